//! The per-service idle controller: scale to zero.
//!
//! A service idle for `sleep_after` has its containers stopped; the next real request is
//! held while one detached task starts them and waits until the service can serve again.
//!
//! ```text
//! Active ──idle ≥ sleep_after, none in flight──▶ Stopping ──all stopped (persist)──▶ Sleeping
//!  ▲ ▲                                               │                              │    ▲
//!  │ └───a stop failed: restart it, targets ready────┘                     a request│    │(1)
//!  │                                                                              ▼    │
//!  └───started and ready (persist), or (2)─────────────────────────────────────── Waking─┘
//!
//!  (1) failed: stop what the wake started, back off     (2) failed, and that stop failed too
//! ```
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
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::lifecycle::{ContainerLifecycle, LifecycleError};

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
}

impl IdleState {
    /// The persisted and printed name.
    pub const fn as_str(self) -> &'static str {
        match self {
            IdleState::Active => "active",
            IdleState::Stopping => "stopping",
            IdleState::Sleeping => "sleeping",
            IdleState::Waking => "waking",
        }
    }

    /// Reads a persisted name with restore semantics. A proxy that died mid-transition
    /// cannot know where its containers ended up, so `stopping` and `waking` restore as
    /// sleeping (starting a running container is harmless); a missing or unknown name
    /// restores as active, as an old state file must.
    pub fn parse(name: &str) -> Self {
        match name {
            "sleeping" | "stopping" | "waking" => IdleState::Sleeping,
            _ => IdleState::Active,
        }
    }

    const fn from_u8(value: u8) -> Self {
        match value {
            1 => IdleState::Stopping,
            2 => IdleState::Sleeping,
            3 => IdleState::Waking,
            _ => IdleState::Active,
        }
    }

    const fn to_u8(self) -> u8 {
        match self {
            IdleState::Active => 0,
            IdleState::Stopping => 1,
            IdleState::Sleeping => 2,
            IdleState::Waking => 3,
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
    /// Idle time before the containers are stopped; zero never sleeps.
    pub sleep_after: Duration,
    /// How long a request may be held, and how long one wake may take. The service options
    /// default it (30 s); zero would fail every held request at once.
    pub wake_timeout: Duration,
    /// The containers to stop and start, in order.
    pub containers: Vec<String>,
}

impl SleepConfig {
    fn may_sleep(&self) -> bool {
        !self.sleep_after.is_zero() && !self.containers.is_empty()
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

/// An admitted request. Hold it until the request is really over: for a proxied request
/// that is the end of the response body, for an upgraded connection (WebSocket) the end of
/// the connection. Dropping it ends the request for idle accounting.
#[must_use = "the request counts as in flight only while this guard is held"]
pub struct InFlight {
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
            _ => IdleState::Sleeping,
        };
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
            }),
        });
        if state == IdleState::Sleeping {
            shared.hooks.suspend();
            tracing::info!(
                service = %shared.service,
                containers = %shared.lock().config.containers.join(","),
                "Restored sleeping service"
            );
        }
        tokio::spawn(Arc::clone(&shared).run_timer());
        Arc::new(IdleController { shared })
    }

    pub fn state(&self) -> IdleState {
        self.shared.state()
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
        let containers_changed = inner.config.containers != config.containers;
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

impl Drop for InFlight {
    fn drop(&mut self) {
        let shared = &self.shared;
        // Stamp before the count drops: the timer's compare-and-swap that sees the count at
        // zero then also sees this request's end, so the idle period restarts from it.
        shared.touch();
        let before = shared.gate.fetch_sub(1, Ordering::AcqRel);
        if before & COUNT == 1 {
            shared.nudge.notify_one();
        }
    }
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("service", &self.shared.service)
            .finish_non_exhaustive()
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
}

impl Inner {
    fn backoff_remaining(&self, now: Instant) -> Option<Duration> {
        self.retry_at
            .filter(|&at| at > now)
            .map(|at| whole_seconds(at - now))
    }
}

/// What was left after stopping a list of containers.
#[derive(Default)]
struct StopReport {
    stopped: Vec<String>,
    failed: Vec<(String, LifecycleError)>,
}

/// Why a wake failed; logged, never shown to a client.
#[derive(Debug)]
enum WakeFailure {
    Start {
        container: String,
        error: LifecycleError,
    },
    OutOfTime,
    NotReady,
}

impl fmt::Display for WakeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WakeFailure::Start { container, error } => {
                write!(f, "starting container {container}: {error}")
            }
            WakeFailure::OutOfTime => f.write_str("timed out waking containers"),
            WakeFailure::NotReady => {
                f.write_str("no target became healthy before the wake deadline")
            }
        }
    }
}

impl Shared {
    /// The state lock. A poisoned lock is recovered rather than propagated: every critical
    /// section updates the state fields before calling out (the only foreign code run under
    /// it is `SleepHooks::suspend`), so a panic there leaves a coherent state, and turning it
    /// into a panic on every later request of the service would help nobody.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn state(&self) -> IdleState {
        IdleState::from_u8(self.state.load(Ordering::Acquire))
    }

    fn try_admit(self: &Arc<Self>) -> Option<InFlight> {
        let mut current = self.gate.load(Ordering::Acquire);
        while current & OPEN != 0 {
            match self.gate.compare_exchange_weak(
                current,
                current + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    // No stamp here: while this guard lives nothing sleeps, and its drop
                    // stamps the end, which is later than any arrival stamp would be.
                    return Some(InFlight {
                        shared: Arc::clone(self),
                    });
                }
                Err(actual) => current = actual,
            }
        }
        None
    }

    async fn admit_slowly(self: &Arc<Self>) -> Result<InFlight, WakeError> {
        // Subscribe before the first look at the state, so no transition can slip between
        // the look and the wait.
        let mut changes = self.changed.subscribe();
        let deadline = Instant::now() + self.lock().config.wake_timeout;
        let expiry = sleep_until(deadline);
        tokio::pin!(expiry);
        loop {
            if let Some(guard) = self.admission_step()? {
                return Ok(guard);
            }
            tokio::select! {
                // Biased: at the deadline this request has timed out, whatever the wake
                // reports in the same instant.
                biased;
                () = &mut expiry => return Err(self.timed_out()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Err(WakeError::Closed);
                    }
                }
            }
        }
    }

    /// One look at the state on behalf of a waiting request: admitted, failed, or `None`
    /// to wait for the next transition.
    fn admission_step(self: &Arc<Self>) -> Result<Option<InFlight>, WakeError> {
        let mut inner = self.lock();
        if inner.state == IdleState::Active {
            // The gate only closes under this lock, so it is open while the state says
            // active and we hold it.
            return Ok(self.try_admit());
        }
        if inner.closed {
            return Err(WakeError::Closed);
        }
        // Sleeping inside the backoff, or waking while a failed wake cleans up: fail fast,
        // without a container call.
        let backoff = inner.backoff_remaining(Instant::now());
        match (inner.state, backoff) {
            (IdleState::Sleeping | IdleState::Waking, Some(retry_after)) => {
                Err(WakeError::Failed { retry_after })
            }
            (IdleState::Sleeping, None) => {
                self.begin_wake(&mut inner);
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    fn timed_out(&self) -> WakeError {
        let retry_after = self
            .lock()
            .backoff_remaining(Instant::now())
            .unwrap_or(Duration::from_secs(1));
        WakeError::TimedOut { retry_after }
    }

    fn touch(&self) {
        self.last_activity
            .fetch_max(self.since_epoch(Instant::now()), Ordering::AcqRel);
    }

    fn since_epoch(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn last_activity(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.last_activity.load(Ordering::Acquire))
    }

    /// Moves to `state` (the caller holds the lock and has checked the move is allowed).
    fn enter(&self, inner: &mut Inner, state: IdleState) {
        inner.state = state;
        inner.generation += 1;
        self.state.store(state.to_u8(), Ordering::Release);
        if state == IdleState::Active {
            // Back to active restarts the idle period, whoever is (or is not) waiting.
            self.touch();
            self.gate.fetch_or(OPEN, Ordering::AcqRel);
            self.nudge.notify_one();
        }
        self.changed.send_replace(state);
    }

    /// Applies the outcome of the operation that began at `generation`, unless something
    /// newer (a reconfigure, close) has happened since. `then` runs under the lock, after
    /// the move.
    fn settle(&self, generation: u64, state: IdleState, then: impl FnOnce(&mut Inner)) -> bool {
        let mut inner = self.lock();
        if inner.closed || inner.generation != generation {
            return false;
        }
        self.enter(&mut inner, state);
        then(&mut inner);
        true
    }

    fn spawn_operation<F>(&self, inner: &mut Inner, operation: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let token = self.closing.child_token();
        inner.operation = Some(token.clone());
        tokio::spawn(token.run_until_cancelled_owned(operation));
    }

    // ---- Sleeping ---------------------------------------------------------------------

    async fn run_timer(self: Arc<Self>) {
        loop {
            let due = self.next_sleep_check();
            let wait = async {
                match due {
                    Some(at) => sleep_until(at).await,
                    None => pending().await,
                }
            };
            tokio::select! {
                () = self.closing.cancelled() => return,
                () = self.nudge.notified() => {}
                () = wait => self.try_begin_sleep(),
            }
        }
    }

    /// When the service may next fall asleep, or `None` to wait for a nudge.
    fn next_sleep_check(&self) -> Option<Instant> {
        let inner = self.lock();
        let eligible =
            inner.state == IdleState::Active && !inner.closed && inner.config.may_sleep();
        if !eligible || self.gate.load(Ordering::Acquire) & COUNT != 0 {
            return None;
        }
        Some(self.last_activity() + inner.config.sleep_after)
    }

    fn try_begin_sleep(self: &Arc<Self>) {
        let mut inner = self.lock();
        if inner.state != IdleState::Active || inner.closed || !inner.config.may_sleep() {
            return;
        }
        // Closing the gate fails if a request is in flight; the timer waits for its end.
        if self
            .gate
            .compare_exchange(OPEN, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        // A request may have come and gone between the timer's deadline and the close; its
        // end restarts the idle period.
        if Instant::now() < self.last_activity() + inner.config.sleep_after {
            self.gate.fetch_or(OPEN, Ordering::AcqRel);
            return;
        }
        self.enter(&mut inner, IdleState::Stopping);
        let generation = inner.generation;
        let containers = inner.config.containers.clone();
        tracing::debug!(
            service = %self.service,
            containers = %containers.join(","),
            "Stopping idle service"
        );
        // Pools first: no probe should see (and log) the containers going down.
        self.hooks.suspend();
        let this = Arc::clone(self);
        self.spawn_operation(&mut inner, this.fall_asleep(generation, containers));
    }

    async fn fall_asleep(self: Arc<Self>, generation: u64, containers: Vec<String>) {
        let report = self.stop_each(&containers, false).await;
        if report.failed.is_empty() {
            if self.settle(generation, IdleState::Sleeping, |_| {}) {
                tracing::info!(
                    service = %self.service,
                    containers = %containers.join(","),
                    "Sleeping idle service"
                );
                self.hooks.persist();
            }
            return;
        }
        for (container, error) in &report.failed {
            tracing::warn!(
                service = %self.service,
                containers = %container,
                error = %error,
                "Failed to stop idle container"
            );
        }
        // Held requests stay held until the service can serve again.
        self.recover(
            generation,
            &report.stopped,
            "Failed to restore targets after a failed sleep",
        )
        .await;
    }

    /// Stops each container in order under one shared budget, attempting every one even
    /// after a failure. During a cleanup a container the runtime does not know counts as
    /// stopped (it is not running); when going to sleep it does not, because a service whose
    /// container is gone would never wake again, and staying awake keeps the rest serving.
    async fn stop_each(&self, containers: &[String], cleanup: bool) -> StopReport {
        let deadline = Instant::now() + STOP_BUDGET;
        let mut report = StopReport::default();
        for container in containers {
            let budget = deadline.saturating_duration_since(Instant::now());
            let outcome = timeout_at(deadline, self.lifecycle.stop(container, budget))
                .await
                .unwrap_or_else(|_| Err(LifecycleError::Timeout(container.clone())));
            match outcome {
                Ok(()) => report.stopped.push(container.clone()),
                Err(LifecycleError::NotFound(_)) if cleanup => {}
                Err(error) => report.failed.push((container.clone(), error)),
            }
        }
        report
    }

    /// Puts a service that could not (fully) sleep back to work: restarts what was stopped,
    /// resumes the pools and waits, bounded, for a target to be ready before going active,
    /// so held requests never meet an empty pool. Not persisted: the service never reached
    /// a persisted sleeping edge from here.
    async fn recover(&self, generation: u64, stopped: &[String], not_ready: &'static str) {
        let deadline = Instant::now() + RESTORE_BUDGET;
        for container in stopped {
            let outcome = timeout_at(deadline, self.lifecycle.start(container))
                .await
                .unwrap_or_else(|_| Err(LifecycleError::Timeout(container.clone())));
            if let Err(error) = outcome {
                tracing::warn!(
                    service = %self.service,
                    containers = %container,
                    error = %error,
                    "Failed to restart container"
                );
            }
        }
        let ready = timeout_at(deadline, self.hooks.resume_until_ready(deadline)).await;
        if !matches!(ready, Ok(Ok(()))) {
            tracing::error!(service = %self.service, "{not_ready}");
        }
        self.settle(generation, IdleState::Active, |_| {});
    }

    // ---- Waking -----------------------------------------------------------------------

    fn begin_wake(self: &Arc<Self>, inner: &mut Inner) {
        self.enter(inner, IdleState::Waking);
        let generation = inner.generation;
        let deadline = Instant::now() + inner.config.wake_timeout;
        let containers = inner.config.containers.clone();
        let this = Arc::clone(self);
        self.spawn_operation(inner, this.wake(generation, containers, deadline));
    }

    async fn wake(self: Arc<Self>, generation: u64, containers: Vec<String>, deadline: Instant) {
        let began = Instant::now();
        let list = containers.join(",");
        tracing::info!(service = %self.service, containers = %list, "Waking service");
        let mut maybe_running = Vec::new();
        match self
            .bring_up(&containers, deadline, &mut maybe_running)
            .await
        {
            Ok(()) => {
                let awake = self.settle(generation, IdleState::Active, |inner| {
                    inner.failures = 0;
                    inner.retry_at = None;
                    self.wake_failed.store(false, Ordering::Release);
                });
                if awake {
                    tracing::info!(
                        service = %self.service,
                        containers = %list,
                        wake_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
                        "Service awake"
                    );
                    self.hooks.persist();
                }
            }
            Err(failure) => {
                tracing::warn!(
                    service = %self.service,
                    containers = %list,
                    error = %failure,
                    "Failed to wake service"
                );
                if self.record_wake_failure(generation) {
                    self.stand_down(generation, &maybe_running).await;
                }
            }
        }
    }

    /// Starts each container in order (aborting on the first error), then waits for the
    /// pools, all inside the wake's deadline. `maybe_running` collects what this wake may
    /// have started, for the cleanup if it fails.
    async fn bring_up(
        &self,
        containers: &[String],
        deadline: Instant,
        maybe_running: &mut Vec<String>,
    ) -> Result<(), WakeFailure> {
        for container in containers {
            maybe_running.push(container.clone());
            match timeout_at(deadline, self.lifecycle.start(container)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    if !may_have_started(&error) {
                        maybe_running.pop();
                    }
                    let container = container.clone();
                    return Err(WakeFailure::Start { container, error });
                }
                Err(_) => return Err(WakeFailure::OutOfTime),
            }
        }
        match timeout_at(deadline, self.hooks.resume_until_ready(deadline)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(())) | Err(_) => Err(WakeFailure::NotReady),
        }
    }

    /// Starts the backoff and tells parked requests at once; the state stays `Waking` while
    /// the cleanup runs, so new requests fail fast instead of starting another wake.
    fn record_wake_failure(&self, generation: u64) -> bool {
        let mut inner = self.lock();
        if inner.closed || inner.generation != generation {
            return false;
        }
        inner.failures = inner.failures.saturating_add(1);
        inner.retry_at = Some(Instant::now() + backoff(inner.failures));
        self.wake_failed.store(true, Ordering::Release);
        self.changed.send_replace(inner.state);
        true
    }

    /// After a failed wake: stop what it may have started, then sleep with the pools
    /// suspended. If a container will not stop, the service is running anyway: bring it
    /// back to active so the idle timer accounts for it and puts it to sleep later.
    async fn stand_down(&self, generation: u64, maybe_running: &[String]) {
        let report = self.stop_each(maybe_running, true).await;
        if report.failed.is_empty() {
            self.settle(generation, IdleState::Sleeping, |_| self.hooks.suspend());
            return;
        }
        for (container, error) in &report.failed {
            tracing::warn!(
                service = %self.service,
                containers = %container,
                error = %error,
                "Failed to stop container after a failed wake"
            );
        }
        self.recover(
            generation,
            &report.stopped,
            "Failed to restore targets after a failed wake",
        )
        .await;
    }
}

/// Whether a failed start may still have left the container running (the daemon did not
/// answer, so it may have acted); a definite refusal means it did not start.
fn may_have_started(error: &LifecycleError) -> bool {
    matches!(
        error,
        LifecycleError::Timeout(_) | LifecycleError::Transport(_)
    )
}

/// 1 s after the first failed wake, doubling up to 30 s.
fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(5);
    Duration::from_secs(1 << exponent).min(MAX_BACKOFF)
}

/// Rounds up to whole seconds, at least one (what `Retry-After` can say).
fn whole_seconds(duration: Duration) -> Duration {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Duration::from_secs(seconds.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::LifecycleFuture;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicUsize;
    use tokio::time::sleep;

    const SLEEP_AFTER: Duration = Duration::from_secs(60);
    const WAKE_TIMEOUT: Duration = Duration::from_secs(30);

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Call {
        Start(String),
        Stop(String, Duration),
    }

    /// Records every call; each operation can be slowed down or made to fail per container.
    #[derive(Default)]
    struct FakeLifecycle {
        calls: Mutex<Vec<Call>>,
        start_delay: Mutex<Duration>,
        stop_delay: Mutex<HashMap<String, Duration>>,
        failing_starts: Mutex<HashMap<String, LifecycleError>>,
        failing_stops: Mutex<HashMap<String, LifecycleError>>,
    }

    impl FakeLifecycle {
        fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }
        fn starts(&self) -> usize {
            self.calls()
                .iter()
                .filter(|c| matches!(c, Call::Start(_)))
                .count()
        }
        fn stops(&self) -> usize {
            self.calls()
                .iter()
                .filter(|c| matches!(c, Call::Stop(..)))
                .count()
        }
        fn slow_starts(&self, delay: Duration) {
            *self.start_delay.lock().unwrap() = delay;
        }
        fn slow_stop(&self, container: &str, delay: Duration) {
            self.stop_delay
                .lock()
                .unwrap()
                .insert(container.into(), delay);
        }
        fn fail_start(&self, container: &str, error: Option<LifecycleError>) {
            let mut failing = self.failing_starts.lock().unwrap();
            match error {
                Some(error) => failing.insert(container.into(), error),
                None => failing.remove(container),
            };
        }
        fn fail_stop(&self, container: &str, error: Option<LifecycleError>) {
            let mut failing = self.failing_stops.lock().unwrap();
            match error {
                Some(error) => failing.insert(container.into(), error),
                None => failing.remove(container),
            };
        }
    }

    impl ContainerLifecycle for FakeLifecycle {
        fn start<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
            Box::pin(async move {
                self.calls
                    .lock()
                    .unwrap()
                    .push(Call::Start(container.into()));
                let delay = *self.start_delay.lock().unwrap();
                sleep(delay).await;
                match self.failing_starts.lock().unwrap().get(container) {
                    Some(error) => Err(error.clone()),
                    None => Ok(()),
                }
            })
        }

        fn stop<'a>(&'a self, container: &'a str, budget: Duration) -> LifecycleFuture<'a, ()> {
            Box::pin(async move {
                self.calls
                    .lock()
                    .unwrap()
                    .push(Call::Stop(container.into(), budget));
                let delay = self.stop_delay.lock().unwrap().get(container).copied();
                sleep(delay.unwrap_or_default()).await;
                match self.failing_stops.lock().unwrap().get(container) {
                    Some(error) => Err(error.clone()),
                    None => Ok(()),
                }
            })
        }

        fn inspect<'a>(&'a self, _container: &'a str) -> LifecycleFuture<'a, ()> {
            Box::pin(async { Ok(()) })
        }
    }

    /// Records the hook calls; readiness takes `ready_delay` and can be made to never come.
    #[derive(Default)]
    struct FakeHooks {
        suspends: AtomicUsize,
        resumes: AtomicUsize,
        persists: AtomicUsize,
        ready_delay: Mutex<Duration>,
        never_ready: AtomicBool,
        ready_at: Mutex<Vec<Instant>>,
    }

    impl FakeHooks {
        fn suspends(&self) -> usize {
            self.suspends.load(Ordering::SeqCst)
        }
        fn resumes(&self) -> usize {
            self.resumes.load(Ordering::SeqCst)
        }
        fn persists(&self) -> usize {
            self.persists.load(Ordering::SeqCst)
        }
        fn slow_readiness(&self, delay: Duration) {
            *self.ready_delay.lock().unwrap() = delay;
        }
        fn never_ready(&self, never: bool) {
            self.never_ready.store(never, Ordering::SeqCst);
        }
        fn ready_at(&self) -> Vec<Instant> {
            self.ready_at.lock().unwrap().clone()
        }
    }

    impl SleepHooks for FakeHooks {
        fn suspend(&self) {
            self.suspends.fetch_add(1, Ordering::SeqCst);
        }

        fn resume_until_ready(
            &self,
            deadline: Instant,
        ) -> Pin<Box<dyn Future<Output = Result<(), ()>> + Send + '_>> {
            Box::pin(async move {
                self.resumes.fetch_add(1, Ordering::SeqCst);
                let ready = Instant::now() + *self.ready_delay.lock().unwrap();
                if self.never_ready.load(Ordering::SeqCst) || ready > deadline {
                    sleep_until(deadline).await;
                    return Err(());
                }
                sleep_until(ready).await;
                self.ready_at.lock().unwrap().push(Instant::now());
                Ok(())
            })
        }

        fn persist(&self) {
            self.persists.fetch_add(1, Ordering::SeqCst);
        }
    }

    struct Harness {
        controller: Arc<IdleController>,
        lifecycle: Arc<FakeLifecycle>,
        hooks: Arc<FakeHooks>,
    }

    fn config(containers: &[&str]) -> SleepConfig {
        SleepConfig {
            sleep_after: SLEEP_AFTER,
            wake_timeout: WAKE_TIMEOUT,
            containers: containers.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn harness_with(config: SleepConfig, restored: IdleState) -> Harness {
        let lifecycle = Arc::new(FakeLifecycle::default());
        let hooks = Arc::new(FakeHooks::default());
        let controller = IdleController::new(
            "web".into(),
            config,
            lifecycle.clone(),
            hooks.clone(),
            restored,
        );
        Harness {
            controller,
            lifecycle,
            hooks,
        }
    }

    fn harness(containers: &[&str]) -> Harness {
        harness_with(config(containers), IdleState::Active)
    }

    /// Lets spawned tasks run without moving the (paused) clock.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// Moves the clock by `by` and lets everything due run.
    async fn pass(by: Duration) {
        sleep(by).await;
        settle().await;
    }

    impl Harness {
        async fn put_to_sleep(&self) {
            pass(SLEEP_AFTER).await;
            assert_eq!(self.controller.state(), IdleState::Sleeping);
        }
    }

    fn spawn_admit(
        controller: &Arc<IdleController>,
    ) -> tokio::task::JoinHandle<Result<InFlight, WakeError>> {
        let controller = Arc::clone(controller);
        tokio::spawn(async move { controller.admit().await })
    }

    #[test]
    fn idle_state_names_round_trip() {
        for state in [
            IdleState::Active,
            IdleState::Stopping,
            IdleState::Sleeping,
            IdleState::Waking,
        ] {
            assert_eq!(state.to_string(), state.as_str());
            let restored = IdleState::parse(state.as_str());
            let expected = match state {
                IdleState::Active => IdleState::Active,
                _ => IdleState::Sleeping,
            };
            assert_eq!(restored, expected);
        }
        assert_eq!(IdleState::parse(""), IdleState::Active);
        assert_eq!(IdleState::parse("paused"), IdleState::Active);
        assert_eq!(IdleState::Sleeping.to_string(), "sleeping");
    }

    #[test]
    fn backoff_doubles_to_thirty_seconds() {
        let seconds: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(seconds, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(
            whole_seconds(Duration::from_millis(1)),
            Duration::from_secs(1)
        );
        assert_eq!(
            whole_seconds(Duration::from_millis(1500)),
            Duration::from_secs(2)
        );
        assert_eq!(
            whole_seconds(Duration::from_secs(2)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn in_flight_guard_can_live_in_a_response_body() {
        fn send_static<T: Send + Sync + 'static>() {}
        send_static::<InFlight>();
        send_static::<Arc<IdleController>>();
        fn send_future<F: Future + Send>(_: F) {}
        let h = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        h.block_on(async {
            let harness = harness(&["a"]);
            send_future(harness.controller.admit());
        });
    }

    #[tokio::test(start_paused = true)]
    async fn sleeps_exactly_after_the_idle_period() {
        let h = harness(&["a", "b"]);
        pass(SLEEP_AFTER - Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Active);
        assert!(h.lifecycle.calls().is_empty());

        pass(Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Sleeping);
        assert_eq!(h.hooks.suspends(), 1);
        assert_eq!(h.hooks.persists(), 1);
        let stopped: Vec<String> = h
            .lifecycle
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Stop(container, _) => Some(container),
                Call::Start(_) => None,
            })
            .collect();
        assert_eq!(stopped, ["a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn never_sleeps_without_sleep_after_or_containers() {
        let off = harness_with(
            SleepConfig {
                sleep_after: Duration::ZERO,
                ..config(&["a"])
            },
            IdleState::Active,
        );
        let nothing = harness(&[]);
        pass(SLEEP_AFTER * 10).await;
        assert_eq!(off.controller.state(), IdleState::Active);
        assert_eq!(nothing.controller.state(), IdleState::Active);
        assert!(off.lifecycle.calls().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_blocks_sleep_and_its_end_restarts_the_idle_period() {
        let h = harness(&["a"]);
        let request = h.controller.admit().await.unwrap();
        pass(SLEEP_AFTER * 10).await;
        assert_eq!(h.controller.state(), IdleState::Active);
        assert!(h.lifecycle.calls().is_empty());

        drop(request);
        pass(SLEEP_AFTER - Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Active);
        pass(Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Sleeping);
    }

    #[tokio::test(start_paused = true)]
    async fn wakes_on_the_next_request_with_one_start_per_container() {
        let h = harness(&["a", "b"]);
        h.put_to_sleep().await;

        let request = h.controller.admit().await.unwrap();
        assert_eq!(h.controller.state(), IdleState::Active);
        assert_eq!(h.lifecycle.starts(), 2);
        assert_eq!(h.hooks.resumes(), 1);
        assert!(matches!(h.lifecycle.calls()[2], Call::Start(ref c) if c == "a"));
        assert!(matches!(h.lifecycle.calls()[3], Call::Start(ref c) if c == "b"));
        drop(request);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_share_one_wake() {
        let h = harness(&["a", "b"]);
        h.put_to_sleep().await;
        h.lifecycle.slow_starts(Duration::from_secs(1));

        let admissions = (0..20).map(|_| h.controller.admit());
        let results = futures_util::future::join_all(admissions).await;

        assert!(results.iter().all(Result::is_ok));
        assert_eq!(h.lifecycle.starts(), 2, "exactly one start per container");
        assert_eq!(h.hooks.resumes(), 1);
        assert_eq!(h.controller.state(), IdleState::Active);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_does_not_cancel_the_wake_and_the_service_sleeps_again() {
        let h = harness(&["a"]);
        h.put_to_sleep().await;
        h.lifecycle.slow_starts(Duration::from_secs(5));

        // The client hangs up after a second (its own deadline, or a closed connection).
        let gave_up = tokio::time::timeout(Duration::from_secs(1), h.controller.admit()).await;
        assert!(gave_up.is_err());
        assert_eq!(h.controller.state(), IdleState::Waking);

        pass(Duration::from_secs(4)).await;
        assert_eq!(h.controller.state(), IdleState::Active);
        assert_eq!(h.lifecycle.starts(), 1);
        assert_eq!(h.hooks.persists(), 2);

        // Nobody is left waiting, yet the timer is re-armed by the wake itself.
        pass(SLEEP_AFTER - Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Active);
        pass(Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Sleeping);
        assert_eq!(h.lifecycle.stops(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_wakes_back_off_and_fail_fast_without_a_start() {
        let h = harness(&["a"]);
        h.put_to_sleep().await;
        h.lifecycle
            .fail_start("a", Some(LifecycleError::NotFound("a".into())));

        for (attempt, expected) in [1u64, 2, 4, 8, 16, 30, 30].into_iter().enumerate() {
            let backoff = Duration::from_secs(expected);
            let error = h.controller.admit().await.unwrap_err();
            assert_eq!(
                error,
                WakeError::Failed {
                    retry_after: backoff
                }
            );
            assert_eq!(h.lifecycle.starts(), attempt + 1);

            // Halfway through the window: an instant failure, no container call, and a
            // Retry-After that tells what is really left.
            let half = backoff / 2;
            pass(half).await;
            let asked = Instant::now();
            let error = h.controller.admit().await.unwrap_err();
            assert_eq!(asked.elapsed(), Duration::ZERO);
            assert_eq!(error.retry_after(), Some(whole_seconds(backoff - half)));
            assert_eq!(h.lifecycle.starts(), attempt + 1);

            pass(backoff - half).await;
        }
        assert_eq!(h.controller.state(), IdleState::Sleeping);
        assert_eq!(h.hooks.persists(), 1, "failed wakes are not persisted");
        // A refused start left nothing running, so nothing was stopped again.
        assert_eq!(h.lifecycle.stops(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_stop_holds_requests_until_the_targets_are_ready() {
        let h = harness(&["a", "b"]);
        h.lifecycle.slow_stop("a", Duration::from_secs(10));
        h.lifecycle
            .fail_stop("b", Some(LifecycleError::Transport("refused".into())));
        h.hooks.slow_readiness(Duration::from_secs(2));

        pass(SLEEP_AFTER).await;
        assert_eq!(h.controller.state(), IdleState::Stopping);
        assert_eq!(h.hooks.suspends(), 1);
        let arrived = Instant::now();
        let held = spawn_admit(&h.controller);

        let request = held.await.unwrap().unwrap();
        let released = Instant::now();
        assert_eq!(released - arrived, Duration::from_secs(12));
        assert_eq!(h.hooks.ready_at(), [released], "released only once ready");
        assert_eq!(h.controller.state(), IdleState::Active);
        assert_eq!(h.hooks.persists(), 0);
        // The stop of "b" got what "a" left of the shared 30 s budget.
        let calls = h.lifecycle.calls();
        assert_eq!(calls[0], Call::Stop("a".into(), Duration::from_secs(30)));
        assert_eq!(calls[1], Call::Stop("b".into(), Duration::from_secs(20)));
        // What did stop is started again, so the service is whole.
        assert_eq!(calls[2], Call::Start("a".into()));
        assert_eq!(calls.len(), 3);

        // The timer is re-armed: with the stop fixed, it sleeps a full period later.
        drop(request);
        h.lifecycle.fail_stop("b", None);
        pass(SLEEP_AFTER).await;
        assert_eq!(h.controller.state(), IdleState::Stopping);
        pass(Duration::from_secs(10)).await;
        assert_eq!(h.controller.state(), IdleState::Sleeping);
        assert_eq!(h.hooks.persists(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn every_stop_is_attempted_under_one_budget() {
        let h = harness(&["a", "b", "c"]);
        h.lifecycle
            .fail_stop("a", Some(LifecycleError::Transport("refused".into())));
        h.lifecycle.slow_stop("b", Duration::from_secs(40));
        pass(SLEEP_AFTER).await;
        pass(Duration::from_secs(30)).await;

        let stops: Vec<Call> = h
            .lifecycle
            .calls()
            .into_iter()
            .filter(|c| matches!(c, Call::Stop(..)))
            .collect();
        assert_eq!(
            stops,
            [
                Call::Stop("a".into(), Duration::from_secs(30)),
                Call::Stop("b".into(), Duration::from_secs(30)),
                Call::Stop("c".into(), Duration::ZERO),
            ]
        );
        assert_eq!(h.controller.state(), IdleState::Active);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wake_that_never_gets_ready_stops_what_it_started_and_sleeps() {
        let h = harness(&["a"]);
        h.put_to_sleep().await;
        h.hooks.never_ready(true);

        let arrived = Instant::now();
        let error = h.controller.admit().await.unwrap_err();
        assert_eq!(Instant::now() - arrived, WAKE_TIMEOUT);
        assert_eq!(
            error,
            WakeError::TimedOut {
                retry_after: Duration::from_secs(1)
            }
        );
        settle().await;

        assert_eq!(h.controller.state(), IdleState::Sleeping);
        let calls = h.lifecycle.calls();
        assert_eq!(calls[1], Call::Start("a".into()));
        assert!(matches!(calls[2], Call::Stop(ref c, _) if c == "a"));
        assert_eq!(h.hooks.suspends(), 2);
        assert_eq!(h.hooks.persists(), 1);
        assert_eq!(h.controller.health_check(), HealthAnswer::Unhealthy);
        // Nothing runs unaccounted, so nothing more happens while it sleeps.
        pass(SLEEP_AFTER * 3).await;
        assert_eq!(h.lifecycle.calls().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_wake_that_cannot_clean_up_stays_awake_and_sleeps_later() {
        let h = harness(&["a", "b"]);
        h.put_to_sleep().await;
        h.lifecycle
            .fail_start("b", Some(LifecycleError::NotFound("b".into())));
        h.lifecycle
            .fail_stop("a", Some(LifecycleError::Transport("refused".into())));
        h.lifecycle.slow_stop("a", Duration::from_secs(1));

        // The waiter learns of the failure at once, not after the cleanup.
        let arrived = Instant::now();
        let error = h.controller.admit().await.unwrap_err();
        assert_eq!(
            error,
            WakeError::Failed {
                retry_after: Duration::from_secs(1)
            }
        );
        assert_eq!(Instant::now(), arrived);
        assert_eq!(h.controller.state(), IdleState::Waking);
        pass(Duration::from_secs(1)).await;
        assert_eq!(h.controller.state(), IdleState::Active);
        assert_eq!(h.hooks.persists(), 1);
        // Only "a" was started, so only "a" is stopped; "b" never ran.
        let calls = h.lifecycle.calls();
        assert_eq!(
            &calls[2..],
            [
                Call::Start("a".into()),
                Call::Start("b".into()),
                Call::Stop("a".into(), Duration::from_secs(30)),
            ]
        );

        h.lifecycle.fail_stop("a", None);
        h.lifecycle.slow_stop("a", Duration::ZERO);
        pass(SLEEP_AFTER - Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Active);
        pass(Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Sleeping);
    }

    #[tokio::test(start_paused = true)]
    async fn reconfigure_mid_wake_supersedes_the_late_outcome() {
        let h = harness(&["a"]);
        h.put_to_sleep().await;
        h.lifecycle.slow_starts(Duration::from_secs(10));
        h.lifecycle
            .fail_start("a", Some(LifecycleError::Transport("refused".into())));

        let held = spawn_admit(&h.controller);
        pass(Duration::from_secs(1)).await;
        assert_eq!(h.controller.state(), IdleState::Waking);

        // A redeploy lands: new containers, and the old wake's failure must not count.
        h.lifecycle.slow_starts(Duration::ZERO);
        h.controller.reconfigure(config(&["b"]));
        let request = held.await.unwrap().unwrap();
        assert_eq!(h.controller.state(), IdleState::Active);

        pass(Duration::from_secs(20)).await;
        assert_eq!(h.controller.state(), IdleState::Active);
        assert_eq!(h.controller.health_check(), HealthAnswer::Forward);
        assert_eq!(h.hooks.suspends(), 1, "the stale wake suspended nothing");
        assert_eq!(h.lifecycle.stops(), 1, "the stale wake stopped nothing");
        assert_eq!(h.lifecycle.calls().last(), Some(&Call::Start("b".into())));
        drop(request);
    }

    #[tokio::test(start_paused = true)]
    async fn reconfigure_to_new_containers_while_asleep_wakes_them() {
        let h = harness(&["a"]);
        h.put_to_sleep().await;

        h.controller.reconfigure(config(&["b"]));
        settle().await;
        assert_eq!(h.controller.state(), IdleState::Active);
        assert_eq!(h.lifecycle.calls().last(), Some(&Call::Start("b".into())));
        assert_eq!(h.hooks.persists(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn reconfigure_while_active_restarts_the_idle_period() {
        let h = harness(&["a"]);
        pass(SLEEP_AFTER / 2).await;
        h.controller.reconfigure(config(&["b"]));
        pass(SLEEP_AFTER - Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Active);
        pass(Duration::from_millis(1)).await;
        assert_eq!(h.controller.state(), IdleState::Sleeping);
        assert_eq!(
            h.lifecycle.calls(),
            [Call::Stop("b".into(), Duration::from_secs(30))]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reconfigure_with_the_same_containers_only_updates_durations() {
        let h = harness(&["a"]);
        h.put_to_sleep().await;
        h.controller.reconfigure(SleepConfig {
            sleep_after: Duration::from_secs(10),
            ..config(&["a"])
        });
        settle().await;
        assert_eq!(h.controller.state(), IdleState::Sleeping);
        assert_eq!(h.lifecycle.starts(), 0);

        drop(h.controller.admit().await.unwrap());
        pass(Duration::from_secs(10)).await;
        assert_eq!(h.controller.state(), IdleState::Sleeping);
        assert_eq!(h.lifecycle.stops(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn persists_exactly_the_sleep_and_wake_edges() {
        let h = harness(&["a"]);
        for cycle in 1..=2 {
            h.put_to_sleep().await;
            drop(h.controller.admit().await.unwrap());
            assert_eq!(h.hooks.persists(), 2 * cycle);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn health_checks_are_answered_without_waking() {
        let h = harness(&["a"]);
        assert_eq!(h.controller.health_check(), HealthAnswer::Forward);
        h.put_to_sleep().await;

        assert_eq!(h.controller.health_check(), HealthAnswer::Healthy);
        pass(Duration::from_secs(5)).await;
        assert_eq!(h.lifecycle.starts(), 0);
        assert_eq!(h.controller.state(), IdleState::Sleeping);

        h.lifecycle
            .fail_start("a", Some(LifecycleError::NotFound("a".into())));
        assert!(h.controller.admit().await.is_err());
        settle().await;
        assert_eq!(h.controller.health_check(), HealthAnswer::Unhealthy);

        h.lifecycle.fail_start("a", None);
        pass(Duration::from_secs(1)).await;
        let request = h.controller.admit().await.unwrap();
        assert_eq!(h.controller.health_check(), HealthAnswer::Forward);
        drop(request);
        h.put_to_sleep().await;
        assert_eq!(
            h.controller.health_check(),
            HealthAnswer::Healthy,
            "a success clears it"
        );
        assert_eq!(h.lifecycle.starts(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_restored_sleeping_service_suspends_without_container_calls() {
        for persisted in ["sleeping", "stopping", "waking"] {
            let h = harness_with(config(&["a"]), IdleState::parse(persisted));
            assert_eq!(h.controller.state(), IdleState::Sleeping);
            assert_eq!(h.hooks.suspends(), 1);
            pass(SLEEP_AFTER * 2).await;
            assert!(h.lifecycle.calls().is_empty());
            assert_eq!(h.hooks.persists(), 0);

            drop(h.controller.admit().await.unwrap());
            assert_eq!(h.lifecycle.calls(), [Call::Start("a".into())]);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_start_times_out_within_the_wake_timeout() {
        let h = harness_with(
            SleepConfig {
                wake_timeout: Duration::from_secs(5),
                ..config(&["a"])
            },
            IdleState::Sleeping,
        );
        h.lifecycle.slow_starts(Duration::from_secs(60));

        let arrived = Instant::now();
        let error = h.controller.admit().await.unwrap_err();
        assert_eq!(Instant::now() - arrived, Duration::from_secs(5));
        assert!(matches!(error, WakeError::TimedOut { .. }));
        settle().await;

        // The start did not answer in time, so it may have happened: it is stopped again.
        assert_eq!(h.controller.state(), IdleState::Sleeping);
        assert!(matches!(h.lifecycle.calls()[1], Call::Stop(ref c, _) if c == "a"));
    }

    #[tokio::test(start_paused = true)]
    async fn one_deadline_covers_a_stop_then_a_wake() {
        let h = harness_with(
            SleepConfig {
                wake_timeout: Duration::from_secs(5),
                ..config(&["a"])
            },
            IdleState::Active,
        );
        h.lifecycle.slow_stop("a", Duration::from_secs(3));
        h.lifecycle.slow_starts(Duration::from_secs(3));
        pass(SLEEP_AFTER).await;
        assert_eq!(h.controller.state(), IdleState::Stopping);

        let arrived = Instant::now();
        let error = h.controller.admit().await.unwrap_err();
        assert_eq!(Instant::now() - arrived, Duration::from_secs(5));
        assert!(matches!(error, WakeError::TimedOut { .. }));
        assert_eq!(
            h.lifecycle.starts(),
            1,
            "the held request started the wake itself"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn close_fails_parked_requests_and_stops_the_timer() {
        let h = harness(&["a"]);
        h.put_to_sleep().await;
        h.lifecycle.slow_starts(Duration::from_secs(10));

        let held = spawn_admit(&h.controller);
        pass(Duration::from_secs(1)).await;
        h.controller.close();
        assert_eq!(held.await.unwrap().unwrap_err(), WakeError::Closed);
        assert_eq!(h.controller.admit().await.unwrap_err(), WakeError::Closed);

        // The wake was abandoned where it stood: no cleanup, no further calls.
        pass(SLEEP_AFTER * 2).await;
        assert_eq!(h.lifecycle.calls().len(), 2);
        assert_eq!(h.hooks.resumes(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_controller_stops_its_timer() {
        let h = harness(&["a"]);
        let request = h.controller.admit().await.unwrap();
        drop(h.controller);
        drop(request);
        pass(SLEEP_AFTER * 2).await;
        assert!(h.lifecycle.calls().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_outcome_is_refused() {
        let h = harness(&["a"]);
        h.put_to_sleep().await;
        let began = h.controller.shared.lock().generation;
        h.controller.reconfigure(config(&["b"]));
        settle().await;

        let applied = h.controller.shared.settle(began, IdleState::Sleeping, |_| {
            panic!("a stale outcome must not run its side effects")
        });
        assert!(!applied);
        assert_eq!(h.controller.state(), IdleState::Active);
        assert!(!h.controller.shared.record_wake_failure(began));
        assert_eq!(h.controller.health_check(), HealthAnswer::Forward);
    }

    /// On a real multi-threaded runtime, hammers admission against a tiny `sleep_after`:
    /// a stop must never begin while a request holds its guard.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_stops_under_a_request_in_flight() {
        struct Counting {
            inner: FakeLifecycle,
            in_flight: Arc<AtomicUsize>,
            violations: AtomicUsize,
        }
        impl ContainerLifecycle for Counting {
            fn start<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
                self.inner.start(container)
            }
            fn stop<'a>(&'a self, container: &'a str, budget: Duration) -> LifecycleFuture<'a, ()> {
                if self.in_flight.load(Ordering::SeqCst) != 0 {
                    self.violations.fetch_add(1, Ordering::SeqCst);
                }
                self.inner.stop(container, budget)
            }
            fn inspect<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
                self.inner.inspect(container)
            }
        }

        let in_flight = Arc::new(AtomicUsize::new(0));
        let lifecycle = Arc::new(Counting {
            inner: FakeLifecycle::default(),
            in_flight: in_flight.clone(),
            violations: AtomicUsize::new(0),
        });
        let controller = IdleController::new(
            "web".into(),
            SleepConfig {
                sleep_after: Duration::from_micros(200),
                wake_timeout: Duration::from_secs(10),
                containers: vec!["a".into()],
            },
            lifecycle.clone(),
            Arc::new(FakeHooks::default()),
            IdleState::Active,
        );
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let controller = controller.clone();
                let in_flight = in_flight.clone();
                tokio::spawn(async move {
                    for round in 0..300u32 {
                        let guard = controller.admit().await.unwrap();
                        in_flight.fetch_add(1, Ordering::SeqCst);
                        if round % 7 == 0 {
                            tokio::time::sleep(Duration::from_micros(300)).await;
                        }
                        tokio::task::yield_now().await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        drop(guard);
                        if round % 5 == 0 {
                            tokio::time::sleep(Duration::from_micros(500)).await;
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.await.unwrap();
        }
        assert_eq!(lifecycle.violations.load(Ordering::SeqCst), 0);
        assert!(lifecycle.inner.stops() > 0, "the race was exercised");
    }

    #[test]
    fn wake_errors_explain_themselves_without_detail() {
        let failed = WakeError::Failed {
            retry_after: Duration::from_secs(4),
        };
        assert_eq!(failed.retry_after(), Some(Duration::from_secs(4)));
        assert!(failed.to_string().contains("4s"));
        assert_eq!(WakeError::Closed.retry_after(), None);
    }
}
