//! The router: which service answers a request (lock-free, through an `ArcSwap` route
//! table), and the control-plane operations that change services (deploy, remove, pause,
//! stop, resume), each saved to the state file before it is published (see `persist`).

use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::{Mutex, Notify};

pub mod persist;
pub mod state;
pub mod table;

use crate::balancer::health::{ProbeClient, probe_client};
use crate::balancer::{LoadBalancer, ProbeMode};
use crate::control::{DeployArgs, ListResponse, ServiceDescription};
use crate::gotime;
use crate::lifecycle::{ContainerLifecycle, LifecycleError};
use crate::service::options::{ServiceOptions, container_ref, validate_target};
use crate::service::pause::PauseController;
use crate::service::sleep::{IdleController, IdleState, SleepConfig, SleepHooks, labels};
use crate::service::{Service, ServiceConfig};
use crate::tls::TlsContext;
use persist::StateStore;
use state::{LoadError, ServiceState};
use table::RouteTable;

/// How long the deploy preflight may spend inspecting containers, in all.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// Sets the process-wide ACME settings; call once, before `restore`.
    pub fn configure_tls(self: &Arc<Self>, acme_directory: String, acme_email: Option<String>) {
        let weak = Arc::downgrade(self);
        let still_wanted =
            Arc::new(move |host: &str| weak.upgrade().is_some_and(|r| r.serves_acme_host(host)));
        let _ = self
            .tls
            .set(TlsContext::new(acme_directory, acme_email, still_wanted));
    }

    pub fn tls(&self) -> &Arc<TlsContext> {
        self.tls.get_or_init(|| {
            TlsContext::new(
                crate::tls::cache::LETS_ENCRYPT_PRODUCTION.into(),
                None,
                Arc::new(|_: &str| true),
            )
        })
    }

    /// Whether a host is still served with an ACME certificate (renewal goes on only then).
    fn serves_acme_host(&self, host: &str) -> bool {
        let Some((service, _)) = self.lookup(host, "/") else {
            return false;
        };
        let config = service.config();
        match config.tls.as_deref() {
            Some(crate::tls::CertSource::Acme {
                hosts, on_demand, ..
            }) => config.options.tls_enabled && (on_demand.is_some() || hosts.contains(host)),
            _ => false,
        }
    }

    /// Used for handshakes without SNI: the first host of a TLS service that lists hosts
    /// (the first such service by name, so the choice is stable).
    pub fn default_tls_hostname(&self) -> Option<String> {
        let table = self.table.load();
        let mut candidates: Vec<(Arc<str>, String)> = table
            .all_services()
            .into_iter()
            .filter_map(|s| {
                let config = s.config();
                let o = &config.options;
                let first = o.hosts.first().filter(|h| !h.is_empty())?;
                (o.tls_enabled && o.tls_on_demand_url.is_empty() && o.serves_root())
                    .then(|| (s.name.clone(), first.clone()))
            })
            .collect();
        candidates.sort();
        candidates.into_iter().next().map(|(_, host)| host)
    }

    pub fn state_path(&self) -> &std::path::Path {
        self.store.path()
    }

    /// Restores the state file before any listener opens. A corrupt file is set aside
    /// and the proxy starts empty; a file that cannot be read at all is an error (starting
    /// empty would overwrite it at the next deploy).
    pub async fn restore(self: &Arc<Self>) -> Result<(), String> {
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
            match self.restore_service(s) {
                Ok(service) => {
                    restored.insert(s.name.clone(), service);
                }
                Err(e) => {
                    for service in restored.values() {
                        service.set_sleep_controller(None);
                        service.active().stop_health_checks();
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

    fn restore_service(self: &Arc<Self>, s: &ServiceState) -> Result<Arc<Service>, String> {
        let mut config =
            ServiceConfig::build(&s.name, s.options.clone(), s.target_options.clone())?;
        config.tls = self.tls().source_for(&s.options)?;
        let lb = LoadBalancer::new(
            &s.name,
            &s.active_targets,
            &s.active_readers,
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
        if s.options.sleep_enabled() && self.lifecycle.is_none() {
            tracing::warn!(service = %s.name, "Service has --sleep-after but the proxy runs without --docker-socket; it will not sleep");
        }
        self.sync_sleep(&service, &s.options, restored_idle);
        if service
            .sleep_controller()
            .is_none_or(|c| c.state() == IdleState::Active)
        {
            lb.start_health_checks(ProbeMode::Deploy);
        }
        Ok(service)
    }

    pub async fn deploy(self: &Arc<Self>, args: DeployArgs) -> Result<(), String> {
        let DeployArgs {
            service: name,
            targets,
            readers,
            deployment,
            service_options,
            target_options,
            sleep_flags,
        } = args;
        // Everything is checked before anything happens: no wake, no health check.
        if name.is_empty() {
            return Err("service name must not be empty".into());
        }
        for target in targets.iter().chain(&readers) {
            validate_target(target)?;
        }
        service_options.validate()?;
        target_options.validate()?;
        crate::service::gates::validate_health_check(&service_options, &target_options)?;
        let mut options = service_options;
        self.apply_sleep_labels(&name, &mut options, &sleep_flags, &targets, &readers)
            .await?;
        options.validate_complete()?;
        options.normalize();
        if options.sleep_enabled() {
            self.sleep_preflight(&options, &targets).await?;
        }
        // A sleeping service's containers are stopped: wake it first so the new targets
        // can pass their health checks, and keep it awake (counted in flight) until the
        // deploy is over so it cannot fall asleep halfway.
        let existing = self.services.lock().await.get(&name).cloned();
        let _keep_awake = match existing.and_then(|s| s.sleep_controller()) {
            Some(c) => {
                if c.state() != IdleState::Active {
                    tracing::info!(service = %name, "Waking sleeping service for deploy");
                }
                Some(
                    c.admit()
                        .await
                        .map_err(|e| format!("unable to wake service for deploy: {e}"))?,
                )
            }
            None => None,
        };

        let lb = LoadBalancer::new(
            &name,
            &targets,
            &readers,
            target_options.health_check_config.clone(),
            self.probe_client.clone(),
        )?;
        tracing::info!(service = %name, targets = %targets.join(","), hosts = %options.hosts.join(","), paths = %options.path_prefixes.join(","), tls = options.tls_enabled, "Deploying");
        lb.start_health_checks(ProbeMode::Deploy);
        if !deployment.force {
            let timeout = gotime::to_std(deployment.deploy_timeout);
            if lb.wait_until_healthy(timeout).await.is_err() {
                lb.stop_health_checks();
                return Err(format!(
                    "target failed to become healthy within configured timeout ({})",
                    gotime::format_duration(deployment.deploy_timeout)
                ));
            }
        }

        let replaced = {
            let mut services = self.services.lock().await;
            if let Some(other) = conflicting_service(&services, &name, &options) {
                tracing::error!(service = %name, other = %other, "Host settings conflict with another service");
                lb.stop_health_checks();
                return Err("host settings conflict with another service".into());
            }
            let built = ServiceConfig::build(&name, options.clone(), target_options.clone())
                .and_then(|mut c| {
                    c.tls = self.tls().source_for(&options)?;
                    Ok(c)
                });
            let config = match built {
                Ok(c) => c,
                Err(e) => {
                    lb.stop_health_checks();
                    return Err(e);
                }
            };
            let deployed = ServiceState::new(
                &name,
                options.clone(),
                target_options.clone(),
                &lb,
                services
                    .get(&name)
                    .map(|s| s.pause.snapshot())
                    .unwrap_or_default(),
                self.idle_state_after_deploy(&options),
            );
            if let Err(e) = self.store.save(snapshots(&services, Some(deployed))).await {
                lb.stop_health_checks();
                tracing::error!(service = %name, error = %e, "Deploy refused: state not saved");
                return Err(e);
            }
            let replaced = match services.get(&name) {
                Some(existing) => {
                    existing.set_config(config);
                    Some(existing.swap_active(lb))
                }
                None => {
                    let service =
                        Arc::new(Service::new(&name, config, lb, PauseController::default()));
                    services.insert(name.clone(), service);
                    None
                }
            };
            if let Some(service) = services.get(&name) {
                self.sync_sleep(service, &options, IdleState::Active);
            }
            self.publish(&services);
            replaced
        };
        if let Some(old) = replaced {
            old.stop_health_checks();
            old.drain(gotime::to_std(deployment.drain_timeout)).await;
        }
        tracing::info!(service = %name, targets = %targets.join(","), hosts = %options.hosts.join(","), paths = %options.path_prefixes.join(","), tls = options.tls_enabled, "Deployed");
        Ok(())
    }

    /// Fills the sleep settings the command line left unset from the containers' labels
    /// (`kamal-proxy.sleep-after`, …), when this proxy can manage containers at all.
    async fn apply_sleep_labels(
        &self,
        name: &str,
        options: &mut ServiceOptions,
        given: &[String],
        targets: &[String],
        readers: &[String],
    ) -> Result<(), String> {
        let Some(lifecycle) = &self.lifecycle else {
            return Ok(());
        };
        let unset = labels::unset_flags(options, given);
        if unset.is_empty() {
            return Ok(());
        }
        let all_targets: Vec<String> = targets.iter().chain(readers).cloned().collect();
        let sources = labels::label_sources(options, &all_targets);
        let deadline = tokio::time::Instant::now() + PREFLIGHT_TIMEOUT;
        let applied =
            labels::apply_labels(lifecycle.as_ref(), &sources, &unset, options, deadline).await?;
        if !applied.is_empty() {
            tracing::info!(service = %name, labels = %applied.join(","), "Sleep settings from container labels");
        }
        Ok(())
    }

    /// Refuses a `--sleep-after` deploy whose containers this proxy could not manage.
    async fn sleep_preflight(
        &self,
        options: &ServiceOptions,
        targets: &[String],
    ) -> Result<(), String> {
        let Some(lifecycle) = &self.lifecycle else {
            return Err("scale-to-zero requires the proxy to run with --docker-socket".into());
        };
        let refs = if options.sleep_containers.is_empty() {
            targets
                .iter()
                .map(|t| container_ref(t).map(str::to_string))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("target does not name a container: {e}"))?
        } else {
            options.sleep_containers.clone()
        };
        let deadline = tokio::time::Instant::now() + PREFLIGHT_TIMEOUT;
        for r in &refs {
            let inspected = tokio::time::timeout_at(deadline, lifecycle.inspect(r)).await;
            match inspected {
                Ok(Ok(_)) => {}
                Ok(Err(LifecycleError::NotFound(_))) => {
                    return Err(format!(
                        "target does not name a container: no container named \"{r}\"; if the target names a network alias rather than a container, set --sleep-container"
                    ));
                }
                Ok(Err(LifecycleError::Forbidden(_))) => {
                    tracing::warn!(container = %r, "Cannot verify container for --sleep-after; the socket denies inspect");
                }
                Ok(Err(e)) => {
                    return Err(format!(
                        "cannot manage container \"{r}\" for --sleep-after: {e}"
                    ));
                }
                Err(_) => {
                    return Err(format!(
                        "cannot manage container \"{r}\" for --sleep-after: timed out"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Gives a service the idle controller its options ask for (or takes it away).
    fn sync_sleep(
        self: &Arc<Self>,
        service: &Arc<Service>,
        options: &ServiceOptions,
        restored: IdleState,
    ) {
        let Some(lifecycle) = self.lifecycle.clone().filter(|_| options.sleep_enabled()) else {
            service.set_sleep_controller(None);
            return;
        };
        let containers = if options.sleep_containers.is_empty() {
            let lb = service.active();
            let mut refs: Vec<String> = Vec::new();
            for t in lb.writer_addresses() {
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
            sleep_after: gotime::to_std(options.sleep_after),
            wake_timeout: gotime::to_std(options.wake_timeout),
            containers,
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

    pub async fn remove(&self, name: &str) -> Result<(), String> {
        let mut services = self.services.lock().await;
        if !services.contains_key(name) {
            return Err("service not found".into());
        }
        let remaining = services
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .map(|(_, s)| snapshot(s))
            .collect();
        self.store.save(remaining).await?;
        let Some(service) = services.remove(name) else {
            return Err("service not found".into());
        };
        self.publish(&services);
        service.set_sleep_controller(None);
        service.active().stop_health_checks();
        tracing::info!(service = %name, "Removed");
        Ok(())
    }

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

    pub fn list(&self) -> ListResponse {
        // `try_lock` keeps `list` answering during a long deploy; the snapshot is then
        // read from the published route table instead.
        let mut out = ListResponse::default();
        let services: Vec<Arc<Service>> = match self.services.try_lock() {
            Ok(s) => s.values().cloned().collect(),
            Err(_) => {
                let table = self.table.load();
                let mut seen = BTreeMap::new();
                for s in table_services(&table) {
                    seen.insert(s.name.to_string(), s);
                }
                seen.into_values().collect()
            }
        };
        for s in services {
            let config = s.config();
            let lb = s.active();
            let o = &config.options;
            let writers = lb.writer_addresses();
            let readers = lb.reader_addresses();
            let host = if o.has_configured_hosts() {
                o.hosts.join(",")
            } else {
                "*".into()
            };
            out.services.insert(
                s.name.to_string(),
                ServiceDescription {
                    host,
                    path: o.path_prefixes.join(","),
                    tls: o.tls_enabled,
                    target: writers
                        .iter()
                        .chain(readers.iter())
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(","),
                    state: s.state_name(),
                    hosts: o.hosts.iter().filter(|h| !h.is_empty()).cloned().collect(),
                    path_prefixes: o.path_prefixes.clone(),
                    targets: writers,
                    reader_targets: readers,
                    sleep_state: s
                        .sleep_controller()
                        .map_or("off", |c| c.state().as_str())
                        .to_string(),
                    sleep_containers: s
                        .sleep_controller()
                        .map(|c| c.containers())
                        .unwrap_or_default(),
                },
            );
        }
        out
    }

    fn publish(&self, services: &BTreeMap<String, Arc<Service>>) {
        let table = RouteTable::build(services.values());
        inherit_tls_settings(&table, services);
        self.table.store(Arc::new(table));
    }

    /// The idle state a deploy leaves behind: awake, when this proxy can sleep it.
    fn idle_state_after_deploy(&self, options: &ServiceOptions) -> String {
        if self.lifecycle.is_some() && options.sleep_enabled() {
            IdleState::Active.as_str().to_string()
        } else {
            String::new()
        }
    }

    /// Graceful shutdown: stop probing so no task outlives the listeners.
    pub async fn shutdown(&self) {
        let services = self.services.lock().await;
        for s in services.values() {
            s.active().stop_health_checks();
        }
    }
}

/// Upstream §3.4: a service that does not serve `/` takes its TLS settings from the
/// root-path service of its first host (or the defaults when there is none), so a
/// path-prefix service under a TLS host is redirected and served over HTTPS alike.
fn inherit_tls_settings(table: &RouteTable, services: &BTreeMap<String, Arc<Service>>) {
    for service in services.values() {
        let config = service.config();
        if config.options.serves_root() {
            continue;
        }
        let first = config.options.hosts.first().map_or("", String::as_str);
        let (tls, redirect) = table
            .service_for_host(first)
            .filter(|root| root.config().options.serves_root())
            .map_or((false, true), |root| {
                let o = &root.config().options;
                (o.tls_enabled, o.tls_redirect)
            });
        if config.options.tls_enabled != tls || config.options.tls_redirect != redirect {
            let mut updated = ServiceConfig::clone(&config);
            updated.deployed_tls = updated.deployed_tls.or(Some((
                config.options.tls_enabled,
                config.options.tls_redirect,
            )));
            updated.options.tls_enabled = tls;
            updated.options.tls_redirect = redirect;
            service.set_config(updated);
        }
    }
}

fn table_services(table: &RouteTable) -> Vec<Arc<Service>> {
    table.all_services()
}

fn snapshot(s: &Service) -> ServiceState {
    let config = s.config();
    ServiceState::new(
        &s.name,
        config.deployed_options(),
        config.target_options.clone(),
        &s.active(),
        s.pause.snapshot(),
        s.sleep_controller()
            .map(|c| c.state().to_string())
            .unwrap_or_default(),
    )
}

/// Every service as it would be saved, with `changed` in place of (or beside) the
/// service of the same name.
fn snapshots(
    services: &BTreeMap<String, Arc<Service>>,
    changed: Option<ServiceState>,
) -> Vec<ServiceState> {
    let mut states: Vec<ServiceState> = services
        .values()
        .filter(|s| changed.as_ref().is_none_or(|c| *c.name != *s.name))
        .map(|s| snapshot(s))
        .collect();
    if let Some(c) = changed {
        let at = states.partition_point(|s| s.name < c.name);
        states.insert(at, c);
    }
    states
}

/// The name of another service already bound to one of these (host, prefix) pairs.
fn conflicting_service(
    services: &BTreeMap<String, Arc<Service>>,
    name: &str,
    options: &ServiceOptions,
) -> Option<String> {
    for (other_name, other) in services {
        if other_name == name {
            continue;
        }
        let other = other.config();
        let clash = options.hosts.iter().any(|h| {
            other.options.hosts.contains(h)
                && options
                    .path_prefixes
                    .iter()
                    .any(|p| other.options.path_prefixes.contains(p))
        });
        if clash {
            return Some(other_name.clone());
        }
    }
    None
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
