//! The access gates ahead of the sleep gate (ARCHITECTURE.md step 6): IP allow list (403)
//! → TLS mismatch (503) → redirects (TLS, canonical host, `--redirect`) → rate limit (429)
//! → basic auth (401). Everything here is decided without touching the service's
//! containers, so a blocked, throttled, unauthenticated or redirected request can never
//! start one (denial of wallet).
//!
//! Options are compiled at deploy into [`Gates`] (address lists, regexes, the credential);
//! the request path does no parsing, and a service without gates pays for a few `None`
//! and empty-list checks only. The health-check path (GET/HEAD) stays open through the
//! allow list, the rate limit and basic auth, so a load balancer can watch a protected
//! service drain.

use http::Request;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub mod allow_list;
pub mod basic_auth;
pub mod client_ip;
pub mod deadline;
pub mod rate_limit;
pub mod redirect;
pub mod rewrite;
pub mod rules;

use crate::options::{ServiceOptions, TargetOptions};
use crate::proxy::rejection::Rejection;
use crate::service::Conn;
use allow_list::AllowList;
use basic_auth::{BasicAuth, Credential};
use client_ip::{ClientResolver, IpList};
use rate_limit::RateLimit;
use rules::{Kind, RuleSet};

/// A service's gates, compiled from its options.
#[derive(Default)]
pub struct Gates {
    resolver: ClientResolver,
    allow: Option<AllowList>,
    redirects: RuleSet,
    pub rewrites: RuleSet,
    rate_limit: Option<RateLimit>,
    basic_auth: Option<BasicAuth>,
    pub request_timeout: Option<Duration>,
    /// Denials and throttles are logged at most ten at once, then one per ten seconds.
    log: LogThrottle,
}

impl Gates {
    /// Compiles validated options. Stored options that no longer parse (a hand-edited
    /// state file) fail closed: an unreadable allow list or credential denies everyone,
    /// an unreadable rate-limit exemption or proxy list limits everyone by the connecting
    /// address. Unreadable redirect or rewrite rules fail the restore, as the fork.
    pub fn compile(service: &str, o: &ServiceOptions) -> Result<Gates, String> {
        let trusted = IpList::parse(&o.trusted_proxies, "trusted-proxy");
        let resolver = match &trusted {
            Ok(t) => ClientResolver::new(t.clone(), &o.client_ip_header),
            Err(_) => ClientResolver::default(),
        };
        let allow = (!o.allow_ips.is_empty()).then(|| {
            match (IpList::parse(&o.allow_ips, "allow-ip"), trusted.as_ref()) {
                (Ok(list), Ok(t)) => {
                    if !list.has_ipv6() {
                        tracing::warn!(service, "allow-ip lists no IPv6 ranges; clients reaching the proxy over IPv6 will be denied");
                    }
                    if !t.is_empty() && !t.has_ipv6() {
                        tracing::warn!(service, "trusted-proxy lists no IPv6 ranges; requests arriving over IPv6 will be matched on the connecting address instead of the forwarded one");
                    }
                    AllowList::new(list)
                }
                (Err(e), _) => {
                    tracing::error!(service, error = %e, "Unable to read the stored allow list; denying every request to this service");
                    AllowList::deny_all()
                }
                (_, Err(e)) => {
                    tracing::error!(service, error = %e, "Unable to read the stored allow list; denying every request to this service");
                    AllowList::deny_all()
                }
            }
        });
        let rate_limit = (o.rate_limit > 0.0 && o.rate_limit.is_finite()).then(|| {
            let burst = u32::try_from(o.rate_limit_burst.max(0)).unwrap_or(u32::MAX);
            let exempt = IpList::parse(&o.rate_limit_exempt, "rate-limit-exempt");
            match exempt.and_then(|e| trusted.clone().map(|_| e)) {
                Ok(exempt) => RateLimit::new(o.rate_limit, burst, exempt),
                Err(e) => {
                    tracing::error!(service, error = %e, "Unable to read the stored rate limit settings; counting every client by its connecting address, with no exemptions");
                    RateLimit::new(o.rate_limit, burst, IpList::default())
                }
            }
        });
        let basic_auth = (!o.basic_auth.is_empty()).then(|| match Credential::parse(&o.basic_auth) {
            Ok(c) => {
                if !o.tls_enabled {
                    tracing::warn!(service, "Basic auth is enabled without TLS: credentials will cross the wire in cleartext");
                } else if !o.tls_redirect {
                    tracing::warn!(service, "Basic auth is enabled with TLS redirection off: plaintext requests will be challenged in the clear");
                }
                BasicAuth::new(c)
            }
            Err(e) => {
                tracing::error!(service, error = %e, "Unable to read the stored basic auth credential; denying every request to this service");
                BasicAuth::deny_all()
            }
        });
        // A rate limiter with a broken proxy list must not trust the header either.
        let resolver = if trusted.is_err() {
            ClientResolver::default()
        } else {
            resolver
        };
        Ok(Gates {
            resolver,
            allow,
            redirects: RuleSet::parse(&o.redirects, Kind::Redirect)?,
            rewrites: RuleSet::parse(&o.rewrites, Kind::Rewrite)?,
            rate_limit,
            basic_auth,
            request_timeout: (o.request_timeout.is_positive()).then(|| o.request_timeout.to_std()),
            log: LogThrottle::default(),
        })
    }

    /// Runs the gates in order: a refusal (403, 503, 3xx, 429 or 401) or `Ok` to let the
    /// request on to the pause and sleep gates. The `Authorization` header is always
    /// removed when basic auth is on.
    pub fn check<B>(
        &self,
        service: &str,
        req: &mut Request<B>,
        conn: Conn,
        o: &ServiceOptions,
        is_health_check: bool,
    ) -> Result<(), Rejection> {
        let needs_client = !is_health_check && (self.allow.is_some() || self.rate_limit.is_some());
        let client = needs_client
            .then(|| self.resolver.resolve(conn.client.ip(), req.headers()))
            .flatten();

        if let Some(allow) = self.allow.as_ref().filter(|_| !is_health_check) {
            if !allow.permits(client) {
                self.log_denied(
                    service,
                    "Denied by allow-ip",
                    conn,
                    client,
                    req.uri().path(),
                );
                return Err(Rejection::Forbidden);
            }
        }
        if conn.tls && !o.tls_enabled {
            return Err(Rejection::TlsNotEnabled);
        }
        if let Some((status, location)) = redirect::location(req, o, &self.redirects, conn.tls) {
            return Err(Rejection::Redirect { status, location });
        }
        if let Some(limit) = self.rate_limit.as_ref().filter(|_| !is_health_check) {
            if !limit.allow(client) {
                self.log_denied(service, "Rate limited", conn, client, req.uri().path());
                return Err(Rejection::RateLimited {
                    retry_after_secs: limit.retry_after_secs(),
                });
            }
        }
        if let Some(auth) = &self.basic_auth {
            let ok = auth.take_and_check(req.headers_mut());
            if !ok && !is_health_check {
                return Err(Rejection::Unauthorized);
            }
        }
        Ok(())
    }

    fn log_denied(&self, service: &str, msg: &str, conn: Conn, client: Option<IpAddr>, path: &str) {
        if !self.log.take() {
            return;
        }
        let client_addr = client.map(|a| a.to_string()).unwrap_or_default();
        let reason = if client.is_some() {
            "address not allowed or over budget"
        } else {
            "could not determine a client address"
        };
        tracing::warn!(service, peer = %conn.client, client_addr = %client_addr, reason, path, "{msg}");
    }
}

/// Validation of the gate options, shared by the CLI and the server (through
/// `ServiceOptions::validate`). Messages are the fork's.
pub fn validate(o: &ServiceOptions) -> Result<(), String> {
    // Allow list and trusted proxies.
    if !o.trusted_proxies.is_empty() && o.allow_ips.is_empty() && o.rate_limit <= 0.0 {
        return Err("trusted-proxy requires allow-ip or rate-limit".into());
    }
    if !o.allow_ips.is_empty() && !o.client_ip_header.is_empty() && o.trusted_proxies.is_empty() {
        return Err("allow-ip with client-ip-header requires trusted-proxy, or the header would be ignored while appearing to be honored".into());
    }
    IpList::parse(&o.allow_ips, "allow-ip")?;
    let trusted = IpList::parse(&o.trusted_proxies, "trusted-proxy")?;
    if let Some(net) = trusted.nets().iter().find(|n| n.prefix_len() == 0) {
        return Err(format!(
            "trusted-proxy cannot contain a default route ({net})"
        ));
    }
    // Rate limit.
    if o.rate_limit.is_nan() || o.rate_limit.is_infinite() {
        return Err("rate-limit must be a finite number".into());
    }
    if o.rate_limit < 0.0 {
        return Err("rate-limit cannot be negative".into());
    }
    if o.rate_limit == 0.0 {
        if o.rate_limit_burst != 0 {
            return Err("rate-limit-burst requires rate-limit".into());
        }
        if !o.rate_limit_exempt.is_empty() {
            return Err("rate-limit-exempt requires rate-limit".into());
        }
    } else {
        if o.rate_limit_burst < 0 {
            return Err("rate-limit-burst cannot be negative".into());
        }
        if o.rate_limit_burst > i64::from(u32::MAX) {
            return Err("rate-limit-burst is too large".into());
        }
        // Past this the limiter's clock overflows (a panic at deploy and at every restore).
        let burst = u32::try_from(o.rate_limit_burst).unwrap_or(u32::MAX);
        if rate_limit::refill_secs(o.rate_limit, burst) > rate_limit::MAX_REFILL.as_secs_f64() {
            return Err("rate-limit is too low for its burst: a spent budget (burst / rate) must refill within 10 years".into());
        }
        if !o.client_ip_header.is_empty() && o.trusted_proxies.is_empty() {
            return Err("rate-limit with client-ip-header requires trusted-proxy, or the header would be ignored while appearing to be honored".into());
        }
        IpList::parse(&o.rate_limit_exempt, "rate-limit-exempt")?;
    }
    // Basic auth, path rules, deadline.
    if !o.basic_auth.is_empty() {
        Credential::parse(&o.basic_auth)?;
    }
    RuleSet::parse(&o.redirects, Kind::Redirect)?;
    RuleSet::parse(&o.rewrites, Kind::Rewrite)?;
    if o.request_timeout.is_negative() {
        return Err("request-timeout cannot be negative".into());
    }
    Ok(())
}

/// The health-check path is served without credentials, address check or rate limit, so
/// it cannot be `/` (which would open the whole service) when any of them is on.
pub fn validate_health_check(o: &ServiceOptions, t: &TargetOptions) -> Result<(), String> {
    let path = t.health_check_config.path.as_str();
    if !(path.is_empty() || path == "/") {
        return Ok(());
    }
    let err = |why: &str| {
        Err(format!(
            "service options invalid: health-check-path cannot be \"/\" when {why}"
        ))
    };
    if !o.basic_auth.is_empty() {
        return err("basic auth is enabled, as that path is served without credentials");
    }
    if !o.allow_ips.is_empty() {
        return err("allow-ip is set, as that path is served without an address check");
    }
    if o.rate_limit > 0.0 {
        return err("rate-limit is set, as that path is served without a rate limit");
    }
    Ok(())
}

/// A lock-free log limiter: ten lines per ten-second window, on tokio's clock.
struct LogThrottle {
    /// Windows are counted from here.
    base: tokio::time::Instant,
    /// The window number in the high 32 bits, lines logged in it in the low 32.
    state: AtomicU64,
}

impl Default for LogThrottle {
    fn default() -> Self {
        LogThrottle {
            base: tokio::time::Instant::now(),
            state: AtomicU64::new(0),
        }
    }
}

impl LogThrottle {
    const BURST: u64 = 10;
    const WINDOW_SECS: u64 = 10;

    fn take(&self) -> bool {
        // Window numbers start at 1, so the initial state (window 0) is never current.
        let window = (self.base.elapsed().as_secs() / Self::WINDOW_SECS + 1) & 0xffff_ffff;
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            let (w, n) = (cur >> 32, cur & 0xffff_ffff);
            let next = if w != window {
                (window << 32) | 1
            } else if n < Self::BURST {
                cur + 1
            } else {
                return false;
            };
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gotime::GoDuration;

    #[tokio::test(start_paused = true)]
    async fn log_throttle_allows_ten_lines_per_window() {
        let throttle = LogThrottle::default();
        assert!((0..10).all(|_| throttle.take()));
        assert!(!throttle.take());
        tokio::time::advance(Duration::from_secs(LogThrottle::WINDOW_SECS)).await;
        assert!(throttle.take());
    }

    fn v(o: ServiceOptions) -> String {
        o.validate_with(validate).unwrap_err()
    }

    fn s(list: &[&str]) -> Vec<String> {
        list.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn validation_matrix() {
        let base = ServiceOptions::default;
        let p = "service options invalid: ";
        assert_eq!(
            v(ServiceOptions {
                trusted_proxies: s(&["10.0.0.1"]),
                ..base()
            }),
            format!("{p}trusted-proxy requires allow-ip or rate-limit")
        );
        assert!(
            ServiceOptions {
                trusted_proxies: s(&["10.0.0.1"]),
                rate_limit: 1.0,
                ..base()
            }
            .validate_with(validate)
            .is_ok()
        );
        assert!(v(ServiceOptions { allow_ips: s(&["10.0.0.1"]), client_ip_header: "X-Real-IP".into(), ..base() })
            .ends_with("allow-ip with client-ip-header requires trusted-proxy, or the header would be ignored while appearing to be honored"));
        assert_eq!(
            v(ServiceOptions {
                allow_ips: s(&["1.2.3.4"]),
                trusted_proxies: s(&["::/0"]),
                ..base()
            }),
            format!("{p}trusted-proxy cannot contain a default route (::/0)")
        );
        assert_eq!(
            v(ServiceOptions {
                allow_ips: s(&["1.2.3"]),
                ..base()
            }),
            format!("{p}allow-ip: \"1.2.3\" is not a valid address")
        );
        assert_eq!(
            v(ServiceOptions {
                rate_limit: -1.0,
                ..base()
            }),
            format!("{p}rate-limit cannot be negative")
        );
        assert_eq!(
            v(ServiceOptions {
                rate_limit_burst: 3,
                ..base()
            }),
            format!("{p}rate-limit-burst requires rate-limit")
        );
        assert_eq!(
            v(ServiceOptions {
                rate_limit_exempt: s(&["10.0.0.1"]),
                ..base()
            }),
            format!("{p}rate-limit-exempt requires rate-limit")
        );
        assert_eq!(
            v(ServiceOptions {
                rate_limit: 1.0,
                rate_limit_burst: -1,
                ..base()
            }),
            format!("{p}rate-limit-burst cannot be negative")
        );
        // A rate whose budget would take centuries to refill overflowed the limiter's
        // clock: a panic at deploy (found writing the property tests).
        for (rate, burst) in [(1e-20, 0), (1e-3, i64::from(u32::MAX))] {
            assert_eq!(
                v(ServiceOptions {
                    rate_limit: rate,
                    rate_limit_burst: burst,
                    ..base()
                }),
                format!(
                    "{p}rate-limit is too low for its burst: a spent budget (burst / rate) must refill within 10 years"
                )
            );
        }
        assert!(v(ServiceOptions { rate_limit: 1.0, client_ip_header: "X-Real-IP".into(), ..base() })
            .ends_with("rate-limit with client-ip-header requires trusted-proxy, or the header would be ignored while appearing to be honored"));
        assert_eq!(
            v(ServiceOptions {
                basic_auth: "plain".into(),
                ..base()
            }),
            format!("{p}basic auth credential is not a sha256 value")
        );
        assert_eq!(
            v(ServiceOptions {
                redirects: s(&["x"]),
                ..base()
            }),
            format!("{p}redirect must be given as \"<pattern>=<replacement>\", got \"x\"")
        );
        assert_eq!(
            v(ServiceOptions {
                request_timeout: GoDuration::from_secs(-1),
                ..base()
            }),
            format!("{p}request-timeout cannot be negative")
        );
    }

    #[test]
    fn the_health_path_cannot_be_root_behind_a_gate() {
        let mut t = TargetOptions::default();
        t.health_check_config.path = "/".into();
        let o = ServiceOptions {
            allow_ips: s(&["10.0.0.0/8"]),
            ..Default::default()
        };
        assert_eq!(
            validate_health_check(&o, &t).unwrap_err(),
            "service options invalid: health-check-path cannot be \"/\" when allow-ip is set, as that path is served without an address check"
        );
        assert!(validate_health_check(&ServiceOptions::default(), &t).is_ok());
        t.health_check_config.path = "/up".into();
        assert!(validate_health_check(&o, &t).is_ok());
    }

    #[test]
    fn unreadable_stored_gates_fail_closed() {
        let o = ServiceOptions {
            allow_ips: s(&["not an address"]),
            basic_auth: "garbage".into(),
            ..Default::default()
        };
        let g = Gates::compile("svc", &o).unwrap();
        assert!(
            !g.allow
                .as_ref()
                .unwrap()
                .permits(Some("127.0.0.1".parse().unwrap()))
        );
        let mut h = http::HeaderMap::new();
        assert!(!g.basic_auth.as_ref().unwrap().take_and_check(&mut h));
        let o = ServiceOptions {
            redirects: s(&["nope"]),
            ..Default::default()
        };
        assert!(Gates::compile("svc", &o).is_err());
    }

    #[test]
    fn log_throttle() {
        let t = LogThrottle::default();
        let taken = (0..100).filter(|_| t.take()).count();
        assert!((10..=20).contains(&taken), "{taken}");
    }
}
