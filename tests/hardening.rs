//! Hostile and broken clients, one attack each: a request body that stalls, an HTTP/2
//! stream with headers and no DATA, idle HTTP/2 connections, more connections than
//! `--max-connections`, oversized request heads, ambiguous hosts, `Upgrade: h2c`,
//! oversized chunk sizes, and the temp files a `kill -9` leaves behind.

use bytes::Bytes;
use std::time::Duration;
use testkit::backend::Backend;
use testkit::pebble::self_signed;
use testkit::{Proxy, poll_until, raw};
use tokio::io::{AsyncWriteExt, BufReader};

/// A hang guard for exchanges that must end on their own (not a measurement).
const GUARD: Duration = Duration::from_secs(60);

async fn serve(run: &[&str], deploy: &[&str]) -> (Backend, Proxy) {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with(run, &[]).await;
    let mut extra = vec!["--host=app.test"];
    extra.extend_from_slice(deploy);
    proxy.deploy("app", &backend.target(), &extra).await;
    (backend, proxy)
}

/// Serves `app.test` over HTTPS with a self-signed certificate; returns its PEM.
async fn serve_tls(run: &[&str], host_flag: &str) -> (Backend, Proxy, String) {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with(run, &[]).await;
    let (cert, key, pem) = self_signed(proxy.dir.path(), "app", &["app.test"]);
    let cert = format!("--tls-certificate-path={}", cert.display());
    let key = format!("--tls-private-key-path={}", key.display());
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[host_flag, "--tls", "--tls-redirect=false", &cert, &key],
        )
        .await;
    (backend, proxy, pem)
}

/// An HTTP/2 connection over TLS (SNI `app.test`, ALPN `h2`), and the task driving it,
/// which ends when the server closes the connection.
async fn h2_connect(
    proxy: &Proxy,
    pem: &str,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    testkit::tls::h2(proxy.https_port, pem, "app.test").await
}

/// The status of one HTTP/2 request with no body.
async fn h2_get(send: &mut h2::client::SendRequest<Bytes>, req: http::Request<()>) -> u16 {
    let send = send.clone().ready().await.expect("stream capacity");
    let mut send = send;
    let (response, _) = send.send_request(req, true).expect("send request");
    tokio::time::timeout(GUARD, response)
        .await
        .expect("a response")
        .expect("response headers")
        .status()
        .as_u16()
}

async fn wait_access(proxy: &Proxy, status: u16, path: &str) -> serde_json::Value {
    let line = proxy
        .wait_for_log(&format!("the access line of {path} with {status}"), |l| {
            serde_json::from_str::<serde_json::Value>(l)
                .is_ok_and(|v| v["msg"] == "Request" && v["status"] == status && v["path"] == path)
        })
        .await;
    serde_json::from_str(&line).unwrap()
}

// === Body read timeout ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_request_body_gets_408_and_the_connection_closes() {
    for buffered in [false, true] {
        let deploy: &[&str] = if buffered {
            &["--buffer-requests"]
        } else {
            &[]
        };
        let (_b, proxy) = serve(&["--body-read-timeout=1s"], deploy).await;
        let mut s = raw::connect(proxy.http_port).await;
        // 100,000 bytes promised, 7 sent, then silence.
        s.write_all(
            b"POST /echo HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100000\r\n\r\npartial",
        )
        .await
        .unwrap();
        let mut reader = BufReader::new(s);
        let r = tokio::time::timeout(GUARD, raw::read_response(&mut reader, false))
            .await
            .expect("an answer to the stalled body");
        assert_eq!(r.status, 408, "buffered={buffered}: {}", r.text());
        assert_eq!(r.header("connection"), Some("close"));
        wait_access(&proxy, 408, "/echo").await;
        proxy
            .wait_for_log("the timeout logged", |l| {
                l.contains("Request body read timed out")
            })
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_keeps_coming_is_not_cut() {
    let (_b, proxy) = serve(&["--body-read-timeout=1s"], &[]).await;
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: app.test\r\nContent-Length: 6\r\n\r\n")
        .await
        .unwrap();
    // A byte every 400 ms: slower than nothing, never silent for the timeout.
    for b in b"abcdef" {
        tokio::time::sleep(Duration::from_millis(400)).await;
        s.write_all(&[*b]).await.unwrap();
    }
    let mut reader = BufReader::new(s);
    let r = raw::read_response(&mut reader, false).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["body_len"], 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_h2_stream_with_headers_and_no_data_is_timed_out() {
    let (_b, proxy, pem) = serve_tls(&["--body-read-timeout=1s"], "--host=app.test").await;
    let (send, _connection) = h2_connect(&proxy, &pem).await;
    let mut send = send.ready().await.unwrap();
    let req = http::Request::post("https://app.test/echo")
        .header("content-length", "100")
        .body(())
        .unwrap();
    // The stream stays open (not end-of-stream) and no DATA frame ever comes.
    let (response, _body) = send.send_request(req, false).unwrap();
    let response = tokio::time::timeout(GUARD, response)
        .await
        .expect("an answer to the silent stream")
        .unwrap();
    assert_eq!(response.status(), 408);
    wait_access(&proxy, 408, "/echo").await;
}

// === Idle HTTP/2 connections ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_h2_connection_is_closed_after_the_idle_timeout() {
    let (_b, proxy, pem) = serve_tls(&["--debug", "--idle-timeout=1s"], "--host=app.test").await;
    let (mut send, connection) = h2_connect(&proxy, &pem).await;
    let req = http::Request::get("https://app.test/").body(()).unwrap();
    assert_eq!(h2_get(&mut send, req).await, 200);
    // The server ends the connection (GOAWAY, then close) on its own: the client's
    // connection task returns. The guard only stops a hang.
    let ended = tokio::time::timeout(GUARD, connection)
        .await
        .expect("the server closed the idle connection")
        .unwrap();
    assert!(
        testkit::tls::closed_by_server(&ended),
        "the idle connection ended with an error: {ended:?}"
    );
    proxy
        .wait_for_log("the idle close logged", |l| {
            l.contains("Closing idle HTTP/2 connection")
        })
        .await;
}

// === Connection limit ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_max_connections_new_ones_wait_and_the_control_socket_answers() {
    let (_b, proxy) = serve(&["--max-connections=2"], &[]).await;
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: app.test\r\n\r\n").into_bytes();
    let mut open = Vec::new();
    for path in ["/first", "/second"] {
        let mut s = BufReader::new(raw::connect(proxy.http_port).await);
        s.get_mut().write_all(&get(path)).await.unwrap();
        assert_eq!(raw::read_response(&mut s, false).await.status, 200);
        open.push(s); // kept alive: each holds its slot
    }
    let mut third = BufReader::new(raw::connect(proxy.http_port).await);
    third.get_mut().write_all(&get("/third")).await.unwrap();
    proxy
        .wait_for_log("the limit reached", |l| {
            l.contains("Connection limit reached") && l.contains("\"max_connections\":2")
        })
        .await;
    // The control socket is not behind the limit.
    assert!(proxy.ok(&["list"]).await.contains("app"));
    let mut byte = [0u8; 1];
    assert_eq!(
        third.get_ref().try_read(&mut byte).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "the third connection waits unanswered"
    );
    drop(open.remove(0));
    let r = tokio::time::timeout(GUARD, raw::read_response(&mut third, false))
        .await
        .expect("served once a slot is free");
    assert_eq!(r.status, 200);
}

// === Request head limit ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_request_head_gets_431() {
    let (_b, proxy) = serve(&["--max-request-header-size=4096"], &[]).await;
    let with_header = |len: usize| {
        format!(
            "GET / HTTP/1.1\r\nHost: app.test\r\nX-Big: {}\r\n\r\n",
            "x".repeat(len)
        )
    };
    let r = raw::send(proxy.http_port, with_header(3000).as_bytes()).await;
    assert_eq!(r.status, 200);
    let r = raw::send(proxy.http_port, with_header(5000).as_bytes()).await;
    assert_eq!(r.status, 431, "{}", r.status_line);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_head_limit_is_64_kib_on_http1_and_http2() {
    let (_b, proxy, pem) = serve_tls(&[], "--host=app.test").await;
    let head = |len: usize| {
        format!(
            "GET / HTTP/1.1\r\nHost: app.test\r\nX-Big: {}\r\n\r\n",
            "x".repeat(len)
        )
    };
    let r = raw::send(proxy.http_port, head(60 * 1024).as_bytes()).await;
    assert_eq!(r.status, 200);
    let r = raw::send(proxy.http_port, head(66 * 1024).as_bytes()).await;
    assert_eq!(r.status, 431);

    let (mut send, _c) = h2_connect(&proxy, &pem).await;
    let req = |len: usize| {
        http::Request::get("https://app.test/")
            .header("x-big", "x".repeat(len))
            .body(())
            .unwrap()
    };
    assert_eq!(h2_get(&mut send, req(60 * 1024)).await, 200);
    assert_eq!(h2_get(&mut send, req(66 * 1024)).await, 431);
}

// === One meaning per request ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_or_missing_host_is_400_on_http11() {
    let (backend, proxy) = serve(&[], &[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /dup HTTP/1.1\r\nHost: app.test\r\nHost: other.test\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.header("connection"), Some("close"));
    let r = raw::send(proxy.http_port, b"GET /none HTTP/1.1\r\n\r\n").await;
    assert_eq!(r.status, 400);
    proxy
        .wait_for_log("why", |l| {
            l.contains("Malformed request") && l.contains("missing Host header")
        })
        .await;
    wait_access(&proxy, 400, "/dup").await;
    // HTTP/1.0 needs no Host: it reaches the default... here no service has no host, so 404.
    let r = raw::send(proxy.http_port, b"GET /old HTTP/1.0\r\n\r\n").await;
    assert_eq!(r.status, 404);
    assert_eq!(backend.hits(), 0, "no ambiguous request reached the app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_match_case_insensitively_without_the_trailing_dot() {
    let (_b, proxy) = serve(&[], &[]).await;
    for host in ["APP.Test", "app.test.", "App.TEST.:80"] {
        let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        let r = raw::send(proxy.http_port, req.as_bytes()).await;
        assert_eq!(r.status, 200, "Host: {host}");
        assert_eq!(r.header("x-backend"), Some("app"));
    }
    // Deploys store hosts normalized, so these are the same host as app.test.
    let other = Backend::start("other").await;
    let err = proxy
        .fails(&[
            "deploy",
            "other",
            &format!("--target={}", other.target()),
            "--host=App.Test.",
        ])
        .await;
    assert!(
        err.contains("already in use") || err.contains("conflict"),
        "{err}"
    );
    let json = proxy.list_json().await;
    assert_eq!(
        json["services"]["app"]["hosts"],
        serde_json::json!(["app.test"]),
        "{json}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_contradicting_authority_is_400_and_authority_routes() {
    // Deployed as App.Test: the certificate for app.test is found all the same.
    let (backend, proxy, pem) = serve_tls(&[], "--host=App.Test").await;
    let (mut send, _c) = h2_connect(&proxy, &pem).await;
    let routed = http::Request::get("https://app.test/").body(()).unwrap();
    assert_eq!(h2_get(&mut send, routed).await, 200);
    let conflict = http::Request::get("https://app.test/conflict")
        .header("host", "other.test")
        .body(())
        .unwrap();
    assert_eq!(h2_get(&mut send, conflict).await, 400);
    wait_access(&proxy, 400, "/conflict").await;
    assert_eq!(backend.hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_h2c_upgrade_is_refused_and_the_request_served_plainly() {
    let (_b, proxy) = serve(&[], &[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade, HTTP2-Settings\r\n\
Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "no 101, no tunnel");
    let echo = r.json();
    let headers = echo["headers"].as_object().unwrap();
    for gone in ["upgrade", "http2-settings", "connection"] {
        assert!(
            !headers.contains_key(gone),
            "{gone} reached the app: {echo}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_upgrades_still_pass() {
    let (_b, proxy) = serve(&[], &[]).await;
    let url = format!("ws://127.0.0.1:{}/ws", proxy.http_port);
    let mut req = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        url.as_str(),
    )
    .unwrap();
    req.headers_mut()
        .insert("host", http::HeaderValue::from_static("app.test"));
    let (mut ws, response) = tokio_tungstenite::connect_async(req).await.expect("ws");
    assert_eq!(response.status(), 101);
    use futures_util::{SinkExt, StreamExt};
    ws.send(tokio_tungstenite::tungstenite::Message::text("hi"))
        .await
        .unwrap();
    let echoed = ws.next().await.unwrap().unwrap();
    assert_eq!(echoed.into_text().unwrap().as_str(), "hi");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_chunk_size_is_400() {
    let (_b, proxy) = serve(&["--body-read-timeout=30s"], &[]).await;
    let r = raw::send(
        proxy.http_port,
        b"POST /echo HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n\
ffffffffffffffff\r\nabc",
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

// === Leftovers of a kill -9 ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leftover_temp_state_files_of_dead_processes_are_removed_at_start() {
    let mut proxy = Proxy::start().await;
    let dead_pid = proxy.pid().unwrap();
    proxy.kill9();
    let dir = proxy.state_file().parent().unwrap().to_path_buf();
    let dead = dir.join(format!("kamal-proxy.state.tmp-{dead_pid}"));
    // This test's own process is alive: its file may be another generation's save.
    let live = dir.join(format!("kamal-proxy.state.tmp-{}", std::process::id()));
    std::fs::write(&dead, b"[]").unwrap();
    std::fs::write(&live, b"[]").unwrap();
    proxy.respawn().await;
    let line = proxy
        .wait_for_log("the leftover removed", |l| {
            l.contains("Removed leftover temp state file")
        })
        .await;
    assert!(line.contains(&format!("tmp-{dead_pid}")), "{line}");
    assert!(!dead.exists());
    assert!(live.exists());
    poll_until("a single removal logged", Duration::from_secs(5), || {
        let n = proxy
            .logs()
            .iter()
            .filter(|l| l.contains("Removed leftover temp state file"))
            .count();
        std::future::ready(if n == 1 { Ok(()) } else { Err(n) })
    })
    .await;
}

// === Flags ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_limit_flags_are_refused_with_a_clear_message() {
    for (flag, message) in [
        ("--max-connections=0", "must be between 1 and 1000000"),
        (
            "--body-read-timeout=-1s",
            "must not be negative (0 disables it)",
        ),
        ("--body-read-timeout=soon", "invalid duration"),
        (
            "--max-request-header-size=100",
            "must be between 1024 and 4294967295 bytes",
        ),
    ] {
        match testkit::try_run(&["--http-port=0", flag], &[]).await {
            testkit::RunOutcome::Exited { code, stderr } => {
                assert_eq!(code, Some(1), "{flag}");
                assert!(stderr.contains(message), "{flag}: {stderr}");
            }
            other => panic!("{flag} started: {other:?}"),
        }
    }
}
