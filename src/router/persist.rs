//! Where the router's changes are made durable: the state file, written off the runtime
//! threads, in the order the changes happen, with the outcome handed back to the change.
//!
//! A change is saved before it is published. When the file cannot be written the change
//! is refused and traffic stays exactly as it was: Kamal stops the new container when a
//! deploy fails, so a change must never be live and failed at once, and a change that is
//! live but not saved would vanish at the next `kamal proxy reboot`.

use std::path::{Path, PathBuf};

use super::state::{self, LoadError, ServiceState};

pub struct StateStore {
    path: PathBuf,
}

impl StateStore {
    pub fn new(path: PathBuf) -> StateStore {
        StateStore { path }
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

#[cfg(test)]
mod tests {
    use super::*;

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
