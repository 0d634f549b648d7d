//! Scale-to-zero metrics after real sleep/wake cycles against the Docker Engine, checked
//! by value, by `promtool check metrics` (the whole endpoint), and by a real Prometheus
//! server scraping the proxy and answering PromQL.

use std::process::Stdio;
use std::time::Duration;
use testkit::docker::{self, TestContainer};
use testkit::{Proxy, client, free_port, poll_until};

async fn proxy() -> Proxy {
    let socket = format!("--docker-socket={}", docker::docker_socket_path().display());
    Proxy::start_with_metrics(&[&socket], &[]).await
}

async fn deploy(p: &Proxy, service: &str, c: &TestContainer, tier: &str) {
    let target = format!("127.0.0.1:{}", c.port);
    let container = format!("--sleep-container={}", c.name);
    let host = format!("--host={service}.test");
    p.deploy(
        service,
        &target,
        &[tier, &container, &host, "--health-check-interval=200ms"],
    )
    .await;
}

async fn metric(p: &Proxy, series: &str) -> f64 {
    p.metric(series)
        .await
        .unwrap_or_else(|| panic!("{series} is not exposed"))
}

async fn get(p: &Proxy, host: &str) -> u16 {
    client()
        .get(p.url("/"))
        .header("host", host)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A `bin` from Debian's package, or `None` (skip) off CI.
fn require_binary(bin: &str, package: &str) -> bool {
    if std::process::Command::new(bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true but `{bin}` is missing: install Debian's {package}");
    }
    eprintln!("skipping: `{bin}` is missing (apt-get install {package})");
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sleep_wake_cycle_in_each_tier_is_counted_and_the_endpoint_lints_clean() {
    if !docker::require_docker() || !require_binary("promtool", "prometheus") {
        return;
    }
    // Stopped tier: the app boots in 2 s, so the held request is seen in the gauge.
    let slow = docker::run_app_container("met-stop", Duration::from_secs(2));
    docker::wait_until_ready(&slow).expect("app ready");
    let fast = docker::run_app_container("met-freeze", Duration::ZERO);
    docker::wait_until_ready(&fast).expect("app ready");
    let p = proxy().await;
    deploy(&p, "app", &slow, "--sleep-after=1s").await;
    deploy(&p, "frz", &fast, "--freeze-after=1s").await;

    let state = |service: &str, state: &str| {
        format!("kamal_proxy_service_idle_state{{service=\"{service}\",state=\"{state}\"}}")
    };
    p.wait_for_metric(&state("app", "sleeping"), 1.0).await;
    p.wait_for_metric(&state("frz", "frozen"), 1.0).await;
    assert_eq!(metric(&p, &state("app", "active")).await, 0.0);
    assert_eq!(
        metric(
            &p,
            "kamal_proxy_service_sleeps_total{result=\"success\",service=\"app\",tier=\"sleeping\"}"
        )
        .await,
        1.0
    );
    assert_eq!(
        metric(
            &p,
            "kamal_proxy_service_sleeps_total{result=\"success\",service=\"frz\",tier=\"frozen\"}"
        )
        .await,
        1.0
    );
    let listed = p.list_rows().await;
    assert!(
        listed
            .iter()
            .any(|row| row[0] == "app" && row.iter().any(|c| c.starts_with("sleeping "))),
        "list shows how long it has slept: {listed:?}"
    );

    let held = tokio::spawn({
        let url = p.url("/");
        async move {
            client()
                .get(url)
                .header("host", "app.test")
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    p.wait_for_metric("kamal_proxy_service_held_requests{service=\"app\"}", 1.0)
        .await;
    // The boot takes 2 s: the wake in progress shows in the state gauge.
    p.wait_for_metric(&state("app", "waking"), 1.0).await;
    assert_eq!(metric(&p, &state("app", "sleeping")).await, 0.0);
    assert_eq!(held.await.unwrap(), 200);
    assert_eq!(get(&p, "frz.test").await, 200);

    for (service, tier) in [("app", "sleeping"), ("frz", "frozen")] {
        assert_eq!(metric(&p, &state(service, "active")).await, 1.0);
        let wakes = format!(
            "kamal_proxy_service_wakes_total{{result=\"success\",service=\"{service}\",tier=\"{tier}\"}}"
        );
        assert_eq!(metric(&p, &wakes).await, 1.0);
        let failed = wakes.replace("success", "failure");
        assert_eq!(metric(&p, &failed).await, 0.0);
        let count = format!(
            "kamal_proxy_service_wake_duration_seconds_count{{service=\"{service}\",tier=\"{tier}\"}}"
        );
        assert_eq!(metric(&p, &count).await, 1.0);
    }
    // The boot took 2 s, so the wake did too; the thaw took far less than the boot.
    let sum = |service: &str, tier: &str| {
        format!(
            "kamal_proxy_service_wake_duration_seconds_sum{{service=\"{service}\",tier=\"{tier}\"}}"
        )
    };
    assert!(metric(&p, &sum("app", "sleeping")).await >= 2.0);
    assert!(metric(&p, &sum("frz", "frozen")).await < 2.0);
    assert_eq!(
        metric(&p, "kamal_proxy_service_held_requests{service=\"app\"}").await,
        0.0
    );

    // The whole endpoint, as a scraper sees it, passes Prometheus' own linter.
    let text = client()
        .get(p.metrics_url())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut lint = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = lint.stdin.take().unwrap();
        stdin.write_all(text.as_bytes()).await.unwrap();
    }
    let out = lint.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Removing a service drops its series.
    p.ok(&["remove", "frz"]).await;
    assert_eq!(p.metric(&state("frz", "active")).await, None);
}

/// A real Prometheus (Debian's), on loopback, scraping the proxy every second.
struct Prometheus {
    child: tokio::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn scraping(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: kamal-proxy\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = tokio::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("run prometheus");
        Prometheus {
            child,
            port,
            _dir: dir,
        }
    }

    /// The instant vector `query` evaluates to: each series' value.
    async fn query(&self, query: &str) -> Option<Vec<f64>> {
        let escaped: String = query
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let url = format!(
            "http://127.0.0.1:{}/api/v1/query?query={escaped}",
            self.port
        );
        let reply: serde_json::Value = client().get(url).send().await.ok()?.json().await.ok()?;
        let result = reply["data"]["result"].as_array()?;
        result
            .iter()
            .map(|r| r["value"][1].as_str()?.parse().ok())
            .collect()
    }

    /// Polls until `query` has exactly one series that satisfies `ok`; returns its value.
    async fn wait_for(&self, query: &str, ok: impl Fn(f64) -> bool) -> f64 {
        poll_until(
            &format!("prometheus to answer {query}"),
            Duration::from_secs(30),
            || async {
                match self.query(query).await {
                    Some(v) if v.len() == 1 && ok(v[0]) => Ok(v[0]),
                    other => Err(other),
                }
            },
        )
        .await
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_answers_promql_for_the_wake_count_and_the_wake_time_quantile() {
    if !docker::require_docker() || !require_binary("prometheus", "prometheus") {
        return;
    }
    let c = docker::run_app_container("met-prom", Duration::from_millis(300));
    docker::wait_until_ready(&c).expect("app ready");
    let p = proxy().await;
    let scrape_target = p.metrics_url();
    let scrape_target = scrape_target
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let prometheus = Prometheus::scraping(scrape_target).await;
    deploy(&p, "app", &c, "--sleep-after=1s").await;
    p.wait_for_state("app", "sleeping", Duration::from_secs(20))
        .await;
    assert_eq!(get(&p, "app.test").await, 200);
    let logged = p
        .wait_for_log("the wake", |l| l.contains("Service awake"))
        .await;
    let line: serde_json::Value = serde_json::from_str(&logged).unwrap();
    let wake_seconds = line["wake_ms"].as_f64().unwrap() / 1000.0;

    let wakes = prometheus
        .wait_for(
            "sum(kamal_proxy_service_wakes_total{service=\"app\",result=\"success\"})",
            |v| v == 1.0,
        )
        .await;
    assert_eq!(wakes, 1.0);
    let p90 = prometheus
        .wait_for(
            "histogram_quantile(0.9, sum by (le) (kamal_proxy_service_wake_duration_seconds_bucket{service=\"app\"}))",
            f64::is_finite,
        )
        .await;
    // One observation: the quantile lies in the bucket that holds the logged wake time.
    let bounds = [
        0.0, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    ];
    let upper = bounds
        .iter()
        .position(|&b| b >= wake_seconds)
        .expect("wake within the buckets");
    let (low, high) = (bounds[upper.saturating_sub(1)], bounds[upper]);
    assert!(
        (low..=high).contains(&p90),
        "p90 {p90} outside [{low}, {high}] holding the logged wake of {wake_seconds}s"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_wake_is_counted_as_a_failure_and_the_service_sleeps() {
    if !docker::require_docker() {
        return;
    }
    let c = docker::run_app_container("met-fail", Duration::ZERO);
    docker::wait_until_ready(&c).expect("app ready");
    let p = proxy().await;
    deploy(&p, "app", &c, "--sleep-after=1s").await;
    let state = |state: &str| {
        format!("kamal_proxy_service_idle_state{{service=\"app\",state=\"{state}\"}}")
    };
    p.wait_for_metric(&state("sleeping"), 1.0).await;
    docker::remove(&c.name);

    assert_eq!(get(&p, "app.test").await, 503);
    let wakes = |result: &str| {
        format!(
            "kamal_proxy_service_wakes_total{{result=\"{result}\",service=\"app\",tier=\"sleeping\"}}"
        )
    };
    p.wait_for_metric(&wakes("failure"), 1.0).await;
    assert_eq!(metric(&p, &wakes("success")).await, 0.0);
    assert_eq!(
        metric(
            &p,
            "kamal_proxy_service_wake_duration_seconds_count{service=\"app\",tier=\"sleeping\"}"
        )
        .await,
        0.0,
        "a failed wake is no wake time"
    );
    // After the clean-up it is asleep again, not stuck waking.
    p.wait_for_metric(&state("sleeping"), 1.0).await;
    assert_eq!(metric(&p, &state("waking")).await, 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_restores_the_frozen_state_in_the_gauge() {
    if !docker::require_docker() {
        return;
    }
    let c = docker::run_app_container("met-restart", Duration::ZERO);
    docker::wait_until_ready(&c).expect("app ready");
    let mut p = proxy().await;
    deploy(&p, "frz", &c, "--freeze-after=1s").await;
    let state = |state: &str| {
        format!("kamal_proxy_service_idle_state{{service=\"frz\",state=\"{state}\"}}")
    };
    p.wait_for_metric(&state("frozen"), 1.0).await;

    let since = docker::now_precise();
    p.restart().await;
    // Read at once: restored frozen, not active and frozen again by the idle timer, which
    // the engine's record confirms (nothing was done to the container).
    assert_eq!(metric(&p, &state("frozen")).await, 1.0);
    assert_eq!(metric(&p, &state("active")).await, 0.0);
    assert!(
        docker::actions_before_marker(&c.name, &since)
            .await
            .is_empty(),
        "the restart touched the container"
    );
    assert_eq!(get(&p, "frz.test").await, 200);
    assert_eq!(metric(&p, &state("active")).await, 1.0);
}
