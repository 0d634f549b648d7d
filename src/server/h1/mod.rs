//! Our own HTTP/1.x server connection for the HTTP port: it reads plain requests without a
//! body (nearly all of a web app's traffic: GET, HEAD, ...) with `httparse` straight into
//! the pipeline's `Request`, and writes their responses itself. The first request it does
//! not serve (a body, an upgrade, `Expect`, a head too large or malformed) hands the
//! connection to hyper for the rest of its life, with the bytes already read in front.
//!
//! Why: hyper's server connection cost about 9,200 instructions a request (parse, encode,
//! its dispatch between the connection and the service), and keeps an 8 KiB read and an
//! 8 KiB write buffer for as long as a connection is open, idle or not. Here the read
//! buffer lives only while a request head is being read or is in use, the write buffer
//! only while a response is going out: an idle keep-alive connection holds its task and
//! its socket. See bench/README.md ("Fourth round").
//!
//! What it keeps from the hyper connection it replaces: the listener timeouts (the same
//! [`Watchdog`] over the same [`Phase`]), the drain (idle connections close at once, the
//! request in flight finishes and its connection closes), and hyper's wire format for
//! every response (`response`).

mod date;
mod request;
mod response;
mod rewind;
#[cfg(test)]
mod tests;

use bytes::{Bytes, BytesMut};
use std::convert::Infallible;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::chunk_guard::ChunkGuard;
use super::h1_timeouts::{Expired, Noted, Phase, ResponseOver, Watchdog};
use super::idle::Counted;
use super::{Drain, FirstRequest, Proxy, drive_h1, handle, log_expired};
use crate::proxy::body::ClientBody;
use crate::service::Conn;
use request::Parsed;
use response::Asked;

/// A read buffer's size while a head is coming (hyper's, too).
const READ_SIZE: usize = 8 * 1024;

/// Serves one connection to its end.
pub async fn serve(
    mut stream: TcpStream,
    conn: Conn,
    proxy: Arc<Proxy>,
    http1: hyper::server::conn::http1::Builder,
    draining: Drain,
) {
    let first = Arc::new(FirstRequest::default());
    let phase = Arc::new(Phase::default());
    let mut watchdog = pin!(Watchdog::new(phase.clone(), proxy.limits.timeouts));
    let max_head = proxy.limits.max_header_bytes;
    let mut buf = BytesMut::new();
    let closing = Closing::default();
    loop {
        // The next head, unless the connection closes while idle (a drain closes it at
        // once when no byte of a request has come).
        let parsed = loop {
            let drained = async {
                draining.started_wait().await;
                first.wait().await;
            };
            tokio::select! {
                biased;
                r = next_head(&stream, &mut buf, &phase, max_head) => break r,
                expired = watchdog.as_mut() => {
                    log_expired(expired, conn.client);
                    return;
                }
                _ = drained, if !closing.get() => {
                    if buf.is_empty() {
                        return;
                    }
                    closing.set(true);
                }
            }
        };
        let (request, keep_alive) = match parsed {
            Some(Parsed::Request {
                request,
                keep_alive,
            }) => (request, keep_alive),
            Some(_) => {
                let prefix = std::mem::take(&mut buf).freeze();
                let ctx = Handed {
                    proxy,
                    conn,
                    first,
                    phase,
                    draining,
                };
                return hand_over(stream, prefix, http1, ctx, watchdog).await;
            }
            None => return,
        };
        if buf.is_empty() {
            // Nothing pipelined behind it: the buffer goes (the head keeps its part alive
            // until the request is done), and the idle connection holds none.
            buf = BytesMut::new();
        }
        first.mark();
        phase.request();
        let over = ResponseOver::new(&phase);
        let asked = Asked::of(&request, keep_alive);
        // Boxed: a connection's task holds only what it needs between requests.
        let exchange = Box::pin(async {
            let response = handle(&proxy, request, conn).await;
            // As hyper: a drain begun before the head goes out says `close` in it.
            let asked = Asked {
                keep_alive: asked.keep_alive && !closing.get(),
                ..asked
            };
            let again = response::write(&mut stream, response, asked).await;
            drop(over);
            again
        });
        let again = match watch(exchange, watchdog.as_mut(), &draining, &first, &closing).await {
            Ok(again) => again,
            Err(expired) => {
                log_expired(expired, conn.client);
                return;
            }
        };
        if !again || closing.get() {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// A drain has begun: the request in flight is the connection's last. (Read by the
/// exchange, set beside it in the same task: an atomic only so the task stays `Send`.)
#[derive(Default)]
struct Closing(AtomicBool);

impl Closing {
    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, closing: bool) {
        self.0.store(closing, Ordering::Relaxed);
    }
}

/// Runs an exchange to its end; the watchdog may close the connection first, and a drain
/// that starts meanwhile marks it `closing`.
async fn watch(
    exchange: Pin<Box<impl Future<Output = bool>>>,
    mut watchdog: Pin<&mut Watchdog>,
    draining: &Drain,
    first: &FirstRequest,
    closing: &Closing,
) -> Result<bool, Expired> {
    let mut exchange = exchange;
    let drained = async {
        draining.started_wait().await;
        first.wait().await;
    };
    let mut drained = pin!(drained);
    loop {
        tokio::select! {
            biased;
            again = exchange.as_mut() => return Ok(again),
            expired = watchdog.as_mut() => return Err(expired),
            _ = drained.as_mut(), if !closing.get() => closing.set(true),
        }
    }
}

/// Reads until `buf` holds a whole request head. `None`: the client closed or the read
/// failed.
async fn next_head(
    stream: &TcpStream,
    buf: &mut BytesMut,
    phase: &Phase,
    max_head: usize,
) -> Option<Parsed> {
    loop {
        if !buf.is_empty() {
            match request::parse(buf, max_head) {
                Parsed::Partial => {}
                parsed => return Some(parsed),
            }
        }
        stream.readable().await.ok()?;
        if buf.capacity() - buf.len() < READ_SIZE / 4 {
            buf.reserve(READ_SIZE);
        }
        match stream.try_read_buf(buf) {
            Ok(0) => return None,
            Ok(_) => phase.byte_read(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return None,
        }
    }
}

/// What the connection carries over to hyper.
struct Handed {
    proxy: Arc<Proxy>,
    conn: Conn,
    first: Arc<FirstRequest>,
    phase: Arc<Phase>,
    draining: Drain,
}

/// hyper serves the rest of the connection, starting with the bytes in `prefix`.
async fn hand_over(
    stream: TcpStream,
    prefix: Bytes,
    http1: hyper::server::conn::http1::Builder,
    ctx: Handed,
    watchdog: Pin<&mut Watchdog>,
) {
    let Handed {
        proxy,
        conn,
        first,
        phase,
        draining,
    } = ctx;
    let (seen, noted) = (first.clone(), phase.clone());
    let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        seen.mark();
        noted.request();
        let over = ResponseOver::new(&noted);
        let proxy = proxy.clone();
        async move {
            let response = handle(&proxy, req.map(ClientBody::Hyper), conn).await;
            Ok::<_, Infallible>(response.map(|body| Counted::new(body, over)))
        }
    });
    let io = hyper_util::rt::TokioIo::new(Noted::new(
        ChunkGuard::new(rewind::Rewind::new(prefix, stream)),
        phase,
    ));
    let connection = http1.serve_connection(io, service).with_upgrades();
    drive_h1(connection, watchdog, &draining, &first, conn.client).await;
}
