//! Which request-serving thread the caller is on.
//!
//! The HTTP and HTTPS listeners run one single-threaded runtime per core
//! ([`crate::server::workers`]); state that a request touches on every exchange (the idle
//! upstream connections of a target) is kept per worker, so a request finds what its own
//! thread made and drives, and never waits for a wake-up on another core; shared values a
//! request holds on to are reached through a handle per worker ([`PerWorker`]), so the
//! reference count it writes stays in its own core's cache. Threads that
//! are not workers (the control runtime's, which serves HTTP/3; tests) share one more
//! slot, [`count`]: per-worker state has [`slots`] entries.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

static COUNT: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// How many workers there are (1 until the workers start): the size of per-worker state.
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// Entries of per-worker state: one per worker and one for every other thread.
pub fn slots() -> usize {
    count() + 1
}

/// This thread's slot, below [`slots`]: its worker's index, or [`count`] off the workers.
pub fn index() -> usize {
    INDEX.with(Cell::get).min(count())
}

/// Set once at start, before anything sized by [`count`] is made.
pub(crate) fn set_count(n: usize) {
    COUNT.store(n.max(1), Ordering::Relaxed);
}

/// Called by worker `i` on its own thread.
pub(crate) fn enter(i: usize) {
    INDEX.with(|c| c.set(i));
}

/// `T` alone on its cache lines: 128 bytes, as x86's prefetcher fetches lines in pairs
/// (crossbeam's `CachePadded` makes the same choice). Per-worker state that each worker
/// writes on every request goes in one of these, so one worker's writes never take the
/// line from under another's.
#[repr(align(128))]
#[derive(Default)]
pub struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A shared value that the request path holds on to for a request (a service's config, its
/// pool), with a handle per worker. Cloning an `Arc` writes its count; every worker
/// cloning the same `Arc` on every request moves that line between the cores each time
/// (bench/README.md, "Twentieth round"). [`PerWorker::local`] clones this worker's own
/// handle instead: the count it writes is on lines no other worker touches, and the
/// value's own `Arc` is not written at all. A worker's handle is made the first time it
/// serves the value, so a service no request reaches (asleep, say, among a thousand) costs
/// no handle.
pub struct PerWorker<T> {
    shared: Arc<T>,
    /// Read-only once set: only the handles' own counts are written.
    handles: Box<[OnceLock<Handle<T>>]>,
}

/// One worker's reference to a [`PerWorker`] value, alone on its cache lines.
type Handle<T> = Arc<Padded<Arc<T>>>;

/// A worker's handle on a [`PerWorker`] value, held for a request.
pub struct Local<T>(Handle<T>);

impl<T> PerWorker<T> {
    /// Room for a handle per slot ([`slots`]); made after the workers are counted, as the
    /// services are (a value made before has fewer slots, shared round the workers).
    pub fn new(value: Arc<T>) -> Self {
        PerWorker {
            shared: value,
            handles: (0..slots()).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The value's own `Arc`, for whatever is not on the request path.
    pub fn shared(&self) -> &Arc<T> {
        &self.shared
    }

    /// This thread's handle.
    pub fn local(&self) -> Local<T> {
        let slot = &self.handles[index() % self.handles.len()];
        Local(
            slot.get_or_init(|| Arc::new(Padded(self.shared.clone())))
                .clone(),
        )
    }
}

impl<T> Clone for Local<T> {
    fn clone(&self) -> Self {
        Local(self.0.clone())
    }
}

impl<T> std::ops::Deref for Local<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_s_handle_is_its_own_made_when_it_first_serves() {
        let value = Arc::new(String::from("config"));
        let per_worker = Arc::new(PerWorker::new(value.clone()));
        assert_eq!(per_worker.handles.len(), slots());
        // Ours and the `PerWorker`'s: no handle yet.
        assert_eq!(Arc::strong_count(&value), 2);
        let local = per_worker.local();
        let _again = local.clone();
        let and_again = per_worker.local();
        // One handle for this thread, whose clones write its count, not the value's.
        assert_eq!(Arc::strong_count(&value), 3);
        assert_eq!(Arc::strong_count(&local.0), 4);
        assert_eq!(&*and_again, "config");
        assert!(Arc::ptr_eq(per_worker.shared(), &value));
        assert_eq!(
            Arc::as_ptr(&local.0) as usize % 128,
            0,
            "a handle fills 128-byte blocks"
        );
        // Worker 0 gets a handle of its own (a test thread uses the last slot).
        let worker = per_worker.clone();
        let theirs = std::thread::spawn(move || {
            enter(0);
            Arc::as_ptr(&worker.local().0) as usize
        })
        .join()
        .unwrap();
        assert_ne!(theirs, Arc::as_ptr(&local.0) as usize);
        assert_eq!(Arc::strong_count(&value), 4);
    }
}
