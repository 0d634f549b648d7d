//! Where the router's changes are made durable: the state file, written off the runtime
//! threads, in the order the changes happen, with the outcome handed back to the change.
//!
//! A change is saved before it is published. When the file cannot be written the change
//! is refused and traffic stays exactly as it was: Kamal stops the new container when a
//! deploy fails, so a change must never be live and failed at once, and a change that is
//! live but not saved would vanish at the next `kamal proxy reboot`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::state::{self, LoadError, ServiceState};
use crate::service::Service;

pub struct StateStore {
    path: PathBuf,
    /// Set once this generation has handed its listeners to a newer one: from then on the
    /// newer generation owns the file (it restored from it), and a save here would undo
    /// its changes.
    retired: AtomicBool,
}

/// Why a retired generation refuses a change.
pub const RETIRED: &str = "this kamal-proxy has handed its listeners to a newer generation, which now owns the state; send changes to it";

impl StateStore {
    pub fn new(path: PathBuf) -> StateStore {
        StateStore {
            path,
            retired: AtomicBool::new(false),
        }
    }

    /// Gives up the file for good. Callers hold the router's control lock, so no save
    /// of this generation is under way or follows.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the saved services; `Ok(None)` when there is no file yet.
    pub fn load(&self) -> Result<Option<Vec<ServiceState>>, LoadError> {
        state::load(&self.path)
    }

    /// Writes `services` atomically on a blocking thread (two fsyncs must not stall a
    /// runtime thread that is also serving requests). Callers hold the router's control
    /// lock across the call, so saves land in the order the changes were made.
    pub async fn save(&self, services: Vec<ServiceState>) -> Result<(), String> {
        if self.is_retired() {
            return Err(RETIRED.into());
        }
        let path = self.path.clone();
        let written = tokio::task::spawn_blocking(move || state::save(&path, &services)).await;
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!(
                "unable to save state to {}: {e}",
                self.path.display()
            )),
            Err(e) => Err(format!(
                "unable to save state to {}: {e}",
                self.path.display()
            )),
        }
    }

    /// Moves a corrupt file aside and says where it went (or why it could not).
    pub fn set_aside(&self) -> String {
        state::set_aside(&self.path)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|err| format!("(could not move it aside: {err})"))
    }
}

/// A service as the state file records it.
pub(super) fn snapshot(s: &Service) -> ServiceState {
    let config = s.config();
    let mut state = ServiceState::new(
        &s.name,
        config.deployed_options(),
        config.target_options.clone(),
        &s.active(),
        s.pause.snapshot(),
        s.sleep_controller()
            .map(|c| c.state().to_string())
            .unwrap_or_default(),
    )
    .with_rollout(s.rollout().as_deref(), s.rollout_split().as_deref());
    if let Some(c) = s.sleep_controller() {
        let (ids, since) = c.remembered();
        state.idle_containers = ids;
        state.idle_since = since
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
    }
    state
}

/// Every service as it would be saved, with `changed` in place of (or beside) the
/// service of the same name.
pub(super) fn snapshots(
    services: &BTreeMap<String, Arc<Service>>,
    changed: Option<ServiceState>,
) -> Vec<ServiceState> {
    let unchanged = services
        .values()
        .filter(|s| changed.as_ref().is_none_or(|c| *c.name != *s.name))
        .map(|s| snapshot(s))
        .collect();
    with_change(unchanged, changed)
}

/// `states` (sorted by name, without `changed`'s name) with `changed` in its place.
fn with_change(mut states: Vec<ServiceState>, changed: Option<ServiceState>) -> Vec<ServiceState> {
    if let Some(c) = changed {
        let at = states.partition_point(|s| s.name < c.name);
        states.insert(at, c);
    }
    states
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_lands_in_name_order() {
        let names = |states: &[ServiceState]| -> Vec<String> {
            states.iter().map(|s| s.name.clone()).collect()
        };
        let saved = with_change(vec![service("a"), service("c")], Some(service("b")));
        assert_eq!(names(&saved), ["a", "b", "c"]);
        let saved = with_change(vec![service("b")], Some(service("a")));
        assert_eq!(names(&saved), ["a", "b"]);
        let saved = with_change(vec![service("a")], None);
        assert_eq!(names(&saved), ["a"]);
    }

    fn service(name: &str) -> ServiceState {
        state::parse(format!(r#"[{{"name":"{name}","active_targets":["web:1"]}}]"#).as_bytes())
            .unwrap()
            .remove(0)
    }

    #[tokio::test]
    async fn saves_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("kamal-proxy.state"));
        assert!(store.load().unwrap().is_none());
        store.save(vec![service("a")]).await.unwrap();
        assert_eq!(store.load().unwrap().unwrap(), vec![service("a")]);
    }

    #[tokio::test]
    async fn an_unwritable_directory_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("kamal-proxy.state");
        let store = StateStore::new(path.clone());
        let err = store.save(vec![service("a")]).await.unwrap_err();
        assert!(
            err.starts_with(&format!("unable to save state to {}: ", path.display())),
            "{err}"
        );
        assert!(!path.exists());
    }
}
