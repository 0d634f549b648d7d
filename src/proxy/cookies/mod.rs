//! The cookies the proxy itself reads and writes: `kamal-rollout` and `kamal-writer` on
//! requests, the writer-affinity cookie on responses (upstream §4.4), the session
//! affinity pin (fork F17, in [`session`]) and `--scope-cookie-paths` (upstream §4.12, in
//! [`set_cookie`]).
//!
//! Requests are read the way Go's `Request.Cookie` reads them, so a cookie routes a
//! request here exactly as it does in Go kamal-proxy.

use http::header::{COOKIE, HeaderMap, HeaderName, HeaderValue, SET_COOKIE};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod session;
mod set_cookie;

pub use session::{SessionPin, set_session_pin, validate_session_affinity};
pub use set_cookie::scope_cookie_paths;

/// The cookie that sends a client's reads to a writer for a while after it wrote.
pub const WRITER_COOKIE: &str = "kamal-writer";

/// An app's answer `X-Writer-Affinity: false` asks for no writer cookie on this response.
pub static X_WRITER_AFFINITY: HeaderName = HeaderName::from_static("x-writer-affinity");

/// The value of the first valid cookie called `name` in the request's `Cookie` headers
/// (surrounding quotes removed), as Go's `Request.Cookie` finds it. Borrows: nothing is
/// allocated on the request path.
pub fn request_cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|line| line.to_str().ok())
        .flat_map(|line| trim_ascii(line).split(';'))
        .find_map(|pair| {
            let (n, v) = trim_ascii(pair).split_once('=')?;
            if n != name || !is_token(n) {
                return None;
            }
            let v = match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
                Some(inner) => inner,
                None => v,
            };
            v.bytes().all(valid_value_byte).then_some(v)
        })
}

/// Whether the request carries a `kamal-writer` cookie that has not expired yet (its value
/// is the expiry in Unix milliseconds).
pub fn has_live_writer_cookie(headers: &HeaderMap) -> bool {
    request_cookie(headers, WRITER_COOKIE)
        .and_then(|v| v.parse::<i64>().ok())
        .is_some_and(|expires| unix_millis(SystemTime::now()) < expires)
}

/// Upstream's writer affinity, on the response to a write: a `kamal-writer` cookie that
/// sends the client's reads to a writer for `timeout`, unless the app answered
/// `X-Writer-Affinity: false`. The opt-out header itself never reaches the client.
pub fn set_writer_affinity(headers: &mut HeaderMap, timeout: Duration) {
    let opted_out = headers
        .get(&X_WRITER_AFFINITY)
        .is_some_and(|v| v.as_bytes() == b"false");
    headers.remove(&X_WRITER_AFFINITY);
    if opted_out {
        return;
    }
    let expires = SystemTime::now() + timeout;
    // One second more on the cookie itself, as upstream, so the browser never drops it
    // before the proxy stops honouring it.
    let cookie_expires = unix_secs(expires) + 1;
    let mut value = format!("{WRITER_COOKIE}={}; Path=/; Expires=", unix_millis(expires));
    let _ = set_cookie::write_http_date(&mut value, cookie_expires);
    value.push_str("; HttpOnly");
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.append(SET_COOKIE, v);
    }
}

fn unix_millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Go's `textproto.TrimString`: ASCII whitespace only.
fn trim_ascii(s: &str) -> &str {
    s.trim_matches([' ', '\t', '\n', '\r'])
}

/// An HTTP token (a cookie name).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Go's `validCookieValueByte`.
fn valid_value_byte(b: u8) -> bool {
    (0x20..0x7f).contains(&b) && b != b'"' && b != b';' && b != b'\\'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn request_cookies_are_read_as_go_reads_them() {
        let h = headers(&[
            ("cookie", "a=1; kamal-rollout=\"alice\""),
            ("cookie", "kamal-rollout=bob"),
        ]);
        assert_eq!(request_cookie(&h, "kamal-rollout"), Some("alice"));
        assert_eq!(request_cookie(&h, "a"), Some("1"));
        assert_eq!(request_cookie(&h, "b"), None);
        // A value Go refuses is skipped, and the next one is taken.
        let h = headers(&[("cookie", "k=a\\b; k=ok")]);
        assert_eq!(request_cookie(&h, "k"), Some("ok"));
    }

    #[test]
    fn writer_cookie_liveness() {
        let now = unix_millis(SystemTime::now());
        let live = headers(&[("cookie", &format!("kamal-writer={}", now + 60_000))]);
        assert!(has_live_writer_cookie(&live));
        let stale = headers(&[("cookie", &format!("kamal-writer={}", now - 1))]);
        assert!(!has_live_writer_cookie(&stale));
        assert!(!has_live_writer_cookie(&headers(&[(
            "cookie",
            "kamal-writer=soon"
        )])));
        assert!(!has_live_writer_cookie(&HeaderMap::new()));
    }

    #[test]
    fn writer_affinity_cookie_and_opt_out() {
        let mut h = headers(&[("set-cookie", "app=1")]);
        let before = unix_millis(SystemTime::now());
        set_writer_affinity(&mut h, Duration::from_millis(200));
        let cookies: Vec<&str> = h
            .get_all(SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(cookies[0], "app=1");
        let ours = cookies[1];
        let value: i64 = ours
            .strip_prefix("kamal-writer=")
            .and_then(|r| r.split(';').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!(value >= before + 200, "{ours}");
        assert!(
            ours.contains("; Path=/; Expires=") && ours.ends_with(" GMT; HttpOnly"),
            "{ours}"
        );

        let mut h = headers(&[("x-writer-affinity", "false")]);
        set_writer_affinity(&mut h, Duration::from_secs(1));
        assert!(
            h.is_empty(),
            "no cookie, and the opt-out header is removed: {h:?}"
        );
        let mut h = headers(&[("x-writer-affinity", "true")]);
        set_writer_affinity(&mut h, Duration::from_secs(1));
        assert!(h.contains_key(SET_COOKIE) && !h.contains_key(&X_WRITER_AFFINITY));
    }
}
