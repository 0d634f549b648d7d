//! The body types that cross the proxy. Enums rather than boxed trait objects: one less
//! allocation per request, and the hot path (a streamed `Incoming`) is a direct call.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::oneshot;

use super::buffer::BufferedBody;
use super::exchange::Exchange;
use super::http1::body::Http1Body;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client's request body, from where it is read to the target: hyper's stream, a
/// buffered copy (`--buffer-requests`), or none (a bodiless request read by our own
/// HTTP/1 connection, `server::h1`).
///
/// 40 bytes, hyper's `Incoming`'s size: the request (with this) is built where it is read
/// and moved a few times on the way to its exchange, and a copy above 256 bytes costs twice
/// the instructions of one below. What watches a body (its read timers, the signal of its
/// end) is boxed beside it, on the few requests that have one.
pub struct RequestBody(Kind);

const _: () = assert!(std::mem::size_of::<RequestBody>() <= std::mem::size_of::<Incoming>());

enum Kind {
    Empty,
    Stream(Incoming),
    Watched(Box<Watched>),
}

/// A body with a timer on its reading or a signal of its end.
struct Watched {
    source: Source,
    /// Dropped once the body has been handed over in full (or abandoned): the
    /// `--target-timeout` wait for response headers starts then.
    sent: Option<oneshot::Sender<()>>,
    /// `--body-read-timeout`, for a body still coming from the client.
    silence: Option<Silence>,
    /// `--read-timeout`: when the whole body must have come.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

enum Source {
    Stream(Incoming),
    Buffered(BufferedBody),
}

/// How long the client has left us waiting for the next byte of its body. The clock
/// runs only while we are asking for one: an app that reads slowly (and so stops asking)
/// does not count against the client.
struct Silence {
    limit: std::time::Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    waiting: bool,
}

impl Silence {
    /// Called when the client has nothing for us: whether it has been silent too long.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.waiting {
            self.waiting = true;
            let at = tokio::time::Instant::now() + self.limit;
            self.timer.as_mut().reset(at);
        }
        self.timer.as_mut().poll(cx).is_ready()
    }
}

/// The client sent no byte of its body for `--body-read-timeout`, or not all of it within
/// `--read-timeout`.
#[derive(Debug)]
pub struct BodyReadTimeout;

impl std::fmt::Display for BodyReadTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request body read timed out")
    }
}

impl std::error::Error for BodyReadTimeout {}

impl RequestBody {
    pub fn stream(b: Incoming) -> Self {
        RequestBody(Kind::Stream(b))
    }

    pub fn buffered(b: BufferedBody) -> Self {
        RequestBody(Kind::Watched(Box::new(Watched::of(Source::Buffered(b)))))
    }

    pub fn empty() -> Self {
        RequestBody(Kind::Empty)
    }

    /// Fails the body with [`BodyReadTimeout`] when the client sends nothing for
    /// `silence` while we wait for it, or is still sending it at `deadline` (`None`: no
    /// such limit). Set in place, once the request is admitted: the request is built with
    /// this type where it is read and borrowed by the layers below, never rebuilt. A body
    /// that has already ended pays for no timer.
    pub fn limit_reading(
        &mut self,
        silence: Option<std::time::Duration>,
        deadline: Option<tokio::time::Instant>,
    ) {
        if self.is_end_stream() || (silence.is_none() && deadline.is_none()) {
            return;
        }
        let Some(watched) = self.watched() else {
            return;
        };
        if let Some(limit) = silence {
            watched.silence = Some(Silence {
                limit,
                timer: Box::pin(tokio::time::sleep(limit)),
                waiting: false,
            });
        }
        if let Some(at) = deadline {
            watched.deadline = Some(Box::pin(tokio::time::sleep_until(at)));
        }
    }

    /// Resolves once the whole body has been sent; `None` when there is nothing to send
    /// (the common bodiless request pays for no channel).
    pub fn track_sent(&mut self) -> Option<oneshot::Receiver<()>> {
        if self.is_end_stream() {
            return None;
        }
        let watched = self.watched()?;
        let (tx, rx) = oneshot::channel();
        watched.sent = Some(tx);
        Some(rx)
    }

    /// The body, watched from now on (`None` when there is none).
    fn watched(&mut self) -> Option<&mut Watched> {
        if matches!(self.0, Kind::Stream(_)) {
            self.0 = match std::mem::replace(&mut self.0, Kind::Empty) {
                Kind::Stream(incoming) => {
                    Kind::Watched(Box::new(Watched::of(Source::Stream(incoming))))
                }
                other => other,
            };
        }
        match &mut self.0 {
            Kind::Watched(watched) => Some(watched),
            Kind::Empty | Kind::Stream(_) => None,
        }
    }
}

impl Watched {
    fn of(source: Source) -> Watched {
        Watched {
            source,
            sent: None,
            silence: None,
            deadline: None,
        }
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled: Poll<Option<Result<Frame<Bytes>, BoxError>>> = match &mut self.source {
            Source::Stream(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Source::Buffered(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
        };
        if let Some(silence) = self.silence.as_mut() {
            if polled.is_ready() {
                silence.waiting = false;
            } else if silence.expired(cx) {
                self.silence = None;
                self.sent = None;
                return Poll::Ready(Some(Err(Box::new(BodyReadTimeout))));
            }
        }
        if let Some(deadline) = self.deadline.as_mut() {
            match polled {
                Poll::Ready(None) => self.deadline = None,
                // Only while the client keeps us waiting: what it has sent is taken.
                Poll::Pending if deadline.as_mut().poll(cx).is_ready() => {
                    self.deadline = None;
                    self.silence = None;
                    self.sent = None;
                    return Poll::Ready(Some(Err(Box::new(BodyReadTimeout))));
                }
                _ => {}
            }
        }
        if self.sent.is_some() && (matches!(polled, Poll::Ready(None)) || self.is_end_stream()) {
            self.sent = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Stream(b) => b.is_end_stream(),
            Source::Buffered(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Stream(b) => b.size_hint(),
            Source::Buffered(b) => b.size_hint(),
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().0 {
            Kind::Empty => Poll::Ready(None),
            Kind::Stream(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Kind::Watched(w) => w.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.0 {
            Kind::Empty => true,
            Kind::Stream(b) => b.is_end_stream(),
            Kind::Watched(w) => w.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Stream(b) => b.size_hint(),
            Kind::Watched(w) => w.size_hint(),
        }
    }
}

/// A target's response body, read by hyper's connection or by our own.
pub(crate) enum UpstreamBody {
    Hyper(Incoming),
    Own(Http1Body),
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            UpstreamBody::Own(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Hyper(b) => b.is_end_stream(),
            UpstreamBody::Own(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Hyper(b) => b.size_hint(),
            UpstreamBody::Own(b) => b.size_hint(),
        }
    }
}

enum Inner {
    Stream(UpstreamBody),
    Buffered(BufferedBody),
    Full(Option<Bytes>),
}

/// What we send to the client. It carries the request's [`Exchange`], which writes the
/// access log and releases the in-flight counts when the body ends or is dropped — so a
/// streamed response counts as traffic until its last byte.
pub struct ResponseBody {
    inner: Inner,
    sent: u64,
    exchange: Option<Exchange>,
    /// `--request-timeout` still running while the body streams: the body is cut off
    /// when it fires.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ResponseBody {
    pub(crate) fn stream(b: UpstreamBody) -> Self {
        Self::new(Inner::Stream(b))
    }

    pub fn buffered(b: BufferedBody) -> Self {
        Self::new(Inner::Buffered(b))
    }

    pub fn full(b: impl Into<Bytes>) -> Self {
        let b = b.into();
        Self::new(Inner::Full(if b.is_empty() { None } else { Some(b) }))
    }

    pub fn empty() -> Self {
        Self::new(Inner::Full(None))
    }

    fn new(inner: Inner) -> Self {
        ResponseBody {
            inner,
            sent: 0,
            exchange: None,
            deadline: None,
        }
    }

    /// Cuts the body off at `at` (the request deadline; headers have already gone out).
    pub fn cut_at(&mut self, at: tokio::time::Instant) {
        self.deadline = Some(Box::pin(tokio::time::sleep_until(at)));
    }

    pub fn attach(&mut self, exchange: Exchange) {
        self.exchange = Some(exchange);
    }

    fn finish(&mut self) {
        if let Some(c) = self.exchange.take() {
            c.finish(self.sent);
        }
    }
}

/// A response on its way to the client, on the heap from where it is made (an app's,
/// as its head is read) to where it is written: it passes through a dozen futures
/// (the pool's, forward's, the attempts', the service's, the pipeline's, the connection's
/// exchange and its writer), and each of them moved its 240 bytes by value, about 600
/// instructions of `memcpy` a request where a pointer now moves (bench/README.md,
/// "Thirty-second round").
pub type BoxedResponse = Box<http::Response<ResponseBody>>;

/// Hands the exchange to the response: the access log and in-flight counts then end
/// with its body. Every response the proxy returns goes through here.
pub fn finish(mut response: BoxedResponse, mut exchange: Exchange) -> BoxedResponse {
    exchange.set_response(response.status().as_u16(), response.headers());
    response.body_mut().attach(exchange);
    response
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.exchange.as_ref().is_some_and(Exchange::cancelled) {
            // A drain gave up on this request: cut the stream.
            this.finish();
            return Poll::Ready(Some(Err("request cancelled due to draining".into())));
        }
        if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                this.deadline = None;
                this.finish();
                return Poll::Ready(Some(Err("request deadline exceeded".into())));
            }
        }
        let polled: Poll<Option<Result<Frame<Bytes>, BoxError>>> = match &mut this.inner {
            Inner::Stream(b) => Pin::new(b).poll_frame(cx),
            Inner::Buffered(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            Inner::Full(b) => Poll::Ready(b.take().map(|d| Ok(Frame::data(d)))),
        };
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.sent += d.len() as u64;
                }
            }
            Poll::Ready(None) => this.finish(),
            Poll::Ready(Some(Err(_))) => this.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Stream(b) => b.is_end_stream(),
            Inner::Buffered(b) => b.is_end_stream(),
            Inner::Full(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Stream(b) => b.size_hint(),
            Inner::Buffered(b) => b.size_hint(),
            Inner::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}
