//! PROXY protocol headers (v1 and v2), as the first bytes of a connection arrive.
#![no_main]

use kamal_proxy::server::proxy_protocol::{Parsed, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = parse(data);
    // The reader peeks again only while the answer is "incomplete": any decision taken
    // on a part of the bytes must be the one the whole gives.
    for cut in 0..data.len() {
        let part = parse(&data[..cut]);
        if part != Parsed::Incomplete {
            assert_eq!(part, whole, "decided at {cut}");
            break;
        }
    }
});
