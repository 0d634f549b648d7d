//! The redirect step: upstream's TLS and canonical-host redirects with the fork's
//! `--redirect` rules folded in, so `http://www.x/old` → `https://x/new` is one hop.

use http::{Request, StatusCode};

use super::rules::{RuleSet, is_full_url};
use crate::options::ServiceOptions;
use crate::uri::{decoded_path, encode_path, host_without_port, normalize_host, request_host};

/// Where to send the client, if anywhere: (status, `Location`).
pub fn location<B>(
    req: &Request<B>,
    o: &ServiceOptions,
    rules: &RuleSet,
    tls: bool,
) -> Option<(StatusCode, String)> {
    let want_https = !tls && o.tls_enabled && o.tls_redirect;
    if !want_https && o.canonical_host.is_empty() && rules.is_empty() {
        // Nothing to redirect to (most services): the host is not even looked up (a
        // hashed look-up, about 100 instructions a request).
        return None;
    }
    let raw_host = request_host(req).unwrap_or("");
    let host = host_without_port(raw_host);
    // The canonical host is deployed normalized: `X.com.` is already canonical.
    let want_host = (!o.canonical_host.is_empty() && o.canonical_host != normalize_host(host))
        .then_some(o.canonical_host.as_str());
    let scheme = if want_https || tls { "https" } else { "http" };
    // A redirect that changes scheme or host drops the port (as upstream); a path-only
    // rule keeps the Host the client used.
    let target_host = match (want_https, want_host) {
        (false, None) => raw_host,
        (_, h) => h.unwrap_or(host),
    };

    if !rules.is_empty() {
        let path = decoded_path(req.uri().path());
        if let Some(expanded) = rules.apply(&path) {
            let status = expanded.status;
            let query = expanded.query.as_deref().or(req.uri().query());
            // Encoded either way: a capture carries the client's decoded text.
            let mut location = if is_full_url(&expanded.path) {
                // The scheme and authority as the operator wrote them (an IPv6 literal
                // keeps its brackets), the path encoded.
                let after_scheme = expanded.path.find("://").map_or(0, |i| i + 3);
                let path_at = expanded.path[after_scheme..]
                    .find('/')
                    .map_or(expanded.path.len(), |i| after_scheme + i);
                let (origin, path) = expanded.path.split_at(path_at);
                format!("{origin}{}", encode_path(path))
            } else {
                // Always rebuilt on this scheme and host, so a captured `//evil.com` stays
                // a path here.
                format!("{scheme}://{target_host}{}", encode_path(&expanded.path))
            };
            if let Some(q) = query {
                location.push('?');
                location.push_str(q);
            }
            let query = req.uri().query();
            let current = {
                let mut c = format!(
                    "{}://{raw_host}{}",
                    if tls { "https" } else { "http" },
                    encode_path(&path)
                );
                if let Some(q) = query {
                    c.push('?');
                    c.push_str(q);
                }
                c
            };
            // A rule that resolves to the URL being requested would loop: skip it and let
            // the TLS and canonical-host checks decide.
            if location != current {
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::MOVED_PERMANENTLY);
                return Some((status, location));
            }
        }
    }

    if !want_https && want_host.is_none() {
        return None;
    }
    let pq = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    Some((
        StatusCode::MOVED_PERMANENTLY,
        format!("{scheme}://{target_host}{pq}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::rules::Kind;
    use super::*;
    use http::header;

    fn req(host: &str, pq: &str) -> Request<()> {
        Request::builder()
            .uri(pq)
            .header(header::HOST, host)
            .body(())
            .unwrap()
    }

    fn rules(r: &[&str]) -> RuleSet {
        RuleSet::parse(
            &r.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            Kind::Redirect,
        )
        .unwrap()
    }

    fn opts() -> ServiceOptions {
        ServiceOptions::default()
    }

    #[test]
    fn rules_keep_host_and_port_and_carry_the_query() {
        let r = rules(&["/old/(.*)=/new/$1"]);
        assert_eq!(
            location(&req("a.com:8080", "/old/x?q=1"), &opts(), &r, false),
            Some((
                StatusCode::MOVED_PERMANENTLY,
                "http://a.com:8080/new/x?q=1".into()
            ))
        );
        let r = rules(&["/old=/new?a=b;status=302"]);
        assert_eq!(
            location(&req("a.com", "/old?q=1"), &opts(), &r, false),
            Some((StatusCode::FOUND, "http://a.com/new?a=b".into()))
        );
        assert_eq!(location(&req("a.com", "/other"), &opts(), &r, false), None);
    }

    #[test]
    fn folds_into_the_canonical_and_tls_redirects() {
        let mut o = opts();
        o.canonical_host = "x.com".into();
        o.tls_enabled = true;
        o.tls_redirect = true;
        let r = rules(&["/old=/new"]);
        assert_eq!(
            location(&req("www.x.com", "/old"), &o, &r, false),
            Some((StatusCode::MOVED_PERMANENTLY, "https://x.com/new".into()))
        );
        assert_eq!(
            location(&req("www.x.com", "/else?a"), &o, &r, false),
            Some((StatusCode::MOVED_PERMANENTLY, "https://x.com/else?a".into()))
        );
    }

    #[test]
    fn no_loops_and_no_escapes() {
        let r = rules(&["/(.*)=/$1"]);
        assert_eq!(location(&req("a.com", "/same?x"), &opts(), &r, false), None);
        // A bare "$1" replacement is refused at deploy; a captured `//host` stays a path
        // on this host.
        assert!(RuleSet::parse(&["/go(.*)=$1".into()], Kind::Redirect).is_err());
        let r2 = rules(&["/go/(.*)=/$1"]);
        assert_eq!(
            location(&req("a.com", "/go//evil.com"), &opts(), &r2, false),
            Some((
                StatusCode::MOVED_PERMANENTLY,
                "http://a.com//evil.com".into()
            ))
        );
    }

    /// A client's path, decoded and expanded into a rule's replacement, put a multi-byte
    /// character across `https://`'s length: the full-URL check sliced the text there and
    /// panicked, which in a release build (panic = abort) took the whole proxy down.
    #[test]
    fn a_multibyte_path_cannot_panic_the_redirect() {
        let r = rules(&["/old(.*)=/new$1"]);
        assert_eq!(
            location(&req("a.com", "/oldab%C3%A9"), &opts(), &r, false),
            Some((
                StatusCode::MOVED_PERMANENTLY,
                "http://a.com/newab%C3%A9".into()
            ))
        );
    }

    /// Captured text is encoded in a full URL's path too (a newline made the `Location`
    /// an invalid header, so the redirect went out without one).
    #[test]
    fn full_url_captures_are_encoded() {
        let r = rules(&["/docs/((?s).*)=https://[::1]:8443/d/$1?from=$1"]);
        assert_eq!(
            location(&req("a.com", "/docs/a%0Ab%3Fc"), &opts(), &r, false),
            Some((
                StatusCode::MOVED_PERMANENTLY,
                "https://[::1]:8443/d/a%0Ab%3Fc?from=a%0Ab?c".into()
            ))
        );
    }

    #[test]
    fn full_urls_go_anywhere() {
        let r = rules(&["/docs/(.*)=https://docs.example.com/$1;status=308"]);
        assert_eq!(
            location(&req("a.com", "/docs/x?v=2"), &opts(), &r, false),
            Some((
                StatusCode::PERMANENT_REDIRECT,
                "https://docs.example.com/x?v=2".into()
            ))
        );
    }
}
