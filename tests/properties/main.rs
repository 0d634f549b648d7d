//! Property tests for every parser of outside input: what a user types (flag values, Go
//! durations, targets, hosts, rules), what a file or a peer hands us (the state file, the
//! control protocol, stored credentials, forwarded chains, request paths, PROXY protocol
//! headers). Each property is a round trip, an agreement with Go's documented behaviour,
//! an invariant, or "never panics" on arbitrary input. Case counts are modest so the whole
//! suite takes seconds; `fuzz/` runs the same parsers for as long as you like
//! (`scripts/fuzz`).
//!
//! A failing case is shrunk and recorded by proptest under `proptest-regressions/`; the
//! defects found are kept as named unit tests next to the code they fixed.

mod control;
mod durations;
mod flags;
mod gates;
mod hosts;
mod proxy_protocol;
mod request_heads;
mod rules;
mod state;
mod targets;
mod timeouts;

/// Few cases for properties that compile regexes or build services (slow in debug).
pub const FEW: u32 = 64;
/// The default for cheap properties.
pub const SOME: u32 = 256;
