//! Flag values with pflag's Go semantics.
#![no_main]

use kamal_proxy::cli::values::{duration, float64, go_bool, go_quote, int64, port};
use kamal_proxy::options::upstream::{PathTimeouts, from_pairs, parse_pairs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = go_bool(text);
    if let Ok(v) = int64(text) {
        assert_eq!(int64(&v.to_string()), Ok(v));
    }
    if let Ok(f) = float64(text) {
        assert!(f.is_finite());
        assert_eq!(float64(&f.to_string()).map(f64::to_bits), Ok(f.to_bits()));
    }
    if let Ok(p) = port(text) {
        assert_eq!(port(&p.to_string()), Ok(p));
    }
    let _ = duration(text);
    // `--path-timeout` / `--path-request-timeout` values, and the paths they then match.
    if let Ok(pairs) = parse_pairs(text) {
        if let Ok(list) = from_pairs("path-timeout", &pairs) {
            let compiled = PathTimeouts::compile(&list);
            assert_eq!(PathTimeouts::compile(&from_pairs("path-timeout", &pairs).unwrap()), compiled);
            let _ = compiled.resolve(text);
        }
    }
    let quoted = go_quote(text);
    assert!(quoted.starts_with('"') && quoted.ends_with('"'));
});
