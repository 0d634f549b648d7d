//! The listener timeouts on an HTTP/1.x connection (fork F27), as Go's server keeps them:
//! `--read-header-timeout` from a request head's first byte (the first request's: from
//! the moment the connection is ready) to its end, `--idle-timeout` from the end of a
//! response to the next request's first byte, `--write-timeout` from a request head's
//! arrival to the end of its response. hyper has a single timer, from the moment it starts
//! waiting for a head to the head's end, which runs the idle and header timeouts together.
//!
//! Three parties note where the connection is, each in the connection's own task: the
//! reader (a byte arrived on an idle connection), the service (a head arrived) and the
//! response body (it is over). The [`Watchdog`] is polled right after the connection in
//! that same task, so it sees each change as it happens: nobody else reads the clock,
//! takes a lock or wakes anyone, and its timer (a slot in its thread's alarm table,
//! `alarms`) is queued again only when a deadline comes earlier than the one it waits
//! for (a later one is picked up when that one comes due).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::alarms::{Alarm, Bell, Rings};
use super::limits::Timeouts;

const HEAD: u32 = 0;
const BUSY: u32 = 1;
const IDLE: u32 = 2;
const STATE: u32 = 0b11;

/// Where a connection is: reading a head, serving a request, or idle. The state sits in
/// the low bits and a turn counter above them, so the watchdog tells a new head from
/// the one it last saw even when it missed the phases in between. Beside it, the
/// watchdog's timer state, which its thread's alarm table reads (`alarms`).
#[derive(Default)]
pub struct Phase(AtomicU32, Bell);

impl Phase {
    fn set(&self, state: u32) {
        // Only the connection's task writes (see the module's comment): no read-modify-
        // write needed.
        let turn = (self.0.load(Ordering::Relaxed) >> 2).wrapping_add(1);
        self.0.store(turn << 2 | state, Ordering::Relaxed);
    }

    /// A request head has been read: the request is being served.
    pub fn request(&self) {
        self.set(BUSY);
    }

    /// A byte of a request arrived (it starts a head when the connection was idle).
    pub fn byte_read(&self) {
        if self.0.load(Ordering::Relaxed) & STATE == IDLE {
            self.set(HEAD);
        }
    }

    fn over(&self) {
        self.set(IDLE);
    }
}

/// Held by a response body until it is over: then the connection is idle.
pub struct ResponseOver(Arc<Phase>);

impl ResponseOver {
    pub fn new(phase: &Arc<Phase>) -> Self {
        ResponseOver(phase.clone())
    }
}

impl Rings for Phase {
    fn bell(&self) -> &Bell {
        &self.1
    }
}

impl Drop for ResponseOver {
    fn drop(&mut self) {
        self.0.over();
    }
}

pin_project_lite::pin_project! {
    /// The connection's byte stream, noting the first byte after an idle spell.
    pub struct Noted<T> {
        #[pin]
        inner: T,
        phase: Arc<Phase>,
    }
}

impl<T> Noted<T> {
    pub fn new(inner: T, phase: Arc<Phase>) -> Self {
        Noted { inner, phase }
    }
}

impl<T: AsyncRead> AsyncRead for Noted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        std::task::ready!(this.inner.poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.phase.byte_read();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite> AsyncWrite for Noted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Which timeout closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// `--read-header-timeout` (or `--read-timeout`) on a request head.
    Header,
    /// `--write-timeout`: the response was not over in time.
    Write,
    /// `--idle-timeout` between requests.
    Idle,
}

impl Expired {
    /// For the log line.
    pub fn reason(self) -> &'static str {
        match self {
            Expired::Header => "read header timeout",
            Expired::Write => "write timeout",
            Expired::Idle => "idle timeout",
        }
    }
}

/// Resolves when the phase the connection is in has lasted longer than its timeout.
/// Poll it after the connection, in the same task (`select!` with `biased`). It
/// borrows the listener's timeouts. Every idle connection's task holds one, so it is
/// kept small (40 bytes): its timer is a slot in its thread's alarm table (`alarms`),
/// where a tokio `Sleep` took 112 bytes of the task (152 in all before).
pub struct Watchdog<'t> {
    phase: Arc<Phase>,
    timeouts: &'t Timeouts,
    alarm: Alarm,
    seen: u32,
}

impl<'t> Watchdog<'t> {
    /// For a connection ready for its first request head from now.
    pub fn new(phase: Arc<Phase>, timeouts: &'t Timeouts) -> Self {
        let seen = phase.0.load(Ordering::Relaxed);
        let alarm = Alarm::new(phase.clone());
        let deadline = Self::limit(timeouts, seen).map(|d| crate::clock::now() + d);
        // Queued with the table at the first poll, which has the task's waker.
        alarm.set(&phase.1, deadline);
        Watchdog {
            phase,
            timeouts,
            alarm,
            seen,
        }
    }

    fn limit(timeouts: &Timeouts, seen: u32) -> Option<std::time::Duration> {
        match seen & STATE {
            HEAD => timeouts.head(),
            BUSY => timeouts.write,
            _ => timeouts.idle,
        }
    }

    fn expired(seen: u32) -> Expired {
        match seen & STATE {
            HEAD => Expired::Header,
            BUSY => Expired::Write,
            _ => Expired::Idle,
        }
    }
}

impl Future for Watchdog<'_> {
    type Output = Expired;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Expired> {
        let this = self.get_mut();
        let now_seen = this.phase.0.load(Ordering::Relaxed);
        if now_seen != this.seen {
            this.seen = now_seen;
            let deadline = Self::limit(this.timeouts, now_seen).map(|d| crate::clock::now() + d);
            this.alarm.set(&this.phase.1, deadline);
        }
        match this.alarm.poll_rang(&this.phase.1, cx) {
            Poll::Ready(()) => Poll::Ready(Self::expired(this.seen)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn timeouts(head: u64, write: Option<u64>, idle: u64) -> Timeouts {
        Timeouts {
            read_header: Some(Duration::from_secs(head)),
            read: None,
            write: write.map(Duration::from_secs),
            idle: Some(Duration::from_secs(idle)),
        }
    }

    async fn pending(w: &mut Pin<&mut Watchdog<'_>>) -> bool {
        futures_util::poll!(w.as_mut()).is_pending()
    }

    #[tokio::test(start_paused = true)]
    async fn each_phase_has_its_own_clock() {
        let phase = Arc::new(Phase::default());
        let t = timeouts(30, Some(5), 60);
        let w = Watchdog::new(phase.clone(), &t);
        let mut w = std::pin::pin!(w);
        assert!(pending(&mut w).await);
        super::super::alarms::advance(Duration::from_secs(29)).await;
        assert!(pending(&mut w).await);
        // The head arrived: no header clock any more, the write clock starts.
        phase.request();
        assert!(pending(&mut w).await);
        super::super::alarms::advance(Duration::from_secs(4)).await;
        assert!(pending(&mut w).await);
        phase.over();
        assert!(pending(&mut w).await);
        // Idle for 59 s: still open, though the first header clock has long passed.
        super::super::alarms::advance(Duration::from_secs(59)).await;
        assert!(pending(&mut w).await);
        // A byte of the next head: the header clock starts again from now.
        phase.byte_read();
        assert!(pending(&mut w).await);
        super::super::alarms::advance(Duration::from_secs(29)).await;
        assert!(pending(&mut w).await);
        super::super::alarms::advance(Duration::from_secs(1)).await;
        assert_eq!(
            futures_util::poll!(w.as_mut()),
            Poll::Ready(Expired::Header)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_and_write_timeouts_fire() {
        let phase = Arc::new(Phase::default());
        let t = timeouts(30, None, 60);
        let w = Watchdog::new(phase.clone(), &t);
        let mut w = std::pin::pin!(w);
        phase.request();
        assert!(pending(&mut w).await);
        // No write timeout: a long response is never cut.
        super::super::alarms::advance(Duration::from_secs(3600)).await;
        assert!(pending(&mut w).await);
        phase.over();
        assert!(pending(&mut w).await);
        super::super::alarms::advance(Duration::from_secs(60)).await;
        assert_eq!(futures_util::poll!(w.as_mut()), Poll::Ready(Expired::Idle));

        let phase = Arc::new(Phase::default());
        let t = timeouts(30, Some(5), 60);
        let w = Watchdog::new(phase.clone(), &t);
        let mut w = std::pin::pin!(w);
        phase.request();
        assert!(pending(&mut w).await);
        super::super::alarms::advance(Duration::from_secs(5)).await;
        assert_eq!(futures_util::poll!(w.as_mut()), Poll::Ready(Expired::Write));
    }

    #[tokio::test(start_paused = true)]
    async fn a_byte_while_busy_is_not_a_new_head() {
        let phase = Arc::new(Phase::default());
        phase.request();
        phase.byte_read();
        assert_eq!(phase.0.load(Ordering::Relaxed) & STATE, BUSY);
        phase.over();
        phase.byte_read();
        assert_eq!(phase.0.load(Ordering::Relaxed) & STATE, HEAD);
    }

    #[tokio::test(start_paused = true)]
    async fn no_limits_never_fire() {
        let phase = Arc::new(Phase::default());
        let none = Timeouts {
            read_header: None,
            read: None,
            write: None,
            idle: None,
        };
        let w = Watchdog::new(phase.clone(), &none);
        let mut w = std::pin::pin!(w);
        for _ in 0..3 {
            assert!(pending(&mut w).await);
            super::super::alarms::advance(Duration::from_secs(86_400)).await;
            phase.request();
            assert!(pending(&mut w).await);
            phase.over();
        }
    }
}
