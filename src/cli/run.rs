//! `kamal-proxy run`: restore state, open the listeners, serve until SIGTERM/SIGINT.

use clap::Args;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use super::values::{duration, go_bool, int64, non_empty, port};
use crate::config::{env_bool, env_int, env_value};
use crate::control::server::ControlListener;
use crate::gotime::GoDuration;
use crate::lifecycle::ContainerLifecycle;
use crate::lifecycle::docker::{check_socket_path, connect};
use crate::router::{RestorePolicy, Router};
use crate::server::handover::{self, HandoverListener, Inherited, Role};
use crate::server::limits::{self, ConnectionSlots, Limits, Timeouts};
use crate::server::proxy_protocol::{self, ProxyProtocol};
use crate::server::workers::Workers;
use crate::server::{self, Proxy, Shutdown};
use crate::service::gates::client_ip::IpList;

#[derive(Args, Debug)]
#[command(
    about = "Run the server",
    long_about = "Run the server.\n\n\
Each flag can also be set from the environment: KAMAL_PROXY_<NAME>, then <NAME>\n\
(e.g. KAMAL_PROXY_HTTP_PORT or HTTP_PORT); an explicit flag wins.\n\n\
Durations take Go's syntax (500ms, 30s, 1m30s); a timeout of 0 means no limit.\n\n\
Example:\n  kamal-proxy run --http-port=8080 --metrics-port=9090\n  kamal-proxy run --data-dir=/var/lib/kamal-proxy --recheck-targets-on-restore\n  \
kamal-proxy run --proxy-protocol --proxy-protocol-allow-ip=10.0.0.0/8 --idle-timeout=2m"
)]
pub struct RunArgs {
    /// Upstream accepts and ignores positional arguments.
    #[arg(hide = true)]
    _ignored: Vec<String>,
    /// Include debugging logs [env: KAMAL_PROXY_DEBUG, DEBUG]
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, default_value_t = env_bool("DEBUG", false), value_name = "BOOL")]
    debug: bool,
    /// Port to serve HTTP traffic on [env: KAMAL_PROXY_HTTP_PORT, HTTP_PORT]
    #[arg(long = "http-port", value_parser = port, default_value_t = env_int("HTTP_PORT", 80))]
    http_port: u16,
    /// Port to serve HTTPS traffic on [env: KAMAL_PROXY_HTTPS_PORT, HTTPS_PORT]
    #[arg(long = "https-port", value_parser = port, default_value_t = env_int("HTTPS_PORT", 443))]
    https_port: u16,
    /// Publish metrics on the specified port (default zero to disable) [env: KAMAL_PROXY_METRICS_PORT, METRICS_PORT]
    #[arg(long = "metrics-port", value_parser = port, default_value_t = env_int("METRICS_PORT", 0))]
    metrics_port: u16,
    /// Enable HTTP/3 (QUIC on the HTTPS port, advertised with Alt-Svc)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, default_value_t = false, value_name = "BOOL")]
    http3: bool,
    /// ACME directory URL for automatic certificates, unless a service uses --tls-staging
    /// [default: Let's Encrypt production] [env: KAMAL_PROXY_ACME_DIRECTORY, ACME_DIRECTORY]
    #[arg(long = "acme-directory", default_value_t = env_value("ACME_DIRECTORY").unwrap_or_default(), hide_default_value = true, value_name = "URL")]
    acme_directory: String,
    /// Contact email of the ACME account (optional) [env: KAMAL_PROXY_ACME_EMAIL, ACME_EMAIL]
    #[arg(long = "acme-email", default_value_t = env_value("ACME_EMAIL").unwrap_or_default(), hide_default_value = true, value_name = "EMAIL")]
    acme_email: String,
    /// Docker Engine socket used to stop and start sleeping services (empty = scale-to-zero
    /// disabled) [env: KAMAL_PROXY_DOCKER_SOCKET, DOCKER_SOCKET]
    #[arg(long = "docker-socket", default_value_t = env_value("DOCKER_SOCKET").unwrap_or_default())]
    docker_socket: String,
    /// Answer 408 and close the connection when a client sends no byte of its request
    /// body for this long (0 = wait for ever) [env: KAMAL_PROXY_BODY_READ_TIMEOUT, BODY_READ_TIMEOUT]
    #[arg(long = "body-read-timeout", value_parser = timeout, default_value_t = env_parsed("BODY_READ_TIMEOUT", timeout, GoDuration::from_secs(60)), value_name = "DURATION")]
    body_read_timeout: GoDuration,
    /// Close a connection whose request head has not fully arrived this long after its
    /// first byte (the first request's: after the connection opened); also bounds a PROXY
    /// protocol header [env: KAMAL_PROXY_READ_HEADER_TIMEOUT, READ_HEADER_TIMEOUT]
    #[arg(long = "read-header-timeout", value_parser = timeout, default_value_t = env_parsed("READ_HEADER_TIMEOUT", timeout, GoDuration::from_secs(30)), value_name = "DURATION")]
    read_header_timeout: GoDuration,
    /// The longest a client may take to send a whole request: its head (the shorter of
    /// this and --read-header-timeout), then its body (408) [env: KAMAL_PROXY_READ_TIMEOUT, READ_TIMEOUT]
    #[arg(long = "read-timeout", value_parser = timeout, default_value_t = env_parsed("READ_TIMEOUT", timeout, GoDuration::from_secs(0)), value_name = "DURATION")]
    read_timeout: GoDuration,
    /// Cut off a response not over this long after its request head arrived (the
    /// connection is closed, an HTTP/2 stream reset); kills long downloads and event
    /// streams [env: KAMAL_PROXY_WRITE_TIMEOUT, WRITE_TIMEOUT]
    #[arg(long = "write-timeout", value_parser = timeout, default_value_t = env_parsed("WRITE_TIMEOUT", timeout, GoDuration::from_secs(0)), value_name = "DURATION")]
    write_timeout: GoDuration,
    /// Close a keep-alive connection idle this long: HTTP/1.1 waiting for its next
    /// request, HTTP/2 with no open stream (GOAWAY), HTTP/3 [env: KAMAL_PROXY_IDLE_TIMEOUT, IDLE_TIMEOUT]
    #[arg(long = "idle-timeout", value_parser = timeout, default_value_t = env_parsed("IDLE_TIMEOUT", timeout, GoDuration::from_secs(60)), value_name = "DURATION")]
    idle_timeout: GoDuration,
    /// On SIGTERM/SIGINT, or a drain without --drain-timeout, how long in-flight requests
    /// get to finish [env: KAMAL_PROXY_SHUTDOWN_TIMEOUT, SHUTDOWN_TIMEOUT]
    #[arg(long = "shutdown-timeout", value_parser = timeout, default_value_t = env_parsed("SHUTDOWN_TIMEOUT", timeout, GoDuration::from_secs(10)), value_name = "DURATION")]
    shutdown_timeout: GoDuration,
    /// Read a PROXY protocol header (v1 or v2, optional per connection) on the HTTP and
    /// HTTPS ports: the client it names is the one logged, forwarded and checked by the
    /// gates [env: KAMAL_PROXY_PROXY_PROTOCOL, PROXY_PROTOCOL]
    #[arg(long = "proxy-protocol", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, default_value_t = env_bool("PROXY_PROTOCOL", false), value_name = "BOOL")]
    proxy_protocol: bool,
    /// Honour PROXY protocol headers only from these addresses/CIDRs (repeatable, or
    /// comma-separated; others are served on their own address) [default: every peer]
    #[arg(long = "proxy-protocol-allow-ip", value_delimiter = ',', action = clap::ArgAction::Append, value_name = "IP|CIDR")]
    proxy_protocol_allow_ip: Vec<String>,
    /// Serve metrics only to these connecting addresses/CIDRs, 403 to others (repeatable,
    /// or comma-separated) [default: everyone who reaches the port]
    #[arg(long = "metrics-allow-ip", value_delimiter = ',', action = clap::ArgAction::Append, value_name = "IP|CIDR")]
    metrics_allow_ip: Vec<String>,
    /// Most client connections open at once on the HTTP and HTTPS ports; past it, new
    /// connections wait in the listen backlog [env: KAMAL_PROXY_MAX_CONNECTIONS, MAX_CONNECTIONS]
    #[arg(long = "max-connections", value_parser = max_connections, default_value_t = env_parsed("MAX_CONNECTIONS", max_connections, limits::DEFAULT_MAX_CONNECTIONS), value_name = "COUNT")]
    max_connections: usize,
    /// Largest request head (request line and headers) in bytes; larger ones get 431
    /// [env: KAMAL_PROXY_MAX_REQUEST_HEADER_SIZE, MAX_REQUEST_HEADER_SIZE]
    #[arg(long = "max-request-header-size", value_parser = max_header_size, default_value_t = env_parsed("MAX_REQUEST_HEADER_SIZE", max_header_size, limits::DEFAULT_MAX_HEADER_BYTES), value_name = "BYTES")]
    max_request_header_size: usize,
    /// Directory for the state file and certificates [default: $HOME/.config/kamal-proxy]
    /// [env: KAMAL_PROXY_DATA_DIR, DATA_DIR]
    #[arg(long = "data-dir", default_value_t = env_value("DATA_DIR").unwrap_or_default(), hide_default_value = true, value_name = "PATH")]
    data_dir: String,
    /// Boot with no services when the state file cannot be decoded (it is set aside),
    /// instead of refusing to start [env: KAMAL_PROXY_IGNORE_RESTORE_ERRORS, IGNORE_RESTORE_ERRORS]
    #[arg(long = "ignore-restore-errors", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, default_value_t = env_bool("IGNORE_RESTORE_ERRORS", false), value_name = "BOOL")]
    ignore_restore_errors: bool,
    /// Keep health-checking restored targets (they serve at once; a dead one is taken out,
    /// a recovered one rejoins) [env: KAMAL_PROXY_RECHECK_TARGETS_ON_RESTORE, RECHECK_TARGETS_ON_RESTORE]
    #[arg(long = "recheck-targets-on-restore", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, default_value_t = env_bool("RECHECK_TARGETS_ON_RESTORE", false), value_name = "BOOL")]
    recheck_targets_on_restore: bool,
    /// Bind the listeners with SO_REUSEPORT and take over the listening sockets of a
    /// running generation sharing the data directory, for an upgrade that drops nothing
    /// (then `kamal-proxy drain` the old one) [env: KAMAL_PROXY_REUSE_PORT, REUSE_PORT]
    #[arg(long = "reuse-port", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, default_value_t = env_bool("REUSE_PORT", false), value_name = "BOOL")]
    reuse_port: bool,
}

/// An environment default parsed as the flag is; a value that does not parse falls back
/// to the built-in default, as upstream's integer flags do.
fn env_parsed<T>(key: &str, parse: fn(&str) -> Result<T, String>, default: T) -> T {
    env_value(key)
        .and_then(|v| parse(&v).ok())
        .unwrap_or(default)
}

/// A duration flag where 0 turns the limit off.
fn timeout(s: &str) -> Result<GoDuration, String> {
    let d = duration(s)?;
    if d.is_negative() {
        return Err("must not be negative (0 disables it)".into());
    }
    Ok(d)
}

fn max_connections(s: &str) -> Result<usize, String> {
    match int64(s)? {
        n @ 1..=1_000_000 => Ok(n as usize),
        _ => Err("must be between 1 and 1000000".into()),
    }
}

fn max_header_size(s: &str) -> Result<usize, String> {
    match int64(s)? {
        n @ 1024..=0xFFFF_FFFF => Ok(n as usize),
        _ => Err("must be between 1024 and 4294967295 bytes".into()),
    }
}

pub fn run(args: RunArgs) -> i32 {
    let _log_guard = crate::observe::log::init(args.debug);
    // The control side (control socket, deploys and health checks, scale-to-zero, ACME,
    // metrics, HTTP/3's endpoint): light work, on this thread whatever the host. The
    // listeners have their own runtimes (server/workers.rs). One thread, not a pool of
    // two: idle RSS is ~0.65 MiB less (two threads' stacks and malloc arenas, and libm,
    // which only the work-stealing scheduler's `powf` needed; bench/README.md).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Access lines wait in this thread's batch until it goes idle (or the batch
        // fills): one hand-over to the log writer per burst instead of one per request.
        .on_thread_park(crate::observe::log::thread_idle)
        // The blocking pool's threads (name lookups, file writes).
        .on_thread_stop(crate::observe::log::thread_stopping)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: {e}");
            return 1;
        }
    };
    // The listeners' own runtimes (server/workers.rs); started before the state is
    // restored, because per-worker state is sized by their number.
    let (workers, threads) = match Workers::start(Workers::default_count()) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("Error: {e}");
            return 1;
        }
    };
    let result = runtime.block_on(serve(args, workers.clone()));
    // The workers first: nothing of theirs may outlive the control runtime.
    workers.stop();
    threads.join();
    drop(runtime);
    // The runtime ran on this thread, where `on_thread_stop` does not fire: hand over
    // this thread's last access lines here.
    crate::observe::log::thread_stopping();
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

/// `Some` for a positive duration; 0 means no limit.
fn limit(d: GoDuration) -> Option<std::time::Duration> {
    d.is_positive().then(|| d.to_std())
}

async fn serve(args: RunArgs, workers: Workers) -> Result<(), String> {
    // Dev-dependencies can compile a second provider in; never let rustls guess.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    // Checked before anything starts, even when the feature they belong to is off (as
    // the fork): a typo is found at the first boot, not when the feature is turned on.
    let metrics_allowed = IpList::parse(
        &non_empty(args.metrics_allow_ip.clone()),
        "metrics-allow-ip",
    )?;
    let proxy_protocol_allowed = IpList::parse(
        &non_empty(args.proxy_protocol_allow_ip.clone()),
        "proxy-protocol-allow-ip",
    )?;
    let timeouts = Timeouts {
        read_header: limit(args.read_header_timeout),
        read: limit(args.read_timeout),
        write: limit(args.write_timeout),
        idle: limit(args.idle_timeout),
    };
    let lifecycle: Option<Arc<dyn ContainerLifecycle>> = if args.docker_socket.is_empty() {
        None
    } else {
        let path = std::path::Path::new(&args.docker_socket);
        check_socket_path(path)?;
        let docker = connect(path)?;
        tracing::info!(docker_socket = %args.docker_socket, "Scale-to-zero enabled");
        Some(Arc::new(docker))
    };

    let open_files = raise_open_files_limit();
    // Each proxied connection holds two descriptors (client and app).
    if open_files.is_some_and(|n| (args.max_connections as u64).saturating_mul(2) + 64 > n) {
        tracing::warn!(
            max_connections = args.max_connections,
            open_files_limit = open_files,
            "The open files limit is too low for --max-connections; descriptors may run out first"
        );
    }
    let data_dir = crate::config::prepare_data_dir(&args.data_dir)?;
    let reuse = args.reuse_port;
    // An upgrade: the previous generation's listening sockets, asked for before the
    // state is read, because handing them over is also how it gives up the state file.
    let handover_path = data_dir.join(crate::config::HANDOVER_SOCKET_NAME);
    let mut inherited = if reuse {
        handover::ask(&handover_path).await?.unwrap_or_default()
    } else {
        Inherited::default()
    };
    if !inherited.is_empty() {
        tracing::info!("Took over the listeners of the previous generation");
    }
    let state_path = data_dir.join(crate::config::STATE_FILE_NAME);
    for leftover in crate::router::state::remove_stale_temp_files(&state_path) {
        tracing::info!(path = %leftover.display(), "Removed leftover temp state file");
    }
    let router = Router::new(state_path, lifecycle);
    let acme_directory = if args.acme_directory.is_empty() {
        crate::tls::cache::LETS_ENCRYPT_PRODUCTION.to_string()
    } else {
        args.acme_directory.clone()
    };
    let acme_email = (!args.acme_email.is_empty()).then(|| args.acme_email.clone());
    router.configure_tls(
        acme_directory,
        acme_email,
        data_dir.join(crate::config::CERTS_DIR_NAME),
    );
    // Before the restore: each restored service's sleep series are made as its idle
    // controller is, and would otherwise be missing until its next deploy.
    if args.metrics_port != 0 {
        crate::observe::metrics::enable()?;
    }
    router
        .restore(RestorePolicy {
            ignore_errors: args.ignore_restore_errors,
            recheck_targets: args.recheck_targets_on_restore,
        })
        .await?;

    let shutdown = Arc::new(Shutdown::new(args.shutdown_timeout.to_std()));
    // Metrics outlive the drain (fork F28): they stop with the process.
    let metrics_stop = CancellationToken::new();
    let mut tasks = Vec::new();
    // `--metrics-port 0` means disabled (upstream), so a bound metrics port is never 0.
    let mut metrics = None;
    if args.metrics_port != 0 {
        let listener = match inherited.take(Role::Metrics, args.metrics_port) {
            Some(l) => l,
            None => server::bind(args.metrics_port, reuse).await?,
        };
        let port = listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or(args.metrics_port);
        tracing::info!(address = %format!(":{port}"), "Metrics enabled");
        metrics = Some((port, listener));
    }
    let http = match inherited.take(Role::Http, args.http_port) {
        Some(l) => l,
        None => server::bind(args.http_port, reuse).await?,
    };
    let http_port = http
        .local_addr()
        .map(|a| a.port())
        .unwrap_or(args.http_port);
    let https = match inherited.take(Role::Https, args.https_port) {
        Some(l) => l,
        None => server::bind(args.https_port, reuse).await?,
    };
    let https_port = https
        .local_addr()
        .map(|a| a.port())
        .unwrap_or(args.https_port);
    // The next generation asks here for these very sockets.
    let mut offered = vec![(Role::Http, &http), (Role::Https, &https)];
    if let Some((_, l)) = &metrics {
        offered.push((Role::Metrics, l));
    }
    // Without it the proxy still serves; only the next upgrade cannot take the sockets.
    let handover = HandoverListener::bind(&handover_path, &offered)
        .inspect_err(|e| {
            tracing::warn!(error = %e, "No listener hand-over: a later upgrade with --reuse-port will bind alongside instead")
        })
        .ok();
    let metrics_allowed = Arc::new(metrics_allowed);
    let metrics_port = metrics.map(|(port, listener)| {
        tasks.push(tokio::spawn(server::metrics_listener::serve(
            listener,
            metrics_allowed,
            timeouts,
            metrics_stop.clone(),
        )));
        port
    });
    let tls_config = crate::server::https::server_config(Arc::new(
        crate::server::certificates::TlsResolver::new(router.clone()),
    ));
    #[cfg(feature = "http3")]
    let h3_endpoint = if args.http3 {
        if reuse {
            return Err("--http3 cannot be combined with --reuse-port yet".into());
        }
        Some(crate::server::h3::bind(
            https_port,
            &tls_config.aes_first,
            timeouts.idle,
        )?)
    } else {
        None
    };
    #[cfg(not(feature = "http3"))]
    if args.http3 {
        return Err("HTTP/3 support was not compiled in (cargo feature \"http3\")".into());
    }
    let alt_svc = args
        .http3
        .then(|| format!("h3=\":{https_port}\"; ma=2592000"))
        .and_then(|v| http::HeaderValue::from_str(&v).ok());
    let control = ControlListener::bind(&crate::config::socket_path()).map_err(|e| {
        format!(
            "listen unix {}: {e}",
            crate::config::socket_path().display()
        )
    })?;
    let limits = Limits {
        max_connections: args.max_connections,
        max_header_bytes: args.max_request_header_size,
        body_read_timeout: limit(args.body_read_timeout),
        timeouts,
    };
    let proxy_protocol = args.proxy_protocol.then(|| {
        if proxy_protocol_allowed.is_empty() {
            tracing::warn!("PROXY protocol headers are honoured from every peer: anyone who reaches the ports can claim any address; list the load balancers with --proxy-protocol-allow-ip");
        }
        if args.http3 {
            tracing::warn!("PROXY protocol does not cover HTTP/3 (UDP): its clients are seen at their own addresses");
        }
        ProxyProtocol::new(
            proxy_protocol_allowed,
            timeouts.head().unwrap_or(proxy_protocol::DEFAULT_TIMEOUT),
        )
    });
    if !args.proxy_protocol && !args.proxy_protocol_allow_ip.is_empty() {
        tracing::warn!("--proxy-protocol-allow-ip has no effect without --proxy-protocol");
    }
    let proxy = Arc::new(Proxy {
        router: router.clone(),
        forwarder: crate::proxy::Forwarder::new(limits.body_read_timeout)
            .with_read_timeout(timeouts.read),
        http_port: args.http_port,
        https_port: args.https_port,
        limits,
        slots: ConnectionSlots::new(limits.max_connections),
        proxy_protocol,
    });
    let control_task = tokio::spawn(control.serve(router.clone(), shutdown.clone()));
    let handover_task = handover.map(|h| tokio::spawn(h.serve(router.clone(), shutdown.clone())));
    let mut listeners = vec![tokio::spawn(server::serve_http(
        http,
        proxy.clone(),
        shutdown.clone(),
        workers.clone(),
    ))];
    tasks.push(tokio::spawn(server::trim::after_bursts(
        proxy.slots.clone(),
        workers.clone(),
        shutdown.stopping(),
    )));
    #[cfg(feature = "http3")]
    if let Some(endpoint) = h3_endpoint {
        listeners.push(tokio::spawn(crate::server::h3::serve(
            endpoint,
            proxy.clone(),
            shutdown.clone(),
            workers.clone(),
        )));
    }
    let https_shared = crate::server::https::Https::new(proxy, tls_config, alt_svc);
    listeners.push(tokio::spawn(crate::server::https::serve_https(
        https,
        https_shared,
        shutdown.clone(),
        workers,
    )));
    // The ports actually bound, so a caller that passed 0 learns them from this line.
    match metrics_port {
        Some(metrics) => {
            tracing::info!(
                http = http_port,
                https = https_port,
                metrics,
                "Server started"
            )
        }
        None => tracing::info!(http = http_port, https = https_port, "Server started"),
    }

    // A signal and `drain` take the same path; only `drain` waits for the reply.
    let drained = tokio::select! {
        _ = wait_for_signal() => false,
        _ = shutdown.drain_requested() => true,
    };
    shutdown.begin();
    for t in listeners {
        let _ = t.await;
    }
    if let Some(t) = handover_task {
        let _ = t.await;
    }
    if let Err(e) = router.flush().await {
        tracing::error!(error = %e, "Failed to save state");
    }
    router.shutdown().await;
    shutdown.finished();
    if drained {
        tracing::info!("Drained");
        // Time for the drain's reply to reach the caller before the process goes.
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    control_task.abort();
    metrics_stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    tracing::info!("Server stopped");
    Ok(())
}

pub(crate) async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers we cannot stop gracefully; wait forever instead.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as Go's runtime does at start: a
/// proxy holds two descriptors per proxied connection, and the usual soft 1,024 runs out
/// long before the machine does. Returns the soft limit in force.
fn raise_open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur >= limit.rlim_max {
            return Some(limit.rlim_cur);
        }
        let soft = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            return Some(soft);
        }
        tracing::debug!(
            from = soft,
            to = limit.rlim_max,
            "Raised the open files limit"
        );
        Some(limit.rlim_max)
    }
}
