//! Header maps reused on a worker thread. Every proxied request makes two (the client's
//! request, the app's response head) and each is two allocations; a map whose head has
//! gone out comes back here instead, cleared but with its room, for the next one.
//! (About 1,000 instructions a request: four `malloc`s and four `free`s.)

use http::HeaderMap;
use std::cell::RefCell;

/// Spare maps kept per thread: enough for the requests that end between two that start
/// (see `recycle::KEPT`, which keeps as many for the same reason).
const SPARE: usize = 64;
/// A map grown past this many fields is not kept: one unusual request must not keep
/// its memory for good.
const LARGEST_KEPT: usize = 64;

thread_local! {
    static SPARES: RefCell<Vec<HeaderMap>> = const { RefCell::new(Vec::new()) };
}

/// An empty map with room for `fields`.
pub fn with_capacity(fields: usize) -> HeaderMap {
    match SPARES.with_borrow_mut(Vec::pop) {
        Some(mut map) => {
            map.reserve(fields);
            map
        }
        None => HeaderMap::with_capacity(fields),
    }
}

/// Gives back a map whose fields have been written (or are no longer needed).
pub fn recycle(mut map: HeaderMap) {
    if map.capacity() == 0 || map.capacity() > LARGEST_KEPT {
        return;
    }
    map.clear();
    SPARES.with_borrow_mut(|spares| {
        if spares.len() < SPARE {
            spares.push(map);
        }
    });
}

/// Drops this thread's spare maps past `keep` (after a burst: see `recycle::shed`).
pub fn shed(keep: usize) {
    let extra = SPARES.with_borrow_mut(|spares| spares.split_off(keep.min(spares.len())));
    drop(extra);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recycled_map_comes_back_empty_with_its_room() {
        let mut map = with_capacity(10);
        map.insert("x-a", "1".parse().unwrap());
        map.append("x-a", "2".parse().unwrap());
        let room = map.capacity();
        recycle(map);
        let again = with_capacity(4);
        assert!(again.is_empty());
        assert!(again.capacity() >= room.min(4));
        let mut big = HeaderMap::with_capacity(LARGEST_KEPT * 2);
        big.insert("x-b", "1".parse().unwrap());
        recycle(big);
        // The large one was not kept: the next map is a fresh one of the size asked.
        assert!(with_capacity(1).capacity() < LARGEST_KEPT * 2);
    }

    #[test]
    fn after_a_burst_only_a_few_spare_maps_stay() {
        let maps: Vec<_> = (0..SPARE + 3).map(|_| with_capacity(4)).collect();
        maps.into_iter().for_each(recycle);
        assert_eq!(SPARES.with_borrow(Vec::len), SPARE);
        shed(2);
        assert_eq!(SPARES.with_borrow(Vec::len), 2);
    }
}
