//! Service names, hosts, path prefixes, on-demand URLs.
#![no_main]

use kamal_proxy::options::{
    ServiceOptions, normalize_prefix, validate_on_demand_url, validate_service_name,
};
use kamal_proxy::router::table::prefix_matches;
use kamal_proxy::uri::{host_without_port, routed_path};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, &str)| {
    let (text, path) = input;
    let _ = validate_service_name(text);
    let options = ServiceOptions {
        hosts: vec![text.to_string()],
        canonical_host: path.to_string(),
        ..Default::default()
    };
    let _ = options.validate();
    let _ = validate_on_demand_url(text);
    let _ = host_without_port(text);
    let prefix = normalize_prefix(text);
    assert!(prefix.starts_with('/'));
    assert_eq!(normalize_prefix(&prefix), prefix);
    if prefix_matches(&prefix, path) {
        let _ = routed_path(path, &prefix, true);
    }
});
