//! Chunk sizes Go would refuse. hyper accepts any chunk size that fits in 64 bits, so
//! `ffffffffffffffff` (16 hex digits) opens a chunk no client will ever finish; Go's
//! server refuses 16 digits or more ("http chunk length too large"), nginx and HAProxy
//! answer 400. hyper does not show us the size, so this reader follows the HTTP/1.x
//! framing of what the client sends (request heads, `Content-Length` bodies, chunk size
//! lines) and fails the read at such a size line: hyper then reports the body as broken,
//! and the request gets its 400 through the usual rejection.
//!
//! It only ever fails open: a request it cannot follow (an upgrade, `CONNECT`, a line it
//! cannot read) switches it off for the rest of the connection. Heads are scanned a line
//! at a time and bodies skipped by count, so the hot path pays one `memchr` per line.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Go's limit: a chunk size of this many hex digits or more is refused.
const MAX_SIZE_DIGITS: u32 = 16;
/// The part of a header line worth keeping: enough for the names we look for and a
/// `Transfer-Encoding` value.
const LINE_KEEP: usize = 128;

pin_project_lite::pin_project! {
    pub struct ChunkGuard<T> {
        #[pin]
        inner: T,
        framing: Framing,
        refused: bool,
    }
}

impl<T> ChunkGuard<T> {
    pub fn new(inner: T) -> Self {
        ChunkGuard {
            inner,
            framing: Framing::default(),
            refused: false,
        }
    }
}

impl<T: AsyncRead> AsyncRead for ChunkGuard<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if *this.refused {
            return Poll::Ready(Err(too_large()));
        }
        let before = buf.filled().len();
        std::task::ready!(this.inner.poll_read(cx, buf))?;
        let Some(at) = this.framing.scan(&buf.filled()[before..]) else {
            return Poll::Ready(Ok(()));
        };
        // Hand over what comes before the offending digit; the next read fails. An empty
        // read would look like the end of the stream, so fail this one instead.
        *this.refused = true;
        if at == 0 {
            return Poll::Ready(Err(too_large()));
        }
        buf.set_filled(before + at);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite> AsyncWrite for ChunkGuard<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

fn too_large() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "http chunk length too large")
}

/// Where the client's byte stream is, in HTTP/1.x terms.
#[derive(Debug, Default)]
struct Framing {
    state: State,
    /// The current head line (its first [`LINE_KEEP`] bytes).
    line: Vec<u8>,
    head: Head,
}

#[derive(Debug, Default, PartialEq)]
enum State {
    /// Reading a request head, line by line.
    #[default]
    Head,
    /// Skipping this many bytes of a `Content-Length` body.
    Body(u64),
    /// Reading a chunk size: digits so far and their value.
    Size { digits: u32, size: u64 },
    /// After the size: extensions up to the line's end.
    SizeLine { size: u64 },
    /// Skipping chunk data.
    Data(u64),
    /// The CRLF after chunk data.
    DataEnd,
    /// Trailer lines after the last chunk; `blank`: nothing on this line yet.
    Trailers { blank: bool },
    /// Not following this connection any more.
    Off,
}

/// What the head read so far says about the body.
#[derive(Debug, Default)]
struct Head {
    lines: u32,
    chunked: bool,
    length: u64,
    /// An upgrade or `CONNECT`: what follows may not be HTTP.
    opaque: bool,
}

impl Framing {
    /// Follows `bytes`; the offset of a size digit past the limit, if one comes.
    fn scan(&mut self, mut bytes: &[u8]) -> Option<usize> {
        let total = bytes.len();
        while !bytes.is_empty() {
            let at = total - bytes.len();
            match &mut self.state {
                State::Off => return None,
                State::Head => match memchr::memchr(b'\n', bytes) {
                    None => {
                        self.keep(bytes);
                        return None;
                    }
                    Some(end) => {
                        self.keep(&bytes[..end]);
                        bytes = &bytes[end + 1..];
                        self.head_line();
                    }
                },
                State::Body(left) | State::Data(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        self.state = match self.state {
                            State::Data(_) => State::DataEnd,
                            _ => State::Head,
                        };
                    }
                }
                State::Size { digits, size } => {
                    let b = bytes[0];
                    if let Some(d) = (b as char).to_digit(16) {
                        *digits += 1;
                        if *digits >= MAX_SIZE_DIGITS {
                            return Some(at);
                        }
                        *size = *size * 16 + u64::from(d);
                        bytes = &bytes[1..];
                    } else if *digits == 0 {
                        // Not a size line: hyper will say what is wrong with it.
                        self.state = State::Off;
                    } else {
                        self.state = State::SizeLine { size: *size };
                    }
                }
                State::SizeLine { size } => match memchr::memchr(b'\n', bytes) {
                    None => return None,
                    Some(end) => {
                        bytes = &bytes[end + 1..];
                        self.state = match *size {
                            0 => State::Trailers { blank: true },
                            n => State::Data(n),
                        };
                    }
                },
                State::DataEnd => match memchr::memchr(b'\n', bytes) {
                    None => return None,
                    Some(end) => {
                        bytes = &bytes[end + 1..];
                        self.state = State::Size { digits: 0, size: 0 };
                    }
                },
                State::Trailers { blank } => {
                    let b = bytes[0];
                    bytes = &bytes[1..];
                    match b {
                        b'\n' if *blank => self.state = State::Head,
                        b'\n' => *blank = true,
                        b'\r' => {}
                        _ => *blank = false,
                    }
                }
            }
        }
        None
    }

    fn keep(&mut self, part: &[u8]) {
        let room = LINE_KEEP.saturating_sub(self.line.len());
        self.line.extend_from_slice(&part[..part.len().min(room)]);
    }

    /// A whole head line has been read (without its LF).
    fn head_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        let head = &mut self.head;
        if line.is_empty() {
            if head.lines == 0 {
                // Blank lines before a request line are ignored (RFC 9112 §2.2).
                self.line = Vec::new();
                return;
            }
            let head = std::mem::take(&mut self.head);
            self.state = if head.opaque {
                State::Off
            } else if head.chunked {
                State::Size { digits: 0, size: 0 }
            } else if head.length > 0 {
                State::Body(head.length)
            } else {
                State::Head
            };
            return;
        }
        head.lines += 1;
        if head.lines == 1 {
            head.opaque = line.starts_with(b"CONNECT ");
            return;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return;
        };
        let name = &line[..colon];
        let value = line[colon + 1..].trim_ascii();
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if line.len() >= LINE_KEEP {
                // Cut short: we cannot tell, so stop following.
                head.opaque = true;
            }
            let last = value.rsplit(|&b| b == b',').next().unwrap_or(b"");
            head.chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
        } else if name.eq_ignore_ascii_case(b"content-length") {
            match std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                Some(n) => head.length = n,
                None => head.opaque = true,
            }
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            head.opaque = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `stream` in pieces of `step` bytes; the absolute offset of a refusal.
    fn refusal(stream: &[u8], step: usize) -> Option<usize> {
        let mut f = Framing::default();
        for (i, piece) in stream.chunks(step).enumerate() {
            if let Some(at) = f.scan(piece) {
                return Some(i * step + at);
            }
        }
        None
    }

    const HEAD: &[u8] = b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";

    #[test]
    fn sixteen_digit_sizes_are_refused_at_the_sixteenth_digit() {
        let mut s = HEAD.to_vec();
        s.extend_from_slice(b"ffffffffffffffff\r\nabc");
        for step in [1, 3, 7, s.len()] {
            assert_eq!(refusal(&s, step), Some(HEAD.len() + 15), "step {step}");
        }
    }

    #[test]
    fn ordinary_traffic_passes_whatever_the_pieces() {
        let mut s = Vec::new();
        // A pipelined sequence: chunked with extensions and trailers, a
        // Content-Length body that looks like a huge size line, a bodiless GET.
        s.extend_from_slice(HEAD);
        s.extend_from_slice(
            b"5;ext=1\r\nhello\r\n000000000000010\r\n0123456789abcdef\r\n0\r\nX-T: 1\r\n\r\n",
        );
        s.extend_from_slice(
            b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 18\r\n\r\nffffffffffffffff\r\n",
        );
        s.extend_from_slice(b"\r\nGET /c HTTP/1.1\r\nHost: a\r\n\r\n");
        s.extend_from_slice(HEAD);
        s.extend_from_slice(b"3\r\nabc\r\n0\r\n\r\n");
        for step in [1, 2, 5, 64, s.len()] {
            assert_eq!(refusal(&s, step), None, "step {step}");
        }
        let mut after = s.clone();
        after.extend_from_slice(HEAD);
        after.extend_from_slice(b"1000000000000000\r\n");
        assert_eq!(refusal(&after, 9), Some(s.len() + HEAD.len() + 15));
    }

    #[test]
    fn upgrades_and_connect_switch_it_off() {
        let mut s =
            b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
                .to_vec();
        s.extend_from_slice(HEAD);
        s.extend_from_slice(b"ffffffffffffffff\r\n");
        assert_eq!(refusal(&s, 4), None);
        let mut s = b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n".to_vec();
        s.extend_from_slice(HEAD);
        s.extend_from_slice(b"ffffffffffffffff\r\n");
        assert_eq!(refusal(&s, 4), None);
    }
}
