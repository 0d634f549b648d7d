//! Decoding a chunked response body (RFC 9112 §7.1) as its bytes arrive from the target.
//!
//! The client reads into a `BytesMut` and calls [`ChunkedDecoder::decode`] after every read; the
//! decoder takes what it can use off the front and says what it found. Body bytes are handed out
//! as soon as they arrive, split off the read buffer, so a large or slow chunk is never held back
//! and never copied.
//!
//! Framing is parsed strictly: every line must end in CRLF (hyper also accepts a bare LF; we do
//! not). Where a response ends decides what the next bytes on a reused connection are taken for,
//! so a proxy that is more lenient than the app's server about line ends can be made to disagree
//! with it about that: failing the response, and with it the connection, is the safe answer.
//! Every line has a bound, so a target that never ends one costs at most that much buffer before
//! it is an error.

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// A size line (chunk size and extensions, CRLF excluded) longer than this is an error.
const MAX_SIZE_LINE: usize = 4096;
/// Most trailer fields accepted after the last chunk.
const MAX_TRAILER_FIELDS: usize = 100;
/// Most bytes of the trailer section, its line ends and final empty line included.
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// What the decoder found at the front of the buffer.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// Body bytes (never empty), split off the front of the buffer without copying (`buf.split_to(n).freeze()`).
    Data(Bytes),
    /// The trailer section after the last chunk; only when it had at least one field. The body ends after it.
    /// Which of its fields may be passed on is the caller's decision.
    Trailers(HeaderMap),
    /// The body has ended (last chunk and its empty trailer section consumed). Every later call returns End again.
    End,
    /// The buffer does not yet hold enough to go on: read more bytes into it and call again. Nothing was lost: what the decoder consumed so far is remembered in its state.
    NeedMore,
}

/// Why a chunked body is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkedError(&'static str);

impl std::fmt::Display for ChunkedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for ChunkedError {}

const INVALID_SIZE_LINE: ChunkedError = ChunkedError("invalid chunk size line");
const SIZE_OVERFLOW: ChunkedError = ChunkedError("chunk size too large");
const SIZE_LINE_TOO_LONG: ChunkedError = ChunkedError("chunk size line too long");
const BARE_LF: ChunkedError = ChunkedError("line not ended by crlf");
const MISSING_CRLF: ChunkedError = ChunkedError("missing crlf after chunk data");
const INVALID_TRAILER: ChunkedError = ChunkedError("invalid trailer field");
const TOO_MANY_TRAILERS: ChunkedError = ChunkedError("too many trailer fields");
const TRAILERS_TOO_LARGE: ChunkedError = ChunkedError("trailer section too large");

/// Decodes one chunked body, whatever pieces it arrives in.
pub(crate) struct ChunkedDecoder {
    state: State,
    /// How many bytes at the front of the buffer were already searched for the LF ending the
    /// current line: a line arriving a byte at a time is then searched once, not once per byte.
    scanned: usize,
}

enum State {
    /// Before a chunk-size line.
    SizeLine,
    /// Inside a chunk, with this many (more than zero) of its bytes still to come.
    Data {
        left: u64,
    },
    /// After a chunk's data, before the CRLF that must follow it.
    DataEnd,
    /// After the last chunk: the fields read so far and how many bytes they took.
    Trailers {
        fields: HeaderMap,
        bytes: usize,
    },
    Done,
    /// Kept so that a caller asking again gets the error again rather than a decode of the
    /// bytes that follow the malformed part.
    Failed(ChunkedError),
}

impl ChunkedDecoder {
    pub(crate) fn new() -> Self {
        Self {
            state: State::SizeLine,
            scanned: 0,
        }
    }

    /// Decodes from the front of `buf`, consuming (splitting off/advancing past) exactly what it used.
    /// Data is returned as soon as any is available: a chunk of 10,000 bytes of which 3,000 are in the
    /// buffer yields Data(3,000) now and the rest on later calls (the decoder remembers how much of the chunk is left).
    ///
    /// Between calls the caller only appends to `buf`.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, ChunkedError> {
        let result = self.step(buf);
        if let Err(e) = result {
            self.state = State::Failed(e);
        }
        result
    }

    /// Whether the body has ended (End was returned, or Trailers).
    #[cfg(test)]
    fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn step(&mut self, buf: &mut BytesMut) -> Result<Decoded, ChunkedError> {
        // Each turn either returns or consumes a line, so it ends within the buffer's length.
        loop {
            match &mut self.state {
                State::SizeLine => {
                    let Some(len) = find_line(
                        buf,
                        &mut self.scanned,
                        MAX_SIZE_LINE + 2,
                        SIZE_LINE_TOO_LONG,
                    )?
                    else {
                        return Ok(Decoded::NeedMore);
                    };
                    let size = parse_size_line(&buf[..len])?;
                    buf.advance(len + 2);
                    self.state = if size == 0 {
                        State::Trailers {
                            fields: HeaderMap::new(),
                            bytes: 0,
                        }
                    } else {
                        State::Data { left: size }
                    };
                }
                State::Data { left } => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    // Compared as u64 so that a size beyond usize (32-bit targets) cannot wrap.
                    let n = if *left < buf.len() as u64 {
                        *left as usize
                    } else {
                        buf.len()
                    };
                    *left -= n as u64;
                    if *left == 0 {
                        self.state = State::DataEnd;
                    }
                    return Ok(Decoded::Data(buf.split_to(n).freeze()));
                }
                State::DataEnd => {
                    // Checked byte by byte so that a wrong byte fails now rather than after more reads.
                    if buf.first().is_some_and(|&b| b != b'\r')
                        || buf.get(1).is_some_and(|&b| b != b'\n')
                    {
                        return Err(MISSING_CRLF);
                    }
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    buf.advance(2);
                    self.state = State::SizeLine;
                }
                State::Trailers { fields, bytes } => {
                    let limit = MAX_TRAILER_BYTES - *bytes;
                    let Some(len) = find_line(buf, &mut self.scanned, limit, TRAILERS_TOO_LARGE)?
                    else {
                        return Ok(Decoded::NeedMore);
                    };
                    if len == 0 {
                        buf.advance(2);
                        let fields = std::mem::take(fields);
                        self.state = State::Done;
                        return Ok(if fields.is_empty() {
                            Decoded::End
                        } else {
                            Decoded::Trailers(fields)
                        });
                    }
                    if fields.len() >= MAX_TRAILER_FIELDS {
                        return Err(TOO_MANY_TRAILERS);
                    }
                    let (name, value) = parse_trailer_field(&buf[..len])?;
                    fields.append(name, value);
                    *bytes += len + 2;
                    buf.advance(len + 2);
                }
                State::Done => return Ok(Decoded::End),
                State::Failed(e) => return Err(*e),
            }
        }
    }
}

/// The length (CRLF excluded) of the line at the front of `buf`, if all of it is there; a line
/// that would take more than `limit` bytes with its CRLF is `too_long`.
fn find_line(
    buf: &[u8],
    scanned: &mut usize,
    limit: usize,
    too_long: ChunkedError,
) -> Result<Option<usize>, ChunkedError> {
    let window = &buf[..buf.len().min(limit)];
    // min: a caller breaking the append-only rule gets a wrong answer, not a panic.
    let from = (*scanned).min(window.len());
    match memchr::memchr(b'\n', &window[from..]) {
        Some(i) => {
            *scanned = 0;
            let lf = from + i;
            if lf == 0 || window[lf - 1] != b'\r' {
                return Err(BARE_LF);
            }
            Ok(Some(lf - 1))
        }
        None if window.len() == limit => Err(too_long),
        None => {
            *scanned = window.len();
            Ok(None)
        }
    }
}

/// `chunk-size [ chunk-ext ]`; the extensions are checked for form and ignored.
fn parse_size_line(line: &[u8]) -> Result<u64, ChunkedError> {
    // By hand: `from_str_radix` would take a leading `+`, which no other parser reads as a size.
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(INVALID_SIZE_LINE);
    }
    let mut size: u64 = 0;
    for &b in &line[..digits] {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => b - b'A' + 10,
        };
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(u64::from(digit)))
            .ok_or(SIZE_OVERFLOW)?;
    }
    check_extensions(&line[digits..])?;
    Ok(size)
}

/// `*( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] )`, with whitespace also
/// allowed at the end as most servers accept it.
fn check_extensions(mut rest: &[u8]) -> Result<(), ChunkedError> {
    loop {
        rest = skip_ws(rest);
        match rest.split_first() {
            None => return Ok(()),
            Some((b';', after)) => rest = skip_ws(after),
            Some(_) => return Err(INVALID_SIZE_LINE),
        }
        rest = skip_token(rest)?;
        let after_ws = skip_ws(rest);
        if let Some((b'=', after)) = after_ws.split_first() {
            let value = skip_ws(after);
            rest = match value.split_first() {
                Some((b'"', quoted)) => skip_quoted(quoted)?,
                _ => skip_token(value)?,
            };
        }
    }
}

fn skip_ws(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    &s[n..]
}

/// Past a token (RFC 9110 §5.6.2), which must not be empty.
fn skip_token(s: &[u8]) -> Result<&[u8], ChunkedError> {
    let n = s.iter().take_while(|&&b| is_tchar(b)).count();
    if n == 0 {
        return Err(INVALID_SIZE_LINE);
    }
    Ok(&s[n..])
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Past the rest of a quoted-string (RFC 9110 §5.6.4) whose opening quote was taken; a quote
/// escaped by a backslash does not end it.
fn skip_quoted(s: &[u8]) -> Result<&[u8], ChunkedError> {
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        match b {
            b'"' => return Ok(&s[i + 1..]),
            b'\\' => match s.get(i + 1) {
                Some(&c) if c == b'\t' || c == b' ' || (0x21..=0x7e).contains(&c) || c >= 0x80 => {
                    i += 2
                }
                _ => return Err(INVALID_SIZE_LINE),
            },
            b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff => i += 1,
            _ => return Err(INVALID_SIZE_LINE),
        }
    }
    Err(INVALID_SIZE_LINE)
}

/// `name ":" OWS value OWS`. A folded line starts with whitespace, which no field name holds,
/// so obsolete line folding is rejected with the rest.
fn parse_trailer_field(line: &[u8]) -> Result<(HeaderName, HeaderValue), ChunkedError> {
    let colon = memchr::memchr(b':', line).ok_or(INVALID_TRAILER)?;
    // Also rejects whitespace before the colon, which RFC 9112 §5.1 says must be.
    let name = HeaderName::from_bytes(&line[..colon]).map_err(|_| INVALID_TRAILER)?;
    let value = &line[colon + 1..];
    let start = value
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |i| i + 1);
    let value = HeaderValue::from_bytes(&value[start..end]).map_err(|_| INVALID_TRAILER)?;
    Ok((name, value))
}

#[cfg(test)]
mod tests;
