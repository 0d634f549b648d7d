//! Listeners and the outermost request steps (ARCHITECTURE.md steps 1–4): liveness ping,
//! request id and start stamp, the access log, and routing to a service.

use http::{HeaderValue, Request};
use hyper_util::rt::TokioTimer;
use std::net::SocketAddr;

use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

mod acme_http01;
mod alarms;
pub mod certificates;
mod chunk_guard;
mod framing;
mod glance;
pub mod h1;
mod h1_timeouts;
#[cfg(feature = "http3")]
pub mod h3;
pub mod handover;
pub mod https;
mod idle;
pub mod limits;
pub mod metrics_listener;
pub mod proxy_protocol;
pub mod shutdown;
pub mod trim;
pub mod workers;
mod write_deadline;

pub use shutdown::{DEFAULT_SHUTDOWN_TIMEOUT, Drain, FirstRequest, Heard, Shutdown};

use crate::observe::access::{AccessRecord, header_values};
use crate::proxy::Forwarder;
use crate::proxy::body::{BoxedResponse, RequestBody};
use crate::proxy::exchange::Exchange;
use crate::proxy::headers::{X_FORWARDED_FOR, X_REQUEST_ID, X_REQUEST_START};
use crate::proxy::rejection::{Refused, Rejection};
use crate::recycle::Recycled;
use crate::router::Router;
use crate::service::Conn;
use crate::uri::host_without_port;
use glance::Glance;

use limits::{ConnectionSlots, Limits};
use proxy_protocol::ProxyProtocol;

pub const PING_PATH: &str = "/.kamal-proxy/ping";

/// Everything the request path needs, shared by every connection.
pub struct Proxy {
    pub router: Arc<Router>,
    pub forwarder: Forwarder,
    pub http_port: u16,
    pub https_port: u16,
    pub limits: Limits,
    /// `--max-connections`, shared by the HTTP and HTTPS listeners.
    pub slots: ConnectionSlots,
    /// `--proxy-protocol` on the HTTP and HTTPS listeners; `None`: off, and a connection
    /// pays nothing for it.
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// Binds like Go's `net.Listen("tcp", ":port")`, with Go's error wording. `reuse_port`
/// (`run --reuse-port`, fork F28) lets two proxy generations hold the port at once.
pub async fn bind(port: u16, reuse_port: bool) -> Result<TcpListener, String> {
    let addr = SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 0], port));
    let socket = tokio::net::TcpSocket::new_v6().map_err(|e| format!("listen tcp :{port}: {e}"))?;
    // Accept IPv4 too (dual stack), and allow quick restarts.
    let _ = socket.set_reuseaddr(true);
    if reuse_port {
        socket
            .set_reuseport(true)
            .map_err(|e| format!("listen tcp :{port}: SO_REUSEPORT: {e}"))?;
    }
    let bound = set_dual_stack(&socket)
        .and_then(|()| socket.bind(addr))
        .and_then(|()| socket.listen(1024));
    match bound {
        Ok(l) => Ok(l),
        Err(e) => {
            // Hosts without IPv6: fall back to IPv4 only.
            let v4 = SocketAddr::from(([0, 0, 0, 0], port));
            if e.kind() == std::io::ErrorKind::AddrInUse {
                return Err(format!("listen tcp :{port}: bind: address already in use"));
            }
            let socket =
                tokio::net::TcpSocket::new_v4().map_err(|e| format!("listen tcp :{port}: {e}"))?;
            let _ = socket.set_reuseaddr(true);
            if reuse_port {
                let _ = socket.set_reuseport(true);
            }
            socket
                .bind(v4)
                .and_then(|()| socket.listen(1024))
                .map_err(|e| format!("listen tcp :{port}: bind: {}", io_text(&e)))
        }
    }
}

fn set_dual_stack(socket: &tokio::net::TcpSocket) -> std::io::Result<()> {
    set_int_option(socket, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)
}

/// Lets the kernel hand a connection to `accept` only once its first bytes have arrived
/// (`TCP_DEFER_ACCEPT`), on a listener whose clients always speak first (a TLS client's
/// ClientHello, a PROXY header): accepting it and reading its first bytes then take one
/// wake-up instead of two. A client that connects and sends nothing is still accepted
/// after `secs` or so (the kernel's next SYN-ACK retransmission answered), and the
/// handshake timeout runs from there. nginx offers the same as `listen ... deferred`.
pub fn defer_accept(listener: &TcpListener, secs: u32) -> std::io::Result<()> {
    let secs = libc::c_int::try_from(secs).unwrap_or(libc::c_int::MAX);
    set_int_option(listener, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, secs)
}

fn set_int_option(
    socket: &impl std::os::fd::AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> std::io::Result<()> {
    // SAFETY: a valid socket fd and a correctly sized c_int option value.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => "address already in use".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Serves plain HTTP/1.x (upstream's HTTP port speaks no h2c) on every worker until the
/// shutdown begins, then lets in-flight requests finish within its grace period.
pub async fn serve_http(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: Arc<Shutdown>,
    workers: workers::Workers,
) {
    let slots = proxy.slots.clone();
    let settings = h1::Settings::new(&proxy.limits);
    workers
        .accept(
            listener,
            slots,
            shutdown,
            move |stream, client, draining| {
                serve_connection(stream, client, proxy.clone(), settings.clone(), draining)
            },
        )
        .await
}

/// HTTP/1.x as every listener serves it: request heads up to `--max-request-header-size`
/// (431 past it). hyper's own header timer is off: [`h1_timeouts`] keeps Go's timeouts.
pub(crate) fn http1_builder(limits: &Limits) -> hyper::server::conn::http1::Builder {
    // hyper's read buffer stops growing at ~400 KiB and answers 431 there too: a larger
    // head limit needs a larger buffer.
    const HYPER_DEFAULT_MAX_BUF: usize = 8192 + 4096 * 100;
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_header_size(limits.max_header_bytes);
    if limits.max_header_bytes >= HYPER_DEFAULT_MAX_BUF {
        builder.max_buf_size(limits.max_header_bytes + 1);
    }
    builder
}

/// Accept failures (a full descriptor table, mostly): a growing pause between attempts,
/// and a log line at most once a second counting the failures since the last one.
pub(crate) struct AcceptBackoff {
    pause: Duration,
    failures: u64,
    last_log: Option<tokio::time::Instant>,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            pause: Self::FIRST,
            failures: 0,
            last_log: None,
        }
    }
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1);

    pub(crate) fn reset(&mut self) {
        self.pause = Self::FIRST;
    }

    /// How long to pause, and the failure count to log now (if a line is due).
    pub(crate) fn failed(&mut self) -> (Duration, Option<u64>) {
        self.failures += 1;
        let pause = self.pause;
        self.pause = (self.pause * 2).min(Self::MAX);
        let now = tokio::time::Instant::now();
        let due = self
            .last_log
            .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1));
        if !due {
            return (pause, None);
        }
        self.last_log = Some(now);
        (pause, Some(std::mem::take(&mut self.failures)))
    }
}

/// Accepts connections until the shutdown begins and serves each with `serve`; then
/// closes the listener (a socket handed to a newer generation stays open there, its
/// queue included), starts the [`Drain`] every connection got and waits up to
/// the shutdown's grace period for them to close. `false`: some were still open then.
pub async fn accept_loop<F, Fut>(
    listener: TcpListener,
    slots: &ConnectionSlots,
    shutdown: Arc<Shutdown>,
    share: workers::Share,
    serve: F,
) -> bool
where
    F: Fn(TcpStream, SocketAddr, Drain) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    // Connections in flight; each holds a clone of the sender until it closes.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<()>(1);
    let draining = Drain::default();
    let mut backoff = AcceptBackoff::default();
    let mut full_logged: Option<tokio::time::Instant> = None;
    let stop = shutdown.stopping();
    loop {
        // A worker well ahead of another lets it take the next connection first.
        if share.ahead() {
            tokio::select! {
                _ = tokio::time::sleep(workers::Share::YIELD) => {}
                _ = stop.cancelled() => break,
            }
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => break,
        };
        let (stream, client) = match accepted {
            Ok(a) => {
                backoff.reset();
                a
            }
            Err(e) => {
                // Usually EMFILE: back off instead of spinning, and say so once a second.
                let (pause, log) = backoff.failed();
                if let Some(failures) = log {
                    tracing::error!(error = %e, failures, "Failed to accept connection");
                }
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        // Past `--max-connections`, this one waits for a slot and the loop accepts no
        // more: new connections wait in the kernel's backlog.
        let full = |limit| {
            let now = tokio::time::Instant::now();
            if full_logged.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1)) {
                full_logged = Some(now);
                tracing::warn!(
                    max_connections = limit,
                    "Connection limit reached; new connections wait"
                );
            }
        };
        // A connection already accepted is served even when the stop comes while it
        // waits for a slot: it has left the (possibly shared) queue, so nobody else can
        // answer it, and dropping it would reset a request the client has sent. `biased`
        // because a free slot and a stop can be ready together, and `select!` would
        // otherwise pick one at random.
        let slot = tokio::select! {
            biased;
            s = slots.acquire(full) => Some(s),
            _ = stop.cancelled() => None,
        };
        let stopping = slot.is_none();
        tokio::spawn(Connection {
            serving: serve(stream, client, draining.clone()),
            _open: open_tx.clone(),
            _held: share.hold(),
            _slot: slot,
        });
        if stopping {
            break;
        }
    }
    drop(listener);
    drop(open_tx);
    draining.start();
    // recv() returns None once every connection task has dropped its sender.
    tokio::time::timeout(shutdown.grace(), open_rx.recv())
        .await
        .is_ok()
}

pin_project_lite::pin_project! {
    /// A connection's task: the future serving it, and what the connection holds until it
    /// ends (dropped in this order). A struct rather than an `async` block, which would
    /// keep the serving future twice, as captured and as awaited: the task of an idle
    /// connection was 4.4 KB, twice its future.
    struct Connection<F> {
        #[pin]
        serving: F,
        _open: tokio::sync::mpsc::Sender<()>,
        _held: workers::Held,
        _slot: Option<tokio::sync::OwnedSemaphorePermit>,
    }
}

impl<F: Future<Output = ()>> Future for Connection<F> {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        // A request's clock reads fall into two polls of this task (crate::clock).
        let serving = self.project().serving;
        crate::clock::in_poll(|| serving.poll(cx))
    }
}

/// Serves one HTTP/1.x connection on the HTTP port.
///
/// Without `--proxy-protocol` the connection's task is the HTTP/1 connection itself:
/// an `async` wrapper would add its own copy of the arguments to every connection's task
/// (136 bytes, idle or not). The PROXY header's read is boxed instead, once per
/// connection of a listener that asked for it.
fn serve_connection(
    stream: TcpStream,
    client: SocketAddr,
    proxy: Arc<Proxy>,
    settings: Arc<h1::Settings>,
    draining: Drain,
) -> impl Future<Output = ()> + Send {
    use futures_util::future::Either;
    if proxy.proxy_protocol.is_none() {
        return Either::Left(serve_h1(stream, client, proxy, settings, draining));
    }
    Either::Right(Box::pin(async move {
        let mut stream = stream;
        let pp = proxy.proxy_protocol.as_ref();
        if let Some(client) = proxy_protocol::client_of(pp, &mut stream, client).await {
            serve_h1(stream, client, proxy, settings, draining).await;
        }
    }))
}

/// HTTP/1.x on the HTTP port, for the client at `client`.
fn serve_h1(
    stream: TcpStream,
    client: SocketAddr,
    proxy: Arc<Proxy>,
    settings: Arc<h1::Settings>,
    draining: Drain,
) -> impl Future<Output = ()> + Send {
    let _ = stream.set_nodelay(true);
    let conn = Conn {
        client: normalize(client),
        tls: false,
        watches_cuts: false,
    };
    h1::serve(stream, conn, proxy, settings, draining)
}

/// A listener timeout closed a connection.
fn log_expired(expired: h1_timeouts::Expired, client: SocketAddr) {
    if expired == h1_timeouts::Expired::Write {
        tracing::info!(client = %client, "Response not written within --write-timeout; closing the connection");
    } else {
        tracing::debug!(client = %client, reason = expired.reason(), "Closing connection");
    }
}

/// IPv4 clients on a dual-stack socket appear as `::ffff:a.b.c.d`; log them as IPv4.
pub(crate) fn normalize(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, v6.port())),
            None => addr,
        },
        v4 => v4,
    }
}

/// The pipeline for one request (ARCHITECTURE.md's order), from the ping path to the
/// service's answer.
///
/// The request is borrowed, here and by every layer below, from the one place it was
/// built with its final body type (the connection's exchange): moved by value from one
/// layer's future into the next, it was copied five times a request and rebuilt once for
/// its body's type (bench/README.md, "Thirty-first round"). A function
/// returning an `async` block, not an `async fn`: an `async fn` keeps each argument twice
/// in its future (as passed, and moved into its body), and copies them on its first poll.
#[allow(clippy::manual_async_fn)]
pub fn handle<'a>(
    proxy: &'a Proxy,
    req: &'a mut Request<RequestBody>,
    conn: Conn,
) -> impl Future<Output = BoxedResponse> + Send + 'a {
    async move {
        if req.uri().path() == PING_PATH {
            // Never logged, never routed.
            let method_allowed =
                req.method() == http::Method::GET || req.method() == http::Method::HEAD;
            return Box::new(Rejection::Ping { method_allowed }.render(None, req.method()));
        }
        // HTTP-01 answers come before routing and any redirect, and ahead of the access log
        // (ARCHITECTURE.md's step 2): a certificate authority's probes are not app traffic.
        if req
            .uri()
            .path()
            .starts_with(crate::tls::challenge::HTTP01_PREFIX)
        {
            if let Some(answer) = acme_http01::answer(&proxy.router, req) {
                return Box::new(answer.render(None, req.method()));
            }
        }
        let mut glance = Glance::of(req.headers());
        let (request_id, request_id_added) = request_id(req, &glance);
        let request_start_added = request_start(req, &glance);
        let arrival = Arrival {
            request_id,
            request_id_added,
            request_start_added,
        };
        let exchange = Exchange::new(access_record(proxy, req, conn, arrival, &mut glance));

        // One meaning per request: which host it is for, or a 400 when that is ambiguous.
        if let Err(rejection) = framing::settle(req, &mut glance) {
            let at = Refused {
                service: "",
                path: req.uri().path(),
                method: req.method(),
            };
            return rejection.respond(&at, None, exchange);
        }
        let host = glance.host.as_ref().and_then(|h| h.to_str().ok());
        let host = host_without_port(
            host.or_else(|| req.uri().authority().map(|a| a.as_str()))
                .unwrap_or(""),
        );
        let Some((service, prefix)) = proxy.router.lookup(host, req.uri().path()) else {
            let at = Refused {
                service: "",
                path: req.uri().path(),
                method: req.method(),
            };
            return Rejection::NotFound.respond(&at, None, exchange);
        };
        // On the heap, in a block the thread reuses (`Recycled`): the request path below is a
        // future of about 2.7 KB, and hyper keeps a slot as large as this one's in every
        // connection for as long as it is open, idle or not (10,000 idle keep-alive
        // connections held 21 KB each before).
        Recycled::new(service.serve(req, conn, &prefix, exchange, &proxy.forwarder)).await
    }
}

/// The request's id: the client's, or a fresh UUIDv4, returned as a header value (which
/// shares its bytes instead of copying them for the log) with whether it is to be added
/// where the request leaves (`proxy::proxy_fields`). A fresh id replaces an empty value
/// the client sent in the request's map; otherwise the map is left alone: an insert of a
/// custom name there (hashing it, probing) cost about 250 instructions a request.
fn request_id(req: &mut Request<RequestBody>, glance: &Glance) -> (HeaderValue, bool) {
    if let Some(id) = &glance.request_id {
        return (id.clone(), false);
    }
    let buf = hyphenated_v4();
    // The array itself is the shared buffer: one allocation, and a clone is a reference
    // count (a copied `Bytes` allocated again when first cloned).
    let id = HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(buf))
        .unwrap_or(HeaderValue::from_static(""));
    if glance.request_id_sent {
        req.headers_mut().insert(&X_REQUEST_ID, id.clone());
        return (id, false);
    }
    (id, true)
}

/// A fresh UUIDv4 in its hyphenated lower-case form (`uuid::fmt::Hyphenated`'s text).
/// `uuid`'s encoder picks each hex digit with a comparison and an add, about 210
/// instructions a request; here each byte's two digits are one load from a table.
fn hyphenated_v4() -> [u8; uuid::fmt::Hyphenated::LENGTH] {
    const DIGIT_PAIRS: [[u8; 2]; 256] = {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut pairs = [[0; 2]; 256];
        let mut byte = 0;
        while byte < 256 {
            pairs[byte] = [HEX[byte >> 4], HEX[byte & 0xf]];
            byte += 1;
        }
        pairs
    };
    let mut text = [b'-'; uuid::fmt::Hyphenated::LENGTH];
    let mut at = 0;
    for (i, byte) in uuid::Uuid::new_v4().as_bytes().iter().enumerate() {
        // The groups of 4, 2, 2, 2 and 6 bytes are separated by a hyphen.
        if matches!(i, 4 | 6 | 8 | 10) {
            at += 1;
        }
        text[at..at + 2].copy_from_slice(&DIGIT_PAIRS[usize::from(*byte)]);
        at += 2;
    }
    text
}

/// The `X-Request-Start` to add where the request leaves, when the client sent none; one
/// replacing an empty value the client sent goes into the request's map (as
/// [`request_id`]).
fn request_start(req: &mut Request<RequestBody>, glance: &Glance) -> Option<HeaderValue> {
    if glance.request_start {
        return None;
    }
    let ms = crate::clock::wall()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    // Requests of the same millisecond share one value (a reference count, not a copy):
    // formatting and allocating it for each request cost about 700 instructions.
    let value = REQUEST_START.with_borrow_mut(|(at, value)| {
        if *at != ms {
            *value = request_start_value(ms);
            *at = ms;
        }
        value.clone()
    });
    if glance.request_start_sent {
        req.headers_mut().insert(&X_REQUEST_START, value);
        return None;
    }
    Some(value)
}

thread_local! {
    /// This thread's last `X-Request-Start` and its millisecond.
    static REQUEST_START: std::cell::RefCell<(u64, HeaderValue)> =
        const { std::cell::RefCell::new((u64::MAX, HeaderValue::from_static(""))) };
}

/// `t=` and the milliseconds since the epoch.
fn request_start_value(ms: u64) -> HeaderValue {
    // Formatted on the stack and copied once into the header.
    let digits = crate::observe::text::Decimal::new(ms);
    let mut buf = [0u8; 22];
    buf[..2].copy_from_slice(b"t=");
    let len = 2 + digits.as_bytes().len();
    buf[2..len].copy_from_slice(digits.as_bytes());
    HeaderValue::from_bytes(&buf[..len]).unwrap_or(HeaderValue::from_static(""))
}

/// What [`request_id`] and [`request_start`] made of the request, for its record.
struct Arrival {
    request_id: HeaderValue,
    request_id_added: bool,
    request_start_added: Option<HeaderValue>,
}

fn access_record(
    proxy: &Proxy,
    req: &Request<RequestBody>,
    conn: Conn,
    arrival: Arrival,
    glance: &mut Glance,
) -> AccessRecord {
    let headers = req.headers();
    let host = glance.host.clone().unwrap_or_else(|| {
        req.uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or(HeaderValue::from_static(""))
    });
    let remote_addr = if glance.more_forwarded_for {
        HeaderValue::from_str(&header_values(headers, X_FORWARDED_FOR.as_str())).ok()
    } else {
        glance.forwarded_for.take()
    };
    // As Go's `Request.ContentLength`: the declared length, 0 for a request that has no
    // body (neither Content-Length nor chunked), -1 when only the stream's end will tell.
    let req_content_length = hyper::body::Body::size_hint(req.body())
        .exact()
        .and_then(|n| i64::try_from(n).ok())
        .unwrap_or(-1);
    AccessRecord {
        started: crate::clock::now(),
        host,
        port: if conn.tls {
            proxy.https_port
        } else {
            proxy.http_port
        },
        path_and_query: req.uri().path_and_query().cloned(),
        request_id: arrival.request_id,
        request_id_added: arrival.request_id_added,
        request_start_added: arrival.request_start_added,
        status: 200,
        service: None,
        target: None,
        method: crate::observe::metrics::method_label(req.method()),
        method_raw: req.method().clone(),
        req_content_length,
        req_content_type: glance.content_type.take(),
        resp_content_type: None,
        client: conn.client,
        remote_addr,
        user_agent: glance.user_agent.take(),
        proto: match req.version() {
            http::Version::HTTP_10 => "HTTP/1.0",
            http::Version::HTTP_2 => "HTTP/2.0",
            http::Version::HTTP_3 => "HTTP/3.0",
            _ => "HTTP/1.1",
        },
        scheme: if conn.tls { "https" } else { "http" },
        req_headers: Vec::new(),
        resp_header_names: None,
        resp_headers: Vec::new(),
        exclude_metrics: false,
        retries: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn accept_failures_back_off_and_log_once_a_second() {
        let mut b = AcceptBackoff::default();
        assert_eq!(b.failed(), (Duration::from_millis(5), Some(1)));
        assert_eq!(b.failed(), (Duration::from_millis(10), None));
        for _ in 0..10 {
            b.failed();
        }
        assert_eq!(b.failed().0, AcceptBackoff::MAX);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(b.failed().1, Some(13));
        b.reset();
        assert_eq!(b.failed().0, AcceptBackoff::FIRST);
    }

    #[test]
    fn request_ids_are_uuid_v4_in_uuids_own_hyphenated_text() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let id = hyphenated_v4();
            let text = std::str::from_utf8(&id).unwrap();
            let parsed = uuid::Uuid::try_parse(text).unwrap();
            assert_eq!(parsed.get_version(), Some(uuid::Version::Random));
            assert_eq!(parsed.hyphenated().to_string(), text);
            assert!(seen.insert(id), "{text} came twice");
        }
    }
}
