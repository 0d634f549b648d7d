//! Go durations: `time.ParseDuration` and `Duration.String()`.

use kamal_proxy::gotime::{DurationError, GoDuration, format_duration, parse_duration};
use proptest::prelude::*;

/// Go's units and their nanoseconds (both micro spellings, as Go accepts both).
const UNITS: &[(&str, i128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("\u{00b5}s", 1_000),
    ("\u{03bc}s", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// One `<int>.<frac><unit>` term, with its exact value in nanoseconds. Fractions are kept
/// to digits whose value in the unit is a whole number of nanoseconds (or to `ns`, where
/// any fraction is worth nothing), so Go's float64 arithmetic is exact and an independent
/// integer model predicts it.
fn term() -> impl Strategy<Value = (String, i128)> {
    (
        prop_oneof![3 => 0u64..10_000, 1 => any::<u64>()],
        0usize..3, // leading zeros
        any::<bool>(),
        0usize..UNITS.len(),
        any::<u64>(),
        0u32..10,
        any::<bool>(),
    )
        .prop_map(|(int, zeros, int_empty, unit, frac, digits, dot)| {
            let (name, ns) = UNITS[unit];
            let max_digits = (0..=9u32)
                .filter(|d| ns == 1 || ns % 10i128.pow(*d) == 0)
                .max()
                .unwrap_or(0);
            let digits = digits.min(max_digits);
            let scale = 10u64.pow(digits);
            let frac = if digits == 0 { 0 } else { frac % scale };
            let int_text = if int_empty && digits > 0 {
                String::new()
            } else {
                format!("{}{int}", "0".repeat(zeros))
            };
            let int_value = if int_text.is_empty() { 0 } else { int };
            let mut text = int_text;
            if digits > 0 {
                text.push_str(&format!(".{frac:0width$}", width = digits as usize));
            } else if dot && !text.is_empty() {
                text.push('.'); // `5.s` is valid Go
            }
            text.push_str(name);
            let value = i128::from(int_value) * ns + i128::from(frac) * ns / i128::from(scale);
            (text, value)
        })
}

fn duration_text() -> impl Strategy<Value = (String, i128)> {
    (
        prop_oneof![Just(""), Just("-"), Just("+")],
        prop::collection::vec(term(), 1..4),
    )
        .prop_map(|(sign, terms)| {
            let text = format!(
                "{sign}{}",
                terms.iter().map(|(t, _)| t.as_str()).collect::<String>()
            );
            let magnitude: i128 = terms.iter().map(|(_, v)| v).sum();
            let value = if sign == "-" { -magnitude } else { magnitude };
            (text, value)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::SOME))]

    /// `Duration.String()` output always parses back to the same value (Go issue 48629),
    /// over the whole i64 range.
    #[test]
    fn format_then_parse_is_identity(nanos in any::<i64>()) {
        prop_assert_eq!(parse_duration(&format_duration(nanos)), Ok(nanos));
    }

    /// Agreement with Go's grammar and arithmetic: every generated sum of terms parses to
    /// the value an exact integer model gives, or is refused as invalid exactly when Go's
    /// range check refuses it (2^63 is allowed only negative).
    #[test]
    fn terms_add_up_as_go_computes_them((text, value) in duration_text()) {
        let got = parse_duration(&text);
        if value >= i128::from(i64::MIN) && value <= i128::from(i64::MAX) {
            prop_assert_eq!(got, Ok(value as i64), "{}", text);
        } else {
            prop_assert_eq!(got, Err(DurationError::Invalid { orig: text.clone() }));
        }
    }

    /// A sign only flips the value: `-X` is `-(X)` and `+X` is `X`.
    #[test]
    fn signs_negate((text, _) in duration_text()) {
        let unsigned = text.trim_start_matches(['-', '+']);
        if let Ok(v) = parse_duration(unsigned) {
            prop_assert_eq!(parse_duration(&format!("+{unsigned}")), Ok(v));
            prop_assert_eq!(parse_duration(&format!("-{unsigned}")), Ok(-v));
        }
    }

    /// A number without a unit is Go's "missing unit" error, except a lone zero (past
    /// 2^63 the number itself is Go's "invalid duration", checked first).
    #[test]
    fn bare_numbers_need_a_unit(n in 1u64..=1 << 63, sign in prop_oneof![Just(""), Just("-"), Just("+")]) {
        let text = format!("{sign}{n}");
        prop_assert_eq!(
            parse_duration(&text),
            Err(DurationError::MissingUnit { orig: text.clone() })
        );
    }

    /// No whitespace anywhere: Go refuses `5 s`, ` 5s` and `5s `.
    #[test]
    fn whitespace_is_never_accepted((text, _) in duration_text(), at in any::<prop::sample::Index>(), ws in prop_oneof![Just(' '), Just('\t'), Just('\n')]) {
        let chars: Vec<char> = text.chars().collect();
        let i = at.index(chars.len() + 1);
        let mut spaced: String = chars[..i].iter().collect();
        spaced.push(ws);
        spaced.extend(&chars[i..]);
        prop_assert!(parse_duration(&spaced).is_err(), "{:?}", spaced);
    }

    /// Arbitrary text never panics; what parses is canonical (formats and parses back),
    /// and every refusal is Go's `time: …` message.
    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        match parse_duration(&text) {
            Ok(v) => prop_assert_eq!(parse_duration(&format_duration(v)), Ok(v)),
            Err(e) => prop_assert!(e.to_string().starts_with("time: "), "{}", e),
        }
    }

    /// The same over the duration alphabet, where near-misses are dense.
    #[test]
    fn near_misses_never_panic(text in "[-+0-9.a-z\u{00b5}\u{03bc}]{0,24}") {
        match parse_duration(&text) {
            Ok(v) => prop_assert_eq!(parse_duration(&format_duration(v)), Ok(v)),
            Err(e) => prop_assert!(e.to_string().starts_with("time: ")),
        }
    }

    /// `GoDuration` is Go's JSON (bare integer nanoseconds) and Go's text, both ways.
    #[test]
    fn go_duration_json_and_text(nanos in any::<i64>()) {
        let d = GoDuration::from_nanos(nanos);
        let json = serde_json::to_string(&d).unwrap();
        prop_assert_eq!(&json, &nanos.to_string());
        prop_assert_eq!(serde_json::from_str::<GoDuration>(&json).unwrap(), d);
        prop_assert_eq!(d.to_string().parse::<GoDuration>(), Ok(d));
    }
}
