//! What the proxy tells operators: the access log, server messages and metrics.

pub mod access;
pub mod log;
pub mod metrics;
pub mod text;
