//! Deploy and remove. A deploy is checked completely before anything happens — no
//! container is woken and no health check runs for a deploy that is then refused — and
//! saved before it is published.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::Router;
use super::persist::{snapshot, snapshots};
use super::state::ServiceState;
use crate::balancer::affinity::PinKey;
use crate::balancer::spec::TargetSpec;
use crate::balancer::target::container_ref;
use crate::balancer::{LoadBalancer, ProbeMode};
use crate::lifecycle::LifecycleError;
use crate::options::{DeploymentOptions, ServiceOptions, TargetOptions};
use crate::service::pause::PauseController;
use crate::service::sleep::{IdleState, InFlight, labels};
use crate::service::{Service, ServiceConfig};

/// How long the deploy preflight may spend inspecting containers, in all.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(10);

/// A deploy, as the CLI sends it over the control socket.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeployArgs {
    pub service: String,
    pub targets: Vec<String>,
    #[serde(default)]
    pub readers: Vec<String>,
    pub deployment: DeploymentOptions,
    pub service_options: ServiceOptions,
    pub target_options: TargetOptions,
    /// The sleep flags given on the command line (by name, e.g. `sleep-after`), even at
    /// their zero value: those win over container labels (see `service::sleep::labels`).
    #[serde(default)]
    pub sleep_flags: Vec<String>,
}

/// A deploy that passed every check; nothing has happened yet.
struct Checked {
    name: String,
    targets: Vec<String>,
    deployment: DeploymentOptions,
    options: ServiceOptions,
    target_options: TargetOptions,
    config: ServiceConfig,
    lb: Arc<LoadBalancer>,
}

impl Router {
    pub async fn deploy(self: &Arc<Self>, args: DeployArgs) -> Result<(), String> {
        // Before anything else: a deploy here would wake containers and probe targets
        // only to be refused at the save.
        if self.store.is_retired() {
            return Err(super::persist::RETIRED.into());
        }
        let Checked {
            name,
            targets,
            deployment,
            options,
            target_options,
            config,
            lb,
        } = self.check(args).await?;

        let existing = self.services.lock().await.get(&name).cloned();
        let _keep_awake = keep_awake(existing.as_deref(), "deploy").await?;

        let fields = deploy_log_fields(&targets, &options.hosts, &options.path_prefixes);
        tracing::info!(service = %name, json_fields = fields.as_str(), tls = options.tls_enabled, "Deploying");
        lb.start_health_checks(ProbeMode::Deploy);
        if !deployment.force {
            let timeout = deployment.deploy_timeout.to_std();
            if lb.wait_until_healthy(timeout).await.is_err() {
                lb.stop_health_checks();
                return Err(format!(
                    "target failed to become healthy within configured timeout ({})",
                    deployment.deploy_timeout
                ));
            }
        }

        let replaced = {
            let mut services = self.services.lock().await;
            // Checked before, and again: another deploy may have taken the hosts since.
            if let Err(e) = refuse_conflict(&services, &name, &options) {
                lb.stop_health_checks();
                return Err(e);
            }
            let deployed = ServiceState::new(
                &name,
                options.clone(),
                target_options,
                &lb,
                services
                    .get(&name)
                    .map(|s| s.pause.snapshot())
                    .unwrap_or_default(),
                self.idle_state_after_deploy(&options),
            )
            // A deploy replaces the active pool only; the rollout stays (upstream).
            .with_rollout(
                services.get(&name).and_then(|s| s.rollout()).as_deref(),
                services
                    .get(&name)
                    .and_then(|s| s.rollout_split())
                    .as_deref(),
            );
            if let Err(e) = self.store.save(snapshots(&services, Some(deployed))).await {
                lb.stop_health_checks();
                tracing::error!(service = %name, error = %e, "Deploy refused: state not saved");
                return Err(e);
            }
            let replaced = match services.get(&name) {
                Some(existing) => {
                    let mut config = config;
                    config.succeed(&existing.config());
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
            old.drain(deployment.drain_timeout.to_std()).await;
        }
        tracing::info!(service = %name, json_fields = fields.as_str(), tls = options.tls_enabled, "Deployed");
        Ok(())
    }

    /// Every check a deploy must pass, in the order a user would fix them. It reads
    /// (container labels, certificate files) but changes nothing.
    async fn check(&self, args: DeployArgs) -> Result<Checked, String> {
        check_request(&args)?;
        let DeployArgs {
            service: name,
            targets,
            readers,
            deployment,
            service_options: mut options,
            target_options,
            sleep_flags,
        } = args;
        // Parsed once more (the request was checked): weights apart from addresses, which
        // are what names containers.
        let writers = TargetSpec::parse_all(&targets)?;
        let reader_specs = TargetSpec::parse_all(&readers)?;
        let addresses = |specs: &[TargetSpec]| -> Vec<String> {
            specs.iter().map(|s| s.address.clone()).collect()
        };
        let writer_addresses = addresses(&writers);
        self.apply_sleep_labels(
            &name,
            &mut options,
            &sleep_flags,
            &writer_addresses,
            &addresses(&reader_specs),
        )
        .await?;
        options.validate_complete()?;
        options.normalize();
        if options.sleep_enabled() {
            self.sleep_preflight(&options, &writer_addresses).await?;
        }
        let mut config = ServiceConfig::build(&name, options.clone(), target_options.clone())?;
        config.tls = options
            .cert_request()
            .map(|req| self.tls().source_for(&req))
            .transpose()?;
        let pin_key = {
            let services = self.services.lock().await;
            refuse_conflict(&services, &name, &options)?;
            // A redeploy keeps the service's session affinity key, so a client pinned to
            // a target that stays is still pinned to it (fork F17 re-pins everyone).
            services.get(&name).map(|s| s.active().pin_key().clone())
        };
        let pin_key = match pin_key {
            Some(key) => key,
            None => PinKey::generate()?,
        };
        let lb = LoadBalancer::new(
            &name,
            &writers,
            &reader_specs,
            pin_key,
            target_options.health_check_config.clone(),
            self.probe_client.clone(),
        )?;
        Ok(Checked {
            name,
            targets,
            deployment,
            options,
            target_options,
            config,
            lb,
        })
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
        let deadline = tokio::time::Instant::now() + PREFLIGHT_TIMEOUT;
        if !options.sleep_labels.is_empty() {
            // Containers are looked up at each transition; the targets may be addresses.
            let labels = options.sleep_labels.join(",");
            let listed =
                tokio::time::timeout_at(deadline, lifecycle.list(&options.sleep_labels)).await;
            return match listed {
                Ok(Ok(found)) if found.is_empty() => Err(format!(
                    "no container has the labels {labels}; check --sleep-label against `docker ps -a --filter label=...`"
                )),
                Ok(Ok(_)) => Ok(()),
                Ok(Err(LifecycleError::Forbidden(_))) => {
                    tracing::warn!(labels = %labels, "Cannot verify --sleep-label; the socket denies listing containers");
                    Ok(())
                }
                Ok(Err(e)) => Err(format!(
                    "cannot list the containers labelled {labels} for --sleep-label: {e}"
                )),
                Err(_) => Err(format!(
                    "cannot list the containers labelled {labels} for --sleep-label: timed out"
                )),
            };
        }
        let refs = if options.sleep_containers.is_empty() {
            targets
                .iter()
                .map(|t| container_ref(t).map(str::to_string))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("target does not name a container: {e}"))?
        } else {
            options.sleep_containers.clone()
        };
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
        for pool in service.pools() {
            pool.stop_health_checks();
        }
        tracing::info!(service = %name, "Removed");
        Ok(())
    }
}

/// A sleeping service's containers are stopped: a deploy or rollout wakes it first so the
/// new targets can pass their health checks, and keeps it awake (counted in flight) until
/// it is over so it cannot fall asleep halfway.
pub(super) async fn keep_awake(
    service: Option<&Service>,
    what: &str,
) -> Result<Option<InFlight>, String> {
    let Some(c) = service.and_then(|s| s.sleep_controller()) else {
        return Ok(None);
    };
    if c.state() != IdleState::Active {
        tracing::info!(service = %service.map_or("", |s| &s.name), "Waking sleeping service for {what}");
    }
    c.admit()
        .await
        .map(Some)
        .map_err(|e| format!("unable to wake service for {what}: {e}"))
}

/// The checks that need nothing but the request itself.
fn check_request(args: &DeployArgs) -> Result<(), String> {
    crate::options::validate_service_name(&args.service)?;
    for target in args.targets.iter().chain(&args.readers) {
        TargetSpec::parse(target)?;
    }
    crate::service::validate(&args.service_options, &args.target_options)
}

/// Refuses options that bind a (host, path prefix) pair another service already has.
fn refuse_conflict(
    services: &BTreeMap<String, Arc<Service>>,
    name: &str,
    options: &ServiceOptions,
) -> Result<(), String> {
    let taken = services.iter().find(|(other_name, other)| {
        *other_name != name && claims_same_route(options, &other.config().options)
    });
    match taken {
        Some((other, _)) => {
            tracing::error!(service = %name, other = %other, "Host settings conflict with another service");
            Err("host settings conflict with another service".into())
        }
        None => Ok(()),
    }
}

/// Whether two services would answer the same host and path prefix.
fn claims_same_route(a: &ServiceOptions, b: &ServiceOptions) -> bool {
    a.hosts
        .iter()
        .any(|h| b.hosts.contains(h) && a.path_prefixes.iter().any(|p| b.path_prefixes.contains(p)))
}

/// `targets`, `hosts` and `paths` as slog writes Go's `[]string` attributes: JSON arrays.
fn deploy_log_fields(targets: &[String], hosts: &[String], paths: &[String]) -> String {
    let mut out = String::new();
    for (i, (key, values)) in [("targets", targets), ("hosts", hosts), ("paths", paths)]
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            out.push(',');
        }
        crate::observe::log::json_string_list_member(&mut out, key, values);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(hosts: &[&str], prefixes: &[&str]) -> ServiceOptions {
        let mut o = ServiceOptions {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            path_prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
            ..ServiceOptions::default()
        };
        o.normalize();
        o
    }

    fn request(targets: &[&str]) -> DeployArgs {
        DeployArgs {
            service: "app".into(),
            targets: targets.iter().map(|t| t.to_string()).collect(),
            readers: vec![],
            deployment: DeploymentOptions::default(),
            service_options: ServiceOptions::default(),
            target_options: TargetOptions::default(),
            sleep_flags: vec![],
        }
    }

    #[test]
    fn routes_conflict_only_on_a_shared_host_and_prefix() {
        let a = options(&["a.test"], &["/"]);
        assert!(claims_same_route(&a, &options(&["a.test"], &["/"])));
        assert!(claims_same_route(
            &a,
            &options(&["b.test", "a.test"], &["/api", "/"])
        ));
        assert!(!claims_same_route(&a, &options(&["b.test"], &["/"])));
        assert!(!claims_same_route(&a, &options(&["a.test"], &["/api"])));
    }

    #[test]
    fn a_request_is_checked_before_anything_happens() {
        assert!(check_request(&request(&["web:3000"])).is_ok());
        let mut nameless = request(&["web:3000"]);
        nameless.service.clear();
        assert_eq!(
            check_request(&nameless).unwrap_err(),
            "service name must not be empty"
        );
        assert!(check_request(&request(&["web:3000:extra"])).is_err());
        assert!(check_request(&request(&["web:notaport"])).is_err());
        assert!(check_request(&request(&["web:3000;weight=5"])).is_ok());
        assert_eq!(
            check_request(&request(&["web:3000;weight=0"])).unwrap_err(),
            "invalid target weight: 0 is outside 1-1000"
        );
    }
}
