//! The pool of keep-alive connections to targets, over hyper's own HTTP/1 client
//! connections.
//!
//! hyper-util's pooled client cost about 8,000 instructions per request on top of hyper's
//! connection itself (bench/README.md): a pool key cloned and hashed byte by byte with
//! SipHash, a race between the pool and a lazily built connect future, large futures
//! moved between layers, and a task spawned to return a connection whose body is still
//! streaming. This pool does what the proxy needs and no more: HTTP/1.1 only (targets
//! speak nothing else here), a short list of idle connections per target under a mutex
//! held for a push or a pop, the idle timeout checked when a connection is taken, and at
//! most [`Pool::max_idle`] idle connections per target in total.
//!
//! Kept from hyper-util: a request refused by a reused connection before any of it was
//! written goes again on another connection (its `retry_canceled_requests`); the
//! connection task is spawned, so idle connections notice the app closing them; a
//! connection goes back to the pool only once hyper is ready for its next request, by a
//! spawned wait when the body is still streaming. Errors read as hyper-util's did
//! (`client error (Connect)`, `client error (SendRequest)`), so log lines are unchanged.

use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri, header};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use super::body::RequestBody;
use super::retry::TrackingConnector;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Keep-alive connections to targets, by target address.
#[derive(Clone)]
pub(crate) struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    connector: TrackingConnector,
    /// A connection idle longer than this is not reused (the app may be closing it).
    idle_timeout: Duration,
    max_idle: usize,
    idle: Mutex<HashMap<Authority, Vec<Idle>, BuildHasherDefault<Fnv>>>,
}

struct Idle {
    sender: SendRequest<RequestBody>,
    since: Instant,
}

impl Pool {
    pub(crate) fn new(
        connector: TrackingConnector,
        idle_timeout: Duration,
        max_idle: usize,
    ) -> Self {
        Pool {
            inner: Arc::new(Inner {
                connector,
                idle_timeout,
                max_idle,
                idle: Mutex::default(),
            }),
        }
    }

    /// Sends `req` (its URI absolute: the target's address is its authority) on an idle
    /// connection to that target, or a new one.
    pub(crate) async fn send(
        &self,
        mut req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let Some(host) = req.uri().authority().cloned() else {
            return Err(UpstreamError::new(
                "Connect",
                "request without a target address".into(),
            ));
        };
        // HTTP/1 sends the path only, and a Host header (the client's, or the target's).
        if !req.headers().contains_key(header::HOST) {
            if let Ok(v) = HeaderValue::from_str(host_header(&host)) {
                req.headers_mut().insert(header::HOST, v);
            }
        }
        let origin = req
            .uri()
            .path_and_query()
            .cloned()
            .map_or_else(|| Uri::from_static("/"), Uri::from);
        *req.uri_mut() = origin;
        loop {
            let (mut sender, reused) = match self.inner.take(&host) {
                Some(sender) => (sender, true),
                None => (self.connect(&host).await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(response) => {
                    self.inner.clone().give_back(host, sender);
                    return Ok(response);
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

    async fn connect(&self, host: &Authority) -> Result<SendRequest<RequestBody>, UpstreamError> {
        let connect_error = |e: BoxError| UpstreamError::new("Connect", e);
        let dst = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(host.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| connect_error(e.into()))?;
        let mut connector = self.inner.connector.clone();
        let io = tower_service::Service::call(&mut connector, dst)
            .await
            .map_err(connect_error)?;
        let (sender, connection) = http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| connect_error(e.into()))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "Upstream connection error");
            }
        });
        Ok(sender)
    }
}

impl Inner {
    /// The most recently used idle connection to `host` that can take a request.
    fn take(&self, host: &Authority) -> Option<SendRequest<RequestBody>> {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.get_mut(host)?;
        while let Some(conn) = list.pop() {
            if now.duration_since(conn.since) < self.idle_timeout
                && conn.sender.is_ready()
                && !conn.sender.is_closed()
            {
                return Some(conn.sender);
            }
        }
        None
    }

    /// Returns a connection to the pool once hyper can send on it again: now, when its
    /// response has been read in full already (the usual small answer), or when the
    /// streaming body has ended.
    fn give_back(self: Arc<Self>, host: Authority, mut sender: SendRequest<RequestBody>) {
        if sender.is_ready() {
            self.put(host, sender);
        } else if !sender.is_closed() {
            tokio::spawn(async move {
                if sender.ready().await.is_ok() {
                    self.put(host, sender);
                }
            });
        }
    }

    fn put(&self, host: Authority, sender: SendRequest<RequestBody>) {
        let since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry(host).or_default();
        // Past the limit the connection closes as the sender drops.
        if list.len() < self.max_idle {
            list.push(Idle { sender, since });
        }
    }
}

/// The Host header for a target address: its port left out when it is HTTP's default,
/// as hyper-util did.
fn host_header(host: &Authority) -> &str {
    match host.port_u16() {
        Some(80) => host.host(),
        _ => host.as_str(),
    }
}

/// A failure to reach a target or to exchange with it.
#[derive(Debug)]
pub(crate) struct UpstreamError {
    /// hyper-util's name for the stage that failed.
    kind: &'static str,
    source: BoxError,
}

impl UpstreamError {
    fn new(kind: &'static str, source: BoxError) -> Self {
        UpstreamError { kind, source }
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client error ({})", self.kind)
    }
}

impl StdError for UpstreamError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// FNV-1a: `Authority` hashes itself a byte at a time (case-folded), which costs SipHash
/// a round per byte; the keys are our own target addresses, not attacker-chosen.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_header_leaves_out_the_default_port() {
        let a: Authority = "web:80".parse().unwrap();
        assert_eq!(host_header(&a), "web");
        let a: Authority = "127.0.0.1:3000".parse().unwrap();
        assert_eq!(host_header(&a), "127.0.0.1:3000");
        let a: Authority = "[::1]:8080".parse().unwrap();
        assert_eq!(host_header(&a), "[::1]:8080");
    }

    #[test]
    fn errors_read_as_hyper_utils() {
        let e = UpstreamError::new("Connect", "tcp connect error".into());
        assert_eq!(e.to_string(), "client error (Connect)");
        assert_eq!(e.source().unwrap().to_string(), "tcp connect error");
    }
}
