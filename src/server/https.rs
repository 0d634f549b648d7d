//! The HTTPS listener: TLS (rustls on aws-lc-rs) with the certificate chosen by SNI, ALPN
//! `h2`, `http/1.1` and `acme-tls/1`, then HTTP/1.1 (with upgrades) or HTTP/2, as ALPN
//! chose (as Go's server: no ALPN means HTTP/1.1), into the same request pipeline as the
//! HTTP port.

use http::{HeaderValue, header};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;

use super::certificates::{TlsResolver, offers_acme_tls, prepare};
use super::idle::{Activity, Counted};
use super::workers::Workers;
use super::write_deadline::{WriteDeadline, WriteTimedOut};
use super::{Drain, FirstRequest, Proxy, Shutdown, handle, normalize};
use crate::proxy::body::{BoxedResponse, RequestBody};
use crate::service::Conn;
use crate::tls::challenge::ACME_TLS_ALPN;

/// A client gets this long to send its ClientHello, and again to finish the handshake
/// once its certificate is ready (obtaining one has its own limit), or less when a
/// listener timeout is shorter (as Go, which takes the shortest of them).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTPS listener's TLS settings, in two orders of cipher suites (see
/// `crate::tls::provider`): AES-GCM first, and ChaCha20-Poly1305 first for a client that
/// lists it first (`crate::tls::prefers_chacha`), as Go chooses.
pub struct TlsConfigs {
    pub aes_first: Arc<rustls::ServerConfig>,
    chacha_first: Arc<rustls::ServerConfig>,
}

impl TlsConfigs {
    fn for_client(&self, hello: &rustls::server::ClientHello<'_>) -> Arc<rustls::ServerConfig> {
        if crate::tls::prefers_chacha(hello.cipher_suites()) {
            self.chacha_first.clone()
        } else {
            self.aes_first.clone()
        }
    }
}

pub fn server_config(resolver: Arc<TlsResolver>) -> TlsConfigs {
    // One session cache for both: a client resumes whichever order its first handshake took.
    let sessions = rustls::server::ServerSessionMemoryCache::new(256);
    let config = |provider| {
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|_| rustls::ServerConfig::builder())
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), ACME_TLS_ALPN.to_vec()];
        // Our order of cipher suites, not the client's.
        config.ignore_client_order = true;
        config.session_storage = sessions.clone();
        // One TLS 1.3 ticket a handshake, as Go's server (upstream) sends, not rustls's two:
        // a client resumes with one and gets the next with it, so the second was encrypted,
        // cached and parsed by the client for nothing, on every new connection.
        config.send_tls13_tickets = 1;
        Arc::new(config)
    };
    TlsConfigs {
        aes_first: config(crate::tls::provider()),
        chacha_first: config(crate::tls::provider_chacha_first()),
    }
}

/// What every HTTPS connection shares.
pub struct Https {
    pub proxy: Arc<Proxy>,
    pub configs: TlsConfigs,
    /// `Alt-Svc` advertising HTTP/3, when it is served.
    pub alt_svc: Option<HeaderValue>,
    /// For its HTTP/1.1 connections.
    h1: Arc<super::h1::Settings>,
    http2: hyper::server::conn::http2::Builder<TokioExecutor>,
    handshake_timeout: Duration,
}

impl Https {
    pub fn new(proxy: Arc<Proxy>, configs: TlsConfigs, alt_svc: Option<HeaderValue>) -> Arc<Https> {
        let h1 = super::h1::Settings::new(&proxy.limits);
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(proxy.limits.max_header_bytes).unwrap_or(u32::MAX));
        let t = proxy.limits.timeouts;
        let handshake_timeout = [t.read_header, t.read, t.write]
            .into_iter()
            .flatten()
            .fold(HANDSHAKE_TIMEOUT, Duration::min);
        Arc::new(Https {
            proxy,
            configs,
            alt_svc,
            h1,
            http2,
            handshake_timeout,
        })
    }
}

pub async fn serve_https(
    listener: TcpListener,
    https: Arc<Https>,
    shutdown: Arc<Shutdown>,
    workers: Workers,
) {
    let slots = https.proxy.slots.clone();
    // A TLS client speaks first. One second: a client that waits for the server anyway is
    // still served, a second late. Set here rather than at bind: a socket handed over by
    // an earlier generation gets it too. Without it (another kernel) nothing is lost but
    // a wake-up a connection.
    if let Err(e) = super::defer_accept(&listener, 1) {
        tracing::debug!(error = %e, "TCP_DEFER_ACCEPT not set on the HTTPS listener");
    }
    workers
        .accept(
            listener,
            slots,
            shutdown,
            move |stream, client, draining| {
                serve_connection(stream, client, https.clone(), draining)
            },
        )
        .await
}

/// Go's check for plain HTTP on a TLS port (a TLS record starts with 0x16).
fn looks_like_http(first: &[u8]) -> bool {
    const STARTS: [&[u8]; 5] = [b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO"];
    first.first() != Some(&0x16) && STARTS.iter().any(|s| first.len() >= 5 && first == *s)
}

/// What Go's net/http answers to plain HTTP sent to an HTTPS port. Raw bytes rather than a
/// [`crate::proxy::rejection::Rejection`]: no HTTP connection exists here (the bytes were
/// sniffed where a TLS handshake belongs), and Go writes exactly this HTTP/1.0 text.
async fn answer_plain_http(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt;
    let _ = stream
        .write_all(
            b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n",
        )
        .await;
    let _ = stream.shutdown().await;
}

/// Serves one connection on the HTTPS port: the TLS handshake, then HTTP/2 or HTTP/1.x as
/// ALPN chose.
///
/// The handshake runs in a box of its own, freed once it is over: its state (about 4 KB:
/// rustls' acceptor, the ClientHello, the timeouts) would otherwise size every HTTPS
/// connection's task for as long as the connection is open. The connection's future is
/// built before it is awaited, so that what the handshake returned is not kept beside it
/// (a value matched on lives through its arms' `.await`s). Idle TLS connections held
/// 7.9 KB each in their task.
#[allow(clippy::manual_async_fn)]
fn serve_connection(
    stream: TcpStream,
    client: SocketAddr,
    https: Arc<Https>,
    draining: Drain,
) -> impl Future<Output = ()> + Send {
    use futures_util::future::Either;
    async move {
        let serving = match Box::pin(handshake(stream, client, &https)).await {
            Handshake::H2(tls, conn) => {
                let first = Arc::new(FirstRequest::default());
                Either::Left(serve_h2(TokioIo::new(tls), https, conn, draining, first))
            }
            Handshake::H1(tls, conn) => {
                let settings = https.h1.clone();
                Either::Right(super::h1::serve(tls, conn, https, settings, draining))
            }
            Handshake::Over => return,
        };
        serving.await
    }
}

/// How a connection's handshake ended.
enum Handshake {
    H2(TlsStream<TcpStream>, Conn),
    H1(TlsStream<TcpStream>, Conn),
    /// Nothing more to serve: a failed handshake, plain HTTP answered, an ACME
    /// validation's handshake (which was the answer).
    Over,
}

async fn handshake(mut stream: TcpStream, client: SocketAddr, https: &Https) -> Handshake {
    // The PROXY header comes before the ClientHello.
    let pp = https.proxy.proxy_protocol.as_ref();
    let Some(client) = super::proxy_protocol::client_of(pp, &mut stream, client).await else {
        return Handshake::Over;
    };
    let _ = stream.set_nodelay(true);
    let handshake_timeout = https.handshake_timeout;
    let mut first = [0u8; 5];
    match tokio::time::timeout(handshake_timeout, stream.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {
            if looks_like_http(&first[..n]) {
                answer_plain_http(stream).await;
                return Handshake::Over;
            }
        }
        _ => return Handshake::Over,
    }
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    let start = match tokio::time::timeout(handshake_timeout, acceptor).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => {
            tracing::debug!(client = %client, error = %e, "TLS handshake error");
            return Handshake::Over;
        }
        Err(_) => return Handshake::Over,
    };
    let hello = start.client_hello();
    if !offers_acme_tls(&hello) {
        let sni = hello.server_name().map(str::to_string);
        prepare(&https.proxy.router, sni.as_deref()).await;
    }
    let config = https.configs.for_client(&hello);
    let tls = match tokio::time::timeout(handshake_timeout, start.into_stream(config)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(client = %client, error = %e, "TLS handshake error");
            return Handshake::Over;
        }
        Err(_) => return Handshake::Over,
    };
    let conn = Conn {
        client: normalize(client),
        tls: true,
        watches_cuts: false,
    };
    match tls.get_ref().1.alpn_protocol() {
        // A TLS-ALPN-01 validation: the handshake was the answer.
        Some(ACME_TLS_ALPN) => Handshake::Over,
        Some(b"h2") => Handshake::H2(tls, conn),
        _ => Handshake::H1(tls, conn),
    }
}

/// An HTTPS connection's answer: the pipeline's, with `Alt-Svc` when HTTP/3 is served.
impl super::h1::Respond for Arc<Https> {
    fn respond<'a>(
        &'a self,
        request: &'a mut http::Request<RequestBody>,
        conn: Conn,
    ) -> impl std::future::Future<Output = BoxedResponse> + Send + 'a {
        respond(self, request, conn)
    }
}

/// One HTTP/2 connection: shut down gracefully (GOAWAY, open streams finish) on drain,
/// or once it has had no open stream for `--idle-timeout`. A stream whose response is not
/// over within `--write-timeout` of its request is reset.
///
/// The connection is built before the `async` block, which then holds it and not also the
/// stream it was built from (as an `async fn`'s argument would be, 1.2 KB over TLS).
#[allow(clippy::manual_async_fn)]
fn serve_h2<I>(
    io: I,
    https: Arc<Https>,
    conn: Conn,
    draining: Drain,
    first: Arc<FirstRequest>,
) -> impl Future<Output = ()> + Send
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::default());
    let counted = activity.clone();
    let shared = https.clone();
    let seen = first.clone();
    let timeouts = https.proxy.limits.timeouts;
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        seen.mark();
        let https = shared.clone();
        let stream = counted.begin();
        let mut req = req.map(RequestBody::stream);
        let deadline = timeouts
            .write
            .map(|limit| tokio::time::Instant::now() + limit);
        async move {
            let response = match deadline {
                None => respond(&https, &mut req, conn).await,
                // No response by then: an error, which hyper turns into a reset stream.
                Some(at) => tokio::time::timeout_at(at, respond(&https, &mut req, conn))
                    .await
                    .map_err(|_| {
                        tracing::info!(client = %conn.client, "No response within --write-timeout; resetting the stream");
                        WriteTimedOut
                    })?,
            };
            Ok::<_, WriteTimedOut>(
                (*response).map(|body| Counted::new(WriteDeadline::new(body, deadline), stream)),
            )
        }
    });
    // Boxed: pinned inside the block it would be moved there from the block's capture,
    // and the task would hold its 2.7 KB twice.
    let mut connection = Box::pin(https.http2.serve_connection(io, service));
    async move {
        let idle = async {
            match timeouts.idle {
                Some(limit) => activity.idle_for(limit).await,
                None => std::future::pending().await,
            }
        };
        let mut idle = std::pin::pin!(idle);
        let mut drained = std::pin::pin!(draining.started_after(&first));
        let mut closing = false;
        let result = loop {
            tokio::select! {
                r = connection.as_mut() => break r,
                _ = drained.as_mut(), if !closing => {}
                _ = idle.as_mut(), if !closing => {
                    tracing::debug!(client = %conn.client, "Closing idle HTTP/2 connection");
                }
            }
            closing = true;
            connection.as_mut().graceful_shutdown();
        };
        if let Err(e) = result {
            tracing::debug!(error = %e, "Connection error");
        }
    }
}

/// The pipeline's answer, with `Alt-Svc` when HTTP/3 is served.
async fn respond(https: &Https, req: &mut http::Request<RequestBody>, conn: Conn) -> BoxedResponse {
    let mut response = handle(&https.proxy, req, conn).await;
    if let Some(alt_svc) = &https.alt_svc {
        if !response.headers().contains_key(header::ALT_SVC) {
            response
                .headers_mut()
                .insert(header::ALT_SVC, alt_svc.clone());
        }
    }
    response
}
