//! Log lines gathered per thread and handed to the writer thread in batches.
//!
//! Every request writes an access line. Sending each line through the writer thread's
//! channel on its own cost an allocation, a copy and often a wake-up of that thread per
//! request (bench/README.md). A runtime worker instead appends its lines to a buffer of
//! its own and hands the buffer over when it goes idle (tokio's `on_thread_park`), when the
//! buffer passes [`BATCH_BYTES`], or before any other log line of that thread, so one
//! thread's lines keep their order. Threads that are not runtime workers (they never
//! report going idle) hand each line over at once, as before.
//!
//! The listeners' workers (single-threaded runtimes, server/workers.rs) go idle between
//! most requests, and a hand-over at each of those woke the writer thread for a `write`
//! of a line or two: at one connection, a wake-up and a syscall on another core per
//! request. They hand over at most every [`WORKER_FLUSH_DELAY`] instead
//! ([`worker_idle`]), or when the batch fills.

use std::cell::RefCell;
use std::io::Write;
use std::sync::OnceLock;

use super::sink::Sink;

/// A worker hands its lines over once they fill this much, even while busy.
const BATCH_BYTES: usize = 64 * 1024;

/// The longest a listener worker's line waits in its batch (nginx's buffered access log
/// waits up to its `flush=` time, commonly 1 s or more).
pub const WORKER_FLUSH_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// The writer thread; unset in programs that never called `log::init` (the lines then go
/// straight to stdout).
static SINK: OnceLock<Sink> = OnceLock::new();

pub(super) fn set_sink(sink: Sink) {
    let _ = SINK.set(sink);
}

struct Pending {
    buf: String,
    /// This thread reports when it goes idle, so its lines may wait for that.
    batched: bool,
    /// A delayed hand-over is scheduled on this thread ([`worker_idle`]).
    flush_scheduled: bool,
}

impl Pending {
    fn hand_over(&mut self) {
        send(&mut self.buf);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.hand_over();
    }
}

thread_local! {
    static PENDING: RefCell<Pending> = const {
        RefCell::new(Pending { buf: String::new(), batched: false, flush_scheduled: false })
    };
}

/// Hands `lines` to the writer thread (by value: `lines` is left empty, with a written
/// buffer's room), or, with no writer running, writes them to stdout here.
fn send(lines: &mut String) {
    if lines.is_empty() || SINK.get().is_some_and(|sink| sink.send(lines)) {
        return;
    }
    let _ = std::io::stdout().lock().write_all(lines.as_bytes());
    lines.clear();
}

/// Appends one complete line (ending in `\n`), written by `write`, to this thread's batch.
pub fn write_line(write: impl FnOnce(&mut String)) {
    let mut write = Some(write);
    let queued = PENDING.try_with(|p| {
        let Ok(mut p) = p.try_borrow_mut() else {
            return false;
        };
        if let Some(w) = write.take() {
            w(&mut p.buf);
        }
        if !p.batched || p.buf.len() >= BATCH_BYTES {
            p.hand_over();
        }
        true
    });
    if queued != Ok(true) {
        // The thread is exiting (or re-entered): no batch, send the line alone.
        if let Some(w) = write.take() {
            let mut line = String::new();
            w(&mut line);
            send(&mut line);
        }
    }
}

/// Hands this thread's pending lines to the writer thread.
pub fn flush_thread() {
    let _ = PENDING.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            p.hand_over();
        }
    });
}

/// Called by a runtime worker about to go idle: its lines go now, and from here on they
/// may wait in its batch until the next time.
pub fn thread_idle() {
    let _ = PENDING.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            p.batched = true;
            p.hand_over();
        }
    });
}

/// Called by a listener worker (a single-threaded runtime) about to go idle: its lines may
/// wait in its batch, and a task on this same thread hands them over within
/// [`WORKER_FLUSH_DELAY`]. Must run inside that runtime (tokio's `on_thread_park` does):
/// the task is spawned here, and a current-thread runtime runs it on this thread.
pub fn worker_idle() {
    let schedule = PENDING
        .try_with(|p| {
            let Ok(mut p) = p.try_borrow_mut() else {
                return false;
            };
            p.batched = true;
            let schedule = !p.buf.is_empty() && !p.flush_scheduled;
            p.flush_scheduled |= schedule;
            schedule
        })
        .unwrap_or(false);
    if schedule {
        // Spawning from the park hook makes the runtime run the task instead of parking.
        tokio::spawn(async {
            tokio::time::sleep(WORKER_FLUSH_DELAY).await;
            let _ = PENDING.try_with(|p| {
                if let Ok(mut p) = p.try_borrow_mut() {
                    p.flush_scheduled = false;
                    p.hand_over();
                }
            });
        });
    }
}

/// Called by a runtime thread about to stop: nothing may wait any more.
pub fn thread_stopping() {
    let _ = PENDING.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            p.batched = false;
            p.hand_over();
        }
    });
}

/// The writer the `tracing` subscriber uses: an event's line goes to the writer thread at
/// once, behind this thread's pending lines, so they stay in order.
pub(super) struct InOrder;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for InOrder {
    type Writer = InOrder;

    fn make_writer(&'a self) -> InOrder {
        InOrder
    }
}

impl Write for InOrder {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(bytes);
        write_line(|out| out.push_str(&text));
        flush_thread();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
