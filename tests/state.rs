//! The state file and process lifecycle: restore on restart, upstream's file format,
//! corrupt files set aside, crash safety under `kill -9`, and graceful SIGTERM.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use testkit::go_state::{
    GO_FIXTURE, GO_V0_9_2_FIXTURE, GoRelease, as_go_reads_it, check_go_decodable,
    check_go_decodable_by,
};
use testkit::{
    Proxy, RunOutcome, backend::Backend, client, poll_until, send, try_run_in, unprivileged_uid,
};

fn read_state(proxy: &Proxy) -> Value {
    let text = std::fs::read_to_string(proxy.state_file()).expect("state file");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("state file is not JSON ({e}): {text}"))
}

/// Files next to the state file whose name starts with `kamal-proxy.state.corrupt-`.
fn corrupt_files(proxy: &Proxy) -> Vec<PathBuf> {
    let dir = proxy.state_file().parent().unwrap().to_path_buf();
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("kamal-proxy.state.corrupt-"))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// Writes a state file before the proxy ever starts.
fn write_state_file(home: &Path, contents: &str) {
    let dir = home.join(".config/kamal-proxy");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("kamal-proxy.state"), contents).unwrap();
}

/// A proxy whose home already holds `contents` as its state file.
async fn start_with_state(contents: &str) -> Proxy {
    start_with_state_and(contents, &[]).await
}

/// A file that cannot be decoded stops the start-up (fork F29) unless the proxy runs
/// with `--ignore-restore-errors`, which sets it aside and boots empty.
async fn start_ignoring_restore_errors(contents: &str) -> Proxy {
    start_with_state_and(contents, &["--ignore-restore-errors"]).await
}

async fn start_with_state_and(contents: &str, args: &[&str]) -> Proxy {
    let proxy = Proxy::start_with(args, &[]).await;
    let home = proxy.home();
    let mut proxy = proxy;
    proxy.terminate().await;
    let _ = std::fs::remove_file(proxy.state_file());
    write_state_file(&home, contents);
    proxy.respawn().await;
    proxy
}

fn log_lines_since(proxy: &Proxy, from: usize) -> Vec<String> {
    proxy.logs().into_iter().skip(from).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_restores_every_service() {
    let web = Backend::start("web").await;
    let api = Backend::start("api").await;
    let fallback = Backend::start("fallback").await;
    let mut proxy = Proxy::start().await;
    proxy
        .deploy(
            "web",
            &web.target(),
            &[
                "--host=web.test,www.web.test",
                "--target-timeout=7s",
                "--buffer-requests",
                "--buffer-responses",
                "--max-request-body=1000000",
                "--log-request-header=X-Custom",
                "--health-check-path=/status/200",
                "--health-check-interval=100ms",
                "--forward-headers=false",
            ],
        )
        .await;
    proxy
        .deploy(
            "api",
            &api.target(),
            &[
                "--host=web.test",
                "--path-prefix=/api,/admin",
                "--strip-path-prefix=false",
            ],
        )
        .await;
    proxy
        .deploy("fallback", &fallback.target(), &["--path-prefix=/"])
        .await;
    proxy
        .ok(&["stop", "fallback", "--drain-timeout=1s", "--message=Later"])
        .await;
    proxy.ok(&["resume", "fallback"]).await;
    let list_before = proxy.ok(&["list"]).await;
    let json_before = proxy.list_json().await;
    let state_before = read_state(&proxy);

    proxy.restart().await;
    assert_eq!(proxy.ok(&["list"]).await, list_before);
    assert_eq!(proxy.list_json().await, json_before);
    assert!(
        proxy
            .logs()
            .iter()
            .any(|l| l.contains("Restored saved state"))
    );

    let r = proxy.get("www.web.test", "/").await;
    assert_eq!((r.status, r.body.as_str()), (200, "web"));
    let r = proxy.get("web.test", "/admin/users?page=2").await;
    assert_eq!((r.status, r.body.as_str()), (200, "api"));
    assert_eq!(
        r.header("x-uri"),
        "/admin/users?page=2",
        "strip-path-prefix=false survived"
    );
    assert_eq!(proxy.get("other.test", "/").await.body, "fallback");

    // Every option survives the round trip: a save after the restart writes the same
    // services as before it.
    proxy.ok(&["resume", "web"]).await;
    let by_name = |state: &Value| -> std::collections::BTreeMap<String, Value> {
        state
            .as_array()
            .expect("a top-level array of services")
            .iter()
            .map(|s| (s["name"].as_str().unwrap().to_string(), s.clone()))
            .collect()
    };
    assert_eq!(by_name(&read_state(&proxy)), by_name(&state_before));
}

#[tokio::test(flavor = "multi_thread")]
async fn state_file_is_upstreams_array_with_upstreams_keys() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    assert!(
        !proxy.state_file().exists(),
        "nothing is written before the first command"
    );
    proxy
        .deploy(
            "app",
            &app.target(),
            &[
                "--host=app.test",
                "--path-prefix=api/",
                "--target-timeout=7s",
                "--health-check-interval=100ms",
                "--health-check-timeout=2s",
                "--buffer-requests",
                "--log-request-header=Cache-Control",
            ],
        )
        .await;
    proxy
        .ok(&["stop", "app", "--drain-timeout=1s", "--message=<Back> soon"])
        .await;

    let text = std::fs::read_to_string(proxy.state_file()).unwrap();
    assert!(text.ends_with('\n'), "one JSON document and a newline");
    let state: Value = serde_json::from_str(&text).unwrap();
    let services = state.as_array().expect("a top-level array, as Go writes");
    assert_eq!(services.len(), 1);
    let s = &services[0];
    assert_eq!(s["name"], "app");
    assert_eq!(s["active_targets"], json!([app.target()]));
    assert_eq!(s["active_readers"], json!([]));
    let o = &s["options"];
    assert_eq!(o["hosts"], json!(["app.test"]));
    assert_eq!(o["path_prefixes"], json!(["/api"]), "normalised");
    assert_eq!(o["tls_enabled"], false);
    assert_eq!(o["tls_redirect"], true);
    assert_eq!(o["strip_prefix"], true);
    assert_eq!(
        o["writer_affinity_timeout"], 1_000_000_000i64,
        "durations in nanoseconds"
    );
    for key in [
        "tls_certificate_path",
        "tls_private_key_path",
        "tls_on_demand_url",
        "canonical_host",
        "acme_directory",
        "acme_cache_path",
        "error_page_path",
        "read_targets_accept_websockets",
        "exclude_metrics_paths",
        "client_ip_header",
    ] {
        assert!(o.get(key).is_some(), "options.{key} missing: {o}");
    }
    let t = &s["target_options"];
    assert_eq!(
        t["health_check_config"],
        json!({"path": "/up", "port": 0, "interval": 100_000_000i64, "timeout": 2_000_000_000i64, "host": ""})
    );
    assert_eq!(t["response_timeout"], 7_000_000_000i64);
    assert_eq!(t["buffer_requests"], true);
    assert_eq!(t["buffer_responses"], false);
    assert_eq!(t["max_memory_buffer_size"], 1_048_576);
    assert_eq!(t["max_request_body_size"], 0);
    assert_eq!(t["forward_headers"], true);
    assert_eq!(t["log_request_headers"], json!(["Cache-Control"]));
    for key in [
        "max_response_body_size",
        "log_response_headers",
        "scope_cookie_paths",
    ] {
        assert!(t.get(key).is_some(), "target_options.{key} missing: {t}");
    }
    assert_eq!(
        s["pause_controller"],
        json!({"state": 2, "stop_message": "<Back> soon", "fail_after": 0}),
        "never paused: Go's zero fail_after"
    );
    for key in ["rollout_targets", "rollout_readers", "rollout_controller"] {
        assert!(s.get(key).is_some(), "{key} missing: {s}");
    }
    // Legacy keys are read, never written.
    for key in ["active_target", "rollout_target", "hosts", "path_prefixes"] {
        assert!(s.get(key).is_none(), "legacy key {key} written: {s}");
    }
}

/// A state file as Go kamal-proxy writes it: a bare array, Go's HTML escaping, `null`
/// slices, plus an older service using the legacy keys.
fn upstream_state(web: &str, legacy: &str, maint: &str) -> String {
    let options = |hosts: Value, prefixes: Value, strip: bool| {
        json!({
            "hosts": hosts, "path_prefixes": prefixes, "tls_enabled": false,
            "tls_certificate_path": "", "tls_private_key_path": "", "tls_on_demand_url": "",
            "tls_redirect": true, "canonical_host": "", "acme_directory": "",
            "acme_cache_path": "/home/kamal-proxy/.config/kamal-proxy/certs",
            "error_page_path": "", "strip_prefix": strip, "writer_affinity_timeout": 1_000_000_000i64,
            "read_targets_accept_websockets": false, "exclude_metrics_paths": null,
            "client_ip_header": ""
        })
    };
    let target_options = json!({
        "health_check_config": {"path": "/up", "port": 0, "interval": 1_000_000_000i64,
                                "timeout": 5_000_000_000i64, "host": ""},
        "response_timeout": 30_000_000_000i64, "buffer_requests": false, "buffer_responses": false,
        "max_memory_buffer_size": 1_048_576, "max_request_body_size": 0,
        "max_response_body_size": 0, "log_request_headers": ["Cache-Control", "Last-Modified", "User-Agent"],
        "log_response_headers": null, "forward_headers": true, "scope_cookie_paths": false
    });
    let services = json!([
        {
            "name": "web",
            "options": options(json!(["web.test"]), json!(["/"]), true),
            "target_options": target_options,
            "active_targets": [web], "active_readers": [],
            "rollout_targets": null, "rollout_readers": null,
            "pause_controller": {"state": 0, "stop_message": "", "fail_after": 30_000_000_000i64},
            "rollout_controller": null
        },
        {
            "name": "legacy",
            "hosts": ["legacy.test"],
            "path_prefixes": ["/old/"],
            "active_target": legacy,
            "options": {"tls_redirect": true, "strip_prefix": true},
            "target_options": {"health_check_config": {"path": "/up", "interval": 1_000_000_000i64,
                               "timeout": 5_000_000_000i64}, "response_timeout": 30_000_000_000i64},
            "pause_controller": {"state": 0, "stop_message": "", "fail_after": 0}
        },
        {
            "name": "maint",
            "options": options(json!([""]), json!(["/"]), true),
            "target_options": target_options,
            "active_targets": [maint], "active_readers": [],
            "rollout_targets": null, "rollout_readers": null,
            "pause_controller": {"state": 2, "stop_message": "Back <soon>", "fail_after": 30_000_000_000i64},
            "rollout_controller": null
        }
    ]);
    // Go's encoder escapes <, > and & in strings.
    services
        .to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        + "\n"
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_state_file_loads() {
    let web = Backend::start("web").await;
    let legacy = Backend::start("legacy").await;
    let maint = Backend::start("maint").await;
    let contents = upstream_state(&web.target(), &legacy.target(), &maint.target());
    assert!(contents.contains("\\u003csoon\\u003e"));
    let mut proxy = start_with_state(&contents).await;
    assert!(
        !proxy
            .logs()
            .iter()
            .any(|l| l.contains("Failed to decode saved state")),
        "{:#?}",
        proxy.logs()
    );

    let rows = proxy.list_rows().await;
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(names, ["legacy", "maint", "web"], "{rows:?}");
    assert_eq!(rows[0][1], "legacy.test");
    assert_eq!(rows[0][2], "/old");
    assert_eq!(rows[0][3], legacy.target());
    assert_eq!(rows[1][4], "stopped");

    // Restored targets serve at once, without a deploy.
    let r = proxy.get("web.test", "/").await;
    assert_eq!((r.status, r.body.as_str()), (200, "web"));
    let r = proxy.get("legacy.test", "/old/page").await;
    assert_eq!((r.status, r.body.as_str()), (200, "legacy"));
    assert_eq!(r.header("x-uri"), "/page");
    let r = proxy.get("other.test", "/").await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("Back &lt;soon&gt;"), "{}", r.body);

    // The next command rewrites it in the current format, which loads again.
    proxy.ok(&["resume", "maint"]).await;
    assert!(read_state(&proxy).is_array());
    let list = proxy.ok(&["list"]).await;
    proxy.restart().await;
    assert_eq!(proxy.ok(&["list"]).await, list);
    assert_eq!(proxy.get("other.test", "/").await.body, "maint");
    assert_eq!(proxy.get("legacy.test", "/old").await.body, "legacy");
}

/// Services by name, for comparing files whose order differs.
fn by_name(file: &Value) -> std::collections::BTreeMap<String, Value> {
    file.as_array()
        .expect("a top-level array of services")
        .iter()
        .map(|s| (s["name"].as_str().expect("name").to_string(), s.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_go_wrote_is_restored_and_written_back_as_go_wrote_it() {
    restored_and_written_back_as_go_wrote_it(GO_FIXTURE, GoRelease::Head).await;
}

/// v0.9.2 is the oldest release Kamal boots, so the one a rollback most likely lands on.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_go_v0_9_2_wrote_is_restored_and_written_back_as_it_wrote_it() {
    restored_and_written_back_as_go_wrote_it(GO_V0_9_2_FIXTURE, GoRelease::V0_9_2).await;
}

async fn restored_and_written_back_as_go_wrote_it(fixture: &str, release: GoRelease) {
    let go: Value = serde_json::from_str(fixture).unwrap();
    check_go_decodable_by(&go, release).expect("the fixture is what Go writes");
    let proxy = start_with_state(fixture).await;
    assert!(
        proxy
            .logs()
            .iter()
            .any(|l| l.contains("Restored saved state")),
        "{:#?}",
        proxy.logs()
    );
    let rows = proxy.list_rows().await;
    let summary: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r[0].as_str(), r[2].as_str(), r[4].as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            ("app-admin", "/", "stopped"),
            ("app-api", "/api", "running"),
            ("app-jobs", "/", "paused"),
            ("app-web", "/", "running"),
            ("fallback", "/", "running"),
        ]
    );

    // Any command rewrites the file; read with Go's keys it is what Go wrote, so a
    // rollback to the Go image restores exactly these services.
    proxy.ok(&["resume", "fallback"]).await;
    let ours = read_state(&proxy);
    check_go_decodable_by(&ours, release).unwrap();
    let (ours, go) = (by_name(&ours), by_name(&go));
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        go.keys().collect::<Vec<_>>()
    );
    for (name, go_service) in &go {
        assert_eq!(
            &as_go_reads_it(&ours[name], go_service),
            go_service,
            "service {name} as Go reads it"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_option_we_save_stays_decodable_by_go() {
    let web = Backend::start("web").await;
    let reader = Backend::start("reader").await;
    let api = Backend::start("api").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "web",
            &web.target(),
            &[
                &format!("--read-target={}", reader.target()),
                "--host=web.test",
                "--tls",
                "--tls-redirect=false",
                "--allow-ip=127.0.0.1,10.0.0.0/8",
                "--trusted-proxy=10.0.0.1",
                "--rate-limit=0.5",
                "--rate-limit-burst=3",
                "--rate-limit-exempt=192.0.2.1",
                "--basic-auth=admin:secret",
                "--redirect=/old=/new;status=308",
                "--rewrite=/a/(.*)=/b/$1",
                "--request-timeout=5s",
                "--exclude-metrics-path=/up",
                "--log-response-header=X-Runtime",
            ],
        )
        .await;
    // A path-prefix service under a TLS host takes TLS from its root service, but is
    // saved as deployed: Go refuses TLS settings on a path-prefix service.
    proxy
        .deploy(
            "api",
            &api.target(),
            &["--host=web.test", "--path-prefix=/api"],
        )
        .await;
    proxy
        .ok(&["pause", "api", "--drain-timeout=1s", "--max-pause=20s"])
        .await;

    let state = read_state(&proxy);
    check_go_decodable(&state).unwrap();
    let services = by_name(&state);
    assert_eq!(services["web"]["active_readers"], json!([reader.target()]));
    assert_eq!(services["web"]["options"]["tls_enabled"], true);
    assert_eq!(services["api"]["options"]["tls_enabled"], false);
    assert_eq!(services["api"]["options"]["tls_redirect"], true);
    assert_eq!(
        services["api"]["pause_controller"],
        json!({"state": 1, "stop_message": "", "fail_after": 20_000_000_000i64})
    );
    assert_eq!(
        proxy.list_json().await["services"]["api"]["tls"],
        true,
        "served with the inherited setting all the same"
    );
    // Our own settings travel as extra keys Go ignores.
    assert_eq!(services["web"]["options"]["rate_limit"], 0.5);
    assert_eq!(
        services["web"]["options"]["request_timeout"],
        5_000_000_000i64
    );
}

#[test]
fn the_go_decodability_check_can_fail() {
    let mut go: Value = serde_json::from_str(GO_FIXTURE).unwrap();
    go[0]["options"]["writer_affinity_timeout"] = json!(1.5);
    assert!(
        check_go_decodable(&go)
            .unwrap_err()
            .contains("writer_affinity_timeout")
    );
    let mut go: Value = serde_json::from_str(GO_FIXTURE).unwrap();
    go[1]["options"]["Hosts"] = json!("x");
    assert!(
        check_go_decodable(&go)
            .unwrap_err()
            .contains("would be read by Go")
    );
    // The fork's weighted spec in upstream's list: Go refuses the file.
    let mut go: Value = serde_json::from_str(GO_FIXTURE).unwrap();
    go[0]["active_targets"] = json!(["4f2a9c1b7e3d:80;weight=5"]);
    assert!(
        check_go_decodable(&go)
            .unwrap_err()
            .contains("active_targets")
    );
    // v0.9.2's file lacks HEAD's newer keys: HEAD's check refuses it, v0.9.2's takes it.
    let old: Value = serde_json::from_str(GO_V0_9_2_FIXTURE).unwrap();
    assert!(check_go_decodable(&old).unwrap_err().contains("is missing"));
    assert!(check_go_decodable_by(&old, GoRelease::V0_9_2).is_ok());
    let mut go: Value = serde_json::from_str(GO_FIXTURE).unwrap();
    go[2].as_object_mut().unwrap().remove("pause_controller");
    assert!(check_go_decodable(&go).unwrap_err().contains("missing"));
    let wrapped = json!({"version": 2, "services": go});
    assert!(check_go_decodable(&wrapped).is_err());
}

/// A proxy home whose data dir is prepared by `setup` (as the test's user, i.e. root
/// in CI) before `run` starts as an unprivileged user; returns how `run` ended.
/// The temp dir is returned so the files outlive the call.
async fn run_unprivileged_with(
    setup: impl FnOnce(&Path, Option<u32>),
) -> (RunOutcome, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let uid = unprivileged_uid();
    if let Some(uid) = uid {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid)).unwrap();
    }
    setup(&home, uid);
    let outcome = try_run_in(
        dir.path(),
        &home,
        uid,
        &["--http-port=0", "--https-port=0"],
        &[],
    )
    .await;
    // Let the tempdir be removed whatever the modes were.
    let _ = std::process::Command::new("chmod")
        .args(["-R", "u+rwx"])
        .arg(dir.path())
        .status();
    (outcome, home.join(".config/kamal-proxy"), dir)
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn expect_exit_1(outcome: RunOutcome) -> String {
    match outcome {
        RunOutcome::Exited { code, stderr } => {
            assert_eq!(code, Some(1), "{stderr}");
            stderr
        }
        RunOutcome::Started { .. } => panic!("run started"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_dir_that_cannot_be_created_is_a_startup_error() {
    // A home the proxy's user cannot write: no silent fallback to the temp dir.
    let (outcome, data_dir, _dir) = run_unprivileged_with(|home, uid| {
        if uid.is_none() {
            chmod(home, 0o500);
        }
    })
    .await;
    let stderr = expect_exit_1(outcome);
    assert!(
        stderr.starts_with(&format!(
            "Error: cannot create the data directory {} (running as ",
            data_dir.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(!data_dir.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_dir_the_proxy_cannot_write_is_a_startup_error() {
    // Kamal's volume owned by root while the proxy runs as its own user.
    let (outcome, data_dir, _dir) = run_unprivileged_with(|home, uid| {
        let data = home.join(".config/kamal-proxy");
        std::fs::create_dir_all(&data).unwrap();
        if let Some(uid) = uid {
            std::os::unix::fs::chown(home.join(".config"), Some(uid), Some(uid)).unwrap();
            chmod(&data, 0o755); // root's, readable, not writable by the proxy
        } else {
            chmod(&data, 0o500);
        }
    })
    .await;
    let stderr = expect_exit_1(outcome);
    assert!(
        stderr.starts_with(&format!(
            "Error: the data directory {} is not writable (running as ",
            data_dir.display()
        )),
        "{stderr}"
    );
    if unprivileged_uid().is_some() {
        assert!(stderr.contains("(uid 65534)"), "names the user: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_state_file_is_a_startup_error_and_stays_as_it_was() {
    let (outcome, data_dir, _dir) = run_unprivileged_with(|home, uid| {
        let data = home.join(".config/kamal-proxy");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("kamal-proxy.state"), GO_FIXTURE).unwrap();
        chmod(&data.join("kamal-proxy.state"), 0o000);
        if let Some(uid) = uid {
            for d in [home.join(".config"), data] {
                std::os::unix::fs::chown(d, Some(uid), Some(uid)).unwrap();
            }
        }
    })
    .await;
    let stderr = expect_exit_1(outcome);
    let file = data_dir.join("kamal-proxy.state");
    assert!(
        stderr.starts_with(&format!(
            "Error: cannot read the state file {} (running as ",
            file.display()
        )),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        GO_FIXTURE,
        "left alone"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_change_that_cannot_be_saved_is_refused_and_traffic_stays_as_it_was() {
    let v1 = Backend::start("v1").await;
    let v2 = Backend::start("v2").await;
    let uid = unprivileged_uid();
    let mut proxy = Proxy::start_as(uid, &[], &[]).await;
    proxy
        .deploy("app", &v1.target(), &["--host=app.test"])
        .await;
    let saved = std::fs::read_to_string(proxy.state_file()).unwrap();
    let data_dir = proxy.state_file().parent().unwrap().to_path_buf();
    chmod(&data_dir, 0o500);

    let target = format!("--target={}", v2.target());
    let refused = proxy
        .fails(&[
            "deploy",
            "app",
            &target,
            "--host=app.test",
            "--deploy-timeout=5s",
        ])
        .await;
    assert!(
        refused.starts_with(&format!(
            "Error: unable to save state to {}: ",
            proxy.state_file().display()
        )),
        "{refused}"
    );
    assert_eq!(
        proxy.get("app.test", "/").await.body,
        "v1",
        "traffic unchanged"
    );
    assert_eq!(proxy.list_rows().await[0][3], v1.target());
    for args in [
        &["stop", "app", "--drain-timeout=1s"][..],
        &["pause", "app", "--drain-timeout=1s"],
        &["remove", "app"],
    ] {
        assert!(
            proxy.fails(args).await.contains("unable to save state"),
            "{args:?}"
        );
    }
    assert_eq!(proxy.get("app.test", "/").await.body, "v1", "still served");
    assert_eq!(proxy.list_rows().await[0][4], "running");
    assert_eq!(std::fs::read_to_string(proxy.state_file()).unwrap(), saved);

    // Writable again: the same deploy goes through, and survives a restart.
    chmod(&data_dir, 0o700);
    proxy
        .deploy("app", &v2.target(), &["--host=app.test"])
        .await;
    proxy.restart().await;
    assert_eq!(proxy.get("app.test", "/").await.body, "v2");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_state_file_that_cannot_be_decoded_stops_the_start_up_and_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let garbage = "[{\"name\":\"app\",\"options\":{\"hosts\":[\"a";
    write_state_file(&home, garbage);
    match testkit::try_run_in(
        dir.path(),
        &home,
        None,
        &["--http-port=0", "--https-port=0"],
        &[],
    )
    .await
    {
        testkit::RunOutcome::Exited { code, stderr } => {
            assert_eq!(code, Some(1));
            assert!(
                stderr.starts_with("Error: failed to restore saved state (use --ignore-restore-errors to boot with no services): "),
                "{stderr}"
            );
        }
        other => panic!("started on a corrupt state file: {other:?}"),
    }
    let state = home.join(".config/kamal-proxy/kamal-proxy.state");
    assert_eq!(
        std::fs::read_to_string(state).unwrap(),
        garbage,
        "left in place, untouched"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn corrupt_state_file_is_set_aside() {
    let app = Backend::start("app").await;
    let garbage = "{\"version\":2,\"services\":[{\"name\":\"app\",\"options\":{\"hosts\":[\"a";
    let mut proxy = start_ignoring_restore_errors(garbage).await;

    proxy
        .wait_for_log("Failed to decode saved state", |l| {
            l.contains("Failed to decode saved state")
        })
        .await;
    let aside = corrupt_files(&proxy);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read_to_string(&aside[0]).unwrap(),
        garbage,
        "content preserved"
    );
    assert!(
        !proxy.state_file().exists(),
        "the corrupt file is moved, not left to be overwritten"
    );
    assert!(proxy.list_rows().await.is_empty());
    let r = proxy.get("", "/").await;
    assert_eq!(r.status, 404);

    // The proxy works normally from there, and the set-aside file is kept.
    proxy.deploy("app", &app.target(), &[]).await;
    proxy.restart().await;
    assert_eq!(proxy.get("", "/").await.body, "app");
    assert_eq!(corrupt_files(&proxy), aside);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_corrupt_file_does_not_replace_the_first() {
    let mut proxy = start_ignoring_restore_errors("first garbage").await;
    assert_eq!(corrupt_files(&proxy).len(), 1);
    proxy.terminate().await;
    write_state_file(&proxy.home(), "second garbage");
    proxy.respawn().await;

    let aside = corrupt_files(&proxy);
    let mut contents: Vec<String> = aside
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    contents.sort();
    assert_eq!(contents, ["first garbage", "second garbage"], "{aside:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn state_file_with_an_invalid_target_is_set_aside_whole() {
    let app = Backend::start("app").await;
    let contents = json!([
        {"name": "good", "options": {"hosts": ["good.test"]}, "active_targets": [app.target()]},
        {"name": "bad", "options": {"hosts": ["bad.test"]}, "active_targets": ["foo/bar"]}
    ])
    .to_string();
    let mut proxy = start_ignoring_restore_errors(&contents).await;

    // Upstream decodes all or nothing; the file is kept for the operator either way.
    proxy
        .wait_for_log("Failed to decode saved state", |l| {
            l.contains("Failed to decode saved state")
        })
        .await;
    let aside = corrupt_files(&proxy);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read_to_string(&aside[0]).unwrap(), contents);
    assert!(proxy.list_rows().await.is_empty());

    proxy
        .deploy("good", &app.target(), &["--host=good.test"])
        .await;
    proxy.restart().await;
    assert_eq!(proxy.get("good.test", "/").await.body, "app");
}

/// A small xorshift generator seeded from the clock: kill moments differ per run.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_deploys_leaves_a_state_file_that_loads() {
    let a = Backend::start("a").await;
    let b = Backend::start("b").await;
    let targets = [a.target(), b.target()];
    let mut proxy = Proxy::start().await;
    let mut rng = Rng::new();

    for round in 0..10 {
        let stop = AtomicBool::new(false);
        let delay = Duration::from_millis(30 + rng.below(300));
        let pid = proxy.pid().expect("running");
        {
            let deploys = async {
                let mut i = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let service = format!("svc{}", i % 3);
                    let host = format!("--host={service}.test");
                    let target = format!("--target={}", targets[i % 2]);
                    let prefix = format!("--path-prefix=/p{}", i % 4);
                    let args = [
                        "deploy",
                        service.as_str(),
                        target.as_str(),
                        host.as_str(),
                        prefix.as_str(),
                        "--deploy-timeout=2s",
                        "--drain-timeout=1s",
                        "--log-request-header=X-Round",
                    ];
                    if !proxy.cli(&args).await.status.success() {
                        break; // the server died under us
                    }
                    if i % 5 == 4 {
                        let _ = proxy.cli(&["remove", "svc1"]).await;
                    }
                    i += 1;
                }
            };
            let kill = async {
                tokio::time::sleep(delay).await;
                let _ = tokio::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status()
                    .await;
                stop.store(true, Ordering::SeqCst);
            };
            tokio::join!(deploys, kill);
            proxy.kill9();
        };

        let from = proxy.logs().len();
        proxy.respawn().await;
        let lines = log_lines_since(&proxy, from);
        assert!(
            !lines
                .iter()
                .any(|l| l.contains("Failed to decode") || l.contains("Failed to restore")),
            "round {round} (killed after {delay:?}): {lines:#?}"
        );
        assert!(corrupt_files(&proxy).is_empty(), "round {round}");

        // Whatever was saved serves.
        for row in proxy.list_rows().await {
            let (host, prefix) = (row[1].clone(), row[2].clone());
            let r = proxy.get(&host, &prefix).await;
            assert_eq!(r.status, 200, "round {round}: {row:?}: {r:?}");
            assert!(
                r.body == "a" || r.body == "b",
                "round {round}: {row:?}: {r:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fresh_start_has_no_previous_state() {
    let proxy = Proxy::start().await;
    proxy
        .wait_for_log("No previous state to restore", |l| {
            l.contains("No previous state to restore")
        })
        .await;
    assert!(!proxy.logs().iter().any(|l| l.contains("Failed to decode")));
    assert!(proxy.list_rows().await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_exits_zero_and_logs_server_stopped() {
    let mut proxy = Proxy::start().await;
    let socket = proxy.socket();
    assert!(socket.exists());
    let code = proxy.terminate().await;
    assert_eq!(code, Some(0));
    proxy
        .wait_for_log("\"msg\":\"Server stopped\"", |l| {
            l.contains("\"msg\":\"Server stopped\"")
        })
        .await;
    assert!(!socket.exists(), "the control socket is removed on exit");
}

#[tokio::test(flavor = "multi_thread")]
async fn in_flight_request_finishes_during_sigterm_shutdown() {
    let app = Backend::start("app").await;
    let mut proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    let url = proxy.url("/slow?ms=1000");
    let slow = tokio::spawn(async move { send(&client(), reqwest::Method::GET, &url, None).await });
    poll_until("app.hits() == 1", Duration::from_secs(5), || async {
        app.hits() == 1
    })
    .await;

    let code = proxy.terminate().await;
    assert_eq!(code, Some(0));
    let r = slow
        .await
        .unwrap()
        .expect("the in-flight request is answered");
    assert_eq!((r.status, r.body.as_str()), (200, "slow 1000"));
    proxy
        .wait_for_log("\"msg\":\"Server stopped\"", |l| {
            l.contains("\"msg\":\"Server stopped\"")
        })
        .await;
    // Its access line is written before the proxy says it stopped (a worker thread's
    // lines wait in its batch for up to 100 ms; the drain hands them over first).
    let logs = proxy.logs();
    let line_at = |needle: &str| logs.iter().position(|l| l.contains(needle));
    let access = line_at("\"path\":\"/slow\"").expect("the request's access line");
    let stopped = line_at("\"msg\":\"Server stopped\"").expect("Server stopped");
    assert!(access < stopped, "{logs:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_refuses_new_connections_while_finishing_old_ones() {
    let app = Backend::start("app").await;
    let mut proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    let url = proxy.url("/slow?ms=2000");
    let slow = tokio::spawn(async move { send(&client(), reqwest::Method::GET, &url, None).await });
    poll_until("app.hits() == 1", Duration::from_secs(5), || async {
        app.hits() == 1
    })
    .await;

    let pid = proxy.pid().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let addr = format!("127.0.0.1:{}", proxy.http_port);
    poll_until(
        "the listener closes at once",
        Duration::from_secs(5),
        || async { tokio::net::TcpStream::connect(&addr).await.is_err() },
    )
    .await;
    assert!(
        !slow.is_finished(),
        "the in-flight request is still being served"
    );
    let r = slow.await.unwrap().expect("in-flight request");
    assert_eq!((r.status, r.body.as_str()), (200, "slow 2000"));
    assert_eq!(proxy.terminate().await, Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigint_stops_gracefully_too() {
    let mut proxy = Proxy::start().await;
    let pid = proxy.pid().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    proxy
        .wait_for_log("\"msg\":\"Server stopped\"", |l| {
            l.contains("\"msg\":\"Server stopped\"")
        })
        .await;
    assert_eq!(proxy.terminate().await, Some(0));
}
