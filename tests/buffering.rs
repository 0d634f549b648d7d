//! `--buffer-requests` / `--buffer-responses` (upstream §4.8): limits, spilling to disk,
//! the streaming exemptions, and malformed request bodies.

use futures_util::{SinkExt, StreamExt};
use std::path::Path;
use std::time::Duration;
use testkit::backend::{Backend, fnv1a};
use testkit::raw;
use testkit::{Proxy, client, poll_until};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

const HTML: &str = "text/html; charset=utf-8";

async fn serve(extra: &[&str]) -> (Backend, Proxy) {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &backend.target(), extra).await;
    (backend, proxy)
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i.wrapping_mul(31) % 253) as u8).collect()
}

fn fnv_hex(data: &[u8]) -> String {
    format!("{:016x}", fnv1a(data))
}

/// A request body the test feeds piece by piece (sent chunked: no length up front).
fn channel_body() -> (mpsc::Sender<Vec<u8>>, reqwest::Body) {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(4);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::io::Error>(chunk), rx))
    });
    (tx, reqwest::Body::wrap_stream(stream))
}

/// Files the process holds open below `dir` (spill files are unlinked at once, so they
/// show only here, as `<dir>/… (deleted)`).
/// One HTTP/1.1 chunk carrying `data`.
fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:X}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

fn open_files_below(pid: u32, dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|p| p.starts_with(dir))
        .map(|p| p.display().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_body_of_exactly_the_limit_passes_and_one_more_byte_is_413() {
    let (backend, proxy) = serve(&["--buffer-requests", "--max-request-body=1000"]).await;
    let c = client();
    let data = pattern(1000);
    let resp = c
        .post(proxy.url("/echo"))
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["body_len"], 1000);
    assert_eq!(echo["body_fnv"], fnv_hex(&data).as_str());

    let hits = backend.hits();
    let resp = c
        .post(proxy.url("/echo"))
        .body(pattern(1001))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.headers()["content-type"], HTML);
    let body = resp.text().await.unwrap();
    assert!(body.contains("413 — Content Too Large"), "{body}");
    assert!(body.contains("exceeds the allowed size"), "{body}");

    // Same for a chunked body, whose size is only known while reading it.
    let (tx, body) = channel_body();
    let send = tokio::spawn(c.post(proxy.url("/echo")).body(body).send());
    for piece in pattern(1001).chunks(300) {
        if tx.send(piece.to_vec()).await.is_err() {
            break;
        }
    }
    drop(tx);
    let resp = send.await.unwrap().unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(
        backend.hits(),
        hits,
        "an oversized body must never reach the app"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn response_body_over_the_limit_is_500() {
    let (_b, proxy) = serve(&["--buffer-responses", "--max-response-body=1000"]).await;
    let c = client();
    let resp = c.get(proxy.url("/bytes/1000")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().len(), 1000);

    let resp = c.get(proxy.url("/bytes/1001")).send().await.unwrap();
    assert_eq!(resp.status(), 500);
    assert_eq!(resp.headers()["content-type"], HTML);
    assert_eq!(
        resp.text().await.unwrap(),
        "<h1>500 Internal Server Error</h1>"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buffered_response_waits_for_the_whole_body_and_gets_a_length() {
    let (_b, proxy) = serve(&["--buffer-responses"]).await;
    let started = Instant::now();
    let resp = client()
        .get(proxy.url("/drip?n=3&interval_ms=300"))
        .send()
        .await
        .unwrap();
    // Headers come only once the upstream finished (two 300 ms pauses).
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(resp.status(), 200);
    let expected = "data: event 0\n\ndata: event 1\n\ndata: event 2\n\n";
    assert_eq!(resp.content_length(), Some(expected.len() as u64));
    assert_eq!(resp.text().await.unwrap(), expected);

    // Without buffering the same response streams, with no length.
    let (_b, plain) = serve(&[]).await;
    let resp = client()
        .get(plain.url("/drip?n=2&interval_ms=5000"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.content_length(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buffered_request_reaches_the_app_only_when_complete_with_a_length() {
    let (backend, proxy) = serve(&["--buffer-requests"]).await;
    let data = pattern(300_000);
    // Chunked, so only a proxy that read the whole body can give the app a length.
    let mut conn = raw::connect(proxy.http_port).await;
    let head = "POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n";
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&chunk(&data[..100_000])).await.unwrap();
    // The proxy has read the first part (a streaming proxy would have sent the head on
    // to the app by then).
    raw::wait_until_read_by_peer(&conn).await;
    assert_eq!(
        backend.hits(),
        0,
        "the app saw the request before its body was complete"
    );
    conn.write_all(&chunk(&data[100_000..])).await.unwrap();
    conn.write_all(b"0\r\n\r\n").await.unwrap();
    let resp = raw::read_response(&mut tokio::io::BufReader::new(conn), false).await;
    assert_eq!(resp.status, 200);
    let echo = resp.json();
    assert_eq!(echo["body_len"], data.len());
    assert_eq!(echo["body_fnv"], fnv_hex(&data).as_str());
    assert_eq!(
        echo["headers"]["content-length"],
        data.len().to_string().as_str(),
        "{echo}"
    );
    assert!(echo["headers"].get("transfer-encoding").is_none(), "{echo}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_body_past_buffer_memory_spills_to_a_temp_file() {
    let spill = tempfile::tempdir().unwrap();
    let spill_dir = spill.path().canonicalize().unwrap();
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with(&[], &[("TMPDIR", spill_dir.to_str().unwrap())]).await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--buffer-requests", "--buffer-memory=1024"],
        )
        .await;
    let pid = proxy.pid().unwrap();

    let data = pattern(1024 * 1024);
    let (tx, body) = channel_body();
    let send = tokio::spawn(client().post(proxy.url("/echo")).body(body).send());
    tx.send(data[..512 * 1024].to_vec()).await.unwrap();
    // While the body is still arriving, the proxy holds a file in $TMPDIR.
    let files = poll_until("a spill file opened", Duration::from_secs(10), || async {
        let files = open_files_below(pid, &spill_dir);
        (!files.is_empty()).then_some(files)
    })
    .await;
    assert!(
        files.iter().all(|f| f.ends_with("(deleted)")),
        "spill files must be unlinked: {files:?}"
    );
    assert_eq!(
        std::fs::read_dir(&spill_dir).unwrap().count(),
        0,
        "nothing left visible in TMPDIR"
    );
    tx.send(data[512 * 1024..].to_vec()).await.unwrap();
    drop(tx);

    let resp = send.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["body_len"], data.len());
    assert_eq!(echo["body_fnv"], fnv_hex(&data).as_str());
    // The file goes away with the request.
    poll_until(
        "the spill file to close with the request",
        Duration::from_secs(10),
        || async { open_files_below(pid, &spill_dir).is_empty() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_body_within_buffer_memory_stays_in_memory() {
    let spill = tempfile::tempdir().unwrap();
    let spill_dir = spill.path().canonicalize().unwrap();
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with(&[], &[("TMPDIR", spill_dir.to_str().unwrap())]).await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--buffer-requests", "--buffer-memory=4194304"],
        )
        .await;
    let pid = proxy.pid().unwrap();

    let data = pattern(2 * 1024 * 1024);
    let mut conn = raw::connect(proxy.http_port).await;
    let head = "POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n";
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&chunk(&data[..1024 * 1024])).await.unwrap();
    // The proxy holds the first MiB (it has read it), and no spill file is open.
    raw::wait_until_read_by_peer(&conn).await;
    assert_eq!(open_files_below(pid, &spill_dir), Vec::<String>::new());
    conn.write_all(&chunk(&data[1024 * 1024..])).await.unwrap();
    conn.write_all(b"0\r\n\r\n").await.unwrap();
    let echo = raw::read_response(&mut tokio::io::BufReader::new(conn), false)
        .await
        .json();
    assert_eq!(echo["body_len"], data.len());
    assert_eq!(echo["body_fnv"], fnv_hex(&data).as_str());
}

/// The spill file lives in $TMPDIR: when that cannot be written, a body that must spill
/// fails (500) while one that fits in memory still passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unwritable_tmpdir_fails_only_bodies_that_spill() {
    let missing = tempfile::tempdir().unwrap().path().join("gone");
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with(&[], &[("TMPDIR", missing.to_str().unwrap())]).await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--buffer-requests", "--buffer-memory=1024"],
        )
        .await;
    let c = client();
    let resp = c
        .post(proxy.url("/echo"))
        .body(pattern(1000))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = c
        .post(proxy.url("/echo"))
        .body(pattern(64 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 500);
    assert_eq!(resp.headers()["content-type"], HTML);
    let body = resp.text().await.unwrap();
    assert!(
        !body.contains("gone") && !body.contains("No such file"),
        "internal detail leaked: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_sent_events_bypass_response_buffering() {
    let (b, proxy) = serve(&["--buffer-responses", "--max-response-body=10"]).await;
    let resp = client()
        .get(proxy.url("/sse?n=2&interval_ms=60000"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let first = stream
        .next()
        .await
        .expect("first event before the stream ended")
        .unwrap();
    assert_eq!(&first[..], b"data: event 0\n\n");
    assert_eq!(
        b.events_sent(),
        1,
        "the first event arrived before the second existed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn websockets_work_with_buffering_on() {
    let (_b, proxy) = serve(&[
        "--buffer-requests",
        "--buffer-responses",
        "--max-request-body=10",
        "--max-response-body=10",
    ])
    .await;
    use tokio_tungstenite::tungstenite::Message;
    let url = format!("ws://127.0.0.1:{}/ws", proxy.http_port);
    let (mut ws, resp) = tokio_tungstenite::connect_async(url)
        .await
        .expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    let long = "a message longer than both body limits";
    ws.send(Message::text(long)).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("echo in time");
    assert_eq!(got.unwrap().unwrap(), Message::text(long));
    ws.close(None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_buffering_no_limits_apply() {
    // The limits may be given with buffering explicitly off; they are then ignored.
    let (_b, proxy) = serve(&[
        "--buffer-requests=false",
        "--buffer-responses=false",
        "--max-request-body=10",
        "--max-response-body=10",
    ])
    .await;
    let c = client();
    let data = pattern(100_000);
    let echo: serde_json::Value = c
        .post(proxy.url("/echo"))
        .body(data.clone())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(echo["body_len"], data.len());
    assert_eq!(echo["body_fnv"], fnv_hex(&data).as_str());
    let resp = c.get(proxy.url("/bytes/100000")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().len(), 100_000);

    // Without the buffering flag at all, the CLI refuses the limits.
    let err = proxy
        .fails(&[
            "deploy",
            "other",
            "--target=127.0.0.1:1",
            "--max-request-body=10",
        ])
        .await;
    assert!(
        err.contains("max-request-body can only be set when request buffering is enabled"),
        "{err}"
    );
    let err = proxy
        .fails(&[
            "deploy",
            "other",
            "--target=127.0.0.1:1",
            "--max-response-body=10",
        ])
        .await;
    assert!(
        err.contains("max-response-body can only be set when response buffering is enabled"),
        "{err}"
    );
}

const MALFORMED_CHUNKED: &[u8] =
    b"POST /echo HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nhello\r\n0\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_chunked_body_is_400_with_buffering() {
    let (_b, proxy) = serve(&["--buffer-requests"]).await;
    let r = raw::send(proxy.http_port, MALFORMED_CHUNKED).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("content-type"), Some(HTML));
    assert_eq!(r.text(), "<h1>400 Bad Request</h1>");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_chunked_body_is_400_without_buffering() {
    let (_b, proxy) = serve(&[]).await;
    let r = raw::send(proxy.http_port, MALFORMED_CHUNKED).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.header("content-type"), Some(HTML));
    assert_eq!(r.text(), "<h1>400 Bad Request</h1>");
    proxy
        .wait_for_log("\"msg\":\"Request\"", |l| {
            l.contains("\"msg\":\"Request\"") && l.contains("\"status\":400")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buffered_head_response_keeps_the_apps_length() {
    let (_b, proxy) = serve(&["--buffer-responses"]).await;
    let mut s = raw::connect(proxy.http_port).await;
    use tokio::io::AsyncWriteExt;
    s.write_all(b"HEAD /bytes/100 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let mut reader = tokio::io::BufReader::new(s);
    let r = raw::read_response(&mut reader, true).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("100"));
    let r = raw::send(
        proxy.http_port,
        b"GET /status/204 HTTP/1.1\r\nHost: app.test\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 204);
    assert!(
        r.header("content-length").is_none_or(|v| v == "0"),
        "{:?}",
        r.headers
    );
}

/// Response spilling also goes through $TMPDIR: when it cannot be written, a response
/// that must spill is a 500 (the proxy's failure, not the app's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unwritable_tmpdir_fails_only_responses_that_spill() {
    let missing = tempfile::tempdir().unwrap().path().join("gone");
    let backend = Backend::start("app").await;
    let proxy = Proxy::start_with(&[], &[("TMPDIR", missing.to_str().unwrap())]).await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--buffer-responses", "--buffer-memory=1024"],
        )
        .await;
    let c = client();
    let resp = c.get(proxy.url("/bytes/1000")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap().len(), 1000);
    let resp = c.get(proxy.url("/bytes/100000")).send().await.unwrap();
    assert_eq!(resp.status(), 500);
    assert_eq!(
        resp.text().await.unwrap(),
        "<h1>500 Internal Server Error</h1>"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buffered_response_spills_to_disk_and_arrives_intact() {
    let (_b, proxy) = serve(&["--buffer-responses", "--buffer-memory=1024"]).await;
    const N: usize = 3 * 1024 * 1024;
    let resp = client()
        .get(proxy.url(&format!("/bytes/{N}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.content_length(), Some(N as u64));
    let body = resp.bytes().await.unwrap();
    assert_eq!(body.len(), N);
    assert!(body.iter().all(|&b| b == b'x'));
}

/// An app that dies while its response is being buffered: a 502, never a truncated 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn app_failing_while_its_response_is_buffered_is_502() {
    let (addr, task) =
        raw::scripted_backend(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("app", &addr.to_string(), &["--buffer-responses"])
        .await;
    let resp = client().get(proxy.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    assert!(resp.text().await.unwrap().contains("502 — Bad Gateway"));
    task.abort();
}
