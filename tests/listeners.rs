//! The listener flags of `run` (fork F2, F4, F27): the read-header, read, write, idle and
//! shutdown timeouts on the HTTP, HTTPS and metrics ports, the PROXY protocol (v1 and
//! v2, the client it names in the log, in `X-Forwarded-For` and at the gates, only from
//! allowed peers), and the metrics allow list. Each closed connection is seen closing
//! (EOF, a reset, a GOAWAY or a reset stream), never inferred from silence.

use std::time::Duration;
use testkit::backend::Backend;
use testkit::pebble::self_signed;
use testkit::{Proxy, RunOutcome, client, poll_until, raw, try_run};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A hang guard for exchanges that must end on their own (not a measurement).
const GUARD: Duration = Duration::from_secs(60);

/// `app.test` over HTTP and `secure.test` over HTTPS (a self-signed certificate, whose
/// PEM is returned), both to one backend.
async fn serve(run: &[&str], deploy: &[&str]) -> (Backend, Proxy, String) {
    serve_with(Proxy::start_with(run, &[]).await, deploy).await
}

async fn serve_with(proxy: Proxy, deploy: &[&str]) -> (Backend, Proxy, String) {
    let backend = Backend::start("app").await;
    let mut extra = vec!["--host=app.test"];
    extra.extend_from_slice(deploy);
    proxy.deploy("app", &backend.target(), &extra).await;
    let (cert, key, pem) = self_signed(proxy.dir.path(), "secure", &["secure.test"]);
    let cert = format!("--tls-certificate-path={}", cert.display());
    let key = format!("--tls-private-key-path={}", key.display());
    proxy
        .deploy(
            "secure",
            &backend.target(),
            &[
                "--host=secure.test",
                "--tls",
                "--tls-redirect=false",
                &cert,
                &key,
            ],
        )
        .await;
    (backend, proxy, pem)
}

/// Reads until the proxy closes the connection (EOF, a reset, or a TLS stream cut
/// without close_notify) and returns what came before.
async fn until_closed<S: AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(GUARD, s.read(&mut buf))
            .await
            .expect("the proxy closed the connection");
        match read {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                return got;
            }
            Err(e) => panic!("reading: {e}"),
        }
    }
}

/// Sends `head` and then a header line every 200 ms, for ever: a client that never
/// finishes its request head, yet is never silent. Returns the reading half.
fn trickle_head<S>(stream: S, head: &'static [u8]) -> tokio::io::ReadHalf<S>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, mut write) = tokio::io::split(stream);
    tokio::spawn(async move {
        if write.write_all(head).await.is_err() {
            return;
        }
        while write.write_all(b"X-Slow: still coming\r\n").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    read
}

async fn tls(proxy: &Proxy, pem: &str) -> tokio_rustls::client::TlsStream<TcpStream> {
    tls_over(raw::connect(proxy.https_port).await, pem).await
}

/// A TLS handshake for secure.test (HTTP/1.1) over `tcp`.
async fn tls_over(tcp: TcpStream, pem: &str) -> tokio_rustls::client::TlsStream<TcpStream> {
    testkit::tls::handshake(tcp, pem, "secure.test", &[b"http/1.1"]).await
}

/// A TLS handshake for secure.test over `tcp`, then one GET of `path` and its response.
async fn https_get(tcp: TcpStream, pem: &str, path: &str) -> raw::RawResponse {
    let mut tls = BufReader::new(tls_over(tcp, pem).await);
    let request = format!("GET {path} HTTP/1.1\r\nHost: secure.test\r\n\r\n");
    tls.get_mut().write_all(request.as_bytes()).await.unwrap();
    raw::read_response(&mut tls, false).await
}

/// The access line whose query is `query`.
async fn access_line(proxy: &Proxy, query: &str) -> serde_json::Value {
    let line = proxy
        .wait_for_log(&format!("the access line of ?{query}"), |l| {
            serde_json::from_str::<serde_json::Value>(l)
                .is_ok_and(|v| v["msg"] == "Request" && v["query"] == query)
        })
        .await;
    serde_json::from_str(&line).unwrap()
}

// === --read-header-timeout ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_request_head_is_cut_at_the_read_header_timeout_on_every_listener() {
    let proxy = Proxy::start_with_metrics(
        &["--debug", "--read-header-timeout=1s", "--idle-timeout=5m"],
        &[],
    )
    .await;
    let (backend, proxy, pem) = serve_with(proxy, &[]).await;
    let metrics_port = proxy.metrics_port.unwrap();

    let http = trickle_head(
        raw::connect(proxy.http_port).await,
        b"GET /slow-head HTTP/1.1\r\nHost: app.test\r\n",
    );
    let https = trickle_head(
        tls(&proxy, &pem).await,
        b"GET /slow-head HTTP/1.1\r\nHost: secure.test\r\n",
    );
    let metrics = trickle_head(
        raw::connect(metrics_port).await,
        b"GET /metrics HTTP/1.1\r\nHost: metrics\r\n",
    );
    // Meanwhile everyone else is served.
    assert_eq!(proxy.get("app.test", "/").await.status, 200);
    let r = client().get(proxy.metrics_url()).send().await.unwrap();
    assert_eq!(r.status(), 200);

    for (name, mut half) in [("HTTP", http), ("metrics", metrics)] {
        let got = until_closed(&mut half).await;
        assert!(
            got.is_empty(),
            "{name}: answered {:?}",
            String::from_utf8_lossy(&got)
        );
    }
    let mut https = https;
    let got = until_closed(&mut https).await;
    assert!(
        got.is_empty(),
        "HTTPS: answered {:?}",
        String::from_utf8_lossy(&got)
    );
    proxy
        .wait_for_log("the header timeout logged", |l| {
            l.contains("Closing connection") && l.contains("read header timeout")
        })
        .await;
    assert_eq!(backend.hits(), 1, "only the normal request reached the app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_read_timeout_also_bounds_the_head_when_the_header_timeout_is_off() {
    let (_b, proxy, _pem) = serve(
        &[
            "--read-header-timeout=0",
            "--read-timeout=1s",
            "--idle-timeout=5m",
        ],
        &[],
    )
    .await;
    let mut half = trickle_head(
        raw::connect(proxy.http_port).await,
        b"GET / HTTP/1.1\r\nHost: app.test\r\n",
    );
    assert!(until_closed(&mut half).await.is_empty());
}

/// The HTTPS listener defers `accept` until a connection's first bytes arrive (one
/// wake-up a connection instead of two): a client that connects and says nothing is
/// still accepted and cut at the handshake timeout (the shortest listener timeout), and
/// one that waits past the deferral before its ClientHello is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_tls_client_is_cut_at_the_handshake_timeout_and_a_late_one_served() {
    let (_b, proxy, _pem) = serve(&["--read-header-timeout=2s", "--idle-timeout=5m"], &[]).await;
    let mut silent = raw::connect(proxy.https_port).await;
    let got = until_closed(&mut silent).await;
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));

    let (_b2, proxy, pem) = serve(&[], &[]).await;
    let late = raw::connect(proxy.https_port).await;
    // Past the one-second deferral, so the kernel hands the connection over empty.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(https_get(late, &pem, "/late").await.status, 200);
}

// === --idle-timeout ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let (_b, proxy, pem) = serve(&["--idle-timeout=1s", "--read-header-timeout=5m"], &[]).await;
    // Opened first and left silent: waiting for a first request is the header
    // timeout's business, not the idle one's.
    let mut waiting = BufReader::new(raw::connect(proxy.http_port).await);

    let mut kept = BufReader::new(raw::connect(proxy.http_port).await);
    for _ in 0..2 {
        kept.get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(raw::read_response(&mut kept, false).await.status, 200);
    }
    let got = until_closed(&mut kept).await;
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));

    // The same over HTTPS (HTTP/1.1 by ALPN).
    let mut kept = BufReader::new(tls(&proxy, &pem).await);
    kept.get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: secure.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(raw::read_response(&mut kept, false).await.status, 200);
    assert!(until_closed(&mut kept).await.is_empty());

    // Outlived two idle timeouts and is still served.
    waiting
        .get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(raw::read_response(&mut waiting, false).await.status, 200);
}

// === --write-timeout ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_response_not_over_within_the_write_timeout_is_cut_off() {
    let (_b, proxy, pem) = serve(&["--write-timeout=1s"], &[]).await;
    // No answer in time: the connection closes with nothing written.
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"GET /slow?ms=5000 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let got = until_closed(&mut s).await;
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    proxy
        .wait_for_log("the write timeout logged", |l| {
            l.contains("Response not written within --write-timeout")
        })
        .await;

    // A stream that outlasts it is cut mid-body: the head came, the last chunk never.
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"GET /drip?n=50&interval_ms=100 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let got = String::from_utf8_lossy(&until_closed(&mut s).await).into_owned();
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(!got.ends_with("0\r\n\r\n"), "the stream was not cut: {got}");

    // A quick response is untouched.
    assert_eq!(proxy.get("app.test", "/").await.status, 200);

    // HTTP/2: the stream is reset, the connection goes on.
    let (send, _connection) = testkit::tls::h2(proxy.https_port, &pem, "secure.test").await;
    let mut send = send.ready().await.unwrap();
    let req = http::Request::get("https://secure.test/slow?ms=5000")
        .body(())
        .unwrap();
    let (response, _) = send.send_request(req, true).unwrap();
    let err = tokio::time::timeout(GUARD, response)
        .await
        .expect("an end to the slow stream")
        .expect_err("the slow stream is reset");
    assert_eq!(err.reason(), Some(h2::Reason::INTERNAL_ERROR), "{err:?}");
    let mut send = send.ready().await.unwrap();
    let req = http::Request::get("https://secure.test/").body(()).unwrap();
    let (response, _) = send.send_request(req, true).unwrap();
    let response = tokio::time::timeout(GUARD, response)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
}

// === --read-timeout ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_that_trickles_past_the_read_timeout_gets_408() {
    // The body never goes silent for --body-read-timeout; it just takes too long.
    let (_b, proxy, _pem) = serve(&["--read-timeout=1s", "--body-read-timeout=1m"], &[]).await;
    let s = raw::connect(proxy.http_port).await;
    let (read, mut write) = tokio::io::split(s);
    write
        .write_all(b"POST /echo HTTP/1.1\r\nHost: app.test\r\nContent-Length: 50\r\n\r\n")
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if write.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    let mut reader = BufReader::new(read);
    let r = tokio::time::timeout(GUARD, raw::read_response(&mut reader, false))
        .await
        .expect("an answer");
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"));
    // The 408 is the read timeout's: the body never paused for --body-read-timeout.
    trickle.abort();
    proxy
        .wait_for_log("the timeout logged", |l| {
            l.contains("Request body read timed out")
        })
        .await;

    // A body sent at once is forwarded.
    let r = raw::send(
        proxy.http_port,
        b"POST /echo HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], 5);
}

// === --shutdown-timeout ===

/// Starts `/slow?ms=6000` and waits until the app has it.
async fn in_flight(proxy: &Proxy, backend: &Backend) -> TcpStream {
    let mut s = raw::connect(proxy.http_port).await;
    s.write_all(b"GET /slow?ms=6000 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    poll_until("the app to have the request", GUARD, || async {
        backend.hits() == 1
    })
    .await;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_shutdown_timeout_bounds_what_a_stop_waits_for() {
    // SIGTERM: after 1 s the request still at the app is cut, where the default 10 s
    // would have let its answer (at 6 s) through.
    let (backend, mut proxy, _pem) = serve(&["--shutdown-timeout=1s"], &[]).await;
    let mut s = in_flight(&proxy, &backend).await;
    assert_eq!(proxy.terminate().await, Some(0));
    assert!(until_closed(&mut s).await.is_empty());
    proxy
        .wait_for_log("the grace running out", |l| {
            l.contains("Closing active connections")
        })
        .await;

    // `drain` without --drain-timeout takes the shutdown timeout too.
    let (backend, proxy, _pem) = serve(&["--shutdown-timeout=1s"], &[]).await;
    let mut s = in_flight(&proxy, &backend).await;
    proxy.ok(&["drain"]).await;
    assert!(until_closed(&mut s).await.is_empty());

    // `drain --drain-timeout` still picks its own.
    let (backend, proxy, _pem) = serve(&["--shutdown-timeout=1s"], &[]).await;
    let s = in_flight(&proxy, &backend).await;
    let drain = proxy.spawn_cli(&["drain", "--drain-timeout=30s"]);
    let r = tokio::time::timeout(GUARD, raw::read_response(&mut BufReader::new(s), false))
        .await
        .expect("the answer");
    assert_eq!(r.status, 200);
    assert!(drain.await.unwrap().status.success());
}

// === PROXY protocol ===

const V1_CLIENT: &[u8] = b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 80\r\n";

/// A v2 header naming `[2001:db8::5]:4444`, with a TLV after the addresses.
fn v2_client() -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x21); // version 2, PROXY
    h.push(0x21); // IPv6, STREAM
    let mut block = "2001:db8::5"
        .parse::<std::net::Ipv6Addr>()
        .unwrap()
        .octets()
        .to_vec();
    block.extend_from_slice(
        &"2001:db8::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    block.extend_from_slice(&4444u16.to_be_bytes());
    block.extend_from_slice(&443u16.to_be_bytes());
    block.extend_from_slice(&[0x04, 0x00, 0x03, b'a', b'b', b'c']); // a NOOP TLV
    h.extend_from_slice(&u16::try_from(block.len()).unwrap().to_be_bytes());
    h.extend_from_slice(&block);
    h
}

/// `preamble` then `request` on one connection, in one write (as a balancer does).
async fn send_with(proxy: &Proxy, preamble: &[u8], request: &[u8]) -> raw::RawResponse {
    raw::send(proxy.http_port, &[preamble, request].concat()).await
}

fn get(query: &str) -> Vec<u8> {
    format!("GET /echo?{query} HTTP/1.1\r\nHost: app.test\r\n\r\n").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proxy_protocol_names_the_client_in_the_log_the_forwarded_header_and_the_gates() {
    let (_b, proxy, pem) = serve(
        &[
            "--proxy-protocol",
            "--proxy-protocol-allow-ip=127.0.0.1,::1",
        ],
        &["--allow-ip=203.0.113.0/24,2001:db8::/32"],
    )
    .await;

    let r = send_with(&proxy, V1_CLIENT, &get("v1")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-forwarded-for"], "203.0.113.7");
    let line = access_line(&proxy, "v1").await;
    assert_eq!(line["client_addr"], "203.0.113.7");
    assert_eq!(line["client_port"], "5555");

    let r = send_with(&proxy, &v2_client(), &get("v2")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-forwarded-for"], "2001:db8::5");
    let line = access_line(&proxy, "v2").await;
    assert_eq!(line["client_addr"], "2001:db8::5");
    assert_eq!(line["client_port"], "4444");

    // The allow list judges the named client: outside it, 403; without a header the
    // connection keeps its own address (127.0.0.1), outside it too.
    let outside = b"PROXY TCP4 198.51.100.1 10.0.0.1 5555 80\r\n";
    assert_eq!(
        send_with(&proxy, outside, &get("outside")).await.status,
        403
    );
    assert_eq!(send_with(&proxy, b"", &get("none")).await.status, 403);
    assert_eq!(
        access_line(&proxy, "none").await["client_addr"],
        "127.0.0.1"
    );

    // Over HTTPS the header comes before the ClientHello.
    let mut tcp = raw::connect(proxy.https_port).await;
    tcp.write_all(V1_CLIENT).await.unwrap();
    let r = https_get(tcp, &pem, "/echo?tls").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-forwarded-for"], "203.0.113.7");
    assert_eq!(
        access_line(&proxy, "tls").await["client_addr"],
        "203.0.113.7"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_rate_limit_counts_the_client_the_proxy_protocol_names() {
    let (_b, proxy, _pem) = serve(&["--proxy-protocol"], &["--rate-limit=0.001"]).await;
    let a = b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 80\r\n";
    let b = b"PROXY TCP4 203.0.113.8 10.0.0.1 5555 80\r\n";
    assert_eq!(send_with(&proxy, a, &get("a1")).await.status, 200);
    assert_eq!(send_with(&proxy, a, &get("a2")).await.status, 429);
    assert_eq!(send_with(&proxy, b, &get("b1")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_header_from_a_peer_outside_the_allow_list_is_not_honoured() {
    let (backend, proxy, _pem) = serve(
        &[
            "--debug",
            "--proxy-protocol",
            "--proxy-protocol-allow-ip=10.9.9.9",
        ],
        &[],
    )
    .await;
    // Read and set aside: the connection is served as the peer it really is.
    let r = send_with(&proxy, V1_CLIENT, &get("spoofed")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(
        access_line(&proxy, "spoofed").await["client_addr"],
        "127.0.0.1"
    );
    proxy
        .wait_for_log("the header set aside", |l| {
            l.contains("Ignoring the PROXY protocol header")
        })
        .await;
    // So a claimed address buys nothing at the gates.
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--host=app.test", "--allow-ip=203.0.113.0/24"],
        )
        .await;
    assert_eq!(
        send_with(&proxy, V1_CLIENT, &get("gated")).await.status,
        403
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_proxy_header_closes_the_connection_before_anything_is_forwarded() {
    let (backend, proxy, _pem) = serve(&["--debug", "--proxy-protocol"], &[]).await;
    let mut bad_v2 = v2_client();
    bad_v2[12] = 0x31; // version 3
    for bad in [
        &b"PROXY TCP4 300.0.113.7 10.0.0.1 5555 80\r\n"[..],
        b"PROXY TCP4 203.0.113.7 10.0.0.1 5555\r\n",
        &bad_v2,
    ] {
        let skip = proxy.logs().len();
        let mut s = raw::connect(proxy.http_port).await;
        s.write_all(&[bad, &get("bad")[..]].concat()).await.unwrap();
        let got = until_closed(&mut s).await;
        assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
        proxy
            .wait_for_log_after(skip, "the refusal", |l| {
                l.contains("Invalid PROXY protocol header")
            })
            .await;
    }
    assert_eq!(backend.hits(), 0);
    // Connections without a header are still served.
    assert_eq!(send_with(&proxy, b"", &get("plain")).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_header_that_trickles_is_cut_at_the_read_header_timeout() {
    let (_b, proxy, _pem) = serve(
        &["--debug", "--proxy-protocol", "--read-header-timeout=1s"],
        &[],
    )
    .await;
    let s = raw::connect(proxy.http_port).await;
    let (mut read, mut write) = tokio::io::split(s);
    tokio::spawn(async move {
        for b in V1_CLIENT {
            if write.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    assert!(until_closed(&mut read).await.is_empty());
    proxy
        .wait_for_log("the timeout logged", |l| {
            l.contains("PROXY protocol header timed out")
        })
        .await;
}

// === --metrics-allow-ip ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_are_refused_outside_the_allow_list() {
    let proxy = Proxy::start_with_metrics(&["--metrics-allow-ip=10.0.0.0/8,fd00::/8"], &[]).await;
    let r = client().get(proxy.metrics_url()).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(
        r.headers()["content-type"].to_str().unwrap(),
        "text/plain; charset=utf-8"
    );
    assert_eq!(r.text().await.unwrap(), "Forbidden\n");

    let proxy = Proxy::start_with_metrics(&["--metrics-allow-ip=10.0.0.0/8,127.0.0.1"], &[]).await;
    let r = client().get(proxy.metrics_url()).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("process_resident_memory_bytes")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_address_list_fails_the_boot_even_with_its_feature_off() {
    for (flag, error) in [
        (
            "--metrics-allow-ip=10.0.0.0/8,not-an-ip",
            "Error: metrics-allow-ip: \"not-an-ip\" is not a valid address",
        ),
        (
            "--proxy-protocol-allow-ip=10.0.0.0/33",
            "Error: proxy-protocol-allow-ip: \"10.0.0.0/33\" is not a valid CIDR range",
        ),
    ] {
        match try_run(&["--http-port=0", "--https-port=0", flag], &[]).await {
            RunOutcome::Exited { code, stderr } => {
                assert_eq!(code, Some(1), "{flag}");
                assert_eq!(stderr.trim(), error, "{flag}");
            }
            other => panic!("{flag}: {other:?}"),
        }
    }
}

// === ACME HTTP-01 answers ===

/// autocert's answer to a challenge path with no pending token: before routing and before
/// the redirect to HTTPS that `--tls` sets (ARCHITECTURE.md's step 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_challenge_token_gets_autocert_s_404_before_any_redirect() {
    let proxy = Proxy::start().await;
    let backend = Backend::start("app").await;
    proxy
        .deploy("app", &backend.target(), &["--host=acme.test", "--tls"])
        .await;
    let path = "/.well-known/acme-challenge/no-such-token";
    let r = proxy.get("acme.test", path).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), "text/plain; charset=utf-8");
    assert_eq!(r.body, "acme/autocert: certificate cache miss\n");
    assert_eq!(backend.hits(), 0);
    // Any other path of the host is redirected.
    assert_eq!(proxy.get("acme.test", "/").await.status, 301);
}

// === The fork's command line ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fork_s_run_line_is_accepted_and_help_documents_every_flag() {
    // As the fork's Kamal writes them (`--flag="value"` reaches us without the quotes).
    let (_b, proxy, _pem) = serve(
        &[
            "--read-header-timeout=30s",
            "--read-timeout=0s",
            "--write-timeout=0s",
            "--idle-timeout=60s",
            "--shutdown-timeout=10s",
            "--proxy-protocol",
            "--proxy-protocol-allow-ip=127.0.0.1",
            "--metrics-allow-ip=10.0.0.0/8",
        ],
        &[],
    )
    .await;
    assert_eq!(send_with(&proxy, V1_CLIENT, &get("fork")).await.status, 200);
    assert_eq!(
        access_line(&proxy, "fork").await["client_addr"],
        "203.0.113.7"
    );

    let help = proxy.ok(&["run", "--help"]).await;
    for (flag, default) in [
        ("--read-header-timeout", "[default: 30s]"),
        ("--read-timeout", "[default: 0s]"),
        ("--write-timeout", "[default: 0s]"),
        ("--idle-timeout", "[default: 1m0s]"),
        ("--shutdown-timeout", "[default: 10s]"),
        ("--proxy-protocol", "[default: false]"),
        ("--proxy-protocol-allow-ip", "[default: every peer]"),
        (
            "--metrics-allow-ip",
            "[default: everyone who reaches the port]",
        ),
    ] {
        assert_help_default(&help, flag, default);
    }

    // An environment value is a default (as the fork, `KAMAL_PROXY_<NAME>` then `<NAME>`);
    // one that does not parse is ignored.
    let out = std::process::Command::new(testkit::bin())
        .args(["run", "--help"])
        .env("READ_HEADER_TIMEOUT", "5s")
        .env("KAMAL_PROXY_SHUTDOWN_TIMEOUT", "1m30s")
        .env("IDLE_TIMEOUT", "abc")
        .env("PROXY_PROTOCOL", "true")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert_help_default(&help, "--read-header-timeout", "[default: 5s]");
    assert_help_default(&help, "--shutdown-timeout", "[default: 1m30s]");
    assert_help_default(&help, "--idle-timeout", "[default: 1m0s]");
    assert_help_default(&help, "--proxy-protocol", "[default: true]");
}

/// The help entry of `flag` (up to the next flag) shows `default`.
fn assert_help_default(help: &str, flag: &str, default: &str) {
    let at = help
        .find(&format!("{flag} "))
        .or_else(|| help.find(&format!("{flag}[")))
        .unwrap_or_else(|| panic!("{flag} missing from run --help:\n{help}"));
    let next = help[at + 2..]
        .find("\n  -")
        .map_or(help.len(), |n| at + 2 + n);
    assert!(
        help[at..next].contains(default),
        "{flag} shows {default}:\n{}",
        &help[at..next]
    );
}
