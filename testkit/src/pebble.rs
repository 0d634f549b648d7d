//! A real ACME server for the tests: Debian's `pebble`, with `pebble-challtestsrv` as a
//! mock DNS that answers 127.0.0.1 for every name (so `app.test` works). Each test gets
//! its own pair on its own ports, and its own HTTPS certificate for pebble (made here).
//!
//! pebble validates HTTP-01 and TLS-ALPN-01 on ports fixed in its config, and the proxy
//! must know pebble's directory URL when it starts. So [`with_proxy`] starts the proxy
//! first on ports it picks itself (port 0, learned from its `Server started` line), then
//! pebble on those; pebble's own ports are picked here and, when one was taken meanwhile
//! ("address already in use"), everything is started again on fresh ones.
//! Without `pebble` installed the tests skip with a message; under `CI=true` they fail.

use crate::poll::poll_until;
use crate::ports::{ATTEMPTS, free_port, free_udp_port};
use crate::proxy::Proxy;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long pebble and its DNS may take to serve (a hang guard, not a measurement).
const START_TIMEOUT: Duration = Duration::from_secs(15);

pub struct Pebble {
    children: Children,
    pub dir: tempfile::TempDir,
    /// The ACME directory URL.
    pub directory: String,
    /// Trust anchor for pebble's own HTTPS endpoint (pass as `SSL_CERT_FILE`).
    pub ca_file: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
    validity: Option<Duration>,
    listen_port: u16,
    management_port: u16,
}

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

/// Which of the proxy's ports pebble validates challenges on. The others point at a port
/// nobody listens on, so that challenge cannot succeed (should someone listen there after
/// all, it is not the proxy, and the challenge still fails).
#[derive(Clone, Copy, Debug)]
pub enum Challenges {
    /// HTTP-01 on the proxy's HTTP port, TLS-ALPN-01 on its HTTPS port.
    Both,
    /// Only HTTP-01 can succeed.
    Http01,
    /// Only TLS-ALPN-01 can succeed.
    TlsAlpn01,
    /// Neither can: issuance fails.
    Neither,
}

/// pebble and a proxy that uses it as its ACME directory (`--acme-email` set), the proxy on
/// ports it picked itself; `validity` is the certificates' lifetime (pebble's default is
/// five years).
pub async fn with_proxy(challenges: Challenges, validity: Option<Duration>) -> (Pebble, Proxy) {
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        let mut pebble = Pebble::prepare(validity);
        let proxy = Proxy::start_with(
            &[
                &format!("--acme-directory={}", pebble.directory),
                "--acme-email=ops@example.com",
            ],
            &[(
                "SSL_CERT_FILE",
                pebble.ca_file.to_str().expect("utf-8 path"),
            )],
        )
        .await;
        let (http, tls) = match challenges {
            Challenges::Both => (proxy.http_port, proxy.https_port),
            Challenges::Http01 => (proxy.http_port, free_port()),
            Challenges::TlsAlpn01 => (free_port(), proxy.https_port),
            Challenges::Neither => (free_port(), free_port()),
        };
        match pebble.launch(http, tls).await {
            Ok(()) => return (pebble, proxy),
            Err(e) => last = e,
        }
    }
    panic!("pebble found no free ports in {ATTEMPTS} attempts:\n{last}");
}

impl Pebble {
    /// Everything but the processes: pebble's HTTPS certificate and its directory URL on a
    /// port picked here, so a proxy can be pointed at it first.
    fn prepare(validity: Option<Duration>) -> Pebble {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ca_file, cert_file, key_file) = pebble_tls(&dir);
        let listen_port = free_port();
        Pebble {
            children: Children(Vec::new()),
            directory: format!("https://localhost:{listen_port}/dir"),
            ca_file,
            cert_file,
            key_file,
            validity,
            dir,
            listen_port,
            management_port: free_port(),
        }
    }

    /// Starts pebble validating challenges on `http_port` and `tls_port`, and its DNS, and
    /// waits until both serve. `Err` (with the logs) when one of their ports was taken.
    async fn launch(&mut self, http_port: u16, tls_port: u16) -> Result<(), String> {
        let dns_port = free_udp_port();
        let dns_management = free_port();
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{}", self.listen_port),
                "managementListenAddress": format!("127.0.0.1:{}", self.management_port),
                "certificate": self.cert_file,
                "privateKey": self.key_file,
                "httpPort": http_port,
                "tlsPort": tls_port,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": false,
                "certificateValidityPeriod": self.validity.map_or(157766400, |d| d.as_secs()),
            }
        });
        let config_file = self.dir.path().join("pebble-config.json");
        std::fs::write(&config_file, config.to_string()).expect("write pebble config");

        let log = |name: &str| {
            std::fs::File::create(self.dir.path().join(name))
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
        // Killed on drop, also when the wait below gives up.
        let children = std::sync::Mutex::new(Children(vec![pebble, dns]));

        let https = self.https_client();
        let directory = self.directory.clone();
        let roots = format!("https://localhost:{}/roots/0", self.management_port);
        // Positive signals, each from the process itself: pebble's directory and root
        // served over its own certificate, the DNS answering a query. A port taken by
        // someone else shows as "address already in use" in the logs (pebble exits on it,
        // challtestsrv only logs it).
        let outcome = poll_until("pebble and its DNS to serve", START_TIMEOUT, || async {
            let logs = self.logs();
            let exited = children
                .lock()
                .expect("children")
                .0
                .iter_mut()
                .any(|c| !matches!(c.try_wait(), Ok(None)));
            if exited || logs.contains("address already in use") {
                return Ok(Err(logs));
            }
            let serves = |url: String| {
                let https = https.clone();
                async move {
                    https
                        .get(url)
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success())
                }
            };
            if !serves(directory.clone()).await {
                return Err("no directory yet");
            }
            if !serves(roots.clone()).await {
                return Err("no root yet");
            }
            if !dns_answers(dns_port).await {
                return Err("no DNS answer yet");
            }
            Ok(Ok(()))
        })
        .await;
        self.children = children.into_inner().expect("children");
        outcome
    }

    fn https_client(&self) -> reqwest::Client {
        let ca = std::fs::read(&self.ca_file).expect("ca");
        reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([reqwest::Certificate::from_pem(&ca).expect("ca pem")])
            .timeout(Duration::from_secs(5))
            .build()
            .expect("client")
    }

    /// pebble's issuing root (regenerated at every start), to verify what it issued.
    pub async fn root(&self) -> reqwest::Certificate {
        let url = format!("https://localhost:{}/roots/0", self.management_port);
        let r = self
            .https_client()
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("pebble root: {e}\n{}", self.logs()));
        assert!(r.status().is_success(), "pebble root: {}", r.status());
        let pem = r.bytes().await.expect("pebble root body");
        reqwest::Certificate::from_pem(&pem).expect("root pem")
    }

    pub fn logs(&self) -> String {
        [
            "pebble.log",
            "pebble.err",
            "challtestsrv.log",
            "challtestsrv.err",
        ]
        .iter()
        .map(|f| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
    }
}

/// Whether a DNS server on 127.0.0.1:`port` (UDP) answers an `A` query with our id.
async fn dns_answers(port: u16) -> bool {
    let Ok(socket) = tokio::net::UdpSocket::bind("127.0.0.1:0").await else {
        return false;
    };
    let id = (std::process::id() as u16) ^ port;
    let mut query = Vec::new();
    query.extend_from_slice(&id.to_be_bytes());
    // Recursion desired; one question.
    query.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in ["ready", "test"] {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]); // root, type A, class IN
    if socket.send_to(&query, ("127.0.0.1", port)).await.is_err() {
        return false;
    }
    let mut reply = [0u8; 512];
    match tokio::time::timeout(Duration::from_millis(500), socket.recv(&mut reply)).await {
        // Our id, a response, at least one answer.
        Ok(Ok(n)) => {
            n >= 12
                && reply[..2] == id.to_be_bytes()
                && reply[2] & 0x80 != 0
                && reply[6..8] != [0, 0]
        }
        _ => false,
    }
}

/// pebble and its DNS, killed when dropped.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
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
