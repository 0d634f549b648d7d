use super::*;
use crate::lifecycle::{ContainerInfo, LifecycleError, LifecycleFuture, ListedContainer};
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use tokio::time::{sleep, sleep_until};

use super::transitions::backoff;

const SLEEP_AFTER: Duration = Duration::from_secs(60);
const WAKE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Start(String),
    Stop(String, Duration),
    Freeze(String),
    Thaw(String),
}

/// Records every call; each operation can be slowed down or made to fail per container.
#[derive(Default)]
struct FakeLifecycle {
    calls: Mutex<Vec<Call>>,
    start_delay: Mutex<Duration>,
    stop_delay: Mutex<HashMap<String, Duration>>,
    failing_starts: Mutex<HashMap<String, LifecycleError>>,
    failing_stops: Mutex<HashMap<String, LifecycleError>>,
    failing_thaws: Mutex<HashMap<String, LifecycleError>>,
    /// What `list` finds (the selector is not checked: every entry matches).
    listed: Mutex<Vec<ListedContainer>>,
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
    fn fail_thaw(&self, container: &str, error: LifecycleError) {
        self.failing_thaws
            .lock()
            .unwrap()
            .insert(container.into(), error);
    }
    fn set_listed(&self, containers: &[(&str, i64, bool)]) {
        *self.listed.lock().unwrap() = containers
            .iter()
            .map(|&(id, created, live)| ListedContainer {
                id: id.into(),
                created,
                live,
            })
            .collect();
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

    fn inspect<'a>(&'a self, _container: &'a str) -> LifecycleFuture<'a, ContainerInfo> {
        Box::pin(async { Ok(ContainerInfo::default()) })
    }

    fn freeze<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Freeze(container.into()));
        Box::pin(async { Ok(()) })
    }

    fn thaw<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Thaw(container.into()));
        let failed = self.failing_thaws.lock().unwrap().get(container).cloned();
        Box::pin(async move { failed.map_or(Ok(()), Err) })
    }

    fn list<'a>(&'a self, _labels: &'a [String]) -> LifecycleFuture<'a, Vec<ListedContainer>> {
        let listed = self.listed.lock().unwrap().clone();
        Box::pin(async move { Ok(listed) })
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
        ..SleepConfig::default()
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
            _ => None,
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
async fn a_failed_clean_up_with_nothing_ready_is_left_asleep_and_the_next_request_wakes_it() {
    // The engine went silent mid-wake: the start and the clean-up's stop both time out,
    // and no target gets ready. Active would route every request to an empty pool, and
    // that traffic would keep the service from ever idling into a sleep and a new wake.
    let h = harness(&["a"]);
    h.put_to_sleep().await;
    h.lifecycle
        .fail_start("a", Some(LifecycleError::Timeout("a".into())));
    h.lifecycle
        .fail_stop("a", Some(LifecycleError::Timeout("a".into())));
    h.hooks.never_ready(true);
    assert!(h.controller.admit().await.is_err());
    pass(RESTORE_BUDGET + Duration::from_secs(1)).await;
    assert_eq!(h.controller.state(), IdleState::Sleeping);

    // The engine is back: after the backoff, a request wakes the service.
    h.lifecycle.fail_start("a", None);
    h.lifecycle.fail_stop("a", None);
    h.hooks.never_ready(false);
    pass(MAX_BACKOFF).await;
    let starts = h.lifecycle.starts();
    let admitted = h.controller.admit().await;
    assert!(admitted.is_ok(), "{admitted:?}");
    assert_eq!(h.lifecycle.starts(), starts + 1);
    assert_eq!(h.controller.state(), IdleState::Active);
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
        fn inspect<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ContainerInfo> {
            self.inner.inspect(container)
        }
        fn freeze<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
            self.inner.freeze(container)
        }
        fn thaw<'a>(&'a self, container: &'a str) -> LifecycleFuture<'a, ()> {
            self.inner.thaw(container)
        }
        fn list<'a>(&'a self, labels: &'a [String]) -> LifecycleFuture<'a, Vec<ListedContainer>> {
            self.inner.list(labels)
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
            ..SleepConfig::default()
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

// ---- The freeze tier ------------------------------------------------------------------

const FREEZE_AFTER: Duration = Duration::from_secs(20);

fn tiered(containers: &[&str]) -> Harness {
    harness_with(
        SleepConfig {
            freeze_after: FREEZE_AFTER,
            ..config(containers)
        },
        IdleState::Active,
    )
}

#[tokio::test(start_paused = true)]
async fn freezes_first_then_stops_once_idle_for_sleep_after() {
    let h = tiered(&["a", "b"]);
    pass(FREEZE_AFTER - Duration::from_millis(1)).await;
    assert_eq!(h.controller.state(), IdleState::Active);
    pass(Duration::from_millis(1)).await;
    assert_eq!(h.controller.state(), IdleState::Frozen);
    assert_eq!(
        h.lifecycle.calls(),
        [Call::Freeze("a".into()), Call::Freeze("b".into())]
    );
    assert_eq!(h.hooks.suspends(), 1);
    assert_eq!(h.hooks.persists(), 1);
    assert!(h.controller.asleep_for().is_some());
    // Health checks are answered as while asleep.
    assert_eq!(h.controller.health_check(), HealthAnswer::Healthy);

    // Idle for sleep_after in all (not freeze_after + sleep_after): stopped.
    pass(SLEEP_AFTER - FREEZE_AFTER - Duration::from_millis(1)).await;
    assert_eq!(h.controller.state(), IdleState::Frozen);
    pass(Duration::from_millis(1)).await;
    assert_eq!(h.controller.state(), IdleState::Sleeping);
    assert_eq!(h.lifecycle.stops(), 2);
    assert_eq!(h.hooks.suspends(), 1, "the pools were suspended once");
    assert_eq!(h.hooks.persists(), 2);

    // From there a request starts them, as for any sleeping service.
    let _guard = h.controller.admit().await.unwrap();
    assert_eq!(h.lifecycle.starts(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_request_to_a_frozen_service_thaws_it_without_a_start() {
    let h = tiered(&["a"]);
    pass(FREEZE_AFTER).await;
    assert_eq!(h.controller.state(), IdleState::Frozen);

    let guard = h.controller.admit().await.unwrap();
    assert_eq!(h.controller.state(), IdleState::Active);
    assert!(h.controller.asleep_for().is_none());
    let calls = h.lifecycle.calls();
    assert_eq!(calls.last(), Some(&Call::Thaw("a".into())));
    assert_eq!(h.lifecycle.starts(), 0);
    assert_eq!(h.lifecycle.stops(), 0);
    drop(guard);
    // Idle again: frozen again after freeze_after, counted from the request's end.
    pass(FREEZE_AFTER).await;
    assert_eq!(h.controller.state(), IdleState::Frozen);
}

#[tokio::test(start_paused = true)]
async fn freeze_alone_never_stops() {
    let h = harness_with(
        SleepConfig {
            freeze_after: FREEZE_AFTER,
            sleep_after: Duration::ZERO,
            ..config(&["a"])
        },
        IdleState::Active,
    );
    pass(FREEZE_AFTER).await;
    assert_eq!(h.controller.state(), IdleState::Frozen);
    pass(SLEEP_AFTER * 10).await;
    assert_eq!(h.controller.state(), IdleState::Frozen);
    assert_eq!(h.lifecycle.stops(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_thaw_is_a_failed_wake() {
    let h = tiered(&["a"]);
    pass(FREEZE_AFTER).await;
    h.lifecycle.fail_thaw(
        "a",
        LifecycleError::Daemon {
            container: "a".into(),
            status: 500,
            body: "cgroup freezer gone".into(),
        },
    );
    let error = h.controller.admit().await.unwrap_err();
    assert_eq!(
        error,
        WakeError::Failed {
            retry_after: Duration::from_secs(1)
        }
    );
    settle().await;
    // As after any failed wake: what may run is stopped, the service sleeps, backs off
    // and reports unhealthy.
    assert_eq!(h.controller.state(), IdleState::Sleeping);
    assert_eq!(h.lifecycle.stops(), 1);
    assert_eq!(h.controller.health_check(), HealthAnswer::Unhealthy);
}

#[tokio::test(start_paused = true)]
async fn a_restored_frozen_service_stays_frozen_until_a_request_thaws_it() {
    let h = harness_with(
        SleepConfig {
            freeze_after: FREEZE_AFTER,
            ..config(&["a"])
        },
        IdleState::parse("frozen"),
    );
    assert_eq!(h.controller.state(), IdleState::Frozen);
    assert_eq!(h.hooks.suspends(), 1);
    assert!(
        h.lifecycle.calls().is_empty(),
        "restore touches no container"
    );
    let _guard = h.controller.admit().await.unwrap();
    assert_eq!(h.lifecycle.calls(), [Call::Thaw("a".into())]);
}

// ---- Selection by labels --------------------------------------------------------------

fn selected() -> Harness {
    harness_with(
        SleepConfig {
            selector: vec!["service=app".into()],
            ..config(&[])
        },
        IdleState::Active,
    )
}

#[tokio::test(start_paused = true)]
async fn a_sleep_stops_the_running_matches_and_a_wake_starts_exactly_those() {
    let h = selected();
    // Kamal keeps the older, stopped version under the same labels.
    h.lifecycle
        .set_listed(&[("old", 100, false), ("current", 200, true)]);
    h.put_to_sleep().await;
    let stops: Vec<Call> = h
        .lifecycle
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::Stop(..)))
        .collect();
    assert_eq!(stops.len(), 1);
    assert!(matches!(&stops[0], Call::Stop(c, _) if c == "current"));
    assert_eq!(h.controller.containers(), ["current"]);

    // A newer stopped container appeared meanwhile: still, the remembered one wakes.
    h.lifecycle.set_listed(&[
        ("old", 100, false),
        ("current", 200, false),
        ("newer", 300, false),
    ]);
    let _guard = h.controller.admit().await.unwrap();
    assert_eq!(
        h.lifecycle.calls().last(),
        Some(&Call::Start("current".into()))
    );
    assert_eq!(h.lifecycle.starts(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_remembered_container_that_is_gone_is_replaced_by_the_newest_match() {
    let h = selected();
    h.lifecycle
        .set_listed(&[("old", 100, false), ("current", 200, true)]);
    h.put_to_sleep().await;
    // Pruned while asleep; an older version is still there, and a newer one.
    h.lifecycle
        .fail_start("current", Some(LifecycleError::NotFound("current".into())));
    h.lifecycle
        .set_listed(&[("old", 100, false), ("next", 300, false)]);
    let _guard = h.controller.admit().await.unwrap();
    let starts: Vec<Call> = h
        .lifecycle
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::Start(_)))
        .collect();
    assert_eq!(
        starts,
        [Call::Start("current".into()), Call::Start("next".into())]
    );
}

#[tokio::test(start_paused = true)]
async fn no_container_matching_is_a_failed_wake() {
    let h = selected();
    h.lifecycle.set_listed(&[("current", 200, true)]);
    h.put_to_sleep().await;
    h.lifecycle
        .fail_start("current", Some(LifecycleError::NotFound("current".into())));
    h.lifecycle.set_listed(&[]);
    let error = h.controller.admit().await.unwrap_err();
    assert!(matches!(error, WakeError::Failed { .. }), "{error:?}");
    settle().await;
    assert_eq!(h.controller.state(), IdleState::Sleeping);
    assert_eq!(h.controller.health_check(), HealthAnswer::Unhealthy);
}

fn stopped(h: &Harness) -> Vec<String> {
    h.lifecycle
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Stop(c, _) => Some(c),
            _ => None,
        })
        .collect()
}

fn started(h: &Harness) -> Vec<String> {
    h.lifecycle
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Start(c) => Some(c),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_second_remembered_container_gone_does_not_wake_an_older_kept_version() {
    let h = selected();
    // Two replicas were running; a kept older version sits beside them.
    h.lifecycle
        .set_listed(&[("a", 200, true), ("b", 150, true), ("old", 100, false)]);
    h.put_to_sleep().await;
    assert_eq!(h.controller.containers(), ["a", "b"]);
    // "b" is pruned while asleep. The newest match is "a", which the wake starts anyway:
    // the next newest is the older version, and no stand-in is started.
    h.lifecycle
        .fail_start("b", Some(LifecycleError::NotFound("b".into())));
    h.lifecycle
        .set_listed(&[("a", 200, false), ("old", 100, false)]);
    let _guard = h.controller.admit().await.unwrap();
    assert_eq!(started(&h), ["a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn of_matches_created_in_the_same_second_the_first_listed_stands_in() {
    let h = selected();
    h.lifecycle.set_listed(&[("current", 200, true)]);
    h.put_to_sleep().await;
    h.lifecycle
        .fail_start("current", Some(LifecycleError::NotFound("current".into())));
    // Docker lists newest first by the exact time; its seconds are equal here.
    h.lifecycle.set_listed(&[
        ("newer", 300, false),
        ("new", 300, false),
        ("old", 100, false),
    ]);
    let _guard = h.controller.admit().await.unwrap();
    assert_eq!(started(&h), ["current", "newer"]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_thaw_stops_the_stand_in_it_started_as_well_as_the_remembered_ones() {
    let h = harness_with(
        SleepConfig {
            selector: vec!["service=app".into()],
            freeze_after: FREEZE_AFTER,
            ..config(&[])
        },
        IdleState::Active,
    );
    h.lifecycle.set_listed(&[("a", 200, true)]);
    pass(FREEZE_AFTER).await;
    assert_eq!(h.controller.state(), IdleState::Frozen);
    // Removed while frozen and recreated (stopped): the wake starts the new one in its
    // place, which then never gets ready.
    h.lifecycle
        .fail_thaw("a", LifecycleError::NotFound("a".into()));
    h.lifecycle.set_listed(&[("a2", 300, false)]);
    h.hooks.never_ready(true);
    assert!(h.controller.admit().await.is_err());
    settle().await;
    assert_eq!(h.controller.state(), IdleState::Sleeping);
    assert_eq!(started(&h), ["a2"]);
    assert_eq!(stopped(&h), ["a", "a2"], "the stand-in was left running");
}

#[test]
fn the_cleanup_of_a_failed_thaw_covers_the_remembered_and_what_it_started() {
    let plan = super::selection::Plan {
        containers: Vec::new(),
        selector: vec!["service=app".into()],
        remembered: vec!["a".into(), "b".into()],
    };
    let started = vec!["a".to_string(), "c".to_string()];
    assert_eq!(
        plan.after_failed_wake(true, started.clone()),
        ["a", "b", "c"]
    );
    assert_eq!(plan.after_failed_wake(false, started), ["a", "c"]);
}
