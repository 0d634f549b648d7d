//! What operators see (upstream §7): the access log line, slog's line shape, the liveness
//! ping, and the Prometheus endpoint.

use std::time::Duration;
use testkit::backend::Backend;
use testkit::free_port;
use testkit::raw;
use testkit::{Proxy, client, poll_until};
use tokio::io::AsyncWriteExt;

/// The top-level keys of a JSON object, in the order they appear in the raw text.
fn keys_in_order(line: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut depth = 0;
    let mut in_string = false;
    let mut escaped = false;
    let mut current = String::new();
    let mut expecting_key = false;
    let mut reading_key = false;
    for c in line.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
                if reading_key {
                    keys.push(std::mem::take(&mut current));
                    reading_key = false;
                }
                continue;
            }
            if reading_key {
                current.push(c);
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                reading_key = depth == 1 && expecting_key;
                expecting_key = false;
            }
            '{' | '[' => {
                depth += 1;
                expecting_key = depth == 1;
            }
            '}' | ']' => depth -= 1,
            ',' => expecting_key = depth == 1,
            _ => {}
        }
    }
    keys
}

/// The raw access-log line for `path`, waiting for it to be written.
async fn raw_access_line(proxy: &Proxy, path: &str) -> String {
    let needle = format!("\"path\":\"{path}\"");
    proxy
        .wait_for_log(&format!("an access-log line for {path}"), |l| {
            l.contains("\"msg\":\"Request\"") && l.contains(&needle)
        })
        .await
}

const ACCESS_KEYS: [&str; 23] = [
    "time",
    "level",
    "msg",
    "host",
    "port",
    "path",
    "request_id",
    "status",
    "service",
    "target",
    "duration",
    "method",
    "req_content_length",
    "req_content_type",
    "resp_content_length",
    "resp_content_type",
    "client_addr",
    "client_port",
    "remote_addr",
    "user_agent",
    "proto",
    "scheme",
    "query",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn access_log_line_has_upstreams_keys_in_order() {
    let port = free_port();
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with(&[&format!("--http-port={port}")], &[]).await;
    assert_eq!(proxy.http_port, port);
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--log-request-header=X-Custom",
                "--log-response-header=Cache-Control",
                "--log-response-header=X-App",
            ],
        )
        .await;
    let query =
        "cache-control=no-cache&x-app=a&x-app=b&content-type=text/plain%3B%20charset%3Dutf-8";
    let mut s = raw::connect(port).await;
    let client_port = s.local_addr().unwrap().port();
    let request = format!(
        "POST /headers?{query} HTTP/1.1\r\nHost: app.test:8080\r\nX-Forwarded-For: 10.1.1.1\r\n\
User-Agent: test-agent/1.0\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nX-Custom: c1\r\n\
x-custom: c2\r\nX-Request-ID: req-1\r\n\r\nhello"
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut reader = tokio::io::BufReader::new(s);
    let r = raw::read_response(&mut reader, false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "headers");

    let line = raw_access_line(&proxy, "/headers").await;
    let mut expected: Vec<&str> = ACCESS_KEYS.to_vec();
    expected.extend(["req_x_custom", "resp_cache_control", "resp_x_app"]);
    assert_eq!(keys_in_order(&line), expected, "{line}");

    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["level"], "INFO");
    assert_eq!(v["host"], "app.test:8080");
    assert_eq!(v["port"], port);
    assert_eq!(v["path"], "/headers");
    assert_eq!(v["request_id"], "req-1");
    assert_eq!(v["status"], 200);
    assert_eq!(v["service"], "app");
    assert_eq!(v["target"], backend.target().as_str());
    assert!(v["duration"].as_i64().is_some_and(|d| d > 0), "{line}");
    assert_eq!(v["method"], "POST");
    assert_eq!(v["req_content_length"], 5);
    assert_eq!(v["req_content_type"], "text/plain");
    assert_eq!(v["resp_content_length"], 7);
    assert_eq!(v["resp_content_type"], "text/plain; charset=utf-8");
    assert_eq!(v["client_addr"], "127.0.0.1");
    assert_eq!(v["client_port"], client_port.to_string().as_str());
    assert_eq!(v["remote_addr"], "10.1.1.1");
    assert_eq!(v["user_agent"], "test-agent/1.0");
    assert_eq!(v["proto"], "HTTP/1.1");
    assert_eq!(v["scheme"], "http");
    assert_eq!(v["query"], query);
    assert_eq!(v["req_x_custom"], "c1,c2");
    assert_eq!(v["resp_cache_control"], "no-cache");
    assert_eq!(v["resp_x_app"], "a,b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn access_log_values_for_unrouted_requests_and_bodies() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--host=app.test", "--log-request-header=X-Missing"],
        )
        .await;

    let r = raw::send(
        proxy.http_port,
        b"GET /nowhere HTTP/1.1\r\nHost: other.test\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 404);
    let line = raw_access_line(&proxy, "/nowhere").await;
    assert_eq!(
        keys_in_order(&line),
        ACCESS_KEYS,
        "unrouted lines carry no header keys: {line}"
    );
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["status"], 404);
    assert_eq!(v["service"], "");
    assert_eq!(v["target"], "");
    assert_eq!(
        v["remote_addr"], "127.0.0.1",
        "no X-Forwarded-For: the socket address"
    );
    assert_eq!(v["req_content_length"], 0);
    assert_eq!(v["resp_content_type"], "text/html; charset=utf-8");
    assert_eq!(v["resp_content_length"], r.body.len());

    let r = raw::send(
        proxy.http_port,
        b"POST /chunked HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value =
        serde_json::from_str(&raw_access_line(&proxy, "/chunked").await).unwrap();
    assert_eq!(v["req_content_length"], -1, "chunked: length unknown");
    assert_eq!(
        v["req_x_missing"], "",
        "an absent logged header is an empty string"
    );

    // No Content-Length and no Transfer-Encoding: an HTTP/1.1 request without a body.
    let r = raw::send(
        proxy.http_port,
        b"POST /bodiless HTTP/1.1\r\nHost: app.test\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value =
        serde_json::from_str(&raw_access_line(&proxy, "/bodiless").await).unwrap();
    assert_eq!(v["req_content_length"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn access_log_path_is_decoded_and_query_raw() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &backend.target(), &[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /caf%C3%A9%20menu?q=%C3%A9+x HTTP/1.1\r\nHost: app.test\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
    let v: serde_json::Value =
        serde_json::from_str(&raw_access_line(&proxy, "/café menu").await).unwrap();
    assert_eq!(v["query"], "q=%C3%A9+x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_stdout_line_is_slog_json_with_time_level_msg_first() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("app", &backend.target(), &["--host=app.test"])
        .await;
    let c = client();
    c.get(proxy.url("/"))
        .header("host", "app.test")
        .send()
        .await
        .unwrap();
    c.get(proxy.url("/"))
        .header("host", "other.test")
        .send()
        .await
        .unwrap();
    proxy.ok(&["stop", "app", "--drain-timeout=1s"]).await;
    proxy.ok(&["resume", "app"]).await;
    raw_access_line(&proxy, "/").await;
    let lines: Vec<String> = proxy
        .logs()
        .into_iter()
        .filter(|l| !l.starts_with("stderr: "))
        .collect();
    assert!(lines.len() >= 6, "{lines:?}");
    for line in &lines {
        let keys = keys_in_order(line);
        assert_eq!(
            keys.get(..3),
            Some(&["time".to_string(), "level".into(), "msg".into()][..]),
            "{line}"
        );
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            matches!(
                v["level"].as_str(),
                Some("DEBUG" | "INFO" | "WARN" | "ERROR")
            ),
            "{line}"
        );
        let time = v["time"].as_str().unwrap();
        assert!(
            time.len() >= 20 && time.as_bytes()[4] == b'-' && time.as_bytes()[10] == b'T',
            "{line}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ping_answers_on_any_host_and_is_not_logged_or_routed() {
    let proxy = Proxy::start().await;
    let resp = client()
        .get(proxy.url("/.kamal-proxy/ping"))
        .header("host", "anything.test")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "answers with no service deployed");
    assert_eq!(resp.headers()["cache-control"], "no-store");

    let backend = Backend::start("app").await;
    proxy.deploy("app", &backend.target(), &[]).await;
    let hits = backend.hits();
    for host in ["app.test", "other.test:8080"] {
        let resp = client()
            .get(proxy.url("/.kamal-proxy/ping"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["cache-control"], "no-store");
    }
    assert_eq!(
        backend.hits(),
        hits,
        "the catch-all service never sees the ping"
    );
    client().get(proxy.url("/after")).send().await.unwrap();
    raw_access_line(&proxy, "/after").await;
    assert!(
        !proxy
            .logs()
            .iter()
            .any(|l| l.contains("/.kamal-proxy/ping")),
        "ping was logged: {:?}",
        proxy.logs()
    );
}

async fn scrape(port: u16, path: &str) -> String {
    let resp = client()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

/// The value of the sample named exactly `series` (name plus labels), if exported.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

async fn wait_for_sample(port: u16, series: &str, value: f64) -> String {
    poll_until(
        &format!("{series} to be {value}"),
        Duration::from_secs(10),
        || async {
            let text = scrape(port, "/metrics").await;
            if sample(&text, series) == Some(value) {
                Ok(text)
            } else {
                Err(text)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_count_requests_by_service_method_and_status() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with_metrics(&[], &[]).await;
    let metrics = proxy
        .metrics_port
        .expect("metrics port in the start-up line");
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--host=app.test", "--exclude-metrics-path=/up2"],
        )
        .await;
    let c = client();
    let send = |method: &str, path: &str, host: &str| {
        c.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            proxy.url(path),
        )
        .header("host", host)
        .send()
    };
    for _ in 0..3 {
        assert_eq!(send("GET", "/", "app.test").await.unwrap().status(), 200);
    }
    assert_eq!(
        send("GET", "/status/201", "app.test")
            .await
            .unwrap()
            .status(),
        201
    );
    assert_eq!(
        send("PROPFIND", "/", "app.test").await.unwrap().status(),
        200
    );
    assert_eq!(send("DELETE", "/", "app.test").await.unwrap().status(), 200);
    for _ in 0..2 {
        assert_eq!(send("GET", "/up2", "app.test").await.unwrap().status(), 200);
    }
    assert_eq!(send("GET", "/", "other.test").await.unwrap().status(), 404);
    poll_until("9 access-log lines", Duration::from_secs(10), || async {
        proxy.access_log().len() >= 9
    })
    .await;

    let text = scrape(metrics, "/metrics").await;
    let total = "kamal_proxy_http_requests_total";
    assert!(text.contains(&format!("# TYPE {total} counter")), "{text}");
    for (labels, n) in [
        (r#"{method="GET",service="app",status="200"}"#, 3.0),
        (r#"{method="GET",service="app",status="201"}"#, 1.0),
        (r#"{method="OTHER",service="app",status="200"}"#, 1.0),
        (r#"{method="DELETE",service="app",status="200"}"#, 1.0),
        (r#"{method="GET",service="",status="404"}"#, 1.0),
    ] {
        assert_eq!(
            sample(&text, &format!("{total}{labels}")),
            Some(n),
            "{total}{labels}:\n{text}"
        );
    }
    assert!(!text.contains("PROPFIND"), "{text}");

    let hist = "kamal_proxy_http_request_duration_seconds";
    assert!(text.contains(&format!("# TYPE {hist} histogram")), "{text}");
    let labels = r#"method="GET",service="app",status="200""#;
    for le in [
        "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf",
    ] {
        let series = format!("{hist}_bucket{{{labels},le=\"{le}\"}}");
        assert!(
            sample(&text, &series).is_some(),
            "missing {series}:\n{text}"
        );
    }
    assert_eq!(
        sample(&text, &format!("{hist}_bucket{{{labels},le=\"+Inf\"}}")),
        Some(3.0)
    );
    assert_eq!(
        sample(&text, &format!("{hist}_count{{{labels}}}")),
        Some(3.0)
    );
    assert!(sample(&text, &format!("{hist}_sum{{{labels}}}")).is_some_and(|s| s > 0.0));

    // The excluded path is logged (twice) but counted nowhere.
    let logged = proxy
        .access_log()
        .iter()
        .filter(|l| l["path"] == "/up2")
        .count();
    assert_eq!(logged, 2);
    let counted: f64 = text
        .lines()
        .filter(|l| l.starts_with(total) && l.contains("service=\"app\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(
        counted, 6.0,
        "only the 6 non-excluded requests count:\n{text}"
    );
    // And the method is still logged as sent.
    assert!(proxy.access_log().iter().any(|l| l["method"] == "PROPFIND"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_are_served_on_every_path() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with_metrics(&[], &[]).await;
    let metrics = proxy
        .metrics_port
        .expect("metrics port in the start-up line");
    proxy.deploy("app", &backend.target(), &[]).await;
    client().get(proxy.url("/")).send().await.unwrap();
    let series = r#"kamal_proxy_http_requests_total{method="GET",service="app",status="200"}"#;
    wait_for_sample(metrics, series, 1.0).await;
    for path in ["/", "/metrics", "/x/y?z=1"] {
        let text = scrape(metrics, path).await;
        assert_eq!(sample(&text, series), Some(1.0), "{path}:\n{text}");
        assert!(
            text.contains("# HELP kamal_proxy_http_requests_total"),
            "{path}"
        );
    }
    // Both start-up lines name the port actually bound.
    let address = format!("\"address\":\":{metrics}\"");
    proxy
        .wait_for_log("Metrics enabled with its port", |l| {
            l.contains("\"msg\":\"Metrics enabled\"") && l.contains(&address)
        })
        .await;
    let started = format!("\"metrics\":{metrics}");
    proxy
        .wait_for_log("Server started with the metrics port", |l| {
            l.contains("\"msg\":\"Server started\"") && l.contains(&started)
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_flight_gauge_tracks_requests_until_they_finish() {
    let loud = Backend::start("loud").await;
    let quiet = Backend::start("quiet").await;
    let proxy = Proxy::start_with_metrics(&[], &[]).await;
    let metrics = proxy
        .metrics_port
        .expect("metrics port in the start-up line");
    proxy
        .deploy("app", &loud.target(), &["--host=app.test"])
        .await;
    proxy
        .deploy(
            "quiet",
            &quiet.target(),
            &["--host=quiet.test", "--exclude-metrics-path=/slow"],
        )
        .await;

    let c = client();
    let quiet_req = tokio::spawn(
        c.get(proxy.url("/slow?ms=5000"))
            .header("host", "quiet.test")
            .send(),
    );
    poll_until(
        "the excluded request to reach its app",
        Duration::from_secs(10),
        || async { quiet.hits() == 1 },
    )
    .await;
    let loud_req = tokio::spawn(
        c.get(proxy.url("/slow?ms=2500"))
            .header("host", "app.test")
            .send(),
    );
    let text = wait_for_sample(
        metrics,
        r#"kamal_proxy_http_in_flight_requests{service="app"}"#,
        1.0,
    )
    .await;
    assert!(
        text.contains("# TYPE kamal_proxy_http_in_flight_requests gauge"),
        "{text}"
    );
    assert!(
        sample(
            &text,
            r#"kamal_proxy_http_in_flight_requests{service="quiet"}"#
        )
        .unwrap_or(0.0)
            == 0.0,
        "an excluded path is not tracked in flight:\n{text}"
    );
    assert_eq!(loud_req.await.unwrap().unwrap().status(), 200);
    wait_for_sample(
        metrics,
        r#"kamal_proxy_http_in_flight_requests{service="app"}"#,
        0.0,
    )
    .await;
    quiet_req.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_cancellations_count_as_499() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with_metrics(&[], &[]).await;
    let metrics = proxy
        .metrics_port
        .expect("metrics port in the start-up line");
    proxy.deploy("app", &backend.target(), &[]).await;
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"GET /slow?ms=20000 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    poll_until(
        "the request to reach the app",
        Duration::from_secs(10),
        || async { backend.hits() == 1 },
    )
    .await;
    drop(s);
    wait_for_sample(
        metrics,
        r#"kamal_proxy_http_requests_total{method="GET",service="app",status="499"}"#,
        1.0,
    )
    .await;
    wait_for_sample(
        metrics,
        r#"kamal_proxy_http_in_flight_requests{service="app"}"#,
        0.0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debug_flag_is_accepted() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with(&["--debug"], &[]).await;
    proxy.deploy("app", &backend.target(), &[]).await;
    let resp = client().get(proxy.url("/")).send().await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "app");
    raw_access_line(&proxy, "/").await;
}
