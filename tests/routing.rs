//! The routing matrix (upstream §3.1–3.3): which service answers a request, by host and
//! path prefix, and what the target sees.

use testkit::{Proxy, backend::Backend};

const PAGE_404_TEXT: &str = "The page you were looking for doesn’t exist.";

fn assert_404_page(r: &testkit::Reply) {
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.header("content-type"), "text/html; charset=utf-8");
    assert!(
        r.body.contains(PAGE_404_TEXT),
        "built-in 404 page expected: {}",
        r.body
    );
    assert_eq!(
        r.header("x-backend"),
        "",
        "a 404 must not come from a backend"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exact_host_matches_with_or_without_port() {
    let app = Backend::start("app").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("app", &app.target(), &["--host=app.example.com"])
        .await;

    let r = proxy.get("app.example.com", "/").await;
    assert_eq!((r.status, r.body.as_str()), (200, "app"));
    let r = proxy.get("app.example.com:8080", "/").await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (200, "app"),
        "the port in Host is ignored"
    );

    assert_404_page(&proxy.get("other.example.com", "/").await);
    assert_404_page(&proxy.get("example.com", "/").await);
    // No Host override: reqwest sends 127.0.0.1:<port>, which is not app.example.com.
    assert_404_page(&proxy.get("", "/").await);
}

#[tokio::test(flavor = "multi_thread")]
async fn wildcard_host_matches_one_level_only() {
    let wild = Backend::start("wild").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("wild", &wild.target(), &["--host=*.example.com"])
        .await;

    for host in ["a.example.com", "www.example.com", "a.example.com:3000"] {
        let r = proxy.get(host, "/").await;
        assert_eq!((r.status, r.body.as_str()), (200, "wild"), "host {host}");
    }
    for host in ["example.com", "a.b.example.com", "a.example.org"] {
        assert_404_page(&proxy.get(host, "/").await);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_service_catches_unknown_hosts() {
    let fallback = Backend::start("fallback").await;
    let proxy = Proxy::start().await;
    proxy.deploy("fallback", &fallback.target(), &[]).await;

    for host in ["", "anything.test", "a.b.c.example.com", "10.0.0.1:81"] {
        let r = proxy.get(host, "/some/path").await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (200, "fallback"),
            "host {host:?}"
        );
    }
    let rows = proxy.list_rows().await;
    assert_eq!(
        rows[0][1], "*",
        "a host-less service lists its host as *: {rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exact_beats_wildcard_beats_default() {
    let exact = Backend::start("exact").await;
    let wild = Backend::start("wild").await;
    let fallback = Backend::start("fallback").await;
    let proxy = Proxy::start().await;
    proxy.deploy("fallback", &fallback.target(), &[]).await;
    proxy
        .deploy("wild", &wild.target(), &["--host=*.example.com"])
        .await;
    proxy
        .deploy("exact", &exact.target(), &["--host=www.example.com"])
        .await;

    let cases = [
        ("www.example.com", "exact"),
        ("api.example.com", "wild"),
        ("example.com", "fallback"),
        ("a.b.example.com", "fallback"),
        ("other.test", "fallback"),
    ];
    for (host, expected) in cases {
        let r = proxy.get(host, "/").await;
        assert_eq!((r.status, r.body.as_str()), (200, expected), "host {host}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn path_miss_does_not_fall_through_to_wildcard_or_default() {
    let api = Backend::start("api").await;
    let wild_api = Backend::start("wild-api").await;
    let wild = Backend::start("wild").await;
    let fallback = Backend::start("fallback").await;
    let proxy = Proxy::start().await;
    proxy.deploy("fallback", &fallback.target(), &[]).await;
    proxy
        .deploy("wild", &wild.target(), &["--host=*.example.com"])
        .await;
    proxy
        .deploy(
            "api",
            &api.target(),
            &["--host=app.example.com", "--path-prefix=/api"],
        )
        .await;
    proxy
        .deploy(
            "wild-api",
            &wild_api.target(),
            &["--host=*.test", "--path-prefix=/api"],
        )
        .await;

    let r = proxy.get("app.example.com", "/api/x").await;
    assert_eq!((r.status, r.body.as_str()), (200, "api"));
    // The exact host entry exists, so neither the wildcard nor the default is consulted.
    assert_404_page(&proxy.get("app.example.com", "/").await);
    assert_404_page(&proxy.get("app.example.com", "/other").await);
    // Same for a wildcard entry without a root binding.
    let r = proxy.get("x.test", "/api").await;
    assert_eq!((r.status, r.body.as_str()), (200, "wild-api"));
    assert_404_page(&proxy.get("x.test", "/").await);
    // Hosts without their own entry still reach the wildcard and the default.
    assert_eq!(proxy.get("b.example.com", "/other").await.body, "wild");
    assert_eq!(proxy.get("unknown.host", "/other").await.body, "fallback");
}

#[tokio::test(flavor = "multi_thread")]
async fn longest_prefix_wins_on_segment_boundaries() {
    let root = Backend::start("root").await;
    let api = Backend::start("api").await;
    let v2 = Backend::start("v2").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("root", &root.target(), &["--host=example.com"])
        .await;
    proxy
        .deploy(
            "api",
            &api.target(),
            &["--host=example.com", "--path-prefix=/api"],
        )
        .await;
    proxy
        .deploy(
            "v2",
            &v2.target(),
            &["--host=example.com", "--path-prefix=api/v2/"],
        )
        .await;

    let cases = [
        ("/", "root"),
        ("/index.html", "root"),
        ("/api", "api"),
        ("/api/", "api"),
        ("/api/users", "api"),
        ("/api/v3/users", "api"),
        ("/api/v2", "v2"),
        ("/api/v2/", "v2"),
        ("/api/v2/users/1", "v2"),
        ("/apiary", "root"),
        ("/api-docs", "root"),
        ("/api/v22", "api"),
        ("/API", "root"),
    ];
    for (path, expected) in cases {
        let r = proxy.get("example.com", path).await;
        assert_eq!((r.status, r.body.as_str()), (200, expected), "path {path}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prefix_is_stripped_by_default_and_query_preserved() {
    let api = Backend::start("api").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("api", &api.target(), &["--path-prefix=/api"])
        .await;

    let cases = [
        ("/api", "/"),
        ("/api/", "/"),
        ("/api/users/1", "/users/1"),
        ("/api/users/?page=2&sort=-name", "/users/?page=2&sort=-name"),
        ("/api?x=1", "/?x=1"),
        (
            "/api/search?q=a%20b&empty=&flag",
            "/search?q=a%20b&empty=&flag",
        ),
    ];
    for (path, upstream) in cases {
        let r = proxy.get("", path).await;
        assert_eq!(r.status, 200, "path {path}");
        assert_eq!(r.header("x-uri"), upstream, "path {path}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prefix_is_kept_with_strip_path_prefix_false() {
    let api = Backend::start("api").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "api",
            &api.target(),
            &["--path-prefix=/api", "--strip-path-prefix=false"],
        )
        .await;

    for path in ["/api", "/api/", "/api/users/1", "/api/search?q=a%20b&flag"] {
        let r = proxy.get("", path).await;
        assert_eq!(r.status, 200, "path {path}");
        assert_eq!(r.header("x-uri"), path, "the full path is forwarded");
    }
    assert_404_page(&proxy.get("", "/other").await);
}

#[tokio::test(flavor = "multi_thread")]
async fn several_hosts_and_prefixes_route_every_combination() {
    let multi = Backend::start("multi").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy(
            "multi",
            &multi.target(),
            &[
                "--host=a.test,b.test",
                "--host=c.test",
                "--path-prefix=/one",
                "--path-prefix=/two",
            ],
        )
        .await;

    for host in ["a.test", "b.test", "c.test"] {
        for (path, upstream) in [("/one/x", "/x"), ("/two", "/")] {
            let r = proxy.get(host, path).await;
            assert_eq!((r.status, r.body.as_str()), (200, "multi"), "{host}{path}");
            assert_eq!(r.header("x-uri"), upstream, "{host}{path}");
        }
        assert_404_page(&proxy.get(host, "/three").await);
        assert_404_page(&proxy.get(host, "/").await);
    }
    assert_404_page(&proxy.get("d.test", "/one").await);

    let rows = proxy.list_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][1], "a.test,b.test,c.test");
    assert_eq!(rows[0][2], "/one,/two");
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_deployed_answers_the_builtin_404_page() {
    let proxy = Proxy::start().await;
    for (host, path) in [("", "/"), ("example.com", "/x/y?z=1")] {
        let r = proxy.get(host, path).await;
        assert_404_page(&r);
        assert!(
            r.body.contains("<title>404 — Not Found</title>"),
            "{}",
            r.body
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn host_conflict_is_refused_and_changes_nothing() {
    let first = Backend::start("first").await;
    let second = Backend::start("second").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("first", &first.target(), &["--host=app.test,www.app.test"])
        .await;
    let state_before = std::fs::read_to_string(proxy.state_file()).unwrap();
    let list_before = proxy.ok(&["list"]).await;

    let conflicting: [&[&str]; 3] = [
        &["--host=app.test"],
        &["--host=other.test,www.app.test"],
        &["--host=www.app.test", "--path-prefix=/"],
    ];
    for flags in conflicting {
        let target = format!("--target={}", second.target());
        let mut args = vec!["deploy", "second", target.as_str(), "--deploy-timeout=5s"];
        args.extend_from_slice(flags);
        let stderr = proxy.fails(&args).await;
        assert_eq!(
            stderr, "Error: host settings conflict with another service\n",
            "{flags:?}"
        );
    }
    assert_eq!(proxy.ok(&["list"]).await, list_before);
    assert_eq!(
        std::fs::read_to_string(proxy.state_file()).unwrap(),
        state_before
    );
    assert_eq!(proxy.get("app.test", "/").await.body, "first");
    assert_eq!(proxy.get("www.app.test", "/").await.body, "first");
    assert_404_page(&proxy.get("other.test", "/").await);

    // The same host under a different prefix is not a conflict.
    proxy
        .deploy(
            "second",
            &second.target(),
            &["--host=app.test", "--path-prefix=/admin"],
        )
        .await;
    assert_eq!(proxy.get("app.test", "/admin/x").await.body, "second");
    assert_eq!(proxy.get("app.test", "/x").await.body, "first");
}

#[tokio::test(flavor = "multi_thread")]
async fn hostless_services_conflict_only_on_the_same_prefix() {
    let first = Backend::start("first").await;
    let second = Backend::start("second").await;
    let proxy = Proxy::start().await;
    proxy.deploy("first", &first.target(), &[]).await;
    let target = format!("--target={}", second.target());
    let stderr = proxy
        .fails(&["deploy", "second", &target, "--deploy-timeout=5s"])
        .await;
    assert_eq!(
        stderr,
        "Error: host settings conflict with another service\n"
    );
    assert_eq!(proxy.list_rows().await.len(), 1);

    proxy
        .deploy("second", &second.target(), &["--path-prefix=/second"])
        .await;
    assert_eq!(proxy.get("any.test", "/second").await.body, "second");
    assert_eq!(proxy.get("any.test", "/").await.body, "first");
    // A wildcard and an exact host never conflict with the default host.
    proxy
        .deploy("wild", &second.target(), &["--host=*.test"])
        .await;
    proxy
        .deploy("exact", &second.target(), &["--host=a.test"])
        .await;
    assert_eq!(proxy.list_rows().await.len(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn redeploy_with_changed_hosts_moves_traffic() {
    let v1 = Backend::start("v1").await;
    let v2 = Backend::start("v2").await;
    let other = Backend::start("other").await;
    let proxy = Proxy::start().await;
    proxy
        .deploy("app", &v1.target(), &["--host=old.test"])
        .await;
    assert_eq!(proxy.get("old.test", "/").await.body, "v1");

    proxy
        .deploy("app", &v2.target(), &["--host=new.test"])
        .await;
    assert_eq!(proxy.get("new.test", "/").await.body, "v2");
    assert_404_page(&proxy.get("old.test", "/").await);
    let rows = proxy.list_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][1], "new.test");

    // The released host can be taken by another service.
    proxy
        .deploy("other", &other.target(), &["--host=old.test"])
        .await;
    assert_eq!(proxy.get("old.test", "/").await.body, "other");

    // Redeploying under the same name with overlapping hosts is not a conflict.
    proxy
        .deploy("app", &v1.target(), &["--host=new.test,newer.test"])
        .await;
    assert_eq!(proxy.get("new.test", "/").await.body, "v1");
    assert_eq!(proxy.get("newer.test", "/").await.body, "v1");
}
