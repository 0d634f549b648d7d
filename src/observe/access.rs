//! The access log: what is recorded about a request and the line written when its
//! exchange ends (see `proxy::exchange`, which decides when).

use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::time::Instant;

use super::log::{self, json_escape_bytes_into, json_escape_into, plain};
use super::text::{Decimal, IpText};
use crate::short_copy::append;
use crate::uri::decoded_path;

/// Logged when the client disconnected before a response was ready (nginx's convention,
/// as upstream uses).
pub const STATUS_CLIENT_CLOSED_REQUEST: u16 = 499;

/// What the access line says about a request. Captured at arrival mostly as cheap clones
/// of what hyper already parsed (header values and the URI share its read buffer), so the
/// hot path allocates nothing here; text is rendered only when the line is written.
pub struct AccessRecord {
    pub started: Instant,
    /// The raw Host header (or the URI authority), port included.
    pub host: HeaderValue,
    pub port: u16,
    /// Path and raw query as received; the path is logged decoded, as Go's `URL.Path`.
    pub path_and_query: Option<PathAndQuery>,
    pub request_id: HeaderValue,
    /// The proxy made `request_id`: as `X-Request-Id`, it leaves with the request's other
    /// proxy fields (`proxy::proxy_fields`), not in its header map.
    pub request_id_added: bool,
    /// The `X-Request-Start` the proxy made, which leaves likewise (in the line only when
    /// `--log-request-header` names it).
    pub request_start_added: Option<HeaderValue>,
    pub status: u16,
    pub service: Option<Arc<str>>,
    pub target: Option<Arc<str>>,
    /// The metrics label (`OTHER` for non-standard methods).
    pub method: &'static str,
    pub method_raw: Method,
    pub req_content_length: i64,
    pub req_content_type: Option<HeaderValue>,
    pub resp_content_type: Option<HeaderValue>,
    pub client: SocketAddr,
    /// `X-Forwarded-For` as received (or as `--client-ip-header` rewrote it); when absent
    /// the client's IP is logged.
    pub remote_addr: Option<HeaderValue>,
    pub user_agent: Option<HeaderValue>,
    pub proto: &'static str,
    pub scheme: &'static str,
    /// `--log-request-header` values, captured at arrival: (log key, value).
    pub req_headers: Vec<(String, String)>,
    /// `--log-response-header` names still to capture from the response (none: `None`,
    /// rather than a shared empty list whose reference count every request would raise
    /// and drop, on a cache line all the workers write).
    pub resp_header_names: Option<Arc<Vec<String>>>,
    pub resp_headers: Vec<(String, String)>,
    pub exclude_metrics: bool,
    /// Further attempts to place the request on a target (`--target-try-duration`):
    /// logged as `retries` when there were any (upstream's line has no such key).
    pub retries: u32,
}

impl AccessRecord {
    /// The `X-Request-Id` and `X-Request-Start` the proxy made for the request, which are
    /// not in its header map.
    pub fn arrival(&self) -> (Option<&HeaderValue>, Option<&HeaderValue>) {
        (
            self.request_id_added.then_some(&self.request_id),
            self.request_start_added.as_ref(),
        )
    }

    /// One of [`AccessRecord::arrival`] by its name (lower case).
    pub fn arrival_field(&self, name: &str) -> Option<&HeaderValue> {
        let (id, start) = self.arrival();
        match name {
            "x-request-id" => id,
            "x-request-start" => start,
            _ => None,
        }
    }
}

/// `X-Custom-Header` → `x_custom_header`.
pub fn log_key(prefix: &str, header: &str) -> String {
    let mut k = String::with_capacity(prefix.len() + header.len());
    k.push_str(prefix);
    k.extend(header.chars().map(|c| {
        if c == '-' {
            '_'
        } else {
            c.to_ascii_lowercase()
        }
    }));
    k
}

/// All values of a header joined with `,` (upstream's rendering), empty when absent.
pub fn header_values(headers: &HeaderMap, name: &str) -> String {
    let mut out = String::new();
    for (i, v) in headers.get_all(name).iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&String::from_utf8_lossy(v.as_bytes()));
    }
    out
}

/// Writes the access line of a finished request: the line the `tracing` formatter would
/// write for `info!(json_fields = .., "Request")`, built straight into this thread's log
/// batch (see `log::write_line`), which skips the subscriber's dispatch and a copy.
pub fn log_request(r: &AccessRecord, elapsed: std::time::Duration, bytes_sent: u64) {
    let now = crate::clock::wall();
    log::write_line(|out| {
        out.push_str("{\"time\":\"");
        log::push_rfc3339_nano_utc(out, now);
        out.push_str("\",\"level\":\"INFO\",\"msg\":\"Request\",");
        write_fields(out, r, elapsed.as_nanos() as i64, bytes_sent);
        out.push_str("}\n");
    });
}

/// The access line's fields, `"host":..,"port":..,..`, in upstream's order.
///
/// Each member is its key with the punctuation around it as one literal (`,"path":"`), then
/// the value, checked and copied inline: the line's 20 members went through a call each to
/// a quoting and a number writer, with a capacity check per quote, about 2,300
/// instructions a line (bench/README.md, "Twenty-second round").
fn write_fields(s: &mut String, r: &AccessRecord, duration_ns: i64, bytes_sent: u64) {
    let (path, query) = match &r.path_and_query {
        Some(pq) => (pq.path(), pq.query().unwrap_or("")),
        None => ("", ""),
    };
    let client_ip = IpText::of(r.client.ip());
    let client_ip = client_ip.as_str().as_bytes();
    string(s, "\"host\":\"", r.host.as_bytes());
    number(s, ",\"port\":", u64::from(r.port));
    string(s, ",\"path\":\"", decoded_path(path).as_bytes());
    string(s, ",\"request_id\":\"", r.request_id.as_bytes());
    number(s, ",\"status\":", u64::from(r.status));
    string(
        s,
        ",\"service\":\"",
        r.service.as_deref().unwrap_or("").as_bytes(),
    );
    string(
        s,
        ",\"target\":\"",
        r.target.as_deref().unwrap_or("").as_bytes(),
    );
    signed(s, ",\"duration\":", duration_ns);
    // A method is a token, an address and the protocol names are ASCII: nothing in them to
    // escape.
    text(s, ",\"method\":\"", r.method_raw.as_str().as_bytes());
    signed(s, ",\"req_content_length\":", r.req_content_length);
    string(
        s,
        ",\"req_content_type\":\"",
        value_bytes(r.req_content_type.as_ref()),
    );
    number(s, ",\"resp_content_length\":", bytes_sent);
    string(
        s,
        ",\"resp_content_type\":\"",
        value_bytes(r.resp_content_type.as_ref()),
    );
    text(s, ",\"client_addr\":\"", client_ip);
    text(
        s,
        ",\"client_port\":\"",
        Decimal::new(u64::from(r.client.port())).as_bytes(),
    );
    match &r.remote_addr {
        Some(v) => string(s, ",\"remote_addr\":\"", v.as_bytes()),
        None => text(s, ",\"remote_addr\":\"", client_ip),
    }
    string(s, ",\"user_agent\":\"", value_bytes(r.user_agent.as_ref()));
    text(s, ",\"proto\":\"", r.proto.as_bytes());
    text(s, ",\"scheme\":\"", r.scheme.as_bytes());
    string(s, ",\"query\":\"", query.as_bytes());
    if r.retries > 0 {
        number(s, ",\"retries\":", u64::from(r.retries));
    }
    for (k, v) in r.req_headers.iter().chain(r.resp_headers.iter()) {
        s.push_str(",\"");
        s.push_str(k);
        s.push_str("\":");
        json_escape_into(s, v);
    }
}

/// A header's value, empty when absent.
fn value_bytes(v: Option<&HeaderValue>) -> &[u8] {
    v.map_or(&b""[..], HeaderValue::as_bytes)
}

/// `key` (a literal ending in the value's opening quote), then `value` as a JSON string:
/// as it is when it is plain ASCII, else decoded as UTF-8 (invalid sequences replaced)
/// and escaped.
#[inline(always)]
fn string(s: &mut String, key: &'static str, value: &[u8]) {
    if plain(value) {
        text(s, key, value);
    } else {
        s.push_str(&key[..key.len() - 1]);
        json_escape_bytes_into(s, value);
    }
}

/// `key` (ending in the opening quote), then `value`, which is ASCII with nothing to
/// escape, and the closing quote.
#[inline(always)]
fn text(s: &mut String, key: &'static str, value: &[u8]) {
    debug_assert!(plain(value));
    // SAFETY: `key` is text, and `value` is ASCII: the string stays UTF-8.
    let bytes = unsafe { s.as_mut_vec() };
    bytes.extend_from_slice(key.as_bytes());
    append(bytes, value);
    bytes.push(b'"');
}

/// `key`, then `n` in decimal.
#[inline(always)]
fn number(s: &mut String, key: &'static str, n: u64) {
    // SAFETY: `key` is text, and digits are ASCII.
    let bytes = unsafe { s.as_mut_vec() };
    bytes.extend_from_slice(key.as_bytes());
    append(bytes, Decimal::new(n).as_bytes());
}

/// `key`, then `n` in decimal with its sign.
#[inline(always)]
fn signed(s: &mut String, key: &'static str, n: i64) {
    if n < 0 {
        s.push_str(key);
        s.push('-');
        number(s, "", n.unsigned_abs());
    } else {
        number(s, key, n.unsigned_abs());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys() {
        assert_eq!(log_key("req_", "X-Custom-Header"), "req_x_custom_header");
        assert_eq!(log_key("resp_", "cache-control"), "resp_cache_control");
    }

    fn record() -> AccessRecord {
        AccessRecord {
            started: Instant::now(),
            host: HeaderValue::from_static("app.example.com:8443"),
            port: 443,
            path_and_query: Some(PathAndQuery::from_static("/a%20b/c?x=1&y=%22")),
            request_id: HeaderValue::from_static("1b394462-43b8-4fe1-809f-3d3d89f973a7"),
            request_id_added: true,
            request_start_added: None,
            status: 200,
            service: Some("app".into()),
            target: Some("10.0.0.7:3000".into()),
            method: "GET",
            method_raw: Method::GET,
            req_content_length: 0,
            req_content_type: None,
            resp_content_type: Some(HeaderValue::from_static("text/html; charset=utf-8")),
            client: "192.0.2.10:51234".parse().unwrap(),
            remote_addr: None,
            user_agent: Some(HeaderValue::from_static(
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)",
            )),
            proto: "HTTP/1.1",
            scheme: "https",
            req_headers: Vec::new(),
            resp_header_names: None,
            resp_headers: Vec::new(),
            exclude_metrics: false,
            retries: 0,
        }
    }

    fn members(r: &AccessRecord, duration_ns: i64, bytes_sent: u64) -> String {
        let mut line = String::from("{");
        write_fields(&mut line, r, duration_ns, bytes_sent);
        line.push('}');
        line
    }

    /// The members of a usual line, values as they are, in upstream's order.
    #[test]
    fn plain_values_are_written_as_they_are() {
        let line = members(&record(), 1_119_929, 6);
        assert_eq!(
            line,
            concat!(
                r#"{"host":"app.example.com:8443","port":443,"path":"/a b/c","#,
                r#""request_id":"1b394462-43b8-4fe1-809f-3d3d89f973a7","status":200,"#,
                r#""service":"app","target":"10.0.0.7:3000","duration":1119929,"method":"GET","#,
                r#""req_content_length":0,"req_content_type":"","resp_content_length":6,"#,
                r#""resp_content_type":"text/html; charset=utf-8","client_addr":"192.0.2.10","#,
                r#""client_port":"51234","remote_addr":"192.0.2.10","#,
                r#""user_agent":"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)","#,
                r#""proto":"HTTP/1.1","scheme":"https","query":"x=1&y=%22"}"#
            )
        );
    }

    /// Values with quotes, backslashes, control characters and bytes that are not UTF-8
    /// come out as JSON strings that decode to what was sent (invalid bytes replaced);
    /// negative numbers keep their sign; retries and logged headers follow.
    #[test]
    fn other_values_are_escaped_and_numbers_signed() {
        let mut r = record();
        r.host = HeaderValue::from_bytes(b"we\"ird\\host\t").unwrap();
        r.path_and_query = Some(PathAndQuery::from_static("/%01%22?q"));
        r.user_agent = Some(HeaderValue::from_bytes(b"agent \xff\xfe \xe2\x80\xa8 end").unwrap());
        r.remote_addr = Some(HeaderValue::from_static("203.0.113.5, 10.0.0.1"));
        r.method_raw = Method::from_bytes(b"PROPFIND").unwrap();
        r.req_content_length = -1;
        r.retries = 2;
        r.req_headers = vec![("req_x_tag".into(), "a\"b".into())];
        r.resp_headers = vec![("resp_cache_control".into(), "no-store".into())];
        let line = members(&r, -5, 0);
        let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
        assert_eq!(v["host"], "we\"ird\\host\t");
        assert_eq!(v["path"], "/\u{1}\"");
        assert_eq!(v["user_agent"], "agent \u{fffd}\u{fffd} \u{2028} end");
        // U+2028 escaped as slog does; the replacement characters as they are.
        assert!(
            line.contains("\"user_agent\":\"agent \u{fffd}\u{fffd} \\u2028 end\""),
            "{line}"
        );
        assert!(
            line.contains(r#""host":"we\"ird\\host\t","port":443,"path":"/\u0001\"","#),
            "{line}"
        );
        assert_eq!(v["remote_addr"], "203.0.113.5, 10.0.0.1");
        assert_eq!(v["method"], "PROPFIND");
        assert_eq!(v["req_content_length"], -1);
        assert_eq!(v["duration"], -5);
        assert_eq!(v["retries"], 2);
        assert_eq!(v["req_x_tag"], "a\"b");
        assert_eq!(v["resp_cache_control"], "no-store");
        assert!(
            line.ends_with(concat!(
                r#""query":"q","retries":2,"req_x_tag":"a\"b","#,
                r#""resp_cache_control":"no-store"}"#
            )),
            "{line}"
        );
    }
}
