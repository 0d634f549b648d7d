//! `kamal-proxy run`: restore state, open the listeners, serve until SIGTERM/SIGINT.

use clap::Args;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

use super::values::{go_bool, port};
use crate::config::{env_bool, env_int, env_value};
use crate::control::server::ControlListener;
use crate::lifecycle::ContainerLifecycle;
use crate::lifecycle::docker::{check_socket_path, connect};
use crate::router::Router;
use crate::server::{self, Proxy};

#[derive(Args, Debug)]
#[command(
    about = "Run the server",
    long_about = "Run the server.\n\n\
Each flag can also be set from the environment: KAMAL_PROXY_<NAME>, then <NAME>\n\
(e.g. KAMAL_PROXY_HTTP_PORT or HTTP_PORT); an explicit flag wins.\n\n\
Example:\n  kamal-proxy run --http-port=8080 --metrics-port=9090"
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
}

pub fn run(args: RunArgs) -> i32 {
    let _log_guard = crate::observe::log::init(args.debug);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // Access lines wait in a per-worker batch until the worker goes idle (or the batch
        // fills): one hand-over to the log writer per burst instead of one per request.
        .on_thread_park(crate::observe::log::thread_idle)
        .on_thread_stop(crate::observe::log::thread_stopping)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: {e}");
            return 1;
        }
    };
    let result = runtime.block_on(serve(args));
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

async fn serve(args: RunArgs) -> Result<(), String> {
    // Dev-dependencies can compile a second provider in; never let rustls guess.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let lifecycle: Option<Arc<dyn ContainerLifecycle>> = if args.docker_socket.is_empty() {
        None
    } else {
        let path = std::path::Path::new(&args.docker_socket);
        check_socket_path(path)?;
        let docker = connect(path)?;
        tracing::info!(docker_socket = %args.docker_socket, "Scale-to-zero enabled");
        Some(Arc::new(docker))
    };

    raise_open_files_limit();
    let data_dir = crate::config::prepare_data_dir()?;
    let router = Router::new(data_dir.join(crate::config::STATE_FILE_NAME), lifecycle);
    let acme_directory = if args.acme_directory.is_empty() {
        crate::tls::cache::LETS_ENCRYPT_PRODUCTION.to_string()
    } else {
        args.acme_directory.clone()
    };
    let acme_email = (!args.acme_email.is_empty()).then(|| args.acme_email.clone());
    router.configure_tls(acme_directory, acme_email);
    router.restore().await?;

    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    // `--metrics-port 0` means disabled (upstream), so a bound metrics port is never 0.
    let mut metrics_port = None;
    if args.metrics_port != 0 {
        crate::observe::metrics::enable()?;
        let listener = server::bind(args.metrics_port).await?;
        let port = listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or(args.metrics_port);
        tracing::info!(address = %format!(":{port}"), "Metrics enabled");
        metrics_port = Some(port);
        tasks.push(tokio::spawn(server::serve_metrics(listener, stop.clone())));
    }
    let http = server::bind(args.http_port).await?;
    let http_port = http
        .local_addr()
        .map(|a| a.port())
        .unwrap_or(args.http_port);
    let https = server::bind(args.https_port).await?;
    let https_port = https
        .local_addr()
        .map(|a| a.port())
        .unwrap_or(args.https_port);
    let tls_config = crate::server::https::server_config(Arc::new(
        crate::server::certificates::TlsResolver::new(router.clone()),
    ));
    #[cfg(feature = "http3")]
    let h3_endpoint = if args.http3 {
        Some(crate::server::h3::bind(https_port, &tls_config)?)
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
    let proxy = Arc::new(Proxy {
        router: router.clone(),
        forwarder: crate::proxy::Forwarder::new(),
        http_port: args.http_port,
        https_port: args.https_port,
    });
    let control_task = tokio::spawn(control.serve(router.clone()));
    let http_task = tokio::spawn(server::serve_http(http, proxy.clone(), stop.clone()));
    #[cfg(feature = "http3")]
    if let Some(endpoint) = h3_endpoint {
        tasks.push(tokio::spawn(crate::server::h3::serve(
            endpoint,
            proxy.clone(),
            stop.clone(),
        )));
    }
    let https_shared = crate::server::https::Https::new(proxy, tls_config, alt_svc);
    tasks.push(tokio::spawn(crate::server::https::serve_https(
        https,
        https_shared,
        stop.clone(),
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

    wait_for_signal().await;
    control_task.abort();
    stop.cancel();
    let _ = http_task.await;
    for t in tasks {
        let _ = t.await;
    }
    router.shutdown().await;
    tracing::info!("Server stopped");
    Ok(())
}

async fn wait_for_signal() {
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
/// long before the machine does.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max
        {
            return;
        }
        let soft = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
            tracing::debug!(
                from = soft,
                to = limit.rlim_max,
                "Raised the open files limit"
            );
        }
    }
}
