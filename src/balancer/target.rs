//! One upstream address: its health, the requests in flight to it, and draining.

use arc_swap::ArcSwap;
use http::uri::Authority;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Health {
    /// Not verified yet: a failure keeps it here rather than flapping.
    Adding = 0,
    Healthy = 1,
    Unhealthy = 2,
}

impl Health {
    fn from_u8(v: u8) -> Health {
        match v {
            1 => Health::Healthy,
            2 => Health::Unhealthy,
            _ => Health::Adding,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Health::Adding => "adding",
            Health::Healthy => "healthy",
            Health::Unhealthy => "unhealthy",
        }
    }
}

/// Cancellation handles for one drain cycle. Replaced after every drain so a paused and
/// resumed service starts with fresh ones.
struct DrainTokens {
    /// Cancelled when a drain times out: in-flight requests answer 504.
    requests: CancellationToken,
    /// Cancelled as soon as a drain starts: upgraded connections (WebSockets) are cut at
    /// once, as upstream does, because they would otherwise hold every drain to its limit.
    upgrades: CancellationToken,
}

impl DrainTokens {
    fn new() -> Arc<Self> {
        Arc::new(DrainTokens {
            requests: CancellationToken::new(),
            upgrades: CancellationToken::new(),
        })
    }
}

pub struct Target {
    address: Arc<str>,
    authority: Authority,
    health: AtomicU8,
    inflight: AtomicUsize,
    idle: Notify,
    tokens: ArcSwap<DrainTokens>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("address", &self.address)
            .finish()
    }
}

impl Target {
    /// `address` has already passed `validate_target`; a missing port means 80.
    pub fn new(address: &str) -> Result<Arc<Target>, String> {
        let with_port = if address.contains(':') {
            address.to_string()
        } else {
            format!("{address}:80")
        };
        let authority: Authority = with_port
            .parse()
            .map_err(|_| format!("{address} :invalid host pattern"))?;
        Ok(Arc::new(Target {
            address: Arc::from(address),
            authority,
            health: AtomicU8::new(Health::Adding as u8),
            inflight: AtomicUsize::new(0),
            idle: Notify::new(),
            tokens: ArcSwap::new(DrainTokens::new()),
        }))
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// The address as a shared string, for the access log (no copy per request).
    pub fn shared_address(&self) -> Arc<str> {
        self.address.clone()
    }

    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    pub fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::Acquire))
    }

    /// Returns the previous state.
    pub fn set_health(&self, h: Health) -> Health {
        Health::from_u8(self.health.swap(h as u8, Ordering::AcqRel))
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }

    /// Counts a request against this target until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> TargetGuard {
        self.inflight.fetch_add(1, Ordering::AcqRel);
        let tokens = self.tokens.load_full();
        TargetGuard {
            target: self.clone(),
            tokens,
        }
    }

    /// Waits up to `timeout` for in-flight requests to finish, then cancels the rest.
    pub async fn drain(&self, timeout: Duration) {
        let tokens = self.tokens.load_full();
        tokens.upgrades.cancel();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.inflight() == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                if self.inflight() > 0 {
                    tokens.requests.cancel();
                }
                break;
            }
        }
        self.tokens.store(DrainTokens::new());
    }
}

/// Held for as long as a request (or its upgraded connection) uses the target.
pub struct TargetGuard {
    target: Arc<Target>,
    tokens: Arc<DrainTokens>,
}

impl TargetGuard {
    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// Resolves when a drain gives up waiting for this request.
    pub async fn cancelled(&self) {
        self.tokens.requests.cancelled().await
    }

    pub fn is_cancelled(&self) -> bool {
        self.tokens.requests.is_cancelled()
    }

    /// Resolves when a drain starts: upgraded connections end at once.
    pub async fn upgrade_cancelled(&self) {
        self.tokens.upgrades.cancelled().await
    }
}

impl Drop for TargetGuard {
    fn drop(&mut self) {
        if self.target.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.target.idle.notify_waiters();
        }
    }
}

/// Upstream's target syntax: a word character followed by at least one of word, `-`, `_`,
/// `.`, `+`, then an optional `:port`. IPv6 literals, schemes and paths are refused.
pub fn validate_target(addr: &str) -> Result<(), String> {
    let (host, port) = match addr.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (addr, None),
    };
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut chars = host.chars();
    let ok_host = match chars.next() {
        Some(first) if word(first) => {
            let rest: Vec<char> = chars.collect();
            !rest.is_empty()
                && rest
                    .iter()
                    .all(|&c| word(c) || matches!(c, '-' | '.' | '+'))
        }
        _ => false,
    };
    let ok_port = port.is_none_or(|p| {
        !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) && p.parse::<u16>().is_ok()
    });
    if ok_host && ok_port {
        Ok(())
    } else {
        Err(format!("{addr} :invalid host pattern"))
    }
}

/// The container a target names, for scale-to-zero: its host part, unless that is an
/// address rather than a name.
pub fn container_ref(target: &str) -> Result<&str, String> {
    let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
    if host.is_empty() || host.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!(
            "target {target} is an address, not a container; name the container with --sleep-container"
        ));
    }
    Ok(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_syntax() {
        for ok in [
            "web-1",
            "web-1:3000",
            "localhost:80",
            "127.0.0.1:8080",
            "abc123def456:80",
        ] {
            assert!(validate_target(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "_",
            "/",
            "a",
            "http://x:80",
            "[::1]:80",
            "x:port",
            "x:99999",
            "a/b",
        ] {
            assert_eq!(
                validate_target(bad).unwrap_err(),
                format!("{bad} :invalid host pattern")
            );
        }
    }

    #[test]
    fn container_refs() {
        assert_eq!(container_ref("web-1:3000").unwrap(), "web-1");
        assert_eq!(container_ref("abc123def456:80").unwrap(), "abc123def456");
        assert!(
            container_ref("10.0.0.5:3000")
                .unwrap_err()
                .contains("--sleep-container")
        );
        assert!(container_ref("127.0.0.1:80").is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn drain_waits_then_cancels() {
        let t = Target::new("app:3000").unwrap();
        let g = t.begin();
        assert_eq!(t.inflight(), 1);
        let started = tokio::time::Instant::now();
        t.drain(Duration::from_secs(5)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert!(g.is_cancelled());
        drop(g);
        assert_eq!(t.inflight(), 0);
        // A fresh cycle after the drain.
        assert!(!t.begin().is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn drain_returns_when_requests_finish() {
        let t = Target::new("app").unwrap();
        assert_eq!(t.authority().as_str(), "app:80");
        let g = t.begin();
        let t2 = t.clone();
        let started = tokio::time::Instant::now();
        let d = tokio::spawn(async move { t2.drain(Duration::from_secs(30)).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(g);
        d.await.unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }
}
