//! The proxy's own error pages (upstream §4.7): the built-in pages, `--error-pages`
//! templates, and what happens when they cannot be loaded.

use std::path::Path;
use std::time::Duration;
use testkit::backend::Backend;
use testkit::{Proxy, client, poll_until};

const HTML: &str = "text/html; charset=utf-8";

async fn get(url: String, host: Option<&str>) -> (u16, String, String) {
    let mut req = client().get(url);
    if let Some(h) = host {
        req = req.header("host", h);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ct, resp.text().await.unwrap())
}

/// Kills the backend (open connections included) and waits until its port refuses
/// connections.
async fn stop_listening(backend: &Backend) {
    backend.kill();
    poll_until(
        "the backend to refuse connections",
        Duration::from_secs(10),
        || async { tokio::net::TcpStream::connect(backend.addr).await.is_err() },
    )
    .await;
}

fn pages_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in files {
        std::fs::write(dir.path().join(name), body).unwrap();
    }
    dir
}

fn arg(flag: &str, path: &Path) -> String {
    format!("--{flag}={}", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn built_in_pages() {
    let slow = Backend::start("slow").await;
    let gone = Backend::start("gone").await;
    let stopped = Backend::start("stopped").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "slow",
            &slow.target(),
            &["--host=slow.test", "--target-timeout=100ms"],
        )
        .await;
    proxy
        .deploy("gone", &gone.target(), &["--host=gone.test"])
        .await;
    proxy
        .deploy("stopped", &stopped.target(), &["--host=stopped.test"])
        .await;
    stop_listening(&gone).await;
    proxy.ok(&["stop", "stopped", "--drain-timeout=1s"]).await;

    let cases = [
        (
            "nowhere.test",
            "/",
            404,
            "404 — Not Found",
            "The page you were looking for doesn’t exist.",
        ),
        (
            "gone.test",
            "/",
            502,
            "502 — Bad Gateway",
            "The server received an invalid response.",
        ),
        (
            "stopped.test",
            "/",
            503,
            "503 — Service Temporarily Unavailable",
            "The service is temporarily unavailable. It may be overloaded, or undergoing scheduled maintenance. Please try again later.",
        ),
        (
            "slow.test",
            "/slow?ms=3000",
            504,
            "504 — Gateway Timeout",
            "The service did not respond within the allowed time limit.",
        ),
    ];
    for (host, path, status, title, text) in cases {
        let (got, ct, body) = get(proxy.url(path), Some(host)).await;
        assert_eq!(got, status, "{host}: {body}");
        assert_eq!(ct, HTML, "{host}");
        assert!(
            body.contains(&format!("<title>{title}</title>")),
            "{host}: no title {title:?} in {body}"
        );
        assert!(body.contains(text), "{host}: no text {text:?} in {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_message_replaces_the_built_in_text_escaped() {
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &backend.target(), &[]).await;
    proxy
        .ok(&[
            "stop",
            "app",
            "--drain-timeout=1s",
            "--message=Back <soon> & \"better\"",
        ])
        .await;
    let (status, ct, body) = get(proxy.url("/"), None).await;
    assert_eq!(status, 503);
    assert_eq!(ct, HTML);
    assert!(
        body.contains("503 — Service Temporarily Unavailable"),
        "{body}"
    );
    assert!(
        body.contains("Back &lt;soon&gt; &amp; &#34;better&#34;"),
        "{body}"
    );
    assert!(!body.contains("It may be overloaded"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn custom_templates_render_and_missing_ones_fall_back() {
    let dir = pages_dir(&[
        (
            "503.html",
            "<html><body><h1>Custom</h1><p>{{ .Message }}</p></body></html>\n",
        ),
        (
            "504.html",
            "timeout[{{ .Message }}]{{ if .Message }} with message{{ else }} no message{{ end }}",
        ),
        ("notes.txt", "not a template {{"),
    ]);
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[&arg("error-pages", dir.path()), "--target-timeout=100ms"],
        )
        .await;

    // A proxy-generated 504 uses the custom template, with no message.
    let (status, ct, body) = get(proxy.url("/slow?ms=3000"), None).await;
    assert_eq!(status, 504);
    assert_eq!(ct, HTML);
    assert_eq!(body, "timeout[] no message");

    // Upstream error responses are the app's own, never replaced.
    let (status, _, body) = get(proxy.url("/status/503"), None).await;
    assert_eq!((status, body.as_str()), (503, "status 503"));

    // No custom 502: the built-in page.
    stop_listening(&backend).await;
    let (status, ct, body) = get(proxy.url("/"), None).await;
    assert_eq!(status, 502);
    assert_eq!(ct, HTML);
    assert!(body.contains("502 — Bad Gateway"), "{body}");

    proxy
        .ok(&[
            "stop",
            "app",
            "--drain-timeout=1s",
            "--message=Custom Maintenance",
        ])
        .await;
    let (status, ct, body) = get(proxy.url("/"), None).await;
    assert_eq!(status, 503);
    assert_eq!(ct, HTML);
    assert_eq!(
        body,
        "<html><body><h1>Custom</h1><p>Custom Maintenance</p></body></html>\n"
    );

    proxy
        .ok(&["stop", "app", "--drain-timeout=1s", "--message=<b>&</b>"])
        .await;
    let (_, _, body) = get(proxy.url("/"), None).await;
    assert_eq!(
        body,
        "<html><body><h1>Custom</h1><p>&lt;b&gt;&amp;&lt;/b&gt;</p></body></html>\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn templates_are_read_at_deploy_time() {
    let dir = pages_dir(&[("503.html", "first {{ .Message }}")]);
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    let pages = arg("error-pages", dir.path());
    proxy.deploy("app", &backend.target(), &[&pages]).await;
    proxy
        .ok(&["stop", "app", "--drain-timeout=1s", "--message=m"])
        .await;
    std::fs::write(dir.path().join("503.html"), "second {{ .Message }}").unwrap();
    assert_eq!(get(proxy.url("/"), None).await.2, "first m");
    proxy.deploy("app", &backend.target(), &[&pages]).await;
    assert_eq!(get(proxy.url("/"), None).await.2, "second m");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unrouted_404_always_uses_the_built_in_page() {
    let dir = pages_dir(&[
        ("404.html", "custom not found"),
        ("503.html", "custom unavailable"),
    ]);
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--host=app.test", &arg("error-pages", dir.path())],
        )
        .await;
    let (status, ct, body) = get(proxy.url("/"), Some("other.test")).await;
    assert_eq!(status, 404);
    assert_eq!(ct, HTML);
    assert!(body.contains("404 — Not Found"), "{body}");
    assert!(!body.contains("custom"), "{body}");
    // The service itself still serves.
    assert_eq!(get(proxy.url("/"), Some("app.test")).await.2, "app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unloadable_error_pages_fail_the_deploy_and_change_nothing() {
    let one = Backend::start("one").await;
    let two = Backend::start("two").await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &one.target(), &[]).await;
    let before_list = proxy.ok(&["list"]).await;
    let before_state = std::fs::read(proxy.state_file()).unwrap();

    let empty = tempfile::tempdir().unwrap();
    let only_text = pages_dir(&[("503.txt", "not html")]);
    let unparseable = pages_dir(&[("503.html", "broken {{ .Message ")]);
    let missing = empty.path().join("missing");
    for dir in [
        empty.path(),
        only_text.path(),
        unparseable.path(),
        missing.as_path(),
    ] {
        let pages = arg("error-pages", dir);
        let t = format!("--target={}", two.target());
        let err = proxy
            .fails(&["deploy", "app", &t, "--deploy-timeout=5s", &pages])
            .await;
        assert!(
            err.contains("Error: unable to load error pages"),
            "{}: {err}",
            dir.display()
        );
        // A new service is not created either.
        let err = proxy
            .fails(&[
                "deploy",
                "fresh",
                &t,
                "--host=fresh.test",
                "--deploy-timeout=5s",
                &pages,
            ])
            .await;
        assert!(
            err.contains("Error: unable to load error pages"),
            "{}: {err}",
            dir.display()
        );
    }

    assert_eq!(proxy.ok(&["list"]).await, before_list);
    assert_eq!(std::fs::read(proxy.state_file()).unwrap(), before_state);
    assert_eq!(get(proxy.url("/"), None).await.2, "one");
    let (status, _, _) = get(proxy.url("/"), Some("fresh.test")).await;
    assert_eq!(status, 200, "fresh.test falls through to the catch-all app");
    assert_eq!(two.hits(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buffering_errors_use_custom_templates_too() {
    let dir = pages_dir(&[
        ("413.html", "custom too large"),
        ("500.html", "custom internal error"),
    ]);
    let backend = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                &arg("error-pages", dir.path()),
                "--buffer-requests",
                "--max-request-body=10",
                "--buffer-responses",
                "--max-response-body=10",
            ],
        )
        .await;
    let resp = client()
        .post(proxy.url("/echo"))
        .body(vec![0u8; 11])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.headers()["content-type"], HTML);
    assert_eq!(resp.text().await.unwrap(), "custom too large");
    let resp = client().get(proxy.url("/bytes/11")).send().await.unwrap();
    assert_eq!(resp.status(), 500);
    assert_eq!(resp.headers()["content-type"], HTML);
    assert_eq!(resp.text().await.unwrap(), "custom internal error");
}
