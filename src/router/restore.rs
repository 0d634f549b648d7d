//! Start-up: the services of the state file, restored before any listener opens.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Router;
use super::state::{LoadError, ServiceState};
use crate::balancer::affinity::PinKey;
use crate::balancer::{LoadBalancer, ProbeMode};
use crate::service::pause::PauseController;
use crate::service::sleep::IdleState;
use crate::service::{Service, ServiceConfig};

/// `run`'s restore flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct RestorePolicy {
    /// `--ignore-restore-errors` (fork F29): a state file that cannot be decoded is set
    /// aside and the proxy boots with no services, instead of refusing to start.
    pub ignore_errors: bool,
    /// `--recheck-targets-on-restore` (fork F30): restored targets serve at once but keep
    /// being probed for the pool's life, so a target that died while the proxy was down
    /// is demoted (503) and one that recovers rejoins.
    pub recheck_targets: bool,
}

/// The error `run` exits with when the state file cannot be decoded (fork F29).
const RESTORE_FAILED: &str =
    "failed to restore saved state (use --ignore-restore-errors to boot with no services)";

impl Router {
    /// Restores the state file. A file that cannot be decoded stops the start-up, left
    /// in place (fork F29); with `--ignore-restore-errors` it is set aside and the proxy
    /// starts empty. A file that cannot be read at all is always an error (starting
    /// empty would overwrite it at the next deploy).
    pub async fn restore(self: &Arc<Self>, policy: RestorePolicy) -> Result<(), String> {
        let path = self.store.path().display().to_string();
        let saved = match self.store.load() {
            Ok(None) => {
                tracing::info!("No previous state to restore");
                return Ok(());
            }
            Ok(Some(s)) => s,
            Err(LoadError::Io(e)) => {
                return Err(format!(
                    "cannot read the state file {path} (running as {}): {e}",
                    crate::config::current_user()
                ));
            }
            Err(e) if !policy.ignore_errors => {
                tracing::error!(path = %path, error = %e, "Failed to decode saved state");
                return Err(format!("{RESTORE_FAILED}: {path}: {e}"));
            }
            Err(e) => {
                let aside = self.store.set_aside();
                tracing::error!(path = %path, error = %e, moved_to = %aside, "Failed to decode saved state");
                return Ok(());
            }
        };
        // All or nothing, as upstream: restoring part of the file and saving would
        // silently drop the services that failed.
        let mut restored = BTreeMap::new();
        for s in &saved {
            match self.restore_service(s, policy) {
                Ok(service) => {
                    restored.insert(s.name.clone(), service);
                }
                Err(e) => {
                    for service in restored.values() {
                        service.set_sleep_controller(None);
                        for pool in service.pools() {
                            pool.stop_health_checks();
                        }
                    }
                    if !policy.ignore_errors {
                        tracing::error!(path = %path, service = %s.name, error = %e, "Failed to decode saved state");
                        return Err(format!(
                            "{RESTORE_FAILED}: {path}: service \"{}\": {e}",
                            s.name
                        ));
                    }
                    let aside = self.store.set_aside();
                    tracing::error!(path = %path, service = %s.name, error = %e, moved_to = %aside, "Failed to decode saved state");
                    return Ok(());
                }
            }
        }
        let mut services = self.services.lock().await;
        *services = restored;
        self.publish(&services);
        tracing::info!(services = services.len(), "Restored saved state");
        Ok(())
    }

    fn restore_service(
        self: &Arc<Self>,
        s: &ServiceState,
        policy: RestorePolicy,
    ) -> Result<Arc<Service>, String> {
        let mut config =
            ServiceConfig::build(&s.name, s.options.clone(), s.target_options.clone())?;
        config.tls = s
            .options
            .cert_request()
            .map(|req| self.tls().source_for(&req))
            .transpose()?;
        // The saved key keeps every client's pin across the restart; a file without one
        // (affinity off, an upstream file) gets a fresh key.
        let pin_key = match &s.session_affinity_key {
            Some(key) => key.clone(),
            None => PinKey::generate()?,
        };
        let (writers, readers) = s.active_specs();
        let lb = LoadBalancer::new(
            &s.name,
            &writers,
            &readers,
            pin_key.clone(),
            s.target_options.health_check_config.clone(),
            self.probe_client.clone(),
        )?;
        let service = Arc::new(Service::new(
            &s.name,
            config,
            lb.clone(),
            PauseController::restore(&s.pause_controller),
        ));
        let restored_idle = IdleState::parse(&s.idle_state);
        lb.mark_all_healthy();
        // A rollout pool is restored when it has targets, healthy at once like the active
        // one (upstream §6.3), and its split as saved.
        let (rollout_writers, rollout_readers) = s.rollout_specs();
        let rollout = match rollout_writers.as_slice() {
            writers if !writers.is_empty() => {
                let pool = LoadBalancer::new(
                    &s.name,
                    writers,
                    &rollout_readers,
                    pin_key,
                    s.target_options.health_check_config.clone(),
                    self.probe_client.clone(),
                )?;
                pool.mark_all_healthy();
                service.swap_rollout(Some(pool.clone()));
                Some(pool)
            }
            _ => None,
        };
        service.set_rollout_split(s.rollout_controller.clone());
        if s.options.sleep_enabled() && self.lifecycle.is_none() {
            tracing::warn!(service = %s.name, "Service has --sleep-after but the proxy runs without --docker-socket; it will not sleep");
        }
        self.sync_sleep(&service, &s.options, restored_idle);
        if let Some(c) = service.sleep_controller() {
            let since = u64::try_from(s.idle_since)
                .ok()
                .filter(|&secs| secs > 0)
                .map(|secs| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
            c.restore_remembered(s.idle_containers.clone(), since);
        }
        if service
            .sleep_controller()
            .is_none_or(|c| c.state() == IdleState::Active)
        {
            for pool in std::iter::once(&lb).chain(rollout.as_ref()) {
                if policy.recheck_targets {
                    pool.start_health_checks_for_life(ProbeMode::Deploy);
                } else {
                    pool.start_health_checks(ProbeMode::Deploy);
                }
            }
        }
        Ok(service)
    }
}
