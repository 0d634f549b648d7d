//! Backends whose faults are exact, on raw sockets: one that stops listening on its port
//! and starts again (a target down for a moment, as in a redeploy), counts what arrives on
//! each connection and can hold requests until the test lets them go; and an address
//! whose connections never complete (a full listen backlog), for dial timeouts.
//!
//! The app speaks HTTP/1.1 with keep-alive: `/up` answers `200 ok`; any other request is
//! answered `200` with the body `<METHOD> <path> <X-Seq>` (its own body read and
//! discarded), after `?ms=N` milliseconds when the query says so, and only once released
//! while [`FlakyBackend::hold`] is on. A request with `Connection: close` gets its answer
//! and the connection closes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

use crate::poll::poll_until;

/// How long a state the test waits for may take to appear (a hang guard).
const PATIENCE: Duration = Duration::from_secs(20);

/// One request the app received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// The `X-Seq` header, "" when absent.
    pub seq: String,
    /// The `Connection` header, "" when absent.
    pub connection: String,
    /// Which app connection it came on (0, 1, …, in the order of their first request).
    pub conn: usize,
}

#[derive(Default)]
struct Stats {
    requests: Vec<Seen>,
    /// App connections (those that carried a request other than `/up`) opened so far.
    app_connections: usize,
    /// App connections open now, and the most ever open at once.
    open: usize,
    max_open: usize,
    /// Requests waiting for [`FlakyBackend::release`].
    held: usize,
}

struct Shared {
    stats: Mutex<Stats>,
    /// While true, requests wait; each `release` lets them all go.
    hold: watch::Sender<bool>,
    /// Bumped to close every open connection (the process "died").
    generation: watch::Sender<u64>,
}

/// A backend on a fixed port that can stop listening (connections refused) and start
/// again.
pub struct FlakyBackend {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    state: tokio::sync::Mutex<Listening>,
}

enum Listening {
    /// Accepting, in this task.
    Yes(tokio::task::JoinHandle<()>),
    /// The port bound but not listening: connections are refused, and no one else can
    /// take the port meanwhile.
    No(TcpSocket),
}

impl FlakyBackend {
    pub async fn start() -> FlakyBackend {
        let socket = bound(SocketAddr::from(([127, 0, 0, 1], 0)));
        let addr = socket.local_addr().expect("local address");
        let shared = Arc::new(Shared {
            stats: Mutex::default(),
            hold: watch::Sender::new(false),
            generation: watch::Sender::new(0),
        });
        let task = accept(socket, shared.clone());
        FlakyBackend {
            addr,
            shared,
            state: tokio::sync::Mutex::new(Listening::Yes(task)),
        }
    }

    /// `127.0.0.1:<port>`, as passed to `--target`.
    pub fn target(&self) -> String {
        self.addr.to_string()
    }

    /// Stops listening and closes every open connection: connecting is refused until
    /// [`Self::serve`].
    pub async fn refuse(&self) {
        let mut state = self.state.lock().await;
        if let Listening::Yes(task) = &mut *state {
            // Bound before the listener goes, so the port is never free in between: a
            // free port in the ephemeral range can be handed to the proxy's own
            // connection attempt to it (a TCP self-connect), and binding it back fails.
            let socket = bound(self.addr);
            task.abort();
            let _ = task.await;
            self.shared.generation.send_modify(|g| *g += 1);
            *state = Listening::No(socket);
        }
    }

    /// Listens again on the same port.
    pub async fn serve(&self) {
        let mut state = self.state.lock().await;
        let old = std::mem::replace(&mut *state, Listening::No(placeholder()));
        *state = match old {
            Listening::No(socket) => Listening::Yes(accept(socket, self.shared.clone())),
            yes => yes,
        };
    }

    /// While on, requests other than `/up` wait for [`Self::release`].
    pub fn hold(&self, on: bool) {
        self.shared.hold.send_replace(on);
    }

    /// Lets every held request go (and stops holding).
    pub fn release(&self) {
        self.hold(false);
    }

    /// Waits until `n` requests are held.
    pub async fn wait_held(&self, n: usize) {
        poll_until(&format!("{n} requests held by the app"), PATIENCE, || {
            let held = self.stats(|s| s.held);
            std::future::ready((held == n).then_some(()).ok_or(held))
        })
        .await
    }

    /// Every request other than `/up`, in the order they arrived.
    pub fn requests(&self) -> Vec<Seen> {
        self.stats(|s| s.requests.clone())
    }

    /// Connections that carried a request other than `/up`.
    pub fn app_connections(&self) -> usize {
        self.stats(|s| s.app_connections)
    }

    /// App connections open now.
    pub fn open_connections(&self) -> usize {
        self.stats(|s| s.open)
    }

    /// Waits until `n` app connections are open (the proxy closed the others).
    pub async fn wait_open(&self, n: usize) {
        poll_until(&format!("{n} app connections open"), PATIENCE, || {
            let open = self.open_connections();
            std::future::ready((open == n).then_some(()).ok_or(open))
        })
        .await
    }

    /// The most app connections ever open at once.
    pub fn max_open_connections(&self) -> usize {
        self.stats(|s| s.max_open)
    }

    fn stats<T>(&self, f: impl FnOnce(&Stats) -> T) -> T {
        f(&self.shared.stats.lock().expect("stats"))
    }
}

impl Drop for FlakyBackend {
    fn drop(&mut self) {
        if let Ok(state) = self.state.try_lock() {
            if let Listening::Yes(task) = &*state {
                task.abort();
            }
        }
        self.shared.generation.send_modify(|g| *g += 1);
    }
}

/// A socket bound to `addr` (reused at once, as a restarted server would), not listening.
/// `SO_REUSEPORT` lets it be bound while the backend's listener still holds the port.
fn bound(addr: SocketAddr) -> TcpSocket {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
    socket.set_reuseport(true).expect("SO_REUSEPORT");
    socket.bind(addr).expect("bind the backend's port");
    socket
}

/// Never used: stands in for a moment while the state changes hands.
fn placeholder() -> TcpSocket {
    TcpSocket::new_v4().expect("socket")
}

fn accept(socket: TcpSocket, shared: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    let listener: TcpListener = socket.listen(1024).expect("listen");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(connection(stream, shared.clone()));
        }
    })
}

struct Head {
    method: String,
    path: String,
    seq: String,
    connection: String,
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
    let mut head = Head {
        method,
        path,
        seq: String::new(),
        connection: String::new(),
        length: 0,
    };
    loop {
        let mut h = String::new();
        r.read_line(&mut h).await.ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            return Some(head);
        }
        let (k, v) = h.split_once(':')?;
        let v = v.trim().to_string();
        match k.to_ascii_lowercase().as_str() {
            "content-length" => head.length = v.parse().ok()?,
            "x-seq" => head.seq = v,
            "connection" => head.connection = v,
            _ => {}
        }
    }
}

/// Serves one connection until the peer closes it, it asks to close, or the backend
/// "dies" ([`FlakyBackend::refuse`]).
async fn connection(stream: TcpStream, shared: Arc<Shared>) {
    let mut died = shared.generation.subscribe();
    tokio::select! {
        _ = serve(stream, &shared) => {}
        _ = died.changed() => {}
    }
}

async fn serve(stream: TcpStream, shared: &Arc<Shared>) {
    let mut r = BufReader::new(stream);
    let mut app_conn = None;
    let result = async {
        while let Some(head) = read_head(&mut r).await {
            let mut body = vec![0; head.length];
            r.read_exact(&mut body).await.ok()?;
            if head.path == "/up" {
                let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                r.get_mut().write_all(ok).await.ok()?;
                continue;
            }
            let conn = *app_conn.get_or_insert_with(|| {
                let mut s = shared.stats.lock().expect("stats");
                s.app_connections += 1;
                s.open += 1;
                s.max_open = s.max_open.max(s.open);
                s.app_connections - 1
            });
            shared.stats.lock().expect("stats").requests.push(Seen {
                method: head.method.clone(),
                path: head.path.clone(),
                seq: head.seq.clone(),
                connection: head.connection.clone(),
                conn,
            });
            wait_until_released(shared).await;
            if let Some(ms) = query_ms(&head.path) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let reply = format!("{} {} {}", head.method, head.path, head.seq);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{reply}",
                reply.len()
            );
            r.get_mut().write_all(response.as_bytes()).await.ok()?;
            if head.connection.eq_ignore_ascii_case("close") {
                return None;
            }
        }
        Some(())
    };
    let _ = result.await;
    if app_conn.is_some() {
        shared.stats.lock().expect("stats").open -= 1;
    }
}

async fn wait_until_released(shared: &Arc<Shared>) {
    let mut hold = shared.hold.subscribe();
    if !*hold.borrow_and_update() {
        return;
    }
    shared.stats.lock().expect("stats").held += 1;
    let _ = hold.wait_for(|on| !*on).await;
    shared.stats.lock().expect("stats").held -= 1;
}

fn query_ms(path: &str) -> Option<u64> {
    let query = path.split_once('?')?.1;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("ms="))
        .and_then(|v| v.parse().ok())
}

/// An address whose connections never complete: a listener with a backlog of one, full.
/// New connection attempts (SYNs) are dropped by the kernel, so a client's connect hangs
/// until its own timeout, deterministically. Keep the value alive while it is used.
pub struct Blackhole {
    pub addr: SocketAddr,
    _listener: TcpListener,
    _filler: TcpStream,
}

impl Blackhole {
    pub async fn start() -> Blackhole {
        let socket = bound(SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = socket.listen(0).expect("listen with no backlog");
        let addr = listener.local_addr().expect("local address");
        // The one connection the queue holds; never accepted.
        let filler = TcpStream::connect(addr).await.expect("fill the backlog");
        poll_until("the listen backlog to be full", PATIENCE, || {
            std::future::ready(match listen_queue(addr) {
                Some((queued, max)) if queued > max => Ok(()),
                other => Err(other),
            })
        })
        .await;
        Blackhole {
            addr,
            _listener: listener,
            _filler: filler,
        }
    }

    /// `127.0.0.1:<port>`, as passed to `--target`.
    pub fn target(&self) -> String {
        self.addr.to_string()
    }
}

/// `(connections queued, backlog)` of the listening socket on `addr`, from
/// `/proc/net/tcp` (for a listener the kernel shows them as `tx_queue:rx_queue` swapped:
/// the backlog first).
fn listen_queue(addr: SocketAddr) -> Option<(u64, u64)> {
    let SocketAddr::V4(v4) = addr else {
        return None;
    };
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // State 0A: LISTEN.
        if f.get(1) != Some(&local.as_str()) || f.get(3) != Some(&"0A") {
            return None;
        }
        let (max, queued) = f.get(4)?.split_once(':')?;
        Some((
            u64::from_str_radix(queued, 16).ok()?,
            u64::from_str_radix(max, 16).ok()?,
        ))
    })
}
