//! Deploys: waiting for health, zero-downtime switches, draining, removal, and the `list`
//! output users read afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use testkit::{Proxy, backend::Backend, client, poll_until, send};
use tokio::time::Instant;

const FAST_HEALTH: [&str; 2] = ["--health-check-interval=100ms", "--health-check-timeout=1s"];

fn deploy_args<'a>(service: &'a str, target: &'a str, extra: &[&'a str]) -> Vec<String> {
    let mut args = vec![
        "deploy".to_string(),
        service.to_string(),
        format!("--target={target}"),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn unhealthy_target_fails_the_deploy_and_is_not_routed() {
    let sick = Backend::start("sick").await;
    sick.set_healthy(false);
    let proxy = Proxy::start().await;

    let started = Instant::now();
    let args = deploy_args(
        "app",
        &sick.target(),
        &["--deploy-timeout=1s", FAST_HEALTH[0]],
    );
    let stderr = proxy.fails(&strs(&args)).await;
    assert_eq!(
        stderr,
        "Error: target failed to become healthy within configured timeout (1s)\n"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "the deploy waited for the timeout"
    );
    assert!(
        sick.health_hits() >= 2,
        "the target was health checked repeatedly"
    );
    assert_eq!(proxy.get("", "/").await.status, 404);
    assert_eq!(proxy.list_rows().await.len(), 0);
    assert_eq!(sick.hits(), 0, "no request reached the unhealthy target");
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_redeploy_keeps_the_previous_target_serving() {
    let good = Backend::start("good").await;
    let sick = Backend::start("sick").await;
    sick.set_healthy(false);
    let proxy = Proxy::start().await;
    proxy
        .deploy("app", &good.target(), &["--host=app.test"])
        .await;
    let list_before = proxy.ok(&["list"]).await;
    let state_before = std::fs::read_to_string(proxy.state_file()).unwrap();

    let args = deploy_args(
        "app",
        &sick.target(),
        &[
            "--host=other.test",
            "--deploy-timeout=500ms",
            FAST_HEALTH[0],
        ],
    );
    let stderr = proxy.fails(&strs(&args)).await;
    assert_eq!(
        stderr,
        "Error: target failed to become healthy within configured timeout (500ms)\n"
    );
    let r = proxy.get("app.test", "/").await;
    assert_eq!((r.status, r.body.as_str()), (200, "good"));
    assert_eq!(
        proxy.get("other.test", "/").await.status,
        404,
        "new options not applied"
    );
    assert_eq!(proxy.ok(&["list"]).await, list_before);
    assert_eq!(
        std::fs::read_to_string(proxy.state_file()).unwrap(),
        state_before
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn force_skips_the_health_wait() {
    let sick = Backend::start("sick").await;
    sick.set_healthy(false);
    let proxy = Proxy::start().await;

    let args = deploy_args(
        "app",
        &sick.target(),
        &["--force", "--deploy-timeout=30s", FAST_HEALTH[0]],
    );
    // --force must not wait for health: a deploy that waited would fail (exit 1) when
    // the 30 s deploy timeout ran out, since the target never turns healthy here.
    proxy.ok(&strs(&args)).await;
    let rows = proxy.list_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][3], sick.target());

    // Installed, but a target that never passed a check receives no traffic.
    let r = proxy.get("", "/").await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(sick.hits(), 0);
    sick.set_healthy(true);
    poll_until(
        "the forced target serves once it turns healthy",
        Duration::from_secs(10),
        || async { proxy.get("", "/").await.body == "sick" },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn health_check_uses_the_configured_path() {
    let backend = Backend::start("app").await;
    backend.set_healthy(false); // `/up` answers 503 from now on
    let proxy = Proxy::start().await;

    let failing = deploy_args(
        "app",
        &backend.target(),
        &["--deploy-timeout=500ms", FAST_HEALTH[0]],
    );
    let stderr = proxy.fails(&strs(&failing)).await;
    assert!(stderr.contains("failed to become healthy"), "{stderr}");

    let bad_path = deploy_args(
        "app",
        &backend.target(),
        &[
            "--health-check-path=/status/500",
            "--deploy-timeout=500ms",
            FAST_HEALTH[0],
        ],
    );
    let stderr = proxy.fails(&strs(&bad_path)).await;
    assert!(stderr.contains("failed to become healthy"), "{stderr}");

    let hits_before = backend.hits();
    let good_path = deploy_args(
        "app",
        &backend.target(),
        &[
            "--health-check-path=/status/204",
            "--deploy-timeout=5s",
            FAST_HEALTH[0],
        ],
    );
    proxy.ok(&strs(&good_path)).await;
    assert!(
        backend.hits() > hits_before,
        "the probe went to /status/204"
    );
    assert_eq!(proxy.get("", "/").await.body, "app");
}

/// Sends requests back to back until `stop`, recording every outcome.
async fn request_loop(
    url: String,
    http: reqwest::Client,
    stop: Arc<AtomicBool>,
) -> Vec<Result<(u16, String), String>> {
    let mut outcomes = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let outcome = match send(&http, reqwest::Method::GET, &url, None).await {
            Ok(r) => Ok((r.status, r.body)),
            Err(e) => Err(e.to_string()),
        };
        outcomes.push(outcome);
    }
    outcomes
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_redeploys_under_load_lose_no_request() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &a.target(), &[]).await;

    let stop = Arc::new(AtomicBool::new(false));
    // One client reuses its connection across switches, the other opens a new one each time.
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let loops = [client(), fresh]
        .map(|http| tokio::spawn(request_loop(proxy.url("/"), http, stop.clone())));
    // Let traffic flow before the first switch.
    poll_until("traffic to flow to a", Duration::from_secs(5), || async {
        a.hits() >= 10
    })
    .await;

    for i in 0..20 {
        let target = if i % 2 == 0 { b.target() } else { a.target() };
        let args = deploy_args(
            "app",
            &target,
            &["--deploy-timeout=5s", "--drain-timeout=5s", FAST_HEALTH[0]],
        );
        proxy.ok(&strs(&args)).await;
        let rows = proxy.list_rows().await;
        assert_eq!(
            rows[0][3], target,
            "list shows the new target after deploy {i}"
        );
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::SeqCst);

    let mut total = 0;
    let mut seen = std::collections::BTreeMap::new();
    for handle in loops {
        for outcome in handle.await.unwrap() {
            total += 1;
            match outcome {
                Ok((200, body)) if body == "a" || body == "b" => {
                    *seen.entry(body).or_insert(0) += 1
                }
                other => panic!("request {total} failed during redeploys: {other:?}"),
            }
        }
    }
    assert!(
        total >= 40,
        "the clients kept requesting throughout ({total} requests)"
    );
    assert_eq!(seen.len(), 2, "both backends served: {seen:?}");
    // Deploy 20 (index 19) went back to `a`: it serves now.
    assert_eq!(proxy.get("", "/").await.body, "a");
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_request_survives_its_target_being_replaced() {
    let old = Backend::start("old").await;
    let new = Backend::start("new").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &old.target(), &[]).await;

    let url = proxy.url("/slow?ms=1500");
    let sent = Instant::now();
    let slow = tokio::spawn(async move { send(&client(), reqwest::Method::GET, &url, None).await });
    poll_until("old.hits() == 1", Duration::from_secs(5), || async {
        old.hits() == 1
    })
    .await;

    // Meanwhile new requests already go to the new target while the deploy drains.
    let deploying = {
        let args = deploy_args(
            "app",
            &new.target(),
            &["--drain-timeout=10s", FAST_HEALTH[0]],
        );
        proxy.spawn_cli(&strs(&args))
    };
    poll_until(
        "new requests go to the new target during the drain",
        Duration::from_secs(5),
        || async { proxy.get("", "/").await.body == "new" },
    )
    .await;
    assert!(
        !deploying.is_finished(),
        "deploy returns only after the old target drained"
    );

    let (code, stderr) = code_and_stderr(deploying.await.unwrap());
    assert_eq!(code, Some(0), "deploy failed: {stderr}");
    assert!(
        sent.elapsed() >= Duration::from_millis(1400),
        "deploy returned before the in-flight request finished"
    );
    let r = slow.await.unwrap().expect("slow request");
    assert_eq!((r.status, r.body.as_str()), (200, "slow 1500"));
}

/// Both kinds of client connection: a bodiless GET is served by the proxy's own HTTP/1
/// connection, whose task hears the drain's cut once for all its requests; a POST with a
/// body is handed to hyper's connection, where the request waits on its target's cut itself.
#[tokio::test(flavor = "multi_thread")]
async fn drain_timeout_cancels_a_request_that_is_too_slow() {
    let old = Backend::start("old").await;
    let new = Backend::start("new").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &old.target(), &[]).await;

    let url = proxy.url("/slow?ms=8000");
    let slow_get = tokio::spawn({
        let url = url.clone();
        async move { send(&client(), reqwest::Method::GET, &url, None).await }
    });
    let slow_post = tokio::spawn(async move {
        let r = client().post(&url).body("a body").send().await?;
        Ok::<_, reqwest::Error>(r.status().as_u16())
    });
    poll_until("old.hits() == 2", Duration::from_secs(5), || async {
        old.hits() == 2
    })
    .await;

    let args = deploy_args(
        "app",
        &new.target(),
        &["--drain-timeout=300ms", FAST_HEALTH[0]],
    );
    proxy.ok(&strs(&args)).await;

    // The drain timeout ended the drain, not the requests: they were cut off (504, and
    // the old target saw its callers go) instead of answered after their 8 s.
    let r = slow_get.await.unwrap().expect("the client gets an answer");
    assert_eq!(r.status, 504, "{r:?}");
    let posted = slow_post.await.unwrap().expect("the client gets an answer");
    assert_eq!(posted, 504, "the POST (hyper's connection) was not cut");
    poll_until(
        "the old target to see both slow requests abandoned",
        Duration::from_secs(10),
        || async { old.slow_cancelled() == 2 },
    )
    .await;
    assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
    assert_eq!(proxy.get("", "/").await.body, "new");
}

#[tokio::test(flavor = "multi_thread")]
async fn remove_and_rm_stop_routing() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let proxy = Proxy::start().await;
    proxy.deploy("one", &a.target(), &["--host=one.test"]).await;
    proxy.deploy("two", &b.target(), &["--host=two.test"]).await;

    assert_eq!(proxy.ok(&["remove", "one"]).await, "");
    assert_eq!(proxy.get("one.test", "/").await.status, 404);
    assert_eq!(proxy.get("two.test", "/").await.body, "b");
    let rows = proxy.list_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][0], "two");

    proxy.ok(&["rm", "two"]).await;
    assert_eq!(proxy.get("two.test", "/").await.status, 404);
    assert!(proxy.list_rows().await.is_empty());
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(proxy.state_file()).unwrap()).unwrap();
    assert_eq!(state, serde_json::json!([]), "{state}");

    assert_eq!(
        proxy.fails(&["remove", "one"]).await,
        "Error: service not found\n"
    );
}

/// One table cell as upstream prints it: styled text, padding, two spaces.
fn cell(style: &str, text: &str, width: usize) -> String {
    format!(
        "\x1b[{style}m{text}\x1b[0m{}  ",
        " ".repeat(width - text.len())
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn list_prints_upstreams_table() {
    let proxy = Proxy::start().await;
    let header = ["Service", "Host", "Path", "Target", "State", "TLS"];
    let header_line = |widths: [usize; 6]| -> String {
        let mut line: String = header
            .iter()
            .zip(widths)
            .map(|(h, w)| cell("3;94", h, w))
            .collect();
        line.push('\n');
        line
    };
    // No services: the header alone, each cell as wide as its text.
    assert_eq!(proxy.ok(&["list"]).await, header_line([7, 4, 4, 6, 5, 3]));

    // Unreachable targets with --force keep the output independent of ports.
    let force = ["--force", "--health-check-interval=10s"];
    let mut web = vec![
        "--host=example.com,www.example.com",
        "--read-target=web-ro:3000",
    ];
    web.extend(force);
    proxy.deploy("web", "web-1:3000,web-2:3000", &web).await;
    let mut api = vec!["--host=api.example.com", "--path-prefix=/v1"];
    api.extend(force);
    proxy.deploy("api", "api-1:3000", &api).await;
    proxy.deploy("worker", "worker:80", &force).await;
    proxy.ok(&["pause", "worker", "--drain-timeout=1s"]).await;

    let widths = [7, 27, 4, 33, 7, 3];
    let row = |cells: [&str; 6]| -> String {
        let mut line = String::new();
        for (i, (text, w)) in cells.iter().zip(widths).enumerate() {
            line.push_str(&cell(if i == 0 { "1;34" } else { "" }, text, w));
        }
        line.push('\n');
        line
    };
    let expected = [
        header_line(widths),
        row([
            "api",
            "api.example.com",
            "/v1",
            "api-1:3000",
            "running",
            "no",
        ]),
        row([
            "web",
            "example.com,www.example.com",
            "/",
            "web-1:3000,web-2:3000,web-ro:3000",
            "running",
            "no",
        ]),
        row(["worker", "*", "/", "worker:80", "paused", "no"]),
    ]
    .concat();
    let out = proxy.ok(&["list"]).await;
    assert_eq!(out, expected, "\n{out}\n{expected}");
    assert_eq!(proxy.ok(&["ls"]).await, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn list_json_describes_every_service() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &["--host=app.test", "--path-prefix=/api"],
        )
        .await;
    proxy
        .deploy(
            "bare",
            "bare-1:80",
            &["--force", "--health-check-interval=10s"],
        )
        .await;
    proxy.ok(&["stop", "bare", "--drain-timeout=1s"]).await;

    let v = proxy.list_json().await;
    let services = v["services"].as_object().expect("services object");
    assert_eq!(services.len(), 2, "{v}");
    let a = &services["app"];
    assert_eq!(a["host"], "app.test");
    assert_eq!(a["path"], "/api");
    assert_eq!(a["tls"], false);
    assert_eq!(a["target"], app.target());
    assert_eq!(a["state"], "running");
    assert_eq!(a["sleep_state"], "off", "no scale-to-zero");
    assert_eq!(a["sleep_containers"], serde_json::json!([]));
    let b = &services["bare"];
    assert_eq!(b["host"], "*");
    assert_eq!(b["path"], "/");
    assert_eq!(b["target"], "bare-1:80");
    assert_eq!(b["state"], "stopped");

    proxy.ok(&["rm", "bare"]).await;
    proxy.ok(&["rm", "app"]).await;
    assert_eq!(proxy.list_json().await, serde_json::json!({"services": {}}));
}

/// The exit code and stderr of a CLI call started with `spawn_cli`.
fn code_and_stderr(out: std::process::Output) -> (Option<i32>, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn deploy_waits_for_every_target_and_balances_across_them() {
    let one = Backend::start("one").await;
    let two = Backend::start("two").await;
    two.set_healthy(false);
    let proxy = Proxy::start().await;
    let targets = format!("{},{}", one.target(), two.target());

    let args = deploy_args("app", &targets, &["--deploy-timeout=500ms", FAST_HEALTH[0]]);
    let stderr = proxy.fails(&strs(&args)).await;
    assert_eq!(
        stderr,
        "Error: target failed to become healthy within configured timeout (500ms)\n"
    );
    // The rejected targets are no longer probed. The proxy's own prober is the clock: a
    // service of two other backends (a pool keeps being probed) deployed with the same
    // interval gets five probes of one, in which time the rejected target gets at most
    // the one that may have been in flight.
    let probes = two.health_hits();
    let (clock, clock2) = (
        Backend::start("clock").await,
        Backend::start("clock2").await,
    );
    let clock_targets = format!("{},{}", clock.target(), clock2.target());
    let args = deploy_args(
        "clock",
        &clock_targets,
        &["--host=clock.test", FAST_HEALTH[0]],
    );
    proxy.ok(&strs(&args)).await;
    let from = clock.health_hits();
    poll_until(
        "five probes of the clock backend",
        Duration::from_secs(10),
        || async { (clock.health_hits() >= from + 5).then_some(()) },
    )
    .await;
    assert!(
        two.health_hits() <= probes + 1,
        "probing continued after the failed deploy"
    );

    two.set_healthy(true);
    let args = deploy_args("app", &targets, &["--deploy-timeout=5s", FAST_HEALTH[0]]);
    proxy.ok(&strs(&args)).await;
    let mut bodies = std::collections::BTreeSet::new();
    for _ in 0..6 {
        bodies.insert(proxy.get("", "/").await.body);
    }
    assert_eq!(bodies.into_iter().collect::<Vec<_>>(), ["one", "two"]);
    assert_eq!(proxy.list_rows().await[0][3], targets);
}

#[tokio::test(flavor = "multi_thread")]
async fn remove_does_not_wait_for_in_flight_requests() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    let url = proxy.url("/slow?ms=2000");
    let slow = tokio::spawn(async move { send(&client(), reqwest::Method::GET, &url, None).await });
    poll_until("app.hits() == 1", Duration::from_secs(5), || async {
        app.hits() == 1
    })
    .await;

    proxy.ok(&["remove", "app"]).await;
    assert!(
        !slow.is_finished(),
        "remove returned at once, without draining"
    );
    assert_eq!(proxy.get("", "/").await.status, 404);
    let r = slow.await.unwrap().expect("in-flight request");
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "slow 2000"),
        "not cut off by remove"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_deploy_does_not_block_other_commands() {
    let sick = Backend::start("sick").await;
    sick.set_healthy(false);
    let other = Backend::start("other").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("other", &other.target(), &["--host=other.test"])
        .await;

    let slow_deploy = {
        let args = deploy_args(
            "slow",
            &sick.target(),
            &["--host=slow.test", "--deploy-timeout=4s"],
        );
        proxy.spawn_cli(&strs(&args))
    };
    poll_until("sick.health_hits() > 0", Duration::from_secs(5), || async {
        sick.health_hits() > 0
    })
    .await;

    // While it waits for health: list, another deploy and a pause all answer, and
    // finish before it does (commands queued behind it would end after it).
    assert_eq!(proxy.list_rows().await.len(), 1);
    proxy
        .deploy("third", &other.target(), &["--host=third.test"])
        .await;
    proxy.ok(&["pause", "other", "--drain-timeout=1s"]).await;
    proxy.ok(&["resume", "other"]).await;
    assert!(
        !slow_deploy.is_finished(),
        "the slow deploy is still waiting: commands were not held up"
    );
    assert_eq!(proxy.get("third.test", "/").await.body, "other");

    let (code, stderr) = code_and_stderr(slow_deploy.await.unwrap());
    assert_eq!(code, Some(1));
    assert!(stderr.contains("failed to become healthy"), "{stderr}");
    assert_eq!(proxy.get("slow.test", "/").await.status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn health_check_follows_redirects_like_upstream() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    // Go's HTTP client follows redirects: `/redirect/up` → 302 → `/up` → 200 is healthy.
    let args = deploy_args(
        "app",
        &app.target(),
        &[
            "--health-check-path=/redirect/up",
            "--deploy-timeout=2s",
            FAST_HEALTH[0],
        ],
    );
    proxy.ok(&strs(&args)).await;
    assert_eq!(proxy.get("", "/").await.body, "app");

    // A redirect to a failing page is a failure.
    app.set_healthy(false);
    let args = deploy_args(
        "app",
        &app.target(),
        &[
            "--health-check-path=/redirect/up",
            "--deploy-timeout=500ms",
            FAST_HEALTH[0],
        ],
    );
    let stderr = proxy.fails(&strs(&args)).await;
    assert!(stderr.contains("failed to become healthy"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unhealthy_target_leaves_the_rotation_and_comes_back() {
    let one = Backend::start("one").await;
    let two = Backend::start("two").await;
    let proxy = Proxy::start().await;
    let targets = format!("{},{}", one.target(), two.target());
    proxy.deploy("app", &targets, &FAST_HEALTH).await;

    two.set_healthy(false);
    poll_until(
        "the failing target was taken out of rotation",
        Duration::from_secs(10),
        || async {
            let mut bodies = Vec::new();
            for _ in 0..4 {
                bodies.push(proxy.get("", "/").await.body);
            }
            bodies.iter().all(|b| b == "one")
        },
    )
    .await;

    two.set_healthy(true);
    poll_until(
        "the recovered target serves again",
        Duration::from_secs(10),
        || async {
            let mut bodies = std::collections::BTreeSet::new();
            for _ in 0..4 {
                bodies.insert(proxy.get("", "/").await.body);
            }
            bodies.len() == 2
        },
    )
    .await;
}
