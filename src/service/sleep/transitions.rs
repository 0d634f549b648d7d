//! The controller's transitions: admission, the idle timer, falling asleep, waking, and
//! the recoveries after a failed stop or wake. The state they share is defined in the
//! parent module; everything here runs on the controller's own tasks or under its lock.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, sleep_until, timeout_at};

use super::selection::{Plan, WakeFailure, may_have_started};
use super::*;
use crate::lifecycle::LifecycleError;

/// What was left after stopping a list of containers.
#[derive(Default)]
pub(super) struct StopReport {
    stopped: Vec<String>,
    failed: Vec<(String, LifecycleError)>,
}

impl Shared {
    /// The state lock. A poisoned lock is recovered rather than propagated: every critical
    /// section updates the state fields before calling out (the only foreign code run under
    /// it is `SleepHooks::suspend`), so a panic there leaves a coherent state, and turning it
    /// into a panic on every later request of the service would help nobody.
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn state(&self) -> IdleState {
        IdleState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(super) fn try_admit(self: &Arc<Self>) -> Option<InFlight> {
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
                    return Some(InFlight::new(Arc::clone(self) as Arc<dyn Activity>));
                }
                Err(actual) => current = actual,
            }
        }
        None
    }

    pub(super) async fn admit_slowly(self: &Arc<Self>) -> Result<InFlight, WakeError> {
        // Subscribe before the first look at the state, so no transition can slip between
        // the look and the wait.
        let mut changes = self.changed.subscribe();
        let deadline = Instant::now() + self.lock().config.wake_timeout;
        let _held = HeldRequest::new(self.metrics.as_deref());
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
    pub(super) fn admission_step(self: &Arc<Self>) -> Result<Option<InFlight>, WakeError> {
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
            (IdleState::Sleeping | IdleState::Frozen | IdleState::Waking, Some(retry_after)) => {
                Err(WakeError::Failed { retry_after })
            }
            (IdleState::Sleeping | IdleState::Frozen, None) => {
                self.begin_wake(&mut inner);
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    pub(super) fn timed_out(&self) -> WakeError {
        let retry_after = self
            .lock()
            .backoff_remaining(Instant::now())
            .unwrap_or(Duration::from_secs(1));
        WakeError::TimedOut { retry_after }
    }

    pub(super) fn touch(&self) {
        self.last_activity
            .fetch_max(self.since_epoch(Instant::now()), Ordering::AcqRel);
    }

    pub(super) fn since_epoch(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    pub(super) fn last_activity(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.last_activity.load(Ordering::Acquire))
    }

    /// Moves to `state` (the caller holds the lock and has checked the move is allowed).
    pub(super) fn enter(&self, inner: &mut Inner, state: IdleState) {
        inner.state = state;
        inner.generation += 1;
        self.state.store(state.to_u8(), Ordering::Release);
        if let Some(m) = &self.metrics {
            m.set_state(state.as_str());
        }
        match state {
            IdleState::Active => {
                // Back to active restarts the idle period, whoever is (or is not) waiting.
                inner.asleep_since = None;
                self.touch();
                self.gate.fetch_or(OPEN, Ordering::AcqRel);
                self.nudge.notify_one();
            }
            // The timer now counts towards the stopped tier.
            IdleState::Frozen => self.nudge.notify_one(),
            _ => {}
        }
        self.changed.send_replace(state);
    }

    /// Applies the outcome of the operation that began at `generation`, unless something
    /// newer (a reconfigure, close) has happened since. `then` runs under the lock, after
    /// the move.
    pub(super) fn settle(
        &self,
        generation: u64,
        state: IdleState,
        then: impl FnOnce(&mut Inner),
    ) -> bool {
        let mut inner = self.lock();
        if inner.closed || inner.generation != generation {
            return false;
        }
        self.enter(&mut inner, state);
        then(&mut inner);
        true
    }

    pub(super) fn spawn_operation<F>(&self, inner: &mut Inner, operation: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let token = self.closing.child_token();
        inner.operation = Some(token.clone());
        tokio::spawn(token.run_until_cancelled_owned(operation));
    }

    // ---- Sleeping ---------------------------------------------------------------------

    pub(super) async fn run_timer(self: Arc<Self>) {
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

    /// When the service may next freeze or fall asleep, or `None` to wait for a nudge.
    pub(super) fn next_sleep_check(&self) -> Option<Instant> {
        let inner = self.lock();
        if inner.closed || !inner.config.may_sleep() {
            return None;
        }
        match inner.state {
            IdleState::Active if self.gate.load(Ordering::Acquire) & COUNT == 0 => {
                Some(self.last_activity() + inner.config.first_tier_after())
            }
            // Frozen since the last request: stopped once idle for `sleep_after` in all.
            IdleState::Frozen if !inner.config.sleep_after.is_zero() => {
                Some(self.last_activity() + inner.config.sleep_after)
            }
            _ => None,
        }
    }

    pub(super) fn try_begin_sleep(self: &Arc<Self>) {
        let mut inner = self.lock();
        if inner.closed || !inner.config.may_sleep() {
            return;
        }
        let from = inner.state;
        let tier = match from {
            IdleState::Active => {
                // Closing the gate fails if a request is in flight; the timer waits for
                // its end.
                if self
                    .gate
                    .compare_exchange(OPEN, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    return;
                }
                // A request may have come and gone between the timer's deadline and the
                // close; its end restarts the idle period.
                if Instant::now() < self.last_activity() + inner.config.first_tier_after() {
                    self.gate.fetch_or(OPEN, Ordering::AcqRel);
                    return;
                }
                if inner.config.freeze_after.is_zero() {
                    IdleState::Stopping
                } else {
                    IdleState::Freezing
                }
            }
            IdleState::Frozen => {
                let sleep_after = inner.config.sleep_after;
                if sleep_after.is_zero() || Instant::now() < self.last_activity() + sleep_after {
                    return;
                }
                IdleState::Stopping
            }
            _ => return,
        };
        self.enter(&mut inner, tier);
        let generation = inner.generation;
        tracing::debug!(service = %self.service, state = %tier, "Idle service leaving active");
        if from == IdleState::Active {
            // Pools first: no probe should see (and log) the containers going down.
            self.hooks.suspend();
            inner.asleep_since = Some(SystemTime::now());
        }
        let plan = Plan::of(&inner);
        let this = Arc::clone(self);
        self.spawn_operation(&mut inner, this.fall_asleep(generation, from, tier, plan));
    }

    pub(super) async fn fall_asleep(
        self: Arc<Self>,
        generation: u64,
        from: IdleState,
        tier: IdleState,
        plan: Plan,
    ) {
        let frozen = tier == IdleState::Freezing;
        let containers = match self.live_containers(&plan).await {
            Ok(containers) => containers,
            Err(error) => {
                tracing::warn!(service = %self.service, labels = %plan.selector.join(","), error = %error, "Failed to list idle containers");
                self.count_sleep(frozen, false);
                let back = if from == IdleState::Frozen {
                    plan.remembered.clone()
                } else {
                    Vec::new()
                };
                self.recover(
                    generation,
                    &back,
                    "Failed to restore targets after a failed sleep",
                )
                .await;
                return;
            }
        };
        let report = if frozen {
            self.freeze_each(&containers).await
        } else {
            self.stop_each(&containers, false).await
        };
        if report.failed.is_empty() {
            let state = if frozen {
                IdleState::Frozen
            } else {
                IdleState::Sleeping
            };
            let remembered = containers.clone();
            let settled = self.settle(generation, state, |inner| {
                // Nothing live to act on (someone else stopped them): keep what a wake
                // should bring back.
                if !remembered.is_empty() {
                    inner.remembered = remembered;
                }
            });
            if settled {
                tracing::info!(
                    service = %self.service,
                    containers = %containers.join(","),
                    "{}",
                    if frozen { "Froze idle service" } else { "Sleeping idle service" }
                );
                self.count_sleep(frozen, true);
                self.hooks.persist();
            }
            return;
        }
        self.count_sleep(frozen, false);
        self.log_stop_failures(
            &report.failed,
            if frozen {
                "Failed to freeze idle container"
            } else {
                "Failed to stop idle container"
            },
        );
        // Held requests stay held until the service can serve again. From frozen, the
        // containers this stop did not reach are still frozen: bring them all back.
        let back = if from == IdleState::Frozen {
            containers
        } else {
            report.stopped
        };
        self.recover(
            generation,
            &back,
            "Failed to restore targets after a failed sleep",
        )
        .await;
    }

    fn count_sleep(&self, frozen: bool, ok: bool) {
        if let Some(m) = &self.metrics {
            m.slept(frozen, ok);
        }
    }

    /// Freezes each container under one shared budget, attempting every one.
    pub(super) async fn freeze_each(&self, containers: &[String]) -> StopReport {
        let deadline = Instant::now() + STOP_BUDGET;
        let mut report = StopReport::default();
        for container in containers {
            let outcome = timeout_at(deadline, self.lifecycle.freeze(container))
                .await
                .unwrap_or_else(|_| Err(LifecycleError::Timeout(container.clone())));
            match outcome {
                Ok(()) => report.stopped.push(container.clone()),
                Err(error) => report.failed.push((container.clone(), error)),
            }
        }
        report
    }

    /// Stops each container in order under one shared budget, attempting every one even
    /// after a failure. During a cleanup a container the runtime does not know counts as
    /// stopped (it is not running); when going to sleep it does not, because a service whose
    /// container is gone would never wake again, and staying awake keeps the rest serving.
    pub(super) async fn stop_each(&self, containers: &[String], cleanup: bool) -> StopReport {
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
    /// so held requests never meet an empty pool; when none gets ready it is left asleep.
    /// Not persisted: the service never reached a persisted sleeping edge from here.
    pub(super) async fn recover(
        &self,
        generation: u64,
        stopped: &[String],
        not_ready: &'static str,
    ) {
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
        if matches!(ready, Ok(Ok(()))) {
            self.settle(generation, IdleState::Active, |_| {});
            return;
        }
        tracing::error!(service = %self.service, "{not_ready}");
        // Nothing serves. Active would be a dead end: every request would meet an empty
        // pool, and that traffic would keep the idle timer from ever sleeping it. Asleep,
        // the next request (after the failure backoff) wakes it: starts whatever is not
        // running, which a container that did stop needs, and waits for it to be ready.
        self.settle(generation, IdleState::Sleeping, |_| self.hooks.suspend());
    }

    // ---- Waking -----------------------------------------------------------------------

    pub(super) fn begin_wake(self: &Arc<Self>, inner: &mut Inner) {
        // A wake superseding a freeze in progress thaws; anything else starts (each also
        // handles the other tier, see `ContainerLifecycle`).
        let frozen = inner.state.is_frozen();
        self.enter(inner, IdleState::Waking);
        let generation = inner.generation;
        let deadline = Instant::now() + inner.config.wake_timeout;
        let plan = Plan::of(inner);
        let this = Arc::clone(self);
        self.spawn_operation(inner, this.wake(generation, frozen, plan, deadline));
    }

    pub(super) async fn wake(
        self: Arc<Self>,
        generation: u64,
        frozen: bool,
        plan: Plan,
        deadline: Instant,
    ) {
        let began = Instant::now();
        let tier = if frozen { "frozen" } else { "sleeping" };
        tracing::info!(service = %self.service, containers = %plan.describe(), from = tier, "Waking service");
        let mut maybe_running = Vec::new();
        let outcome = self
            .bring_up(&plan, frozen, deadline, &mut maybe_running)
            .await;
        let list = maybe_running.join(",");
        match outcome {
            Ok(()) => {
                let awake = self.settle(generation, IdleState::Active, |inner| {
                    inner.failures = 0;
                    inner.retry_at = None;
                    self.wake_failed.store(false, Ordering::Release);
                });
                if awake {
                    let took = began.elapsed();
                    tracing::info!(
                        service = %self.service,
                        containers = %list,
                        from = tier,
                        wake_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
                        "Service awake"
                    );
                    if let Some(m) = &self.metrics {
                        m.woke(frozen, true, took.as_secs_f64());
                    }
                    self.hooks.persist();
                }
            }
            Err(failure) => {
                tracing::warn!(
                    service = %self.service,
                    containers = %plan.describe(),
                    from = tier,
                    error = %failure,
                    "Failed to wake service"
                );
                if self.record_wake_failure(generation) {
                    if let Some(m) = &self.metrics {
                        m.woke(frozen, false, 0.0);
                    }
                    let cleanup = plan.after_failed_wake(frozen, maybe_running);
                    self.stand_down(generation, &cleanup).await;
                }
            }
        }
    }

    /// Thaws (from frozen) or starts each container in order (aborting on the first
    /// error), then waits for the pools, all inside the wake's deadline. `maybe_running`
    /// collects what this wake may have started, for the cleanup if it fails.
    pub(super) async fn bring_up(
        &self,
        plan: &Plan,
        frozen: bool,
        deadline: Instant,
        maybe_running: &mut Vec<String>,
    ) -> Result<(), WakeFailure> {
        let mut gone = plan.remembered.is_empty();
        for container in &plan.wake_targets() {
            maybe_running.push(container.clone());
            let op = if frozen {
                self.lifecycle.thaw(container)
            } else {
                self.lifecycle.start(container)
            };
            match timeout_at(deadline, op).await {
                Ok(Ok(())) => {}
                // With a selector, a remembered container that is gone (Kamal pruned it)
                // is replaced below by the newest one the labels match.
                Ok(Err(LifecycleError::NotFound(_))) if !plan.selector.is_empty() => {
                    maybe_running.pop();
                    gone = true;
                }
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
        if !plan.selector.is_empty() && gone {
            self.wake_stand_in(plan, deadline, maybe_running).await?;
        }
        match timeout_at(deadline, self.hooks.resume_until_ready(deadline)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(())) | Err(_) => Err(WakeFailure::NotReady),
        }
    }

    /// Starts the backoff and tells parked requests at once; the state stays `Waking` while
    /// the cleanup runs, so new requests fail fast instead of starting another wake.
    pub(super) fn record_wake_failure(&self, generation: u64) -> bool {
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
    pub(super) async fn stand_down(&self, generation: u64, maybe_running: &[String]) {
        let report = self.stop_each(maybe_running, true).await;
        if report.failed.is_empty() {
            self.settle(generation, IdleState::Sleeping, |_| self.hooks.suspend());
            return;
        }
        self.log_stop_failures(
            &report.failed,
            "Failed to stop container after a failed wake",
        );
        self.recover(
            generation,
            &report.stopped,
            "Failed to restore targets after a failed wake",
        )
        .await;
    }
}

/// Counts a request in the held-requests gauge for as long as it waits.
pub(super) struct HeldRequest<'a>(Option<&'a SleepMetrics>);

impl<'a> HeldRequest<'a> {
    pub(super) fn new(metrics: Option<&'a SleepMetrics>) -> Self {
        if let Some(m) = metrics {
            m.held(1);
        }
        HeldRequest(metrics)
    }
}

impl Drop for HeldRequest<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.0 {
            m.held(-1);
        }
    }
}

impl Shared {
    /// One warning per container that would not stop; the message says which recovery.
    fn log_stop_failures(&self, failed: &[(String, LifecycleError)], message: &'static str) {
        for (container, error) in failed {
            tracing::warn!(service = %self.service, containers = %container, error = %error, "{}", message);
        }
    }
}

/// 1 s after the first failed wake, doubling up to 30 s.
pub(super) fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(5);
    Duration::from_secs(1 << exponent).min(MAX_BACKOFF)
}

/// Rounds up to whole seconds, at least one (what `Retry-After` can say).
pub(super) fn whole_seconds(duration: Duration) -> Duration {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    Duration::from_secs(seconds.max(1))
}
