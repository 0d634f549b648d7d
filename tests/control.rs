//! The control socket: private whatever the umask, callers checked by their credentials,
//! a deadline on reading each request, and names that `list` can print.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;
use testkit::{Proxy, bin, unprivileged_uid};

/// The CLI as `uid`, against `p`'s socket.
fn cli_as(uid: u32, p: &Proxy, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin())
        .uid(uid)
        .gid(uid)
        .env_clear()
        .env("HOME", "/")
        .env("KAMAL_PROXY_SOCKET", p.socket())
        .args(args)
        .output()
        .expect("run cli");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Sends raw bytes and reads the reply until the server closes.
fn raw_request(p: &Proxy, bytes: &[u8], close_write: bool) -> String {
    let mut s = UnixStream::connect(p.socket()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(bytes).expect("write");
    if close_write {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("reply");
    reply
}

#[tokio::test(flavor = "multi_thread")]
async fn the_socket_is_private_whatever_the_umask_and_callers_are_checked() {
    // SAFETY: umask has no preconditions; this is the only test here that changes it.
    let old = unsafe { libc::umask(0) };
    let p = Proxy::start().await;
    unsafe { libc::umask(old) };
    let mode = std::fs::metadata(p.socket()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");

    let Some(uid) = unprivileged_uid() else {
        return; // not root: the test's own user is the server's, nothing more to show
    };
    // Open the way to the socket, so only its own mode stands in the way.
    std::fs::set_permissions(p.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, stderr) = tokio::task::block_in_place(|| {
        cli_as(uid, &p, &["deploy", "intruder", "--target=127.0.0.1:9"])
    });
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");

    // A socket opened to others by mistake: the caller's uid is still refused.
    std::fs::set_permissions(p.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, stderr) = tokio::task::block_in_place(|| {
        cli_as(uid, &p, &["deploy", "intruder", "--target=127.0.0.1:9"])
    });
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("permission denied: uid {uid} may not control")),
        "{stderr}"
    );
    // The log reaches us through the server's writer thread and a pipe: wait for it.
    p.wait_for_log("the refusal in the server's log", |l| {
        l.contains("Refused control connection")
    })
    .await;
    assert!(!p.ok(&["list"]).await.contains("intruder"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_that_never_ends_is_answered_at_the_read_deadline() {
    let p = Proxy::start().await;
    let reply = tokio::task::block_in_place(|| raw_request(&p, br#"{"command":"li"#, false));
    assert!(reply.contains("timed out reading the request"), "{reply}");
    // The server is still there for everyone else.
    p.ok(&["list"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn service_names_are_bounded_and_printable() {
    let p = Proxy::start().await;
    let long = "a".repeat(300);
    let stderr = p.fails(&["deploy", &long, "--target=127.0.0.1:9"]).await;
    assert!(stderr.contains("at most 255"), "{stderr}");
    let stderr = p
        .fails(&["deploy", "bad\u{1b}[2Jname", "--target=127.0.0.1:9"])
        .await;
    assert!(stderr.contains("is not allowed"), "{stderr}");

    // The server checks too, for a caller that bypasses the CLI.
    let huge = "x".repeat(3_500_000);
    let request = format!(
        r#"{{"command":"deploy","service":"{huge}","targets":["127.0.0.1:9"],"deployment":{{}},"service_options":{{}},"target_options":{{}}}}"#
    );
    let reply = tokio::task::block_in_place(|| raw_request(&p, request.as_bytes(), true));
    assert!(
        reply.contains("service name is 3500000 bytes long"),
        "{reply}"
    );
    assert_eq!(p.list_json().await["services"], serde_json::json!({}));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_open_files_soft_limit_is_raised_to_the_hard_limit() {
    let mut mine = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only touch the struct passed; the soft limit is lowered
    // for the child to inherit and restored at once.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut mine), 0);
        let lowered = libc::rlimit {
            rlim_cur: 512.min(mine.rlim_max),
            rlim_max: mine.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lowered), 0);
    }
    let p = Proxy::start().await;
    unsafe {
        libc::setrlimit(libc::RLIMIT_NOFILE, &mine);
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", p.pid().unwrap())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[3], fields[4], "{line}");
}

/// Upstream's service-option rules (upstream §2.3), checked by the server itself for a
/// request that never went through the CLI, with upstream's wording, and nothing deployed.
#[tokio::test(flavor = "multi_thread")]
async fn the_server_refuses_upstream_s_invalid_option_combinations_over_the_raw_socket() {
    use serde_json::json;
    let app = testkit::backend::Backend::start("app").await;
    let p = Proxy::start().await;
    let deploy = |options: serde_json::Value| {
        json!({
            "command": "deploy", "service": "app", "targets": [app.target()],
            "deployment": {"deploy_timeout": 5_000_000_000i64}, "service_options": options,
            "target_options": {}
        })
    };
    let cases = [
        (
            json!({"tls_on_demand_url": "/allow"}),
            "TLS must be enabled to use a TLS on-demand URL",
        ),
        (
            json!({"tls_enabled": true, "tls_on_demand_url": "/allow", "hosts": ["a.test"]}),
            "cannot set hosts when using a TLS on-demand URL",
        ),
        (
            json!({"tls_enabled": true, "tls_on_demand_url": "/allow",
                   "tls_certificate_path": "/c.pem", "tls_private_key_path": "/k.pem"}),
            "cannot use a custom TLS certificate with a TLS on-demand URL",
        ),
        (
            json!({"tls_enabled": true, "tls_on_demand_url": "/allow", "canonical_host": "a.test"}),
            "cannot set a canonical host when using a TLS on-demand URL",
        ),
        (
            json!({"tls_enabled": true}),
            "host must be set when using TLS",
        ),
        (
            json!({"tls_enabled": true, "hosts": ["a.test"], "path_prefixes": ["/api"]}),
            "TLS settings must be specified on the root path service",
        ),
        (
            json!({"hosts": ["a.test", "b.test"], "canonical_host": "c.test"}),
            "canonical-host 'c.test' must be present in the hosts list: [a.test b.test]",
        ),
    ];
    for (options, message) in cases {
        let reply = p.control(deploy(options.clone())).await;
        assert_eq!(
            reply,
            json!({"error": format!("service options invalid: {message}")}),
            "{options}"
        );
    }
    assert_eq!(p.list_json().await["services"], json!({}));
    assert_eq!(app.health_hits(), 0, "a refused deploy probes nothing");
    assert!(!p.state_file().exists(), "nothing saved");
    // The same path deploys a valid request.
    let reply = p.control(deploy(json!({"hosts": ["a.test"]}))).await;
    assert_eq!(reply, json!("ok"));
    assert_eq!(p.get("a.test", "/").await.body, "app");
}
