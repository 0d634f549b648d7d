//! The router: which service answers a request (lock-free, through an `ArcSwap` route
//! table), and the control-plane operations that change services, one job per file:
//!
//! - `table`: the published (host, path prefix) → service lookup;
//! - `deploy`: deploy and remove, every check made before anything happens;
//! - `maintenance`: pause, stop and resume (`kamal app maintenance` / `live`);
//! - `rollout`: the second pool and the split of requests onto it;
//! - `restore`: the services of the state file, brought back at start-up;
//! - `persist` and `state`: the state file, saved before a change is published;
//! - `sleep`: the idle controller each scale-to-zero service gets;
//! - `tls`: certificate settings and the host rules TLS needs from the table.

use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use tokio::sync::{Mutex, Notify};

mod deploy;
mod maintenance;
pub mod persist;
mod restore;
mod rollout;
mod sleep;
pub mod state;
pub mod table;
mod tls;

pub use deploy::DeployArgs;
pub use rollout::RolloutDeployArgs;

use crate::balancer::health::{ProbeClient, probe_client};
use crate::lifecycle::ContainerLifecycle;
use crate::service::Service;
use crate::tls::TlsContext;
use persist::{StateStore, snapshots};
use table::RouteTable;

pub struct Router {
    table: ArcSwap<RouteTable>,
    /// Control-plane only: requests never touch this lock.
    services: Mutex<BTreeMap<String, Arc<Service>>>,
    store: StateStore,
    probe_client: ProbeClient,
    lifecycle: Option<Arc<dyn ContainerLifecycle>>,
    /// Nudged by idle controllers when a service falls asleep or wakes.
    persist: Arc<Notify>,
    /// Certificates: set by `run` from its ACME flags (see [`Router::configure_tls`]).
    tls: OnceLock<Arc<TlsContext>>,
}

impl Router {
    pub fn new(state_path: PathBuf, lifecycle: Option<Arc<dyn ContainerLifecycle>>) -> Arc<Router> {
        let router = Arc::new(Router {
            table: ArcSwap::from_pointee(RouteTable::default()),
            services: Mutex::new(BTreeMap::new()),
            store: StateStore::new(state_path),
            probe_client: probe_client(),
            lifecycle,
            persist: Arc::new(Notify::new()),
            tls: OnceLock::new(),
        });
        let weak = Arc::downgrade(&router);
        let persist = router.persist.clone();
        tokio::spawn(async move {
            loop {
                persist.notified().await;
                let Some(router) = weak.upgrade() else { return };
                let services = router.services.lock().await;
                // A sleep transition cannot be refused after the fact; say so loudly.
                if let Err(e) = router.store.save(snapshots(&services, None)).await {
                    tracing::error!(error = %e, "Failed to save state");
                }
            }
        });
        router
    }

    /// The hot path: the service for a host and path, and the prefix it matched.
    pub fn lookup(&self, host: &str, path: &str) -> Option<(Arc<Service>, Arc<str>)> {
        let table = self.table.load();
        table
            .lookup(host, path)
            .map(|(s, prefix)| (s.clone(), prefix.clone()))
    }

    /// Every service, by name. `try_lock` keeps `list` answering during a long deploy:
    /// the services are then read from the published route table instead.
    pub fn services(&self) -> Vec<Arc<Service>> {
        match self.services.try_lock() {
            Ok(s) => s.values().cloned().collect(),
            Err(_) => {
                let mut by_name = BTreeMap::new();
                for s in self.table.load().all_services() {
                    by_name.insert(s.name.clone(), s);
                }
                by_name.into_values().collect()
            }
        }
    }

    pub fn state_path(&self) -> &std::path::Path {
        self.store.path()
    }

    /// Makes `services` the table requests are routed by.
    fn publish(&self, services: &BTreeMap<String, Arc<Service>>) {
        let table = RouteTable::build(services.values());
        tls::inherit_tls_settings(&table, services);
        self.table.store(Arc::new(table));
    }

    /// Graceful shutdown: stop probing so no task outlives the listeners.
    pub async fn shutdown(&self) {
        let services = self.services.lock().await;
        for pool in services.values().flat_map(|s| s.pools()) {
            pool.stop_health_checks();
        }
    }
}
