//! The one way a test waits: poll a check on tokio's clock until it holds, or fail naming
//! what it waited for and what it saw last.

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

/// How often a check is retried.
const INTERVAL: Duration = Duration::from_millis(20);

/// What a check reports: done (with a value) or not yet (with what it saw, formatted
/// only if the wait gives up).
pub trait Check {
    type Output;
    type Pending: Debug;
    fn outcome(self) -> Result<Self::Output, Self::Pending>;
}

impl Check for bool {
    type Output = ();
    type Pending = &'static str;
    fn outcome(self) -> Result<(), &'static str> {
        if self { Ok(()) } else { Err("false") }
    }
}

impl<T> Check for Option<T> {
    type Output = T;
    type Pending = &'static str;
    fn outcome(self) -> Result<T, &'static str> {
        self.ok_or("nothing yet")
    }
}

impl<T, E: Debug> Check for Result<T, E> {
    type Output = T;
    type Pending = E;
    fn outcome(self) -> Result<T, E> {
        self
    }
}

/// Runs `check` until it reports done and returns its value; panics after `timeout`
/// with `what` and the last thing the check saw. The timeout is a hang guard, never a
/// measurement: make it generous.
pub async fn poll_until<F, Fut, C>(what: &str, timeout: Duration, mut check: F) -> C::Output
where
    F: FnMut() -> Fut,
    Fut: Future<Output = C>,
    C: Check,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match check().await.outcome() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("gave up after {timeout:?} waiting for {what}; last seen: {last:?}");
        }
        tokio::time::sleep(INTERVAL).await;
    }
}
