//! TLS: the HTTPS listener, certificate selection by SNI, ACME (HTTP-01 and TLS-ALPN-01),
//! custom certificates, on-demand TLS and HTTP/3.
//!
//! A service's certificate source is built at deploy (and restore) and travels in its
//! `ServiceConfig`, so SNI → service → certificate is a lookup in the published route
//! table: no lock on the handshake path. Anything slow (reading the cache, asking an
//! on-demand endpoint, talking to the CA) happens in [`resolver::prepare`], after the
//! ClientHello is read and before the handshake continues.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub mod acme;
pub mod cache;
pub mod cert;
pub mod challenge;
pub mod client;
#[cfg(feature = "http3")]
pub mod h3;
pub mod http01;
pub mod listener;
pub mod on_demand;
pub mod resolver;
pub mod static_cert;

use crate::service::options::ServiceOptions;
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
    pub http: client::AcmeHttp,
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
    fn lists(&self, name: &str) -> bool {
        match self {
            CertSource::Static(_) => true,
            CertSource::Acme { hosts, .. } => hosts.contains(name),
        }
    }
}

pub struct TlsContext {
    pub settings: Arc<AcmeSettings>,
    pub challenges: Arc<ChallengeStore>,
    pub probe: client::ProbeHttp,
    managers: Mutex<HashMap<DirCache, Arc<AcmeManager>>>,
    still_wanted: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

impl TlsContext {
    pub fn new(
        default_directory: String,
        email: Option<String>,
        still_wanted: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> Arc<TlsContext> {
        let roots = client::root_store();
        Arc::new(TlsContext {
            settings: Arc::new(AcmeSettings {
                default_directory,
                email,
                http: client::acme_http(roots.clone()),
            }),
            challenges: Arc::new(ChallengeStore::default()),
            probe: client::probe_http(roots),
            managers: Mutex::new(HashMap::new()),
            still_wanted,
        })
    }

    /// The certificate source a service's options ask for, with upstream's deploy errors.
    pub fn source_for(&self, o: &ServiceOptions) -> Result<Option<Arc<CertSource>>, String> {
        // Path-prefix services only inherit TLS from the root service of their host, which
        // answers the handshake; they have no certificates of their own (as upstream).
        if !o.tls_enabled || !o.serves_root() {
            return Ok(None);
        }
        if !o.tls_certificate_path.is_empty() {
            let cert = static_cert::load(
                std::path::Path::new(&o.tls_certificate_path),
                std::path::Path::new(&o.tls_private_key_path),
            )
            .map_err(|e| {
                tracing::error!(error = %e, "Unable to load certificate");
                "unable to load certificate".to_string()
            })?;
            return Ok(Some(Arc::new(CertSource::Static(Arc::new(cert)))));
        }
        if o.hosts.iter().any(|h| h.contains('*')) {
            return Err("automatic TLS does not support wildcards".into());
        }
        let directory = if o.acme_directory.is_empty() {
            self.settings.default_directory.clone()
        } else {
            o.acme_directory.clone()
        };
        let cache_path = if o.acme_cache_path.is_empty() {
            crate::config::default_acme_cache_path()
        } else {
            PathBuf::from(&o.acme_cache_path)
        };
        let cache = DirCache::new(&cache_path, &directory);
        let manager = self.manager(cache, directory);
        let hosts: HashSet<String> = o
            .hosts
            .iter()
            .filter(|h| !h.is_empty())
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let listed: Vec<String> = hosts.iter().cloned().collect();
        manager.preload(&listed);
        let on_demand = (!o.tls_on_demand_url.is_empty())
            .then(|| on_demand::OnDemand::new(&o.tls_on_demand_url));
        Ok(Some(Arc::new(CertSource::Acme {
            manager,
            hosts,
            on_demand,
        })))
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
/// in, and rustls then refuses to pick one implicitly.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Names autocert accepts: at least one dot, no path separators.
pub fn acme_name_ok(name: &str) -> bool {
    let name = name.trim_end_matches('.');
    name.contains('.') && !name.contains(['/', '\\']) && !name.starts_with('.')
}
