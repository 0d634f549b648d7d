//! The outbound HTTPS client used to talk to the ACME server and to external on-demand
//! endpoints. It trusts what a Go program on the same host trusts: the system roots plus
//! the file named by `SSL_CERT_FILE` (how tests and private CAs are trusted).

use bytes::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

pub type AcmeHttp = Client<HttpsConnector<HttpConnector>, instant_acme::BodyWrapper<Bytes>>;
pub type ProbeHttp = Client<HttpsConnector<HttpConnector>, http_body_util::Empty<Bytes>>;

/// Where Go looks for the system bundle on Linux, first found wins.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

pub fn root_store() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for cert in native.certs {
        let _ = roots.add(cert);
    }
    let mut files: Vec<String> = Vec::new();
    if let Some(bundle) = SYSTEM_BUNDLES
        .iter()
        .find(|p| std::path::Path::new(p).is_file())
    {
        files.push(bundle.to_string());
    }
    if let Some(f) = std::env::var_os("SSL_CERT_FILE").filter(|v| !v.is_empty()) {
        files.push(f.to_string_lossy().into_owned());
    }
    for f in files {
        match CertificateDer::pem_file_iter(&f) {
            Ok(iter) => {
                for cert in iter.flatten() {
                    let _ = roots.add(cert);
                }
            }
            Err(e) => tracing::warn!(path = %f, error = %e, "Unable to read CA certificates"),
        }
    }
    roots
}

fn connector(roots: rustls::RootCertStore) -> HttpsConnector<HttpConnector> {
    let config = rustls::ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|_| rustls::ClientConfig::builder())
        .with_root_certificates(roots)
        .with_no_client_auth();
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .build()
}

pub fn acme_http(roots: rustls::RootCertStore) -> AcmeHttp {
    Client::builder(TokioExecutor::new()).build(connector(roots))
}

pub fn probe_http(roots: rustls::RootCertStore) -> ProbeHttp {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4)
        .build(connector(roots))
}
