//! `kamal-proxy deploy <service>`: upstream's flags and defaults, plus the fork's
//! scale-to-zero flags. Validated here and again by the server, with the same messages.

use clap::{ArgAction, Args};

use super::values::{duration, float64, go_bool, int64, non_empty, port};
use crate::balancer::spec::TargetSpec;
use crate::control::{DeployArgs, Request};
use crate::gotime::GoDuration;
use crate::options::*;

/// The clap group of the sleep flags: the flags `labels::SLEEP_FLAGS` reads labels for.
const SLEEP_GROUP: &str = "sleep";

const STAGING_DIRECTORY: &str = "https://acme-staging-v02.api.letsencrypt.org/directory";

#[derive(Args, Debug)]
#[command(
    about = "Deploy a target host",
    long_about = "Deploy a target host.\n\n\
Waits until every target is healthy (unless --force), switches traffic atomically, then drains\n\
the previous targets before returning.\n\n\
Example:\n  kamal-proxy deploy app-web --target=\"app-web-1234:3000\" --host=\"app.example.com\"",
    // The scale-to-zero flags, each of which a container label can stand in for.
    group(clap::ArgGroup::new(SLEEP_GROUP).multiple(true))
)]
pub struct DeployCmd {
    /// Name of the service
    #[arg(value_name = "SERVICE")]
    service: Vec<String>,

    /// Target host(s) to deploy (repeatable, or comma-separated); 'host:port;weight=N' (1-1000, quoted for the shell) sets a target's share of requests [required]
    #[arg(long, value_delimiter = ',', action = ArgAction::Append, value_name = "HOST:PORT[;weight=N]")]
    target: Option<Vec<String>>,
    /// Read-only target host(s) to deploy; ';weight=N' weighs readers among themselves
    #[arg(long = "read-target", value_delimiter = ',', action = ArgAction::Append, value_name = "HOST:PORT[;weight=N]")]
    read_target: Vec<String>,
    /// Host(s) to serve this target on (empty for wildcard)
    #[arg(long, value_delimiter = ',', action = ArgAction::Append)]
    host: Vec<String>,
    /// Deploy the service below the specified path(s)
    #[arg(long = "path-prefix", value_delimiter = ',', action = ArgAction::Append)]
    path_prefix: Vec<String>,
    /// With --path-prefix, strip prefix from request before forwarding [default: true]
    #[arg(long = "strip-path-prefix", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    strip_path_prefix: Option<bool>,

    /// Configure TLS for this target (requires a non-empty host)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    tls: Option<bool>,
    /// Will make an HTTP request to the given URL, asking whether a host is allowed to have a certificate issued
    #[arg(long = "tls-on-demand-url", default_value = "")]
    tls_on_demand_url: String,
    /// Use Let's Encrypt staging environment for certificate provisioning
    #[arg(long = "tls-staging", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    tls_staging: Option<bool>,
    /// Configure custom TLS certificate path (PEM format)
    #[arg(long = "tls-certificate-path")]
    tls_certificate_path: Option<String>,
    /// Configure custom TLS private key path (PEM format)
    #[arg(long = "tls-private-key-path")]
    tls_private_key_path: Option<String>,
    /// Location to store ACME assets [default: ~/.config/kamal-proxy/certs]
    #[arg(long = "tls-acme-cache-path")]
    tls_acme_cache_path: Option<String>,
    /// Redirect HTTP traffic to HTTPS [default: true]
    #[arg(long = "tls-redirect", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    tls_redirect: Option<bool>,
    /// Redirect all requests to this host (e.g., force root or www)
    #[arg(long = "canonical-host", default_value = "")]
    canonical_host: String,

    /// Maximum time to wait for the new target to become healthy
    #[arg(long = "deploy-timeout", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    deploy_timeout: GoDuration,
    /// Maximum time to allow existing connections to drain before removing old target
    #[arg(long = "drain-timeout", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    drain_timeout: GoDuration,
    /// Skip health checks and force deployment
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    force: Option<bool>,

    /// Interval between health checks
    #[arg(long = "health-check-interval", value_parser = duration, default_value = "1s", value_name = "DURATION")]
    health_check_interval: GoDuration,
    /// Time each health check must complete in
    #[arg(long = "health-check-timeout", value_parser = duration, default_value = "5s", value_name = "DURATION")]
    health_check_timeout: GoDuration,
    /// Path to check for health
    #[arg(long = "health-check-path", default_value = DEFAULT_HEALTH_CHECK_PATH)]
    health_check_path: String,
    /// Port to check for health (default matches target port)
    #[arg(long = "health-check-port", value_parser = port, default_value_t = 0)]
    health_check_port: u16,
    /// Host header to send with health check requests
    #[arg(long = "health-check-host", default_value = "")]
    health_check_host: String,

    /// Time after a write before read requests will be routed to readers
    #[arg(long = "writer-affinity-timeout", value_parser = duration, default_value = "1s", value_name = "DURATION")]
    writer_affinity_timeout: GoDuration,
    /// Route WebSocket traffic to read targets, when available
    #[arg(long = "read-target-websockets", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    read_target_websockets: Option<bool>,

    /// Maximum time to wait for the target server to respond when serving requests
    #[arg(long = "target-timeout", value_parser = duration, default_value = "30s", value_name = "DURATION")]
    target_timeout: GoDuration,
    /// Buffer requests before forwarding to target
    #[arg(long = "buffer-requests", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    buffer_requests: Option<bool>,
    /// Buffer responses before forwarding to client
    #[arg(long = "buffer-responses", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    buffer_responses: Option<bool>,
    /// Max size of memory buffer, in bytes
    #[arg(long = "buffer-memory", value_parser = int64, default_value = "1048576", value_name = "BYTES")]
    buffer_memory: i64,
    /// Max size of request body when buffering, in bytes (default of 0 means unlimited)
    #[arg(long = "max-request-body", value_parser = int64, value_name = "BYTES")]
    max_request_body: Option<i64>,
    /// Max size of response body when buffering, in bytes (default of 0 means unlimited)
    #[arg(long = "max-response-body", value_parser = int64, value_name = "BYTES")]
    max_response_body: Option<i64>,

    /// Path to custom error pages
    #[arg(long = "error-pages", default_value = "")]
    error_pages: String,
    /// Additional request header to log (may be specified multiple times)
    #[arg(long = "log-request-header", value_delimiter = ',', action = ArgAction::Append)]
    log_request_header: Vec<String>,
    /// Additional response header to log (may be specified multiple times)
    #[arg(long = "log-response-header", value_delimiter = ',', action = ArgAction::Append)]
    log_response_header: Vec<String>,
    /// Request path(s) to exclude from Prometheus metrics (may be specified multiple times)
    #[arg(long = "exclude-metrics-path", value_delimiter = ',', action = ArgAction::Append)]
    exclude_metrics_path: Vec<String>,
    /// Forward X-Forwarded headers to target (default false if TLS enabled; otherwise true)
    #[arg(long = "forward-headers", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    forward_headers: Option<bool>,
    /// Request header containing the original client IP; used to populate X-Forwarded-For when present
    #[arg(long = "client-ip-header", default_value = "")]
    client_ip_header: String,
    /// Scope cookie paths to match path prefix
    #[arg(long = "scope-cookie-paths", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    scope_cookie_paths: Option<bool>,

    /// Pin each client to one target with a cookie (an opaque HMAC of the target) for as long as that target is healthy and deployed, then to another; reads served by --read-target are not pinned
    #[arg(long = "session-affinity", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    session_affinity: Option<bool>,
    /// Name of the session affinity cookie (requires --session-affinity) [default: kamal-session]
    #[arg(long = "session-affinity-cookie", value_name = "NAME")]
    session_affinity_cookie: Option<String>,

    /// Stop the service's containers after this long without traffic (0 = never). Unset, it
    /// comes from the containers' label kamal-proxy.sleep-after when the proxy has a
    /// Docker socket [default: 0]
    #[arg(long = "sleep-after", group = SLEEP_GROUP, value_parser = duration, value_name = "DURATION")]
    sleep_after: Option<GoDuration>,
    /// How long a request is held while a sleeping service starts (label:
    /// kamal-proxy.wake-timeout) [default: 30s]
    #[arg(long = "wake-timeout", group = SLEEP_GROUP, value_parser = duration, value_name = "DURATION")]
    wake_timeout: Option<GoDuration>,
    /// Container to stop and start instead of those named by the targets (repeatable;
    /// label: kamal-proxy.sleep-container, comma-separated)
    #[arg(long = "sleep-container", group = SLEEP_GROUP, action = ArgAction::Append, value_name = "CONTAINER")]
    sleep_container: Vec<String>,
    /// Freeze (docker pause: memory kept, no CPU, wakes in milliseconds) the service's
    /// containers after this long without traffic; 0 = never. With --sleep-after it must be
    /// shorter: frozen first, stopped later (label: kamal-proxy.freeze-after) [default: 0]
    #[arg(long = "freeze-after", group = SLEEP_GROUP, value_parser = duration, value_name = "DURATION")]
    freeze_after: Option<GoDuration>,
    /// Select the containers to freeze, stop and start by Docker label at each transition
    /// instead of fixed references (repeatable, all must match; e.g. service=app, role=web;
    /// label: kamal-proxy.sleep-label, comma-separated)
    #[arg(long = "sleep-label", group = SLEEP_GROUP, action = ArgAction::Append, value_name = "KEY=VALUE")]
    sleep_label: Vec<String>,
    /// Answer a browser navigation still held by a wake after 1s with a self-refreshing
    /// "Starting…" page (503, Retry-After; wake.html in --error-pages overrides it); API
    /// calls stay held (label: kamal-proxy.wake-page)
    #[arg(long = "wake-page", group = SLEEP_GROUP, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    wake_page: Option<bool>,

    /// Only these client addresses or CIDR ranges may reach the service; others get 403 (repeatable, or comma-separated)
    #[arg(long = "allow-ip", value_delimiter = ',', action = ArgAction::Append, value_name = "IP|CIDR")]
    allow_ip: Vec<String>,
    /// Proxies in front of this one whose X-Forwarded-For (or --client-ip-header) names the client, for --allow-ip and --rate-limit (repeatable, or comma-separated)
    #[arg(long = "trusted-proxy", value_delimiter = ',', action = ArgAction::Append, value_name = "IP|CIDR")]
    trusted_proxy: Vec<String>,
    /// Requests per second per client (IPv6 clients per /64; fractions allowed, e.g. 0.5); over budget → 429 (0 = off)
    #[arg(long = "rate-limit", value_parser = float64, default_value = "0", value_name = "REQUESTS/S")]
    rate_limit: f64,
    /// Requests a client may make at once before the rate applies (0 = max(1, ceil(rate)))
    #[arg(long = "rate-limit-burst", value_parser = int64, default_value = "0", value_name = "N")]
    rate_limit_burst: i64,
    /// Client addresses or CIDR ranges the rate limit does not apply to (repeatable, or comma-separated)
    #[arg(long = "rate-limit-exempt", value_delimiter = ',', action = ArgAction::Append, value_name = "IP|CIDR")]
    rate_limit_exempt: Vec<String>,
    /// Require HTTP Basic credentials (user:password); hashed here, the password never leaves this host
    #[arg(long = "basic-auth", default_value = "", value_name = "USER:PASSWORD")]
    basic_auth: String,
    /// Redirect paths matching a regex: 'PATTERN=REPLACEMENT[;status=N]' ($1 expands; status 301 by default; repeatable)
    #[arg(long = "redirect", action = ArgAction::Append, value_name = "RULE")]
    redirect: Vec<String>,
    /// Rewrite the path the target sees: 'PATTERN=REPLACEMENT' ($1 expands; repeatable)
    #[arg(long = "rewrite", action = ArgAction::Append, value_name = "RULE")]
    rewrite: Vec<String>,
    /// Deadline for the whole request, holds included; 504 when it passes (0 = none; WebSocket and SSE exempt)
    #[arg(long = "request-timeout", value_parser = duration, default_value = "0", value_name = "DURATION")]
    request_timeout: GoDuration,

    /// The upstream leg: retries, the connection pool, per-path timeouts.
    #[command(flatten)]
    upstream: super::upstream::UpstreamFlags,
}

impl DeployCmd {
    pub fn to_args(&self) -> Result<DeployArgs, String> {
        // Cobra's order: the argument count, then required flags, then the rest.
        let service = super::exactly_one(&self.service)?;
        validate_service_name(&service)?;
        let Some(target) = &self.target else {
            return Err("required flag(s) \"target\" not set".into());
        };
        // Cobra's flag group: both or neither, by presence (an empty value counts).
        match (&self.tls_certificate_path, &self.tls_private_key_path) {
            (Some(_), None) | (None, Some(_)) => {
                let missing = if self.tls_certificate_path.is_none() {
                    "tls-certificate-path"
                } else {
                    "tls-private-key-path"
                };
                return Err(format!(
                    "if any flags in the group [tls-certificate-path tls-private-key-path] are set they must all be set; missing [{missing}]"
                ));
            }
            _ => {}
        }
        // Upstream checks presence, not value: Kamal sends `--buffer-requests="false"`
        // together with `--max-request-body`, which must pass.
        if self.max_request_body.is_some() && self.buffer_requests.is_none() {
            return Err(
                "max-request-body can only be set when request buffering is enabled".into(),
            );
        }
        if self.max_response_body.is_some() && self.buffer_responses.is_none() {
            return Err(
                "max-response-body can only be set when response buffering is enabled".into(),
            );
        }
        let tls = self.tls.unwrap_or(false);
        let acme_cache_path = match &self.tls_acme_cache_path {
            Some(p) => p.clone(),
            None => crate::config::default_acme_cache_path()
                .display()
                .to_string(),
        };
        let service_options = ServiceOptions {
            hosts: non_empty(self.host.clone()),
            path_prefixes: non_empty(self.path_prefix.clone()),
            tls_enabled: tls,
            tls_certificate_path: self.tls_certificate_path.clone().unwrap_or_default(),
            tls_private_key_path: self.tls_private_key_path.clone().unwrap_or_default(),
            tls_on_demand_url: self.tls_on_demand_url.clone(),
            tls_redirect: self.tls_redirect.unwrap_or(true),
            canonical_host: self.canonical_host.clone(),
            acme_directory: if self.tls_staging.unwrap_or(false) {
                STAGING_DIRECTORY.into()
            } else {
                String::new()
            },
            acme_cache_path,
            error_page_path: self.error_pages.clone(),
            strip_prefix: self.strip_path_prefix.unwrap_or(true),
            writer_affinity_timeout: self.writer_affinity_timeout,
            read_targets_accept_websockets: self.read_target_websockets.unwrap_or(false),
            exclude_metrics_paths: non_empty(self.exclude_metrics_path.clone()),
            client_ip_header: self.client_ip_header.clone(),
            session_affinity: self.session_affinity.unwrap_or(false),
            session_affinity_cookie: self.session_affinity_cookie.clone().unwrap_or_default(),
            sleep_after: self.sleep_after.unwrap_or_default(),
            wake_timeout: self.wake_timeout.unwrap_or_default(),
            sleep_containers: non_empty(self.sleep_container.clone()),
            freeze_after: self.freeze_after.unwrap_or_default(),
            sleep_labels: non_empty(self.sleep_label.clone()),
            wake_page: self.wake_page.unwrap_or(false),
            allow_ips: non_empty(self.allow_ip.clone()),
            trusted_proxies: non_empty(self.trusted_proxy.clone()),
            rate_limit: self.rate_limit,
            rate_limit_burst: self.rate_limit_burst,
            rate_limit_exempt: non_empty(self.rate_limit_exempt.clone()),
            // Hashed here: the plaintext never crosses the socket.
            basic_auth: if self.basic_auth.is_empty() {
                String::new()
            } else {
                crate::service::gates::basic_auth::encode_flag(&self.basic_auth)?
            },
            redirects: self.redirect.clone(),
            rewrites: self.rewrite.clone(),
            request_timeout: self.request_timeout,
            retry: self.upstream.retry(),
        };
        let target_options = TargetOptions {
            health_check_config: HealthCheckConfig {
                path: self.health_check_path.clone(),
                port: self.health_check_port,
                interval: self.health_check_interval,
                timeout: self.health_check_timeout,
                host: self.health_check_host.clone(),
            },
            response_timeout: self.target_timeout,
            buffer_requests: self.buffer_requests.unwrap_or(false),
            buffer_responses: self.buffer_responses.unwrap_or(false),
            max_memory_buffer_size: self.buffer_memory,
            max_request_body_size: self.max_request_body.unwrap_or(0),
            max_response_body_size: self.max_response_body.unwrap_or(0),
            log_request_headers: non_empty(self.log_request_header.clone()),
            log_response_headers: non_empty(self.log_response_header.clone()),
            forward_headers: self.forward_headers.unwrap_or(!tls),
            scope_cookie_paths: self.scope_cookie_paths.unwrap_or(false),
            upstream: self.upstream.options()?,
        };
        crate::service::validate(&service_options, &target_options)?;
        let targets = non_empty(target.clone());
        let readers = non_empty(self.read_target.clone());
        for t in targets.iter().chain(readers.iter()) {
            TargetSpec::parse(t)?;
        }
        Ok(DeployArgs {
            service,
            targets,
            readers,
            deployment: DeploymentOptions {
                deploy_timeout: self.deploy_timeout,
                drain_timeout: self.drain_timeout,
                force: self.force.unwrap_or(false),
            },
            service_options,
            target_options,
            sleep_flags: self.sleep_flags_given(),
        })
    }

    /// The sleep flags on the command line, which win over container labels.
    fn sleep_flags_given(&self) -> Vec<String> {
        [
            ("sleep-after", self.sleep_after.is_some()),
            ("wake-timeout", self.wake_timeout.is_some()),
            ("sleep-container", !self.sleep_container.is_empty()),
            ("freeze-after", self.freeze_after.is_some()),
            ("sleep-label", !self.sleep_label.is_empty()),
            ("wake-page", self.wake_page.is_some()),
        ]
        .into_iter()
        .filter(|(_, given)| *given)
        .map(|(flag, _)| flag.to_string())
        .collect()
    }

    pub fn execute(&self) -> Result<(), String> {
        let args = self.to_args()?;
        super::call(Request::Deploy(Box::new(args))).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::sleep::labels::SLEEP_FLAGS;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        deploy: DeployCmd,
    }

    fn parse(args: &[&str]) -> DeployCmd {
        let argv = std::iter::once("deploy").chain(args.iter().copied());
        Wrapper::try_parse_from(argv).expect("parses").deploy
    }

    #[test]
    fn session_affinity_and_weights_as_the_fork_s_kamal_sends_them() {
        let args = parse(&[
            "app",
            "--target=web-1:80;weight=3,web-2:80",
            "--session-affinity",
            "--session-affinity-cookie=sticky",
        ])
        .to_args()
        .unwrap();
        assert_eq!(args.targets, ["web-1:80;weight=3", "web-2:80"]);
        assert!(args.service_options.session_affinity);
        assert_eq!(args.service_options.session_cookie(), Some("sticky"));
        let args = parse(&["app", "--target=web:80", "--session-affinity=true"])
            .to_args()
            .unwrap();
        assert_eq!(args.service_options.session_cookie(), Some("kamal-session"));
        let off = parse(&["app", "--target=web:80"]).to_args().unwrap();
        assert_eq!(off.service_options.session_cookie(), None);
        assert_eq!(
            parse(&["app", "--target=web:80", "--session-affinity-cookie=x"])
                .to_args()
                .unwrap_err(),
            "service options invalid: session-affinity-cookie requires session-affinity"
        );
    }

    /// One vocabulary: every flag in the deploy command's sleep group has a label (it is
    /// in `SLEEP_FLAGS`, and its help names `kamal-proxy.<flag>`), every label name is a
    /// sleep flag, and no flag that looks like one (sleep-/wake-/freeze-) is outside the
    /// group.
    #[test]
    fn the_sleep_flags_and_the_label_names_agree_both_ways() {
        use crate::service::sleep::labels::label_for;
        let mut command = Wrapper::command();
        // Arguments join their groups when the command is built.
        command.build();
        let group = command
            .get_groups()
            .find(|g| g.get_id() == SLEEP_GROUP)
            .expect("the deploy command has a sleep group");
        let members: Vec<&clap::Arg> = group
            .get_args()
            .map(|id| {
                command
                    .get_arguments()
                    .find(|a| a.get_id() == id)
                    .unwrap_or_else(|| panic!("group member {id} is no argument"))
            })
            .collect();
        let flags: Vec<&str> = members
            .iter()
            .map(|a| a.get_long().expect("a long flag"))
            .collect();
        for arg in &members {
            let flag = arg.get_long().expect("a long flag");
            assert!(
                SLEEP_FLAGS.contains(&flag),
                "--{flag} is a sleep flag with no label"
            );
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(
                help.contains(&label_for(flag)),
                "--{flag}'s help does not name its label {}: {help}",
                label_for(flag)
            );
        }
        for label in SLEEP_FLAGS {
            assert!(
                flags.contains(label),
                "label kamal-proxy.{label} names no sleep flag of deploy"
            );
        }
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if ["sleep-", "wake-", "freeze-"]
                .iter()
                .any(|p| long.starts_with(p))
            {
                assert!(flags.contains(&long), "--{long} is outside the sleep group");
            }
        }
    }

    #[test]
    fn every_sleep_label_is_a_deploy_flag_and_the_cli_reports_each_given() {
        let command = Wrapper::command();
        for flag in SLEEP_FLAGS {
            assert!(
                command.get_arguments().any(|a| a.get_long() == Some(flag)),
                "--{flag} is not a deploy flag"
            );
        }
        let all = parse(&[
            "app",
            "--target=web:80",
            "--sleep-after=0",
            "--wake-timeout=30s",
            "--sleep-container=web",
            "--freeze-after=0",
            "--sleep-label=service=app",
            "--wake-page=false",
        ]);
        assert_eq!(all.sleep_flags_given(), SLEEP_FLAGS);
        let none = parse(&["app", "--target=web:80"]);
        assert!(none.sleep_flags_given().is_empty());
        let args = none.to_args().unwrap();
        assert_eq!(
            (
                args.service_options.sleep_after,
                args.service_options.wake_timeout
            ),
            (GoDuration::ZERO, GoDuration::ZERO),
            "unset: left to the labels, then the defaults"
        );
    }
}
