//! The lines the Kamal fork (`kamal-client.md` §9) sends for the operator features of issue
//! 13, replayed with the fork's `--flag="value"` quoting through a real shell: every `run`
//! and `deploy` flag accepted, taking effect (weights, affinity, metrics, drain) or saved
//! under the fork's state keys (the try, pool and path flags). Each
//! flag's behaviour in depth is in its own test file (listeners, upstream_leg,
//! session_affinity, weighted_targets, upgrade).

use serde_json::{Value, json};
use testkit::{Proxy, backend::Backend, client};

/// The first value under `key` anywhere in `v`.
fn find<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(map) => map
            .get(key)
            .or_else(|| map.values().find_map(|x| find(x, key))),
        Value::Array(items) => items.iter().find_map(|x| find(x, key)),
        _ => None,
    }
}

/// The argv a POSIX shell makes of `line` (the fork's quoting is the shell's).
fn shell_words(line: &str) -> Vec<String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("for a in {line}; do printf '%s\\0' \"$a\"; done"))
        .output()
        .expect("sh");
    assert!(out.status.success(), "sh could not split {line}");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .split('\0')
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_fork_s_run_and_deploy_lines_are_accepted_and_take_effect() {
    let web1 = Backend::start("web-1").await;
    let web2 = Backend::start("web-2").await;

    // `run`: what the fork's `proxy.run` keys render (the recheck flag is always appended).
    let run = shell_words(
        r#"--recheck-targets-on-restore --reuse-port --ignore-restore-errors --proxy-protocol --proxy-protocol-allow-ip="127.0.0.1" --metrics-allow-ip="127.0.0.1" --read-header-timeout="30s" --read-timeout="0s" --write-timeout="0s" --idle-timeout="60s" --shutdown-timeout="10s""#,
    );
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let proxy = Proxy::start_with_metrics(&run, &[]).await;

    // `deploy`, in the fork's order: base flags, traffic, lifecycle, target pool options.
    let line = format!(
        r#"app-web --target="{};weight=3,{}" --host="app.test" --health-check-path="/up" --buffer-requests="false" --path-timeout="/reports=120s" --path-request-timeout="/exports=300s" --session-affinity --session-affinity-cookie="_app_pin" --target-try-duration="10s" --target-try-interval="250ms" --target-max-conns="64" --target-max-idle-conns="32" --target-idle-conn-timeout="60s" --target-dial-timeout="5s" --target-disable-keep-alives="false""#,
        web1.target(),
        web2.target()
    );
    let mut deploy = vec!["deploy".to_owned()];
    deploy.extend(shell_words(&line));
    let deploy: Vec<&str> = deploy.iter().map(String::as_str).collect();
    proxy.ok(&deploy).await;

    // The weights, as the fork lists them.
    let list = proxy.list_json().await;
    let target = list["services"]["app-web"]["target"].to_string();
    assert!(target.contains(";weight=3"), "{list}");

    // Affinity under the fork's cookie name: a client without it is pinned, and stays.
    let http = client();
    let first = http
        .get(proxy.url("/"))
        .header("host", "app.test")
        .send()
        .await
        .expect("GET");
    assert_eq!(first.status(), 200);
    let pin = first
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("_app_pin="))
        .unwrap_or_else(|| panic!("no _app_pin cookie: {:?}", first.headers()))
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let pinned_body = first.text().await.unwrap();
    for _ in 0..8 {
        let r = http
            .get(proxy.url("/"))
            .header("host", "app.test")
            .header("cookie", &pin)
            .send()
            .await
            .expect("GET");
        assert_eq!(r.text().await.unwrap(), pinned_body);
    }

    // Metrics answer the allowed address (the test's own, 127.0.0.1).
    let metrics = http
        .get(proxy.metrics_url())
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(metrics.status(), 200);

    // The try, pool and path flags are saved under the fork's keys (their behaviour is
    // tests/upstream_leg.rs's).
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(proxy.state_file()).expect("state file"))
            .expect("JSON");
    for (key, want) in [
        ("max_conns_per_host", json!(64)),
        ("max_idle_conns_per_host", json!(32)),
        ("target_try_duration", json!(10_000_000_000u64)),
        ("target_try_interval", json!(250_000_000u64)),
        ("idle_conn_timeout", json!(60_000_000_000u64)),
        ("dial_timeout", json!(5_000_000_000u64)),
    ] {
        assert_eq!(find(&state, key), Some(&want), "{key} in {state}");
    }
    for key in ["path_response_timeouts", "path_request_timeouts"] {
        let rules = find(&state, key).unwrap_or_else(|| panic!("{key} in {state}"));
        assert_eq!(rules.as_array().map(Vec::len), Some(1), "{key}: {rules}");
    }

    // The `drain` of the upgrade recipe (`hold` has its own test in tests/upgrade.rs).
    proxy.ok(&["drain", "--drain-timeout=30s"]).await;
}
