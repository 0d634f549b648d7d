//! Faults on the real Docker Engine during scale-to-zero: the engine going silent in the
//! middle of a wake, a container killed in the middle of a request, a container that
//! exits as it wakes. Each must end in a clear 502/503 with no internal detail, the
//! service must recover once the fault clears, and nothing may stay held (the in-flight
//! count, the proxy's connections to the engine).
//!
//! A silent engine is the one fault the real engine cannot be made to produce on demand,
//! so that test puts a Unix-socket relay between the proxy and the real engine and
//! makes the relay swallow traffic; everything else is the engine itself.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use testkit::docker::{self, TestContainer};
use testkit::{Proxy, client, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

async fn app(prefix: &str) -> TestContainer {
    docker::app_container_ready(prefix, Duration::ZERO, &[]).await
}

async fn deploy_sleepy(p: &Proxy, c: &TestContainer, extra: &[&str]) {
    let target = format!("127.0.0.1:{}", c.port);
    let container = format!("--sleep-container={}", c.name);
    let mut flags = vec![
        "--sleep-after=1s",
        container.as_str(),
        "--health-check-interval=200ms",
    ];
    flags.extend_from_slice(extra);
    p.deploy("app", &target, &flags).await;
}

/// What a client sees must never name the machinery behind it.
fn assert_no_internal_detail(body: &str, container: &str) {
    for secret in [container, "docker", ".sock", "container"] {
        assert!(
            !body.to_lowercase().contains(&secret.to_lowercase()),
            "the client's body mentions {secret:?}: {body}"
        );
    }
}

/// A Unix-socket relay to the real engine that can be told to go silent: while silent it
/// accepts and reads everything and answers nothing, on new and existing connections.
struct Relay {
    path: PathBuf,
    silent: Arc<AtomicBool>,
    /// Connections the proxy holds open right now.
    open: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
}

impl Relay {
    fn start() -> Relay {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let silent = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let engine = docker::docker_socket_path();
        let (s, o) = (silent.clone(), open.clone());
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(relay(client, engine.clone(), s.clone(), o.clone()));
            }
        });
        Relay {
            path,
            silent,
            open,
            _dir: dir,
        }
    }

    fn socket_flag(&self) -> String {
        format!("--docker-socket={}", self.path.display())
    }

    fn go_silent(&self, silent: bool) {
        self.silent.store(silent, Ordering::SeqCst);
    }

    fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

async fn relay(
    client: UnixStream,
    engine: PathBuf,
    silent: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
) {
    open.fetch_add(1, Ordering::SeqCst);
    let (mut from_client, mut to_client) = client.into_split();
    let upstream = if silent.load(Ordering::SeqCst) {
        None
    } else {
        UnixStream::connect(&engine).await.ok()
    };
    match upstream {
        None => swallow(&mut from_client).await,
        Some(upstream) => {
            let (mut from_engine, mut to_engine) = upstream.into_split();
            let up = pump(&mut from_client, &mut to_engine, &silent);
            let down = pump(&mut from_engine, &mut to_client, &silent);
            // Either direction ending (the proxy hanging up) ends the relayed connection.
            tokio::select! {
                _ = up => {}
                _ = down => {}
            }
        }
    }
    open.fetch_sub(1, Ordering::SeqCst);
}

/// Copies until EOF; once the relay is silent, keeps reading and drops what it reads.
async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    silent: &AtomicBool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if silent.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn swallow(from: &mut (impl AsyncReadExt + Unpin)) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_engine_that_goes_silent_mid_wake_answers_503_and_the_service_recovers() {
    if !docker::require_docker() {
        return;
    }
    let engine = Relay::start();
    let c = app("fault-silent").await;
    let p = Proxy::start_with(&[&engine.socket_flag()], &[]).await;
    deploy_sleepy(&p, &c, &["--wake-timeout=2s"]).await;
    p.wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;

    engine.go_silent(true);
    let r = client().get(p.url("/held")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"), "{r:?}");
    assert_no_internal_detail(&r.text().await.unwrap(), &c.name);
    p.wait_for_log("the failed wake in the operator's log", |l| {
        l.contains("Failed to wake service")
    })
    .await;

    // The fault clears. The failed wake's clean-up (stopping what the wake may have
    // started) met the silent engine too and runs out its 30 s stop budget, then finds
    // nothing ready and leaves the service asleep; meanwhile requests fail fast with a
    // 503 (and keep coming: traffic must not keep it from recovering). Then a request
    // wakes it.
    engine.go_silent(false);
    poll_until(
        "a request answered after the engine came back",
        Duration::from_secs(120),
        || async {
            let r = client().get(p.url("/after")).send().await;
            let status = r
                .as_ref()
                .map(|r| r.status().as_u16())
                .map_err(|e| e.to_string());
            (status == Ok(200)).then_some(()).ok_or(status)
        },
    )
    .await;
    assert!(docker::is_running(&c.name));
    // Nothing held: the proxy let go of every connection it opened while the engine was
    // silent (the relay sees them closed), keeping at most its one pooled connection.
    poll_until(
        "the proxy to close what it opened to the silent engine",
        Duration::from_secs(30),
        || async {
            (engine.open_connections() <= 1)
                .then_some(())
                .ok_or(engine.open_connections())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_killed_mid_request_is_a_clean_502_and_the_next_request_wakes_it() {
    if !docker::require_docker() {
        return;
    }
    let c = app("fault-kill").await;
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    let p = Proxy::start_with_metrics(&[&socket], &[]).await;
    deploy_sleepy(&p, &c, &[]).await;
    let in_flight = "kamal_proxy_http_in_flight_requests{service=\"app\"}";

    let slow = tokio::spawn(client().get(p.url("/slow?ms=30000")).send());
    // The request first wakes the container: on a loaded machine (the suite runs the
    // other engine-fault tests beside this one) a start and its health check can take
    // more than 10 s.
    poll_until(
        "the slow request in flight",
        Duration::from_secs(45),
        || async { (p.metric(in_flight).await == Some(1.0)).then_some(()) },
    )
    .await;
    docker::kill(&c.name);

    let r = slow.await.unwrap().unwrap();
    assert_eq!(r.status(), 502);
    assert_no_internal_detail(&r.text().await.unwrap(), &c.name);
    // Nothing held: the request left the in-flight gauge, and the idle controller's count
    // with it, so the service falls asleep on its own timer.
    poll_until(
        "the in-flight gauge back to 0",
        Duration::from_secs(10),
        || async { (p.metric(in_flight).await == Some(0.0)).then_some(()) },
    )
    .await;
    p.wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;
    // The next request starts the killed container again and is answered.
    let r = client().get(p.url("/again")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(docker::is_running(&c.name));
}

/// busybox httpd that exits at once while `fault/exit` exists in the host directory
/// mounted at `/fault`: a container that dies as it wakes, for as long as the test wants.
fn httpd_that_exits_while(fault: &Path) -> TestContainer {
    let port = testkit::free_port();
    let script = format!(
        "if [ -e /fault/exit ]; then echo crashing >&2; exit 3; fi; \
         exec httpd -f -p 127.0.0.1:{port} -h /www"
    );
    let mount = format!("{}:/fault:ro", fault.display());
    let c = docker::run_container_with(
        "fault-exit",
        port,
        true,
        &["-v", &mount],
        &["/bin/sh", "-c", &script],
    );
    docker::wait_until_ready(&c).expect("httpd ready");
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_that_exits_as_it_wakes_answers_503_and_the_service_recovers() {
    if !docker::require_docker() {
        return;
    }
    let fault = tempfile::tempdir().unwrap();
    let c = httpd_that_exits_while(fault.path());
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    let p = Proxy::start_with(&[&socket], &[]).await;
    deploy_sleepy(&p, &c, &["--wake-timeout=3s"]).await;
    p.wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;

    std::fs::write(fault.path().join("exit"), b"").unwrap();
    let r = client().get(p.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"), "{r:?}");
    assert_no_internal_detail(&r.text().await.unwrap(), &c.name);
    p.wait_for_log("the failed wake in the operator's log", |l| {
        l.contains("Failed to wake service")
    })
    .await;

    // The fault clears: the container boots again, and so does the service.
    std::fs::remove_file(fault.path().join("exit")).unwrap();
    poll_until(
        "the app's own answer once the container boots",
        Duration::from_secs(30),
        || async {
            // busybox httpd has no `/`: its own 404 is the app answering.
            let r = client().get(p.url("/")).send().await;
            let status = r
                .as_ref()
                .map(|r| r.status().as_u16())
                .map_err(|e| e.to_string());
            (status == Ok(404)).then_some(()).ok_or(status)
        },
    )
    .await;
    assert!(docker::is_running(&c.name));
}
