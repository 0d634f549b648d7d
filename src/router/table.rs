//! The host + path → service table. Built whole on every change and published through an
//! `ArcSwap`, so a request looks it up without taking a lock.

use std::collections::HashMap;
use std::sync::Arc;

use crate::service::Service;

#[derive(Default)]
pub struct RouteTable {
    /// Host (as deployed: exact, `*.domain`, or `""` for the default) → bindings sorted
    /// by prefix length, longest first.
    hosts: HashMap<String, Vec<(String, Arc<Service>)>>,
}

impl RouteTable {
    pub fn build<'a>(services: impl Iterator<Item = &'a Arc<Service>>) -> RouteTable {
        let mut hosts: HashMap<String, Vec<(String, Arc<Service>)>> = HashMap::new();
        for service in services {
            let config = service.config();
            for host in &config.options.hosts {
                for prefix in &config.options.path_prefixes {
                    hosts
                        .entry(host.clone())
                        .or_default()
                        .push((prefix.clone(), service.clone()));
                }
            }
        }
        for bindings in hosts.values_mut() {
            bindings.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        }
        RouteTable { hosts }
    }

    /// Exact host first; only if there is none, `*.` + the host after its first dot; only
    /// if neither exists, the default host. No fall-through once a host entry is chosen.
    fn bindings_for(&self, host: &str) -> Option<&Vec<(String, Arc<Service>)>> {
        if let Some(b) = self.hosts.get(host) {
            return Some(b);
        }
        if let Some(dot) = host.find('.') {
            let wildcard = format!("*{}", &host[dot..]);
            if let Some(b) = self.hosts.get(&wildcard) {
                return Some(b);
            }
        }
        self.hosts.get("")
    }

    /// The service for a request and the prefix it matched.
    pub fn lookup(&self, host: &str, path: &str) -> Option<(&Arc<Service>, &str)> {
        let bindings = self.bindings_for(host)?;
        bindings
            .iter()
            .find(|(prefix, _)| prefix_matches(prefix, path))
            .map(|(prefix, s)| (s, prefix.as_str()))
    }

    /// Every service bound in the table, possibly more than once.
    pub fn all_services(&self) -> Vec<Arc<Service>> {
        self.hosts
            .values()
            .flat_map(|b| b.iter().map(|(_, s)| s.clone()))
            .collect()
    }

    /// The service answering for a host at the root path (TLS lookups and inheritance).
    pub fn service_for_host(&self, host: &str) -> Option<&Arc<Service>> {
        self.lookup(host, "/").map(|(s, _)| s)
    }
}

/// Segment-boundary prefix match: `/api` matches `/api`, `/api/` and `/api/x`, not
/// `/apiary`.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_boundaries() {
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/"));
        assert!(prefix_matches("/api", "/api/x"));
        assert!(!prefix_matches("/api", "/apiary"));
        assert!(prefix_matches("/", "/anything"));
    }
}
