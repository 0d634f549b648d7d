//! `--sleep-label` against the real Docker Engine, driven as Kamal drives a deploy: each
//! version is a new container with the same labels, the old one is stopped and kept for a
//! rollback. A sleep stops the running matches and remembers them; a wake starts exactly
//! those, never an older kept version; a remembered container that is gone is replaced by
//! the newest match.

use std::time::Duration;
use testkit::docker::{self, TestContainer};
use testkit::{Proxy, client};

async fn proxy() -> Proxy {
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    Proxy::start_with(&[&socket], &[]).await
}

/// One version of the app: the backend answers with `name`; labelled like Kamal's.
fn version(name: &str, service_label: &str) -> TestContainer {
    let service = format!("--label=service={service_label}");
    let c = docker::run_app_container_with(name, Duration::ZERO, &[&service, "--label=role=web"]);
    docker::wait_until_ready(&c).expect("app container ready");
    c
}

async fn deploy(p: &Proxy, c: &TestContainer, service_label: &str) {
    let label = format!("--sleep-label=service={service_label}");
    p.deploy(
        "app",
        &format!("127.0.0.1:{}", c.port),
        &[
            "--sleep-after=2s",
            &label,
            "--sleep-label=role=web",
            "--health-check-interval=200ms",
        ],
    )
    .await;
}

async fn asleep(p: &Proxy) {
    p.wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;
}

async fn answered_by(p: &Proxy, path: &str) -> String {
    let r = client().get(p.url(path)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn labels_follow_a_redeploy_and_a_rollback_and_never_wake_a_kept_version() {
    if !docker::require_docker() {
        return;
    }
    let label = format!("lbl-{}-{}", std::process::id(), docker::now_unix());
    let v1 = version("lbl-v1", &label);
    let p = proxy().await;
    deploy(&p, &v1, &label).await;
    asleep(&p).await;
    assert_eq!(docker::status(&v1.name), "exited");
    let v1_id = docker::container_id(&v1.name);
    assert_eq!(
        p.list_json().await["services"]["app"]["sleep_containers"],
        serde_json::json!([v1_id])
    );

    // Kamal deploys v2: a new container, the proxy pointed at it, v1 stopped and kept.
    let v2 = version("lbl-v2", &label);
    deploy(&p, &v2, &label).await;
    docker::stop(&v1.name);
    asleep(&p).await;
    assert_eq!(docker::status(&v2.name), "exited");
    let v2_id = docker::container_id(&v2.name);
    assert_eq!(
        p.list_json().await["services"]["app"]["sleep_containers"],
        serde_json::json!([v2_id])
    );
    let since = docker::now_precise();
    assert_eq!(answered_by(&p, "/after-redeploy").await, "lbl-v2");
    assert!(
        docker::actions_before_marker(&v1.name, &since)
            .await
            .is_empty(),
        "the kept version was touched"
    );
    assert_eq!(docker::status(&v1.name), "exited");

    // Kamal rolls back to v1: it starts v1, points the proxy at it and stops v2. v2 is the
    // newest match, yet the wake starts the remembered v1.
    asleep(&p).await;
    docker::run_docker(&["start", &v1.name]);
    docker::wait_until_ready(&v1).expect("v1 ready again");
    deploy(&p, &v1, &label).await;
    docker::stop(&v2.name);
    asleep(&p).await;
    assert_eq!(docker::status(&v1.name), "exited");
    let since = docker::now_precise();
    assert_eq!(answered_by(&p, "/after-rollback").await, "lbl-v1");
    assert!(
        docker::actions_before_marker(&v2.name, &since)
            .await
            .is_empty(),
        "the newer, kept version was touched"
    );

    // The remembered container is removed while asleep and recreated in its place (as
    // `kamal app boot` does), left stopped: the newest match stands in for it.
    asleep(&p).await;
    let port = v1.port;
    drop(v1);
    let service = format!("--label=service={label}");
    let v1b = docker::run_app_container_on(
        "lbl-v1b",
        port,
        Duration::ZERO,
        &[&service, "--label=role=web"],
    );
    docker::wait_until_ready(&v1b).expect("v1b ready");
    docker::stop(&v1b.name);
    assert_eq!(answered_by(&p, "/after-recreate").await, "lbl-v1b");
    let v1b_id = docker::container_id(&v1b.name);
    p.wait_for_log("the stand-in", |l| {
        l.contains("Waking the newest container the labels match") && l.contains(&v1b_id)
    })
    .await;
    assert_eq!(
        docker::status(&v2.name),
        "exited",
        "the older v2 stayed kept"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_container_matching_refuses_the_deploy_then_fails_the_wake_without_detail() {
    if !docker::require_docker() {
        return;
    }
    let label = format!("lbl-none-{}-{}", std::process::id(), docker::now_unix());
    let p = proxy().await;
    let c = version("lbl-none", &label);
    let target = format!("--target=127.0.0.1:{}", c.port);

    // Checked before anything happens: nothing matches.
    let err = p
        .fails(&[
            "deploy",
            "app",
            &target,
            "--sleep-after=2s",
            "--sleep-label=service=no-such-app-xyz",
        ])
        .await;
    assert!(
        err.contains("no container has the labels service=no-such-app-xyz"),
        "{err}"
    );
    let container = format!("--sleep-container={}", c.name);
    let err = p
        .fails(&[
            "deploy",
            "app",
            &target,
            "--sleep-after=2s",
            "--sleep-label=service=x",
            &container,
        ])
        .await;
    assert_eq!(
        err,
        "Error: service options invalid: sleep-label and sleep-container cannot be used together\n"
    );
    let err = p
        .fails(&["deploy", "app", &target, "--sleep-label=service"])
        .await;
    assert_eq!(
        err,
        "Error: service options invalid: sleep-label must be given as \"<key>=<value>\", got \"service\"\n"
    );
    assert!(p.list_rows().await.is_empty(), "nothing deployed");

    // Deployed, asleep, then every matching container is removed: a failed wake.
    deploy(&p, &c, &label).await;
    asleep(&p).await;
    docker::remove(&c.name);
    let r = client().get(p.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let body = r.text().await.unwrap();
    assert!(!body.contains(&label), "body names the labels: {body}");
    assert!(!body.contains("docker"), "{body}");
    p.wait_for_log("the failed wake", |l| {
        l.contains("Failed to wake service") && l.contains("no container has the labels")
    })
    .await;
}

async fn deploy_freezing(p: &Proxy, c: &TestContainer, service_label: &str, extra: &[&str]) {
    let label = format!("--sleep-label=service={service_label}");
    let mut flags = vec![
        "--freeze-after=1s",
        label.as_str(),
        "--sleep-label=role=web",
        "--health-check-interval=200ms",
    ];
    flags.extend_from_slice(extra);
    p.deploy("app", &format!("127.0.0.1:{}", c.port), &flags)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_freeze_tier_labels_pick_what_is_frozen_thawed_stopped_and_started() {
    if !docker::require_docker() {
        return;
    }
    let label = format!("lbl-frz-{}-{}", std::process::id(), docker::now_unix());
    // An older version, stopped and kept for a rollback, then the current one.
    let old = version("lbl-frz-old", &label);
    docker::stop(&old.name);
    let v1 = version("lbl-frz-v1", &label);
    let v1_id = docker::container_id(&v1.name);
    let p = proxy().await;
    let since = docker::now_precise();
    deploy_freezing(&p, &v1, &label, &["--sleep-after=4s"]).await;

    p.wait_for_state("app", "frozen", Duration::from_secs(20))
        .await;
    assert_eq!(
        p.list_json().await["services"]["app"]["sleep_containers"],
        serde_json::json!([v1_id])
    );
    assert_eq!(answered_by(&p, "/thawed").await, "lbl-frz-v1");

    // Idle again: frozen, then stopped; the next request starts the same container.
    asleep(&p).await;
    assert_eq!(docker::status(&v1.name), "exited");
    assert_eq!(
        p.list_json().await["services"]["app"]["sleep_containers"],
        serde_json::json!([v1_id])
    );
    assert_eq!(answered_by(&p, "/started").await, "lbl-frz-v1");
    for from in ["frozen", "sleeping"] {
        p.wait_for_log(&format!("the wake from {from}"), |l| {
            l.contains("Service awake") && l.contains(&format!("\"from\":\"{from}\""))
        })
        .await;
    }
    // The engine's record of the labelled container: paused, thawed (not started), paused
    // again, stopped (Docker's stop of a paused container kills, unpauses and so on), and
    // started once, by the wake from stopped.
    let actions = docker::actions_before_marker(&v1.name, &since).await;
    assert_eq!(actions[..3], ["pause", "unpause", "pause"], "{actions:?}");
    assert_eq!(
        actions.last().map(String::as_str),
        Some("start"),
        "{actions:?}"
    );
    assert_eq!(
        actions.iter().filter(|a| *a == "start").count(),
        1,
        "{actions:?}"
    );
    assert!(actions.iter().any(|a| a == "die"), "{actions:?}");
    assert!(
        docker::actions_before_marker(&old.name, &since)
            .await
            .is_empty(),
        "the kept version was touched"
    );
    assert_eq!(docker::status(&old.name), "exited");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_thaw_stops_the_stand_in_it_started() {
    if !docker::require_docker() {
        return;
    }
    let label = format!("lbl-frz-fail-{}-{}", std::process::id(), docker::now_unix());
    let v1 = version("lbl-frz-gone", &label);
    let p = proxy().await;
    deploy_freezing(&p, &v1, &label, &["--sleep-after=1h", "--wake-timeout=3s"]).await;
    p.wait_for_state("app", "frozen", Duration::from_secs(20))
        .await;
    // The frozen container is removed and recreated, stopped, but listening elsewhere: the
    // wake starts it in its place and it never serves the target.
    drop(v1);
    let stand_in = version("lbl-frz-standin", &label);
    docker::stop(&stand_in.name);
    let stand_in_id = docker::container_id(&stand_in.name);

    let r = client().get(p.url("/")).send().await.unwrap();
    assert!(r.status().is_server_error(), "{}", r.status());
    p.wait_for_log("the stand-in", |l| {
        l.contains("Waking the newest container the labels match") && l.contains(&stand_in_id)
    })
    .await;
    p.wait_for_log("the failed thaw", |l| l.contains("Failed to wake service"))
        .await;
    // Recorded as sleeping only once the cleanup is done: nothing may be left running.
    asleep(&p).await;
    assert_eq!(
        docker::status(&stand_in.name),
        "exited",
        "the stand-in this wake started was left running while the service sleeps"
    );
}
