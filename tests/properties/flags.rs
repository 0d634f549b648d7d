//! Flag values with pflag's Go semantics: booleans, integers, floats, ports, durations.

use kamal_proxy::cli::values::{duration, float64, go_bool, go_quote, int64, port};
use kamal_proxy::gotime::{GoDuration, parse_duration};
use proptest::prelude::*;

const GO_BOOLS: &[(&str, bool)] = &[
    ("1", true),
    ("t", true),
    ("T", true),
    ("TRUE", true),
    ("true", true),
    ("True", true),
    ("0", false),
    ("f", false),
    ("F", false),
    ("FALSE", false),
    ("false", false),
    ("False", false),
];

/// `v` written as one of Go's integer literal forms.
fn go_literal(v: i64, form: u8, underscores: bool) -> String {
    let sign = if v < 0 { "-" } else { "" };
    let m = v.unsigned_abs();
    let (prefix, digits) = match form % 7 {
        0 => ("", m.to_string()),
        1 => ("0x", format!("{m:x}")),
        2 => ("0X", format!("{m:X}")),
        3 => ("0o", format!("{m:o}")),
        4 => ("0", format!("{m:o}")), // a bare leading zero means octal
        5 => ("0b", format!("{m:b}")),
        _ => ("0B", format!("{m:b}")),
    };
    let digits = if underscores {
        // `_` between every pair of digits is allowed in Go literals.
        digits
            .chars()
            .map(String::from)
            .collect::<Vec<_>>()
            .join("_")
    } else {
        digits
    };
    format!("{sign}{prefix}{digits}")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

    /// `strconv.ParseBool`: exactly Go's twelve spellings, nothing else.
    #[test]
    fn booleans_are_go_spellings_only(text in prop_oneof![
        any::<String>(),
        prop::sample::select(GO_BOOLS).prop_map(|(s, _)| s.to_string()),
        "[tTfF01rRuUeEaAlLsS ]{0,6}",
    ]) {
        let want = GO_BOOLS.iter().find(|(s, _)| *s == text).map(|(_, b)| *b);
        match want {
            Some(b) => prop_assert_eq!(go_bool(&text), Ok(b)),
            None => prop_assert_eq!(
                go_bool(&text),
                Err(format!("strconv.ParseBool: parsing \"{text}\": invalid syntax"))
            ),
        }
    }

    /// pflag's `strconv.ParseInt(s, 0, 64)`: every i64 in every Go literal form (decimal,
    /// hex, octal with `0o` or a bare `0`, binary, `_` separators) reads back.
    #[test]
    fn integers_read_back_in_every_go_form(v in any::<i64>(), form in any::<u8>(), underscores in any::<bool>(), plus in any::<bool>()) {
        let mut text = go_literal(v, form, underscores);
        if plus && v >= 0 {
            text.insert(0, '+');
        }
        prop_assert_eq!(int64(&text), Ok(v), "{}", text);
    }

    /// Past the i64 range it is Go's "value out of range", never a wrapped number.
    #[test]
    fn integers_out_of_range_say_so(extra in 1u64..=u64::MAX, negative in any::<bool>()) {
        let v: i128 = if negative {
            i128::from(i64::MIN) - i128::from(extra)
        } else {
            i128::from(i64::MAX) + i128::from(extra)
        };
        let text = v.to_string();
        prop_assert_eq!(
            int64(&text),
            Err(format!("strconv.ParseInt: parsing \"{text}\": value out of range"))
        );
    }

    /// Arbitrary text never panics; accepted text is made of literal characters only; a
    /// refusal is Go's message with the text quoted as `strconv.Quote` does.
    #[test]
    fn integers_never_panic(text in prop_oneof![any::<String>(), "[-+0-9a-fA-FxXoObB_ ]{0,12}"]) {
        match int64(&text) {
            Ok(_) => prop_assert!(text.chars().all(|c| c.is_ascii_hexdigit() || "+-xXoObB_".contains(c)), "{:?}", text),
            Err(e) => {
                let prefix = format!("strconv.ParseInt: parsing {}: ", go_quote(&text));
                prop_assert!(e.starts_with(&prefix), "{} / {}", e, prefix);
                prop_assert!(e.ends_with("invalid syntax") || e.ends_with("value out of range"));
            }
        }
    }

    /// Every finite float reads back bit for bit, from Rust's shortest text and from
    /// exponent form (both are Go syntax); NaN and infinities are refused.
    #[test]
    fn floats_read_back(f in any::<f64>()) {
        if f.is_finite() {
            prop_assert_eq!(float64(&f.to_string()).map(f64::to_bits), Ok(f.to_bits()));
            prop_assert_eq!(float64(&format!("{f:e}")).map(f64::to_bits), Ok(f.to_bits()));
        } else {
            prop_assert!(float64(&f.to_string()).is_err());
        }
    }

    #[test]
    fn floats_never_panic(text in any::<String>()) {
        if let Ok(f) = float64(&text) {
            prop_assert!(f.is_finite());
        }
    }

    /// Every port reads back; past 65535 it is out of range.
    #[test]
    fn ports_read_back(p in any::<u16>(), big in 65536i64..) {
        prop_assert_eq!(port(&p.to_string()), Ok(p));
        prop_assert_eq!(
            port(&big.to_string()),
            Err(format!("strconv.ParseInt: parsing \"{big}\": value out of range"))
        );
    }

    /// A duration flag is exactly `time.ParseDuration`, message included.
    #[test]
    fn duration_flags_are_go_durations(text in prop_oneof![any::<String>(), "[-+0-9.smhun]{0,10}"]) {
        match parse_duration(&text) {
            Ok(v) => prop_assert_eq!(duration(&text), Ok(GoDuration::from_nanos(v))),
            Err(e) => prop_assert_eq!(duration(&text), Err(e.to_string())),
        }
    }
}

mod labels {
    use kamal_proxy::gotime::parse_flag;
    use kamal_proxy::options::ServiceOptions;
    use kamal_proxy::service::sleep::labels::apply_value;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

        /// A label's value is read exactly as its flag's: durations by Go's rules, the
        /// container list split at commas, trimmed, empty items dropped.
        #[test]
        fn labels_read_like_their_flags(value in prop_oneof![any::<String>(), "[0-9.smh, a-z-]{0,16}"]) {
            let mut o = ServiceOptions::default();
            match parse_flag(&value) {
                Ok(d) => {
                    prop_assert_eq!(apply_value(&mut o, "sleep-after", &value), Ok(()));
                    prop_assert_eq!(o.sleep_after, d);
                }
                Err(e) => prop_assert_eq!(apply_value(&mut o, "wake-timeout", &value), Err(e)),
            }
            prop_assert_eq!(apply_value(&mut o, "sleep-container", &value), Ok(()));
            let want: Vec<String> = value.split(',').map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect();
            prop_assert_eq!(&o.sleep_containers, &want);
            prop_assert!(apply_value(&mut o, "sleep-never", &value).is_err());
        }
    }
}
