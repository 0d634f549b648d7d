//! What TLS needs from the router: the process-wide ACME settings, the host a handshake
//! without SNI is answered for, whether a host still wants its ACME certificate, and
//! upstream's rule that path-prefix services take their TLS settings from the host's
//! root service.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Router;
use super::table::RouteTable;
use crate::service::{Service, ServiceConfig};
use crate::tls::{CertSource, TlsContext};

impl Router {
    /// Sets the process-wide ACME settings; call once, before `restore`.
    pub fn configure_tls(
        self: &Arc<Self>,
        acme_directory: String,
        acme_email: Option<String>,
        cache_dir: std::path::PathBuf,
    ) {
        let weak = Arc::downgrade(self);
        let still_wanted =
            Arc::new(move |host: &str| weak.upgrade().is_some_and(|r| r.serves_acme_host(host)));
        let _ = self.tls.set(TlsContext::new(
            acme_directory,
            acme_email,
            cache_dir,
            still_wanted,
        ));
    }

    pub fn tls(&self) -> &Arc<TlsContext> {
        self.tls.get_or_init(|| {
            TlsContext::new(
                crate::tls::cache::LETS_ENCRYPT_PRODUCTION.into(),
                None,
                crate::config::default_acme_cache_path(),
                Arc::new(|_: &str| true),
            )
        })
    }

    /// Whether a host is still served with an ACME certificate (renewal goes on only then).
    fn serves_acme_host(&self, host: &str) -> bool {
        let Some((service, _)) = self.lookup(host, "/") else {
            return false;
        };
        let config = service.config();
        match config.tls.as_deref() {
            Some(CertSource::Acme {
                hosts, on_demand, ..
            }) => config.options.tls_enabled && (on_demand.is_some() || hosts.contains(host)),
            _ => false,
        }
    }

    /// Used for handshakes without SNI: the first host of a TLS service that lists hosts
    /// (the first such service by name, so the choice is stable).
    pub fn default_tls_hostname(&self) -> Option<String> {
        let table = self.table.load();
        let mut candidates: Vec<(Arc<str>, String)> = table
            .all_services()
            .into_iter()
            .filter_map(|s| {
                let config = s.config();
                let o = &config.options;
                let first = o.hosts.first().filter(|h| !h.is_empty())?;
                (o.tls_enabled && o.tls_on_demand_url.is_empty() && o.serves_root())
                    .then(|| (s.name.clone(), first.clone()))
            })
            .collect();
        candidates.sort();
        candidates.into_iter().next().map(|(_, host)| host)
    }
}

/// Upstream §3.4: a service that does not serve `/` takes its TLS settings from the
/// root-path service of its first host (or the defaults when there is none), so a
/// path-prefix service under a TLS host is redirected and served over HTTPS alike.
pub(super) fn inherit_tls_settings(table: &RouteTable, services: &BTreeMap<String, Arc<Service>>) {
    for service in services.values() {
        let config = service.config();
        if config.options.serves_root() {
            continue;
        }
        let first = config.options.hosts.first().map_or("", String::as_str);
        let (tls, redirect) = table
            .service_for_host(first)
            .filter(|root| root.config().options.serves_root())
            .map_or((false, true), |root| {
                let o = &root.config().options;
                (o.tls_enabled, o.tls_redirect)
            });
        if config.options.tls_enabled != tls || config.options.tls_redirect != redirect {
            let mut updated = ServiceConfig::clone(&config);
            updated.deployed_tls = updated.deployed_tls.or(Some((
                config.options.tls_enabled,
                config.options.tls_redirect,
            )));
            updated.options.tls_enabled = tls;
            updated.options.tls_redirect = redirect;
            service.set_config(updated);
        }
    }
}
