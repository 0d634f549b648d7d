//! The request reader against the requests it must leave to hyper, and the response
//! writer byte for byte against hyper's own server connection: the same response, for
//! the same request, must come out the same (the `Date` value masked).

use super::request::{Parsed, parse};
use super::response::{self, Asked};
use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Response, StatusCode, Version};
use http_body_util::{BodyExt, Empty, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use std::convert::Infallible;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn parsed(raw: &str) -> (Parsed, BytesMut) {
    let mut buf = BytesMut::from(raw.as_bytes());
    let p = parse(&mut buf, 64 * 1024);
    (p, buf)
}

#[test]
fn a_plain_get_is_ours_and_leaves_what_follows() {
    let (p, rest) =
        parsed("GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\nX-Two: 1\r\nx-two: 2\r\n\r\nGET /next");
    let Parsed::Request {
        request,
        keep_alive,
    } = p
    else {
        panic!("not ours");
    };
    assert!(keep_alive);
    assert_eq!(request.method(), http::Method::GET);
    assert_eq!(request.uri(), "/a?b=1");
    assert_eq!(request.version(), Version::HTTP_11);
    assert_eq!(request.headers()["host"], "example.com");
    let two: Vec<_> = request.headers().get_all("x-two").iter().collect();
    assert_eq!(two, ["1", "2"]);
    assert_eq!(&rest[..], b"GET /next");
}

#[test]
fn keep_alive_follows_the_version_and_connection() {
    let ka = |raw: &str| match parsed(raw).0 {
        Parsed::Request { keep_alive, .. } => keep_alive,
        _ => panic!("not ours: {raw}"),
    };
    assert!(!ka("GET / HTTP/1.0\r\n\r\n"));
    assert!(ka("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
    assert!(!ka("GET / HTTP/1.1\r\nConnection: close\r\n\r\n"));
    assert!(!ka(
        "GET / HTTP/1.1\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n"
    ));
    assert!(ka("GET / HTTP/1.1\r\nConnection: x, keep-alive\r\n\r\n"));
}

#[test]
fn bodies_upgrades_and_the_unusual_go_to_hyper_untouched() {
    for raw in [
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        "PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n",
        "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
        "GET /\x7f HTTP/1.1\r\n\r\n",
    ] {
        let (p, rest) = parsed(raw);
        assert!(matches!(p, Parsed::Elsewhere), "ours: {raw:?}");
        assert_eq!(&rest[..], raw.as_bytes(), "buffer changed: {raw:?}");
    }
    let (p, _) = parsed("GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert!(matches!(p, Parsed::Request { .. }), "an empty body is ours");
}

#[test]
fn a_head_past_the_limit_goes_to_hyper_and_a_partial_one_waits() {
    let (p, _) = parsed("GET / HTTP/1.1\r\nHost: a\r\n");
    assert!(matches!(p, Parsed::Partial));
    let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(200));
    let mut buf = BytesMut::from(long.as_bytes());
    assert!(matches!(parse(&mut buf, 100), Parsed::Elsewhere));
    assert_eq!(buf.len(), long.len());
    let mut buf = BytesMut::from(&long.as_bytes()[..150]);
    assert!(matches!(parse(&mut buf, 100), Parsed::Elsewhere));
    let fields: String = (0..101).map(|i| format!("x-{i}: 1\r\n")).collect();
    let (p, _) = parsed(&format!("GET / HTTP/1.1\r\n{fields}\r\n"));
    assert!(
        matches!(p, Parsed::Elsewhere),
        "too many fields: hyper's 431"
    );
}

type TestBody = BoxBody<Bytes, Infallible>;
/// A request, the response to give it, and whether the connection stays open after.
type Case = (&'static str, fn() -> Response<TestBody>, bool);

fn full(s: &'static str) -> TestBody {
    Full::new(Bytes::from_static(s.as_bytes())).boxed()
}

fn empty() -> TestBody {
    Empty::new().boxed()
}

/// A body of unknown length, in two frames.
fn streamed() -> TestBody {
    let frames = futures_util::stream::iter([
        Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"hello "))),
        Ok(Frame::data(Bytes::from_static(b"world"))),
    ]);
    StreamBody::new(frames).boxed()
}

fn response(
    status: u16,
    headers: &[(&'static str, &'static str)],
    body: TestBody,
) -> Response<TestBody> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    for (n, v) in headers {
        r.headers_mut().append(*n, HeaderValue::from_static(v));
    }
    r
}

/// What hyper's server connection writes for `request`, answered with `make()`.
async fn hyper_writes(request: &str, make: fn() -> Response<TestBody>) -> Vec<u8> {
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let service =
        hyper::service::service_fn(move |_req| async move { Ok::<_, Infallible>(make()) });
    let serving = tokio::spawn(async move {
        let _ = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(hyper_util::rt::TokioIo::new(server), service)
            .await;
    });
    client.write_all(request.as_bytes()).await.unwrap();
    client.shutdown().await.unwrap();
    let mut out = Vec::new();
    client.read_to_end(&mut out).await.unwrap();
    serving.await.unwrap();
    out
}

/// What ours writes, and whether it would keep the connection.
async fn we_write(request: &str, make: fn() -> Response<TestBody>) -> (Vec<u8>, bool) {
    let Parsed::Request {
        request,
        keep_alive,
    } = parsed(request).0
    else {
        panic!("not ours");
    };
    let (mut client, mut server) = tokio::io::duplex(1 << 20);
    let again = response::write(
        &mut server,
        Box::new(make()),
        Asked::of(&request, keep_alive),
    )
    .await;
    drop(server);
    let mut out = Vec::new();
    client.read_to_end(&mut out).await.unwrap();
    (out, again)
}

fn masked_date(mut raw: Vec<u8>) -> String {
    let text = String::from_utf8_lossy(&raw).into_owned();
    if let Some(at) = text.find("\r\ndate: ") {
        let start = at + "\r\ndate: ".len();
        raw[start..start + 29].fill(b'D');
    }
    String::from_utf8(raw).unwrap()
}

#[tokio::test]
async fn responses_are_written_byte_for_byte_as_hyper_writes_them() {
    const GET11: &str = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    const GET10: &str = "GET / HTTP/1.0\r\nHost: a\r\n\r\n";
    const GET10_KA: &str = "GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n";
    const HEAD11: &str = "HEAD / HTTP/1.1\r\nHost: a\r\n\r\n";
    const CLOSE11: &str = "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    // (request, response, keeps the connection)
    let cases: &[Case] = &[
        (
            GET11,
            || response(200, &[("x-a", "1")], full("hello")),
            true,
        ),
        (
            GET11,
            || response(200, &[("content-length", "5"), ("x-a", "1")], full("hello")),
            true,
        ),
        (
            GET11,
            || response(404, &[("content-type", "text/plain")], empty()),
            true,
        ),
        (
            GET11,
            || {
                response(
                    200,
                    &[("set-cookie", "a=1"), ("set-cookie", "b=2")],
                    streamed(),
                )
            },
            true,
        ),
        (
            GET11,
            || response(204, &[("content-length", "0")], empty()),
            true,
        ),
        (
            GET11,
            || response(304, &[("etag", "\"x\"")], full("")),
            true,
        ),
        (
            GET11,
            || response(200, &[("connection", "close")], full("bye")),
            false,
        ),
        (
            GET11,
            || response(200, &[("date", "Sun, 06 Nov 1994 08:49:37 GMT")], full("x")),
            true,
        ),
        (GET11, || response(599, &[], full("odd")), true),
        (
            GET11,
            || response(200, &[("content-length", "11")], streamed()),
            true,
        ),
        (
            HEAD11,
            || response(200, &[("content-length", "5")], empty()),
            true,
        ),
        (HEAD11, || response(200, &[], streamed()), true),
        (GET10, || response(200, &[], full("hello")), false),
        (GET10, || response(200, &[], streamed()), false),
        (GET10_KA, || response(200, &[], full("hello")), true),
        (GET10_KA, || response(200, &[], streamed()), false),
        (CLOSE11, || response(200, &[], full("hello")), false),
    ];
    for (i, (request, make, keeps)) in cases.iter().enumerate() {
        let theirs = masked_date(hyper_writes(request, *make).await);
        let (ours, again) = we_write(request, *make).await;
        assert_eq!(masked_date(ours), theirs, "case {i}: {request:?}");
        assert_eq!(again, *keeps, "case {i}: keep-alive");
    }
}

#[tokio::test]
async fn a_custom_reason_phrase_is_kept() {
    let make = || {
        let mut r = response(200, &[], full("x"));
        r.extensions_mut()
            .insert(hyper::ext::ReasonPhrase::from_static(b"Fine Thanks"));
        r
    };
    let request = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let theirs = masked_date(hyper_writes(request, make).await);
    let (ours, _) = we_write(request, make).await;
    assert_eq!(masked_date(ours), theirs);
    assert!(theirs.starts_with("HTTP/1.1 200 Fine Thanks\r\n"));
}

#[tokio::test]
async fn a_large_body_goes_out_whole() {
    fn big() -> Response<TestBody> {
        response(
            200,
            &[],
            Full::new(Bytes::from(vec![b'z'; 100_000])).boxed(),
        )
    }
    fn big_streamed() -> Response<TestBody> {
        let frames = futures_util::stream::iter([
            Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'y'; 70_000]))),
            Ok(Frame::data(Bytes::from(vec![b'z'; 30_000]))),
        ]);
        response(200, &[], StreamBody::new(frames).boxed())
    }
    let request = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    for make in [big as fn() -> _, big_streamed] {
        let theirs = masked_date(hyper_writes(request, make).await);
        let (ours, again) = we_write(request, make).await;
        assert!(again);
        assert_eq!(masked_date(ours), theirs);
    }
}

/// Answers every request with `ok`.
#[derive(Clone)]
struct Ok200;

impl super::Respond for Ok200 {
    async fn respond<'a>(
        &'a self,
        _request: &'a mut http::Request<crate::proxy::body::RequestBody>,
        _conn: crate::service::Conn,
    ) -> crate::proxy::body::BoxedResponse {
        Box::new(Response::new(crate::proxy::body::ResponseBody::full("ok")))
    }
}

/// A connection served by ours on a real socket, and its client's end.
async fn served(
    drain: &crate::server::Drain,
) -> (tokio::net::TcpStream, tokio::task::JoinHandle<()>) {
    served_by(Ok200, drain).await
}

/// A connection served by ours on a real socket with `respond`, and its client's end.
async fn served_by(
    respond: impl super::Respond,
    drain: &crate::server::Drain,
) -> (tokio::net::TcpStream, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (stream, peer) = listener.accept().await.unwrap();
    let settings = std::sync::Arc::new(super::Settings {
        http1: hyper::server::conn::http1::Builder::new(),
        max_head: 64 * 1024,
        timeouts: crate::server::limits::Timeouts {
            read_header: None,
            read: None,
            write: None,
            idle: None,
        },
    });
    let conn = crate::service::Conn {
        client: peer,
        tls: false,
        watches_cuts: false,
    };
    let serving = tokio::spawn(super::serve(stream, conn, respond, settings, drain.clone()));
    (client, serving)
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n";

/// Reads the connection to its end: one `ok` answer that says `close`, then the close,
/// and the connection's task is over.
async fn last_answer(mut client: tokio::net::TcpStream, serving: tokio::task::JoinHandle<()>) {
    let mut out = Vec::new();
    client.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(out.contains("connection: close\r\n"), "{out}");
    assert!(out.ends_with("\r\n\r\nok"), "{out}");
    serving.await.unwrap();
}

#[tokio::test]
async fn a_drain_closes_an_idle_connection_and_serves_a_first_request_on_its_way() {
    // Served once, idle when the drain begins: closed at once.
    let drain = crate::server::Drain::default();
    let (mut client, serving) = served(&drain).await;
    client.write_all(GET).await.unwrap();
    let mut answer = vec![0; 1024];
    let n = client.read(&mut answer).await.unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200 OK\r\n"));
    drain.start();
    // A guard against a hang, not a measure of speed: the close comes at once.
    let closed = tokio::time::timeout(std::time::Duration::from_secs(30), serving).await;
    closed.expect("the connection closed").unwrap();
    assert_eq!(client.read(&mut answer).await.unwrap(), 0, "closed");

    // Accepted an instant before the drain, its request not sent yet: the request is
    // answered (saying `close`), then the connection closes.
    let drain = crate::server::Drain::default();
    let (mut client, serving) = served(&drain).await;
    drain.start();
    tokio::task::yield_now().await;
    client.write_all(GET).await.unwrap();
    last_answer(client, serving).await;
}

/// Says when a request has come (`started`), and answers it with `ok` once `open` is
/// notified.
#[derive(Clone, Default)]
struct Held {
    started: std::sync::Arc<tokio::sync::Notify>,
    open: std::sync::Arc<tokio::sync::Notify>,
}

impl super::Respond for Held {
    async fn respond<'a>(
        &'a self,
        _request: &'a mut http::Request<crate::proxy::body::RequestBody>,
        _conn: crate::service::Conn,
    ) -> crate::proxy::body::BoxedResponse {
        self.started.notify_one();
        self.open.notified().await;
        Box::new(Response::new(crate::proxy::body::ResponseBody::full("ok")))
    }
}

/// Reads from `client` until `answers` holds `count` whole `ok` answers.
async fn read_answers(client: &mut tokio::net::TcpStream, answers: &mut String, count: usize) {
    let mut buf = vec![0; 4096];
    while answers.matches("\r\n\r\nok").count() < count {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {answers}");
        answers.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
}

#[tokio::test]
async fn a_drain_during_a_request_lets_it_finish_saying_close_and_a_pipelined_one_waits_its_turn() {
    // A request in flight when the drain begins: its answer says `close`, and the
    // connection ends after it.
    let drain = crate::server::Drain::default();
    let held = Held::default();
    let (mut client, serving) = served_by(held.clone(), &drain).await;
    client.write_all(GET).await.unwrap();
    held.started.notified().await;
    drain.start();
    tokio::task::yield_now().await;
    held.open.notify_one();
    last_answer(client, serving).await;

    // Without a drain, a request sent while another is in flight waits beside it and is
    // answered after it, on the same connection.
    let drain = crate::server::Drain::default();
    let held = Held::default();
    let (mut client, serving) = served_by(held.clone(), &drain).await;
    client.write_all(GET).await.unwrap();
    held.started.notified().await;
    client.write_all(GET).await.unwrap();
    held.open.notify_one();
    let mut answers = String::new();
    read_answers(&mut client, &mut answers, 1).await;
    held.started.notified().await;
    held.open.notify_one();
    read_answers(&mut client, &mut answers, 2).await;
    assert_eq!(
        answers.matches("HTTP/1.1 200 OK\r\n").count(),
        2,
        "{answers}"
    );
    assert!(!answers.contains("connection: close"), "{answers}");
    // The client's close ends the idle connection.
    drop(client);
    serving.await.unwrap();
}
