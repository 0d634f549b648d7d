//! Scale-to-zero wiring: the idle controller a service's options ask for, and the hooks
//! through which it suspends and resumes the service's pool and asks for a save.

use std::sync::{Arc, Weak};
use tokio::sync::Notify;

use super::Router;
use crate::balancer::target::container_ref;
use crate::options::ServiceOptions;
use crate::service::Service;
use crate::service::sleep::{IdleController, IdleState, SleepConfig, SleepHooks};

impl Router {
    /// Gives a service the idle controller its options ask for (or takes it away).
    pub(super) fn sync_sleep(
        self: &Arc<Self>,
        service: &Arc<Service>,
        options: &ServiceOptions,
        restored: IdleState,
    ) {
        let Some(lifecycle) = self.lifecycle.clone().filter(|_| options.sleep_enabled()) else {
            service.set_sleep_controller(None);
            return;
        };
        // With a selector the containers are looked up at each transition.
        let containers = if !options.sleep_labels.is_empty() {
            Vec::new()
        } else if options.sleep_containers.is_empty() {
            let mut refs: Vec<String> = Vec::new();
            for t in service.active().writer_addresses() {
                if let Ok(r) = container_ref(&t) {
                    if !refs.iter().any(|x| x == r) {
                        refs.push(r.to_string());
                    }
                }
            }
            refs
        } else {
            options.sleep_containers.clone()
        };
        let config = SleepConfig {
            sleep_after: options.sleep_after.to_std(),
            freeze_after: options.freeze_after.to_std(),
            wake_timeout: options.wake_timeout.to_std(),
            containers,
            selector: options.sleep_labels.clone(),
        };
        match service.sleep_controller() {
            Some(c) => c.reconfigure(config),
            None => {
                let hooks = Arc::new(PoolHooks {
                    service: Arc::downgrade(service),
                    persist: self.persist.clone(),
                });
                let c = IdleController::new(
                    service.name.to_string(),
                    config,
                    lifecycle,
                    hooks,
                    restored,
                );
                service.set_sleep_controller(Some(c));
            }
        }
    }

    /// The idle state a deploy leaves behind: awake, when this proxy can sleep it.
    pub(super) fn idle_state_after_deploy(&self, options: &ServiceOptions) -> String {
        if self.lifecycle.is_some() && options.sleep_enabled() {
            IdleState::Active.as_str().to_string()
        } else {
            String::new()
        }
    }
}

/// What the idle controller needs from the service's pool and the router.
struct PoolHooks {
    service: Weak<Service>,
    persist: Arc<Notify>,
}

impl SleepHooks for PoolHooks {
    fn suspend(&self) {
        if let Some(s) = self.service.upgrade() {
            s.active().suspend();
        }
    }

    fn resume_until_ready(
        &self,
        deadline: tokio::time::Instant,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ()>> + Send + '_>> {
        Box::pin(async move {
            let Some(lb) = self.service.upgrade().map(|s| s.active()) else {
                return Err(());
            };
            lb.resume();
            lb.wait_until_serving(deadline).await
        })
    }

    fn persist(&self) {
        self.persist.notify_one();
    }
}
