//! Scale-to-zero against the real Docker Engine: a service idle for `--sleep-after` has
//! its container stopped; the next request is held, the container starts, and the request
//! goes through. The app is the real test backend running inside a container.

use std::time::Duration;
use testkit::docker::{self, TestContainer};
use testkit::{Proxy, backend::fnv1a, client};
use tokio::time::Instant;

/// A proxy with scale-to-zero enabled against the engine the tests use.
async fn proxy() -> Proxy {
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    Proxy::start_with(&[&socket], &[]).await
}

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

async fn asleep(p: &Proxy, c: &TestContainer) {
    p.wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;
    assert!(
        !docker::is_running(&c.name),
        "container still running while sleeping"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sleeps_when_idle_and_twenty_concurrent_requests_wake_it_once() {
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-coalesce").await;
    let p = proxy().await;
    deploy_sleepy(&p, &c, &[]).await;
    asleep(&p, &c).await;
    assert!(p.ok(&["list"]).await.contains("sleeping"));

    let since = docker::now_unix();
    let http = client();
    let requests = (0..20).map(|i| {
        let http = http.clone();
        let url = p.url(&format!("/hello?{i}"));
        tokio::spawn(async move { http.get(url).send().await })
    });
    for r in futures_util::future::join_all(requests).await {
        let r = r.unwrap().expect("request");
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), "s2z-coalesce");
    }
    assert_eq!(
        docker::start_events_since(&c.name, since),
        1,
        "exactly one container start"
    );
    assert!(docker::is_running(&c.name));
    assert_eq!(p.state_of("app").await, "running");

    // And it falls asleep again once idle.
    asleep(&p, &c).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chunked_post_held_during_a_wake_arrives_byte_identical() {
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-post").await;
    let p = proxy().await;
    deploy_sleepy(&p, &c, &[]).await;
    asleep(&p, &c).await;

    let body: Vec<u8> = (0..1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let expected = format!("{:016x}", fnv1a(&body));
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(16 * 1024).map(|c| Ok(c.to_vec())).collect();
    let stream = futures_util::stream::iter(chunks);
    let response = client()
        .post(p.url("/echo"))
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200);
    let echo: serde_json::Value = response.json().await.unwrap();
    assert_eq!(
        echo["headers"]["transfer-encoding"], "chunked",
        "sent chunked upstream"
    );
    assert_eq!(echo["body_len"], 1024 * 1024);
    assert_eq!(echo["body_fnv"], expected.as_str());
}

#[tokio::test(flavor = "multi_thread")]
async fn health_checks_while_asleep_are_answered_without_a_start() {
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-health").await;
    let p = proxy().await;
    deploy_sleepy(&p, &c, &[]).await;
    asleep(&p, &c).await;

    let since = docker::now_unix();
    let http = client();
    for _ in 0..5 {
        let r = http.get(p.url("/up")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(docker::starts_before_marker(&c.name, since).await, 0);
    assert_eq!(p.state_of("app").await, "sleeping");
    assert!(!docker::is_running(&c.name));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_wake_answers_503_with_retry_after_and_no_internal_detail() {
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-gone").await;
    let p = proxy().await;
    deploy_sleepy(&p, &c, &[]).await;
    asleep(&p, &c).await;
    docker::remove(&c.name);

    let http = client();
    let r = http.get(p.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body = r.text().await.unwrap();
    assert!(body.contains("503"), "the 503 page");
    assert!(!body.contains(&c.name), "body names the container: {body}");
    assert!(!body.contains("docker"), "body mentions docker: {body}");
    assert!(!body.contains(".sock"), "body mentions a socket: {body}");

    // Health checks now report the truth.
    let r = http.get(p.url("/up")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("retry-after").is_none() || r.status() == 503);
    // The reason is in the operator's log.
    p.wait_for_log("Failed to wake service", |l| {
        l.contains("Failed to wake service") && l.contains(&c.name)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_while_asleep_keeps_it_asleep_until_a_request_comes() {
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-restart").await;
    let mut p = proxy().await;
    deploy_sleepy(&p, &c, &["--sleep-after=2s"]).await;
    asleep(&p, &c).await;
    let state = std::fs::read_to_string(p.state_file()).unwrap();
    assert!(state.contains("\"idle_state\":\"sleeping\""), "{state}");

    let since = docker::now_unix();
    p.restart().await;
    assert_eq!(p.state_of("app").await, "sleeping");
    // Restore runs before the server logs its start-up line, so a start it caused is
    // in the event stream before the marker.
    assert_eq!(
        docker::starts_before_marker(&c.name, since).await,
        0,
        "restart started a container"
    );
    assert!(!docker::is_running(&c.name));

    let r = client().get(p.url("/after-restart")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(docker::start_events_since(&c.name, since), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_open_websocket_keeps_the_service_awake() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-ws").await;
    let p = proxy().await;
    deploy_sleepy(&p, &c, &[]).await;

    let (mut ws, _) =
        tokio_tungstenite::connect_async(format!("ws://127.0.0.1:{}/ws", p.http_port))
            .await
            .expect("websocket through the proxy");
    ws.send(Message::text("first")).await.unwrap();
    assert_eq!(
        ws.next()
            .await
            .unwrap()
            .unwrap()
            .into_text()
            .unwrap()
            .as_str(),
        "first"
    );
    // The proxy's own idle timer as the clock: a second service with the same
    // --sleep-after, deployed after the socket went silent, falls asleep; the one whose
    // socket has been open (and silent) longer must not have.
    let other = app("s2z-ws-clock").await;
    let container = format!("--sleep-container={}", other.name);
    p.deploy(
        "clock",
        &format!("127.0.0.1:{}", other.port),
        &[
            "--sleep-after=1s",
            container.as_str(),
            "--health-check-interval=200ms",
            "--host=clock.test",
        ],
    )
    .await;
    p.wait_for_state("clock", "sleeping", Duration::from_secs(20))
        .await;
    assert_eq!(p.state_of("app").await, "running");
    assert!(docker::is_running(&c.name));
    ws.send(Message::text("still here")).await.unwrap();
    assert_eq!(
        ws.next()
            .await
            .unwrap()
            .unwrap()
            .into_text()
            .unwrap()
            .as_str(),
        "still here"
    );

    ws.close(None).await.unwrap();
    drop(ws);
    asleep(&p, &c).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deploy_refuses_containers_it_cannot_manage() {
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-refuse").await;
    let p = proxy().await;
    let target = format!("--target=127.0.0.1:{}", c.port);
    let err = p
        .fails(&["deploy", "app", &target, "--sleep-after=1s"])
        .await;
    assert!(err.contains("is an address, not a container"), "{err}");
    assert!(err.contains("--sleep-container"), "{err}");

    let err = p
        .fails(&[
            "deploy",
            "app",
            &target,
            "--sleep-after=1s",
            "--sleep-container=no-such-container-xyz",
        ])
        .await;
    assert!(
        err.contains("no container named \"no-such-container-xyz\""),
        "{err}"
    );
    assert!(err.contains("--sleep-container"), "{err}");
    assert!(
        !p.ok(&["list"]).await.contains("app"),
        "nothing was deployed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sleep_flags_are_validated_by_the_cli_and_the_server() {
    let plain = Proxy::start().await;
    let err = plain
        .fails(&[
            "deploy",
            "app",
            "--target=web:3000",
            "--sleep-after=1s",
            "--force",
        ])
        .await;
    assert!(
        err.contains("scale-to-zero requires the proxy to run with --docker-socket"),
        "{err}"
    );
    let err = plain
        .fails(&["deploy", "app", "--target=web:3000", "--sleep-after=-1s"])
        .await;
    assert!(
        err.contains("sleep-after and wake-timeout cannot be negative"),
        "{err}"
    );
    let err = plain
        .fails(&[
            "deploy",
            "app",
            "--target=web:3000",
            "--sleep-container=web",
        ])
        .await;
    assert!(
        err.contains("sleep-container requires sleep-after"),
        "{err}"
    );
    let err = plain
        .fails(&[
            "deploy",
            "app",
            "--target=web:3000",
            "--tls",
            "--tls-on-demand-url=/allow",
            "--sleep-after=1s",
        ])
        .await;
    assert!(
        err.contains("sleep-after cannot be used with a TLS on-demand URL"),
        "{err}"
    );
}

#[test]
fn a_bad_docker_socket_is_a_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.sock");
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    for (path, needle) in [(missing, "does not exist"), (file, "is not a unix socket")] {
        let out = std::process::Command::new(testkit::bin())
            .env("HOME", dir.path())
            .env("KAMAL_PROXY_SOCKET", dir.path().join("kp.sock"))
            .args([
                "run",
                "--http-port=0",
                &format!("--docker-socket={}", path.display()),
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("Error: ") && err.contains(needle), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wake_timeout_shorter_than_the_boot_answers_503_in_time() {
    if !docker::require_docker() {
        return;
    }
    let c = docker::app_container_ready("s2z-slowboot", Duration::from_secs(4), &[]).await;
    let p = proxy().await;
    deploy_sleepy(&p, &c, &["--wake-timeout=1s"]).await;
    asleep(&p, &c).await;

    let started = Instant::now();
    let r = client().get(p.url("/")).send().await.unwrap();
    let waited = started.elapsed();
    // Answered at the wake timeout, not after the 4 s boot (which would be a 200).
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    p.wait_for_log("the wake failing", |l| l.contains("Failed to wake service"))
        .await;
    assert!(
        waited >= Duration::from_millis(900),
        "gave up early: {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redeploy_while_asleep_leaves_a_service_that_serves() {
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-redeploy").await;
    let p = proxy().await;
    deploy_sleepy(&p, &c, &["--sleep-after=2s"]).await;
    asleep(&p, &c).await;
    deploy_sleepy(&p, &c, &["--sleep-after=2s"]).await;
    let r = client().get(p.url("/after-redeploy")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "s2z-redeploy");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rewrite_that_matches_the_health_path_does_not_wake_it() {
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-rewrite").await;
    let p = proxy().await;
    // The SPA catch-all that turned the Go fork's `/up` into a real, waking request.
    deploy_sleepy(&p, &c, &["--rewrite=/[^.]*=/index.html"]).await;
    asleep(&p, &c).await;

    let since = docker::now_unix();
    let r = client().get(p.url("/up")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(docker::starts_before_marker(&c.name, since).await, 0);
    assert_eq!(p.state_of("app").await, "sleeping");
}

/// Stock Kamal cannot send `--sleep-after`, but it can label the app's containers.
async fn labelled_app(prefix: &str, labels: &[&str]) -> TestContainer {
    let options: Vec<String> = labels.iter().map(|l| format!("--label={l}")).collect();
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    docker::app_container_ready(prefix, Duration::ZERO, &options).await
}

fn saved_options(p: &Proxy) -> serde_json::Value {
    let text = std::fs::read_to_string(p.state_file()).expect("state file");
    let state: serde_json::Value = serde_json::from_str(&text).expect("json");
    state[0]["options"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn container_labels_switch_sleep_on_when_the_deploy_leaves_it_unset() {
    if !docker::require_docker() {
        return;
    }
    let c = labelled_app(
        "s2z-labels",
        &["kamal-proxy.sleep-after=1s", "kamal-proxy.wake-timeout=20s"],
    )
    .await;
    let p = proxy().await;
    // Only which container to manage is given (the target is an address here); the
    // durations come from the container's labels.
    let container = format!("--sleep-container={}", c.name);
    p.deploy(
        "app",
        &format!("127.0.0.1:{}", c.port),
        &[&container, "--health-check-interval=200ms"],
    )
    .await;
    assert!(
        p.logs()
            .iter()
            .any(|l| l.contains("Sleep settings from container labels")
                && l.contains("kamal-proxy.sleep-after=1s")),
        "{:#?}",
        p.logs()
    );
    let options = saved_options(&p);
    assert_eq!(options["sleep_after"], 1_000_000_000i64);
    assert_eq!(options["wake_timeout"], 20_000_000_000i64);

    asleep(&p, &c).await;
    let described = &p.list_json().await["services"]["app"];
    assert_eq!(described["sleep_state"], "sleeping");
    assert_eq!(described["sleep_containers"], serde_json::json!([c.name]));

    let since = docker::now_unix();
    let r = client().get(p.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "s2z-labels");
    assert_eq!(docker::start_events_since(&c.name, since), 1);
    assert_eq!(
        p.list_json().await["services"]["app"]["sleep_state"],
        "active"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flag_wins_over_its_label_and_no_flag_nor_label_means_no_sleep() {
    if !docker::require_docker() {
        return;
    }
    let c = labelled_app("s2z-flagwins", &["kamal-proxy.sleep-after=1s"]).await;
    let p = proxy().await;
    let container = format!("--sleep-container={}", c.name);
    let target = format!("127.0.0.1:{}", c.port);
    p.deploy("app", &target, &[&container, "--sleep-after=1h"])
        .await;
    assert_eq!(saved_options(&p)["sleep_after"], 3_600_000_000_000i64);
    assert_eq!(
        p.list_json().await["services"]["app"]["sleep_state"],
        "active"
    );

    // A redeploy that names no container to manage and whose target is no container:
    // nothing carries sleep settings any more, so sleep is off.
    p.deploy("app", &target, &[]).await;
    assert!(saved_options(&p).get("sleep_after").is_none());
    let described = &p.list_json().await["services"]["app"];
    assert_eq!(described["sleep_state"], "off");
    assert_eq!(described["sleep_containers"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_label_refuses_the_deploy_as_an_invalid_flag_would() {
    if !docker::require_docker() {
        return;
    }
    let c = labelled_app("s2z-badlabel", &["kamal-proxy.sleep-after=300"]).await;
    let p = proxy().await;
    let container = format!("--sleep-container={}", c.name);
    let target = format!("--target=127.0.0.1:{}", c.port);
    let err = p.fails(&["deploy", "app", &target, &container]).await;
    assert_eq!(
        err,
        format!(
            "Error: invalid label kamal-proxy.sleep-after=\"300\" on container \"{}\": time: missing unit in duration \"300\"\n",
            c.name
        )
    );
    assert!(p.list_rows().await.is_empty(), "nothing deployed");
    assert!(docker::is_running(&c.name), "nothing stopped");

    // A label that parses but breaks a rule gets the flag's message.
    let c = labelled_app("s2z-neglabel", &["kamal-proxy.sleep-after=-5s"]).await;
    let container = format!("--sleep-container={}", c.name);
    let target = format!("--target=127.0.0.1:{}", c.port);
    let err = p.fails(&["deploy", "app", &target, &container]).await;
    assert_eq!(
        err,
        "Error: service options invalid: sleep-after and wake-timeout cannot be negative\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_redeploy_leaves_a_sleeping_service_asleep() {
    if !docker::require_docker() {
        return;
    }
    let c = app("s2z-refused").await;
    let p = proxy().await;
    let other = testkit::backend::Backend::start("other").await;
    p.deploy("other", &other.target(), &["--host=taken.test"])
        .await;
    deploy_sleepy(&p, &c, &["--sleep-after=2s", "--host=app.test"]).await;
    asleep(&p, &c).await;

    // Every refusal comes before the wake a redeploy of a sleeping service needs: had the
    // wake come first, the container would be running when the refusal is returned.
    let since = docker::now_unix();
    let target = format!("127.0.0.1:{}", c.port);
    let container = format!("--sleep-container={}", c.name);
    let conflict = p
        .fails(&[
            "deploy",
            "app",
            "--target",
            &target,
            "--host=taken.test",
            "--sleep-after=2s",
            &container,
        ])
        .await;
    assert!(
        conflict.contains("host settings conflict with another service"),
        "{conflict}"
    );
    let bad_config = p
        .fails(&[
            "deploy",
            "app",
            "--target",
            &target,
            "--host=app.test",
            "--sleep-after=2s",
            &container,
            "--tls",
            "--tls-certificate-path=/nonexistent.pem",
            "--tls-private-key-path=/nonexistent.key",
        ])
        .await;
    assert!(
        bad_config.contains("unable to load certificate"),
        "{bad_config}"
    );

    assert_eq!(p.state_of("app").await, "sleeping");
    assert!(!docker::is_running(&c.name));
    assert_eq!(docker::start_events_since(&c.name, since), 0);
}
