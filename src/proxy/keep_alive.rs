//! Honouring an app's `Keep-Alive: timeout=N` (issue 10 §2): its idle connections leave our
//! pool before the app closes them, so a request is never written into a closing socket.
//!
//! What a host announced is remembered per host, and every pool that takes an idle
//! connection to that host checks it against the shorter of the announced limit and its
//! own `--target-idle-conn-timeout`. An app announces the same value on every keep-alive
//! response (Node: 5 s, Apache: 5 s), so the first response teaches it; what a host
//! announced is kept until it announces something else.

use arc_swap::ArcSwap;
use http::uri::Authority;
use http::{HeaderMap, HeaderName};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Hosts remembered at most; past it the table starts again (each host re-teaches its
/// timeout with its next response).
const MAX_HOSTS: usize = 4096;

/// The `timeout` an app announces in its `Keep-Alive` response header.
pub(crate) fn announced_timeout(headers: &HeaderMap) -> Option<Duration> {
    // A static name: looking up a `&str` parses and hashes it on every response.
    static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
    let value = headers.get(&KEEP_ALIVE)?.to_str().ok()?;
    value.split(',').find_map(|param| {
        let (name, secs) = param.split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("timeout") {
            return None;
        }
        let secs: u64 = secs.trim().trim_matches('"').parse().ok()?;
        Some(Duration::from_secs(secs))
    })
}

/// How long a connection to an app that announced `timeout` may idle in our pool: a
/// second less (half of it below two seconds), which covers the lag between the app
/// finishing its answer and the connection entering our pool. Zero: never reuse one.
pub(crate) fn idle_limit(timeout: Duration) -> Duration {
    timeout
        .saturating_sub(Duration::from_secs(1))
        .max(timeout / 2)
}

/// Which hosts announced a timeout, and the idle limit it calls for. Read on every
/// request (one atomic load; a hash lookup once any host is in it), written only when a
/// host announces a new value.
#[derive(Default)]
pub(crate) struct Hosts {
    limits: ArcSwap<HashMap<Authority, Duration>>,
    /// Some host has a limit: set once, never cleared. Most backends announce none, and
    /// every request asks; a plain load spares them the two atomic read-modify-writes of
    /// an arc-swap load (bench/README.md, sixteenth round).
    any: AtomicBool,
}

impl Hosts {
    pub(crate) fn limit(&self, host: &Authority) -> Option<Duration> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.limits.load().get(host).copied()
    }

    /// Records the limit a response's `Keep-Alive` header calls for; returns the
    /// announced timeout and the limit when they are news (the caller logs them).
    pub(crate) fn learn(
        &self,
        host: &Authority,
        headers: &HeaderMap,
    ) -> Option<(Duration, Duration)> {
        let timeout = announced_timeout(headers)?;
        let limit = idle_limit(timeout);
        if self.limit(host) == Some(limit) {
            return None;
        }
        self.limits.rcu(|limits| {
            let mut limits = if limits.len() >= MAX_HOSTS {
                HashMap::new()
            } else {
                HashMap::clone(limits)
            };
            limits.insert(host.clone(), limit);
            Arc::new(limits)
        });
        self.any.store(true, Ordering::Release);
        Some((timeout, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep_alive(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("keep-alive", http::HeaderValue::from_static(v));
        h
    }

    #[test]
    fn the_timeout_is_read_from_the_header_parameters() {
        for (v, want) in [
            ("timeout=5", Some(5)),
            ("timeout=5, max=1000", Some(5)),
            ("max=100, Timeout = 15", Some(15)),
            ("timeout=\"2\"", Some(2)),
            ("max=100", None),
            ("timeout=soon", None),
            ("timeout=-1", None),
        ] {
            assert_eq!(
                announced_timeout(&keep_alive(v)),
                want.map(Duration::from_secs),
                "{v}"
            );
        }
        assert_eq!(announced_timeout(&HeaderMap::new()), None);
    }

    #[test]
    fn the_limit_ends_before_the_apps_timeout() {
        let secs = Duration::from_secs;
        for (timeout, want) in [
            (secs(0), Duration::ZERO),
            (secs(1), Duration::from_millis(500)),
            (secs(2), secs(1)),
            (secs(5), secs(4)), // Node's default
            (secs(15), secs(14)),
            (secs(3600), secs(3599)),
        ] {
            let limit = idle_limit(timeout);
            assert_eq!(limit, want, "timeout={timeout:?}");
            assert!(limit < timeout || timeout.is_zero());
        }
    }

    // The header comes from the app: any bytes it sends are read without a panic, and a
    // `timeout` parameter among any others is found.
    proptest::proptest! {
        #[test]
        fn any_header_value_is_read_without_panic(value in proptest::collection::vec(0x20u8..0x7f, 0..64)) {
            let mut h = HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_bytes(&value) {
                h.insert("keep-alive", v);
            }
            let _ = announced_timeout(&h);
        }

        #[test]
        fn the_timeout_is_found_among_other_parameters(
            secs in 0u64..1_000_000,
            before in proptest::collection::vec("[a-z]{1,8}=[0-9]{1,4}", 0..3),
            after in proptest::collection::vec("[a-z]{1,8}=[0-9]{1,4}", 0..3),
        ) {
            let params: Vec<String> = before
                .iter()
                .filter(|p| !p.starts_with("timeout="))
                .cloned()
                .chain([format!("timeout={secs}")])
                .chain(after.iter().filter(|p| !p.starts_with("timeout=")).cloned())
                .collect();
            let mut h = HeaderMap::new();
            h.insert("keep-alive", http::HeaderValue::from_str(&params.join(", ")).unwrap());
            proptest::prop_assert_eq!(announced_timeout(&h), Some(Duration::from_secs(secs)));
        }

        #[test]
        fn the_limit_ends_a_second_before_the_apps_timeout(ms in 0u64..200_000_000) {
            let timeout = Duration::from_millis(ms);
            let limit = idle_limit(timeout);
            // Below the app's timeout (zero, "never reuse", always is), by a second, or by
            // half of it when it is shorter than two.
            proptest::prop_assert!(limit < timeout || limit.is_zero());
            proptest::prop_assert!(limit >= timeout / 2);
            if timeout >= Duration::from_secs(2) {
                proptest::prop_assert_eq!(limit, timeout - Duration::from_secs(1));
            }
        }
    }

    #[test]
    fn hosts_are_learned_once_and_relearned_on_change() {
        let hosts = Hosts::default();
        let a: Authority = "127.0.0.1:3000".parse().unwrap();
        let b: Authority = "127.0.0.1:3001".parse().unwrap();
        assert_eq!(hosts.limit(&a), None);
        assert_eq!(hosts.learn(&a, &HeaderMap::new()), None);

        let learned = hosts.learn(&a, &keep_alive("timeout=5"));
        assert_eq!(
            learned,
            Some((Duration::from_secs(5), Duration::from_secs(4)))
        );
        assert_eq!(hosts.limit(&a), Some(Duration::from_secs(4)));
        assert_eq!(hosts.limit(&b), None);
        // The same announcement again is no news.
        assert_eq!(hosts.learn(&a, &keep_alive("timeout=5, max=99")), None);

        let learned = hosts.learn(&a, &keep_alive("timeout=300"));
        assert_eq!(
            learned,
            Some((Duration::from_secs(300), Duration::from_secs(299)))
        );
    }
}
