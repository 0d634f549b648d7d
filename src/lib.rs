//! kamal-proxy in Rust: a drop-in replacement for basecamp/kamal-proxy with
//! scale-to-zero. See ARCHITECTURE.md in the shared folder and the README.

pub mod aligned_alloc;
pub mod balancer;
pub mod broadcast;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod gotime;
pub mod inflight;
pub mod lifecycle;
pub mod observe;
pub mod options;
pub mod proxy;
pub mod raw_tcp;
pub mod recycle;
pub mod router;
pub mod server;
pub mod service;
pub mod short_copy;
pub mod tls;
pub mod uri;
pub mod worker;
