//! How a request to a target failed, worded as hyper-util's errors were (log lines are
//! unchanged).

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

type BoxError = Box<dyn StdError + Send + Sync>;

/// A failure to reach a target or to exchange with it.
pub(crate) struct UpstreamError {
    /// hyper-util's name for the stage that failed.
    kind: &'static str,
    source: BoxError,
    /// The request is still whole in the sender's hands (it had no body, and nothing
    /// took it): it can be sent again.
    resendable: bool,
}

impl UpstreamError {
    pub(super) fn new(kind: &'static str, source: BoxError) -> Self {
        UpstreamError {
            kind,
            source,
            resendable: false,
        }
    }

    /// The request failed but is whole: it can go again.
    pub(super) fn resendable(mut self) -> Self {
        self.resendable = true;
        self
    }

    /// Whether the request that failed can be sent again as it is (it had no body).
    pub(crate) fn can_resend(&self) -> bool {
        self.resendable
    }
}

impl fmt::Debug for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client error ({})", self.kind)
    }
}

impl StdError for UpstreamError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// `--target-dial-timeout` passed while connecting.
#[derive(Debug)]
pub(crate) struct DialTimeout(pub Duration);

impl fmt::Display for DialTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dial timed out after {}",
            crate::gotime::format_duration(self.0.as_nanos().try_into().unwrap_or(i64::MAX))
        )
    }
}

impl StdError for DialTimeout {}

/// How connecting to the target failed, when that is what failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnectFailure {
    /// Refused, unreachable, reset while connecting, a name that does not resolve: no
    /// byte of the request reached the target.
    Failed,
    /// `--target-dial-timeout` passed.
    TimedOut(Duration),
}

/// Whether `err` (from [`Pools::send`]) is a failure to connect, and which.
pub(crate) fn connect_failure(err: &(dyn StdError + 'static)) -> Option<ConnectFailure> {
    let mut next = Some(err);
    let mut connecting = false;
    while let Some(e) = next {
        if let Some(u) = e.downcast_ref::<UpstreamError>() {
            connecting = u.kind == "Connect";
        }
        if let Some(t) = e.downcast_ref::<DialTimeout>() {
            return Some(ConnectFailure::TimedOut(t.0));
        }
        next = e.source();
    }
    connecting.then_some(ConnectFailure::Failed)
}

/// `--target-timeout` (or a `--path-timeout`) passed before the target's answer began.
#[derive(Debug)]
pub(crate) struct AnswerTimedOut;

impl fmt::Display for AnswerTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("timeout awaiting response headers")
    }
}

impl StdError for AnswerTimedOut {}

/// Whether `T` is `err` or among its causes (`AnswerTimedOut`: the target did not answer
/// in time).
pub(crate) fn caused_by<T: StdError + 'static>(err: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(e) = next {
        if e.is::<T>() {
            return true;
        }
        next = e.source();
    }
    false
}
