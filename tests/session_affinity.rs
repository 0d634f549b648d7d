//! Cookie session affinity (fork F17): `--session-affinity` pins each client to one
//! writer with an opaque cookie; the pin holds while that target is healthy and deployed,
//! and a client whose target left (a redeploy, a failed health check) is pinned to
//! another. Through the real binary with real backends; the sleep/wake case runs on the
//! real Docker engine.

use std::collections::BTreeSet;
use std::time::Duration;
use testkit::docker::{self, TestContainer};
use testkit::pebble::self_signed;
use testkit::{Proxy, Reply, backend::Backend, client, send_with_cookie};

/// `method path` with an optional `Cookie` header.
async fn send(proxy: &Proxy, method: reqwest::Method, path: &str, cookie: Option<&str>) -> Reply {
    send_with_cookie(&client(), method, &proxy.url(path), None, cookie)
        .await
        .expect("request")
}

async fn get(proxy: &Proxy, cookie: Option<&str>) -> Reply {
    send(proxy, reqwest::Method::GET, "/", cookie).await
}

/// The `Set-Cookie` for `name`, if the response carries one.
fn set_cookie(r: &Reply, name: &str) -> Option<String> {
    r.headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with(&format!("{name}=")))
        .map(String::from)
}

/// `name=value`, as a browser sends the cookie back.
fn pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_string()
}

/// Three healthy writers, probed often so a failing one leaves the pool quickly.
async fn three_writers(extra: &[&str]) -> (Proxy, [Backend; 3]) {
    let backends = [
        Backend::start("one").await,
        Backend::start("two").await,
        Backend::start("three").await,
    ];
    let proxy = Proxy::start().await;
    let targets = backends
        .iter()
        .map(Backend::target)
        .collect::<Vec<_>>()
        .join(",");
    let mut flags = vec!["--health-check-interval=100ms"];
    flags.extend_from_slice(extra);
    proxy.deploy("app", &targets, &flags).await;
    (proxy, backends)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_stays_on_its_target_across_many_requests_and_methods() {
    let (proxy, backends) = three_writers(&["--session-affinity"]).await;

    let first = get(&proxy, None).await;
    assert_eq!(first.status, 200);
    let cookie = set_cookie(&first, "kamal-session").expect("the first answer pins");
    let (value, attributes) = pair(&cookie)
        .strip_prefix("kamal-session=")
        .map(|v| {
            (
                v.to_string(),
                cookie[cookie.find(';').unwrap()..].to_string(),
            )
        })
        .unwrap();
    assert_eq!(attributes, "; Path=/; HttpOnly; SameSite=Lax", "{cookie}");
    assert_eq!(value.len(), 32);
    assert!(value.bytes().all(|b| b.is_ascii_hexdigit()), "{value}");
    for b in &backends {
        let port = b.addr.port().to_string();
        assert!(!value.contains(&port), "the pin does not name the target");
    }

    // 60 requests with the cookie, of every method: the same backend, and no new cookie.
    let pinned = first.body.clone();
    let methods = [
        reqwest::Method::GET,
        reqwest::Method::POST,
        reqwest::Method::PUT,
        reqwest::Method::DELETE,
        reqwest::Method::PATCH,
        reqwest::Method::HEAD,
    ];
    for i in 0..60 {
        let method = methods[i % methods.len()].clone();
        let r = send(&proxy, method.clone(), "/", Some(&pair(&cookie))).await;
        assert_eq!(r.status, 200, "{method}");
        assert_eq!(r.header("x-backend"), pinned, "request {i} ({method})");
        assert_eq!(set_cookie(&r, "kamal-session"), None, "already pinned");
    }
    let hits: Vec<usize> = backends.iter().map(Backend::hits).collect();
    assert_eq!(hits.iter().sum::<usize>(), 61);
    assert!(hits.contains(&61), "every request on one backend: {hits:?}");

    // Clients without the cookie still rotate, each pinned where it lands.
    let mut landed = BTreeSet::new();
    for _ in 0..3 {
        let r = get(&proxy, None).await;
        assert!(set_cookie(&r, "kamal-session").is_some());
        landed.insert(r.body);
    }
    assert_eq!(landed.len(), 3, "rotation for new clients: {landed:?}");

    // A forged value counts for nothing: served, and pinned with a real one.
    let forged = get(
        &proxy,
        Some("kamal-session=00000000000000000000000000000000"),
    )
    .await;
    assert_eq!(forged.status, 200);
    assert!(set_cookie(&forged, "kamal-session").is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn off_by_default_and_a_custom_cookie_name() {
    let (proxy, _backends) = three_writers(&[]).await;
    let r = get(&proxy, None).await;
    assert_eq!(r.status, 200);
    assert!(
        r.headers.get("set-cookie").is_none(),
        "no affinity, no cookie"
    );

    proxy
        .deploy(
            "app",
            &_backends
                .iter()
                .map(Backend::target)
                .collect::<Vec<_>>()
                .join(","),
            &[
                "--session-affinity=true",
                "--session-affinity-cookie=sticky",
            ],
        )
        .await;
    let r = get(&proxy, None).await;
    let cookie = set_cookie(&r, "sticky").expect("the named cookie");
    assert_eq!(set_cookie(&r, "kamal-session"), None);
    for _ in 0..5 {
        let again = get(&proxy, Some(&pair(&cookie))).await;
        assert_eq!(again.body, r.body);
    }
    assert_eq!(
        proxy.list_json().await["services"]["app"]["targets"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redeploy_that_removes_the_pinned_target_re_pins_and_one_that_keeps_it_does_not() {
    let (proxy, backends) = three_writers(&["--session-affinity"]).await;
    let first = get(&proxy, None).await;
    let cookie = pair(&set_cookie(&first, "kamal-session").unwrap());
    let pinned = backends.iter().position(|b| b.name == first.body).unwrap();
    let others: Vec<&Backend> = backends
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != pinned)
        .map(|(_, b)| b)
        .collect();

    // Redeploy keeping the pinned target (beside a new one): the pin still holds.
    let fourth = Backend::start("four").await;
    let kept = format!("{},{}", backends[pinned].target(), fourth.target());
    proxy.deploy("app", &kept, &["--session-affinity"]).await;
    for _ in 0..5 {
        let r = get(&proxy, Some(&cookie)).await;
        assert_eq!(r.body, first.body, "the target stayed, so did the client");
        assert_eq!(set_cookie(&r, "kamal-session"), None);
    }

    // Redeploy without it: the client is served by a remaining target and re-pinned.
    let without = format!("{},{}", others[0].target(), others[1].target());
    proxy.deploy("app", &without, &["--session-affinity"]).await;
    let moved = get(&proxy, Some(&cookie)).await;
    assert_eq!(moved.status, 200);
    assert_ne!(moved.body, first.body);
    let repinned = pair(&set_cookie(&moved, "kamal-session").expect("a new pin"));
    assert_ne!(repinned, cookie);
    for _ in 0..10 {
        let r = get(&proxy, Some(&repinned)).await;
        assert_eq!(r.body, moved.body, "the new pin holds");
        assert_eq!(set_cookie(&r, "kamal-session"), None);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unhealthy_pinned_target_re_pins_its_clients() {
    let (proxy, backends) = three_writers(&["--session-affinity"]).await;
    let first = get(&proxy, None).await;
    let cookie = pair(&set_cookie(&first, "kamal-session").unwrap());
    let pinned = backends.iter().find(|b| b.name == first.body).unwrap();

    pinned.set_healthy(false);
    let address = pinned.target();
    proxy
        .wait_for_log("the pinned target marked unhealthy", |l| {
            l.contains("Target health updated")
                && l.contains(&address)
                && l.contains("\"state\":\"unhealthy\"")
        })
        .await;
    let moved = get(&proxy, Some(&cookie)).await;
    assert_eq!(moved.status, 200, "a stale pin never fails the request");
    assert_ne!(moved.body, first.body);
    let repinned = pair(&set_cookie(&moved, "kamal-session").expect("re-pinned"));
    for _ in 0..5 {
        assert_eq!(get(&proxy, Some(&repinned)).await.body, moved.body);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_s_own_error_pages_never_pin() {
    let backend = Backend::start("only").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("app", &backend.target(), &["--session-affinity"])
        .await;
    let ok = get(&proxy, None).await;
    assert!(set_cookie(&ok, "kamal-session").is_some());

    // The app is gone: the proxy answers 502 itself, without a pin.
    backend.kill();
    let failed = get(&proxy, None).await;
    assert_eq!(failed.status, 502);
    assert_eq!(set_cookie(&failed, "kamal-session"), None, "{failed:?}");

    // Stopped: 503 from the proxy, no pin either.
    proxy.ok(&["stop", "app", "--drain-timeout=1s"]).await;
    let stopped = get(&proxy, None).await;
    assert_eq!(stopped.status, 503);
    assert!(stopped.headers.get("set-cookie").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn with_retries_a_pinned_target_that_fails_is_tried_once_and_the_client_moves() {
    // Probed rarely, so the dead target is still in the pool when the request comes.
    let (proxy, backends) = three_writers(&[]).await;
    let targets = backends
        .iter()
        .map(Backend::target)
        .collect::<Vec<_>>()
        .join(",");
    proxy
        .deploy(
            "app",
            &targets,
            &[
                "--session-affinity",
                "--health-check-interval=1h",
                "--target-try-duration=5s",
            ],
        )
        .await;
    let first = get(&proxy, None).await;
    let cookie = pair(&set_cookie(&first, "kamal-session").unwrap());
    let pinned = backends.iter().find(|b| b.name == first.body).unwrap();
    pinned.kill();

    let moved = get(&proxy, Some(&cookie)).await;
    assert_eq!(moved.status, 200, "retried on another target");
    assert_ne!(moved.body, first.body);
    let repinned = pair(&set_cookie(&moved, "kamal-session").expect("pinned where it landed"));
    assert_ne!(repinned, cookie);
    proxy
        .wait_for_log("the access log counting one retry", |l| {
            l.contains("\"msg\":\"Request\"") && l.contains("\"retries\":1")
        })
        .await;
    for _ in 0..4 {
        assert_eq!(get(&proxy, Some(&repinned)).await.body, moved.body);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_served_by_readers_are_not_pinned_and_writes_keep_their_reads_on_the_writer() {
    let writers = [Backend::start("w1").await, Backend::start("w2").await];
    let reader = Backend::start("reader").await;
    let proxy = Proxy::start().await;
    let targets = format!("{},{}", writers[0].target(), writers[1].target());
    let read_target = format!("--read-target={}", reader.target());
    proxy
        .deploy(
            "app",
            &targets,
            &[
                &read_target,
                "--session-affinity",
                "--writer-affinity-timeout=30s",
            ],
        )
        .await;

    let read = get(&proxy, None).await;
    assert_eq!(read.body, "reader");
    assert_eq!(
        set_cookie(&read, "kamal-session"),
        None,
        "a reader's read is not pinned"
    );

    let write = send(&proxy, reqwest::Method::POST, "/", None).await;
    let session = pair(&set_cookie(&write, "kamal-session").expect("a write pins"));
    let writer = pair(&set_cookie(&write, "kamal-writer").expect("and sets writer affinity"));
    let both = format!("{session}; {writer}");
    for _ in 0..6 {
        let r = get(&proxy, Some(&both)).await;
        assert_eq!(r.body, write.body, "reads after a write: the pinned writer");
        let w = send(&proxy, reqwest::Method::POST, "/", Some(&both)).await;
        assert_eq!(w.body, write.body, "writes: the pinned writer");
        assert_eq!(set_cookie(&w, "kamal-session"), None);
    }
    // Without the writer cookie, reads go back to the reader, pin or not.
    assert_eq!(get(&proxy, Some(&session)).await.body, "reader");
}

#[tokio::test(flavor = "multi_thread")]
async fn pins_survive_a_restart_of_the_proxy() {
    let (mut proxy, _backends) = three_writers(&["--session-affinity"]).await;
    let first = get(&proxy, None).await;
    let cookie = pair(&set_cookie(&first, "kamal-session").unwrap());
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(proxy.state_file()).unwrap()).unwrap();
    let key = saved[0]["session_affinity_key"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(key.len(), 64, "the key is kept (0600 file): {saved}");

    proxy.restart().await;
    for _ in 0..6 {
        let r = get(&proxy, Some(&cookie)).await;
        assert_eq!(r.body, first.body);
        assert_eq!(set_cookie(&r, "kamal-session"), None, "still pinned");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pin_is_secure_over_tls() {
    let backends = [Backend::start("one").await, Backend::start("two").await];
    let proxy = Proxy::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path(), "site", &["pin.test"]);
    let cert_flag = format!("--tls-certificate-path={}", cert.display());
    let key_flag = format!("--tls-private-key-path={}", key.display());
    let targets = format!("{},{}", backends[0].target(), backends[1].target());
    proxy
        .deploy(
            "app",
            &targets,
            &[
                "--host=pin.test",
                "--tls",
                &cert_flag,
                &key_flag,
                "--session-affinity",
            ],
        )
        .await;
    let https = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(pem.as_bytes()).unwrap()])
        .resolve(
            "pin.test",
            std::net::SocketAddr::from(([127, 0, 0, 1], proxy.https_port)),
        )
        .build()
        .unwrap();
    let resp = https
        .get(format!("https://pin.test:{}/", proxy.https_port))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let cookie = resp
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        cookie.starts_with("kamal-session=")
            && cookie.ends_with("; Path=/; HttpOnly; Secure; SameSite=Lax"),
        "{cookie}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_flags_are_checked_by_the_cli_and_the_server_and_a_refusal_changes_nothing() {
    let (proxy, backends) = three_writers(&[]).await;
    let target = format!("--target={}", backends[0].target());
    let cases = [
        (
            "--session-affinity-cookie=sticky",
            "Error: service options invalid: session-affinity-cookie requires session-affinity",
        ),
        (
            "--session-affinity-cookie=a b",
            "Error: service options invalid: session-affinity-cookie \"a b\" is not a valid cookie name",
        ),
        (
            "--session-affinity-cookie=kamal-writer",
            "Error: service options invalid: session-affinity-cookie \"kamal-writer\" is a cookie the proxy already reads for routing; choose another name",
        ),
    ];
    for (flag, message) in cases {
        let mut args = vec!["deploy", "app", target.as_str(), flag];
        if flag != "--session-affinity-cookie=sticky" {
            args.push("--session-affinity");
        }
        let out = proxy.fails(&args).await;
        assert_eq!(out.trim(), message, "{flag}");
    }
    // The server says the same to a request that skips the CLI.
    let reply = proxy
        .control(serde_json::json!({
            "command": "deploy",
            "service": "app",
            "targets": [backends[0].target()],
            "deployment": {"deploy_timeout": 1_000_000_000i64, "drain_timeout": 0, "force": false},
            "service_options": {"session_affinity_cookie": "sticky"},
            "target_options": {},
        }))
        .await;
    assert_eq!(
        reply,
        serde_json::json!({"error": "service options invalid: session-affinity-cookie requires session-affinity"})
    );
    // Nothing changed: still three targets, no pin.
    assert_eq!(
        proxy.list_json().await["services"]["app"]["targets"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert!(get(&proxy, None).await.headers.get("set-cookie").is_none());
}

/// A proxy with scale-to-zero against the engine the tests use.
async fn docker_proxy() -> Proxy {
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    Proxy::start_with(&[&socket], &[]).await
}

async fn app(prefix: &str) -> TestContainer {
    docker::app_container_ready(prefix, Duration::ZERO, &[]).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pin_survives_a_sleep_and_wake() {
    if !docker::require_docker() {
        return;
    }
    let a = app("affinity-a").await;
    let b = app("affinity-b").await;
    let p = docker_proxy().await;
    let targets = format!("127.0.0.1:{},127.0.0.1:{}", a.port, b.port);
    let containers = [
        format!("--sleep-container={}", a.name),
        format!("--sleep-container={}", b.name),
    ];
    p.deploy(
        "app",
        &targets,
        &[
            "--session-affinity",
            "--sleep-after=1s",
            &containers[0],
            &containers[1],
            "--health-check-interval=200ms",
        ],
    )
    .await;
    let first = get(&p, None).await;
    assert_eq!(first.status, 200);
    let cookie = pair(&set_cookie(&first, "kamal-session").unwrap());
    let pinned_body = first.body.clone();
    assert!(pinned_body == "affinity-a" || pinned_body == "affinity-b");

    for _ in 0..2 {
        p.wait_for_state("app", "sleeping", Duration::from_secs(20))
            .await;
        assert!(!docker::is_running(&a.name) && !docker::is_running(&b.name));
        // The request that wakes it, and those after, reach the pinned container.
        let woken = get(&p, Some(&cookie)).await;
        assert_eq!(woken.status, 200);
        assert_eq!(woken.body, pinned_body, "the pin survives the nap");
        assert_eq!(set_cookie(&woken, "kamal-session"), None);
        for _ in 0..4 {
            assert_eq!(get(&p, Some(&cookie)).await.body, pinned_body);
        }
    }
}
