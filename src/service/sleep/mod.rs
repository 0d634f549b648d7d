//! The per-service idle controller: scale to zero, in two tiers.
//!
//! A service idle for `freeze_after` has its containers frozen (Docker's pause: memory
//! kept, no CPU, back in milliseconds); idle for `sleep_after`, they are stopped. The next
//! real request is held while one detached task thaws or starts them and waits until the
//! service can serve again. Either tier may be used alone.
//!
//! ```text
//! Active   ──idle ≥ freeze_after──▶ Freezing ──all frozen (persist)──▶ Frozen
//! Active   ──idle ≥ sleep_after (no freeze tier)──▶ Stopping
//! Frozen   ──idle ≥ sleep_after in all──▶ Stopping ──all stopped (persist)──▶ Sleeping
//! Frozen   ──a request──▶ Waking (thaw)      Sleeping ──a request──▶ Waking (start)
//! Waking   ──ready (persist)──▶ Active
//! Waking   ──failed: stop what may run, back off──▶ Sleeping (that stop failed too: Active)
//! Freezing, Stopping ──failed: bring them back, targets ready──▶ Active
//! ```
//!
//! The containers are either a fixed list (`--sleep-container`, or the targets' ids) or
//! selected by Docker labels (`--sleep-label`) at each transition: a sleep acts on the
//! running matching containers and remembers their ids; a wake starts those ids, and only
//! when a remembered one is gone does the newest matching container stand in (unless the
//! wake already started it), so an older version Kamal keeps for rollback is never started
//! by a wake.
//!
//! A deploy that changes the container set supersedes whatever is in progress: an active
//! service stays active, any other is woken with the new set.
//!
//! Two halves with different costs:
//!
//! * The request hot path ([`IdleController::admit`] while active, and [`InFlight`]'s drop)
//!   touches atomics only: one word holds the "open" bit (state is active) together with the
//!   in-flight count, so admitting a request and deciding to sleep are a single
//!   compare-and-swap race on the same word that exactly one side wins.
//! * Everything else (transitions, backoff, the generation counter) lives in a small
//!   `std::sync::Mutex` that is never held across an `.await`. Parked requests watch a
//!   `tokio::sync::watch` channel and re-read the state after every transition.
//!
//! Stops and wakes run on their own tasks, detached from any request, so a client that hangs
//! up (or whose request deadline fires) only removes itself. Each transition bumps a
//! generation counter, and an operation applies its outcome only if the generation has not
//! moved since it began: a redeploy that lands mid-wake wins over the late result.

use std::fmt;
use std::future::{Future, pending};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::inflight::Activity;
pub use crate::inflight::InFlight;
use crate::lifecycle::ContainerLifecycle;
use crate::observe::metrics::SleepMetrics;

/// All the stops of one sleep (or of one cleanup) share this budget; the lifecycle is told
/// what is left so the runtime's own kill lands inside it.
const STOP_BUDGET: Duration = Duration::from_secs(30);

/// How long a rollback (after a failed stop or a failed cleanup) may take to bring the
/// service back before held requests are released anyway.
const RESTORE_BUDGET: Duration = Duration::from_secs(30);

/// Ceiling of the wake-failure backoff (1 s, 2 s, 4 s, 8 s, 16 s, then 30 s).
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The `gate` word: the high bit is set while the service is active, the rest counts
/// requests in flight.
const OPEN: u64 = 1 << 63;
const COUNT: u64 = OPEN - 1;

/// Where a service stands in its sleep cycle. Persisted by name in the state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IdleState {
    #[default]
    Active,
    Stopping,
    Sleeping,
    Waking,
    Freezing,
    Frozen,
}

impl IdleState {
    /// The persisted and printed name.
    pub const fn as_str(self) -> &'static str {
        match self {
            IdleState::Active => "active",
            IdleState::Stopping => "stopping",
            IdleState::Sleeping => "sleeping",
            IdleState::Waking => "waking",
            IdleState::Freezing => "freezing",
            IdleState::Frozen => "frozen",
        }
    }

    /// Reads a persisted name with restore semantics. A proxy that died mid-transition
    /// cannot know where its containers ended up, so `stopping` and `waking` restore as
    /// sleeping and `freezing` as frozen (a wake thaws a frozen container and starts a
    /// stopped one, and either is harmless on a running one); a missing or unknown name
    /// restores as active, as an old state file must.
    pub fn parse(name: &str) -> Self {
        match name {
            "sleeping" | "stopping" | "waking" => IdleState::Sleeping,
            "frozen" | "freezing" => IdleState::Frozen,
            _ => IdleState::Active,
        }
    }

    /// Frozen, or on the way there: the containers are (being) frozen, not stopped.
    pub const fn is_frozen(self) -> bool {
        matches!(self, IdleState::Freezing | IdleState::Frozen)
    }

    const fn from_u8(value: u8) -> Self {
        match value {
            1 => IdleState::Stopping,
            2 => IdleState::Sleeping,
            3 => IdleState::Waking,
            4 => IdleState::Freezing,
            5 => IdleState::Frozen,
            _ => IdleState::Active,
        }
    }

    const fn to_u8(self) -> u8 {
        match self {
            IdleState::Active => 0,
            IdleState::Stopping => 1,
            IdleState::Sleeping => 2,
            IdleState::Waking => 3,
            IdleState::Freezing => 4,
            IdleState::Frozen => 5,
        }
    }
}

impl fmt::Display for IdleState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The sleep options of one service, as deployed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SleepConfig {
    /// Idle time before the containers are stopped; zero never stops them.
    pub sleep_after: Duration,
    /// Idle time before the containers are frozen; zero never freezes them. Shorter than
    /// `sleep_after` when both are set (the options are validated so).
    pub freeze_after: Duration,
    /// How long a request may be held, and how long one wake may take. The service options
    /// default it (30 s); zero would fail every held request at once.
    pub wake_timeout: Duration,
    /// The containers to stop and start, in order (empty with a selector).
    pub containers: Vec<String>,
    /// `key=value` Docker labels, all required: the containers are looked up at each
    /// transition instead of being fixed.
    pub selector: Vec<String>,
}

impl SleepConfig {
    fn may_sleep(&self) -> bool {
        (!self.sleep_after.is_zero() || !self.freeze_after.is_zero())
            && (!self.containers.is_empty() || !self.selector.is_empty())
    }

    /// The idle time after which an active service leaves the active state.
    fn first_tier_after(&self) -> Duration {
        if self.freeze_after.is_zero() {
            self.sleep_after
        } else {
            self.freeze_after
        }
    }
}

/// What the controller needs from the service around it (its load balancer and the state
/// file).
///
/// `suspend` is called while the controller's state lock is held, so that it can never land
/// after a newer transition; it must be quick and must not call back into the controller's
/// mutating methods (`reconfigure`, `close`). `state()` and `health_check()` are lock-free
/// and safe to call from any hook.
pub trait SleepHooks: Send + Sync + 'static {
    /// Stop probing and routing to the service's targets (called before stopping containers,
    /// after a failed wake, at restore). Must be idempotent.
    fn suspend(&self);

    /// Re-arm the suspended pools (targets back to "unverified", probing at a short fixed
    /// interval) and resolve `Ok` once the service can serve (at least one healthy writer
    /// target), or `Err(())` if `deadline` passes first. A pool that is not suspended (say, a
    /// freshly deployed one) should be left as it is.
    fn resume_until_ready(
        &self,
        deadline: Instant,
    ) -> Pin<Box<dyn Future<Output = Result<(), ()>> + Send + '_>>;

    /// The idle state changed in a way worth persisting (the sleeping and active edges).
    fn persist(&self);
}

/// How to treat a health-check request (GET or HEAD on the health path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthAnswer {
    /// Active: forward it to a target like any request, but do not count it as traffic.
    Forward,
    /// Asleep (or on the way): answer 200 ourselves, so a monitor neither wakes the service
    /// nor sees it as down.
    Healthy,
    /// A wake has failed since the last successful one: answer 503, so monitoring notices a
    /// service that can no longer start.
    Unhealthy,
}

/// Why a request was not admitted. `Display` is operator text for the logs; the client
/// gets a bare 503 with `Retry-After` ([`WakeError::retry_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeError {
    /// A wake failed, now or recently: `retry_after` is what is left of the backoff.
    Failed { retry_after: Duration },
    /// The request's wait (`wake_timeout` from its arrival) ran out first.
    TimedOut { retry_after: Duration },
    /// The service was removed while the request waited.
    Closed,
}

impl WakeError {
    /// For the `Retry-After` header: whole seconds, at least one. `None` once the service
    /// is gone, since waiting will not help.
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            WakeError::Failed { retry_after } | WakeError::TimedOut { retry_after } => {
                Some(retry_after)
            }
            WakeError::Closed => None,
        }
    }
}

impl fmt::Display for WakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WakeError::Failed { retry_after } => write!(
                f,
                "the service failed to wake; next attempt allowed in {}s",
                retry_after.as_secs()
            ),
            WakeError::TimedOut { .. } => {
                f.write_str("the service did not wake within the wake timeout")
            }
            WakeError::Closed => f.write_str("the service was removed while the request waited"),
        }
    }
}

impl std::error::Error for WakeError {}

/// The idle controller of one service. Share it as `Arc<IdleController>`; dropping the last
/// handle closes it.
pub struct IdleController {
    shared: Arc<Shared>,
}

impl IdleController {
    /// Builds the controller and spawns its idle timer (call inside a tokio runtime).
    ///
    /// `restored` is the state read back from the state file (see
    /// [`IdleState::parse`]); anything but `Active` starts asleep: the pools are
    /// suspended and no container is touched.
    pub fn new(
        service: String,
        config: SleepConfig,
        lifecycle: Arc<dyn ContainerLifecycle>,
        hooks: Arc<dyn SleepHooks>,
        restored: IdleState,
    ) -> Arc<Self> {
        let state = match restored {
            IdleState::Active => IdleState::Active,
            IdleState::Freezing | IdleState::Frozen => IdleState::Frozen,
            _ => IdleState::Sleeping,
        };
        let metrics = SleepMetrics::for_service(&service);
        if let Some(m) = &metrics {
            m.set_state(state.as_str());
        }
        let (changed, _) = watch::channel(state);
        let shared = Arc::new(Shared {
            service,
            lifecycle,
            hooks,
            epoch: Instant::now(),
            gate: AtomicU64::new(if state == IdleState::Active { OPEN } else { 0 }),
            last_activity: AtomicU64::new(0),
            state: AtomicU8::new(state.to_u8()),
            wake_failed: AtomicBool::new(false),
            metrics,
            nudge: Notify::new(),
            changed,
            closing: CancellationToken::new(),
            inner: Mutex::new(Inner {
                config,
                state,
                generation: 0,
                failures: 0,
                retry_at: None,
                closed: false,
                operation: None,
                remembered: Vec::new(),
                asleep_since: None,
            }),
        });
        if state != IdleState::Active {
            shared.hooks.suspend();
            tracing::info!(
                service = %shared.service,
                containers = %shared.lock().config.containers.join(","),
                state = %state,
                "Restored idle service"
            );
        }
        tokio::spawn(Arc::clone(&shared).run_timer());
        Arc::new(IdleController { shared })
    }

    pub fn state(&self) -> IdleState {
        self.shared.state()
    }

    /// The containers this controller stops and starts: the fixed list, or with a selector
    /// the ids the last freeze or stop acted on (control plane only: takes the lock).
    pub fn containers(&self) -> Vec<String> {
        let inner = self.shared.lock();
        if inner.config.selector.is_empty() {
            inner.config.containers.clone()
        } else {
            inner.remembered.clone()
        }
    }

    /// The ids the last freeze or stop acted on, and since when the service has been idle
    /// (wall clock), for the state file.
    pub fn remembered(&self) -> (Vec<String>, Option<SystemTime>) {
        let inner = self.shared.lock();
        (inner.remembered.clone(), inner.asleep_since)
    }

    /// Puts back what [`Self::remembered`] returned before a restart.
    pub fn restore_remembered(&self, ids: Vec<String>, since: Option<SystemTime>) {
        let mut inner = self.shared.lock();
        inner.remembered = ids;
        if inner.state != IdleState::Active {
            inner.asleep_since = since;
        }
    }

    /// How long the service has been frozen or asleep; `None` while active or waking.
    pub fn asleep_for(&self) -> Option<Duration> {
        let inner = self.shared.lock();
        match inner.state {
            IdleState::Active | IdleState::Waking => None,
            _ => inner
                .asleep_since
                .map(|since| since.elapsed().unwrap_or_default()),
        }
    }

    /// Admits a real request, holding it while the service wakes.
    ///
    /// While active this is a compare-and-swap and returns at once. Otherwise the request
    /// waits (starting the one shared wake if the service sleeps) for at most `wake_timeout`
    /// from now, across a stop that is still running and the wake after it. Dropping the
    /// future only removes this request; the wake goes on for the others.
    pub async fn admit(&self) -> Result<InFlight, WakeError> {
        match self.shared.try_admit() {
            Some(guard) => Ok(guard),
            None => self.shared.admit_slowly().await,
        }
    }

    /// Classifies a health-check request. Never waits and never wakes.
    pub fn health_check(&self) -> HealthAnswer {
        match self.state() {
            IdleState::Active => HealthAnswer::Forward,
            _ if self.shared.wake_failed.load(Ordering::Acquire) => HealthAnswer::Unhealthy,
            _ => HealthAnswer::Healthy,
        }
    }

    /// Applies a deploy or rollout.
    ///
    /// The same containers only update the durations. A changed container set supersedes any
    /// stop or wake in progress and clears the backoff; an active service stays active and
    /// its idle period restarts, while a service that is (or may be) asleep is woken with
    /// the new set, so that a redeploy or rollout while asleep leaves a service that serves
    /// (waiters keep waiting for that wake). Starting an already running container is a
    /// cheap success, so for a fresh deploy this costs one call per container.
    pub fn reconfigure(&self, config: SleepConfig) {
        let shared = &self.shared;
        let mut inner = shared.lock();
        if inner.closed {
            return;
        }
        let containers_changed = inner.config.containers != config.containers
            || inner.config.selector != config.selector;
        if inner.config.selector != config.selector {
            inner.remembered.clear();
        }
        inner.config = config;
        if containers_changed {
            tracing::info!(
                service = %shared.service,
                containers = %inner.config.containers.join(","),
                "Sleep containers changed"
            );
            if let Some(operation) = inner.operation.take() {
                operation.cancel();
            }
            inner.failures = 0;
            inner.retry_at = None;
            shared.wake_failed.store(false, Ordering::Release);
            match inner.state {
                IdleState::Active => shared.enter(&mut inner, IdleState::Active),
                _ => shared.begin_wake(&mut inner),
            }
        }
        drop(inner);
        // The durations may have changed: let the timer recompute its deadline.
        shared.nudge.notify_one();
    }

    /// The service is being removed: stops the timer and any stop or wake in progress, and
    /// fails parked requests with [`WakeError::Closed`]. Containers are left as they are.
    pub fn close(&self) {
        let mut inner = self.shared.lock();
        if inner.closed {
            return;
        }
        inner.closed = true;
        inner.generation += 1;
        inner.operation = None;
        self.shared.closing.cancel();
        if self.shared.metrics.is_some() {
            SleepMetrics::forget(&self.shared.service);
        }
        self.shared.changed.send_replace(inner.state);
    }
}

impl Drop for IdleController {
    fn drop(&mut self) {
        self.close();
    }
}

impl fmt::Debug for IdleController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleController")
            .field("service", &self.shared.service)
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl Activity for Shared {
    fn request_ended(&self) {
        // Stamp before the count drops: the timer's compare-and-swap that sees the count at
        // zero then also sees this request's end, so the idle period restarts from it.
        self.touch();
        let before = self.gate.fetch_sub(1, Ordering::AcqRel);
        if before & COUNT == 1 {
            self.nudge.notify_one();
        }
    }
}

/// Everything the controller, its tasks and the in-flight guards share.
struct Shared {
    service: String,
    lifecycle: Arc<dyn ContainerLifecycle>,
    hooks: Arc<dyn SleepHooks>,
    /// Origin of `last_activity`, so the stamp fits in an atomic.
    epoch: Instant,
    /// `OPEN` while active, plus the in-flight count (see the module doc).
    gate: AtomicU64,
    /// Nanoseconds from `epoch` to the last request end (or return to active).
    last_activity: AtomicU64,
    /// Mirror of `Inner::state` for lock-free reads.
    state: AtomicU8,
    /// A wake failed since the last successful one (health checks answer 503).
    wake_failed: AtomicBool,
    /// `None` unless `--metrics-port` is set.
    metrics: Option<Arc<SleepMetrics>>,
    /// Tells the idle timer to recompute: the last request ended, the service became
    /// active, or the durations changed.
    nudge: Notify,
    /// Bumped on every transition (and on a wake failure) so parked requests re-check.
    changed: watch::Sender<IdleState>,
    /// Cancelled by `close`; every task of the controller is a child of it.
    closing: CancellationToken,
    inner: Mutex<Inner>,
}

struct Inner {
    config: SleepConfig,
    state: IdleState,
    /// Bumped on every transition; an operation applies its outcome only if it is unchanged.
    generation: u64,
    /// Consecutive failed wakes.
    failures: u32,
    /// No new wake before this instant.
    retry_at: Option<Instant>,
    closed: bool,
    /// The stop or wake in progress, so a reconfigure can cancel it.
    operation: Option<CancellationToken>,
    /// What the last freeze or stop acted on: the ids a wake brings back (with a
    /// selector; with a fixed list, the list itself is used).
    remembered: Vec<String>,
    /// When the service last left the active state for a tier (wall clock, for `list`).
    asleep_since: Option<SystemTime>,
}

impl Inner {
    fn backoff_remaining(&self, now: Instant) -> Option<Duration> {
        self.retry_at
            .filter(|&at| at > now)
            .map(|at| whole_seconds(at - now))
    }
}

pub mod labels;
mod selection;
mod transitions;
use transitions::whole_seconds;

#[cfg(test)]
mod tests;
