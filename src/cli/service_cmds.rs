//! `remove`, `pause`, `stop` and `resume`.

use clap::Args;

use super::values::duration;
use crate::control::Request;

#[derive(Args, Debug)]
pub struct ServiceArg {
    /// Name of the service
    service: String,
}

#[derive(Args, Debug)]
pub struct PauseCmd {
    /// Name of the service
    service: String,
    /// How long to allow in-flight requests to complete
    #[arg(long = "drain-timeout", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    drain_timeout: i64,
    /// How long to enqueue requests before shedding load
    #[arg(long = "max-pause", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    max_pause: i64,
}

#[derive(Args, Debug)]
pub struct StopCmd {
    /// Name of the service
    service: String,
    /// How long to allow in-flight requests to complete
    #[arg(long = "drain-timeout", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    drain_timeout: i64,
    /// Message to display to clients while stopped
    #[arg(long, default_value = "")]
    message: String,
}

fn non_negative(flag: &str, v: i64) -> Result<(), String> {
    if v < 0 {
        Err(format!("{flag} cannot be negative"))
    } else {
        Ok(())
    }
}

pub fn remove(a: ServiceArg) -> Result<(), String> {
    super::call(Request::Remove { service: a.service }).map(|_| ())
}

pub fn resume(a: ServiceArg) -> Result<(), String> {
    super::call(Request::Resume { service: a.service }).map(|_| ())
}

impl PauseCmd {
    pub fn execute(&self) -> Result<(), String> {
        non_negative("drain-timeout", self.drain_timeout)?;
        non_negative("max-pause", self.max_pause)?;
        super::call(Request::Pause {
            service: self.service.clone(),
            drain_timeout: self.drain_timeout,
            pause_timeout: self.max_pause,
        })
        .map(|_| ())
    }
}

impl StopCmd {
    pub fn execute(&self) -> Result<(), String> {
        non_negative("drain-timeout", self.drain_timeout)?;
        super::call(Request::Stop {
            service: self.service.clone(),
            drain_timeout: self.drain_timeout,
            message: self.message.clone(),
        })
        .map(|_| ())
    }
}
