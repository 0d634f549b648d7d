//! One meaning per request, settled before it is routed: the host it is for (a 400 when
//! that is ambiguous, as Go's server and RFC 9113 §8.3.1 would have it) and no
//! `h2c` upgrade, which would open a tunnel to the app past the gates and the access log.

use http::{HeaderMap, HeaderValue, Request, Version, header};

use super::glance::Glance;
use crate::proxy::rejection::Rejection;
use crate::uri::{host_without_port, normalize_host};

/// Checks the request's host headers and drops an `h2c` upgrade (`glance`: what the
/// request's fields were). On HTTP/1.1 an absolute-form target names the host (RFC 9112
/// §3.2.2): `Host` is set to it, and in `glance`, so the router and the app see the same
/// one.
pub fn settle<B>(req: &mut Request<B>, glance: &mut Glance) -> Result<(), Rejection> {
    if glance.upgrade {
        refuse_h2c(req.headers_mut());
    }
    if glance.more_hosts {
        return Err(Rejection::BadRequest {
            reason: "duplicate Host header",
        });
    }
    let host = glance.host.as_ref();
    let authority = req.uri().authority();
    match req.version() {
        Version::HTTP_2 | Version::HTTP_3 => {
            // `:authority` routes; a `host` naming something else is malformed.
            if let (Some(host), Some(authority)) = (host, authority) {
                if !same_host(host.as_bytes(), authority.as_str()) {
                    return Err(Rejection::BadRequest {
                        reason: "Host header differs from :authority",
                    });
                }
            }
        }
        Version::HTTP_11 => {
            let Some(host) = host else {
                return Err(Rejection::BadRequest {
                    reason: "missing Host header",
                });
            };
            if let Some(authority) = authority {
                if !same_host(host.as_bytes(), authority.as_str()) {
                    if let Ok(v) = HeaderValue::from_str(authority.as_str()) {
                        req.headers_mut().insert(header::HOST, v.clone());
                        glance.host = Some(v);
                    }
                }
            }
        }
        // HTTP/1.0 needs no Host.
        _ => {}
    }
    Ok(())
}

/// Whether a `Host` value and an authority name the same host: compared as routing
/// compares them (case-insensitive, trailing dot ignored), ports only when both give one.
fn same_host(host: &[u8], authority: &str) -> bool {
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let (a_name, a_port) = split_port(host);
    let (b_name, b_port) = split_port(authority);
    normalize_host(a_name) == normalize_host(b_name)
        && (a_port.is_none() || b_port.is_none() || a_port == b_port)
}

fn split_port(host: &str) -> (&str, Option<&str>) {
    let name = host_without_port(host);
    let port = host[name.len()..].strip_prefix(':');
    (name, port)
}

/// `Upgrade: h2c` (HTTP/2 over cleartext, the known smuggling vector) is not honoured:
/// the request is served as plain HTTP/1.1, as nginx and HAProxy do, instead of handing
/// the app's `101` a raw tunnel. Other upgrades (WebSocket) pass as upstream.
fn refuse_h2c(headers: &mut HeaderMap) {
    let asks_h2c = headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case("h2c"));
    if asks_h2c {
        tracing::debug!("Refusing h2c upgrade");
        headers.remove(header::UPGRADE);
        headers.remove(&HTTP2_SETTINGS);
    }
}

static HTTP2_SETTINGS: header::HeaderName = header::HeaderName::from_static("http2-settings");

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: Version, uri: &str, hosts: &[&str]) -> Request<()> {
        let mut b = Request::builder().version(version).uri(uri);
        for h in hosts {
            b = b.header(header::HOST, *h);
        }
        b.body(()).unwrap()
    }

    /// Settles `r` as the pipeline does, after a glance at its fields.
    fn settle_<B>(r: &mut Request<B>) -> Result<(), Rejection> {
        let mut glance = Glance::of(r.headers());
        settle(r, &mut glance)
    }

    fn reason(r: Result<(), Rejection>) -> Option<&'static str> {
        match r {
            Err(Rejection::BadRequest { reason }) => Some(reason),
            _ => None,
        }
    }

    #[test]
    fn http11_needs_exactly_one_host() {
        let mut r = request(Version::HTTP_11, "/", &[]);
        assert_eq!(reason(settle_(&mut r)), Some("missing Host header"));
        let mut r = request(Version::HTTP_11, "/", &["a.test", "b.test"]);
        assert_eq!(reason(settle_(&mut r)), Some("duplicate Host header"));
        let mut r = request(Version::HTTP_10, "/", &[]);
        assert!(settle_(&mut r).is_ok());
        let mut r = request(Version::HTTP_11, "/", &["a.test"]);
        assert!(settle_(&mut r).is_ok());
    }

    #[test]
    fn an_absolute_target_names_the_host() {
        let mut r = request(Version::HTTP_11, "http://b.test/x", &["a.test"]);
        let mut glance = Glance::of(r.headers());
        assert!(settle(&mut r, &mut glance).is_ok());
        assert_eq!(r.headers()[header::HOST], "b.test");
        assert_eq!(
            glance.host.unwrap(),
            "b.test",
            "the router sees the same host"
        );
    }

    #[test]
    fn http2_authority_and_host_must_agree() {
        let mut r = request(Version::HTTP_2, "https://a.test/", &["b.test"]);
        assert_eq!(
            reason(settle_(&mut r)),
            Some("Host header differs from :authority")
        );
        for same in ["A.test", "a.test.", "a.test:443"] {
            let mut r = request(Version::HTTP_2, "https://a.test:443/", &[same]);
            assert!(settle_(&mut r).is_ok(), "{same}");
        }
        let mut r = request(Version::HTTP_2, "https://a.test:8443/", &["a.test:443"]);
        assert!(settle_(&mut r).is_err());
        let mut r = request(Version::HTTP_2, "https://a.test/", &[]);
        assert!(settle_(&mut r).is_ok());
    }

    #[test]
    fn h2c_upgrades_are_dropped_others_kept() {
        let mut r = request(Version::HTTP_11, "/", &["a.test"]);
        r.headers_mut()
            .insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        r.headers_mut().insert(
            &HTTP2_SETTINGS,
            HeaderValue::from_static("AAMAAABkAAQAoAAAAAIAAAAA"),
        );
        settle_(&mut r).unwrap();
        assert!(!r.headers().contains_key(header::UPGRADE));
        assert!(!r.headers().contains_key(&HTTP2_SETTINGS));

        let mut r = request(Version::HTTP_11, "/", &["a.test"]);
        r.headers_mut()
            .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        settle_(&mut r).unwrap();
        assert_eq!(r.headers()[header::UPGRADE], "websocket");
    }
}
