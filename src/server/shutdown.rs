//! How the listeners stop: on SIGTERM/SIGINT, or on `kamal-proxy drain` (fork F28), which
//! names its own grace period and is answered only once the drain is over.

use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// `run --shutdown-timeout` (fork F27; upstream's fixed grace): in-flight requests get
/// this long to finish.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Shutdown {
    /// Cancelled when the listeners must stop accepting.
    stop: CancellationToken,
    grace: Mutex<Duration>,
    /// Set once the listeners have closed, connections have finished and state is saved.
    drained: watch::Sender<bool>,
    /// A `drain` asked for the stop (rather than a signal).
    requested: CancellationToken,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new(DEFAULT_SHUTDOWN_TIMEOUT)
    }
}

impl Shutdown {
    /// `grace`: `--shutdown-timeout`, what a signal and a `drain` without its own
    /// `--drain-timeout` give connections to finish.
    pub fn new(grace: Duration) -> Self {
        Shutdown {
            stop: CancellationToken::new(),
            grace: Mutex::new(grace),
            drained: watch::channel(false).0,
            requested: CancellationToken::new(),
        }
    }

    /// What the accept loops wait on.
    pub fn stopping(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// How long connections get to finish once the listeners stop.
    pub fn grace(&self) -> Duration {
        *self.grace.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `drain`: the first call picks the grace (zero: `--shutdown-timeout`) and starts the stop;
    /// every call returns once the drain is over.
    pub async fn drain(&self, grace: Duration) {
        if !self.requested.is_cancelled() && !self.stop.is_cancelled() {
            if !grace.is_zero() {
                *self.grace.lock().unwrap_or_else(|e| e.into_inner()) = grace;
            }
            self.requested.cancel();
        }
        let mut drained = self.drained.subscribe();
        let _ = drained.wait_for(|d| *d).await;
    }

    /// Resolves when a `drain` arrives.
    pub async fn drain_requested(&self) {
        self.requested.cancelled().await
    }

    /// Stops the listeners (the run loop calls this on a signal or a drain).
    pub fn begin(&self) {
        self.stop.cancel();
    }

    /// Answers every waiting `drain`.
    pub fn finished(&self) {
        self.drained.send_replace(true);
    }
}

/// How long a drain waits for the first request of a connection it accepted an instant
/// before: the client has connected and is sending it.
pub(super) const FIRST_REQUEST_WAIT: Duration = Duration::from_secs(1);

/// Whether a connection has begun its first request. A drain that finds a connection
/// accepted but not yet read would close it unanswered (HTTP servers close idle
/// connections at once on a graceful shutdown), failing a request the client had already
/// sent; the drain waits for that request instead, serves it and closes after it.
#[derive(Default)]
pub struct FirstRequest {
    seen: std::sync::atomic::AtomicBool,
    arrived: tokio::sync::Notify,
}

impl FirstRequest {
    /// Called for every request; cheap after the first.
    pub fn mark(&self) {
        use std::sync::atomic::Ordering;
        if !self.seen.load(Ordering::Relaxed) {
            self.seen.store(true, Ordering::Release);
            self.arrived.notify_waiters();
        }
    }

    /// Returns once the first request has arrived, or after [`FIRST_REQUEST_WAIT`].
    pub async fn wait(&self) {
        use std::sync::atomic::Ordering;
        let arrived = self.arrived.notified();
        if self.seen.load(Ordering::Acquire) {
            return;
        }
        let _ = tokio::time::timeout(FIRST_REQUEST_WAIT, arrived).await;
    }
}

/// A listener's word to its connections that it is draining: each finishes the request in
/// flight and closes. The word goes out through [`crate::broadcast`], which a connection's
/// task listens to once for its life: after the first poll a check is two atomic loads (a
/// `CancellationToken` took two locks for it, its own, then its `Notify`'s).
#[derive(Clone, Default)]
pub struct Drain(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drain {
    pub fn start(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
        crate::broadcast::send();
    }

    fn started(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resolves once the drain has started and `first` has come (or the wait for it ran
    /// out): when a connection should stop taking requests. A connection handed over
    /// before its first request still gets it served.
    pub async fn started_after(&self, first: &FirstRequest) {
        self.started_wait().await;
        first.wait().await;
    }

    /// Resolves once the drain has started; also tells of the other words of
    /// [`crate::broadcast`] ([`DrainWait::poll_heard`]). For one task.
    pub fn started_wait(&self) -> DrainWait<'_> {
        DrainWait {
            drain: self,
            // Made now, so a `start` from here on is heard even before the first poll.
            heard: crate::broadcast::listen(),
        }
    }
}

/// What a connection's [`DrainWait`] heard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Its listener's drain has started.
    Started,
    /// Another word: a target's drain cut the requests still in flight to it (or another
    /// listener's drain started). The request in flight, if any, should be polled again:
    /// it may be one of those cut.
    Other,
}

pin_project_lite::pin_project! {
    /// See [`Drain::started_wait`].
    pub struct DrainWait<'a> {
        drain: &'a Drain,
        #[pin]
        heard: crate::broadcast::Listen,
    }
}

impl DrainWait<'_> {
    /// Ready with what was heard since the last ready poll.
    pub fn poll_heard(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Heard> {
        let this = self.project();
        if this.drain.started() {
            return std::task::Poll::Ready(Heard::Started);
        }
        match this.heard.poll_heard(cx) {
            // Started between the two loads.
            std::task::Poll::Ready(()) if this.drain.started() => {
                std::task::Poll::Ready(Heard::Started)
            }
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Heard::Other),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl std::future::Future for DrainWait<'_> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        loop {
            match std::task::ready!(self.as_mut().poll_heard(cx)) {
                Heard::Started => return std::task::Poll::Ready(()),
                // Not this drain's word: registered again, wait on.
                Heard::Other => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_drain_wakes_a_connection_waiting_for_it_and_is_seen_by_later_ones() {
        let drain = Drain::default();
        let waiting = tokio::spawn({
            let drain = drain.clone();
            async move { drain.started_wait().await }
        });
        // Polled once (registered), then the drain starts: the waiting task wakes.
        tokio::task::yield_now().await;
        let before_first_poll = drain.started_wait();
        drain.start();
        waiting.await.expect("woken");
        before_first_poll.await;
        drain.started_wait().await;
    }
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn the_first_drain_picks_the_grace_and_every_drain_answers_after_the_end() {
        let shutdown = Arc::new(Shutdown::default());
        assert_eq!(shutdown.grace(), DEFAULT_SHUTDOWN_TIMEOUT);
        let first = tokio::spawn({
            let s = shutdown.clone();
            async move { s.drain(Duration::from_secs(30)).await }
        });
        shutdown.drain_requested().await;
        let second = tokio::spawn({
            let s = shutdown.clone();
            async move { s.drain(Duration::from_secs(1)).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(shutdown.grace(), Duration::from_secs(30));
        assert!(!first.is_finished() && !second.is_finished());
        shutdown.begin();
        assert!(shutdown.stopping().is_cancelled());
        shutdown.finished();
        first.await.unwrap();
        second.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_drain_timeout_keeps_the_shutdown_timeout() {
        let shutdown = Arc::new(Shutdown::new(Duration::from_secs(3)));
        let s = shutdown.clone();
        let drain = tokio::spawn(async move { s.drain(Duration::ZERO).await });
        shutdown.drain_requested().await;
        assert_eq!(shutdown.grace(), Duration::from_secs(3));
        shutdown.finished();
        drain.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_waits_for_a_first_request_at_most_a_second() {
        let first = FirstRequest::default();
        let started = tokio::time::Instant::now();
        first.wait().await;
        assert_eq!(started.elapsed(), FIRST_REQUEST_WAIT);
        first.mark();
        let started = tokio::time::Instant::now();
        first.wait().await;
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
