//! `--rewrite`: the path the target sees, changed after the sleep gate (logs and metrics
//! keep the original). Matched against the decoded path as the client sent it; the
//! result then goes through `--strip-path-prefix` like any path.

use http::uri::PathAndQuery;

use super::rules::{RuleSet, encode_path, split_query};
use crate::observe::access::decoded_path;
use crate::service::routed_path;

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
    let (expanded, _) = rules.apply(&decoded_path(path))?;
    let (new_path, own_query) = split_query(&expanded);
    let encoded = encode_path(new_path);
    let routed = routed_path(&encoded, prefix, strip);
    let s = match own_query.or(query) {
        Some(q) => format!("{routed}?{q}"),
        None => routed.into_owned(),
    };
    PathAndQuery::try_from(s).ok()
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
