//! Launching `kamal-proxy run` and learning what it bound from its own start-up line.

use crate::poll::poll_until;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long `run` may take to log `Server started` (a hang guard, not a measurement).
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The `kamal-proxy` binary cargo built for these tests: `$KAMAL_PROXY_BIN`, else next to
/// the test executable's directory (`target/<profile>/deps/<test>` →
/// `target/<profile>/kamal-proxy`), as cargo lays out binaries for integration tests.
pub fn bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(path) = std::env::var_os("KAMAL_PROXY_BIN") {
            return PathBuf::from(path);
        }
        let exe = std::env::current_exe().expect("test executable path");
        let mut dir = exe.parent().expect("test executable's directory");
        if dir.ends_with("deps") {
            dir = dir.parent().expect("target profile directory");
        }
        let bin = dir.join("kamal-proxy");
        assert!(
            bin.exists(),
            "{} is missing: run the tests with cargo (it builds the binary), or set KAMAL_PROXY_BIN",
            bin.display()
        );
        bin
    })
    .clone()
}

/// Every line the process wrote, stdout as is, stderr prefixed `stderr: `. Drained by
/// threads, so a test that blocks never stalls the proxy on a full pipe.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Starts draining the child's pipes; the threads end when the pipes close.
    fn capture(&self, child: &mut Child) -> [std::thread::JoinHandle<()>; 2] {
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let out = self.0.clone();
        let stdout = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                out.lock().unwrap().push(line);
            }
        });
        let err = self.0.clone();
        let stderr = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                err.lock().unwrap().push(format!("stderr: {line}"));
            }
        });
        [stdout, stderr]
    }
}

/// The whole log, printed when a wait on it gives up.
impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the log so far:\n{}", self.lines().join("\n"))
    }
}

/// The ports a started server reports in its `Server started` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ports {
    pub http: u16,
    pub https: u16,
    /// Present when metrics are enabled.
    pub metrics: Option<u16>,
}

/// How a launch ended up.
#[derive(Debug)]
pub enum Launch {
    Started(Ports),
    /// It exited before starting.
    Exited {
        code: Option<i32>,
        stderr: String,
    },
}

/// Spawns `cmd` (a `kamal-proxy run …`) with its output captured into `log`, and waits
/// until it either logs `Server started` or exits.
pub async fn launch(mut cmd: Command, log: &Log) -> (Child, Launch) {
    let skip = log.lines().len();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kamal-proxy run");
    let drains = log.capture(&mut child);
    let outcome = poll_until("kamal-proxy run to start or exit", START_TIMEOUT, || {
        let started = log
            .lines()
            .into_iter()
            .skip(skip)
            .find(|l| l.contains("\"msg\":\"Server started\""));
        let outcome = match started {
            Some(line) => Some(Launch::Started(ports(&line))),
            None => match child.try_wait() {
                Ok(Some(status)) => Some(Launch::Exited {
                    code: status.code(),
                    stderr: String::new(),
                }),
                _ => None,
            },
        };
        std::future::ready(outcome)
    })
    .await;
    let outcome = match outcome {
        Launch::Exited { code, .. } => {
            // The pipes close with the process: once drained, the log holds all it said.
            // A drain that panicked lost nothing the test needs: ignore its result.
            let _ = tokio::task::spawn_blocking(move || drains.map(std::thread::JoinHandle::join))
                .await;
            let stderr: String = log
                .lines()
                .iter()
                .skip(skip)
                .filter_map(|l| l.strip_prefix("stderr: "))
                .map(|l| format!("{l}\n"))
                .collect();
            Launch::Exited { code, stderr }
        }
        started => started,
    };
    (child, outcome)
}

fn ports(line: &str) -> Ports {
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("start-up line {line:?}: {e}"));
    let port = |key: &str| {
        v[key]
            .as_u64()
            .map(|p| u16::try_from(p).expect("a port fits u16"))
    };
    Ports {
        http: port("http").expect("http port in the start-up line"),
        https: port("https").expect("https port in the start-up line"),
        metrics: port("metrics"),
    }
}
