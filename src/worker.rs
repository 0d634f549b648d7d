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
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
/// value's own `Arc` is not written at all.
pub struct PerWorker<T> {
    shared: Arc<T>,
    handles: Box<[Arc<Padded<Arc<T>>>]>,
}

/// A worker's handle on a [`PerWorker`] value, held for a request.
pub struct Local<T>(Arc<Padded<Arc<T>>>);

impl<T> PerWorker<T> {
    /// One handle per slot ([`slots`]); made after the workers are counted, as the
    /// services are (a value made before has fewer handles, shared round the workers).
    pub fn new(value: Arc<T>) -> Self {
        let handles = (0..slots())
            .map(|_| Arc::new(Padded(value.clone())))
            .collect();
        PerWorker {
            shared: value,
            handles,
        }
    }

    /// The value's own `Arc`, for whatever is not on the request path.
    pub fn shared(&self) -> &Arc<T> {
        &self.shared
    }

    /// This thread's handle.
    pub fn local(&self) -> Local<T> {
        Local(self.handles[index() % self.handles.len()].clone())
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
    fn each_slot_has_its_own_handle_on_lines_of_its_own() {
        let value = Arc::new(String::from("config"));
        let per_worker = PerWorker::new(value.clone());
        assert_eq!(per_worker.handles.len(), slots());
        // The value's count: ours, the `PerWorker`'s, and one per handle; a local clone
        // writes none of them.
        assert_eq!(Arc::strong_count(&value), 2 + slots());
        let local = per_worker.local();
        let again = local.clone();
        assert_eq!(Arc::strong_count(&value), 2 + slots());
        assert_eq!(&*again, "config");
        assert!(Arc::ptr_eq(per_worker.shared(), &value));
        for handle in per_worker.handles.iter() {
            let at = Arc::as_ptr(handle) as usize;
            assert_eq!(at % 128, 0, "a handle's value starts a 128-byte block");
        }
        // A thread off the workers uses the last slot; worker 0 the first.
        assert!(Arc::ptr_eq(
            &local.0,
            &per_worker.handles[index() % slots()]
        ));
        std::thread::spawn(move || {
            enter(0);
            let on_worker = per_worker.local();
            assert!(Arc::ptr_eq(&on_worker.0, &per_worker.handles[0]));
        })
        .join()
        .unwrap();
    }
}
