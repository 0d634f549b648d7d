//! Our own HTTP/1.1 client connection to a target, for requests without a body.
//!
//! hyper's client connection runs in a task of its own: every exchange crosses from the
//! request's task to it and back (a dispatch channel and a wake-up each way, the response
//! body through another channel), about 13,000 instructions a request in all
//! (bench/README.md). A request without a body needs little of that machinery, so this
//! connection is driven by the request's own task: the head is written with one `write`,
//! the response head is read until `httparse` completes it, and the body is read from the
//! socket by the response body itself ([`body::UpstreamBody`]). A response whose body came
//! with its head (the usual small answer) hands the connection back to the pool before
//! its body is even polled.
//!
//! Requests with a body, and upgrades, still go through hyper's connection
//! ([`super::pool`]); so does anything this module does not parse as hyper would
//! (obsolete line folding is refused by both).

pub(crate) mod body;
pub(crate) mod chunked;
#[cfg(test)]
mod tests;

use super::headers::has_token;
use super::proxy_fields::ProxyFields;
use crate::raw_tcp;
use crate::short_copy::append;
use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode, Version};
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// hyper's limits, so a target's answer is refused here exactly where it was before.
const MAX_HEADERS: usize = 100;
const MAX_HEAD_BYTES: usize = 8192 + 4096 * 100;
/// How much room a read asks for: from the first, doubled while reads fill it (a large
/// body then costs fewer system calls), back to the first for each response.
const READ_SIZE: usize = 8192;
const MAX_READ_SIZE: usize = 256 * 1024;

/// One connection to a target.
pub(crate) struct Connection {
    io: TcpStream,
    /// Bytes read from the target and not used yet.
    buf: BytesMut,
    /// The request head being written; its capacity is kept for the next one.
    out: Vec<u8>,
    /// It has carried an exchange to its end before: a failure before the answer may be
    /// the app closing it while we picked it (see `retry.rs`).
    reused: bool,
    read_size: usize,
    /// Where each field's name and value lie in the head being parsed (kept for the next
    /// head: no allocation, and no 100-entry array to clear, per response).
    spans: Vec<[u32; 4]>,
    /// The target's time to answer (`--target-timeout`): one timer for the connection's
    /// life, moved later for each exchange. Moving a registered timer later is one atomic
    /// exchange; a timer made for each request and dropped after it was registered with
    /// the runtime's timer wheel and taken out again, under its lock (about 540
    /// instructions a request). Made at the first exchange that has a limit.
    timer: Option<Pin<Box<Sleep>>>,
}

/// The head of a target's response, and how its body is framed.
pub(crate) struct Head {
    pub(crate) response: http::response::Parts,
    pub(crate) framing: Framing,
    /// The connection may carry another exchange once this body has been read.
    pub(crate) keep_alive: bool,
    /// The head's size on the wire.
    pub(crate) bytes: usize,
    /// The size of the request head that was written.
    pub(crate) request_bytes: usize,
}

/// How the end of a response body is found (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body: a HEAD request, a 1xx, 204 or 304 answer.
    Empty,
    Length(u64),
    Chunked,
    /// Everything until the target closes the connection.
    UntilClose,
}

/// Why an exchange failed.
#[derive(Debug)]
pub(crate) enum SendError {
    /// Not a byte of the request was written: it may go on another connection as it is.
    Unsent(io::Error),
    Failed(Error),
    /// The answer did not begin within the time given (the request was written).
    TimedOut,
}

/// A failure of the exchange after the request began.
#[derive(Debug)]
pub(crate) struct Error {
    kind: ErrorKind,
    cause: Option<io::Error>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorKind {
    /// The target closed before its answer was complete (hyper's wording).
    Incomplete,
    Io,
    InvalidHead,
    HeadTooLarge,
    InvalidLength,
    InvalidChunk,
}

impl Error {
    fn new(kind: ErrorKind, cause: Option<io::Error>) -> Self {
        Error { kind, cause }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.kind {
            ErrorKind::Incomplete => "connection closed before message completed",
            ErrorKind::Io => "connection error",
            ErrorKind::InvalidHead => "invalid HTTP response head",
            ErrorKind::HeadTooLarge => "response head too large",
            ErrorKind::InvalidLength => "invalid content-length in response",
            ErrorKind::InvalidChunk => "invalid chunked body in response",
        })
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_ref().map(|e| e as _)
    }
}

impl Connection {
    pub(crate) fn new(io: TcpStream) -> Self {
        Connection {
            io,
            buf: BytesMut::new(),
            out: Vec::new(),
            reused: false,
            read_size: READ_SIZE,
            spans: Vec::new(),
            timer: None,
        }
    }

    /// Lets go of a read buffer a large answer grew, before the connection idles.
    pub(crate) fn shrink_idle(&mut self) {
        if self.buf.capacity() > 2 * READ_SIZE {
            self.buf = BytesMut::new();
        }
    }

    /// Whether the target has closed this idle connection (or sent bytes nobody asked
    /// for, which makes it as unusable). No system call unless the socket has become
    /// readable since its last exchange.
    pub(crate) fn is_closed(&self) -> bool {
        let mut probe = [0u8; 1];
        match self.io.try_read(&mut probe) {
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
            Ok(_) => true,
        }
    }

    /// Writes a request without a body (`path`: its path and query; `fields`: the proxy's,
    /// in place of the client's of the same names) and reads the head of the answer,
    /// skipping informational (1xx) answers other than 101 as hyper does.
    /// `answer_within`: how long the head may take once the request is written (Go's
    /// `ResponseHeaderTimeout`).
    pub(crate) async fn send(
        &mut self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        fields: &ProxyFields<'_>,
        answer_within: Option<Duration>,
    ) -> Result<Head, SendError> {
        self.write_head(method, path, headers, fields);
        self.write_out().await?;
        if let Some(limit) = answer_within {
            self.arm(limit);
        }
        let timed = answer_within.is_some();
        self.read_size = READ_SIZE;
        // Any byte of an answer (an informational one included) came back.
        let mut answered = false;
        loop {
            if !self.buf.is_empty() {
                if let Some(head) = self.parse_head(method)? {
                    return Ok(head);
                }
            }
            if self.buf.len() >= MAX_HEAD_BYTES {
                return Err(SendError::Failed(Error::new(ErrorKind::HeadTooLarge, None)));
            }
            let read = std::future::poll_fn(|cx| {
                let read = self.poll_fill(cx);
                if read.is_pending() && timed && self.poll_timer(cx).is_ready() {
                    return Poll::Ready(None);
                }
                read.map(Some)
            })
            .await;
            let Some(read) = read else {
                return Err(SendError::TimedOut);
            };
            match read {
                Ok(0) => {
                    let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
                    return Err(SendError::Failed(self.failed_before_answer(eof, answered)));
                }
                Ok(_) => answered = true,
                Err(e) => return Err(SendError::Failed(self.failed_before_answer(e, answered))),
            }
        }
    }

    /// Sets the timer to fire `limit` from now.
    fn arm(&mut self, limit: Duration) {
        let due = crate::clock::now() + limit;
        match &mut self.timer {
            // Later than before unless the limit shrank (a `--path-timeout`) or the timer
            // already fired while the connection idled; either way `reset` re-registers it.
            Some(timer) => timer.as_mut().reset(due),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(due))),
        }
    }

    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.timer {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    /// The error for a read that failed: a reused connection that died before any byte
    /// of the answer is marked for `retry.rs`'s re-send rule.
    fn failed_before_answer(&self, e: io::Error, answered: bool) -> Error {
        if !answered && self.reused {
            return Error::new(
                ErrorKind::Io,
                Some(super::retry::reused_connection_closed(e, true)),
            );
        }
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Error::new(ErrorKind::Incomplete, None)
        } else {
            Error::new(ErrorKind::Io, Some(e))
        }
    }

    /// The request line and fields, as hyper writes them (names as the map holds them,
    /// lower-case; no `Transfer-Encoding`: there is no body to frame), the proxy's last.
    fn write_head(
        &mut self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        fields: &ProxyFields<'_>,
    ) {
        // The buffer keeps its capacity from one request to the next: no sizing pass.
        let out = &mut self.out;
        out.clear();
        append(out, method.as_str().as_bytes());
        out.push(b' ');
        append(out, path.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in headers {
            if name == header::TRANSFER_ENCODING || ProxyFields::replaces(name) {
                continue;
            }
            append(out, name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            append(out, value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        fields.write(out);
        out.extend_from_slice(b"\r\n");
    }

    /// Writes the head. `Unsent` when the connection failed before taking any of it.
    async fn write_out(&mut self) -> Result<(), SendError> {
        let mut at = 0;
        while at < self.out.len() {
            match raw_tcp::Half(&self.io).write(&self.out[at..]).await {
                Ok(0) => {
                    let e = io::Error::from(io::ErrorKind::WriteZero);
                    return Err(self.failed_writing(e, at));
                }
                Ok(n) => at += n,
                Err(e) => return Err(self.failed_writing(e, at)),
            }
        }
        Ok(())
    }

    fn failed_writing(&self, e: io::Error, written: usize) -> SendError {
        if written == 0 {
            return SendError::Unsent(e);
        }
        let cause = if self.reused {
            super::retry::reused_connection_closed(e, true)
        } else {
            e
        };
        SendError::Failed(Error::new(ErrorKind::Io, Some(cause)))
    }

    /// Reads what the socket has into the buffer; `Ok(0)` at end of file.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < self.read_size / 4 {
            self.buf.reserve(self.read_size);
        }
        let room = self.buf.capacity() - self.buf.len();
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut raw_tcp::Half(&self.io)),
            cx,
            &mut self.buf
        ))?;
        if n == room {
            self.read_size = (self.read_size * 2).min(MAX_READ_SIZE);
        }
        Poll::Ready(Ok(n))
    }

    /// The response head, once the buffer holds all of it (`None`: read more).
    fn parse_head(&mut self, method: &Method) -> Result<Option<Head>, SendError> {
        let invalid = || SendError::Failed(Error::new(ErrorKind::InvalidHead, None));
        loop {
            let mut fields = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
            let mut parsed = httparse::Response::new(&mut []);
            let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
                &mut parsed,
                &self.buf,
                &mut fields,
            ) {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(httparse::Error::TooManyHeaders) => {
                    return Err(SendError::Failed(Error::new(ErrorKind::HeadTooLarge, None)));
                }
                Err(_) => return Err(invalid()),
            };
            let code = parsed.code.ok_or_else(invalid)?;
            let status = StatusCode::from_u16(code).map_err(|_| invalid())?;
            if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
                // 100 Continue, 103 Early Hints: hyper drops them; so do we.
                let _ = self.buf.split_to(len);
                continue;
            }
            let version = if parsed.version == Some(1) {
                Version::HTTP_11
            } else {
                Version::HTTP_10
            };
            let reason = parsed
                .reason
                .filter(|r| Some(*r) != status.canonical_reason())
                .map(|r| Bytes::copy_from_slice(r.as_bytes()));
            // Offsets rather than slices: the values are cut out of the head's bytes once
            // it is frozen, without a copy. (The head is at most `MAX_HEAD_BYTES`.)
            let base = self.buf.as_ptr() as usize;
            let at = |field: &[u8]| (field.as_ptr() as usize - base) as u32;
            self.spans.clear();
            for field in parsed.headers.iter() {
                let (name, value) = (at(field.name.as_bytes()), at(field.value));
                let (name_len, value_len) = (field.name.len() as u32, field.value.len() as u32);
                self.spans
                    .push([name, name + name_len, value, value + value_len]);
            }
            let head = self.buf.split_to(len).freeze();
            let mut headers = super::header_maps::with_capacity(self.spans.len());
            let mut keep_alive = version == Version::HTTP_11;
            let mut close = false;
            let mut body_fields = BodyFields::default();
            for &[ns, ne, vs, ve] in &self.spans {
                let (ns, ne, vs, ve) = (ns as usize, ne as usize, vs as usize, ve as usize);
                let name = super::headers::name_from_wire(&head[ns..ne]).map_err(|_| invalid())?;
                let raw = &head[vs..ve];
                if name == header::CONNECTION {
                    // Once any `Connection` line asks to close, a later one cannot undo it.
                    if close || has_token(raw, b"close") {
                        close = true;
                        keep_alive = false;
                    } else if !keep_alive {
                        keep_alive = has_token(raw, b"keep-alive");
                    }
                    // Read here, and never passed on: the proxy removes it from every
                    // response. Unless it names other fields, it need not reach the map
                    // (adding it, finding it and removing it cost about 350 instructions
                    // for the usual `Connection: keep-alive`), nor be cut out of the head
                    // (a reference count raised and dropped).
                    if super::headers::connection_names_no_other_field(raw) {
                        continue;
                    }
                }
                // SAFETY: httparse accepted these bytes as a field value, and its set
                // (HTAB, SP through `~`, 0x80 and above) is the one `HeaderValue` allows.
                let value = unsafe { HeaderValue::from_maybe_shared_unchecked(head.slice(vs..ve)) };
                if name == header::CONTENT_LENGTH {
                    body_fields.content_length(value.as_bytes());
                } else if name == header::TRANSFER_ENCODING {
                    body_fields.transfer_encoding = Some(value.clone());
                }
                headers.append(name, value);
            }
            let framing = framing(status, method, version, body_fields)
                .map_err(|kind| SendError::Failed(Error::new(kind, None)))?;
            let (mut response, ()) = http::Response::new(()).into_parts();
            response.status = status;
            response.version = version;
            response.headers = headers;
            if let Some(reason) = reason {
                if let Ok(reason) = hyper::ext::ReasonPhrase::try_from(reason) {
                    response.extensions.insert(reason);
                }
            }
            // A 101 switched the connection to another protocol: it carries no more HTTP.
            let keep_alive = keep_alive
                && status != StatusCode::SWITCHING_PROTOCOLS
                && framing != Framing::UntilClose;
            self.reused = true;
            return Ok(Some(Head {
                response,
                framing,
                keep_alive,
                bytes: len,
                request_bytes: self.out.len(),
            }));
        }
    }
}

/// What a response head says of its body, noted field by field as it is read (looking
/// the fields up in the map afterwards cost about 200 instructions a response).
struct BodyFields {
    /// The last `Transfer-Encoding` line.
    transfer_encoding: Option<HeaderValue>,
    /// The length all `Content-Length` values agree on so far, or why they do not.
    length: Result<Option<u64>, ErrorKind>,
}

impl Default for BodyFields {
    fn default() -> Self {
        BodyFields {
            transfer_encoding: None,
            length: Ok(None),
        }
    }
}

impl BodyFields {
    /// One `Content-Length` line: a list of lengths that must all be the same (and the
    /// same as any earlier line's).
    fn content_length(&mut self, value: &[u8]) {
        let Ok(mut length) = self.length else {
            return;
        };
        // As bytes: only ASCII whitespace (spaces, tabs) is trimmed around a length; the
        // map's reading, a `HeaderValue` as text, refused any other byte that is not ASCII.
        for part in value.split(|&b| b == b',') {
            let part = part.trim_ascii();
            let n = if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                None
            } else {
                std::str::from_utf8(part)
                    .ok()
                    .and_then(|digits| digits.parse::<u64>().ok())
            };
            match n {
                Some(n) if length.is_none_or(|l| l == n) => length = Some(n),
                _ => {
                    self.length = Err(ErrorKind::InvalidLength);
                    return;
                }
            }
        }
        self.length = Ok(length);
    }
}

/// hyper's rules (RFC 9112 §6.3) for where a response's body ends.
fn framing(
    status: StatusCode,
    method: &Method,
    version: Version,
    body: BodyFields,
) -> Result<Framing, ErrorKind> {
    if matches!(status.as_u16(), 101 | 204 | 304) || method == Method::HEAD {
        return Ok(Framing::Empty);
    }
    if let Some(codings) = body.transfer_encoding {
        if version == Version::HTTP_10 {
            return Err(ErrorKind::InvalidHead);
        }
        // Chunked only when it is the last coding; otherwise the body runs to the close.
        let last = codings
            .to_str()
            .ok()
            .and_then(|v| v.rsplit(',').next())
            .map(str::trim);
        return Ok(match last {
            Some(coding) if coding.eq_ignore_ascii_case("chunked") => Framing::Chunked,
            _ => Framing::UntilClose,
        });
    }
    Ok(match body.length? {
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}
