//! Shared harness for the black-box tests: the real `kamal-proxy` binary with its own
//! socket, home and state file, and real HTTP backends on loopback.

#![allow(dead_code)]

pub mod backend;
pub mod docker;
pub mod go_state;
pub mod kamal;
pub mod pebble;
pub mod raw;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_kamal-proxy");

/// A running `kamal-proxy run` child process.
pub struct Proxy {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub http_port: u16,
    /// The HTTPS port actually bound (kernel-chosen unless the test passes `--https-port`).
    pub https_port: u16,
    pub metrics_port: Option<u16>,
    extra_args: Vec<String>,
    extra_env: Vec<(String, String)>,
    /// Runs the server as this uid (and gid); the CLI stays the test's own user.
    run_as: Option<u32>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    pub fn start() -> Proxy {
        Self::start_with(&[], &[])
    }

    /// Starts with extra `run` flags and environment variables.
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Proxy {
        Self::start_as(None, args, env)
    }

    /// Starts the server as `uid` (see [`unprivileged_uid`]), its directory owned by it.
    pub fn start_as(run_as: Option<u32>, args: &[&str], env: &[(&str, &str)]) -> Proxy {
        let dir = tempfile::tempdir().expect("tempdir");
        if let Some(uid) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).expect("chown tempdir");
        }
        let mut p = Proxy {
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
            lines: Arc::new(Mutex::new(Vec::new())),
        };
        p.spawn();
        p
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
        let mut c = Command::new(BIN);
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

    fn spawn(&mut self) {
        std::fs::create_dir_all(self.home()).expect("home");
        if let Some(uid) = self.run_as {
            std::os::unix::fs::chown(self.home(), Some(uid), Some(uid)).expect("chown home");
        }
        let port = if self.http_port == 0 {
            "0".to_string()
        } else {
            self.http_port.to_string()
        };
        let mut cmd = self.command();
        cmd.arg("run").arg(format!("--http-port={port}"));
        // Never the default 443: tests run side by side. A restart keeps its port.
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
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kamal-proxy");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let lines = self.lines.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("\"msg\":\"Server started\"") {
                    let _ = tx.send(Ok(line.clone()));
                }
                lines.lock().unwrap().push(line);
            }
        });
        let err_lines = self.lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                err_lines.lock().unwrap().push(format!("stderr: {line}"));
            }
        });
        self.child = Some(child);
        let started = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| {
                panic!(
                    "kamal-proxy did not start; output:\n{}",
                    self.logs().join("\n")
                )
            });
        let started: Result<String, ()> = started;
        let v: serde_json::Value = serde_json::from_str(&started.unwrap()).expect("json");
        self.http_port = v["http"].as_u64().expect("http port") as u16;
        self.https_port = v["https"].as_u64().expect("https port") as u16;
    }

    /// SIGTERM, wait for exit, start again with the same home (and HTTP port).
    pub fn restart(&mut self) {
        self.terminate();
        self.spawn();
    }

    /// Sends SIGTERM and waits; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        unsafe_kill(child.id(), "TERM");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9`, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn respawn(&mut self) {
        self.spawn();
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Runs a CLI command against this proxy.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("run cli")
    }

    /// Runs a CLI command and panics (with its stderr) unless it succeeds.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
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
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "kamal-proxy {args:?} should exit 1"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    pub fn deploy(&self, service: &str, target: &str, extra: &[&str]) {
        let t = format!("--target={target}");
        let mut args = vec![
            "deploy",
            service,
            t.as_str(),
            "--deploy-timeout=5s",
            "--drain-timeout=2s",
        ];
        args.extend_from_slice(extra);
        self.ok(&args);
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.http_port, path)
    }

    pub fn logs(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Access-log lines (msg "Request") parsed as JSON.
    pub fn access_log(&self) -> Vec<serde_json::Value> {
        self.logs()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["msg"] == "Request")
            .collect()
    }

    /// Waits until a log line satisfies `pred`.
    pub fn wait_for_log(&self, pred: impl Fn(&str) -> bool, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.logs().iter().any(|l| pred(l)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn unsafe_kill(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

/// An HTTP client that never uses a proxy from the environment and keeps connections.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

pub fn path_exists(p: &Path) -> bool {
    p.exists()
}

/// What a client saw: status, headers and body.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Reply {
    /// A response header as text ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// Sends `method url` with an optional `Host` header and reads the whole response.
pub async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    host: Option<&str>,
) -> Result<Reply, reqwest::Error> {
    let mut req = client.request(method, url);
    if let Some(h) = host {
        req = req.header(reqwest::header::HOST, h);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.text().await?;
    Ok(Reply {
        status,
        headers,
        body,
    })
}

impl Proxy {
    /// `GET path` with `Host: host` (no header override when `host` is empty).
    pub async fn get(&self, host: &str, path: &str) -> Reply {
        let host = (!host.is_empty()).then_some(host);
        send(&client(), reqwest::Method::GET, &self.url(path), host)
            .await
            .unwrap_or_else(|e| panic!("GET {path} (host {host:?}) failed: {e}"))
    }

    /// The `list` table rows (ANSI escapes removed, cells trimmed), header excluded.
    pub fn list_rows(&self) -> Vec<Vec<String>> {
        let out = self.ok(&["list"]);
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
    pub fn list_json(&self) -> serde_json::Value {
        let out = self.ok(&["list", "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("list --json: {e}: {out}"))
    }

    /// The `state` a service shows in `list --json` (`running`, `sleeping`, …; "" if absent).
    pub fn state_of(&self, service: &str) -> String {
        self.list_json()["services"][service]["state"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    /// Polls `list --json` until the service shows `state`; panics with the log otherwise.
    pub fn wait_for_state(&self, service: &str, state: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.state_of(service);
            if now == state {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "service {service} stayed {now:?}, expected {state:?}\n{}",
                self.logs().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

pub fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Polls `check` until it returns true or `timeout` passes; returns the last result.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
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
pub fn try_run(args: &[&str], env: &[(&str, &str)]) -> RunOutcome {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    try_run_in(dir.path(), &home, None, args, env)
}

/// The uid the permission tests run the server as: `nobody` when the tests run as root
/// (root ignores file modes), else none (the test's own user already obeys them).
pub fn unprivileged_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata("/proc/self").expect("/proc/self").uid();
    (me == 0).then_some(65534)
}

/// As [`try_run`], with `HOME` at `home`, the socket and temp dir in `dir`, as `run_as`.
pub fn try_run_in(
    dir: &Path,
    home: &Path,
    run_as: Option<u32>,
    args: &[&str],
    env: &[(&str, &str)],
) -> RunOutcome {
    let mut cmd = Command::new(BIN);
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
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn kamal-proxy run");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("\"msg\":\"Server started\"") {
                let _ = tx.send(line);
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(line) = rx.try_recv() {
            let _ = child.kill();
            let _ = child.wait();
            let v: serde_json::Value = serde_json::from_str(&line).expect("json");
            let http_port = v["http"].as_u64().expect("http port") as u16;
            return RunOutcome::Started { http_port };
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
            }
            return RunOutcome::Exited {
                code: status.code(),
                stderr,
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kamal-proxy run neither started nor exited");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
