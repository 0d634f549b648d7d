//! A TLS client over a socket the test controls (so it can send bytes before the
//! ClientHello, such as a PROXY protocol header), and an HTTP/2 client on top of it that
//! sees the connection's own end: a GOAWAY, a reset stream.

use bytes::Bytes;
use rustls::client::{Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls_pki_types::ServerName;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A store trusting only the certificate `pem`.
fn roots(pem: &str) -> rustls::RootCertStore {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM"))
        .expect("root");
    roots
}

/// A TLS handshake on `tcp` for `sni`, trusting only `pem`, offering `alpn`.
pub async fn handshake(
    tcp: TcpStream,
    pem: &str,
    sni: &str,
    alpn: &[&[u8]],
) -> TlsStream<TcpStream> {
    let roots = roots(pem);
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = rustls_pki_types::ServerName::try_from(sni.to_string()).expect("server name");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake")
}

/// The cipher suite a TLS handshake with `port` on loopback settles on, for a client that
/// offers `suites` in this order of preference over `version` (trusting only `pem`).
pub async fn negotiated_suite(
    port: u16,
    pem: &str,
    sni: &str,
    suites: &[rustls::SupportedCipherSuite],
    version: &'static rustls::SupportedProtocolVersion,
) -> rustls::CipherSuite {
    let roots = roots(pem);
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites = suites.to_vec();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[version])
        .expect("protocol version")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from(sni.to_string()).expect("server name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    tls.get_ref()
        .1
        .negotiated_cipher_suite()
        .expect("a suite once the handshake is over")
        .suite()
}

/// A client's store of TLS sessions that counts the TLS 1.3 tickets servers send it.
#[derive(Debug)]
pub struct CountingSessions {
    inner: rustls::client::ClientSessionMemoryCache,
    tickets: std::sync::atomic::AtomicUsize,
}

impl Default for CountingSessions {
    fn default() -> Self {
        CountingSessions {
            inner: rustls::client::ClientSessionMemoryCache::new(32),
            tickets: Default::default(),
        }
    }
}

impl CountingSessions {
    /// Tickets received so far, over every connection that used this store.
    pub fn tickets(&self) -> usize {
        self.tickets.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl rustls::client::ClientSessionStore for CountingSessions {
    fn set_kx_hint(&self, name: ServerName<'static>, group: rustls::NamedGroup) {
        self.inner.set_kx_hint(name, group)
    }
    fn kx_hint(&self, name: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner.kx_hint(name)
    }
    fn set_tls12_session(&self, name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.inner.set_tls12_session(name, value)
    }
    fn tls12_session(&self, name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.inner.tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.inner.remove_tls12_session(name)
    }
    fn insert_tls13_ticket(&self, name: ServerName<'static>, value: Tls13ClientSessionValue) {
        self.tickets
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.insert_tls13_ticket(name, value)
    }
    fn take_tls13_ticket(&self, name: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        self.inner.take_tls13_ticket(name)
    }
}

/// A TLS 1.3 client trusting only `pem` that keeps its sessions in `sessions`. One
/// config for all the connections that should resume: rustls resumes a session only
/// with the certificate verifier that made it.
pub fn resuming_client(pem: &str, sessions: Arc<CountingSessions>) -> Arc<rustls::ClientConfig> {
    let roots = roots(pem);
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::store(sessions);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// One `GET /` over a new TLS connection to `port` on loopback (SNI and `Host` `sni`) made
/// with `config`: the kind of handshake it took, and the whole response (read to its end,
/// so the tickets the server sent after the handshake have been stored).
pub async fn get_over_tls(
    port: u16,
    config: Arc<rustls::ClientConfig>,
    sni: &str,
) -> (rustls::HandshakeKind, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let name = ServerName::try_from(sni.to_string()).expect("server name");
    let mut tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .expect("TLS handshake");
    let kind = tls.get_ref().1.handshake_kind().expect("handshake over");
    let request = format!("GET / HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    // The server's close may come without TLS's close_notify: what was read is the answer.
    let _ = tls.read_to_end(&mut response).await;
    (kind, String::from_utf8_lossy(&response).into_owned())
}

/// An HTTP/2 connection over TLS to `port` on loopback (SNI `sni`, ALPN `h2`), and the
/// task driving it, which ends when the server closes the connection.
pub async fn h2(
    port: u16,
    pem: &str,
    sni: &str,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    h2_over(handshake(tcp, pem, sni, &[b"h2"]).await).await
}

/// HTTP/2 over an established TLS connection.
pub async fn h2_over(
    tls: TlsStream<TcpStream>,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let (send, connection) = h2::client::handshake(tls).await.expect("h2 handshake");
    (send, tokio::spawn(connection))
}

/// Whether an HTTP/2 connection's end is the server closing it after a graceful GOAWAY.
/// On a loaded machine the client may still be writing (a PING or SETTINGS ack) when the
/// server closes: its write meets a closed socket (broken pipe) or its unread frame
/// turns the server's FIN into a reset.
pub fn closed_by_server(ended: &Result<(), h2::Error>) -> bool {
    match ended {
        Ok(()) => true,
        Err(e) => {
            e.is_go_away() && e.reason() == Some(h2::Reason::NO_ERROR)
                || e.get_io().is_some_and(|io| {
                    matches!(
                        io.kind(),
                        std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::BrokenPipe
                            | std::io::ErrorKind::UnexpectedEof
                    )
                })
        }
    }
}
