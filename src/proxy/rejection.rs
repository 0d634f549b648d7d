//! Every answer the proxy gives itself instead of the app's, and the one place that
//! renders it.
//!
//! A pipeline step that refuses a request returns a [`Rejection`]; [`Rejection::respond`]
//! writes its log line, renders it (with the service's error pages) and finishes the
//! exchange. Each variant knows its status, what the log says about it and what the
//! client may read: never internal detail (container names, socket paths, daemon
//! output), which goes to the log only.

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode, header};
use std::sync::Arc;
use std::time::Duration;

use super::body::finish;
use super::body::{BoxedResponse, ResponseBody};
use super::exchange::Exchange;
use super::pages::{ErrorPages, error_response, html_escape};

/// Why the proxy answered a request itself.
#[derive(Debug)]
pub enum Rejection {
    /// `/.kamal-proxy/ping`: `OK` to `GET`/`HEAD`, 405 to any other method (as the fork).
    /// Never logged, never routed.
    Ping { method_allowed: bool },
    /// An HTTP-01 challenge token pending for this host: its key authorization (200).
    ChallengeAnswered { key_authorization: String },
    /// A challenge path for a host the ACME service does not list (403, autocert's text).
    ChallengeHostNotAllowed { host: String },
    /// A challenge path with no pending token, for an ACME service (404, autocert's text).
    ChallengeUnknownToken,
    /// `--metrics-allow-ip` does not admit the connecting address (403, Go's
    /// `http.Error` text, on the metrics listener).
    MetricsForbidden,
    /// No service for the host and path (404, the built-in page: no service to ask).
    NotFound,
    /// `--allow-ip` does not admit the client (403).
    Forbidden,
    /// An HTTPS request to a service deployed without TLS (503).
    TlsNotEnabled,
    /// TLS, canonical-host or `--redirect` rules send the client elsewhere.
    Redirect {
        status: StatusCode,
        location: String,
    },
    /// `--rate-limit` budget spent (429, `Retry-After`).
    RateLimited { retry_after_secs: u64 },
    /// `--basic-auth` credentials missing or wrong (401, a challenge).
    Unauthorized,
    /// A health check answered for the app while it is paused or asleep: 200 when it
    /// would be healthy, 503 after a failed wake. Never held, never waking.
    HealthCheckAnswered { healthy: bool },
    /// `kamal-proxy stop`: 503 with the operator's message, if any.
    Stopped { message: String },
    /// A paused request was held past the pause timeout (504).
    PauseExpired,
    /// `--request-timeout` passed (504).
    DeadlineExceeded,
    /// The service did not wake (503, `Retry-After` when a retry is worth it). `detail`
    /// is for the log only.
    WakeFailed {
        detail: String,
        retry_after: Option<Duration>,
    },
    /// `--wake-page`: a browser navigation still held by a wake after the grace period gets
    /// a self-refreshing waiting page (503, `Retry-After`, never cached); the wake goes on.
    WakePage { service: Arc<str> },
    /// Every target is unhealthy or draining (503).
    NoHealthyTarget,
    /// `--target-timeout` passed before the target's response headers (504).
    TargetTimeout,
    /// The target was drained away while the request waited for it (504).
    Drained,
    /// `--target-dial-timeout` passed while connecting to the target (504, as Go's
    /// transport reports a dial timeout).
    DialTimedOut { target: Arc<str>, limit: Duration },
    /// The target could not be reached or broke the exchange (502). `detail` is for the
    /// log only.
    TargetFailed {
        target: Arc<str>,
        detail: String,
        /// It failed on the second attempt, after a re-send on a new connection.
        resent: bool,
    },
    /// The client's own body could not be read, e.g. malformed chunking (400).
    BadRequestBody { detail: String },
    /// The request has no single meaning: a duplicate or missing `Host`, or a `host`
    /// that contradicts HTTP/2's `:authority` (400, connection closed).
    BadRequest { reason: &'static str },
    /// The client sent no byte of its body for `--body-read-timeout`, or not all of it
    /// within `--read-timeout` (408, connection closed, as nginx's `client_body_timeout`).
    BodyReadTimeout,
    /// A buffered request body over `--max-request-body` (413).
    RequestTooLarge,
    /// A buffered response over `--max-response-body` (500, as upstream).
    ResponseTooLarge,
    /// Buffering to memory or disk failed (500). `detail` is for the log only.
    BufferFailed { detail: String },
}

impl Rejection {
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Ping {
                method_allowed: true,
            }
            | Rejection::ChallengeAnswered { .. } => StatusCode::OK,
            Rejection::Ping {
                method_allowed: false,
            } => StatusCode::METHOD_NOT_ALLOWED,
            Rejection::NotFound | Rejection::ChallengeUnknownToken => StatusCode::NOT_FOUND,
            Rejection::Forbidden
            | Rejection::ChallengeHostNotAllowed { .. }
            | Rejection::MetricsForbidden => StatusCode::FORBIDDEN,
            Rejection::Redirect { status, .. } => *status,
            Rejection::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Rejection::Unauthorized => StatusCode::UNAUTHORIZED,
            Rejection::HealthCheckAnswered { healthy: true } => StatusCode::OK,
            Rejection::TlsNotEnabled
            | Rejection::HealthCheckAnswered { healthy: false }
            | Rejection::Stopped { .. }
            | Rejection::WakeFailed { .. }
            | Rejection::WakePage { .. }
            | Rejection::NoHealthyTarget => StatusCode::SERVICE_UNAVAILABLE,
            Rejection::PauseExpired
            | Rejection::DeadlineExceeded
            | Rejection::TargetTimeout
            | Rejection::Drained
            | Rejection::DialTimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
            Rejection::TargetFailed { .. } => StatusCode::BAD_GATEWAY,
            Rejection::BadRequestBody { .. } | Rejection::BadRequest { .. } => {
                StatusCode::BAD_REQUEST
            }
            Rejection::BodyReadTimeout => StatusCode::REQUEST_TIMEOUT,
            Rejection::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Rejection::ResponseTooLarge | Rejection::BufferFailed { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The log line this answer deserves, if any (the gates log their own, throttled).
    fn log(&self, service: &str, path: &str) {
        match self {
            Rejection::PauseExpired => {
                tracing::warn!(service, path, "Rejecting request due to expired pause")
            }
            Rejection::DeadlineExceeded => {
                tracing::info!(service, path, "Request deadline exceeded")
            }
            Rejection::TargetTimeout => {
                tracing::info!(service, path, "Target timed out before responding")
            }
            Rejection::WakeFailed { detail, .. } => {
                tracing::warn!(service, path, error = %detail, "Rejecting request: service did not wake")
            }
            Rejection::Drained => {
                tracing::info!(service, path, "Request cancelled due to draining")
            }
            Rejection::DialTimedOut { target, limit } => {
                let limit = crate::gotime::format_duration(
                    i64::try_from(limit.as_nanos()).unwrap_or(i64::MAX),
                );
                tracing::warn!(service, "target" = %target, path, dial_timeout = %limit, "Timed out connecting to target")
            }
            Rejection::WakePage { .. } => {
                tracing::info!(
                    service,
                    path,
                    "Answered a held navigation with the wake page"
                )
            }
            Rejection::TargetFailed {
                target,
                detail,
                resent,
            } => {
                tracing::error!(service, "target" = %target, path, error = %detail, resent, "Error while proxying")
            }
            Rejection::BadRequestBody { detail } => {
                tracing::info!(service, path, error = %detail, "Malformed request")
            }
            Rejection::BadRequest { reason } => {
                tracing::info!(service, path, error = reason, "Malformed request")
            }
            Rejection::BodyReadTimeout => {
                tracing::info!(service, path, "Request body read timed out")
            }
            Rejection::ResponseTooLarge => {
                tracing::info!(service, path, "Response exceeded max response limit")
            }
            Rejection::BufferFailed { detail } => {
                tracing::error!(service, path, error = %detail, "Error buffering response")
            }
            _ => {}
        }
    }

    /// The response the client gets. Called alone only for answers that are never
    /// access-logged (the ping, HTTP-01 answers, the metrics listener); everything else goes through
    /// [`Rejection::respond`].
    pub fn render(
        self,
        pages: Option<&Arc<ErrorPages>>,
        method: &Method,
    ) -> Response<ResponseBody> {
        let status = self.status();
        match self {
            Rejection::Ping { method_allowed } => {
                let body: &'static [u8] = if method_allowed {
                    b"OK\n"
                } else {
                    b"Method Not Allowed\n"
                };
                let mut r = plain_text(status, Bytes::from_static(body));
                let h = r.headers_mut();
                if !method_allowed {
                    h.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
                }
                h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                r
            }
            // autocert's answers, word for word.
            Rejection::ChallengeAnswered { key_authorization } => {
                plain_text(status, Bytes::from(key_authorization))
            }
            Rejection::ChallengeHostNotAllowed { host } => plain_text(
                status,
                Bytes::from(format!(
                    "acme/autocert: host {host:?} not configured in HostWhitelist\n"
                )),
            ),
            Rejection::ChallengeUnknownToken => plain_text(
                status,
                Bytes::from_static(b"acme/autocert: certificate cache miss\n"),
            ),
            Rejection::MetricsForbidden => {
                let mut r = plain_text(status, Bytes::from_static(b"Forbidden\n"));
                r.headers_mut().insert(
                    header::X_CONTENT_TYPE_OPTIONS,
                    HeaderValue::from_static("nosniff"),
                );
                r
            }
            Rejection::HealthCheckAnswered { healthy: true } => {
                let mut r = Response::new(ResponseBody::empty());
                *r.status_mut() = status;
                r
            }
            Rejection::NotFound => error_response(status, None, None),
            // Nothing more on this connection can be trusted to mean what it says (or to
            // come at all): close it after the answer.
            Rejection::BadRequest { .. } | Rejection::BodyReadTimeout => {
                let mut r = error_response(status, pages, None);
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                r
            }
            Rejection::Redirect { location, .. } => redirect(method, status, &location),
            Rejection::Stopped { message } => {
                let message = (!message.is_empty()).then_some(message.as_str());
                error_response(status, pages, message)
            }
            Rejection::RateLimited { retry_after_secs } => {
                let mut r = error_response(status, pages, None);
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
                r
            }
            Rejection::Unauthorized => {
                let mut r = error_response(status, pages, None);
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(BASIC_AUTH_CHALLENGE),
                );
                r
            }
            Rejection::WakeFailed { retry_after, .. } => {
                let mut r = error_response(status, pages, None);
                if let Some(retry) = retry_after {
                    let secs = retry.as_secs_f64().ceil().max(1.0) as u64;
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
                }
                r
            }
            Rejection::WakePage { service } => wake_page(&service, pages),
            _ => error_response(status, pages, None),
        }
    }

    /// Logs, renders and finishes the exchange: the one way a rejection reaches a client.
    pub fn respond(
        self,
        at: &Refused<'_>,
        pages: Option<&Arc<ErrorPages>>,
        exchange: Exchange,
    ) -> BoxedResponse {
        self.log(at.service, at.path);
        finish(Box::new(self.render(pages, at.method)), exchange)
    }
}

/// A `text/plain` answer, as Go's `http.Error` and autocert write them (no error page).
fn plain_text(status: StatusCode, body: Bytes) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// How often the waiting page reloads itself, and what its `Retry-After` says.
const WAKE_PAGE_REFRESH_SECS: u64 = 2;

/// 503 rather than 200: the page is not the resource, so a crawler must not index it, a
/// cache must not keep it and a monitor must not count it as up; browsers render it and
/// follow its refresh all the same. `Refresh` (header and meta) reloads a custom
/// `wake.html` too, and each reload is an ordinary request: held again, never a second
/// wake (one wake at a time per service).
fn wake_page(service: &str, pages: Option<&Arc<ErrorPages>>) -> Response<ResponseBody> {
    let body =
        super::pages::wake_page_body(service, pages.map(|p| p.as_ref()), WAKE_PAGE_REFRESH_SECS);
    let mut r = Response::new(ResponseBody::full(Bytes::from(body)));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::RETRY_AFTER,
        HeaderValue::from(WAKE_PAGE_REFRESH_SECS),
    );
    h.insert(header::REFRESH, HeaderValue::from(WAKE_PAGE_REFRESH_SECS));
    r
}

/// Where a rejection happened, for its log line and its rendering.
pub struct Refused<'a> {
    pub service: &'a str,
    pub path: &'a str,
    pub method: &'a Method,
}

/// The `WWW-Authenticate` challenge of `--basic-auth`.
pub const BASIC_AUTH_CHALLENGE: &str = "Basic realm=\"Restricted\", charset=\"UTF-8\"";

/// The redirect response, as Go's `http.Redirect` writes it.
fn redirect(method: &Method, status: StatusCode, location: &str) -> Response<ResponseBody> {
    let body = if method == Method::GET {
        format!(
            "<a href=\"{}\">{}</a>.\n\n",
            html_escape(location),
            status.canonical_reason().unwrap_or("")
        )
    } else {
        String::new()
    };
    let mut r = Response::new(ResponseBody::full(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    if method == Method::GET || method == Method::HEAD {
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
    }
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_headers() {
        let get = Method::GET;
        let r = Rejection::RateLimited {
            retry_after_secs: 3,
        }
        .render(None, &get);
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");

        let r = Rejection::WakeFailed {
            detail: "container web-1: no such container".into(),
            retry_after: Some(Duration::from_millis(1500)),
        }
        .render(None, &get);
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");

        let r = Rejection::Unauthorized.render(None, &get);
        assert_eq!(r.status(), 401);
        assert!(r.headers().contains_key(header::WWW_AUTHENTICATE));

        let r = Rejection::Redirect {
            status: StatusCode::PERMANENT_REDIRECT,
            location: "https://a.test/x".into(),
        }
        .render(None, &Method::POST);
        assert_eq!(r.status(), 308);
        assert_eq!(r.headers()[header::LOCATION], "https://a.test/x");

        let r = Rejection::WakePage {
            service: Arc::from("app-web"),
        }
        .render(None, &get);
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert_eq!(r.headers()[header::REFRESH], "2");
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-store");

        assert_eq!(Rejection::TargetTimeout.status(), 504);
        assert_eq!(Rejection::DeadlineExceeded.status(), 504);
        assert_eq!(
            Rejection::HealthCheckAnswered { healthy: true }
                .render(None, &get)
                .status(),
            200
        );
    }

    async fn text(r: Response<ResponseBody>) -> String {
        use http_body_util::BodyExt;
        let body = r.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(body.to_vec()).unwrap()
    }

    /// The plain-text answers given without an error page, word for word.
    #[tokio::test]
    async fn plain_text_answers() {
        let get = Method::GET;
        let plain = "text/plain; charset=utf-8";

        let r = Rejection::Ping {
            method_allowed: true,
        }
        .render(None, &get);
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-store");
        assert_eq!(r.headers()[header::CONTENT_TYPE], plain);
        assert!(!r.headers().contains_key(header::ALLOW));
        assert_eq!(text(r).await, "OK\n");

        let r = Rejection::Ping {
            method_allowed: false,
        }
        .render(None, &Method::POST);
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()[header::ALLOW], "GET, HEAD");
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-store");
        assert_eq!(r.headers()[header::CONTENT_TYPE], plain);
        assert_eq!(text(r).await, "Method Not Allowed\n");

        let r = Rejection::ChallengeAnswered {
            key_authorization: "token.thumbprint".into(),
        }
        .render(None, &get);
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[header::CONTENT_TYPE], plain);
        assert_eq!(text(r).await, "token.thumbprint");

        let r = Rejection::ChallengeHostNotAllowed {
            host: "other.test".into(),
        }
        .render(None, &get);
        assert_eq!(r.status(), 403);
        assert_eq!(
            text(r).await,
            "acme/autocert: host \"other.test\" not configured in HostWhitelist\n"
        );

        let r = Rejection::ChallengeUnknownToken.render(None, &get);
        assert_eq!(r.status(), 404);
        assert_eq!(r.headers()[header::CONTENT_TYPE], plain);
        assert_eq!(text(r).await, "acme/autocert: certificate cache miss\n");

        let r = Rejection::MetricsForbidden.render(None, &get);
        assert_eq!(r.status(), 403);
        assert_eq!(r.headers()[header::CONTENT_TYPE], plain);
        assert_eq!(r.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(text(r).await, "Forbidden\n");
    }
}
