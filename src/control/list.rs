//! `kamal-proxy list`: what the control socket reports about each service.

use std::sync::Arc;

use super::{ListResponse, ServiceDescription};
use crate::service::Service;

/// The fork's `list --json` shape (F32), extended only by added keys.
pub fn describe(services: impl IntoIterator<Item = Arc<Service>>) -> ListResponse {
    let mut out = ListResponse::default();
    for s in services {
        out.services.insert(s.name.to_string(), description(&s));
    }
    out
}

fn description(s: &Service) -> ServiceDescription {
    let config = s.config();
    let lb = s.active();
    let o = &config.options;
    // Weighted targets as the fork lists them, `web:80;weight=5` (a weight of 1 is the
    // bare address, so unweighted services list as upstream's).
    let specs = |v: Vec<crate::balancer::spec::TargetSpec>| -> Vec<String> {
        v.iter().map(ToString::to_string).collect()
    };
    let writers = specs(lb.writer_specs());
    let readers = specs(lb.reader_specs());
    let sleep = s.sleep_controller();
    let rollout = s.rollout();
    let split = s.rollout_split();
    ServiceDescription {
        host: if o.has_configured_hosts() {
            o.hosts.join(",")
        } else {
            "*".into()
        },
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
        // As the fork fills it: every target of the rollout pool, writers then readers
        // (like `target` for the active pool).
        rollout_targets: rollout
            .as_ref()
            .map(|p| {
                let mut all = specs(p.writer_specs());
                all.extend(specs(p.reader_specs()));
                all
            })
            .unwrap_or_default(),
        rollout_reader_targets: rollout
            .as_ref()
            .map(|p| specs(p.reader_specs()))
            .unwrap_or_default(),
        rollout_percentage: split.as_ref().map(|s| s.percentage),
        rollout_allowlist: split.map(|s| s.allowlist.clone()).unwrap_or_default(),
        sleep_state: sleep
            .as_ref()
            .map_or("off", |c| c.state().as_str())
            .to_string(),
        asleep_seconds: sleep
            .as_ref()
            .and_then(|c| c.asleep_for())
            .map(|d| d.as_secs()),
        sleep_containers: sleep.map(|c| c.containers()).unwrap_or_default(),
    }
}
