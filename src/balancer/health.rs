//! Health probes: `GET <target><path>` with `User-Agent: kamal-proxy`; any 2xx is healthy.

use bytes::Bytes;
use http::{Request, header};
use http_body_util::Empty;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

use super::target::Target;
use crate::service::options::HealthCheckConfig;

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

/// One probe. Ok(()) when healthy, Err(reason) otherwise.
pub async fn probe(
    client: &ProbeClient,
    uri: &str,
    config: &HealthCheckConfig,
) -> Result<(), String> {
    let mut builder = Request::get(uri).header(header::USER_AGENT, "kamal-proxy");
    if !config.host.is_empty() {
        builder = builder.header(header::HOST, config.host.as_str());
    }
    let request = builder.body(Empty::new()).map_err(|e| e.to_string())?;
    let timeout = crate::gotime::to_std(config.timeout);
    match tokio::time::timeout(timeout, client.request(request)).await {
        Err(_) => Err("request timed out".into()),
        Ok(Err(e)) => Err(describe_client_error(&e)),
        Ok(Ok(response)) if response.status().is_success() => Ok(()),
        Ok(Ok(response)) => Err(format!(
            "unexpected status ({})",
            response.status().as_u16()
        )),
    }
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
