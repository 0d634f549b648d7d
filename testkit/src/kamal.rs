//! Kamal 2.12 as the client: the kamal-proxy image built by `scripts/image`, and Kamal's own
//! command lines (`kamal-client.md`), rendered with Kamal's quoting and run by `sh -c` as
//! Kamal's SSH session runs them on a server.
//!
//! Each [`KamalHost`] is one server as Kamal sees it. Only three names differ from Kamal's,
//! so that tests can run side by side on one engine: the proxy container
//! (`kamal-proxy-<suffix>` for `kamal-proxy`), the network (`kamal-<suffix>` for `kamal`)
//! and the config volume (`kamal-proxy-config-<suffix>`). Every flag, its order and its
//! quoting are Kamal's. Ports are published on 127.0.0.1 only (Kamal's `bind_ips`), on
//! host ports the engine picks at boot and reports (`docker port`), so nothing races for
//! them; a reboot publishes the same ports again, as Kamal's does. Everything created
//! carries `kamal-proxy-test=1` and is removed on drop.

use crate::docker::{self, TEST_LABEL};
use crate::poll::poll_until;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Where the image's data dir and the apps-config bind mount live (Kamal's fixed paths).
pub const CONFIG_DIR: &str = "/home/kamal-proxy/.config/kamal-proxy";
pub const APPS_CONFIG: &str = "/home/kamal-proxy/.apps-config";
/// How long a proxy container may take to answer its ping after `docker run`.
const BOOT_TIMEOUT: Duration = Duration::from_secs(30);

/// Builds the image once per test process with `bash scripts/image` and returns the
/// reference it printed last (`kamal-proxy:v<crate version>`).
pub fn image() -> String {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let script = crate::workspace_root().join("scripts/image");
            let started = Instant::now();
            let out = Command::new("bash")
                .arg(&script)
                .current_dir(crate::workspace_root())
                .output()
                .expect("run bash scripts/image");
            assert!(
                out.status.success(),
                "bash scripts/image failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            let image = stdout
                .lines()
                .last()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .unwrap_or_else(|| panic!("scripts/image printed no image reference"))
                .to_owned();
            eprintln!("scripts/image built {image} in {:?}", started.elapsed());
            image
        })
        .clone()
}

/// `Kamal::Utils.escape_shell_value` for ASCII text: Ruby's `String#dump` (double quotes,
/// `"` and `\` escaped, control characters as `\n`/`\t`/`\xNN`, `#{` `#$` `#@` as `\#…`),
/// then backticks escaped and every `$` not starting `${` escaped.
pub fn escape(value: &str) -> String {
    let mut dumped = String::from("\"");
    let chars: Vec<char> = value.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        match c {
            '"' => dumped.push_str("\\\""),
            '\\' => dumped.push_str("\\\\"),
            '\n' => dumped.push_str("\\n"),
            '\t' => dumped.push_str("\\t"),
            '#' if matches!(chars.get(i + 1), Some('{' | '$' | '@')) => dumped.push_str("\\#"),
            c if c.is_ascii_control() => dumped.push_str(&format!("\\x{:02X}", c as u32)),
            c => {
                assert!(c.is_ascii(), "escape() covers ASCII values only: {value:?}");
                dumped.push(c)
            }
        }
    }
    dumped.push('"');
    let mut out = String::new();
    let bytes: Vec<char> = dumped.chars().collect();
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            '`' => out.push_str("\\`"),
            '$' if bytes.get(i + 1) != Some(&'{') => out.push_str("\\$"),
            c => out.push(c),
        }
    }
    out
}

/// `--key="value"`, as Kamal's `optionize(…, with: "=")` writes a valued flag.
pub fn flag(key: &str, value: &str) -> String {
    format!("--{key}={}", escape(value))
}

/// A `kamal-proxy deploy` as `Kamal::Configuration::Proxy#deploy_options` orders it.
#[derive(Clone, Debug)]
pub struct Deploy {
    pub service: String,
    /// `<container id>:<app_port>`.
    pub target: String,
    pub hosts: Vec<String>,
    pub tls: bool,
    /// Custom certificate paths (inside the container).
    pub certificate: Option<(String, String)>,
    pub deploy_timeout: u32,
    pub drain_timeout: u32,
    pub health_check_interval: Option<u32>,
    pub buffer_requests: bool,
    pub buffer_responses: bool,
    pub path_prefixes: Vec<String>,
    pub log_request_headers: Vec<String>,
    pub error_pages: Option<String>,
    /// Flags only the fork's Kamal sends (`--sleep-after="2s"` …), appended in its order.
    pub fork_flags: Vec<String>,
}

impl Deploy {
    /// An app with deploy.yml's defaults (`deploy_timeout`/`drain_timeout` 30, buffering on,
    /// the three default logged request headers) and one host.
    pub fn new(service: &str, target: &str, host: &str) -> Deploy {
        Deploy {
            service: service.to_owned(),
            target: target.to_owned(),
            hosts: vec![host.to_owned()],
            tls: false,
            certificate: None,
            deploy_timeout: 30,
            drain_timeout: 30,
            health_check_interval: None,
            buffer_requests: true,
            buffer_responses: true,
            path_prefixes: Vec::new(),
            log_request_headers: ["Cache-Control", "Last-Modified", "User-Agent"]
                .map(String::from)
                .to_vec(),
            error_pages: None,
            fork_flags: Vec::new(),
        }
    }

    /// The arguments after `kamal-proxy`, exactly as Kamal joins them.
    pub fn args(&self) -> String {
        let mut a = vec!["deploy".to_owned(), self.service.clone()];
        a.push(flag("target", &self.target));
        for h in &self.hosts {
            a.push(flag("host", h));
        }
        if self.tls {
            a.push("--tls".to_owned());
        }
        if let Some((cert, key)) = &self.certificate {
            a.push(flag("tls-certificate-path", cert));
            a.push(flag("tls-private-key-path", key));
        }
        a.push(flag("deploy-timeout", &format!("{}s", self.deploy_timeout)));
        a.push(flag("drain-timeout", &format!("{}s", self.drain_timeout)));
        if let Some(i) = self.health_check_interval {
            a.push(flag("health-check-interval", &format!("{i}s")));
        }
        a.push(bool_flag("buffer-requests", self.buffer_requests));
        a.push(bool_flag("buffer-responses", self.buffer_responses));
        for p in &self.path_prefixes {
            a.push(flag("path-prefix", p));
        }
        for h in &self.log_request_headers {
            a.push(flag("log-request-header", h));
        }
        if let Some(dir) = &self.error_pages {
            a.push(flag("error-pages", dir));
        }
        a.extend(self.fork_flags.iter().cloned());
        a.join(" ")
    }
}

fn bool_flag(key: &str, value: bool) -> String {
    if value {
        format!("--{key}")
    } else {
        flag(key, "false")
    }
}

/// Runs one command line through `sh -c` in `cwd`, as Kamal's SSH session would.
pub fn sh(cwd: &Path, line: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(line)
        .current_dir(cwd)
        .output()
        .unwrap_or_else(|e| panic!("sh -c {line:?}: {e}"))
}

/// A container Kamal started for an app or accessory.
#[derive(Debug, Clone)]
pub struct App {
    pub name: String,
    /// The 12-hex id Kamal captures with `docker container ls --all --filter … --quiet`.
    pub id: String,
}

impl App {
    /// `--target`: the container id and the app port (80).
    pub fn target(&self) -> String {
        format!("{}:80", self.id)
    }
}

/// One server as Kamal sees it: the `kamal` network, the proxy's config volume, the
/// working directory holding `.kamal/proxy/apps-config`, and the published ports.
pub struct KamalHost {
    pub suffix: String,
    /// The proxy container's name (Kamal: `kamal-proxy`).
    pub proxy: String,
    pub network: String,
    pub volume: String,
    /// `$PWD` of the shell that runs Kamal's lines.
    pub workdir: tempfile::TempDir,
    pub http_port: u16,
    pub https_port: u16,
    /// `proxy.run.options`, rendered in Kamal's space form (`--key "value"`).
    pub run_options: Vec<String>,
    apps: Mutex<Vec<String>>,
}

impl KamalHost {
    /// A server with `proxy.run.options` given as (key, value) pairs, in order.
    pub fn new(run_options: &[(&str, &str)]) -> KamalHost {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() % 1_000_000);
        let suffix = format!(
            "{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let workdir = tempfile::tempdir().expect("workdir");
        let apps_config = workdir.path().join(".kamal/proxy/apps-config");
        std::fs::create_dir_all(&apps_config).expect("apps-config dir");
        // The SSH user owns it; the proxy (uid 1001) only reads it.
        for dir in [workdir.path(), &workdir.path().join(".kamal"), &apps_config] {
            set_mode(dir, 0o755);
        }
        let mut options: Vec<String> = run_options
            .iter()
            .map(|(k, v)| format!("--{k} {}", escape(v)))
            .collect();
        options.push(format!("--label {}", escape(TEST_LABEL)));
        let host = KamalHost {
            proxy: format!("kamal-proxy-{suffix}"),
            network: format!("kamal-{suffix}"),
            volume: format!("kamal-proxy-config-{suffix}"),
            suffix,
            workdir,
            http_port: 0,
            https_port: 0,
            run_options: options,
            apps: Mutex::new(Vec::new()),
        };
        // `kamal server bootstrap` / `proxy boot` create the network; a labelled volume so
        // an interrupted run can be swept (Docker still copies the image's directory into
        // it on first mount, as it does for the volume `docker run` would create).
        host.docker_ok(&["network", "create", "--label", TEST_LABEL, &host.network]);
        host.docker_ok(&["volume", "create", "--label", TEST_LABEL, &host.volume]);
        host
    }

    /// `.kamal/proxy/apps-config` on the host (the SSH user's side of the bind mount).
    pub fn apps_config(&self) -> PathBuf {
        self.workdir.path().join(".kamal/proxy/apps-config")
    }

    /// Kamal's `proxy.run` line (`Kamal::Commands::Proxy#run`) with `bind_ips: [127.0.0.1]`.
    pub fn run_line(&self) -> String {
        let mut a = vec![
            "docker run".to_owned(),
            format!("--name {}", self.proxy),
            format!("--network {}", self.network),
            "--detach --restart unless-stopped".to_owned(),
            format!("--volume {}:{CONFIG_DIR}", self.volume),
            format!("--volume $PWD/.kamal/proxy/apps-config:{APPS_CONFIG}"),
            publish(self.http_port, 80),
            publish(self.https_port, 443),
            "--log-opt max-size=10m".to_owned(),
        ];
        a.extend(self.run_options.iter().cloned());
        a.push(image());
        a.push("kamal-proxy run".to_owned());
        a.join(" ")
    }

    /// `kamal proxy boot`: `docker container start kamal-proxy || docker run …`.
    pub fn boot_line(&self) -> String {
        format!(
            "docker container start {} || {}",
            self.proxy,
            self.run_line()
        )
    }

    /// `kamal proxy boot` on host ports the engine picks (learned with `docker port`),
    /// then waits until the proxy answers its ping.
    pub async fn boot(&mut self) {
        self.http_port = 0;
        self.https_port = 0;
        self.run_ok(&self.boot_line());
        let proxy = self.proxy.clone();
        self.learn_ports(&proxy);
        self.wait_until_serving().await;
    }

    /// Takes `http_port` and `https_port` from the host ports `container` publishes 80
    /// and 443 on (`docker port`), for a container started with them left to the engine.
    pub fn learn_ports(&mut self, container: &str) {
        self.http_port = self.published_port(container, 80);
        self.https_port = self.published_port(container, 443);
    }

    fn published_port(&self, container: &str, port: u16) -> u16 {
        let out = self.run_ok(&format!("docker port {container} {port}/tcp"));
        // `127.0.0.1:32768`, one line per binding.
        out.lines()
            .find_map(|l| l.trim().rsplit_once(':')?.1.parse().ok())
            .unwrap_or_else(|| panic!("no host port for {container} {port}/tcp: {out:?}"))
    }

    /// `kamal proxy reboot`: stop, prune stopped proxy containers by the image label, run
    /// (on the ports the boot published).
    pub fn reboot(&self) {
        self.run_ok(&format!("docker container stop {}", self.proxy));
        self.run_ok(
            "docker container prune --force --filter label=org.opencontainers.image.title=kamal-proxy",
        );
        self.run_ok(&self.run_line());
    }

    /// Polls `GET /.kamal-proxy/ping` until the proxy answers through the published port.
    pub async fn wait_until_serving(&self) {
        let url = self.url("/.kamal-proxy/ping");
        // Each attempt bounded, so a ping stuck on a half-started container is retried.
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("client");
        poll_until("the proxy to answer its ping", BOOT_TIMEOUT, || async {
            match http.get(&url).send().await {
                Ok(r) if r.status() == 200 => Ok(()),
                Ok(r) => Err(format!("status {}", r.status())),
                Err(e) => Err(format!("{e}; proxy logs:\n{}", self.logs_async().await)),
            }
        })
        .await
    }

    /// Runs one of Kamal's lines in this server's working directory.
    pub fn run(&self, line: &str) -> Output {
        sh(self.workdir.path(), line)
    }

    /// Runs a line and panics (with its output and the proxy's log) unless it exits 0.
    pub fn run_ok(&self, line: &str) -> String {
        let out = self.run(line);
        assert!(
            out.status.success(),
            "`{line}` failed ({:?}):\n{}{}\nproxy logs:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `docker exec kamal-proxy kamal-proxy <args>` (args already in Kamal's quoting).
    pub fn exec_line(&self, args: &str) -> String {
        format!("docker exec {} kamal-proxy {args}", self.proxy)
    }

    /// Runs `kamal-proxy <args>` in the proxy container; panics unless it exits 0.
    pub fn proxy_ok(&self, args: &str) -> String {
        self.run_ok(&self.exec_line(args))
    }

    /// The `deploy` line Kamal sends; panics unless it succeeds.
    pub fn deploy(&self, deploy: &Deploy) {
        self.proxy_ok(&deploy.args());
    }

    /// `list --json` inside the container, parsed.
    pub fn list_json(&self) -> serde_json::Value {
        let out = self.proxy_ok("list --json");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("list --json: {e}: {out}"))
    }

    /// Starts an app or accessory container on the `kamal` network as Kamal does
    /// (`docker run --detach --restart unless-stopped --name <svc>-<version> --network kamal
    /// … --label …`), serving `body` at `/` and `ok` at `/up` on port 80, and returns it
    /// with the id Kamal captures for `--target`. `labels` are deploy.yml `labels:`.
    pub fn app(&self, service: &str, version: &str, body: &str, labels: &[(&str, &str)]) -> App {
        let image = docker::ensure_test_image();
        let name = format!("{service}-{version}-{}", self.suffix);
        let mut line = vec![
            "docker run --detach --restart unless-stopped".to_owned(),
            format!("--name {name}"),
            format!("--network {}", self.network),
            // Not Kamal's: without an init, busybox httpd as PID 1 ignores SIGTERM and every
            // `docker stop` would wait out its 10 s.
            "--init".to_owned(),
            format!("--label {}", escape(TEST_LABEL)),
            format!("--label service={}", escape(service)),
        ];
        for (k, v) in labels {
            line.push(format!("--label {k}={}", escape(v)));
        }
        line.push(image);
        let script = format!("echo {body} > /www/index.html && exec httpd -f -p 80 -h /www");
        line.push(format!("sh -c {}", escape(&script)));
        self.apps.lock().unwrap().push(name.clone());
        self.run_ok(&line.join(" "));
        let id = self
            .run_ok(&format!(
                "docker container ls --all --filter name=^{name}$ --quiet"
            ))
            .trim()
            .to_owned();
        assert_eq!(id.len(), 12, "a 12-hex container id, got {id:?}");
        App { name, id }
    }

    /// Removes the container `name` (one the test started beside Kamal's) with the rest.
    pub fn remove_on_drop(&self, name: &str) {
        self.apps.lock().unwrap().push(name.to_owned());
    }

    /// Kamal's stop of an old container after `deploy` returned (no `-t`: the proxy
    /// drained it already).
    pub fn stop_app(&self, app: &App) {
        self.run_ok(&format!(
            "docker container ls --all --filter name=^{}$ --quiet | xargs docker stop",
            app.name
        ));
    }

    /// The proxy container's output (`kamal proxy logs`).
    pub fn logs(&self) -> String {
        let out = Command::new("docker")
            .args(["logs", &self.proxy])
            .output()
            .expect("docker logs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `docker inspect --format <format> <name>`, trimmed ("" when it fails).
    pub fn inspect(&self, name: &str, format: &str) -> String {
        let out = Command::new("docker")
            .args(["inspect", "--format", format, name])
            .output()
            .expect("docker inspect");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Polls until the container's `.State.Status` is `status`; panics with the log otherwise.
    pub async fn wait_for_container_status(&self, name: &str, status: &str, timeout: Duration) {
        let what = format!("container {name} to be {status:?}");
        poll_until(&what, timeout, || async {
            let out = docker_async(&["inspect", "--format", "{{.State.Status}}", name]).await;
            let now = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if now == status {
                Ok(())
            } else {
                Err(format!("{now:?}; proxy logs:\n{}", self.logs_async().await))
            }
        })
        .await
    }

    /// Polls the proxy's log until a line contains every one of `needles`, and returns it.
    pub async fn wait_for_log(&self, needles: &[&str], timeout: Duration) -> String {
        let what = format!("a proxy log line with {needles:?}");
        poll_until(&what, timeout, || async {
            let logs = self.logs_async().await;
            match logs.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
                Some(line) => Ok(line.to_owned()),
                None => Err(logs),
            }
        })
        .await
    }

    /// [`KamalHost::logs`] without blocking the runtime.
    async fn logs_async(&self) -> String {
        let out = docker_async(&["logs", &self.proxy]).await;
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// `http://127.0.0.1:<published http port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http_port)
    }

    fn docker_ok(&self, args: &[&str]) {
        let out = Command::new("docker").args(args).output().expect("docker");
        assert!(
            out.status.success(),
            "docker {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for KamalHost {
    fn drop(&mut self) {
        let mut names = vec![self.proxy.clone()];
        names.extend(self.apps.lock().map(|a| a.clone()).unwrap_or_default());
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&names)
            .output();
        let _ = Command::new("docker")
            .args(["volume", "rm", "-f", &self.volume])
            .output();
        let _ = Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
    }
}

/// `--publish` on 127.0.0.1 of `container_port`: on `host_port`, or one the engine picks (0).
fn publish(host_port: u16, container_port: u16) -> String {
    if host_port == 0 {
        format!("--publish 127.0.0.1::{container_port}")
    } else {
        format!("--publish 127.0.0.1:{host_port}:{container_port}")
    }
}

/// `docker <args>` on tokio's process API (a poll's check must not block the runtime).
async fn docker_async(args: &[&str]) -> Output {
    tokio::process::Command::new("docker")
        .args(args)
        .output()
        .await
        .expect("run the docker CLI")
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Kamal's `Gem::Version` comparison of a proxy image tag with a minimum (`v0.9.2`): the
/// leading `v` stripped, numeric segments compared with zeros padding the shorter one.
/// `None` when the tag is not a plain numeric version (Gem would raise, or read a
/// pre-release such as `1.0.0-rust` as older than `1.0.0`).
pub fn tag_at_least(tag: &str, minimum: &str) -> Option<bool> {
    fn segments(v: &str) -> Option<Vec<u64>> {
        let v = v.strip_prefix('v').unwrap_or(v);
        v.split('.').map(|s| s.parse().ok()).collect()
    }
    let (a, b) = (segments(tag)?, segments(minimum)?);
    let len = a.len().max(b.len());
    let pad = |v: &[u64]| {
        let mut v = v.to_vec();
        v.resize(len, 0);
        v
    };
    Some(pad(&a) >= pad(&b))
}
