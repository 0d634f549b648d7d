//! Service, target and deployment options: the values `deploy` sends, their defaults,
//! normalisation and validation. The serde names are upstream's state-file keys, so a
//! state file written by Go kamal-proxy loads here unchanged. Durations are stored as
//! signed nanoseconds, as upstream does.

use serde::{Deserialize, Deserializer, Serialize};
use std::time::Duration;

use crate::gotime::GoDuration;

pub mod upstream;
use upstream::{RetryOptions, UpstreamOptions};

pub const DEFAULT_DEPLOY_TIMEOUT: GoDuration = GoDuration::from_secs(30);
pub const DEFAULT_DRAIN_TIMEOUT: GoDuration = GoDuration::from_secs(30);
pub const DEFAULT_PAUSE_TIMEOUT: GoDuration = GoDuration::from_secs(30);
pub const DEFAULT_WRITER_AFFINITY_TIMEOUT: GoDuration = GoDuration::from_secs(1);
pub const DEFAULT_TARGET_TIMEOUT: GoDuration = GoDuration::from_secs(30);
pub const DEFAULT_MAX_MEMORY_BUFFER_SIZE: i64 = 1 << 20;
pub const DEFAULT_WAKE_TIMEOUT: GoDuration = GoDuration::from_secs(30);
/// The fork's session affinity cookie (F17).
pub const DEFAULT_SESSION_AFFINITY_COOKIE: &str = "kamal-session";

/// Go's `nil` slices are written as `null`; accept both.
fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// Go writes a list that was never given (a nil slice) as `null`; so do we, so a file
/// read back by Go is the file Go would have written.
fn empty_as_null<S: serde::Serializer>(v: &[String], s: S) -> Result<S::Ok, S::Error> {
    if v.is_empty() {
        s.serialize_none()
    } else {
        s.collect_seq(v)
    }
}

fn is_zero<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}

pub use crate::balancer::health::{
    DEFAULT_HEALTH_CHECK_INTERVAL, DEFAULT_HEALTH_CHECK_PATH, DEFAULT_HEALTH_CHECK_TIMEOUT,
    HealthCheckConfig,
};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ServiceOptions {
    #[serde(deserialize_with = "null_as_empty")]
    pub hosts: Vec<String>,
    #[serde(deserialize_with = "null_as_empty")]
    pub path_prefixes: Vec<String>,
    pub tls_enabled: bool,
    pub tls_certificate_path: String,
    pub tls_private_key_path: String,
    pub tls_on_demand_url: String,
    pub tls_redirect: bool,
    pub canonical_host: String,
    pub acme_directory: String,
    pub acme_cache_path: String,
    pub error_page_path: String,
    pub strip_prefix: bool,
    pub writer_affinity_timeout: GoDuration,
    pub read_targets_accept_websockets: bool,
    #[serde(deserialize_with = "null_as_empty", serialize_with = "empty_as_null")]
    pub exclude_metrics_paths: Vec<String>,
    pub client_ip_header: String,
    /// Cookie session affinity (fork F17): each client pinned to one writer; the cookie's
    /// name (empty: [`DEFAULT_SESSION_AFFINITY_COOKIE`]). Omitted when unset.
    #[serde(skip_serializing_if = "is_zero")]
    pub session_affinity: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub session_affinity_cookie: String,
    /// Scale-to-zero (fork keys): omitted when unset so upstream files stay recognisable.
    #[serde(skip_serializing_if = "is_zero")]
    pub sleep_after: GoDuration,
    #[serde(skip_serializing_if = "is_zero")]
    pub wake_timeout: GoDuration,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub sleep_containers: Vec<String>,
    /// The freeze tier: containers paused after this long idle; 0 = off.
    #[serde(skip_serializing_if = "is_zero")]
    pub freeze_after: GoDuration,
    /// `key=value` Docker labels selecting the containers at each transition.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub sleep_labels: Vec<String>,
    /// A waiting page for browser navigations held by a wake.
    #[serde(skip_serializing_if = "is_zero")]
    pub wake_page: bool,
    /// Access gates (fork keys, snake_case of the fork's field names); omitted when unset.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub allow_ips: Vec<String>,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub trusted_proxies: Vec<String>,
    /// Requests per second per client; 0 = off.
    #[serde(skip_serializing_if = "is_zero_f64")]
    pub rate_limit: f64,
    #[serde(skip_serializing_if = "is_zero")]
    pub rate_limit_burst: i64,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub rate_limit_exempt: Vec<String>,
    /// `sha256:<salt>:<digest>`, hashed by the CLI; never the plaintext.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub basic_auth: String,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub redirects: Vec<String>,
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub rewrites: Vec<String>,
    /// Whole-request deadline, nanoseconds; 0 = none.
    #[serde(skip_serializing_if = "is_zero")]
    pub request_timeout: GoDuration,
    /// `--target-try-duration`/`--target-try-interval` (fork keys, omitted when unset).
    #[serde(flatten)]
    pub retry: RetryOptions,
}

impl Default for ServiceOptions {
    /// Defaults of a file that omits a key are Go's zero values (legacy files restore
    /// `tls_redirect: false`); the CLI fills in the user-facing defaults itself.
    fn default() -> Self {
        ServiceOptions {
            hosts: Vec::new(),
            path_prefixes: Vec::new(),
            tls_enabled: false,
            tls_certificate_path: String::new(),
            tls_private_key_path: String::new(),
            tls_on_demand_url: String::new(),
            tls_redirect: false,
            canonical_host: String::new(),
            acme_directory: String::new(),
            acme_cache_path: String::new(),
            error_page_path: String::new(),
            strip_prefix: false,
            writer_affinity_timeout: GoDuration::ZERO,
            read_targets_accept_websockets: false,
            exclude_metrics_paths: Vec::new(),
            client_ip_header: String::new(),
            session_affinity: false,
            session_affinity_cookie: String::new(),
            sleep_after: GoDuration::ZERO,
            wake_timeout: GoDuration::ZERO,
            sleep_containers: Vec::new(),
            freeze_after: GoDuration::ZERO,
            sleep_labels: Vec::new(),
            wake_page: false,
            allow_ips: Vec::new(),
            trusted_proxies: Vec::new(),
            rate_limit: 0.0,
            rate_limit_burst: 0,
            rate_limit_exempt: Vec::new(),
            basic_auth: String::new(),
            redirects: Vec::new(),
            rewrites: Vec::new(),
            request_timeout: GoDuration::ZERO,
            retry: RetryOptions::default(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct TargetOptions {
    pub health_check_config: HealthCheckConfig,
    pub response_timeout: GoDuration,
    pub buffer_requests: bool,
    pub buffer_responses: bool,
    pub max_memory_buffer_size: i64,
    pub max_request_body_size: i64,
    pub max_response_body_size: i64,
    #[serde(deserialize_with = "null_as_empty", serialize_with = "empty_as_null")]
    pub log_request_headers: Vec<String>,
    #[serde(deserialize_with = "null_as_empty", serialize_with = "empty_as_null")]
    pub log_response_headers: Vec<String>,
    pub forward_headers: bool,
    pub scope_cookie_paths: bool,
    /// The pool flags and per-path timeouts (fork keys, omitted when unset).
    #[serde(flatten)]
    pub upstream: UpstreamOptions,
}

impl Default for TargetOptions {
    fn default() -> Self {
        TargetOptions {
            health_check_config: HealthCheckConfig::default(),
            response_timeout: DEFAULT_TARGET_TIMEOUT,
            buffer_requests: false,
            buffer_responses: false,
            max_memory_buffer_size: DEFAULT_MAX_MEMORY_BUFFER_SIZE,
            max_request_body_size: 0,
            max_response_body_size: 0,
            log_request_headers: Vec::new(),
            log_response_headers: Vec::new(),
            forward_headers: true,
            scope_cookie_paths: false,
            upstream: UpstreamOptions::default(),
        }
    }
}

impl TargetOptions {
    pub fn response_timeout(&self) -> Duration {
        self.response_timeout.to_std()
    }

    pub fn validate(&self) -> Result<(), String> {
        let hc = &self.health_check_config;
        if !hc.interval.is_positive() {
            return Err("health-check-interval must be positive".into());
        }
        if !hc.timeout.is_positive() {
            return Err("health-check-timeout must be positive".into());
        }
        if self.response_timeout.is_negative() {
            return Err("target-timeout cannot be negative".into());
        }
        if self.max_memory_buffer_size < 0
            || self.max_request_body_size < 0
            || self.max_response_body_size < 0
        {
            return Err("buffer sizes cannot be negative".into());
        }
        self.upstream
            .validate()
            .map_err(|e| format!("target options invalid: {e}"))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct DeploymentOptions {
    pub deploy_timeout: GoDuration,
    pub drain_timeout: GoDuration,
    pub force: bool,
}

impl Default for DeploymentOptions {
    fn default() -> Self {
        DeploymentOptions {
            deploy_timeout: DEFAULT_DEPLOY_TIMEOUT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            force: false,
        }
    }
}

/// `api`, `/api/` and `api/` all mean `/api`; `/` stays `/`.
pub fn normalize_prefix(prefix: &str) -> String {
    format!("/{}", prefix.trim_matches('/'))
}

impl ServiceOptions {
    /// Upstream's normalised view: no hosts means the default (empty) host, no prefixes
    /// means the root path.
    pub fn normalize(&mut self) {
        if self.hosts.is_empty() {
            self.hosts.push(String::new());
        }
        for h in self.hosts.iter_mut().chain([&mut self.canonical_host]) {
            *h = crate::uri::normalize_host(h).into_owned();
        }
        if self.path_prefixes.is_empty() {
            self.path_prefixes.push("/".into());
        }
        for p in &mut self.path_prefixes {
            *p = normalize_prefix(p);
        }
        if self.sleep_enabled() && self.wake_timeout == GoDuration::ZERO {
            self.wake_timeout = DEFAULT_WAKE_TIMEOUT;
        }
    }

    pub fn has_configured_hosts(&self) -> bool {
        !self.hosts.is_empty() && self.hosts.iter().all(|h| !h.is_empty())
    }

    pub fn serves_root(&self) -> bool {
        self.path_prefixes.iter().any(|p| p == "/")
    }

    /// What the service asks of certificates; none without TLS, and none for path-prefix
    /// services, which inherit TLS from the root service of their host (which answers the
    /// handshake), as upstream.
    pub fn cert_request(&self) -> Option<crate::tls::CertRequest<'_>> {
        (self.tls_enabled && self.serves_root()).then_some(crate::tls::CertRequest {
            hosts: &self.hosts,
            certificate_path: &self.tls_certificate_path,
            private_key_path: &self.tls_private_key_path,
            acme_directory: &self.acme_directory,
            acme_cache_path: &self.acme_cache_path,
            on_demand_url: &self.tls_on_demand_url,
        })
    }

    /// The session affinity cookie's name, when affinity is on.
    pub fn session_cookie(&self) -> Option<&str> {
        let name = match self.session_affinity_cookie.as_str() {
            "" => DEFAULT_SESSION_AFFINITY_COOKIE,
            name => name,
        };
        self.session_affinity.then_some(name)
    }

    /// Either tier is on: the service gets an idle controller.
    pub fn sleep_enabled(&self) -> bool {
        self.sleep_after.is_positive() || self.freeze_after.is_positive()
    }

    /// Validation shared by the CLI (before connecting) and the server (on every deploy):
    /// both give the same message. Runs on a normalised copy, as upstream does.
    /// The options' own rules; [`crate::service::validate`] adds the gates' and the
    /// health check's.
    pub fn validate(&self) -> Result<(), String> {
        let mut o = self.clone();
        o.normalize();
        o.check()
            .map_err(|e| format!("service options invalid: {e}"))
    }

    /// Checks `self` normalized (as it will be deployed) with `check`, errors prefixed.
    pub fn validate_with(
        &self,
        check: impl FnOnce(&ServiceOptions) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut o = self.clone();
        o.normalize();
        check(&o).map_err(|e| format!("service options invalid: {e}"))
    }

    /// [`Self::validate`] plus what only the server can judge, once container labels
    /// may have filled in sleep settings the command line left unset.
    pub fn validate_complete(&self) -> Result<(), String> {
        self.validate()?;
        if !self.sleep_enabled() {
            let needs = |flag: &str| {
                Err(format!(
                    "service options invalid: {flag} requires sleep-after or freeze-after"
                ))
            };
            if !self.sleep_containers.is_empty() {
                return needs("sleep-container");
            }
            if !self.sleep_labels.is_empty() {
                return needs("sleep-label");
            }
            if self.wake_page {
                return needs("wake-page");
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        for host in &self.hosts {
            validate_host(host)?;
        }
        if !self.tls_on_demand_url.is_empty() {
            if !self.tls_enabled {
                return Err("TLS must be enabled to use a TLS on-demand URL".into());
            }
            if self.has_configured_hosts() {
                return Err("cannot set hosts when using a TLS on-demand URL".into());
            }
            if !self.tls_certificate_path.is_empty() || !self.tls_private_key_path.is_empty() {
                return Err("cannot use a custom TLS certificate with a TLS on-demand URL".into());
            }
            if !self.canonical_host.is_empty() {
                return Err("cannot set a canonical host when using a TLS on-demand URL".into());
            }
            validate_on_demand_url(&self.tls_on_demand_url)?;
        } else if self.tls_enabled && !self.has_configured_hosts() {
            return Err("host must be set when using TLS".into());
        }
        if self.tls_enabled && !self.serves_root() {
            return Err("TLS settings must be specified on the root path service".into());
        }
        if self.tls_certificate_path.is_empty() != self.tls_private_key_path.is_empty() {
            return Err(
                "tls-certificate-path and tls-private-key-path must be set together".into(),
            );
        }
        if !self.canonical_host.is_empty()
            && self.hosts.first().is_some_and(|h| !h.is_empty())
            && !self.hosts.contains(&self.canonical_host)
        {
            return Err(format!(
                "canonical-host '{}' must be present in the hosts list: [{}]",
                self.canonical_host,
                self.hosts.join(" ")
            ));
        }
        if self.sleep_after.is_negative() || self.wake_timeout.is_negative() {
            return Err("sleep-after and wake-timeout cannot be negative".into());
        }
        if self.sleep_after.is_positive() && !self.tls_on_demand_url.is_empty() {
            return Err("sleep-after cannot be used with a TLS on-demand URL".into());
        }
        if self.freeze_after.is_negative() {
            return Err("freeze-after cannot be negative".into());
        }
        if self.freeze_after.is_positive() && !self.tls_on_demand_url.is_empty() {
            return Err("freeze-after cannot be used with a TLS on-demand URL".into());
        }
        if self.freeze_after.is_positive()
            && self.sleep_after.is_positive()
            && self.freeze_after >= self.sleep_after
        {
            return Err(format!(
                "freeze-after ({}) must be shorter than sleep-after ({})",
                self.freeze_after, self.sleep_after
            ));
        }
        for label in &self.sleep_labels {
            validate_sleep_label(label)?;
        }
        if !self.sleep_labels.is_empty() && !self.sleep_containers.is_empty() {
            return Err("sleep-label and sleep-container cannot be used together".into());
        }
        self.retry.validate()
    }
}

/// A `--sleep-label`: `key=value`, as Docker's label filter takes it.
fn validate_sleep_label(label: &str) -> Result<(), String> {
    match label.split_once('=') {
        Some((key, _)) if !key.trim().is_empty() && key.trim() == key => Ok(()),
        _ => Err(format!(
            "sleep-label must be given as \"<key>=<value>\", got \"{label}\""
        )),
    }
}

/// The longest service name accepted (Kamal's are `<service>-<role>[-<destination>]`).
pub const MAX_SERVICE_NAME: usize = 255;

/// A service name is printed by `list`, logged and used as a metrics label: letters,
/// digits, `-`, `_` and `.`, at most [`MAX_SERVICE_NAME`] bytes.
pub fn validate_service_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("service name must not be empty".into());
    }
    if name.len() > MAX_SERVICE_NAME {
        return Err(format!(
            "service name is {} bytes long; at most {MAX_SERVICE_NAME} are allowed",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "invalid service name {:?}: {c:?} is not allowed (letters, digits, '-', '_' and '.' are)",
            name
        ));
    }
    Ok(())
}

/// The longest host name DNS allows.
const MAX_HOST: usize = 253;

/// Rejects what can never match a Host header, so a typo is caught at deploy rather than
/// as a silent 404.
fn validate_host(host: &str) -> Result<(), String> {
    if host.len() > MAX_HOST {
        return Err(format!(
            "invalid host: {} bytes long, at most {MAX_HOST} are allowed",
            host.len()
        ));
    }
    let bad = host
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '?' | '#' | '@' | ','));
    if bad || host.starts_with('.') || (host.contains('*') && !host.starts_with("*.")) {
        return Err(format!("invalid host '{host}'"));
    }
    if host.matches('*').count() > 1 {
        return Err(format!("invalid host '{host}'"));
    }
    Ok(())
}

pub fn validate_on_demand_url(url: &str) -> Result<(), String> {
    if url.starts_with("//") {
        return Err("tls-on-demand-url must be a path or an absolute http(s) URL".into());
    }
    if url.starts_with('/') {
        return Ok(());
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "unable to parse tls-on-demand-url: parse \"{url}\": invalid URI for request"
        ));
    };
    if scheme.is_empty() {
        return Err(format!(
            "unable to parse tls-on-demand-url: parse \"{url}\": missing protocol scheme"
        ));
    }
    if scheme != "http" && scheme != "https" {
        return Err(format!(
            "unsupported scheme \"{scheme}\" in tls-on-demand-url"
        ));
    }
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() {
        return Err("missing host in tls-on-demand-url".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
