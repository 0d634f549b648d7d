//! The session affinity cookie (fork F17): `<name>=<pin>` on an app's response when the
//! request was pinned to a target its cookie did not already name. The pin itself (what
//! it is, which target it names) is the balancer's (`balancer::affinity`).

use http::header::{HeaderMap, HeaderValue, SET_COOKIE};

use super::{WRITER_COOKIE, is_token};
use crate::balancer::rollout::ROLLOUT_COOKIE;

/// The cookie to set on an app's response.
#[derive(Clone, Copy, Debug)]
pub struct SessionPin<'a> {
    /// `--session-affinity-cookie`, `kamal-session` by default.
    pub name: &'a str,
    /// The chosen target's pin.
    pub value: &'a str,
    /// The request came over TLS: a cookie sent back over plain HTTP could be read on
    /// the way, so over TLS it is marked `Secure`.
    pub secure: bool,
}

/// Appends the pin cookie: no expiry (it lasts the browser session), `HttpOnly` (no
/// script needs it), `SameSite=Lax`; attributes in the order Go's `http.SetCookie` writes
/// them, as the fork does.
pub fn set_session_pin(headers: &mut HeaderMap, pin: &SessionPin<'_>) {
    let secure = if pin.secure { "; Secure" } else { "" };
    let value = format!(
        "{}={}; Path=/; HttpOnly{secure}; SameSite=Lax",
        pin.name, pin.value
    );
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.append(SET_COOKIE, v);
    }
}

/// `--session-affinity-cookie` (the fork's messages): a cookie name, only with
/// `--session-affinity`, and never one of the cookies the proxy reads for routing, whose
/// values mean something else.
pub fn validate_session_affinity(enabled: bool, cookie: &str) -> Result<(), String> {
    if cookie.is_empty() {
        return Ok(());
    }
    if !enabled {
        return Err("session-affinity-cookie requires session-affinity".into());
    }
    if !is_token(cookie) {
        return Err(format!(
            "session-affinity-cookie \"{cookie}\" is not a valid cookie name"
        ));
    }
    if cookie == WRITER_COOKIE || cookie == ROLLOUT_COOKIE {
        return Err(format!(
            "session-affinity-cookie \"{cookie}\" is a cookie the proxy already reads for routing; choose another name"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cookies(h: &HeaderMap) -> Vec<&str> {
        h.get_all(SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn the_cookie_s_attributes() {
        let mut h = HeaderMap::new();
        h.append(SET_COOKIE, HeaderValue::from_static("app=1"));
        let pin = SessionPin {
            name: "kamal-session",
            value: "0465ba8e983ea1e5c44925cd236d30af",
            secure: false,
        };
        set_session_pin(&mut h, &pin);
        set_session_pin(
            &mut h,
            &SessionPin {
                secure: true,
                ..pin
            },
        );
        assert_eq!(
            cookies(&h),
            [
                "app=1",
                "kamal-session=0465ba8e983ea1e5c44925cd236d30af; Path=/; HttpOnly; SameSite=Lax",
                "kamal-session=0465ba8e983ea1e5c44925cd236d30af; Path=/; HttpOnly; Secure; SameSite=Lax",
            ]
        );
    }

    #[test]
    fn the_flags_are_checked() {
        assert_eq!(validate_session_affinity(false, ""), Ok(()));
        assert_eq!(validate_session_affinity(true, ""), Ok(()));
        assert_eq!(validate_session_affinity(true, "sticky"), Ok(()));
        assert_eq!(
            validate_session_affinity(false, "sticky").unwrap_err(),
            "session-affinity-cookie requires session-affinity"
        );
        for bad in ["a b", "a;b", "a=b", "é", "a,b", "\"a\""] {
            assert_eq!(
                validate_session_affinity(true, bad).unwrap_err(),
                format!("session-affinity-cookie \"{bad}\" is not a valid cookie name")
            );
        }
        assert!(
            validate_session_affinity(true, "kamal-writer")
                .unwrap_err()
                .contains("already reads")
        );
        assert!(validate_session_affinity(true, "kamal-rollout").is_err());
    }
}
