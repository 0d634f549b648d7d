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
use std::task::Poll;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::chunk_guard::ChunkGuard;
use super::h1_timeouts::{Expired, Noted, Phase, ResponseOver, Watchdog};
use super::idle::Counted;
use super::limits::Timeouts;
use super::shutdown::DrainWait;
use super::shutdown::FIRST_REQUEST_WAIT;
use super::{Drain, FirstRequest, Heard, Proxy, handle, log_expired};
use crate::proxy::body::{BoxedResponse, RequestBody};
use crate::raw_tcp;
use crate::recycle::Recycled;
use crate::service::Conn;
use http::Request;
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

/// A client's byte stream, taken apart (borrowed, not shared: no allocation for a plain
/// TCP connection) so that a response can be written while the connection watches for the
/// client's close.
pub trait Duplex: AsyncRead + AsyncWrite + Unpin + Sized + Send + 'static {
    type Reader<'a>: AsyncRead + Unpin + Send
    where
        Self: 'a;
    type Writer<'a>: AsyncWrite + Unpin + Send
    where
        Self: 'a;
    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>);
}

/// Reads and writes as bare system calls (`raw_tcp`), not through glibc's wrappers.
impl Duplex for TcpStream {
    type Reader<'a> = raw_tcp::Half<'a>;
    type Writer<'a> = raw_tcp::Half<'a>;

    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>) {
        (raw_tcp::Half(self), raw_tcp::Half(self))
    }
}

impl Duplex for tokio_rustls::server::TlsStream<TcpStream> {
    type Reader<'a> = tokio::io::ReadHalf<&'a mut Self>;
    type Writer<'a> = tokio::io::WriteHalf<&'a mut Self>;

    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>) {
        tokio::io::split(self)
    }
}

/// What a listener answers a request with: the pipeline, and for HTTPS an `Alt-Svc`.
/// The request is borrowed: it stays where it was read for the whole exchange.
pub trait Respond: Clone + Send + Sync + 'static {
    fn respond<'a>(
        &'a self,
        request: &'a mut Request<RequestBody>,
        conn: Conn,
    ) -> impl Future<Output = BoxedResponse> + Send + 'a;
}

/// The HTTP port's answer: the pipeline's.
impl Respond for Arc<Proxy> {
    fn respond<'a>(
        &'a self,
        request: &'a mut Request<RequestBody>,
        conn: Conn,
    ) -> impl Future<Output = BoxedResponse> + Send + 'a {
        handle(self, request, conn)
    }
}

/// A listener's settings for its HTTP/1 connections, shared by all of them.
pub struct Settings {
    /// For the requests handed to hyper.
    pub http1: hyper::server::conn::http1::Builder,
    /// `--max-request-header-size`.
    pub max_head: usize,
    pub timeouts: Timeouts,
}

impl Settings {
    pub fn new(limits: &super::limits::Limits) -> Arc<Settings> {
        Arc::new(Settings {
            http1: super::http1_builder(limits),
            max_head: limits.max_header_bytes,
            timeouts: limits.timeouts,
        })
    }
}

/// Serves one connection to its end.
///
/// Its task lives as long as the connection, idle or not, and is as large as this
/// future: what a request needs beyond the head is boxed (the exchange) or kept out of
/// the locals that outlive an `.await` (see `begin`). A function returning an `async`
/// block, not an `async fn`: that would keep each argument twice, as passed and as moved
/// into its body (92 bytes of every connection's task).
#[allow(clippy::manual_async_fn)]
pub fn serve<S: Duplex, R: Respond>(
    mut stream: S,
    conn: Conn,
    respond: R,
    settings: Arc<Settings>,
    draining: Drain,
) -> impl Future<Output = ()> + Send {
    async move {
        // In a block: a local once borrowed (here by `clone`) keeps its room in the task
        // until its scope ends, even after it is moved.
        let (phase, watchdog) = {
            let phase = Arc::new(Phase::default());
            let watchdog = Watchdog::new(phase.clone(), &settings.timeouts);
            (phase, watchdog)
        };
        let mut watchdog = pin!(watchdog);
        let closing = Closing::default();
        let mut served = false;
        let (phase, buf) = {
            // Registered with the drain once for the connection's life, not once a request
            // (each registration takes the drain's lock twice, to join its list and leave).
            let drained = pin!(draining.started_wait());
            // The connection's state between requests, in as few places as it fits: each
            // binding kept across an `.await` takes room in every connection's task.
            let mut lifeline = Lifeline {
                watchdog: watchdog.as_mut(),
                drained,
                closing: &closing,
            };
            let (reader, mut writer) = stream.halves();
            let mut head = Head {
                reader,
                buf: BytesMut::new(),
                phase,
                max_head: settings.max_head,
            };
            loop {
                // Matched as a temporary: a request bound to a local would keep its room in
                // this future across the exchange's `.await`, idle or not.
                let exchange = match next_request(&mut head, &mut lifeline, served).await {
                    Next::Head(Parsed::Request {
                        request,
                        keep_alive,
                    }) => begin(
                        request,
                        keep_alive,
                        &respond,
                        conn,
                        &mut writer,
                        &closing,
                        &head.phase,
                    ),
                    Next::Head(_) => break,
                    Next::Expired(expired) => {
                        log_expired(expired, conn.client);
                        return;
                    }
                    Next::Closed => return,
                };
                served = true;
                if head.buf.is_empty() {
                    // Nothing pipelined behind it: the buffer goes (the parsed request keeps
                    // its part alive until it is done), and the idle connection holds none.
                    head.buf = BytesMut::new();
                }
                match watch(exchange, &mut head, &mut lifeline).await {
                    Ended::Done(true) if !closing.get() => {}
                    Ended::Done(_) => {
                        let _ = writer.shutdown().await;
                        return;
                    }
                    Ended::Expired(expired) => {
                        log_expired(expired, conn.client);
                        return;
                    }
                    // The exchange was dropped with its task: the request is cancelled
                    // upstream and logged as the client's (499), as when hyper saw the
                    // client go.
                    Ended::ClientGone => return,
                }
            }
            (head.phase, head.buf)
        };
        // A request ours does not take: hyper serves the rest of the connection.
        let first = Arc::new(FirstRequest::default());
        if served {
            first.mark();
        }
        let ctx = Handed {
            respond,
            conn,
            first,
            phase,
            draining,
        };
        let prefix = buf.freeze();
        // Boxed: hyper's connection is large, and an unboxed one would size every
        // connection's task, idle or not.
        Box::pin(hand_over(stream, prefix, &settings.http1, ctx, watchdog)).await
    }
}

/// A request's exchange with the pipeline: its response, written. `true`: the connection
/// may carry another request. On the heap, in a block the thread reuses
/// ([`Recycled`]): a connection's task holds only what it needs between requests.
fn begin<'a, R: Respond>(
    mut request: Request<RequestBody>,
    keep_alive: bool,
    respond: &'a R,
    conn: Conn,
    writer: &'a mut (impl AsyncWrite + Unpin + Send),
    closing: &'a Closing,
    phase: &Arc<Phase>,
) -> Recycled<impl Future<Output = bool> + Send + 'a> {
    phase.request();
    let over = ResponseOver::new(phase);
    let asked = Asked::of(&request, keep_alive);
    // This connection's task polls the exchange again after every word of a drain
    // (`watch`), so the request need not wait on its target's cut itself.
    let conn = Conn {
        watches_cuts: true,
        ..conn
    };
    Recycled::new(async move {
        // The request lives here, borrowed by the whole pipeline, until its answer is
        // written. (Moved into a block of its own to be dropped as the answer came, it was
        // copied once more a request.)
        let response = respond.respond(&mut request, conn).await;
        // As hyper: a drain begun before the head goes out says `close` in it.
        let asked = Asked {
            keep_alive: asked.keep_alive && !closing.get(),
            ..asked
        };
        let again = response::write(writer, response, asked).await;
        drop(over);
        again
    })
}

// The head's variant is large, and boxing it would cost an allocation a request; `Next`
// only passes between two calls (`serve` matches it as a temporary).
#[allow(clippy::large_enum_variant)]
enum Next {
    Head(Parsed),
    Expired(Expired),
    /// The client closed the connection, or it was idle when a drain began.
    Closed,
}

/// Waits for the next request head. A drain closes an idle connection at once; a
/// connection that has served nothing yet gets [`FIRST_REQUEST_WAIT`] for its first
/// request (the client connected an instant before the drain and is sending it).
///
/// Not an `async fn`, which would keep its arguments twice in every idle connection's
/// task (see [`serve`]).
#[allow(clippy::manual_async_fn)]
fn next_request<'a, R: AsyncRead + Unpin>(
    head: &'a mut Head<R>,
    lifeline: &'a mut Lifeline<'_, '_, '_, '_>,
    served: bool,
) -> impl Future<Output = Next> + 'a {
    // The fields are used in place, not bound to locals: every binding kept across an
    // `.await` takes room in each idle connection's task.
    async move {
        loop {
            let wait = HeadWait {
                head: &mut *head,
                lifeline: &mut *lifeline,
            };
            if let Some(next) = wait.await {
                return next;
            }
            // The drain has begun. (Not awaited inside the wait, whose output, as large as
            // a request, would then take room in every connection's task.)
            lifeline.closing.set(true);
            if head.buf.is_empty() && served {
                return Next::Closed;
            }
            if head.buf.is_empty() {
                // Boxed: only a drain waits here, and an unboxed timer would take room in
                // every connection's task.
                match Box::pin(tokio::time::timeout(FIRST_REQUEST_WAIT, head.next())).await {
                    Ok(r) => return r.map_or(Next::Closed, Next::Head),
                    Err(_) if head.buf.is_empty() => return Next::Closed,
                    Err(_) => {}
                }
            }
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

/// The client's side of the connection: what it sends is kept in `buf` (while a request is
/// served: a pipelined request), and its close ends the connection. Owned, not borrowed
/// from the connection's locals: every reference kept across an `.await` takes room in
/// the connection's task.
struct Head<R> {
    reader: R,
    buf: BytesMut,
    max_head: usize,
    phase: Arc<Phase>,
}

impl<R: AsyncRead + Unpin> Head<R> {
    /// The next request head (see [`Head::poll_next`]). A poll function over the
    /// connection's own fields, not an `async fn`: its future is one reference, where an
    /// `async fn` kept its arguments twice and its read's future beside them (112 bytes
    /// of every idle connection's task).
    fn next(&mut self) -> impl Future<Output = Option<Parsed>> + '_ {
        std::future::poll_fn(move |cx| self.poll_next(cx))
    }

    /// Reads until `buf` holds a whole request head. `None`: the client closed or the
    /// read failed.
    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Option<Parsed>> {
        loop {
            if !self.buf.is_empty() {
                match request::parse(&mut self.buf, self.max_head) {
                    Parsed::Partial => {}
                    parsed => return Poll::Ready(Some(parsed)),
                }
            }
            match std::task::ready!(poll_read_into(cx, &mut self.reader, &mut self.buf)) {
                Ok(0) | Err(_) => return Poll::Ready(None),
                Ok(_) => self.phase.byte_read(),
            }
        }
    }
}

/// What may end a connection, idle or serving a request.
struct Lifeline<'w, 't, 'd, 'l> {
    watchdog: Pin<&'w mut Watchdog<'t>>,
    drained: Pin<&'d mut DrainWait<'l>>,
    closing: &'l Closing,
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
///
/// Not an `async fn`, which would keep its arguments twice in every connection's task
/// (see [`serve`]).
fn watch<'a, 'w, 't, 'd, 'l, R: AsyncRead + Unpin, F: Future<Output = bool>>(
    exchange: Recycled<F>,
    client: &'a mut Head<R>,
    lifeline: &'a mut Lifeline<'w, 't, 'd, 'l>,
) -> Watch<'a, 'w, 't, 'd, 'l, R, F> {
    Watch {
        exchange,
        client,
        lifeline,
    }
}

// The waits of an idle connection and of a request in flight, each as one struct rather
// than an `async fn` around a `select!`: every connection's task is as large as the larger
// of the two, and the `async fn` kept its arguments twice, the `select!` its futures and a
// poll function beside them (224 bytes for the exchange's wait, 104 now; 264 and 120 for
// the head's, whose drain-time timer is boxed). The connection's task went from 768 to
// 640 bytes (bench/README.md, "Ninth round"), and to 512 with the watchdog's timer in its
// thread's alarm table ("Thirtieth round"). Both poll the connection's one registration
// with the drain, which lives in `Lifeline`.
/// The next request head, or what ends an idle connection first (the watchdog, and the
/// drain unless `closing` already). `None`: the drain has begun.
struct HeadWait<'a, 'w, 't, 'd, 'l, R> {
    head: &'a mut Head<R>,
    lifeline: &'a mut Lifeline<'w, 't, 'd, 'l>,
}

impl<R: AsyncRead + Unpin> Future for HeadWait<'_, '_, '_, '_, '_, R> {
    type Output = Option<Next>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Option<Next>> {
        let this = self.get_mut();
        if let Poll::Ready(r) = this.head.poll_next(cx) {
            return Poll::Ready(Some(r.map_or(Next::Closed, Next::Head)));
        }
        // The watchdog right after the reader: it sees what the read did.
        if let Poll::Ready(expired) = this.lifeline.watchdog.as_mut().poll(cx) {
            return Poll::Ready(Some(Next::Expired(expired)));
        }
        if !this.lifeline.closing.get()
            && this.lifeline.drained.as_mut().poll_heard(cx) == Poll::Ready(Heard::Started)
        {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

/// See [`watch`].
struct Watch<'a, 'w, 't, 'd, 'l, R, F> {
    exchange: Recycled<F>,
    client: &'a mut Head<R>,
    lifeline: &'a mut Lifeline<'w, 't, 'd, 'l>,
}

impl<R: AsyncRead + Unpin, F: Future<Output = bool>> Future for Watch<'_, '_, '_, '_, '_, R, F> {
    type Output = Ended;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Ended> {
        let this = self.get_mut();
        if let Poll::Ready(again) = Pin::new(&mut this.exchange).poll(cx) {
            return Poll::Ready(Ended::Done(again));
        }
        if let Poll::Ready(expired) = this.lifeline.watchdog.as_mut().poll(cx) {
            return Poll::Ready(Ended::Expired(expired));
        }
        match this.lifeline.drained.as_mut().poll_heard(cx) {
            Poll::Ready(Heard::Started) => this.lifeline.closing.set(true),
            // A target's drain cut its requests: the exchange looks whether it is one of
            // them when polled again (it does not wait on its target itself, see `begin`).
            Poll::Ready(Heard::Other) => cx.waker().wake_by_ref(),
            Poll::Pending => {}
        }
        // A pipelined request is kept (up to a head's worth); a close ends the exchange.
        let client = &mut *this.client;
        while client.buf.len() <= client.max_head {
            match poll_read_into(cx, &mut client.reader, &mut client.buf) {
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(Ended::ClientGone),
                Poll::Ready(Ok(_)) => client.phase.byte_read(),
                Poll::Pending => break,
            }
        }
        Poll::Pending
    }
}

/// Polls one read from the client into `buf`.
fn poll_read_into(
    cx: &mut std::task::Context<'_>,
    reader: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    // Through the thread's buffer: the connection's own is as large as what came (usually
    // a head of a few hundred bytes, where an 8 KiB buffer per request cost about 1,200
    // instructions to allocate and free). Through `poll_read`, which after a short read
    // takes the socket as drained: the next read waits for the next readiness event
    // instead of asking the kernel for an EAGAIN.
    SCRATCH.with_borrow_mut(|scratch| {
        let mut into = tokio::io::ReadBuf::new(&mut scratch[..]);
        let polled = Pin::new(&mut *reader).poll_read(cx, &mut into);
        if polled.is_ready() {
            buf.extend_from_slice(into.filled());
        }
        polled.map_ok(|()| into.filled().len())
    })
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
    http1: &hyper::server::conn::http1::Builder,
    ctx: Handed<R>,
    watchdog: Pin<&mut Watchdog<'_>>,
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
            let mut req = req.map(RequestBody::stream);
            let response = respond.respond(&mut req, conn).await;
            Ok::<_, Infallible>((*response).map(|body| Counted::new(body, over)))
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
    mut watchdog: Pin<&mut Watchdog<'_>>,
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
