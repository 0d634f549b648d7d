//! Health probes: `GET <target><path>` with `User-Agent: kamal-proxy`; any 2xx is healthy.

use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::Empty;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

use super::target::Target;
use crate::gotime::GoDuration;
use serde::{Deserialize, Serialize};

pub const DEFAULT_HEALTH_CHECK_PATH: &str = "/up";
pub const DEFAULT_HEALTH_CHECK_INTERVAL: GoDuration = GoDuration::from_secs(1);
pub const DEFAULT_HEALTH_CHECK_TIMEOUT: GoDuration = GoDuration::from_secs(5);

/// `--health-check-*`: how a target's health is probed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct HealthCheckConfig {
    pub path: String,
    pub port: u16,
    pub interval: GoDuration,
    pub timeout: GoDuration,
    pub host: String,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig {
            path: DEFAULT_HEALTH_CHECK_PATH.into(),
            port: 0,
            interval: DEFAULT_HEALTH_CHECK_INTERVAL,
            timeout: DEFAULT_HEALTH_CHECK_TIMEOUT,
            host: String::new(),
        }
    }
}

pub type ProbeClient = Client<HttpConnector, Empty<Bytes>>;

pub fn probe_client() -> ProbeClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    // Keep few idle connections: probes are rare, and a connection to a container that
    // has since been stopped must not linger.
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(1)
        .build(connector)
}

/// The probe URL: the target's host, the health-check port if set, and the path.
pub fn probe_uri(target: &Target, config: &HealthCheckConfig) -> String {
    let authority = target.authority();
    let port = if config.port > 0 {
        config.port
    } else {
        authority.port_u16().unwrap_or(80)
    };
    let path = if config.path.starts_with('/') {
        config.path.clone()
    } else {
        format!("/{}", config.path)
    };
    format!("http://{}:{}{}", authority.host(), port, path)
}

/// Go's HTTP client (which upstream probes with) gives up after this many redirects.
const MAX_REDIRECTS: usize = 10;

/// One probe. Ok(()) when healthy, Err(reason) otherwise. Redirects are followed as Go's
/// default client does, so `/up` answering `302 → /healthz` is judged by `/healthz`.
pub async fn probe(
    client: &ProbeClient,
    uri: &str,
    config: &HealthCheckConfig,
) -> Result<(), String> {
    let timeout = config.timeout.to_std();
    match tokio::time::timeout(timeout, probe_following_redirects(client, uri, config)).await {
        Err(_) => Err("request timed out".into()),
        Ok(result) => result,
    }
}

async fn probe_following_redirects(
    client: &ProbeClient,
    uri: &str,
    config: &HealthCheckConfig,
) -> Result<(), String> {
    let mut current: Uri = uri.parse().map_err(|e| format!("invalid URL {uri}: {e}"))?;
    // Go keeps a custom Host header only across relative redirects.
    let mut host = (!config.host.is_empty()).then_some(config.host.as_str());
    for _ in 0..=MAX_REDIRECTS {
        let mut builder = Request::get(current.clone()).header(header::USER_AGENT, "kamal-proxy");
        if let Some(h) = host {
            builder = builder.header(header::HOST, h);
        }
        let request = builder.body(Empty::new()).map_err(|e| e.to_string())?;
        let response = client
            .request(request)
            .await
            .map_err(|e| describe_client_error(&e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok());
        let (true, Some(location)) = (is_followed_redirect(status), location) else {
            return Err(format!("unexpected status ({})", status.as_u16()));
        };
        let next = resolve_location(&current, location)?;
        if next.authority() != current.authority() {
            host = None;
        }
        current = next;
    }
    Err(format!("stopped after {MAX_REDIRECTS} redirects"))
}

fn is_followed_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

/// Resolves a `Location` against the URL that answered with it. Probes speak plain HTTP
/// only, so a redirect to another scheme is a failed check.
fn resolve_location(base: &Uri, location: &str) -> Result<Uri, String> {
    let invalid = |e: &dyn std::fmt::Display| format!("invalid redirect to {location:?}: {e}");
    let absolute = if let Some(rest) = location.strip_prefix("//") {
        format!("http://{rest}")
    } else if location.contains("://") {
        location.to_string()
    } else {
        let authority = base.authority().map(|a| a.as_str()).unwrap_or_default();
        let path = if location.starts_with('/') {
            location.to_string()
        } else {
            let dir = base.path().rsplit_once('/').map_or("", |(dir, _)| dir);
            format!("{dir}/{location}")
        };
        format!("http://{authority}{path}")
    };
    let uri: Uri = absolute.parse().map_err(|e| invalid(&e))?;
    if uri.scheme_str() != Some("http") {
        return Err(invalid(&"only http redirects are followed"));
    }
    if uri.authority().is_none() {
        return Err(invalid(&"no host"));
    }
    Ok(uri)
}

fn describe_client_error(e: &hyper_util::client::legacy::Error) -> String {
    use std::error::Error;
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg = format!("{msg}: {s}");
        source = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(base: &str, location: &str) -> Result<String, String> {
        resolve_location(&base.parse().unwrap(), location).map(|u| u.to_string())
    }

    #[test]
    fn locations_resolve_like_a_browser() {
        let base = "http://web:3000/health/up";
        assert_eq!(resolve(base, "/ready").unwrap(), "http://web:3000/ready");
        assert_eq!(
            resolve(base, "ready?x=1").unwrap(),
            "http://web:3000/health/ready?x=1"
        );
        assert_eq!(
            resolve(base, "//other:80/up").unwrap(),
            "http://other:80/up"
        );
        assert_eq!(resolve(base, "http://other/up").unwrap(), "http://other/up");
        assert!(resolve(base, "https://web/up").is_err());
    }
}
