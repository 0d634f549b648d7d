//! A running `kamal-proxy run` and the CLI pointed at it.

use crate::http::{Reply, client, send, strip_ansi};
use crate::poll::poll_until;
use crate::ports::{ATTEMPTS, free_port};
use crate::process::{Launch, Log, Ports, bin, launch};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

/// How long a CLI-visible change or a log line may take (a hang guard, not a measurement).
const PATIENCE: Duration = Duration::from_secs(20);
/// How often [`Proxy::respawn`] tries a port another socket holds for a moment.
const RESPAWN_ATTEMPTS: usize = 50;

/// A running `kamal-proxy run` child process.
pub struct Proxy {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub http_port: u16,
    /// The HTTPS port actually bound (kernel-chosen unless the test passes `--https-port`).
    pub https_port: u16,
    /// The metrics port, when started with [`Proxy::start_with_metrics`] (or a
    /// `--metrics-port` flag).
    pub metrics_port: Option<u16>,
    extra_args: Vec<String>,
    extra_env: Vec<(String, String)>,
    /// Runs the server as this uid (and gid); the CLI stays the test's own user.
    run_as: Option<u32>,
    log: Log,
}

impl Proxy {
    pub async fn start() -> Proxy {
        Self::start_with(&[], &[]).await
    }

    /// Starts with extra `run` flags and environment variables.
    pub async fn start_with(args: &[&str], env: &[(&str, &str)]) -> Proxy {
        Self::start_as(None, args, env).await
    }

    /// Starts with metrics enabled on a free port (`--metrics-port 0` means disabled, so
    /// the port is picked here, and picked again if someone takes it first).
    pub async fn start_with_metrics(args: &[&str], env: &[(&str, &str)]) -> Proxy {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let flag = format!("--metrics-port={}", free_port());
            let mut with = args.to_vec();
            with.push(&flag);
            let mut p = Self::new(None, &with, env);
            match p.spawn().await {
                Ok(()) => return p,
                Err(e) if e.contains("address already in use") => last = e,
                Err(e) => panic!("kamal-proxy did not start: {e}"),
            }
        }
        panic!("kamal-proxy found no free metrics port in {ATTEMPTS} attempts: {last}");
    }

    /// Starts the server as `uid` (see [`unprivileged_uid`]), its directory owned by it.
    pub async fn start_as(run_as: Option<u32>, args: &[&str], env: &[(&str, &str)]) -> Proxy {
        let mut p = Self::new(run_as, args, env);
        if let Err(e) = p.spawn().await {
            panic!("kamal-proxy did not start: {e}");
        }
        p
    }

    fn new(run_as: Option<u32>, args: &[&str], env: &[(&str, &str)]) -> Proxy {
        let dir = tempfile::tempdir().expect("tempdir");
        if let Some(uid) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).expect("chown tempdir");
        }
        Proxy {
            child: None,
            dir,
            http_port: 0,
            https_port: 0,
            metrics_port: None,
            extra_args: args.iter().map(|s| s.to_string()).collect(),
            extra_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            run_as,
            log: Log::default(),
        }
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("kamal-proxy.sock")
    }

    pub fn state_file(&self) -> PathBuf {
        self.home().join(".config/kamal-proxy/kamal-proxy.state")
    }

    fn command(&self) -> Command {
        let mut c = Command::new(bin());
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.home())
            .env("KAMAL_PROXY_SOCKET", self.socket())
            .env("TMPDIR", self.dir.path());
        for (k, v) in &self.extra_env {
            c.env(k, v);
        }
        c
    }

    /// Starts `run`; a restart keeps the ports the first start was given.
    async fn spawn(&mut self) -> Result<(), String> {
        std::fs::create_dir_all(self.home()).expect("home");
        if let Some(uid) = self.run_as {
            std::os::unix::fs::chown(self.home(), Some(uid), Some(uid)).expect("chown home");
        }
        let mut cmd = self.command();
        cmd.arg("run")
            .arg(format!("--http-port={}", self.http_port));
        // Never the default 443: tests run side by side.
        if !self
            .extra_args
            .iter()
            .any(|a| a.starts_with("--https-port"))
        {
            cmd.arg(format!("--https-port={}", self.https_port));
        }
        cmd.args(&self.extra_args);
        if let Some(uid) = self.run_as {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(uid);
        }
        let (child, outcome) = launch(cmd, &self.log).await;
        self.child = Some(child);
        match outcome {
            Launch::Started(Ports {
                http,
                https,
                metrics,
            }) => {
                self.http_port = http;
                self.https_port = https;
                self.metrics_port = metrics;
                Ok(())
            }
            Launch::Exited { code, stderr } => Err(format!(
                "exited with {code:?}: {stderr}\noutput:\n{}",
                self.logs().join("\n")
            )),
        }
    }

    /// SIGTERM, wait for exit, start again with the same home and ports.
    pub async fn restart(&mut self) {
        self.terminate().await;
        self.respawn().await;
    }

    /// Sends SIGTERM and waits; returns the exit code (None if it had to be killed).
    pub async fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        signal(child.id(), "TERM").await;
        // A shutdown that hangs is killed and reported as no exit code, for the test to
        // assert on; not a harness failure.
        let exited = tokio::time::timeout(
            PATIENCE,
            poll_until("kamal-proxy to exit after SIGTERM", PATIENCE * 2, || {
                std::future::ready(child.try_wait().ok().flatten())
            }),
        )
        .await;
        match exited {
            Ok(status) => status.code(),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                None
            }
        }
    }

    /// `kill -9`, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts `run` again after [`Proxy::terminate`] or [`Proxy::kill9`], on the same ports.
    /// Those were picked by the kernel from the ephemeral range: once the proxy is gone,
    /// another test's outgoing connection may hold one as its local port for a moment (seen
    /// once in CI: "bind: address already in use" on a restart), so that error is retried
    /// for a while; any other failure, or that one for good, fails the test.
    pub async fn respawn(&mut self) {
        const PAUSE: Duration = Duration::from_millis(100);
        let mut last = String::new();
        for _ in 0..RESPAWN_ATTEMPTS {
            match self.spawn().await {
                Ok(()) => return,
                Err(e) if e.contains("address already in use") => {
                    last = e;
                    tokio::time::sleep(PAUSE).await;
                }
                Err(e) => panic!("kamal-proxy did not start again: {e}"),
            }
        }
        panic!("kamal-proxy did not start again in {RESPAWN_ATTEMPTS} attempts: {last}");
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Runs a CLI command against this proxy.
    pub async fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = tokio::process::Command::from(self.command());
        cmd.args(args).output().await.expect("run cli")
    }

    /// Starts a CLI command that runs on while the test does other things (a deploy
    /// that waits for health, say); await the handle for its output.
    pub fn spawn_cli(&self, args: &[&str]) -> tokio::task::JoinHandle<Output> {
        let mut cmd = tokio::process::Command::from(self.command());
        cmd.args(args);
        tokio::spawn(async move { cmd.output().await.expect("run cli") })
    }

    /// Runs a CLI command and panics (with its stderr) unless it succeeds.
    pub async fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args).await;
        assert!(
            out.status.success(),
            "kamal-proxy {:?} failed: {}\n{}",
            args,
            String::from_utf8_lossy(&out.stderr),
            self.logs().join("\n")
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a CLI command expected to fail; returns its stderr.
    pub async fn fails(&self, args: &[&str]) -> String {
        let out = self.cli(args).await;
        assert_eq!(
            out.status.code(),
            Some(1),
            "kamal-proxy {args:?} should exit 1"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Sends one raw request over the control socket, as any program could (not through
    /// the CLI and its checks), and returns the server's JSON reply.
    pub async fn control(&self, request: serde_json::Value) -> serde_json::Value {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::UnixStream::connect(self.socket())
            .await
            .expect("connect to the control socket");
        s.write_all(request.to_string().as_bytes())
            .await
            .expect("send");
        s.shutdown().await.expect("half-close");
        let mut reply = String::new();
        s.read_to_string(&mut reply).await.expect("reply");
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("reply {reply:?}: {e}"))
    }

    pub async fn deploy(&self, service: &str, target: &str, extra: &[&str]) {
        let t = format!("--target={target}");
        let mut args = vec![
            "deploy",
            service,
            t.as_str(),
            "--deploy-timeout=5s",
            "--drain-timeout=2s",
        ];
        args.extend_from_slice(extra);
        self.ok(&args).await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.http_port, path)
    }

    /// The metrics endpoint's URL; panics unless metrics are enabled.
    pub fn metrics_url(&self) -> String {
        let port = self.metrics_port.expect("metrics enabled");
        format!("http://127.0.0.1:{port}/metrics")
    }

    /// The current value of one Prometheus sample (`name{labels}` exactly as exposed),
    /// or None while it is absent.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        let text = client()
            .get(self.metrics_url())
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines().find_map(|line| {
            let value = line.strip_prefix(series)?.strip_prefix(' ')?;
            value.trim().parse().ok()
        })
    }

    /// Waits until a Prometheus sample shows `value` (a positive signal: the server
    /// counted it).
    pub async fn wait_for_metric(&self, series: &str, value: f64) {
        poll_until(&format!("{series} to be {value}"), PATIENCE, || async {
            match self.metric(series).await {
                Some(v) if v == value => Ok(()),
                other => Err(other),
            }
        })
        .await
    }

    /// Everything the server wrote so far, one line each (stderr prefixed `stderr: `).
    pub fn logs(&self) -> Vec<String> {
        self.log.lines()
    }

    /// Access-log lines (msg "Request") parsed as JSON.
    pub fn access_log(&self) -> Vec<serde_json::Value> {
        self.logs()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["msg"] == "Request")
            .collect()
    }

    /// Waits for a log line satisfying `pred` and returns it; panics with the log if
    /// none comes within a generous guard.
    pub async fn wait_for_log(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        self.wait_for_log_after(0, what, pred).await
    }

    /// As [`Proxy::wait_for_log`], looking only past the first `skip` lines (to see
    /// what happened after a point the test marked with `logs().len()`).
    pub async fn wait_for_log_after(
        &self,
        skip: usize,
        what: &str,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        poll_until(&format!("a log line showing {what}"), PATIENCE, || {
            let found = self.logs().into_iter().skip(skip).find(|l| pred(l));
            std::future::ready(found.ok_or_else(|| self.log.clone()))
        })
        .await
    }

    /// `GET path` with `Host: host` (no header override when `host` is empty).
    pub async fn get(&self, host: &str, path: &str) -> Reply {
        let host = (!host.is_empty()).then_some(host);
        send(&client(), reqwest::Method::GET, &self.url(path), host)
            .await
            .unwrap_or_else(|e| panic!("GET {path} (host {host:?}) failed: {e}"))
    }

    /// The `list` table rows (ANSI escapes removed, cells trimmed), header excluded.
    pub async fn list_rows(&self) -> Vec<Vec<String>> {
        let out = self.ok(&["list"]).await;
        out.lines()
            .skip(1)
            .map(|line| {
                strip_ansi(line)
                    .split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(String::from)
                    .collect()
            })
            .collect()
    }

    /// `list --json` parsed.
    pub async fn list_json(&self) -> serde_json::Value {
        let out = self.ok(&["list", "--json"]).await;
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("list --json: {e}: {out}"))
    }

    /// The `state` a service shows in `list --json` (`running`, `sleeping`, …; "" if absent).
    pub async fn state_of(&self, service: &str) -> String {
        self.list_json().await["services"][service]["state"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// Polls `list --json` until the service shows `state`; panics with the log otherwise.
    pub async fn wait_for_state(&self, service: &str, state: &str, timeout: Duration) {
        let what = format!("service {service} to be {state:?}");
        poll_until(&what, timeout, || async {
            let now = self.state_of(service).await;
            if now == state {
                Ok(())
            } else {
                Err(Seen {
                    state: now,
                    log: self.log.clone(),
                })
            }
        })
        .await
    }
}

/// A state other than the one waited for, and the log to explain it.
struct Seen {
    state: String,
    log: Log,
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "state {:?}; {:?}", self.state, self.log)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill9();
    }
}

async fn signal(pid: u32, signal: &str) {
    let _ = tokio::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .await;
}

/// How a one-off `kamal-proxy run` ended up.
#[derive(Debug)]
pub enum RunOutcome {
    /// It logged `Server started` on this HTTP port (and has been stopped again).
    Started { http_port: u16 },
    /// It exited before starting.
    Exited { code: Option<i32>, stderr: String },
}

/// Runs `kamal-proxy run <args>` with its own home and socket and exactly the given extra
/// environment (no `--http-port` is added), and reports whether it started.
pub async fn try_run(args: &[&str], env: &[(&str, &str)]) -> RunOutcome {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    try_run_in(dir.path(), &home, None, args, env).await
}

/// The uid the permission tests run the server as: `nobody` when the tests run as root
/// (root ignores file modes), else none (the test's own user already obeys them).
pub fn unprivileged_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata("/proc/self").expect("/proc/self").uid();
    (me == 0).then_some(65534)
}

/// As [`try_run`], with `HOME` at `home`, the socket and temp dir in `dir`, as `run_as`.
pub async fn try_run_in(
    dir: &Path,
    home: &Path,
    run_as: Option<u32>,
    args: &[&str],
    env: &[(&str, &str)],
) -> RunOutcome {
    let mut cmd = Command::new(bin());
    if let Some(uid) = run_as {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(uid);
    }
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("KAMAL_PROXY_SOCKET", dir.join("kamal-proxy.sock"))
        .env("TMPDIR", dir)
        .arg("run")
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let (mut child, outcome) = launch(cmd, &Log::default()).await;
    match outcome {
        Launch::Started(ports) => {
            let _ = child.kill();
            let _ = child.wait();
            RunOutcome::Started {
                http_port: ports.http,
            }
        }
        Launch::Exited { code, stderr } => RunOutcome::Exited { code, stderr },
    }
}
