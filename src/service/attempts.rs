//! Placing a request on a target (the last part of ARCHITECTURE.md step 9): the pool (the
//! rollout's or the active one), a reader or a writer, and the exchange with it, in one
//! attempt or, with `--target-try-duration` (fork F18), in as many as fit in it:
//!
//! - no healthy target: the request waits (any method: nothing was sent) until the pool
//!   can serve, or `--target-try-interval` passes, and is placed again;
//! - an attempt that failed in a way `proxy::retry::may_try_elsewhere` allows: straight
//!   on to the next target while some remain untried, then after the interval.
//!
//! Each attempt asks the service for its pool again, so a request held across a redeploy
//! goes to the new targets. With `--session-affinity` (fork F17) the first attempt goes to
//! the writer the client's cookie pins; a further attempt is the rotation's, and the
//! answer pins the client to the target that gave it (a proxy-made answer pins nobody).
//! The try duration never outlasts `--request-timeout`: a deadline that passes while the
//! request waits is a 504, as during any other hold. The access log counts the further
//! attempts (`retries`).

use http::Request;
use http::uri::PathAndQuery;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::{Conn, Service, ServiceConfig, is_read_request};
use crate::balancer::{LoadBalancer, Pick};
use crate::options::upstream::RetryPolicy;
use crate::proxy::body::{BoxedResponse, RequestBody};
use crate::proxy::cookies::{SessionPin, has_live_writer_cookie, request_cookie};
use crate::proxy::exchange::Exchange;
use crate::proxy::rejection::{Refused, Rejection};
use crate::proxy::{Forwarder, ResponseCookies, Retry, UpstreamRequest};
use crate::recycle::Recycled;
use crate::worker::Local;

/// What the pipeline decided about the request before it is placed.
pub(super) struct Placement<'a> {
    /// The path after rewrites and `--strip-path-prefix`, with the query.
    pub path_and_query: PathAndQuery,
    /// `--target-timeout` or the request's `--path-timeout`.
    pub response_timeout: Option<Duration>,
    /// `--request-timeout` or the request's `--path-request-timeout`.
    pub deadline: Option<Instant>,
    /// The path prefix the router matched.
    pub prefix: &'a str,
}

impl Service {
    /// Sends the request to a target and returns the response: the app's, or the proxy's
    /// own answer once no attempt is left.
    ///
    /// The request is borrowed from where it was read (see `server::handle`). Not an
    /// `async fn`, which would keep each argument twice in its future and copy them on its
    /// first poll.
    #[allow(clippy::manual_async_fn)]
    pub(super) fn forward_to_target<'a>(
        &'a self,
        req: &'a mut Request<RequestBody>,
        conn: Conn,
        config: &'a ServiceConfig,
        placed: Placement<'a>,
        mut exchange: Exchange,
        forwarder: &'a Forwarder,
    ) -> impl Future<Output = BoxedResponse> + Send + 'a {
        async move {
            let mut tries = config
                .upstream
                .retry
                .map(|policy| Tries::new(policy, placed.deadline));
            let client_ip = crate::proxy::headers::ip_value(conn.client.ip());
            self.wait_for_a_starting_pin(req, config, placed.deadline)
                .await;
            let mut first = true;
            loop {
                let chosen = self.choose_target(req, config, placed.prefix, first);
                let Chosen {
                    target,
                    lb,
                    mut cookies,
                    repin,
                } = match chosen {
                    // The pin counts for the first attempt sent, not for a wait before it.
                    Ok(chosen) => {
                        first = false;
                        chosen
                    }
                    Err(pool) => {
                        let waited = match tries.as_mut() {
                            Some(t) => t.wait_for_target(&pool).await,
                            None => false,
                        };
                        if waited {
                            exchange.record().retries += 1;
                            continue;
                        }
                        let rejection = past_deadline(placed.deadline, Rejection::NoHealthyTarget);
                        return self.refuse(rejection, req, config, exchange);
                    }
                };
                cookies.session_pin =
                    config
                        .options
                        .session_cookie()
                        .filter(|_| repin)
                        .map(|name| SessionPin {
                            name,
                            value: target.pin(),
                            secure: conn.tls,
                        });
                exchange.record().target = Some(target.shared_address());
                exchange.target = Some(target.begin());
                let may_retry = tries.as_ref().is_some_and(Tries::time_left);
                let up = UpstreamRequest {
                    target: &target,
                    path_and_query: placed.path_and_query.clone(),
                    options: &config.target_options,
                    pools: &config.upstream.pools,
                    response_timeout: placed.response_timeout,
                    may_retry,
                    pages: config.pages.as_ref(),
                    client_ip: &client_ip,
                    tls: conn.tls,
                    watches_cuts: conn.watches_cuts,
                    deadline: placed.deadline,
                    service: &self.name,
                    cookies,
                };
                // On the heap, in a block the thread reuses (`Recycled`): `forward`'s future is
                // about 5 KB, and held inline it made every future above it (this one,
                // `serve`, `handle`, the connection's service call) that much larger, each
                // moved whole once per request (about 9 KB copied at hyper's `recv_msg` and
                // again into the service block). A block is cheaper than those copies
                // (bench/README.md, "Where the time goes").
                let forwarded = Recycled::new(forwarder.forward(req, up, exchange));
                let Retry {
                    exchange: back,
                    failure,
                } = match forwarded.await {
                    Ok(response) => return response,
                    Err(retry) => *retry,
                };
                exchange = back;
                let again = match tries.as_mut() {
                    Some(t) => t.after_failure(lb.healthy_alongside(&target)).await,
                    None => false,
                };
                if !again {
                    let rejection = past_deadline(placed.deadline, failure);
                    return self.refuse(rejection, req, config, exchange);
                }
                exchange.record().retries += 1;
                tracing::debug!(
                    service = %self.name,
                    "target" = target.address(),
                    path = req.uri().path(),
                    failure = ?failure,
                    "Retrying request"
                );
            }
        }
    }

    /// The pool a request goes to (the rollout's or the active one), whether it is a
    /// read, and whether it may go to a reader.
    fn pool_and_side<B>(
        &self,
        req: &Request<B>,
        config: &ServiceConfig,
    ) -> (Local<LoadBalancer>, bool, bool) {
        let lb = self.pool_for(req.headers());
        // Only a pool with readers tells reads from writes (every use of `read` below and
        // in the balancer is with readers present): most pools have none, and the test
        // looks up `Connection` and `Upgrade`.
        let read =
            lb.has_readers() && is_read_request(req, config.options.read_targets_accept_websockets);
        // Writer affinity (upstream §4.4) matters only to a pool with readers: a client
        // that wrote recently reads from a writer, and a write renews its cookie.
        let to_reader = read && !(lb.has_readers() && has_live_writer_cookie(req.headers()));
        (lb, read, to_reader)
    }

    /// Session affinity across a wake: a client whose pinned container is still starting
    /// waits for it (up to the wake's deadline and the request's) rather than be re-pinned
    /// to the first container up (see `LoadBalancer::starting_pin`).
    async fn wait_for_a_starting_pin<B>(
        &self,
        req: &Request<B>,
        config: &ServiceConfig,
        deadline: Option<Instant>,
    ) {
        let Some(cookie) = config
            .options
            .session_cookie()
            .and_then(|name| request_cookie(req.headers(), name))
        else {
            return;
        };
        let (lb, _, to_reader) = self.pool_and_side(req, config);
        if let Some((pinned, until)) = lb.starting_pin(to_reader, cookie) {
            let until = deadline.map_or(until, |d| d.min(until));
            lb.wait_for_target(&pinned, until).await;
        }
    }

    /// A target for the request (in the rollout's pool or the active one, a reader or a
    /// writer), its pool and what the proxy does to the cookies of its answer; the pool
    /// alone when it has no healthy target. With session affinity the `first` attempt
    /// honours the client's pin; later ones are the rotation's.
    pub(super) fn choose_target<'p, B>(
        &self,
        req: &Request<B>,
        config: &ServiceConfig,
        prefix: &'p str,
        first: bool,
    ) -> Result<Chosen<'p>, Local<LoadBalancer>> {
        let (lb, read, to_reader) = self.pool_and_side(req, config);
        let affinity = lb.has_readers();
        let writer_affinity =
            (affinity && !read && config.options.writer_affinity_timeout.is_positive())
                .then(|| config.options.writer_affinity_timeout.to_std());
        // Upstream scopes cookie paths only under a stripped, non-root prefix.
        let scope_cookies = (config.target_options.scope_cookie_paths
            && config.options.strip_prefix
            && prefix != "/")
            .then_some(prefix);
        // Session affinity (fork F17) inside the chosen pool, after the read/write split:
        // a write, or a read kept on the writers, goes to the writer the client's cookie
        // pins; weights and rotation choose only for a client without a live pin.
        let picked = match config.options.session_cookie() {
            Some(name) => {
                let pin = request_cookie(req.headers(), name);
                lb.select_pinned(to_reader, pin.filter(|_| first))
                    .map(|p| Pick {
                        // A further attempt's target may be the one the cookie names.
                        repin: p.repin && pin != Some(p.target.pin()),
                        target: p.target,
                    })
            }
            None => lb.select(to_reader).map(|target| Pick {
                target,
                repin: false,
            }),
        };
        let Some(Pick { target, repin }) = picked else {
            return Err(lb);
        };
        let cookies = ResponseCookies {
            writer_affinity,
            scope_paths: scope_cookies,
            session_pin: None,
        };
        Ok(Chosen {
            target,
            lb,
            cookies,
            repin,
        })
    }

    fn refuse<B>(
        &self,
        rejection: Rejection,
        req: &Request<B>,
        config: &ServiceConfig,
        exchange: Exchange,
    ) -> BoxedResponse {
        let at = Refused {
            service: &self.name,
            path: req.uri().path(),
            method: req.method(),
        };
        rejection.respond(&at, config.pages.as_ref(), exchange)
    }
}

/// A target, its pool, and the proxy's changes to the cookies of its answer.
pub(super) struct Chosen<'p> {
    target: Arc<crate::balancer::Target>,
    lb: Local<LoadBalancer>,
    cookies: ResponseCookies<'p>,
    /// Session affinity: the answer pins the client to this target (the session cookie
    /// is added once the target is at hand, as it borrows the target's pin).
    repin: bool,
}

/// `rejection`, unless the request's deadline has passed: then that is the answer.
fn past_deadline(deadline: Option<Instant>, rejection: Rejection) -> Rejection {
    match deadline {
        Some(d) if Instant::now() >= d => Rejection::DeadlineExceeded,
        _ => rejection,
    }
}

/// The budget and pacing of one request's attempts.
struct Tries {
    /// The try duration's end, or the request's deadline if that comes first.
    until: Instant,
    interval: Duration,
    /// Targets tried straight after one another since the last pause.
    hops: usize,
}

impl Tries {
    fn new(policy: RetryPolicy, deadline: Option<Instant>) -> Tries {
        let end = Instant::now() + policy.try_duration;
        Tries {
            until: deadline.map_or(end, |d| d.min(end)),
            interval: policy.interval,
            hops: 0,
        }
    }

    fn time_left(&self) -> bool {
        Instant::now() < self.until
    }

    /// No healthy target: waits until `pool` can serve, for the interval at most.
    /// `false`: the time is up.
    async fn wait_for_target(&mut self, pool: &LoadBalancer) -> bool {
        let now = Instant::now();
        if now >= self.until {
            return false;
        }
        tracing::debug!(service = pool.service(), "Waiting for a healthy target");
        let until = (now + self.interval).min(self.until);
        if pool.wait_until_serving(until).await.is_ok() {
            // A pool that says it serves while it gave no target is between two updates
            // of its healthy set: let the other one finish.
            tokio::task::yield_now().await;
        }
        true
    }

    /// An attempt failed: straight on while the `healthy` targets on its side (readers or
    /// writers) outnumber the attempts since the last pause, else a pause of the interval
    /// (the last one cut to the time left). `false`: the time is up.
    async fn after_failure(&mut self, healthy: usize) -> bool {
        let now = Instant::now();
        if now >= self.until {
            return false;
        }
        if self.hops + 1 < healthy {
            self.hops += 1;
            return true;
        }
        self.hops = 0;
        tokio::time::sleep_until((now + self.interval).min(self.until)).await;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::affinity::PinKey;
    use crate::balancer::health::{HealthCheckConfig, probe_client};
    use crate::balancer::spec::TargetSpec;

    fn pool(targets: &[&str]) -> std::sync::Arc<LoadBalancer> {
        let t: Vec<TargetSpec> = targets
            .iter()
            .map(|s| TargetSpec::parse(s).unwrap())
            .collect();
        LoadBalancer::new(
            "app",
            &t,
            &[],
            PinKey::generate().unwrap(),
            HealthCheckConfig::default(),
            probe_client(),
        )
        .unwrap()
    }

    fn policy(try_ms: u64, interval_ms: u64) -> RetryPolicy {
        RetryPolicy {
            try_duration: Duration::from_millis(try_ms),
            interval: Duration::from_millis(interval_ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failures_hop_through_the_targets_then_pause_until_the_time_is_up() {
        // Three healthy targets on the failed attempt's side.
        let start = Instant::now();
        let mut tries = Tries::new(policy(1000, 300), None);
        // Two more targets to try straight away, then a pause.
        assert!(tries.after_failure(3).await);
        assert!(tries.after_failure(3).await);
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(tries.after_failure(3).await);
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        for _ in 0..3 {
            tries.after_failure(3).await;
        }
        assert_eq!(start.elapsed(), Duration::from_millis(600));
        for _ in 0..3 {
            tries.after_failure(3).await;
        }
        assert_eq!(start.elapsed(), Duration::from_millis(900));
        // The last pause is cut to the time left, and one attempt follows it.
        tries.after_failure(3).await;
        tries.after_failure(3).await;
        assert!(tries.after_failure(3).await);
        assert_eq!(start.elapsed(), Duration::from_millis(1000));
        assert!(!tries.time_left());
        assert!(!tries.after_failure(3).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_deadline_ends_the_tries_first() {
        let lb = pool(&["web-a:1"]);
        let start = Instant::now();
        let deadline = start + Duration::from_millis(400);
        let mut tries = Tries::new(policy(10_000, 250), Some(deadline));
        assert!(tries.wait_for_target(&lb).await);
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        assert!(tries.wait_for_target(&lb).await);
        assert_eq!(start.elapsed(), Duration::from_millis(400));
        assert!(!tries.wait_for_target(&lb).await);
        assert!(matches!(
            past_deadline(Some(deadline), Rejection::NoHealthyTarget),
            Rejection::DeadlineExceeded
        ));
        assert!(matches!(
            past_deadline(None, Rejection::NoHealthyTarget),
            Rejection::NoHealthyTarget
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_ends_as_soon_as_the_pool_can_serve() {
        let lb = pool(&["web-a:1"]);
        let start = Instant::now();
        let mut tries = Tries::new(policy(10_000, 5_000), None);
        let marker = lb.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(70)).await;
            marker.mark_all_healthy();
        });
        assert!(tries.wait_for_target(&lb).await);
        assert_eq!(start.elapsed(), Duration::from_millis(70));
    }
}
