//! Target syntax (`host[:port]`, and `host[:port];weight=N`) and container references.
#![no_main]

use kamal_proxy::balancer::spec::TargetSpec;
use kamal_proxy::balancer::target::{Target, container_ref, validate_target};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    match validate_target(text) {
        // A validated target must always construct (a failure at restore discards every
        // service).
        Ok(()) => {
            Target::new(text).expect("a validated target constructs");
        }
        Err(e) => assert_eq!(e, format!("{text} :invalid host pattern")),
    }
    let _ = container_ref(text);
    // A spec that parses prints back to itself and builds a target; any other is one of
    // the two messages.
    match TargetSpec::parse(text) {
        Ok(spec) => {
            assert!((1..=1000).contains(&spec.weight));
            assert_eq!(TargetSpec::parse(&spec.to_string()), Ok(spec.clone()));
            Target::build(&spec, None).expect("a parsed spec constructs");
        }
        Err(e) => assert!(
            e.starts_with("invalid target weight: ") || e.ends_with(" :invalid host pattern"),
            "{e}"
        ),
    }
});
