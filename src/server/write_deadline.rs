//! `--write-timeout` on an HTTP/2 stream (fork F27): a response must be over by the
//! deadline its request set, or the stream is reset (hyper resets a stream whose service
//! or body fails), as Go's HTTP/2 server does. HTTP/1.x connections are closed by their
//! watchdog instead (`h1_timeouts`).

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::{Instant, Sleep};

/// The response was not over within `--write-timeout`.
#[derive(Debug)]
pub struct WriteTimedOut;

impl std::fmt::Display for WriteTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("response not written within --write-timeout")
    }
}

impl std::error::Error for WriteTimedOut {}

pin_project_lite::pin_project! {
    /// A response body cut off at a deadline; without one, a plain pass-through.
    pub struct WriteDeadline<B> {
        #[pin]
        inner: B,
        // Boxed: only responses under a `--write-timeout` pay for a timer.
        timer: Option<Pin<Box<Sleep>>>,
    }
}

impl<B> WriteDeadline<B> {
    pub fn new(inner: B, deadline: Option<Instant>) -> Self {
        WriteDeadline {
            inner,
            timer: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
        }
    }
}

impl<B> Body for WriteDeadline<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        if let Some(timer) = this.timer.as_mut() {
            if timer.as_mut().poll(cx).is_ready() {
                tracing::info!("Response not written within --write-timeout; resetting the stream");
                return Poll::Ready(Some(Err(Box::new(WriteTimedOut))));
            }
        }
        this.inner.poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
