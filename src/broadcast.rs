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
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::worker::{self, Padded};

/// The process's words.
static WORDS: Words = Words::new();

struct Words {
    /// How many words there have been. Counted after what the word is about was set, so a
    /// task that sees the count move sees that too.
    count: AtomicU64,
    /// One `Notify` a worker (and one for the other threads).
    workers: OnceLock<Box<[Padded<Notify>]>>,
}

impl Words {
    const fn new() -> Self {
        Words {
            count: AtomicU64::new(0),
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

    fn listen(&'static self) -> Listen {
        Listen {
            words: self,
            // Before the `Notified` is made: a word between the two is heard at the first poll.
            seen: self.count.load(Ordering::Acquire),
            notified: self.own_worker().notified(),
            registered: false,
        }
    }
}

/// Wakes every listening task, once what the word is about has been set where they look.
pub fn send() {
    WORDS.send();
}

/// A listener for this thread's task (it registers with the worker it is made on).
pub fn listen() -> Listen {
    WORDS.listen()
}

pin_project_lite::pin_project! {
    /// A task's registration for the words. It keeps the waker of its first poll, as a
    /// task's waker does not change, so a poll after that is one load.
    pub struct Listen {
        words: &'static Words,
        seen: u64,
        #[pin]
        notified: Notified<'static>,
        registered: bool,
    }
}

impl Listen {
    /// Ready once for each poll that finds words sent since the last ready one (or since
    /// it was made): the task should look again at what concerns it.
    pub fn poll_heard(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let now = this.words.count.load(Ordering::Acquire);
        if now != *this.seen {
            // Registered again for the words to come, before the caller looks: a word
            // after this line wakes the task, one before it is counted in `now`.
            *this.seen = now;
            this.notified.set(this.words.own_worker().notified());
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

    #[test]
    fn a_listener_wakes_at_each_word_and_hears_it_once() {
        // Words of its own: the process's are sent by other tests' drains too.
        let words: &'static Words = Box::leak(Box::new(Words::new()));
        let wakes = Arc::new(Count(AtomicUsize::new(0)));
        let mut listen = std::pin::pin!(words.listen());
        assert!(polled(listen.as_mut(), &wakes).is_pending());
        assert!(polled(listen.as_mut(), &wakes).is_pending());

        words.send();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "the word woke the task");
        assert!(polled(listen.as_mut(), &wakes).is_ready());
        assert!(
            polled(listen.as_mut(), &wakes).is_pending(),
            "heard once a word"
        );

        // Registered again: the next word wakes it too.
        words.send();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
        assert!(polled(listen.as_mut(), &wakes).is_ready());

        // A listener made before a word and first polled after it hears it.
        let mut late = std::pin::pin!(words.listen());
        words.send();
        assert!(polled(late.as_mut(), &wakes).is_ready());
        assert!(polled(late.as_mut(), &wakes).is_pending());
    }
}
