//! The host + path → service table. Built whole on every change and published through an
//! `ArcSwap`, so a request looks it up without taking a lock.

use std::collections::HashMap;
use std::sync::Arc;

use crate::service::Service;
use crate::uri::normalize_host;

type Bindings = Vec<(Arc<str>, Arc<Service>)>;

#[derive(Default)]
pub struct RouteTable {
    /// Exact hosts → bindings sorted by prefix length, longest first.
    exact: HashMap<String, Bindings>,
    /// `*.example.com` stored under `.example.com`, so a lookup borrows the request's
    /// host suffix instead of building a key.
    wildcard: HashMap<String, Bindings>,
    /// Services deployed without a host.
    default: Option<Bindings>,
}

impl RouteTable {
    pub fn build<'a>(services: impl Iterator<Item = &'a Arc<Service>>) -> RouteTable {
        let mut table = RouteTable::default();
        for service in services {
            let config = service.config();
            for host in &config.options.hosts {
                let bindings = if host.is_empty() {
                    table.default.get_or_insert_with(Vec::new)
                } else if let Some(suffix) = host.strip_prefix('*') {
                    table.wildcard.entry(suffix.to_string()).or_default()
                } else {
                    table.exact.entry(host.clone()).or_default()
                };
                for prefix in &config.options.path_prefixes {
                    bindings.push((Arc::from(prefix.as_str()), service.clone()));
                }
            }
        }
        let sort = |b: &mut Bindings| {
            b.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)))
        };
        table.exact.values_mut().for_each(sort);
        table.wildcard.values_mut().for_each(sort);
        if let Some(b) = table.default.as_mut() {
            sort(b);
        }
        table
    }

    /// Exact host first; only if there is none, `*.` + the host after its first dot; only
    /// if neither exists, the default host. No fall-through once a host entry is chosen.
    fn bindings_for(&self, host: &str) -> Option<&Bindings> {
        if let Some(b) = self.exact.get(host) {
            return Some(b);
        }
        if let Some(b) = host
            .find('.')
            .and_then(|dot| self.wildcard.get(&host[dot..]))
        {
            return Some(b);
        }
        self.default.as_ref()
    }

    /// The service for a request and the prefix it matched. Hosts are deployed
    /// normalized; the request's is normalized here, so `App.Test.` finds `app.test`.
    pub fn lookup(&self, host: &str, path: &str) -> Option<(&Arc<Service>, &Arc<str>)> {
        let bindings = self.bindings_for(&normalize_host(host))?;
        bindings
            .iter()
            .find(|(prefix, _)| prefix_matches(prefix, path))
            .map(|(prefix, s)| (s, prefix))
    }

    /// Every service bound in the table, possibly more than once.
    pub fn all_services(&self) -> Vec<Arc<Service>> {
        self.exact
            .values()
            .chain(self.wildcard.values())
            .chain(self.default.iter())
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
