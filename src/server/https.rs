//! The HTTPS listener: TLS (rustls on aws-lc-rs) with the certificate chosen by SNI, ALPN
//! `h2`, `http/1.1` and `acme-tls/1`, then HTTP/1.1 or HTTP/2 (with upgrades) into the same
//! request pipeline as the HTTP port.

use http::{HeaderValue, header};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::LazyConfigAcceptor;
use tokio_util::sync::CancellationToken;

use super::certificates::{TlsResolver, offers_acme_tls, prepare};
use super::{FirstRequest, Proxy, Shutdown, accept_loop, handle, normalize};
use crate::service::Conn;
use crate::tls::challenge::ACME_TLS_ALPN;

/// A client gets this long to send its ClientHello, and again to finish the handshake
/// once its certificate is ready (obtaining one has its own limit).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub fn server_config(resolver: Arc<TlsResolver>) -> Arc<rustls::ServerConfig> {
    let mut config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|_| rustls::ServerConfig::builder())
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), ACME_TLS_ALPN.to_vec()];
    Arc::new(config)
}

/// What every HTTPS connection shares.
pub struct Https {
    pub proxy: Arc<Proxy>,
    pub config: Arc<rustls::ServerConfig>,
    /// `Alt-Svc` advertising HTTP/3, when it is served.
    pub alt_svc: Option<HeaderValue>,
    http: hyper_util::server::conn::auto::Builder<TokioExecutor>,
}

impl Https {
    pub fn new(
        proxy: Arc<Proxy>,
        config: Arc<rustls::ServerConfig>,
        alt_svc: Option<HeaderValue>,
    ) -> Arc<Https> {
        let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        http.http1().timer(TokioTimer::new());
        http.http2().timer(TokioTimer::new());
        Arc::new(Https {
            proxy,
            config,
            alt_svc,
            http,
        })
    }
}

pub async fn serve_https(listener: TcpListener, https: Arc<Https>, shutdown: Arc<Shutdown>) {
    accept_loop(listener, shutdown, move |stream, client, draining| {
        serve_connection(stream, client, https.clone(), draining)
    })
    .await
}

/// Go's check for plain HTTP on a TLS port (a TLS record starts with 0x16).
fn looks_like_http(first: &[u8]) -> bool {
    const STARTS: [&[u8]; 5] = [b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO"];
    first.first() != Some(&0x16) && STARTS.iter().any(|s| first.len() >= 5 && first == *s)
}

/// What Go's net/http answers to plain HTTP sent to an HTTPS port.
async fn answer_plain_http(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt;
    let _ = stream
        .write_all(
            b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n",
        )
        .await;
    let _ = stream.shutdown().await;
}

async fn serve_connection(
    stream: TcpStream,
    client: SocketAddr,
    https: Arc<Https>,
    draining: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let mut first = [0u8; 5];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 => {
            if looks_like_http(&first[..n]) {
                answer_plain_http(stream).await;
                return;
            }
        }
        _ => return,
    }
    let acceptor = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    let start = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor).await {
        Ok(Ok(start)) => start,
        Ok(Err(e)) => {
            tracing::debug!(client = %client, error = %e, "TLS handshake error");
            return;
        }
        Err(_) => return,
    };
    let hello = start.client_hello();
    if !offers_acme_tls(&hello) {
        let sni = hello.server_name().map(str::to_string);
        prepare(&https.proxy.router, sni.as_deref()).await;
    }
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, start.into_stream(https.config.clone()))
        .await
    {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(client = %client, error = %e, "TLS handshake error");
            return;
        }
        Err(_) => return,
    };
    if tls.get_ref().1.alpn_protocol() == Some(ACME_TLS_ALPN) {
        // A TLS-ALPN-01 validation: the handshake was the answer.
        return;
    }
    let conn = Conn {
        client: normalize(client),
        tls: true,
    };
    let shared = https.clone();
    let first = Arc::new(FirstRequest::default());
    let seen = first.clone();
    let service = service_fn(move |req| {
        seen.mark();
        let https = shared.clone();
        async move {
            let mut response = handle(&https.proxy, req, conn).await;
            if let Some(alt_svc) = &https.alt_svc {
                if !response.headers().contains_key(header::ALT_SVC) {
                    response
                        .headers_mut()
                        .insert(header::ALT_SVC, alt_svc.clone());
                }
            }
            Ok::<_, Infallible>(response)
        }
    });
    let connection = https
        .http
        .serve_connection_with_upgrades(TokioIo::new(tls), service);
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        r = connection.as_mut() => r,
        _ = draining.cancelled() => {
            tokio::select! {
                r = connection.as_mut() => r,
                _ = first.wait() => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "Connection error");
    }
}
