//! The state file: any bytes, then the restore's service build for what parses.
#![no_main]

use kamal_proxy::router::state;
use kamal_proxy::service::ServiceConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(services) = state::parse(data) else {
        return;
    };
    // Writing what was read and reading it again changes nothing.
    let written = serde_json::to_vec(&services).expect("a parsed state serialises");
    let again = state::parse(&written).expect("what we write parses");
    let rewritten = serde_json::to_vec(&again).expect("a parsed state serialises");
    assert_eq!(
        String::from_utf8_lossy(&rewritten),
        String::from_utf8_lossy(&written)
    );
    for s in services {
        let mut options = s.options.clone();
        options.error_page_path.clear(); // no file system here
        let _ = ServiceConfig::build(&s.name, options, s.target_options.clone());
    }
});
