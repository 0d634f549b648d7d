//! What the pipeline's first steps read of a request's fields (the access record, the host
//! checks, the request id), found in one pass over them.
//!
//! Each of those reads was a hashed look-up of its own, about 90 instructions for a
//! standard name and 100 more to hash a custom one (`X-Forwarded-For`, `X-Request-Id`),
//! and the host was looked up three times: about 700 instructions a request in all
//! (bench/README.md, "Eleventh round"). One pass over the few fields a request carries
//! costs a comparison of lengths for most of them.

use http::{HeaderMap, HeaderValue};

/// The fields the first steps read. Values are shared, not copied (a reference count).
#[derive(Debug, Default)]
pub struct Glance {
    /// The first `Host`, and whether there was another.
    pub host: Option<HeaderValue>,
    pub more_hosts: bool,
    /// The first `X-Forwarded-For`, and whether there was another.
    pub forwarded_for: Option<HeaderValue>,
    pub more_forwarded_for: bool,
    pub content_type: Option<HeaderValue>,
    pub user_agent: Option<HeaderValue>,
    /// An `Upgrade` field was sent.
    pub upgrade: bool,
    /// The client's `X-Request-Id`, when its first value is not empty.
    pub request_id: Option<HeaderValue>,
    /// The client sent an `X-Request-Id`, empty or not.
    pub request_id_sent: bool,
    /// The client's `X-Request-Start` has a first value that is not empty.
    pub request_start: bool,
    /// The client sent an `X-Request-Start`, empty or not.
    pub request_start_sent: bool,
}

impl Glance {
    pub fn of(headers: &HeaderMap) -> Self {
        let mut g = Glance::default();
        for (name, value) in headers {
            match name.as_str() {
                "host" => first(&mut g.host, &mut g.more_hosts, value),
                "x-forwarded-for" => first(&mut g.forwarded_for, &mut g.more_forwarded_for, value),
                "content-type" if g.content_type.is_none() => g.content_type = Some(value.clone()),
                "user-agent" if g.user_agent.is_none() => g.user_agent = Some(value.clone()),
                "upgrade" => g.upgrade = true,
                // Only the first value counts, as `HeaderMap::get` has it.
                "x-request-id" if !std::mem::replace(&mut g.request_id_sent, true) => {
                    g.request_id = Some(value.clone()).filter(|v| !v.is_empty());
                }
                "x-request-start" if !std::mem::replace(&mut g.request_start_sent, true) => {
                    g.request_start = !value.is_empty();
                }
                _ => {}
            }
        }
        g
    }
}

fn first(slot: &mut Option<HeaderValue>, more: &mut bool, value: &HeaderValue) {
    if slot.is_some() {
        *more = true;
    } else {
        *slot = Some(value.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    /// What a look-up of each name finds.
    #[test]
    fn a_glance_finds_what_look_ups_find() {
        let mut h = HeaderMap::new();
        h.append(header::HOST, HeaderValue::from_static("a.test"));
        h.append(header::HOST, HeaderValue::from_static("b.test"));
        h.append("x-forwarded-for", HeaderValue::from_static("1.1.1.1"));
        h.append("X-Forwarded-For", HeaderValue::from_static("2.2.2.2"));
        h.append(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.append(header::USER_AGENT, HeaderValue::from_static("curl/8"));
        h.append(header::USER_AGENT, HeaderValue::from_static("other"));
        h.append(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.append("x-request-id", HeaderValue::from_static(""));
        h.append("x-request-id", HeaderValue::from_static("later"));
        h.append("x-request-start", HeaderValue::from_static("t=1"));
        h.append("x-other", HeaderValue::from_static("1"));
        let g = Glance::of(&h);
        assert_eq!(g.host.as_ref(), h.get(header::HOST));
        assert!(g.more_hosts);
        assert_eq!(g.forwarded_for.as_ref(), h.get("x-forwarded-for"));
        assert!(g.more_forwarded_for);
        assert_eq!(g.content_type.as_ref(), h.get(header::CONTENT_TYPE));
        assert_eq!(g.user_agent.as_ref(), h.get(header::USER_AGENT));
        assert!(g.upgrade);
        assert_eq!(g.request_id, None, "an empty first value is none");
        assert!(g.request_id_sent);
        assert!(g.request_start);
        assert!(g.request_start_sent);

        let mut h = HeaderMap::new();
        h.append(header::HOST, HeaderValue::from_static("a.test"));
        h.append("x-request-id", HeaderValue::from_static("abc"));
        h.append("x-request-start", HeaderValue::from_static(""));
        let g = Glance::of(&h);
        assert_eq!(g.host.as_ref(), h.get(header::HOST));
        assert!(!g.more_hosts);
        assert_eq!(g.forwarded_for, None);
        assert!(!g.more_forwarded_for);
        assert!(!g.upgrade);
        assert_eq!(g.request_id.as_ref(), h.get("x-request-id"));
        assert!(!g.request_start);
        assert!(g.request_id_sent && g.request_start_sent);
        assert_eq!(g.content_type, None);
        let g = Glance::of(&HeaderMap::new());
        assert!(!g.request_id_sent && !g.request_start_sent);
        assert_eq!(g.user_agent, None);
    }
}
