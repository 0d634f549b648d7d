//! A certificate ready to serve: the rustls key and chain plus what renewal and cache
//! checks need to know about the leaf (validity window, names).

use rustls::crypto::aws_lc_rs::sign::any_supported_type;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub struct ServedCert {
    pub key: Arc<CertifiedKey>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub names: Vec<String>,
}

impl ServedCert {
    pub fn new(
        key: PrivateKeyDer<'static>,
        chain: Vec<CertificateDer<'static>>,
    ) -> Result<Self, String> {
        let leaf = chain.first().ok_or("empty certificate chain")?;
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| format!("unable to parse certificate: {e}"))?;
        let validity = parsed.validity();
        let to_time = |t: &x509_parser::time::ASN1Time| {
            let secs = t.timestamp();
            if secs >= 0 {
                UNIX_EPOCH + Duration::from_secs(secs as u64)
            } else {
                UNIX_EPOCH
            }
        };
        let mut names = Vec::new();
        if let Ok(Some(san)) = parsed.subject_alternative_name() {
            for n in &san.value.general_names {
                if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                    names.push(d.to_ascii_lowercase());
                }
            }
        }
        if names.is_empty() {
            for cn in parsed.subject().iter_common_name() {
                if let Ok(s) = cn.as_str() {
                    names.push(s.to_ascii_lowercase());
                }
            }
        }
        let not_before = to_time(&validity.not_before);
        let not_after = to_time(&validity.not_after);
        let signing_key =
            any_supported_type(&key).map_err(|e| format!("unsupported private key: {e}"))?;
        let certified = CertifiedKey::new(chain, signing_key);
        certified
            .keys_match()
            .map_err(|e| format!("private key does not match certificate: {e}"))?;
        Ok(ServedCert {
            key: Arc::new(certified),
            not_before,
            not_after,
            names,
        })
    }

    /// Whether the leaf names this host (exactly, or through a one-label wildcard).
    pub fn covers(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.names.iter().any(|n| {
            n == &host
                || n.strip_prefix("*.").is_some_and(|suffix| {
                    host.split_once('.').is_some_and(|(_, rest)| rest == suffix)
                })
        })
    }

    pub fn expired(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }

    /// When to renew: 30 days before expiry as autocert, or once two thirds of the
    /// lifetime have passed, whichever is earlier, so short-lived certificates (6-day
    /// Let's Encrypt, test CAs) are renewed in time too.
    pub fn renew_at(&self) -> SystemTime {
        let lifetime = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        let before = Duration::from_secs(30 * 24 * 3600).min(lifetime / 3);
        self.not_after
            .checked_sub(before)
            .unwrap_or(self.not_before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(names: &[&str]) -> ServedCert {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.self_signed(&key).unwrap();
        ServedCert::new(
            PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            vec![cert.der().clone()],
        )
        .unwrap()
    }

    #[test]
    fn names_and_renewal_window() {
        let c = self_signed(&["a.test", "*.b.test"]);
        assert!(c.covers("a.test"));
        assert!(c.covers("A.TEST"));
        assert!(c.covers("x.b.test"));
        assert!(!c.covers("x.y.b.test"));
        assert!(!c.covers("b.test"));
        assert!(c.renew_at() < c.not_after);
        assert!(c.renew_at() > c.not_before);
    }

    #[test]
    fn mismatched_key_is_refused() {
        let a = rcgen::KeyPair::generate().unwrap();
        let b = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a.test".to_string()])
            .unwrap()
            .self_signed(&a)
            .unwrap();
        let r = ServedCert::new(
            PrivateKeyDer::Pkcs8(b.serialize_der().into()),
            vec![cert.der().clone()],
        );
        assert!(r.is_err());
    }
}
