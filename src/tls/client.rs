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
use std::collections::HashSet;
use std::sync::OnceLock;

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

/// The roots this process trusts: the system's (as rustls-native-certs finds them), the
/// first system bundle Go would read, and `SSL_CERT_FILE`.
fn root_store() -> rustls::RootCertStore {
    let native = rustls_native_certs::load_native_certs().certs;
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
    let from_files = files
        .into_iter()
        .flat_map(|f| match CertificateDer::pem_file_iter(&f) {
            Ok(iter) => iter.flatten().collect(),
            Err(e) => {
                tracing::warn!(path = %f, error = %e, "Unable to read CA certificates");
                Vec::new()
            }
        });
    distinct_roots(native.into_iter().chain(from_files))
}

/// A store of `certs`, each once: the same bundle is usually found by two or three of
/// [`root_store`]'s sources, and the store kept every copy (0.1 MiB each).
fn distinct_roots(
    certs: impl IntoIterator<Item = CertificateDer<'static>>,
) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    let mut seen = HashSet::new();
    for cert in certs {
        if seen.insert(cert.clone()) {
            let _ = roots.add(cert);
        }
    }
    roots
}

/// The outbound TLS settings, made on first use (an ACME order, an on-demand check) and
/// then shared: the roots parsed take about 0.1 MiB, which a proxy that never asks an
/// ACME server anything should not hold, and which every client shares (a clone of the
/// settings shares their verifier).
fn client_config() -> rustls::ClientConfig {
    static CONFIG: OnceLock<rustls::ClientConfig> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            rustls::ClientConfig::builder_with_provider(super::provider())
                .with_safe_default_protocol_versions()
                .unwrap_or_else(|_| rustls::ClientConfig::builder())
                .with_root_certificates(root_store())
                .with_no_client_auth()
        })
        .clone()
}

fn connector() -> HttpsConnector<HttpConnector> {
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_config())
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .build()
}

pub fn acme_http() -> AcmeHttp {
    Client::builder(TokioExecutor::new()).build(connector())
}

pub fn probe_http() -> ProbeHttp {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4)
        .build(connector())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(name: &str) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn a_root_found_by_several_sources_is_kept_once() {
        let (a, b) = (ca("root a"), ca("root b"));
        let roots = distinct_roots([a.clone(), b.clone(), a.clone(), b, a]);
        assert_eq!(roots.len(), 2);
    }
}
