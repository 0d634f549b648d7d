//! Target syntax and container references.
#![no_main]

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
});
