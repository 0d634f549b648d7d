//! `run --http3`: QUIC on UDP at the HTTPS port (TLS 1.3, ALPN `h3`), the same
//! certificate resolver and the same request pipeline.
//!
//! The pipeline streams a request body as hyper's `Incoming` (`RequestBody`), which only
//! hyper's own connections can produce, so each HTTP/3 request is handed to it over an
//! in-memory HTTP/1.1 connection (a duplex pipe): the request and response bodies stream
//! through unbuffered.
//! That costs a little per HTTP/3 request and nothing on the HTTP/1.1 and HTTP/2 paths.
//! A certificate must already be in memory (obtained on a TCP handshake, which is where
//! clients learn about HTTP/3 from `Alt-Svc`).

use bytes::{Buf, Bytes};
use http::{Request, Response, Version, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::workers::Workers;
use super::{Proxy, Shutdown, handle, normalize};
use crate::proxy::body::RequestBody;
use crate::service::Conn;

type BridgeBody = BoxBody<Bytes, std::io::Error>;

/// Binds the UDP socket (all interfaces, as the TCP listeners). `idle`: `--idle-timeout`,
/// the only listener timeout HTTP/3 takes (fork F27); `None` keeps idle connections.
pub fn bind(
    port: u16,
    tcp_config: &rustls::ServerConfig,
    idle: Option<Duration>,
) -> Result<quinn::Endpoint, String> {
    let mut tls = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("HTTP/3: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(tcp_config.cert_resolver.clone());
    tls.alpn_protocols = vec![b"h3".to_vec()];
    tls.max_early_data_size = 0;
    tls.ignore_client_order = tcp_config.ignore_client_order;
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| format!("HTTP/3: {e}"))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    // QUIC caps an idle timeout at 2^62 ms; a longer one is as good as none.
    transport.max_idle_timeout(idle.and_then(|d| quinn::IdleTimeout::try_from(d).ok()));
    config.transport_config(Arc::new(transport));
    let v6 = SocketAddr::from(([0u16; 8], port));
    quinn::Endpoint::server(config.clone(), v6)
        .or_else(|_| quinn::Endpoint::server(config, SocketAddr::from(([0, 0, 0, 0], port))))
        .map_err(|e| format!("listen udp :{port}: {e}"))
}

/// Accepts QUIC connections on `endpoint` (its packets are handled where this runs, the
/// control runtime) and serves each on the next worker in turn, as a TCP connection is.
pub async fn serve(
    endpoint: quinn::Endpoint,
    proxy: Arc<Proxy>,
    shutdown: Arc<Shutdown>,
    workers: Workers,
) {
    let stop = shutdown.stopping();
    let mut next = 0usize;
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = stop.cancelled() => break,
        };
        let Some(incoming) = incoming else { break };
        let proxy = proxy.clone();
        next = next.wrapping_add(1);
        workers.spawn(next, async move {
            let connection = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "QUIC handshake error");
                    return;
                }
            };
            let client = normalize(connection.remote_address());
            let mut h3 = match h3::server::builder()
                .max_field_section_size(proxy.limits.max_header_bytes as u64)
                .build::<_, Bytes>(h3_quinn::Connection::new(connection))
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(error = %e, "HTTP/3 connection error");
                    return;
                }
            };
            loop {
                match h3.accept().await {
                    Ok(Some(resolver)) => {
                        let proxy = proxy.clone();
                        tokio::spawn(async move {
                            if let Err(e) = serve_request(resolver, proxy, client).await {
                                tracing::debug!(error = %e, "HTTP/3 request error");
                            }
                        });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "HTTP/3 connection closed");
                        break;
                    }
                }
            }
        });
    }
    endpoint.close(0u32.into(), b"shutting down");
    let _ = tokio::time::timeout(shutdown.grace(), endpoint.wait_idle()).await;
}

type Resolver = h3::server::RequestResolver<h3_quinn::Connection, Bytes>;

async fn serve_request(
    resolver: Resolver,
    proxy: Arc<Proxy>,
    client: SocketAddr,
) -> Result<(), String> {
    let (req, stream) = resolver
        .resolve_request()
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, mut recv) = stream.split();

    // A request whose stream ends right after its headers has no body: send none, so the
    // pipeline does not see a chunked GET.
    let first = recv.recv_data().await.map_err(|e| e.to_string())?;
    let body: BridgeBody = match first {
        None => Full::new(Bytes::new())
            .map_err(|never: Infallible| match never {})
            .boxed(),
        Some(mut chunk) => {
            let first = chunk.copy_to_bytes(chunk.remaining());
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(8);
            tokio::spawn(async move {
                if tx.send(Ok(Frame::data(first))).await.is_err() {
                    return;
                }
                loop {
                    match recv.recv_data().await {
                        Ok(Some(mut c)) => {
                            let bytes = c.copy_to_bytes(c.remaining());
                            if tx.send(Ok(Frame::data(bytes))).await.is_err() {
                                return;
                            }
                        }
                        Ok(None) => return,
                        Err(e) => {
                            let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                            return;
                        }
                    }
                }
            });
            StreamBody::new(tokio_stream_from(rx)).boxed()
        }
    };

    let (parts, ()) = req.into_parts();
    // Absolute-form when there is an `:authority`, so the pipeline can hold it against a
    // `host` header as it does for HTTP/2.
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let target = match parts.uri.authority() {
        Some(authority) => format!("https://{authority}{path}"),
        None => path.to_string(),
    };
    let mut bridged = Request::builder()
        .method(parts.method)
        .uri(target)
        .version(Version::HTTP_11);
    if let Some(headers) = bridged.headers_mut() {
        *headers = parts.headers;
        if !headers.contains_key(header::HOST) {
            if let Some(authority) = parts.uri.authority() {
                if let Ok(v) = http::HeaderValue::from_str(authority.as_str()) {
                    headers.insert(header::HOST, v);
                }
            }
        }
    }
    let bridged = bridged.body(body).map_err(|e| e.to_string())?;

    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let conn = Conn {
        client,
        tls: true,
        watches_cuts: false,
    };
    let limits = proxy.limits;
    tokio::spawn(async move {
        let service = service_fn(move |mut req| {
            let proxy = proxy.clone();
            *req.version_mut() = Version::HTTP_3;
            async move {
                let mut req = req.map(RequestBody::stream);
                Ok::<_, Infallible>(*handle(&proxy, &mut req, conn).await)
            }
        });
        let _ = super::http1_builder(&limits)
            .serve_connection(TokioIo::new(server_io), service)
            .await;
    });
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(client_io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let response = sender
        .send_request(bridged)
        .await
        .map_err(|e| e.to_string())?;

    let (mut parts, mut body) = response.into_parts();
    for h in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        http::HeaderName::from_static("keep-alive"),
    ] {
        parts.headers.remove(h);
    }
    parts.version = Version::HTTP_3;
    send.send_response(Response::from_parts(parts, ()))
        .await
        .map_err(|e| e.to_string())?;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        match frame.into_data() {
            Ok(data) => send.send_data(data).await.map_err(|e| e.to_string())?,
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    send.send_trailers(trailers)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
        }
    }
    send.finish().await.map_err(|e| e.to_string())
}

/// A `Stream` over an mpsc receiver (tokio-stream's wrapper, without the dependency).
fn tokio_stream_from<T>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send + Sync + 'static
where
    T: Send + Sync + 'static,
{
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
