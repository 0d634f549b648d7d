//! `remove`, `pause`, `stop` and `resume`.

use clap::Args;

use super::values::duration;
use crate::control::Request;
use crate::gotime::GoDuration;

#[derive(Args, Debug)]
pub struct ServiceArg {
    /// Name of the service
    #[arg(value_name = "SERVICE")]
    service: Vec<String>,
}

#[derive(Args, Debug)]
pub struct PauseCmd {
    /// Name of the service
    #[arg(value_name = "SERVICE")]
    service: Vec<String>,
    /// How long to allow in-flight requests to complete
    #[arg(long = "drain-timeout", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    drain_timeout: GoDuration,
    /// How long to enqueue requests before shedding load
    #[arg(long = "max-pause", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    max_pause: GoDuration,
}

#[derive(Args, Debug)]
pub struct StopCmd {
    /// Name of the service
    #[arg(value_name = "SERVICE")]
    service: Vec<String>,
    /// How long to allow in-flight requests to complete
    #[arg(long = "drain-timeout", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    drain_timeout: GoDuration,
    /// Message to display to clients while stopped
    #[arg(long, default_value = "")]
    message: String,
}

fn non_negative(flag: &str, v: GoDuration) -> Result<(), String> {
    if v.is_negative() {
        Err(format!("{flag} cannot be negative"))
    } else {
        Ok(())
    }
}

pub fn remove(a: ServiceArg) -> Result<(), String> {
    let service = super::exactly_one(&a.service)?;
    super::call(Request::Remove { service }).map(|_| ())
}

pub fn resume(a: ServiceArg) -> Result<(), String> {
    let service = super::exactly_one(&a.service)?;
    super::call(Request::Resume { service }).map(|_| ())
}

impl PauseCmd {
    pub fn execute(&self) -> Result<(), String> {
        let service = super::exactly_one(&self.service)?;
        non_negative("drain-timeout", self.drain_timeout)?;
        non_negative("max-pause", self.max_pause)?;
        super::call(Request::Pause {
            service,
            drain_timeout: self.drain_timeout,
            pause_timeout: self.max_pause,
        })
        .map(|_| ())
    }
}

impl StopCmd {
    pub fn execute(&self) -> Result<(), String> {
        let service = super::exactly_one(&self.service)?;
        non_negative("drain-timeout", self.drain_timeout)?;
        super::call(Request::Stop {
            service,
            drain_timeout: self.drain_timeout,
            message: self.message.clone(),
        })
        .map(|_| ())
    }
}
