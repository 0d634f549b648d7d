//! The log writer thread: each thread's batch of lines (see `batch`) is handed over by
//! value and written to stdout in the order the batches came.
//!
//! It replaces `tracing_appender`'s non-blocking writer, which copied every batch twice
//! (into its channel's message, then into a `BufWriter` in front of stdout) and whose
//! channel, once empty, made the writer thread spin with `sched_yield` before sleeping:
//! with the proxy on one core, each batch cost a dozen context switches between the
//! worker and the writer, 2 % of the proxy's CPU (bench/README.md, "Sixth round"). Here a
//! batch moves (a `String`, no copy), the writer sleeps on a condition variable as soon
//! as it has nothing to write, and a written batch's buffer goes back to the next thread
//! that hands one over, so a busy proxy allocates no log buffers.
//!
//! Nothing is dropped: past [`Sink::new`]'s `limit` of bytes waiting, a thread handing a
//! batch over waits for the writer (back-pressure, as the old writer's `lossy(false)`).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Written buffers kept for the next hand-overs (one per thread that logs, roughly).
const SPARES: usize = 16;
/// A buffer that grew larger than this (a burst) is not kept.
const SPARE_CAPACITY: usize = 256 * 1024;
/// How long dropping the [`Guard`] waits for the queued lines to be written.
const FLUSH_ON_EXIT: Duration = Duration::from_secs(1);

/// Where threads hand their batches over. Cheap to clone.
#[derive(Clone)]
pub struct Sink {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// The writer waits here for batches.
    queued: Condvar,
    /// Threads wait here for room (the queue past its limit), and the guard for the end.
    written: Condvar,
    limit: usize,
}

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    /// Bytes in `queue`.
    bytes: usize,
    spares: Vec<String>,
    /// The writer is asleep on `queued`: a hand-over wakes it.
    writer_asleep: bool,
    /// Threads (and the guard) asleep on `written`. (A notification is a system call
    /// even when nobody waits.)
    waiting: usize,
    /// The guard was dropped: the writer writes what is queued and ends.
    closed: bool,
    /// The writer has ended.
    done: bool,
}

/// Keep alive for the life of the process: dropping it writes what is queued (waiting
/// up to a second) and ends the writer thread.
#[must_use]
pub struct Guard {
    shared: Arc<Shared>,
}

impl Sink {
    /// Starts the writer thread, writing to `out`. Threads wait once `limit` bytes are
    /// queued.
    pub fn new(
        out: impl Write + Send + 'static,
        limit: usize,
        thread_name: &str,
    ) -> std::io::Result<(Sink, Guard)> {
        let shared = Arc::new(Shared {
            state: Mutex::default(),
            queued: Condvar::new(),
            written: Condvar::new(),
            limit,
        });
        let writer = shared.clone();
        std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || write_all(&writer, out))?;
        let guard = Guard {
            shared: shared.clone(),
        };
        Ok((Sink { shared }, guard))
    }

    /// Hands `batch` over; it is left empty, with a written buffer's room when one is
    /// spare. `false`: the writer has been stopped, and `batch` is untouched.
    pub fn send(&self, batch: &mut String) -> bool {
        if batch.is_empty() {
            return true;
        }
        let shared = &*self.shared;
        let mut state = lock(&shared.state);
        while state.bytes > 0 && state.bytes + batch.len() > shared.limit && !state.closed {
            state.waiting += 1;
            state = shared
                .written
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
            state.waiting -= 1;
        }
        if state.closed {
            return false;
        }
        let spare = state.spares.pop().unwrap_or_default();
        let full = std::mem::replace(batch, spare);
        state.bytes += full.len();
        state.queue.push_back(full);
        let wake = std::mem::replace(&mut state.writer_asleep, false);
        // Woken after the lock is released: on one core, the woken writer would otherwise
        // run at once and block on the lock this thread still holds.
        drop(state);
        if wake {
            shared.queued.notify_one();
        }
        true
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let shared = &*self.shared;
        let mut state = lock(&shared.state);
        state.closed = true;
        shared.queued.notify_one();
        // Threads waiting for room hand their lines over themselves now.
        shared.written.notify_all();
        let deadline = std::time::Instant::now() + FLUSH_ON_EXIT;
        while !state.done {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            state.waiting += 1;
            state = match shared.written.wait_timeout(state, left) {
                Ok((s, _)) => s,
                Err(e) => e.into_inner().0,
            };
            state.waiting -= 1;
        }
    }
}

/// The writer thread: writes each batch as it comes, sleeps when there is none, ends once
/// the guard is dropped and the queue is empty.
fn write_all(shared: &Shared, mut out: impl Write) {
    let mut taken: VecDeque<String> = VecDeque::new();
    let mut failed = false;
    loop {
        {
            let mut state = lock(&shared.state);
            // The buffers just written go back for the next hand-overs.
            for mut buf in taken.drain(..) {
                if state.spares.len() < SPARES && buf.capacity() <= SPARE_CAPACITY {
                    buf.clear();
                    state.spares.push(buf);
                }
            }
            while state.queue.is_empty() {
                if state.closed {
                    state.done = true;
                    shared.written.notify_all();
                    return;
                }
                state.writer_asleep = true;
                state = shared.queued.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            std::mem::swap(&mut taken, &mut state.queue);
            state.bytes = 0;
            if state.waiting > 0 {
                shared.written.notify_all();
            }
        }
        for batch in &taken {
            if let Err(e) = out.write_all(batch.as_bytes()) {
                report(&mut failed, &e);
            }
        }
        if let Err(e) = out.flush() {
            report(&mut failed, &e);
        }
    }
}

/// A failed write of the log (stdout closed, a full disk behind it) is said once on
/// stderr; the lines go on being written as they come.
fn report(failed: &mut bool, e: &std::io::Error) {
    if !std::mem::replace(failed, true) {
        eprintln!("kamal-proxy: writing the log to stdout failed: {e}");
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In-memory output shared with the test.
    #[derive(Clone, Default)]
    struct Out(Arc<Mutex<Vec<u8>>>);

    impl Write for Out {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_batch_is_written_in_order_through_a_full_queue() {
        let out = Out::default();
        // A limit smaller than two batches: most hand-overs wait for the writer.
        let (sink, guard) = Sink::new(out.clone(), 16, "test-log").unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let sink = sink.clone();
                std::thread::spawn(move || {
                    let mut batch = String::new();
                    for i in 0..500 {
                        batch.push_str(&format!("{t} {i}\n"));
                        assert!(sink.send(&mut batch));
                        assert!(batch.is_empty());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let mut next = [0; 4];
        for line in text.lines() {
            let (t, i) = line.split_once(' ').unwrap();
            let (t, i): (usize, usize) = (t.parse().unwrap(), i.parse().unwrap());
            assert_eq!(i, next[t], "thread {t}'s lines out of order");
            next[t] += 1;
        }
        assert_eq!(next, [500; 4], "lines were lost");
    }

    #[test]
    fn a_written_buffer_comes_back_with_its_room() {
        let out = Out::default();
        let (sink, guard) = Sink::new(out.clone(), 1 << 20, "test-log").unwrap();
        let mut batch = String::with_capacity(4096);
        batch.push_str("one\n");
        assert!(sink.send(&mut batch));
        // Once the writer has written it and taken the lock again, its buffer is spare.
        while lock(&sink.shared.state).spares.is_empty() {
            std::thread::yield_now();
        }
        assert_eq!(&*out.0.lock().unwrap(), b"one\n");
        batch.push_str("two\n");
        assert!(sink.send(&mut batch));
        assert!(batch.is_empty());
        assert!(
            batch.capacity() >= 4096,
            "the written buffer was not handed back"
        );
        drop(guard);
    }

    #[test]
    fn after_the_guard_is_dropped_a_batch_stays_with_its_thread() {
        let out = Out::default();
        let (sink, guard) = Sink::new(out.clone(), 1 << 20, "test-log").unwrap();
        let mut batch = String::from("before\n");
        assert!(sink.send(&mut batch));
        drop(guard);
        assert_eq!(&*out.0.lock().unwrap(), b"before\n");
        batch.push_str("after\n");
        assert!(!sink.send(&mut batch));
        assert_eq!(
            batch, "after\n",
            "the batch was not kept for its caller to write"
        );
    }
}
