//! `--rate-limit`: a GCRA budget per client (governor's algorithm), 429 with
//! `Retry-After` when spent.
//!
//! The budgets live in a sharded concurrent map (no global lock; a known client costs a
//! shard read lock and one compare-and-swap). Memory is bounded: IPv6 clients are counted
//! per /64 (one subnet per customer, so rotating addresses buys nothing), at most
//! [`MAX_TRACKED_CLIENTS`] are tracked individually, and clients past the cap (and clients
//! whose address cannot be resolved) share one overflow budget: still limited, never
//! waved through. Budgets that have fully refilled are swept every minute, lazily, from
//! the request path; a budget still in debt is kept, so forgetting it grants no amnesty.

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::StateStore;
use governor::{Quota, RateLimiter as Gcra};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::client_ip::{IpList, normalize};

pub const MAX_TRACKED_CLIENTS: usize = 50_000;

/// The longest a spent budget may take to refill in full (burst ÷ rate). governor keeps
/// its times as `u64` nanoseconds (584 years) and panics or wraps past them; a decade is
/// far beyond any real limit and leaves the rest for the proxy's uptime.
pub const MAX_REFILL: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// The burst a limiter uses: `burst`, or `max(1, ceil(rate))` when it is zero, as the fork.
pub fn effective_burst(rate: f64, burst: u32) -> u32 {
    if burst == 0 {
        rate.ceil().clamp(1.0, f64::from(u32::MAX)) as u32
    } else {
        burst
    }
}

/// Seconds a spent budget takes to refill in full; validation refuses more than
/// [`MAX_REFILL`].
pub fn refill_secs(rate: f64, burst: u32) -> f64 {
    f64::from(effective_burst(rate, burst)) / rate
}
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// The identity a budget belongs to: the whole IPv4 address (as its mapped IPv6 form), or
/// the /64 of an IPv6 address. The two never collide: a /64 key has its low 64 bits zero,
/// a mapped IPv4 address never does.
type Key = u128;

fn key_of(addr: IpAddr) -> Key {
    match normalize(addr) {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6) & !((1u128 << 64) - 1),
    }
}

/// Time for the limiter, from tokio's clock (so tests can pause it).
#[derive(Clone)]
struct TokioClock {
    base: tokio::time::Instant,
}

impl Clock for TokioClock {
    type Instant = Duration;
    fn now(&self) -> Duration {
        self.base.elapsed()
    }
}

/// One GCRA state word per key: 0 = never used, else the theoretical arrival time.
#[derive(Default)]
struct Cell(AtomicU64);

impl Cell {
    fn measure_and_replace<T, E>(
        &self,
        f: impl Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    ) -> Result<T, E> {
        let mut prev = self.0.load(Ordering::Acquire);
        loop {
            let (result, next) = f((prev != 0).then(|| Nanos::from(prev)))?;
            match self.0.compare_exchange_weak(
                prev,
                next.as_u64(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(result),
                Err(actual) => prev = actual,
            }
        }
    }
}

/// The bounded store governor measures against. `None` is the overflow budget. Shared
/// with [`RateLimit`] (governor keeps its store private) for counting and sweeping.
#[derive(Default)]
struct Budgets {
    clients: DashMap<Key, Cell>,
    tracked: AtomicUsize,
    overflow: Cell,
}

struct Store(Arc<Budgets>);

impl StateStore for Store {
    type Key = Option<Key>;

    fn measure_and_replace<T, F, E>(&self, key: &Option<Key>, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let this = &self.0;
        let Some(key) = key else {
            return this.overflow.measure_and_replace(f);
        };
        if let Some(cell) = this.clients.get(key) {
            return cell.measure_and_replace(f);
        }
        if this.tracked.load(Ordering::Relaxed) >= MAX_TRACKED_CLIENTS {
            return this.overflow.measure_and_replace(f);
        }
        match this.clients.entry(*key) {
            Entry::Occupied(e) => e.get().measure_and_replace(f),
            Entry::Vacant(e) => {
                this.tracked.fetch_add(1, Ordering::Relaxed);
                e.insert(Cell::default()).measure_and_replace(f)
            }
        }
    }
}

pub struct RateLimit {
    gcra: Gcra<Option<Key>, Store, TokioClock, NoOpMiddleware<Duration>>,
    exempt: IpList,
    budgets: Arc<Budgets>,
    rate: f64,
    burst: u32,
    clock: TokioClock,
    /// The limiter's zero on `clock`: governor keeps arrival times relative to it.
    start: Duration,
    /// When the next sweep is due, in nanoseconds on `clock`.
    next_sweep: AtomicU64,
}

impl RateLimit {
    /// `rate` is requests per second (> 0, may be fractional); a zero `burst` means
    /// `max(1, ceil(rate))`, as the fork.
    ///
    /// Validation keeps a full refill within [`MAX_REFILL`]; a stored value past it (a
    /// hand-edited state file) is clamped there rather than overflowing governor's clock.
    pub fn new(rate: f64, burst: u32, exempt: IpList) -> RateLimit {
        let period = Duration::try_from_secs_f64(1.0 / rate)
            .unwrap_or(MAX_REFILL)
            .clamp(Duration::from_nanos(1), MAX_REFILL);
        let most = MAX_REFILL.as_nanos() / period.as_nanos();
        let burst = effective_burst(rate, burst).min(u32::try_from(most).unwrap_or(u32::MAX));
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
        let clock = TokioClock {
            base: tokio::time::Instant::now(),
        };
        let budgets = Arc::new(Budgets::default());
        let start = clock.now();
        RateLimit {
            gcra: Gcra::new(quota, Store(budgets.clone()), clock.clone()),
            exempt,
            budgets,
            rate,
            burst,
            clock,
            start,
            next_sweep: AtomicU64::new(SWEEP_INTERVAL.as_nanos() as u64),
        }
    }

    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Spends one token of `client`'s budget; `false` when there is none left.
    pub fn allow(&self, client: Option<IpAddr>) -> bool {
        if client.is_some_and(|a| self.exempt.contains(a)) {
            return true;
        }
        self.sweep_if_due();
        self.gcra.check_key(&client.map(key_of)).is_ok()
    }

    /// `Retry-After` in whole seconds: `ceil(1/rate)`, at least one (from the rate, not
    /// the bucket, as the fork).
    pub fn retry_after_secs(&self) -> u64 {
        (1.0 / self.rate).ceil().max(1.0) as u64
    }

    /// Clients tracked individually.
    pub fn tracked(&self) -> usize {
        self.budgets.tracked.load(Ordering::Relaxed)
    }

    fn sweep_if_due(&self) {
        let now = self.clock.now().as_nanos() as u64;
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now < due {
            return;
        }
        let next = now + SWEEP_INTERVAL.as_nanos() as u64;
        if self
            .next_sweep
            .compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return; // another request is sweeping
        }
        self.sweep();
    }

    /// Drops the budgets that have fully refilled (theoretical arrival time not after
    /// now): they are indistinguishable from new ones.
    fn sweep(&self) {
        let now = self.clock.now().saturating_sub(self.start).as_nanos() as u64;
        let mut removed = 0usize;
        self.budgets.clients.retain(|_, cell| {
            let full = cell.0.load(Ordering::Acquire) <= now;
            removed += usize::from(full);
            !full
        });
        self.budgets.tracked.fetch_sub(removed, Ordering::Relaxed);
        self.budgets.clients.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    fn limiter(rate: f64, burst: u32) -> RateLimit {
        RateLimit::new(rate, burst, IpList::default())
    }

    #[tokio::test(start_paused = true)]
    async fn allows_the_burst_then_refills_at_the_rate() {
        let l = limiter(2.0, 0);
        assert_eq!(l.burst(), 2);
        assert!(l.allow(ip("192.0.2.1")));
        assert!(l.allow(ip("192.0.2.1")));
        assert!(!l.allow(ip("192.0.2.1")));
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(l.allow(ip("192.0.2.1")));
        assert!(!l.allow(ip("192.0.2.1")));
        assert_eq!(l.retry_after_secs(), 1);
    }

    /// Rates and bursts that validation refuses, as a hand-edited state file may still
    /// hold them: governor's clock overflowed (a panic, the proxy down at restore).
    #[tokio::test(start_paused = true)]
    async fn extreme_stored_rates_are_clamped_not_a_panic() {
        for (rate, burst) in [
            (1e-30, 0),
            (f64::MIN_POSITIVE, 0),
            (1e-3, u32::MAX),
            (1e300, 0),
            (1e300, u32::MAX),
            (0.5, u32::MAX),
        ] {
            let l = RateLimit::new(rate, burst, IpList::default());
            assert!(l.allow(ip("192.0.2.1")), "rate {rate} burst {burst}");
            assert!(l.retry_after_secs() >= 1);
        }
        let l = RateLimit::new(1e-30, 0, IpList::default());
        assert!(l.allow(ip("192.0.2.1")));
        assert!(
            !l.allow(ip("192.0.2.1")),
            "one request, then the (clamped) decade"
        );
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(!l.allow(ip("192.0.2.1")));
    }

    #[tokio::test(start_paused = true)]
    async fn fractional_rates() {
        let l = limiter(0.5, 0);
        assert_eq!(l.burst(), 1);
        assert_eq!(l.retry_after_secs(), 2);
        assert!(l.allow(ip("192.0.2.1")));
        assert!(!l.allow(ip("192.0.2.1")));
        tokio::time::advance(Duration::from_millis(1900)).await;
        assert!(!l.allow(ip("192.0.2.1")));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(l.allow(ip("192.0.2.1")));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_ipv4_per_address_and_ipv6_per_64() {
        let l = limiter(1.0, 1);
        assert!(l.allow(ip("192.0.2.1")));
        assert!(l.allow(ip("192.0.2.2")));
        assert!(
            !l.allow(ip("::ffff:192.0.2.1")),
            "mapped shares the v4 budget"
        );
        assert!(l.allow(ip("2001:db8:0:1::1")));
        assert!(!l.allow(ip("2001:db8:0:1:ffff::2")), "same /64");
        assert!(l.allow(ip("2001:db8:0:2::1")), "another /64");
        assert_eq!(l.tracked(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn exempt_ranges_and_the_shared_overflow_budget() {
        let exempt = IpList::parse(&["10.0.0.0/8".into()], "rate-limit-exempt").unwrap();
        let l = RateLimit::new(1.0, 1, exempt);
        for _ in 0..10 {
            assert!(l.allow(ip("10.1.2.3")));
        }
        // Unresolvable clients share one budget: limited, not waved through.
        assert!(l.allow(None));
        assert!(!l.allow(None));
        assert_eq!(l.tracked(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded_under_a_flood_of_distinct_clients() {
        let l = limiter(1.0, 1);
        for i in 0..(MAX_TRACKED_CLIENTS as u128 + 10_000) {
            let a = std::net::Ipv6Addr::from((0x2001_0db8u128 << 96) | (i << 64));
            l.allow(Some(IpAddr::V6(a)));
        }
        assert_eq!(l.tracked(), MAX_TRACKED_CLIENTS);
        assert!(l.budgets.clients.len() <= MAX_TRACKED_CLIENTS);
        // Newcomers past the cap share the overflow budget (spent by the flood).
        assert!(!l.allow(ip("192.0.2.77")));
        // Once refilled, the next sweep forgets them all.
        tokio::time::advance(SWEEP_INTERVAL).await;
        assert!(l.allow(ip("192.0.2.77")));
        assert_eq!(l.tracked(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn budgets_in_debt_survive_the_sweep() {
        let l = limiter(1.0 / 120.0, 1);
        assert!(l.allow(ip("192.0.2.1")));
        tokio::time::advance(SWEEP_INTERVAL).await;
        assert!(!l.allow(ip("192.0.2.1")), "no amnesty");
        assert_eq!(l.tracked(), 1);
    }

    #[test]
    fn exact_budget_under_concurrency() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let _guard = rt.enter();
        let l = std::sync::Arc::new(limiter(0.001, 50));
        let allowed = std::sync::Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                let (l, allowed) = (l.clone(), allowed.clone());
                let handle = rt.handle().clone();
                s.spawn(move || {
                    let _g = handle.enter();
                    for _ in 0..100 {
                        if l.allow(ip("192.0.2.1")) {
                            allowed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(allowed.load(Ordering::Relaxed), 50);
    }
}
