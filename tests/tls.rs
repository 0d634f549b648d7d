//! HTTPS without an ACME server: custom certificates chosen by SNI, HTTP/2 by ALPN, the
//! HTTP → HTTPS redirect, the TLS mismatch, TLS inherited by path-prefix services, deploy
//! errors, and HTTP/3.

use std::net::SocketAddr;
use testkit::pebble::self_signed;
use testkit::{Proxy, backend::Backend};

fn https_client(cert_pem: &str, host: &str, port: u16) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .tls_certs_only([reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap()])
        .tls_info(true)
        .resolve(host, SocketAddr::from(([127, 0, 0, 1], port)))
}

fn peer_certificate(resp: &reqwest::Response) -> Vec<u8> {
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .map(<[u8]>::to_vec)
        .expect("peer certificate")
}

fn pem_der(pem: &str) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn custom_certificate_served_over_h2_with_redirect_and_reload_on_redeploy() {
    let backend = Backend::start("one").await;
    let proxy = Proxy::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path(), "site", &["custom.test"]);
    let cert_flag = format!("--tls-certificate-path={}", cert.display());
    let key_flag = format!("--tls-private-key-path={}", key.display());
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--host=custom.test", "--tls", &cert_flag, &key_flag],
        )
        .await;

    let client = https_client(&pem, "custom.test", proxy.https_port)
        .build()
        .unwrap();
    let url = format!("https://custom.test:{}/hello", proxy.https_port);
    let resp = client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), reqwest::Version::HTTP_2, "h2 by ALPN");
    assert_eq!(peer_certificate(&resp), pem_der(&pem));
    assert!(
        resp.headers().get("alt-svc").is_none(),
        "no Alt-Svc without --http3"
    );
    assert_eq!(resp.text().await.unwrap(), "one");

    let h1 = https_client(&pem, "custom.test", proxy.https_port)
        .http1_only()
        .build()
        .unwrap();
    let resp = h1.get(&url).send().await.unwrap();
    assert_eq!(resp.version(), reqwest::Version::HTTP_11);
    assert_eq!(resp.status(), 200);

    // Access lines reach the log within 100 ms of the request (a worker's batch).
    let line: serde_json::Value = serde_json::from_str(
        &proxy
            .wait_for_log("the h2 access line", |l| {
                l.contains("\"msg\":\"Request\"") && l.contains("\"proto\":\"HTTP/2.0\"")
            })
            .await,
    )
    .expect("JSON");
    assert_eq!(line["scheme"], "https");
    assert_eq!(line["service"], "app");

    // Plain HTTP is redirected, port dropped, path and query kept.
    let r = proxy.get("custom.test", "/a/b?x=1").await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), "https://custom.test/a/b?x=1");
    assert_eq!(proxy.list_rows().await[0][5], "yes");

    // The files are read again on redeploy.
    let (_, _, pem2) = self_signed(dir.path(), "site", &["custom.test"]);
    proxy
        .deploy(
            "app",
            &backend.target(),
            &["--host=custom.test", "--tls", &cert_flag, &key_flag],
        )
        .await;
    let client2 = https_client(&pem2, "custom.test", proxy.https_port)
        .build()
        .unwrap();
    let resp = client2.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(peer_certificate(&resp), pem_der(&pem2));

    // --tls-redirect=false serves both schemes.
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--host=custom.test",
                "--tls",
                "--tls-redirect=false",
                &cert_flag,
                &key_flag,
            ],
        )
        .await;
    assert_eq!(proxy.get("custom.test", "/").await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_mismatch_unknown_names_and_inherited_settings() {
    let web = Backend::start("web").await;
    let api = Backend::start("api").await;
    let plain = Backend::start("plain").await;
    let proxy = Proxy::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path(), "site", &["custom.test"]);
    let cert_flag = format!("--tls-certificate-path={}", cert.display());
    let key_flag = format!("--tls-private-key-path={}", key.display());
    proxy
        .deploy(
            "web",
            &web.target(),
            &["--host=custom.test", "--tls", &cert_flag, &key_flag],
        )
        .await;
    proxy
        .deploy(
            "api",
            &api.target(),
            &["--host=custom.test", "--path-prefix=/api"],
        )
        .await;
    proxy
        .deploy("plain", &plain.target(), &["--host=plain.test"])
        .await;

    let client = https_client(&pem, "custom.test", proxy.https_port)
        .http1_only()
        .build()
        .unwrap();
    let base = format!("https://custom.test:{}", proxy.https_port);

    // The path-prefix service inherits TLS from the root service of its host.
    let resp = client.get(format!("{base}/api/x")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "api");
    let r = proxy.get("custom.test", "/api/x").await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), "https://custom.test/api/x");
    let rows = proxy.list_rows().await;
    let api_row = rows.iter().find(|r| r[0] == "api").unwrap();
    assert_eq!(api_row[5], "yes");

    // SNI picks a TLS service but the Host routes to a non-TLS one: 503.
    let resp = client
        .get(format!("{base}/"))
        .header("host", "plain.test")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(plain.hits(), 0);

    // A name no TLS service answers for fails the handshake.
    let other = https_client(&pem, "plain.test", proxy.https_port)
        .build()
        .unwrap();
    let err = other
        .get(format!("https://plain.test:{}/", proxy.https_port))
        .send()
        .await;
    assert!(err.is_err(), "handshake for a non-TLS host must fail");

    // Inherited settings are saved and survive a restart, even under a wildcard host.
    let mut proxy = proxy;
    proxy.restart().await;
    let rows = proxy.list_rows().await;
    assert_eq!(rows.len(), 3, "{rows:?}");
    let client = https_client(&pem, "custom.test", proxy.https_port)
        .http1_only()
        .build()
        .unwrap();
    let base = format!("https://custom.test:{}", proxy.https_port);
    let resp = client.get(format!("{base}/api/x")).send().await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "api");

    // After removing the root service, the prefix service falls back to no TLS.
    proxy.ok(&["remove", "web"]).await;
    let rows = proxy.list_rows().await;
    let api_row = rows.iter().find(|r| r[0] == "api").unwrap();
    assert_eq!(api_row[5], "no");
    assert_eq!(proxy.get("custom.test", "/api/x").await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_http_to_the_https_port_gets_go_s_400() {
    let proxy = Proxy::start().await;
    let r = testkit::client()
        .get(format!("http://127.0.0.1:{}/", proxy.https_port))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.text().await.unwrap(),
        "Client sent an HTTP request to an HTTPS server.\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn certificate_deploy_errors_as_upstream() {
    let backend = Backend::start("one").await;
    let proxy = Proxy::start().await;
    let target = format!("--target={}", backend.target());
    let err = proxy
        .fails(&[
            "deploy",
            "app",
            &target,
            "--host=a.test",
            "--tls",
            "--tls-certificate-path=/nonexistent/cert.pem",
            "--tls-private-key-path=/nonexistent/key.pem",
        ])
        .await;
    assert_eq!(err, "Error: unable to load certificate\n");
    let err = proxy
        .fails(&[
            "deploy",
            "app",
            &target,
            "--host=a.test",
            "--tls",
            "--tls-certificate-path=/x/cert.pem",
        ])
        .await;
    assert_eq!(
        err,
        "Error: if any flags in the group [tls-certificate-path tls-private-key-path] are set they must all be set; missing [tls-private-key-path]\n"
    );
    let err = proxy
        .fails(&["deploy", "app", &target, "--host=*.a.test", "--tls"])
        .await;
    assert_eq!(err, "Error: automatic TLS does not support wildcards\n");

    // A mismatched key is refused too; nothing was deployed.
    let dir = tempfile::tempdir().unwrap();
    let (cert, _, _) = self_signed(dir.path(), "one", &["a.test"]);
    let (_, other_key, _) = self_signed(dir.path(), "two", &["a.test"]);
    let err = proxy
        .fails(&[
            "deploy",
            "app",
            &target,
            "--host=a.test",
            "--tls",
            &format!("--tls-certificate-path={}", cert.display()),
            &format!("--tls-private-key-path={}", other_key.display()),
        ])
        .await;
    assert_eq!(err, "Error: unable to load certificate\n");
    assert!(proxy.list_rows().await.is_empty());

    // Wildcards are fine with a custom certificate.
    let (cert, key, _) = self_signed(dir.path(), "wild", &["*.a.test"]);
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--host=*.a.test",
                "--tls",
                &format!("--tls-certificate-path={}", cert.display()),
                &format!("--tls-private-key-path={}", key.display()),
            ],
        )
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn handshake_without_sni_uses_the_default_tls_hostname() {
    let backend = Backend::start("one").await;
    let proxy = Proxy::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path(), "site", &["custom.test"]);
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--host=custom.test",
                "--tls",
                &format!("--tls-certificate-path={}", cert.display()),
                &format!("--tls-private-key-path={}", key.display()),
            ],
        )
        .await;
    // An IP address is never sent as SNI. HTTP/1.1, so that `Host` names the service (over
    // HTTP/2 a `host` contradicting `:authority` is a 400).
    let client = reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .danger_accept_invalid_certs(true)
        .tls_info(true)
        .build()
        .unwrap();
    let resp = client
        .get(format!("https://127.0.0.1:{}/", proxy.https_port))
        .header("host", "custom.test")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(peer_certificate(&resp), pem_der(&pem));
    proxy
        .wait_for_log("No server name; using default TLS hostname", |l| {
            l.contains("No server name; using default TLS hostname")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cipher_suites_are_chosen_in_go_s_order_and_by_go_s_rule_for_chacha20() {
    use rustls::CipherSuite;
    use rustls::crypto::aws_lc_rs::cipher_suite::*;
    use rustls::version::{TLS12, TLS13};
    use testkit::tls::negotiated_suite;
    let backend = Backend::start("one").await;
    let proxy = Proxy::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path(), "site", &["suites.test"]);
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--host=suites.test",
                "--tls",
                &format!("--tls-certificate-path={}", cert.display()),
                &format!("--tls-private-key-path={}", key.display()),
            ],
        )
        .await;
    let port = proxy.https_port;
    let suite = |suites, version| negotiated_suite(port, &pem, "suites.test", suites, version);
    // OpenSSL's order (AES-256 first), as curl, wrk and most servers' HTTP clients send it.
    let openssl13 = [
        TLS13_AES_256_GCM_SHA384,
        TLS13_CHACHA20_POLY1305_SHA256,
        TLS13_AES_128_GCM_SHA256,
    ];
    let openssl12 = [
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ];
    // A client that lists ChaCha20 before AES-GCM (a device without AES instructions) gets
    // ChaCha20, as Go's `aesgcmPreferred` decides.
    let chacha13 = [
        TLS13_CHACHA20_POLY1305_SHA256,
        TLS13_AES_256_GCM_SHA384,
        TLS13_AES_128_GCM_SHA256,
    ];
    let chacha12 = [
        TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ];
    let cases = [
        (&openssl13, &TLS13, CipherSuite::TLS13_AES_128_GCM_SHA256),
        (
            &openssl12,
            &TLS12,
            CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            &chacha13,
            &TLS13,
            CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
        ),
        (
            &chacha12,
            &TLS12,
            CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
    ];
    for (offered, version, chosen) in cases {
        assert_eq!(suite(offered, version).await, chosen, "{offered:?}");
    }
    // A client without AES-128 still gets what it offers, next in our order.
    assert_eq!(
        suite(&openssl13[..2], &TLS13).await,
        CipherSuite::TLS13_AES_256_GCM_SHA384
    );
    assert_eq!(
        suite(&[TLS13_CHACHA20_POLY1305_SHA256], &TLS13).await,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
    );
}

/// A client resumes its TLS 1.3 session on its next connection, and each handshake, full
/// or resumed, sends it one ticket (Go's server sends one; rustls's default is two, and the
/// second costs both sides work on every new connection).
#[tokio::test(flavor = "multi_thread")]
async fn tls13_sessions_resume_with_one_ticket_a_handshake() {
    use rustls::HandshakeKind;
    use std::sync::Arc;
    use testkit::tls::{CountingSessions, get_over_tls, resuming_client};
    let backend = Backend::start("one").await;
    let proxy = Proxy::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path(), "site", &["resume.test"]);
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--host=resume.test",
                "--tls",
                &format!("--tls-certificate-path={}", cert.display()),
                &format!("--tls-private-key-path={}", key.display()),
            ],
        )
        .await;
    let sessions = Arc::new(CountingSessions::default());
    let client = resuming_client(&pem, sessions.clone());
    let get = || get_over_tls(proxy.https_port, client.clone(), "resume.test");
    let (kind, response) = get().await;
    assert_eq!(kind, HandshakeKind::Full);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(sessions.tickets(), 1, "tickets after a full handshake");
    for resumed in 1..=3 {
        let (kind, response) = get().await;
        assert_eq!(kind, HandshakeKind::Resumed, "connection {}", resumed + 1);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("one"), "{response}");
        assert_eq!(
            sessions.tickets(),
            1 + resumed,
            "tickets after {resumed} resumed"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_services_survive_a_restart() {
    let backend = Backend::start("one").await;
    let mut proxy = Proxy::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path(), "site", &["custom.test"]);
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--host=custom.test",
                "--tls",
                &format!("--tls-certificate-path={}", cert.display()),
                &format!("--tls-private-key-path={}", key.display()),
            ],
        )
        .await;
    proxy.restart().await;
    let client = https_client(&pem, "custom.test", proxy.https_port)
        .build()
        .unwrap();
    let resp = client
        .get(format!("https://custom.test:{}/", proxy.https_port))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(proxy.get("custom.test", "/").await.status, 301);
    assert_eq!(proxy.list_rows().await[0][5], "yes");
}

#[cfg(feature = "http3")]
#[tokio::test(flavor = "multi_thread")]
async fn http3_request_succeeds_and_alt_svc_is_advertised() {
    use bytes::Buf;
    let backend = Backend::start("one").await;
    // HTTP/3 needs the UDP port to match the TCP one: pick it up front.
    let port = testkit::free_port();
    let proxy = Proxy::start_with(&["--http3", &format!("--https-port={port}")], &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path(), "site", &["custom.test"]);
    proxy
        .deploy(
            "app",
            &backend.target(),
            &[
                "--host=custom.test",
                "--tls",
                &format!("--tls-certificate-path={}", cert.display()),
                &format!("--tls-private-key-path={}", key.display()),
            ],
        )
        .await;

    let client = https_client(&pem, "custom.test", port).build().unwrap();
    let resp = client
        .get(format!("https://custom.test:{port}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers().get("alt-svc").unwrap(),
        &format!("h3=\":{port}\"; ma=2592000")
    );

    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from(pem_der(&pem)))
        .unwrap();
    let mut tls = rustls::ClientConfig::builder_with_protocol_versions(&[&rustls::version::TLS13])
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(std::sync::Arc::new(quic)));
    let conn = endpoint
        .connect(SocketAddr::from(([127, 0, 0, 1], port)), "custom.test")
        .unwrap()
        .await
        .expect("QUIC handshake");
    let (mut driver, mut send_request) = h3::client::new(h3_quinn::Connection::new(conn))
        .await
        .unwrap();
    let drive = tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    let req = http::Request::get(format!("https://custom.test:{port}/echo"))
        .body(())
        .unwrap();
    let mut stream = send_request.send_request(req).await.unwrap();
    stream.finish().await.unwrap();
    let resp = stream.recv_response().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("alt-svc").is_none());
    let mut body = Vec::new();
    while let Some(mut chunk) = stream.recv_data().await.unwrap() {
        body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
    }
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(echo["method"], "GET");
    assert_eq!(echo["headers"]["x-forwarded-proto"], "https");
    drop(send_request);
    drive.abort();

    proxy
        .wait_for_log("\"proto\":\"HTTP/3.0\"", |l| {
            l.contains("\"proto\":\"HTTP/3.0\"")
                && l.contains("\"status\":200")
                && l.contains("\"scheme\":\"https\"")
        })
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn prefix_service_under_a_wildcard_tls_host_survives_a_restart() {
    let web = Backend::start("web").await;
    let api = Backend::start("api").await;
    let mut proxy = Proxy::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, pem) = self_signed(dir.path(), "wild", &["*.wild.test"]);
    proxy
        .deploy(
            "web",
            &web.target(),
            &[
                "--host=*.wild.test",
                "--tls",
                &format!("--tls-certificate-path={}", cert.display()),
                &format!("--tls-private-key-path={}", key.display()),
            ],
        )
        .await;
    proxy
        .deploy(
            "api",
            &api.target(),
            &["--host=*.wild.test", "--path-prefix=/api"],
        )
        .await;
    proxy.restart().await;
    assert_eq!(
        proxy.list_rows().await.len(),
        2,
        "{}",
        proxy.logs().join("\n")
    );
    let client = https_client(&pem, "a.wild.test", proxy.https_port)
        .build()
        .unwrap();
    let resp = client
        .get(format!("https://a.wild.test:{}/api/x", proxy.https_port))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "api");
}
