//! The black-box test harness: the real `kamal-proxy` binary with its own socket, home
//! and state file, real HTTP backends on loopback, the real Docker Engine, pebble and
//! Kamal's command lines.
//!
//! One way to wait ([`poll_until`]), every timer on tokio's clock, CLI calls that never
//! block the runtime, and ports learned from the server's own `Server started` line.

pub mod backend;
pub mod docker;
pub mod flaky;
pub mod go_state;
mod http;
pub mod kamal;
pub mod load;
pub mod pebble;
mod poll;
mod ports;
mod process;
mod proxy;
pub mod raw;
pub mod tls;

pub use http::{Reply, client, send, send_with_cookie, strip_ansi};
pub use poll::{Check, poll_until};
pub use ports::{free_port, free_udp_port};
pub use process::{Ports, bin};
pub use proxy::{Proxy, RunOutcome, try_run, try_run_in, unprivileged_uid};

/// The repository root (this crate lives in `testkit/` under it).
pub fn workspace_root() -> std::path::PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().expect("testkit/ has a parent").to_path_buf()
}
