//! The connections' timers: one table a thread, one task a table to ring them.
//!
//! Every HTTP/1 connection keeps a timer for its listener timeouts (`h1_timeouts`) for as
//! long as it is open, idle or not. tokio's `Sleep` is 112 bytes, all of them in the
//! connection's task, which is what an idle connection costs: with it the task took a
//! 640-byte slot (`aligned_alloc`), and 120 bytes less puts it in a 512-byte one. Here a
//! connection's task keeps an [`Alarm`] (its table and slot, 16 bytes), the state the
//! table's task and the connection share, a [`Bell`], sits in an allocation the connection
//! has anyway (its `Phase`, 16 bytes more), and the table keeps a slot (32 bytes) and a
//! queue entry (16) a connection: 64 bytes a connection less in all (bench/README.md,
//! "Thirtieth round").
//!
//! The common case touches no lock: a connection's deadline is an atomic it writes, and it
//! asks its table for a wake-up only when the deadline comes earlier than the one queued
//! for it. A later deadline is picked up when the queued one comes due: the table's task
//! looks at the bell then, and queues it again at its new deadline, or rings it. On the
//! HTTP/1 path the head deadline is set when a request's first bytes arrive without the
//! rest; a request read whole moves the connection from idle to busy to idle, and its
//! deadlines only move later.
//!
//! A thread's table is made on its first alarm and stays for the thread's life (the
//! workers, the control runtime's threads; in tests, each test's thread). Its task runs
//! on the runtime of the alarm that started it, and is started again if that runtime
//! went away.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::poll_fn;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use tokio::time::Instant;

/// What a connection and its table's task share. `deadline` and `queued` are ticks of the
/// table's clock ([`Table::ticks`]), 0 for none.
#[derive(Default)]
pub struct Bell {
    /// The table's task found the deadline passed; the connection clears it.
    rang: AtomicBool,
    /// When the connection's current limit runs out.
    deadline: AtomicU64,
    /// The earliest time the table's task will look at this bell.
    queued: AtomicU64,
}

/// What owns a [`Bell`]: the table holds it while the alarm lives, to ring it.
pub trait Rings: Send + Sync + 'static {
    fn bell(&self) -> &Bell;
}

/// A connection's place in its thread's table.
pub struct Alarm {
    table: &'static Table,
    slot: u32,
}

impl Alarm {
    /// Takes a slot in this thread's table for `owner`'s bell, with no deadline.
    pub fn new(owner: Arc<dyn Rings>) -> Alarm {
        let table = TABLE.with(|t| *t);
        let slot = table.lock().take(owner);
        Alarm { table, slot }
    }

    /// The deadline is `at` from now on (`None`: none). Nothing is queued here: see
    /// [`Alarm::poll_rang`]. `bell` is the one of the owner the alarm was made for (the
    /// alarm does not keep it, for the 8 bytes of every connection's task).
    pub fn set(&self, bell: &Bell, at: Option<Instant>) {
        let ticks = at.map_or(0, |at| self.table.ticks(at));
        bell.deadline.store(ticks, Ordering::Relaxed);
    }

    /// Whether the deadline has passed, once the table's task said so. Pending until then,
    /// with this task's waker queued at the deadline when nothing earlier was.
    pub fn poll_rang(&self, bell: &Bell, cx: &mut Context<'_>) -> Poll<()> {
        if bell.rang.load(Ordering::Acquire) {
            bell.rang.store(false, Ordering::Relaxed);
            let deadline = bell.deadline.load(Ordering::Relaxed);
            if deadline != 0 && deadline <= self.table.ticks(Instant::now()) {
                return Poll::Ready(());
            }
        }
        let deadline = bell.deadline.load(Ordering::Relaxed);
        let queued = bell.queued.load(Ordering::Relaxed);
        if deadline != 0 && (queued == 0 || deadline < queued) {
            self.table.queue(self.slot, bell, deadline, cx.waker());
        }
        Poll::Pending
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        self.table.lock().give_back(self.slot);
    }
}

thread_local! {
    static TABLE: &'static Table = Box::leak(Box::new(Table::new()));
}

struct Table {
    /// Ticks count from here: a thread's first alarm, on its runtime's clock (which tests
    /// may pause).
    epoch: Instant,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: Vec<Entry>,
    free: Vec<u32>,
    /// (ticks, slot). An entry whose slot was given back, or that a bell's earlier
    /// deadline overtook, is skipped when it comes up; one for a slot taken again since
    /// can only make the table look at that bell once more, which changes nothing.
    queue: BinaryHeap<Reverse<(u64, u32)>>,
    /// The table's task, while it waits for the queue's first deadline (`due`, ticks).
    ringer: Option<Waker>,
    due: u64,
    /// A task rings this table (cleared when its runtime drops it).
    ringing: bool,
}

struct Entry {
    owner: Option<Arc<dyn Rings>>,
    waker: Option<Waker>,
}

impl Table {
    fn new() -> Table {
        Table {
            epoch: Instant::now(),
            inner: Mutex::default(),
        }
    }

    /// `at` on this table's clock: nanoseconds from its epoch, plus one (0 means none).
    fn ticks(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(since).unwrap_or(u64::MAX - 1) + 1
    }

    fn instant(&self, ticks: u64) -> Instant {
        self.epoch + std::time::Duration::from_nanos(ticks - 1)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding it leaves the table consistent (each change is whole).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `slot` at `deadline`, with `waker` to ring, and makes sure a task rings.
    fn queue(&'static self, slot: u32, bell: &Bell, deadline: u64, waker: &Waker) {
        let mut inner = self.lock();
        let entry = &mut inner.entries[slot as usize];
        if !entry.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            entry.waker = Some(waker.clone());
        }
        inner.queue.push(Reverse((deadline, slot)));
        bell.queued.store(deadline, Ordering::Relaxed);
        if !inner.ringing {
            inner.ringing = true;
            drop(inner);
            tokio::spawn(ring(self));
        } else if deadline < inner.due {
            if let Some(ringer) = inner.ringer.take() {
                ringer.wake();
            }
        }
    }
}

impl Inner {
    fn take(&mut self, owner: Arc<dyn Rings>) -> u32 {
        match self.free.pop() {
            Some(slot) => {
                self.entries[slot as usize].owner = Some(owner);
                slot
            }
            None => {
                self.entries.push(Entry {
                    owner: Some(owner),
                    waker: None,
                });
                u32::try_from(self.entries.len() - 1).expect("fewer than 2^32 connections")
            }
        }
    }

    fn give_back(&mut self, slot: u32) {
        let entry = &mut self.entries[slot as usize];
        entry.owner = None;
        entry.waker = None;
        self.free.push(slot);
    }

    /// Looks at every bell queued up to `now`: rings those whose deadline has passed and
    /// queues the others again at theirs. The next deadline queued, if any.
    fn ring_due(&mut self, now: u64) -> Option<u64> {
        while let Some(&Reverse((at, slot))) = self.queue.peek() {
            if at > now {
                return Some(at);
            }
            self.queue.pop();
            let entry = &self.entries[slot as usize];
            let Some(owner) = &entry.owner else {
                continue;
            };
            let bell = owner.bell();
            // An earlier deadline was queued after this one: that one stands.
            if bell.queued.load(Ordering::Relaxed) != at {
                continue;
            }
            let deadline = bell.deadline.load(Ordering::Relaxed);
            if deadline == 0 {
                bell.queued.store(0, Ordering::Relaxed);
            } else if deadline > now {
                bell.queued.store(deadline, Ordering::Relaxed);
                self.queue.push(Reverse((deadline, slot)));
            } else {
                bell.queued.store(0, Ordering::Relaxed);
                bell.rang.store(true, Ordering::Release);
                if let Some(waker) = &entry.waker {
                    waker.wake_by_ref();
                }
            }
        }
        None
    }
}

/// Clears the table's `ringing` when its task goes (its runtime dropped it).
struct Ringing(&'static Table);

impl Drop for Ringing {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        inner.ringing = false;
        inner.ringer = None;
    }
}

/// The table's task: sleeps until the first deadline queued, rings what is due, again.
async fn ring(table: &'static Table) {
    let _ringing = Ringing(table);
    let mut sleep = pin!(tokio::time::sleep_until(Instant::now()));
    poll_fn(|cx| {
        loop {
            let mut now = table.ticks(Instant::now());
            // The timer went off at the deadline it was set to: that deadline is due, even
            // if the clock, read again, is a hair behind it.
            if sleep.is_elapsed() {
                now = now.max(table.ticks(sleep.deadline()));
            }
            let mut inner = table.lock();
            let Some(next) = inner.ring_due(now) else {
                inner.due = u64::MAX;
                inner.ringer = Some(cx.waker().clone());
                return Poll::Pending;
            };
            inner.due = next;
            inner.ringer = Some(cx.waker().clone());
            drop(inner);
            sleep.as_mut().reset(table.instant(next));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    })
    .await
}

/// Test time: moves the paused clock by `by`, then lets the tables' tasks ring what came
/// due before the caller looks (the runtime polls the test's own future first).
#[cfg(test)]
pub(super) async fn advance(by: std::time::Duration) {
    tokio::time::advance(by).await;
    tokio::task::yield_now().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[derive(Default)]
    struct Owner(Bell);

    impl Rings for Owner {
        fn bell(&self) -> &Bell {
            &self.0
        }
    }

    async fn rang(alarm: &Alarm, owner: &Owner) -> bool {
        poll_fn(|cx| Poll::Ready(alarm.poll_rang(&owner.0, cx).is_ready())).await
    }

    /// An alarm set `secs` from now, polled once (so queued), which has not rung.
    async fn armed(secs: u64) -> (Arc<Owner>, Alarm) {
        let owner = Arc::new(Owner::default());
        let alarm = Alarm::new(owner.clone());
        alarm.set(&owner.0, Some(Instant::now() + Duration::from_secs(secs)));
        assert!(!rang(&alarm, &owner).await);
        (owner, alarm)
    }

    #[tokio::test(start_paused = true)]
    async fn an_alarm_rings_at_its_deadline_and_not_before() {
        let (owner, alarm) = armed(10).await;
        advance(Duration::from_secs(9)).await;
        assert!(!rang(&alarm, &owner).await);
        advance(Duration::from_secs(1)).await;
        assert!(rang(&alarm, &owner).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_deadline_is_picked_up_when_the_queued_one_comes_due() {
        let owner = Arc::new(Owner::default());
        let alarm = Alarm::new(owner.clone());
        let start = Instant::now();
        alarm.set(&owner.0, Some(start + Duration::from_secs(5)));
        assert!(!rang(&alarm, &owner).await);
        // Moved later: nothing queued anew, the table looks again at 5 s.
        alarm.set(&owner.0, Some(start + Duration::from_secs(8)));
        assert!(!rang(&alarm, &owner).await);
        assert_eq!(
            owner.0.queued.load(Ordering::Relaxed),
            alarm.table.ticks(start + Duration::from_secs(5))
        );
        advance(Duration::from_secs(5)).await;
        assert!(!rang(&alarm, &owner).await);
        assert_eq!(
            owner.0.queued.load(Ordering::Relaxed),
            alarm.table.ticks(start + Duration::from_secs(8))
        );
        advance(Duration::from_secs(3)).await;
        assert!(rang(&alarm, &owner).await);
        // No deadline: never rings.
        alarm.set(&owner.0, None);
        assert!(!rang(&alarm, &owner).await);
        advance(Duration::from_secs(86_400)).await;
        assert!(!rang(&alarm, &owner).await);
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_wakes_the_table_and_a_dropped_alarm_is_forgotten() {
        let (late, late_alarm) = armed(60).await;
        let (_gone, gone_alarm) = armed(1).await;
        let (early, early_alarm) = armed(2).await;
        drop(gone_alarm);
        // The dropped alarm's slot is taken again: its old queue entry is stale.
        let (again, again_alarm) = armed(30).await;
        assert_eq!(again_alarm.slot, 1);
        advance(Duration::from_secs(2)).await;
        assert!(rang(&early_alarm, &early).await);
        assert!(!rang(&again_alarm, &again).await);
        assert!(!again.0.rang.load(Ordering::Relaxed));
        assert!(!rang(&late_alarm, &late).await);
        advance(Duration::from_secs(28)).await;
        assert!(rang(&again_alarm, &again).await);
        assert!(!rang(&late_alarm, &late).await);
    }
}
