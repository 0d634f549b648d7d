//! Pending ACME challenges, shared by every ACME manager in the process: HTTP-01 key
//! authorizations (answered on the HTTP port, before routing and logging) and TLS-ALPN-01
//! certificates (returned by the resolver when a client offers `acme-tls/1`).
//!
//! Written only while an order is in flight; read only for challenge paths and for
//! `acme-tls/1` handshakes, so a plain lock is fine here.

use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

pub const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

#[derive(Default)]
pub struct ChallengeStore {
    /// token → (domain, key authorization)
    http01: RwLock<HashMap<String, (String, String)>>,
    /// domain → challenge certificate
    tls_alpn01: RwLock<HashMap<String, Arc<CertifiedKey>>>,
}

impl ChallengeStore {
    pub fn put_http01(&self, token: &str, domain: &str, key_authorization: &str) {
        if let Ok(mut m) = self.http01.write() {
            m.insert(
                token.to_string(),
                (domain.to_string(), key_authorization.to_string()),
            );
        }
    }

    pub fn remove_http01(&self, token: &str) {
        if let Ok(mut m) = self.http01.write() {
            m.remove(token);
        }
    }

    /// The key authorization for a token, when it was issued for this host.
    pub fn http01(&self, token: &str, host: &str) -> Option<String> {
        let m = self.http01.read().ok()?;
        let (domain, key_auth) = m.get(token)?;
        let host = host.trim_end_matches('.');
        domain.eq_ignore_ascii_case(host).then(|| key_auth.clone())
    }

    pub fn put_tls_alpn01(&self, domain: &str, cert: Arc<CertifiedKey>) {
        if let Ok(mut m) = self.tls_alpn01.write() {
            m.insert(domain.to_ascii_lowercase(), cert);
        }
    }

    pub fn remove_tls_alpn01(&self, domain: &str) {
        if let Ok(mut m) = self.tls_alpn01.write() {
            m.remove(&domain.to_ascii_lowercase());
        }
    }

    pub fn tls_alpn01(&self, domain: &str) -> Option<Arc<CertifiedKey>> {
        self.tls_alpn01
            .read()
            .ok()?
            .get(&domain.to_ascii_lowercase())
            .cloned()
    }
}

/// The TLS-ALPN-01 certificate (RFC 8737): self-signed for the domain, with the
/// `acmeIdentifier` extension carrying the SHA-256 of the key authorization.
pub fn tls_alpn01_cert(domain: &str, key_auth_digest: &[u8]) -> Result<Arc<CertifiedKey>, String> {
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params =
        rcgen::CertificateParams::new(vec![domain.to_string()]).map_err(|e| e.to_string())?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(key_auth_digest)];
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let der = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let signing =
        rustls::crypto::aws_lc_rs::sign::any_supported_type(&der).map_err(|e| e.to_string())?;
    Ok(Arc::new(CertifiedKey::new(
        vec![cert.der().clone()],
        signing,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http01_tokens_are_bound_to_their_domain() {
        let s = ChallengeStore::default();
        s.put_http01("tok", "app.test", "tok.thumb");
        assert_eq!(s.http01("tok", "app.test").as_deref(), Some("tok.thumb"));
        assert_eq!(s.http01("tok", "APP.test.").as_deref(), Some("tok.thumb"));
        assert_eq!(s.http01("tok", "other.test"), None);
        assert_eq!(s.http01("nope", "app.test"), None);
        s.remove_http01("tok");
        assert_eq!(s.http01("tok", "app.test"), None);
    }
}
