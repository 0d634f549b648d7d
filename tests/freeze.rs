//! The freeze tier against the real Docker Engine: a service idle for `--freeze-after` has
//! its container paused (cgroup freezer), the next request thaws it and goes through
//! intact; idle for `--sleep-after` it is stopped. The app is the real test backend in a
//! container.

use std::time::Duration;
use testkit::docker::{self, TestContainer};
use testkit::{Proxy, backend::fnv1a, client};

async fn proxy() -> Proxy {
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    Proxy::start_with(&[&socket], &[]).await
}

fn app(prefix: &str) -> TestContainer {
    let c = docker::run_app_container(prefix, Duration::ZERO);
    docker::wait_until_ready(&c).expect("app container ready");
    c
}

async fn deploy_freezing(p: &Proxy, c: &TestContainer, extra: &[&str]) {
    let target = format!("127.0.0.1:{}", c.port);
    let container = format!("--sleep-container={}", c.name);
    let mut flags = vec![
        "--freeze-after=1s",
        container.as_str(),
        "--health-check-interval=200ms",
    ];
    flags.extend_from_slice(extra);
    p.deploy("app", &target, &flags).await;
}

async fn frozen(p: &Proxy, c: &TestContainer) {
    p.wait_for_state("app", "frozen", Duration::from_secs(20))
        .await;
    assert_eq!(docker::status(&c.name), "paused", "frozen means paused");
}

/// 1 MiB, chunked, in 16 KiB pieces: (the body as a stream, its FNV-1a hash).
fn chunked_body() -> (reqwest::Body, String) {
    let body: Vec<u8> = (0..1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    let hash = format!("{:016x}", fnv1a(&body));
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(16 * 1024).map(|c| Ok(c.to_vec())).collect();
    (
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)),
        hash,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_service_thaws_for_a_chunked_post_that_arrives_intact() {
    if !docker::require_docker() {
        return;
    }
    let c = app("frz-post");
    let p = proxy().await;
    let since = docker::now_precise();
    deploy_freezing(&p, &c, &["--sleep-after=1h"]).await;
    frozen(&p, &c).await;
    let listed = &p.list_json().await["services"]["app"];
    assert_eq!(listed["sleep_state"], "frozen");
    assert!(listed["asleep_seconds"].is_u64(), "{listed}");
    // The table says for how long, in Go's duration style (`frozen 3s`).
    let rows = p.list_rows().await;
    let state = rows
        .iter()
        .find(|row| row[0] == "app")
        .and_then(|row| row.iter().find_map(|cell| cell.strip_prefix("frozen ")))
        .unwrap_or_else(|| panic!("no `frozen <duration>` cell: {rows:?}"));
    assert!(
        state.ends_with('s')
            && state[..state.len() - 1]
                .bytes()
                .all(|b| b.is_ascii_digit() || b == b'm' || b == b'h'),
        "not a Go duration: {state:?}"
    );
    let state = std::fs::read_to_string(p.state_file()).unwrap();
    assert!(state.contains("\"idle_state\":\"frozen\""), "{state}");
    // Health checks are answered while frozen, without a thaw.
    let r = client().get(p.url("/up")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(docker::status(&c.name), "paused");

    let (body, hash) = chunked_body();
    let response = client()
        .post(p.url("/echo"))
        .body(body)
        .send()
        .await
        .expect("post");
    assert_eq!(response.status(), 200);
    let echo: serde_json::Value = response.json().await.unwrap();
    assert_eq!(echo["headers"]["transfer-encoding"], "chunked");
    assert_eq!(echo["body_len"], 1024 * 1024);
    assert_eq!(echo["body_fnv"], hash.as_str());
    assert_eq!(docker::status(&c.name), "running");
    assert_eq!(p.state_of("app").await, "running");

    // The engine's own record: paused once, thawed once, never stopped nor restarted.
    let actions = docker::actions_before_marker(&c.name, &since).await;
    assert_eq!(actions, ["pause", "unpause"]);
    p.wait_for_log("the thaw", |l| {
        l.contains("Service awake") && l.contains("\"from\":\"frozen\"")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn frozen_first_then_stopped_and_a_request_starts_it() {
    if !docker::require_docker() {
        return;
    }
    let c = app("frz-tiers");
    let p = proxy().await;
    deploy_freezing(&p, &c, &["--sleep-after=3s"]).await;
    frozen(&p, &c).await;
    p.wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;
    assert_eq!(docker::status(&c.name), "exited");

    let since = docker::now_unix();
    let r = client().get(p.url("/after-sleep")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "frz-tiers");
    assert_eq!(docker::start_events_since(&c.name, since), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_while_frozen_restores_frozen_and_wakes_whatever_it_finds() {
    if !docker::require_docker() {
        return;
    }
    let c = app("frz-restart");
    let mut p = proxy().await;
    deploy_freezing(&p, &c, &["--sleep-after=1h"]).await;
    frozen(&p, &c).await;

    // Still frozen: restored as frozen, nothing touched, a request thaws it.
    let since = docker::now_precise();
    p.restart().await;
    assert_eq!(p.state_of("app").await, "frozen");
    assert!(
        docker::actions_before_marker(&c.name, &since)
            .await
            .is_empty(),
        "the restart touched the container"
    );
    let r = client().get(p.url("/thawed")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    frozen(&p, &c).await;

    // Stopped meanwhile (a daemon or host restart stops frozen containers): started.
    p.restart().await;
    docker::run_docker(&["stop", &c.name]);
    assert_eq!(p.state_of("app").await, "frozen");
    let r = client().get(p.url("/started")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{:#?}", p.logs());
    assert_eq!(r.text().await.unwrap(), "frz-restart");
    frozen(&p, &c).await;

    // Thawed by hand meanwhile: the wake finds it running and just serves.
    p.restart().await;
    docker::run_docker(&["unpause", &c.name]);
    let r = client().get(p.url("/running")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(p.state_of("app").await, "running");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_thaw_answers_503_without_detail_like_a_failed_wake() {
    if !docker::require_docker() {
        return;
    }
    let c = app("frz-gone");
    let p = proxy().await;
    deploy_freezing(&p, &c, &["--sleep-after=1h"]).await;
    frozen(&p, &c).await;
    docker::remove(&c.name);

    let r = client().get(p.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body = r.text().await.unwrap();
    assert!(!body.contains(&c.name), "body names the container: {body}");
    assert!(!body.contains("docker"), "{body}");
    let r = client().get(p.url("/up")).send().await.unwrap();
    assert_eq!(r.status(), 503, "health checks report the failed wake");
    p.wait_for_log("the failed thaw", |l| {
        l.contains("Failed to wake service") && l.contains(&c.name)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn freeze_flags_are_validated() {
    let plain = Proxy::start().await;
    let err = plain
        .fails(&[
            "deploy",
            "app",
            "--target=web:3000",
            "--freeze-after=1m",
            "--sleep-after=1m",
        ])
        .await;
    assert_eq!(
        err,
        "Error: service options invalid: freeze-after (1m0s) must be shorter than sleep-after (1m0s)\n"
    );
    let err = plain
        .fails(&["deploy", "app", "--target=web:3000", "--freeze-after=-1s"])
        .await;
    assert_eq!(
        err,
        "Error: service options invalid: freeze-after cannot be negative\n"
    );
    let err = plain
        .fails(&[
            "deploy",
            "app",
            "--target=web:3000",
            "--freeze-after=1s",
            "--force",
        ])
        .await;
    assert!(
        err.contains("scale-to-zero requires the proxy to run with --docker-socket"),
        "{err}"
    );
    assert!(plain.list_rows().await.is_empty(), "nothing deployed");
}
