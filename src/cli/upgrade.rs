//! The proxy upgrade commands (fork F28): `drain`, which ends a generation gracefully,
//! and the hidden `hold`, which owns a network namespace for generations to join.

use clap::Args;

use super::values::duration;
use crate::control::Request;
use crate::gotime::GoDuration;

#[derive(Args, Debug)]
pub struct DrainCmd {
    /// How long in-flight requests get to finish (0: the server's --shutdown-timeout)
    #[arg(long = "drain-timeout", value_parser = duration, default_value = "0s", value_name = "DURATION")]
    drain_timeout: GoDuration,
}

impl DrainCmd {
    /// Returns once the server has stopped accepting, finished what was in flight and
    /// saved its state; it exits right after.
    pub fn execute(self) -> Result<(), String> {
        if self.drain_timeout.is_negative() {
            return Err("drain-timeout cannot be negative".into());
        }
        super::call(Request::Drain {
            drain_timeout: self.drain_timeout,
        })
        .map(|_| ())
    }
}

/// Waits for SIGTERM or SIGINT and exits 0: a container that owns the network namespace
/// and the published ports while proxy generations come and go with
/// `--network container:<it>`.
pub fn hold() -> i32 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: {e}");
            return 1;
        }
    };
    runtime.block_on(super::run::wait_for_signal());
    0
}
