//! A body buffer for `--buffer-requests` / `--buffer-responses`: up to `--buffer-memory`
//! bytes in memory, the rest spilled to an unlinked temporary file, with an optional total
//! limit (`--max-*-body`, 0 = unlimited; a body of exactly the limit passes).

use bytes::Bytes;
use http_body::{Body, Frame};
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;

#[derive(Debug)]
pub enum BufferError {
    TooLarge,
    Io(io::Error),
}

pub struct SpillBuffer {
    memory: VecDeque<Bytes>,
    in_memory: usize,
    memory_limit: usize,
    file: Option<tokio::fs::File>,
    total: u64,
    limit: u64,
}

impl SpillBuffer {
    pub fn new(memory_limit: i64, limit: i64) -> Self {
        SpillBuffer {
            memory: VecDeque::new(),
            in_memory: 0,
            memory_limit: memory_limit.max(0) as usize,
            file: None,
            total: 0,
            limit: limit.max(0) as u64,
        }
    }

    pub fn len(&self) -> u64 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    pub fn spilled(&self) -> bool {
        self.file.is_some()
    }

    pub async fn write(&mut self, chunk: Bytes) -> Result<(), BufferError> {
        let new_total = self.total + chunk.len() as u64;
        if self.limit > 0 && new_total > self.limit {
            return Err(BufferError::TooLarge);
        }
        self.total = new_total;
        if self.file.is_none() && self.in_memory + chunk.len() <= self.memory_limit {
            self.in_memory += chunk.len();
            self.memory.push_back(chunk);
            return Ok(());
        }
        if self.file.is_none() {
            // Unlinked at creation: nothing is left behind, even if we crash.
            let f = tokio::task::spawn_blocking(tempfile::tempfile)
                .await
                .map_err(|e| BufferError::Io(io::Error::other(e)))?
                .map_err(BufferError::Io)?;
            self.file = Some(tokio::fs::File::from_std(f));
        }
        if let Some(file) = self.file.as_mut() {
            file.write_all(&chunk).await.map_err(BufferError::Io)?;
        }
        Ok(())
    }

    pub async fn into_body(mut self) -> Result<BufferedBody, BufferError> {
        let file = match self.file.take() {
            Some(mut f) => {
                f.flush().await.map_err(BufferError::Io)?;
                f.rewind().await.map_err(BufferError::Io)?;
                Some(Box::new(ReaderStream::with_capacity(f, 32 * 1024)))
            }
            None => None,
        };
        Ok(BufferedBody {
            memory: self.memory,
            file,
            remaining: self.total,
        })
    }
}

/// Replays a buffered body: the memory part, then the spilled file.
pub struct BufferedBody {
    memory: VecDeque<Bytes>,
    /// Boxed: the file's reader is 144 bytes, and every request and response body (an
    /// enum with this as a variant) would carry that room through each future it passes.
    file: Option<Box<ReaderStream<tokio::fs::File>>>,
    remaining: u64,
}

impl BufferedBody {
    pub fn len(&self) -> u64 {
        self.remaining
    }

    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }
}

impl Body for BufferedBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        if let Some(chunk) = this.memory.pop_front() {
            this.remaining = this.remaining.saturating_sub(chunk.len() as u64);
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        let Some(file) = this.file.as_mut() else {
            return Poll::Ready(None);
        };
        match futures_util::ready!(Pin::new(file).poll_next(cx)) {
            Some(Ok(chunk)) => {
                this.remaining = this.remaining.saturating_sub(chunk.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e))),
            None => {
                this.file = None;
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.remaining)
    }
}

use futures_util::Stream;

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn spills_past_memory_and_replays_in_order() {
        let mut b = SpillBuffer::new(4, 0);
        b.write(Bytes::from_static(b"abc")).await.unwrap();
        assert!(!b.spilled());
        b.write(Bytes::from_static(b"defgh")).await.unwrap();
        assert!(b.spilled());
        let body = b.into_body().await.unwrap();
        assert_eq!(body.len(), 8);
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"abcdefgh");
    }

    #[tokio::test]
    async fn limit_is_inclusive() {
        let mut b = SpillBuffer::new(4, 8);
        b.write(Bytes::from_static(b"12345678")).await.unwrap();
        assert!(matches!(
            b.write(Bytes::from_static(b"9")).await,
            Err(BufferError::TooLarge)
        ));
    }
}
