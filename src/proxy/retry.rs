//! The rules for sending a request again, and the mark on the failure the first one
//! needs. Two rules, one place:
//!
//! **Always on: a pooled connection that died under a request (issue 10 §2).** An app closes
//! an idle keep-alive connection (its own timeout, or right after answering) while we pick
//! that connection from the pool and write the next request. The request meets a dead
//! socket and would be a 502. Go's transport re-sends such a request
//! (`persistConn.shouldRetryRequest`); so do we, with Go's rule:
//!
//! - only when the connection had carried an exchange before (a fresh connection that dies
//!   is the app's answer, not a race), and died before any byte of the response came back;
//! - when no byte of the request had been written, or when it is replayable: GET, HEAD,
//!   OPTIONS or TRACE (or it carries an `Idempotency-Key`), without a body;
//! - once, on a new connection that is never pooled.
//!
//! **With `--target-try-duration`: another attempt, perhaps on another target (fork F18).**
//! A request that could not be handed to any target (none healthy) waits and tries again,
//! whatever its method: nothing was sent. A request that was handed to a target goes again
//! only when [`may_try_elsewhere`] says so: it is one of the fork's replayable requests
//! (GET, HEAD, OPTIONS, TRACE, PUT or DELETE, without a body, not an upgrade) and the
//! failure proves the target did not act on it (the connection could not be made:
//! refused, unreachable, reset while connecting) or the target was drained away from
//! under it. A timeout (connecting included), a reset after the request was written, an
//! answer begun: never.
//!
//! A body we streamed is consumed as hyper writes it, so only bodiless requests are re-sent
//! by either rule. The pool ([`super::pool`]) itself re-sends a request (body included)
//! that a reused connection refused before hyper started writing it (as hyper-util's
//! `retry_canceled_requests` did): that "nothing written" case never reaches these rules.
//!
//! When a reused connection fails before the first response byte, the I/O error it reports
//! carries a [`ReusedConnectionClosed`], which [`resend_after`] finds in the error chain
//! (and which the log line shows). Our own connection (`super::http1`, bodiless requests)
//! knows whether it was reused and whether any byte of the answer came, and marks the
//! error itself ([`reused_connection_closed`]); the pool hands the request back with the
//! failure. hyper's error says neither, so on hyper's connections (requests with a body,
//! never re-sent, but the log says why they failed) [`Tracked`] watches the bytes. Nothing
//! is allocated unless that happens.

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};
use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Whether a request that failed with `err` may be sent again, once, on a new connection.
/// `idempotency_key`: it carries one; `bodiless`: it had no body to send.
pub(crate) fn resend_after(
    err: &(dyn StdError + 'static),
    method: &Method,
    idempotency_key: bool,
    bodiless: bool,
) -> bool {
    closed_before_response(err)
        .is_some_and(|c| may_resend(c.written, method, idempotency_key, bodiless))
}

/// [`resend_after`] for a bodiless request that failed with `err` (the pool hands such a
/// request back with its failure).
pub(crate) fn resend_allowed<B>(err: &(dyn StdError + 'static), req: &Request<B>) -> bool {
    let key = req.headers().keys().any(is_idempotency_key);
    resend_after(err, req.method(), key, true)
}

/// Go's rule, for a request whose reused connection died before any response byte.
fn may_resend(written: bool, method: &Method, idempotency_key: bool, bodiless: bool) -> bool {
    bodiless && (!written || replayable(method, idempotency_key))
}

/// Go's `Request.isReplayable` for a request without a body.
fn replayable(method: &Method, idempotency_key: bool) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    ) || idempotency_key
}

/// Fork F18: whether a request may go again, to whichever target the load balancer picks
/// next, after an attempt that failed in a way that allows it (its connection could not
/// be made, or a drain gave up on it before the answer). `bodiless`: it had no body (a
/// known length of zero); `upgrade`: it asks to switch protocols (its client connection
/// cannot be handed over twice).
pub(crate) fn may_try_elsewhere(method: &Method, bodiless: bool, upgrade: bool) -> bool {
    bodiless
        && !upgrade
        && matches!(
            *method,
            Method::GET
                | Method::HEAD
                | Method::OPTIONS
                | Method::TRACE
                | Method::PUT
                | Method::DELETE
        )
}

/// Go's idempotency headers.
fn is_idempotency_key(name: &HeaderName) -> bool {
    name == "idempotency-key" || name == "x-idempotency-key"
}

/// The request as the client sent it, for another attempt with `--target-try-duration`
/// (fork F18), kept only when one may come: its headers are copied into one buffer (one
/// allocation, no reference counts to raise and drop) rather than cloned as a `HeaderMap`
/// (bench/README.md). The extensions are not kept: nothing below reads them. (The
/// always-on re-send needs no copy: the pool hands a bodiless request back with its
/// failure.)
pub(crate) struct Replay {
    method: Method,
    uri: Uri,
    /// Each header as its name's length (u16, little end), its value's length (u32), the
    /// name and the value.
    headers: Vec<u8>,
}

impl Replay {
    pub(crate) fn of(method: &Method, uri: &Uri, fields: &HeaderMap) -> Self {
        let size: usize = fields
            .iter()
            .map(|(n, v)| 6 + n.as_str().len() + v.len())
            .sum();
        let mut headers = Vec::with_capacity(size);
        for (name, value) in fields {
            let (n, v) = (name.as_str().as_bytes(), value.as_bytes());
            // hyper refuses longer heads long before these bounds.
            let (Ok(nl), Ok(vl)) = (u16::try_from(n.len()), u32::try_from(v.len())) else {
                continue;
            };
            headers.extend_from_slice(&nl.to_le_bytes());
            headers.extend_from_slice(&vl.to_le_bytes());
            headers.extend_from_slice(n);
            headers.extend_from_slice(v);
        }
        Replay {
            method: method.clone(),
            uri: uri.clone(),
            headers,
        }
    }

    /// The request again, with `body` (an empty one).
    pub(crate) fn into_request<B>(self, body: B) -> Request<B> {
        let mut req = Request::new(body);
        let headers = req.headers_mut();
        let mut rest = &self.headers[..];
        while rest.len() >= 6 {
            let nl = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
            let vl = u32::from_le_bytes([rest[2], rest[3], rest[4], rest[5]]) as usize;
            let Some(entry) = rest.get(6..6 + nl + vl) else {
                break;
            };
            let (n, v) = entry.split_at(nl);
            // Both were a valid name and value when copied.
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
                headers.append(n, v);
            }
            rest = &rest[6 + nl + vl..];
        }
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = Version::HTTP_11;
        req
    }
}

/// Our mark in the error chain: the `io::Error` our connection (or [`Tracked`]) reports
/// carries it as its payload (`io::Error::source` skips the payload, so look inside each
/// one).
fn closed_before_response<'a>(
    err: &'a (dyn StdError + 'static),
) -> Option<&'a ReusedConnectionClosed> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(mark) = e
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<ReusedConnectionClosed>())
        {
            return Some(mark);
        }
        next = e.source();
    }
    None
}

/// The error of a reused connection that failed before the first byte of its response
/// (`written`: some of the request had gone out), marked for [`resend_after`]. An end of
/// file carries no cause, as [`Tracked`] reports it.
pub(crate) fn reused_connection_closed(e: io::Error, written: bool) -> io::Error {
    let kind = e.kind();
    let cause = (kind != io::ErrorKind::UnexpectedEof).then_some(e);
    io::Error::new(kind, ReusedConnectionClosed { written, cause })
}

/// A reused upstream connection failed before the first byte of its response.
#[derive(Debug)]
pub(crate) struct ReusedConnectionClosed {
    /// Whether any byte of the request had been written.
    written: bool,
    /// The socket's own error; none when it simply reached end of file.
    cause: Option<io::Error>,
}

impl fmt::Display for ReusedConnectionClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.written {
            "reused connection closed before any response byte"
        } else {
            "reused connection closed before the request was written"
        })
    }
}

impl StdError for ReusedConnectionClosed {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.cause.as_ref().map(|e| e as _)
    }
}

/// Where a connection is in its request/response cycle, as its bytes show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing sent yet.
    Fresh,
    /// Last thing seen: bytes from the app (a response, or part of one).
    Answered,
    /// Writing a request, and no byte has come back since.
    Sent { reused: bool },
}

/// An upstream connection that marks the errors of a reused connection that died before
/// answering. Two branches per read or write, no allocation unless it marks an error.
pub(crate) struct Tracked<T> {
    io: T,
    phase: Phase,
}

impl<T> Tracked<T> {
    pub(crate) fn new(io: T) -> Self {
        Tracked {
            io,
            phase: Phase::Fresh,
        }
    }

    /// `Some(written)` when a failure now ends a reused connection before its answer.
    /// `writing`: the failure came from a write, which starts a request if the app had
    /// answered last.
    fn unanswered(&self, writing: bool) -> Option<bool> {
        match self.phase {
            Phase::Sent { reused: true } => Some(true),
            Phase::Answered if writing => Some(false),
            _ => None,
        }
    }

    fn fail(&self, e: io::Error, writing: bool) -> io::Error {
        match self.unanswered(writing) {
            Some(written) => io::Error::new(
                e.kind(),
                ReusedConnectionClosed {
                    written,
                    cause: Some(e),
                },
            ),
            None => e,
        }
    }

    fn wrote(&mut self, n: usize) {
        if n > 0 && !matches!(self.phase, Phase::Sent { .. }) {
            self.phase = Phase::Sent {
                reused: self.phase == Phase::Answered,
            };
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.phase = Phase::Answered;
                Poll::Ready(Ok(()))
            }
            // End of file with room to read: the app closed.
            Poll::Ready(Ok(())) if buf.remaining() > 0 => match this.unanswered(false) {
                Some(written) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    ReusedConnectionClosed {
                        written,
                        cause: None,
                    },
                ))),
                None => Poll::Ready(Ok(())),
            },
            Poll::Ready(Err(e)) => Poll::Ready(Err(this.fail(e, false))),
            other => other,
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => {
                this.wrote(n);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(this.fail(e, true))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => {
                this.wrote(n);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(this.fail(e, true))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
