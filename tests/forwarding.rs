//! Forwarding, as a client and an upstream app see it: headers in both directions,
//! bodies streamed intact, timeouts and upstream failures, cancellation, upgrades,
//! server-sent events and HTTP/1.0 (upstream §3.8–3.11, §4.7, §4.9).

use futures_util::{SinkExt, StreamExt};
use std::time::Duration;
use testkit::backend::{Backend, fnv1a};
use testkit::free_port;
use testkit::raw;
use testkit::{Proxy, client, poll_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn serve(extra: &[&str]) -> (Backend, Proxy) {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &backend.target(), extra).await;
    (backend, proxy)
}

/// Waits until `pred` holds for an access-log line, or fails with the logs.
async fn wait_access(
    proxy: &Proxy,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let line = proxy
        .wait_for_log(&format!("an access-log line {what}"), |l| {
            serde_json::from_str::<serde_json::Value>(l)
                .is_ok_and(|v| v["msg"] == "Request" && pred(&v))
        })
        .await;
    serde_json::from_str(&line).expect("a JSON log line")
}

fn header<'a>(echo: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    echo["headers"][name].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hop_by_hop_request_headers_are_removed() {
    let (_b, proxy) = serve(&[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive, X-Secret, x-other\r\n\
X-Secret: s\r\nX-Other: o\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n\
Proxy-Authorization: Basic Zm9vOmJhcg==\r\nTe: gzip\r\nTrailer: X-T\r\nUpgrade: foo/1\r\n\
X-App: kept\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    let headers = echo["headers"].as_object().unwrap();
    for gone in [
        "connection",
        "x-secret",
        "x-other",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "upgrade",
        "via",
    ] {
        assert!(
            !headers.contains_key(gone),
            "{gone} reached the upstream: {echo}"
        );
    }
    assert_eq!(header(&echo, "x-app"), Some("kept"));
}

/// Go's proxy keeps the host apart from the fields: a `Connection` that names `Host`
/// removes nothing, and the app sees the host the client asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_connection_field_naming_host_does_not_take_the_host_away() {
    let (_b, proxy) = serve(&[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive, Host\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(header(&echo, "host"), Some("app.test"), "{echo}");
    assert_eq!(
        header(&echo, "x-forwarded-host"),
        Some("app.test"),
        "{echo}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn te_trailers_is_kept_and_no_user_agent_is_invented() {
    let (_b, proxy) = serve(&[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: app.test\r\nTE: trailers, gzip\r\n\r\n",
    )
    .await;
    let echo = r.json();
    assert_eq!(header(&echo, "te"), Some("trailers"), "{echo}");
    assert_eq!(header(&echo, "user-agent"), None, "{echo}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hop_by_hop_response_headers_are_removed() {
    let (b, proxy) = serve(&[]).await;
    let request = b"GET /headers?connection=X-Secret&x-secret=s&keep-alive=timeout%3D5&proxy-authenticate=Basic&\
proxy-connection=keep-alive&x-app=kept HTTP/1.1\r\nHost: app.test\r\n\r\n";
    // The app really sends them...
    let direct = raw::send(b.addr.port(), request).await;
    for sent in [
        "x-secret",
        "keep-alive",
        "proxy-authenticate",
        "proxy-connection",
    ] {
        assert!(
            direct.has_header(sent),
            "backend did not send {sent}: {:?}",
            direct.headers
        );
    }
    // ...and the proxy drops them.
    let r = raw::send(proxy.http_port, request).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for gone in [
        "x-secret",
        "keep-alive",
        "proxy-authenticate",
        "proxy-connection",
        "via",
    ] {
        assert!(
            !r.has_header(gone),
            "{gone} reached the client: {:?}",
            r.headers
        );
    }
    if let Some(c) = r.header("connection") {
        assert!(
            !c.to_ascii_lowercase().contains("x-secret"),
            "Connection: {c}"
        );
    }
    assert_eq!(r.header("x-app"), Some("kept"));
    assert_eq!(r.text(), "headers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forwarded_headers_extend_client_values_by_default() {
    let (_b, proxy) = serve(&[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: app.test:8080\r\nX-Forwarded-For: 1.2.3.4\r\n\
X-Forwarded-For: 5.6.7.8\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: orig.test\r\n\
Forwarded: for=9.9.9.9\r\n\r\n",
    )
    .await;
    let echo = r.json();
    assert_eq!(
        header(&echo, "x-forwarded-for"),
        Some("1.2.3.4, 5.6.7.8, 127.0.0.1"),
        "{echo}"
    );
    assert_eq!(header(&echo, "x-forwarded-proto"), Some("https"));
    assert_eq!(header(&echo, "x-forwarded-host"), Some("orig.test"));
    assert_eq!(header(&echo, "forwarded"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forwarded_headers_are_computed_when_the_client_sends_none() {
    let (_b, proxy) = serve(&[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: app.test:8080\r\n\r\n",
    )
    .await;
    let echo = r.json();
    assert_eq!(
        header(&echo, "x-forwarded-for"),
        Some("127.0.0.1"),
        "{echo}"
    );
    assert_eq!(header(&echo, "x-forwarded-proto"), Some("http"));
    assert_eq!(header(&echo, "x-forwarded-host"), Some("app.test:8080"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forward_headers_false_replaces_client_values() {
    let (_b, proxy) = serve(&["--forward-headers=false"]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: app.test:8080\r\nX-Forwarded-For: 1.2.3.4\r\n\
X-Forwarded-Proto: https\r\nX-Forwarded-Host: orig.test\r\nForwarded: for=9.9.9.9\r\n\r\n",
    )
    .await;
    let echo = r.json();
    assert_eq!(
        header(&echo, "x-forwarded-for"),
        Some("127.0.0.1"),
        "{echo}"
    );
    assert_eq!(header(&echo, "x-forwarded-proto"), Some("http"));
    assert_eq!(header(&echo, "x-forwarded-host"), Some("app.test:8080"));
    assert_eq!(header(&echo, "forwarded"), None);
}

fn is_uuid_v4(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && parts.iter().all(|p| {
            p.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        })
        && parts[2].starts_with('4')
        && matches!(parts[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_id_is_generated_when_absent_and_kept_when_present() {
    let (_b, proxy) = serve(&[]).await;
    let c = client();
    let echo: serde_json::Value = c
        .get(proxy.url("/echo?first"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = header(&echo, "x-request-id")
        .expect("x-request-id")
        .to_string();
    assert!(is_uuid_v4(&id), "not a UUIDv4: {id}");
    let again: serde_json::Value = c
        .get(proxy.url("/echo?second"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_ne!(
        header(&again, "x-request-id"),
        Some(id.as_str()),
        "ids must differ per request"
    );

    let resp = c
        .get(proxy.url("/echo?kept"))
        .header("X-Request-ID", "1234")
        .send()
        .await
        .unwrap();
    assert!(
        resp.headers().get("x-request-id").is_none(),
        "not added to the response"
    );
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(header(&echo, "x-request-id"), Some("1234"));

    // The access log names the id actually used.
    let line = wait_access(&proxy, "for ?first", |l| l["query"] == "first").await;
    assert_eq!(line["request_id"], id.as_str());
    let line = wait_access(&proxy, "for ?kept", |l| l["query"] == "kept").await;
    assert_eq!(line["request_id"], "1234");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_start_is_stamped_when_absent_and_kept_when_present() {
    let (_b, proxy) = serve(&[]).await;
    let c = client();
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    };
    let before = now_ms();
    let echo: serde_json::Value = c
        .get(proxy.url("/echo"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let after = now_ms();
    let stamp = header(&echo, "x-request-start").expect("x-request-start");
    let ms: u128 = stamp
        .strip_prefix("t=")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("bad X-Request-Start {stamp}"));
    assert!(
        ms + 1000 >= before && ms <= after + 1000,
        "{ms} not within [{before}, {after}]"
    );

    let echo: serde_json::Value = c
        .get(proxy.url("/echo"))
        .header("X-Request-Start", "t=1234")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(header(&echo, "x-request-start"), Some("t=1234"));
}

/// The id and start the proxy makes reach the app whichever upstream connection carries
/// the request (one with a body goes through hyper's), replace empty values the client
/// sent rather than go beside them, and are what `--log-request-header` logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn made_request_id_and_start_reach_the_app_on_either_connection_and_are_logged() {
    let (_b, proxy) = serve(&[
        "--log-request-header=X-Request-Id",
        "--log-request-header=X-Request-Start",
    ])
    .await;
    let sent = [
        (
            "body",
            "POST /echo?body HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello",
        ),
        (
            "bodiless",
            "GET /echo?bodiless HTTP/1.1\r\nHost: app.test\r\n\r\n",
        ),
        (
            "empty",
            "GET /echo?empty HTTP/1.1\r\nHost: app.test\r\nX-Request-Id: \r\n\
X-Request-Start: \r\n\r\n",
        ),
    ];
    for (query, request) in sent {
        let r = raw::send(proxy.http_port, request.as_bytes()).await;
        assert_eq!(r.status, 200, "{query}: {}", r.text());
        let echo = r.json();
        let id = header(&echo, "x-request-id").expect("x-request-id");
        assert!(is_uuid_v4(id), "{query}: not a UUIDv4: {id}");
        let start = header(&echo, "x-request-start").expect("x-request-start");
        assert!(
            start
                .strip_prefix("t=")
                .is_some_and(|ms| ms.parse::<u64>().is_ok()),
            "{query}: bad X-Request-Start {start}"
        );
        let line = wait_access(&proxy, &format!("for ?{query}"), |l| l["query"] == query).await;
        assert_eq!(line["request_id"], id, "{query}");
        assert_eq!(line["req_x_request_id"], id, "{query}");
        assert_eq!(line["req_x_request_start"], start, "{query}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kamal_target_names_the_chosen_target() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &backend.target(), &[]).await;
    proxy
        .deploy(
            "strict",
            &backend.target(),
            &["--host=strict.test", "--forward-headers=false"],
        )
        .await;
    let target = backend.target();
    let c = client();

    let echo: serde_json::Value = c
        .get(proxy.url("/echo"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(header(&echo, "x-kamal-target"), Some(target.as_str()));

    let echo: serde_json::Value = c
        .get(proxy.url("/echo"))
        .header("X-Kamal-Target", "edge:1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        header(&echo, "x-kamal-target"),
        Some(format!("edge:1, {target}").as_str())
    );

    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: app.test\r\nX-Kamal-Target: a:1\r\nX-Kamal-Target: b:2\r\n\r\n",
    )
    .await;
    let expected = format!("a:1, b:2, {target}");
    assert_eq!(header(&r.json(), "x-kamal-target"), Some(expected.as_str()));

    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: strict.test\r\nX-Kamal-Target: edge:1\r\n\r\n",
    )
    .await;
    assert_eq!(header(&r.json(), "x-kamal-target"), Some(target.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn host_header_is_preserved() {
    let (b, proxy) = serve(&[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo HTTP/1.1\r\nHost: Myapp.Example:1234\r\n\r\n",
    )
    .await;
    let echo = r.json();
    assert_eq!(header(&echo, "host"), Some("Myapp.Example:1234"), "{echo}");
    assert_ne!(header(&echo, "host"), Some(b.target().as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn query_string_is_forwarded_verbatim() {
    let (_b, proxy) = serve(&[]).await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo?p1=a;b;c&p2=%x&p3=%20+&&p4 HTTP/1.1\r\nHost: app.test\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let echo = r.json();
    assert_eq!(echo["uri"], "/echo?p1=a;b;c&p2=%x&p3=%20+&&p4", "{echo}");
    let line = wait_access(&proxy, "for /echo", |l| l["path"] == "/echo").await;
    assert_eq!(line["query"], "p1=a;b;c&p2=%x&p3=%20+&&p4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chunked_request_body_arrives_byte_identical() {
    let (_b, proxy) = serve(&[]).await;
    let data: Vec<u8> = (0..5 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(7) % 251) as u8)
        .collect();
    let expected = format!("{:016x}", fnv1a(&data));
    // Uneven pieces, sent as a stream of unknown length: chunked on the wire.
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        data.chunks(65_521).map(|c| Ok(c.to_vec())).collect();
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(pieces));
    let resp = client()
        .post(proxy.url("/echo"))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body_len"], data.len());
    assert_eq!(echo["body_fnv"], expected.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_response_arrives_complete() {
    let (_b, proxy) = serve(&[]).await;
    const N: usize = 20 * 1024 * 1024;
    let resp = client()
        .get(proxy.url(&format!("/bytes/{N}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.content_length(), Some(N as u64));
    let mut stream = resp.bytes_stream();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("body chunk");
        assert!(chunk.iter().all(|&b| b == b'x'));
        total += chunk.len();
    }
    assert_eq!(total, N);
    let line = wait_access(&proxy, "for /bytes", |l| l["path"] == format!("/bytes/{N}")).await;
    assert_eq!(line["resp_content_length"], N);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_connections_are_reused() {
    let (backend, proxy) = serve(&[]).await;
    let before = backend.connections();
    let c = client();
    for i in 0..50 {
        let resp = c.get(proxy.url(&format!("/n{i}"))).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), "app");
    }
    let opened = backend.connections() - before;
    assert!(
        opened <= 5,
        "50 sequential requests opened {opened} upstream connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_timeout_answers_504_page() {
    let (_b, proxy) = serve(&["--target-timeout=200ms"]).await;
    let resp = client()
        .get(proxy.url("/slow?ms=3000"))
        .send()
        .await
        .unwrap();
    // The app would have answered 200 after 3 s: a 504 means the proxy gave up first.
    assert_eq!(resp.status(), 504);
    assert_eq!(resp.headers()["content-type"], "text/html; charset=utf-8");
    assert!(resp.text().await.unwrap().contains("504 — Gateway Timeout"));
    // The log says which timeout fired.
    proxy
        .wait_for_log("the target timeout firing", |l| {
            l.contains("Target timed out before responding")
        })
        .await;
    assert!(
        !proxy
            .logs()
            .iter()
            .any(|l| l.contains("Request deadline exceeded"))
    );
    // Not a limit on the body: a fast response is unaffected.
    let resp = client().get(proxy.url("/slow?ms=10")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// Kills the backend (open connections included) and waits until its port refuses
/// connections.
async fn stop_listening(backend: &Backend) {
    backend.kill();
    poll_until(
        "the killed backend to refuse connections",
        Duration::from_secs(10),
        || async { tokio::net::TcpStream::connect(backend.addr).await.is_err() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_target_answers_502_page() {
    let (backend, proxy) = serve(&[]).await;
    stop_listening(&backend).await;
    let resp = client().get(proxy.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["content-type"], "text/html; charset=utf-8");
    let body = resp.text().await.unwrap();
    assert!(body.contains("502 — Bad Gateway"), "{body}");
    assert!(
        !body.contains(&backend.target()),
        "the page must not leak the target: {body}"
    );
    proxy
        .wait_for_log("Error while proxying", |l| {
            l.contains("Error while proxying")
        })
        .await;
}

/// A forced deploy installs a target that never became healthy: upstream routes nothing
/// to it and answers 503 (no healthy targets).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forced_deploy_to_a_closed_port_answers_503_page() {
    let port = free_port();
    let proxy = Proxy::start().await;
    proxy
        .deploy("app", &format!("127.0.0.1:{port}"), &["--force"])
        .await;
    let resp = client().get(proxy.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["content-type"], "text/html; charset=utf-8");
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("503 — Service Temporarily Unavailable")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_error_responses_pass_through() {
    let (_b, proxy) = serve(&[]).await;
    for code in [500u16, 502, 503, 404] {
        let resp = client()
            .get(proxy.url(&format!("/status/{code}")))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), code);
        assert!(
            resp.headers()
                .get("content-type")
                .is_none_or(|v| v != "text/html; charset=utf-8")
        );
        assert_eq!(resp.text().await.unwrap(), format!("status {code}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_disconnect_cancels_the_upstream_request() {
    let (backend, proxy) = serve(&[]).await;
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"GET /slow?ms=20000 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    poll_until(
        "the request to reach the backend",
        Duration::from_secs(10),
        || std::future::ready(backend.hits() > 0),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(s);
    // Long before the 20 s answer: the proxy logs 499 and hangs up on the upstream.
    let line = wait_access(&proxy, "for /slow", |l| l["path"] == "/slow").await;
    assert_eq!(line["status"], 499, "{line}");
    assert_eq!(line["service"], "app");
    poll_until(
        "the upstream request to be cancelled",
        Duration::from_secs(10),
        || std::future::ready(backend.slow_cancelled() > 0),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn websocket_echo_through_the_proxy() {
    let (_b, proxy) = serve(&[]).await;
    let url = format!("ws://127.0.0.1:{}/ws", proxy.http_port);
    let (mut ws, resp) = tokio_tungstenite::connect_async(url)
        .await
        .expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    use tokio_tungstenite::tungstenite::Message;
    for text in ["hello", "second message"] {
        ws.send(Message::text(text)).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("echo in time");
        assert_eq!(got.unwrap().unwrap(), Message::text(text));
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("echo in time");
    assert_eq!(got.unwrap().unwrap(), Message::binary(vec![0u8, 1, 2, 255]));
    ws.close(None).await.unwrap();
    drop(ws);
    let line = wait_access(&proxy, "for /ws", |l| l["path"] == "/ws").await;
    assert_eq!(line["status"], 101, "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_sent_events_arrive_while_the_stream_is_open() {
    let (b, proxy) = serve(&[]).await;
    // The second event comes 60 s after the first; the first must not wait for it.
    let resp = client()
        .get(proxy.url("/sse?n=2&interval_ms=60000"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream();
    let first = stream
        .next()
        .await
        .expect("first event before the upstream sent the second")
        .unwrap();
    assert_eq!(&first[..], b"data: event 0\n\n");
    assert_eq!(
        b.events_sent(),
        1,
        "the first event arrived before the second existed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http10_client_is_served() {
    let (_b, proxy) = serve(&[]).await;
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"GET /echo HTTP/1.0\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut all))
        .await
        .expect("HTTP/1.0 response ends with the connection")
        .unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(
        text.starts_with("HTTP/1.0 200 ") || text.starts_with("HTTP/1.1 200 "),
        "{text}"
    );
    assert!(
        !text
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{text}"
    );
    let body = text.split_once("\r\n\r\n").unwrap().1;
    let echo: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["headers"]["host"], "app.test");
    let line = wait_access(&proxy, "for /echo", |l| l["path"] == "/echo").await;
    assert_eq!(line["proto"], "HTTP/1.0");
}

/// An app that speaks HTTP/1.0: every answer is `HTTP/1.0 200` and the connection closes.
async fn http10_backend() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = stream
                    .write_all(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\nold ok")
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_http10_upstream_is_answered_in_our_own_version() {
    let (addr, task) = http10_backend().await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &addr.to_string(), &[]).await;
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let mut reader = tokio::io::BufReader::new(s);
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        raw::read_response(&mut reader, false),
    )
    .await
    .expect("response");
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(r.text(), "old ok");
    // Still HTTP/1.1 keep-alive: a second request on the same connection works.
    reader
        .get_mut()
        .write_all(b"GET /again HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        raw::read_response(&mut reader, false),
    )
    .await
    .expect("second response");
    assert_eq!(r.status_line, "HTTP/1.1 200 OK");
    assert_eq!(r.text(), "old ok");
    task.abort();
}

async fn scripted(answer: &'static [u8]) -> (Proxy, tokio::task::JoinHandle<()>) {
    let (addr, task) = raw::scripted_backend(answer).await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &addr.to_string(), &[]).await;
    (proxy, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_dying_mid_body_aborts_the_client_response() {
    // Declared 100 bytes, sent 10.
    let (proxy, task) = scripted(
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: text/plain\r\n\r\n0123456789",
    )
    .await;
    let resp = client().get(proxy.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.bytes().await.is_err(),
        "a truncated body must not look complete"
    );
    task.abort();

    // Chunked, without the last chunk: the client must not get a clean end of stream.
    let (proxy, task) =
        scripted(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n").await;
    let resp = client().get(proxy.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.bytes().await.is_err(),
        "a truncated chunked body must not look complete"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_switching_to_another_protocol_is_502() {
    let (proxy, task) = scripted(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: something-else\r\n\r\n",
    )
    .await;
    let r = raw::send(
        proxy.http_port,
        b"GET /ws HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 502, "{:?}", r);
    // A 101 to a request that asked for no upgrade at all is just as invalid.
    let r = raw::send(proxy.http_port, b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n").await;
    assert_eq!(r.status, 502, "{:?}", r);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn head_keeps_the_upstream_length_and_sends_no_body() {
    let (_b, proxy) = serve(&[]).await;
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"HEAD /bytes/100 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let mut reader = tokio::io::BufReader::new(s);
    let r = raw::read_response(&mut reader, true).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("100"));
    // The connection is still usable: no stray body bytes were sent.
    reader
        .get_mut()
        .write_all(b"GET /status/201 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        raw::read_response(&mut reader, false),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 201);
    assert_eq!(r.text(), "status 201");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expect_100_continue_is_honoured() {
    let (_b, proxy) = serve(&[]).await;
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        .await
        .unwrap();
    let mut reader = tokio::io::BufReader::new(s);
    let interim = tokio::time::timeout(
        Duration::from_secs(5),
        raw::read_response(&mut reader, false),
    )
    .await
    .expect("100 Continue before the body is sent");
    assert_eq!(interim.status, 100);
    reader.get_mut().write_all(b"hello").await.unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        raw::read_response(&mut reader, false),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn request_body_streams_to_the_app_before_it_is_complete() {
    let (backend, proxy) = serve(&[]).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::io::Error>(chunk), rx))
    });
    let send = tokio::spawn(
        client()
            .post(proxy.url("/echo"))
            .body(reqwest::Body::wrap_stream(stream))
            .send(),
    );
    tx.send(vec![1u8; 1000]).await.unwrap();
    poll_until(
        "the app to see the request while its body is open",
        Duration::from_secs(10),
        || std::future::ready(backend.hits() > 0),
    )
    .await;
    tx.send(vec![2u8; 1000]).await.unwrap();
    drop(tx);
    let echo: serde_json::Value = send.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(echo["body_len"], 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_length_responses_stream_as_they_come() {
    let (b, proxy) = serve(&[]).await;
    let resp = client()
        .get(proxy.url("/drip?n=2&interval_ms=60000"))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let first = stream
        .next()
        .await
        .expect("first chunk before the second was produced")
        .unwrap();
    assert_eq!(&first[..], b"data: event 0\n\n");
    assert_eq!(
        b.events_sent(),
        1,
        "the first event arrived before the second existed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_timeout_does_not_limit_the_body() {
    let (_b, proxy) = serve(&["--target-timeout=200ms"]).await;
    let resp = client()
        .get(proxy.url("/drip?n=3&interval_ms=300"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.text().await.unwrap(),
        "data: event 0\n\ndata: event 1\n\ndata: event 2\n\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http10_request_without_host_reaches_the_catch_all_service() {
    let (b, proxy) = serve(&[]).await;
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"GET /echo HTTP/1.0\r\n\r\n").await.unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut all))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&all);
    assert!(
        text.starts_with("HTTP/1.0 200 ") || text.starts_with("HTTP/1.1 200 "),
        "{text}"
    );
    let echo: serde_json::Value =
        serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(echo["headers"]["host"], b.target().as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_ip_header_replaces_x_forwarded_for() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--host=trusting.test",
                "--client-ip-header=CF-Connecting-IP",
            ],
        )
        .await;
    proxy
        .deploy(
            "strict",
            &backend.target(),
            &[
                "--host=strict.test",
                "--client-ip-header=CF-Connecting-IP",
                "--forward-headers=false",
            ],
        )
        .await;
    let r = raw::send(
        proxy.http_port,
        b"GET /echo?trusting HTTP/1.1\r\nHost: trusting.test\r\nX-Forwarded-For: 1.2.3.4\r\nCF-Connecting-IP: 9.9.9.9\r\n\r\n",
    )
    .await;
    let echo = r.json();
    assert_eq!(
        header(&echo, "x-forwarded-for"),
        Some("9.9.9.9, 127.0.0.1"),
        "{echo}"
    );
    assert_eq!(header(&echo, "cf-connecting-ip"), Some("9.9.9.9"));
    let line = wait_access(&proxy, "for ?trusting", |l| l["query"] == "trusting").await;
    assert_eq!(line["remote_addr"], "9.9.9.9");

    let r = raw::send(
        proxy.http_port,
        b"GET /echo?strict HTTP/1.1\r\nHost: strict.test\r\nX-Forwarded-For: 1.2.3.4\r\nCF-Connecting-IP: 9.9.9.9\r\n\r\n",
    )
    .await;
    let echo = r.json();
    assert_eq!(
        header(&echo, "x-forwarded-for"),
        Some("127.0.0.1"),
        "{echo}"
    );
    let line = wait_access(&proxy, "for ?strict", |l| l["query"] == "strict").await;
    assert_eq!(line["remote_addr"], "9.9.9.9");
}

/// `--target-timeout` waits for the response headers once the request is sent: a slow
/// upload is not cut short by it (Go's `ResponseHeaderTimeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn target_timeout_does_not_limit_a_slow_upload() {
    let (_b, proxy) = serve(&["--target-timeout=300ms"]).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::io::Error>(chunk), rx))
    });
    let send = tokio::spawn(
        client()
            .post(proxy.url("/echo"))
            .body(reqwest::Body::wrap_stream(stream))
            .send(),
    );
    for i in 0..4u8 {
        tx.send(vec![i; 1000]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(tx);
    let resp = send.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let echo: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(echo["body_len"], 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_websocket_upgrade_passes_the_apps_answer_through() {
    let (_b, proxy) = serve(&[]).await;
    // No Sec-WebSocket-Key: the app refuses with its own 400.
    let r = raw::send(
        proxy.http_port,
        b"GET /ws HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.text(), "not a websocket request");
}

/// Reads the next response on a kept-alive connection.
async fn next_response(
    reader: &mut tokio::io::BufReader<tokio::net::TcpStream>,
    head: bool,
) -> raw::RawResponse {
    tokio::time::timeout(Duration::from_secs(20), raw::read_response(reader, head))
        .await
        .expect("a response within 20 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (_b, proxy) = serve(&[]).await;
    let s = raw::connect(proxy.http_port).await;
    let mut reader = tokio::io::BufReader::new(s);
    // Three requests in one write, the last one split in the middle of its head.
    let all = b"GET /echo?n=1 HTTP/1.1\r\nHost: app.test\r\n\r\n\
                HEAD /echo?n=2 HTTP/1.1\r\nHost: app.test\r\n\r\n\
                GET /echo?n=3 HTTP/1.1\r\nHo";
    reader.get_mut().write_all(all).await.unwrap();
    let first = next_response(&mut reader, false).await;
    assert_eq!(first.json()["uri"], "/echo?n=1");
    let second = next_response(&mut reader, true).await;
    assert_eq!(second.status, 200);
    assert!(second.body.is_empty(), "a HEAD answer has no body");
    assert!(second.has_header("content-length"), "{:?}", second.headers);
    reader
        .get_mut()
        .write_all(b"st: app.test\r\n\r\n")
        .await
        .unwrap();
    let third = next_response(&mut reader, false).await;
    assert_eq!(third.json()["uri"], "/echo?n=3");
    let line = wait_access(&proxy, "for the third", |l| l["query"] == "n=3").await;
    assert_eq!(line["status"], 200);
}

/// A request with a body arriving on a connection that has carried plain GETs: the
/// connection changes hands (our server reads bodiless requests itself and leaves the
/// rest to hyper) without losing a byte, and serves what follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_after_plain_requests_on_one_connection_arrives_whole() {
    let (_b, proxy) = serve(&[]).await;
    let s = raw::connect(proxy.http_port).await;
    let mut reader = tokio::io::BufReader::new(s);
    reader
        .get_mut()
        .write_all(b"GET /echo?n=1 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        next_response(&mut reader, false).await.json()["method"],
        "GET"
    );
    let body = vec![b'x'; 100_000];
    let head = format!(
        "POST /echo HTTP/1.1\r\nHost: app.test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    // The head and the first bytes of the body in one write, then the rest, and a GET
    // pipelined right behind it.
    let mut first = head.into_bytes();
    first.extend_from_slice(&body[..10]);
    reader.get_mut().write_all(&first).await.unwrap();
    reader.get_mut().write_all(&body[10..]).await.unwrap();
    reader
        .get_mut()
        .write_all(b"GET /echo?n=3 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let posted = next_response(&mut reader, false).await.json();
    assert_eq!(posted["method"], "POST");
    assert_eq!(posted["body_len"], 100_000);
    assert_eq!(posted["body_fnv"], format!("{:016x}", fnv1a(&body)));
    let after = next_response(&mut reader, false).await.json();
    assert_eq!(after["uri"], "/echo?n=3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_asks_to_close_is_told_so_and_the_connection_closes() {
    let (_b, proxy) = serve(&[]).await;
    let s = raw::connect(proxy.http_port).await;
    let mut reader = tokio::io::BufReader::new(s);
    reader
        .get_mut()
        .write_all(b"GET /echo HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let r = next_response(&mut reader, false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(r.has_header("date"), "{:?}", r.headers);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), reader.read_to_end(&mut rest))
        .await
        .expect("the proxy closes the connection")
        .unwrap();
    assert!(rest.is_empty(), "nothing after the response: {rest:?}");
}
