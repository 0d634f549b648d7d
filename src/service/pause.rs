//! `pause`, `stop` and `resume`: a paused service holds new requests until resumed (or
//! `--max-pause` passes → 504); a stopped one answers 503 with its message.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

use crate::options::DEFAULT_PAUSE_TIMEOUT;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseState {
    Running,
    Paused,
    Stopped,
}

impl PauseState {
    pub fn name(self) -> &'static str {
        match self {
            PauseState::Running => "running",
            PauseState::Paused => "paused",
            PauseState::Stopped => "stopped",
        }
    }
}

/// The persisted form, with upstream's keys and numeric states.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct PauseSnapshot {
    pub state: u8,
    pub stop_message: String,
    pub fail_after: i64,
}

impl Default for PauseSnapshot {
    /// Go's zero value: a service never paused has `fail_after` 0, and writing back what
    /// was read keeps the file byte-compatible with upstream's.
    fn default() -> Self {
        PauseSnapshot {
            state: 0,
            stop_message: String::new(),
            fail_after: 0,
        }
    }
}

#[derive(Clone, Debug)]
struct Status {
    state: PauseState,
    message: String,
    fail_after: Duration,
}

pub enum PauseOutcome {
    Proceed,
    Stopped(String),
    TimedOut,
}

pub struct PauseController {
    status: watch::Sender<Status>,
    /// Lets the hot path skip the watch channel's lock while running.
    running: AtomicBool,
}

impl Default for PauseController {
    fn default() -> Self {
        Self::restore(&PauseSnapshot::default())
    }
}

impl PauseController {
    pub fn restore(s: &PauseSnapshot) -> Self {
        let state = match s.state {
            1 => PauseState::Paused,
            2 => PauseState::Stopped,
            _ => PauseState::Running,
        };
        let fail_after = crate::gotime::to_std(s.fail_after.max(0));
        PauseController {
            status: watch::channel(Status {
                state,
                message: s.stop_message.clone(),
                fail_after,
            })
            .0,
            running: AtomicBool::new(state == PauseState::Running),
        }
    }

    pub fn snapshot(&self) -> PauseSnapshot {
        let s = self.status.borrow();
        PauseSnapshot {
            state: match s.state {
                PauseState::Running => 0,
                PauseState::Paused => 1,
                PauseState::Stopped => 2,
            },
            stop_message: s.message.clone(),
            fail_after: s.fail_after.as_nanos() as i64,
        }
    }

    pub fn state(&self) -> PauseState {
        if self.is_running() {
            PauseState::Running
        } else {
            self.status.borrow().state
        }
    }

    #[inline]
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    fn set(&self, state: PauseState, message: Option<String>, fail_after: Option<Duration>) {
        self.status.send_modify(|s| {
            s.state = state;
            if let Some(m) = message {
                s.message = m;
            }
            if let Some(f) = fail_after {
                s.fail_after = f;
            }
        });
        self.running
            .store(state == PauseState::Running, Ordering::Release);
    }

    pub fn pause(&self, fail_after: Duration) {
        self.set(PauseState::Paused, None, Some(fail_after));
    }

    pub fn stop(&self, message: String) {
        self.set(PauseState::Stopped, Some(message), None);
    }

    pub fn resume(&self) {
        self.set(PauseState::Running, None, None);
    }

    /// Waits while paused, each request for at most its own `--max-pause`.
    pub async fn wait(&self) -> PauseOutcome {
        let mut rx = self.status.subscribe();
        // A paused service always has its --max-pause, except one restored from a file
        // that never stored it.
        let fail_after = Some(rx.borrow().fail_after)
            .filter(|f| !f.is_zero())
            .unwrap_or(DEFAULT_PAUSE_TIMEOUT.to_std());
        let settled = rx.wait_for(|s| s.state != PauseState::Paused);
        match tokio::time::timeout(fail_after, settled).await {
            Err(_) => PauseOutcome::TimedOut,
            Ok(Err(_)) => PauseOutcome::Proceed,
            Ok(Ok(s)) => match s.state {
                PauseState::Stopped => PauseOutcome::Stopped(s.message.clone()),
                _ => PauseOutcome::Proceed,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn paused_requests_wait_for_resume_or_time_out() {
        let p = Arc::new(PauseController::default());
        p.pause(Duration::from_secs(2));
        let p2 = p.clone();
        let waiter = tokio::spawn(async move { p2.wait().await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        p.resume();
        assert!(matches!(waiter.await.unwrap(), PauseOutcome::Proceed));
        p.pause(Duration::from_secs(2));
        assert!(matches!(p.wait().await, PauseOutcome::TimedOut));
    }

    #[tokio::test(start_paused = true)]
    async fn stop_releases_waiters_with_the_message() {
        let p = Arc::new(PauseController::default());
        p.pause(Duration::from_secs(30));
        let p2 = p.clone();
        let waiter = tokio::spawn(async move { p2.wait().await });
        tokio::time::sleep(Duration::from_millis(10)).await;
        p.stop("maintenance".into());
        match waiter.await.unwrap() {
            PauseOutcome::Stopped(m) => assert_eq!(m, "maintenance"),
            _ => panic!("expected stopped"),
        }
        assert_eq!(p.snapshot().state, 2);
    }
}
