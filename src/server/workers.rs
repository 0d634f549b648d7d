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
//! gets the connection). A connection stays on its worker for life, so a worker that won
//! more of a burst of new connections than its share (wrk's 64 split 43/21 in one run)
//! would stay the busier one: a worker holding more than [`Share::SLACK`] connections over
//! another waits [`Share::YIELD`] before each accept, which lets the other take them.
//!
//! The control side (control socket, deploys and health checks, scale-to-zero, ACME,
//! metrics, HTTP/3's UDP endpoint) runs on a single-threaded runtime of its own, on the
//! main thread (cli/run.rs); HTTP/3's connections are served on the workers.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::limits::ConnectionSlots;
use super::{Drain, Shutdown, accept_loop};

/// The worker threads; cloning shares them.
#[derive(Clone)]
pub struct Workers {
    runtimes: Arc<[Handle]>,
    stop: CancellationToken,
}

/// Joins the worker threads once [`Workers::stop`] has been called.
pub struct Threads(Vec<std::thread::JoinHandle<()>>);

impl Workers {
    /// How many workers `run` starts: `TOKIO_WORKER_THREADS` when it is a positive number,
    /// else one per CPU this process may run on (its affinity mask and cgroup quota).
    /// The control runtime keeps its one thread either way.
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
                // Access lines wait in this thread's batch, handed to the log writer at most
                // every 100 ms or when it fills (observe/log/batch.rs).
                .on_thread_park(crate::observe::log::worker_idle)
                .build()?;
            runtimes.push(runtime.handle().clone());
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("kp-worker-{index}"))
                .spawn(move || {
                    crate::worker::enter(index);
                    runtime.block_on(stop.cancelled());
                    // Drops what is left on it (idle upstream connections); the shutdown
                    // has drained the requests before. Bounded: a name lookup on a
                    // blocking thread must not hold the exit.
                    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
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

    /// Runs `f` once on each worker's thread, and waits until all have (a worker that has
    /// stopped skips it).
    pub async fn on_each(&self, f: fn()) {
        let runs: Vec<_> = self
            .runtimes
            .iter()
            .map(|runtime| runtime.spawn(async move { f() }))
            .collect();
        for run in runs {
            let _ = run.await;
        }
    }

    /// Runs `future` on worker `n` (modulo their number): how HTTP/3 connections, which the
    /// control runtime's endpoint accepts, are spread over the workers.
    pub fn spawn<F>(&self, n: usize, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtimes[n % self.runtimes.len()].spawn(future)
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
        F: Fn(TcpStream, SocketAddr, Drain) -> Fut + Clone + Send + 'static,
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
        let open: Arc<[Arc<AtomicUsize>]> = self.runtimes.iter().map(|_| Arc::default()).collect();
        for (index, runtime) in self.runtimes.iter().enumerate() {
            let share = Share {
                open: open.clone(),
                index,
            };
            // A duplicate descriptor of the same socket: one accept queue for all.
            let socket = match listener.try_clone() {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "A worker could not share the listener; fewer workers accept");
                    share.leave();
                    continue;
                }
            };
            let (slots, shutdown, serve) = (slots.clone(), shutdown.clone(), serve.clone());
            loops.push(runtime.spawn(async move {
                // Registered with this worker's own reactor.
                match TcpListener::from_std(socket) {
                    Ok(listener) => accept_loop(listener, &slots, shutdown, share, serve).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "A worker could not listen");
                        share.leave();
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
        // The access lines of the last requests, before the caller logs that it stopped.
        let flushes: Vec<_> = self
            .runtimes
            .iter()
            .map(|r| r.spawn(async { crate::observe::log::flush_thread() }))
            .collect();
        for f in flushes {
            let _ = f.await;
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

/// One worker's part in a listener: the connections each worker holds, so none takes far
/// more than its share.
pub struct Share {
    /// Each worker's count, apart: a connection's [`Held`] keeps a thin pointer to its
    /// own (8 bytes of every connection's task, against 24 for the list and an index).
    open: Arc<[Arc<AtomicUsize>]>,
    index: usize,
}

impl Share {
    /// Connections a worker may hold over the least loaded one before it gives way.
    const SLACK: usize = 2;
    /// How long it gives way: the other worker, woken for the same connection, takes it
    /// meanwhile unless it is busy, and then this one takes it after all.
    pub const YIELD: Duration = Duration::from_millis(1);

    pub fn ahead(&self) -> bool {
        let own = self.open[self.index].load(Ordering::Relaxed);
        self.open
            .iter()
            .any(|other| other.load(Ordering::Relaxed).saturating_add(Self::SLACK) < own)
    }

    /// This worker does not accept (it could not listen): the others never wait for it.
    fn leave(&self) {
        self.open[self.index].store(usize::MAX, Ordering::Relaxed);
    }

    /// Counts a connection for this worker until the guard drops.
    pub fn hold(&self) -> Held {
        let own = &self.open[self.index];
        own.fetch_add(1, Ordering::Relaxed);
        Held(own.clone())
    }
}

/// A connection counted in its worker's [`Share`].
pub struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_gives_way_only_when_well_ahead_of_another() {
        let open: Arc<[Arc<AtomicUsize>]> = (0..2).map(|_| Arc::default()).collect();
        let (a, b) = (
            Share {
                open: open.clone(),
                index: 0,
            },
            Share { open, index: 1 },
        );
        let mut held: Vec<Held> = (0..Share::SLACK).map(|_| a.hold()).collect();
        assert!(!a.ahead(), "within the slack");
        held.push(a.hold());
        assert!(a.ahead());
        assert!(!b.ahead());
        let one_of_b = b.hold();
        assert!(!a.ahead(), "back within the slack once b holds one");
        drop(one_of_b);
        held.pop();
        assert!(!a.ahead(), "a connection that closes leaves the count");
    }

    #[test]
    fn on_each_runs_on_the_worker_thread() {
        static THREADS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        fn note_thread() {
            let name = std::thread::current().name().unwrap_or("").to_string();
            THREADS.lock().unwrap().push(name);
        }
        // One worker: `start` sets the worker count every test of this process sees, and
        // one is what it is before any worker starts.
        let (workers, threads) = Workers::start(1).unwrap();
        let caller = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        caller.block_on(workers.on_each(note_thread));
        workers.stop();
        threads.join();
        let mut seen = THREADS.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, ["kp-worker-0"]);
    }
}
