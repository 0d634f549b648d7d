//! What a client may hold, so a hostile or broken one costs a bounded amount: open
//! connections, the size of a request head, how long a request body may go silent, and
//! the listener timeouts (fork F27): how long a request head, a whole request and a
//! response may take, and how long a connection may sit idle.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// `run --max-connections`: well under the descriptors a raised `RLIMIT_NOFILE` gives,
/// at two per proxied connection.
pub const DEFAULT_MAX_CONNECTIONS: usize = 20_000;
/// `run --max-request-header-size`: nginx's `large_client_header_buffers` allows 4 × 8 KiB
/// per line; 64 KiB for the whole head is generous for cookies and tokens, and bounds what
/// 2,000 slow clients can pin (Go's 1 MiB lets them pin 2 GB).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// `run --body-read-timeout`: nginx's `client_body_timeout`.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// `run --read-header-timeout` (fork F27): Go's slowloris default.
pub const DEFAULT_READ_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// `run --idle-timeout` (fork F27): how long a connection may sit between requests.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The limits every listener applies, from `run`'s flags.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_header_bytes: usize,
    /// `None`: a silent body is waited for for ever (`--body-read-timeout=0`).
    pub body_read_timeout: Option<Duration>,
    /// The listener timeouts; `None` is a flag set to 0 (no limit).
    pub timeouts: Timeouts,
}

/// `run --read-header-timeout`, `--read-timeout`, `--write-timeout` and `--idle-timeout`
/// (fork F27), as Go's `http.Server` fields they set. `None`: no limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeouts {
    /// A request head must have arrived this long after its first byte (the first
    /// request's: after the connection is ready); also the PROXY protocol header's limit.
    pub read_header: Option<Duration>,
    /// A whole request: its head (the shorter of this and `read_header` wins), then its
    /// body, counted from the head's arrival.
    pub read: Option<Duration>,
    /// A response must be over this long after its request head arrived.
    pub write: Option<Duration>,
    /// A connection with no request under way: HTTP/1.1 between a response and the next
    /// request's first byte, HTTP/2 with no open stream, HTTP/3 (QUIC's idle timeout).
    pub idle: Option<Duration>,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            read_header: Some(DEFAULT_READ_HEADER_TIMEOUT),
            read: None,
            write: None,
            idle: Some(DEFAULT_IDLE_TIMEOUT),
        }
    }
}

impl Timeouts {
    /// How long a request head may take: as Go, `--read-timeout` bounds it too, and
    /// stands in for a `--read-header-timeout` of 0.
    pub fn head(&self) -> Option<Duration> {
        match (self.read_header, self.read) {
            (Some(h), Some(r)) => Some(h.min(r)),
            (h, r) => h.or(r),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            body_read_timeout: Some(DEFAULT_BODY_READ_TIMEOUT),
            timeouts: Timeouts::default(),
        }
    }
}

/// The connections the TCP listeners may have open at once, shared by HTTP and HTTPS.
/// Each accept loop takes a slot for the connection it has just accepted and accepts no
/// more until it has one: past the limit, that connection waits unserved (one per worker
/// and listener) and new ones wait in the kernel's backlog (refused by it once that is
/// full) instead of taking descriptors the control socket and the upstream connections
/// need.
#[derive(Clone)]
pub struct ConnectionSlots {
    slots: Arc<Semaphore>,
    limit: usize,
    /// The most connections open at once since [`ConnectionSlots::take_peak`] last
    /// looked: how [`super::trim`] tells that a burst has ended.
    peak: Arc<AtomicUsize>,
}

impl ConnectionSlots {
    pub fn new(limit: usize) -> Self {
        let limit = limit.min(Semaphore::MAX_PERMITS);
        ConnectionSlots {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            peak: Arc::default(),
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.limit - self.slots.available_permits()
    }

    /// The peak since the last call, which starts again from the connections open now.
    pub fn take_peak(&self) -> usize {
        self.peak.swap(self.open(), Ordering::Relaxed)
    }

    /// A slot, held for as long as the connection is open; waits while all are taken.
    /// `full` is called when the limit is reached, before waiting.
    pub async fn acquire(&self, full: impl FnOnce(usize)) -> OwnedSemaphorePermit {
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                full(self.limit);
                match self.slots.clone().acquire_owned().await {
                    Ok(permit) => permit,
                    // The semaphore is never closed; waiting for ever is the honest fallback.
                    Err(_) => std::future::pending().await,
                }
            }
        };
        self.peak.fetch_max(self.open(), Ordering::Relaxed);
        permit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slot_comes_back_when_its_connection_closes() {
        let slots = ConnectionSlots::new(1);
        let first = slots.acquire(|_| panic!("not full yet")).await;
        assert_eq!(slots.open(), 1);
        let reported = std::cell::Cell::new(None);
        let waiting = slots.acquire(|limit| reported.set(Some(limit)));
        let mut waiting = std::pin::pin!(waiting);
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        assert_eq!(reported.get(), Some(1));
        drop(first);
        let _second = waiting.await;
        assert_eq!(slots.take_peak(), 1);
    }
}
