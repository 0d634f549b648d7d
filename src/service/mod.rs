//! A deployed service and its request pipeline (steps 5–9 of ARCHITECTURE.md): the gates
//! run in order, and each may answer the request itself.

use arc_swap::{ArcSwap, ArcSwapOption};
use http::uri::PathAndQuery;
use http::{HeaderName, Method, Request, header};
use std::sync::Arc;

mod attempts;
pub mod gates;
mod optional;
// The options moved to the top-level `options` module (a leaf every layer reads); this
// path stays for code written against the old one.
pub use crate::options;
pub mod pause;
pub mod sleep;

use crate::balancer::LoadBalancer;
use crate::balancer::rollout::{ROLLOUT_COOKIE, RolloutSplit};
use crate::observe::access::{header_values, log_key};
use crate::observe::metrics::ServiceMetrics;
use crate::options::upstream::{PathTimeouts, RetryPolicy};
use crate::options::{ServiceOptions, TargetOptions};
use crate::proxy::body::{BoxedResponse, RequestBody};
use crate::proxy::cookies::request_cookie;
use crate::proxy::exchange::Exchange;
use crate::proxy::pages::ErrorPages;
use crate::proxy::rejection::{Refused, Rejection};
use crate::proxy::{Forwarder, Pools, headers};
use crate::uri::{decoded_path, routed_path};
use crate::worker::{Local, PerWorker};
use gates::Gates;
use pause::{PauseController, PauseOutcome};
use sleep::{HealthAnswer, IdleController};

/// Options compiled for the request path; swapped whole on redeploy.
#[derive(Clone)]
pub struct ServiceConfig {
    pub options: ServiceOptions,
    pub target_options: TargetOptions,
    pub pages: Option<Arc<ErrorPages>>,
    /// `--log-request-header`: (log key, header name).
    pub log_request_headers: Vec<(String, HeaderName)>,
    pub log_response_headers: Arc<Vec<String>>,
    /// Allow list, redirects, rate limit, basic auth, rewrites, deadline: compiled.
    /// Shared, so a config re-issued with inherited TLS settings keeps the same budgets.
    pub gates: Arc<Gates>,
    /// Where certificates come from when TLS is on (set by the router at deploy).
    pub tls: Option<Arc<crate::tls::CertSource>>,
    /// The deployed `(tls_enabled, tls_redirect)` when `options` carries the values a
    /// path-prefix service inherits from its host's root service; what is saved is what
    /// was deployed (Go refuses TLS on a path-prefix service when it reads the file back).
    pub deployed_tls: Option<(bool, bool)>,
    /// The upstream leg (fork F18–F21), compiled from the options above.
    pub upstream: UpstreamConfig,
}

/// The service's connections to its targets and the limits of each attempt.
#[derive(Clone)]
pub struct UpstreamConfig {
    /// Shared by configs re-issued with inherited TLS settings, and carried over a
    /// redeploy with the same pool flags ([`ServiceConfig::succeed`]).
    pub pools: Arc<Pools>,
    /// `--target-try-duration`; `None`: one attempt.
    pub retry: Option<RetryPolicy>,
    /// `--target-timeout` (`None` when 0: no limit, as Go's `ResponseHeaderTimeout`).
    pub response_timeout: Option<std::time::Duration>,
    /// `--path-timeout`.
    pub path_timeouts: PathTimeouts,
    /// `--path-request-timeout`.
    pub path_request_timeouts: PathTimeouts,
}

impl UpstreamConfig {
    fn build(options: &ServiceOptions, target: &TargetOptions) -> UpstreamConfig {
        let up = &target.upstream;
        UpstreamConfig {
            pools: Arc::new(Pools::new(up.pool_settings())),
            retry: options.retry.policy(),
            response_timeout: target
                .response_timeout
                .is_positive()
                .then(|| target.response_timeout.to_std()),
            path_timeouts: PathTimeouts::compile(&up.path_timeouts),
            path_request_timeouts: PathTimeouts::compile(&up.path_request_timeouts),
        }
    }
}

impl ServiceConfig {
    /// The options as deployed, without inherited TLS settings: what the state file keeps.
    pub fn deployed_options(&self) -> ServiceOptions {
        let mut options = self.options.clone();
        if let Some((enabled, redirect)) = self.deployed_tls {
            options.tls_enabled = enabled;
            options.tls_redirect = redirect;
        }
        options
    }

    pub fn build(
        name: &str,
        options: ServiceOptions,
        target_options: TargetOptions,
    ) -> Result<Self, String> {
        let pages = if options.error_page_path.is_empty() {
            None
        } else {
            let pages =
                ErrorPages::load(std::path::Path::new(&options.error_page_path)).map_err(|e| {
                    tracing::error!(error = %e, "Unable to load error pages");
                    "unable to load error pages".to_string()
                })?;
            Some(Arc::new(pages))
        };
        let log_request_headers = target_options
            .log_request_headers
            .iter()
            .map(|h| {
                HeaderName::from_bytes(h.as_bytes())
                    .map(|name| (log_key("req_", h), name))
                    .map_err(|_| format!("invalid header name '{h}'"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for h in &target_options.log_response_headers {
            HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| format!("invalid header name '{h}'"))?;
        }
        let gates = Gates::compile(name, &options)?;
        let upstream = UpstreamConfig::build(&options, &target_options);
        Ok(ServiceConfig {
            upstream,
            gates: Arc::new(gates),
            log_response_headers: Arc::new(target_options.log_response_headers.clone()),
            options,
            target_options,
            pages,
            log_request_headers,
            tls: None,
            deployed_tls: None,
        })
    }

    /// A redeploy of the service that `old` configured: the same pool flags keep its
    /// connections (and their limit) to the targets that stay.
    pub fn succeed(&mut self, old: &ServiceConfig) {
        let settings = *self.upstream.pools.settings();
        self.upstream.pools = Arc::new(Pools::succeed(&old.upstream.pools, settings));
    }

    fn is_health_check(&self, method: &Method, routed_path: &str) -> bool {
        (method == Method::GET || method == Method::HEAD)
            && routed_path == self.target_options.health_check_config.path
    }
}

/// Facts about the connection a request arrived on.
#[derive(Clone, Copy, Debug)]
pub struct Conn {
    pub client: std::net::SocketAddr,
    pub tls: bool,
    /// The task serving the request polls it again after every drain cut (our HTTP/1
    /// connection, see `crate::broadcast`): the request need not wait on its target's cut
    /// itself.
    pub watches_cuts: bool,
}

pub struct Service {
    pub name: Arc<str>,
    /// The config and the pools a request holds on to while it lasts: a handle per worker
    /// (see [`PerWorker`]).
    config: ArcSwap<PerWorker<ServiceConfig>>,
    active: ArcSwap<PerWorker<LoadBalancer>>,
    /// `rollout deploy`'s second pool, and `rollout set`'s split of requests onto it
    /// (upstream §4.5). `rollout stop` clears the split and keeps the pool.
    rollout: ArcSwapOption<PerWorker<LoadBalancer>>,
    rollout_split: optional::Optional<RolloutSplit>,
    pub pause: PauseController,
    sleep: optional::Optional<IdleController>,
    /// Resolved on the first request (metrics are switched on before any listener opens).
    metrics: std::sync::OnceLock<Option<Arc<ServiceMetrics>>>,
}

impl Service {
    pub fn new(
        name: &str,
        config: ServiceConfig,
        lb: Arc<LoadBalancer>,
        pause: PauseController,
    ) -> Self {
        Service {
            name: Arc::from(name),
            config: ArcSwap::from_pointee(PerWorker::new(Arc::new(config))),
            active: ArcSwap::from_pointee(PerWorker::new(lb)),
            rollout: ArcSwapOption::empty(),
            rollout_split: optional::Optional::default(),
            pause,
            sleep: optional::Optional::default(),
            metrics: std::sync::OnceLock::new(),
        }
    }

    pub fn config(&self) -> Arc<ServiceConfig> {
        self.config.load().shared().clone()
    }

    pub fn set_config(&self, config: ServiceConfig) {
        self.config
            .store(Arc::new(PerWorker::new(Arc::new(config))));
    }

    pub fn active(&self) -> Arc<LoadBalancer> {
        self.active.load().shared().clone()
    }

    /// Installs a new pool and returns the one it replaces.
    pub fn swap_active(&self, lb: Arc<LoadBalancer>) -> Arc<LoadBalancer> {
        self.active
            .swap(Arc::new(PerWorker::new(lb)))
            .shared()
            .clone()
    }

    pub fn rollout(&self) -> Option<Arc<LoadBalancer>> {
        self.rollout.load().as_ref().map(|lb| lb.shared().clone())
    }

    /// Installs (or clears) the rollout pool and returns the one it replaces.
    pub fn swap_rollout(&self, lb: Option<Arc<LoadBalancer>>) -> Option<Arc<LoadBalancer>> {
        self.rollout
            .swap(lb.map(|lb| Arc::new(PerWorker::new(lb))))
            .map(|old| old.shared().clone())
    }

    pub fn rollout_split(&self) -> Option<Arc<RolloutSplit>> {
        self.rollout_split.load_full()
    }

    pub fn set_rollout_split(&self, split: Option<RolloutSplit>) {
        self.rollout_split.swap(split.map(Arc::new));
    }

    /// The active pool, then the rollout pool if there is one: what a pause or stop
    /// drains, and what sleeping suspends and waking resumes.
    pub fn pools(&self) -> Vec<Arc<LoadBalancer>> {
        std::iter::once(self.active())
            .chain(self.rollout())
            .collect()
    }

    /// The pools requests can reach: the active pool, and the rollout pool while a split
    /// sends requests to it. A sleeping service starts the containers of these and waits
    /// until each can serve; a rollout pool left after `rollout stop` gets no traffic, so
    /// its containers (perhaps removed since) never hold up a wake.
    pub fn live_pools(&self) -> Vec<Arc<LoadBalancer>> {
        let rollout = self.rollout().filter(|_| self.rollout_split.is_set());
        std::iter::once(self.active()).chain(rollout).collect()
    }

    /// The pool a request goes to: the rollout pool when a split is set and the request's
    /// `kamal-rollout` cookie falls on its side, else the active pool.
    fn pool_for(&self, headers: &http::HeaderMap) -> Local<LoadBalancer> {
        if let Some(split) = self.rollout_split.load_full() {
            if let Some(rollout) = self.rollout.load().as_ref() {
                if request_cookie(headers, ROLLOUT_COOKIE).is_some_and(|v| split.routes(v)) {
                    return rollout.local();
                }
            }
        }
        self.active.load().local()
    }

    pub fn sleep_controller(&self) -> Option<Arc<IdleController>> {
        self.sleep.load_full()
    }

    pub fn set_sleep_controller(&self, c: Option<Arc<IdleController>>) {
        if let Some(old) = self.sleep.swap(c) {
            old.close();
        }
    }

    /// The `State` column of `list`: a pause state wins, then a non-active idle state.
    pub fn state_name(&self) -> String {
        let pause = self.pause.state();
        if pause != pause::PauseState::Running {
            return pause.name().to_string();
        }
        match self.sleep_controller().map(|c| c.state()) {
            Some(s) if s != sleep::IdleState::Active => s.to_string(),
            _ => "running".to_string(),
        }
    }

    /// Runs the service's part of the pipeline. `prefix` is the path prefix the router
    /// matched. The returned response always carries `exchange`.
    ///
    /// The request is borrowed from where it was read (see `server::handle`). Not an
    /// `async fn`, which would keep each argument twice in its future and copy them from
    /// one place to the other on its first poll.
    #[allow(clippy::manual_async_fn)]
    pub fn serve<'a>(
        &'a self,
        req: &'a mut Request<RequestBody>,
        conn: Conn,
        prefix: &'a str,
        mut exchange: Exchange,
        forwarder: &'a Forwarder,
    ) -> impl Future<Output = BoxedResponse> + Send + 'a {
        async move {
            let config = self.config.load().local();
            // The gates below may change the request's headers, so the path is read from the
            // URI's own handle (a reference count, not a copy) and routed once.
            let uri = req.uri().clone();
            let routed = routed_path(uri.path(), prefix, config.options.strip_prefix);
            let excluded = config
                .options
                .exclude_metrics_paths
                .iter()
                .any(|p| p == routed.as_ref());
            let metrics = self
                .metrics
                .get_or_init(|| ServiceMetrics::for_service(&self.name));
            exchange.set_service(self.name.clone(), metrics.as_ref(), excluded);
            if !config.log_request_headers.is_empty() || !config.log_response_headers.is_empty() {
                let record = exchange.record();
                let logged = config
                    .log_request_headers
                    .iter()
                    .map(|(key, name)| {
                        let mut value = header_values(req.headers(), name.as_str());
                        // The id and start the proxy made are sent, so logged, as well.
                        if value.is_empty()
                            && let Some(added) = record.arrival_field(name.as_str())
                        {
                            value = String::from_utf8_lossy(added.as_bytes()).into_owned();
                        }
                        (key.clone(), value)
                    })
                    .collect();
                record.req_headers = logged;
                record.resp_header_names = Some(config.log_response_headers.clone());
            }
            if !config.options.client_ip_header.is_empty() {
                // Upstream logs the named header as `remote_addr` when the client sent it.
                if let Some(v) = req
                    .headers()
                    .get(config.options.client_ip_header.as_str())
                    .filter(|v| !v.is_empty())
                {
                    exchange.record().remote_addr = Some(v.clone());
                }
            }
            let pages = config.pages.as_ref();
            let gates = &config.gates;
            // Classified on the path as the client sent it (prefix stripped), before rewrites.
            let is_health_check = config.is_health_check(req.method(), &routed);

            // Steps 5–8, each of which may answer the request itself.
            let admitted = self
                .admit(req, conn, &config, is_health_check, &mut exchange)
                .await;
            let deadline = match admitted {
                Ok(deadline) => deadline,
                Err(rejection) => {
                    let at = Refused {
                        service: &self.name,
                        path: uri.path(),
                        method: req.method(),
                    };
                    return rejection.respond(&at, pages, exchange);
                }
            };

            // Step 9: rewrites change only what the target sees; then a target is chosen.
            let path_and_query = gates::rewrite::rewrite(
                &gates.rewrites,
                uri.path(),
                uri.query(),
                prefix,
                config.options.strip_prefix,
            )
            .unwrap_or_else(|| upstream_path_and_query(&uri, &routed));
            // `--path-timeout` goes by the path after rewrites, before the prefix is
            // stripped (fork F20).
            let response_timeout = {
                let up = &config.upstream;
                if up.path_timeouts.is_empty() {
                    up.response_timeout
                } else {
                    let path = gates::rewrite::rewritten_path(&gates.rewrites, uri.path());
                    up.path_timeouts
                        .for_path(&decoded_path(&path), up.response_timeout)
                }
            };
            if !config.options.client_ip_header.is_empty() {
                headers::apply_client_ip_header(
                    req.headers_mut(),
                    &config.options.client_ip_header,
                );
            }
            forwarder.limit_client_body(req.body_mut(), exchange.started());
            let placed = attempts::Placement {
                path_and_query,
                response_timeout,
                deadline,
                prefix,
            };
            self.forward_to_target(req, conn, &config, placed, exchange, forwarder)
                .await
        }
    }
}

impl Service {
    /// Steps 5–8 of the pipeline: the request deadline, the gates, the pause gate and the
    /// sleep gate. `Ok` carries the deadline, for the steps below; an admitted request to
    /// a sleeping service is counted in flight (in `exchange`) and its wake awaited.
    async fn admit(
        &self,
        req: &mut Request<RequestBody>,
        conn: Conn,
        config: &ServiceConfig,
        is_health_check: bool,
        exchange: &mut Exchange,
    ) -> Result<Option<tokio::time::Instant>, Rejection> {
        let gates = &config.gates;
        // Step 5: one deadline over everything below, holds included; a
        // `--path-request-timeout` goes by the path as the client sent it (fork F21).
        let timeout = {
            let paths = &config.upstream.path_request_timeouts;
            if paths.is_empty() {
                gates.request_timeout
            } else {
                paths.for_path(&decoded_path(req.uri().path()), gates.request_timeout)
            }
        };
        let deadline = gates::deadline::deadline_for(timeout, req.headers());

        // Step 6: allow list, TLS mismatch, redirects, rate limit, basic auth.
        gates.check(&self.name, req, conn, &config.options, is_health_check)?;

        // Step 7: paused → held; stopped → refused.
        if !self.pause.is_running() {
            if is_health_check {
                return Err(Rejection::HealthCheckAnswered { healthy: true });
            }
            match within(deadline, self.pause.wait()).await {
                None => return Err(Rejection::DeadlineExceeded),
                Some(PauseOutcome::Proceed) => {}
                Some(PauseOutcome::Stopped(message)) => {
                    return Err(Rejection::Stopped { message });
                }
                Some(PauseOutcome::TimedOut) => return Err(Rejection::PauseExpired),
            }
        }

        // Step 8, the sleep gate: nothing above may start a container.
        if let Some(controller) = self.sleep.load_full() {
            if is_health_check {
                return match controller.health_check() {
                    HealthAnswer::Forward => Ok(deadline),
                    HealthAnswer::Healthy => Err(Rejection::HealthCheckAnswered { healthy: true }),
                    HealthAnswer::Unhealthy => {
                        Err(Rejection::HealthCheckAnswered { healthy: false })
                    }
                };
            }
            // A deadline that fires while the request is held answers 504; the wake
            // itself runs on, detached, for the next request. So does a browser
            // navigation answered with the wake page after the grace period.
            let page = config.options.wake_page && wants_wake_page(req);
            let held = async {
                if page {
                    tokio::time::timeout(WAKE_PAGE_GRACE, controller.admit()).await
                } else {
                    Ok(controller.admit().await)
                }
            };
            match within(deadline, held).await {
                Some(Ok(Ok(in_flight))) => exchange.idle = Some(in_flight),
                Some(Ok(Err(e))) => {
                    return Err(Rejection::WakeFailed {
                        detail: e.to_string(),
                        retry_after: e.retry_after(),
                    });
                }
                Some(Err(_)) => {
                    return Err(Rejection::WakePage {
                        service: self.name.clone(),
                    });
                }
                None => return Err(Rejection::DeadlineExceeded),
            }
        }
        Ok(deadline)
    }
}

/// How long a browser navigation is held before `--wake-page` answers it: a frozen
/// service wakes well inside it, so the page only shows for a real boot.
const WAKE_PAGE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// A browser navigation (`Sec-Fetch-Mode: navigate`, or a GET that accepts HTML): what
/// `--wake-page` answers. API calls, form posts and fetches are held as always.
fn wants_wake_page<B>(req: &Request<B>) -> bool {
    if req.method() != Method::GET {
        return false;
    }
    let h = req.headers();
    h.get("sec-fetch-mode").is_some_and(|v| v == "navigate")
        || h.get_all(header::ACCEPT)
            .iter()
            .any(|v| v.to_str().is_ok_and(|v| v.contains("text/html")))
}

/// Runs `f` until `deadline`, if there is one; `None` when the deadline passed first.
async fn within<F: std::future::Future>(
    deadline: Option<tokio::time::Instant>,
    f: F,
) -> Option<F::Output> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, f).await.ok(),
        None => Some(f.await),
    }
}

/// Every rule a deploy's options must satisfy, shared by the CLI (before it connects)
/// and the server (on every deploy), first error first.
pub fn validate(service: &ServiceOptions, target: &TargetOptions) -> Result<(), String> {
    service.validate()?;
    service.validate_with(gates::validate)?;
    service.validate_with(|o| {
        crate::proxy::cookies::validate_session_affinity(
            o.session_affinity,
            &o.session_affinity_cookie,
        )
    })?;
    target.validate()?;
    gates::validate_health_check(service, target)
}

fn upstream_path_and_query(uri: &http::Uri, routed: &str) -> PathAndQuery {
    let original = uri.path_and_query();
    if original.is_some_and(|pq| pq.path() == routed) {
        if let Some(pq) = original {
            return pq.clone();
        }
    }
    let s = match uri.query() {
        Some(q) => format!("{routed}?{q}"),
        None => routed.to_string(),
    };
    PathAndQuery::try_from(s).unwrap_or_else(|_| PathAndQuery::from_static("/"))
}

fn is_read_request<B>(req: &Request<B>, websockets_to_readers: bool) -> bool {
    let m = req.method();
    (m == Method::GET || m == Method::HEAD)
        && (websockets_to_readers || !headers::is_websocket(req.headers()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_browser_navigations_get_the_wake_page() {
        let req = |method: Method, headers: &[(&str, &str)]| {
            let mut b = Request::builder().method(method).uri("/");
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            b.body(()).unwrap()
        };
        let browser = "text/html,application/xhtml+xml,*/*;q=0.8";
        assert!(wants_wake_page(&req(Method::GET, &[("accept", browser)])));
        assert!(wants_wake_page(&req(
            Method::GET,
            &[("sec-fetch-mode", "navigate")]
        )));
        // API calls, fetches, form posts and HEAD are held as always.
        assert!(!wants_wake_page(&req(Method::GET, &[])));
        assert!(!wants_wake_page(&req(
            Method::GET,
            &[("accept", "application/json")]
        )));
        assert!(!wants_wake_page(&req(Method::GET, &[("accept", "*/*")])));
        assert!(!wants_wake_page(&req(
            Method::GET,
            &[("sec-fetch-mode", "cors"), ("accept", "application/json")]
        )));
        assert!(!wants_wake_page(&req(Method::POST, &[("accept", browser)])));
        assert!(!wants_wake_page(&req(Method::HEAD, &[("accept", browser)])));
    }
}
