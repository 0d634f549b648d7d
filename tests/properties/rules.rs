//! `--redirect` and `--rewrite` rules, and the request paths they are applied to.

use http::{HeaderValue, Request};
use kamal_proxy::options::ServiceOptions;
use kamal_proxy::service::gates::redirect::location;
use kamal_proxy::service::gates::rewrite::rewrite;
use kamal_proxy::service::gates::rules::{Kind, RuleSet, is_full_url};
use kamal_proxy::uri::{decoded_path, encode_path};
use proptest::prelude::*;

fn parse(rule: &str, kind: Kind) -> Result<RuleSet, String> {
    RuleSet::parse(&[rule.to_string()], kind)
}

/// A path as a client may send it: printable ASCII, percent-escapes of any byte
/// (multi-byte UTF-8 and invalid sequences included).
fn wire_path() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            "[a-zA-Z0-9/._~-]{1,4}",
            any::<u8>().prop_map(|b| format!("%{b:02X}")),
            Just("%".to_string()),
        ],
        0..12,
    )
    .prop_map(|parts| format!("/{}", parts.concat()))
}

fn request(path_and_query: &str) -> Request<()> {
    Request::builder()
        .uri(path_and_query)
        .header(http::header::HOST, "app.test")
        .body(())
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::FEW))]

    /// Any rule text: a rule set or the fork's error, never a panic; a rule set applies to
    /// any path without panicking.
    #[test]
    fn arbitrary_rules_never_panic(rule in prop_oneof![any::<String>(), "[/a-z().*$1=;:statuhp0-9\u{e9}]{0,24}"], path in any::<String>()) {
        for kind in [Kind::Redirect, Kind::Rewrite] {
            if let Ok(set) = parse(&rule, kind) {
                let _ = set.apply(&path);
            }
        }
        let _ = is_full_url(&rule);
        let _ = is_full_url(&path);
    }

    /// A literal rule matches its own path exactly (anchored), gives its replacement and
    /// its status; other statuses are refused.
    #[test]
    fn literal_rules_match_exactly(from in "/[a-z0-9.?*+()]{0,10}", to in "/[a-z0-9/]{0,10}", status in prop::sample::select(vec![301u16, 302, 303, 307, 308]), bad in 100u16..1000) {
        let rule = format!("{}={to};status={status}", regex::escape(&from));
        let set = parse(&rule, Kind::Redirect).map_err(TestCaseError::fail)?;
        let expanded = set.apply(&from).map(|e| (e.path, e.query, e.status));
        prop_assert_eq!(expanded, Some((to.clone(), None, status)));
        let (after, before) = (format!("{from}x"), format!("x{from}"));
        prop_assert_eq!(set.apply(&after), None);
        prop_assert_eq!(set.apply(&before), None);
        let rewrite_rule = format!("{}={to}", regex::escape(&from));
        let rewritten = parse(&rewrite_rule, Kind::Rewrite).map_err(TestCaseError::fail)?.apply(&from).map(|e| e.path);
        prop_assert_eq!(rewritten, Some(to.clone()));
        if ![301, 302, 303, 307, 308].contains(&bad) {
            let refused = parse(&format!("/a=/b;status={bad}"), Kind::Redirect).unwrap_err();
            prop_assert_eq!(refused, format!("redirect status must be one of 301, 302, 303, 307, 308, got {bad}"));
        }
    }

    /// Whatever path a client sends, a catch-all redirect answers with a `Location` that
    /// is a valid header value on this host (a captured `//evil` stays a path), and never
    /// panics (a multi-byte character once did).
    #[test]
    fn redirect_locations_are_valid_headers(path in wire_path(), query in prop::option::of("[a-z0-9=&%]{0,8}")) {
        // `(?s)`: `.` stops at a newline otherwise (as in Go's regexp), and `%0A` decodes
        // to one.
        let set = parse("/((?s).*)=/moved/$1;status=308", Kind::Redirect).unwrap();
        let pq = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path.clone(),
        };
        let req = request(&pq);
        let (status, to) = location(&req, &ServiceOptions::default(), &set, false).expect("a catch-all rule redirects");
        prop_assert_eq!(status.as_u16(), 308);
        prop_assert!(to.starts_with("http://app.test/moved/"), "{}", to);
        prop_assert!(HeaderValue::from_str(&to).is_ok(), "{:?}", to);
    }

    /// The same for a rule that sends the client elsewhere, captures in path and query.
    #[test]
    fn full_url_locations_are_valid_headers(path in wire_path(), query in prop::option::of("[a-z0-9=&%]{0,8}")) {
        let set = parse("/((?s).*)=https://[2001:db8::1]:8443/x/$1?from=$1;status=302", Kind::Redirect).unwrap();
        let pq = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path.clone(),
        };
        let (status, to) = location(&request(&pq), &ServiceOptions::default(), &set, false).expect("a catch-all rule redirects");
        prop_assert_eq!(status.as_u16(), 302);
        prop_assert!(to.starts_with("https://[2001:db8::1]:8443/x/"), "{}", to);
        prop_assert!(HeaderValue::from_str(&to).is_ok(), "{:?}", to);
        prop_assert!(to.parse::<http::Uri>().is_ok(), "{:?}", to);
    }

    /// A catch-all rewrite always yields a valid path for the target, starting with `/`.
    #[test]
    fn rewrites_yield_valid_paths(path in wire_path(), query in prop::option::of("[a-z0-9=&]{0,8}"), strip in any::<bool>()) {
        let set = RuleSet::parse(&["/((?s).*)=/app/$1".to_string()], Kind::Rewrite).unwrap();
        let pq = rewrite(&set, &path, query.as_deref(), "/app", strip);
        let pq = pq.expect("a catch-all rule rewrites");
        prop_assert!(pq.path().starts_with('/'));
        // The client's query, whatever its path held (an encoded `?` stays in the path).
        prop_assert_eq!(pq.query(), query.as_deref());
    }

    /// Encoding a decoded path gives a path that decodes to the same text (for text
    /// without `%`, which `encode_path` leaves alone by design).
    #[test]
    fn encoded_paths_decode_back(text in any::<String>()) {
        prop_assume!(!text.contains('%'));
        let encoded = encode_path(&text);
        prop_assert!(encoded.is_ascii());
        let decoded = decoded_path(&encoded);
        prop_assert_eq!(decoded.as_ref(), text.as_str());
    }

    /// Decoding never panics, and text without `%` is left as it is.
    #[test]
    fn decoding_never_panics(raw in prop_oneof![any::<String>(), wire_path()]) {
        let decoded = decoded_path(&raw);
        if !raw.contains('%') {
            prop_assert_eq!(decoded.as_ref(), raw.as_str());
        }
    }
}
