//! The image under Kamal 2.12: the image `scripts/image` builds, driven by Kamal's own command
//! lines on the real Docker engine — `kamal proxy boot`/`reboot`, app and accessory deploys
//! through `docker exec kamal-proxy kamal-proxy …`, maintenance, custom certificates from
//! `.apps-config`, and scale-to-zero with the Docker socket mounted through
//! `proxy.run.options` while the proxy runs as the image's non-root user.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use testkit::docker;
use testkit::kamal::{self, APPS_CONFIG, App, CONFIG_DIR, Deploy, KamalHost};
use testkit::{client, poll_until, send};
use tokio::time::Instant;

const APP_HOST: &str = "app.example.com";
const ACCESSORY_HOST: &str = "busybox.example.com";
/// Generous: a wake or a sleep on a loaded CI machine; never an assertion on speed.
const PATIENCE: Duration = Duration::from_secs(60);

/// A booted server, or `None` (skip) when no engine answers off CI.
async fn booted(run_options: &[(&str, &str)]) -> Option<KamalHost> {
    if !docker::require_docker() {
        return None;
    }
    let mut host = KamalHost::new(run_options);
    host.boot().await;
    Some(host)
}

/// `GET path` with a `Host` header through the published HTTP port.
async fn get(host: &KamalHost, name: &str, path: &str) -> testkit::Reply {
    send(&client(), reqwest::Method::GET, &host.url(path), Some(name))
        .await
        .unwrap_or_else(|e| panic!("GET {path} (host {name}) failed: {e}\n{}", host.logs()))
}

#[test]
fn kamal_s_quoting_reaches_the_proxy_as_the_intended_argv() {
    // `Kamal::Utils.escape_shell_value`, as the lines above use it.
    assert_eq!(
        kamal::flag("message", "Back soon"),
        r#"--message="Back soon""#
    );
    assert_eq!(kamal::escape(r#"a"b\c`d$e${F}"#), r#""a\"b\\c\`d\$e${F}""#);
    let line = format!(
        "printf '%s\\0' deploy app-web {} {} {}",
        kamal::flag("target", "a1b2c3d4e5f6:80"),
        kamal::flag("message", r#"it's "down" for $5 `now`"#),
        kamal::flag("buffer-requests", "false"),
    );
    let out = kamal::sh(std::path::Path::new("/"), &line);
    let argv: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(
        argv,
        [
            "deploy",
            "app-web",
            "--target=a1b2c3d4e5f6:80",
            r#"--message=it's "down" for $5 `now`"#,
            "--buffer-requests=false",
        ]
    );
}

/// The tag `scripts/image` gives the image, derived as it derives it: `v` and the first
/// `version = "…"` line of Cargo.toml.
fn image_tag_from_cargo_toml() -> String {
    let manifest = testkit::workspace_root().join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("version = \"")?.strip_suffix('"'))
        .unwrap_or_else(|| panic!("no version line in {}", manifest.display()));
    format!("v{version}")
}

/// No engine needed: the tag the image will carry satisfies Kamal 2.12 (`Gem::Version`,
/// MINIMUM_VERSION v0.9.2) and the fork's Kamal (v1.0.0.0), and the comparison refuses
/// what Kamal refuses.
#[test]
fn the_image_tag_satisfies_kamal_and_the_fork() {
    let tag = image_tag_from_cargo_toml();
    assert_eq!(tag, format!("v{}", env!("CARGO_PKG_VERSION")));
    assert_eq!(kamal::tag_at_least(&tag, "v0.9.2"), Some(true), "{tag}");
    assert_eq!(kamal::tag_at_least(&tag, "v1.0.0.0"), Some(true), "{tag}");
    // The comparison itself.
    assert_eq!(kamal::tag_at_least("v0.9.2", "v0.9.2"), Some(true));
    assert_eq!(kamal::tag_at_least("v0.9.1", "v0.9.2"), Some(false));
    assert_eq!(kamal::tag_at_least("v0.10.0", "v0.9.2"), Some(true));
    assert_eq!(kamal::tag_at_least("v1.0.0", "v1.0.0.0"), Some(true));
    assert_eq!(kamal::tag_at_least("v0.9.9.9", "v1.0.0.0"), Some(false));
    assert_eq!(kamal::tag_at_least("v1.0.0-rust", "v0.9.2"), None);
    assert_eq!(kamal::tag_at_least("latest", "v0.9.2"), None);
}

#[test]
fn the_image_follows_upstream() {
    if !docker::require_docker() {
        return;
    }
    let image = kamal::image();
    let tag = image.rsplit(':').next().unwrap_or_default();
    assert_eq!(tag, image_tag_from_cargo_toml());

    let inspect = |format: &str| {
        let out = std::process::Command::new("docker")
            .args(["image", "inspect", "--format", format, &image])
            .output()
            .expect("docker image inspect");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(
        inspect("{{index .Config.Labels \"org.opencontainers.image.title\"}}"),
        "kamal-proxy"
    );
    assert_eq!(inspect("{{.Config.User}}"), "kamal-proxy");
    assert_eq!(inspect("{{json .Config.Cmd}}"), r#"["kamal-proxy","run"]"#);
    assert_eq!(
        inspect("{{json .Config.ExposedPorts}}"),
        r#"{"443/tcp":{},"80/tcp":{}}"#
    );
    let env = inspect("{{json .Config.Env}}");
    assert!(env.contains("\"HOME=/home/kamal-proxy\""), "{env}");
    let size: u64 = inspect("{{.Size}}").parse().expect("size");
    eprintln!("image {image}: {size} bytes");

    // The files, owners and modes a container starts with (docker export of a created one).
    let name = format!("kamal-proxy-files-{}", std::process::id());
    let created = std::process::Command::new("docker")
        .args([
            "create",
            "--label",
            docker::TEST_LABEL,
            "--name",
            &name,
            &image,
        ])
        .output()
        .expect("docker create");
    assert!(created.status.success());
    let listing = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "docker export {name} | tar -tv --numeric-owner -f -"
        ))
        .output()
        .expect("docker export");
    docker::remove(&name);
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let entry = |path: &str| {
        listing
            .lines()
            .find(|l| l.split_whitespace().last() == Some(path))
            .unwrap_or_else(|| panic!("{path} missing from the image:\n{listing}"))
            .to_owned()
    };
    let data_dir = entry("home/kamal-proxy/.config/kamal-proxy/");
    assert!(data_dir.starts_with("drwx------ 1001/1001"), "{data_dir}");
    assert!(entry("home/kamal-proxy/").starts_with("drwxr-xr-x 1001/1001"));
    assert!(entry("home/").starts_with("drwxr-xr-x 0/0"));
    assert!(entry("tmp/").starts_with("drwxrwxrwt"), "{}", entry("tmp/"));
    assert!(entry("usr/local/bin/kamal-proxy").starts_with("-rwxr-xr-x 0/0"));
    entry("etc/ssl/certs/ca-certificates.crt");
    entry("etc/nsswitch.conf");
    assert!(entry("etc/passwd").starts_with("-rw-r--r--"));
}

#[tokio::test(flavor = "multi_thread")]
async fn boot_deploy_an_app_and_an_accessory_then_remove_them() {
    let Some(host) = booted(&[]).await else {
        return;
    };
    // What `kamal proxy boot` checks next: the version from the image tag.
    let version = host.run_ok(&format!(
        "docker inspect {} --format '{{{{.Config.Image}}}}' | awk -F: '{{print $NF}}'",
        host.proxy
    ));
    assert_eq!(version.trim(), format!("v{}", env!("CARGO_PKG_VERSION")));
    // Kamal's own integration suite greps a fresh boot's log for this.
    host.wait_for_log(&["No previous state to restore"], PATIENCE)
        .await;
    // The server runs as the image's user, not root.
    let top = host.run_ok(&format!("docker top {} -o pid,uid,args", host.proxy));
    assert!(
        top.lines()
            .any(|l| l.contains("1001") && l.contains("kamal-proxy run")),
        "{top}"
    );

    let web = host.app("app-web", "v1", "web-v1", &[]);
    host.deploy(&Deploy::new("app-web", &web.target(), APP_HOST));
    let busybox = host.app("custom-busybox", "v1", "accessory", &[]);
    host.deploy(&Deploy::new(
        "custom-busybox",
        &busybox.target(),
        ACCESSORY_HOST,
    ));

    let r = get(&host, APP_HOST, "/").await;
    assert_eq!((r.status, r.body.trim()), (200, "web-v1"));
    let r = get(&host, ACCESSORY_HOST, "/").await;
    assert_eq!((r.status, r.body.trim()), (200, "accessory"));
    assert_eq!(get(&host, "other.example.com", "/").await.status, 404);
    let list = host.list_json();
    assert_eq!(list["services"]["app-web"]["state"], "running", "{list}");
    assert_eq!(list["services"]["custom-busybox"]["host"], ACCESSORY_HOST);

    // `kamal app remove`: remove the service (the container goes afterwards).
    host.proxy_ok("remove app-web");
    assert_eq!(get(&host, APP_HOST, "/").await.status, 404);
    // `kamal accessory remove`: docker stop first, then remove, which must succeed.
    host.run_ok(&format!("docker container stop {}", busybox.name));
    host.proxy_ok("remove custom-busybox");
    assert_eq!(get(&host, ACCESSORY_HOST, "/").await.status, 404);
    assert_eq!(host.list_json()["services"], serde_json::json!({}));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redeploy_under_load_drops_no_request_when_the_old_container_stops_at_once() {
    let Some(host) = booted(&[]).await else {
        return;
    };
    let v1 = host.app("app-web", "v1", "v1", &[]);
    host.deploy(&Deploy::new("app-web", &v1.target(), APP_HOST));
    assert_eq!(get(&host, APP_HOST, "/").await.body.trim(), "v1");

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let url = host.url("/");
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, answered, url, http) =
                (stop.clone(), answered.clone(), url.clone(), client());
            tokio::spawn(async move {
                let mut seen: Vec<(Instant, Result<String, String>)> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = send(&http, reqwest::Method::GET, &url, Some(APP_HOST)).await;
                    let outcome = match r {
                        Ok(r) if r.status == 200 => Ok(r.body.trim().to_owned()),
                        Ok(r) => Err(format!("{} {}", r.status, r.body.trim())),
                        Err(e) => Err(e.to_string()),
                    };
                    seen.push((Instant::now(), outcome));
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                seen
            })
        })
        .collect();

    // Kamal: start the new container, deploy to it, then stop the old one at once.
    let v2 = host.app("app-web", "v2", "v2", &[]);
    tokio::task::spawn_blocking({
        let deploy = Deploy::new("app-web", &v2.target(), APP_HOST).args();
        let line = host.exec_line(&deploy);
        let stop_old = format!(
            "docker container ls --all --filter name=^{}$ --quiet | xargs docker stop",
            v1.name
        );
        let dir = host.workdir.path().to_owned();
        move || {
            for line in [line, stop_old] {
                let out = kamal::sh(&dir, &line);
                assert!(
                    out.status.success(),
                    "`{line}` failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    })
    .await
    .expect("deploy and stop");
    let stopped_at = Instant::now();
    assert_eq!(host.inspect(&v1.name, "{{.State.Running}}"), "false");
    // Keep the load on for a good number of requests after the stop.
    let at_stop = answered.load(Ordering::Relaxed);
    poll_until("100 more answers after the stop", PATIENCE, || {
        std::future::ready(answered.load(Ordering::Relaxed) >= at_stop + 100)
    })
    .await;
    stop.store(true, Ordering::Relaxed);

    let mut total = 0;
    let mut failures = Vec::new();
    let (mut v1_seen, mut v2_after_stop) = (0, 0);
    for w in workers {
        for (at, outcome) in w.await.expect("worker") {
            total += 1;
            match outcome {
                Ok(body) if body == "v1" => v1_seen += 1,
                Ok(body) if body == "v2" => v2_after_stop += usize::from(at > stopped_at),
                Ok(other) => failures.push(format!("unexpected body {other:?}")),
                Err(e) => failures.push(e),
            }
        }
    }
    eprintln!(
        "redeploy under load: {total} requests, {} failed",
        failures.len()
    );
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    assert!(v1_seen > 0, "load ran before the switch");
    assert!(
        v2_after_stop > 0,
        "load ran after the old container stopped"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_renders_the_app_s_503_page_and_live_resumes() {
    let Some(host) = booted(&[]).await else {
        return;
    };
    // Kamal uploads the app's error pages for this version under .apps-config.
    let pages = host.apps_config().join("app/error_pages/v1");
    std::fs::create_dir_all(&pages).unwrap();
    std::fs::write(
        pages.join("503.html"),
        "<h1>Custom Maintenance Page: {{ .Message }}</h1>\n",
    )
    .unwrap();
    let web = host.app("app-web", "v1", "web-v1", &[]);
    let mut deploy = Deploy::new("app-web", &web.target(), APP_HOST);
    deploy.error_pages = Some(format!("{APPS_CONFIG}/app/error_pages/v1"));
    host.deploy(&deploy);
    assert_eq!(get(&host, APP_HOST, "/").await.status, 200);

    // `kamal app maintenance --message "Testing Maintenance Mode"`
    host.proxy_ok(&format!(
        "stop app-web {} {}",
        kamal::flag("drain-timeout", "30s"),
        kamal::flag("message", "Testing Maintenance Mode")
    ));
    let r = get(&host, APP_HOST, "/").await;
    assert_eq!(r.status, 503);
    assert!(
        r.body
            .contains("Custom Maintenance Page: Testing Maintenance Mode"),
        "{}",
        r.body
    );
    // `kamal app live`
    host.proxy_ok("resume app-web");
    let r = get(&host, APP_HOST, "/").await;
    assert_eq!((r.status, r.body.trim()), (200, "web-v1"));
}

/// `GET /` with `Host: host` on one fresh connection; true on a 200.
fn answers(port: u16, host: &str) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        write!(s, "GET / HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
        let mut response = String::new();
        s.read_to_string(&mut response)?;
        Ok(response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"))
    };
    attempt().unwrap_or(false)
}

/// Polls `GET /` through `port` while `restart` runs; returns the longest run of failed
/// polls, from the last answer before it to the first answer after it.
fn outage_during(port: u16, host: &str, restart: impl FnOnce()) -> Duration {
    assert!(answers(port, host), "serving before the restart");
    let done = Arc::new(AtomicBool::new(false));
    let poller = std::thread::spawn({
        let (done, host) = (done.clone(), host.to_owned());
        move || {
            let mut last_ok = Instant::now();
            let mut worst = Duration::ZERO;
            let mut failing = false;
            let deadline = Instant::now() + PATIENCE;
            loop {
                let ok = answers(port, &host);
                let now = Instant::now();
                if ok {
                    if failing {
                        worst = worst.max(now - last_ok);
                        failing = false;
                    }
                    last_ok = now;
                    if done.load(Ordering::Relaxed) {
                        return Some(worst);
                    }
                } else {
                    failing = true;
                    if now > deadline {
                        return None;
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    restart();
    done.store(true, Ordering::Relaxed);
    poller
        .join()
        .expect("poller")
        .expect("never answered again after the restart")
}

#[tokio::test(flavor = "multi_thread")]
async fn reboot_restores_every_service_from_the_volume() {
    let Some(host) = booted(&[]).await else {
        return;
    };
    let web = host.app("app-web", "v1", "web-v1", &[]);
    host.deploy(&Deploy::new("app-web", &web.target(), APP_HOST));
    let busybox = host.app("custom-busybox", "v1", "accessory", &[]);
    host.deploy(&Deploy::new(
        "custom-busybox",
        &busybox.target(),
        ACCESSORY_HOST,
    ));
    let api = host.app("app-api", "v1", "api-v1", &[]);
    let mut maintenance = Deploy::new("app-api", &api.target(), "api.example.com");
    maintenance.path_prefixes = vec!["/api".to_owned()];
    host.deploy(&maintenance);
    host.proxy_ok(&format!(
        "stop app-api {} {}",
        kamal::flag("drain-timeout", "30s"),
        kamal::flag("message", "back soon")
    ));
    let before = host.inspect(&host.proxy, "{{.Id}}");

    let outage = outage_during(host.http_port, APP_HOST, || host.reboot());

    let after = host.inspect(&host.proxy, "{{.Id}}");
    assert_ne!(before, after, "a new container");
    // The prune by label removed the old one: one container under that name, the new one.
    let same_name = host.run_ok(&format!(
        "docker ps --all --quiet --no-trunc --filter name=^{}$",
        host.proxy
    ));
    assert_eq!(same_name.trim(), after);
    let old_gone = std::process::Command::new("docker")
        .args(["inspect", &before])
        .output()
        .expect("docker inspect");
    assert!(!old_gone.status.success(), "the old container was pruned");

    // Every service, with its state, from the volume.
    let r = get(&host, APP_HOST, "/").await;
    assert_eq!((r.status, r.body.trim()), (200, "web-v1"));
    let r = get(&host, ACCESSORY_HOST, "/").await;
    assert_eq!((r.status, r.body.trim()), (200, "accessory"));
    let r = get(&host, "api.example.com", "/api/").await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("back soon"), "{}", r.body);
    let list = host.list_json();
    assert_eq!(list["services"]["app-api"]["state"], "stopped", "{list}");
    assert!(!host.logs().contains("No previous state to restore"));

    // The same restart of a plain container publishing a port, for scale: most of the
    // outage is Docker's (stop, network and port forwarding setup), not the proxy's.
    let baseline = baseline_restart_outage(&host).await;
    eprintln!(
        "kamal proxy reboot outage: {} ms (plain busybox httpd restarted the same way: {} ms)",
        outage.as_millis(),
        baseline.as_millis()
    );
}

/// Stop, prune, run of a busybox httpd container published like the proxy: first on a
/// port the engine picks, then again on that port, as a reboot does.
async fn baseline_restart_outage(host: &KamalHost) -> Duration {
    let name = format!("kamal-proxy-baseline-{}", host.suffix);
    let label = format!("kamal-proxy-baseline={}", host.suffix);
    let run = |port: &str| {
        format!(
            "docker run --name {name} --network {} --detach --restart unless-stopped --init \
             --label {} --label {label} --publish 127.0.0.1:{port}:80 {} \
             sh -c 'echo ok > /www/index.html && exec httpd -f -p 80 -h /www'",
            host.network,
            docker::TEST_LABEL,
            docker::ensure_test_image()
        )
    };
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            docker::remove(&self.0);
        }
    }
    let _cleanup = Cleanup(name.clone());
    host.run_ok(&run(""));
    let published = host.run_ok(&format!("docker port {name} 80/tcp"));
    let port: u16 = published
        .lines()
        .find_map(|l| l.trim().rsplit_once(':')?.1.parse().ok())
        .unwrap_or_else(|| panic!("no published port for {name}: {published:?}"));
    poll_until("the baseline container to serve", PATIENCE, || async {
        tokio::task::spawn_blocking(move || answers(port, "baseline"))
            .await
            .expect("poll")
    })
    .await;
    let again = run(&port.to_string());
    outage_during(port, "baseline", || {
        host.run_ok(&format!("docker container stop {name}"));
        host.run_ok(&format!(
            "docker container prune --force --filter label={label}"
        ));
        host.run_ok(&again);
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn custom_certificates_from_apps_config() {
    let Some(host) = booted(&[]).await else {
        return;
    };
    // `ssl: {certificate_pem: CERT, private_key_pem: KEY}`: Kamal writes the secrets under
    // .kamal/proxy/apps-config/<service>/tls/<role>/ and passes the container paths.
    let tls = host.apps_config().join("app/tls/web");
    std::fs::create_dir_all(&tls).unwrap();
    let (cert, key, pem) = testkit::pebble::self_signed(&tls, "generated", &[APP_HOST]);
    std::fs::rename(&cert, tls.join("cert.pem")).unwrap();
    std::fs::rename(&key, tls.join("key.pem")).unwrap();
    for dir in [
        host.apps_config().join("app"),
        host.apps_config().join("app/tls"),
        tls.clone(),
    ] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    let web = host.app("app-web", "v1", "secure", &[]);
    let mut deploy = Deploy::new("app-web", &web.target(), APP_HOST);
    deploy.tls = true;
    deploy.certificate = Some((
        format!("{APPS_CONFIG}/app/tls/web/cert.pem"),
        format!("{APPS_CONFIG}/app/tls/web/key.pem"),
    ));
    host.deploy(&deploy);

    let https = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(pem.as_bytes()).unwrap()])
        .resolve(
            APP_HOST,
            SocketAddr::from(([127, 0, 0, 1], host.https_port)),
        )
        .build()
        .unwrap();
    let r = https
        .get(format!("https://{APP_HOST}:{}/", host.https_port))
        .send()
        .await
        .unwrap_or_else(|e| panic!("HTTPS request failed: {e}\n{}", host.logs()));
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap().trim(), "secure");
    // ssl_redirect defaults to on: plain HTTP is sent to HTTPS.
    let r = get(&host, APP_HOST, "/path?q=1").await;
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), format!("https://{APP_HOST}/path?q=1"));
}

/// `proxy.run.options` that give the non-root proxy the engine's socket: the socket
/// mounted, its group added, and the environment variable `run` reads.
fn socket_options() -> Vec<(&'static str, String)> {
    use std::os::unix::fs::MetadataExt;
    let socket = docker::docker_socket_path();
    let gid = std::fs::metadata(&socket)
        .unwrap_or_else(|e| panic!("{}: {e}", socket.display()))
        .gid();
    vec![
        (
            "volume",
            format!("{}:/var/run/docker.sock", socket.display()),
        ),
        ("group-add", gid.to_string()),
        (
            "env",
            "KAMAL_PROXY_DOCKER_SOCKET=/var/run/docker.sock".to_owned(),
        ),
    ]
}

async fn booted_with_socket() -> Option<KamalHost> {
    if !docker::require_docker() {
        return None;
    }
    let options = socket_options();
    let options: Vec<(&str, &str)> = options.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let host = booted(&options).await?;
    let top = host.run_ok(&format!("docker top {} -o pid,uid,args", host.proxy));
    assert!(
        top.lines()
            .any(|l| l.contains("1001") && l.contains("kamal-proxy run")),
        "the proxy runs as uid 1001: {top}"
    );
    Some(host)
}

/// The container stops once idle and the next request wakes it.
async fn sleeps_and_wakes(host: &KamalHost, app: &App, body: &str) {
    host.wait_for_container_status(&app.name, "exited", PATIENCE)
        .await;
    poll_until("app-web to be sleeping", PATIENCE, || {
        let list = host.list_json();
        std::future::ready(
            if list["services"]["app-web"]["sleep_state"] == "sleeping" {
                Ok(())
            } else {
                Err(list)
            },
        )
    })
    .await;
    let r = get(host, APP_HOST, "/").await;
    assert_eq!((r.status, r.body.trim()), (200, body));
    assert_eq!(host.inspect(&app.name, "{{.State.Running}}"), "true");
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_to_zero_with_the_fork_s_sleep_flags_as_the_non_root_user() {
    let Some(host) = booted_with_socket().await else {
        return;
    };
    let web = host.app("app-web", "v1", "sleepy", &[]);
    let mut deploy = Deploy::new("app-web", &web.target(), APP_HOST);
    deploy.fork_flags = vec![
        kamal::flag("sleep-after", "2s"),
        kamal::flag("wake-timeout", "20s"),
    ];
    host.deploy(&deploy);
    assert_eq!(get(&host, APP_HOST, "/").await.body.trim(), "sleepy");
    sleeps_and_wakes(&host, &web, "sleepy").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scale_to_zero_from_container_labels_with_a_plain_kamal_deploy() {
    let Some(host) = booted_with_socket().await else {
        return;
    };
    // deploy.yml `labels:` on the app's containers; the deploy line is stock Kamal's.
    let web = host.app(
        "app-web",
        "v1",
        "labelled",
        &[
            ("kamal-proxy.sleep-after", "2s"),
            ("kamal-proxy.wake-timeout", "20s"),
        ],
    );
    host.deploy(&Deploy::new("app-web", &web.target(), APP_HOST));
    host.wait_for_log(
        &["Sleep settings from container labels", "app-web"],
        PATIENCE,
    )
    .await;
    sleeps_and_wakes(&host, &web, "labelled").await;
}

/// The saved options of `service`, read from the state file on the proxy's volume.
fn saved_options(host: &KamalHost, service: &str) -> serde_json::Value {
    // The image has no shell tools: copy the file out of the container.
    host.run_ok(&format!(
        "docker cp {}:{CONFIG_DIR}/kamal-proxy.state saved.state",
        host.proxy
    ));
    let text = std::fs::read_to_string(host.workdir.path().join("saved.state")).expect("copy");
    let state: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("state file: {e}: {text}"));
    state
        .as_array()
        .and_then(|services| services.iter().find(|s| s["name"] == service))
        .map(|s| s["options"].clone())
        .unwrap_or_else(|| panic!("{service} not in the state file: {state}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redeploy_to_an_unlabelled_container_turns_sleep_off() {
    let Some(host) = booted_with_socket().await else {
        return;
    };
    let v1 = host.app(
        "app-web",
        "v1",
        "labelled",
        &[
            ("kamal-proxy.sleep-after", "1h"),
            ("kamal-proxy.wake-timeout", "20s"),
        ],
    );
    host.deploy(&Deploy::new("app-web", &v1.target(), APP_HOST));
    let described = &host.list_json()["services"]["app-web"];
    assert_eq!(described["sleep_state"], "active", "{described}");
    assert_eq!(
        saved_options(&host, "app-web")["sleep_after"],
        3_600_000_000_000i64
    );

    // The next version, deployed by stock Kamal without `labels:`: the target is the new
    // container's id, which carries no sleep labels, so nothing asks for sleep any more.
    let v2 = host.app("app-web", "v2", "unlabelled", &[]);
    host.deploy(&Deploy::new("app-web", &v2.target(), APP_HOST));
    host.stop_app(&v1);
    let described = &host.list_json()["services"]["app-web"];
    assert_eq!(described["sleep_state"], "off", "{described}");
    assert_eq!(described["sleep_containers"], serde_json::json!([]));
    let options = saved_options(&host, "app-web");
    assert!(options.get("sleep_after").is_none(), "{options}");
    let r = get(&host, APP_HOST, "/").await;
    assert_eq!((r.status, r.body.trim()), (200, "unlabelled"));
}
