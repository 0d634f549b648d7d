//! Which containers a transition acts on: a fixed list, or the containers Docker labels
//! select (`--sleep-label`). A freeze or stop acts on the running matches and remembers
//! their ids; a wake brings those back, and only when a remembered one is gone (Kamal
//! pruned or recreated it) does the newest match stand in, at most one, and none when it is
//! one of the remembered ones this wake just brought back: anything else would be older.
//! An older version Kamal keeps stopped for rollback is therefore never started by a wake.
//! Also here: why a wake failed (the failures a selection adds among them), as the log
//! tells it.

use std::fmt;

use tokio::time::{Instant, timeout_at};

use super::{Inner, STOP_BUDGET, Shared};
use crate::lifecycle::{LifecycleError, ListedContainer};

/// What a freeze, stop or wake acts on, copied from the controller's state when the
/// operation begins.
pub(super) struct Plan {
    pub(super) containers: Vec<String>,
    pub(super) selector: Vec<String>,
    pub(super) remembered: Vec<String>,
}

impl Plan {
    pub(super) fn of(inner: &Inner) -> Plan {
        Plan {
            containers: inner.config.containers.clone(),
            selector: inner.config.selector.clone(),
            remembered: inner.remembered.clone(),
        }
    }

    /// What a wake brings back first: the fixed list, or the remembered ids.
    pub(super) fn wake_targets(&self) -> Vec<String> {
        if self.selector.is_empty() {
            self.containers.clone()
        } else {
            self.remembered.clone()
        }
    }

    /// What a failed wake stops before the service is recorded as sleeping: everything it
    /// may have started (`maybe_running`), a stand-in among them; from frozen also every
    /// container it was to thaw, since a failed thaw leaves the ones after it frozen, and
    /// frozen is not asleep.
    pub(super) fn after_failed_wake(
        &self,
        frozen: bool,
        maybe_running: Vec<String>,
    ) -> Vec<String> {
        if !frozen {
            return maybe_running;
        }
        let mut cleanup = self.wake_targets();
        for container in maybe_running {
            if !cleanup.contains(&container) {
                cleanup.push(container);
            }
        }
        cleanup
    }

    /// For the log: the fixed list, or the labels and the remembered ids.
    pub(super) fn describe(&self) -> String {
        if self.selector.is_empty() {
            self.containers.join(",")
        } else {
            format!(
                "{} ({})",
                self.remembered.join(","),
                self.selector.join(",")
            )
        }
    }
}

impl Shared {
    /// The containers a freeze or stop acts on: the fixed list, or the running (or frozen)
    /// containers the selector matches now.
    pub(super) async fn live_containers(&self, plan: &Plan) -> Result<Vec<String>, LifecycleError> {
        if plan.selector.is_empty() {
            return Ok(plan.containers.clone());
        }
        let listed = timeout_at(
            Instant::now() + STOP_BUDGET,
            self.lifecycle.list(&plan.selector),
        )
        .await
        .unwrap_or_else(|_| Err(LifecycleError::Timeout(plan.selector.join(","))))?;
        Ok(listed
            .into_iter()
            .filter(|c| c.live)
            .map(|c| c.id)
            .collect())
    }

    /// After a wake found a remembered container gone (or had none to remember): starts
    /// the newest container the labels match, unless this wake has already brought it
    /// back. Never the next newest: with the newest version up, every other match is an
    /// older one (Kamal's rollback copies), and starting it would serve an old release.
    /// None at all is a failed wake.
    pub(super) async fn wake_stand_in(
        &self,
        plan: &Plan,
        deadline: Instant,
        maybe_running: &mut Vec<String>,
    ) -> Result<(), WakeFailure> {
        let selector = plan.selector.join(",");
        let listed = timeout_at(deadline, self.lifecycle.list(&plan.selector))
            .await
            .unwrap_or_else(|_| Err(LifecycleError::Timeout(selector.clone())))
            .map_err(|error| WakeFailure::NoContainer {
                selector: selector.clone(),
                error: Some(error),
            })?;
        match newest(listed) {
            Some(c) if maybe_running.contains(&c.id) => {}
            Some(c) => {
                tracing::info!(service = %self.service, container = %c.id, "Waking the newest container the labels match");
                maybe_running.push(c.id.clone());
                match timeout_at(deadline, self.lifecycle.start(&c.id)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        if !may_have_started(&error) {
                            maybe_running.pop();
                        }
                        return Err(WakeFailure::Start {
                            container: c.id,
                            error,
                        });
                    }
                    Err(_) => return Err(WakeFailure::OutOfTime),
                }
            }
            None if maybe_running.is_empty() => {
                return Err(WakeFailure::NoContainer {
                    selector,
                    error: None,
                });
            }
            None => {}
        }
        Ok(())
    }
}

/// The most recently created of `listed`. Docker gives creation times in whole seconds but
/// lists newest first by the exact time, so of equal seconds the first listed wins.
pub(super) fn newest(listed: Vec<ListedContainer>) -> Option<ListedContainer> {
    listed.into_iter().reduce(|newest, c| {
        if c.created > newest.created {
            c
        } else {
            newest
        }
    })
}

/// Why a wake failed; logged, never shown to a client.
#[derive(Debug)]
pub(super) enum WakeFailure {
    Start {
        container: String,
        error: LifecycleError,
    },
    OutOfTime,
    NotReady,
    /// A selector matched no container (or none that could be listed).
    NoContainer {
        selector: String,
        error: Option<LifecycleError>,
    },
}

impl fmt::Display for WakeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WakeFailure::Start { container, error } => {
                write!(f, "starting container {container}: {error}")
            }
            WakeFailure::OutOfTime => f.write_str("timed out waking containers"),
            WakeFailure::NotReady => {
                f.write_str("no target became healthy before the wake deadline")
            }
            WakeFailure::NoContainer {
                selector,
                error: None,
            } => write!(f, "no container has the labels {selector}"),
            WakeFailure::NoContainer {
                selector,
                error: Some(error),
            } => write!(f, "listing the containers labelled {selector}: {error}"),
        }
    }
}

/// Whether a failed start may still have left the container running (the daemon did not
/// answer, so it may have acted); a definite refusal means it did not start.
pub(super) fn may_have_started(error: &LifecycleError) -> bool {
    matches!(
        error,
        LifecycleError::Timeout(_) | LifecycleError::Transport(_)
    )
}
