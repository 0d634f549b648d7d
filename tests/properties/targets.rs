//! Target syntax (`host[:port]`, upstream's pattern) and container references.

use kamal_proxy::balancer::target::{Target, container_ref, validate_target};
use proptest::prelude::*;

/// Upstream's pattern: a word character, then at least one of word, `-`, `.`, `+`.
fn target_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_][A-Za-z0-9_.+-]{1,30}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

    /// Every name the pattern allows, with or without a port, is accepted and becomes a
    /// target whose authority is that name and port (80 when none is given).
    #[test]
    fn valid_targets_are_accepted_and_addressable(name in target_name(), port in prop::option::of(any::<u16>())) {
        let text = match port {
            Some(p) => format!("{name}:{p}"),
            None => name.clone(),
        };
        prop_assert_eq!(validate_target(&text), Ok(()));
        let target = Target::new(&text).map_err(TestCaseError::fail)?;
        prop_assert_eq!(target.address(), text.as_str());
        prop_assert_eq!(target.authority().host(), name.as_str());
        prop_assert_eq!(target.authority().port_u16(), Some(port.unwrap_or(80)));
    }

    /// Anything else is refused with upstream's message, and never panics; whatever is
    /// accepted can always be turned into a target (a validated target never fails later,
    /// at restore, where a failure discards every service).
    #[test]
    fn arbitrary_targets(text in prop_oneof![any::<String>(), "[a-z0-9:/\\[\\]._+@-]{0,12}"]) {
        match validate_target(&text) {
            Ok(()) => prop_assert!(Target::new(&text).is_ok(), "{:?}", text),
            Err(e) => prop_assert_eq!(e, format!("{text} :invalid host pattern")),
        }
        let _ = container_ref(&text);
    }

    /// A target's container is its host part, unless that is an IP address.
    #[test]
    fn container_refs_name_the_host(name in target_name(), port in any::<u16>(), v4 in any::<std::net::Ipv4Addr>()) {
        prop_assume!(name.parse::<std::net::IpAddr>().is_err());
        let named = format!("{name}:{port}");
        prop_assert_eq!(container_ref(&named), Ok(name.as_str()));
        let address = container_ref(&format!("{v4}:{port}")).unwrap_err();
        prop_assert!(address.contains("--sleep-container"), "{}", address);
    }
}
