//! A TLS client over a socket the test controls (so it can send bytes before the
//! ClientHello, such as a PROXY protocol header), and an HTTP/2 client on top of it that
//! sees the connection's own end: a GOAWAY, a reset stream.

use bytes::Bytes;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A TLS handshake on `tcp` for `sni`, trusting only `pem`, offering `alpn`.
pub async fn handshake(
    tcp: TcpStream,
    pem: &str,
    sni: &str,
    alpn: &[&[u8]],
) -> TlsStream<TcpStream> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM"))
        .expect("root");
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
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("PEM"))
        .expect("root");
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
