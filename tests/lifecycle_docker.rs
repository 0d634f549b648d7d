//! `DockerLifecycle` against the real Docker Engine, plus a fake engine on a Unix socket
//! for the faults a real engine cannot be made to produce (403, huge 500 bodies,
//! redirects, a failing `/version`, silence).

use testkit::docker as docker_support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use docker_support::{TestContainer, is_running, require_docker, run_container, run_httpd};
use kamal_proxy::lifecycle::docker::{DockerLifecycle, check_socket_path, connect};
use kamal_proxy::lifecycle::{ContainerLifecycle, LifecycleError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

const STOP_BUDGET: Duration = Duration::from_secs(30);

fn real_engine() -> DockerLifecycle {
    connect(&docker_support::docker_socket_path()).expect("connect to the docker socket")
}

/// A stopped copy of the httpd test container.
fn stopped_httpd(prefix: &str) -> TestContainer {
    let container = run_httpd(prefix);
    docker_support::stop(&container.name);
    assert!(!is_running(&container.name));
    container
}

#[tokio::test]
async fn stop_stops_a_running_container_and_is_idempotent() {
    if !require_docker() {
        return;
    }
    let container = run_httpd("lc-stop");
    let docker = real_engine();

    let started = Instant::now();
    docker.stop(&container.name, STOP_BUDGET).await.unwrap();
    eprintln!("stop (httpd under --init): {:?}", started.elapsed());
    assert!(!is_running(&container.name));

    // Docker answers 304 for a container that is already stopped.
    docker.stop(&container.name, STOP_BUDGET).await.unwrap();
    assert!(!is_running(&container.name));
}

#[tokio::test]
async fn start_starts_a_stopped_container_and_is_idempotent() {
    if !require_docker() {
        return;
    }
    let since = docker_support::now_unix();
    let container = stopped_httpd("lc-start");
    // Event times are whole seconds here, so count from before `docker run` and subtract
    // its own start rather than race the clock.
    let before = docker_support::start_events_since(&container.name, since);
    assert_eq!(before, 1);
    let docker = real_engine();

    let started = Instant::now();
    docker.start(&container.name).await.unwrap();
    let start_latency = started.elapsed();
    assert!(is_running(&container.name));
    docker_support::ready(&container).await.unwrap();
    eprintln!(
        "start: {start_latency:?}, serving /up after {:?}",
        started.elapsed()
    );

    // Docker answers 304 for a running container, and does not start it again.
    docker.start(&container.name).await.unwrap();
    assert!(is_running(&container.name));
    let after = docker_support::start_events_since(&container.name, since);
    assert_eq!(after - before, 1);
}

#[tokio::test]
async fn unknown_containers_are_not_found() {
    if !require_docker() {
        return;
    }
    let docker = real_engine();
    let name = "kamal-proxy-test-no-such-container";
    let not_found = Err(LifecycleError::NotFound(name.to_owned()));
    assert_eq!(docker.start(name).await, not_found);
    assert_eq!(docker.stop(name, STOP_BUDGET).await, not_found);
    assert_eq!(docker.inspect(name).await.map(drop), not_found);
}

#[tokio::test]
async fn inspect_knows_a_container_by_name_and_by_short_id() {
    if !require_docker() {
        return;
    }
    let container = stopped_httpd("lc-inspect");
    let docker = real_engine();
    let info = docker.inspect(&container.name).await.unwrap();
    assert_eq!(
        info.labels.get("kamal-proxy-test").map(String::as_str),
        Some("1"),
        "the container's labels: {info:?}"
    );
    // Kamal's targets are 12-character id prefixes.
    let id = docker_support::container_id(&container.name);
    docker.inspect(&id[..12]).await.unwrap();
}

#[tokio::test]
async fn a_reference_cannot_reach_outside_its_path_segment() {
    if !require_docker() {
        return;
    }
    let container = stopped_httpd("lc-escape");
    let docker = real_engine();
    // bollard alone would normalise `x/../NAME` into /containers/NAME/start. Escaped,
    // it reaches Docker as x%2F..%2FNAME; Docker unescapes and answers 301 to the
    // cleaned path, and since redirects are never followed nothing starts.
    let sneaky = format!("x/../{}", container.name);
    assert!(matches!(
        docker.start(&sneaky).await,
        Err(LifecycleError::Daemon { status: 301, .. })
    ));
    assert_eq!(
        docker.start("..").await,
        Err(LifecycleError::NotFound("..".into()))
    );
    assert!(!is_running(&container.name));
}

#[tokio::test]
async fn stop_kills_a_container_that_ignores_sigterm_within_the_budget() {
    if !require_docker() {
        return;
    }
    // No --init: sh is PID 1 and ignores TERM, so only Docker's SIGKILL stops it.
    let container = run_container(
        "lc-stubborn",
        0,
        false,
        &["/bin/sh", "-c", "trap '' TERM; while :; do sleep 1; done"],
    );
    let docker = real_engine();
    let budget = Duration::from_secs(6);

    let started = Instant::now();
    docker.stop(&container.name, budget).await.unwrap();
    // Ok, not `LifecycleError::Timeout`: the stop finished within its own budget.
    eprintln!(
        "stop of a SIGTERM-ignoring container, budget {budget:?}: {:?}",
        started.elapsed()
    );
    assert!(!is_running(&container.name));
}

#[tokio::test]
async fn start_returns_before_a_slow_booting_container_serves() {
    if !require_docker() {
        return;
    }
    let delay = Duration::from_millis(1500);
    let container = docker_support::run_httpd_with_boot_delay("lc-slow", delay);
    docker_support::stop(&container.name);
    let docker = real_engine();

    let started = Instant::now();
    docker.start(&container.name).await.unwrap();
    let start_latency = started.elapsed();
    // Running is not ready: readiness is the health check's business. Nothing serves
    // yet when start returns (no wall-clock bound on how fast start was).
    assert!(docker_support::http_get(container.port, "/up").is_err());
    docker_support::ready(&container).await.unwrap();
    let ready = started.elapsed();
    eprintln!("slow boot: start {start_latency:?}, serving after {ready:?}");
    assert!(ready >= delay, "served after {ready:?}");
}

#[test]
fn check_socket_path_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.sock");
    assert_eq!(
        check_socket_path(&missing),
        Err(format!(
            "docker socket {} does not exist",
            missing.display()
        ))
    );
    let file = dir.path().join("file.sock");
    std::fs::write(&file, "").unwrap();
    assert_eq!(
        check_socket_path(&file),
        Err(format!(
            "docker socket {} is not a unix socket",
            file.display()
        ))
    );
    assert!(connect(&missing).is_err());
}

#[test]
fn check_socket_path_accepts_the_engine_socket() {
    if !require_docker() {
        return;
    }
    assert_eq!(
        check_socket_path(&docker_support::docker_socket_path()),
        Ok(())
    );
}

#[tokio::test]
async fn negotiates_the_api_version_once_and_sends_versioned_paths() {
    if !require_docker() {
        return;
    }
    let container = stopped_httpd("lc-version");
    let proxy = RecordingProxy::start(docker_support::docker_socket_path());
    let docker = connect(&proxy.socket).unwrap();

    docker.start(&container.name).await.unwrap();
    docker.stop(&container.name, STOP_BUDGET).await.unwrap();

    let version = negotiated_version(&engine_api_version());
    assert_eq!(
        proxy.requests(),
        [
            "GET /version".to_owned(),
            format!("POST /v{version}/containers/{}/start", container.name),
            format!("POST /v{version}/containers/{}/stop?t=24", container.name),
        ]
    );
}

// ---- fake engine: faults a real engine cannot be made to produce ----

#[tokio::test]
async fn forbidden_maps_to_forbidden() {
    let engine = FakeEngine::start(|_| Some(Reply::json(403, r#"{"message":"denied"}"#)));
    let docker = connect(&engine.socket).unwrap();
    let forbidden = Err(LifecycleError::Forbidden("app".into()));
    assert_eq!(docker.start("app").await, forbidden);
    assert_eq!(docker.stop("app", STOP_BUDGET).await, forbidden);
    assert_eq!(docker.inspect("app").await.map(drop), forbidden);
}

#[tokio::test]
async fn daemon_errors_carry_status_and_a_bounded_body() {
    let body = format!("  {}", "x".repeat(10 * 1024));
    let engine = FakeEngine::start(move |_| Some(Reply::text(500, &body)));
    let docker = connect(&engine.socket).unwrap();
    match docker.start("app").await {
        Err(LifecycleError::Daemon {
            container,
            status,
            body,
        }) => {
            assert_eq!((container.as_str(), status), ("app", 500));
            assert!(body.len() <= 4096, "body of {} bytes", body.len());
            assert!(body.starts_with("xxx"), "body not trimmed");
        }
        other => panic!("expected Daemon, got {other:?}"),
    }
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let engine = FakeEngine::start(|line| {
        Some(if line.starts_with("GET /version") {
            Reply::json(200, r#"{"ApiVersion":"1.41"}"#)
        } else {
            Reply::text(301, "").header("Location", "/v1.41/containers/elsewhere/start")
        })
    });
    let docker = connect(&engine.socket).unwrap();
    assert!(matches!(
        docker.start("app").await,
        Err(LifecycleError::Daemon { status: 301, .. })
    ));
    assert!(matches!(
        docker.inspect("app").await,
        Err(LifecycleError::Daemon { status: 301, .. })
    ));
    let requests = engine.requests();
    assert!(
        requests.iter().all(|line| !line.contains("elsewhere")),
        "{requests:?}"
    );
}

#[tokio::test]
async fn failed_negotiation_falls_back_to_1_41_and_is_retried() {
    let engine = FakeEngine::start(|line| {
        if line.starts_with("GET /version") {
            Some(Reply::text(500, "no version for you"))
        } else {
            Some(Reply::text(204, ""))
        }
    });
    let docker = connect(&engine.socket).unwrap();
    docker.start("we/ird name").await.unwrap();
    docker.start("app").await.unwrap();
    assert_eq!(
        engine.requests(),
        [
            "GET /version",
            "POST /v1.41/containers/we%2Fird%20name/start",
            "GET /version",
            "POST /v1.41/containers/app/start",
        ]
    );
}

#[tokio::test]
async fn negotiation_caps_at_the_newest_version_bollard_models() {
    let engine = FakeEngine::start(|line| {
        if line.starts_with("GET /version") {
            Some(Reply::json(
                200,
                r#"{"ApiVersion":"1.99","Version":"99.0"}"#,
            ))
        } else {
            Some(Reply::text(304, ""))
        }
    });
    let docker = connect(&engine.socket).unwrap();
    docker.start("app").await.unwrap();
    let newest = bollard::API_DEFAULT_VERSION;
    assert_eq!(
        engine.requests()[1],
        format!(
            "POST /v{}.{}/containers/app/start",
            newest.major_version, newest.minor_version
        )
    );
}

#[tokio::test]
async fn a_dead_socket_is_a_transport_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dead.sock");
    // The socket file stays behind when its listener is gone, as after a daemon crash.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let docker = connect(&socket).unwrap();
    match docker.inspect("app").await {
        Err(LifecycleError::Transport(message)) => {
            assert!(message.contains(&socket.display().to_string()), "{message}");
        }
        other => panic!("expected Transport, got {other:?}"),
    }
}

// On tokio's paused clock the budget is exact, so "just past" can be checked without
// racing a busy machine.
#[tokio::test(start_paused = true)]
async fn a_silent_engine_times_out_just_past_the_stop_budget() {
    let engine = FakeEngine::start(|_| None);
    let docker = connect(&engine.socket).unwrap();
    let started = tokio::time::Instant::now();
    assert_eq!(
        docker.stop("app", Duration::from_secs(1)).await,
        Err(LifecycleError::Timeout("app".into()))
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

// ---- helpers ----

fn engine_api_version() -> String {
    let out = std::process::Command::new("docker")
        .args(["version", "--format", "{{.Server.APIVersion}}"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// What negotiation should settle on: the engine's version, capped at bollard's.
fn negotiated_version(engine: &str) -> String {
    let (major, minor) = engine.split_once('.').unwrap();
    let engine: (usize, usize) = (major.parse().unwrap(), minor.parse().unwrap());
    let newest = bollard::API_DEFAULT_VERSION;
    let (major, minor) = engine.min((newest.major_version, newest.minor_version));
    format!("{major}.{minor}")
}

/// Reads one request head and returns its request line without the HTTP version.
async fn read_head(stream: &mut UnixStream) -> Option<(String, Vec<u8>)> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next()?;
    let line = line.rsplit_once(' ').map_or(line, |(start, _)| start);
    Some((line.to_owned(), head))
}

struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

impl Reply {
    fn text(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("Content-Type", "text/plain".into())],
            body: body.to_owned(),
        }
    }

    fn json(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("Content-Type", "application/json".into())],
            body: body.to_owned(),
        }
    }

    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {} Fake\r\n", self.status);
        for (name, value) in &self.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        // 204 and 304 must not carry a body or a length.
        if !matches!(self.status, 204 | 304) {
            out.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        out.push_str("Connection: close\r\n\r\n");
        out.push_str(&self.body);
        out.into_bytes()
    }
}

/// An HTTP/1.1 server on a Unix socket that records each request line and answers
/// through `respond`; `None` means never answer.
struct FakeEngine {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeEngine {
    fn start(respond: impl Fn(&str) -> Option<Reply> + Send + Sync + 'static) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let respond = Arc::new(respond);
        let seen = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (seen, respond) = (Arc::clone(&seen), Arc::clone(&respond));
                tokio::spawn(async move {
                    let Some((line, _)) = read_head(&mut stream).await else {
                        return;
                    };
                    seen.lock().unwrap().push(line.clone());
                    match respond(&line) {
                        Some(reply) => {
                            let _ = stream.write_all(&reply.to_bytes()).await;
                        }
                        // Hold the connection open, answering nothing.
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
        Self {
            _dir: dir,
            socket,
            requests,
            task,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Forwards to the real engine socket, recording each request line. bollard opens a
/// connection per request (no idle pooling), so the first head on a connection is all
/// there is to see.
struct RecordingProxy {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RecordingProxy {
    fn start(upstream: PathBuf) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let (seen, upstream) = (Arc::clone(&seen), upstream.clone());
                tokio::spawn(async move {
                    let Some((line, head)) = read_head(&mut client).await else {
                        return;
                    };
                    seen.lock().unwrap().push(line);
                    let mut engine = UnixStream::connect(&upstream).await.unwrap();
                    engine.write_all(&head).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut engine).await;
                });
            }
        });
        Self {
            _dir: dir,
            socket,
            requests,
            task,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
