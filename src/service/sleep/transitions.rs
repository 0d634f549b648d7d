//! The controller's transitions: admission, the idle timer, falling asleep, waking, and
//! the recoveries after a failed stop or wake. The state they share is defined in the
//! parent module; everything here runs on the controller's own tasks or under its lock.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};

use super::*;
use crate::lifecycle::LifecycleError;

/// What was left after stopping a list of containers.
#[derive(Default)]
pub(super) struct StopReport {
    stopped: Vec<String>,
    failed: Vec<(String, LifecycleError)>,
}

/// Why a wake failed; logged, never shown to a client.
#[derive(Debug)]
pub(super) enum WakeFailure {
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

    /// When the service may next fall asleep, or `None` to wait for a nudge.
    pub(super) fn next_sleep_check(&self) -> Option<Instant> {
        let inner = self.lock();
        let eligible =
            inner.state == IdleState::Active && !inner.closed && inner.config.may_sleep();
        if !eligible || self.gate.load(Ordering::Acquire) & COUNT != 0 {
            return None;
        }
        Some(self.last_activity() + inner.config.sleep_after)
    }

    pub(super) fn try_begin_sleep(self: &Arc<Self>) {
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

    pub(super) async fn fall_asleep(self: Arc<Self>, generation: u64, containers: Vec<String>) {
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
        self.log_stop_failures(&report.failed, "Failed to stop idle container");
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
        self.enter(inner, IdleState::Waking);
        let generation = inner.generation;
        let deadline = Instant::now() + inner.config.wake_timeout;
        let containers = inner.config.containers.clone();
        let this = Arc::clone(self);
        self.spawn_operation(inner, this.wake(generation, containers, deadline));
    }

    pub(super) async fn wake(
        self: Arc<Self>,
        generation: u64,
        containers: Vec<String>,
        deadline: Instant,
    ) {
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
    pub(super) async fn bring_up(
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

/// Whether a failed start may still have left the container running (the daemon did not
/// answer, so it may have acted); a definite refusal means it did not start.
impl Shared {
    /// One warning per container that would not stop; the message says which recovery.
    fn log_stop_failures(&self, failed: &[(String, LifecycleError)], message: &'static str) {
        for (container, error) in failed {
            tracing::warn!(service = %self.service, containers = %container, error = %error, "{}", message);
        }
    }
}

pub(super) fn may_have_started(error: &LifecycleError) -> bool {
    matches!(
        error,
        LifecycleError::Timeout(_) | LifecycleError::Transport(_)
    )
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
