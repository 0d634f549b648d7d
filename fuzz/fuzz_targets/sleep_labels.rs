//! Scale-to-zero settings read from container labels.
#![no_main]

use kamal_proxy::options::ServiceOptions;
use kamal_proxy::service::sleep::labels::{SLEEP_FLAGS, apply_value};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u8, &str)| {
    let (which, value) = input;
    let flag = SLEEP_FLAGS[usize::from(which) % SLEEP_FLAGS.len()];
    let mut options = ServiceOptions::default();
    if apply_value(&mut options, flag, value).is_ok() {
        assert!(
            options
                .sleep_containers
                .iter()
                .all(|c| !c.is_empty() && c.trim() == c)
        );
        let _ = options.validate_complete();
    }
});
