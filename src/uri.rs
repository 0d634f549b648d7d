//! Hosts and paths as the request path reads and writes them: the request's host, its
//! name without the port, the name as routing compares it, the path a target sees after
//! its prefix is stripped, and the percent-decoding and -encoding on either side of a
//! rewrite or redirect pattern.
//!
//! A leaf: it depends on `http` and nothing of ours, so listeners, the router, the
//! gates and the access log can all share it without importing each other.

use http::{Request, header};
use std::borrow::Cow;

/// The host the request names: its `Host` header, else the URI's authority (HTTP/2 and
/// HTTP/3 may send only `:authority`). Port included.
pub fn request_host<B>(req: &Request<B>) -> Option<&str> {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
}

/// Host header without its port (`[::1]` keeps its brackets).
pub fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(i) => &host[..=i],
            None => host,
        };
    }
    // A byte search: `rfind` with a `char` pattern took a searcher's setup per request.
    match host.bytes().rposition(|b| b == b':') {
        Some(i) if i > 0 => &host[..i],
        _ => host,
    }
}

/// A host as routing and certificates compare it: DNS names are case-insensitive and
/// `a.test.` is `a.test` (RFC 1034 §3.1). Borrowed unless something changes, so a
/// request's lookup allocates only for an unusual host.
pub fn normalize_host(host: &str) -> Cow<'_, str> {
    let host = match host.strip_suffix('.') {
        Some(h) if !h.is_empty() => h,
        _ => host,
    };
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

/// The path the target sees: the prefix stripped (never empty) unless stripping is off.
pub fn routed_path<'a>(path: &'a str, prefix: &str, strip: bool) -> Cow<'a, str> {
    if prefix == "/" || !strip {
        return Cow::Borrowed(path);
    }
    let rest = path.strip_prefix(prefix).unwrap_or(path);
    if rest.is_empty() {
        Cow::Borrowed("/")
    } else if rest.starts_with('/') {
        Cow::Borrowed(rest)
    } else {
        Cow::Owned(format!("/{rest}"))
    }
}

/// The path as upstream logs and matches it (Go's `URL.Path`): percent-escapes decoded.
pub fn decoded_path(raw: &str) -> Cow<'_, str> {
    if !raw.contains('%') {
        return Cow::Borrowed(raw);
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Percent-encodes what cannot appear raw in a URI path (the inverse of the decoding the
/// patterns matched against), leaving `/` and the usual path characters alone.
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'/' | b'-'
                    | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
                    | b':'
                    | b'@'
                    | b'%'
            );
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-encodes what cannot appear raw in a query (a capture carries decoded text:
/// spaces, control characters, non-ASCII), leaving the query's own syntax alone.
pub fn encode_query(query: &str) -> String {
    let mut out = String::with_capacity(query.len());
    for c in query.chars() {
        if c == '?' {
            out.push(c);
        } else {
            out.push_str(&encode_path(c.encode_utf8(&mut [0; 4])));
        }
    }
    out
}

/// Splits a path-and-query at its first `?`: the path, and the query if there is one.
pub fn split_query(s: &str) -> (&str, Option<&str>) {
    match s.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (s, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_host_is_the_host_header_else_the_authority() {
        let req = Request::builder()
            .uri("https://b.test:8443/x")
            .header(header::HOST, "a.test:80")
            .body(())
            .unwrap();
        assert_eq!(request_host(&req), Some("a.test:80"));
        let req = Request::builder()
            .uri("https://b.test:8443/x")
            .body(())
            .unwrap();
        assert_eq!(request_host(&req), Some("b.test:8443"));
        let req = Request::builder().uri("/x").body(()).unwrap();
        assert_eq!(request_host(&req), None);
    }

    #[test]
    fn hosts_lose_ports() {
        assert_eq!(host_without_port("a.com:8080"), "a.com");
        assert_eq!(host_without_port("a.com"), "a.com");
        assert_eq!(host_without_port("[::1]:80"), "[::1]");
        assert_eq!(host_without_port("[::1]"), "[::1]");
    }

    #[test]
    fn hosts_compare_without_case_or_a_trailing_dot() {
        assert!(matches!(normalize_host("a.test"), Cow::Borrowed("a.test")));
        assert_eq!(normalize_host("A.Test."), "a.test");
        assert_eq!(normalize_host("a.test."), "a.test");
        assert_eq!(normalize_host("."), ".");
        assert_eq!(normalize_host(""), "");
    }

    #[test]
    fn strips_prefixes() {
        assert_eq!(routed_path("/app/show", "/app", true), "/show");
        assert_eq!(routed_path("/app", "/app", true), "/");
        assert_eq!(routed_path("/app/", "/app", true), "/");
        assert_eq!(routed_path("/app/show", "/app", false), "/app/show");
        assert_eq!(routed_path("/x", "/", true), "/x");
    }

    #[test]
    fn logged_paths_are_decoded() {
        assert_eq!(decoded_path("/plain/path"), "/plain/path");
        assert_eq!(decoded_path("/caf%C3%A9%20x"), "/café x");
        assert_eq!(decoded_path("/a%2Fb"), "/a/b");
        assert_eq!(decoded_path("/bad%zz%4"), "/bad%zz%4");
    }

    #[test]
    fn path_encoding() {
        assert_eq!(encode_path("/a b/ü?#"), "/a%20b/%C3%BC%3F%23");
        assert_eq!(encode_path("/a-b_c.d~e/@:x"), "/a-b_c.d~e/@:x");
    }

    #[test]
    fn query_encoding_keeps_the_query_syntax() {
        assert_eq!(encode_query("q=a b\u{e9}#x&r=1"), "q=a%20b%C3%A9%23x&r=1");
        assert_eq!(encode_query("a?b"), "a?b");
    }

    #[test]
    fn queries_split_at_the_first_question_mark() {
        assert_eq!(split_query("/a?b=1?c"), ("/a", Some("b=1?c")));
        assert_eq!(split_query("/a?"), ("/a", Some("")));
        assert_eq!(split_query("/a"), ("/a", None));
    }
}
