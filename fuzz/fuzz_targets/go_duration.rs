//! Go durations: `time.ParseDuration` on any text, `Duration.String()` on any value.
#![no_main]

use kamal_proxy::gotime::{GoDuration, format_duration, parse_duration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        match parse_duration(text) {
            // What parses is canonical: printed and parsed again, the same value.
            Ok(v) => assert_eq!(parse_duration(&format_duration(v)), Ok(v), "{text:?}"),
            Err(e) => assert!(e.to_string().starts_with("time: ")),
        }
        let _ = text.parse::<GoDuration>();
    }
    if let Ok(bytes) = <[u8; 8]>::try_from(data.get(..8).unwrap_or_default()) {
        let v = i64::from_le_bytes(bytes);
        assert_eq!(parse_duration(&format_duration(v)), Ok(v));
    }
});
