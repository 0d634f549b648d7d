//! The time, read once per poll of a client connection.
//!
//! A proxied request read the clock nine times (its start and its `X-Request-Start`,
//! the upstream connection taken from the pool and its answer timer armed, the
//! connection given back, the access line's time and duration, the connection's
//! watchdog), about 25 ns each on a virtual machine's clock: 1.3 % of the pinned proxy's
//! CPU (bench/README.md, "Seventeenth round"). Those reads fall into the two polls of the
//! connection's task a request takes (the request read and sent on, then the answer read
//! and written back), and within one poll the time moves by microseconds. So while a
//! connection's task is polled ([`in_poll`]) the first read of each clock is kept and the
//! next ones reuse it; outside such a poll (health checks, timers, other tasks) every call
//! reads the clock.
//!
//! What that changes: the access line's duration runs from the first read of the
//! request's poll to the first of its answer's (at most the few microseconds of parsing
//! a head earlier at each end), and timeouts armed in a poll count from its first read.

use std::cell::Cell;
use std::thread::LocalKey;
use std::time::SystemTime;
use tokio::time::Instant;

thread_local! {
    /// Inside a connection's poll: reads are kept.
    static ON: Cell<bool> = const { Cell::new(false) };
    static NOW: Cell<Option<Instant>> = const { Cell::new(None) };
    static WALL: Cell<Option<SystemTime>> = const { Cell::new(None) };
}

/// The monotonic time: the poll's, or read now outside a connection's poll.
pub fn now() -> Instant {
    kept(&NOW, Instant::now)
}

/// The wall-clock time: the poll's, or read now outside a connection's poll.
pub fn wall() -> SystemTime {
    kept(&WALL, SystemTime::now)
}

fn kept<T: Copy + 'static>(slot: &'static LocalKey<Cell<Option<T>>>, read: fn() -> T) -> T {
    if let Some(time) = slot.get() {
        return time;
    }
    let time = read();
    if ON.get() {
        slot.set(Some(time));
    }
    time
}

/// Runs one poll of a connection's task with the clocks kept for its length.
pub fn in_poll<R>(poll: impl FnOnce() -> R) -> R {
    /// Forgets the kept times however the poll ends (a panic included), so that nothing
    /// after it on this thread sees them. (Polls do not nest: a connection's task
    /// polls no other task's.)
    struct Forget;
    impl Drop for Forget {
        fn drop(&mut self) {
            ON.set(false);
            NOW.set(None);
            WALL.set(None);
        }
    }
    let _forget = Forget;
    ON.set(true);
    poll()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pause() {
        // Long enough for both clocks to move on any machine.
        std::thread::sleep(Duration::from_millis(2));
    }

    #[test]
    fn outside_a_poll_every_read_is_fresh() {
        let (a, wa) = (now(), wall());
        pause();
        assert!(now() > a);
        assert!(wall() > wa);
    }

    #[test]
    fn within_a_poll_the_first_reads_are_kept() {
        let (a, b, wa, wb) = in_poll(|| {
            let (a, wa) = (now(), wall());
            pause();
            (a, now(), wa, wall())
        });
        assert_eq!(a, b);
        assert_eq!(wa, wb);
        // And forgotten after it.
        pause();
        assert!(now() > b);
        assert!(wall() > wb);
    }

    #[test]
    fn each_poll_reads_the_clock_again() {
        let first = in_poll(now);
        pause();
        let second = in_poll(now);
        assert!(second > first);
    }

    #[test]
    fn a_poll_that_panics_leaves_nothing_kept() {
        let kept = std::panic::catch_unwind(|| {
            in_poll(|| {
                let _ = now();
                panic!("the poll fails");
            })
        });
        assert!(kept.is_err());
        let a = now();
        pause();
        assert!(now() > a, "reads after the failed poll are fresh");
    }
}
