//! The exchange guard: everything a request holds from its arrival until its response is
//! over — the access record, the service's in-flight metric, the target's drain guard and
//! the idle controller's in-flight count. It travels with the response body, so a
//! streamed response counts as traffic until its last byte, and dropping it (the client
//! went away) still writes the access line.

use http::{HeaderMap, HeaderValue};
use std::sync::Arc;

use crate::balancer::TargetGuard;
use crate::inflight::InFlight;
use crate::observe::access::{self, AccessRecord, STATUS_CLIENT_CLOSED_REQUEST};
use crate::observe::metrics::{self, ServiceMetrics};

pub struct Exchange {
    record: Box<AccessRecord>,
    /// The target the request went to; draining waits for it, or cancels it.
    pub target: Option<TargetGuard>,
    /// Counts the request as activity for a scale-to-zero service.
    pub idle: Option<InFlight>,
    metered: Metered,
    finished: bool,
}

/// Where the request is counted in the metrics.
enum Metered {
    /// Not routed to a service (yet): counted under the empty service name.
    Unrouted,
    /// Routed: the service's handles, its in-flight gauge already raised.
    Service(Arc<ServiceMetrics>),
    /// `--exclude-metrics-path`, or metrics are off.
    Not,
}

impl Exchange {
    pub fn new(record: AccessRecord) -> Self {
        Exchange {
            record: Box::new(record),
            target: None,
            idle: None,
            metered: Metered::Unrouted,
            finished: false,
        }
    }

    pub fn record(&mut self) -> &mut AccessRecord {
        &mut self.record
    }

    /// The `X-Request-Id` and `X-Request-Start` the proxy made for this request when it
    /// arrived, which leave with its proxy fields (`ForwardedFor::arrival`).
    pub fn arrival_fields(&self) -> (Option<&HeaderValue>, Option<&HeaderValue>) {
        self.record.arrival()
    }

    /// When the request arrived (its head was read).
    pub fn started(&self) -> tokio::time::Instant {
        self.record.started
    }

    /// The request reached a service: from here it counts in that service's metrics
    /// (`metrics` is `None` when they are off), unless its path is excluded.
    pub fn set_service(
        &mut self,
        name: Arc<str>,
        metrics: Option<&Arc<ServiceMetrics>>,
        exclude_metrics: bool,
    ) {
        self.metered = match metrics.filter(|_| !exclude_metrics) {
            Some(m) => {
                m.request_started();
                Metered::Service(m.clone())
            }
            None => Metered::Not,
        };
        self.record.service = Some(name);
    }

    pub fn set_response(&mut self, status: u16, headers: &HeaderMap) {
        self.record.status = status;
        self.record.resp_content_type = headers.get(http::header::CONTENT_TYPE).cloned();
        if let Some(names) = self.record.resp_header_names.clone() {
            self.record.resp_headers = names
                .iter()
                .map(|n| {
                    (
                        access::log_key("resp_", n),
                        access::header_values(headers, n),
                    )
                })
                .collect();
        }
    }

    /// Whether a drain gave up on this request's target.
    pub fn cancelled(&self) -> bool {
        self.target.as_ref().is_some_and(TargetGuard::is_cancelled)
    }

    /// The response body ended (or was cut off) after `bytes_sent` bytes.
    pub fn finish(mut self, bytes_sent: u64) {
        self.write(bytes_sent);
    }

    fn write(&mut self, bytes_sent: u64) {
        if self.finished {
            return;
        }
        self.finished = true;
        let r = &self.record;
        let elapsed = crate::clock::now().saturating_duration_since(r.started);
        match &self.metered {
            Metered::Service(m) => {
                m.request_ended();
                m.record(r.method, r.status, elapsed.as_secs_f64());
            }
            Metered::Unrouted => {
                metrics::record_unrouted(r.method, r.status, elapsed.as_secs_f64())
            }
            Metered::Not => {}
        }
        access::log_request(r, elapsed, bytes_sent);
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        if !self.finished {
            // Dropped before any response was handed to the client: it hung up.
            self.record.status = STATUS_CLIENT_CLOSED_REQUEST;
            self.write(0);
        }
    }
}
