//! Appending short byte strings without a call to `memcpy`.
//!
//! Each request writes about forty short values into a buffer: the header names and values
//! of the head sent to the target and of the one sent back to the client, and the access
//! line's fields. Their lengths are not known to the compiler, so `extend_from_slice` became
//! a call to glibc's `memcpy` for each (a call, its size checks, and the caller's registers
//! saved around it), for copies of a few to a few dozen bytes (bench/README.md,
//! "Twenty-first round"). Here a copy of up to 32 bytes is two loads and two stores that
//! overlap in the middle, chosen by the length's size class, inline where it is used.

/// Appends `src` to `out`.
#[inline(always)]
pub fn append(out: &mut Vec<u8>, src: &[u8]) {
    out.reserve(src.len());
    // SAFETY: `reserve` made room for `src`.
    unsafe { append_within(out, src) }
}

/// Appends `src` to `out`, which has room for it: for a writer that reserved room for a
/// whole run of values at once, and so skips a check of the capacity a value.
///
/// # Safety
/// `out` has room for `src.len()` more bytes (`capacity - len`).
#[inline(always)]
pub unsafe fn append_within(out: &mut Vec<u8>, src: &[u8]) {
    let n = src.len();
    debug_assert!(out.capacity() - out.len() >= n);
    let len = out.len();
    // SAFETY: the caller guarantees room for `n` bytes after `len`; each copy writes
    // exactly the `n` bytes of `src` there, so they are initialised before `set_len`.
    unsafe {
        let dst = out.as_mut_ptr().add(len);
        if n > 32 {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst, n);
        } else {
            copy_short(src.as_ptr(), dst, n);
        }
        out.set_len(len + n);
    }
}

/// Appends `src` to `out`.
#[inline(always)]
pub fn append_str(out: &mut String, src: &str) {
    // SAFETY: appending a whole `&str` keeps the `String` valid UTF-8.
    append(unsafe { out.as_mut_vec() }, src.as_bytes());
}

/// Copies `n` (at most 32) bytes from `src` to `dst`.
///
/// # Safety
/// `src` is readable and `dst` writable for `n` bytes, and they do not overlap.
#[inline(always)]
unsafe fn copy_short(src: *const u8, dst: *mut u8, n: usize) {
    debug_assert!(n <= 32);
    // SAFETY (every branch): each load reads, and each store writes, a block that starts
    // at 0 or at `n - width` with `width <= n`, so within the caller's `n` bytes.
    unsafe {
        if n >= 16 {
            let head = src.cast::<[u8; 16]>().read_unaligned();
            let tail = src.add(n - 16).cast::<[u8; 16]>().read_unaligned();
            dst.cast::<[u8; 16]>().write_unaligned(head);
            dst.add(n - 16).cast::<[u8; 16]>().write_unaligned(tail);
        } else if n >= 8 {
            let head = src.cast::<u64>().read_unaligned();
            let tail = src.add(n - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(head);
            dst.add(n - 8).cast::<u64>().write_unaligned(tail);
        } else if n >= 4 {
            let head = src.cast::<u32>().read_unaligned();
            let tail = src.add(n - 4).cast::<u32>().read_unaligned();
            dst.cast::<u32>().write_unaligned(head);
            dst.add(n - 4).cast::<u32>().write_unaligned(tail);
        } else if n > 0 {
            // 1 to 3 bytes: the first, the middle and the last (some of them the same).
            *dst = *src;
            *dst.add(n / 2) = *src.add(n / 2);
            *dst.add(n - 1) = *src.add(n - 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length from 0 to 40, appended after every length of existing content, gives
    /// what `extend_from_slice` gives.
    #[test]
    fn appends_exactly_the_bytes_for_every_length() {
        let source: Vec<u8> = (1..=40u8).collect();
        for before in 0..20 {
            for n in 0..=source.len() {
                let mut out: Vec<u8> = (100..100 + before).collect();
                let mut expected = out.clone();
                append(&mut out, &source[..n]);
                expected.extend_from_slice(&source[..n]);
                assert_eq!(out, expected, "{before} bytes, then {n}");
            }
        }
    }

    #[test]
    fn appends_text() {
        let mut s = String::from("ab");
        append_str(&mut s, "c—d");
        append_str(&mut s, "");
        assert_eq!(s, "abc—d");
    }

    /// Growing from empty and past capacity keeps what was there.
    #[test]
    fn grows_the_buffer() {
        let mut out = Vec::new();
        for i in 0..100u8 {
            append(&mut out, &[i; 7]);
        }
        assert_eq!(out.len(), 700);
        assert!(out.chunks(7).enumerate().all(|(i, c)| c == [i as u8; 7]));
    }
}
