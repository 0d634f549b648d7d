//! A response written to the client as hyper's HTTP/1 server writes it: the same status
//! line, header order and case, `Date`, framing (`Content-Length` from the body's exact
//! size, chunked otherwise, to the close for HTTP/1.0) and keep-alive rules, so a client
//! cannot tell which of the two served it.

use crate::short_copy::append;
use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, Version, header};
use http_body::Body;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::Poll;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::date;
use crate::proxy::headers::has_token;

/// What the request asked that shapes the response.
#[derive(Clone, Copy)]
pub struct Asked {
    pub head: bool,
    pub version: Version,
    pub keep_alive: bool,
}

impl Asked {
    pub fn of<B>(request: &http::Request<B>, keep_alive: bool) -> Self {
        Asked {
            head: request.method() == Method::HEAD,
            version: request.version(),
            keep_alive,
        }
    }
}

/// How the body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Framing {
    Length(u64),
    Chunked,
    UntilClose,
}

/// A body up to this size is copied behind the head and goes out in the same `write`.
const COPY_UP_TO: usize = 8 * 1024;

/// The head as hyper encodes it. `body`: `None` for a body already at its end, else its
/// exact size if known. Returns the framing and whether the connection closes after.
pub fn encode_head(
    status: StatusCode,
    version: Version,
    reason: Option<&[u8]>,
    headers: &mut HeaderMap,
    body: Option<Option<u64>>,
    asked: Asked,
    out: &mut Vec<u8>,
) -> (Framing, bool) {
    let mut keep_alive = asked.keep_alive;
    let mut version = version;
    let mut add_keep_alive = false;
    if asked.version == Version::HTTP_11 && !keep_alive {
        // The client asked to close, or a drain began: hyper says so.
        match headers.entry(header::CONNECTION) {
            header::Entry::Occupied(mut entry) => {
                if !entry.iter().any(|v| has_token(v.as_bytes(), b"close")) {
                    entry.append(HeaderValue::from_static("close"));
                }
            }
            header::Entry::Vacant(entry) => {
                entry.insert(HeaderValue::from_static("close"));
            }
        }
    } else if asked.version == Version::HTTP_10 {
        // hyper speaks HTTP/1.0 to a client that does, and keeps the connection only
        // when the client asked for it and the response does not say otherwise.
        let says_keep_alive = headers
            .get(header::CONNECTION)
            .is_some_and(|v| has_token(v.as_bytes(), b"keep-alive"));
        if !says_keep_alive {
            if version == Version::HTTP_10 {
                keep_alive = false;
            } else if version == Version::HTTP_11 && keep_alive {
                add_keep_alive = true;
            }
        }
        version = Version::HTTP_10;
    }
    let mut last = !keep_alive;
    let can_chunk = !asked.head && !matches!(status.as_u16(), 204 | 304);
    let can_length = !matches!(status.as_u16(), 204 | 304);

    if version == Version::HTTP_11 && status == StatusCode::OK && reason.is_none() {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(if version == Version::HTTP_10 {
            b"HTTP/1.0 "
        } else {
            b"HTTP/1.1 "
        });
        append(out, status.as_str().as_bytes());
        out.push(b' ');
        let canonical = status.canonical_reason().unwrap_or("<none>").as_bytes();
        append(out, reason.unwrap_or(canonical));
        out.extend_from_slice(b"\r\n");
    }

    let mut framing = Framing::Length(0);
    let mut wrote_len = false;
    let mut wrote_date = false;
    // Fields whose values hyper joins into one line; `Some` while that line is open.
    let mut open_line: Option<header::HeaderName> = None;
    let mut must_add_chunked = false;
    let close_line = |out: &mut Vec<u8>, open: &mut Option<header::HeaderName>, chunked: bool| {
        if open.take().is_some() {
            out.extend_from_slice(if chunked { b", chunked\r\n" } else { b"\r\n" });
        }
    };
    let mut current: Option<header::HeaderName> = None;
    // Drained: the map keeps its room, for `header_maps`.
    for (name, value) in headers.drain() {
        if let Some(name) = name {
            close_line(out, &mut open_line, must_add_chunked);
            must_add_chunked = false;
            current = Some(name);
        }
        let Some(name) = current.as_ref() else {
            continue;
        };
        let joined = open_line.as_ref() == Some(name);
        match *name {
            header::CONTENT_LENGTH => {
                match body {
                    // Later values of the field, or one after a `Transfer-Encoding`: hyper
                    // writes the first only.
                    Some(_) if joined || wrote_len => {}
                    Some(size) => {
                        // The body's exact size, or (it has none) the field's own value.
                        let declared = || {
                            std::str::from_utf8(value.as_bytes())
                                .ok()
                                .and_then(|v| v.trim().parse::<u64>().ok())
                        };
                        let Some(len) = size.or_else(declared) else {
                            // hyper refuses to send such a head; the connection ends.
                            last = true;
                            continue;
                        };
                        framing = Framing::Length(len);
                        out.extend_from_slice(b"content-length: ");
                        append(out, value.as_bytes());
                        wrote_len = true;
                        open_line = Some(name.clone());
                    }
                    None if asked.head => {
                        wrote_len = true;
                        write_field(out, name, value.as_bytes());
                    }
                    // No body to send: the length goes (an implicit `0` may follow).
                    None => {}
                }
                continue;
            }
            header::TRANSFER_ENCODING => {
                if version == Version::HTTP_10 || !can_chunk {
                    continue;
                }
                wrote_len = true;
                must_add_chunked = !last_coding_is_chunked(value.as_bytes());
                if joined {
                    out.extend_from_slice(b", ");
                } else {
                    framing = Framing::Chunked;
                    out.extend_from_slice(b"transfer-encoding: ");
                    open_line = Some(name.clone());
                }
                append(out, value.as_bytes());
                continue;
            }
            header::CONNECTION | header::TRAILER => {
                if *name == header::CONNECTION {
                    last |= has_token(value.as_bytes(), b"close");
                } else if version == Version::HTTP_10 || !can_chunk {
                    continue;
                }
                if joined {
                    out.extend_from_slice(b", ");
                } else {
                    append(out, name.as_str().as_bytes());
                    out.extend_from_slice(b": ");
                    open_line = Some(name.clone());
                }
                append(out, value.as_bytes());
                continue;
            }
            header::DATE => wrote_date = true,
            _ => {}
        }
        write_field(out, name, value.as_bytes());
    }
    close_line(out, &mut open_line, must_add_chunked);
    if add_keep_alive {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }

    if !wrote_len {
        framing = match body {
            Some(None) if version == Version::HTTP_10 || !can_chunk => Framing::UntilClose,
            Some(None) => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
            None | Some(Some(0)) => {
                if can_length && !asked.head {
                    out.extend_from_slice(b"content-length: 0\r\n");
                }
                Framing::Length(0)
            }
            Some(Some(len)) => {
                if can_length {
                    out.extend_from_slice(b"content-length: ");
                    append(out, itoa::Buffer::new().format(len).as_bytes());
                    out.extend_from_slice(b"\r\n");
                    Framing::Length(len)
                } else {
                    Framing::Length(0)
                }
            }
        };
    }
    if !can_chunk {
        // HEAD, 204, 304: no body, whatever the headers say.
        framing = Framing::Length(0);
    }
    if !wrote_date {
        out.extend_from_slice(b"date: ");
        date::extend(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if framing == Framing::UntilClose {
        last = true;
    }
    (framing, last)
}

fn write_field(out: &mut Vec<u8>, name: &header::HeaderName, value: &[u8]) {
    append(out, name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    append(out, value);
    out.extend_from_slice(b"\r\n");
}

fn last_coding_is_chunked(value: &[u8]) -> bool {
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

/// Writes `response`. Returns whether the connection may carry another request.
///
/// The response is used where it lies in this future, not taken apart into locals, and
/// the function returns an `async` block rather than being an `async fn` (which keeps its
/// arguments twice): each of those was a copy of the response's 248 bytes a request.
#[allow(clippy::manual_async_fn)]
pub fn write<'a, B, W>(
    stream: &'a mut W,
    mut response: Box<Response<B>>,
    asked: Asked,
) -> impl Future<Output = bool> + 'a
where
    B: Body<Data = Bytes> + Unpin + 'a,
    W: AsyncWrite + Unpin,
{
    async move {
        let size = (!response.body().is_end_stream()).then(|| response.body().size_hint().exact());
        let mut out = Vec::with_capacity(128 + response.headers().len() * 32);
        // Taken out (an empty map's look-up when the answer had its standard reason): the
        // head's encoding changes the headers, which the borrow would hold.
        let reason = response
            .extensions_mut()
            .remove::<hyper::ext::ReasonPhrase>();
        let (status, version) = (response.status(), response.version());
        let (framing, last) = encode_head(
            status,
            version,
            reason.as_ref().map(|r| r.as_bytes()),
            response.headers_mut(),
            size,
            asked,
            &mut out,
        );
        crate::proxy::header_maps::recycle(std::mem::take(response.headers_mut()));
        if framing == Framing::Length(0) || size.is_none() {
            // Nothing of the body goes out (HEAD, 204, 304, or it is empty): it is left
            // unread, as hyper leaves it.
            return stream.write_all(&out).await.is_ok() && !last;
        }
        let mut sender = Sender {
            framing,
            sent: 0,
            out,
        };
        // The first frame, if the body has it at hand, goes out with the head; if it has not,
        // the head goes first (an event stream's client sees its headers at once).
        let first =
            std::future::poll_fn(|cx| Poll::Ready(Pin::new(response.body_mut()).poll_frame(cx)))
                .await;
        let mut next = match first {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if sender.flush(stream).await.is_err() {
                    return false;
                }
                std::future::poll_fn(|cx| Pin::new(response.body_mut()).poll_frame(cx)).await
            }
        };
        loop {
            match next {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if sender.data(stream, data).await.is_err() {
                            return false;
                        }
                    }
                    // Trailers: only sent to a client that asked for them (`TE: trailers`),
                    // and such a request is hyper's.
                }
                Some(Err(_)) => return false,
                None => break,
            }
            next = std::future::poll_fn(|cx| Pin::new(response.body_mut()).poll_frame(cx)).await;
        }
        sender.end(stream).await.unwrap_or(false) && !last
    }
}

/// The body's bytes on their way out, framed.
struct Sender {
    framing: Framing,
    sent: u64,
    /// What has not been written yet (at first, the head).
    out: Vec<u8>,
}

impl Sender {
    async fn flush(&mut self, stream: &mut (impl AsyncWrite + Unpin)) -> io::Result<()> {
        if !self.out.is_empty() {
            stream.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    async fn data(
        &mut self,
        stream: &mut (impl AsyncWrite + Unpin),
        mut data: Bytes,
    ) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if let Framing::Length(len) = self.framing {
            let room = len - self.sent;
            if data.len() as u64 > room {
                // More than the length announced: hyper would not send it either.
                return Err(io::ErrorKind::InvalidData.into());
            }
        }
        self.sent += data.len() as u64;
        let mut prefix = [0u8; 18];
        let prefix: &[u8] = if self.framing == Framing::Chunked {
            chunk_size(data.len(), &mut prefix)
        } else {
            &[]
        };
        let suffix: &[u8] = if self.framing == Framing::Chunked {
            b"\r\n"
        } else {
            &[]
        };
        if self.out.len() + data.len() <= COPY_UP_TO + 512 && data.len() <= COPY_UP_TO {
            append(&mut self.out, prefix);
            append(&mut self.out, &data);
            append(&mut self.out, suffix);
            return self.flush(stream).await;
        }
        let mut head = std::mem::take(&mut self.out);
        head.extend_from_slice(prefix);
        let mut parts = [
            IoSlice::new(&head),
            IoSlice::new(&data),
            IoSlice::new(suffix),
        ];
        write_all_vectored(stream, &mut parts).await?;
        head.clear();
        self.out = head;
        data.advance(data.len());
        Ok(())
    }

    /// The end of the body. `Ok(false)`: it ended short of its announced length.
    async fn end(&mut self, stream: &mut (impl AsyncWrite + Unpin)) -> io::Result<bool> {
        let complete = match self.framing {
            Framing::Length(len) => self.sent == len,
            Framing::Chunked => {
                self.out.extend_from_slice(b"0\r\n\r\n");
                true
            }
            Framing::UntilClose => true,
        };
        self.flush(stream).await?;
        Ok(complete)
    }
}

/// `{size in hex}\r\n`
fn chunk_size(len: usize, buf: &mut [u8; 18]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut at = 16;
    let mut n = len;
    loop {
        at -= 1;
        buf[at] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    buf[16] = b'\r';
    buf[17] = b'\n';
    &buf[at..]
}

async fn write_all_vectored(
    stream: &mut (impl AsyncWrite + Unpin),
    parts: &mut [IoSlice<'_>],
) -> io::Result<()> {
    let mut parts = parts;
    IoSlice::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        let n = stream.write_vectored(parts).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut parts, n);
    }
    Ok(())
}
