//! The access log: what is recorded about a request and the line written when its
//! exchange ends (see `proxy::exchange`, which decides when).

use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue, Method};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::time::Instant;

use super::log::{self, json_escape_bytes_into, json_escape_into, push_quoted};
use super::text::{IpText, push_i64, push_u64};
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
fn write_fields(s: &mut String, r: &AccessRecord, duration_ns: i64, bytes_sent: u64) {
    // `,"name":` as one literal: three pushes for each of 18 keys cost about 600
    // instructions a line.
    macro_rules! key {
        ($s:expr, $k:literal) => {
            $s.push_str(concat!(",\"", $k, "\":"))
        };
    }
    let (path, query) = match &r.path_and_query {
        Some(pq) => (pq.path(), pq.query().unwrap_or("")),
        None => ("", ""),
    };
    let client_ip = IpText::of(r.client.ip());
    s.push_str("\"host\":");
    escape_value(s, Some(&r.host));
    key!(s, "port");
    push_u64(s, u64::from(r.port));
    key!(s, "path");
    json_escape_into(s, &decoded_path(path));
    key!(s, "request_id");
    escape_value(s, Some(&r.request_id));
    key!(s, "status");
    push_u64(s, u64::from(r.status));
    key!(s, "service");
    json_escape_into(s, r.service.as_deref().unwrap_or(""));
    key!(s, "target");
    json_escape_into(s, r.target.as_deref().unwrap_or(""));
    key!(s, "duration");
    push_i64(s, duration_ns);
    key!(s, "method");
    // A method is a token: nothing in it to escape.
    push_quoted(s, r.method_raw.as_str());
    key!(s, "req_content_length");
    push_i64(s, r.req_content_length);
    key!(s, "req_content_type");
    escape_value(s, r.req_content_type.as_ref());
    key!(s, "resp_content_length");
    push_u64(s, bytes_sent);
    key!(s, "resp_content_type");
    escape_value(s, r.resp_content_type.as_ref());
    key!(s, "client_addr");
    push_quoted(s, client_ip.as_str());
    key!(s, "client_port");
    s.push('"');
    push_u64(s, u64::from(r.client.port()));
    s.push('"');
    key!(s, "remote_addr");
    match &r.remote_addr {
        Some(v) => escape_value(s, Some(v)),
        None => push_quoted(s, client_ip.as_str()),
    }
    key!(s, "user_agent");
    escape_value(s, r.user_agent.as_ref());
    key!(s, "proto");
    push_quoted(s, r.proto);
    key!(s, "scheme");
    push_quoted(s, r.scheme);
    key!(s, "query");
    json_escape_into(s, query);
    if r.retries > 0 {
        key!(s, "retries");
        push_u64(s, u64::from(r.retries));
    }
    for (k, v) in r.req_headers.iter().chain(r.resp_headers.iter()) {
        s.push_str(",\"");
        s.push_str(k);
        s.push_str("\":");
        json_escape_into(s, v);
    }
}

/// A header value as a JSON string (empty when absent; invalid UTF-8 replaced).
fn escape_value(out: &mut String, v: Option<&HeaderValue>) {
    json_escape_bytes_into(out, v.map_or(&b""[..], HeaderValue::as_bytes));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys() {
        assert_eq!(log_key("req_", "X-Custom-Header"), "req_x_custom_header");
        assert_eq!(log_key("resp_", "cache-control"), "resp_cache_control");
    }
}
