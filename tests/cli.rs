//! The command line as users and Kamal drive it: exact error messages (exit 1, `Error: …`
//! on stderr, nothing changed), Kamal's exact argv, `run`'s environment rules, and help.

use std::process::{Command, Output};
use testkit::{Proxy, RunOutcome, backend::Backend, try_run};

/// Asserts a failed CLI call changed nothing: no service listed, no state written.
async fn assert_unchanged(proxy: &Proxy) {
    assert!(
        proxy.list_rows().await.is_empty(),
        "{:?}",
        proxy.list_rows().await
    );
    assert!(
        !proxy.state_file().exists(),
        "a failed command wrote the state file"
    );
}

/// Runs the binary with a clean environment pointing at `socket` (no server there).
fn cli_without_server(args: &[&str], socket: &str) -> Output {
    let home = tempfile::tempdir().unwrap();
    Command::new(testkit::bin())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("KAMAL_PROXY_SOCKET", socket)
        .args(args)
        .output()
        .expect("run cli")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_flags_and_commands_are_refused() {
    let proxy = Proxy::start().await;
    let cases: [(&[&str], &str); 6] = [
        (
            &["deploy", "app", "--target=web:80", "--foo"],
            "Error: unknown flag: --foo\n",
        ),
        (
            &["deploy", "app", "--target=web:80", "--foo=bar"],
            "Error: unknown flag: --foo\n",
        ),
        (&["list", "--verbose"], "Error: unknown flag: --verbose\n"),
        (
            &["stop", "app", "--force"],
            "Error: unknown flag: --force\n",
        ),
        (
            &["x"],
            "Error: unknown command \"x\" for \"kamal-proxy\"\nRun 'kamal-proxy --help' for usage.\n",
        ),
        (
            &["rollback", "app"],
            "Error: unknown command \"rollback\" for \"kamal-proxy\"\nRun 'kamal-proxy --help' for usage.\n",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(proxy.fails(args).await, expected, "{args:?}");
    }
    assert_unchanged(&proxy).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_argument_counts_are_refused() {
    let proxy = Proxy::start().await;
    let cases: [(&[&str], &str); 7] = [
        (
            &["deploy", "--target=web:80"],
            "Error: accepts 1 arg(s), received 0\n",
        ),
        (
            &["deploy", "a", "b", "--target=web:80"],
            "Error: accepts 1 arg(s), received 2\n",
        ),
        (
            &["deploy", "app"],
            "Error: required flag(s) \"target\" not set\n",
        ),
        (&["remove"], "Error: accepts 1 arg(s), received 0\n"),
        (
            &["remove", "a", "b"],
            "Error: accepts 1 arg(s), received 2\n",
        ),
        (
            &["pause", "a", "b", "c"],
            "Error: accepts 1 arg(s), received 3\n",
        ),
        (
            &["list", "extra"],
            "Error: unknown command \"extra\" for \"kamal-proxy list\"\n",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(proxy.fails(args).await, expected, "{args:?}");
    }
    assert_unchanged(&proxy).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_targets_are_refused() {
    let proxy = Proxy::start().await;
    for target in [
        "foo/bar",
        "x",
        "http://web:80",
        "web:80/path",
        "web:port",
        "_",
    ] {
        let flag = format!("--target={target}");
        let stderr = proxy.fails(&["deploy", "app", &flag, "--force"]).await;
        assert_eq!(stderr, format!("Error: {target} :invalid host pattern\n"));
    }
    let stderr = proxy
        .fails(&[
            "deploy",
            "app",
            "--target=web:80",
            "--read-target=a/b",
            "--force",
        ])
        .await;
    assert_eq!(stderr, "Error: a/b :invalid host pattern\n");
    assert_unchanged(&proxy).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_values_name_the_flag_and_the_reason() {
    let proxy = Proxy::start().await;
    let cases: [(&[&str], &str); 6] = [
        (
            &["deploy", "app", "--target=web:80", "--deploy-timeout=30"],
            "Error: invalid argument \"30\" for \"--deploy-timeout\" flag: time: missing unit in duration \"30\"\n",
        ),
        (
            &["deploy", "app", "--target=web:80", "--drain-timeout=soon"],
            "Error: invalid argument \"soon\" for \"--drain-timeout\" flag: time: invalid duration \"soon\"\n",
        ),
        (
            &["pause", "app", "--max-pause=5"],
            "Error: invalid argument \"5\" for \"--max-pause\" flag: time: missing unit in duration \"5\"\n",
        ),
        (
            &["deploy", "app", "--target=web:80", "--force=maybe"],
            "Error: invalid argument \"maybe\" for \"--force\" flag: strconv.ParseBool: parsing \"maybe\": invalid syntax\n",
        ),
        (
            &[
                "deploy",
                "app",
                "--target=web:80",
                "--buffer-requests",
                "--buffer-memory=1MB",
            ],
            "Error: invalid argument \"1MB\" for \"--buffer-memory\" flag: strconv.ParseInt: parsing \"1MB\": invalid syntax\n",
        ),
        (
            &["deploy", "app", "--target=web:80", "--tls"],
            "Error: service options invalid: host must be set when using TLS\n",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(proxy.fails(args).await, expected, "{args:?}");
    }
    assert_unchanged(&proxy).await;

    match try_run(&["--http-port=eighty"], &[]).await {
        RunOutcome::Exited { code, stderr } => {
            assert_eq!(code, Some(1));
            assert_eq!(
                stderr,
                "Error: invalid argument \"eighty\" for \"--http-port\" flag: strconv.ParseInt: parsing \"eighty\": invalid syntax\n"
            );
        }
        other => panic!("run accepted --http-port=eighty: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn body_limits_need_the_buffering_flag_present() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    let target = format!("--target={}", app.target());
    assert_eq!(
        proxy
            .fails(&["deploy", "app", &target, "--max-request-body=100"])
            .await,
        "Error: max-request-body can only be set when request buffering is enabled\n"
    );
    assert_eq!(
        proxy
            .fails(&["deploy", "app", &target, "--max-response-body=100"])
            .await,
        "Error: max-response-body can only be set when response buffering is enabled\n"
    );
    assert_unchanged(&proxy).await;

    // Presence is what counts: Kamal sends `--buffer-requests="false"` with a limit.
    proxy
        .ok(&[
            "deploy",
            "app",
            &target,
            "--buffer-requests=false",
            "--max-request-body=100",
            "--buffer-responses=false",
            "--max-response-body=0",
        ])
        .await;
    assert_eq!(proxy.get("", "/").await.body, "app");
}

#[tokio::test(flavor = "multi_thread")]
async fn booleans_take_their_value_after_an_equals_sign_only() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    let target = format!("--target={}", app.target());
    // pflag: `--force false` is the flag plus a second positional argument.
    for flag in ["--force", "--strip-path-prefix", "--buffer-requests"] {
        let stderr = proxy
            .fails(&["deploy", "app", &target, flag, "false"])
            .await;
        assert_eq!(
            stderr, "Error: accepts 1 arg(s), received 2\n",
            "{flag} false"
        );
    }
    assert_unchanged(&proxy).await;

    for value in [
        "1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False",
    ] {
        let flag = format!("--force={value}");
        proxy
            .ok(&["deploy", "app", &target, &flag, "--deploy-timeout=5s"])
            .await;
    }
    assert_eq!(proxy.get("", "/").await.body, "app");
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_without_a_server_says_what_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("missing.sock").display().to_string();
    for args in [
        &["list"][..],
        &["deploy", "app", "--target=web:80"],
        &["resume", "app"],
    ] {
        let out = cli_without_server(args, &socket);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert!(err.starts_with("Error: "), "{err}");
        assert!(err.contains(&socket), "names the socket: {err}");
        assert!(
            err.contains("kamal-proxy run"),
            "says the server must run: {err}"
        );
        assert_eq!(stdout(&out), "");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn run_on_a_port_in_use_fails() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let flag = format!("--http-port={port}");
    match try_run(&[&flag], &[]).await {
        RunOutcome::Exited { code, stderr } => {
            assert_eq!(code, Some(1));
            assert_eq!(
                stderr,
                format!("Error: listen tcp :{port}: bind: address already in use\n")
            );
        }
        other => panic!("run started on a port in use: {other:?}"),
    }
}

/// Kamal's `deploy` line (kamal-client.md §2: flag order, `--flag="value"` quoting, bare
/// `true`, `="false"`), run through a shell as `docker exec` does.
fn kamal_deploy_line(target: &str) -> String {
    [
        "kamal-proxy deploy app-web",
        &format!("--target=\"{target}\""),
        "--host=\"app.example.com\"",
        "--host=\"www.example.com\"",
        "--deploy-timeout=\"30s\"",
        "--drain-timeout=\"30s\"",
        "--health-check-interval=\"1s\"",
        "--health-check-timeout=\"5s\"",
        "--health-check-path=\"/up\"",
        "--target-timeout=\"30s\"",
        "--buffer-requests",
        "--buffer-responses",
        "--buffer-memory=\"2000000\"",
        "--max-request-body=\"40000000\"",
        "--max-response-body=\"0\"",
        "--path-prefix=\"/\"",
        "--strip-path-prefix=\"false\"",
        "--forward-headers=\"false\"",
        "--tls-redirect=\"false\"",
        "--log-request-header=\"Cache-Control\"",
        "--log-request-header=\"Last-Modified\"",
        "--log-request-header=\"User-Agent\"",
        "--log-response-header=\"X-Backend\"",
    ]
    .join(" ")
}

fn sh(proxy: &Proxy, line: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(line)
        .env_clear()
        .env(
            "PATH",
            format!(
                "{}:{}",
                testkit::bin().parent().unwrap().display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("HOME", proxy.home())
        .env("KAMAL_PROXY_SOCKET", proxy.socket())
        .output()
        .expect("sh")
}

#[tokio::test(flavor = "multi_thread")]
async fn kamals_exact_command_lines_work() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    let run = |line: &str| {
        let out = tokio::task::block_in_place(|| sh(&proxy, line));
        assert_eq!(out.status.code(), Some(0), "{line}\n{}", stderr(&out));
        assert_eq!(stdout(&out), "", "success prints nothing");
    };

    run(&kamal_deploy_line(&app.target()));
    let r = proxy.get("app.example.com", "/echo").await;
    assert_eq!(r.status, 200, "{r:?}");
    let r = proxy.get("www.example.com", "/").await;
    assert_eq!((r.status, r.body.as_str()), (200, "app"));
    assert_eq!(proxy.get("other.example.com", "/").await.status, 404);
    let rows = proxy.list_rows().await;
    assert_eq!(
        rows[0][..4],
        [
            "app-web",
            "app.example.com,www.example.com",
            "/",
            &app.target()
        ]
    );

    // The options arrived as Kamal meant them.
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(proxy.state_file()).unwrap()).unwrap();
    let s = &state[0];
    assert_eq!(s["options"]["strip_prefix"], false);
    assert_eq!(s["options"]["tls_redirect"], false);
    assert_eq!(s["target_options"]["forward_headers"], false);
    assert_eq!(s["target_options"]["buffer_requests"], true);
    assert_eq!(s["target_options"]["buffer_responses"], true);
    assert_eq!(s["target_options"]["max_memory_buffer_size"], 2_000_000);
    assert_eq!(s["target_options"]["max_request_body_size"], 40_000_000);
    assert_eq!(
        s["target_options"]["log_request_headers"],
        serde_json::json!(["Cache-Control", "Last-Modified", "User-Agent"])
    );

    // A redeploy with buffering turned off, as Kamal writes it.
    let line = kamal_deploy_line(&app.target()).replace(
        "--buffer-requests --buffer-responses",
        "--buffer-requests=\"false\" --buffer-responses=\"false\"",
    );
    run(&line);
    assert_eq!(proxy.get("app.example.com", "/").await.body, "app");

    // Maintenance, live, remove: `kamal app maintenance/live/remove`.
    run(
        "kamal-proxy stop app-web --drain-timeout=\"10s\" --message=\"Scheduled maintenance, back at 10:00\"",
    );
    let r = proxy.get("app.example.com", "/").await;
    assert_eq!(r.status, 503);
    assert!(
        r.body.contains("Scheduled maintenance, back at 10:00"),
        "{}",
        r.body
    );
    run("kamal-proxy stop app-web --drain-timeout=\"0s\"");
    run("kamal-proxy resume app-web");
    assert_eq!(proxy.get("app.example.com", "/").await.body, "app");
    run("kamal-proxy remove app-web");
    assert_eq!(proxy.get("app.example.com", "/").await.status, 404);
}

fn started_port(outcome: RunOutcome) -> u16 {
    match outcome {
        RunOutcome::Started { http_port } => http_port,
        RunOutcome::Exited { code, stderr } => panic!("run exited ({code:?}): {stderr}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn run_takes_ports_from_the_environment_prefixed_first() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let busy = taken.local_addr().unwrap().port().to_string();
    let free = ["--https-port=0"];

    // KAMAL_PROXY_HTTP_PORT=0 wins over HTTP_PORT=<busy>: the proxy starts.
    let port = started_port(
        try_run(
            &free,
            &[("KAMAL_PROXY_HTTP_PORT", "0"), ("HTTP_PORT", &busy)],
        )
        .await,
    );
    assert_ne!(port.to_string(), busy);

    // The unprefixed name alone is honoured: the busy port is tried and refused.
    match try_run(&free, &[("HTTP_PORT", &busy)]).await {
        RunOutcome::Exited { code, stderr } => {
            assert_eq!(code, Some(1));
            assert_eq!(
                stderr,
                format!("Error: listen tcp :{busy}: bind: address already in use\n")
            );
        }
        other => panic!("HTTP_PORT ignored: {other:?}"),
    }

    // An explicit flag beats both.
    started_port(
        try_run(
            &["--http-port=0", "--https-port=0"],
            &[("KAMAL_PROXY_HTTP_PORT", &busy), ("HTTP_PORT", &busy)],
        )
        .await,
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unparseable_port_environment_falls_back_to_the_default() {
    // An unparseable (or empty, but set) prefixed value means the default port 80, not
    // the unprefixed variable: upstream consults only the first variable that is set.
    for value in ["eighty", ""] {
        let outcome = try_run(
            &["--https-port=0"],
            &[("KAMAL_PROXY_HTTP_PORT", value), ("HTTP_PORT", "0")],
        )
        .await;
        match outcome {
            RunOutcome::Started { http_port } => assert_eq!(http_port, 80, "{value:?}"),
            RunOutcome::Exited { code, stderr } => {
                // Port 80 may be taken or privileged here; the attempt still shows.
                assert_eq!(code, Some(1));
                assert!(
                    stderr.starts_with("Error: listen tcp :80: bind: "),
                    "{value:?}: {stderr}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn help_lists_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("none.sock").display().to_string();
    let help = cli_without_server(&["--help"], &socket);
    let bare = cli_without_server(&[], &socket);
    for out in [&help, &bare] {
        assert_eq!(out.status.code(), Some(0));
        let text = stdout(out);
        assert!(
            text.contains("HTTP proxy for zero downtime deployments"),
            "{text}"
        );
        for command in ["run", "deploy", "remove", "pause", "stop", "resume", "list"] {
            assert!(
                text.lines().any(|l| l.trim_start().starts_with(command)),
                "{command} missing from help:\n{text}"
            );
        }
    }
    for command in ["deploy", "run", "stop"] {
        let out = cli_without_server(&[command, "--help"], &socket);
        assert_eq!(out.status.code(), Some(0), "{command} --help");
        assert!(
            stdout(&out).contains("--"),
            "{command} --help lists its flags"
        );
    }
    let out = cli_without_server(&["help", "deploy"], &socket);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("--target"), "{}", stdout(&out));
}
