//! Forwarding a request to its target and the response back: the upstream client pool,
//! header rewriting, upgrades, buffering and the proxy's own error pages.

pub mod body;
pub mod buffer;
pub mod cookies;
pub mod exchange;
pub mod forward;
pub mod header_maps;
pub mod headers;
mod http1;
mod keep_alive;
pub mod pages;
pub mod pool;
mod proxy_fields;
pub mod rejection;
mod retry;

pub use forward::{Forwarder, ResponseCookies, Retry, UpstreamRequest};
pub use pool::Pools;
