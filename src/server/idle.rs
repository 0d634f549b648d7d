//! Idle HTTP/2 connections: hyper closes an HTTP/1.1 connection that waits too long for
//! its next request head, but keeps an HTTP/2 one open for as long as the client likes.
//! [`Activity`] counts a connection's open streams (a stream is open until its response
//! body is over), so the connection can be shut down gracefully (GOAWAY) once it has had
//! none for the idle timeout.

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Notify;

/// One connection's open streams. The counter is the connection's own (no sharing
/// across connections); a waiter is woken only when it passes through zero.
#[derive(Default)]
pub struct Activity {
    open: AtomicUsize,
    changed: Notify,
}

impl Activity {
    /// A stream opened; it stays open until the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> StreamGuard {
        if self.open.fetch_add(1, Ordering::AcqRel) == 0 {
            self.changed.notify_waiters();
        }
        StreamGuard(self.clone())
    }

    /// Resolves once the connection has had no open stream for `timeout`.
    pub async fn idle_for(&self, timeout: Duration) {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before the count is read, so no change is missed.
            changed.as_mut().enable();
            if self.open.load(Ordering::Acquire) == 0 {
                tokio::select! {
                    // A stream that opened as the timer ran out wins.
                    biased;
                    _ = changed => {}
                    _ = tokio::time::sleep(timeout) => {
                        if self.open.load(Ordering::Acquire) == 0 {
                            return;
                        }
                    }
                }
            } else {
                changed.await;
            }
        }
    }
}

pub struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.changed.notify_waiters();
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds `guard` until it is over: keeps its HTTP/2 stream
    /// counted as open ([`StreamGuard`]), or its HTTP/1.x connection busy
    /// ([`super::h1_timeouts::ResponseOver`]).
    pub struct Counted<B, G> {
        #[pin]
        inner: B,
        guard: Option<G>,
    }
}

impl<B, G> Counted<B, G> {
    pub fn new(inner: B, guard: G) -> Self {
        Counted {
            inner,
            guard: Some(guard),
        }
    }
}

impl<B: Body<Data = Bytes>, G> Body for Counted<B, G> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.guard.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_only_after_the_last_stream_closed_for_the_timeout() {
        let activity = Arc::new(Activity::default());
        let stream = activity.begin();
        let idle = activity.idle_for(Duration::from_secs(30));
        let mut idle = std::pin::pin!(idle);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(futures_util::poll!(idle.as_mut()).is_pending());
        drop(stream);
        assert!(futures_util::poll!(idle.as_mut()).is_pending());
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(futures_util::poll!(idle.as_mut()).is_pending());
        // A new stream restarts the clock.
        let again = activity.begin();
        assert!(futures_util::poll!(idle.as_mut()).is_pending());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(futures_util::poll!(idle.as_mut()).is_pending());
        drop(again);
        assert!(futures_util::poll!(idle.as_mut()).is_pending());
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(futures_util::poll!(idle.as_mut()).is_ready());
    }
}
