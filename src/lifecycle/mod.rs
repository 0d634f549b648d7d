//! Starting and stopping the containers behind a sleeping service.
//!
//! The idle controller only knows this trait; the Docker Engine implementation lives in
//! `docker.rs`. Keeping the surface small (start, stop, freeze, thaw, inspect, list by
//! label) is what lets a restricted start/stop service (or a test double for a fault
//! Docker cannot produce) replace raw socket access later.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

pub mod docker;

/// A boxed future, so the trait stays object-safe (`Arc<dyn ContainerLifecycle>`).
pub type LifecycleFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, LifecycleError>> + Send + 'a>>;

pub trait ContainerLifecycle: Send + Sync + 'static {
    /// Succeeds when the container is running afterwards, including when it already was.
    fn start<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()>;

    /// Succeeds when the container is stopped afterwards, including when it already was.
    /// `budget` is how long the caller is prepared to wait; the implementation must make
    /// the runtime's own kill land inside it.
    fn stop<'a>(&'a self, container: &'a str, budget: Duration) -> LifecycleFuture<'a, ()>;

    /// What the runtime knows of the reference; fails when it knows none.
    fn inspect<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ContainerInfo>;

    /// Freezes a running container (cgroup freezer: memory kept, no CPU). Succeeds when the
    /// container uses no CPU afterwards: frozen, or not running at all.
    fn freeze<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()>;

    /// Brings a container back from either tier: thaws a frozen one, starts a stopped one.
    /// Succeeds when the container is running afterwards, including when it already was.
    fn thaw<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()>;

    /// Every container (running or not) carrying all of `labels` (`key=value` each), newest
    /// first when the runtime orders them (Docker does).
    fn list<'a>(&'a self, labels: &'a [String]) -> LifecycleFuture<'a, Vec<ListedContainer>>;
}

/// A container found by [`ContainerLifecycle::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedContainer {
    /// The full id: what a sleep remembers, so a wake starts exactly that container.
    pub id: String,
    /// Creation time, Unix seconds: the newest stands in for a remembered one that is gone.
    /// Docker lists newest first by the exact time, which breaks ties within a second.
    pub created: i64,
    /// Running, frozen or restarting: what a sleep has to stop.
    pub live: bool,
}

/// The part of a container's description the proxy uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The container's labels (Kamal's `labels:`, e.g. `kamal-proxy.sleep-after`).
    pub labels: BTreeMap<String, String>,
    /// Running (frozen counts as running, as Docker reports it).
    pub running: bool,
    /// Frozen.
    pub paused: bool,
}

/// Errors carry operator detail (references, daemon output). They are logged and may be
/// returned over the control socket, but never rendered to an HTTP client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifecycleError {
    /// The runtime does not know the reference (HTTP 404 from Docker).
    NotFound(String),
    /// The socket refuses the operation (HTTP 403, e.g. a hardened socket proxy).
    Forbidden(String),
    /// Any other answer from the daemon; `body` is truncated to a few KiB.
    Daemon {
        container: String,
        status: u16,
        body: String,
    },
    /// The socket could not be reached or the connection failed.
    Transport(String),
    /// The operation did not finish inside its budget.
    Timeout(String),
}

impl std::fmt::Display for LifecycleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LifecycleError::NotFound(c) => write!(f, "container not found: {c}"),
            LifecycleError::Forbidden(c) => write!(f, "container inspection forbidden: {c}"),
            LifecycleError::Daemon {
                container,
                status,
                body,
            } => {
                write!(
                    f,
                    "docker returned {status} for container {container}: {body}"
                )
            }
            LifecycleError::Transport(e) => write!(f, "docker socket: {e}"),
            LifecycleError::Timeout(c) => write!(f, "timed out waiting for container {c}"),
        }
    }
}

impl std::error::Error for LifecycleError {}
