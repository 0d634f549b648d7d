//! The cookies the proxy writes on an app's responses: writer affinity with read targets
//! (upstream §4.4: `kamal-writer`, `X-Writer-Affinity: false`) and
//! `--scope-cookie-paths` under a stripped prefix (upstream §4.12), with host and domain
//! cases. Proxy-made answers never carry the writer cookie.

use std::time::{SystemTime, UNIX_EPOCH};
use testkit::{Proxy, Reply, backend::Backend, client, poll_until, send_with_cookie};

/// `method path` with optional `Host` and `Cookie` headers.
async fn send(
    proxy: &Proxy,
    method: reqwest::Method,
    path: &str,
    host: Option<&str>,
    cookie: Option<&str>,
) -> Reply {
    send_with_cookie(&client(), method, &proxy.url(path), host, cookie)
        .await
        .expect("request")
}

fn set_cookies(r: &Reply) -> Vec<String> {
    r.headers
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

fn writer_cookie(r: &Reply) -> Option<String> {
    set_cookies(r)
        .into_iter()
        .find(|c| c.starts_with("kamal-writer="))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A service with one writer and one reader, both healthy.
async fn with_reader(extra: &[&str]) -> (Proxy, Backend, Backend) {
    let writer = Backend::start("writer").await;
    let reader = Backend::start("reader").await;
    let proxy = Proxy::start().await;
    let read = format!("--read-target={}", reader.target());
    let mut flags = vec![read.as_str(), "--health-check-interval=100ms"];
    flags.extend_from_slice(extra);
    proxy.deploy("app", &writer.target(), &flags).await;
    (proxy, writer, reader)
}

use reqwest::Method;

#[tokio::test(flavor = "multi_thread")]
async fn a_write_sends_the_client_s_reads_to_the_writer_for_a_while() {
    let (proxy, _writer, _reader) = with_reader(&["--writer-affinity-timeout=30s"]).await;

    let read = send(&proxy, Method::GET, "/", None, None).await;
    assert_eq!(read.body, "reader");
    assert_eq!(writer_cookie(&read), None, "a read sets no cookie");

    let before = now_ms();
    let write = send(&proxy, Method::POST, "/", None, None).await;
    assert_eq!(write.body, "writer");
    let cookie = writer_cookie(&write).expect("a write sets the writer cookie");
    let (pair, attrs) = cookie.split_once("; ").unwrap();
    let expires: i64 = pair.strip_prefix("kamal-writer=").unwrap().parse().unwrap();
    assert!(
        expires >= before + 30_000 && expires <= now_ms() + 30_000,
        "{cookie}"
    );
    assert!(attrs.starts_with("Path=/; Expires="), "{cookie}");
    assert!(attrs.ends_with(" GMT; HttpOnly"), "{cookie}");

    // The browser sends it back: reads go to the writer, and get no new cookie.
    let read = send(&proxy, Method::GET, "/", None, Some(pair)).await;
    assert_eq!(read.body, "writer");
    assert_eq!(writer_cookie(&read), None);
    let head = send(&proxy, Method::HEAD, "/", None, Some(pair)).await;
    assert_eq!(head.headers["x-backend"], "writer");
    // An expired or unreadable cookie counts for nothing.
    let stale = format!("kamal-writer={}", now_ms() - 1);
    assert_eq!(
        send(&proxy, Method::GET, "/", None, Some(&stale))
            .await
            .body,
        "reader"
    );
    let junk = "kamal-writer=later";
    assert_eq!(
        send(&proxy, Method::GET, "/", None, Some(junk)).await.body,
        "reader"
    );
    // Every write refreshes it, whatever the method.
    for m in [Method::PUT, Method::PATCH, Method::DELETE] {
        let r = send(&proxy, m.clone(), "/", None, None).await;
        assert_eq!(r.body, "writer", "{m}");
        assert!(writer_cookie(&r).is_some(), "{m}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_app_opts_out_with_x_writer_affinity_false() {
    let (proxy, _writer, _reader) = with_reader(&[]).await;
    let r = send(
        &proxy,
        Method::POST,
        "/headers?X-Writer-Affinity=false&set-cookie=app%3D1",
        None,
        None,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(set_cookies(&r), ["app=1"], "the app's own cookie only");
    assert!(
        r.headers.get("x-writer-affinity").is_none(),
        "the opt-out header is the proxy's, never the client's"
    );
    // Any other value keeps the cookie, and the header is still removed.
    let r = send(
        &proxy,
        Method::POST,
        "/headers?X-Writer-Affinity=no",
        None,
        None,
    )
    .await;
    assert!(writer_cookie(&r).is_some());
    assert!(r.headers.get("x-writer-affinity").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn no_readers_or_no_timeout_means_no_affinity() {
    // Without readers upstream does not wrap the response: the header passes through.
    let writer = Backend::start("writer").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &writer.target(), &[]).await;
    let r = send(
        &proxy,
        Method::POST,
        "/headers?X-Writer-Affinity=false",
        None,
        None,
    )
    .await;
    assert_eq!(writer_cookie(&r), None);
    assert_eq!(r.headers["x-writer-affinity"], "false");

    let (proxy, _w, _r) = with_reader(&["--writer-affinity-timeout=0s"]).await;
    let r = send(&proxy, Method::POST, "/", None, None).await;
    assert_eq!(r.body, "writer");
    assert_eq!(writer_cookie(&r), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn proxy_made_error_pages_carry_no_writer_cookie() {
    let reader = Backend::start("reader").await;
    let gone = Backend::start("gone").await;
    let writer_addr = gone.target();
    gone.kill();
    drop(gone);
    let proxy = Proxy::start().await;
    // Forced in with a writer that never answers: writes have no healthy writer.
    proxy
        .deploy(
            "app",
            &writer_addr,
            &[
                &format!("--read-target={}", reader.target()),
                "--force",
                "--health-check-interval=100ms",
            ],
        )
        .await;
    poll_until(
        "the reader to serve reads",
        std::time::Duration::from_secs(10),
        || async { send(&proxy, Method::GET, "/", None, None).await.body == "reader" },
    )
    .await;
    let r = send(&proxy, Method::POST, "/", None, None).await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("503"), "the proxy's page");
    assert!(set_cookies(&r).is_empty(), "{:?}", r.headers);
}

/// `GET <prefix>/headers` whose app answer sets each of `cookies`, with `Host: host`.
async fn cookies_through(proxy: &Proxy, prefix: &str, host: &str, cookies: &[&str]) -> Vec<String> {
    let query: Vec<String> = cookies
        .iter()
        .map(|c| format!("set-cookie={}", encode(c)))
        .collect();
    let path = format!("{prefix}/headers?{}", query.join("&"));
    let r = send(proxy, Method::GET, &path, Some(host), None).await;
    assert_eq!(r.status, 200, "{path}: {r:?}");
    set_cookies(&r)
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn cookie_paths_are_scoped_below_a_stripped_prefix() {
    let app = Backend::start("app").await;
    let root = Backend::start("root").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &app.target(),
            &[
                "--host=a.test",
                "--path-prefix=/app",
                "--scope-cookie-paths",
            ],
        )
        .await;
    proxy
        .deploy("root", &root.target(), &["--host=a.test"])
        .await;

    // Upstream's cases: the path goes below the prefix.
    assert_eq!(
        cookies_through(
            &proxy,
            "/app",
            "a.test",
            &["session=1; Path=/something", "b=2; Path=/", "c=3"]
        )
        .await,
        [
            "session=1; Path=/app/something",
            "b=2; Path=/app",
            "c=3; Path=/app"
        ]
    );
    // Only the request host's cookies (Domain absent or equal to the Host header without
    // its port) change; others stay byte for byte, in order.
    assert_eq!(
        cookies_through(
            &proxy,
            "/app",
            "a.test:8080",
            &[
                "mine=1;path=/x;domain=a.test;secure",
                "theirs=2; Path=/; Domain=other.test",
                "parent=3; Path=/; Domain=.a.test",
                "sub=4; Path=/; Domain=www.a.test",
            ]
        )
        .await,
        [
            "mine=1; Path=/app/x; Domain=a.test; Secure",
            "theirs=2; Path=/; Domain=other.test",
            "parent=3; Path=/; Domain=.a.test",
            "sub=4; Path=/; Domain=www.a.test",
        ]
    );
    // A changed cookie is written as Go writes it; one it cannot parse is left alone.
    assert_eq!(
        cookies_through(
            &proxy,
            "/app",
            "a.test",
            &[
                "t=1; SameSite=Strict; HttpOnly; Expires=Wed, 21 Oct 2037 07:28:00 GMT; Unknown=x",
                "no-equals-sign"
            ]
        )
        .await,
        [
            "t=1; Path=/app; Expires=Wed, 21 Oct 2037 07:28:00 GMT; HttpOnly; SameSite=Strict",
            "no-equals-sign"
        ]
    );
    // The root service is not below a prefix: its cookies pass untouched.
    assert_eq!(
        cookies_through(&proxy, "", "a.test", &["r=1; Path=/"]).await,
        ["r=1; Path=/"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cookie_paths_stay_without_the_flag_or_without_stripping() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("plain", &app.target(), &["--path-prefix=/plain"])
        .await;
    proxy
        .deploy(
            "kept",
            &app.target(),
            &[
                "--path-prefix=/headers",
                "--strip-path-prefix=false",
                "--scope-cookie-paths",
            ],
        )
        .await;
    assert_eq!(
        cookies_through(&proxy, "/plain", "a.test", &["x=1; Path=/"]).await,
        ["x=1; Path=/"]
    );
    // Unstripped, the app sees its full path (`/headers` here) and sets its cookies
    // for it: upstream scopes nothing.
    assert_eq!(
        cookies_through(&proxy, "", "a.test", &["y=2; Path=/"]).await,
        ["y=2; Path=/"]
    );
}
