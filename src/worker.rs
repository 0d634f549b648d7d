//! Which request-serving thread the caller is on.
//!
//! The HTTP and HTTPS listeners run one single-threaded runtime per core
//! ([`crate::server::workers`]); state that a request touches on every exchange (the idle
//! upstream connections of a target) is kept per worker, so a request finds what its own
//! thread made and drives, and never waits for a wake-up on another core. Threads that
//! are not workers (the control runtime's, which serves HTTP/3; tests) share one more
//! slot, [`count`]: per-worker state has [`slots`] entries.

use std::cell::Cell;
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
