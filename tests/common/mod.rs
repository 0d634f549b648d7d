//! Shared harness for the black-box tests: the real `kamal-proxy` binary with its own
//! socket, home and state file, and real HTTP backends on loopback.

#![allow(dead_code)]

pub mod backend;
pub mod docker;

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
    pub metrics_port: Option<u16>,
    extra_args: Vec<String>,
    extra_env: Vec<(String, String)>,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    pub fn start() -> Proxy {
        Self::start_with(&[], &[])
    }

    /// Starts with extra `run` flags and environment variables.
    pub fn start_with(args: &[&str], env: &[(&str, &str)]) -> Proxy {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut p = Proxy {
            child: None,
            dir,
            http_port: 0,
            metrics_port: None,
            extra_args: args.iter().map(|s| s.to_string()).collect(),
            extra_env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
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
        let port = if self.http_port == 0 { "0".to_string() } else { self.http_port.to_string() };
        let mut cmd = self.command();
        cmd.arg("run").arg(format!("--http-port={port}")).args(&self.extra_args);
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
        let started = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| {
            panic!("kamal-proxy did not start; output:\n{}", self.logs().join("\n"))
        });
        let started: Result<String, ()> = started;
        let v: serde_json::Value = serde_json::from_str(&started.unwrap()).expect("json");
        self.http_port = v["http"].as_u64().expect("http port") as u16;
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
        assert_eq!(out.status.code(), Some(1), "kamal-proxy {args:?} should exit 1");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    pub fn deploy(&self, service: &str, target: &str, extra: &[&str]) {
        let t = format!("--target={target}");
        let mut args = vec!["deploy", service, t.as_str(), "--deploy-timeout=5s", "--drain-timeout=2s"];
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
    let _ = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
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
