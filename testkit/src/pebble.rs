//! A real ACME server for the tests: Debian's `pebble`, with `pebble-challtestsrv` as a
//! mock DNS that answers 127.0.0.1 for every name (so `app.test` works). Each test gets
//! its own pair on free ports, and its own HTTPS certificate for pebble (made here).
//!
//! pebble validates HTTP-01 on `http_port` and TLS-ALPN-01 on `tls_port`: start the proxy
//! on those ports (or point one at a dead port to force the other challenge).
//! Without `pebble` installed the tests skip with a message; under `CI=true` they fail.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Pebble {
    children: Vec<Child>,
    pub dir: tempfile::TempDir,
    /// The ACME directory URL.
    pub directory: String,
    /// Trust anchor for pebble's own HTTPS endpoint (pass as `SSL_CERT_FILE`).
    pub ca_file: PathBuf,
    management_port: u16,
}

use crate::ports::{free_port, free_udp_port};

/// Whether pebble can run here. Under `CI=true` a missing pebble is a failure.
pub fn available() -> bool {
    let found = Command::new("pebble")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
        && Command::new("pebble-challtestsrv")
            .arg("-help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
    if !found {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("pebble is not installed (apt-get install pebble); required under CI=true");
        }
        eprintln!("skipping: pebble is not installed (apt-get install pebble)");
    }
    found
}

impl Pebble {
    /// Starts pebble validating challenges on these ports, issuing certificates valid for
    /// `validity` (pebble's default is five years).
    pub fn start(http_port: u16, tls_port: u16, validity: Option<Duration>) -> Pebble {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca_file, cert_file, key_file) = pebble_tls(&dir);
        let listen_port = free_port();
        let management_port = free_port();
        let dns_port = free_udp_port();
        let dns_management = free_port();
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{listen_port}"),
                "managementListenAddress": format!("127.0.0.1:{management_port}"),
                "certificate": cert_file,
                "privateKey": key_file,
                "httpPort": http_port,
                "tlsPort": tls_port,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": false,
                "certificateValidityPeriod": validity.map_or(157766400, |d| d.as_secs()),
            }
        });
        let config_file = dir.path().join("pebble-config.json");
        std::fs::write(&config_file, config.to_string()).expect("write pebble config");

        let log = |name: &str| {
            std::fs::File::create(dir.path().join(name))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null())
        };
        let dns = Command::new("pebble-challtestsrv")
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .args(["-dns01", &format!("127.0.0.1:{dns_port}")])
            .args(["-management", &format!("127.0.0.1:{dns_management}")])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .stdout(log("challtestsrv.log"))
            .stderr(log("challtestsrv.err"))
            .spawn()
            .expect("start pebble-challtestsrv");
        let pebble = Command::new("pebble")
            .args(["-config", config_file.to_str().expect("utf-8 path")])
            .args(["-dnsserver", &format!("127.0.0.1:{dns_port}")])
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(log("pebble.log"))
            .stderr(log("pebble.err"))
            .spawn()
            .expect("start pebble");
        let p = Pebble {
            children: vec![pebble, dns],
            directory: format!("https://localhost:{listen_port}/dir"),
            ca_file,
            dir,
            management_port,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", listen_port)).is_err()
            || std::net::TcpStream::connect(("127.0.0.1", management_port)).is_err()
            || std::net::TcpStream::connect(("127.0.0.1", dns_management)).is_err()
        {
            assert!(
                Instant::now() < deadline,
                "pebble did not start: {}",
                p.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    /// pebble's issuing root (regenerated at every start), to verify what it issued.
    pub async fn root(&self) -> reqwest::Certificate {
        let ca = std::fs::read(&self.ca_file).expect("ca");
        let client = reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).expect("ca pem")])
            .build()
            .expect("client");
        let url = format!("https://localhost:{}/roots/0", self.management_port);
        let mut last_error = String::new();
        for _ in 0..50 {
            match client.get(&url).send().await {
                Ok(r) if r.status().is_success() => {
                    let pem = r.bytes().await.expect("pebble root body");
                    return reqwest::Certificate::from_pem(&pem).expect("root pem");
                }
                Ok(r) => last_error = format!("status {}", r.status()),
                Err(e) => last_error = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("pebble root: {last_error}\n{}", self.logs());
    }

    pub fn logs(&self) -> String {
        ["pebble.log", "pebble.err", "challtestsrv.err"]
            .iter()
            .map(|f| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A CA and a `localhost` certificate for pebble's own HTTPS listener.
fn pebble_tls(dir: &tempfile::TempDir) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "pebble test CA");
    let ca = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).expect("params");
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    let cert = params.signed_by(&key, &issuer).expect("leaf");
    let ca_file = dir.path().join("ca.pem");
    let cert_file = dir.path().join("cert.pem");
    let key_file = dir.path().join("key.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write");
    std::fs::write(&cert_file, cert.pem()).expect("write");
    std::fs::write(&key_file, key.serialize_pem()).expect("write");
    (ca_file, cert_file, key_file)
}

/// A self-signed certificate and key for `names`, as PEM files in `dir`.
pub fn self_signed(
    dir: &std::path::Path,
    stem: &str,
    names: &[&str],
) -> (PathBuf, PathBuf, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("params");
    let cert = params.self_signed(&key).expect("cert");
    let cert_file = dir.join(format!("{stem}.crt"));
    let key_file = dir.join(format!("{stem}.key"));
    std::fs::write(&cert_file, cert.pem()).expect("write");
    std::fs::write(&key_file, key.serialize_pem()).expect("write");
    (cert_file, key_file, cert.pem())
}
