//! `rollout deploy`, `rollout set` and `rollout stop` (upstream §1.9, §4.5): a second pool
//! beside the active one, and the split that sends chosen requests to it. Like a deploy,
//! each change is saved before it is applied.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::Router;
use super::deploy::keep_awake;
use super::persist::{snapshot, snapshots};
use crate::balancer::rollout::RolloutSplit;
use crate::balancer::spec::TargetSpec;
use crate::balancer::{LoadBalancer, ProbeMode};
use crate::options::DeploymentOptions;
use crate::service::Service;
use crate::service::sleep::IdleState;

/// `rollout deploy`, as the CLI sends it over the control socket.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RolloutDeployArgs {
    pub service: String,
    pub targets: Vec<String>,
    #[serde(default)]
    pub readers: Vec<String>,
    /// `force` is ignored: a rollout always waits for health, as upstream.
    #[serde(default)]
    pub deployment: DeploymentOptions,
}

impl Router {
    /// Health-checks the new pool with the service's current options, installs it in the
    /// rollout slot, then drains the rollout pool it replaces.
    pub async fn rollout_deploy(self: &Arc<Self>, args: RolloutDeployArgs) -> Result<(), String> {
        // As `deploy`: a retired generation refuses before probing anything.
        if self.store.is_retired() {
            return Err(super::persist::RETIRED.into());
        }
        let RolloutDeployArgs {
            service: name,
            targets,
            readers,
            deployment,
        } = args;
        // Upstream's order: the service, then the addresses (checked as the pool is built,
        // before anything is probed, woken or saved).
        let service = self.service_named(&name).await?;
        let targets_field = list_field("targets", &targets);
        tracing::info!(service = %name, json_fields = targets_field.as_str(), "Deploying for rollout");
        let config = service.config();
        let lb = LoadBalancer::new(
            &name,
            &TargetSpec::parse_all(&targets)?,
            &TargetSpec::parse_all(&readers)?,
            // The service's key: a client pinned in the rollout pool stays pinned when
            // the same targets come back in a later rollout.
            service.active().pin_key().clone(),
            config.target_options.health_check_config.clone(),
            self.probe_client.clone(),
        )?;
        let _keep_awake = keep_awake(Some(&service), "rollout").await?;

        lb.start_health_checks(ProbeMode::Deploy);
        let timeout = deployment.deploy_timeout;
        if lb.wait_until_healthy(timeout.to_std()).await.is_err() {
            lb.stop_health_checks();
            return Err(format!(
                "target failed to become healthy within configured timeout ({timeout})"
            ));
        }

        let replaced = {
            let services = self.services.lock().await;
            // The service may have been removed or redeployed meanwhile: install into the
            // service as it is now.
            let Some(service) = services.get(&name).cloned() else {
                lb.stop_health_checks();
                return Err("service not found".into());
            };
            let changed =
                snapshot(&service).with_rollout(Some(&lb), service.rollout_split().as_deref());
            if let Err(e) = self.store.save(snapshots(&services, Some(changed))).await {
                lb.stop_health_checks();
                tracing::error!(service = %name, error = %e, "Rollout refused: state not saved");
                return Err(e);
            }
            let replaced = service.swap_rollout(Some(lb));
            // While a split is set, the rollout's containers sleep and wake with the
            // service's.
            self.sync_sleep(&service, &service.config().options, IdleState::Active);
            replaced
        };
        if let Some(old) = replaced {
            old.stop_health_checks();
            old.drain(deployment.drain_timeout.to_std()).await;
        }
        tracing::info!(service = %name, json_fields = targets_field.as_str(), "Deployed for rollout");
        Ok(())
    }

    /// `rollout set`: replaces the split. Needs a rollout pool.
    pub async fn rollout_set(
        self: &Arc<Self>,
        name: &str,
        percentage: i64,
        allowlist: Vec<String>,
    ) -> Result<(), String> {
        let services = self.services.lock().await;
        let service = services
            .get(name)
            .cloned()
            .ok_or_else(|| "service not found".to_string())?;
        let Some(pool) = service.rollout() else {
            return Err("rollout target not set".into());
        };
        let split = RolloutSplit::new(percentage, allowlist);
        let changed = snapshot(&service).with_rollout(Some(&pool), Some(&split));
        self.store.save(snapshots(&services, Some(changed))).await?;
        let allowlist = list_field("allowlist", &split.allowlist);
        tracing::info!(service = %name, percentage, json_fields = allowlist.as_str(), "Set rollout split");
        service.set_rollout_split(Some(split));
        // The rollout's containers now sleep and wake with the service's.
        self.sync_sleep(&service, &service.config().options, IdleState::Active);
        Ok(())
    }

    /// `rollout stop`: every request goes to the active pool again. The rollout pool stays
    /// (and is still saved), so a later `rollout set` can resume the split.
    pub async fn rollout_stop(self: &Arc<Self>, name: &str) -> Result<(), String> {
        let services = self.services.lock().await;
        let service = services
            .get(name)
            .cloned()
            .ok_or_else(|| "service not found".to_string())?;
        let changed = snapshot(&service).with_rollout(service.rollout().as_deref(), None);
        self.store.save(snapshots(&services, Some(changed))).await?;
        service.set_rollout_split(None);
        self.sync_sleep(&service, &service.config().options, IdleState::Active);
        tracing::info!(service = %name, "Stopped rollout");
        Ok(())
    }

    async fn service_named(&self, name: &str) -> Result<Arc<Service>, String> {
        self.services
            .lock()
            .await
            .get(name)
            .cloned()
            .ok_or_else(|| "service not found".to_string())
    }
}

/// A list attribute of upstream's log lines (`"targets":["web:80"]`), as slog writes it.
fn list_field(key: &str, values: &[String]) -> String {
    let mut out = String::new();
    crate::observe::log::json_string_list_member(&mut out, key, values);
    out
}
