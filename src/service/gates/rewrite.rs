//! `--rewrite`: the path the target sees, changed after the sleep gate (logs and metrics
//! keep the original). Matched against the decoded path as the client sent it; the
//! result then goes through `--strip-path-prefix` like any path.

use http::uri::PathAndQuery;

use super::rules::RuleSet;
use crate::uri::{decoded_path, encode_path, routed_path};

/// The upstream path and query after the first matching rule, or `None` when no rule
/// matches. The replacement's own query replaces the request's; otherwise it is kept.
pub fn rewrite(
    rules: &RuleSet,
    path: &str,
    query: Option<&str>,
    prefix: &str,
    strip: bool,
) -> Option<PathAndQuery> {
    if rules.is_empty() {
        return None;
    }
    let expanded = rules.apply(&decoded_path(path))?;
    let encoded = encode_path(&expanded.path);
    let routed = routed_path(&encoded, prefix, strip);
    let s = match expanded.query.as_deref().or(query) {
        Some(q) => format!("{routed}?{q}"),
        None => routed.into_owned(),
    };
    PathAndQuery::try_from(s).ok()
}

/// The path after the first matching rule, before `--strip-path-prefix` (what
/// `--path-timeout` is matched against, as the fork's handler sees it): the raw path
/// itself when no rule matches.
pub fn rewritten_path<'a>(rules: &RuleSet, path: &'a str) -> std::borrow::Cow<'a, str> {
    if rules.is_empty() {
        return std::borrow::Cow::Borrowed(path);
    }
    match rules.apply(&decoded_path(path)) {
        Some(expanded) => std::borrow::Cow::Owned(encode_path(&expanded.path)),
        None => std::borrow::Cow::Borrowed(path),
    }
}

#[cfg(test)]
mod tests {
    use super::super::rules::Kind;
    use super::*;

    fn rules(r: &[&str]) -> RuleSet {
        RuleSet::parse(
            &r.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            Kind::Rewrite,
        )
        .unwrap()
    }

    #[test]
    fn rewrites_path_keeps_or_replaces_query() {
        let r = rules(&["/old/(.*)=/new/$1", "/q=/search?x=1"]);
        assert_eq!(
            rewrite(&r, "/old/a%20b", Some("k=v"), "/", true).unwrap(),
            "/new/a%20b?k=v"
        );
        assert_eq!(
            rewrite(&r, "/q", Some("k=v"), "/", true).unwrap(),
            "/search?x=1"
        );
        assert!(rewrite(&r, "/other", None, "/", true).is_none());
    }

    /// A client's `%3F` stays in the path the target sees, with the client's query.
    #[test]
    fn an_encoded_question_mark_stays_in_the_path() {
        let r = rules(&["/old/(.*)=/new/$1"]);
        assert_eq!(
            rewrite(&r, "/old/a%3Fadmin=1", Some("k=v"), "/", true).unwrap(),
            "/new/a%3Fadmin=1?k=v"
        );
    }

    #[test]
    fn prefix_stripping_applies_to_the_result() {
        let r = rules(&["/app/old=/app/new"]);
        assert_eq!(rewrite(&r, "/app/old", None, "/app", true).unwrap(), "/new");
        assert_eq!(
            rewrite(&r, "/app/old", None, "/app", false).unwrap(),
            "/app/new"
        );
    }
}
