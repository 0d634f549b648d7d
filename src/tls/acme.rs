//! An autocert-like certificate manager on instant-acme: certificates are obtained on the
//! first handshake for a host (single flight per host), kept in memory behind an
//! `ArcSwap` map the resolver reads without locks, written to the on-disk cache in Go
//! autocert's layout, reloaded from it after a restart, and renewed in the background
//! ahead of expiry while the old certificate keeps serving. Failures are logged with
//! their reason and retried with backoff.
//!
//! One manager per cache directory (cache path + directory URL); the host policy belongs
//! to the service (see `source.rs`) and is checked before a manager is asked.

use arc_swap::ArcSwap;
use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Identifier, NewAccount, NewOrder, OrderStatus,
    RetryPolicy,
};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use super::AcmeSettings;
use super::cache::{ACCOUNT_KEY_FILE, DirCache, split_entry};
use super::cert::ServedCert;
use super::challenge::{ChallengeStore, tls_alpn01_cert};

/// How long one issuance may take in all (account, order, validation, download).
const ISSUE_TIMEOUT: Duration = Duration::from_secs(90);
const BACKOFF_FIRST: Duration = Duration::from_secs(60);
const BACKOFF_MAX: Duration = Duration::from_secs(3600);

struct Failure {
    count: u32,
    retry_at: tokio::time::Instant,
    error: String,
}

pub struct AcmeManager {
    directory: String,
    cache: DirCache,
    settings: Arc<AcmeSettings>,
    challenges: Arc<ChallengeStore>,
    certs: ArcSwap<HashMap<String, Arc<ServedCert>>>,
    account: tokio::sync::Mutex<Option<Account>>,
    inflight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    failures: Mutex<HashMap<String, Failure>>,
    renewing: Mutex<HashSet<String>>,
    /// Decides whether a host is still served with this manager; renewal stops otherwise.
    still_wanted: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

impl AcmeManager {
    pub fn new(
        directory: String,
        cache: DirCache,
        settings: Arc<AcmeSettings>,
        challenges: Arc<ChallengeStore>,
        still_wanted: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    ) -> Arc<AcmeManager> {
        Arc::new(AcmeManager {
            directory,
            cache,
            settings,
            challenges,
            certs: ArcSwap::from_pointee(HashMap::new()),
            account: tokio::sync::Mutex::new(None),
            inflight: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            renewing: Mutex::new(HashSet::new()),
            still_wanted,
        })
    }

    pub fn directory(&self) -> &str {
        &self.directory
    }

    pub fn cache(&self) -> &DirCache {
        &self.cache
    }

    /// The resolver's lookup: lock-free, never touches the disk or the network.
    pub fn cached(&self, host: &str) -> Option<Arc<CertifiedKey>> {
        let certs = self.certs.load();
        let c = certs.get(host)?;
        (!c.expired(SystemTime::now())).then(|| c.key.clone())
    }

    /// Whether a certificate exists for the host in memory or in the cache directory
    /// (on-demand TLS skips its check for those, as upstream).
    pub fn has_certificate(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.certs.load().contains_key(host)
            || self.cache.contains(host)
            || self.cache.contains(&format!("{host}+rsa"))
    }

    /// Makes sure a valid certificate for `host` is in memory: from memory, else from the
    /// disk cache, else from the CA. Concurrent callers for one host share one attempt.
    pub async fn ensure(self: &Arc<Self>, host: &str) -> Result<(), String> {
        if self.cached(host).is_some() {
            return Ok(());
        }
        let gate = {
            let mut inflight = self.inflight.lock().map_err(|_| "lock poisoned")?;
            inflight.entry(host.to_string()).or_default().clone()
        };
        let _turn = gate.lock().await;
        if self.cached(host).is_some() {
            return Ok(());
        }
        if let Some(cert) = self.load_cached(host) {
            self.install(host, cert);
            return Ok(());
        }
        if let Some(error) = self.backing_off(host) {
            return Err(error);
        }
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(ISSUE_TIMEOUT, self.issue(host)).await {
            Ok(Ok((cert, challenge))) => {
                tracing::info!(host = %host, challenge = %challenge, duration = started.elapsed().as_nanos() as u64, expires_in = secs_until(cert.not_after), "Obtained certificate");
                self.clear_failure(host);
                self.install(host, cert);
                Ok(())
            }
            Ok(Err(e)) => Err(self.record_failure(host, e)),
            Err(_) => Err(self.record_failure(host, "timed out obtaining certificate".into())),
        }
    }

    /// Loads certificates already in the cache for these hosts, so renewal is scheduled
    /// even before the first handshake after a restart.
    pub fn preload(self: &Arc<Self>, hosts: &[String]) {
        for host in hosts {
            if self.certs.load().contains_key(host.as_str()) {
                continue;
            }
            if let Some(cert) = self.load_cached(host) {
                self.install(host, cert);
            }
        }
    }

    fn load_cached(&self, host: &str) -> Option<ServedCert> {
        let data = self.cache.get(host)?;
        let (key, chain) = split_entry(&data)?;
        let cert = match ServedCert::new(key, chain) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(host = %host, error = %e, "Ignoring unusable cached certificate");
                return None;
            }
        };
        if cert.expired(SystemTime::now()) || !cert.covers(host) {
            return None;
        }
        Some(cert)
    }

    fn install(self: &Arc<Self>, host: &str, cert: ServedCert) {
        let cert = Arc::new(cert);
        self.certs.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.insert(host.to_string(), cert.clone());
            m
        });
        self.schedule_renewal(host);
    }

    fn forget(&self, host: &str) {
        self.certs.rcu(|m| {
            let mut m = HashMap::clone(m);
            m.remove(host);
            m
        });
    }

    fn schedule_renewal(self: &Arc<Self>, host: &str) {
        let Ok(mut renewing) = self.renewing.lock() else {
            return;
        };
        if !renewing.insert(host.to_string()) {
            return;
        }
        let weak = Arc::downgrade(self);
        let host = host.to_string();
        tokio::spawn(renewal_loop(weak, host));
    }

    fn backing_off(&self, host: &str) -> Option<String> {
        let failures = self.failures.lock().ok()?;
        let f = failures.get(host)?;
        (tokio::time::Instant::now() < f.retry_at).then(|| f.error.clone())
    }

    fn record_failure(&self, host: &str, error: String) -> String {
        let delay = if let Ok(mut failures) = self.failures.lock() {
            let f = failures.entry(host.to_string()).or_insert(Failure {
                count: 0,
                retry_at: tokio::time::Instant::now(),
                error: String::new(),
            });
            f.count += 1;
            let delay = backoff(f.count);
            f.retry_at = tokio::time::Instant::now() + delay;
            f.error = error.clone();
            delay
        } else {
            BACKOFF_FIRST
        };
        tracing::error!(host = %host, error = %error, retry_in = %crate::gotime::format_duration(delay.as_nanos() as i64), "Unable to obtain certificate");
        error
    }

    fn clear_failure(&self, host: &str) {
        if let Ok(mut failures) = self.failures.lock() {
            failures.remove(host);
        }
    }

    async fn account(&self) -> Result<Account, String> {
        let mut slot = self.account.lock().await;
        if let Some(a) = slot.as_ref() {
            return Ok(a.clone());
        }
        let builder = || Account::builder_with_http(Box::new(self.settings.http().clone()));
        let account = match self.cache.get(ACCOUNT_KEY_FILE) {
            Some(pem) => {
                let pkcs8 = account_key_pkcs8(&pem)?;
                let key = instant_acme::Key::from_pkcs8_der(PrivatePkcs8KeyDer::from(
                    pkcs8.secret_pkcs8_der().to_vec(),
                ))
                .map_err(|e| format!("invalid ACME account key: {e}"))?;
                let (account, _) = builder()
                    .create_from_key((key, PrivateKeyDer::Pkcs8(pkcs8)), self.directory.clone())
                    .await
                    .map_err(|e| format!("ACME account: {e}"))?;
                account
            }
            None => {
                let contact = self.settings.email.as_ref().map(|e| format!("mailto:{e}"));
                let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
                let (account, credentials) = builder()
                    .create(
                        &NewAccount {
                            contact: &contacts,
                            terms_of_service_agreed: true,
                            only_return_existing: false,
                        },
                        self.directory.clone(),
                        None,
                    )
                    .await
                    .map_err(|e| format!("ACME account registration: {e}"))?;
                let pem = pem_encode("PRIVATE KEY", credentials.private_key().secret_pkcs8_der());
                if let Err(e) = self.cache.put(ACCOUNT_KEY_FILE, pem.as_bytes()) {
                    tracing::warn!(error = %e, "Unable to cache ACME account key");
                }
                account
            }
        };
        *slot = Some(account.clone());
        Ok(account)
    }

    /// One issuance: autocert's order of challenges (TLS-ALPN-01, then HTTP-01), a new
    /// order for the next type when one fails validation.
    async fn issue(&self, host: &str) -> Result<(ServedCert, &'static str), String> {
        let account = self.account().await?;
        let mut last_error = String::new();
        for kind in [ChallengeType::TlsAlpn01, ChallengeType::Http01] {
            match self.try_order(&account, host, kind.clone()).await {
                Ok(cert) => return Ok((cert, challenge_name(&kind))),
                Err(OrderError::Fatal(e)) => return Err(e),
                Err(OrderError::ChallengeFailed(e)) => {
                    tracing::warn!(host = %host, challenge = challenge_name(&kind), error = %e, "ACME challenge failed");
                    last_error = e;
                }
            }
        }
        Err(last_error)
    }

    async fn try_order(
        &self,
        account: &Account,
        host: &str,
        kind: ChallengeType,
    ) -> Result<ServedCert, OrderError> {
        let identifiers = [Identifier::Dns(host.to_string())];
        let mut order = account
            .new_order(&NewOrder::new(&identifiers))
            .await
            .map_err(|e| OrderError::Fatal(format!("new order: {e}")))?;
        let mut cleanup = Cleanup {
            store: &self.challenges,
            tokens: Vec::new(),
            alpn_domains: Vec::new(),
        };
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.map_err(|e| OrderError::Fatal(format!("authorization: {e}")))?;
            match authz.status {
                AuthorizationStatus::Valid => continue,
                AuthorizationStatus::Pending => {}
                other => {
                    return Err(OrderError::Fatal(format!("authorization is {other:?}")));
                }
            }
            let Some(mut challenge) = authz.challenge(kind.clone()) else {
                return Err(OrderError::ChallengeFailed(format!(
                    "{} not offered",
                    challenge_name(&kind)
                )));
            };
            let key_auth = challenge.key_authorization();
            match kind {
                ChallengeType::Http01 => {
                    self.challenges
                        .put_http01(&challenge.token, host, key_auth.as_str());
                    cleanup.tokens.push(challenge.token.clone());
                }
                _ => {
                    let cert = tls_alpn01_cert(host, key_auth.digest().as_ref())
                        .map_err(OrderError::Fatal)?;
                    self.challenges.put_tls_alpn01(host, cert);
                    cleanup.alpn_domains.push(host.to_string());
                }
            }
            challenge
                .set_ready()
                .await
                .map_err(|e| OrderError::ChallengeFailed(e.to_string()))?;
        }
        let retry = RetryPolicy::new()
            .initial_delay(Duration::from_millis(100))
            .backoff(1.5)
            .timeout(Duration::from_secs(60));
        let status = order
            .poll_ready(&retry)
            .await
            .map_err(|e| OrderError::ChallengeFailed(e.to_string()))?;
        if status != OrderStatus::Ready {
            return Err(OrderError::ChallengeFailed(order_problem(&mut order).await));
        }
        drop(cleanup);

        let key = rcgen::KeyPair::generate().map_err(|e| OrderError::Fatal(e.to_string()))?;
        let mut params = rcgen::CertificateParams::new(vec![host.to_string()])
            .map_err(|e| OrderError::Fatal(e.to_string()))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        let csr = params
            .serialize_request(&key)
            .map_err(|e| OrderError::Fatal(e.to_string()))?;
        order
            .finalize_csr(csr.der())
            .await
            .map_err(|e| OrderError::Fatal(format!("finalize: {e}")))?;
        let chain_pem = order
            .poll_certificate(&retry)
            .await
            .map_err(|e| OrderError::Fatal(format!("certificate: {e}")))?;
        let entry = format!("{}{}", key.serialize_pem(), chain_pem);
        let (key_der, chain) = split_entry(entry.as_bytes())
            .ok_or_else(|| OrderError::Fatal("CA returned no certificate".into()))?;
        let cert = ServedCert::new(key_der, chain).map_err(OrderError::Fatal)?;
        if let Err(e) = self.cache.put(host, entry.as_bytes()) {
            tracing::error!(host = %host, error = %e, "Unable to cache certificate");
        }
        Ok(cert)
    }
}

enum OrderError {
    /// Validation of this challenge type failed: another type may still work.
    ChallengeFailed(String),
    Fatal(String),
}

/// Removes the challenge answers of an order once it is over, however it ended.
struct Cleanup<'a> {
    store: &'a ChallengeStore,
    tokens: Vec<String>,
    alpn_domains: Vec<String>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for t in &self.tokens {
            self.store.remove_http01(t);
        }
        for d in &self.alpn_domains {
            self.store.remove_tls_alpn01(d);
        }
    }
}

/// The CA's reason for an invalid order, from its authorizations' challenge errors.
async fn order_problem(order: &mut instant_acme::Order) -> String {
    let mut reasons = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authz)) = authorizations.next().await {
        if let Ok(state) = authz.refresh().await {
            for c in &state.challenges {
                if let Some(p) = &c.error {
                    reasons.push(p.to_string());
                }
            }
        }
    }
    if reasons.is_empty() {
        "order is invalid".into()
    } else {
        reasons.join("; ")
    }
}

fn challenge_name(kind: &ChallengeType) -> &'static str {
    match kind {
        ChallengeType::Http01 => "http-01",
        ChallengeType::TlsAlpn01 => "tls-alpn-01",
        ChallengeType::Dns01 => "dns-01",
        _ => "other",
    }
}

fn backoff(count: u32) -> Duration {
    let factor = 1u32 << count.saturating_sub(1).min(10);
    (BACKOFF_FIRST * factor).min(BACKOFF_MAX)
}

/// Renews a host's certificate ahead of expiry for as long as the host is served. The
/// current certificate keeps serving until the new one is installed.
async fn renewal_loop(manager: Weak<AcmeManager>, host: String) {
    loop {
        let wait = {
            let Some(m) = manager.upgrade() else { return };
            let Some(cert) = m.certs.load().get(&host).cloned() else {
                let _ = m.renewing.lock().map(|mut r| r.remove(&host));
                return;
            };
            cert.renew_at()
                .duration_since(SystemTime::now())
                .unwrap_or_default()
        };
        tokio::time::sleep(wait).await;
        let Some(m) = manager.upgrade() else { return };
        if !(m.still_wanted)(&host) {
            tracing::info!(host = %host, "Certificate no longer used; not renewing");
            m.forget(&host);
            let _ = m.renewing.lock().map(|mut r| r.remove(&host));
            return;
        }
        let started = tokio::time::Instant::now();
        let result = match tokio::time::timeout(ISSUE_TIMEOUT, m.issue(&host)).await {
            Ok(r) => r,
            Err(_) => Err("timed out renewing certificate".into()),
        };
        match result {
            Ok((cert, challenge)) => {
                tracing::info!(host = %host, challenge = %challenge, duration = started.elapsed().as_nanos() as u64, expires_in = secs_until(cert.not_after), "Renewed certificate");
                m.clear_failure(&host);
                let cert = Arc::new(cert);
                m.certs.rcu(|map| {
                    let mut map = HashMap::clone(map);
                    map.insert(host.clone(), cert.clone());
                    map
                });
            }
            Err(e) => {
                m.record_failure(&host, e);
                let delay = m
                    .failures
                    .lock()
                    .ok()
                    .and_then(|f| f.get(&host).map(|f| f.count))
                    .map(backoff)
                    .unwrap_or(BACKOFF_FIRST);
                drop(m);
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// The account key as PKCS#8, whether the cache holds PKCS#8 or (as Go writes it) SEC1.
fn account_key_pkcs8(pem: &[u8]) -> Result<PrivatePkcs8KeyDer<'static>, String> {
    use rustls_pki_types::pem::PemObject;
    let key = PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| format!("unreadable ACME account key: {e}"))?;
    match key {
        PrivateKeyDer::Pkcs8(k) => Ok(k),
        PrivateKeyDer::Sec1(k) => {
            let pair = aws_lc_rs::signature::EcdsaKeyPair::from_private_key_der(
                &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                k.secret_sec1_der(),
            )
            .map_err(|e| format!("unsupported ACME account key: {e}"))?;
            let doc = pair
                .to_pkcs8v1()
                .map_err(|_| "unsupported ACME account key".to_string())?;
            Ok(PrivatePkcs8KeyDer::from(doc.as_ref().to_vec()))
        }
        _ => Err("unsupported ACME account key type".into()),
    }
}

pub fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn secs_until(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::now())
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_an_hour() {
        assert_eq!(backoff(1), Duration::from_secs(60));
        assert_eq!(backoff(2), Duration::from_secs(120));
        assert_eq!(backoff(7), Duration::from_secs(3600));
        assert_eq!(backoff(40), Duration::from_secs(3600));
    }

    #[test]
    fn account_keys_load_from_sec1_and_pkcs8() {
        let key = rcgen::KeyPair::generate().unwrap();
        let pkcs8 = account_key_pkcs8(key.serialize_pem().as_bytes()).unwrap();
        assert_eq!(pkcs8.secret_pkcs8_der(), key.serialize_der().as_slice());
        // Go writes `EC PRIVATE KEY` (SEC1): the same key, re-encoded.
        let pair = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &key.serialize_der(),
        )
        .unwrap();
        use aws_lc_rs::encoding::{AsDer, EcPrivateKeyRfc5915Der};
        let sec1: EcPrivateKeyRfc5915Der = pair.private_key().as_der().unwrap();
        let pem = pem_encode("EC PRIVATE KEY", sec1.as_ref());
        assert!(account_key_pkcs8(pem.as_bytes()).is_ok());
    }
}
