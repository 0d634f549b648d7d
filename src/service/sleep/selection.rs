//! Which containers a transition acts on: a fixed list, or the containers Docker labels
//! select (`--sleep-label`). A freeze or stop acts on the running matches and remembers
//! their ids; a wake brings those back, and only a remembered one that is gone (Kamal
//! pruned or recreated it) is replaced by the newest match. An older version Kamal keeps
//! stopped for rollback is therefore never started by a wake. Also here: why a wake failed
//! (the failures a selection adds among them), as the log tells it.

use std::fmt;

use tokio::time::{Instant, timeout_at};

use super::{Inner, STOP_BUDGET, Shared};
use crate::lifecycle::LifecycleError;

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
    /// the newest container the labels match that this wake has not started already.
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
        let newest = listed
            .into_iter()
            .filter(|c| !maybe_running.contains(&c.id))
            .max_by_key(|c| c.created);
        match newest {
            Some(c) => {
                tracing::info!(service = %self.service, container = %c.id, "Waking the newest container the labels match");
                maybe_running.push(c.id.clone());
                match timeout_at(deadline, self.lifecycle.start(&c.id)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
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
