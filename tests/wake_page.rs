//! `--wake-page` against the real Docker Engine: while a sleeping app boots, a browser
//! navigation gets a self-refreshing waiting page after the grace period, an API call
//! beside it stays held and gets the app's answer, and the page's refreshes never start a
//! second wake (the engine's event stream and the wake counter say so).

use std::time::Duration;
use testkit::docker::{self, TestContainer};
use testkit::{Proxy, client};

const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

async fn proxy() -> Proxy {
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    Proxy::start_with_metrics(&[&socket], &[]).await
}

/// An app that takes `boot` to listen after every start.
fn slow_app(prefix: &str, boot: Duration) -> TestContainer {
    let c = docker::run_app_container(prefix, boot);
    docker::wait_until_ready(&c).expect("app container ready");
    c
}

async fn deploy(p: &Proxy, c: &TestContainer, extra: &[&str]) {
    let target = format!("127.0.0.1:{}", c.port);
    let container = format!("--sleep-container={}", c.name);
    // Longer than the page's refresh interval: a service that fell asleep again between
    // two reloads would be woken again by the next, rightly.
    let mut flags = vec![
        "--sleep-after=3s",
        "--wake-page",
        container.as_str(),
        "--health-check-interval=200ms",
    ];
    flags.extend_from_slice(extra);
    p.deploy("app", &target, &flags).await;
    p.wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;
}

fn navigation(p: &Proxy, path: &str) -> reqwest::RequestBuilder {
    client()
        .get(p.url(path))
        .header("accept", BROWSER_ACCEPT)
        .header("sec-fetch-mode", "navigate")
}

/// Loads `path` as a browser does, following the page's refresh until the app answers;
/// returns the waiting pages seen and the app's answer.
async fn browse_until_served(p: &Proxy, path: &str) -> (Vec<reqwest::Response>, String) {
    let mut pages = Vec::new();
    loop {
        let r = navigation(p, path).send().await.unwrap();
        if r.status() == 200 {
            return (pages, r.text().await.unwrap());
        }
        assert_eq!(r.status(), 503, "only the waiting page stands in");
        let retry: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        pages.push(r);
        assert!(pages.len() < 30, "the app never answered");
        // The browser waits as the page says before it reloads.
        tokio::time::sleep(Duration::from_secs(retry)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_browser_gets_the_waiting_page_while_an_api_call_beside_it_is_held() {
    if !docker::require_docker() {
        return;
    }
    let c = slow_app("wp-app", Duration::from_secs(4));
    let p = proxy().await;
    deploy(&p, &c, &[]).await;
    let since = docker::now_unix();

    let api = tokio::spawn({
        let url = p.url("/api/things");
        async move {
            let r = client()
                .get(url)
                .header("accept", "application/json")
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap())
        }
    });
    let (pages, served) = browse_until_served(&p, "/").await;
    assert_eq!(served, "wp-app");
    assert!(!pages.is_empty(), "a 4 s boot shows the page at least once");
    for page in pages {
        let h = page.headers();
        assert_eq!(h["cache-control"], "no-store");
        assert_eq!(h["refresh"], "2");
        assert_eq!(h["content-type"], "text/html; charset=utf-8");
        let body = page.text().await.unwrap();
        assert!(body.contains("Starting app…"), "{body}");
        assert!(body.contains("http-equiv=\"refresh\""), "{body}");
        assert!(
            !body.contains(&c.name),
            "the page names the container: {body}"
        );
    }
    let (status, body) = api.await.unwrap();
    assert_eq!(status, 200, "the API call was held, never given the page");
    assert_eq!(body, "wp-app");

    // Every reload was held again, none started a second wake: the engine recorded one
    // start, and the proxy counted one wake.
    assert_eq!(docker::starts_before_marker(&c.name, since).await, 1);
    p.wait_for_metric(
        "kamal_proxy_service_wakes_total{result=\"success\",service=\"app\",tier=\"sleeping\"}",
        1.0,
    )
    .await;
    p.wait_for_log("the page served", |l| {
        l.contains("Answered a held navigation with the wake page")
    })
    .await;

    // Awake, a navigation goes straight through.
    let r = navigation(&p, "/again").send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn wake_html_in_the_error_pages_replaces_the_built_in_page() {
    if !docker::require_docker() {
        return;
    }
    let pages = tempfile::tempdir().unwrap();
    std::fs::write(
        pages.path().join("wake.html"),
        "<p>Please hold on, {{ .Message }} is on its way</p>",
    )
    .unwrap();
    let c = slow_app("wp-custom", Duration::from_secs(3));
    let p = proxy().await;
    let flag = format!("--error-pages={}", pages.path().display());
    deploy(&p, &c, &[&flag]).await;

    let r = navigation(&p, "/").send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["refresh"], "2");
    assert_eq!(
        r.text().await.unwrap(),
        "<p>Please hold on, app is on its way</p>"
    );
    let (_, served) = browse_until_served(&p, "/").await;
    assert_eq!(served, "wp-custom");
}
