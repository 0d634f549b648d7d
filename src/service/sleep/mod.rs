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
mod tests;
