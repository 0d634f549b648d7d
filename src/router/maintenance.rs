//! Pause, stop and resume (`kamal app maintenance` and `live`): each change is saved
//! before it is applied.

use std::sync::Arc;

use super::Router;
use super::persist::{snapshot, snapshots};
use crate::gotime::GoDuration;
use crate::service::Service;
use crate::service::pause::PauseController;

impl Router {
    pub async fn pause(
        &self,
        name: &str,
        drain_timeout: GoDuration,
        pause_timeout: GoDuration,
    ) -> Result<(), String> {
        let service = self
            .with_service(name, |p| p.pause(pause_timeout.to_std()))
            .await?;
        tracing::info!(service = %name, "Service paused");
        drain_all(&service, drain_timeout).await;
        tracing::info!(service = %name, "Service drained");
        Ok(())
    }

    pub async fn stop(
        &self,
        name: &str,
        drain_timeout: GoDuration,
        message: String,
    ) -> Result<(), String> {
        let service = self.with_service(name, |p| p.stop(message.clone())).await?;
        tracing::info!(service = %name, "Service stopped");
        drain_all(&service, drain_timeout).await;
        tracing::info!(service = %name, "Service drained");
        Ok(())
    }

    pub async fn resume(&self, name: &str) -> Result<(), String> {
        self.with_service(name, |p| p.resume()).await?;
        tracing::info!(service = %name, "Service resumed");
        Ok(())
    }

    /// Applies a pause-state change, saved first: the change is tried on a scratch copy
    /// of the service's pause controller, that outcome is saved, then it is applied.
    async fn with_service(
        &self,
        name: &str,
        change: impl Fn(&PauseController),
    ) -> Result<Arc<Service>, String> {
        let services = self.services.lock().await;
        let service = services
            .get(name)
            .cloned()
            .ok_or_else(|| "service not found".to_string())?;
        let scratch = PauseController::restore(&service.pause.snapshot());
        change(&scratch);
        let mut changed = snapshot(&service);
        changed.pause_controller = scratch.snapshot();
        self.store.save(snapshots(&services, Some(changed))).await?;
        change(&service.pause);
        Ok(service)
    }
}

/// Pause and stop drain the active and the rollout pool at once (upstream §4.3).
async fn drain_all(service: &Service, timeout: GoDuration) {
    let pools = service.pools();
    futures_util::future::join_all(pools.iter().map(|p| p.drain(timeout.to_std()))).await;
}
