//! Heap room for the request path's large futures, reused on each worker thread.
//!
//! Three futures of every request are boxed so that the futures around them stay small
//! (the connection's exchange, the service's pipeline, the forward to a target: about
//! 1.5, 2.7 and 5 KB). glibc's per-thread cache (tcache) takes only blocks up to 1,032
//! bytes, so each of those went through `malloc`'s general path and back through
//! `free`'s, about 390 instructions a box (bench/README.md, "Tenth round"). A
//! [`Recycled`] future takes its block from a short list kept by the thread, per layout,
//! and gives it back there when it is dropped: a `Vec` pop and push.
//!
//! A block freed on another thread than the one that made it joins that thread's list
//! (blocks come from the global allocator; any thread may free them). Each list keeps
//! at most [`KEPT`] blocks: past it, blocks go back to the allocator, so a burst of
//! requests leaves little behind.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// Spare blocks kept per layout and thread: the requests that end between two that
/// start, as for the header maps (`proxy::header_maps`). With 64 connections on one worker,
/// a batch of answers often ends more than 16 requests at once; with 16 kept, `malloc`'s
/// general path ran 1.9 times a request there (0.4 with 16 connections), with 64 kept 0.3
/// (bench/README.md, "Nineteenth round"). At most 64 × (1.5 + 2.7 + 5 KB), about 590 KB, stay
/// with a worker after a burst, until `server::trim` notices its end and [`shed`]s them.
const KEPT: usize = 64;

/// A future in a block of its own, pinned there until dropped, like `Pin<Box<F>>`.
pub struct Recycled<F> {
    future: NonNull<F>,
    _owns: PhantomData<F>,
}

// SAFETY: `Recycled` owns its future as a `Box` does; the block itself is plain memory
// any thread may free.
unsafe impl<F: Send> Send for Recycled<F> {}
// SAFETY: as for `Send`; `&Recycled` gives no access to the future.
unsafe impl<F: Sync> Sync for Recycled<F> {}
// The future never moves: it stays in its block until it is dropped there.
impl<F> Unpin for Recycled<F> {}

impl<F: Future> Recycled<F> {
    pub fn new(future: F) -> Self {
        let layout = Layout::new::<F>();
        let block = if layout.size() == 0 {
            NonNull::dangling()
        } else {
            take(layout).cast::<F>()
        };
        // SAFETY: the block is fresh or spare (nothing lives in it), of `F`'s size and
        // alignment (a zero-sized future needs only an aligned pointer).
        unsafe { block.as_ptr().write(future) };
        Recycled {
            future: block,
            _owns: PhantomData,
        }
    }
}

impl<F: Future> Future for Recycled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // SAFETY: the future lives at `future` until `drop`, which is the only place it
        // is moved out of (dropped in place); no other reference to it exists.
        unsafe { Pin::new_unchecked(this.future.as_mut()) }.poll(cx)
    }
}

impl<F> Drop for Recycled<F> {
    fn drop(&mut self) {
        // SAFETY: the future was written in `new` and is dropped only here.
        unsafe { std::ptr::drop_in_place(self.future.as_ptr()) };
        give_back(self.future.cast(), Layout::new::<F>());
    }
}

/// The spare blocks of one layout.
struct Spares {
    layout: Layout,
    blocks: Vec<NonNull<u8>>,
}

impl Drop for Spares {
    fn drop(&mut self) {
        for block in self.blocks.drain(..) {
            // SAFETY: each block was allocated with this layout and holds nothing.
            unsafe { alloc::dealloc(block.as_ptr(), self.layout) };
        }
    }
}

thread_local! {
    /// This thread's spares, by layout (a few layouts: a linear search).
    static SPARES: RefCell<Vec<Spares>> = const { RefCell::new(Vec::new()) };
}

/// A block for `layout` (not of zero size): a spare one, or a new one.
fn take(layout: Layout) -> NonNull<u8> {
    let spare = SPARES
        .try_with(|spares| {
            let mut spares = spares.borrow_mut();
            let of_layout = spares.iter_mut().find(|s| s.layout == layout)?;
            of_layout.blocks.pop()
        })
        .ok()
        .flatten();
    spare.unwrap_or_else(|| {
        // SAFETY: the size is not zero.
        let block = unsafe { alloc::alloc(layout) };
        NonNull::new(block).unwrap_or_else(|| alloc::handle_alloc_error(layout))
    })
}

/// Keeps `block` (empty, allocated for `layout`) for the next [`take`], or frees it.
fn give_back(block: NonNull<u8>, layout: Layout) {
    if layout.size() == 0 {
        return;
    }
    // Not kept while the thread's spares are being torn down (a future dropped by
    // another thread-local's destructor): freed at once.
    let kept = SPARES.try_with(|spares| {
        let mut spares = spares.borrow_mut();
        let index = match spares.iter().position(|s| s.layout == layout) {
            Some(i) => i,
            None => {
                spares.push(Spares {
                    layout,
                    blocks: Vec::with_capacity(KEPT),
                });
                spares.len() - 1
            }
        };
        let blocks = &mut spares[index].blocks;
        if blocks.len() < KEPT {
            blocks.push(block);
            return true;
        }
        false
    });
    if kept != Ok(true) {
        // SAFETY: the block was allocated with this layout and holds nothing.
        unsafe { alloc::dealloc(block.as_ptr(), layout) };
    }
}

/// Frees this thread's spare blocks past `keep` of each layout: after a burst
/// (`server::trim`), so that [`KEPT`] blocks of each size do not stay for good with a worker
/// that had that many requests in flight once.
pub fn shed(keep: usize) {
    let extra: Vec<(NonNull<u8>, Layout)> = SPARES
        .try_with(|spares| {
            let mut spares = spares.borrow_mut();
            spares
                .iter_mut()
                .flat_map(|s| {
                    let layout = s.layout;
                    s.blocks
                        .drain(keep.min(s.blocks.len())..)
                        .map(move |block| (block, layout))
                })
                .collect()
        })
        .unwrap_or_default();
    for (block, layout) in extra {
        // SAFETY: a spare block was allocated with its list's layout and holds nothing.
        unsafe { alloc::dealloc(block.as_ptr(), layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts its drops; pending until told otherwise.
    struct Probe {
        drops: Arc<AtomicUsize>,
        ready: bool,
        _room: [u8; 3000],
    }

    impl Future for Probe {
        type Output = &'static str;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<&'static str> {
            if self.ready {
                Poll::Ready("done")
            } else {
                Poll::Pending
            }
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn probe(drops: &Arc<AtomicUsize>, ready: bool) -> Probe {
        Probe {
            drops: drops.clone(),
            ready,
            _room: [0; 3000],
        }
    }

    fn address<F>(f: &Recycled<F>) -> usize {
        f.future.as_ptr() as usize
    }

    #[tokio::test]
    async fn a_future_runs_in_its_block_and_the_block_serves_the_next_one() {
        let drops = Arc::new(AtomicUsize::new(0));
        let first = Recycled::new(probe(&drops, true));
        let at = address(&first);
        assert_eq!(first.await, "done");
        assert_eq!(drops.load(Ordering::SeqCst), 1, "dropped once, when done");
        let second = Recycled::new(probe(&drops, true));
        assert_eq!(address(&second), at, "the spare block was taken again");
        // Another layout does not take it.
        let other = Recycled::new(async { 7u64 });
        assert_ne!(address(&other), at);
        assert_eq!(other.await, 7);
        drop(second);
        assert_eq!(drops.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_pending_future_dropped_drops_what_it_holds() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut pending = Recycled::new(probe(&drops, false));
        assert!(futures_util::poll!(&mut pending).is_pending());
        drop(pending);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn at_most_kept_blocks_wait_and_the_rest_are_freed() {
        let drops = Arc::new(AtomicUsize::new(0));
        let many: Vec<_> = (0..KEPT + 5)
            .map(|_| Recycled::new(probe(&drops, true)))
            .collect();
        let addresses: Vec<usize> = many.iter().map(address).collect();
        drop(many);
        assert_eq!(drops.load(Ordering::SeqCst), KEPT + 5);
        let kept = SPARES.with_borrow(|spares| {
            spares
                .iter()
                .find(|s| s.layout == Layout::new::<Probe>())
                .map_or(0, |s| s.blocks.len())
        });
        assert_eq!(kept, KEPT);
        // The next ones reuse kept blocks: all among the earlier addresses.
        let again: Vec<_> = (0..KEPT)
            .map(|_| Recycled::new(probe(&drops, true)))
            .collect();
        assert!(again.iter().all(|f| addresses.contains(&address(f))));
        drop(again);
        // After a burst only a few stay.
        shed(3);
        let kept = SPARES.with_borrow(|spares| {
            spares
                .iter()
                .find(|s| s.layout == Layout::new::<Probe>())
                .map_or(0, |s| s.blocks.len())
        });
        assert_eq!(kept, 3);
    }

    #[tokio::test]
    async fn a_future_of_no_size_needs_no_block() {
        struct Now;
        impl Future for Now {
            type Output = u8;
            fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<u8> {
                Poll::Ready(1)
            }
        }
        assert_eq!(Recycled::new(Now).await, 1);
    }
}
