//! Request paths as the access log and the rules decode them.
#![no_main]

use kamal_proxy::uri::{decoded_path, encode_path, encode_query};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let decoded = decoded_path(text);
    let encoded = encode_path(&decoded);
    assert!(encoded.is_ascii());
    if !decoded.contains('%') {
        assert_eq!(decoded_path(&encoded), decoded);
    }
    assert!(encode_query(&decoded).is_ascii());
});
