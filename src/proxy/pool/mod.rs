//! The connections to one service's targets: our own HTTP/1 connections ([`own`]) for
//! requests without a body, hyper's for those with one and for upgrades.
//!
//! hyper-util's pooled client cost about 8,000 instructions per request on top of hyper's
//! connection itself (bench/README.md): a pool key cloned and hashed byte by byte with
//! SipHash, a race between the pool and a lazily built connect future, large futures
//! moved between layers, and a task spawned to return a connection whose body is still
//! streaming. This pool does what the proxy needs and no more: HTTP/1.1 only (targets
//! speak nothing else here), and per target and worker thread a short list of idle
//! connections under a mutex of its own, held for a push or a pop.
//!
//! Each service has its own [`Pools`], built from its deploy's pool flags (fork F19), and
//! in it each target a [`TargetPool`]:
//! - `--target-max-conns` is a semaphore whose permits the connections hold for their
//!   whole life (connecting, busy and idle, as Go's `MaxConnsPerHost`); a request over it
//!   waits for an idle connection or a free permit, whichever comes first, and one that
//!   needs a connection of its own (an upgrade) closes the longest-idle one to free its
//!   permit. One limit per target, whatever the path timeout, the worker thread or the
//!   kind of connection.
//! - `--target-max-idle-conns` idle connections at most, all workers together; past it a
//!   connection closes.
//! - Idle connections wait in the list of the worker thread that opened them
//!   ([`crate::worker`]): a socket is registered with the runtime of the thread that opened
//!   it (and hyper drives its connection in a task there), so a request that took another
//!   thread's connection would wake that thread for every read and write. A request takes
//!   its own worker's connections; only one that waits at the connection limit takes any
//!   worker's (and that connection still goes back to the list of the worker it belongs
//!   to). When the idle limit is reached, a connection coming back replaces the
//!   longest-idle one of any worker, so one worker's burst cannot keep the others dialling
//!   for every request.
//! - `--target-idle-conn-timeout`: an idle connection is not taken past it, and a reaper
//!   (one task per target and worker, only while it has idle connections) closes it.
//! - `--target-dial-timeout` bounds connecting (name resolution included).
//!
//! A bodiless request takes our own connections, a request with a body or an upgrade
//! hyper's. At `--target-max-conns`, a waiting request closes an idle connection of the
//! other kind that nobody waits for, and a connection coming back that no waiting request
//! can use closes, so its slot goes to one that needs the other kind or a new connection
//! (which before waited for the idle timeout).
//!
//! Kept from hyper-util: a request refused by a reused connection before any of it was
//! written goes again on another connection (its `retry_canceled_requests`); an idle
//! connection the app closed is not taken (hyper's task notices the close; ours is checked
//! without a system call unless its socket has become readable); a connection goes back
//! to the pool only once it can carry the next request. Errors read as hyper-util's did
//! (`client error (Connect)`, `client error (SendRequest)`), so log lines are unchanged.

use arc_swap::ArcSwap;
use http::uri::{Authority, Scheme};
use http::{Method, Request, Uri};
use http_body::Body as _;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};

use super::body::{BoxedResponse, RequestBody, ResponseBody, UpstreamBody};
use super::http1 as own;
use super::proxy_fields::ProxyFields;
use super::retry::Tracked;
use crate::options::upstream::PoolSettings;
use crate::worker::Padded;

mod error;
mod target;
#[cfg(test)]
mod tests;

pub(crate) use error::{
    AnswerTimedOut, ConnectFailure, DialTimeout, UpstreamError, caused_by, connect_failure,
};
use target::{Conn, Kind, NEW, OwnConn, TargetPool, Upstream, Waiting};

type BoxError = Box<dyn StdError + Send + Sync>;
/// Keyed by the target's address as the deploy wrote it (the same `Target` always gives the
/// same string): hashed in one pass and compared with `memcmp`, where `Authority` hashes
/// and compares a case-folded byte at a time.
type ByTarget = HashMap<Box<str>, Arc<TargetPool>, BuildHasherDefault<Fnv>>;

/// One service's connections to its targets, by target address.
pub struct Pools {
    settings: PoolSettings,
    connector: HttpConnector,
    /// Read on every request (one atomic load and a lookup); written once per target.
    targets: ArcSwap<ByTarget>,
}

/// Whether a request's connection may be reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reuse {
    /// An idle connection younger than this, else a new one that goes back to the pool.
    Pooled(Duration),
    /// A new connection, closed after the exchange.
    Fresh,
    /// A new connection that may switch protocols (a WebSocket): it leaves the pool's
    /// count once it has (as a hijacked connection leaves Go's).
    Upgrade,
}

impl Pools {
    pub fn new(settings: PoolSettings) -> Pools {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Pools {
            settings,
            connector,
            targets: ArcSwap::default(),
        }
    }

    /// The pools of a redeployed service: the same settings keep the targets that still
    /// hold connections, so a connection limit spans the deploy (in-flight requests to
    /// a target that stays count against the same limit) and warm connections are kept.
    pub fn succeed(old: &Pools, settings: PoolSettings) -> Pools {
        let new = Pools::new(settings);
        if old.settings == settings {
            let kept: ByTarget = old
                .targets
                .load()
                .iter()
                .filter(|(_, t)| t.open.load(Ordering::Acquire) > 0)
                .map(|(a, t)| (a.clone(), t.clone()))
                .collect();
            new.targets.store(Arc::new(kept));
        }
        new
    }

    pub fn settings(&self) -> &PoolSettings {
        &self.settings
    }

    /// Sends `req` (its URI the path and query alone) to the target at `host`, with the
    /// proxy's `fields`, which replace the client's of the same names as it leaves.
    /// `answer_within` (`--target-timeout` or a `--path-timeout`) bounds the wait for the
    /// answer's head once the request is written, body included, as Go's
    /// `ResponseHeaderTimeout` does: a slow upload, or a wait at `--target-max-conns`, is
    /// not cut short. Past it the error is [`AnswerTimedOut`].
    ///
    /// The request is borrowed, not moved: it stays in the caller's future, and the
    /// layers below hold a reference to it instead of a copy of its 328 bytes each (four
    /// copies a request, from the forwarder's future down to the exchange). A request
    /// with a body goes to hyper, which takes it: `req` is left empty then. A failure
    /// that left it whole says so ([`UpstreamError::can_resend`]).
    ///
    /// Not an `async fn`: those keep each argument twice in their future.
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn send<'a>(
        &'a self,
        req: &'a mut Request<RequestBody>,
        host: &'a Authority,
        fields: &'a ProxyFields<'a>,
        reuse: Reuse,
        answer_within: Option<Duration>,
    ) -> impl Future<Output = Result<BoxedResponse, UpstreamError>> + Send + 'a {
        async move {
            let target = self.target(host);
            // Our own connection takes every request it can: one without a body to stream,
            // that does not switch protocols.
            if reuse != Reuse::Upgrade
                && req.body().is_end_stream()
                && req.method() != Method::CONNECT
            {
                let sent = self
                    .send_own(req, fields, &target, host, reuse, answer_within)
                    .await;
                if sent.is_ok() {
                    // Its head is out, and a request answered is not sent again: the
                    // header map goes back to this thread's spares.
                    super::header_maps::recycle(std::mem::take(req.headers_mut()));
                }
                return sent;
            }
            fields.apply(req.headers_mut());
            let req = std::mem::replace(req, Request::new(RequestBody::empty()));
            self.send_hyper(req, &target, host, reuse, answer_within)
                .await
        }
    }

    /// Over one of our own connections. A failure leaves the request whole (it has no
    /// body), so it can be sent again. (Not an `async fn`: see [`Pools::send`].)
    #[allow(clippy::manual_async_fn)]
    fn send_own<'a>(
        &'a self,
        req: &'a Request<RequestBody>,
        fields: &'a ProxyFields<'a>,
        target: &'a Arc<TargetPool>,
        host: &'a Authority,
        reuse: Reuse,
        answer_within: Option<Duration>,
    ) -> impl Future<Output = Result<BoxedResponse, UpstreamError>> + Send + 'a {
        async move {
            let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
            loop {
                let (conn, reused) = match self.checkout(target, host, reuse, Kind::Own).await {
                    Ok(checked) => checked,
                    Err(e) => return Err(e.resendable()),
                };
                let Conn::Own(mut conn) = conn.conn else {
                    unreachable!("a checkout of our own kind")
                };
                let answered =
                    conn.conn
                        .send(req.method(), path, req.headers(), fields, answer_within);
                let failed = match answered.await {
                    Ok(head) => {
                        // A connection's buffers stay at the largest head they held: one
                        // whose request or response head was large closes after its
                        // exchange.
                        conn.pooled = matches!(reuse, Reuse::Pooled(_))
                            && head.request_bytes <= KEEP_HEAD_LIMIT
                            && head.bytes <= KEEP_HEAD_LIMIT;
                        let response = own::body::response(head, conn);
                        let body = |b| ResponseBody::stream(UpstreamBody::Own(b));
                        return Ok(Box::new(response.map(body)));
                    }
                    // Not a byte of it was written: the reused connection was closing.
                    Err(own::SendError::Unsent(_)) if reused => continue,
                    Err(own::SendError::Unsent(e)) => e.into(),
                    Err(own::SendError::Failed(e)) => e.into(),
                    Err(own::SendError::TimedOut) => Box::new(AnswerTimedOut) as BoxError,
                };
                return Err(UpstreamError::new("SendRequest", failed).resendable());
            }
        }
    }

    /// Over one of hyper's connections (a body to stream, or an upgrade).
    async fn send_hyper(
        &self,
        mut req: Request<RequestBody>,
        target: &Arc<TargetPool>,
        host: &Authority,
        reuse: Reuse,
        answer_within: Option<Duration>,
    ) -> Result<BoxedResponse, UpstreamError> {
        // hyper keeps a connection's buffers at the largest head they held: one whose request
        // or response head was large closes after its exchange instead of idling.
        let keep =
            matches!(reuse, Reuse::Pooled(_)) && head_bytes(req.headers()) <= KEEP_HEAD_LIMIT;
        // hyper writes the URI as it is: [`Pools::send`]'s is the path alone.
        loop {
            let (conn, reused) = self.checkout(target, host, reuse, Kind::Hyper).await?;
            let Conn::Hyper(mut sender) = conn.conn else {
                unreachable!("a checkout of hyper's kind")
            };
            let answered = match answer_within {
                None => sender.try_send_request(req).await,
                Some(limit) => {
                    // The body says when it is all sent only when a clock waits for it.
                    let body_sent = req.body_mut().track_sent();
                    match within(limit, body_sent, sender.try_send_request(req)).await {
                        Some(answered) => answered,
                        None => {
                            let timed_out = Box::new(AnswerTimedOut);
                            return Err(UpstreamError::new("SendRequest", timed_out));
                        }
                    }
                }
            };
            match answered {
                Ok(response) => {
                    if keep && head_bytes(response.headers()) <= KEEP_HEAD_LIMIT {
                        target.clone().give_back(sender, conn.home);
                    }
                    let body = |b| ResponseBody::stream(UpstreamBody::Hyper(b));
                    return Ok(Box::new(response.map(body)));
                }
                Err(mut e) => match e.take_message() {
                    // Not a byte of it was written: the reused connection was closing.
                    // hyper-util tries again; so do we, on the next connection.
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(UpstreamError::new("SendRequest", e.into_error().into())),
                },
            }
        }
    }

    /// The pool of `host`, made on its first request.
    fn target(&self, host: &Authority) -> Arc<TargetPool> {
        if let Some(t) = self.targets.load().get(host.as_str()) {
            return t.clone();
        }
        let slots = self
            .settings
            .max_conns
            .map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS))));
        let made = Arc::new(TargetPool {
            idle: (0..crate::worker::slots())
                .map(|_| Padded::default())
                .collect(),
            idle_count: Padded::default(),
            slots,
            returned: Notify::new(),
            waiting: Default::default(),
            open: AtomicUsize::new(0),
            settings: self.settings,
        });
        let map = self.targets.rcu(|map| {
            if map.contains_key(host.as_str()) {
                return Arc::clone(map);
            }
            let mut map = ByTarget::clone(map);
            map.insert(host.as_str().into(), made.clone());
            Arc::new(map)
        });
        // `rcu` returns the map it replaced: ours went in unless another request's did.
        match map.get(host.as_str()) {
            Some(theirs) => theirs.clone(),
            None => made,
        }
    }

    /// A connection for the next request: an idle one when `reuse` allows, else a new
    /// one once the target's connection limit has room. `true`: it was reused.
    async fn checkout(
        &self,
        target: &Arc<TargetPool>,
        host: &Authority,
        reuse: Reuse,
        kind: Kind,
    ) -> Result<(Upstream, bool), UpstreamError> {
        'checkout: loop {
            if let Reuse::Pooled(limit) = reuse {
                if let Some(sender) = target.take(crate::worker::index(), limit, kind) {
                    return Ok((sender, true));
                }
            }
            let slot = match &target.slots {
                None => None,
                Some(slots) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => Some(slot),
                    Err(_) => {
                        tracing::debug!(
                            "target" = %host,
                            max_conns = ?self.settings.max_conns,
                            "Waiting for a connection to the target"
                        );
                        match reuse {
                            Reuse::Pooled(limit) => {
                                // A connection coming back idle serves this request as well
                                // as a new one would. Registered before looking again, so
                                // a connection returned in between is not missed.
                                let _waiting = Waiting::new(&target.waiting[kind as usize]);
                                let returned = target.returned.notified();
                                let mut returned = std::pin::pin!(returned);
                                returned.as_mut().enable();
                                if let Some(sender) = target.take_any(limit, kind) {
                                    return Ok((sender, true));
                                }
                                // An idle connection of the other kind holds a slot this
                                // request cannot use: closing one frees it, unless a request
                                // of that kind is waiting for it.
                                let other = &target.waiting[kind.other() as usize];
                                if other.load(Ordering::Acquire) == 0 {
                                    drop(target.evict_oldest(Some(kind.other())));
                                }
                                tokio::select! {
                                    slot = slots.clone().acquire_owned() => slot.ok(),
                                    _ = returned => continue 'checkout,
                                }
                            }
                            // A request that needs a connection of its own (an upgrade, a
                            // fresh one) cannot use an idle one: closing the longest-idle
                            // frees its slot, rather than waiting for the reaper or the app.
                            Reuse::Fresh | Reuse::Upgrade => {
                                let _waiting = Waiting::new(&target.waiting[NEW]);
                                drop(target.evict_oldest(None));
                                slots.clone().acquire_owned().await.ok()
                            }
                        }
                    }
                },
            };
            let home = crate::worker::index();
            let conn = match kind {
                Kind::Own => {
                    let io = self.dial(host).await?;
                    target.open.fetch_add(1, Ordering::AcqRel);
                    Conn::Own(Box::new(OwnConn {
                        conn: own::Connection::new(io),
                        target: Arc::downgrade(target),
                        home,
                        _slot: slot,
                        pooled: false,
                    }))
                }
                Kind::Hyper => Conn::Hyper(
                    self.connect(target, host, slot, reuse == Reuse::Upgrade)
                        .await?,
                ),
            };
            return Ok((Upstream { conn, home }, false));
        }
    }

    /// A TCP connection to `host` (its name resolved), within `--target-dial-timeout`.
    async fn dial(&self, host: &Authority) -> Result<tokio::net::TcpStream, UpstreamError> {
        let connect_error = |e: BoxError| UpstreamError::new("Connect", e);
        let dst = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(host.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| connect_error(e.into()))?;
        let mut connector = self.connector.clone();
        let connecting = tower_service::Service::call(&mut connector, dst);
        let limit = self.settings.dial_timeout;
        match tokio::time::timeout(limit, connecting).await {
            Ok(io) => Ok(io.map_err(|e| connect_error(e.into()))?.into_inner()),
            Err(_) => Err(connect_error(Box::new(DialTimeout(limit)))),
        }
    }

    async fn connect(
        &self,
        target: &Arc<TargetPool>,
        host: &Authority,
        slot: Option<OwnedSemaphorePermit>,
        upgrades: bool,
    ) -> Result<SendRequest<RequestBody>, UpstreamError> {
        let connect_error = |e: BoxError| UpstreamError::new("Connect", e);
        let io = TokioIo::new(Tracked::new(self.dial(host).await?));
        let (sender, connection) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| connect_error(e.into()))?;
        target.open.fetch_add(1, Ordering::AcqRel);
        let target = target.clone();
        tokio::spawn(async move {
            // The slot is the connection's until it closes (or is upgraded away).
            let _slot = slot;
            let ended = if upgrades {
                connection.with_upgrades().await
            } else {
                connection.await
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "Upstream connection error");
            }
            target.open.fetch_sub(1, Ordering::AcqRel);
        });
        Ok(sender)
    }
}

/// A connection whose request or response head was larger than this is not kept idle:
/// hyper's read and write buffers stay at the largest head they held, so after a burst of
/// 32 KiB heads every pooled connection held ~75 KB (7.5 MB for 100 idle connections,
/// `bench/rss_bursts.sh`) for as long as it idled. Ordinary heads, cookies included, are
/// well below it.
const KEEP_HEAD_LIMIT: usize = 16 * 1024;

/// About the bytes a head takes on the wire (name, `: `, value, CRLF per field).
fn head_bytes(headers: &http::HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum()
}

/// `exchange`'s outcome, unless `limit` passes first. The clock starts once the request's
/// body is all sent (at once for a request without one).
async fn within<F: Future>(
    limit: Duration,
    body_sent: Option<oneshot::Receiver<()>>,
    exchange: F,
) -> Option<F::Output> {
    let clock = async {
        if let Some(sent) = body_sent {
            // A body that fails or is dropped unsent: its error comes from the exchange.
            let _ = sent.await;
        }
        tokio::time::sleep(limit).await;
    };
    tokio::select! {
        biased;
        out = exchange => Some(out),
        () = clock => None,
    }
}

/// FNV-1a over the address (one `write` for the string, one for its terminator): short
/// keys, our own target addresses, not attacker-chosen, so SipHash's cost buys nothing.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}
