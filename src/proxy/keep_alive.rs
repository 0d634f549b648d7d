//! Honouring an app's `Keep-Alive: timeout=N` (issue 10 §2): its idle connections leave our
//! pool before the app closes them, so a request is never written into a closing socket.
//!
//! Why per host and not per connection: the pool's one knob ([`super::pool`]) is the idle
//! timeout, checked against the time a connection went idle each time one is taken from
//! the pool, which keeps the pool's take and return to a push and a pop. A per-connection
//! deadline would need a timer per idle connection. So an app that announces a timeout
//! has its requests sent through a pool whose idle timeout is below it. Pools are
//! rungs of a short ladder, so a handful of them serve any number of apps; a rung below
//! the announced timeout only costs an earlier reconnect. An app announces the same value on
//! every keep-alive response (Node: 5 s, Apache: 5 s), so the first response teaches it.
//!
//! What a host announced is kept until it announces something else; the idle connections
//! it had in the pool it left are never taken again and close with the app's timeout.

use arc_swap::ArcSwap;
use http::uri::Authority;
use http::{HeaderMap, HeaderName};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The pool idle timeouts a host can be moved to, shortest first. Rung 0 means "never
/// reuse" (`timeout=0`, or a second that leaves no margin).
pub(crate) const RUNGS: [Duration; 9] = [
    Duration::ZERO,
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(15),
    Duration::from_secs(30),
    Duration::from_secs(60),
];

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

/// The rung for an announced timeout: the longest idle time that ends a second before the
/// app's own (half of it below two seconds), which covers the lag between the app
/// finishing its answer and the connection entering our pool. `None`: the timeout is no
/// shorter than `default` and the shared pool already honours it.
pub(crate) fn rung_for(timeout: Duration, default: Duration) -> Option<usize> {
    let limit = timeout
        .saturating_sub(Duration::from_secs(1))
        .max(timeout / 2);
    if limit >= default {
        return None;
    }
    RUNGS.iter().rposition(|r| *r <= limit)
}

/// Which hosts announced a timeout, and their rung. Read on every request (one atomic
/// load; a hash lookup once any host is in it), written only when a host announces a new
/// value.
#[derive(Default)]
pub(crate) struct Hosts {
    rungs: ArcSwap<HashMap<Authority, usize>>,
}

impl Hosts {
    pub(crate) fn rung(&self, host: &Authority) -> Option<usize> {
        let rungs = self.rungs.load();
        if rungs.is_empty() {
            return None;
        }
        rungs.get(host).copied()
    }

    /// Records the rung a response's `Keep-Alive` header calls for; returns it when it is
    /// news (the caller logs it).
    pub(crate) fn learn(
        &self,
        host: &Authority,
        headers: &HeaderMap,
        default: Duration,
    ) -> Option<(Duration, Option<usize>)> {
        let timeout = announced_timeout(headers)?;
        let rung = rung_for(timeout, default);
        if self.rung(host) == rung {
            return None;
        }
        self.rungs.rcu(|rungs| {
            let mut rungs = if rungs.len() >= MAX_HOSTS {
                HashMap::new()
            } else {
                HashMap::clone(rungs)
            };
            match rung {
                Some(r) => rungs.insert(host.clone(), r),
                None => rungs.remove(host),
            };
            Arc::new(rungs)
        });
        Some((timeout, rung))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: Duration = Duration::from_secs(90);

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
    fn the_rung_ends_before_the_apps_timeout() {
        let secs = Duration::from_secs;
        for (timeout, want) in [
            (secs(0), Some(Duration::ZERO)),
            (secs(1), Some(Duration::from_millis(500))),
            (secs(2), Some(secs(1))),
            (secs(5), Some(secs(4))), // Node's default
            (secs(15), Some(secs(8))),
            (secs(65), Some(secs(60))),
            (secs(91), None),
            (secs(3600), None),
        ] {
            let rung = rung_for(timeout, DEFAULT);
            assert_eq!(rung.map(|r| RUNGS[r]), want, "timeout={timeout:?}");
            if let Some(r) = rung {
                assert!(RUNGS[r] < timeout || timeout.is_zero());
            }
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
        fn the_rung_is_the_longest_that_ends_before_the_apps_timeout(ms in 0u64..200_000) {
            let timeout = Duration::from_millis(ms);
            match rung_for(timeout, DEFAULT) {
                None => proptest::prop_assert!(
                    timeout.saturating_sub(Duration::from_secs(1)).max(timeout / 2) >= DEFAULT
                ),
                Some(r) => {
                    // Below the app's timeout (rung 0, "never reuse", always is), and the
                    // next rung up would not leave the margin.
                    proptest::prop_assert!(RUNGS[r] < timeout || r == 0);
                    let limit = timeout.saturating_sub(Duration::from_secs(1)).max(timeout / 2);
                    proptest::prop_assert!(RUNGS[r] <= limit);
                    if let Some(next) = RUNGS.get(r + 1) {
                        proptest::prop_assert!(*next > limit);
                    }
                }
            }
        }
    }

    #[test]
    fn hosts_are_learned_once_and_relearned_on_change() {
        let hosts = Hosts::default();
        let a: Authority = "127.0.0.1:3000".parse().unwrap();
        let b: Authority = "127.0.0.1:3001".parse().unwrap();
        assert_eq!(hosts.rung(&a), None);
        assert_eq!(hosts.learn(&a, &HeaderMap::new(), DEFAULT), None);

        let learned = hosts.learn(&a, &keep_alive("timeout=5"), DEFAULT);
        assert_eq!(learned, Some((Duration::from_secs(5), Some(4))));
        assert_eq!(
            hosts.rung(&a).map(|r| RUNGS[r]),
            Some(Duration::from_secs(4))
        );
        assert_eq!(hosts.rung(&b), None);
        // The same announcement again is no news.
        assert_eq!(
            hosts.learn(&a, &keep_alive("timeout=5, max=99"), DEFAULT),
            None
        );

        // A longer timeout than the shared pool's: back to the shared pool.
        let learned = hosts.learn(&a, &keep_alive("timeout=300"), DEFAULT);
        assert_eq!(learned, Some((Duration::from_secs(300), None)));
        assert_eq!(hosts.rung(&a), None);
    }
}
