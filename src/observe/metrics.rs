//! Prometheus metrics with upstream's names and labels, in the Go client's text format.
//! Recording is skipped entirely unless `--metrics-port` is set.

use arc_swap::ArcSwap;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

pub struct Metrics {
    pub registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    in_flight: IntGaugeVec,
    sleep: SleepCollectors,
}

/// Scale-to-zero collectors (ours; named in upstream's `kamal_proxy_` style).
struct SleepCollectors {
    state: IntGaugeVec,
    sleeps: IntCounterVec,
    wakes: IntCounterVec,
    wake_duration: HistogramVec,
    held: IntGaugeVec,
}

/// Every idle state the gauge reports, in the controller's vocabulary.
pub const SLEEP_STATES: &[&str] = &[
    "active", "freezing", "frozen", "stopping", "sleeping", "waking",
];

/// Wakes take milliseconds from frozen and seconds from stopped: buckets for both.
const WAKE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static METRICS: OnceLock<Metrics> = OnceLock::new();
static ENABLED: AtomicBool = AtomicBool::new(false);

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Registers the collectors; called once by `run` when a metrics port is configured.
pub fn enable() -> Result<&'static Metrics, String> {
    let m = METRICS.get_or_init(|| build().expect("metric definitions are static and valid"));
    ENABLED.store(true, Ordering::Relaxed);
    Ok(m)
}

fn build() -> prometheus::Result<Metrics> {
    let registry = Registry::new();
    let requests = IntCounterVec::new(
        Opts::new("http_requests_total", "Total number of HTTP requests")
            .namespace("kamal")
            .subsystem("proxy"),
        &["service", "method", "status"],
    )?;
    let duration = HistogramVec::new(
        HistogramOpts::new(
            "http_request_duration_seconds",
            "Duration of HTTP requests in seconds",
        )
        .namespace("kamal")
        .subsystem("proxy")
        .buckets(prometheus::DEFAULT_BUCKETS.to_vec()),
        &["service", "method", "status"],
    )?;
    let in_flight = IntGaugeVec::new(
        Opts::new(
            "http_in_flight_requests",
            "Number of in-flight HTTP requests",
        )
        .namespace("kamal")
        .subsystem("proxy"),
        &["service"],
    )?;
    let sleep = SleepCollectors {
        state: IntGaugeVec::new(
            Opts::new(
                "service_idle_state",
                "Scale-to-zero state of a service (1 for the current state, 0 for the others)",
            )
            .namespace("kamal")
            .subsystem("proxy"),
            &["service", "state"],
        )?,
        sleeps: IntCounterVec::new(
            Opts::new(
                "service_sleeps_total",
                "Times an idle service was frozen or stopped, by tier and result",
            )
            .namespace("kamal")
            .subsystem("proxy"),
            &["service", "tier", "result"],
        )?,
        wakes: IntCounterVec::new(
            Opts::new(
                "service_wakes_total",
                "Times a frozen or sleeping service was woken, by tier and result",
            )
            .namespace("kamal")
            .subsystem("proxy"),
            &["service", "tier", "result"],
        )?,
        wake_duration: HistogramVec::new(
            HistogramOpts::new(
                "service_wake_duration_seconds",
                "Time from the start of a successful wake until the service could serve",
            )
            .namespace("kamal")
            .subsystem("proxy")
            .buckets(WAKE_BUCKETS.to_vec()),
            &["service", "tier"],
        )?,
        held: IntGaugeVec::new(
            Opts::new(
                "service_held_requests",
                "Requests held now while a service wakes",
            )
            .namespace("kamal")
            .subsystem("proxy"),
            &["service"],
        )?,
    };
    registry.register(Box::new(requests.clone()))?;
    registry.register(Box::new(duration.clone()))?;
    registry.register(Box::new(in_flight.clone()))?;
    registry.register(Box::new(sleep.state.clone()))?;
    registry.register(Box::new(sleep.sleeps.clone()))?;
    registry.register(Box::new(sleep.wakes.clone()))?;
    registry.register(Box::new(sleep.wake_duration.clone()))?;
    registry.register(Box::new(sleep.held.clone()))?;
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    Ok(Metrics {
        registry,
        requests,
        duration,
        in_flight,
        sleep,
    })
}

/// Upstream keeps the standard methods and folds everything else into `OTHER`.
pub fn method_label(method: &http::Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "CONNECT" => "CONNECT",
        "OPTIONS" => "OPTIONS",
        "TRACE" => "TRACE",
        _ => "OTHER",
    }
}

/// One service's metric handles, resolved once per service rather than by label lookup
/// (a hash and a read lock in the registry) on every request.
pub struct ServiceMetrics {
    service: Arc<str>,
    in_flight: IntGauge,
    /// The (method, status) series seen so far: a handful per service, scanned without a
    /// lock; a new pair is added copy-on-write, once.
    outcomes: ArcSwap<Vec<Outcome>>,
}

struct Outcome {
    method: &'static str,
    status: u16,
    requests: IntCounter,
    duration: Histogram,
}

impl ServiceMetrics {
    /// The handles for `service`; `None` unless `--metrics-port` is set.
    pub fn for_service(service: &Arc<str>) -> Option<Arc<ServiceMetrics>> {
        let m = METRICS.get().filter(|_| enabled())?;
        Some(Arc::new(ServiceMetrics {
            service: service.clone(),
            in_flight: m.in_flight.with_label_values(&[&**service]),
            outcomes: ArcSwap::from_pointee(Vec::new()),
        }))
    }

    pub fn request_started(&self) {
        self.in_flight.inc();
    }

    pub fn request_ended(&self) {
        self.in_flight.dec();
    }

    /// Counts a finished request and its duration.
    pub fn record(&self, method: &'static str, status: u16, seconds: f64) {
        let find = |outcomes: &[Outcome]| {
            outcomes
                .iter()
                .position(|o| o.status == status && o.method == method)
        };
        let outcomes = self.outcomes.load();
        if let Some(i) = find(&outcomes) {
            outcomes[i].requests.inc();
            outcomes[i].duration.observe(seconds);
            return;
        }
        drop(outcomes);
        let Some(m) = METRICS.get() else { return };
        let mut buf = itoa_buf(status);
        let labels = [&*self.service, method, status_str(&mut buf)];
        let requests = m.requests.with_label_values(&labels);
        let duration = m.duration.with_label_values(&labels);
        requests.inc();
        duration.observe(seconds);
        self.outcomes.rcu(|current| {
            let mut next: Vec<Outcome> = Vec::with_capacity(current.len() + 1);
            next.extend(current.iter().map(|o| Outcome {
                method: o.method,
                status: o.status,
                requests: o.requests.clone(),
                duration: o.duration.clone(),
            }));
            if find(&next).is_none() {
                next.push(Outcome {
                    method,
                    status,
                    requests: requests.clone(),
                    duration: duration.clone(),
                });
            }
            next
        });
    }
}

/// One service's scale-to-zero handles, resolved when its idle controller is built, so a
/// transition updates a gauge or counter without a registry lookup.
pub struct SleepMetrics {
    /// One gauge per entry of [`SLEEP_STATES`].
    states: Vec<IntGauge>,
    /// By tier (0 = frozen, 1 = sleeping): (success, failure).
    sleeps: [(IntCounter, IntCounter); 2],
    wakes: [(IntCounter, IntCounter); 2],
    wake_duration: [Histogram; 2],
    held: IntGauge,
}

/// The two tiers a service can be woken from, as metric labels.
const TIERS: [&str; 2] = ["frozen", "sleeping"];

impl SleepMetrics {
    /// The handles for `service`, every series created at zero so a query sees the service
    /// before its first transition; `None` unless `--metrics-port` is set.
    pub fn for_service(service: &str) -> Option<Arc<SleepMetrics>> {
        let m = &METRICS.get().filter(|_| enabled())?.sleep;
        let counters = |vec: &IntCounterVec, tier: &str| {
            (
                vec.with_label_values(&[service, tier, "success"]),
                vec.with_label_values(&[service, tier, "failure"]),
            )
        };
        Some(Arc::new(SleepMetrics {
            states: SLEEP_STATES
                .iter()
                .map(|state| m.state.with_label_values(&[service, state]))
                .collect(),
            sleeps: TIERS.map(|tier| counters(&m.sleeps, tier)),
            wakes: TIERS.map(|tier| counters(&m.wakes, tier)),
            wake_duration: TIERS.map(|tier| m.wake_duration.with_label_values(&[service, tier])),
            held: m.held.with_label_values(&[service]),
        }))
    }

    /// Moves the state gauge to `state` (one of [`SLEEP_STATES`]).
    pub fn set_state(&self, state: &str) {
        for (gauge, name) in self.states.iter().zip(SLEEP_STATES) {
            gauge.set(i64::from(*name == state));
        }
    }

    pub fn slept(&self, frozen: bool, ok: bool) {
        let (success, failure) = &self.sleeps[usize::from(!frozen)];
        if ok { success.inc() } else { failure.inc() }
    }

    pub fn woke(&self, frozen: bool, ok: bool, seconds: f64) {
        let tier = usize::from(!frozen);
        let (success, failure) = &self.wakes[tier];
        if ok {
            success.inc();
            self.wake_duration[tier].observe(seconds);
        } else {
            failure.inc();
        }
    }

    pub fn held(&self, delta: i64) {
        self.held.add(delta);
    }

    /// Drops the service's series when it is removed.
    pub fn forget(service: &str) {
        let Some(m) = METRICS.get() else { return };
        let m = &m.sleep;
        for state in SLEEP_STATES {
            let _ = m.state.remove_label_values(&[service, state]);
        }
        for tier in TIERS {
            for result in ["success", "failure"] {
                let _ = m.sleeps.remove_label_values(&[service, tier, result]);
                let _ = m.wakes.remove_label_values(&[service, tier, result]);
            }
            let _ = m.wake_duration.remove_label_values(&[service, tier]);
        }
        let _ = m.held.remove_label_values(&[service]);
    }
}

/// A request that reached no service (a 404): counted under the empty service name.
pub fn record_unrouted(method: &'static str, status: u16, seconds: f64) {
    let Some(m) = METRICS.get().filter(|_| enabled()) else {
        return;
    };
    let mut buf = itoa_buf(status);
    let labels = ["", method, status_str(&mut buf)];
    m.requests.with_label_values(&labels).inc();
    m.duration.with_label_values(&labels).observe(seconds);
}

fn itoa_buf(status: u16) -> [u8; 3] {
    let s = status.min(999);
    [
        b'0' + (s / 100) as u8,
        b'0' + (s / 10 % 10) as u8,
        b'0' + (s % 10) as u8,
    ]
}

fn status_str(buf: &mut [u8; 3]) -> &str {
    std::str::from_utf8(buf).unwrap_or("000")
}

/// The text exposition, served on every path of the metrics port.
pub fn render() -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(m) = METRICS.get() {
        let _ = prometheus::TextEncoder::new().encode(&m.registry.gather(), &mut out);
    }
    out
}
