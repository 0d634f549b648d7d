//! Certificate selection by SNI (upstream §5.1): the name (or the default TLS hostname
//! when a client sends none) is looked up like a request host at path `/`; no service,
//! or one without TLS, fails the handshake. `acme-tls/1` handshakes get the pending
//! TLS-ALPN-01 certificate.
//!
//! [`resolve`](TlsResolver::resolve) runs inside rustls and must not block: it only reads
//! the route table and in-memory maps. [`prepare`] runs first, async, and does anything
//! slow, so that by the time rustls asks, the certificate is in memory.

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::sync::Arc;

use crate::router::Router;
use crate::tls::challenge::ACME_TLS_ALPN;
use crate::tls::{CertSource, acme_name_ok};

pub struct TlsResolver {
    router: Arc<Router>,
}

impl std::fmt::Debug for TlsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsResolver")
    }
}

impl TlsResolver {
    pub fn new(router: Arc<Router>) -> TlsResolver {
        TlsResolver { router }
    }
}

pub fn offers_acme_tls(hello: &ClientHello<'_>) -> bool {
    hello
        .alpn()
        .is_some_and(|mut protocols| protocols.any(|p| p == ACME_TLS_ALPN))
}

/// The name to select a certificate for: the SNI, lower-cased, or the default TLS
/// hostname when the client sent none.
fn server_name(router: &Router, sni: Option<&str>) -> Option<String> {
    match sni {
        Some(n) => Some(n.trim_end_matches('.').to_ascii_lowercase()),
        None => router.default_tls_hostname(),
    }
}

impl ResolvesServerCert for TlsResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = server_name(&self.router, hello.server_name())?;
        if offers_acme_tls(&hello) {
            return self.router.tls().challenges.tls_alpn01(&name);
        }
        let (service, _) = self.router.lookup(&name, "/")?;
        let config = service.config();
        if !config.options.tls_enabled {
            return None;
        }
        match config.tls.as_deref()? {
            CertSource::Static(cert) => Some(cert.key.clone()),
            source @ CertSource::Acme {
                manager, on_demand, ..
            } => {
                if on_demand.is_none() && !source.lists(&name) {
                    return None;
                }
                manager.cached(&name)
            }
        }
    }
}

/// Gets the certificate for a handshake ready before rustls resolves it: loads it from
/// the cache or obtains it (asking the on-demand endpoint first where configured).
/// Failures are logged; the handshake then fails in `resolve`.
pub async fn prepare(router: &Router, sni: Option<&str>) {
    let Some(name) = server_name(router, sni) else {
        return;
    };
    if sni.is_none() {
        tracing::warn!(host = %name, "No server name; using default TLS hostname");
    }
    let Some((service, _)) = router.lookup(&name, "/") else {
        return;
    };
    let config = service.config();
    if !config.options.tls_enabled {
        return;
    }
    let Some(source) = config.tls.as_deref() else {
        return;
    };
    let CertSource::Acme {
        manager, on_demand, ..
    } = source
    else {
        return;
    };
    if manager.cached(&name).is_some() {
        return;
    }
    if !acme_name_ok(&name) {
        tracing::debug!(host = %name, "Server name not eligible for ACME");
        return;
    }
    match on_demand {
        None if !source.lists(&name) => return,
        None => {}
        Some(check) if !manager.has_certificate(&name) => {
            // Never wakes a sleeping service: validation refuses on-demand with
            // --sleep-after. A paused or stopped service has no target to ask.
            let local_target = || {
                service
                    .pause
                    .is_running()
                    .then(|| service.active().select(true))
                    .flatten()
                    .map(|t| t.address().to_string())
            };
            if let Err(e) = check
                .check(&name, &local_target, router.tls().probe())
                .await
            {
                tracing::info!(host = %name, error = %e, "TLS handshake refused");
                return;
            }
        }
        Some(_) => {}
    }
    // Issue detached from this connection: a client that gives up does not abandon an
    // order halfway, and the next handshake finds the certificate.
    let manager = manager.clone();
    let task = tokio::spawn(async move { manager.ensure(&name).await });
    let _ = task.await;
}
