//! The last step of the pipeline: send the request to the chosen target and relay the
//! response, streaming both ways unless the service asked for buffering.

use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri, Version, header};
use http_body_util::BodyExt;
use hyper::body::Body as _;
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Duration;

use super::body::finish;
use super::body::{BodyReadTimeout, BoxedResponse, RequestBody, ResponseBody};
use super::buffer::{BufferError, SpillBuffer};
use super::cookies;
use super::exchange::Exchange;
use super::headers::{self, Field, Present};
use super::keep_alive;
use super::pages::ErrorPages;
use super::pool::{self, ConnectFailure, Pools, Reuse};
use super::proxy_fields::{ForwardedFor, ProxyFields};
use super::rejection::{Refused, Rejection};
use super::retry::{self, Replay};
use crate::balancer::Target;
use crate::options::TargetOptions;

/// Forwards requests to targets through each service's [`Pools`], and keeps what targets
/// have said about their connections.
#[derive(Clone)]
pub struct Forwarder {
    /// Hosts that announced `Keep-Alive: timeout=N`, and how long their connections may idle.
    keep_alive: Arc<keep_alive::Hosts>,
    /// `run --body-read-timeout`.
    body_read_timeout: Option<Duration>,
    /// `run --read-timeout`: the whole body, from the request's arrival.
    read_timeout: Option<Duration>,
}

/// What the service has decided about a request before it is forwarded.
pub struct UpstreamRequest<'a> {
    pub target: &'a Arc<Target>,
    /// The path after `--strip-path-prefix`, with the query untouched.
    pub path_and_query: PathAndQuery,
    pub options: &'a TargetOptions,
    /// The service's connections to its targets.
    pub pools: &'a Pools,
    /// `--target-timeout`, or the `--path-timeout` of the request's path: how long the
    /// target may take to start its answer once the request is sent (`None`: no limit).
    pub response_timeout: Option<Duration>,
    /// `--target-try-duration` leaves time for another attempt: a failure that
    /// [`retry::may_try_elsewhere`] allows is handed back instead of answered.
    pub may_retry: bool,
    pub pages: Option<&'a Arc<ErrorPages>>,
    /// The client's address, as `X-Forwarded-For` gets it.
    pub client_ip: &'a HeaderValue,
    pub tls: bool,
    /// The task serving the request polls it again after every drain cut (see
    /// [`crate::service::Conn::watches_cuts`]).
    pub watches_cuts: bool,
    /// `--request-timeout`: the response headers must arrive by then (504 otherwise).
    pub deadline: Option<tokio::time::Instant>,
    /// The service's name, for the log line of a rejection.
    pub service: &'a str,
    /// What the proxy does to the cookies of the app's response (never to its own
    /// answers: an error page carries no writer cookie).
    pub cookies: ResponseCookies<'a>,
}

/// The proxy's changes to the `Set-Cookie` headers of an app's response.
#[derive(Clone, Copy, Debug, Default)]
pub struct ResponseCookies<'a> {
    /// `--writer-affinity-timeout`, on a write to a pool with readers (upstream §4.4).
    pub writer_affinity: Option<Duration>,
    /// `--scope-cookie-paths`: the stripped prefix the request matched (upstream §4.12).
    pub scope_paths: Option<&'a str>,
    /// `--session-affinity`: the pin of a target the client's cookie did not name yet
    /// (fork F17).
    pub session_pin: Option<cookies::SessionPin<'a>>,
}

impl ResponseCookies<'_> {
    /// `host` is the request's `Host` header.
    fn apply(&self, headers: &mut HeaderMap, host: Option<&HeaderValue>) {
        if let Some(prefix) = self.scope_paths {
            let host = host.and_then(|h| h.to_str().ok()).unwrap_or("");
            cookies::scope_cookie_paths(headers, prefix, host);
        }
        if let Some(timeout) = self.writer_affinity {
            cookies::set_writer_affinity(headers, timeout);
        }
        // After the app's own cookies are scoped: ours is for the whole site.
        if let Some(pin) = &self.session_pin {
            cookies::set_session_pin(headers, pin);
        }
    }
}

impl UpstreamRequest<'_> {
    /// Answers with `rejection` instead of the app (see [`Rejection::respond`]).
    fn reject(
        &self,
        rejection: Rejection,
        path: &str,
        method: &Method,
        exchange: Exchange,
    ) -> BoxedResponse {
        let at = Refused {
            service: self.service,
            path,
            method,
        };
        rejection.respond(&at, self.pages, exchange)
    }
}

impl Forwarder {
    /// `body_read_timeout`: how long a client may leave its request body silent
    /// (`None`: for ever).
    pub fn new(body_read_timeout: Option<Duration>) -> Self {
        Forwarder {
            keep_alive: Arc::default(),
            body_read_timeout,
            read_timeout: None,
        }
    }

    /// `read_timeout`: how long after its head a request's whole body may take to come
    /// (`run --read-timeout`; `None`: no limit).
    pub fn with_read_timeout(mut self, read_timeout: Option<Duration>) -> Self {
        self.read_timeout = read_timeout;
        self
    }

    /// Limits the reading of a client's request body as it is forwarded: cut off after
    /// `--body-read-timeout` of silence, or when it is still coming `--read-timeout` after
    /// the request `arrived`.
    pub fn limit_client_body(&self, body: &mut RequestBody, arrived: tokio::time::Instant) {
        body.limit_reading(
            self.body_read_timeout,
            self.read_timeout.map(|limit| arrived + limit),
        );
    }

    /// How a request to `target` may use the pool: an upgrade or `--target-disable-keep-alives`
    /// gets a connection of its own; otherwise an idle connection younger than both the
    /// service's `--target-idle-conn-timeout` and what the app announced.
    fn reuse_for(&self, pools: &Pools, target: &Target, upgrade: bool) -> Reuse {
        if upgrade {
            return Reuse::Upgrade;
        }
        let settings = pools.settings();
        if !settings.keep_alive {
            return Reuse::Fresh;
        }
        match self.keep_alive.limit(target.authority()) {
            Some(limit) if limit.is_zero() => Reuse::Fresh,
            Some(limit) => Reuse::Pooled(limit.min(settings.idle_timeout)),
            None => Reuse::Pooled(settings.idle_timeout),
        }
    }

    /// Sends `req`; when a reused connection died under it before it was answered and
    /// [`retry`]'s rule allows, sends it once more on a new connection. (Only a bodiless
    /// request can go again: the pool leaves such a request whole after a failure.)
    /// Not an `async fn`, for the size of its future (see `Pools::send`).
    #[allow(clippy::manual_async_fn)]
    fn send<'a>(
        &'a self,
        pools: &'a Pools,
        reuse: Reuse,
        req: &'a mut Request<RequestBody>,
        fields: &'a ProxyFields<'a>,
        answer_within: Option<Duration>,
        target: &'a Target,
    ) -> impl Future<Output = Result<BoxedResponse, SendError>> + Send + 'a {
        async move {
            let to = target.authority();
            let failed = match pools.send(req, to, fields, reuse, answer_within).await {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            let again = failed.can_resend() && retry::resend_allowed(&failed, req);
            let e: BoxError = failed.into();
            if !again {
                return Err(SendError {
                    error: e,
                    resent: false,
                });
            }
            tracing::info!(
                "target" = target.address(),
                path = %req.uri().path(),
                error = %describe(&e),
                "Resending request on a new connection"
            );
            pools
                .send(req, to, fields, Reuse::Fresh, answer_within)
                .await
                .map_err(|error| SendError {
                    error: error.into(),
                    resent: true,
                })
        }
    }

    /// Forwards `req` (its body limited by [`Self::limit_client_body`]); the returned
    /// response carries `exchange` in its body (or, for an upgrade, in the task that copies
    /// the upgraded connection). With `up.may_retry`, a failure that allows another
    /// attempt comes back as [`Retry`] instead, with nothing sent to the client and `req`
    /// as the client sent it. The request is borrowed where the attempts keep it, not
    /// moved into this future and back (see `Pools::send`); it is changed where it lies on
    /// its way out.
    ///
    /// Not an `async fn`, for the size of its future (see `Pools::send`).
    #[allow(clippy::manual_async_fn)]
    pub fn forward<'a>(
        &'a self,
        req: &'a mut Request<RequestBody>,
        up: UpstreamRequest<'a>,
        exchange: Exchange,
    ) -> impl Future<Output = Result<BoxedResponse, Box<Retry>>> + Send + 'a {
        async move {
            let opts = up.options;
            // One pass over the request's names tells which of the fields looked at below
            // it carries (usually `Host` alone), and finds its `Host`.
            let (present, client_host) = Present::with_host(req.headers());
            let client_host = client_host.cloned();
            let upgrade = headers::upgrade_type(req.headers(), present);
            let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut *req));

            // The request is changed where it lies, not taken apart and put together again:
            // each of those was a copy of its 328 bytes.
            let head_request = req.method() == http::Method::HEAD;
            // Kept for a rejection's rendering (a copy only for a non-standard method).
            let method = req.method().clone();
            // The request as the client sent it, for another attempt (fork F18): kept only
            // when one may come and the request qualifies.
            let again = (up.may_retry
                && retry::may_try_elsewhere(
                    &method,
                    req.body().is_end_stream(),
                    upgrade.is_some(),
                ))
            .then(|| Replay::of(req.method(), req.uri(), req.headers()));
            if opts.buffer_requests && upgrade.is_none() {
                let incoming = std::mem::replace(req.body_mut(), RequestBody::empty());
                let buffered = match up.deadline {
                    Some(d) => tokio::time::timeout_at(d, buffer_request(incoming, opts))
                        .await
                        .unwrap_or(Err(Rejection::DeadlineExceeded)),
                    None => buffer_request(incoming, opts).await,
                };
                match buffered {
                    Ok(b) => *req.body_mut() = b,
                    Err(rejection) => {
                        return Ok(up.reject(rejection, req.uri().path(), &method, exchange));
                    }
                }
            }

            // Without a `Host` field (HTTP/1.0, or HTTP/2's `:authority`), the URI's names it.
            let host_from_uri = match client_host {
                Some(_) => None,
                None => req
                    .uri()
                    .authority()
                    .and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
            };
            let original_host = client_host.or_else(|| host_from_uri.clone());
            // `TE` goes with the other hop-by-hop fields, except its `trailers`.
            let hop_by_hop = headers::remove_hop_by_hop(req.headers_mut(), present);
            // Fields that `Connection` named have gone.
            let present = if hop_by_hop.named_others {
                Present::of(req.headers())
            } else {
                present
            };
            if hop_by_hop.trailers {
                req.headers_mut()
                    .insert(header::TE, HeaderValue::from_static("trailers"));
            }
            // Set where the request leaves (see `proxy_fields`), not in the map here.
            let fields = ProxyFields::new(
                req.headers(),
                present,
                &ForwardedFor {
                    client_ip: up.client_ip,
                    host: original_host.as_ref(),
                    tls: up.tls,
                    trust_client: opts.forward_headers,
                    arrival: exchange.arrival_fields(),
                },
                up.target.header_value(),
            );
            // Kept (a reference count, not a copy) only when the response's cookies need it.
            let cookie_host = up.cookies.scope_paths.and(original_host.as_ref()).cloned();
            // The client's `Host` stays where it is, unless `Connection` named it (Go's proxy
            // keeps the host apart from the fields: naming it removes nothing). A request
            // that named no host at all gets the target's, as Go's transport sends it.
            let host_to_set = match &original_host {
                None => HeaderValue::from_str(host_field(up.target.authority())).ok(),
                Some(host) if hop_by_hop.named_others => Some(host.clone()),
                Some(_) => host_from_uri,
            };
            if let Some(h) = host_to_set {
                req.headers_mut().insert(header::HOST, h);
            }
            if let Some(kind) = &upgrade {
                req.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                req.headers_mut().insert(header::UPGRADE, kind.clone());
            }
            // The path alone, as HTTP/1 sends it: the pool is told the target's address
            // apart (taking a copy of the target's shared `Authority` into the URI wrote its
            // reference count, which every worker writes, twice a request).
            let mut uri = Uri::from(up.path_and_query.clone());
            std::mem::swap(req.uri_mut(), &mut uri);
            *req.version_mut() = Version::HTTP_11;
            let reuse = self.reuse_for(up.pools, up.target, upgrade.is_some());
            if !up.pools.settings().keep_alive && upgrade.is_none() {
                // `--target-disable-keep-alives`: say so, as Go's transport does.
                req.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            // `--target-timeout` (or `--path-timeout`) bounds the wait for response headers
            // once the request is sent (Go's `ResponseHeaderTimeout`), so a slow upload or
            // a wait for a connection at `--target-max-conns` is not cut short: the pool
            // times it, from the moment the request is written.
            let sent = self.send(
                up.pools,
                reuse,
                req,
                &fields,
                up.response_timeout,
                up.target,
            );
            let result = {
                let cancelled = async {
                    match exchange.target.as_ref() {
                        // Our HTTP/1 connection's task polls this again after a drain's
                        // word (`crate::broadcast`): a look at the target's is enough.
                        Some(g) if up.watches_cuts => g.cancelled_when_polled().await,
                        Some(g) => g.cancelled().await,
                        None => std::future::pending().await,
                    }
                };
                // `--request-timeout`: the whole request's deadline, uploads included.
                let deadline = async {
                    match up.deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                };
                // `biased`: the answer is looked at first. Polling the drain's cut takes its
                // waiters' lock each time (for a request served by hyper's connections), so
                // the poll that brings the answer should not start there (an unbiased
                // `select!` starts at a random branch).
                tokio::select! {
                    biased;
                    r = sent => Some(Ok(r)),
                    _ = deadline => Some(Err(Rejection::DeadlineExceeded)),
                    _ = cancelled => None,
                }
            };
            let mut response = match result {
                None => {
                    // Release the target now: the 504 page itself must not be cut by the drain.
                    let mut exchange = exchange;
                    exchange.target = None;
                    return match again {
                        Some(again) => Err(Retry::new(req, again, exchange, Rejection::Drained)),
                        None => Ok(up.reject(Rejection::Drained, uri.path(), &method, exchange)),
                    };
                }
                Some(Err(fired)) => return Ok(up.reject(fired, uri.path(), &method, exchange)),
                Some(Ok(Err(SendError { error: e, .. })))
                    if pool::caused_by::<pool::AnswerTimedOut>(e.as_ref()) =>
                {
                    return Ok(up.reject(Rejection::TargetTimeout, uri.path(), &method, exchange));
                }
                Some(Ok(Err(SendError { error: e, .. }))) if client_body_failed(&e) => {
                    // The client's own body could not be read (malformed chunking) or did not
                    // come: its fault.
                    let bad = if body_timed_out(e.as_ref()) {
                        Rejection::BodyReadTimeout
                    } else {
                        Rejection::BadRequestBody {
                            detail: describe(&e),
                        }
                    };
                    return Ok(up.reject(bad, uri.path(), &method, exchange));
                }
                Some(Ok(Err(SendError { error: e, resent }))) => {
                    let connect = pool::connect_failure(e.as_ref());
                    let failure = match connect {
                        Some(ConnectFailure::TimedOut(limit)) => Rejection::DialTimedOut {
                            target: up.target.shared_address(),
                            limit,
                        },
                        _ => Rejection::TargetFailed {
                            target: up.target.shared_address(),
                            detail: describe(&e),
                            resent,
                        },
                    };
                    // Only a connection that could not be made proves the target did not act.
                    return match again.filter(|_| connect == Some(ConnectFailure::Failed)) {
                        Some(again) => Err(Retry::new(req, again, exchange, failure)),
                        None => Ok(up.reject(failure, uri.path(), &method, exchange)),
                    };
                }
                Some(Ok(Ok(r))) => r,
            };
            let answered = Present::of(response.headers());
            if answered.has(Field::KeepAlive)
                && let Some((timeout, limit)) = self
                    .keep_alive
                    .learn(up.target.authority(), response.headers())
            {
                tracing::info!(
                    "target" = up.target.address(),
                    keep_alive_timeout = ?timeout,
                    pool_idle_timeout = ?limit.min(up.pools.settings().idle_timeout),
                    "Target announced its keep-alive timeout"
                );
            }
            // Answer in our own version: hyper writes the response's version on the status
            // line, so an HTTP/1.0 app would otherwise downgrade HTTP/1.1 clients.
            *response.version_mut() = Version::HTTP_11;

            if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                // The app may only switch to the protocol the client asked for.
                let switched_to = response.headers().get(header::UPGRADE);
                let agreed = upgrade
                    .as_ref()
                    .zip(switched_to)
                    .is_some_and(|(asked, got)| {
                        asked.as_bytes().eq_ignore_ascii_case(got.as_bytes())
                    });
                return Ok(match client_upgrade.filter(|_| agreed) {
                    Some(client_upgrade) => splice_upgrade(response, client_upgrade, exchange),
                    None => {
                        let failed = Rejection::TargetFailed {
                            target: up.target.shared_address(),
                            detail: "backend switched to a protocol that was not requested".into(),
                            resent: false,
                        };
                        up.reject(failed, uri.path(), &method, exchange)
                    }
                });
            }
            headers::remove_hop_by_hop(response.headers_mut(), answered);
            up.cookies
                .apply(response.headers_mut(), cookie_host.as_ref());

            if opts.buffer_responses && !is_event_stream(response.headers()) {
                let (mut parts, incoming) = (*response).into_parts();
                let buffered = match up.deadline {
                    Some(d) => {
                        match tokio::time::timeout_at(d, buffer_response(incoming, opts)).await {
                            Ok(b) => b,
                            Err(_) => {
                                let late = Rejection::DeadlineExceeded;
                                return Ok(up.reject(late, uri.path(), &method, exchange));
                            }
                        }
                    }
                    None => buffer_response(incoming, opts).await,
                };
                return Ok(match buffered {
                    Ok(body) => {
                        // A HEAD, 204 or 304 answer has no body to measure: its length, if
                        // any, stays the app's.
                        let bodiless = head_request
                            || matches!(
                                parts.status,
                                StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED
                            );
                        if !(bodiless && body.is_empty()) {
                            parts
                                .headers
                                .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
                        }
                        finish(
                            Box::new(Response::from_parts(parts, ResponseBody::buffered(body))),
                            exchange,
                        )
                    }
                    Err(e) => {
                        let rejection = match e {
                            ResponseBufferError::Buffer(BufferError::TooLarge) => {
                                Rejection::ResponseTooLarge
                            }
                            ResponseBufferError::Buffer(BufferError::Io(e)) => {
                                Rejection::BufferFailed {
                                    detail: e.to_string(),
                                }
                            }
                            ResponseBufferError::Upstream(e) => Rejection::TargetFailed {
                                target: up.target.shared_address(),
                                detail: e.to_string(),
                                resent: false,
                            },
                        };
                        up.reject(rejection, uri.path(), &method, exchange)
                    }
                });
            }
            // The deadline keeps running over the body, unless it is an event stream.
            if let Some(d) = up.deadline.filter(|_| !is_event_stream(response.headers())) {
                response.body_mut().cut_at(d);
            }
            Ok(finish(response, exchange))
        }
    }
}

/// An attempt that failed in a way that allows another (see [`retry::may_try_elsewhere`]):
/// nothing was sent to the client, and the request is as the client sent it again.
pub struct Retry {
    /// The request's exchange, released from the target that failed.
    pub exchange: Exchange,
    /// What the client gets when there is no next attempt.
    pub failure: Rejection,
}

impl Retry {
    /// `req` becomes the request again, as the client sent it, for the next attempt.
    fn new(
        req: &mut Request<RequestBody>,
        again: Replay,
        mut exchange: Exchange,
        failure: Rejection,
    ) -> Box<Retry> {
        *req = again.into_request(RequestBody::empty());
        exchange.target = None;
        Box::new(Retry { exchange, failure })
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

struct SendError {
    error: BoxError,
    /// It was the second attempt.
    resent: bool,
}

fn is_event_stream(h: &http::HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// Whether sending failed because reading the request body from the client failed (hyper
/// reports errors of the body we hand it as "user" errors).
fn client_body_failed(e: &BoxError) -> bool {
    let mut source = e.source();
    while let Some(s) = source {
        if s.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_user)
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// Whether the client's body failed because it went silent (`--body-read-timeout`).
fn body_timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    pool::caused_by::<BodyReadTimeout>(e)
}

fn describe(e: &BoxError) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

async fn buffer_request(
    mut body: RequestBody,
    opts: &TargetOptions,
) -> Result<RequestBody, Rejection> {
    let mut buf = SpillBuffer::new(opts.max_memory_buffer_size, opts.max_request_body_size);
    while let Some(frame) = body.frame().await {
        // A body that cannot be read is the client's fault (malformed chunking, early
        // close, silence): upstream answers 400 too.
        let frame = frame.map_err(|e| {
            if body_timed_out(e.as_ref()) {
                Rejection::BodyReadTimeout
            } else {
                Rejection::BadRequestBody {
                    detail: e.to_string(),
                }
            }
        })?;
        if let Ok(data) = frame.into_data() {
            buf.write(data).await.map_err(|e| match e {
                BufferError::TooLarge => Rejection::RequestTooLarge,
                BufferError::Io(e) => Rejection::BufferFailed {
                    detail: e.to_string(),
                },
            })?;
        }
    }
    if buf.is_empty() {
        return Ok(RequestBody::empty());
    }
    buf.into_body()
        .await
        .map(RequestBody::buffered)
        .map_err(|e| Rejection::BufferFailed {
            detail: format!("{e:?}"),
        })
}

enum ResponseBufferError {
    /// The app's body could not be read: its fault (502).
    Upstream(BoxError),
    /// Over the limit, or the spill file failed: ours (500).
    Buffer(BufferError),
}

async fn buffer_response(
    mut body: ResponseBody,
    opts: &TargetOptions,
) -> Result<super::buffer::BufferedBody, ResponseBufferError> {
    let mut buf = SpillBuffer::new(opts.max_memory_buffer_size, opts.max_response_body_size);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ResponseBufferError::Upstream)?;
        if let Ok(data) = frame.into_data() {
            buf.write(data).await.map_err(ResponseBufferError::Buffer)?;
        }
    }
    buf.into_body().await.map_err(ResponseBufferError::Buffer)
}

/// A `Host` value for `target`: without the port when it is HTTP's default (as Go's
/// transport writes it).
fn host_field(target: &Authority) -> &str {
    match target.port_u16() {
        Some(80) => target.host(),
        _ => target.as_str(),
    }
}

/// Relays a 101: the client gets the upstream's headers, then bytes flow both ways until
/// either side closes or a drain starts. The exchange (and so the in-flight counts that
/// keep a service awake) lives as long as the connection.
fn splice_upgrade(
    mut upstream: BoxedResponse,
    client: hyper::upgrade::OnUpgrade,
    mut exchange: Exchange,
) -> BoxedResponse {
    let upstream_upgrade = hyper::upgrade::on(&mut *upstream);
    // The client gets the head alone: what follows it is the upgraded connection's.
    *upstream.body_mut() = ResponseBody::empty();
    exchange.set_response(101, upstream.headers());
    tokio::spawn(async move {
        let (client, upstream) = match tokio::try_join!(client, upstream_upgrade) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(error = %e, "Upgrade failed");
                exchange.finish(0);
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        let copied = async { tokio::io::copy_bidirectional(&mut client, &mut upstream).await };
        let cut = async {
            match exchange.target.as_ref() {
                Some(g) => g.upgrade_cancelled().await,
                None => std::future::pending().await,
            }
        };
        let sent = tokio::select! {
            r = copied => r.map(|(_, to_client)| to_client).unwrap_or(0),
            _ = cut => 0,
        };
        exchange.finish(sent);
    });
    upstream
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_field_leaves_out_the_default_port() {
        let a: Authority = "web:80".parse().unwrap();
        assert_eq!(host_field(&a), "web");
        let a: Authority = "127.0.0.1:3000".parse().unwrap();
        assert_eq!(host_field(&a), "127.0.0.1:3000");
        let a: Authority = "[::1]:8080".parse().unwrap();
        assert_eq!(host_field(&a), "[::1]:8080");
    }
}
