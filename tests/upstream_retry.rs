//! A pooled upstream connection that the app closes under a request (issue 10 §2): the
//! request is re-sent once on a new connection when Go's rule allows, never otherwise, and
//! an app's `Keep-Alive: timeout=N` retires our idle connections before the app does.
//!
//! The apps here are raw sockets, so the close lands exactly where the test wants it.

use futures_util::StreamExt;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::{Proxy, client, poll_until};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// How the app treats a keep-alive connection once it has answered on it.
#[derive(Clone, Copy)]
enum Policy {
    /// One answer per connection; the next request finds the connection closed, as when
    /// the app's close crosses that request on the wire (the race, every time).
    ClosesOnReuse,
    /// Closes right after answering, without saying so (`Connection: close`): our pool
    /// races the close. The reproduction.
    ClosesAfterAnswering,
    /// Announces `Keep-Alive: timeout=1`; a request on a connection idle for a second or
    /// more finds it closed (the app's timer fired as the request was on its way).
    KeepAliveOneSecond,
}

#[derive(Default)]
struct Seen {
    /// `X-Seq` of every request answered, and how often.
    answered: HashMap<String, usize>,
    /// `X-Seq` of requests that arrived on a connection the app then closed unanswered.
    unanswered: Vec<String>,
    /// Connections that carried a request other than `/up`.
    app_connections: usize,
}

struct App {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl App {
    async fn start(policy: Policy) -> App {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(serve_connection(stream, policy, s.clone()));
            }
        });
        App { addr, seen, task }
    }

    fn target(&self) -> String {
        self.addr.to_string()
    }

    fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.seen.lock().unwrap())
    }
}

struct Head {
    method: String,
    path: String,
    seq: String,
    length: usize,
}

async fn read_head(r: &mut BufReader<TcpStream>) -> Option<Head> {
    let mut line = String::new();
    if r.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let (mut seq, mut length) = (String::new(), 0);
    loop {
        let mut h = String::new();
        r.read_line(&mut h).await.ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        if k.eq_ignore_ascii_case("content-length") {
            length = v.trim().parse().ok()?;
        } else if k.eq_ignore_ascii_case("x-seq") {
            seq = v.trim().to_string();
        }
    }
    Some(Head {
        method,
        path,
        seq,
        length,
    })
}

async fn serve_connection(stream: TcpStream, policy: Policy, seen: Arc<Mutex<Seen>>) {
    let mut r = BufReader::new(stream);
    let mut answered_app = false;
    let mut idle_since = Instant::now();
    while let Some(head) = read_head(&mut r).await {
        if head.path == "/up" {
            let _ = r
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await;
            continue;
        }
        let closes = match policy {
            Policy::ClosesOnReuse | Policy::ClosesAfterAnswering => answered_app,
            Policy::KeepAliveOneSecond => {
                answered_app && idle_since.elapsed() >= Duration::from_secs(1)
            }
        };
        {
            let mut s = seen.lock().unwrap();
            if closes {
                s.unanswered.push(head.seq.clone());
            } else if !answered_app {
                s.app_connections += 1;
            }
        }
        if closes {
            // Unread body bytes make this a reset, else a plain close: both happen.
            return;
        }
        let mut body = vec![0; head.length];
        if r.read_exact(&mut body).await.is_err() {
            return;
        }
        let reply = format!("{} {} {}", head.method, head.seq, body.len());
        let keep_alive = match policy {
            Policy::KeepAliveOneSecond => "Keep-Alive: timeout=1\r\n",
            _ => "",
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{keep_alive}\r\n{reply}",
            reply.len()
        );
        // Counted before it goes out: counted after, the last request's answer could reach
        // the test (through the proxy) before the count did.
        *seen.lock().unwrap().answered.entry(head.seq).or_default() += 1;
        if r.get_mut().write_all(response.as_bytes()).await.is_err() {
            return;
        }
        answered_app = true;
        idle_since = Instant::now();
        if matches!(policy, Policy::ClosesAfterAnswering) {
            return;
        }
    }
}

async fn serve(policy: Policy) -> (App, Proxy) {
    let app = App::start(policy).await;
    let proxy = Proxy::start().await;
    proxy.deploy("app", &app.target(), &[]).await;
    (app, proxy)
}

/// Sends `n` requests, `concurrency` at a time, each tagged `X-Seq: <prefix><i>`; a POST
/// carries a 2 KiB body. Returns each request's status (0: no answer at all).
async fn load(
    proxy: &Proxy,
    method: reqwest::Method,
    prefix: &str,
    n: usize,
    concurrency: usize,
) -> Vec<(String, u16)> {
    let c = client();
    let url = proxy.url("/work");
    futures_util::stream::iter(0..n)
        .map(|i| {
            let seq = format!("{prefix}{i}");
            let mut req = c.request(method.clone(), &url).header("x-seq", &seq);
            if method == reqwest::Method::POST {
                req = req.body(vec![b'p'; 2048]);
            }
            async move {
                let status = match req.send().await {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        let _ = r.bytes().await;
                        s
                    }
                    Err(_) => 0,
                };
                (seq, status)
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// Panics with a count and a sample unless every request was answered 200.
fn assert_all_ok(results: &[(String, u16)]) {
    let failed: Vec<_> = results.iter().filter(|(_, s)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed, e.g. {:?}",
        failed.len(),
        results.len(),
        &failed[..failed.len().min(10)]
    );
}

fn resend_lines(proxy: &Proxy) -> Vec<serde_json::Value> {
    proxy
        .logs()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["msg"] == "Resending request on a new connection")
        .collect()
}

/// Waits for `n` resend lines (the log is read from a pipe, a moment behind).
async fn wait_resends(proxy: &Proxy, n: usize) -> Vec<serde_json::Value> {
    poll_until(
        &format!("{n} resend lines"),
        Duration::from_secs(10),
        || {
            let lines = resend_lines(proxy);
            std::future::ready(if lines.len() >= n {
                Ok(lines)
            } else {
                Err(lines)
            })
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gets_on_connections_closed_under_them_are_resent_once() {
    let (app, proxy) = serve(Policy::ClosesOnReuse).await;
    let results = load(&proxy, reqwest::Method::GET, "g", 2000, 16).await;
    assert_all_ok(&results);

    let unanswered = app.seen(|s| s.unanswered.clone());
    assert!(
        !unanswered.is_empty(),
        "the app never closed a reused connection under a request"
    );
    // Each request the app closed on was answered exactly once afterwards...
    app.seen(|s| {
        for seq in &unanswered {
            assert_eq!(s.answered.get(seq), Some(&1), "request {seq}");
        }
        assert_eq!(s.answered.len(), 2000);
        assert!(s.answered.values().all(|n| *n == 1));
    });
    // ...and the log says so, once per resend, naming what happened.
    let lines = wait_resends(&proxy, unanswered.len()).await;
    assert_eq!(lines.len(), unanswered.len(), "{lines:?}");
    let line = &lines[0];
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["target"], app.target(), "{line}");
    assert_eq!(line["path"], "/work", "{line}");
    assert!(
        line["error"]
            .as_str()
            .unwrap_or("")
            .contains("reused connection closed before any response byte"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_whose_bytes_were_written_is_not_resent() {
    posts_written_are_not_resent(vec![b'p'; 2048]).await;
}

/// The same for a POST without a body (`Content-Length: 0`), which goes over the proxy's
/// own connection rather than hyper's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bodiless_post_whose_head_was_written_is_not_resent() {
    posts_written_are_not_resent(Vec::new()).await;
}

async fn posts_written_are_not_resent(body: Vec<u8>) {
    let (app, proxy) = serve(Policy::ClosesOnReuse).await;
    let c = client();
    // Each POST that is answered leaves its connection in the pool, and the next one takes
    // that connection, is written, and the app closes. Go's rule: a POST with a body is
    // not sent twice.
    let mut closed_posts = Vec::new();
    for i in 0..20 {
        let seq = format!("post{i}");
        let r = c
            .post(proxy.url("/work"))
            .header("x-seq", &seq)
            .body(body.clone())
            .send()
            .await
            .expect("post");
        let status = r.status().as_u16();
        let closed = app.seen(|s| s.unanswered.contains(&seq));
        if closed {
            assert_eq!(status, 502, "{seq} was closed on, yet answered {status}");
            closed_posts.push(seq);
        } else {
            assert_eq!(status, 200, "{seq}");
        }
    }
    assert!(
        !closed_posts.is_empty(),
        "no POST met a closed connection\n{}",
        proxy.logs().join("\n")
    );
    app.seen(|s| {
        for seq in &closed_posts {
            assert_eq!(s.answered.get(seq), None, "{seq} reached the app twice");
        }
    });
    // The error line says what happened, and that nothing was re-sent.
    let errors = poll_until(
        &format!("{} proxying error lines", closed_posts.len()),
        Duration::from_secs(10),
        || {
            let errors: Vec<serde_json::Value> = proxy
                .logs()
                .iter()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["msg"] == "Error while proxying")
                .collect();
            std::future::ready(if errors.len() >= closed_posts.len() {
                Ok(errors)
            } else {
                Err(errors)
            })
        },
    )
    .await;
    assert_eq!(errors.len(), closed_posts.len(), "{errors:?}");
    for e in &errors {
        assert_eq!(e["resent"], false, "{e}");
        assert!(
            e["error"]
                .as_str()
                .unwrap_or("")
                .contains("reused connection closed before any response byte"),
            "{e}"
        );
    }
    let resent: Vec<_> = resend_lines(&proxy)
        .into_iter()
        .filter(|l| l["path"] == "/work")
        .collect();
    assert_eq!(resent, Vec::<serde_json::Value>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_app_closing_right_after_answering_causes_no_502_on_gets() {
    let (_app, proxy) = serve(Policy::ClosesAfterAnswering).await;
    let results = load(&proxy, reqwest::Method::GET, "g", 2000, 16).await;
    assert_all_ok(&results);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_idle_near_the_apps_keep_alive_timeout_are_not_reused() {
    let (app, proxy) = serve(Policy::KeepAliveOneSecond).await;
    let c = client();
    let get = |seq: &'static str| c.get(proxy.url("/work")).header("x-seq", seq).send();
    assert_eq!(get("first").await.expect("first").status(), 200);
    // The app said one second; our pool keeps such a connection half a second.
    proxy
        .wait_for_log("the app's keep-alive timeout learned", |l| {
            l.contains("Target announced its keep-alive timeout")
                && l.contains("\"keep_alive_timeout\":\"1s\"")
                && l.contains("\"pool_idle_timeout\":\"500ms\"")
        })
        .await;
    assert_eq!(get("second").await.expect("second").status(), 200);
    let before = app.seen(|s| s.app_connections);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(get("third").await.expect("third").status(), 200);
    // The third request went on a new connection: the idle one was retired.
    app.seen(|s| {
        assert_eq!(s.app_connections, before + 1);
        assert!(s.unanswered.is_empty(), "{:?}", s.unanswered);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gets_and_posts_across_the_apps_keep_alive_timeout_never_fail() {
    let (app, proxy) = serve(Policy::KeepAliveOneSecond).await;
    let mut results = Vec::new();
    for round in 0..4 {
        if round > 0 {
            // Let the pooled connections pass the app's timeout: without our pool retiring
            // them first, the next requests would meet closed connections.
            tokio::time::sleep(Duration::from_millis(1300)).await;
        }
        results.extend(load(&proxy, reqwest::Method::GET, &format!("g{round}-"), 500, 16).await);
        results.extend(
            load(
                &proxy,
                reqwest::Method::POST,
                &format!("p{round}-"),
                500,
                16,
            )
            .await,
        );
    }
    assert_eq!(results.len(), 4000);
    assert_all_ok(&results);
    app.seen(|s| {
        // Never one request sent into a connection the app had timed out.
        assert_eq!(s.unanswered, Vec::<String>::new());
        assert_eq!(s.answered.len(), 4000);
        // Each round after a pause started on new connections.
        assert!(s.app_connections > 16, "{}", s.app_connections);
    });
}
