//! The body of a response read from our own connection, by the task that polls it.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use super::chunked::{ChunkedDecoder, Decoded};
use super::{Connection, Error, ErrorKind, Framing, Head};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connection lent to one exchange by its pool.
pub(crate) trait Lease: Send + Sync + 'static {
    fn connection(&mut self) -> &mut Connection;
    /// The exchange is over and the connection can carry another. (Dropping the lease
    /// instead closes the connection.)
    fn release(self: Box<Self>);
}

/// A response body from a [`Connection`].
pub(crate) struct Http1Body {
    state: State,
}

enum State {
    /// The whole body came with the head; the connection has gone back already.
    Read(Option<Bytes>),
    Reading {
        lease: Box<dyn Lease>,
        rest: Rest,
        keep_alive: bool,
    },
    Done,
}

enum Rest {
    Length(u64),
    /// Boxed: the decoder is 104 bytes, which every response body would carry.
    Chunked(Box<ChunkedDecoder>),
    UntilClose,
}

/// The response to an exchange whose head is `head`, its body read over `lease`'s
/// connection. When the body is already in (or there is none), the connection goes back
/// at once.
pub(crate) fn response(head: Head, mut lease: Box<dyn Lease>) -> http::Response<Http1Body> {
    let conn = lease.connection();
    let state = match head.framing {
        Framing::Empty => {
            end(lease, head.keep_alive);
            State::Read(None)
        }
        Framing::Length(n) if conn.buf.len() as u64 >= n => {
            // `n` fits: it is at most the buffer's length.
            let data = conn.buf.split_to(n as usize).freeze();
            end(lease, head.keep_alive);
            State::Read((!data.is_empty()).then_some(data))
        }
        Framing::Length(n) => State::Reading {
            lease,
            rest: Rest::Length(n),
            keep_alive: head.keep_alive,
        },
        Framing::Chunked => State::Reading {
            lease,
            rest: Rest::Chunked(Box::new(ChunkedDecoder::new())),
            keep_alive: head.keep_alive,
        },
        Framing::UntilClose => State::Reading {
            lease,
            rest: Rest::UntilClose,
            keep_alive: false,
        },
    };
    http::Response::from_parts(head.response, Http1Body { state })
}

/// The exchange is over: the connection goes back when it may carry another (and the
/// target sent nothing past the answer), else it closes.
fn end(mut lease: Box<dyn Lease>, keep_alive: bool) {
    if keep_alive && lease.connection().buf.is_empty() {
        lease.release();
    }
}

impl Http1Body {
    /// Ends the body; `keep`: the connection may be reused.
    fn finish(&mut self, keep: bool) {
        if let State::Reading {
            lease, keep_alive, ..
        } = std::mem::replace(&mut self.state, State::Done)
        {
            if keep {
                end(lease, keep_alive);
            }
        }
    }
}

impl Body for Http1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let (conn, rest) = match &mut this.state {
                State::Read(data) => return Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
                State::Done => return Poll::Ready(None),
                State::Reading { lease, rest, .. } => (lease.connection(), rest),
            };
            match rest {
                Rest::Length(left) => {
                    if !conn.buf.is_empty() {
                        let n = conn
                            .buf
                            .len()
                            .min(usize::try_from(*left).unwrap_or(usize::MAX));
                        let data = conn.buf.split_to(n).freeze();
                        *left -= n as u64;
                        if *left == 0 {
                            this.finish(true);
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Rest::Chunked(decoder) => match decoder.decode(&mut conn.buf) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::Trailers(trailers)) => {
                        this.finish(true);
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                    Ok(Decoded::End) => {
                        this.finish(true);
                        return Poll::Ready(None);
                    }
                    Ok(Decoded::NeedMore) => {}
                    Err(e) => {
                        this.finish(false);
                        let cause = std::io::Error::new(std::io::ErrorKind::InvalidData, e);
                        return Poll::Ready(Some(Err(Error::new(
                            ErrorKind::InvalidChunk,
                            Some(cause),
                        )
                        .into())));
                    }
                },
                Rest::UntilClose => {
                    if !conn.buf.is_empty() {
                        let data = conn.buf.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
            }
            // Nothing buffered: read more.
            let read = ready!(conn.poll_fill(cx));
            let ended = matches!(rest, Rest::UntilClose);
            match read {
                Ok(0) if ended => {
                    this.finish(false);
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    this.finish(false);
                    return Poll::Ready(Some(Err(Error::new(ErrorKind::Incomplete, None).into())));
                }
                Ok(_) => {}
                Err(e) => {
                    this.finish(false);
                    return Poll::Ready(Some(Err(Error::new(ErrorKind::Io, Some(e)).into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Read(None) | State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Read(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            State::Reading {
                rest: Rest::Length(left),
                ..
            } => SizeHint::with_exact(*left),
            State::Reading { .. } => SizeHint::default(),
            State::Done => SizeHint::with_exact(0),
        }
    }
}
