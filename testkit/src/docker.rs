//! Real Docker Engine helpers for integration tests, driven through the `docker` CLI.
//!
//! The engine has no images and no registry, so the test image is imported from a
//! busybox-static rootfs. Everything created carries the label `kamal-proxy-test=1`, so
//! CI can sweep leftovers: `docker rm -f $(docker ps -aq --filter label=kamal-proxy-test=1)`.
//! The shared image is left in place for the next test process (it is tiny).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::poll::poll_until;
use crate::ports::free_port;

pub const TEST_IMAGE: &str = "kamal-proxy-test-busybox:latest";
pub const TEST_LABEL: &str = "kamal-proxy-test=1";

const BUSYBOX: &str = "/bin/busybox";
const APPLETS: &[&str] = &[
    "sh", "httpd", "nc", "sleep", "cat", "echo", "ls", "wget", "mkdir",
];
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// A port picked by binding `:0` can be taken again before httpd binds it; retry then.
const RUN_ATTEMPTS: usize = 3;

/// True when a Docker Engine answers `docker info`. Checked once per process.
pub fn docker_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Command::new("docker")
            .args(["info", "--format", "{{.ServerVersion}}"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

/// Call first in every Docker test: `if !require_docker() { return; }`.
/// Off CI a missing engine skips the test (with a note); on CI it fails it.
pub fn require_docker() -> bool {
    if docker_available() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "CI=true but no Docker Engine answers `docker info`: Docker tests must not be skipped on CI \
             (start one as in rust-stack.md §6.2, or fix DOCKER_HOST)"
        );
    }
    eprintln!(
        "skipping: no Docker Engine answers `docker info` (set CI=true to make this a failure)"
    );
    false
}

/// Imports the busybox test image once per process. Concurrent test processes each
/// import under a private tag and then move the shared tag, which Docker does atomically,
/// so nobody ever sees a half-built image.
pub fn ensure_test_image() -> String {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            if !docker_ok(&["image", "inspect", TEST_IMAGE]) {
                import_test_image();
            }
            TEST_IMAGE.to_owned()
        })
        .clone()
}

fn import_test_image() {
    assert!(
        Path::new(BUSYBOX).is_file(),
        "{BUSYBOX} is missing: install Debian's busybox-static (it must be statically linked)"
    );
    let rootfs = tempfile::tempdir().expect("temp dir for the rootfs");
    let bin = rootfs.path().join("bin");
    let www = rootfs.path().join("www");
    std::fs::create_dir_all(&bin).expect("create rootfs/bin");
    std::fs::create_dir_all(&www).expect("create rootfs/www");
    std::fs::copy(BUSYBOX, bin.join("busybox")).expect("copy busybox into the rootfs");
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("applet symlink");
    }
    std::fs::write(www.join("up"), "ok\n").expect("write /www/up");

    let private_tag = format!("kamal-proxy-test-busybox:build-{}", unique_suffix());
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(rootfs.path())
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run tar");
    let tar_out = tar.stdout.take().expect("tar stdout");
    let import = Command::new("docker")
        .args([
            "import",
            "--change",
            r#"CMD ["/bin/httpd", "-f", "-p", "3000", "-h", "/www"]"#,
            "--change",
            &format!("LABEL {TEST_LABEL}"),
            "-",
            &private_tag,
        ])
        .stdin(tar_out)
        .output()
        .expect("run docker import");
    assert!(
        tar.wait().expect("wait for tar").success(),
        "tar of the rootfs failed"
    );
    assert!(
        import.status.success(),
        "docker import failed: {}",
        stderr(&import)
    );
    docker(&["tag", &private_tag, TEST_IMAGE]);
    // Drops only the private tag; the image stays under TEST_IMAGE. Best effort: if
    // another process moved TEST_IMAGE meanwhile and started containers from our image,
    // Docker refuses, and the labelled image is left for the CI sweep.
    let _ = docker_output(&["rmi", &private_tag]);
}

/// A container removed (`docker rm -f`) when dropped, so a failing test still cleans up.
#[derive(Debug)]
pub struct TestContainer {
    pub name: String,
    /// The loopback port httpd listens on (host network), or 0 when it serves nothing.
    pub port: u16,
}

impl Drop for TestContainer {
    fn drop(&mut self) {
        remove(&self.name);
    }
}

/// Runs busybox httpd serving `/www` (`GET /up` → `ok`) on 127.0.0.1, and waits until it
/// answers.
pub fn run_httpd(name_prefix: &str) -> TestContainer {
    let mut last_error = String::new();
    for _ in 0..RUN_ATTEMPTS {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let container = run_container(
            name_prefix,
            port,
            true,
            &["/bin/httpd", "-f", "-p", &listen, "-h", "/www"],
        );
        match wait_until_ready(&container) {
            Ok(()) => return container,
            Err(e) => last_error = e,
        }
    }
    panic!("httpd test container never became ready: {last_error}");
}

/// Like [`run_httpd`], but httpd starts only after `delay` (every start, so every wake),
/// and this returns at once without waiting for readiness.
pub fn run_httpd_with_boot_delay(name_prefix: &str, delay: Duration) -> TestContainer {
    let port = free_port();
    let script = format!(
        "sleep {:.3}; exec httpd -f -p 127.0.0.1:{port} -h /www",
        delay.as_secs_f64()
    );
    run_container(name_prefix, port, true, &["/bin/sh", "-c", &script])
}

/// Runs `command` in the test image on the host network. With `init` false the command
/// is PID 1, which the kernel shields from signals it has no handler for (SIGTERM
/// included): use that to get a container only SIGKILL stops.
pub fn run_container(name_prefix: &str, port: u16, init: bool, command: &[&str]) -> TestContainer {
    run_container_with(name_prefix, port, init, &[], command)
}

/// [`run_container`] with extra `docker run` options (e.g. `-v host:container`).
pub fn run_container_with(
    name_prefix: &str,
    port: u16,
    init: bool,
    docker_options: &[&str],
    command: &[&str],
) -> TestContainer {
    let image = ensure_test_image();
    let container = TestContainer {
        name: format!("{name_prefix}-{}", unique_suffix()),
        port,
    };
    let mut args = vec![
        "run",
        "-d",
        "--network",
        "host",
        "--label",
        TEST_LABEL,
        "--name",
        &container.name,
    ];
    if init {
        args.push("--init");
    }
    args.extend_from_slice(docker_options);
    args.push(&image);
    args.extend_from_slice(command);
    docker(&args);
    container
}

pub fn is_running(name: &str) -> bool {
    let out = docker_output(&["inspect", "--format", "{{.State.Running}}", name]);
    out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "true"
}

pub fn stop(name: &str) {
    docker(&["stop", name]);
}

/// Removes the container if it exists; never fails (used from `Drop`).
/// `docker kill`: SIGKILL, no grace, as a crash would.
pub fn kill(name: &str) {
    docker(&["kill", name]);
}

/// `docker start`.
pub fn start(name: &str) {
    docker(&["start", name]);
}

pub fn remove(name: &str) {
    let _ = docker_output(&["rm", "-f", "-v", name]);
}

/// The container's full id, as `docker inspect` reports it.
pub fn container_id(name: &str) -> String {
    let out = docker(&["inspect", "--format", "{{.Id}}", name]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// How many times the container was started since `since_unix` (seconds since the epoch).
pub fn start_events_since(name: &str, since_unix: i64) -> usize {
    // Fractional "now": a whole-second bound would either cut off this second's events
    // or, rounded up, make `docker events` wait for the future.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    let until = format!("{}.{:09}", now.as_secs(), now.subsec_nanos());
    let out = docker(&[
        "events",
        "--since",
        &since_unix.to_string(),
        "--until",
        &until,
        "--filter",
        &format!("container={name}"),
        "--filter",
        "event=start",
        "--format",
        "{{.Status}}",
    ]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.trim() == "start")
        .count()
}

/// How many times the container was started since `since_unix`, read from the engine's
/// event stream up to a marker event this call causes itself (see [`actions_before_marker`]).
pub async fn starts_before_marker(name: &str, since_unix: i64) -> usize {
    actions_before_marker(name, &since_unix.to_string())
        .await
        .iter()
        .filter(|a| *a == "start")
        .count()
}

/// Everything the engine did to the container (`start`, `pause`, `unpause`, `kill`,
/// `stop`, `die`, …, in order) since `since` (Unix seconds, fractional allowed: see
/// [`now_precise`]), read from the event stream up to a marker
/// event this call causes itself (a labelled volume created and removed). The marker is
/// the positive signal: every action the engine recorded before it is listed, so "none"
/// means none happened, with no waiting and hoping.
pub async fn actions_before_marker(name: &str, since: &str) -> Vec<String> {
    let marker = format!("kamal-proxy-test-marker-{}", unique_suffix());
    let docker = |args: Vec<String>| async move {
        let out = tokio::process::Command::new("docker")
            .args(&args)
            .output()
            .await
            .expect("run the docker CLI");
        assert!(
            out.status.success(),
            "docker {} failed: {}",
            args.join(" "),
            stderr(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    docker(owned(&["volume", "create", "--label", TEST_LABEL, &marker])).await;
    docker(owned(&["volume", "rm", &marker])).await;
    crate::poll_until(
        "the engine's event stream to reach the marker",
        Duration::from_secs(20),
        || {
            let args = owned(&[
                "events",
                "--since",
                since,
                "--until",
                &until_now(),
                "--filter",
                "type=container",
                "--filter",
                "type=volume",
                "--format",
                "{{.Type}} {{.Action}} {{.Actor.ID}} {{index .Actor.Attributes \"name\"}}",
            ]);
            let marker = marker.clone();
            async move {
                let mut actions = Vec::new();
                for line in docker(args).await.lines() {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    match fields.as_slice() {
                        ["volume", "create", id, ..] if *id == marker => return Some(actions),
                        ["container", action, _, n] if *n == name => {
                            actions.push(action.to_string())
                        }
                        _ => {}
                    }
                }
                None
            }
        },
    )
    .await
}

/// The container's state as Docker reports it: `running`, `paused`, `exited`, …
pub fn status(name: &str) -> String {
    let out = docker(&["inspect", "--format", "{{.State.Status}}", name]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Runs `docker <args>` (a test's own container operations: start, stop, pause, rm).
pub fn run_docker(args: &[&str]) {
    docker(args);
}

/// Fractional "now" for `docker events --until`: a whole-second bound would either cut
/// off this second's events or, rounded up, make `docker events` wait for the future.
fn until_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    format!("{}.{:09}", now.as_secs(), now.subsec_nanos())
}

/// Now, as a fractional Unix timestamp for `docker events --since`: events earlier in the
/// same second are not included.
pub fn now_precise() -> String {
    until_now()
}

pub fn now_unix() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since_epoch.as_secs()).expect("time fits i64")
}

/// One plain HTTP/1.0 GET to 127.0.0.1:`port`; returns (status code, body).
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let invalid =
        || std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HTTP response");
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(invalid)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(invalid)?;
    Ok((status, body.to_owned()))
}

/// Polls `GET /up` (through [`poll_until`], on tokio's clock) until the container answers
/// `ok`. `Err` when the container exits first (its process could not bind its port);
/// panics if it neither serves nor exits within a generous guard.
pub async fn ready(container: &TestContainer) -> Result<(), String> {
    let url = format!("http://127.0.0.1:{}/up", container.port);
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let what = format!("{} to serve /up", container.name);
    poll_until(&what, READY_TIMEOUT, || async {
        if let Ok(r) = http.get(&url).send().await
            && r.status() == 200
            && r.text().await.is_ok_and(|b| b.trim() == "ok")
        {
            return Ok(Ok(()));
        }
        let running = tokio::process::Command::new("docker")
            .args(["inspect", "--format", "{{.State.Running}}", &container.name])
            .output()
            .await
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "true"
            });
        if running {
            Err("not serving /up yet")
        } else {
            Ok(Err(format!("{} exited before serving /up", container.name)))
        }
    })
    .await
}

/// [`run_app_container_with`], returned once it serves `/up`; started again on a fresh
/// port when the one picked was taken before the app bound it (the app exits then).
pub async fn app_container_ready(
    name_prefix: &str,
    boot_delay: Duration,
    docker_options: &[&str],
) -> TestContainer {
    let mut last_error = String::new();
    for _ in 0..RUN_ATTEMPTS {
        let container = run_app_container_with(name_prefix, boot_delay, docker_options);
        match ready(&container).await {
            Ok(()) => return container,
            Err(e) => last_error = e,
        }
    }
    panic!("app container never became ready in {RUN_ATTEMPTS} attempts: {last_error}");
}

/// The blocking form of [`ready`], kept for callers outside an async context and for the
/// tests not yet moved to [`ready`] / [`app_container_ready`].
pub fn wait_until_ready(container: &TestContainer) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match http_get(container.port, "/up") {
            Ok((200, body)) if body.trim() == "ok" => return Ok(()),
            _ if Instant::now() > deadline => {
                return Err(format!(
                    "{} not serving /up after {READY_TIMEOUT:?}",
                    container.name
                ));
            }
            _ if !is_running(&container.name) => {
                return Err(format!("{} exited before serving /up", container.name));
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Unique across threads and concurrent test processes.
fn unique_suffix() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{}-{}-{nanos:09}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn docker_output(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("run the docker CLI")
}

fn docker_ok(args: &[&str]) -> bool {
    docker_output(args).status.success()
}

/// Runs `docker <args>` and panics with its stderr when it fails.
fn docker(args: &[&str]) -> Output {
    let out = docker_output(args);
    assert!(
        out.status.success(),
        "docker {} failed: {}",
        args.join(" "),
        stderr(&out)
    );
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

/// The engine's Unix socket as the docker CLI sees it (`DOCKER_HOST=unix://…`), so the
/// code under test talks to the same engine as these helpers.
pub fn docker_socket_path() -> std::path::PathBuf {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|host| host.strip_prefix("unix://").map(std::path::PathBuf::from))
        .unwrap_or_else(|| "/var/run/docker.sock".into())
}

/// The `test_backend` example binary (testkit/src/backend.rs as a program), built on
/// demand so a single `cargo test --test …` works too.
pub fn test_backend_binary() -> std::path::PathBuf {
    static BUILT: OnceLock<std::path::PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test executable path");
            // target/<profile>/deps/<test> → target/<profile>/examples/test_backend
            let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
            let binary = profile_dir.join("examples").join("test_backend");
            let mut args = vec!["build", "--example", "test_backend"];
            if profile_dir.ends_with("release") {
                args.push("--release");
            }
            let status = Command::new(env!("CARGO"))
                .args(&args)
                .current_dir(crate::workspace_root())
                .status()
                .expect("run cargo build --example test_backend");
            assert!(status.success(), "building the test_backend example failed");
            assert!(binary.exists(), "{} missing after build", binary.display());
            binary
        })
        .clone()
}

/// Runs the real test backend (echo, slow, SSE, WebSocket…) inside a container, on the
/// host network at 127.0.0.1:<port>. The binary and the host's shared libraries are
/// mounted read-only into the busybox image, which has no libc of its own.
/// `boot_delay` models an app that takes time to boot before it listens.
pub fn run_app_container(name_prefix: &str, boot_delay: Duration) -> TestContainer {
    run_app_container_with(name_prefix, boot_delay, &[])
}

/// [`run_app_container`] with extra `docker run` options (e.g. `--label k=v`).
pub fn run_app_container_with(
    name_prefix: &str,
    boot_delay: Duration,
    docker_options: &[&str],
) -> TestContainer {
    run_app_container_on(name_prefix, free_port(), boot_delay, docker_options)
}

/// [`run_app_container_with`] on a given port: a container recreated in place of another
/// (as `kamal app boot` does), reachable at the same target.
pub fn run_app_container_on(
    name_prefix: &str,
    port: u16,
    boot_delay: Duration,
    docker_options: &[&str],
) -> TestContainer {
    let binary = test_backend_binary();
    let dir = binary.parent().expect("examples dir").display().to_string();
    let image = ensure_test_image();
    let container = TestContainer {
        name: format!("{name_prefix}-{}", unique_suffix()),
        port,
    };
    let mount = format!("{dir}:/app:ro");
    let listen = format!("127.0.0.1:{port}");
    let delay = boot_delay.as_millis().to_string();
    let mut args = vec![
        "run",
        "-d",
        "--init",
        "--network",
        "host",
        "--label",
        TEST_LABEL,
        "--name",
        &container.name,
        "-v",
        &mount,
    ];
    let libs: Vec<String> = ["/lib", "/lib64", "/usr/lib"]
        .iter()
        .filter(|p| Path::new(p).exists())
        .map(|p| format!("{p}:{p}:ro"))
        .collect();
    for l in &libs {
        args.push("-v");
        args.push(l);
    }
    args.extend_from_slice(docker_options);
    args.extend_from_slice(&[
        &image,
        "/app/test_backend",
        "--listen",
        &listen,
        "--name",
        name_prefix,
        "--boot-delay-ms",
        &delay,
    ]);
    docker(&args);
    container
}
