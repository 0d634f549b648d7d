//! `--tls-on-demand-url`: before a certificate is obtained for a host nobody listed, ask
//! an endpoint. An absolute URL is fetched directly; a path is asked of the service's own
//! targets. The check URL carries `host=<name>` (query re-encoded sorted by key, as Go's
//! `url.Values.Encode`). Any 2xx allows (as the fork); redirects and everything else deny;
//! 2 s timeout. A host that already has a certificate is not asked again (the caller
//! checks the cache first).

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Empty};
use std::time::Duration;

use super::client::ProbeHttp;

pub const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_LOGGED_BODY: usize = 256;

pub struct OnDemand {
    url: String,
}

/// The narrow capability on-demand TLS needs from a service: the address of a target
/// that may answer a local check path now, if any.
pub type PickTarget<'a> = dyn Fn() -> Option<String> + Send + Sync + 'a;

impl OnDemand {
    pub fn new(url: &str) -> OnDemand {
        OnDemand {
            url: url.to_string(),
        }
    }

    /// Asks whether `host` may get a certificate. A local check path is asked of the
    /// target `local_target` picks (the service's own healthy target, or none).
    pub async fn check(
        &self,
        host: &str,
        local_target: &PickTarget<'_>,
        http: &ProbeHttp,
    ) -> Result<(), String> {
        let asked = tokio::time::timeout(CHECK_TIMEOUT, self.ask(host, local_target, http)).await;
        let (status, body) = match asked {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return Err(format!("{host} is not allowed to get a certificate ({e})")),
            Err(_) => {
                return Err(format!(
                    "{host} is not allowed to get a certificate (check timed out)"
                ));
            }
        };
        if (200..300).contains(&status) {
            return Ok(());
        }
        let body = String::from_utf8_lossy(&body[..body.len().min(MAX_LOGGED_BODY)]).into_owned();
        tracing::warn!(host = %host, status = status, body = %body, "TLS on-demand check denied host");
        Err(format!(
            "{host} is not allowed to get a certificate (status: {status}, body: {body:?})"
        ))
    }

    async fn ask(
        &self,
        host: &str,
        local_target: &PickTarget<'_>,
        http: &ProbeHttp,
    ) -> Result<(u16, Bytes), String> {
        let check = check_url(&self.url, host);
        let request = if check.starts_with('/') {
            // A path is asked of the service itself; without a target to ask (a paused or
            // stopped service) it is denied, as upstream's stopped service answers 503.
            let Some(target) = local_target() else {
                return Ok((503, Bytes::new()));
            };
            let uri: Uri = format!("http://{target}{check}")
                .parse()
                .map_err(|e| format!("{e}"))?;
            Request::get(uri)
                .header(header::HOST, host)
                .header("X-Forwarded-Proto", "http")
                .header("X-Forwarded-Host", host)
                .body(Empty::<Bytes>::new())
                .map_err(|e| e.to_string())?
        } else {
            let uri: Uri = check.parse().map_err(|e| format!("{e}"))?;
            Request::get(uri)
                .body(Empty::<Bytes>::new())
                .map_err(|e| e.to_string())?
        };
        let response = http.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let limited = http_body_util::Limited::new(response.into_body(), 64 * 1024);
        let body = limited
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        Ok((status, body))
    }
}

/// The URL with `host=<name>` set in its query (other parameters kept), re-encoded with
/// keys sorted as Go's `url.Values.Encode` does.
pub fn check_url(url: &str, host: &str) -> String {
    let (base, fragment) = match url.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (url, None),
    };
    let (path, query) = base.split_once('?').unwrap_or((base, ""));
    let mut params: Vec<(String, String)> = query
        .split(['&'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (query_unescape(k), query_unescape(v))
        })
        .filter(|(k, _)| k != "host")
        .collect();
    params.push(("host".into(), host.to_string()));
    params.sort_by(|a, b| a.0.cmp(&b.0));
    let encoded: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{}={}", query_escape(k), query_escape(v)))
        .collect();
    let mut out = format!("{path}?{}", encoded.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn query_unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_urls_as_upstream() {
        assert_eq!(
            check_url("/allow-host", "x.test"),
            "/allow-host?host=x.test"
        );
        assert_eq!(
            check_url("/allow-host?token=abc", "x.test"),
            "/allow-host?host=x.test&token=abc"
        );
        assert_eq!(
            check_url("https://a.com/check?z=1&a=2", "x.test"),
            "https://a.com/check?a=2&host=x.test&z=1"
        );
        assert_eq!(
            check_url("/check?host=old", "h:8443"),
            "/check?host=h%3A8443"
        );
    }
}
