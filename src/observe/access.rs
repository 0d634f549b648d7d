//! The access log: what is recorded about a request and the line written when its
//! exchange ends (see `proxy::exchange`, which decides when).

use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::time::Instant;

use super::log::{self, json_escape_bytes_into, json_escape_into, plain};
use super::text::{Decimal, IpText};
use crate::short_copy::{append, append_within};
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
/// instructions a line (bench/README.md, "Twenty-second round"). When no value needs
/// escaping (nearly every line), the room for all of them is reserved at once and they
/// are copied without a check of the capacity each ("Thirty-first round").
fn write_fields(s: &mut String, r: &AccessRecord, duration_ns: i64, bytes_sent: u64) {
    let (path, query) = match &r.path_and_query {
        Some(pq) => (pq.path(), pq.query().unwrap_or("")),
        None => ("", ""),
    };
    let path = decoded_path(path);
    let client_ip = IpText::of(r.client.ip());
    let fields = Fields {
        r,
        path: path.as_bytes(),
        query: query.as_bytes(),
        client_ip: client_ip.as_str().as_bytes(),
        client_port: Decimal::new(u64::from(r.client.port())),
        duration_ns,
        bytes_sent,
    };
    let mut plain = AllPlain(true);
    fields.write(&mut plain);
    if plain.0 {
        let mut room = Room(0);
        fields.write(&mut room);
        // SAFETY: `Within` writes only ASCII (every value was found plain) and literals.
        let bytes = unsafe { s.as_mut_vec() };
        bytes.reserve(room.0);
        fields.write(&mut Within(bytes));
    } else {
        fields.write(&mut Checked(s));
    }
    for (k, v) in r.req_headers.iter().chain(r.resp_headers.iter()) {
        s.push_str(",\"");
        s.push_str(k);
        s.push_str("\":");
        json_escape_into(s, v);
    }
}

/// The values of an access line's fixed members, rendered where they are not already text.
struct Fields<'a> {
    r: &'a AccessRecord,
    path: &'a [u8],
    query: &'a [u8],
    client_ip: &'a [u8],
    client_port: Decimal,
    duration_ns: i64,
    bytes_sent: u64,
}

impl Fields<'_> {
    /// The members, in upstream's order, to `out`: the one list that each pass (plain?,
    /// how long?, write) goes through.
    #[inline(always)]
    fn write(&self, out: &mut impl Members) {
        let r = self.r;
        out.string("\"host\":\"", r.host.as_bytes());
        out.number(",\"port\":", u64::from(r.port));
        out.string(",\"path\":\"", self.path);
        out.string(",\"request_id\":\"", r.request_id.as_bytes());
        out.number(",\"status\":", u64::from(r.status));
        let service = r.service.as_deref().unwrap_or("");
        out.string(",\"service\":\"", service.as_bytes());
        let target = r.target.as_deref().unwrap_or("");
        out.string(",\"target\":\"", target.as_bytes());
        out.signed(",\"duration\":", self.duration_ns);
        // A method is a token, an address and the protocol names are ASCII: nothing in
        // them to escape.
        out.text(",\"method\":\"", r.method_raw.as_str().as_bytes());
        out.signed(",\"req_content_length\":", r.req_content_length);
        let req_type = value_bytes(r.req_content_type.as_ref());
        out.string(",\"req_content_type\":\"", req_type);
        out.number(",\"resp_content_length\":", self.bytes_sent);
        let resp_type = value_bytes(r.resp_content_type.as_ref());
        out.string(",\"resp_content_type\":\"", resp_type);
        out.text(",\"client_addr\":\"", self.client_ip);
        out.text(",\"client_port\":\"", self.client_port.as_bytes());
        match &r.remote_addr {
            Some(v) => out.string(",\"remote_addr\":\"", v.as_bytes()),
            None => out.text(",\"remote_addr\":\"", self.client_ip),
        }
        out.string(",\"user_agent\":\"", value_bytes(r.user_agent.as_ref()));
        out.text(",\"proto\":\"", r.proto.as_bytes());
        out.text(",\"scheme\":\"", r.scheme.as_bytes());
        out.string(",\"query\":\"", self.query);
        if r.retries > 0 {
            out.number(",\"retries\":", u64::from(r.retries));
        }
    }
}

/// Where an access line's members go. `key` is a literal: the member's punctuation and
/// key, ending in the value's opening quote for `string` and `text`.
trait Members {
    /// A value that may need escaping.
    fn string(&mut self, key: &'static str, value: &[u8]);
    /// ASCII with nothing to escape.
    fn text(&mut self, key: &'static str, value: &[u8]);
    fn number(&mut self, key: &'static str, n: u64);
    /// `n` with its sign.
    fn signed(&mut self, key: &'static str, n: i64);
}

/// Whether every `string` value is plain ASCII with nothing to escape.
struct AllPlain(bool);

impl Members for AllPlain {
    #[inline(always)]
    fn string(&mut self, _: &'static str, value: &[u8]) {
        self.0 &= plain(value);
    }
    #[inline(always)]
    fn text(&mut self, _: &'static str, value: &[u8]) {
        debug_assert!(plain(value));
    }
    #[inline(always)]
    fn number(&mut self, _: &'static str, _: u64) {}
    #[inline(always)]
    fn signed(&mut self, _: &'static str, _: i64) {}
}

/// The room the members take with their values as they are: an upper bound for the
/// numbers (twenty digits and a sign).
struct Room(usize);

impl Members for Room {
    #[inline(always)]
    fn string(&mut self, key: &'static str, value: &[u8]) {
        self.text(key, value);
    }
    #[inline(always)]
    fn text(&mut self, key: &'static str, value: &[u8]) {
        self.0 += key.len() + value.len() + 1;
    }
    #[inline(always)]
    fn number(&mut self, key: &'static str, _: u64) {
        self.0 += key.len() + 20;
    }
    #[inline(always)]
    fn signed(&mut self, key: &'static str, _: i64) {
        self.0 += key.len() + 21;
    }
}

/// Writes into room reserved for all the members ([`Room`]), all of them plain
/// ([`AllPlain`]).
struct Within<'a>(&'a mut Vec<u8>);

impl Within<'_> {
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) {
        // SAFETY: the caller reserved `Room`'s count, which covers every member written.
        unsafe { append_within(self.0, bytes) }
    }
}

impl Members for Within<'_> {
    #[inline(always)]
    fn string(&mut self, key: &'static str, value: &[u8]) {
        self.text(key, value);
    }
    #[inline(always)]
    fn text(&mut self, key: &'static str, value: &[u8]) {
        self.put(key.as_bytes());
        self.put(value);
        self.put(b"\"");
    }
    #[inline(always)]
    fn number(&mut self, key: &'static str, n: u64) {
        self.put(key.as_bytes());
        self.put(Decimal::new(n).as_bytes());
    }
    #[inline(always)]
    fn signed(&mut self, key: &'static str, n: i64) {
        self.put(key.as_bytes());
        if n < 0 {
            self.put(b"-");
        }
        self.put(Decimal::new(n.unsigned_abs()).as_bytes());
    }
}

/// Writes with a check of the room each, escaping the values that need it.
struct Checked<'a>(&'a mut String);

impl Members for Checked<'_> {
    fn string(&mut self, key: &'static str, value: &[u8]) {
        if plain(value) {
            self.text(key, value);
        } else {
            self.0.push_str(&key[..key.len() - 1]);
            json_escape_bytes_into(self.0, value);
        }
    }
    fn text(&mut self, key: &'static str, value: &[u8]) {
        debug_assert!(plain(value));
        // SAFETY: `key` is text, and `value` is ASCII: the string stays UTF-8.
        let bytes = unsafe { self.0.as_mut_vec() };
        append(bytes, key.as_bytes());
        append(bytes, value);
        bytes.push(b'"');
    }
    fn number(&mut self, key: &'static str, n: u64) {
        // SAFETY: `key` is text, and digits are ASCII.
        let bytes = unsafe { self.0.as_mut_vec() };
        append(bytes, key.as_bytes());
        append(bytes, Decimal::new(n).as_bytes());
    }
    fn signed(&mut self, key: &'static str, n: i64) {
        self.0.push_str(key);
        if n < 0 {
            self.0.push('-');
        }
        self.number("", n.unsigned_abs());
    }
}

/// A header's value, empty when absent.
fn value_bytes(v: Option<&HeaderValue>) -> &[u8] {
    v.map_or(&b""[..], HeaderValue::as_bytes)
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

    /// Negative numbers and retries on a line whose values are all plain (written into
    /// room reserved at once) come out as on any other line.
    #[test]
    fn plain_lines_keep_signs_and_retries() {
        let mut r = record();
        r.req_content_length = -1;
        r.retries = 12;
        r.remote_addr = Some(HeaderValue::from_static("203.0.113.5"));
        let line = members(&r, -1_119_929, 18_446_744_073_709_551_615);
        let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
        assert_eq!(v["duration"], -1_119_929);
        assert_eq!(v["req_content_length"], -1);
        assert_eq!(v["resp_content_length"], u64::MAX);
        assert_eq!(v["remote_addr"], "203.0.113.5");
        assert!(
            line.ends_with(r#""query":"x=1&y=%22","retries":12}"#),
            "{line}"
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
