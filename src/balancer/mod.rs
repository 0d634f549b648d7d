//! A service's pool of targets: health checking, round-robin selection, readiness for
//! deploys and wakes, draining, and suspension while the service sleeps.

use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub mod health;
pub mod rollout;
pub mod target;

use health::HealthCheckConfig;
use health::ProbeClient;
pub use target::{Health, Target, TargetGuard};

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

#[derive(Default)]
struct HealthySet {
    writers: Vec<Arc<Target>>,
    readers: Vec<Arc<Target>>,
}

pub struct LoadBalancer {
    service: String,
    writers: Vec<Arc<Target>>,
    readers: Vec<Arc<Target>>,
    healthy: ArcSwap<HealthySet>,
    next_writer: AtomicUsize,
    next_reader: AtomicUsize,
    health_config: HealthCheckConfig,
    status: watch::Sender<PoolStatus>,
    /// Serialises rebuilds of `healthy` so a slow rebuild cannot overwrite a newer one.
    rebuild: Mutex<()>,
    probes: Mutex<Option<CancellationToken>>,
    client: ProbeClient,
}

impl LoadBalancer {
    pub fn new(
        service: &str,
        writers: &[String],
        readers: &[String],
        health_config: HealthCheckConfig,
        client: ProbeClient,
    ) -> Result<Arc<LoadBalancer>, String> {
        let build = |addrs: &[String]| -> Result<Vec<Arc<Target>>, String> {
            addrs
                .iter()
                .map(|a| {
                    target::validate_target(a)?;
                    Target::new(a)
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

    pub fn reader_addresses(&self) -> Vec<String> {
        self.readers
            .iter()
            .map(|t| t.address().to_string())
            .collect()
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

    /// Picks a target round-robin. A read request prefers a healthy reader (the caller
    /// has already sent a client with a live writer cookie to the writers).
    pub fn select(&self, read_request: bool) -> Option<Arc<Target>> {
        let healthy = self.healthy.load();
        if read_request && !healthy.readers.is_empty() {
            return Some(pick(&healthy.readers, &self.next_reader));
        }
        if healthy.writers.is_empty() {
            return None;
        }
        Some(pick(&healthy.writers, &self.next_writer))
    }

    /// Targets restored from the state file serve at once, as upstream does.
    pub fn mark_all_healthy(&self) {
        for t in self.all_targets() {
            t.set_health(Health::Healthy);
        }
        self.rebuild_healthy();
    }

    pub fn start_health_checks(self: &Arc<Self>, mode: ProbeMode) {
        let token = CancellationToken::new();
        if let Some(old) = self.probes_slot().replace(token.clone()) {
            old.cancel();
        }
        // A pool with a single target stops probing once it is healthy (upstream): the
        // probe would otherwise be the only traffic an idle app ever sees.
        let single = self.writers.len() + self.readers.len() == 1;
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

    /// Wake: every target must prove itself again, probed fast.
    pub fn resume(self: &Arc<Self>) {
        for t in self.all_targets() {
            t.set_health(Health::Adding);
        }
        self.rebuild_healthy();
        self.start_health_checks(ProbeMode::Wake);
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
        let set = HealthySet {
            writers: healthy(&self.writers),
            readers: healthy(&self.readers),
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

fn pick(targets: &[Arc<Target>], counter: &AtomicUsize) -> Arc<Target> {
    // Pre-increment, as upstream: with N targets the first request goes to index 1.
    let i = counter.fetch_add(1, Ordering::Relaxed).wrapping_add(1) % targets.len();
    targets[i].clone()
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

    fn pool(writers: &[&str], readers: &[&str]) -> Arc<LoadBalancer> {
        let w: Vec<String> = writers.iter().map(|s| s.to_string()).collect();
        let r: Vec<String> = readers.iter().map(|s| s.to_string()).collect();
        LoadBalancer::new(
            "app",
            &w,
            &r,
            HealthCheckConfig::default(),
            health::probe_client(),
        )
        .unwrap()
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
            .map(|_| pick(&targets, &counter).address().to_string())
            .collect();
        assert_eq!(picked, ["a2:1", "a3:1", "a1:1", "a2:1"]);
    }
}
