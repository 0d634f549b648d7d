//! Our connection against a real socket whose far end answers with scripted bytes.

use super::body::{Http1Body, Lease, response};
use super::*;
use http_body_util::BodyExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

/// A request without the proxy's own fields (those have their tests in `proxy_fields`).
static NO_FIELDS: std::sync::LazyLock<ProxyFields<'static>> =
    std::sync::LazyLock::new(ProxyFields::default);

/// A connection to a listener whose accepted end is returned with it.
async fn pair() -> (Connection, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (near, far) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (Connection::new(near.unwrap()), far.unwrap().0)
}

/// Reads one request head off the far end.
async fn read_head(far: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(
            far.read(&mut byte).await.unwrap(),
            1,
            "request head cut short"
        );
        got.push(byte[0]);
    }
    String::from_utf8(got).unwrap()
}

struct TestLease {
    conn: Connection,
    released: Arc<AtomicBool>,
}

impl Lease for TestLease {
    fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    fn release(self: Box<Self>) {
        self.released.store(true, Ordering::SeqCst);
    }
}

fn lease(conn: Connection) -> (Box<TestLease>, Arc<AtomicBool>) {
    let released = Arc::new(AtomicBool::new(false));
    let lease = TestLease {
        conn,
        released: released.clone(),
    };
    (Box::new(lease), released)
}

fn get_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(header::HOST, HeaderValue::from_static("app.example"));
    h.append("x-many", HeaderValue::from_static("one"));
    h.append("x-many", HeaderValue::from_static("two"));
    h
}

/// Sends a GET (or `method`) over a new connection whose far end answers `answer` (and
/// closes, with `close_after`), and returns the response, whether the connection went
/// back, the request head sent and the far end (kept open while the caller holds it).
async fn exchange(
    method: Method,
    answer: &'static [u8],
    close_after: bool,
) -> (
    http::Response<Http1Body>,
    Arc<AtomicBool>,
    String,
    Option<TcpStream>,
) {
    let (mut conn, mut far) = pair().await;
    let server = tokio::spawn(async move {
        let head = read_head(&mut far).await;
        far.write_all(answer).await.unwrap();
        (head, (!close_after).then_some(far))
    });
    let head = match conn
        .send(&method, "/p?q=1", &get_headers(), &NO_FIELDS, None)
        .await
    {
        Ok(head) => head,
        Err(e) => panic!("exchange failed: {e:?}"),
    };
    let (lease, released) = lease(conn);
    let response = response(head, lease);
    let (sent, far) = server.await.unwrap();
    (response, released, sent, far)
}

async fn body_of(
    response: http::Response<Http1Body>,
) -> Result<(Bytes, Option<HeaderMap>), BoxError> {
    let collected = response.into_body().collect().await?;
    let trailers = collected.trailers().cloned();
    Ok((collected.to_bytes(), trailers))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::test]
async fn writes_the_head_as_hyper_does_and_hands_back_a_connection_whose_body_came_with_its_head() {
    let (response, released, head, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nX-App: a\r\n\r\nhello\n",
        false,
    )
    .await;
    assert_eq!(
        head,
        "GET /p?q=1 HTTP/1.1\r\nhost: app.example\r\nx-many: one\r\nx-many: two\r\n\r\n"
    );
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), Version::HTTP_11);
    assert_eq!(response.headers()["x-app"], "a");
    assert!(
        released.load(Ordering::SeqCst),
        "the body was in: back before it is read"
    );
    assert_eq!(body_of(response).await.unwrap().0, "hello\n");
}

#[tokio::test]
async fn a_body_that_comes_later_is_read_by_the_body_and_then_the_connection_goes_back() {
    let (mut conn, mut far) = pair().await;
    let server = tokio::spawn(async move {
        read_head(&mut far).await;
        far.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n01234")
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        far.write_all(b"56789").await.unwrap();
        far
    });
    let head = conn
        .send(&Method::GET, "/", &get_headers(), &NO_FIELDS, None)
        .await
        .map_err(|e| format!("{e:?}"))
        .unwrap();
    let (lease, released) = lease(conn);
    let response = response(head, lease);
    assert!(
        !released.load(Ordering::SeqCst),
        "half the body still to come"
    );
    assert_eq!(body_of(response).await.unwrap().0, "0123456789");
    assert!(released.load(Ordering::SeqCst));
    drop(server.await.unwrap());
}

#[tokio::test]
async fn a_chunked_body_with_trailers_is_decoded_and_the_connection_goes_back() {
    let (response, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nx-sum: 42\r\n\r\n",
        false,
    )
    .await;
    let (body, trailers) = body_of(response).await.unwrap();
    assert_eq!(body, "hello world");
    assert_eq!(trailers.unwrap()["x-sum"], "42");
    assert!(released.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_body_without_length_runs_to_the_close_and_the_connection_is_not_reused() {
    let (response, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it",
        true,
    )
    .await;
    assert_eq!(body_of(response).await.unwrap().0, "all of it");
    assert!(!released.load(Ordering::SeqCst));
}

#[tokio::test]
async fn head_requests_and_bodiless_statuses_have_no_body_whatever_the_length_says() {
    let (response, released, head, _far) = exchange(
        Method::HEAD,
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
        false,
    )
    .await;
    assert!(head.starts_with("HEAD /p?q=1 HTTP/1.1\r\n"));
    assert_eq!(response.headers()["content-length"], "1000");
    assert!(released.load(Ordering::SeqCst));
    assert!(body_of(response).await.unwrap().0.is_empty());
    let (response, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
    assert!(released.load(Ordering::SeqCst));
}

#[tokio::test]
async fn informational_answers_are_skipped_and_a_custom_reason_is_kept() {
    let (response, _, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 404 Nothing Here\r\nContent-Length: 0\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(!response.headers().contains_key("link"));
    let reason = response.extensions().get::<hyper::ext::ReasonPhrase>();
    assert_eq!(reason.map(|r| r.as_bytes()), Some(&b"Nothing Here"[..]));
}

#[tokio::test]
async fn a_connection_the_app_asks_to_close_or_that_sent_too_much_is_not_reused() {
    let (_, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        false,
    )
    .await;
    assert!(!released.load(Ordering::SeqCst), "Connection: close");
    let (_, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        false,
    )
    .await;
    assert!(
        !released.load(Ordering::SeqCst),
        "HTTP/1.0 without keep-alive"
    );
    let (_, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
        false,
    )
    .await;
    assert!(released.load(Ordering::SeqCst), "HTTP/1.0 with keep-alive");
    let (_, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n",
        false,
    )
    .await;
    assert!(!released.load(Ordering::SeqCst), "bytes past the answer");
}

async fn failure(answer: &'static [u8]) -> String {
    let (mut conn, mut far) = pair().await;
    tokio::spawn(async move {
        read_head(&mut far).await;
        far.write_all(answer).await.unwrap();
    });
    match conn
        .send(&Method::GET, "/", &get_headers(), &NO_FIELDS, None)
        .await
    {
        Err(SendError::Failed(e)) => e.to_string(),
        Err(SendError::Unsent(e)) => panic!("unsent: {e}"),
        Err(SendError::TimedOut) => panic!("timed out without a limit"),
        Ok(_) => panic!("{answer:?} was accepted"),
    }
}

#[tokio::test]
async fn malformed_answers_fail_with_hypers_wording() {
    assert_eq!(
        failure(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n").await,
        "invalid content-length in response"
    );
    assert_eq!(
        failure(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n").await,
        "invalid content-length in response"
    );
    assert_eq!(
        failure(b"HTTP/1.1 2000 OK\r\n\r\n").await,
        "invalid HTTP response head"
    );
    assert_eq!(
        failure(b"nonsense\r\n\r\n").await,
        "invalid HTTP response head"
    );
    assert_eq!(
        failure(b"HTTP/1.1 200 OK\r\nContent-Le").await,
        "connection closed before message completed"
    );
}

#[tokio::test]
async fn a_body_cut_short_is_an_error() {
    let (response, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
        true,
    )
    .await;
    let err = body_of(response).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "connection closed before message completed"
    );
    assert!(!released.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_reused_connection_the_app_closed_is_seen_closed_and_its_failure_is_marked_for_a_resend()
{
    let (mut conn, mut far) = pair().await;
    read_and_answer(&mut conn, &mut far).await;
    assert!(!conn.is_closed(), "open and quiet");
    drop(far);
    // The close reaches the runtime's reactor when it next looks (a hang guard of 10 s).
    let mut waited = 0;
    while !conn.is_closed() {
        assert!(waited < 2000, "the close was never seen");
        waited += 1;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Sent anyway (the close raced the pick): either nothing could be written (the pool
    // sends it again as it is), or the failure says the reused connection died before any
    // answer, which is what the re-send rule looks for.
    match conn
        .send(&Method::GET, "/", &get_headers(), &NO_FIELDS, None)
        .await
    {
        Err(SendError::Unsent(_)) => {}
        Err(SendError::TimedOut) => panic!("timed out without a limit"),
        Err(SendError::Failed(e)) => {
            let boxed: BoxError = Box::new(e);
            assert!(
                super::super::retry::resend_after(&*boxed, &Method::GET, false, true),
                "{boxed:?}"
            );
        }
        Ok(_) => panic!("answered on a closed connection"),
    }
}

/// Reads a request head off the far end and answers it at once.
async fn answer_at_once(far: &mut TcpStream) {
    read_head(far).await;
    far.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
        .await
        .unwrap();
}

/// One exchange, so the connection counts as reused.
async fn read_and_answer(conn: &mut Connection, far: &mut TcpStream) {
    let headers = get_headers();
    let (sent, ()) = tokio::join!(
        conn.send(&Method::GET, "/", &headers, &NO_FIELDS, None),
        answer_at_once(far)
    );
    assert!(sent.is_ok());
}

#[tokio::test]
async fn a_new_connection_that_dies_before_answering_is_not_marked_for_a_resend() {
    let (mut conn, mut far) = pair().await;
    tokio::spawn(async move {
        read_head(&mut far).await;
        drop(far);
    });
    let err = match conn
        .send(&Method::GET, "/", &get_headers(), &NO_FIELDS, None)
        .await
    {
        Err(SendError::Failed(e)) => e,
        Err(SendError::Unsent(e)) => panic!("unsent: {e}"),
        Err(SendError::TimedOut) => panic!("timed out without a limit"),
        Ok(_) => panic!("answered"),
    };
    assert_eq!(
        err.to_string(),
        "connection closed before message completed"
    );
    let boxed: BoxError = Box::new(err);
    assert!(!super::super::retry::resend_allowed(
        &*boxed,
        &http::Request::new(())
    ));
}

#[tokio::test]
async fn a_reused_connection_whose_answer_began_is_not_marked_for_a_resend() {
    let (mut conn, mut far) = pair().await;
    read_and_answer(&mut conn, &mut far).await;
    tokio::spawn(async move {
        read_head(&mut far).await;
        // An informational answer counts as an answer begun.
        far.write_all(b"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 200")
            .await
            .unwrap();
        drop(far);
    });
    let err = match conn
        .send(&Method::GET, "/", &get_headers(), &NO_FIELDS, None)
        .await
    {
        Err(SendError::Failed(e)) => e,
        Err(SendError::Unsent(e)) => panic!("unsent: {e}"),
        Err(SendError::TimedOut) => panic!("timed out without a limit"),
        Ok(_) => panic!("answered"),
    };
    let boxed: BoxError = Box::new(err);
    assert!(!super::super::retry::resend_allowed(
        &*boxed,
        &http::Request::new(())
    ));
}

/// `--target-timeout` on our connection: one timer for the connection's life. A late answer
/// times out; an answer in time is taken, also after the timer fired while the
/// connection idled, and under a shorter limit than the last exchange's.
#[tokio::test]
async fn the_connection_s_one_timer_times_each_answer_from_its_own_request() {
    use std::time::Duration;
    let (mut conn, mut far) = pair().await;
    let limit = Some(Duration::from_millis(200));
    let headers = get_headers();
    let (sent, ()) = tokio::join!(
        conn.send(&Method::GET, "/", &headers, &NO_FIELDS, limit),
        answer_at_once(&mut far)
    );
    assert!(sent.is_ok(), "answered at once");
    // The first exchange's deadline passes while the connection idles: the timer fires.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (sent, ()) = tokio::join!(
        conn.send(&Method::GET, "/", &headers, &NO_FIELDS, limit),
        answer_at_once(&mut far)
    );
    assert!(
        sent.is_ok(),
        "a timer that fired while idle does not end the next exchange"
    );
    // No answer: the request is written, then the (shorter) limit passes.
    let (sent, head) = tokio::join!(
        conn.send(
            &Method::GET,
            "/late",
            &headers,
            &NO_FIELDS,
            Some(Duration::from_millis(50))
        ),
        read_head(&mut far)
    );
    assert!(head.starts_with("GET /late HTTP/1.1\r\n"), "{head}");
    assert!(matches!(sent, Err(SendError::TimedOut)), "timed out");
}

/// The head our connection writes carries the same fields as the map hyper's connection
/// gets once the proxy's fields are applied to it: the client's of those names replaced.
#[tokio::test]
async fn the_proxy_s_fields_replace_the_client_s_in_the_written_head() {
    use crate::proxy::proxy_fields::ForwardedFor;
    let mut client = get_headers();
    for (name, value) in [
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-proto", "http"),
        ("forwarded", "for=6.6.6.6"),
        ("x-kamal-target", "elsewhere:1"),
    ] {
        client.append(name, HeaderValue::from_static(value));
    }
    let (id, start) = (
        HeaderValue::from_static("id-1"),
        HeaderValue::from_static("t=5"),
    );
    for trust_client in [false, true] {
        let f = ForwardedFor {
            client_ip: &HeaderValue::from_static("10.0.0.1"),
            host: Some(&HeaderValue::from_static("app.example")),
            tls: true,
            trust_client,
            arrival: (Some(&id), Some(&start)),
        };
        let target = HeaderValue::from_static("web:3000");
        let fields = ProxyFields::new(
            &client,
            crate::proxy::headers::Present::of(&client),
            &f,
            &target,
        );
        let (mut conn, mut far) = pair().await;
        let (sent, head) = tokio::join!(
            conn.send(&Method::GET, "/", &client, &fields, None),
            async {
                let head = read_head(&mut far).await;
                far.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                    .await
                    .unwrap();
                head
            }
        );
        assert!(sent.is_ok());
        let mut written: Vec<&str> = head.trim_end().split("\r\n").skip(1).collect();
        let mut applied = client.clone();
        fields.apply(&mut applied);
        let applied: Vec<String> = applied
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect();
        let mut applied: Vec<&str> = applied.iter().map(String::as_str).collect();
        written.sort_unstable();
        applied.sort_unstable();
        assert_eq!(written, applied, "trusted: {trust_client}");
        let expected_for = if trust_client {
            "x-forwarded-for: 6.6.6.6, 10.0.0.1"
        } else {
            "x-forwarded-for: 10.0.0.1"
        };
        assert!(written.contains(&expected_for), "{written:?}");
        assert!(!written.iter().any(|l| l.starts_with("forwarded:")));
        assert!(written.contains(&"x-request-id: id-1"), "{written:?}");
        assert!(written.contains(&"x-request-start: t=5"), "{written:?}");
    }
}

/// A `Connection` field is read for the connection's sake and left out of the response,
/// unless it names another field: then it stays, for the proxy to remove both.
#[tokio::test]
async fn the_response_s_connection_field_stays_only_when_it_names_another_field() {
    let (response, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nX-App: 1\r\nContent-Length: 2\r\n\r\nok",
        false,
    )
    .await;
    assert!(released.load(Ordering::SeqCst), "kept alive");
    assert!(!response.headers().contains_key(header::CONNECTION));
    assert_eq!(response.headers()["x-app"], "1");
    let (response, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nConnection: close, X-App\r\nX-App: 1\r\nContent-Length: 2\r\n\r\nok",
        false,
    )
    .await;
    assert!(!released.load(Ordering::SeqCst), "Connection: close");
    assert_eq!(response.headers()[header::CONNECTION], "close, X-App");
    // `close` names a field too (as in Go's proxy): the line stays for the proxy to
    // remove a field called `Close` with it.
    let (response, _, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nClose: 1\r\nContent-Length: 2\r\n\r\nok",
        false,
    )
    .await;
    assert_eq!(response.headers()[header::CONNECTION], "close");
}

/// With nginx's order of fields (`Connection` last, read and dropped) and with the body's
/// framing in the last field, every field and the body come through as sent.
#[tokio::test]
async fn every_field_comes_through_whichever_is_last() {
    let (response, released, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/plain\r\nContent-Length: 6\r\nConnection: keep-alive\r\n\r\nhello\n",
        false,
    )
    .await;
    assert!(released.load(Ordering::SeqCst), "kept alive");
    let h = response.headers();
    assert_eq!(h["server"], "nginx");
    assert_eq!(h["content-type"], "text/plain");
    assert_eq!(h[header::CONTENT_LENGTH], "6");
    assert!(!h.contains_key(header::CONNECTION));
    assert_eq!(body_of(response).await.unwrap().0, "hello\n");

    let (response, _, _, _far) = exchange(
        Method::GET,
        b"HTTP/1.1 200 OK\r\nX-App: 1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        false,
    )
    .await;
    assert_eq!(response.headers()["x-app"], "1");
    assert_eq!(response.headers()[header::TRANSFER_ENCODING], "chunked");
    assert_eq!(body_of(response).await.unwrap().0, "hello");
}

/// hyper's framing rules, applied to fields noted one line at a time.
#[test]
fn body_framing_from_the_fields_as_they_were_read() {
    let framed = |lengths: &[&str], codings: Option<&'static str>| {
        let mut body = BodyFields::default();
        for l in lengths {
            body.content_length(l.as_bytes());
        }
        body.transfer_encoding = codings.map(HeaderValue::from_static);
        framing(StatusCode::OK, &Method::GET, Version::HTTP_11, body)
    };
    assert_eq!(framed(&["5"], None), Ok(Framing::Length(5)));
    assert_eq!(framed(&["5, 5", " 5 "], None), Ok(Framing::Length(5)));
    assert_eq!(framed(&["5", "6"], None), Err(ErrorKind::InvalidLength));
    assert_eq!(framed(&["5,6"], None), Err(ErrorKind::InvalidLength));
    assert_eq!(framed(&["", "5"], None), Err(ErrorKind::InvalidLength));
    // Only ASCII spaces around a length, as the value read as text allowed.
    assert_eq!(framed(&["5\u{a0}"], None), Err(ErrorKind::InvalidLength));
    assert_eq!(framed(&["\t5 "], None), Ok(Framing::Length(5)));
    assert_eq!(framed(&[], None), Ok(Framing::UntilClose));
    // Transfer-Encoding wins, even over a bad length; chunked only when it comes last.
    assert_eq!(framed(&["x"], Some("gzip, chunked")), Ok(Framing::Chunked));
    assert_eq!(framed(&[], Some("chunked, gzip")), Ok(Framing::UntilClose));
    let body = BodyFields {
        transfer_encoding: Some(HeaderValue::from_static("chunked")),
        ..BodyFields::default()
    };
    assert_eq!(
        framing(StatusCode::OK, &Method::GET, Version::HTTP_10, body),
        Err(ErrorKind::InvalidHead)
    );
    assert_eq!(
        framing(
            StatusCode::NO_CONTENT,
            &Method::GET,
            Version::HTTP_11,
            BodyFields::default()
        ),
        Ok(Framing::Empty)
    );
}
