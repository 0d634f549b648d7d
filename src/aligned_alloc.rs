//! The binary's global allocator: the system's `malloc`, except for small over-aligned
//! blocks, which come from slabs of equal slots.
//!
//! tokio aligns every task and every socket's I/O registration to 128 bytes (against
//! false sharing between cores), so each connection makes two such blocks: its task
//! (512 bytes on the HTTP port) and its registration (256). glibc serves an aligned
//! request by cutting the aligned part out of a larger free block (`_int_memalign`); the
//! pieces left before and after it are too small for most later requests, and a
//! connection that stays open keeps them from merging back. With 10,000 idle keep-alive
//! connections that was 250–450 bytes a connection on top of those blocks (896 bytes then):
//! an `LD_PRELOAD` shim packing the aligned blocks end to end took RSS per idle connection
//! from 1,400–1,600 bytes to 1,133 (bench/README.md, "Fifteenth round").
//!
//! Here a block aligned to more than 16 and at most 128 bytes, of up to 4 KiB, takes a
//! slot of its size class (a multiple of 128 bytes) in a 64-KiB chunk mapped from the
//! system. Slots never handed out are never touched, so a chunk is resident only as far
//! as it has been used. A chunk left with no block in use is unmapped at once, unless it
//! is its class's only chunk with room (kept, so that one connection opening and closing
//! does not map and unmap a chunk each time): a burst of connections leaves at most one
//! chunk a class behind. These blocks are made once a connection, not once a request;
//! the mutex of a class is taken as often as glibc's arena lock was on the same path.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::{self, null_mut};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Slot sizes are multiples of this, and every slot is aligned to it.
const SLOT_ALIGN: usize = 128;
/// Larger aligned blocks are rare (a task with a large future): the system serves them.
const MAX_SLOT: usize = 4096;
const CLASSES: usize = MAX_SLOT / SLOT_ALIGN;
/// Chunks are aligned to their size, so a slot finds its chunk by masking its address.
const CHUNK: usize = 64 * 1024;
/// A chunk's bookkeeping takes its first slot-aligned bytes.
const HEADER: usize = SLOT_ALIGN;
/// What glibc's `malloc` guarantees on 64-bit targets: blocks aligned to at most this
/// stay with it.
const MALLOC_ALIGN: usize = 16;

const _: () = assert!(std::mem::size_of::<Chunk>() <= HEADER);

/// The allocator. `main` installs it with `#[global_allocator]`.
pub struct AlignedSlabs {
    classes: [Mutex<Class>; CLASSES],
    /// Chunks mapped now, all classes together (for tests and the curious).
    mapped: AtomicUsize,
}

impl Default for AlignedSlabs {
    fn default() -> Self {
        Self::new()
    }
}

impl AlignedSlabs {
    pub const fn new() -> Self {
        AlignedSlabs {
            classes: [const { Mutex::new(Class::EMPTY) }; CLASSES],
            mapped: AtomicUsize::new(0),
        }
    }

    /// How many 64-KiB chunks are mapped now.
    pub fn mapped_chunks(&self) -> usize {
        self.mapped.load(Ordering::Relaxed)
    }

    /// The size class serving `layout`, if the slabs serve it.
    fn class_of(layout: Layout) -> Option<usize> {
        let fits = layout.align() > MALLOC_ALIGN
            && layout.align() <= SLOT_ALIGN
            && layout.size() <= MAX_SLOT;
        fits.then(|| (layout.size().max(1) - 1) / SLOT_ALIGN)
    }

    fn lock(&self, class: usize) -> std::sync::MutexGuard<'_, Class> {
        // Nothing under this lock panics; a poisoned one still holds consistent lists.
        self.classes[class]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A free slot of `class`, or null when the system has no memory for a new chunk.
    fn take(&self, class: usize) -> *mut u8 {
        let slot_size = (class + 1) * SLOT_ALIGN;
        let mut list = self.lock(class);
        if list.partial.is_null() {
            let chunk = map_chunk();
            if chunk.is_null() {
                return null_mut();
            }
            self.mapped.fetch_add(1, Ordering::Relaxed);
            // SAFETY: a fresh chunk, ours alone, with room for its header.
            unsafe { list.push(chunk) };
        }
        let chunk = list.partial;
        // SAFETY: every chunk on the list is mapped, has a valid header and a free slot;
        // the class's lock is held.
        unsafe {
            let slot = if (*chunk).free.is_null() {
                let slot = chunk.cast::<u8>().add(HEADER + (*chunk).fresh * slot_size);
                (*chunk).fresh += 1;
                slot
            } else {
                let slot = (*chunk).free;
                (*chunk).free = *(slot as *mut *mut u8);
                slot
            };
            (*chunk).live += 1;
            if (*chunk).live == capacity(slot_size) {
                list.remove(chunk);
            }
            slot
        }
    }

    /// Gives a slot of `class` back.
    ///
    /// # Safety
    /// `slot` came from [`AlignedSlabs::take`] with the same class and is not in use.
    unsafe fn give(&self, class: usize, slot: *mut u8) {
        let slot_size = (class + 1) * SLOT_ALIGN;
        let chunk = slot.map_addr(|a| a & !(CHUNK - 1)).cast::<Chunk>();
        let unmap = {
            let mut list = self.lock(class);
            // SAFETY: the slot lies in a mapped chunk of this class (the caller's promise);
            // the class's lock is held. The header is reached through `chunk` only (no
            // reference to it outlives the list's own writes through the same pointer).
            unsafe {
                *(slot as *mut *mut u8) = (*chunk).free;
                (*chunk).free = slot;
                let was_full = (*chunk).live == capacity(slot_size);
                (*chunk).live -= 1;
                if was_full {
                    list.push(chunk);
                }
                // Empty, and another chunk has room: this one goes back to the system.
                let release =
                    (*chunk).live == 0 && !(list.partial == chunk && (*chunk).next.is_null());
                if release {
                    list.remove(chunk);
                }
                release
            }
        };
        // SAFETY: the chunk is off every list and holds no block in use. (Should the system
        // refuse, near `vm.max_map_count`, the chunk stays mapped, unused, and counted.)
        if unmap && unsafe { libc::munmap(chunk.cast(), CHUNK) } == 0 {
            self.mapped.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: slab blocks are slots no other block overlaps, aligned to 128 (and so to any
// alignment the slabs accept) and at least as large as asked; everything else is the
// system allocator's, with the same layout on the way back (`class_of` is a function of
// the layout alone).
unsafe impl GlobalAlloc for AlignedSlabs {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match Self::class_of(layout) {
            Some(class) => self.take(class),
            // SAFETY: the caller's layout, unchanged.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match Self::class_of(layout) {
            Some(class) => {
                let block = self.take(class);
                if !block.is_null() {
                    // SAFETY: the slot has at least `layout.size()` bytes.
                    unsafe { ptr::write_bytes(block, 0, layout.size()) };
                }
                block
            }
            // SAFETY: the caller's layout, unchanged.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        match Self::class_of(layout) {
            // SAFETY: allocated by `alloc` with this layout, so from this class.
            Some(class) => unsafe { self.give(class, block) },
            // SAFETY: allocated by the system with this layout.
            None => unsafe { System.dealloc(block, layout) },
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size`, rounded to the alignment, does not
        // overflow.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (Self::class_of(layout), Self::class_of(new_layout)) {
            // SAFETY: a system block, staying one.
            (None, None) => unsafe { System.realloc(block, layout, new_size) },
            (Some(old), Some(new)) if old == new => block,
            _ => {
                // SAFETY: as `alloc`, `dealloc`; the copy stays within both blocks.
                unsafe {
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                        self.dealloc(block, layout);
                    }
                    moved
                }
            }
        }
    }
}

/// A size class's chunks with a free slot, doubly linked through their headers.
struct Class {
    partial: *mut Chunk,
}

// SAFETY: the chunks are reached only under the class's mutex.
unsafe impl Send for Class {}

impl Class {
    const EMPTY: Class = Class {
        partial: null_mut(),
    };

    /// # Safety
    /// `chunk` is mapped, has a valid header and is on no list.
    unsafe fn push(&mut self, chunk: *mut Chunk) {
        // SAFETY: the caller's promise; the list's chunks are mapped.
        unsafe {
            (*chunk).prev = null_mut();
            (*chunk).next = self.partial;
            if !self.partial.is_null() {
                (*self.partial).prev = chunk;
            }
        }
        self.partial = chunk;
    }

    /// # Safety
    /// `chunk` is on this list.
    unsafe fn remove(&mut self, chunk: *mut Chunk) {
        // SAFETY: the caller's promise; its neighbours are on the list too.
        unsafe {
            let Chunk { prev, next, .. } = *chunk;
            if prev.is_null() {
                self.partial = next;
            } else {
                (*prev).next = next;
            }
            if !next.is_null() {
                (*next).prev = prev;
            }
            (*chunk).prev = null_mut();
            (*chunk).next = null_mut();
        }
    }
}

/// The header at the start of every chunk.
#[derive(Clone, Copy)]
struct Chunk {
    prev: *mut Chunk,
    next: *mut Chunk,
    /// Slots given back, linked through their first word.
    free: *mut u8,
    /// Slots from this index on have never been handed out (nor touched).
    fresh: usize,
    /// Slots in use.
    live: usize,
}

fn capacity(slot_size: usize) -> usize {
    (CHUNK - HEADER) / slot_size
}

/// Maps a zeroed, `CHUNK`-aligned chunk and writes its header; null if the system refuses.
fn map_chunk() -> *mut Chunk {
    // Twice the size, then the unaligned ends are unmapped: mmap aligns only to pages.
    // SAFETY: a private anonymous mapping at no fixed address touches nothing existing.
    let raw = unsafe {
        libc::mmap(
            null_mut(),
            2 * CHUNK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return null_mut();
    }
    let start = raw as usize;
    let aligned = (start + CHUNK - 1) & !(CHUNK - 1);
    let tail = start + 2 * CHUNK - (aligned + CHUNK);
    // SAFETY: both ranges lie in the mapping just made and outside the kept chunk.
    unsafe {
        if aligned > start {
            libc::munmap(raw, aligned - start);
        }
        if tail > 0 {
            libc::munmap((aligned + CHUNK) as *mut libc::c_void, tail);
        }
    }
    let chunk = raw.cast::<u8>().with_addr(aligned).cast::<Chunk>();
    // SAFETY: the chunk is mapped, writable and ours; the header fits its first bytes.
    unsafe {
        chunk.write(Chunk {
            prev: null_mut(),
            next: null_mut(),
            free: null_mut(),
            fresh: 0,
            live: 0,
        })
    };
    chunk
}

#[cfg(test)]
mod tests;
