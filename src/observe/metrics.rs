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
}

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
    registry.register(Box::new(requests.clone()))?;
    registry.register(Box::new(duration.clone()))?;
    registry.register(Box::new(in_flight.clone()))?;
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    Ok(Metrics {
        registry,
        requests,
        duration,
        in_flight,
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
