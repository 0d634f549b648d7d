//! `--path-timeout` and `--path-request-timeout`: the `PREFIX=DURATION` flag syntax (pflag's
//! string-to-string values, Go durations) and the prefix a request path falls under (the
//! longest, by whole path segments).

use kamal_proxy::gotime::GoDuration;
use kamal_proxy::options::normalize_prefix;
use kamal_proxy::options::upstream::{PathTimeout, PathTimeouts, covers, from_pairs, parse_pairs};
use proptest::prelude::*;
use std::time::Duration;

/// A prefix as a user may type it: segments of path characters, slashes anywhere.
fn prefix() -> impl Strategy<Value = String> {
    (
        any::<bool>(),
        prop::collection::vec("[a-z]{1,3}", 0..4),
        any::<bool>(),
    )
        .prop_map(|(lead, segments, trail)| {
            let mut p = segments.join("/");
            if lead {
                p.insert(0, '/');
            }
            if trail {
                p.push('/');
            }
            p
        })
}

/// A request path under some of those prefixes (or none).
fn path() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-z]{1,3}", 0..5).prop_map(|s| format!("/{}", s.join("/")))
}

/// Go's `Duration.String()` of a non-negative duration, which Go parses back.
fn duration_text() -> impl Strategy<Value = (String, GoDuration)> {
    prop_oneof![
        Just(GoDuration::ZERO),
        (1i64..3_600_000).prop_map(GoDuration::from_millis),
        (0i64..i64::MAX).prop_map(GoDuration::from_nanos),
    ]
    .prop_map(|d| (d.to_string(), d))
}

/// Whole-segment coverage, spelled the other way round: the path's segments begin with
/// the prefix's segments.
fn model_covers(prefix: &str, path: &str) -> bool {
    let segments = |s: &str| -> Vec<String> {
        s.split('/')
            .filter(|x| !x.is_empty())
            .map(String::from)
            .collect()
    };
    let (p, q) = (segments(prefix), segments(path));
    q.len() >= p.len() && q[..p.len()] == p[..]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

    /// Any flag value: pairs or pflag's message, never a panic; one `=` is one pair whose
    /// key is everything before it.
    #[test]
    fn any_flag_value_parses_or_is_refused(value in any::<String>()) {
        match parse_pairs(&value) {
            Ok(pairs) => {
                prop_assert!(!pairs.is_empty());
                if value.matches('=').count() == 1 {
                    let (k, v) = value.trim_matches('"').split_once('=').unwrap();
                    prop_assert_eq!(pairs, vec![(k.to_string(), v.to_string())]);
                }
            }
            Err(e) => prop_assert!(
                e.contains("must be formatted as key=value") || e.contains('"'),
                "{}", e
            ),
        }
    }

    /// Pairs written out as the fork's Kamal writes them (one flag each, or a
    /// comma-separated value) read back with their durations, one timeout per normalised
    /// prefix (the last given wins), longest first.
    #[test]
    fn written_pairs_read_back_normalised_and_longest_first(
        entries in prop::collection::vec((prefix(), duration_text()), 1..6),
        one_value in any::<bool>(),
    ) {
        let texts: Vec<String> = entries
            .iter()
            .map(|(p, (text, _))| format!("{p}={text}"))
            .collect();
        let values = if one_value && texts.len() > 1 { vec![texts.join(",")] } else { texts };
        let mut pairs = Vec::new();
        for v in &values {
            pairs.extend(parse_pairs(v).unwrap());
        }
        let list = from_pairs("path-timeout", &pairs).unwrap();
        for w in list.windows(2) {
            prop_assert!(w[0].path_prefix.len() >= w[1].path_prefix.len());
            prop_assert!(w[0].path_prefix != w[1].path_prefix);
        }
        for (p, (_, d)) in &entries {
            let want = entries
                .iter()
                .rev()
                .find(|(q, _)| normalize_prefix(q) == normalize_prefix(p))
                .map(|(_, (_, d))| *d)
                .unwrap();
            let got = list.iter().find(|t| t.path_prefix == normalize_prefix(p)).unwrap();
            prop_assert_eq!(got.timeout, want, "{} ({})", p, d);
        }
    }

    /// A duration Go would refuse, or a negative one, is the fork's message naming the
    /// prefix and the value as given.
    #[test]
    fn bad_durations_are_refused_with_the_forks_message(
        p in prefix(),
        bad in prop_oneof![
            "[0-9]{1,4}".prop_filter("not zero", |s| !s.trim_start_matches('0').is_empty()),
            "-[1-9][0-9]{0,3}(ms|s|m|h)",
            "[a-z]{1,6}",
        ],
    ) {
        let pairs = vec![(p.clone(), bad.clone())];
        prop_assert_eq!(
            from_pairs("path-request-timeout", &pairs).unwrap_err(),
            format!("invalid --path-request-timeout duration for '{p}': {bad}")
        );
    }

    /// A prefix covers a path exactly when the path's segments begin with the prefix's.
    #[test]
    fn coverage_is_by_whole_segments(p in prefix(), q in path()) {
        prop_assert_eq!(covers(&normalize_prefix(&p), &q), model_covers(&p, &q), "{} {}", p, q);
        // A path that merely starts with the same characters is not covered.
        let glued = format!("{}x", normalize_prefix(&p).trim_end_matches('/'));
        if glued != "x" {
            prop_assert!(!covers(&normalize_prefix(&p), &glued) || normalize_prefix(&p) == "/");
        }
    }

    /// The timeout a path gets is that of the longest covering prefix (a zero one: none),
    /// else the service's.
    #[test]
    fn the_longest_covering_prefix_decides(
        entries in prop::collection::vec((prefix(), 0i64..5), 0..6),
        q in path(),
    ) {
        let list: Vec<PathTimeout> = entries
            .iter()
            .map(|(p, s)| PathTimeout { path_prefix: p.clone(), timeout: GoDuration::from_secs(*s) })
            .collect();
        let compiled = PathTimeouts::compile(&list);
        let fallback = Some(Duration::from_secs(30));
        // The model: among the entries (the last given per prefix), the covering one
        // with the most segments.
        let mut best: Option<(usize, i64)> = None;
        for (p, s) in &entries {
            if !model_covers(p, &q) {
                continue;
            }
            let depth = normalize_prefix(p).split('/').filter(|x| !x.is_empty()).count();
            if best.is_none_or(|(d, _)| depth >= d) {
                let last = entries
                    .iter()
                    .rev()
                    .find(|(o, _)| normalize_prefix(o) == normalize_prefix(p))
                    .map(|(_, s)| *s)
                    .unwrap_or(*s);
                best = Some((depth, last));
            }
        }
        let want = match best {
            None => fallback,
            Some((_, 0)) => None,
            Some((_, s)) => Some(Duration::from_secs(s as u64)),
        };
        prop_assert_eq!(compiled.for_path(&q, fallback), want, "{:?} {}", entries, q);
    }
}
