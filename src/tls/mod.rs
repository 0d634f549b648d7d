//! TLS certificates: where each service's come from (custom files, ACME with HTTP-01 and
//! TLS-ALPN-01, on-demand TLS). The listeners that use them live in `server`.
//!
//! A service's certificate source is built at deploy (and restore) and travels in its
//! `ServiceConfig`, so SNI → service → certificate is a lookup in the published route
//! table: no lock on the handshake path. Anything slow (reading the cache, asking an
//! on-demand endpoint, talking to the CA) happens in `server::certificates::prepare`, after the
//! ClientHello is read and before the handshake continues.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

pub mod acme;
pub mod cache;
pub mod cert;
pub mod challenge;
pub mod client;
pub mod on_demand;
pub mod static_cert;

use acme::AcmeManager;
use cache::DirCache;
use cert::ServedCert;
use challenge::ChallengeStore;

/// Process-wide ACME settings (`run --acme-directory`, `--acme-email`) and the client.
pub struct AcmeSettings {
    /// Used when a service names no directory (no `--tls-staging`).
    pub default_directory: String,
    /// The account contact, if any.
    pub email: Option<String>,
    /// The certificate cache of services that name none: `certs/` in the server's data
    /// directory (`run --data-dir`, fork F31).
    pub cache_dir: PathBuf,
    /// Made on the first ACME request ([`AcmeSettings::http`]).
    http: OnceLock<client::AcmeHttp>,
}

impl AcmeSettings {
    /// The HTTPS client that talks to ACME servers.
    pub fn http(&self) -> &client::AcmeHttp {
        self.http.get_or_init(client::acme_http)
    }

    /// Where a service's certificates are cached. The CLI names the default cache as
    /// upstream's does (`$HOME/.config/kamal-proxy/certs`, so a Go proxy reading the state
    /// file back finds it); the server's data directory (`run --data-dir`) decides where
    /// that default really is.
    pub fn cache_path(&self, requested: &str) -> PathBuf {
        if requested.is_empty()
            || std::path::Path::new(requested) == crate::config::default_acme_cache_path()
        {
            self.cache_dir.clone()
        } else {
            PathBuf::from(requested)
        }
    }
}

/// What a TLS service asks of certificates (its `--tls-*`, `--acme-*` and `--host` flags).
pub struct CertRequest<'a> {
    pub hosts: &'a [String],
    /// A custom certificate, when set; ACME otherwise.
    pub certificate_path: &'a str,
    pub private_key_path: &'a str,
    /// The service's ACME directory; empty for the process-wide one.
    pub acme_directory: &'a str,
    /// Empty for the default cache under the data directory.
    pub acme_cache_path: &'a str,
    /// `--tls-on-demand-url`: certificates for hosts the endpoint allows.
    pub on_demand_url: &'a str,
}

/// Where a TLS service's certificates come from.
pub enum CertSource {
    Static(Arc<ServedCert>),
    Acme {
        manager: Arc<AcmeManager>,
        /// Lower-cased `--host` values; empty with an on-demand URL.
        hosts: HashSet<String>,
        on_demand: Option<on_demand::OnDemand>,
    },
}

impl CertSource {
    /// Whether this source may hand out (or obtain) a certificate for `name` without
    /// asking anyone.
    pub fn lists(&self, name: &str) -> bool {
        match self {
            CertSource::Static(_) => true,
            CertSource::Acme { hosts, .. } => hosts.contains(name),
        }
    }
}

pub struct TlsContext {
    pub settings: Arc<AcmeSettings>,
    pub challenges: Arc<ChallengeStore>,
    /// Made on the first on-demand check ([`TlsContext::probe`]).
    probe: OnceLock<client::ProbeHttp>,
    managers: Mutex<HashMap<DirCache, Arc<AcmeManager>>>,
    still_wanted: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

impl TlsContext {
    pub fn new(
        default_directory: String,
        email: Option<String>,
        cache_dir: PathBuf,
        still_wanted: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> Arc<TlsContext> {
        Arc::new(TlsContext {
            settings: Arc::new(AcmeSettings {
                default_directory,
                email,
                cache_dir,
                http: OnceLock::new(),
            }),
            challenges: Arc::new(ChallengeStore::default()),
            probe: OnceLock::new(),
            managers: Mutex::new(HashMap::new()),
            still_wanted,
        })
    }

    /// The HTTPS client that asks `--tls-on-demand-url` endpoints.
    pub fn probe(&self) -> &client::ProbeHttp {
        self.probe.get_or_init(client::probe_http)
    }

    /// The certificate source a TLS service asks for, with upstream's deploy errors.
    pub fn source_for(&self, req: &CertRequest<'_>) -> Result<Arc<CertSource>, String> {
        if !req.certificate_path.is_empty() {
            let cert = static_cert::load(
                std::path::Path::new(req.certificate_path),
                std::path::Path::new(req.private_key_path),
            )
            .map_err(|e| {
                tracing::error!(error = %e, "Unable to load certificate");
                "unable to load certificate".to_string()
            })?;
            return Ok(Arc::new(CertSource::Static(Arc::new(cert))));
        }
        if req.hosts.iter().any(|h| h.contains('*')) {
            return Err("automatic TLS does not support wildcards".into());
        }
        let directory = if req.acme_directory.is_empty() {
            self.settings.default_directory.clone()
        } else {
            req.acme_directory.to_string()
        };
        let cache_path = self.settings.cache_path(req.acme_cache_path);
        let cache = DirCache::new(&cache_path, &directory);
        let manager = self.manager(cache, directory);
        let hosts: HashSet<String> = req
            .hosts
            .iter()
            .filter(|h| !h.is_empty())
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let listed: Vec<String> = hosts.iter().cloned().collect();
        manager.preload(&listed);
        let on_demand =
            (!req.on_demand_url.is_empty()).then(|| on_demand::OnDemand::new(req.on_demand_url));
        Ok(Arc::new(CertSource::Acme {
            manager,
            hosts,
            on_demand,
        }))
    }

    /// One manager per cache directory, shared by the services that use it and kept
    /// across redeploys (certificates in memory, issuance in flight, renewal timers).
    fn manager(&self, cache: DirCache, directory: String) -> Arc<AcmeManager> {
        let mut managers = match self.managers.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        managers
            .entry(cache.clone())
            .or_insert_with(|| {
                AcmeManager::new(
                    directory,
                    cache,
                    self.settings.clone(),
                    self.challenges.clone(),
                    self.still_wanted.clone(),
                )
            })
            .clone()
    }
}

/// aws-lc-rs, named explicitly: with dev-dependencies a second provider can be compiled
/// in, and rustls then refuses to pick one implicitly. Its cipher suites are listed in Go's
/// order of preference (`crypto/tls`, which upstream serves with): AES-128-GCM before
/// AES-256-GCM before ChaCha20-Poly1305. The listeners choose by this order, not the
/// client's (`ignore_client_order`, as Go does), so a TLS 1.3 handshake's key schedule
/// hashes with SHA-256, which x86-64 and arm64 CPUs compute with instructions of their
/// own, rather than SHA-384: about a fifth of a new handshake's CPU time went to SHA-384's
/// HMACs when OpenSSL clients (which list AES-256 first) had their way (bench/README.md).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    with_suites(AES_FIRST.to_vec())
}

/// As [`provider`], ChaCha20-Poly1305 first: Go's order for a client that lists it before
/// AES-GCM (see [`prefers_chacha`]).
pub fn provider_chacha_first() -> Arc<rustls::crypto::CryptoProvider> {
    let (chacha, aes): (Vec<_>, Vec<_>) = AES_FIRST.iter().partition(|s| is_chacha(s.suite()));
    with_suites(chacha.into_iter().chain(aes).collect())
}

/// Whether a client's suites, in its order of preference, name ChaCha20-Poly1305 before
/// AES-GCM: a device without AES instructions, for which Go (`aesgcmPreferred`) puts
/// ChaCha20 first. Suites we do not serve are skipped.
pub fn prefers_chacha(offered: &[rustls::CipherSuite]) -> bool {
    offered
        .iter()
        .find(|offered| AES_FIRST.iter().any(|ours| ours.suite() == **offered))
        .is_some_and(|first| is_chacha(*first))
}

/// Go's order (`cipherSuitesPreferenceOrder`, `defaultCipherSuitesTLS13`), of the suites
/// aws-lc-rs offers.
const AES_FIRST: [rustls::SupportedCipherSuite; 9] = {
    use rustls::crypto::aws_lc_rs::cipher_suite as suite;
    [
        suite::TLS13_AES_128_GCM_SHA256,
        suite::TLS13_AES_256_GCM_SHA384,
        suite::TLS13_CHACHA20_POLY1305_SHA256,
        suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        suite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ]
};

fn is_chacha(suite: rustls::CipherSuite) -> bool {
    use rustls::CipherSuite as S;
    matches!(
        suite,
        S::TLS13_CHACHA20_POLY1305_SHA256
            | S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            | S::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
    )
}

fn with_suites(
    cipher_suites: Vec<rustls::SupportedCipherSuite>,
) -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::CryptoProvider {
        cipher_suites,
        ..rustls::crypto::aws_lc_rs::default_provider()
    })
}

/// Names autocert accepts: at least one dot, no path separators.
pub fn acme_name_ok(name: &str) -> bool {
    let name = name.trim_end_matches('.');
    name.contains('.') && !name.contains(['/', '\\']) && !name.starts_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chacha20_is_preferred_only_when_the_client_lists_it_before_aes_gcm() {
        use rustls::CipherSuite as S;
        // Suites we do not serve (CBC, a GREASE value) are skipped, as Go skips unknown ones.
        let chacha_first = [
            S::Unknown(0x0a0a),
            S::TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,
            S::TLS13_CHACHA20_POLY1305_SHA256,
            S::TLS13_AES_128_GCM_SHA256,
        ];
        assert!(prefers_chacha(&chacha_first));
        let aes_first = [
            S::TLS13_AES_256_GCM_SHA384,
            S::TLS13_CHACHA20_POLY1305_SHA256,
        ];
        assert!(!prefers_chacha(&aes_first));
        assert!(!prefers_chacha(&[S::TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA]));
        assert!(!prefers_chacha(&[]));
        // The ChaCha-first provider keeps every suite, ChaCha20's first.
        let suites: Vec<_> = provider_chacha_first()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(suites.len(), provider().cipher_suites.len());
        assert!(suites[..3].iter().all(|s| is_chacha(*s)));
        assert_eq!(suites[3], S::TLS13_AES_128_GCM_SHA256);
    }

    #[test]
    fn the_default_cache_is_under_the_server_s_data_dir_and_an_explicit_one_is_kept() {
        let tls = TlsContext::new(
            cache::LETS_ENCRYPT_PRODUCTION.into(),
            None,
            PathBuf::from("/srv/proxy-data/certs"),
            Arc::new(|_: &str| true),
        );
        let settings = &tls.settings;
        assert_eq!(
            settings.cache_path(""),
            PathBuf::from("/srv/proxy-data/certs")
        );
        let cli_default = crate::config::default_acme_cache_path();
        if !cli_default.as_os_str().is_empty() {
            assert_eq!(
                settings.cache_path(&cli_default.display().to_string()),
                PathBuf::from("/srv/proxy-data/certs")
            );
        }
        assert_eq!(
            settings.cache_path("/var/certs"),
            PathBuf::from("/var/certs")
        );
    }
}
