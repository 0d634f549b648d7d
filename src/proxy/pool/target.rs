//! One target's connections: the idle lists, the count of requests waiting at
//! `--target-max-conns`, and the reaper.

use hyper::client::conn::http1::SendRequest;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::super::body::RequestBody;
use super::super::http1::{self as own, body::Lease};
use crate::options::upstream::PoolSettings;
use crate::worker::Padded;

/// One target's connections within a service's [`Pools`].
pub(super) struct TargetPool {
    /// One list per worker thread, each on cache lines of its own: each worker takes and
    /// puts back a connection on every request.
    pub(super) idle: Box<[Padded<Mutex<IdleList>>]>,
    /// Idle connections in all the lists, for `--target-max-idle-conns`. Written by every
    /// worker on every request: apart from the fields they only read.
    pub(super) idle_count: Padded<AtomicUsize>,
    /// `--target-max-conns`: one permit per open connection.
    pub(super) slots: Option<Arc<Semaphore>>,
    /// A connection went back to the idle list: a request waiting for a slot may take it.
    pub(super) returned: Notify,
    /// Requests waiting at `--target-max-conns`, by what they need: indexed by [`Kind`] for
    /// an idle connection of that kind, [`NEW`] for a new connection of their own.
    pub(super) waiting: [AtomicUsize; 3],
    /// Connections open (connecting excluded), for [`Pools::succeed`].
    pub(super) open: AtomicUsize,
    pub(super) settings: PoolSettings,
}

#[derive(Default)]
pub(super) struct IdleList {
    pub(super) conns: Vec<Idle>,
    /// A task is closing connections idle past the timeout.
    pub(super) reaping: bool,
}

pub(super) struct Idle {
    pub(super) conn: Conn,
    pub(super) since: Instant,
}

/// A connection checked out of a [`TargetPool`], with the list it goes back to: that of
/// the worker whose runtime its socket is registered with.
pub(super) struct Upstream {
    pub(super) conn: Conn,
    pub(super) home: usize,
}

/// Which connection a request needs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Ours: a request without a body.
    Own = 0,
    /// hyper's: a body to stream, or an upgrade.
    Hyper = 1,
}

/// [`TargetPool::waiting`]'s count of requests that need a new connection of their own.
pub(super) const NEW: usize = 2;

/// A request counted as waiting while this lives.
pub(super) struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    pub(super) fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An open connection: hyper's (driven by its own task) or ours ([`own`], driven by the
/// request that uses it).
pub(super) enum Conn {
    Hyper(SendRequest<RequestBody>),
    Own(Box<OwnConn>),
}

impl Kind {
    pub(super) fn other(self) -> Kind {
        match self {
            Kind::Own => Kind::Hyper,
            Kind::Hyper => Kind::Own,
        }
    }
}

impl Conn {
    pub(super) fn kind(&self) -> Kind {
        match self {
            Conn::Hyper(_) => Kind::Hyper,
            Conn::Own(_) => Kind::Own,
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        match self {
            Conn::Hyper(sender) => sender.is_closed(),
            Conn::Own(own) => own.conn.is_closed(),
        }
    }

    /// Whether it can take a request now.
    pub(super) fn is_ready(&self) -> bool {
        match self {
            Conn::Hyper(sender) => sender.is_ready() && !sender.is_closed(),
            Conn::Own(own) => !own.conn.is_closed(),
        }
    }
}

/// Our own connection, with what the pool keeps for it.
pub(super) struct OwnConn {
    pub(super) conn: own::Connection,
    /// Weak: the pool's idle lists hold this connection, and a pool dropped (its service
    /// removed or redeployed with other pool flags) closes our idle connections at once
    /// (hyper's connection tasks hold theirs until the reaper closes them).
    pub(super) target: Weak<TargetPool>,
    pub(super) home: usize,
    /// `--target-max-conns`: the connection's until it closes.
    pub(super) _slot: Option<OwnedSemaphorePermit>,
    /// It goes back to the pool after this exchange.
    pub(super) pooled: bool,
}

impl Drop for OwnConn {
    fn drop(&mut self) {
        if let Some(target) = self.target.upgrade() {
            target.open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Lease for OwnConn {
    fn connection(&mut self) -> &mut own::Connection {
        &mut self.conn
    }

    fn release(mut self: Box<Self>) {
        if !self.pooled {
            return;
        }
        if let Some(target) = self.target.upgrade() {
            self.conn.shrink_idle();
            let home = self.home;
            target.put(Upstream {
                conn: Conn::Own(self),
                home,
            });
        }
    }
}

impl TargetPool {
    /// `list` below [`crate::worker::slots`] (taken modulo the lists, should a pool have
    /// been made before the workers were counted).
    pub(super) fn lock(&self, list: usize) -> std::sync::MutexGuard<'_, IdleList> {
        // A list of connections holds no invariant a panic could break.
        self.idle[list % self.idle.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used connection of `kind` in worker `list`'s list, idle for less
    /// than `limit`, that can take a request. Those found past it or closed on the way
    /// are closed.
    pub(super) fn take(&self, list: usize, limit: Duration, kind: Kind) -> Option<Upstream> {
        let now = crate::clock::now();
        let mut idle = self.lock(list);
        let mut at = idle.conns.len();
        while at > 0 {
            at -= 1;
            if idle.conns[at].conn.kind() != kind {
                continue;
            }
            let found = idle.conns.remove(at);
            self.idle_count.fetch_sub(1, Ordering::Relaxed);
            if now.duration_since(found.since) < limit && found.conn.is_ready() {
                return Some(Upstream {
                    conn: found.conn,
                    home: list,
                });
            }
        }
        None
    }

    /// As [`TargetPool::take`], this worker's list first, then the others'.
    pub(super) fn take_any(&self, limit: Duration, kind: Kind) -> Option<Upstream> {
        let own = crate::worker::index();
        (0..self.idle.len()).find_map(|i| self.take((own + i) % self.idle.len(), limit, kind))
    }

    /// Takes the longest-idle connection out of the pool (dropping it closes it).
    pub(super) fn evict_oldest(&self, kind: Option<Kind>) -> Option<Idle> {
        let fits = |c: &Idle| kind.is_none_or(|k| c.conn.kind() == k);
        let oldest = (0..self.idle.len())
            .filter_map(|i| {
                let idle = self.lock(i);
                idle.conns.iter().find(|c| fits(c)).map(|c| (c.since, i))
            })
            .min()?;
        let mut idle = self.lock(oldest.1);
        let at = idle.conns.iter().position(fits)?;
        self.idle_count.fetch_sub(1, Ordering::Relaxed);
        Some(idle.conns.remove(at))
    }

    /// Returns a connection to the pool once hyper can send on it again: now, when its
    /// response has been read in full already (the usual small answer), or when the
    /// streaming body has ended.
    pub(super) fn give_back(self: Arc<Self>, mut sender: SendRequest<RequestBody>, home: usize) {
        if sender.is_ready() {
            let conn = Conn::Hyper(sender);
            self.put(Upstream { conn, home });
        } else if !sender.is_closed() {
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    let conn = Conn::Hyper(sender);
                    self.put(Upstream { conn, home });
                }
            });
        }
    }

    /// Into the list of the worker that drives the connection. At the idle limit the
    /// longest-idle connection of any list closes to make room: the one just used is the
    /// likelier to be wanted again, by the worker that just used it.
    pub(super) fn put(self: Arc<Self>, conn: Upstream) {
        if self.slots.is_some() {
            // At `--target-max-conns`, a connection nobody waiting can use closes, so its
            // slot goes to a request that needs another kind, or a new connection.
            let waiting = |i: usize| self.waiting[i].load(Ordering::Acquire);
            let kind = conn.conn.kind();
            if waiting(kind as usize) == 0 && waiting(kind.other() as usize) + waiting(NEW) > 0 {
                return;
            }
        }
        while self.idle_count.fetch_add(1, Ordering::Relaxed) >= self.settings.max_idle {
            self.idle_count.fetch_sub(1, Ordering::Relaxed);
            if self.evict_oldest(None).is_none() {
                // Others are pushing at this moment: this one closes instead.
                return;
            }
        }
        let since = crate::clock::now();
        let list = conn.home;
        let mut idle = self.lock(list);
        idle.conns.push(Idle {
            conn: conn.conn,
            since,
        });
        if !idle.reaping {
            idle.reaping = true;
            tokio::spawn(reap(
                Arc::downgrade(&self),
                list,
                self.settings.idle_timeout,
            ));
        }
        drop(idle);
        // Only a request waiting at `--target-max-conns` listens. All of them wake (each
        // looks for its own kind; those of the other kind wait on).
        if self.slots.is_some() {
            self.returned.notify_waiters();
        }
    }
}

/// Closes connections idle for `timeout` (a dropped sender closes its connection), while
/// the target has idle connections.
async fn reap(target: Weak<TargetPool>, list: usize, timeout: Duration) {
    loop {
        let next = {
            let Some(target) = target.upgrade() else {
                return;
            };
            let now = Instant::now();
            let mut idle = target.lock(list);
            let before = idle.conns.len();
            idle.conns
                .retain(|c| now.duration_since(c.since) < timeout && !c.conn.is_closed());
            target
                .idle_count
                .fetch_sub(before - idle.conns.len(), Ordering::Relaxed);
            match idle.conns.iter().map(|c| c.since).min() {
                Some(oldest) => oldest + timeout,
                None => {
                    idle.reaping = false;
                    return;
                }
            }
        };
        tokio::time::sleep_until(next).await;
    }
}
