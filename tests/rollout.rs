//! `rollout deploy|set|stop` through the real binary: a second pool beside the active one,
//! requests split onto it by the app's `kamal-rollout` cookie (the allow list, or
//! upstream's FNV-1a-32 percentage with the worked values of upstream §4.5), saved in
//! upstream's state keys and restored.

use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use testkit::go_state::check_go_decodable;
use testkit::{Proxy, Reply, backend::Backend, client, poll_until};

const FAST_HEALTH: &str = "--health-check-interval=100ms";

/// `GET path` with `Cookie: kamal-rollout=<value>` (no cookie for `None`).
async fn get_as(proxy: &Proxy, path: &str, rollout: Option<&str>) -> Reply {
    let mut req = client().get(proxy.url(path));
    if let Some(v) = rollout {
        req = req.header("cookie", format!("kamal-rollout={v}"));
    }
    let resp = req.send().await.expect("request");
    Reply {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        body: resp.text().await.expect("body"),
    }
}

/// Which backend answered each cookie value.
async fn served(proxy: &Proxy, values: &[&str]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for v in values {
        let r = get_as(proxy, "/", Some(v)).await;
        assert_eq!(r.status, 200, "{v}: {r:?}");
        out.push((v.to_string(), r.body));
    }
    out
}

fn expect(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

async fn rollout_deploy(proxy: &Proxy, service: &str, target: &str) {
    proxy
        .ok(&[
            "rollout",
            "deploy",
            service,
            &format!("--target={target}"),
            "--deploy-timeout=5s",
            "--drain-timeout=2s",
        ])
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn percentage_and_allow_list_route_by_upstream_s_hash_values() {
    let active = Backend::start("active").await;
    let next = Backend::start("next").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &active.target(), &[]).await;
    rollout_deploy(&proxy, "app", &next.target()).await;

    // A rollout pool without a split gets nothing.
    let all = ["1", "2", "3", "carol", "bob", "alice", "a", "b", "user-1"];
    let before = served(&proxy, &all).await;
    assert!(before.iter().all(|(_, b)| b == "active"), "{before:?}");

    // Worked values (percentile of FNV-1a-32): 1→20.33, 3→21.11, 2→21.50, carol→40.25,
    // bob→52.65, alice→52.79, a→89.08, b→90.25, user-1→95.83.
    proxy.ok(&["rollout", "set", "app", "--percent=21"]).await;
    assert_eq!(
        served(&proxy, &["1", "3", "2", "carol"]).await,
        expect(&[
            ("1", "next"),
            ("3", "active"),
            ("2", "active"),
            ("carol", "active")
        ])
    );
    proxy.ok(&["rollout", "set", "app", "--percent=52"]).await;
    assert_eq!(
        served(&proxy, &["2", "carol", "bob", "alice"]).await,
        expect(&[
            ("2", "next"),
            ("carol", "next"),
            ("bob", "active"),
            ("alice", "active")
        ])
    );
    // The allow list wins whatever the hash; the percentage still applies beside it.
    proxy
        .ok(&["rollout", "set", "app", "--percent=41", "--list=user-1,b"])
        .await;
    assert_eq!(
        served(&proxy, &["user-1", "b", "a", "carol", "bob"]).await,
        expect(&[
            ("user-1", "next"),
            ("b", "next"),
            ("a", "active"),
            ("carol", "next"),
            ("bob", "active")
        ])
    );
    // A list alone: a percentage of 0.
    proxy.ok(&["rollout", "set", "app", "--list=alice"]).await;
    assert_eq!(
        served(&proxy, &["alice", "1"]).await,
        expect(&[("alice", "next"), ("1", "active")])
    );
    // No cookie, or an empty one, always goes to the active pool.
    proxy.ok(&["rollout", "set", "app", "--percent=100"]).await;
    assert_eq!(get_as(&proxy, "/", None).await.body, "active");
    assert_eq!(get_as(&proxy, "/", Some("")).await.body, "active");
    assert_eq!(get_as(&proxy, "/", Some("anyone")).await.body, "next");

    let json = proxy.list_json().await;
    let app = &json["services"]["app"];
    assert_eq!(app["targets"], json!([active.target()]));
    assert_eq!(app["rollout_targets"], json!([next.target()]));
    assert_eq!(app["rollout_percentage"], 100);
    let rows = proxy.list_rows().await;
    assert_eq!(
        rows[0][3],
        format!("{} (rollout: {})", active.target(), next.target())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_keeps_the_pool_and_a_deploy_replaces_only_the_active_one() {
    let active = Backend::start("active").await;
    let next = Backend::start("next").await;
    let newer = Backend::start("newer").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &active.target(), &[]).await;
    rollout_deploy(&proxy, "app", &next.target()).await;
    proxy.ok(&["rollout", "set", "app", "--list=1"]).await;
    assert_eq!(get_as(&proxy, "/", Some("1")).await.body, "next");

    proxy.ok(&["rollout", "stop", "app"]).await;
    assert_eq!(get_as(&proxy, "/", Some("1")).await.body, "active");
    let json = proxy.list_json().await;
    assert_eq!(
        json["services"]["app"]["rollout_targets"],
        json!([next.target()]),
        "the pool stays after a stop"
    );
    assert_eq!(json["services"]["app"]["rollout_percentage"], json!(null));
    // So a split can be set again without a new rollout deploy.
    proxy.ok(&["rollout", "set", "app", "--list=1"]).await;
    assert_eq!(get_as(&proxy, "/", Some("1")).await.body, "next");

    // A deploy replaces the active pool; the rollout and its split stay.
    proxy.deploy("app", &newer.target(), &[]).await;
    assert_eq!(get_as(&proxy, "/", None).await.body, "newer");
    assert_eq!(get_as(&proxy, "/", Some("1")).await.body, "next");
}

#[tokio::test(flavor = "multi_thread")]
async fn rollout_commands_refuse_what_upstream_refuses() {
    let active = Backend::start("active").await;
    let sick = Backend::start("sick").await;
    sick.set_healthy(false);
    let proxy = Proxy::start().await;

    assert_eq!(
        proxy
            .fails(&["rollout", "set", "app", "--percent=10"])
            .await,
        "Error: service not found\n"
    );
    assert_eq!(
        proxy
            .fails(&[
                "rollout",
                "deploy",
                "app",
                &format!("--target={}", active.target())
            ])
            .await,
        "Error: service not found\n"
    );
    assert_eq!(
        proxy.fails(&["rollout", "stop", "app"]).await,
        "Error: service not found\n"
    );
    // The rollout pool is health-checked with the service's options.
    proxy.deploy("app", &active.target(), &[FAST_HEALTH]).await;
    assert_eq!(
        proxy
            .fails(&["rollout", "set", "app", "--percent=10"])
            .await,
        "Error: rollout target not set\n"
    );
    assert_eq!(
        proxy.fails(&["rollout", "set", "app"]).await,
        "Error: at least one of the flags in the group [percent list] is required\n"
    );
    assert_eq!(
        proxy.fails(&["rollout", "deploy", "app"]).await,
        "Error: required flag(s) \"target\" not set\n"
    );
    // A rollout target that never becomes healthy installs nothing.
    let stderr = proxy
        .fails(&[
            "rollout",
            "deploy",
            "app",
            &format!("--target={}", sick.target()),
            "--deploy-timeout=300ms",
        ])
        .await;
    assert_eq!(
        stderr,
        "Error: target failed to become healthy within configured timeout (300ms)\n"
    );
    assert_eq!(
        proxy.list_json().await["services"]["app"]["rollout_targets"],
        json!([])
    );
    // The server refuses the same over the raw socket, whatever a client sends.
    let reply = proxy
        .control(json!({"command": "rollout_set", "service": "app", "percentage": 5}))
        .await;
    assert_eq!(reply, json!({"error": "rollout target not set"}));
    let reply = proxy
        .control(json!({"command": "rollout_deploy", "service": "app", "targets": ["a/b"]}))
        .await;
    assert_eq!(reply, json!({"error": "a/b :invalid host pattern"}));

    assert_eq!(
        proxy.fails(&["rollout", "start", "app"]).await,
        "Error: unknown command \"start\" for \"kamal-proxy rollout\"\nRun 'kamal-proxy rollout --help' for usage.\n"
    );
    assert_eq!(
        proxy
            .fails(&["rollout", "set", "app", "--percent=ten"])
            .await,
        "Error: invalid argument \"ten\" for \"--percent\" flag: strconv.ParseInt: parsing \"ten\": invalid syntax\n"
    );
    // The group alone prints its help and succeeds, as upstream's cobra group.
    let help = proxy.ok(&["rollout"]).await;
    assert!(
        help.contains("deploy") && help.contains("set") && help.contains("stop"),
        "{help}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_restores_the_rollout_in_upstream_s_keys() {
    let active = Backend::start("active").await;
    let next = Backend::start("next").await;
    let reader = Backend::start("reader").await;
    let mut proxy = Proxy::start().await;
    proxy.deploy("app", &active.target(), &[]).await;
    proxy
        .ok(&[
            "rollout",
            "deploy",
            "app",
            &format!("--target={}", next.target()),
            &format!("--read-target={}", reader.target()),
            "--deploy-timeout=5s",
        ])
        .await;
    proxy
        .ok(&["rollout", "set", "app", "--percent=20", "--list=first"])
        .await;

    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(proxy.state_file()).unwrap()).unwrap();
    check_go_decodable(&saved).expect("Go kamal-proxy reads the file back");
    let app = &saved[0];
    assert_eq!(app["rollout_targets"], json!([next.target()]));
    assert_eq!(app["rollout_readers"], json!([reader.target()]));
    assert_eq!(
        app["rollout_controller"],
        json!({"percentage": 20, "percentage_split_point": 858993459.0, "allowlist": ["first"]})
    );

    proxy.restart().await;
    // "1" hashes to 20.33%: above 20, so only the allow list sends a request over.
    let writes = |v: &'static str| {
        let proxy = &proxy;
        async move {
            let r = client()
                .post(proxy.url("/"))
                .header("cookie", format!("kamal-rollout={v}"))
                .send()
                .await
                .unwrap();
            r.text().await.unwrap()
        }
    };
    assert_eq!(writes("first").await, "next");
    assert_eq!(writes("1").await, "active");
    // Reads of the rollout go to its reader.
    assert_eq!(get_as(&proxy, "/", Some("first")).await.body, "reader");
    // `list --json` as the fork fills it: the rollout pool's targets, readers included
    // (after the writers); the readers alone under our added key.
    let json = proxy.list_json().await;
    assert_eq!(
        json["services"]["app"]["rollout_targets"],
        json!([next.target(), reader.target()])
    );
    assert_eq!(
        json["services"]["app"]["rollout_reader_targets"],
        json!([reader.target()])
    );
    assert_eq!(
        json["services"]["app"]["rollout_allowlist"],
        json!(["first"])
    );
    assert_eq!(
        proxy.list_rows().await[0][3],
        format!(
            "{} (rollout: {},{})",
            active.target(),
            next.target(),
            reader.target()
        )
    );

    // After `rollout stop` the file says so, in upstream's shape.
    proxy.ok(&["rollout", "stop", "app"]).await;
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(proxy.state_file()).unwrap()).unwrap();
    check_go_decodable(&saved).unwrap();
    assert_eq!(saved[0]["rollout_controller"], json!(null));
    assert_eq!(saved[0]["rollout_targets"], json!([next.target()]));
}

/// Requests in a loop, half of them with a cookie the split sends to the rollout pool,
/// until `stop`; returns every status seen.
async fn load(proxy_url: String, stop: Arc<AtomicBool>) -> Vec<(u16, String)> {
    let http = client();
    let mut seen = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let mut req = http.get(&proxy_url);
        if i % 2 == 0 {
            req = req.header("cookie", "kamal-rollout=1");
        }
        i += 1;
        match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                seen.push((status, r.text().await.unwrap_or_default()));
            }
            Err(e) => seen.push((0, e.to_string())),
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn rollout_deploys_under_load_fail_no_request() {
    let active = Backend::start("active").await;
    let first = Backend::start("first").await;
    let second = Backend::start("second").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &active.target(), &[]).await;

    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<_> = (0..4)
        .map(|_| tokio::spawn(load(proxy.url("/slow?ms=20"), stop.clone())))
        .collect();
    poll_until("traffic to flow", Duration::from_secs(5), || async {
        active.hits() >= 10
    })
    .await;

    rollout_deploy(&proxy, "app", &first.target()).await;
    proxy.ok(&["rollout", "set", "app", "--percent=50"]).await;
    poll_until(
        "the rollout to take traffic",
        Duration::from_secs(5),
        || async { first.hits() >= 10 },
    )
    .await;
    // Replaced while it serves: the old rollout pool drains.
    rollout_deploy(&proxy, "app", &second.target()).await;
    poll_until(
        "the new rollout to take traffic",
        Duration::from_secs(5),
        || async { second.hits() >= 10 },
    )
    .await;
    proxy.ok(&["rollout", "stop", "app"]).await;
    let after_stop = active.hits();
    poll_until(
        "traffic back on the active pool",
        Duration::from_secs(5),
        || async { active.hits() >= after_stop + 10 },
    )
    .await;
    stop.store(true, Ordering::SeqCst);

    let mut total = 0;
    for handle in loops {
        for (status, body) in handle.await.unwrap() {
            total += 1;
            assert_eq!(status, 200, "request {total} failed: {body}");
        }
    }
    assert!(total >= 40, "the clients kept requesting ({total})");
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_drains_the_rollout_pool_too() {
    let active = Backend::start("active").await;
    let next = Backend::start("next").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &active.target(), &[]).await;
    rollout_deploy(&proxy, "app", &next.target()).await;
    proxy.ok(&["rollout", "set", "app", "--list=1"]).await;

    // A slow request in flight on the rollout pool: the stop's drain gives up on it.
    let url = proxy.url("/slow?ms=10000");
    let slow = tokio::spawn(async move {
        client()
            .get(url)
            .header("cookie", "kamal-rollout=1")
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    poll_until(
        "the slow request to reach the rollout",
        Duration::from_secs(5),
        || async { next.hits() == 1 },
    )
    .await;
    proxy
        .ok(&["stop", "app", "--drain-timeout=200ms", "--message=later"])
        .await;
    assert_eq!(slow.await.unwrap().unwrap(), 504, "cancelled by the drain");
    proxy
        .wait_for_log("the drain cancelling it", |l| {
            l.contains("Request cancelled due to draining")
        })
        .await;
    // Stopped: the rollout's requests get the stop page like any other.
    let r = get_as(&proxy, "/", Some("1")).await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("later"));
    proxy.ok(&["resume", "app"]).await;
    assert_eq!(get_as(&proxy, "/", Some("1")).await.body, "next");
}

/// Scale-to-zero with a rollout (real Docker Engine): the rollout's containers sleep and
/// wake with the service's, a request for the rollout waits for its own pool, and a
/// rollout deploy while asleep leaves a service that serves.
#[tokio::test(flavor = "multi_thread")]
async fn a_sleeping_service_wakes_the_rollout_pool_too() {
    use testkit::docker;
    if !docker::require_docker() {
        return;
    }
    let active = docker::run_app_container("ro-active", Duration::ZERO);
    let next = docker::run_app_container("ro-next", Duration::ZERO);
    docker::wait_until_ready(&active).expect("active container ready");
    docker::wait_until_ready(&next).expect("rollout container ready");
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    let proxy = Proxy::start_with(&[&socket], &[]).await;
    let (c1, c2) = (
        format!("--sleep-container={}", active.name),
        format!("--sleep-container={}", next.name),
    );
    proxy
        .deploy(
            "app",
            &format!("127.0.0.1:{}", active.port),
            &[
                "--sleep-after=1s",
                &c1,
                &c2,
                "--health-check-interval=200ms",
            ],
        )
        .await;
    rollout_deploy(&proxy, "app", &format!("127.0.0.1:{}", next.port)).await;
    proxy.ok(&["rollout", "set", "app", "--list=1"]).await;

    proxy
        .wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;
    assert!(!docker::is_running(&active.name) && !docker::is_running(&next.name));

    // The rollout's request wakes the service and is held until its own pool serves.
    let r = get_as(&proxy, "/", Some("1")).await;
    assert_eq!((r.status, r.body.as_str()), (200, "ro-next"));
    assert!(docker::is_running(&active.name) && docker::is_running(&next.name));
    assert_eq!(get_as(&proxy, "/", None).await.body, "ro-active");

    // Asleep again, a rollout deploy wakes the service first and leaves it serving.
    proxy
        .wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;
    rollout_deploy(&proxy, "app", &format!("127.0.0.1:{}", next.port)).await;
    proxy
        .wait_for_log("the rollout waking the service", |l| {
            l.contains("Waking sleeping service for rollout")
        })
        .await;
    let r = get_as(&proxy, "/", Some("1")).await;
    assert_eq!((r.status, r.body.as_str()), (200, "ro-next"));
}

/// The gates run before a pool is chosen: the rollout's requests meet them as the active
/// pool's do.
#[tokio::test(flavor = "multi_thread")]
async fn gates_apply_to_the_rollout_s_requests() {
    let active = Backend::start("active").await;
    let next = Backend::start("next").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("app", &active.target(), &["--basic-auth=ops:s3cret"])
        .await;
    rollout_deploy(&proxy, "app", &next.target()).await;
    proxy.ok(&["rollout", "set", "app", "--percent=100"]).await;

    let anonymous = get_as(&proxy, "/", Some("anyone")).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(next.hits(), 0, "refused before reaching the rollout pool");
    let r = client()
        .get(proxy.url("/"))
        .header("cookie", "kamal-rollout=anyone")
        .basic_auth("ops", Some("s3cret"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "next");
}

/// A state file as Go kamal-proxy writes it, with a rollout in upstream's keys, restores
/// with its split: a user coming from the Go image keeps the rollout.
#[tokio::test(flavor = "multi_thread")]
async fn a_go_written_rollout_restores() {
    let active = Backend::start("active").await;
    let next = Backend::start("next").await;
    let go: serde_json::Value = serde_json::from_str(testkit::go_state::GO_FIXTURE).unwrap();
    let mut service = go
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "fallback")
        .expect("the fixture's host-less service")
        .clone();
    service["active_targets"] = json!([active.target()]);
    service["rollout_targets"] = json!([next.target()]);
    service["rollout_readers"] = json!([]);
    // `rollout set --percent=21 --list=vip`, as Go encodes it.
    service["rollout_controller"] = json!({
        "percentage": 21, "percentage_split_point": 901943131.95, "allowlist": ["vip"]
    });
    let file = json!([service]);
    check_go_decodable(&file).unwrap();

    let mut proxy = Proxy::start().await;
    proxy.terminate().await;
    std::fs::create_dir_all(proxy.state_file().parent().unwrap()).unwrap();
    std::fs::write(proxy.state_file(), format!("{file}\n")).unwrap();
    proxy.respawn().await;

    assert_eq!(
        served(&proxy, &["1", "2", "vip"]).await,
        expect(&[("1", "next"), ("2", "active"), ("vip", "next")])
    );
    assert_eq!(get_as(&proxy, "/", None).await.body, "active");
    let json = proxy.list_json().await;
    assert_eq!(json["services"]["fallback"]["rollout_percentage"], 21);
}

/// Pause with a rollout pool (upstream §4.6): the pause drains the in-flight requests of
/// both pools, then a request the split sends to the rollout pool is held, reaching no
/// pool, until `resume` lets it through to the rollout pool.
#[tokio::test(flavor = "multi_thread")]
async fn pause_drains_both_pools_and_holds_the_rollout_s_requests_until_resume() {
    let active = Backend::start("active").await;
    let next = Backend::start("next").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &active.target(), &[]).await;
    rollout_deploy(&proxy, "app", &next.target()).await;
    proxy.ok(&["rollout", "set", "app", "--list=1"]).await;

    let request = |path: &str, cookie: Option<&'static str>| {
        let url = proxy.url(path);
        tokio::spawn(async move {
            let mut req = client().get(url);
            if let Some(v) = cookie {
                req = req.header("cookie", format!("kamal-rollout={v}"));
            }
            let r = req.send().await.expect("request");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        })
    };
    // A slow request in flight on each pool: the pause's drain gives up on both.
    let on_active = request("/slow?ms=10000", None);
    let on_rollout = request("/slow?ms=10000", Some("1"));
    poll_until(
        "a slow request on each pool",
        Duration::from_secs(5),
        || async { active.hits() == 1 && next.hits() == 1 },
    )
    .await;
    proxy
        .ok(&["pause", "app", "--drain-timeout=200ms", "--max-pause=30s"])
        .await;
    assert_eq!(on_active.await.unwrap().0, 504, "active pool drained");
    assert_eq!(on_rollout.await.unwrap().0, 504, "rollout pool drained");

    // Paused: the rollout's request waits, and reaches no target meanwhile.
    let held = request("/", Some("1"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!held.is_finished(), "held while paused");
    assert_eq!((active.hits(), next.hits()), (1, 1));

    proxy.ok(&["resume", "app"]).await;
    assert_eq!(held.await.unwrap(), (200, "next".to_string()));
    assert_eq!(get_as(&proxy, "/", None).await.body, "active");
}

/// The log line with this `msg` after the first `skip` lines, parsed, without `time`.
async fn log_entry(proxy: &Proxy, skip: usize, msg: &str) -> serde_json::Value {
    let line = proxy
        .wait_for_log_after(skip, msg, |l| {
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| v["msg"] == msg)
        })
        .await;
    let mut v: serde_json::Value = serde_json::from_str(&line).unwrap();
    v.as_object_mut().unwrap().remove("time");
    v
}

/// A plain deploy's lines carry its lists as slog writes Go's `[]string`: JSON arrays.
#[tokio::test(flavor = "multi_thread")]
async fn deploy_logs_its_lists_as_json_arrays() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let proxy = Proxy::start().await;
    let mark = proxy.logs().len();
    proxy
        .deploy(
            "app",
            &format!("{},{}", a.target(), b.target()),
            &["--host=app.test,www.app.test", "--path-prefix=/api"],
        )
        .await;
    for msg in ["Deploying", "Deployed"] {
        assert_eq!(
            log_entry(&proxy, mark, msg).await,
            json!({
                "level": "INFO", "msg": msg, "service": "app",
                "targets": [a.target(), b.target()],
                "hosts": ["app.test", "www.app.test"], "paths": ["/api"], "tls": false
            })
        );
    }
}

/// Upstream's messages and attributes (§7.1; `router.go`, `service.go`): lists as JSON
/// arrays, an allow list given by no `--list` as Go's `null`.
#[tokio::test(flavor = "multi_thread")]
async fn rollout_commands_log_upstream_s_lines() {
    let active = Backend::start("active").await;
    let next = Backend::start("next").await;
    let reader = Backend::start("reader").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &active.target(), &[]).await;

    let mark = proxy.logs().len();
    proxy
        .ok(&[
            "rollout",
            "deploy",
            "app",
            &format!("--target={}", next.target()),
            &format!("--read-target={}", reader.target()),
            "--deploy-timeout=5s",
        ])
        .await;
    let targets = json!([next.target()]);
    assert_eq!(
        log_entry(&proxy, mark, "Deploying for rollout").await,
        json!({"level": "INFO", "msg": "Deploying for rollout", "service": "app", "targets": targets})
    );
    assert_eq!(
        log_entry(&proxy, mark, "Deployed for rollout").await,
        json!({"level": "INFO", "msg": "Deployed for rollout", "service": "app", "targets": targets})
    );

    let mark = proxy.logs().len();
    proxy
        .ok(&["rollout", "set", "app", "--percent=20", "--list=a,b"])
        .await;
    assert_eq!(
        log_entry(&proxy, mark, "Set rollout split").await,
        json!({"level": "INFO", "msg": "Set rollout split", "service": "app",
               "percentage": 20, "allowlist": ["a", "b"]})
    );
    let mark = proxy.logs().len();
    proxy.ok(&["rollout", "set", "app", "--percent=5"]).await;
    assert_eq!(
        log_entry(&proxy, mark, "Set rollout split").await,
        json!({"level": "INFO", "msg": "Set rollout split", "service": "app",
               "percentage": 5, "allowlist": null})
    );

    let mark = proxy.logs().len();
    proxy.ok(&["rollout", "stop", "app"]).await;
    assert_eq!(
        log_entry(&proxy, mark, "Stopped rollout").await,
        json!({"level": "INFO", "msg": "Stopped rollout", "service": "app"})
    );
    let old = [
        "Deploying rollout",
        "Deployed rollout",
        "Rollout split set",
        "Rollout stopped",
    ];
    let logs = proxy.logs();
    assert!(
        !logs.iter().any(|l| old.iter().any(|o| l.contains(o))),
        "{logs:#?}"
    );
}

/// `rollout set --percent` without `--list` saves the allow list as Go does (`null`), and
/// the file restores the same split.
#[tokio::test(flavor = "multi_thread")]
async fn a_percentage_without_a_list_saves_go_s_null() {
    let active = Backend::start("active").await;
    let next = Backend::start("next").await;
    let mut proxy = Proxy::start().await;
    proxy.deploy("app", &active.target(), &[]).await;
    rollout_deploy(&proxy, "app", &next.target()).await;
    proxy.ok(&["rollout", "set", "app", "--percent=21"]).await;

    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(proxy.state_file()).unwrap()).unwrap();
    check_go_decodable(&saved).unwrap();
    let split = &saved[0]["rollout_controller"];
    assert_eq!(
        (&split["percentage"], &split["allowlist"]),
        (&json!(21), &json!(null)),
        "{split}"
    );
    let point = split["percentage_split_point"].as_f64().unwrap();
    assert!((point - 901_943_131.95).abs() < 1e-3, "{split}");

    proxy.restart().await;
    // "1" hashes to 20.33 % (in), "3" to 21.11 % (out).
    assert_eq!(
        served(&proxy, &["1", "3"]).await,
        expect(&[("1", "next"), ("3", "active")])
    );
    assert_eq!(
        proxy.list_json().await["services"]["app"]["rollout_allowlist"],
        json!([])
    );
}

/// Upstream's CLI sends `rollout deploy` addresses unchecked: the server answers, the
/// service first (`service not found` whatever the address), then the address, before
/// anything is probed or saved.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_rollout_address_is_the_server_s_to_refuse() {
    let active = Backend::start("active").await;
    let proxy = Proxy::start().await;
    assert_eq!(
        proxy
            .fails(&["rollout", "deploy", "app", "--target=a/b"])
            .await,
        "Error: service not found\n"
    );

    proxy.deploy("app", &active.target(), &[]).await;
    let before = std::fs::read(proxy.state_file()).unwrap();
    assert_eq!(
        proxy
            .fails(&["rollout", "deploy", "app", "--target=a/b"])
            .await,
        "Error: a/b :invalid host pattern\n"
    );
    assert_eq!(
        proxy
            .fails(&[
                "rollout",
                "deploy",
                "app",
                &format!("--target={}", active.target()),
                "--read-target=http://x",
            ])
            .await,
        "Error: http://x :invalid host pattern\n"
    );
    assert_eq!(
        std::fs::read(proxy.state_file()).unwrap(),
        before,
        "nothing saved"
    );
    assert_eq!(
        proxy.list_json().await["services"]["app"]["rollout_targets"],
        json!([])
    );
    assert_eq!(
        proxy
            .fails(&["rollout", "set", "app", "--percent=10"])
            .await,
        "Error: rollout target not set\n",
        "no pool installed"
    );
}
