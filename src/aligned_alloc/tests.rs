use super::*;
use std::collections::HashSet;

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).unwrap()
}

#[test]
fn over_aligned_small_blocks_come_from_the_slabs_and_others_from_the_system() {
    assert_eq!(AlignedSlabs::class_of(layout(640, 128)), Some(4));
    assert_eq!(AlignedSlabs::class_of(layout(256, 128)), Some(1));
    assert_eq!(AlignedSlabs::class_of(layout(1, 32)), Some(0));
    assert_eq!(AlignedSlabs::class_of(layout(4096, 64)), Some(31));
    assert_eq!(AlignedSlabs::class_of(layout(4097, 128)), None);
    assert_eq!(AlignedSlabs::class_of(layout(640, 16)), None);
    assert_eq!(AlignedSlabs::class_of(layout(640, 256)), None);

    let slabs = AlignedSlabs::new();
    let plain = layout(640, 8);
    // SAFETY: non-zero layouts, freed with the layout they were made with.
    unsafe {
        let p = slabs.alloc(plain);
        assert!(!p.is_null());
        assert_eq!(slabs.mapped_chunks(), 0, "a plain block maps no chunk");
        slabs.dealloc(p, plain);
    }
}

#[test]
fn blocks_are_aligned_distinct_and_a_freed_one_is_reused() {
    let slabs = AlignedSlabs::new();
    let l = layout(640, 128);
    let mut blocks = Vec::new();
    // SAFETY: each block is written within its size and freed once with its layout.
    unsafe {
        for i in 0..300 {
            let p = slabs.alloc(l);
            assert!(!p.is_null());
            assert_eq!(p as usize % 128, 0, "block {i} is not 128-aligned");
            ptr::write_bytes(p, i as u8, 640);
            blocks.push(p);
        }
        let distinct: HashSet<usize> = blocks.iter().map(|p| *p as usize).collect();
        assert_eq!(distinct.len(), blocks.len());
        for (i, p) in blocks.iter().enumerate() {
            let bytes = std::slice::from_raw_parts(*p, 640);
            assert!(
                bytes.iter().all(|b| *b == i as u8),
                "block {i} was overwritten"
            );
        }
        // 102 slots of 640 bytes a chunk: 300 blocks take three.
        assert_eq!(slabs.mapped_chunks(), 3);
        let freed = blocks.swap_remove(150);
        slabs.dealloc(freed, l);
        let again = slabs.alloc(l);
        assert_eq!(
            again, freed,
            "the slot just freed is the next one handed out"
        );
        blocks.push(again);
        for p in blocks {
            slabs.dealloc(p, l);
        }
    }
    assert_eq!(
        slabs.mapped_chunks(),
        1,
        "one empty chunk is kept for the next block"
    );
}

#[test]
fn a_burst_gives_its_chunks_back_when_it_is_over() {
    let slabs = AlignedSlabs::new();
    let task = layout(640, 128);
    let registration = layout(256, 128);
    let mut blocks = Vec::new();
    // SAFETY: every block is freed once, with its layout.
    unsafe {
        for _ in 0..2_000 {
            blocks.push((slabs.alloc(task), task));
            blocks.push((slabs.alloc(registration), registration));
        }
        // 2,000 / 102 and 2,000 / 255, rounded up.
        assert_eq!(slabs.mapped_chunks(), 20 + 8);
        // A few connections outlive the burst, in different chunks.
        let kept: Vec<_> = blocks.iter().step_by(1000).copied().collect();
        for (i, (p, l)) in blocks.into_iter().enumerate() {
            if i % 1000 != 0 {
                slabs.dealloc(p, l);
            }
        }
        assert!(
            slabs.mapped_chunks() <= kept.len() + 2,
            "{} chunks still mapped for {} blocks in use",
            slabs.mapped_chunks(),
            kept.len()
        );
        for (p, l) in kept {
            slabs.dealloc(p, l);
        }
    }
    assert_eq!(slabs.mapped_chunks(), 2, "one chunk kept per class used");
}

#[test]
fn realloc_keeps_the_contents_across_classes_and_into_the_system() {
    let slabs = AlignedSlabs::new();
    // SAFETY: each block is used within its current size and freed with its layout.
    unsafe {
        let l = layout(100, 128);
        let p = slabs.alloc(l);
        ptr::write_bytes(p, 7, 100);
        let same = slabs.realloc(p, l, 120);
        assert_eq!(same, p, "a size in the same class stays in place");
        let grown = slabs.realloc(same, layout(120, 128), 1000);
        assert_eq!(grown as usize % 128, 0);
        assert!(
            std::slice::from_raw_parts(grown, 100)
                .iter()
                .all(|b| *b == 7)
        );
        let big = slabs.realloc(grown, layout(1000, 128), 10_000);
        assert_eq!(big as usize % 128, 0);
        assert!(std::slice::from_raw_parts(big, 100).iter().all(|b| *b == 7));
        slabs.dealloc(big, layout(10_000, 128));
        let z = slabs.alloc_zeroed(layout(512, 64));
        assert!(std::slice::from_raw_parts(z, 512).iter().all(|b| *b == 0));
        slabs.dealloc(z, layout(512, 64));
    }
    // Classes of 128, 1,024 and 512 bytes were used: one chunk kept for each.
    assert_eq!(slabs.mapped_chunks(), 3);
}

#[test]
fn threads_allocating_and_freeing_each_others_blocks_never_share_a_slot() {
    static SLABS: AlignedSlabs = AlignedSlabs::new();
    let l = layout(640, 128);
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let makers: Vec<_> = (0..4)
        .map(|t| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..5_000usize {
                    // SAFETY: written within its size; freed once by the receiver.
                    unsafe {
                        let p = SLABS.alloc(l);
                        assert!(!p.is_null());
                        (p as *mut usize).write(t * 1_000_000 + i);
                        (p.add(632) as *mut usize).write(t * 1_000_000 + i);
                        tx.send(p as usize).unwrap();
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut live = HashSet::new();
    let mut held = Vec::new();
    for p in rx {
        assert!(live.insert(p), "slot {p:#x} handed out twice");
        held.push(p);
        // Free on this thread, in batches, while the makers keep allocating.
        if held.len() == 64 {
            for p in held.drain(..) {
                // SAFETY: made above with `l`, not freed yet.
                unsafe {
                    let first = (p as *const usize).read();
                    let last = ((p + 632) as *const usize).read();
                    assert_eq!(first, last, "slot {p:#x} was written by two owners");
                    live.remove(&p);
                    SLABS.dealloc(p as *mut u8, l);
                }
            }
        }
    }
    for m in makers {
        m.join().unwrap();
    }
    for p in held {
        // SAFETY: as above.
        unsafe { SLABS.dealloc(p as *mut u8, l) };
    }
    assert_eq!(SLABS.mapped_chunks(), 1);
}
