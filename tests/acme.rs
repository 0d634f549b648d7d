//! Automatic certificates against a real ACME server (Debian's pebble, started per test):
//! issuance on the first HTTPS request over HTTP-01 and over TLS-ALPN-01, the cache reused
//! after a restart, renewal while a client keeps requesting, on-demand allow and deny.
//!
//! The proxy picks its own ports (reported in its start-up line) and pebble is told them:
//! no port is picked here and released for someone else to take first.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use testkit::pebble::{Challenges, available, with_proxy};
use testkit::{Proxy, backend::Backend};
use tokio::time::Instant;

fn client(root: &reqwest::Certificate, host: &str, port: u16) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .tls_certs_only([root.clone()])
        .tls_info(true)
        .timeout(Duration::from_secs(30))
        .resolve(host, SocketAddr::from(([127, 0, 0, 1], port)))
        .build()
        .unwrap()
}

fn peer_certificate(resp: &reqwest::Response) -> Vec<u8> {
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .map(<[u8]>::to_vec)
        .expect("peer certificate")
}

/// Issuance log lines, from the `skip`-th log line on (to look past a restart).
fn obtained_since(proxy: &Proxy, skip: usize) -> Vec<serde_json::Value> {
    proxy
        .logs()
        .iter()
        .skip(skip)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["msg"] == "Obtained certificate" || v["msg"] == "Renewed certificate")
        .collect()
}

fn obtained(proxy: &Proxy) -> Vec<serde_json::Value> {
    obtained_since(proxy, 0)
}

fn sha256_hex(s: &str) -> String {
    use std::fmt::Write;
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, s.as_bytes());
    d.as_ref().iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn http01_on_first_request_then_restart_reuses_the_cache() {
    if !available() {
        return;
    }
    // TLS-ALPN-01 is tried first (as autocert); a dead TLS port makes HTTP-01 the one
    // that succeeds.
    let (pebble, mut proxy) = with_proxy(Challenges::Http01, None).await;
    let https = proxy.https_port;
    let backend = Backend::start("one").await;
    proxy
        .deploy("app", &backend.target(), &["--host=app.test", "--tls"])
        .await;
    let root = pebble.root().await;

    let started = Instant::now();
    let resp = client(&root, "app.test", https)
        .get(format!("https://app.test:{https}/"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", proxy.logs().join("\n"), pebble.logs()));
    let took = started.elapsed();
    assert_eq!(resp.status(), 200);
    proxy
        .wait_for_log("Obtained certificate", |l| {
            l.contains("Obtained certificate")
        })
        .await;
    assert_eq!(resp.version(), reqwest::Version::HTTP_2);
    let first_cert = peer_certificate(&resp);
    assert_eq!(resp.text().await.unwrap(), "one");
    let events = obtained(&proxy);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["challenge"], "http-01");
    assert_eq!(events[0]["host"], "app.test");
    eprintln!("first HTTPS request with HTTP-01 issuance took {took:?}");

    // Cached in autocert's layout: key + chain under the domain, the account key beside.
    let cache = proxy
        .home()
        .join(".config/kamal-proxy/certs")
        .join(sha256_hex(&pebble.directory));
    let entry = std::fs::read_to_string(cache.join("app.test")).expect("cached certificate");
    assert!(entry.starts_with("-----BEGIN PRIVATE KEY-----"), "{entry}");
    assert!(entry.contains("-----BEGIN CERTIFICATE-----"));
    assert!(cache.join("acme_account+key").is_file());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);

    // HTTP is redirected to HTTPS.
    let r = proxy.get("app.test", "/x?y=1").await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), "https://app.test/x?y=1");

    // After a restart the cached certificate is served with no new order.
    let seen = proxy.logs().len();
    proxy.restart().await;
    let resp = client(&root, "app.test", https)
        .get(format!("https://app.test:{https}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(peer_certificate(&resp), first_cert);
    assert!(obtained_since(&proxy, seen).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_alpn01_on_first_request() {
    if !available() {
        return;
    }
    // A dead HTTP port: only TLS-ALPN-01 can succeed.
    let (pebble, proxy) = with_proxy(Challenges::TlsAlpn01, None).await;
    let https = proxy.https_port;
    let backend = Backend::start("one").await;
    proxy
        .deploy("app", &backend.target(), &["--host=alpn.test", "--tls"])
        .await;
    let root = pebble.root().await;
    let resp = client(&root, "alpn.test", https)
        .get(format!("https://alpn.test:{https}/"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", proxy.logs().join("\n"), pebble.logs()));
    assert_eq!(resp.status(), 200);
    proxy
        .wait_for_log("Obtained certificate", |l| {
            l.contains("Obtained certificate")
        })
        .await;
    let events = obtained(&proxy);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["challenge"], "tls-alpn-01");
    eprintln!(
        "TLS-ALPN-01 issuance took {} ms",
        events[0]["duration"].as_u64().unwrap_or(0) / 1_000_000
    );

    // A name the service does not list never gets a certificate, and no order is made.
    let other = client(&root, "other.test", https)
        .get(format!("https://other.test:{https}/"))
        .send()
        .await;
    assert!(other.is_err());
    assert_eq!(obtained(&proxy).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn renews_ahead_of_expiry_while_requests_keep_succeeding() {
    if !available() {
        return;
    }
    // 24 s certificates: renewed once two thirds of the lifetime have passed.
    let (pebble, proxy) = with_proxy(Challenges::Both, Some(Duration::from_secs(24))).await;
    let https = proxy.https_port;
    let backend = Backend::start("one").await;
    proxy
        .deploy("app", &backend.target(), &["--host=renew.test", "--tls"])
        .await;
    let root = pebble.root().await;

    let first = {
        let resp = client(&root, "renew.test", https)
            .get(format!("https://renew.test:{https}/"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", proxy.logs().join("\n")));
        peer_certificate(&resp)
    };
    let failures = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut renewed = None;
    // One kept-alive client and fresh connections side by side.
    let kept = client(&root, "renew.test", https);
    while Instant::now() < deadline {
        for c in [&kept, &client(&root, "renew.test", https)] {
            requests.fetch_add(1, Ordering::SeqCst);
            match c.get(format!("https://renew.test:{https}/")).send().await {
                Ok(r) if r.status() == 200 => {
                    let cert = peer_certificate(&r);
                    if cert != first && renewed.is_none() {
                        renewed = Some(Instant::now());
                    }
                }
                Ok(r) => {
                    eprintln!("status {}", r.status());
                    failures.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => {
                    eprintln!("request failed: {e}");
                    failures.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        if renewed.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        renewed.is_some(),
        "no renewed certificate seen\n{}",
        proxy.logs().join("\n")
    );
    eprintln!(
        "renewed while requesting: {} requests, {} failed",
        requests.load(Ordering::SeqCst),
        failures.load(Ordering::SeqCst)
    );
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "of {} requests",
        requests.load(Ordering::SeqCst)
    );
    proxy
        .wait_for_log("\"msg\":\"Renewed certificate\"", |l| {
            l.contains("\"msg\":\"Renewed certificate\"")
        })
        .await;
}

/// An ask endpoint: 200 for `yes.test`, 403 for anything else; counts what it is asked.
async fn ask_server() -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
    use hyper::service::service_fn;
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = asked.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let query = req.uri().query().unwrap_or("").to_string();
                    log.lock().unwrap().push(query.clone());
                    let allowed = query.split('&').any(|kv| kv == "host=yes.test");
                    async move {
                        let mut r = hyper::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(if allowed { "ok" } else { "nope" }),
                        ));
                        *r.status_mut() = if allowed {
                            hyper::StatusCode::NO_CONTENT
                        } else {
                            hyper::StatusCode::FORBIDDEN
                        };
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, asked)
}

#[tokio::test(flavor = "multi_thread")]
async fn on_demand_allows_and_denies_and_never_asks_twice_for_a_cached_host() {
    if !available() {
        return;
    }
    let (pebble, mut proxy) = with_proxy(Challenges::Both, None).await;
    let https = proxy.https_port;
    let backend = Backend::start("one").await;
    let (ask, asked) = ask_server().await;
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--tls",
                &format!("--tls-on-demand-url=http://{ask}/check?token=abc"),
            ],
        )
        .await;
    let root = pebble.root().await;

    // Allowed (a 204 is a 2xx: allowed, as the fork).
    let resp = client(&root, "yes.test", https)
        .get(format!("https://yes.test:{https}/"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", proxy.logs().join("\n")));
    assert_eq!(resp.status(), 200);
    assert_eq!(
        asked.lock().unwrap().as_slice(),
        ["host=yes.test&token=abc"]
    );

    // Denied: the handshake fails, no order is made.
    let denied = client(&root, "no.test", https)
        .get(format!("https://no.test:{https}/"))
        .send()
        .await;
    assert!(denied.is_err());
    proxy
        .wait_for_log("TLS on-demand check denied host", |l| {
            l.contains("TLS on-demand check denied host") && l.contains("no.test")
        })
        .await;
    assert_eq!(obtained(&proxy).len(), 1);

    // A cached host is not asked again, even after a restart.
    let seen = proxy.logs().len();
    proxy.restart().await;
    let before = asked.lock().unwrap().len();
    let resp = client(&root, "yes.test", https)
        .get(format!("https://yes.test:{https}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(asked.lock().unwrap().len(), before);
    assert!(obtained_since(&proxy, seen).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn on_demand_path_asks_the_service_itself() {
    if !available() {
        return;
    }
    let (pebble, proxy) = with_proxy(Challenges::Both, None).await;
    let https = proxy.https_port;
    let backend = Backend::start("one").await;
    // The test backend answers /status/<code> with that code.
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--tls", "--tls-on-demand-url=/status/200"],
        )
        .await;
    let root = pebble.root().await;
    let resp = client(&root, "path.test", https)
        .get(format!("https://path.test:{https}/"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", proxy.logs().join("\n")));
    assert_eq!(resp.status(), 200);

    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--tls", "--tls-on-demand-url=/status/302"],
        )
        .await;
    let denied = client(&root, "redirected.test", https)
        .get(format!("https://redirected.test:{https}/"))
        .send()
        .await;
    assert!(denied.is_err(), "a redirect is a denial");
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_issuance_is_logged_with_its_reason_and_backs_off() {
    if !available() {
        return;
    }
    // Both challenge ports dead: validation cannot succeed.
    let (pebble, proxy) = with_proxy(Challenges::Neither, None).await;
    let https = proxy.https_port;
    let backend = Backend::start("one").await;
    proxy
        .deploy("app", &backend.target(), &["--host=fail.test", "--tls"])
        .await;
    let root = pebble.root().await;
    let url = format!("https://fail.test:{https}/");
    assert!(
        client(&root, "fail.test", https)
            .get(&url)
            .send()
            .await
            .is_err()
    );
    proxy
        .wait_for_log("Unable to obtain certificate", |l| {
            l.contains("Unable to obtain certificate") && l.contains("retry_in")
        })
        .await;
    let line = proxy
        .logs()
        .into_iter()
        .find(|l| l.contains("Unable to obtain certificate"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["level"], "ERROR");
    assert_eq!(v["host"], "fail.test");
    assert!(
        v["error"].as_str().unwrap().contains("Connection refused")
            || v["error"].as_str().unwrap().contains("connection refused"),
        "{v}"
    );
    assert_eq!(v["retry_in"], "1m0s");

    // Within the backoff, handshakes fail without a new order. Issuance runs inside the
    // handshake, so by the time the client sees the failure any attempt has been logged.
    let attempts = |p: &Proxy| {
        p.logs()
            .iter()
            .filter(|l| {
                l.contains("ACME challenge failed") || l.contains("Unable to obtain certificate")
            })
            .count()
    };
    let before = attempts(&proxy);
    assert!(
        client(&root, "fail.test", https)
            .get(&url)
            .send()
            .await
            .is_err()
    );
    assert_eq!(attempts(&proxy), before);
}
