//! Pause, stop and resume (`kamal app maintenance` and `live`): each change is saved
//! before it is applied.

use std::sync::Arc;

use super::Router;
use super::persist::{snapshot, snapshots};
use crate::gotime;
use crate::service::Service;
use crate::service::pause::PauseController;

impl Router {
    pub async fn pause(
        &self,
        name: &str,
        drain_timeout: i64,
        pause_timeout: i64,
    ) -> Result<(), String> {
        let service = self
            .with_service(name, |p| p.pause(gotime::to_std(pause_timeout)))
            .await?;
        tracing::info!(service = %name, "Service paused");
        service.active().drain(gotime::to_std(drain_timeout)).await;
        tracing::info!(service = %name, "Service drained");
        Ok(())
    }

    pub async fn stop(
        &self,
        name: &str,
        drain_timeout: i64,
        message: String,
    ) -> Result<(), String> {
        let service = self.with_service(name, |p| p.stop(message.clone())).await?;
        tracing::info!(service = %name, "Service stopped");
        service.active().drain(gotime::to_std(drain_timeout)).await;
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
