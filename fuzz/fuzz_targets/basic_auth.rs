//! Stored basic-auth credentials and `Authorization` headers.
#![no_main]

use http::{HeaderMap, HeaderValue, header};
use kamal_proxy::service::gates::basic_auth::{BasicAuth, Credential, encode_flag};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, &[u8])| {
    let (text, authorization) = input;
    let gate = match Credential::parse(text) {
        Ok(c) => BasicAuth::new(c),
        Err(_) => BasicAuth::deny_all(),
    };
    if let Ok(stored) = encode_flag(text) {
        let c = Credential::parse(&stored).expect("what we store reads back");
        let (user, password) = text.split_once(':').expect("encode_flag splits at ':'");
        assert!(c.matches(user, password));
    }
    if let Ok(v) = HeaderValue::from_bytes(authorization) {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, v);
        let _ = gate.take_and_check(&mut headers);
        assert!(headers.is_empty(), "the credentials never reach the target");
    }
});
