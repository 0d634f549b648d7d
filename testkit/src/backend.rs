//! A real HTTP backend for the tests, on 127.0.0.1 with a kernel-chosen port.
//!
//! Routes:
//! - `GET /up` — 200 `ok`, or 503 after `set_healthy(false)`
//! - `/echo` — JSON: method, uri, headers (lower-cased names, values joined with ", "),
//!   body_len and an FNV-1a hash of the body, so tests can check bodies byte for byte
//! - `/slow?ms=N` — answers after N ms
//! - `/sse?n=N&interval_ms=M` — N server-sent events, M ms apart
//! - `/drip?n=N&interval_ms=M` — the same stream as `text/plain` (chunked, no length)
//! - `/redirect/<path>` — 302 to `/<path>`
//! - `/status/<code>` — that status with body `status <code>`
//! - `/bytes/<n>` — n bytes of `x` with a Content-Length
//! - `/ws` — WebSocket echo
//! - `/headers?name=value&…` — 200 with each pair (percent-decoded) as a response header
//! - anything else — 200 with the backend's name as body, `X-Backend: <name>` and
//!   `X-Uri: <path and query as received>`

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, std::io::Error>;

pub struct Backend {
    pub addr: SocketAddr,
    pub name: String,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

struct State {
    name: String,
    healthy: AtomicBool,
    hits: AtomicUsize,
    health_hits: AtomicUsize,
    connections: AtomicUsize,
    /// `/slow` requests whose connection went away before the answer was ready.
    slow_cancelled: AtomicUsize,
    /// `/sse` and `/drip` events produced so far (handed to the connection).
    events_sent: AtomicUsize,
    /// Set by `kill`: every open connection closes.
    killed: tokio::sync::watch::Sender<bool>,
}

impl Backend {
    pub async fn start(name: &str) -> Backend {
        Self::start_on("127.0.0.1:0", name).await
    }

    /// Listens on a given address (the example `test_backend` binary uses this inside a
    /// container).
    pub async fn start_on(addr: &str, name: &str) -> Backend {
        let listener = TcpListener::bind(addr).await.expect("bind backend");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(State {
            name: name.to_string(),
            healthy: AtomicBool::new(true),
            hits: AtomicUsize::new(0),
            health_hits: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            slow_cancelled: AtomicUsize::new(0),
            events_sent: AtomicUsize::new(0),
            killed: tokio::sync::watch::Sender::new(false),
        });
        let s = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                s.connections.fetch_add(1, Ordering::SeqCst);
                let s = s.clone();
                tokio::spawn(async move {
                    let mut killed = s.killed.subscribe();
                    let svc = service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(route(s, req).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .with_upgrades();
                    tokio::select! {
                        _ = conn => {}
                        _ = killed.wait_for(|k| *k) => {}
                    }
                });
            }
        });
        Backend {
            addr,
            name: name.to_string(),
            state,
            task,
        }
    }

    /// `127.0.0.1:<port>`, as passed to `--target`.
    pub fn target(&self) -> String {
        self.addr.to_string()
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.state.healthy.store(healthy, Ordering::SeqCst);
    }

    /// Requests other than health checks.
    pub fn hits(&self) -> usize {
        self.state.hits.load(Ordering::SeqCst)
    }

    pub fn health_hits(&self) -> usize {
        self.state.health_hits.load(Ordering::SeqCst)
    }

    /// TCP connections accepted so far (health checks included).
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// `/slow` requests abandoned by the caller before they were answered.
    pub fn slow_cancelled(&self) -> usize {
        self.state.slow_cancelled.load(Ordering::SeqCst)
    }

    /// `/sse` and `/drip` events produced so far: a client that holds event `i` while
    /// this is `i + 1` got it before the next one existed.
    pub fn events_sent(&self) -> usize {
        self.state.events_sent.load(Ordering::SeqCst)
    }

    /// Stops accepting new connections (existing ones keep going).
    pub fn shutdown(&self) {
        self.task.abort();
    }

    /// Like a crashed app: stops accepting and closes every open HTTP connection.
    pub fn kill(&self) {
        self.task.abort();
        self.state.killed.send_replace(true);
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(
        Full::new(body.into())
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}

fn query_param(req: &Request<Incoming>, key: &str) -> Option<u64> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.parse().ok()).flatten()
    })
}

async fn route(s: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == "/up" {
        s.health_hits.fetch_add(1, Ordering::SeqCst);
        return if s.healthy.load(Ordering::SeqCst) {
            full(StatusCode::OK, "ok")
        } else {
            full(StatusCode::SERVICE_UNAVAILABLE, "down")
        };
    }
    s.hits.fetch_add(1, Ordering::SeqCst);
    if path == "/ws" {
        return websocket(req);
    }
    if path == "/echo" {
        return echo(req).await;
    }
    if path == "/slow" {
        let ms = query_param(&req, "ms").unwrap_or(1000);
        // Hyper drops this future when the caller closes the connection.
        let guard = CancelGuard(Some(s.clone()));
        tokio::time::sleep(Duration::from_millis(ms)).await;
        guard.disarm();
        return full(StatusCode::OK, format!("slow {ms}"));
    }
    if path == "/sse" || path == "/drip" {
        let n = query_param(&req, "n").unwrap_or(3);
        let interval = query_param(&req, "interval_ms").unwrap_or(500);
        let stream = futures_util::stream::unfold(0u64, move |i| {
            let s = s.clone();
            async move {
                if i >= n {
                    return None;
                }
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(interval)).await;
                }
                s.events_sent.fetch_add(1, Ordering::SeqCst);
                let frame = Frame::data(Bytes::from(format!("data: event {i}\n\n")));
                Some((Ok::<_, std::io::Error>(frame), i + 1))
            }
        });
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
        let content_type = if path == "/sse" {
            "text/event-stream"
        } else {
            "text/plain"
        };
        r.headers_mut()
            .insert("content-type", content_type.parse().unwrap());
        return r;
    }
    if let Some(rest) = path.strip_prefix("/redirect/") {
        let mut r = full(StatusCode::FOUND, Bytes::new());
        if let Ok(location) = format!("/{rest}").parse() {
            r.headers_mut().insert("location", location);
        }
        return r;
    }
    if let Some(code) = path.strip_prefix("/status/") {
        let code: u16 = code.parse().unwrap_or(500);
        return full(
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            format!("status {code}"),
        );
    }
    if path == "/headers" {
        let mut r = full(StatusCode::OK, "headers");
        for (k, v) in req
            .uri()
            .query()
            .unwrap_or("")
            .split('&')
            .filter_map(|kv| kv.split_once('='))
        {
            if let (Ok(k), Ok(v)) = (
                hyper::header::HeaderName::from_bytes(&percent_decode(k)),
                hyper::header::HeaderValue::from_bytes(&percent_decode(v)),
            ) {
                r.headers_mut().append(k, v);
            }
        }
        return r;
    }
    if let Some(n) = path.strip_prefix("/bytes/") {
        let n: usize = n.parse().unwrap_or(0);
        return full(StatusCode::OK, vec![b'x'; n]);
    }
    let mut r = full(StatusCode::OK, s.name.clone());
    r.headers_mut().insert("x-backend", s.name.parse().unwrap());
    if let Ok(uri) = req.uri().to_string().parse() {
        r.headers_mut().insert("x-uri", uri);
    }
    r
}

struct CancelGuard(Option<Arc<State>>);

impl CancelGuard {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.slow_cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

async fn echo(req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let mut headers = serde_json::Map::new();
    for name in parts.headers.keys() {
        let values: Vec<String> = parts
            .headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        headers.insert(
            name.as_str().to_string(),
            serde_json::Value::String(values.join(", ")),
        );
    }
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return full(StatusCode::BAD_REQUEST, format!("body error: {e}")),
    };
    let json = serde_json::json!({
        "method": parts.method.as_str(),
        "uri": parts.uri.to_string(),
        "headers": headers,
        "body_len": bytes.len(),
        "body_fnv": format!("{:016x}", fnv1a(&bytes)),
    });
    let mut r = full(StatusCode::OK, json.to_string());
    r.headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    r
}

fn websocket(mut req: Request<Incoming>) -> Response<Body> {
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::Role;
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return full(StatusCode::BAD_REQUEST, "not a websocket request");
    };
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            Role::Server,
            None,
        )
        .await;
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_close() {
                break;
            }
            if (msg.is_text() || msg.is_binary()) && ws.send(msg).await.is_err() {
                break;
            }
        }
    });
    let mut r = full(StatusCode::SWITCHING_PROTOCOLS, Bytes::new());
    let h = r.headers_mut();
    h.insert("connection", "Upgrade".parse().unwrap());
    h.insert("upgrade", "websocket".parse().unwrap());
    h.insert(
        "sec-websocket-accept",
        derive_accept_key(key.as_bytes()).parse().unwrap(),
    );
    r
}
