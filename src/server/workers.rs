//! One single-threaded runtime per core, for the HTTP and HTTPS listeners.
//!
//! Measured on two cores (bench/README.md, issue 12): with one work-stealing runtime a
//! proxied request cost 41 µs of CPU against 27 µs on one core, most of the difference in
//! the kernel: a connection's task moves between threads, and the task that drives an
//! upstream connection is woken from the other core. Here each worker thread accepts from
//! its own duplicate of the listening socket and serves every connection it accepted to
//! its end, on that thread, over upstream connections it opened itself (the pool keeps
//! idle connections per worker, [`crate::worker`]). One socket, not one per worker
//! (`SO_REUSEPORT`): a second proxy on the port still gets `address already in use`, the
//! hand-over to the next generation still passes one socket per role, and a worker that
//! is busy simply accepts less (the kernel wakes every worker; the first to call `accept`
//! gets the connection).
//!
//! The control side (control socket, deploys and health checks, scale-to-zero, ACME,
//! metrics, HTTP/3) stays on the main multi-threaded runtime.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::limits::ConnectionSlots;
use super::{Shutdown, accept_loop};

/// The worker threads; cloning shares them.
#[derive(Clone)]
pub struct Workers {
    runtimes: Arc<[Handle]>,
    stop: CancellationToken,
}

/// Joins the worker threads once [`Workers::stop`] has been called.
pub struct Threads(Vec<std::thread::JoinHandle<()>>);

impl Workers {
    /// How many workers `run` starts: `TOKIO_WORKER_THREADS` when set (as tokio's own
    /// runtime reads it), else one per CPU this process may run on (its affinity mask and
    /// cgroup quota).
    pub fn default_count() -> usize {
        std::env::var("TOKIO_WORKER_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1)
    }

    /// Starts `count` worker threads, each running its own runtime until [`Workers::stop`].
    pub fn start(count: usize) -> std::io::Result<(Workers, Threads)> {
        let count = count.max(1);
        crate::worker::set_count(count);
        let stop = CancellationToken::new();
        let mut runtimes = Vec::with_capacity(count);
        let mut threads = Vec::with_capacity(count);
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                // As on the main runtime: access lines wait in this thread's batch until
                // it goes idle (observe/log/batch.rs).
                .on_thread_park(crate::observe::log::thread_idle)
                .build()?;
            runtimes.push(runtime.handle().clone());
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("kp-worker-{index}"))
                .spawn(move || {
                    crate::worker::enter(index);
                    runtime.block_on(stop.cancelled());
                    // Dropping the runtime drops what is left on it (idle upstream
                    // connections); the shutdown has drained the requests before.
                    drop(runtime);
                    crate::observe::log::thread_stopping();
                })?;
            threads.push(thread);
        }
        let workers = Workers {
            runtimes: runtimes.into(),
            stop,
        };
        Ok((workers, Threads(threads)))
    }

    pub fn count(&self) -> usize {
        self.runtimes.len()
    }

    /// Lets the worker threads end (what still runs on them is dropped).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Accepts from `listener` on every worker and serves each connection with `serve` on
    /// the worker that accepted it, until the shutdown begins; returns once every worker
    /// has drained its connections (see [`accept_loop`]).
    pub async fn accept<F, Fut>(
        &self,
        listener: TcpListener,
        slots: ConnectionSlots,
        shutdown: Arc<Shutdown>,
        serve: F,
    ) where
        F: Fn(TcpStream, SocketAddr, CancellationToken) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let listener = match listener.into_std() {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "Failed to hand the listener to the workers");
                return;
            }
        };
        let mut loops = Vec::with_capacity(self.runtimes.len());
        for runtime in self.runtimes.iter() {
            // A duplicate descriptor of the same socket: one accept queue for all.
            let socket = match listener.try_clone() {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "A worker could not share the listener; fewer workers accept");
                    continue;
                }
            };
            let (slots, shutdown, serve) = (slots.clone(), shutdown.clone(), serve.clone());
            loops.push(runtime.spawn(async move {
                // Registered with this worker's own reactor.
                match TcpListener::from_std(socket) {
                    Ok(listener) => accept_loop(listener, &slots, shutdown, serve).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "A worker could not listen");
                        true
                    }
                }
            }));
        }
        // The original descriptor is not polled by anyone.
        drop(listener);
        let mut all_closed = true;
        for l in loops {
            all_closed &= l.await.unwrap_or(true);
        }
        if !all_closed {
            tracing::warn!("Closing active connections");
        }
    }
}

impl Threads {
    /// Waits for the worker threads to end, after [`Workers::stop`].
    pub fn join(self) {
        for t in self.0 {
            let _ = t.join();
        }
    }
}
