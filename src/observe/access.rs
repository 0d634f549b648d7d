//! The access log: what is recorded about a request and the line written when its
//! exchange ends (see `proxy::exchange`, which decides when).

use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method};
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use tokio::time::Instant;

use super::log::json_escape_into;

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
    /// `--log-response-header` names still to capture from the response.
    pub resp_header_names: Arc<Vec<String>>,
    pub resp_headers: Vec<(String, String)>,
    pub exclude_metrics: bool,
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

/// No `--log-response-header`: shared, so a request without them allocates nothing.
pub fn no_logged_headers() -> Arc<Vec<String>> {
    static EMPTY: LazyLock<Arc<Vec<String>>> = LazyLock::new(|| Arc::new(Vec::new()));
    EMPTY.clone()
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

/// Writes the access line of a finished request.
pub fn log_request(r: &AccessRecord, elapsed: std::time::Duration, bytes_sent: u64) {
    let line = format_fields(r, elapsed.as_nanos() as i64, bytes_sent);
    tracing::info!(json_fields = line.as_str(), "Request");
}

fn format_fields(r: &AccessRecord, duration_ns: i64, bytes_sent: u64) -> String {
    let mut s = String::with_capacity(512);
    let key = |s: &mut String, k: &str| {
        if !s.is_empty() {
            s.push(',');
        }
        s.push('"');
        s.push_str(k);
        s.push_str("\":");
    };
    let (path, query) = match &r.path_and_query {
        Some(pq) => (pq.path(), pq.query().unwrap_or("")),
        None => ("", ""),
    };
    key(&mut s, "host");
    escape_value(&mut s, Some(&r.host));
    key(&mut s, "port");
    let _ = write!(s, "{}", r.port);
    key(&mut s, "path");
    json_escape_into(&mut s, &decoded_path(path));
    key(&mut s, "request_id");
    escape_value(&mut s, Some(&r.request_id));
    key(&mut s, "status");
    let _ = write!(s, "{}", r.status);
    key(&mut s, "service");
    json_escape_into(&mut s, r.service.as_deref().unwrap_or(""));
    key(&mut s, "target");
    json_escape_into(&mut s, r.target.as_deref().unwrap_or(""));
    key(&mut s, "duration");
    let _ = write!(s, "{duration_ns}");
    key(&mut s, "method");
    json_escape_into(&mut s, r.method_raw.as_str());
    key(&mut s, "req_content_length");
    let _ = write!(s, "{}", r.req_content_length);
    key(&mut s, "req_content_type");
    escape_value(&mut s, r.req_content_type.as_ref());
    key(&mut s, "resp_content_length");
    let _ = write!(s, "{bytes_sent}");
    key(&mut s, "resp_content_type");
    escape_value(&mut s, r.resp_content_type.as_ref());
    key(&mut s, "client_addr");
    let _ = write!(s, "\"{}\"", r.client.ip());
    key(&mut s, "client_port");
    let _ = write!(s, "\"{}\"", r.client.port());
    key(&mut s, "remote_addr");
    match &r.remote_addr {
        Some(v) => escape_value(&mut s, Some(v)),
        None => {
            let _ = write!(s, "\"{}\"", r.client.ip());
        }
    }
    key(&mut s, "user_agent");
    escape_value(&mut s, r.user_agent.as_ref());
    key(&mut s, "proto");
    json_escape_into(&mut s, r.proto);
    key(&mut s, "scheme");
    json_escape_into(&mut s, r.scheme);
    key(&mut s, "query");
    json_escape_into(&mut s, query);
    for (k, v) in r.req_headers.iter().chain(r.resp_headers.iter()) {
        key(&mut s, k);
        json_escape_into(&mut s, v);
    }
    s
}

/// A header value as a JSON string (empty when absent; invalid UTF-8 replaced).
fn escape_value(out: &mut String, v: Option<&HeaderValue>) {
    let bytes = v.map_or(&b""[..], HeaderValue::as_bytes);
    json_escape_into(out, &String::from_utf8_lossy(bytes));
}

/// The path as upstream logs it (Go's `URL.Path`): percent-escapes decoded.
pub fn decoded_path(raw: &str) -> std::borrow::Cow<'_, str> {
    if !raw.contains('%') {
        return std::borrow::Cow::Borrowed(raw);
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
    std::borrow::Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_paths_are_decoded() {
        assert_eq!(decoded_path("/plain/path"), "/plain/path");
        assert_eq!(decoded_path("/caf%C3%A9%20x"), "/café x");
        assert_eq!(decoded_path("/a%2Fb"), "/a/b");
        assert_eq!(decoded_path("/bad%zz%4"), "/bad%zz%4");
    }

    #[test]
    fn log_keys() {
        assert_eq!(log_key("req_", "X-Custom-Header"), "req_x_custom_header");
        assert_eq!(log_key("resp_", "cache-control"), "resp_cache_control");
    }
}
