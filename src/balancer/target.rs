//! One upstream address: its health, the requests in flight to it, and draining.

use http::uri::Authority;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

use super::affinity::PinKey;
use super::spec::TargetSpec;
// The syntax lives with the spec; these paths stay for the code that names them here.
pub use super::spec::{container_ref, validate_target};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Health {
    /// Not verified yet: a failure keeps it here rather than flapping.
    Adding = 0,
    Healthy = 1,
    Unhealthy = 2,
}

impl Health {
    fn from_u8(v: u8) -> Health {
        match v {
            1 => Health::Healthy,
            2 => Health::Unhealthy,
            _ => Health::Adding,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Health::Adding => "adding",
            Health::Healthy => "healthy",
            Health::Unhealthy => "unhealthy",
        }
    }
}

/// Which drain cycles have cut their requests and upgraded connections. A request belongs
/// to the cycle that was current when it began ([`Target::begin`]); a drain works on the
/// current cycle and opens the next when it ends, so a paused and resumed service starts
/// clean. Plain atomics rather than a `CancellationToken` a cycle: a request only reads
/// them (a token's `is_cancelled` takes its mutex, and each guard held an `Arc` of the
/// cycle's tokens), and nothing is allocated per drain.
#[derive(Default)]
struct DrainCycles {
    /// The current cycle.
    current: AtomicU64,
    /// Requests of cycles below this are cut: a drain timed out on them (they answer 504).
    requests_cut: AtomicU64,
    /// Upgraded connections (WebSockets) of cycles below this are cut: as soon as a
    /// drain starts, as upstream does, because they would otherwise hold every drain to
    /// its limit.
    upgrades_cut: AtomicU64,
    /// Wakes whoever waits for a cut.
    cut: Notify,
}

impl DrainCycles {
    fn cut(&self, which: &AtomicU64, cycle: u64) {
        which.fetch_max(cycle + 1, Ordering::AcqRel);
        self.cut.notify_waiters();
    }

    /// Resolves once `which` cuts `cycle`.
    async fn wait(&self, which: &AtomicU64, cycle: u64) {
        loop {
            let notified = self.cut.notified();
            if which.load(Ordering::Acquire) > cycle {
                return;
            }
            notified.await;
        }
    }
}

pub struct Target {
    address: Arc<str>,
    /// The address as an `X-Kamal-Target` value, made once (a reference count per request).
    header_value: http::HeaderValue,
    authority: Authority,
    /// Its share of the pool's requests (fork F16; 1 unless given).
    weight: u32,
    /// Its session affinity pin (fork F17): the cookie value that names it.
    pin: Box<str>,
    health: AtomicU8,
    inflight: AtomicUsize,
    /// Drains waiting for `inflight` to reach 0: only while one waits does the last
    /// request out wake `idle` (its waiters' lock, otherwise taken on every request that
    /// leaves the target idle: every request at one connection).
    idle_watchers: AtomicUsize,
    idle: Notify,
    drains: DrainCycles,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("address", &self.address)
            .finish()
    }
}

impl Target {
    /// `address` has already passed `validate_target`; a missing port means 80.
    pub fn new(address: &str) -> Result<Arc<Target>, String> {
        Target::build(&TargetSpec::plain(address), None)
    }

    /// A target of a pool: its weight, and its pin made with the pool's key.
    pub fn build(spec: &TargetSpec, key: Option<&PinKey>) -> Result<Arc<Target>, String> {
        let address = spec.address.as_str();
        let with_port = if address.contains(':') {
            address.to_string()
        } else {
            format!("{address}:80")
        };
        let authority: Authority = with_port
            .parse()
            .map_err(|_| format!("{address} :invalid host pattern"))?;
        let header_value = http::HeaderValue::from_str(address)
            .map_err(|_| format!("{address} :invalid host pattern"))?;
        Ok(Arc::new(Target {
            address: Arc::from(address),
            header_value,
            authority,
            weight: spec.weight,
            pin: key.map(|k| k.pin(address)).unwrap_or_default(),
            health: AtomicU8::new(Health::Adding as u8),
            inflight: AtomicUsize::new(0),
            idle_watchers: AtomicUsize::new(0),
            idle: Notify::new(),
            drains: DrainCycles::default(),
        }))
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// The address as a shared string, for the access log (no copy per request).
    pub fn shared_address(&self) -> Arc<str> {
        self.address.clone()
    }

    /// The address as a header value (`X-Kamal-Target`).
    pub fn header_value(&self) -> &http::HeaderValue {
        &self.header_value
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// The address and weight, as `list` shows them and the state file keeps them.
    pub fn spec(&self) -> TargetSpec {
        TargetSpec {
            address: self.address.to_string(),
            weight: self.weight,
        }
    }

    /// The session affinity cookie value naming this target (empty: it has none).
    pub fn pin(&self) -> &str {
        &self.pin
    }

    pub fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::Acquire))
    }

    /// Returns the previous state.
    pub fn set_health(&self, h: Health) -> Health {
        Health::from_u8(self.health.swap(h as u8, Ordering::AcqRel))
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }

    /// Counts a request against this target until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> TargetGuard {
        self.inflight.fetch_add(1, Ordering::AcqRel);
        TargetGuard {
            target: self.clone(),
            cycle: self.drains.current.load(Ordering::Acquire),
        }
    }

    /// Waits up to `timeout` for in-flight requests to finish, then cancels the rest.
    pub async fn drain(&self, timeout: Duration) {
        let drains = &self.drains;
        let cycle = drains.current.load(Ordering::Acquire);
        drains.cut(&drains.upgrades_cut, cycle);
        // Counted as watching before `inflight` is read, and a guard's drop decrements
        // `inflight` before it reads `idle_watchers`, all SeqCst: either this sees the
        // count at 0, or the last guard out sees a watcher and wakes `idle` (whose
        // `notified` is made before the count is read, so it hears it).
        let _watching = IdleWatch::start(&self.idle_watchers);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.inflight.load(Ordering::SeqCst) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                if self.inflight() > 0 {
                    drains.cut(&drains.requests_cut, cycle);
                    // The requests whose connection's task watches for it.
                    crate::broadcast::send();
                }
                break;
            }
        }
        drains.current.fetch_max(cycle + 1, Ordering::AcqRel);
    }
}

/// A drain counted in [`Target::idle_watchers`] until it ends or is dropped.
struct IdleWatch<'a>(&'a AtomicUsize);

impl<'a> IdleWatch<'a> {
    fn start(watchers: &'a AtomicUsize) -> Self {
        watchers.fetch_add(1, Ordering::SeqCst);
        IdleWatch(watchers)
    }
}

impl Drop for IdleWatch<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Held for as long as a request (or its upgraded connection) uses the target.
pub struct TargetGuard {
    target: Arc<Target>,
    /// The drain cycle it began in.
    cycle: u64,
}

impl TargetGuard {
    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// Resolves when a drain gives up waiting for this request. A request whose
    /// connection's task hears the drain's word ([`crate::broadcast`]) waits with
    /// [`TargetGuard::cancelled_when_polled`] instead.
    pub async fn cancelled(&self) {
        let drains = &self.target.drains;
        drains.wait(&drains.requests_cut, self.cycle).await
    }

    /// Resolves when polled after a drain gave up waiting for this request, registering
    /// no waker: one load a poll, for a request whose connection's task is polled again
    /// when a drain cuts requests ([`crate::broadcast`]). [`TargetGuard::cancelled`] puts
    /// the request in the target's waiters under their lock, twice a request.
    pub fn cancelled_when_polled(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|_| {
            if self.is_cancelled() {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
    }

    pub fn is_cancelled(&self) -> bool {
        self.target.drains.requests_cut.load(Ordering::Acquire) > self.cycle
    }

    /// Resolves when a drain starts: upgraded connections end at once.
    pub async fn upgrade_cancelled(&self) {
        let drains = &self.target.drains;
        drains.wait(&drains.upgrades_cut, self.cycle).await
    }
}

impl Drop for TargetGuard {
    fn drop(&mut self) {
        let target = &self.target;
        if target.inflight.fetch_sub(1, Ordering::SeqCst) == 1
            && target.idle_watchers.load(Ordering::SeqCst) > 0
        {
            target.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn drain_waits_then_cancels() {
        let t = Target::new("app:3000").unwrap();
        let g = t.begin();
        assert_eq!(t.inflight(), 1);
        let started = tokio::time::Instant::now();
        t.drain(Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert!(g.is_cancelled());
        drop(g);
        assert_eq!(t.inflight(), 0);
        // A fresh cycle after the drain.
        assert!(!t.begin().is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn drain_returns_when_requests_finish() {
        let t = Target::new("app").unwrap();
        assert_eq!(t.authority().as_str(), "app:80");
        let g = t.begin();
        let t2 = t.clone();
        let started = tokio::time::Instant::now();
        let d = tokio::spawn(async move { t2.drain(Duration::from_secs(30)).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(g);
        d.await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_given_up_stops_watching() {
        let t = Target::new("app:3000").unwrap();
        let g = t.begin();
        let given_up =
            tokio::time::timeout(Duration::from_secs(1), t.drain(Duration::from_secs(30)));
        assert!(given_up.await.is_err());
        assert_eq!(t.idle_watchers.load(Ordering::SeqCst), 0);
        drop(g);
    }
}
