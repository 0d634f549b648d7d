//! The fields the proxy sets on a request on its way to the target: `X-Forwarded-For`,
//! `-Host` and `-Proto` (upstream's rules, from Go's `httputil.ReverseProxy`), and
//! `X-Kamal-Target`; the client's `Forwarded` goes. With them, the `X-Request-Id` and
//! `X-Request-Start` the proxy made when the request arrived without them.
//!
//! They are worked out once per attempt and put on the request only where it leaves:
//! written straight into the head by our own HTTP/1 connection, or set in the header map
//! handed to hyper's. Setting them in the map first cost a hashed look-up and an insert
//! for each of the four custom names, about 1,000 instructions a request
//! (bench/README.md, "Eleventh round"), for a map that our connection then only reads.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use std::borrow::Cow;

use super::headers::{
    Field, Present, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO, X_KAMAL_TARGET,
    X_REQUEST_ID, X_REQUEST_START,
};
use crate::short_copy::append;

static FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// What a request's forwarding fields come from.
pub struct ForwardedFor<'a> {
    /// The client's address, from [`super::headers::ip_value`].
    pub client_ip: &'a HeaderValue,
    /// The host the client asked for.
    pub host: Option<&'a HeaderValue>,
    pub tls: bool,
    /// `--forward-headers`: trust and extend what the client sent.
    pub trust_client: bool,
    /// The `X-Request-Id` and `X-Request-Start` the proxy made when the request arrived
    /// without them (`Exchange::arrival_fields`). They were not put in the request's map
    /// then: an insert of a custom name there cost about 250 instructions, for a map that
    /// our HTTP/1 connection only reads.
    pub arrival: (Option<&'a HeaderValue>, Option<&'a HeaderValue>),
}

/// The proxy's fields for one request. `None`: the field is not sent at all (nor is the
/// client's). A value the proxy already holds (the client's address, the host asked for,
/// the target's name) is borrowed, not cloned: a clone raises and drops a reference count,
/// and the target's is written by every worker that sends it a request (bench/README.md,
/// "Twenty-fourth round").
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProxyFields<'a> {
    forwarded_for: Option<Cow<'a, HeaderValue>>,
    forwarded_host: Option<Cow<'a, HeaderValue>>,
    forwarded_proto: Option<Cow<'a, HeaderValue>>,
    target: Option<Cow<'a, HeaderValue>>,
    /// `X-Request-Id` and `X-Request-Start` as the proxy made them when the request
    /// arrived without them ([`ForwardedFor::arrival`]); `None`: the client's, if any,
    /// are in its map and go as they are.
    /// Borrowed from the request's record: a clone is a reference count raised and
    /// dropped, an atomic read-modify-write each.
    request_id: Option<&'a HeaderValue>,
    request_start: Option<&'a HeaderValue>,
}

impl<'a> ProxyFields<'a> {
    /// The fields for a request whose client sent `client` (read only when trusted;
    /// `present`: what [`Present::of`] found in it) and that goes to the target at `target`.
    pub fn new(
        client: &HeaderMap,
        present: Present,
        f: &ForwardedFor<'a>,
        target: &'a HeaderValue,
    ) -> Self {
        let proto = Cow::Owned(HeaderValue::from_static(if f.tls {
            "https"
        } else {
            "http"
        }));
        let (request_id, request_start) = f.arrival;
        let host = f.host.map(Cow::Borrowed);
        if !f.trust_client {
            // Nothing the client sent is kept.
            return ProxyFields {
                forwarded_for: Some(Cow::Borrowed(f.client_ip)),
                forwarded_host: host,
                forwarded_proto: Some(proto),
                target: Some(Cow::Borrowed(target)),
                request_id,
                request_start,
            };
        }
        // Trusted (the default for plain HTTP), the client's values are read, but most
        // requests carry none: `present` tells which to look up (four look-ups of custom
        // names cost about 600 instructions a request).
        let for_sent = present.has(Field::XForwardedFor);
        let host_sent = present.has(Field::XForwardedHost);
        let proto_sent = present.has(Field::XForwardedProto);
        let target_sent = present.has(Field::XKamalTarget);
        ProxyFields {
            // The chain the client sent, with its address added.
            forwarded_for: if for_sent {
                joined(client.get_all(&X_FORWARDED_FOR), false, f.client_ip)
            } else {
                Some(Cow::Borrowed(f.client_ip))
            },
            // The client's first non-empty value, else the proxy's own.
            forwarded_host: first_or(host_sent, client, &X_FORWARDED_HOST, host),
            forwarded_proto: first_or(proto_sent, client, &X_FORWARDED_PROTO, Some(proto)),
            target: if target_sent {
                joined(client.get_all(&X_KAMAL_TARGET), true, target)
            } else {
                Some(Cow::Borrowed(target))
            },
            request_id,
            request_start,
        }
    }

    /// Whether a field of the client's request gives way to these (`Forwarded` among
    /// them: it goes).
    pub fn replaces(name: &HeaderName) -> bool {
        matches!(
            name.as_str(),
            "x-forwarded-for"
                | "x-forwarded-host"
                | "x-forwarded-proto"
                | "x-kamal-target"
                | "forwarded"
        )
    }

    /// Sets the fields in `headers`, replacing the client's.
    pub fn apply(&self, headers: &mut HeaderMap) {
        headers.remove(&FORWARDED);
        for (name, value) in self.fields() {
            match value {
                Some(v) => drop(headers.insert(name, v.clone())),
                None => drop(headers.remove(name)),
            }
        }
        for (name, value) in self.arrival() {
            if let Some(v) = value {
                headers.insert(name, v.clone());
            }
        }
    }

    /// Writes the fields as lines of an HTTP/1 head (names in lower case, as hyper writes
    /// them). The client's fields of these names must have been left out.
    pub fn write(&self, out: &mut Vec<u8>) {
        for (name, value) in self.fields().into_iter().chain(self.arrival()) {
            if let Some(v) = value {
                append(out, name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                append(out, v.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        }
    }

    fn fields(&self) -> [(&'static HeaderName, Option<&HeaderValue>); 4] {
        [
            (&X_FORWARDED_FOR, self.forwarded_for.as_deref()),
            (&X_FORWARDED_HOST, self.forwarded_host.as_deref()),
            (&X_FORWARDED_PROTO, self.forwarded_proto.as_deref()),
            (&X_KAMAL_TARGET, self.target.as_deref()),
        ]
    }

    fn arrival(&self) -> [(&'static HeaderName, Option<&HeaderValue>); 2] {
        [
            (&X_REQUEST_ID, self.request_id),
            (&X_REQUEST_START, self.request_start),
        ]
    }
}

/// The client's values joined by `", "`, then `last`; empty values are skipped when
/// `skip_empty`. `None` only if the joined text is not a valid value.
fn joined<'a>(
    prior: http::header::GetAll<'_, HeaderValue>,
    skip_empty: bool,
    last: &'a HeaderValue,
) -> Option<Cow<'a, HeaderValue>> {
    let mut text = Vec::new();
    for v in prior.iter().filter(|v| !(skip_empty && v.is_empty())) {
        text.extend_from_slice(v.as_bytes());
        text.extend_from_slice(b", ");
    }
    if text.is_empty() {
        return Some(Cow::Borrowed(last));
    }
    text.extend_from_slice(last.as_bytes());
    HeaderValue::from_bytes(&text).ok().map(Cow::Owned)
}

/// The first value the client sent (if `sent`) when it is not empty, else `fallback`.
/// (A copy of the client's: its map is changed before the fields leave.)
fn first_or<'a>(
    sent: bool,
    client: &HeaderMap,
    name: &HeaderName,
    fallback: Option<Cow<'a, HeaderValue>>,
) -> Option<Cow<'a, HeaderValue>> {
    if !sent {
        return fallback;
    }
    match client.get(name) {
        Some(first) if !first.is_empty() => Some(Cow::Owned(first.clone())),
        _ => fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    fn all(h: &HeaderMap, n: &HeaderName) -> Vec<String> {
        h.get_all(n)
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect()
    }

    /// The client's fields as hyper's connection gets them. (That our own connection
    /// writes the same: `http1::tests`.)
    fn sent(client: &HeaderMap, f: &ForwardedFor<'_>, target: &str) -> HeaderMap {
        let mut applied = client.clone();
        ProxyFields::new(client, Present::of(client), f, &hv(target)).apply(&mut applied);
        applied
    }

    #[test]
    fn forwarded_headers_default_and_trusted() {
        let host = hv("example.com:8080");
        let mut h = HeaderMap::new();
        h.insert(&X_FORWARDED_FOR, hv("1.2.3.4"));
        h.insert(&X_FORWARDED_PROTO, hv("https"));
        h.insert(header::USER_AGENT, hv("curl"));
        let f = ForwardedFor {
            client_ip: &hv("10.0.0.1"),
            host: Some(&host),
            tls: false,
            trust_client: false,
            arrival: (None, None),
        };
        let untrusted = sent(&h, &f, "web:3000");
        assert_eq!(untrusted[&X_FORWARDED_FOR], "10.0.0.1");
        assert_eq!(untrusted[&X_FORWARDED_PROTO], "http");
        assert_eq!(untrusted[&X_FORWARDED_HOST], "example.com:8080");
        assert_eq!(untrusted[header::USER_AGENT], "curl");
        let f = ForwardedFor {
            trust_client: true,
            ..f
        };
        let trusted = sent(&h, &f, "web:3000");
        assert_eq!(trusted[&X_FORWARDED_FOR], "1.2.3.4, 10.0.0.1");
        assert_eq!(trusted[&X_FORWARDED_PROTO], "https");
        assert_eq!(trusted[&X_FORWARDED_HOST], "example.com:8080");
    }

    #[test]
    fn trusted_forwarded_headers_with_several_or_empty_values() {
        let client = super::super::headers::ip_value("10.0.0.1".parse().unwrap());
        let host = hv("example.com");
        let f = ForwardedFor {
            client_ip: &client,
            host: Some(&host),
            tls: true,
            trust_client: true,
            arrival: (None, None),
        };
        let mut h = HeaderMap::new();
        h.append(&X_FORWARDED_FOR, hv("1.1.1.1"));
        h.append(&X_FORWARDED_FOR, hv("2.2.2.2"));
        h.append(&X_FORWARDED_HOST, hv("first.example"));
        h.append(&X_FORWARDED_HOST, hv("second.example"));
        h.append(&X_FORWARDED_PROTO, hv(""));
        h.append(&X_FORWARDED_PROTO, hv("http"));
        h.insert(&FORWARDED, hv("for=3.3.3.3"));
        let out = sent(&h, &f, "web:3000");
        assert_eq!(all(&out, &X_FORWARDED_FOR), ["1.1.1.1, 2.2.2.2, 10.0.0.1"]);
        assert_eq!(all(&out, &X_FORWARDED_HOST), ["first.example"]);
        // An empty first value counts as absent: the proxy's own goes on.
        assert_eq!(all(&out, &X_FORWARDED_PROTO), ["https"]);
        assert!(out.get(&FORWARDED).is_none());

        let mut h = HeaderMap::new();
        h.append(&X_FORWARDED_HOST, hv(""));
        let out = sent(&h, &ForwardedFor { host: None, ..f }, "web:3000");
        assert_eq!(all(&out, &X_FORWARDED_FOR), ["10.0.0.1"]);
        assert!(out.get(&X_FORWARDED_HOST).is_none());
    }

    #[test]
    fn the_untrusted_client_s_forwarding_fields_all_go() {
        let mut h = HeaderMap::new();
        h.append(&X_FORWARDED_FOR, hv("6.6.6.6"));
        h.append(&X_FORWARDED_HOST, hv("evil.example"));
        h.append(&X_KAMAL_TARGET, hv("elsewhere:1"));
        h.append(&FORWARDED, hv("for=6.6.6.6"));
        let f = ForwardedFor {
            client_ip: &hv("10.0.0.1"),
            host: None,
            tls: true,
            trust_client: false,
            arrival: (None, None),
        };
        let out = sent(&h, &f, "web:3000");
        assert_eq!(all(&out, &X_FORWARDED_FOR), ["10.0.0.1"]);
        assert!(out.get(&X_FORWARDED_HOST).is_none());
        assert_eq!(all(&out, &X_FORWARDED_PROTO), ["https"]);
        assert_eq!(all(&out, &X_KAMAL_TARGET), ["web:3000"]);
        assert!(out.get(&FORWARDED).is_none());
        assert_eq!(out.len(), 3);
    }

    #[test]
    fn target_header_appends_to_trusted_client_values() {
        let f = |trust_client| ForwardedFor {
            client_ip: &X_IP,
            host: None,
            tls: false,
            trust_client,
            arrival: (None, None),
        };
        static X_IP: HeaderValue = HeaderValue::from_static("10.0.0.1");
        let out = sent(&HeaderMap::new(), &f(true), "web:3000");
        assert_eq!(all(&out, &X_KAMAL_TARGET), ["web:3000"]);
        let mut h = HeaderMap::new();
        h.append(&X_KAMAL_TARGET, hv("a:1"));
        h.append(&X_KAMAL_TARGET, hv(""));
        h.append(&X_KAMAL_TARGET, hv("b:2"));
        let out = sent(&h, &f(true), "web:3000");
        assert_eq!(all(&out, &X_KAMAL_TARGET), ["a:1, b:2, web:3000"]);
        let out = sent(&h, &f(false), "web:3000");
        assert_eq!(all(&out, &X_KAMAL_TARGET), ["web:3000"]);
    }

    #[test]
    fn only_the_proxy_s_names_are_replaced() {
        for name in [
            "x-forwarded-for",
            "X-Forwarded-Host",
            "x-forwarded-proto",
            "x-kamal-target",
            "Forwarded",
        ] {
            assert!(
                ProxyFields::replaces(&HeaderName::from_bytes(name.as_bytes()).unwrap()),
                "{name}"
            );
        }
        for name in [
            "host",
            "x-forwarded-port",
            "x-request-id",
            "forwarded-for",
            "x-kamal",
            "te",
        ] {
            assert!(
                !ProxyFields::replaces(&HeaderName::from_bytes(name.as_bytes()).unwrap()),
                "{name}"
            );
        }
        let mut out = Vec::new();
        ProxyFields::default().write(&mut out);
        assert!(out.is_empty(), "no fields, nothing written");
    }

    #[test]
    fn arrival_fields_are_added_and_the_client_s_are_left_alone_without_them() {
        let mut client = HeaderMap::new();
        client.insert(&X_REQUEST_ID, hv("client-id"));
        client.insert(&X_REQUEST_START, hv("t=1"));
        let mut applied = client.clone();
        ProxyFields::default().apply(&mut applied);
        assert_eq!(all(&applied, &X_REQUEST_ID), ["client-id"]);
        assert_eq!(all(&applied, &X_REQUEST_START), ["t=1"]);

        let (id, start) = (hv("made-id"), hv("t=2"));
        for trust_client in [false, true] {
            let f = ForwardedFor {
                client_ip: &hv("10.0.0.1"),
                host: None,
                tls: false,
                trust_client,
                arrival: (Some(&id), Some(&start)),
            };
            let target = hv("w:1");
            let made = ProxyFields::new(&HeaderMap::new(), Present::default(), &f, &target);
            let mut applied = HeaderMap::new();
            made.apply(&mut applied);
            assert_eq!(all(&applied, &X_REQUEST_ID), ["made-id"]);
            assert_eq!(all(&applied, &X_REQUEST_START), ["t=2"]);
            let mut out = Vec::new();
            made.write(&mut out);
            let out = String::from_utf8(out).unwrap();
            assert!(
                out.ends_with("x-request-id: made-id\r\nx-request-start: t=2\r\n"),
                "{out}"
            );
        }
    }
}
