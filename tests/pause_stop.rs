//! `pause`, `stop` and `resume` (upstream §4.6): held requests, shed load, maintenance
//! pages, the health-check bypass, and persistence across redeploys and restarts.

use std::time::Duration;
use testkit::{Proxy, backend::Backend, client, poll_until, send};

const PAGE_503_TEXT: &str = "The service is temporarily unavailable. It may be overloaded, or undergoing scheduled maintenance. Please try again later.";

/// Starts `GET path` in the background.
fn spawn_get(
    proxy: &Proxy,
    host: &str,
    path: &str,
) -> tokio::task::JoinHandle<Result<testkit::Reply, reqwest::Error>> {
    let url = proxy.url(path);
    let host = (!host.is_empty()).then(|| host.to_string());
    tokio::spawn(async move { send(&client(), reqwest::Method::GET, &url, host.as_deref()).await })
}

/// Requests that should be held: the proxy counts them in flight for `app` (so they
/// arrived), the target has seen none of them, and none has been answered.
async fn assert_held<T>(proxy: &Proxy, app: &Backend, handles: &[tokio::task::JoinHandle<T>]) {
    let n = handles.len() as f64;
    proxy
        .wait_for_metric("kamal_proxy_http_in_flight_requests{service=\"app\"}", n)
        .await;
    assert_eq!(app.hits(), 0, "nothing reaches the target while paused");
    assert!(
        handles.iter().all(|h| !h.is_finished()),
        "the requests should be held while paused"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_holds_requests_until_resume() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start_with_metrics(&[], &[]).await;
    proxy.deploy("app", &app.target(), &[]).await;

    assert_eq!(proxy.ok(&["pause", "app", "--drain-timeout=1s"]).await, "");
    assert_eq!(proxy.list_rows().await[0][4], "paused");
    let held = [spawn_get(&proxy, "", "/"), spawn_get(&proxy, "", "/echo")];
    assert_held(&proxy, &app, &held).await;

    assert_eq!(proxy.ok(&["resume", "app"]).await, "");
    for h in held {
        let r = h.await.unwrap().expect("held request answered");
        assert_eq!(r.status, 200, "{r:?}");
    }
    assert_eq!(app.hits(), 2);
    assert_eq!(proxy.list_rows().await[0][4], "running");
    assert_eq!(proxy.get("", "/").await.body, "app");
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_sheds_requests_after_max_pause() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    proxy
        .ok(&["pause", "app", "--drain-timeout=1s", "--max-pause=300ms"])
        .await;

    let r = proxy.get("", "/").await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
    assert!(r.body.contains("504"), "{}", r.body);
    assert!(
        r.body
            .contains("The service did not respond within the allowed time limit."),
        "{}",
        r.body
    );
    assert_eq!(app.hits(), 0);
    proxy
        .wait_for_log("Rejecting request due to expired pause", |l| {
            l.contains("Rejecting request due to expired pause")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_answers_503_with_the_builtin_page() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;

    assert_eq!(proxy.ok(&["stop", "app", "--drain-timeout=1s"]).await, "");
    assert_eq!(proxy.list_rows().await[0][4], "stopped");
    let r = proxy.get("", "/").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
    assert!(r.body.contains(PAGE_503_TEXT), "{}", r.body);
    assert_eq!(app.hits(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_message_replaces_the_page_text() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;

    // As Kamal sends it: `--message="Back soon"` reaches argv as `--message=Back soon`.
    proxy
        .ok(&["stop", "app", "--drain-timeout=10s", "--message=Back soon"])
        .await;
    let r = proxy.get("", "/").await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("Back soon"), "{}", r.body);
    assert!(
        !r.body.contains(PAGE_503_TEXT),
        "the message replaces the default text"
    );

    // A new stop replaces the message; it is HTML-escaped.
    proxy
        .ok(&["stop", "app", "--message=<b>Upgrading</b> & back"])
        .await;
    let r = proxy.get("", "/").await;
    assert_eq!(r.status, 503);
    assert!(
        r.body.contains("&lt;b&gt;Upgrading&lt;/b&gt; &amp; back"),
        "{}",
        r.body
    );
    assert!(!r.body.contains("<b>Upgrading"), "{}", r.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_releases_held_requests_with_503() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start_with_metrics(&[], &[]).await;
    proxy.deploy("app", &app.target(), &[]).await;
    proxy
        .ok(&["pause", "app", "--drain-timeout=1s", "--max-pause=30s"])
        .await;
    let held = [spawn_get(&proxy, "", "/")];
    assert_held(&proxy, &app, &held).await;
    let [held] = held;

    proxy
        .ok(&[
            "stop",
            "app",
            "--drain-timeout=1s",
            "--message=Gone fishing",
        ])
        .await;
    // Released by the stop (503 with its message), not by --max-pause (a 504).
    let r = held.await.unwrap().unwrap();
    assert_eq!(r.status, 503);
    assert!(r.body.contains("Gone fishing"), "{}", r.body);
    assert_eq!(app.hits(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn health_check_path_answers_200_while_paused_or_stopped() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;

    // Running: the health check path is proxied like any other request.
    let r = proxy.get("", "/up").await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok"));
    let probes = app.health_hits();

    for command in [
        &["pause", "app", "--drain-timeout=1s"][..],
        &["stop", "app", "--drain-timeout=1s"],
    ] {
        proxy.ok(command).await;
        let r = proxy.get("", "/up").await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, ""),
            "{command:?}: answered by the proxy"
        );
        let head = send(
            &client(),
            reqwest::Method::HEAD,
            &proxy.url("/up?full=1"),
            None,
        )
        .await
        .unwrap();
        assert_eq!(head.status, 200, "{command:?}: HEAD, query ignored");
        assert_eq!(
            app.health_hits(),
            probes,
            "{command:?}: not forwarded to the target"
        );
    }
    // Only the exact path is bypassed.
    let r = proxy.get("", "/up/more").await;
    assert_eq!(r.status, 503);
    proxy.ok(&["resume", "app"]).await;
    let r = proxy.get("", "/up").await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok"));
}

#[tokio::test(flavor = "multi_thread")]
async fn health_check_bypass_uses_the_path_after_prefix_stripping() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &["--path-prefix=/app", "--health-check-path=/status/200"],
        )
        .await;
    proxy.ok(&["stop", "app", "--drain-timeout=1s"]).await;

    let r = proxy.get("", "/app/status/200").await;
    assert_eq!((r.status, r.body.as_str()), (200, ""));
    assert_eq!(
        proxy.get("", "/status/200").await.status,
        404,
        "not routed to the service"
    );
    assert_eq!(
        proxy.get("", "/app/up").await.status,
        503,
        "only the configured path"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_after_stop_serves_again() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    proxy.ok(&["stop", "app", "--drain-timeout=1s"]).await;
    assert_eq!(proxy.get("", "/").await.status, 503);

    proxy.ok(&["resume", "app"]).await;
    let r = proxy.get("", "/").await;
    assert_eq!((r.status, r.body.as_str()), (200, "app"));
    // Resuming a running service is harmless.
    proxy.ok(&["resume", "app"]).await;
    assert_eq!(proxy.get("", "/").await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_state_survives_redeploy() {
    let v1 = Backend::start("v1").await;
    let v2 = Backend::start("v2").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &v1.target(), &[]).await;
    proxy
        .ok(&["pause", "app", "--drain-timeout=1s", "--max-pause=300ms"])
        .await;

    proxy.deploy("app", &v2.target(), &[]).await;
    assert_eq!(proxy.list_rows().await[0][4], "paused");
    assert_eq!(
        proxy.get("", "/").await.status,
        504,
        "still paused, with its max-pause"
    );
    assert_eq!(v2.hits(), 0);

    proxy
        .ok(&["stop", "app", "--drain-timeout=1s", "--message=Later"])
        .await;
    proxy.deploy("app", &v1.target(), &[]).await;
    let r = proxy.get("", "/").await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("Later"), "{}", r.body);

    proxy.ok(&["resume", "app"]).await;
    assert_eq!(proxy.get("", "/").await.body, "v1");
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_and_stop_survive_restart() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let mut proxy = Proxy::start().await;
    proxy
        .deploy("held", &a.target(), &["--host=held.test"])
        .await;
    proxy
        .deploy("down", &b.target(), &["--host=down.test"])
        .await;
    proxy
        .ok(&["pause", "held", "--drain-timeout=1s", "--max-pause=300ms"])
        .await;
    proxy
        .ok(&[
            "stop",
            "down",
            "--drain-timeout=1s",
            "--message=Maintenance window",
        ])
        .await;

    proxy.restart().await;
    let rows = proxy.list_rows().await;
    assert_eq!(rows[0][0], "down");
    assert_eq!(rows[0][4], "stopped");
    assert_eq!(rows[1][0], "held");
    assert_eq!(rows[1][4], "paused");

    let r = proxy.get("down.test", "/").await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("Maintenance window"), "{}", r.body);
    let r = proxy.get("held.test", "/").await;
    assert_eq!(r.status, 504, "the saved max-pause applies after restart");

    proxy.ok(&["resume", "held"]).await;
    proxy.ok(&["resume", "down"]).await;
    assert_eq!(proxy.get("held.test", "/").await.body, "a");
    assert_eq!(proxy.get("down.test", "/").await.body, "b");
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_service_is_an_error() {
    let proxy = Proxy::start().await;
    for command in [
        &["pause", "nope"][..],
        &["stop", "nope"],
        &["stop", "nope", "--message=x"],
        &["resume", "nope"],
        &["remove", "nope"],
    ] {
        assert_eq!(
            proxy.fails(command).await,
            "Error: service not found\n",
            "{command:?}"
        );
    }
    assert!(proxy.list_rows().await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_returns_after_in_flight_requests_finish() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    let sent = tokio::time::Instant::now();
    let slow = spawn_get(&proxy, "", "/slow?ms=1000");
    poll_until("app.hits() == 1", Duration::from_secs(5), || async {
        app.hits() == 1
    })
    .await;

    proxy.ok(&["pause", "app", "--drain-timeout=10s"]).await;
    assert!(
        sent.elapsed() >= Duration::from_millis(900),
        "pause returned before the in-flight request finished"
    );
    let r = slow.await.unwrap().unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "slow 1000"));
}
