//! A word to every connection's task at once: something happened that may end what it
//! serves. Two things say it: a listener's drain starting (`server::Drain`), and a target's
//! drain giving up on the requests still in flight to it (`balancer::TargetGuard`).
//!
//! A connection's task registers once for its whole life ([`listen`]); each word wakes it,
//! and it looks again at what concerns it: its listener's flag, and the request in flight,
//! which looks at its own target's flag (`TargetGuard::is_cancelled`, one load). Before,
//! a request waiting for its answer waited on its target's `Notify` itself: its lock taken
//! twice a request to join that `Notify`'s list and leave it (four atomic
//! read-modify-writes and a few hundred instructions), for a word that comes at most once
//! a deploy. Requests that hyper's connections serve (HTTP/2, and HTTP/1 requests ours
//! hands over) still wait that way: nothing here polls them again.
//!
//! A task registers with its own worker's `Notify`, so registering and leaving take a lock
//! no other core takes (a listener's drain had one `Notify` for all its connections).

use std::pin::Pin;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::worker::{self, Padded};

/// The process's words.
static WORDS: Words = Words::new();

struct Words {
    /// How many words there have been (wrapping). Counted after what the word is about was
    /// set, so a task that sees the count move sees that too. 32 bits, beside the flag,
    /// keep a registration as small as the `Notify` registration it replaced (every
    /// connection's task holds one, in 128-byte steps).
    count: AtomicU32,
    /// One `Notify` a worker (and one for the other threads).
    workers: OnceLock<Box<[Padded<Notify>]>>,
}

impl Words {
    const fn new() -> Self {
        Words {
            count: AtomicU32::new(0),
            workers: OnceLock::new(),
        }
    }

    fn workers(&self) -> &[Padded<Notify>] {
        self.workers.get_or_init(|| {
            (0..worker::slots())
                .map(|_| Padded(Notify::new()))
                .collect()
        })
    }

    fn own_worker(&self) -> &Notify {
        let all = self.workers();
        &all[worker::index() % all.len()]
    }

    fn send(&self) {
        self.count.fetch_add(1, Ordering::Release);
        for notify in self.workers() {
            notify.notify_waiters();
        }
    }
}

/// Wakes every listening task, once what the word is about has been set where they look.
pub fn send() {
    WORDS.send();
}

/// A listener for this thread's task (it registers with the worker it is made on).
pub fn listen() -> Listen {
    Listen {
        // Before the `Notified` is made: a word between the two is heard at the first poll.
        seen: WORDS.count.load(Ordering::Acquire),
        registered: false,
        notified: WORDS.own_worker().notified(),
    }
}

pin_project_lite::pin_project! {
    /// A task's registration for the words. It keeps the waker of its first poll, as a
    /// task's waker does not change, so a poll after that is one load.
    pub struct Listen {
        seen: u32,
        registered: bool,
        #[pin]
        notified: Notified<'static>,
    }
}

impl Listen {
    /// Ready once for each poll that finds words sent since the last ready one (or since
    /// it was made): the task should look again at what concerns it.
    pub fn poll_heard(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let now = WORDS.count.load(Ordering::Acquire);
        if now != *this.seen {
            // Registered again for the words to come, before the caller looks: a word
            // after this line wakes the task, one before it is counted in `now`.
            *this.seen = now;
            this.notified.set(WORDS.own_worker().notified());
            let _ = this.notified.as_mut().poll(cx);
            *this.registered = true;
            return Poll::Ready(());
        }
        if !*this.registered {
            *this.registered = true;
            if this.notified.as_mut().poll(cx).is_ready() {
                // A word between the load above and the registration: the count has moved.
                cx.waker().wake_by_ref();
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn polled(listen: Pin<&mut Listen>, wakes: &Arc<Count>) -> Poll<()> {
        let waker = std::task::Waker::from(wakes.clone());
        listen.poll_heard(&mut Context::from_waker(&waker))
    }

    fn woken(wakes: &Arc<Count>) -> usize {
        wakes.0.load(Ordering::SeqCst)
    }

    // The process's words: other tests' drains may send some meanwhile, so the counts below
    // are "at least".
    #[test]
    fn a_listener_wakes_at_each_word_and_hears_it() {
        let wakes = Arc::new(Count(AtomicUsize::new(0)));
        let mut first = std::pin::pin!(listen());
        // Heard what came before its first poll, or registered.
        let _ = polled(first.as_mut(), &wakes);
        let before = woken(&wakes);

        send();
        assert!(woken(&wakes) > before, "the word woke the task");
        assert!(polled(first.as_mut(), &wakes).is_ready());

        // Registered again: the next word wakes it too.
        let before = woken(&wakes);
        send();
        assert!(woken(&wakes) > before, "registered again after a word");
        assert!(polled(first.as_mut(), &wakes).is_ready());

        // A listener made before a word and first polled after it hears it.
        let mut late = std::pin::pin!(listen());
        send();
        assert!(polled(late.as_mut(), &wakes).is_ready());
    }

    #[test]
    fn a_registration_is_no_larger_than_the_notify_one_it_replaced() {
        // A `Notified` and a flag, as the listener drain's wait held: every connection's
        // task holds one, and grows in 128-byte steps.
        let before = std::mem::size_of::<Notified<'static>>() + std::mem::size_of::<u64>();
        assert!(std::mem::size_of::<Listen>() <= before);
    }
}
