//! Our own HTTP/1.x server connection, for the HTTP port and HTTP/1.1 over TLS on the HTTPS
//! port (HTTP/2 stays hyper's): it reads plain requests without a
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
pub mod request;
mod response;
mod rewind;
#[cfg(test)]
mod tests;

use bytes::{Bytes, BytesMut};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::chunk_guard::ChunkGuard;
use super::h1_timeouts::{Expired, Noted, Phase, ResponseOver, Watchdog};
use super::idle::Counted;
use super::limits::Timeouts;
use super::{Drain, FirstRequest, Proxy, handle, log_expired};
use crate::proxy::body::{ClientBody, ResponseBody};
use crate::service::Conn;
use http::{Request, Response};
use request::Parsed;
use response::Asked;

/// The largest read (hyper's read buffer is as large).
const READ_SIZE: usize = 8 * 1024;

thread_local! {
    /// Where every connection of this worker thread reads; what came is copied out at
    /// once, so between reads it holds nothing of anyone's.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0; READ_SIZE].into_boxed_slice());
}

/// A client's byte stream, taken apart once per connection so that a response can be
/// written while the connection watches for the client's close.
pub trait Duplex: AsyncRead + AsyncWrite + Unpin + Sized + Send + 'static {
    type Reader: AsyncRead + Unpin + Send;
    type Writer: AsyncWrite + Unpin + Send;
    fn into_halves(self) -> (Self::Reader, Self::Writer);
    fn from_halves(reader: Self::Reader, writer: Self::Writer) -> Self;
}

impl Duplex for TcpStream {
    type Reader = tokio::net::tcp::OwnedReadHalf;
    type Writer = tokio::net::tcp::OwnedWriteHalf;

    fn into_halves(self) -> (Self::Reader, Self::Writer) {
        self.into_split()
    }

    fn from_halves(reader: Self::Reader, writer: Self::Writer) -> Self {
        reader
            .reunite(writer)
            .expect("the two halves of one connection")
    }
}

impl Duplex for tokio_rustls::server::TlsStream<TcpStream> {
    type Reader = tokio::io::ReadHalf<Self>;
    type Writer = tokio::io::WriteHalf<Self>;

    fn into_halves(self) -> (Self::Reader, Self::Writer) {
        tokio::io::split(self)
    }

    fn from_halves(reader: Self::Reader, writer: Self::Writer) -> Self {
        reader.unsplit(writer)
    }
}

/// What a listener answers a request with: the pipeline, and for HTTPS an `Alt-Svc`.
pub trait Respond: Clone + Send + Sync + 'static {
    fn respond(
        &self,
        request: Request<ClientBody>,
        conn: Conn,
    ) -> impl Future<Output = Response<ResponseBody>> + Send;
}

/// The HTTP port's answer: the pipeline's.
impl Respond for Arc<Proxy> {
    fn respond(
        &self,
        request: Request<ClientBody>,
        conn: Conn,
    ) -> impl Future<Output = Response<ResponseBody>> + Send {
        handle(self, request, conn)
    }
}

/// A listener's settings for its HTTP/1 connections.
#[derive(Clone)]
pub struct Settings {
    /// For the requests handed to hyper.
    pub http1: hyper::server::conn::http1::Builder,
    /// `--max-request-header-size`.
    pub max_head: usize,
    pub timeouts: Timeouts,
}

/// Serves one connection to its end.
pub async fn serve<S: Duplex, R: Respond>(
    stream: S,
    conn: Conn,
    respond: R,
    settings: Settings,
    draining: Drain,
) {
    let first = Arc::new(FirstRequest::default());
    let phase = Arc::new(Phase::default());
    let mut watchdog = pin!(Watchdog::new(phase.clone(), settings.timeouts));
    let max_head = settings.max_head;
    let (mut reader, mut writer) = stream.into_halves();
    let mut buf = BytesMut::new();
    let closing = Closing::default();
    loop {
        // The next head, unless the connection closes while idle (a drain closes it at
        // once when no byte of a request has come).
        let parsed = loop {
            let drained = draining.started_after(&first);
            tokio::select! {
                biased;
                r = next_head(&mut reader, &mut buf, &phase, max_head) => break r,
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
                    respond,
                    conn,
                    first,
                    phase,
                    draining,
                };
                let stream = S::from_halves(reader, writer);
                // Boxed: hyper's connection is large, and an unboxed one would size
                // every connection's task, idle or not.
                return Box::pin(hand_over(stream, prefix, settings.http1, ctx, watchdog)).await;
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
            let response = respond.respond(request, conn).await;
            // As hyper: a drain begun before the head goes out says `close` in it.
            let asked = Asked {
                keep_alive: asked.keep_alive && !closing.get(),
                ..asked
            };
            let again = response::write(&mut writer, response, asked).await;
            drop(over);
            again
        });
        let client = Client {
            reader: &mut reader,
            buf: &mut buf,
            max_head,
            phase: &phase,
        };
        let lifeline = Lifeline {
            watchdog: watchdog.as_mut(),
            draining: &draining,
            first: &first,
            closing: &closing,
        };
        match watch(exchange, client, lifeline).await {
            Ended::Done(true) if !closing.get() => {}
            Ended::Done(_) => {
                let _ = writer.shutdown().await;
                return;
            }
            Ended::Expired(expired) => {
                log_expired(expired, conn.client);
                return;
            }
            // The exchange was dropped with its task: the request is cancelled upstream
            // and logged as the client's (499), as when hyper saw the client go.
            Ended::ClientGone => return,
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

/// The client's side of the connection while a request is served: what it sends then
/// (a pipelined request) is kept in `buf`, and its close ends the exchange.
struct Client<'a, R> {
    reader: &'a mut R,
    buf: &'a mut BytesMut,
    max_head: usize,
    phase: &'a Phase,
}

/// What may end a connection while it serves a request.
struct Lifeline<'a> {
    watchdog: Pin<&'a mut Watchdog>,
    draining: &'a Drain,
    first: &'a FirstRequest,
    closing: &'a Closing,
}

enum Ended {
    /// The response went out; `true`: the connection may carry another request.
    Done(bool),
    Expired(Expired),
    /// The client closed the connection (or it failed) before its response was out.
    ClientGone,
}

/// Runs an exchange to its end. The watchdog may close the connection first, and so may
/// the client (hyper, too, drops the request in flight when its client goes); a drain
/// that starts meanwhile marks the connection `closing`.
async fn watch<R: AsyncRead + Unpin>(
    exchange: Pin<Box<impl Future<Output = bool>>>,
    client: Client<'_, R>,
    lifeline: Lifeline<'_>,
) -> Ended {
    let mut exchange = exchange;
    let Lifeline {
        mut watchdog,
        draining,
        first,
        closing,
    } = lifeline;
    let Client {
        reader,
        buf,
        max_head,
        phase,
    } = client;
    let mut drained = pin!(draining.started_after(first));
    loop {
        tokio::select! {
            biased;
            again = exchange.as_mut() => return Ended::Done(again),
            expired = watchdog.as_mut() => return Ended::Expired(expired),
            _ = drained.as_mut(), if !closing.get() => closing.set(true),
            read = read_into(reader, buf), if buf.len() <= max_head => match read {
                Ok(0) | Err(_) => return Ended::ClientGone,
                Ok(_) => phase.byte_read(),
            },
        }
    }
}

/// One read from the client into `buf`.
async fn read_into(reader: &mut (impl AsyncRead + Unpin), buf: &mut BytesMut) -> io::Result<usize> {
    // Through the thread's buffer: the connection's own is as large as what came (usually
    // a head of a few hundred bytes, where an 8 KiB buffer per request cost about 1,200
    // instructions to allocate and free). Through `poll_read`, which after a short read
    // takes the socket as drained: the next read waits for the next readiness event
    // instead of asking the kernel for an EAGAIN.
    std::future::poll_fn(|cx| {
        SCRATCH.with_borrow_mut(|scratch| {
            let mut into = tokio::io::ReadBuf::new(&mut scratch[..]);
            let polled = Pin::new(&mut *reader).poll_read(cx, &mut into);
            if polled.is_ready() {
                buf.extend_from_slice(into.filled());
            }
            polled.map_ok(|()| into.filled().len())
        })
    })
    .await
}

/// Reads until `buf` holds a whole request head. `None`: the client closed or the read
/// failed.
async fn next_head(
    stream: &mut (impl AsyncRead + Unpin),
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
        let read = read_into(stream, buf).await;
        match read {
            Ok(0) | Err(_) => return None,
            Ok(_) => phase.byte_read(),
        }
    }
}

/// What the connection carries over to hyper.
struct Handed<R> {
    respond: R,
    conn: Conn,
    first: Arc<FirstRequest>,
    phase: Arc<Phase>,
    draining: Drain,
}

/// hyper serves the rest of the connection, starting with the bytes in `prefix`.
async fn hand_over<S: Duplex, R: Respond>(
    stream: S,
    prefix: Bytes,
    http1: hyper::server::conn::http1::Builder,
    ctx: Handed<R>,
    watchdog: Pin<&mut Watchdog>,
) {
    let Handed {
        respond,
        conn,
        first,
        phase,
        draining,
    } = ctx;
    let (seen, noted) = (first.clone(), phase.clone());
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        seen.mark();
        noted.request();
        let over = ResponseOver::new(&noted);
        let respond = respond.clone();
        async move {
            let response = respond.respond(req.map(ClientBody::Hyper), conn).await;
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

/// Serves an HTTP/1.x connection to its end. The listener timeouts close it (see
/// [`h1_timeouts`]); when `draining` fires, the request in flight finishes and the
/// connection closes instead of being kept alive.
async fn drive_h1<I, S, B>(
    connection: hyper::server::conn::http1::UpgradeableConnection<I, S>,
    mut watchdog: Pin<&mut Watchdog>,
    draining: &Drain,
    first: &FirstRequest,
    client: SocketAddr,
) where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut connection = std::pin::pin!(connection);
    let mut drained = std::pin::pin!(draining.started_after(first));
    let mut closing = false;
    let result = loop {
        tokio::select! {
            // The watchdog right after the connection: it sees what the connection did.
            biased;
            r = connection.as_mut() => break r,
            expired = watchdog.as_mut() => {
                log_expired(expired, client);
                return;
            }
            _ = drained.as_mut(), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "Connection error");
    }
}
