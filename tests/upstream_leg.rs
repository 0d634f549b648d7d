//! The upstream leg (issue 13 §1, fork F18–F21), through the real binary: attempts and the
//! hold for a healthy target (`--target-try-duration`), each target's connection pool
//! (`--target-max-conns` and friends) and per-path timeouts (`--path-timeout`,
//! `--path-request-timeout`).
//!
//! Where a fault must be exact the app is `testkit::flaky`: a raw-socket backend that stops
//! listening on its port and starts again, holds requests on demand and reports what
//! reached it on which connection.

use futures_util::future::join_all;
use serde_json::{Value, json};
use std::time::Duration;
use testkit::flaky::{Blackhole, FlakyBackend};
use testkit::{Proxy, Reply, client, send};

async fn get(proxy: &Proxy, path: &str) -> Reply {
    send(&client(), reqwest::Method::GET, &proxy.url(path), None)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// `method path` with `X-Seq: seq` (and a small body for a POST); the status and body.
async fn request(proxy: &Proxy, method: reqwest::Method, path: &str, seq: &str) -> (u16, String) {
    let mut req = client()
        .request(method.clone(), proxy.url(path))
        .header("x-seq", seq);
    if method == reqwest::Method::POST {
        req = req.body("order=1");
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

/// The access-log line of the request tagged `seq` (the app echoes it; the proxy logs the
/// path), waiting for it: the line is written when the exchange ends.
async fn access_line(proxy: &Proxy, path: &str, status: u16) -> Value {
    let line = proxy
        .wait_for_log(&format!("the access line of {path} ({status})"), |l| {
            serde_json::from_str::<Value>(l)
                .is_ok_and(|v| v["msg"] == "Request" && v["path"] == path && v["status"] == status)
        })
        .await;
    serde_json::from_str(&line).expect("JSON")
}

fn log_lines(proxy: &Proxy, msg: &str) -> Vec<Value> {
    proxy
        .logs()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["msg"] == msg)
        .collect()
}

// === --target-try-duration: attempts and the hold (fork F18) ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_get_is_retried_while_its_target_restarts_and_a_post_is_not_resent() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start_with(&["--debug"], &[]).await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &["--target-try-duration=30s", "--target-try-interval=20ms"],
        )
        .await;
    // A warm connection in the pool, which the blip kills with the app.
    assert_eq!(
        request(&proxy, reqwest::Method::GET, "/warm", "w").await.0,
        200
    );

    app.refuse().await;
    let held = tokio::spawn({
        let url = proxy.url("/orders");
        async move {
            let resp = client()
                .get(url)
                .header("x-seq", "g1")
                .send()
                .await
                .expect("GET");
            (
                resp.status().as_u16(),
                resp.text().await.unwrap_or_default(),
            )
        }
    });
    proxy
        .wait_for_log("the GET being retried", |l| {
            l.contains("Retrying request") && l.contains("\"path\":\"/orders\"")
        })
        .await;
    // The POST meets the same refused connection while the GET is still held: it is not
    // one of the fork's replayable requests, so it is answered at once, never re-sent.
    let (status, _) = request(&proxy, reqwest::Method::POST, "/orders", "p1").await;
    assert_eq!(status, 502);
    assert!(
        !held.is_finished(),
        "the GET waits for the app to come back"
    );

    app.serve().await;
    let (status, body) = held.await.expect("GET task");
    assert_eq!((status, body.as_str()), (200, "GET /orders g1"));

    // The app saw the GET once and never the POST.
    let seen: Vec<(String, String)> = app
        .requests()
        .into_iter()
        .map(|s| (s.method, s.seq))
        .collect();
    assert_eq!(
        seen,
        [("GET".into(), "w".into()), ("GET".into(), "g1".into())]
    );
    // The access log says the GET was retried; the POST's line has no retries.
    let get_line = access_line(&proxy, "/orders", 200).await;
    assert!(get_line["retries"].as_u64() >= Some(1), "{get_line}");
    let post_line = access_line(&proxy, "/orders", 502).await;
    assert_eq!(post_line["method"], "POST");
    assert!(post_line.get("retries").is_none(), "{post_line}");
    poll_log_count(&proxy, "Error while proxying", 1).await;
    let errors = log_lines(&proxy, "Error while proxying");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("client error (Connect)")),
        "{}",
        errors[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_waits_for_a_target_to_become_healthy() {
    let app = testkit::backend::Backend::start("app").await;
    app.set_healthy(false);
    let proxy = Proxy::start_with(&["--debug"], &[]).await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &[
                "--force",
                "--target-try-duration=60s",
                "--health-check-interval=100ms",
            ],
        )
        .await;
    let held = tokio::spawn({
        let url = proxy.url("/page");
        async move {
            let resp = client().get(url).send().await.expect("GET");
            (
                resp.status().as_u16(),
                resp.text().await.unwrap_or_default(),
            )
        }
    });
    proxy
        .wait_for_log("the request waiting for a healthy target", |l| {
            l.contains("Waiting for a healthy target")
        })
        .await;
    assert_eq!(app.hits(), 0);
    app.set_healthy(true);
    let (status, body) = held.await.expect("GET task");
    assert_eq!((status, body.as_str()), (200, "app"));
    assert_eq!(app.hits(), 1);
    let line = access_line(&proxy, "/page", 200).await;
    assert!(line["retries"].as_u64() >= Some(1), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_try_duration_the_client_gets_503_or_502_and_timeouts_are_never_retried() {
    // No healthy target within the duration: 503, after trying.
    let sick = testkit::backend::Backend::start("sick").await;
    sick.set_healthy(false);
    let proxy = Proxy::start().await;
    let short = ["--force", "--target-try-duration=300ms"];
    proxy.deploy("sick", &sick.target(), &short).await;
    let reply = get(&proxy, "/").await;
    assert_eq!(reply.status, 503);
    let line = access_line(&proxy, "/", 503).await;
    assert!(line["retries"].as_u64() >= Some(1), "{line}");
    assert_eq!(sick.hits(), 0);
    proxy.ok(&["remove", "sick"]).await;

    // A target that refuses connections for the whole duration: the error it gave, 502.
    let down = FlakyBackend::start().await;
    proxy
        .deploy("down", &down.target(), &["--target-try-duration=300ms"])
        .await;
    down.refuse().await;
    assert_eq!(get(&proxy, "/down").await.status, 502);
    let line = access_line(&proxy, "/down", 502).await;
    assert!(line["retries"].as_u64() >= Some(1), "{line}");

    // A target that took the request and did not answer in time may have acted on it:
    // 504 on the first attempt, never sent again.
    down.serve().await;
    proxy
        .deploy(
            "down",
            &down.target(),
            &["--target-try-duration=30s", "--target-timeout=100ms"],
        )
        .await;
    assert_eq!(get(&proxy, "/slow?ms=1000").await.status, 504);
    let line = access_line(&proxy, "/slow", 504).await;
    assert!(line.get("retries").is_none(), "{line}");
    let slow: Vec<_> = down
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/slow"))
        .collect();
    assert_eq!(slow.len(), 1, "{slow:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_try_duration_a_refused_get_is_answered_at_once() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    app.refuse().await;
    assert_eq!(get(&proxy, "/x").await.status, 502);
    let line = access_line(&proxy, "/x", 502).await;
    assert!(line.get("retries").is_none(), "{line}");
}

// === The connection pool (fork F19) ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_max_conns_bounds_the_connections_the_target_sees() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start_with(&["--debug"], &[]).await;
    proxy
        .deploy("app", &app.target(), &["--target-max-conns=2"])
        .await;
    app.hold(true);
    let requests: Vec<_> = (0..6)
        .map(|i| {
            let url = proxy.url("/work");
            tokio::spawn(async move {
                let resp = client()
                    .get(url)
                    .header("x-seq", format!("r{i}"))
                    .send()
                    .await
                    .expect("GET");
                resp.status().as_u16()
            })
        })
        .collect();
    // Two reach the app; the other four queue in the proxy for a connection.
    app.wait_held(2).await;
    poll_log_count(&proxy, "Waiting for a connection to the target", 4).await;
    assert_eq!(app.app_connections(), 2);
    app.release();
    for r in requests {
        assert_eq!(r.await.expect("task"), 200);
    }
    assert_eq!(app.requests().len(), 6);
    // All six went over the same two connections, never more at once.
    assert_eq!(app.app_connections(), 2);
    assert_eq!(app.max_open_connections(), 2);
}

/// `--target-timeout` is the target's time to answer once it has the request: a request
/// that waits at `--target-max-conns` longer than that, with a body or without (hyper's
/// connections and ours), is still answered once a connection comes free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_wait_for_a_connection_at_the_limit_is_not_the_target_s_time_to_answer() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start_with(&["--debug"], &[]).await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &[
                "--target-max-conns=1",
                "--target-timeout=300ms",
                "--path-timeout=/held=30s",
            ],
        )
        .await;
    app.hold(true);
    let send = |method: reqwest::Method, path: &str, body: &str| {
        let request = client()
            .request(method, proxy.url(path))
            .body(body.to_owned());
        tokio::spawn(async move { request.send().await.expect("request").status().as_u16() })
    };
    let first = send(reqwest::Method::GET, "/held", "");
    app.wait_held(1).await;
    let get = send(reqwest::Method::GET, "/queued", "");
    let post = send(reqwest::Method::POST, "/queued", "hello");
    poll_log_count(&proxy, "Waiting for a connection to the target", 2).await;
    // Both wait for the one connection for twice the target timeout.
    tokio::time::sleep(Duration::from_millis(600)).await;
    app.release();
    for (name, task) in [("first", first), ("get", get), ("post", post)] {
        let got = task.await;
        assert!(
            matches!(got, Ok(200)),
            "{name}: {got:?}\n{}",
            proxy.logs().join("\n")
        );
    }
    assert_eq!(app.requests().len(), 3);
}

async fn poll_log_count(proxy: &Proxy, msg: &str, n: usize) {
    testkit::poll_until(
        &format!("{n} log lines {msg:?}"),
        Duration::from_secs(20),
        || {
            let count = log_lines(proxy, msg).len();
            std::future::ready((count >= n).then_some(()).ok_or(count))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_keep_alives_each_request_has_a_connection_of_its_own() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    // One client connection: it is served by one worker thread, whose idle upstream
    // connection each request reuses (each worker keeps its own, src/worker.rs).
    let mut one = OneConnection::open(&proxy).await;
    for i in 0..5 {
        assert_eq!(one.get("/a", &format!("k{i}"), 0).await, 200);
    }
    assert_eq!(app.app_connections(), 1, "kept alive by default");

    proxy
        .deploy("app", &app.target(), &["--target-disable-keep-alives"])
        .await;
    for i in 0..5 {
        let seq = format!("c{i}");
        assert_eq!(
            request(&proxy, reqwest::Method::GET, "/b", &seq).await.0,
            200
        );
    }
    let closing: Vec<_> = app
        .requests()
        .into_iter()
        .filter(|r| r.path == "/b")
        .collect();
    assert_eq!(closing.len(), 5);
    let mut conns: Vec<usize> = closing.iter().map(|r| r.conn).collect();
    conns.dedup();
    assert_eq!(conns.len(), 5, "one connection per request: {closing:?}");
    assert!(
        closing.iter().all(|r| r.connection == "close"),
        "{closing:?}"
    );
    assert_eq!(app.app_connections(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_are_closed_after_the_idle_timeout_and_beyond_the_idle_limit() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &["--target-idle-conn-timeout=1s", "--target-max-idle-conns=1"],
        )
        .await;
    // Three at once: three connections; one stays idle, two are closed at once.
    app.hold(true);
    let requests: Vec<_> = (0..3)
        .map(|_| tokio::spawn(get_status(proxy.url("/a"))))
        .collect();
    app.wait_held(3).await;
    assert_eq!(app.open_connections(), 3);
    app.release();
    for r in requests {
        assert_eq!(r.await.expect("task"), 200);
    }
    app.wait_open(1).await;
    // The idle one is closed by the proxy after the idle timeout.
    app.wait_open(0).await;
    assert_eq!(get(&proxy, "/b").await.status, 200);
    assert_eq!(
        app.app_connections(),
        4,
        "a new connection after the idle one closed"
    );
}

async fn get_status(url: String) -> u16 {
    client()
        .get(url)
        .send()
        .await
        .expect("GET")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_target_that_never_accepts_gets_504_after_the_dial_timeout_and_no_retry() {
    let hole = Blackhole::start().await;
    // Health checks go to a real app on another port: the target itself never answers.
    let health = testkit::backend::Backend::start("health").await;
    let proxy = Proxy::start().await;
    let port = format!("--health-check-port={}", health.addr.port());
    proxy
        .deploy(
            "app",
            &hole.target(),
            &[
                &port,
                "--target-dial-timeout=200ms",
                "--target-try-duration=30s",
            ],
        )
        .await;
    assert_eq!(get(&proxy, "/").await.status, 504);
    let line = proxy
        .wait_for_log("the dial timeout", |l| {
            l.contains("Timed out connecting to target")
        })
        .await;
    let line: Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(line["dial_timeout"], "200ms", "{line}");
    assert_eq!(line["target"], hole.target(), "{line}");
    // A timeout does not prove the target did nothing: no second attempt.
    let access = access_line(&proxy, "/", 504).await;
    assert!(access.get("retries").is_none(), "{access}");
}

// === Per-path timeouts (fork F20, F21) ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_longest_path_timeout_prefix_decides_by_whole_segments() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &[
                "--target-timeout=200ms",
                "--path-timeout=/api=30s,/api/slow=200ms",
                "--path-timeout=/api/slow/none=0",
            ],
        )
        .await;
    let cases = [
        ("/other?ms=1000", 504),           // no prefix: --target-timeout
        ("/api/other?ms=1000", 200),       // /api: 30s
        ("/api/slow/x?ms=1000", 504),      // /api/slow, the longer prefix: 200ms
        ("/api/slowx?ms=1000", 200),       // not under /api/slow: /api's 30s
        ("/api/slow/none/x?ms=1000", 200), // 0: no timeout at all
        ("/apix?ms=1000", 504),            // not under /api: --target-timeout
    ];
    let replies = join_all(cases.iter().map(|(path, _)| get(&proxy, path))).await;
    for ((path, want), reply) in cases.iter().zip(replies) {
        assert_eq!(reply.status, *want, "{path}: {}", reply.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn path_request_timeouts_bound_the_whole_request_by_prefix() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &[
                "--request-timeout=200ms",
                "--path-request-timeout=/reports=0",
                "--path-request-timeout=/api=30s",
            ],
        )
        .await;
    let cases = [
        ("/x?ms=1000", 504),
        ("/reports/x?ms=1000", 200),
        ("/api/x?ms=1000", 200),
        ("/apix?ms=1000", 504),
    ];
    let replies = join_all(cases.iter().map(|(path, _)| get(&proxy, path))).await;
    for ((path, want), reply) in cases.iter().zip(replies) {
        assert_eq!(reply.status, *want, "{path}: {}", reply.body);
    }
    poll_log_count(&proxy, "Request deadline exceeded", 2).await;
    assert_eq!(log_lines(&proxy, "Request deadline exceeded").len(), 2);
}

// === State, the command line, the control socket ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_settings_are_saved_under_the_forks_keys_and_survive_a_restart() {
    let app = FlakyBackend::start().await;
    let mut proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &[
                "--path-timeout=\"/api/slow=200ms\"",
                "--path-request-timeout=/reports=0",
                "--target-try-duration=5s",
                "--target-try-interval=100ms",
                "--target-max-conns=8",
                "--target-max-idle-conns=4",
                "--target-idle-conn-timeout=30s",
                "--target-dial-timeout=2s",
                "--target-disable-keep-alives=true",
            ],
        )
        .await;
    let state: Value =
        serde_json::from_slice(&std::fs::read(proxy.state_file()).expect("state")).expect("JSON");
    testkit::go_state::check_go_decodable(&state).expect("Go reads the file");
    let service = &state[0];
    assert_eq!(service["options"]["target_try_duration"], 5_000_000_000i64);
    assert_eq!(service["options"]["target_try_interval"], 100_000_000);
    let t = &service["target_options"];
    assert_eq!(
        (
            &t["max_conns_per_host"],
            &t["max_idle_conns_per_host"],
            &t["idle_conn_timeout"],
            &t["dial_timeout"],
            &t["disable_keep_alives"],
        ),
        (
            &json!(8),
            &json!(4),
            &json!(30_000_000_000i64),
            &json!(2_000_000_000),
            &json!(true)
        )
    );
    assert_eq!(
        t["path_response_timeouts"],
        json!([{"path_prefix": "/api/slow", "timeout": 200_000_000}])
    );
    assert_eq!(
        t["path_request_timeouts"],
        json!([{"path_prefix": "/reports", "timeout": 0}])
    );

    proxy.terminate().await;
    proxy.respawn().await;
    assert_eq!(get(&proxy, "/api/slow/x?ms=1000").await.status, 504);
    assert_eq!(get(&proxy, "/api/x").await.status, 200);
    let after: Value =
        serde_json::from_slice(&std::fs::read(proxy.state_file()).expect("state")).expect("JSON");
    assert_eq!(after, state, "restored and saved again unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_values_are_refused_by_the_cli_and_the_server_and_change_nothing() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start().await;
    let target = format!("--target={}", app.target());
    for (flag, message) in [
        (
            "--path-timeout=/api=5",
            "Error: invalid --path-timeout duration for '/api': 5",
        ),
        (
            "--path-request-timeout=/api=-1s",
            "Error: invalid --path-request-timeout duration for '/api': -1s",
        ),
        (
            "--path-timeout=/api",
            "Error: invalid argument \"/api\" for \"--path-timeout\" flag: /api must be formatted as key=value",
        ),
        (
            "--target-max-conns=-1",
            "Error: target options invalid: target-max-conns cannot be negative",
        ),
        (
            "--target-dial-timeout=-1s",
            "Error: target options invalid: target-dial-timeout cannot be negative",
        ),
        (
            "--target-try-interval=1s",
            "Error: service options invalid: target-try-interval requires target-try-duration",
        ),
        (
            "--target-try-duration=-1s",
            "Error: service options invalid: target-try-duration cannot be negative",
        ),
    ] {
        let stderr = proxy.fails(&["deploy", "app", &target, flag]).await;
        assert_eq!(stderr.trim_end(), message, "{flag}");
    }
    // The server checks what a program other than the CLI sends.
    let deploy = |service_options: Value, target_options: Value| {
        json!({
            "command": "deploy", "service": "app", "targets": [app.target()],
            "deployment": {"deploy_timeout": 5_000_000_000i64},
            "service_options": service_options, "target_options": target_options,
        })
    };
    for (request, error) in [
        (
            deploy(json!({}), json!({"max_idle_conns_per_host": -1})),
            "target options invalid: target-max-idle-conns cannot be negative",
        ),
        (
            deploy(
                json!({}),
                json!({"path_response_timeouts": [{"path_prefix": "/a", "timeout": -5}]}),
            ),
            "target options invalid: invalid --path-timeout duration for '/a': -5ns",
        ),
        (
            deploy(json!({"target_try_interval": 5}), json!({})),
            "service options invalid: target-try-interval requires target-try-duration",
        ),
    ] {
        assert_eq!(proxy.control(request).await, json!({ "error": error }));
    }
    assert_eq!(proxy.list_json().await["services"], json!({}));
    assert!(!proxy.state_file().exists(), "nothing saved");
    assert!(app.requests().is_empty());
}

#[tokio::test]
async fn deploy_help_documents_every_flag_with_its_default() {
    let proxy = Proxy::start().await;
    let help = proxy.ok(&["deploy", "--help"]).await;
    for (flag, default) in [
        ("--path-timeout", "0 = no timeout"),
        ("--path-request-timeout", "0 = no deadline"),
        ("--target-try-duration", "0 = a single"),
        ("--target-try-interval", "0 = 250ms"),
        ("--target-max-conns", "0 = unlimited"),
        ("--target-max-idle-conns", "0 = 100"),
        ("--target-idle-conn-timeout", "0 = 90s"),
        ("--target-dial-timeout", "0 = 30s"),
        ("--target-disable-keep-alives", "after one request"),
    ] {
        let entry = help
            .split("\n\n")
            .find(|e| {
                e.trim_start()
                    .strip_prefix(flag)
                    .is_some_and(|rest| rest.starts_with([' ', '[']))
            })
            .unwrap_or_else(|| panic!("{flag} not in --help:\n{help}"));
        let entry = entry.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(entry.contains(default), "{flag}: {entry}");
    }
}

/// Bodiless requests go over the proxy's own connections, requests with a body over
/// hyper's: at `--target-max-conns=1`, a request of one kind finds the one slot held by an
/// idle connection of the other and closes it, rather than waiting for the idle timeout
/// (an hour here) to free it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn at_the_connection_limit_an_idle_connection_of_the_other_kind_makes_room() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &["--target-max-conns=1", "--target-idle-conn-timeout=1h"],
        )
        .await;
    let mut one = OneConnection::open(&proxy).await;
    assert_eq!(one.get("/a", "get1", 0).await, 200);
    assert_eq!(one.post("/b", "post1", "hello").await, 200);
    assert_eq!(one.post("/c", "post2", "again").await, 200);
    assert_eq!(one.get("/d", "get2", 0).await, 200);
    let conns: Vec<(String, String, usize)> = app
        .requests()
        .into_iter()
        .map(|r| (r.method, r.path, r.conn))
        .collect();
    let conn = |i: usize| conns[i].2;
    assert_eq!(conns.len(), 4, "{conns:?}");
    // Each change of kind needed a new connection; the same kind reused its own.
    assert_ne!(conn(0), conn(1), "{conns:?}");
    assert_eq!(conn(1), conn(2), "{conns:?}");
    assert_ne!(conn(2), conn(3), "{conns:?}");
    assert_eq!(app.app_connections(), 3, "{conns:?}");
}

/// At `--target-max-conns=1`, a POST (hyper's connection) and a GET (ours) both wait
/// while another GET holds the one connection: when it is answered, both still get theirs
/// (whichever kind the connection coming back is, the other request closes it in time).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_of_both_kinds_at_the_connection_limit_are_all_served() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start_with(&["--debug"], &[]).await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &["--target-max-conns=1", "--target-idle-conn-timeout=1h"],
        )
        .await;
    app.hold(true);
    let send = |method: reqwest::Method, seq: &str, body: &str| {
        let request = client()
            .request(method, proxy.url("/w"))
            .header("x-seq", seq)
            .body(body.to_owned());
        tokio::spawn(async move {
            let sent = tokio::time::timeout(Duration::from_secs(20), request.send());
            sent.await
                .expect("the request stalled")
                .expect("request")
                .status()
                .as_u16()
        })
    };
    let first = send(reqwest::Method::GET, "first", "");
    app.wait_held(1).await;
    let post = send(reqwest::Method::POST, "post", "hello");
    let get = send(reqwest::Method::GET, "get", "");
    poll_log_count(&proxy, "Waiting for a connection to the target", 2).await;
    app.release();
    for (name, task) in [("first", first), ("post", post), ("get", get)] {
        let got = task.await;
        assert!(
            matches!(got, Ok(200)),
            "{name}: {got:?}\n{}",
            proxy.logs().join("\n")
        );
    }
    let seen: Vec<String> = app.requests().into_iter().map(|r| r.seq).collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
}

/// A connection that carried a head over 16 KiB leaves the pool after its exchange (hyper
/// keeps its buffers at that size for as long as it idles: the memory a burst of such
/// requests held, `bench/rss_bursts.sh`); ordinary heads keep reusing one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_that_carried_a_large_head_is_not_kept_idle() {
    let app = FlakyBackend::start().await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    // Every request on one client connection, so one worker thread serves them all and
    // they share its upstream connections (each worker keeps its own, src/worker.rs).
    let mut one = OneConnection::open(&proxy).await;
    for i in 0..3 {
        assert_eq!(one.get("/a", &format!("small{i}"), 0).await, 200);
    }
    assert_eq!(
        app.app_connections(),
        1,
        "ordinary heads share one connection"
    );

    assert_eq!(one.get("/large", "large", 20 * 1024).await, 200);
    // It went on the pooled connection, which then closed: the next request needs a new one,
    // and the one after reuses that.
    for i in 0..3 {
        assert_eq!(one.get("/b", &format!("after{i}"), 0).await, 200);
    }
    let conns: Vec<(String, usize)> = app
        .requests()
        .into_iter()
        .map(|r| (r.path, r.conn))
        .collect();
    assert_eq!(app.app_connections(), 2, "{conns:?}");
    assert_eq!(conns[3], ("/large".to_owned(), conns[0].1), "{conns:?}");
    assert!(
        conns[4..].iter().all(|(_, c)| *c != conns[0].1),
        "{conns:?}"
    );
}

/// At `--target-max-conns=1` the one slot is held by the idle connection a GET left; a
/// WebSocket needs a connection of its own, so the idle one is closed to free the slot
/// (it used to wait for the 90 s idle timeout), and the GET after it is served as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upgrade_at_the_connection_limit_closes_an_idle_connection_for_its_slot() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let app = testkit::backend::Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &["--target-max-conns=1", "--target-idle-conn-timeout=1h"],
        )
        .await;
    let reply = client().get(proxy.url("/")).send().await.expect("GET");
    assert_eq!(reply.status(), 200);
    let before = app.connections();

    // Liveness, not speed: without the eviction the handshake waits the hour out.
    let url = format!("ws://127.0.0.1:{}/ws", proxy.http_port);
    let (mut ws, resp) = tokio::time::timeout(
        Duration::from_secs(60),
        tokio_tungstenite::connect_async(url),
    )
    .await
    .expect("the upgrade got a slot")
    .expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(ws.next().await.unwrap().unwrap(), Message::text("hello"));
    assert_eq!(app.connections(), before + 1, "a connection of its own");
    ws.close(None).await.unwrap();
    drop(ws);

    let reply = client().get(proxy.url("/")).send().await.expect("GET");
    assert_eq!(reply.status(), 200);
}

/// One keep-alive connection to the proxy, used for request after request (a pooled
/// client may open a second connection when its first is not back in its pool yet, and
/// that one may land on another worker thread, with upstream connections of its own).
struct OneConnection {
    stream: tokio::io::BufReader<tokio::net::TcpStream>,
}

impl OneConnection {
    async fn open(proxy: &Proxy) -> Self {
        let stream = testkit::raw::connect(proxy.http_port).await;
        OneConnection {
            stream: tokio::io::BufReader::new(stream),
        }
    }

    /// A GET with `x-seq: seq` and `pad` bytes of padding in a header; its status.
    async fn get(&mut self, path: &str, seq: &str, pad: usize) -> u16 {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nx-seq: {seq}\r\nx-pad: {}\r\n\r\n",
            "x".repeat(pad)
        );
        self.exchange(request).await
    }

    /// A POST of `body` with `x-seq: seq`; its status.
    async fn post(&mut self, path: &str, seq: &str, body: &str) -> u16 {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nx-seq: {seq}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.exchange(request).await
    }

    /// The status of `request`. A request that stalls (20 s: a hang guard, no request
    /// here takes more than milliseconds) fails the test instead of hanging it.
    async fn exchange(&mut self, request: String) -> u16 {
        use tokio::io::AsyncWriteExt;
        self.stream
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .expect("write request");
        let response = testkit::raw::read_response(&mut self.stream, false);
        tokio::time::timeout(Duration::from_secs(20), response)
            .await
            .expect("the request stalled")
            .status
    }
}
