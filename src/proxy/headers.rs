//! Header rewriting between client and upstream, as upstream's Go `httputil.ReverseProxy`
//! does it: hop-by-hop headers removed, upgrades re-announced. (`X-Forwarded-*`:
//! [`super::proxy_fields`].)

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub static X_REQUEST_START: HeaderName = HeaderName::from_static("x-request-start");
pub static X_KAMAL_TARGET: HeaderName = HeaderName::from_static("x-kamal-target");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// What [`remove_hop_by_hop`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HopByHop {
    /// A `TE` asked for `trailers`, which a request may pass on (as Go's proxy does).
    pub trailers: bool,
    /// `Connection` named fields beyond the standard hop-by-hop set, and they went (a
    /// request's `Host` among them, which the proxy then sets again).
    pub named_others: bool,
}

/// A field the forwarding path asks about. The first nine are [`HOP_BY_HOP`], in its
/// order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Connection,
    ProxyConnection,
    KeepAlive,
    ProxyAuthenticate,
    ProxyAuthorization,
    Trailer,
    TransferEncoding,
    Upgrade,
    Te,
    Host,
    XForwardedFor,
    XForwardedHost,
    XForwardedProto,
    XKamalTarget,
}

/// Which [`Field`]s a map holds, found in one pass over its names. Most requests and
/// responses carry none but `Host`, and a hashed look-up of each field asked about cost
/// 90–170 instructions (bench/README.md, "Twenty-third round").
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Present(u16);

impl Present {
    pub fn of(headers: &HeaderMap) -> Present {
        Self::with_host(headers).0
    }

    /// [`Present::of`], and the first `Host` value, found in the same pass.
    pub fn with_host(headers: &HeaderMap) -> (Present, Option<&HeaderValue>) {
        let mut bits = 0;
        let mut host = None;
        for (name, value) in headers {
            if let Some(field) = field_of(name) {
                bits |= 1 << field as u16;
                if field == Field::Host && host.is_none() {
                    host = Some(value);
                }
            }
        }
        (Present(bits), host)
    }

    pub fn has(self, field: Field) -> bool {
        self.0 & (1 << field as u16) != 0
    }

    fn any_hop_by_hop(self) -> bool {
        self.0 & ((1 << HOP_BY_HOP.len()) - 1) != 0
    }
}

/// Removes hop-by-hop headers, including any named in `Connection`. `present`: what
/// [`Present::of`] found in `headers`.
pub fn remove_hop_by_hop(headers: &mut HeaderMap, present: Present) -> HopByHop {
    if !present.any_hop_by_hop() {
        return HopByHop::default();
    }
    let trailers = present.has(Field::Te)
        && headers
            .get_all(header::TE)
            .iter()
            .any(|te| has_token(te.as_bytes(), b"trailers"));
    let mut named_others = false;
    if present.has(Field::Connection) {
        // Names listed in `Connection` beyond the standard set (its tokens are mostly
        // `keep-alive` or `upgrade`, which the set covers: then nothing is allocated).
        // A token of the standard set is compared as bytes: making it a `HeaderName`
        // first cost about 500 instructions for the usual `keep-alive` of a response.
        let mut named: Vec<HeaderName> = Vec::new();
        for value in headers.get_all(header::CONNECTION) {
            for token in value.as_bytes().split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.is_empty() || names_standard_hop_by_hop(token) {
                    continue;
                }
                if let Ok(name) = HeaderName::from_bytes(token) {
                    named.push(name);
                }
            }
        }
        named_others = !named.is_empty();
        for n in named {
            headers.remove(n);
        }
    }
    for (i, h) in HOP_BY_HOP.iter().enumerate() {
        if present.0 & (1 << i) != 0 {
            headers.remove(*h);
        }
    }
    HopByHop {
        trailers,
        named_others,
    }
}

/// Which [`Field`] `name` is. Matched on the name's text, whose length alone rules out
/// most names: comparing each name with every `HeaderName` of the list cost about 70
/// instructions a name, some 500 a request (bench/README.md, "Ninth round").
fn field_of(name: &HeaderName) -> Option<Field> {
    let field = match name.as_str() {
        "connection" => Field::Connection,
        "proxy-connection" => Field::ProxyConnection,
        "keep-alive" => Field::KeepAlive,
        "proxy-authenticate" => Field::ProxyAuthenticate,
        "proxy-authorization" => Field::ProxyAuthorization,
        "trailer" => Field::Trailer,
        "transfer-encoding" => Field::TransferEncoding,
        "upgrade" => Field::Upgrade,
        "te" => Field::Te,
        "host" => Field::Host,
        "x-forwarded-for" => Field::XForwardedFor,
        "x-forwarded-host" => Field::XForwardedHost,
        "x-forwarded-proto" => Field::XForwardedProto,
        "x-kamal-target" => Field::XKamalTarget,
        _ => return None,
    };
    Some(field)
}

/// Whether a `Connection` token names a header of [`HOP_BY_HOP`], in any case. The usual
/// tokens as they are usually written are matched at once; the rest are compared only
/// with the names of their length (a case-blind comparison with all eight cost about 200
/// instructions a response).
fn names_standard_hop_by_hop(token: &[u8]) -> bool {
    matches!(
        token,
        b"keep-alive" | b"upgrade" | b"Keep-Alive" | b"Upgrade"
    ) || HOP_BY_HOP.iter().any(|h| {
        let name = h.as_str().as_bytes();
        name.len() == token.len() && name.eq_ignore_ascii_case(token)
    })
}

/// Whether a `Connection` value names nothing but hop-by-hop fields of the standard set: a
/// field that [`remove_hop_by_hop`] would remove without removing any other. (`close`
/// counts as a name, as Go's proxy has it: a field named `Close` goes with it.)
pub fn connection_names_no_other_field(value: &[u8]) -> bool {
    value.split(|&b| b == b',').all(|token| {
        let token = token.trim_ascii();
        token.is_empty() || names_standard_hop_by_hop(token)
    })
}

/// The hop-by-hop fields, in [`Field`]'s order.
static HOP_BY_HOP: [&HeaderName; 9] = [
    &header::CONNECTION,
    &PROXY_CONNECTION,
    &KEEP_ALIVE,
    &header::PROXY_AUTHENTICATE,
    &header::PROXY_AUTHORIZATION,
    &header::TRAILER,
    &header::TRANSFER_ENCODING,
    &header::UPGRADE,
    &header::TE,
];

/// A field name as read from the wire. The names nearly every request and response
/// carry are matched as they are usually written (`Host`, `content-type`): one
/// comparison, where `HeaderName::from_bytes` lower-cases the name into a buffer and
/// looks it up among all the standard ones (about 250 instructions a name).
pub fn name_from_wire(name: &[u8]) -> Result<HeaderName, http::header::InvalidHeaderName> {
    let common = match name {
        b"Host" | b"host" => &header::HOST,
        b"User-Agent" | b"user-agent" => &header::USER_AGENT,
        b"Accept" | b"accept" => &header::ACCEPT,
        b"Accept-Encoding" | b"accept-encoding" => &header::ACCEPT_ENCODING,
        b"Accept-Language" | b"accept-language" => &header::ACCEPT_LANGUAGE,
        b"Connection" | b"connection" => &header::CONNECTION,
        b"Content-Type" | b"content-type" => &header::CONTENT_TYPE,
        b"Content-Length" | b"content-length" => &header::CONTENT_LENGTH,
        b"Cookie" | b"cookie" => &header::COOKIE,
        b"Date" | b"date" => &header::DATE,
        b"Server" | b"server" => &header::SERVER,
        b"Cache-Control" | b"cache-control" => &header::CACHE_CONTROL,
        b"Keep-Alive" | b"keep-alive" => &KEEP_ALIVE,
        _ => return HeaderName::from_bytes(name),
    };
    Ok(common.clone())
}

/// Whether a comma-separated field value (`Connection`) lists `token`, case-insensitively.
/// For both legs of HTTP/1: the client's request and response, the app's response.
pub fn has_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// `Upgrade` type requested by the client, if this is an upgrade request. `present`: what
/// [`Present::of`] found in `headers`.
pub fn upgrade_type(headers: &HeaderMap, present: Present) -> Option<HeaderValue> {
    if !(present.has(Field::Connection) && present.has(Field::Upgrade)) {
        return None;
    }
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if connection_upgrade {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    }
}

pub fn is_websocket(headers: &HeaderMap) -> bool {
    upgrade_type(headers, Present::of(headers))
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"))
}

/// The client's address as an `X-Forwarded-For` value. The last one made on this thread
/// is kept: the requests of a keep-alive connection repeat it (as do those of clients
/// behind one proxy or CDN), and a clone is a reference count where formatting the
/// address and allocating its value cost about 600 instructions a request.
pub fn ip_value(ip: std::net::IpAddr) -> HeaderValue {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(std::net::IpAddr, HeaderValue)>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((at, value)) if *at == ip => value.clone(),
        _ => {
            let value = HeaderValue::from_str(IpText::new(ip).as_str())
                .expect("an IP address is a valid header value");
            *last = Some((ip, value.clone()));
            value
        }
    })
}

/// `--client-ip-header`: when the request carries a non-empty `name`, its value replaces
/// `X-Forwarded-For` before the proxy's fields are worked out ([`super::proxy_fields`]),
/// and is what the access log shows as `remote_addr`. Returns that value. `name` itself
/// is forwarded unchanged.
pub fn apply_client_ip_header(headers: &mut HeaderMap, name: &str) -> Option<HeaderValue> {
    let value = headers.get(name).filter(|v| !v.is_empty())?.clone();
    headers.insert(&X_FORWARDED_FOR, value.clone());
    Some(value)
}

/// An IP address rendered on the stack: one is formatted for every proxied request
/// (`X-Forwarded-For`), so it costs no allocation.
pub use crate::observe::text::IpText;

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    fn strip(h: &mut HeaderMap) -> HopByHop {
        let present = Present::of(h);
        remove_hop_by_hop(h, present)
    }

    #[test]
    fn fields_are_found_by_their_text_and_no_other_name_is() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(field_of(name).map(|f| f as usize), Some(i), "{name}");
            let from_wire = name_from_wire(name.as_str().to_ascii_uppercase().as_bytes());
            assert_eq!(field_of(&from_wire.unwrap()).map(|f| f as usize), Some(i));
        }
        for (name, field) in [
            (&header::HOST, Field::Host),
            (&X_FORWARDED_FOR, Field::XForwardedFor),
            (&X_FORWARDED_HOST, Field::XForwardedHost),
            (&X_FORWARDED_PROTO, Field::XForwardedProto),
            (&X_KAMAL_TARGET, Field::XKamalTarget),
        ] {
            assert_eq!(field_of(name), Some(field), "{name}");
        }
        for name in [
            "user-agent",
            "set-cookie",
            "referer",
            "hosts",
            "tes",
            "x-upgrade",
            "forwarded",
        ] {
            assert_eq!(field_of(&HeaderName::from_static(name)), None, "{name}");
        }
    }

    #[test]
    fn present_fields_are_the_names_in_the_map() {
        let mut h = HeaderMap::new();
        assert_eq!(Present::of(&h), Present::default());
        h.insert(header::HOST, hv("example.com"));
        h.insert(header::USER_AGENT, hv("curl"));
        h.append(&X_FORWARDED_FOR, hv("1.2.3.4"));
        h.append(&X_FORWARDED_FOR, hv("5.6.7.8"));
        h.append(header::HOST, hv("second.example.com"));
        let (present, host) = Present::with_host(&h);
        assert_eq!(host.unwrap(), "example.com", "the first Host");
        assert_eq!(Present::of(&h), present);
        for field in [Field::Host, Field::XForwardedFor] {
            assert!(present.has(field), "{field:?}");
        }
        for field in [Field::Connection, Field::Te, Field::XKamalTarget] {
            assert!(!present.has(field), "{field:?}");
        }
        assert!(!present.any_hop_by_hop());
        h.insert(header::TE, hv("trailers"));
        assert!(Present::of(&h).any_hop_by_hop());
    }

    #[test]
    fn connection_tokens_naming_hop_by_hop_headers_are_known_in_any_case() {
        for name in HOP_BY_HOP {
            let lower = name.as_str();
            assert!(names_standard_hop_by_hop(lower.as_bytes()), "{lower}");
            assert!(
                names_standard_hop_by_hop(lower.to_ascii_uppercase().as_bytes()),
                "{lower}"
            );
        }
        for token in ["close", "x-secret", "keep-alivex", "tes", ""] {
            assert!(!names_standard_hop_by_hop(token.as_bytes()), "{token}");
        }
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, hv("keep-alive, X-Secret"));
        h.insert("x-secret", hv("1"));
        h.insert("keep-alive", hv("timeout=5"));
        h.insert(header::TRANSFER_ENCODING, hv("chunked"));
        h.insert("x-app", hv("kept"));
        let found = strip(&mut h);
        assert!(!found.trailers, "no TE, no trailers");
        assert!(found.named_others, "X-Secret was named");
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-app"], "kept");
    }

    #[test]
    fn connection_values_naming_other_fields_are_told_apart() {
        for value in ["keep-alive", "Keep-Alive, Upgrade", "", " , TE"] {
            assert!(connection_names_no_other_field(value.as_bytes()), "{value}");
        }
        for value in ["keep-alive, X-Secret", "close", "closed", "x"] {
            assert!(
                !connection_names_no_other_field(value.as_bytes()),
                "{value}"
            );
        }
    }

    #[test]
    fn te_goes_and_says_whether_it_asked_for_trailers() {
        let mut h = HeaderMap::new();
        h.insert(header::TE, hv("gzip"));
        h.append(header::TE, hv("deflate, Trailers"));
        h.insert("x-app", hv("kept"));
        assert_eq!(
            strip(&mut h),
            HopByHop {
                trailers: true,
                named_others: false
            }
        );
        assert!(!h.contains_key(header::TE));
        assert_eq!(h.len(), 1);
        h.insert(header::TE, hv("gzip"));
        assert!(!strip(&mut h).trailers);
        assert!(!h.contains_key(header::TE));
    }

    #[test]
    fn names_from_the_wire_are_what_from_bytes_makes() {
        for name in [
            "Host",
            "host",
            "HOST",
            "User-Agent",
            "content-length",
            "Content-Type",
            "Date",
            "server",
            "Keep-Alive",
            "keep-alive",
            "X-Custom",
            "x-request-id",
            "Bad Name",
            "",
        ] {
            let ours = name_from_wire(name.as_bytes()).ok();
            assert_eq!(ours, HeaderName::from_bytes(name.as_bytes()).ok(), "{name}");
        }
    }

    #[test]
    fn ip_values_follow_the_address() {
        for ip in ["127.0.0.1", "10.1.2.3", "2001:db8::1", "127.0.0.1"] {
            assert_eq!(ip_value(ip.parse().unwrap()), ip);
        }
    }

    #[test]
    fn client_ip_header_replaces_forwarded_for() {
        let name = "cf-connecting-ip";
        let mut h = HeaderMap::new();
        h.insert(&X_FORWARDED_FOR, hv("1.2.3.4"));
        assert_eq!(apply_client_ip_header(&mut h, name), None);
        assert_eq!(h[&X_FORWARDED_FOR], "1.2.3.4");
        h.insert(name, hv(""));
        assert_eq!(
            apply_client_ip_header(&mut h, name),
            None,
            "empty values are ignored"
        );
        h.insert(name, hv("9.9.9.9"));
        assert_eq!(apply_client_ip_header(&mut h, name), Some(hv("9.9.9.9")));
        assert_eq!(h[&X_FORWARDED_FOR], "9.9.9.9");
        assert_eq!(h[name], "9.9.9.9");
    }

    #[test]
    fn upgrade_detection() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, hv("keep-alive, Upgrade"));
        h.insert(header::UPGRADE, hv("WebSocket"));
        assert!(is_websocket(&h));
        h.insert(header::CONNECTION, hv("keep-alive"));
        assert!(upgrade_type(&h, Present::of(&h)).is_none());
        h.insert(header::CONNECTION, hv("Upgrade"));
        assert_eq!(upgrade_type(&h, Present::of(&h)).unwrap(), "WebSocket");
        h.remove(header::UPGRADE);
        assert!(upgrade_type(&h, Present::of(&h)).is_none());
    }
}
