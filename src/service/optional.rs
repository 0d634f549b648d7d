//! A service's optional parts (the rollout split, the sleep controller): an `ArcSwapOption`
//! that answers "is there one?" with a plain load.
//!
//! Every request asks for both, and most services have neither. An arc-swap load is two
//! atomic read-modify-writes (its debt slot taken and paid back), `load_full` four; each
//! waits for the core's store buffer to drain, which nginx's worker never does
//! (bench/README.md, sixteenth round).

use arc_swap::ArcSwapOption;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct Optional<T> {
    value: ArcSwapOption<T>,
    /// Whether `value` is set. Written after it, under `writer`.
    set: AtomicBool,
    /// Changes are rare (a deploy, a `rollout set`); one at a time keeps `set` true to
    /// the value the last one left.
    writer: Mutex<()>,
}

impl<T> Default for Optional<T> {
    fn default() -> Self {
        Optional {
            value: ArcSwapOption::empty(),
            set: AtomicBool::new(false),
            writer: Mutex::new(()),
        }
    }
}

impl<T> Optional<T> {
    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    pub fn load_full(&self) -> Option<Arc<T>> {
        if !self.is_set() {
            return None;
        }
        self.value.load_full()
    }

    /// Installs (or clears) the value and returns the one it replaces.
    pub fn swap(&self, new: Option<Arc<T>>) -> Option<Arc<T>> {
        let _one_at_a_time = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let is_some = new.is_some();
        let old = self.value.swap(new);
        self.set.store(is_some, Ordering::Release);
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_last_installed() {
        let slot = Optional::<u32>::default();
        assert!(!slot.is_set());
        assert_eq!(slot.load_full(), None);
        assert_eq!(slot.swap(Some(Arc::new(7))), None);
        assert!(slot.is_set());
        assert_eq!(slot.load_full().as_deref(), Some(&7));
        assert_eq!(slot.swap(None).as_deref(), Some(&7));
        assert!(!slot.is_set());
        assert_eq!(slot.load_full(), None);
    }

    #[test]
    fn concurrent_writers_leave_the_flag_true_to_the_value() {
        let slot = Arc::new(Optional::<usize>::default());
        let writers: Vec<_> = (0..4)
            .map(|i| {
                let slot = slot.clone();
                std::thread::spawn(move || {
                    for n in 0..2_000 {
                        slot.swap((n % 2 == i % 2).then(|| Arc::new(n)));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(slot.is_set(), slot.value.load().is_some());
    }
}
