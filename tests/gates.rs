//! The access gates through the real binary: ping, IP allow list with trusted proxies (IPv4
//! and IPv6 clients), canonical host and `--redirect`, `--rewrite`, rate limit, basic auth,
//! the request deadline, their order, custom error pages, validation and persistence.

use reqwest::{Method, StatusCode};
use std::time::Duration;
use testkit::backend::Backend;
use testkit::{Proxy, client};
use tokio::time::Instant;

/// `::1` is usable (the proxy listens dual-stack); IPv6 tests skip with a message when not.
fn ipv6_available() -> bool {
    let ok = std::net::TcpListener::bind("[::1]:0").is_ok();
    if !ok {
        eprintln!("skipping the IPv6 part: ::1 is not available on this machine");
    }
    ok
}

fn url6(p: &Proxy, path: &str) -> String {
    format!("http://[::1]:{}{}", p.http_port, path)
}

async fn status(req: reqwest::RequestBuilder) -> StatusCode {
    req.send().await.expect("request").status()
}

#[tokio::test(flavor = "multi_thread")]
async fn ping_answers_on_every_host_before_routing_unlogged_and_uncached() {
    let p = Proxy::start().await;
    let http = client();
    // No service at all.
    let r = http.get(p.url("/.kamal-proxy/ping")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert_eq!(r.headers()["content-type"], "text/plain; charset=utf-8");
    assert_eq!(r.text().await.unwrap(), "OK\n");

    // A catch-all service behind every gate never sees it.
    let b = Backend::start("app").await;
    p.deploy(
        "app",
        &b.target(),
        &[
            "--allow-ip=192.0.2.1",
            "--basic-auth=u:p",
            "--rate-limit=0.001",
        ],
    )
    .await;
    for host in ["any.example", "other.test", ""] {
        let mut req = http.get(p.url("/.kamal-proxy/ping"));
        if !host.is_empty() {
            req = req.header("host", host);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200, "host {host:?}");
        assert_eq!(r.headers()["cache-control"], "no-store");
    }
    assert_eq!(status(http.head(p.url("/.kamal-proxy/ping"))).await, 200);
    let r = http.post(p.url("/.kamal-proxy/ping")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, HEAD");
    if ipv6_available() {
        assert_eq!(status(http.get(url6(&p, "/.kamal-proxy/ping"))).await, 200);
    }
    assert_eq!(b.hits(), 0, "ping is never forwarded");
    // Other paths under /.kamal-proxy/ are the app's (here: denied by its allow list).
    assert_eq!(status(http.get(p.url("/.kamal-proxy/other"))).await, 403);
    let logged: Vec<_> = p
        .access_log()
        .into_iter()
        .filter(|l| l["path"] == "/.kamal-proxy/ping")
        .collect();
    assert!(logged.is_empty(), "ping is not logged: {logged:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_list_admits_listed_addresses_and_denies_the_rest_with_403() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();

    p.deploy("app", &b.target(), &["--allow-ip=10.0.0.0/8,127.0.0.1"])
        .await;
    assert_eq!(status(http.get(p.url("/"))).await, 200);

    p.deploy(
        "app",
        &b.target(),
        &["--allow-ip=10.0.0.0/8", "--allow-ip=192.0.2.0/24"],
    )
    .await;
    let hits = b.hits();
    let r = http.get(p.url("/secret")).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.text().await.unwrap(), "<h1>403 Forbidden</h1>");
    // A client-written X-Forwarded-For buys nothing without --trusted-proxy.
    let r = http
        .get(p.url("/secret"))
        .header("x-forwarded-for", "10.1.2.3")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(b.hits(), hits, "denied requests never reach the app");
    // The health path stays open (GET and HEAD), so a load balancer can watch it.
    assert_eq!(status(http.get(p.url("/up"))).await, 200);
    assert_eq!(status(http.head(p.url("/up"))).await, 200);
    assert_eq!(status(http.post(p.url("/up"))).await, 403);

    // Not sticky: a redeploy without the flag lifts it.
    p.deploy("app", &b.target(), &[]).await;
    assert_eq!(status(http.get(p.url("/secret"))).await, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn ipv6_clients_are_matched_on_their_own_address() {
    if !ipv6_available() {
        return;
    }
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();
    p.deploy("app", &b.target(), &["--allow-ip=::1"]).await;
    assert_eq!(status(http.get(url6(&p, "/"))).await, 200);
    assert_eq!(
        status(http.get(p.url("/"))).await,
        403,
        "IPv4 loopback is not ::1"
    );

    p.deploy("app", &b.target(), &["--allow-ip=127.0.0.0/8"])
        .await;
    assert_eq!(status(http.get(p.url("/"))).await, 200);
    assert_eq!(status(http.get(url6(&p, "/"))).await, 403);

    p.deploy("app", &b.target(), &["--allow-ip=2001:db8::/32,::1/128"])
        .await;
    assert_eq!(status(http.get(url6(&p, "/"))).await, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn trusted_proxy_chains_resolve_the_client_and_unresolvable_chains_deny() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();
    p.deploy(
        "app",
        &b.target(),
        &[
            "--trusted-proxy=127.0.0.1,::1,10.0.0.0/8",
            "--allow-ip=203.0.113.0/24,2001:db8::/32",
        ],
    )
    .await;
    let get = |xff: &[&str]| {
        let mut req = http.get(p.url("/"));
        for line in xff {
            req = req.header("x-forwarded-for", *line);
        }
        status(req)
    };
    assert_eq!(get(&["203.0.113.7"]).await, 200);
    assert_eq!(get(&["198.51.100.1"]).await, 403);
    assert_eq!(get(&["2001:db8::42"]).await, 200);
    // Trusted hops are walked past, from the nearest one backwards.
    assert_eq!(get(&["198.51.100.1, 203.0.113.7, 10.0.0.9"]).await, 200);
    assert_eq!(get(&["203.0.113.7, 198.51.100.1, 10.0.0.9"]).await, 403);
    // A forged first line does not win over the line a hop appended.
    assert_eq!(get(&["203.0.113.7", "198.51.100.1"]).await, 403);
    // Missing, garbage or all-trusted chains resolve to no address: denied.
    assert_eq!(get(&[]).await, 403);
    assert_eq!(get(&["not-an-ip"]).await, 403);
    assert_eq!(get(&["10.0.0.1, 10.0.0.2"]).await, 403);
    if ipv6_available() {
        let r = http
            .get(url6(&p, "/"))
            .header("x-forwarded-for", "2001:db8::7")
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            200,
            "a trusted IPv6 peer forwards for its client"
        );
    }

    // --client-ip-header: read in its original form, and copied into X-Forwarded-For for
    // the app (upstream behaviour).
    p.deploy(
        "app",
        &b.target(),
        &[
            "--trusted-proxy=127.0.0.1",
            "--allow-ip=203.0.113.0/24",
            "--client-ip-header=CF-Connecting-IP",
        ],
    )
    .await;
    let r = http
        .get(p.url("/echo"))
        .header("cf-connecting-ip", "203.0.113.9")
        .header("x-forwarded-for", "198.51.100.1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let echo: serde_json::Value = r.json().await.unwrap();
    assert_eq!(echo["headers"]["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    let r = http
        .get(p.url("/echo"))
        .header("cf-connecting-ip", "198.51.100.1")
        .header("x-forwarded-for", "203.0.113.9")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        403,
        "the named header decides, not X-Forwarded-For"
    );
    p.wait_for_log("\"remote_addr\":\"203.0.113.9\"", |l| {
        l.contains("\"remote_addr\":\"203.0.113.9\"") && l.contains("\"status\":200")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn canonical_host_redirect_rules_and_rewrites() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();
    let port = p.http_port;
    p.deploy(
        "app",
        &b.target(),
        &[
            "--host=example.com,www.example.com",
            "--canonical-host=example.com",
            "--redirect=/old/(.*)=/new/$1",
            "--redirect=/moved=/there?from=moved;status=308",
            "--redirect=/go/(.*)=/$1",
            "--redirect=/docs/(.*)=https://docs.example.org/$1;status=302",
            "--redirect=/(same)=/$1",
            "--rewrite=/legacy/(.*)=/v2/$1",
        ],
    )
    .await;
    let get = |host: &str, path: &str| http.get(p.url(path)).header("host", host).send();
    let loc = |r: &reqwest::Response| {
        r.headers()
            .get("location")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };

    // Canonical host: one 301, port dropped, path and query kept.
    let r = get("www.example.com", "/a?b=1").await.unwrap();
    assert_eq!(r.status(), 301);
    assert_eq!(loc(&r), "http://example.com/a?b=1");
    // A rule combined with the canonical redirect: one hop.
    let r = get("www.example.com", "/old/x").await.unwrap();
    assert_eq!(
        (r.status().as_u16(), loc(&r)),
        (301, "http://example.com/new/x".into())
    );

    let host = format!("example.com:{port}");
    let h = host.as_str();
    let r = get(h, "/old/a/b?q=1").await.unwrap();
    assert_eq!(r.status(), 301);
    assert_eq!(loc(&r), format!("http://{host}/new/a/b?q=1"));
    assert_eq!(r.headers()["connection"], "close");
    let r = get(h, "/moved?x=1").await.unwrap();
    assert_eq!(
        (r.status().as_u16(), loc(&r)),
        (308, format!("http://{host}/there?from=moved"))
    );
    // A captured `//evil.com` stays a path on this host.
    let r = get(h, "/go//evil.com/x").await.unwrap();
    assert_eq!(loc(&r), format!("http://{host}//evil.com/x"));
    // Full URLs go anywhere.
    let r = get(h, "/docs/intro?v=2").await.unwrap();
    assert_eq!(
        (r.status().as_u16(), loc(&r)),
        (302, "https://docs.example.org/intro?v=2".into())
    );
    // A rule that resolves to the requested URL is skipped: no loop.
    let hits = b.hits();
    let r = get(h, "/same").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(b.hits(), hits + 1);

    // Rewrite: the app sees the new path, the log keeps the original.
    let r = get(h, "/legacy/page?k=v").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-uri"], "/v2/page?k=v");
    p.wait_for_log("\"path\":\"/legacy/page\"", |l| {
        l.contains("\"path\":\"/legacy/page\"") && l.contains("\"status\":200")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rate_limit_answers_429_with_retry_after_per_client() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();
    p.deploy(
        "app",
        &b.target(),
        &["--rate-limit=1", "--rate-limit-burst=3"],
    )
    .await;
    for _ in 0..3 {
        assert_eq!(status(http.get(p.url("/"))).await, 200);
    }
    let r = http.get(p.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.text().await.unwrap(), "<h1>429 Too Many Requests</h1>");
    // Health checks are never throttled.
    for _ in 0..5 {
        assert_eq!(status(http.get(p.url("/up"))).await, 200);
    }
    // Another client has its own budget (IPv6 ::1 is not 127.0.0.1).
    if ipv6_available() {
        for _ in 0..3 {
            assert_eq!(status(http.get(url6(&p, "/"))).await, 200);
        }
        assert_eq!(status(http.get(url6(&p, "/"))).await, 429);
    }
    // Refill at the rate: one more token after a second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(status(http.get(p.url("/"))).await, 200);
    assert_eq!(status(http.get(p.url("/"))).await, 429);

    // Fractional rates: Retry-After is ceil(1/rate).
    p.deploy("app", &b.target(), &["--rate-limit=0.25"]).await;
    assert_eq!(status(http.get(p.url("/"))).await, 200);
    let r = http.get(p.url("/")).send().await.unwrap();
    assert_eq!(
        (
            r.status().as_u16(),
            r.headers()["retry-after"].to_str().unwrap()
        ),
        (429, "4")
    );

    // Behind a trusted proxy, each forwarded client is counted on its own.
    p.deploy(
        "app",
        &b.target(),
        &["--rate-limit=0.01", "--trusted-proxy=127.0.0.1,::1"],
    )
    .await;
    let from = |xff: &str| status(http.get(p.url("/")).header("x-forwarded-for", xff));
    assert_eq!(from("203.0.113.1").await, 200);
    assert_eq!(from("203.0.113.1").await, 429);
    assert_eq!(from("203.0.113.2").await, 200);
    // IPv6 clients are counted per /64: a rotated address in the same /64 shares it.
    assert_eq!(from("2001:db8:1:2::1").await, 200);
    assert_eq!(from("2001:db8:1:2:ffff::9").await, 429);
    assert_eq!(from("2001:db8:1:3::1").await, 200);
    // Unresolvable chains share one overflow budget: limited, never waved through.
    assert_eq!(from("garbage").await, 200);
    assert_eq!(from("also garbage").await, 429);
}

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_challenges_strips_the_header_and_keeps_the_plaintext_off_disk() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();
    p.deploy("app", &b.target(), &["--basic-auth=admin:s3cr:et"])
        .await;

    let r = http.get(p.url("/echo")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["www-authenticate"],
        "Basic realm=\"Restricted\", charset=\"UTF-8\""
    );
    assert_eq!(r.text().await.unwrap(), "<h1>401 Unauthorized</h1>");
    let wrong = http
        .get(p.url("/echo"))
        .basic_auth("admin", Some("nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let r = http
        .get(p.url("/echo"))
        .basic_auth("admin", Some("s3cr:et"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let echo: serde_json::Value = r.json().await.unwrap();
    assert!(
        echo["headers"].get("authorization").is_none(),
        "stripped: {echo}"
    );

    // Health path: GET/HEAD open, POST challenged.
    assert_eq!(status(http.get(p.url("/up"))).await, 200);
    assert_eq!(status(http.head(p.url("/up"))).await, 200);
    assert_eq!(status(http.post(p.url("/up"))).await, 401);

    // The plaintext is nowhere: not in the state file, not in `list`.
    let state = std::fs::read_to_string(p.state_file()).unwrap();
    assert!(!state.contains("s3cr"), "{state}");
    assert!(state.contains("\"basic_auth\":\"sha256:"), "{state}");
    assert!(!p.ok(&["list", "--json"]).await.contains("sha256"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(p.state_file())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the state file is not world-readable");

    // Survives a restart.
    let mut p = p;
    p.restart().await;
    assert_eq!(status(http.get(p.url("/"))).await, 401);
    assert_eq!(
        status(http.get(p.url("/")).basic_auth("admin", Some("s3cr:et"))).await,
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gates_run_in_the_documented_order() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();
    // Allow list before auth: a denied client is never asked for a password.
    p.deploy(
        "app",
        &b.target(),
        &["--allow-ip=192.0.2.1", "--basic-auth=u:p"],
    )
    .await;
    assert_eq!(status(http.get(p.url("/"))).await, 403);

    // Redirects before the rate limit: a 301 spends no token. Rate limit before auth:
    // password guessing spends tokens.
    p.deploy(
        "app",
        &b.target(),
        &[
            "--redirect=/old=/new",
            "--rate-limit=0.01",
            "--basic-auth=u:p",
        ],
    )
    .await;
    for _ in 0..5 {
        assert_eq!(status(http.get(p.url("/old"))).await, 301);
    }
    assert_eq!(
        status(http.get(p.url("/")).basic_auth("u", Some("bad"))).await,
        401
    );
    assert_eq!(
        status(http.get(p.url("/")).basic_auth("u", Some("p"))).await,
        429
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn request_deadline_answers_504_including_holds_and_exempts_streams() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();
    p.deploy("app", &b.target(), &["--request-timeout=400ms"])
        .await;

    // No other timeout is shorter than the 3 s answer: a 504 is the deadline firing.
    let r = http.get(p.url("/slow?ms=3000")).send().await.unwrap();
    assert_eq!(r.status(), 504);
    // The log says which timeout fired.
    p.wait_for_log_after(0, "the request deadline firing", |l| {
        l.contains("Request deadline exceeded")
    })
    .await;
    assert!(!p.logs().iter().any(|l| l.contains("Target timed out")));
    assert_eq!(status(http.get(p.url("/slow?ms=50"))).await, 200);

    // While paused, the hold counts against the deadline; an event stream is exempt and
    // waits for the resume.
    p.ok(&["pause", "app", "--drain-timeout=1s"]).await;
    let held = {
        let http = http.clone();
        let url = p.url("/sse?n=2&interval_ms=50");
        tokio::spawn(async move {
            http.get(url)
                .header("accept", "text/event-stream")
                .send()
                .await
                .map(|r| r.status())
        })
    };
    let from = p.logs().len();
    let started = Instant::now();
    assert_eq!(status(http.get(p.url("/"))).await, 504);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(350), "{waited:?}");
    // The deadline answered it, not the pause's own expiry.
    p.wait_for_log_after(from, "the deadline firing for the held request", |l| {
        l.contains("Request deadline exceeded") && l.contains("\"path\":\"/\"")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.ok(&["resume", "app"]).await;
    assert_eq!(held.await.unwrap().unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn each_gate_uses_the_services_error_pages() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();
    let dir = tempfile::tempdir().unwrap();
    for code in [401, 403, 429, 504] {
        std::fs::write(
            dir.path().join(format!("{code}.html")),
            format!("custom {code}"),
        )
        .unwrap();
    }
    let pages = format!("--error-pages={}", dir.path().display());
    p.deploy(
        "app",
        &b.target(),
        &[
            &pages,
            "--basic-auth=u:p",
            "--rate-limit=0.01",
            "--request-timeout=200ms",
        ],
    )
    .await;
    let r = http.get(p.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    assert_eq!(r.text().await.unwrap(), "custom 401");
    let r = http.get(p.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.text().await.unwrap(), "custom 429");

    p.deploy("app", &b.target(), &[&pages, "--allow-ip=192.0.2.1"])
        .await;
    let r = http.get(p.url("/")).send().await.unwrap();
    assert_eq!(
        (r.status().as_u16(), r.text().await.unwrap()),
        (403, "custom 403".into())
    );

    p.deploy("app", &b.target(), &[&pages, "--request-timeout=200ms"])
        .await;
    let r = http.get(p.url("/slow?ms=2000")).send().await.unwrap();
    assert_eq!(
        (r.status().as_u16(), r.text().await.unwrap()),
        (504, "custom 504".into())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn deploys_with_invalid_gates_are_refused_with_the_forks_messages() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let t = format!("--target={}", b.target());
    let fails = async |extra: &[&str]| {
        let mut args = vec!["deploy", "app", t.as_str()];
        args.extend_from_slice(extra);
        p.fails(&args).await
    };
    let cases: &[(&[&str], &str)] = &[
        (
            &["--trusted-proxy=10.0.0.1"],
            "service options invalid: trusted-proxy requires allow-ip or rate-limit",
        ),
        (
            &["--allow-ip=10.0.0.1", "--client-ip-header=X-Real-IP"],
            "service options invalid: allow-ip with client-ip-header requires trusted-proxy, or the header would be ignored while appearing to be honored",
        ),
        (
            &["--allow-ip=10.0.0.1", "--trusted-proxy=0.0.0.0/0"],
            "service options invalid: trusted-proxy cannot contain a default route (0.0.0.0/0)",
        ),
        (
            &["--allow-ip=10.0.0.300"],
            "service options invalid: allow-ip: \"10.0.0.300\" is not a valid address",
        ),
        (
            &["--rate-limit-burst=5"],
            "service options invalid: rate-limit-burst requires rate-limit",
        ),
        (
            &["--rate-limit=-1"],
            "service options invalid: rate-limit cannot be negative",
        ),
        (
            &["--basic-auth=nocolon"],
            "basic-auth must be given as <username>:<password>",
        ),
        (
            &["--basic-auth=user:"],
            "basic-auth needs both a username and a password",
        ),
        (
            &["--redirect=/x"],
            "service options invalid: redirect must be given as \"<pattern>=<replacement>\", got \"/x\"",
        ),
        (
            &["--rewrite=/x=/y;status=301"],
            "service options invalid: rewrite cannot set a status",
        ),
        (
            &["--redirect=/x=/y;status=200"],
            "service options invalid: redirect status must be one of 301, 302, 303, 307, 308, got 200",
        ),
        (
            &["--basic-auth=u:p", "--health-check-path=/"],
            "service options invalid: health-check-path cannot be \"/\" when basic auth is enabled, as that path is served without credentials",
        ),
        (
            &["--allow-ip=10.0.0.1", "--health-check-path=/"],
            "service options invalid: health-check-path cannot be \"/\" when allow-ip is set, as that path is served without an address check",
        ),
        (
            &["--rate-limit=5", "--health-check-path=/"],
            "service options invalid: health-check-path cannot be \"/\" when rate-limit is set, as that path is served without a rate limit",
        ),
    ];
    for (extra, message) in cases {
        let err = fails(extra).await;
        assert_eq!(err.trim(), format!("Error: {message}"), "{extra:?}");
    }
    assert!(
        !p.ok(&["list"]).await.contains("app"),
        "nothing was deployed"
    );
    // The flags are in --help.
    let help = p.ok(&["deploy", "--help"]).await;
    for flag in [
        "--allow-ip",
        "--trusted-proxy",
        "--rate-limit ",
        "--rate-limit-burst",
        "--rate-limit-exempt",
        "--basic-auth",
        "--redirect",
        "--rewrite",
        "--request-timeout",
        "--canonical-host",
        "--client-ip-header",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn gates_survive_a_restart_and_state_keys_are_the_forks() {
    let b = Backend::start("app").await;
    let mut p = Proxy::start().await;
    let http = client();
    p.deploy(
        "app",
        &b.target(),
        &[
            "--allow-ip=127.0.0.1",
            "--trusted-proxy=10.0.0.1",
            "--rate-limit=0.01",
            "--rate-limit-burst=2",
            "--rate-limit-exempt=192.0.2.1",
            "--redirect=/old=/new",
            "--rewrite=/a=/b",
            "--request-timeout=5s",
        ],
    )
    .await;
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.state_file()).unwrap()).unwrap();
    let o = &state[0]["options"];
    assert_eq!(o["allow_ips"], serde_json::json!(["127.0.0.1"]));
    assert_eq!(o["trusted_proxies"], serde_json::json!(["10.0.0.1"]));
    assert_eq!(o["rate_limit"], 0.01);
    assert_eq!(o["rate_limit_burst"], 2);
    assert_eq!(o["rate_limit_exempt"], serde_json::json!(["192.0.2.1"]));
    assert_eq!(o["redirects"], serde_json::json!(["/old=/new"]));
    assert_eq!(o["rewrites"], serde_json::json!(["/a=/b"]));
    assert_eq!(o["request_timeout"], 5_000_000_000i64);

    p.restart().await;
    assert_eq!(status(http.get(p.url("/old"))).await, 301);
    assert_eq!(status(http.get(p.url("/x"))).await, 200);
    assert_eq!(status(http.get(p.url("/x"))).await, 200);
    assert_eq!(status(http.get(p.url("/x"))).await, 429);
}

#[tokio::test(flavor = "multi_thread")]
async fn method_matters_for_ping_only_on_its_exact_path() {
    let p = Proxy::start().await;
    let r = testkit::send(
        &client(),
        Method::DELETE,
        &p.url("/.kamal-proxy/ping"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 405);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_revalidates_what_a_direct_client_sends() {
    use kamal_proxy::control::{DeployArgs, Request, Response, client::call};
    use kamal_proxy::options::{DeploymentOptions, ServiceOptions, TargetOptions};
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let deploy = |o: ServiceOptions, t: TargetOptions| {
        Request::Deploy(Box::new(DeployArgs {
            service: "app".into(),
            targets: vec![b.target()],
            readers: vec![],
            deployment: DeploymentOptions::default(),
            service_options: o,
            target_options: t,
            sleep_flags: vec![],
        }))
    };
    let err = |r: Result<Response, String>| match r {
        Ok(Response::Error(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    };
    // A plaintext password is not a credential: the server refuses it.
    let o = ServiceOptions {
        basic_auth: "admin:secret".into(),
        ..Default::default()
    };
    assert_eq!(
        err(call(&p.socket(), &deploy(o, TargetOptions::default())).await),
        "service options invalid: basic auth credential is not a sha256 value"
    );
    let o = ServiceOptions {
        allow_ips: vec!["10.0.0.0/8".into()],
        ..Default::default()
    };
    let mut t = TargetOptions::default();
    t.health_check_config.path = "/".into();
    assert_eq!(
        err(call(&p.socket(), &deploy(o, t)).await),
        "service options invalid: health-check-path cannot be \"/\" when allow-ip is set, as that path is served without an address check"
    );
    let o = ServiceOptions {
        redirects: vec!["/(x=/y".into()],
        ..Default::default()
    };
    assert!(
        err(call(&p.socket(), &deploy(o, TargetOptions::default())).await)
            .starts_with("service options invalid: redirect has an invalid pattern \"/(x\": ")
    );
    assert!(!p.ok(&["list"]).await.contains("app"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_deadline_cuts_a_slow_body_off_but_not_an_event_stream() {
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    let http = client();
    p.deploy("app", &b.target(), &["--request-timeout=500ms"])
        .await;

    // Headers in time, body too slow: the body is cut off at the deadline.
    let r = http
        .get(p.url("/drip?n=10&interval_ms=200"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.is_err(), "the body is truncated");

    // A response that turns out to be an event stream stops the deadline.
    let r = http
        .get(p.url("/sse?n=5&interval_ms=200"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap().matches("data: event").count(), 5);

    // Within the deadline, nothing changes.
    let r = http
        .get(p.url("/drip?n=2&interval_ms=50"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap().matches("data: event").count(), 2);

    // A buffered response that is not complete by the deadline is a 504.
    p.deploy(
        "app",
        &b.target(),
        &["--request-timeout=500ms", "--buffer-responses"],
    )
    .await;
    let r = http
        .get(p.url("/drip?n=10&interval_ms=200"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
}

#[tokio::test(flavor = "multi_thread")]
async fn unreadable_stored_gates_fail_closed_after_a_restart() {
    let b = Backend::start("app").await;
    let mut p = Proxy::start().await;
    let http = client();
    p.deploy(
        "app",
        &b.target(),
        &["--allow-ip=127.0.0.1", "--basic-auth=u:p"],
    )
    .await;
    p.deploy("other", &b.target(), &["--host=other.test"]).await;
    assert_eq!(
        status(http.get(p.url("/")).basic_auth("u", Some("p"))).await,
        200
    );

    // A hand-edited state file: the allow list no longer parses.
    p.terminate().await;
    let path = p.state_file();
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for s in state.as_array_mut().unwrap() {
        if s["name"] == "app" {
            s["options"]["allow_ips"] = serde_json::json!(["127.0.0.1/99"]);
        }
    }
    std::fs::write(&path, serde_json::to_vec(&state).unwrap()).unwrap();
    p.restart().await;
    assert_eq!(
        status(http.get(p.url("/")).basic_auth("u", Some("p"))).await,
        403,
        "an unreadable allow list denies everyone"
    );
    assert_eq!(
        status(http.get(p.url("/")).header("host", "other.test")).await,
        200,
        "other services restore as usual"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn websockets_outlive_the_request_deadline() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let b = Backend::start("app").await;
    let p = Proxy::start().await;
    p.deploy("app", &b.target(), &["--request-timeout=300ms"])
        .await;
    // Held by a pause for longer than the deadline: an upgrade is exempt, so it waits.
    p.ok(&["pause", "app", "--drain-timeout=1s"]).await;
    let url = format!("ws://127.0.0.1:{}/ws", p.http_port);
    let handshake = tokio::spawn(tokio_tungstenite::connect_async(url));
    tokio::time::sleep(Duration::from_millis(600)).await;
    p.ok(&["resume", "app"]).await;
    let (mut ws, resp) = handshake.await.unwrap().expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    tokio::time::sleep(Duration::from_millis(700)).await;
    ws.send(Message::text("still here")).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), ws.next())
        .await
        .expect("echo in time");
    assert_eq!(got.unwrap().unwrap(), Message::text("still here"));
}
