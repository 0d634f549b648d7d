//! Weighted targets (fork F16): `--target="host:port;weight=N"` splits requests by
//! smooth weighted round robin (nginx's), readers and writers apart; the weight is shown
//! by `list`, kept in the state file beside upstream's lists (which Go reads back as plain
//! `host:port`) and restored. Through the real binary with real backends.

use serde_json::{Value, json};
use testkit::go_state::{GO_FIXTURE, as_go_reads_it, check_go_decodable};
use testkit::{Proxy, Reply, backend::Backend, client, send_with_cookie};

async fn send(
    http: &reqwest::Client,
    proxy: &Proxy,
    method: reqwest::Method,
    cookie: Option<&str>,
) -> Reply {
    send_with_cookie(http, method, &proxy.url("/"), None, cookie)
        .await
        .expect("request")
}

/// Sends `n` requests one after another on one client (its connections kept, as a
/// browser's) and returns which backend answered each.
async fn answers(
    http: &reqwest::Client,
    proxy: &Proxy,
    method: reqwest::Method,
    cookie: Option<&str>,
    n: usize,
) -> Vec<String> {
    let mut seen = Vec::with_capacity(n);
    for _ in 0..n {
        let r = send(http, proxy, method.clone(), cookie).await;
        assert_eq!(r.status, 200, "{r:?}");
        seen.push(r.body);
    }
    seen
}

fn count(seen: &[String], name: &str) -> usize {
    seen.iter().filter(|s| *s == name).count()
}

fn read_state(proxy: &Proxy) -> Value {
    serde_json::from_str(&std::fs::read_to_string(proxy.state_file()).unwrap()).unwrap()
}

/// Asserts the exact 1:5 split, interleaved: every six consecutive answers hold one of
/// `light`'s (smooth weighted round robin never sends it two in a row).
fn assert_one_to_five(seen: &[String], light: &Backend, heavy: &Backend) {
    assert_eq!(count(seen, &light.name), seen.len() / 6);
    assert_eq!(count(seen, &heavy.name), seen.len() * 5 / 6);
    for (i, window) in seen.windows(6).enumerate() {
        assert_eq!(count(window, &light.name), 1, "window at {i}: {window:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_one_to_five_split_is_exact_over_600_requests_and_survives_a_restart() {
    let http = client();
    let light = Backend::start("light").await;
    let heavy = Backend::start("heavy").await;
    let mut proxy = Proxy::start().await;
    let heavy_spec = format!("{};weight=5", heavy.target());
    proxy
        .ok(&[
            "deploy",
            "app",
            &format!("--target={}", light.target()),
            &format!("--target={heavy_spec}"),
        ])
        .await;

    let seen = answers(&http, &proxy, reqwest::Method::GET, None, 600).await;
    assert_one_to_five(&seen, &light, &heavy);
    assert_eq!((light.hits(), heavy.hits()), (100, 500));

    // Shown as the fork shows it: the weight after the address, a weight of 1 bare.
    let listed = &proxy.list_json().await["services"]["app"];
    assert_eq!(listed["targets"], json!([light.target(), heavy_spec]));
    assert_eq!(
        listed["target"],
        json!(format!("{},{heavy_spec}", light.target()))
    );
    let rows = proxy.list_rows().await;
    assert!(rows[0].iter().any(|c| c.contains(&heavy_spec)), "{rows:?}");

    // Saved beside upstream's list, which keeps plain addresses: Go reads them back.
    let state = read_state(&proxy);
    check_go_decodable(&state).unwrap();
    assert_eq!(
        state[0]["active_targets"],
        json!([light.target(), heavy.target()])
    );
    assert_eq!(state[0]["active_target_weights"], json!([1, 5]));
    let go: Value = serde_json::from_str(GO_FIXTURE).unwrap();
    let go_view = as_go_reads_it(&state[0], &go[0]);
    assert_eq!(
        go_view["active_targets"],
        json!([light.target(), heavy.target()]),
        "Go restores the service with its plain targets"
    );
    assert!(go_view.get("active_target_weights").is_none());

    // Restored by our binary, weights and all.
    proxy.restart().await;
    let seen = answers(&http, &proxy, reqwest::Method::GET, None, 600).await;
    assert_one_to_five(&seen, &light, &heavy);
    assert_eq!(
        proxy.list_json().await["services"]["app"]["targets"],
        json!([light.target(), heavy_spec])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn readers_and_writers_are_weighted_apart() {
    let http = client();
    let w1 = Backend::start("w1").await;
    let w3 = Backend::start("w3").await;
    let r2 = Backend::start("r2").await;
    let r1 = Backend::start("r1").await;
    let proxy = Proxy::start().await;
    proxy
        .ok(&[
            "deploy",
            "app",
            &format!("--target={},{};weight=3", w1.target(), w3.target()),
            &format!("--read-target={};weight=2,{}", r2.target(), r1.target()),
        ])
        .await;
    // Interleaved, yet each pool keeps its own cycle.
    let mut reads = Vec::new();
    let mut writes = Vec::new();
    for _ in 0..300 {
        reads.extend(answers(&http, &proxy, reqwest::Method::GET, None, 1).await);
        writes.extend(answers(&http, &proxy, reqwest::Method::POST, None, 1).await);
    }
    assert_eq!((count(&reads, "r2"), count(&reads, "r1")), (200, 100));
    assert_eq!((count(&writes, "w1"), count(&writes, "w3")), (75, 225));
    let listed = &proxy.list_json().await["services"]["app"];
    assert_eq!(
        listed["reader_targets"],
        json!([format!("{};weight=2", r2.target()), r1.target()])
    );
    let state = read_state(&proxy);
    check_go_decodable(&state).unwrap();
    assert_eq!(state[0]["active_reader_weights"], json!([2, 1]));
    assert_eq!(
        state[0]["active_readers"],
        json!([r2.target(), r1.target()])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_weighted_target_that_fails_its_check_leaves_the_split_to_the_others() {
    let http = client();
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let c = Backend::start("c").await;
    let proxy = Proxy::start().await;
    proxy
        .ok(&[
            "deploy",
            "app",
            &format!(
                "--target={};weight=1,{};weight=2,{};weight=6",
                a.target(),
                b.target(),
                c.target()
            ),
            "--health-check-interval=100ms",
        ])
        .await;
    c.set_healthy(false);
    let address = c.target();
    proxy
        .wait_for_log("the heavy target marked unhealthy", |l| {
            l.contains("Target health updated")
                && l.contains(&address)
                && l.contains("\"state\":\"unhealthy\"")
        })
        .await;
    let seen = answers(&http, &proxy, reqwest::Method::GET, None, 300).await;
    assert_eq!(
        (count(&seen, "a"), count(&seen, "b"), count(&seen, "c")),
        (100, 200, 0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rollout_pool_is_weighted_too() {
    let http = client();
    let web = Backend::start("web").await;
    let new2 = Backend::start("new2").await;
    let new1 = Backend::start("new1").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &web.target(), &[]).await;
    let spec = format!("{};weight=2", new2.target());
    proxy
        .ok(&[
            "rollout",
            "deploy",
            "app",
            &format!("--target={spec}"),
            &format!("--target={}", new1.target()),
        ])
        .await;
    proxy.ok(&["rollout", "set", "app", "--list=beta"]).await;
    let seen = answers(
        &http,
        &proxy,
        reqwest::Method::GET,
        Some("kamal-rollout=beta"),
        300,
    )
    .await;
    assert_eq!((count(&seen, "new2"), count(&seen, "new1")), (200, 100));
    assert_eq!(
        answers(&http, &proxy, reqwest::Method::GET, None, 3).await,
        ["web", "web", "web"]
    );
    let listed = &proxy.list_json().await["services"]["app"];
    assert_eq!(listed["rollout_targets"], json!([spec, new1.target()]));
    let state = read_state(&proxy);
    check_go_decodable(&state).unwrap();
    assert_eq!(
        state[0]["rollout_targets"],
        json!([new2.target(), new1.target()])
    );
    assert_eq!(state[0]["rollout_target_weights"], json!([2, 1]));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_weights_are_refused_by_the_cli_and_the_server_and_change_nothing() {
    let a = Backend::start("a").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &a.target(), &[]).await;
    let before = std::fs::read(proxy.state_file()).unwrap();
    let t = a.target();
    for (target, message) in [
        (
            format!("{t};weight=0"),
            "Error: invalid target weight: 0 is outside 1-1000".to_string(),
        ),
        (
            format!("{t};weight=1001"),
            "Error: invalid target weight: 1001 is outside 1-1000".to_string(),
        ),
        (
            format!("{t};weight=five"),
            "Error: invalid target weight: 'five' is not a whole number".to_string(),
        ),
        (
            format!("{t};color=red"),
            "Error: invalid target weight: 'color=red' is not a target attribute, expected 'weight=N'"
                .to_string(),
        ),
        (";weight=5".to_string(), "Error:  :invalid host pattern".to_string()),
    ] {
        let flag = format!("--target={target}");
        let out = proxy.fails(&["deploy", "app", &flag]).await;
        assert_eq!(out.trim(), message, "{target}");
        let out = proxy.fails(&["rollout", "deploy", "app", &flag]).await;
        assert_eq!(out.trim(), message, "rollout {target}");
    }
    let reply = proxy
        .control(json!({
            "command": "deploy",
            "service": "app",
            "targets": [format!("{t};weight=0")],
            "deployment": {"deploy_timeout": 1_000_000_000i64, "drain_timeout": 0, "force": true},
            "service_options": {},
            "target_options": {},
        }))
        .await;
    assert_eq!(
        reply,
        json!({"error": "invalid target weight: 0 is outside 1-1000"})
    );
    assert_eq!(std::fs::read(proxy.state_file()).unwrap(), before);
    assert_eq!(
        proxy.list_json().await["services"]["app"]["targets"],
        json!([t])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_state_file_of_the_go_fork_with_weights_in_upstream_s_list_is_restored() {
    let http = client();
    let light = Backend::start("light").await;
    let heavy = Backend::start("heavy").await;
    let mut proxy = Proxy::start().await;
    proxy.terminate().await;
    // The fork writes the spec into `active_targets`.
    let mut fork: Value = serde_json::from_str(GO_FIXTURE).unwrap();
    let mut service = fork[0].take();
    service["name"] = json!("app");
    service["options"]["hosts"] = json!([""]);
    service["options"]["tls_enabled"] = json!(false);
    service["active_targets"] = json!([light.target(), format!("{};weight=5", heavy.target())]);
    let dir = proxy.state_file().parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        proxy.state_file(),
        serde_json::to_vec(&json!([service])).unwrap(),
    )
    .unwrap();
    proxy.respawn().await;

    let seen = answers(&http, &proxy, reqwest::Method::GET, None, 60).await;
    assert_one_to_five(&seen, &light, &heavy);
    // The next save writes it the way upstream's Go reads it.
    proxy.ok(&["pause", "app"]).await;
    proxy.ok(&["resume", "app"]).await;
    let state = read_state(&proxy);
    check_go_decodable(&state).unwrap();
    assert_eq!(
        state[0]["active_targets"],
        json!([light.target(), heavy.target()])
    );
    assert_eq!(state[0]["active_target_weights"], json!([1, 5]));
}
