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

// === Weighted targets (fork F16): `host[:port];weight=N` and the split it makes ===

use kamal_proxy::balancer::LoadBalancer;
use kamal_proxy::balancer::affinity::PinKey;
use kamal_proxy::balancer::health::{HealthCheckConfig, probe_client};
use kamal_proxy::balancer::spec::TargetSpec;

fn pool_of(weights: &[u32]) -> std::sync::Arc<LoadBalancer> {
    let specs: Vec<TargetSpec> = weights
        .iter()
        .enumerate()
        .map(|(i, &weight)| TargetSpec {
            address: format!("web-{i}:80"),
            weight,
        })
        .collect();
    let lb = LoadBalancer::new(
        "app",
        &specs,
        &[],
        PinKey::generate().unwrap(),
        HealthCheckConfig::default(),
        probe_client(),
    )
    .unwrap();
    lb.mark_all_healthy();
    lb
}

fn index_of(address: &str) -> usize {
    address
        .strip_prefix("web-")
        .and_then(|r| r.strip_suffix(":80"))
        .and_then(|i| i.parse().ok())
        .unwrap()
}

/// nginx's smooth weighted round robin as its source reads (`ngx_http_upstream_get_peer`):
/// the reference the precomputed cycle must match pick for pick.
fn nginx_sequence(weights: &[u32], picks: usize) -> Vec<usize> {
    let total: i64 = weights.iter().map(|&w| i64::from(w)).sum();
    let mut current = vec![0i64; weights.len()];
    (0..picks)
        .map(|_| {
            let mut best = None::<usize>;
            for (i, &w) in weights.iter().enumerate() {
                current[i] += i64::from(w);
                if best.is_none_or(|b| current[i] > current[b]) {
                    best = Some(i);
                }
            }
            let best = best.unwrap();
            current[best] -= total;
            best
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

    /// Every valid address with any weight from 1 to 1000 parses to that address and
    /// weight, and prints back to a spec that parses to the same (the default weight as
    /// the bare address).
    #[test]
    fn weighted_specs_round_trip(name in target_name(), port in prop::option::of(any::<u16>()), weight in 1u32..=1000) {
        let address = match port {
            Some(p) => format!("{name}:{p}"),
            None => name.clone(),
        };
        let spec = TargetSpec::parse(&format!("{address};weight={weight}")).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&spec.address, &address);
        prop_assert_eq!(spec.weight, weight);
        let shown = spec.to_string();
        prop_assert_eq!(TargetSpec::parse(&shown), Ok(spec));
        prop_assert_eq!(shown == address, weight == 1);
        prop_assert_eq!(TargetSpec::parse(&address).map(|s| s.weight), Ok(1));
    }

    /// A whole number outside 1-1000 is refused with the fork's message.
    #[test]
    fn weights_out_of_range_are_refused(n in prop_oneof![i64::MIN..=0, 1001..=i64::MAX]) {
        prop_assert_eq!(
            TargetSpec::parse(&format!("web:80;weight={n}")),
            Err(format!("invalid target weight: {n} is outside 1-1000"))
        );
    }

    /// Anything: a spec that prints back to itself, or one of the two messages; never a
    /// panic.
    #[test]
    fn arbitrary_specs(text in prop_oneof![any::<String>(), "[a-z0-9:;=+-]{0,20}", "web:80;[a-z=0-9;+-]{0,12}"]) {
        match TargetSpec::parse(&text) {
            Ok(spec) => {
                prop_assert!((1..=1000).contains(&spec.weight));
                prop_assert_eq!(validate_target(&spec.address), Ok(()));
                prop_assert_eq!(TargetSpec::parse(&spec.to_string()), Ok(spec));
            }
            Err(e) => prop_assert!(
                e.starts_with("invalid target weight: ") || e.ends_with(" :invalid host pattern"),
                "{}", e
            ),
        }
    }

    /// The pool's picks are nginx's smooth weighted round robin, pick for pick, and over
    /// whole cycles each target gets exactly its weight's share.
    #[test]
    fn weighted_picks_are_nginx_s_sequence(weights in prop::collection::vec(1u32..=40, 2..=6), cycles in 1usize..=3) {
        prop_assume!(weights.iter().any(|&w| w != weights[0]));
        let lb = pool_of(&weights);
        let total: usize = weights.iter().map(|&w| w as usize).sum();
        let picks: Vec<usize> = (0..total * cycles)
            .map(|_| index_of(lb.select(false).unwrap().address()))
            .collect();
        prop_assert_eq!(&picks, &nginx_sequence(&weights, total * cycles));
        for (i, &w) in weights.iter().enumerate() {
            prop_assert_eq!(picks.iter().filter(|&&p| p == i).count(), w as usize * cycles);
        }
    }

    /// Equal weights, whatever their value, keep upstream's round robin (first request to
    /// the second target).
    #[test]
    fn equal_weights_are_upstream_s_round_robin(weight in 1u32..=1000, n in 1usize..=5) {
        let lb = pool_of(&vec![weight; n]);
        let picks: Vec<usize> = (0..2 * n)
            .map(|_| index_of(lb.select(false).unwrap().address()))
            .collect();
        let expected: Vec<usize> = (1..=2 * n).map(|k| k % n).collect();
        prop_assert_eq!(picks, expected);
    }
}
