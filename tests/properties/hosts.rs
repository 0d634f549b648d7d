//! Service names, hosts, path prefixes and the on-demand URL.

use kamal_proxy::options::{
    MAX_SERVICE_NAME, ServiceOptions, normalize_prefix, validate_on_demand_url,
    validate_service_name,
};
use kamal_proxy::router::table::prefix_matches;
use kamal_proxy::uri::{host_without_port, routed_path};
use proptest::prelude::*;

fn host_options(host: &str) -> ServiceOptions {
    ServiceOptions {
        hosts: vec![host.to_string()],
        ..Default::default()
    }
}

fn dns_name() -> impl Strategy<Value = String> {
    prop::collection::vec("[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", 1..5).prop_map(|l| l.join("."))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

    /// A service name is accepted exactly when it is 1 to 255 letters, digits, `-`, `_`
    /// or `.` (what `list`, logs and metric labels can carry unescaped).
    #[test]
    fn service_names(name in prop_oneof![
        any::<String>(),
        "[A-Za-z0-9._-]{1,20}",
        "[A-Za-z0-9._ /\u{1b}-]{0,8}",
        (250usize..260).prop_map(|n| "a".repeat(n)),
    ]) {
        let allowed = !name.is_empty()
            && name.len() <= MAX_SERVICE_NAME
            && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        prop_assert_eq!(validate_service_name(&name).is_ok(), allowed, "{:?}", name);
    }

    /// DNS names and `*.` wildcards of them are valid hosts.
    #[test]
    fn dns_hosts_are_accepted(name in dns_name(), wildcard in any::<bool>()) {
        let host = if wildcard { format!("*.{name}") } else { name };
        prop_assume!(host.len() <= 253);
        prop_assert_eq!(host_options(&host).validate(), Ok(()));
    }

    /// A host that can never match a Host header is refused, never panics.
    #[test]
    fn impossible_hosts_are_refused(name in dns_name(), junk in prop::sample::select(vec![' ', '\t', '\n', '/', '?', '#', '@', ',', '\u{7f}']), at in any::<prop::sample::Index>()) {
        let mut chars: Vec<char> = name.chars().collect();
        let i = at.index(chars.len() + 1);
        chars.insert(i, junk);
        let host: String = chars.into_iter().collect();
        prop_assert!(host_options(&host).validate().is_err(), "{:?}", host);
    }

    #[test]
    fn arbitrary_hosts_never_panic(host in any::<String>()) {
        let _ = host_options(&host).validate();
        let _ = host_without_port(&host);
    }

    /// `host:port` loses its port; a bracketed IPv6 literal keeps its brackets.
    #[test]
    fn ports_come_off_hosts(name in dns_name(), port in any::<u16>(), v6 in any::<std::net::Ipv6Addr>()) {
        let with_port = format!("{name}:{port}");
        prop_assert_eq!(host_without_port(&with_port), name.as_str());
        prop_assert_eq!(host_without_port(&name), name.as_str());
        let bracketed = format!("[{v6}]");
        let with_port = format!("{bracketed}:{port}");
        prop_assert_eq!(host_without_port(&with_port), bracketed.as_str());
    }

    /// A normalised prefix starts with `/`, has no trailing `/` (unless it is `/`), and
    /// normalising again changes nothing.
    #[test]
    fn prefixes_normalise_once(prefix in prop_oneof![any::<String>(), "[a-z/]{0,10}"]) {
        let p = normalize_prefix(&prefix);
        prop_assert!(p.starts_with('/'));
        prop_assert!(p == "/" || !p.ends_with('/'), "{:?}", p);
        prop_assert_eq!(normalize_prefix(&p), p.clone());
    }

    /// A prefix matches itself and every path below it, and the routed path the target
    /// sees always starts with `/`.
    #[test]
    fn prefixes_match_their_subtree(prefix in "(/[a-z]{1,5}){1,3}", rest in "(/[a-z0-9.%]{0,5}){0,3}", strip in any::<bool>()) {
        let path = format!("{prefix}{rest}");
        prop_assert!(prefix_matches(&prefix, &path));
        let sibling = format!("{prefix}x{rest}");
        prop_assert!(!prefix_matches(&prefix, &sibling));
        prop_assert!(routed_path(&path, &prefix, strip).starts_with('/'));
    }

    /// The on-demand URL: a path or an http(s) URL with a host; never panics.
    #[test]
    fn on_demand_urls(path in "/[a-z0-9/?=&]{0,20}", host in "[a-z0-9.-]{1,20}", https in any::<bool>(), junk in any::<String>()) {
        prop_assume!(!path.starts_with("//")); // protocol-relative: refused on purpose
        prop_assert_eq!(validate_on_demand_url(&path), Ok(()));
        let scheme = if https { "https" } else { "http" };
        let url = format!("{scheme}://{host}{path}");
        prop_assert_eq!(validate_on_demand_url(&url), Ok(()));
        let _ = validate_on_demand_url(&junk);
    }
}
