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
            // The writers of the active pool, then of a live rollout pool: a sleeping
            // service with a rollout wakes the containers of both.
            let writers = service
                .live_pools()
                .iter()
                .flat_map(|p| p.writer_addresses())
                .collect::<Vec<_>>();
            for t in writers {
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
            for pool in s.pools() {
                pool.suspend();
            }
        }
    }

    fn resume_until_ready(
        &self,
        deadline: tokio::time::Instant,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ()>> + Send + '_>> {
        Box::pin(async move {
            let Some(service) = self.service.upgrade() else {
                return Err(());
            };
            for pool in service.pools() {
                pool.resume(deadline);
            }
            // Ready when every pool requests can reach can serve: a request the split
            // sends to the rollout must not meet a pool that is still starting.
            let live = service.live_pools();
            drop(service);
            let ready = live.iter().map(|p| p.wait_until_serving(deadline));
            futures_util::future::try_join_all(ready).await.map(|_| ())
        })
    }

    fn persist(&self) {
        self.persist.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::LoadBalancer;
    use crate::balancer::health::{HealthCheckConfig, probe_client};
    use crate::balancer::rollout::RolloutSplit;
    use crate::gotime::GoDuration;
    use crate::lifecycle::{ContainerInfo, ContainerLifecycle, LifecycleError, LifecycleFuture};
    use crate::options::TargetOptions;
    use crate::service::ServiceConfig;
    use crate::service::pause::PauseController;

    /// Never called: an active service starts and stops nothing.
    struct Unused;

    impl ContainerLifecycle for Unused {
        fn start<'a>(&'a self, c: &'a str) -> LifecycleFuture<'a, ()> {
            Box::pin(async move { Err(LifecycleError::NotFound(c.into())) })
        }
        fn stop<'a>(&'a self, c: &'a str, _: std::time::Duration) -> LifecycleFuture<'a, ()> {
            Box::pin(async move { Err(LifecycleError::NotFound(c.into())) })
        }
        fn inspect<'a>(&'a self, c: &'a str) -> LifecycleFuture<'a, ContainerInfo> {
            Box::pin(async move { Err(LifecycleError::NotFound(c.into())) })
        }
        fn freeze<'a>(&'a self, c: &'a str) -> LifecycleFuture<'a, ()> {
            Box::pin(async move { Err(LifecycleError::NotFound(c.into())) })
        }
        fn thaw<'a>(&'a self, c: &'a str) -> LifecycleFuture<'a, ()> {
            Box::pin(async move { Err(LifecycleError::NotFound(c.into())) })
        }
        fn list<'a>(
            &'a self,
            _: &'a [String],
        ) -> LifecycleFuture<'a, Vec<crate::lifecycle::ListedContainer>> {
            Box::pin(async { Ok(Vec::new()) })
        }
    }

    fn pool(writers: &[&str], readers: &[&str]) -> Arc<LoadBalancer> {
        let s = |v: &[&str]| {
            v.iter()
                .map(|x| crate::balancer::spec::TargetSpec::parse(x).unwrap())
                .collect::<Vec<_>>()
        };
        LoadBalancer::new(
            "app",
            &s(writers),
            &s(readers),
            crate::balancer::affinity::PinKey::generate().unwrap(),
            HealthCheckConfig::default(),
            probe_client(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_live_rollout_s_writers_sleep_and_wake_with_the_service() {
        let dir = tempfile::tempdir().unwrap();
        let router = Router::new(dir.path().join("state"), Some(Arc::new(Unused)));
        let options = ServiceOptions {
            sleep_after: GoDuration::from_secs(60),
            wake_timeout: GoDuration::from_secs(30),
            ..ServiceOptions::default()
        };
        let config =
            ServiceConfig::build("app", options.clone(), TargetOptions::default()).unwrap();
        let service = Arc::new(Service::new(
            "app",
            config,
            pool(&["web-1:80", "10.0.0.9:80"], &["replica:80"]),
            PauseController::default(),
        ));
        service.swap_rollout(Some(pool(
            &["web-new:80;weight=3", "web-1:80"],
            &["replica-new:80"],
        )));
        let containers = |s: &Service| s.sleep_controller().unwrap().containers();

        // No split: the rollout pool gets no traffic, its containers are left alone.
        router.sync_sleep(&service, &options, IdleState::Active);
        assert_eq!(containers(&service), ["web-1"]);
        // A split: the active writers, then the rollout's, once each; never readers or
        // addresses.
        service.set_rollout_split(Some(RolloutSplit::new(10, vec![])));
        router.sync_sleep(&service, &options, IdleState::Active);
        assert_eq!(containers(&service), ["web-1", "web-new"]);
        service.set_rollout_split(None);
        router.sync_sleep(&service, &options, IdleState::Active);
        assert_eq!(containers(&service), ["web-1"]);
    }
}
