//! A service's pool of targets: health checking, selection (round robin, smooth weighted
//! round robin, session pins), readiness for deploys and wakes, draining, and suspension
//! while the service sleeps.

use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub mod affinity;
pub mod health;
pub mod rollout;
pub mod spec;
pub mod target;
pub mod weighted;

use affinity::PinKey;
use health::HealthCheckConfig;
use health::ProbeClient;
use spec::TargetSpec;
pub use target::{Health, Target, TargetGuard};
use weighted::Schedule;

/// How fast to probe a target that has not answered yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeMode {
    /// A fresh deploy: 50 ms, doubling up to the interval (upstream's schedule).
    Deploy,
    /// A wake: someone is waiting on the first success, so probe at a short fixed interval
    /// for a while, then fall back to the deploy schedule so a slow app is not flooded.
    Wake,
}

const FIRST_RETRY: Duration = Duration::from_millis(50);
const WAKE_PROBE_INTERVAL: Duration = Duration::from_millis(2);
const WAKE_FAST_PROBING_FOR: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStatus {
    /// Every target (writers and readers) is healthy: what a deploy waits for.
    pub all_healthy: bool,
    /// At least one writer is healthy: the service can serve (what a wake waits for).
    pub serving: bool,
}

/// The targets that may be chosen now, rebuilt whenever one's health changes.
#[derive(Default)]
struct HealthySet {
    writers: Vec<Arc<Target>>,
    readers: Vec<Arc<Target>>,
    /// Smooth weighted round robin over each list when its weights differ (fork F16);
    /// `None`: plain round robin. Readers and writers are weighted apart.
    writer_schedule: Option<Schedule>,
    reader_schedule: Option<Schedule>,
}

/// A target chosen for a request.
pub struct Pick {
    pub target: Arc<Target>,
    /// With session affinity: the client's cookie did not name this writer (none, a
    /// stale pin, a pin of a target that left), so the response pins it afresh.
    pub repin: bool,
}

pub struct LoadBalancer {
    service: String,
    writers: Vec<Arc<Target>>,
    readers: Vec<Arc<Target>>,
    healthy: ArcSwap<HealthySet>,
    next_writer: AtomicUsize,
    next_reader: AtomicUsize,
    /// The service's session affinity key, which made every target's pin; handed on to
    /// the pools that replace this one.
    pin_key: PinKey,
    /// After a wake, until when a pinned request waits for its own target to come back
    /// (nanoseconds since `created`; 0: no wake under way). See [`Self::starting_pin`].
    pins_wait_until: AtomicU64,
    created: tokio::time::Instant,
    health_config: HealthCheckConfig,
    status: watch::Sender<PoolStatus>,
    /// Serialises rebuilds of `healthy` so a slow rebuild cannot overwrite a newer one.
    rebuild: Mutex<()>,
    probes: Mutex<Option<CancellationToken>>,
    client: ProbeClient,
}

impl LoadBalancer {
    /// `pin_key` is the service's (see [`affinity`]): every target's pin is made with it.
    pub fn new(
        service: &str,
        writers: &[TargetSpec],
        readers: &[TargetSpec],
        pin_key: PinKey,
        health_config: HealthCheckConfig,
        client: ProbeClient,
    ) -> Result<Arc<LoadBalancer>, String> {
        let build = |specs: &[TargetSpec]| -> Result<Vec<Arc<Target>>, String> {
            specs
                .iter()
                .map(|s| {
                    target::validate_target(&s.address)?;
                    spec::check_weight(i64::from(s.weight))?;
                    Target::build(s, Some(&pin_key))
                })
                .collect()
        };
        Ok(Arc::new(LoadBalancer {
            service: service.to_string(),
            writers: build(writers)?,
            readers: build(readers)?,
            healthy: ArcSwap::from_pointee(HealthySet::default()),
            next_writer: AtomicUsize::new(0),
            next_reader: AtomicUsize::new(0),
            pin_key,
            pins_wait_until: AtomicU64::new(0),
            created: tokio::time::Instant::now(),
            health_config,
            status: watch::channel(PoolStatus::default()).0,
            rebuild: Mutex::new(()),
            probes: Mutex::new(None),
            client,
        }))
    }

    pub fn writer_addresses(&self) -> Vec<String> {
        self.writers
            .iter()
            .map(|t| t.address().to_string())
            .collect()
    }

    /// The writers with their weights, as deployed.
    pub fn writer_specs(&self) -> Vec<TargetSpec> {
        self.writers.iter().map(|t| t.spec()).collect()
    }

    pub fn reader_specs(&self) -> Vec<TargetSpec> {
        self.readers.iter().map(|t| t.spec()).collect()
    }

    pub fn pin_key(&self) -> &PinKey {
        &self.pin_key
    }

    /// Read targets were deployed (healthy or not): writer affinity applies.
    pub fn has_readers(&self) -> bool {
        !self.readers.is_empty()
    }

    pub fn all_targets(&self) -> impl Iterator<Item = &Arc<Target>> {
        self.writers.iter().chain(self.readers.iter())
    }

    pub fn status(&self) -> PoolStatus {
        *self.status.borrow()
    }

    /// How many healthy targets serve on the side of `target` (the readers when it is one,
    /// else the writers): the targets a retry can still go to before it pauses.
    pub fn healthy_alongside(&self, target: &Arc<Target>) -> usize {
        let healthy = self.healthy.load();
        if healthy.readers.iter().any(|r| Arc::ptr_eq(r, target)) {
            healthy.readers.len()
        } else {
            healthy.writers.len()
        }
    }

    /// Picks a target: round robin, or smooth weighted round robin when weights differ.
    /// A read request prefers a healthy reader (the caller has already sent a client with
    /// a live writer cookie to the writers).
    pub fn select(&self, read_request: bool) -> Option<Arc<Target>> {
        let healthy = self.healthy.load();
        if read_request && !healthy.readers.is_empty() {
            return Some(pick(
                &healthy.readers,
                healthy.reader_schedule.as_ref(),
                &self.next_reader,
            ));
        }
        if healthy.writers.is_empty() {
            return None;
        }
        Some(pick(
            &healthy.writers,
            healthy.writer_schedule.as_ref(),
            &self.next_writer,
        ))
    }

    /// [`Self::select`] with session affinity (fork F17): a request that goes to a writer
    /// goes to the one its `cookie` pins while that writer is healthy; otherwise (no
    /// cookie, a forged or stale one, a pinned target that left the pool or failed its
    /// health check) to the rotation's pick, which the response then pins. Reads served by
    /// a reader are never pinned.
    pub fn select_pinned(&self, read_request: bool, cookie: Option<&str>) -> Option<Pick> {
        let healthy = self.healthy.load();
        if read_request && !healthy.readers.is_empty() {
            let target = pick(
                &healthy.readers,
                healthy.reader_schedule.as_ref(),
                &self.next_reader,
            );
            return Some(Pick {
                target,
                repin: false,
            });
        }
        let pinned = cookie.filter(|c| !c.is_empty()).and_then(|c| {
            healthy
                .writers
                .iter()
                .find(|t| t.pin().as_bytes() == c.as_bytes())
        });
        if let Some(target) = pinned {
            return Some(Pick {
                target: target.clone(),
                repin: false,
            });
        }
        if healthy.writers.is_empty() {
            return None;
        }
        let target = pick(
            &healthy.writers,
            healthy.writer_schedule.as_ref(),
            &self.next_writer,
        );
        Some(Pick {
            target,
            repin: true,
        })
    }

    /// Targets restored from the state file serve at once, as upstream does.
    pub fn mark_all_healthy(&self) {
        for t in self.all_targets() {
            t.set_health(Health::Healthy);
        }
        self.rebuild_healthy();
    }

    pub fn start_health_checks(self: &Arc<Self>, mode: ProbeMode) {
        // A pool with a single target stops probing once it is healthy (upstream): the
        // probe would otherwise be the only traffic an idle app ever sees.
        let single = self.writers.len() + self.readers.len() == 1;
        self.start_probes(mode, single);
    }

    /// As [`Self::start_health_checks`], but a single target is probed on after it is
    /// healthy too (`--recheck-targets-on-restore`, fork F30): a restored target was
    /// never seen alive by this process, and may die or come back at any time.
    pub fn start_health_checks_for_life(self: &Arc<Self>, mode: ProbeMode) {
        self.start_probes(mode, false);
    }

    fn start_probes(self: &Arc<Self>, mode: ProbeMode, single: bool) {
        let token = CancellationToken::new();
        if let Some(old) = self.probes_slot().replace(token.clone()) {
            old.cancel();
        }
        for target in self.all_targets() {
            let lb = Arc::downgrade(self);
            let target = target.clone();
            let token = token.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = probe_loop(lb, target, mode, single) => {}
                }
            });
        }
    }

    pub fn stop_health_checks(&self) {
        if let Some(token) = self.probes_slot().take() {
            token.cancel();
        }
    }

    fn probes_slot(&self) -> std::sync::MutexGuard<'_, Option<CancellationToken>> {
        // The slot holds no invariant a panic could break, so a poisoned lock is usable.
        self.probes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every target is healthy at the same time.
    pub async fn wait_until_healthy(&self, timeout: Duration) -> Result<(), ()> {
        let mut rx = self.status.subscribe();
        let wait = rx.wait_for(|s| s.all_healthy);
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(()),
        }
    }

    /// Waits until the pool can serve: one healthy writer is enough.
    pub async fn wait_until_serving(&self, deadline: tokio::time::Instant) -> Result<(), ()> {
        let mut rx = self.status.subscribe();
        let wait = rx.wait_for(|s| s.serving);
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(()),
        }
    }

    /// Sleep: no probes, no routing.
    pub fn suspend(&self) {
        self.stop_health_checks();
        for t in self.all_targets() {
            t.set_health(Health::Unhealthy);
        }
        self.rebuild_healthy();
    }

    /// Wake: every target must prove itself again, probed fast. Until `wake_deadline` a
    /// pinned client waits for its own target (see [`Self::starting_pin`]).
    pub fn resume(self: &Arc<Self>, wake_deadline: tokio::time::Instant) {
        let until = wake_deadline.saturating_duration_since(self.created);
        self.pins_wait_until.store(
            u64::try_from(until.as_nanos()).unwrap_or(u64::MAX).max(1),
            Ordering::Release,
        );
        for t in self.all_targets() {
            t.set_health(Health::Adding);
        }
        self.rebuild_healthy();
        self.start_health_checks(ProbeMode::Wake);
    }

    /// Session affinity across a wake: the wake is over as soon as one writer answers, so
    /// without this every client pinned to another container would be re-pinned to the
    /// first one up. A client whose pinned writer is still starting (unverified since the
    /// wake) waits for it instead, until the wake's own deadline; returns that writer and
    /// the deadline. A writer that failed later, or after the deadline, re-pins at once;
    /// a read that a healthy reader serves waits for nothing.
    pub fn starting_pin(
        &self,
        read_request: bool,
        cookie: &str,
    ) -> Option<(Arc<Target>, tokio::time::Instant)> {
        let until = self.pins_wait_until.load(Ordering::Acquire);
        if until == 0 || cookie.is_empty() {
            return None;
        }
        let until = self.created + Duration::from_nanos(until);
        if tokio::time::Instant::now() >= until
            || (read_request && !self.healthy.load().readers.is_empty())
        {
            return None;
        }
        self.writers
            .iter()
            .find(|t| t.pin().as_bytes() == cookie.as_bytes() && t.health() == Health::Adding)
            .map(|t| (t.clone(), until))
    }

    /// Waits until `target` is healthy, or `until`; whether it is.
    pub async fn wait_for_target(&self, target: &Target, until: tokio::time::Instant) -> bool {
        let mut rx = self.status.subscribe();
        // Every health change rebuilds the healthy set and publishes a status, so each
        // one is seen here.
        let healthy = rx.wait_for(|_| target.health() == Health::Healthy);
        matches!(tokio::time::timeout_at(until, healthy).await, Ok(Ok(_)))
    }

    pub async fn drain(&self, timeout: Duration) {
        let drains = self.all_targets().map(|t| t.drain(timeout));
        futures_util::future::join_all(drains).await;
    }

    fn record(&self, target: &Target, ok: bool) -> bool {
        let now = if ok {
            Health::Healthy
        } else {
            match target.health() {
                // Unverified targets stay unverified, so a container that never comes
                // up stays out of the pool instead of flapping.
                Health::Adding => Health::Adding,
                _ => Health::Unhealthy,
            }
        };
        let was = target.set_health(now);
        if was != now {
            tracing::info!(
                "target" = target.address(),
                state = now.name(),
                was = was.name(),
                "Target health updated"
            );
            self.rebuild_healthy();
        }
        now == Health::Healthy
    }

    fn rebuild_healthy(&self) {
        let _serial = self.rebuild.lock().unwrap_or_else(|e| e.into_inner());
        let healthy = |ts: &[Arc<Target>]| -> Vec<Arc<Target>> {
            ts.iter()
                .filter(|t| t.health() == Health::Healthy)
                .cloned()
                .collect()
        };
        // Weighted over the healthy targets only: a target that fails its check leaves
        // the cycle, and the others share its requests in their own proportions.
        let schedule = |ts: &[Arc<Target>]| {
            Schedule::for_weights(&ts.iter().map(|t| t.weight()).collect::<Vec<_>>())
        };
        let writers = healthy(&self.writers);
        let readers = healthy(&self.readers);
        let set = HealthySet {
            writer_schedule: schedule(&writers),
            reader_schedule: schedule(&readers),
            writers,
            readers,
        };
        let total = self.writers.len() + self.readers.len();
        let status = PoolStatus {
            all_healthy: total > 0 && set.writers.len() + set.readers.len() == total,
            serving: !set.writers.is_empty(),
        };
        self.healthy.store(Arc::new(set));
        self.status.send_replace(status);
    }

    pub fn service(&self) -> &str {
        &self.service
    }
}

impl Drop for LoadBalancer {
    fn drop(&mut self) {
        self.stop_health_checks();
    }
}

/// `targets` is not empty; `schedule` was computed for exactly these targets.
fn pick(
    targets: &[Arc<Target>],
    schedule: Option<&Schedule>,
    counter: &AtomicUsize,
) -> Arc<Target> {
    if targets.len() == 1 && schedule.is_none() {
        // Nothing to rotate: no write to a counter every worker shares.
        return targets[0].clone();
    }
    let n = counter.fetch_add(1, Ordering::Relaxed);
    let i = match schedule {
        Some(cycle) => cycle.pick(n),
        // Pre-increment, as upstream: with N targets the first request goes to index 1.
        None => n.wrapping_add(1) % targets.len(),
    };
    targets[i % targets.len()].clone()
}

async fn probe_loop(lb: Weak<LoadBalancer>, target: Arc<Target>, mode: ProbeMode, single: bool) {
    let Some((client, config)) = lb
        .upgrade()
        .map(|lb| (lb.client.clone(), lb.health_config.clone()))
    else {
        return;
    };
    let uri = health::probe_uri(&target, &config);
    let interval = config.interval.to_std().max(Duration::from_millis(1));
    let started = tokio::time::Instant::now();
    let mut backoff = FIRST_RETRY;
    let mut ever_healthy = false;
    loop {
        let result = health::probe(&client, &uri, &config).await;
        let Some(lb) = lb.upgrade() else { return };
        if let Err(reason) = &result {
            tracing::info!(url = %uri, error = %reason, "Healthcheck failed");
        }
        let healthy = lb.record(&target, result.is_ok());
        drop(lb);
        if healthy && single {
            return;
        }
        ever_healthy |= healthy;
        let delay = if ever_healthy {
            interval
        } else if mode == ProbeMode::Wake && started.elapsed() < WAKE_FAST_PROBING_FOR {
            WAKE_PROBE_INTERVAL.min(interval)
        } else {
            let d = backoff.min(interval);
            backoff = backoff.saturating_mul(2);
            d
        };
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `host:port[;weight=N]` specs (also for the tests of `weighted` and
    /// `affinity`, which exercise the pool's selection).
    pub(super) fn pool(writers: &[&str], readers: &[&str]) -> Arc<LoadBalancer> {
        let specs = |v: &[&str]| -> Vec<TargetSpec> {
            v.iter().map(|s| TargetSpec::parse(s).unwrap()).collect()
        };
        LoadBalancer::new(
            "app",
            &specs(writers),
            &specs(readers),
            PinKey::generate().unwrap(),
            HealthCheckConfig::default(),
            health::probe_client(),
        )
        .unwrap()
    }

    pub(super) fn picks(lb: &LoadBalancer, read: bool, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| lb.select(read).unwrap().address().to_string())
            .collect()
    }

    #[tokio::test]
    async fn one_healthy_writer_is_enough_to_serve_but_not_to_deploy() {
        let lb = pool(&["web-1:3000", "web-2:3000"], &["reader:3000"]);
        lb.record(&lb.writers[0], true);
        let status = lb.status();
        assert!(status.serving, "a wake is ready with one healthy writer");
        assert!(!status.all_healthy, "a deploy waits for every target");
        let deadline = tokio::time::Instant::now() + Duration::from_millis(10);
        assert_eq!(lb.wait_until_serving(deadline).await, Ok(()));
        assert!(
            lb.wait_until_healthy(Duration::from_millis(10))
                .await
                .is_err()
        );
        // A healthy reader alone does not make the service servable.
        let lb = pool(&["web-1:3000"], &["reader:3000"]);
        lb.record(&lb.readers[0], true);
        assert!(!lb.status().serving);
    }

    #[tokio::test]
    async fn suspended_pools_route_nowhere_and_resume_unverified() {
        let lb = pool(&["web-1:3000", "web-2:3000"], &[]);
        lb.mark_all_healthy();
        assert!(lb.select(false).is_some());
        lb.suspend();
        assert!(lb.select(false).is_none());
        assert!(!lb.status().serving);
        // A failed probe while unverified keeps the target out without flapping.
        lb.writers[0].set_health(Health::Adding);
        lb.record(&lb.writers[0], false);
        assert_eq!(lb.writers[0].health(), Health::Adding);
    }

    #[test]
    fn round_robin_starts_at_the_second_target() {
        let targets: Vec<Arc<Target>> = ["a1:1", "a2:1", "a3:1"]
            .iter()
            .map(|a| Target::new(a).unwrap())
            .collect();
        let counter = AtomicUsize::new(0);
        let picked: Vec<String> = (0..4)
            .map(|_| pick(&targets, None, &counter).address().to_string())
            .collect();
        assert_eq!(picked, ["a2:1", "a3:1", "a1:1", "a2:1"]);
        // Equal weights other than 1 change nothing.
        let lb = pool(&["a1:1;weight=4", "a2:1;weight=4"], &[]);
        lb.mark_all_healthy();
        assert_eq!(picks(&lb, false, 3), ["a2:1", "a1:1", "a2:1"]);
    }
}
