//! Listeners and the outermost request steps (ARCHITECTURE.md steps 1–4): liveness ping,
//! request id and start stamp, the access log, and routing to a service.

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::observe::access::{AccessRecord, Completion, header_values};
use crate::proxy::Forwarder;
use crate::proxy::body::ResponseBody;
use crate::proxy::headers::{X_FORWARDED_FOR, X_REQUEST_ID, X_REQUEST_START};
use crate::proxy::pages::error_response;
use crate::router::Router;
use crate::service::{Conn, finish, host_without_port, request_host};

pub const PING_PATH: &str = "/.kamal-proxy/ping";
/// Upstream's shutdown grace: in-flight requests get this long to finish.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything the request path needs, shared by every connection.
pub struct Proxy {
    pub router: Arc<Router>,
    pub forwarder: Forwarder,
    pub http_port: u16,
    pub https_port: u16,
}

/// Binds like Go's `net.Listen("tcp", ":port")`, with Go's error wording.
pub async fn bind(port: u16) -> Result<TcpListener, String> {
    let addr = SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 0], port));
    let socket = tokio::net::TcpSocket::new_v6().map_err(|e| format!("listen tcp :{port}: {e}"))?;
    // Accept IPv4 too (dual stack), and allow quick restarts.
    let _ = socket.set_reuseaddr(true);
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
            TcpListener::bind(v4)
                .await
                .map_err(|e| format!("listen tcp :{port}: bind: {}", io_text(&e)))
        }
    }
}

fn set_dual_stack(socket: &tokio::net::TcpSocket) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let off: libc::c_int = 0;
    // SAFETY: a valid socket fd and a correctly sized c_int option value.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            &off as *const libc::c_int as *const libc::c_void,
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

/// Serves plain HTTP/1.x (upstream's HTTP port speaks no h2c) until `stop` is cancelled,
/// then lets in-flight requests finish for up to [`SHUTDOWN_TIMEOUT`].
pub async fn serve_http(listener: TcpListener, proxy: Arc<Proxy>, stop: CancellationToken) {
    // Connections in flight; each holds a clone of the sender until it closes.
    let (open_tx, mut open_rx) = tokio::sync::mpsc::channel::<()>(1);
    let draining = CancellationToken::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => break,
        };
        let (stream, client) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Usually EMFILE: back off instead of spinning.
                tracing::error!(error = %e, "Failed to accept connection");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let open = open_tx.clone();
        let draining = draining.clone();
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let _open = open;
            serve_connection(stream, client, proxy, false, draining).await;
        });
    }
    drop(listener);
    drop(open_tx);
    draining.cancel();
    // recv() returns None once every connection task has dropped its sender.
    if tokio::time::timeout(SHUTDOWN_TIMEOUT, open_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!("Closing active connections");
    }
}

/// Serves one HTTP/1.x connection; when `draining` fires, the request in flight
/// finishes and the connection closes instead of being kept alive.
async fn serve_connection(
    stream: TcpStream,
    client: SocketAddr,
    proxy: Arc<Proxy>,
    tls: bool,
    draining: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let conn = Conn {
        client: normalize(client),
        tls,
    };
    let service = service_fn(move |req| {
        let proxy = proxy.clone();
        async move { Ok::<_, Infallible>(handle(&proxy, req, conn).await) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        r = connection.as_mut() => r,
        _ = draining.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "Connection error");
    }
}

/// IPv4 clients on a dual-stack socket appear as `::ffff:a.b.c.d`; log them as IPv4.
fn normalize(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, v6.port())),
            None => addr,
        },
        v4 => v4,
    }
}

pub async fn handle(
    proxy: &Proxy,
    mut req: Request<Incoming>,
    conn: Conn,
) -> Response<ResponseBody> {
    if req.uri().path() == PING_PATH {
        return ping();
    }
    let request_id = ensure_request_id(&mut req);
    ensure_request_start(&mut req);
    let record = access_record(proxy, &req, conn, request_id);
    let completion = Completion::new(record);

    let host = host_without_port(request_host(&req).unwrap_or(""));
    let Some((service, prefix)) = proxy.router.lookup(host, req.uri().path()) else {
        return finish(
            error_response(StatusCode::NOT_FOUND, None, None),
            completion,
        );
    };
    service
        .serve(req, conn, &prefix, completion, &proxy.forwarder)
        .await
}

fn ping() -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(&b"OK\n"[..]));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn ensure_request_id(req: &mut Request<Incoming>) -> String {
    if let Some(id) = req.headers().get(&X_REQUEST_ID).filter(|v| !v.is_empty()) {
        return String::from_utf8_lossy(id.as_bytes()).into_owned();
    }
    let id = uuid::Uuid::new_v4().to_string();
    if let Ok(v) = HeaderValue::from_str(&id) {
        req.headers_mut().insert(&X_REQUEST_ID, v);
    }
    id
}

fn ensure_request_start(req: &mut Request<Incoming>) {
    if req
        .headers()
        .get(&X_REQUEST_START)
        .is_some_and(|v| !v.is_empty())
    {
        return;
    }
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    if let Ok(v) = HeaderValue::from_str(&format!("t={ms}")) {
        req.headers_mut().insert(&X_REQUEST_START, v);
    }
}

fn access_record(
    proxy: &Proxy,
    req: &Request<Incoming>,
    conn: Conn,
    request_id: String,
) -> AccessRecord {
    let headers = req.headers();
    let text = |name: header::HeaderName| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default()
    };
    let client_addr = conn.client.ip().to_string();
    let remote_addr = match headers.get(&X_FORWARDED_FOR) {
        Some(_) => header_values(headers, X_FORWARDED_FOR.as_str()),
        None => client_addr.clone(),
    };
    let req_content_length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(
            if req.method() == http::Method::GET || req.method() == http::Method::HEAD {
                0
            } else {
                -1
            },
        );
    AccessRecord {
        started: tokio::time::Instant::now(),
        host: request_host(req).unwrap_or("").to_string(),
        port: if conn.tls {
            proxy.https_port
        } else {
            proxy.http_port
        },
        path: req.uri().path().to_string(),
        request_id,
        status: 200,
        service: None,
        target: None,
        method: crate::observe::metrics::method_label(req.method()),
        method_raw: req.method().as_str().to_string(),
        req_content_length,
        req_content_type: text(header::CONTENT_TYPE),
        resp_content_type: String::new(),
        client_addr,
        client_port: conn.client.port().to_string(),
        remote_addr,
        user_agent: text(header::USER_AGENT),
        proto: match req.version() {
            http::Version::HTTP_10 => "HTTP/1.0",
            http::Version::HTTP_2 => "HTTP/2.0",
            http::Version::HTTP_3 => "HTTP/3.0",
            _ => "HTTP/1.1",
        },
        scheme: if conn.tls { "https" } else { "http" },
        query: req.uri().query().unwrap_or("").to_string(),
        req_headers: Vec::new(),
        resp_header_names: Arc::new(Vec::new()),
        resp_headers: Vec::new(),
        exclude_metrics: false,
    }
}

/// The Prometheus endpoint: every path answers with the metrics text, as upstream.
pub async fn serve_metrics(listener: TcpListener, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
            _ = stop.cancelled() => return,
        };
        tokio::spawn(async move {
            let service = service_fn(|_req: Request<Incoming>| async {
                let mut r = Response::new(http_body_util::Full::new(bytes::Bytes::from(
                    crate::observe::metrics::render(),
                )));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                Ok::<_, Infallible>(r)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
