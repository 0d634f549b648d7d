//! Denial of wallet, against the real Docker Engine: the access gates sit ahead of the
//! sleep gate, so requests they deny, throttle, challenge or redirect never start a
//! sleeping service's container; and a request deadline that fires while a request is
//! held for a wake answers 504, never an empty 200.

use std::time::Duration;
use testkit::docker::{self, TestContainer};
use testkit::{Proxy, client, poll_until};
use tokio::time::Instant;

async fn proxy() -> Proxy {
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    Proxy::start_with(&[&socket], &[]).await
}

async fn app(prefix: &str, boot_delay: Duration) -> TestContainer {
    docker::app_container_ready(prefix, boot_delay, &[]).await
}

async fn wait_until_sleeping(p: &Proxy, c: &TestContainer) {
    p.wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;
    assert!(!docker::is_running(&c.name));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_denied_throttled_unauthenticated_or_redirected_requests_start_nothing() {
    if !docker::require_docker() {
        return;
    }
    let c = app("gates-wallet", Duration::ZERO).await;
    let p = proxy().await;
    let target = format!("127.0.0.1:{}", c.port);
    let container = format!("--sleep-container={}", c.name);
    p.deploy(
        "app",
        &target,
        &[
            "--sleep-after=1s",
            &container,
            "--health-check-interval=200ms",
            "--host=app.test,www.app.test",
            "--canonical-host=app.test",
            "--trusted-proxy=127.0.0.1",
            "--allow-ip=10.0.0.0/8",
            "--redirect=/old/(.*)=/new/$1",
            "--rate-limit=0.01",
            "--basic-auth=admin:hunter2",
        ],
    )
    .await;
    wait_until_sleeping(&p, &c).await;

    let since = docker::now_unix();
    let http = client();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let requests = (0..1000).map(|i| {
        let http = http.clone();
        let url = p.url(&format!("/page/{i}"));
        let old = p.url(&format!("/old/{i}"));
        tokio::spawn(async move {
            let req = match i % 5 {
                // Outside the allow list (the forwarded client, resolved through the
                // trusted proxy 127.0.0.1): 403.
                0 => http
                    .get(url)
                    .header("host", "app.test")
                    .header("x-forwarded-for", format!("198.51.100.{}", i % 250)),
                // Allowed but not the canonical host: 301.
                1 => http
                    .get(url)
                    .header("host", "www.app.test")
                    .header("x-forwarded-for", "10.0.0.1"),
                // A --redirect rule: 301.
                2 => http
                    .get(old)
                    .header("host", "app.test")
                    .header("x-forwarded-for", "10.0.0.1"),
                // Wrong password (one client, so the rate limit throttles after the
                // first): 401 once, then 429.
                3 => http
                    .post(url)
                    .header("host", "app.test")
                    .header("x-forwarded-for", "10.0.0.2")
                    .basic_auth("admin", Some("guess")),
                // No credentials at all, each from its own client: 401.
                _ => http
                    .get(url)
                    .header("host", "app.test")
                    .header("x-forwarded-for", format!("10.1.{}.{}", i / 250, i % 250)),
            };
            req.send().await.map(|r| r.status().as_u16())
        })
    });
    for r in futures_util::future::join_all(requests).await {
        *statuses.entry(r.unwrap().expect("request")).or_default() += 1;
    }
    eprintln!("statuses: {statuses:?}");
    assert_eq!(statuses.get(&403), Some(&200));
    assert_eq!(statuses.get(&301), Some(&400));
    assert_eq!(statuses.get(&429), Some(&199));
    assert_eq!(statuses.get(&401), Some(&201));
    assert_eq!(statuses.values().sum::<usize>(), 1000);
    assert!(!statuses.contains_key(&200));

    assert_eq!(
        docker::start_events_since(&c.name, since),
        0,
        "no container start for any gated request"
    );
    assert_eq!(p.state_of("app").await, "sleeping");
    assert!(!docker::is_running(&c.name));

    // One authorised request wakes it, once.
    let r = http
        .get(p.url("/hello"))
        .header("host", "app.test")
        .header("x-forwarded-for", "10.9.9.9")
        .basic_auth("admin", Some("hunter2"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "gates-wallet");
    assert_eq!(docker::start_events_since(&c.name, since), 1);
    assert!(docker::is_running(&c.name));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deadline_that_fires_during_a_wake_answers_504_and_the_wake_completes() {
    if !docker::require_docker() {
        return;
    }
    // The app needs 2.5 s to listen after its container starts: longer than the deadline.
    let c = app("gates-deadline", Duration::from_millis(2500)).await;
    let p = proxy().await;
    let target = format!("127.0.0.1:{}", c.port);
    let container = format!("--sleep-container={}", c.name);
    p.deploy(
        "app",
        &target,
        &[
            "--sleep-after=1s",
            &container,
            "--health-check-interval=200ms",
            "--request-timeout=800ms",
        ],
    )
    .await;
    wait_until_sleeping(&p, &c).await;

    let since = docker::now_unix();
    let http = client();
    let started = Instant::now();
    let r = http.get(p.url("/hello")).send().await.unwrap();
    let waited = started.elapsed();
    assert_eq!(r.status(), 504, "a held request past its deadline is a 504");
    assert!(
        r.text().await.unwrap().contains("504"),
        "with the 504 page, not an empty body"
    );
    // A 504, not the app's 200 after its 2.5 s boot: the deadline fired first.
    assert!(waited >= Duration::from_millis(700), "{waited:?}");

    // The wake is detached from the request: it completes, and the next request is served.
    let body = poll_until(
        "the detached wake to serve",
        Duration::from_secs(30),
        || async {
            let r = http.get(p.url("/hello")).send().await.unwrap();
            if r.status() == 200 {
                return Ok(r.text().await.unwrap());
            }
            assert_eq!(r.status(), 504);
            Err(r.status())
        },
    )
    .await;
    assert_eq!(body, "gates-deadline");
    assert_eq!(docker::start_events_since(&c.name, since), 1, "one wake");
}
