use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, http::HeaderValue::from_static(v));
    }
    h
}

fn keyed(h: &http::HeaderMap) -> bool {
    h.keys().any(is_idempotency_key)
}

#[test]
fn written_requests_are_resent_only_when_replayable_and_bodiless() {
    let none = false;
    for m in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
        assert!(may_resend(true, &m, none, true), "{m}");
        assert!(!may_resend(true, &m, none, false), "{m} with a body");
    }
    for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
        assert!(!may_resend(true, &m, none, true), "{m}");
    }
    for key in ["idempotency-key", "x-idempotency-key"] {
        let h = headers(&[(key, "k1")]);
        assert!(may_resend(true, &Method::POST, keyed(&h), true), "{key}");
        assert!(
            !may_resend(true, &Method::POST, keyed(&h), false),
            "{key} with a body"
        );
    }
}

#[test]
fn unwritten_requests_are_resent_whatever_the_method_unless_they_have_a_body() {
    let none = false;
    for m in [Method::GET, Method::POST, Method::DELETE, Method::PATCH] {
        assert!(may_resend(false, &m, none, true), "{m}");
        assert!(!may_resend(false, &m, none, false), "{m} with a body");
    }
}

#[test]
fn only_the_forks_replayable_requests_go_to_another_target() {
    {
        for m in [
            Method::GET,
            Method::HEAD,
            Method::OPTIONS,
            Method::TRACE,
            Method::PUT,
            Method::DELETE,
        ] {
            assert!(may_try_elsewhere(&m, true, false), "{m}");
            assert!(!may_try_elsewhere(&m, false, false), "{m} with a body");
        }
        assert!(!may_try_elsewhere(&Method::GET, true, true), "an upgrade");
        for m in [Method::POST, Method::PATCH, Method::CONNECT] {
            assert!(!may_try_elsewhere(&m, true, false), "{m}");
        }
    }
}

#[test]
fn only_our_mark_allows_a_resend() {
    let none = false;
    let plain = io::Error::new(io::ErrorKind::ConnectionReset, "reset");
    assert!(!resend_after(&plain, &Method::GET, none, true));
    let marked = io::Error::new(
        io::ErrorKind::ConnectionReset,
        ReusedConnectionClosed {
            written: true,
            cause: Some(plain),
        },
    );
    assert!(resend_after(&marked, &Method::GET, none, true));
    assert!(!resend_after(&marked, &Method::POST, none, true));
    // Found below other errors, as hyper-util and hyper wrap it.
    #[derive(Debug)]
    struct Outer(io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("outer")
        }
    }
    impl StdError for Outer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }
    assert!(resend_after(&Outer(marked), &Method::HEAD, none, true));
}

#[test]
fn a_request_handed_back_goes_again_by_its_method_and_idempotency_key() {
    let written = reused_connection_closed(io::ErrorKind::ConnectionReset.into(), true);
    let unwritten = reused_connection_closed(io::ErrorKind::BrokenPipe.into(), false);
    let req = |method: Method, key: bool| {
        let mut b = Request::builder().method(method).uri("http://t:80/");
        if key {
            b = b.header("Idempotency-Key", "k");
        }
        b.body(()).unwrap()
    };
    assert!(resend_allowed(&written, &req(Method::GET, false)));
    assert!(!resend_allowed(&written, &req(Method::DELETE, false)));
    assert!(resend_allowed(&written, &req(Method::DELETE, true)));
    assert!(resend_allowed(&unwritten, &req(Method::POST, false)));
    let unmarked = io::Error::from(io::ErrorKind::ConnectionReset);
    assert!(!resend_allowed(&unmarked, &req(Method::GET, false)));
}

#[test]
fn a_replay_is_the_same_request_again() {
    let req = Request::builder()
        .method(Method::DELETE)
        .uri("http://127.0.0.1:3000/a/b?c=d")
        .header("host", "example.com")
        .header("x-forwarded-for", "10.0.0.1")
        .header("accept", "text/html")
        .header("accept", "*/*")
        .header("X-Idempotency-Key", "k1")
        .body(())
        .unwrap();
    let (parts, ()) = req.into_parts();
    let replay = Replay::of(&parts.method, &parts.uri, &parts.headers);
    let again = replay.into_request(());
    assert_eq!(again.method(), Method::DELETE);
    assert_eq!(again.uri(), &parts.uri);
    assert_eq!(again.headers(), &parts.headers);
    assert_eq!(again.version(), Version::HTTP_11);
    let plain = Request::new(());
    let plain = Replay::of(plain.method(), plain.uri(), plain.headers());
    assert!(plain.into_request(()).headers().is_empty());
}

/// A request/response on `Tracked`, the app side driven by hand.
async fn exchange(ours: &mut Tracked<tokio::io::DuplexStream>, app: &mut tokio::io::DuplexStream) {
    ours.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 64];
    let n = app.read(&mut buf).await.unwrap();
    assert!(n > 0);
    app.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let n = ours.read(&mut buf).await.unwrap();
    assert!(n > 0);
}

fn mark_of(e: &io::Error) -> Option<bool> {
    closed_before_response(e).map(|m| m.written)
}

#[tokio::test]
async fn a_fresh_connection_that_dies_is_not_marked() {
    let (ours, mut app) = tokio::io::duplex(1024);
    let mut ours = Tracked::new(ours);
    ours.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 64];
    let _ = app.read(&mut buf).await.unwrap();
    drop(app);
    // End of file, unmarked: hyper reports it as it always has.
    assert_eq!(ours.read(&mut buf).await.unwrap(), 0);
}

#[tokio::test]
async fn a_reused_connection_closed_after_the_request_is_marked_written() {
    let (ours, mut app) = tokio::io::duplex(1024);
    let mut ours = Tracked::new(ours);
    exchange(&mut ours, &mut app).await;
    ours.write_all(b"GET /again HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    drop(app);
    let mut buf = [0u8; 64];
    let e = ours.read(&mut buf).await.unwrap_err();
    assert_eq!(mark_of(&e), Some(true), "{e}");
}

#[tokio::test]
async fn a_reused_connection_that_refuses_the_first_write_is_marked_unwritten() {
    // A fake, beside the real-socket tests: a duplex half whose peer is gone refuses
    // writes outright, which a TCP socket does only once the app's reset has arrived.
    let (ours, mut app) = tokio::io::duplex(1024);
    let mut ours = Tracked::new(ours);
    exchange(&mut ours, &mut app).await;
    drop(app);
    let e = ours
        .write_all(b"POST / HTTP/1.1\r\n\r\n")
        .await
        .unwrap_err();
    assert_eq!(mark_of(&e), Some(false), "{e}");
}

#[tokio::test]
async fn an_idle_connection_closing_is_a_plain_end_of_file() {
    let (ours, mut app) = tokio::io::duplex(1024);
    let mut ours = Tracked::new(ours);
    exchange(&mut ours, &mut app).await;
    drop(app);
    let mut buf = [0u8; 64];
    assert_eq!(ours.read(&mut buf).await.unwrap(), 0);
}

#[tokio::test]
async fn a_response_begun_is_not_marked() {
    let (ours, mut app) = tokio::io::duplex(1024);
    let mut ours = Tracked::new(ours);
    exchange(&mut ours, &mut app).await;
    ours.write_all(b"GET /again HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    app.write_all(b"HTTP/1.1 200").await.unwrap();
    drop(app);
    let mut buf = [0u8; 64];
    assert!(ours.read(&mut buf).await.unwrap() > 0);
    assert_eq!(ours.read(&mut buf).await.unwrap(), 0);
}
