use super::*;

const NS: i64 = 1;
const US: i64 = 1_000;
const MS: i64 = 1_000_000;
const S: i64 = 1_000_000_000;
const M: i64 = 60 * S;
const H: i64 = 60 * M;

/// Valid inputs and their values; mostly Go's `parseDurationTests`.
const VALID: &[(&str, i64)] = &[
    // simple
    ("0", 0),
    ("5s", 5 * S),
    ("30s", 30 * S),
    ("1478s", 1478 * S),
    // sign
    ("-5s", -5 * S),
    ("+5s", 5 * S),
    ("-0", 0),
    ("+0", 0),
    // decimal
    ("5.0s", 5 * S),
    ("5.6s", 5 * S + 600 * MS),
    ("5.s", 5 * S),
    (".5s", 500 * MS),
    ("1.0s", S),
    ("1.00s", S),
    ("1.004s", S + 4 * MS),
    ("1.0040s", S + 4 * MS),
    ("100.00100s", 100 * S + MS),
    // different units
    ("10ns", 10 * NS),
    ("11us", 11 * US),
    ("12\u{00b5}s", 12 * US),
    ("12\u{03bc}s", 12 * US),
    ("13ms", 13 * MS),
    ("14s", 14 * S),
    ("15m", 15 * M),
    ("16h", 16 * H),
    // composite durations
    ("3h30m", 3 * H + 30 * M),
    ("10.5s4m", 4 * M + 10 * S + 500 * MS),
    ("-2m3.4s", -(2 * M + 3 * S + 400 * MS)),
    (
        "1h2m3s4ms5us6ns",
        H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS,
    ),
    ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
    // large value
    ("52763797000ns", 52763797000 * NS),
    // more than 9 digits after decimal point, see Go issue 6617
    ("0.3333333333333333333h", 20 * M),
    // 9007199254740993 = 1<<53+1 cannot be stored precisely in a float64
    ("9007199254740993ns", (1 << 53) + 1),
    // largest duration that can be represented by int64 in nanoseconds
    ("9223372036854775807ns", i64::MAX),
    ("9223372036854775.807us", i64::MAX),
    ("9223372036854.775807ms", i64::MAX),
    ("9223372036s854ms775us807ns", i64::MAX),
    ("-9223372036854775808ns", i64::MIN),
    ("-9223372036854775.808us", i64::MIN),
    ("-9223372036s854ms775us808ns", i64::MIN),
    // largest negative round trip value, see Go issue 48629
    ("-2562047h47m16.854775808s", i64::MIN),
    ("2562047h47m16.854775807s", i64::MAX),
    // huge string; Go issue 15011
    ("0.100000000000000000000h", 6 * M),
    // exercises the overflow stop in the fraction accumulator
    (
        "0.830103483285477580700h",
        49 * M + 48 * S + 372_539_827 * NS,
    ),
    // very long fractions keep parsing; extra digits are ignored
    ("1.0000000000000000001s", S),
    (".9999999999s", 999_999_999),
    (".9223372036854775807s", 922_337_203),
    ("0.000000001s", 1),
    ("0.0000000009s", 0),
    ("1.5h", H + 30 * M),
    ("-1.5h", -(H + 30 * M)),
    ("0s", 0),
    ("-0s", 0),
    ("0.0s", 0),
    ("000001s", S),
    ("1h1h", 2 * H),
];

#[test]
fn parses_go_vectors() {
    for &(input, want) in VALID {
        assert_eq!(parse_duration(input), Ok(want), "input {input:?}");
    }
}

/// Invalid inputs and the exact message; mostly Go's
/// `parseDurationErrorTests` (Go only checks the quoted part, we check
/// the whole message).
const INVALID: &[(&str, &str)] = &[
    ("", r#"time: invalid duration """#),
    ("3", r#"time: missing unit in duration "3""#),
    ("-", r#"time: invalid duration "-""#),
    ("+", r#"time: invalid duration "+""#),
    ("s", r#"time: invalid duration "s""#),
    (".", r#"time: invalid duration ".""#),
    ("-.", r#"time: invalid duration "-.""#),
    (".s", r#"time: invalid duration ".s""#),
    ("+.s", r#"time: invalid duration "+.s""#),
    ("1d", r#"time: unknown unit "d" in duration "1d""#),
    (
        "\u{85}\u{85}",
        r#"time: invalid duration "\xc2\x85\xc2\x85""#,
    ),
    ("\u{FFFD}", r#"time: invalid duration "\xef\xbf\xbd""#),
    (
        "\u{FFFD} hello \u{FFFD} world",
        r#"time: invalid duration "\xef\xbf\xbd hello \xef\xbf\xbd world""#,
    ),
    // overflow
    (
        "9223372036854775810ns",
        r#"time: invalid duration "9223372036854775810ns""#,
    ),
    (
        "9223372036854775808ns",
        r#"time: invalid duration "9223372036854775808ns""#,
    ),
    (
        "-9223372036854775809ns",
        r#"time: invalid duration "-9223372036854775809ns""#,
    ),
    ("2562048h", r#"time: invalid duration "2562048h""#),
    ("2562047h48m", r#"time: invalid duration "2562047h48m""#),
    (
        "99999999999999999999999s",
        r#"time: invalid duration "99999999999999999999999s""#,
    ),
    ("2562047.9h", r#"time: invalid duration "2562047.9h""#),
    // sum of two in-range terms past 2^63 (Go wraps the exact-2^63 case)
    (
        "-9223372036854775808ns9223372036854775808ns",
        r#"time: invalid duration "-9223372036854775808ns9223372036854775808ns""#,
    ),
    (
        "9223372036854776us",
        r#"time: invalid duration "9223372036854776us""#,
    ),
    ("3000000h", r#"time: invalid duration "3000000h""#),
    (
        "9223372036854775.808us",
        r#"time: invalid duration "9223372036854775.808us""#,
    ),
    (
        "9223372036854ms775us808ns",
        r#"time: invalid duration "9223372036854ms775us808ns""#,
    ),
    // other junk
    ("00", r#"time: missing unit in duration "00""#),
    ("1.5", r#"time: missing unit in duration "1.5""#),
    ("1s2", r#"time: missing unit in duration "1s2""#),
    ("1s.", r#"time: invalid duration "1s.""#),
    ("5 s", r#"time: unknown unit " s" in duration "5 s""#),
    ("5s ", r#"time: unknown unit "s " in duration "5s ""#),
    (" 5s", r#"time: invalid duration " 5s""#),
    ("--5s", r#"time: invalid duration "--5s""#),
    ("+-5s", r#"time: invalid duration "+-5s""#),
    ("5S", r#"time: unknown unit "S" in duration "5S""#),
    ("1sec", r#"time: unknown unit "sec" in duration "1sec""#),
    ("3.4x", r#"time: unknown unit "x" in duration "3.4x""#),
    (
        "1\u{00b5}",
        r#"time: unknown unit "\xc2\xb5" in duration "1\xc2\xb5""#,
    ),
    ("1e9ns", r#"time: unknown unit "e" in duration "1e9ns""#),
    ("1\"", r#"time: unknown unit "\"" in duration "1\"""#),
    ("1\\", r#"time: unknown unit "\\" in duration "1\\""#),
    ("1\n", r#"time: unknown unit "\x0a" in duration "1\x0a""#),
    ("1s-1s", r#"time: unknown unit "s-" in duration "1s-1s""#),
    ("0x10s", r#"time: unknown unit "x" in duration "0x10s""#),
    ("inf", r#"time: invalid duration "inf""#),
];

#[test]
fn rejects_go_vectors_with_go_messages() {
    for &(input, want) in INVALID {
        match parse_duration(input) {
            Ok(v) => panic!("input {input:?} parsed as {v}, want error {want}"),
            Err(e) => assert_eq!(e.to_string(), want, "input {input:?}"),
        }
    }
}

#[test]
fn error_variants_carry_parts() {
    assert_eq!(
        parse_duration("1d"),
        Err(DurationError::UnknownUnit {
            unit: "d".into(),
            orig: "1d".into()
        })
    );
    assert_eq!(
        parse_duration("3"),
        Err(DurationError::MissingUnit { orig: "3".into() })
    );
    assert_eq!(
        parse_duration(""),
        Err(DurationError::Invalid { orig: "".into() })
    );
    let boxed: Box<dyn std::error::Error> = Box::new(DurationError::Invalid { orig: "x".into() });
    assert_eq!(boxed.to_string(), r#"time: invalid duration "x""#);
}

#[test]
fn parse_flag_returns_message() {
    assert_eq!(parse_flag("30s"), Ok(GoDuration::from_secs(30)));
    assert_eq!(
        parse_flag("30"),
        Err(r#"time: missing unit in duration "30""#.to_string())
    );
}

#[test]
fn to_std_clamps_negative() {
    assert_eq!(to_std(0), std::time::Duration::ZERO);
    assert_eq!(to_std(-1), std::time::Duration::ZERO);
    assert_eq!(to_std(i64::MIN), std::time::Duration::ZERO);
    assert_eq!(to_std(1_500 * MS), std::time::Duration::from_millis(1500));
    assert_eq!(
        to_std(i64::MAX),
        std::time::Duration::from_nanos(i64::MAX as u64)
    );
}

/// Go's `durationTests` for `Duration.String()`, plus extras.
const FORMAT: &[(&str, i64)] = &[
    ("0s", 0),
    ("1ns", NS),
    ("1.1\u{00b5}s", 1100 * NS),
    ("2.2ms", 2200 * US),
    ("3.3s", 3300 * MS),
    ("4m5s", 4 * M + 5 * S),
    ("4m5.001s", 4 * M + 5001 * MS),
    ("5h6m7.001s", 5 * H + 6 * M + 7001 * MS),
    ("8m0.000000001s", 8 * M + NS),
    ("2562047h47m16.854775807s", i64::MAX),
    ("-2562047h47m16.854775808s", i64::MIN),
    ("1h30m0s", H + 30 * M),
    ("500ms", 500 * MS),
    ("1h0m0s", H),
    ("1m0s", M),
    ("1s", S),
    ("59.999999999s", M - 1),
    ("999ns", 999),
    ("1\u{00b5}s", US),
    ("999.999\u{00b5}s", MS - 1),
    ("1ms", MS),
    ("999.999999ms", S - 1),
    ("1.000001ms", MS + 1),
    ("-1ns", -1),
    ("-1.5s", -1500 * MS),
    ("-4m5s", -(4 * M + 5 * S)),
    ("-500ms", -500 * MS),
    ("10h0m0.5s", 10 * H + 500 * MS),
    ("100h0m0s", 100 * H),
];

#[test]
fn formats_like_go() {
    for &(want, nanos) in FORMAT {
        assert_eq!(format_duration(nanos), want, "nanos {nanos}");
    }
}

#[test]
fn formatted_values_parse_back() {
    // Every String() output must be accepted by ParseDuration (Go issue
    // 48629), including the extremes.
    for &(text, nanos) in FORMAT {
        assert_eq!(parse_duration(text), Ok(nanos), "text {text:?}");
    }
    // A spread of values, including sub-millisecond ones: formatting is
    // exact (no float), so the round trip must be exact too.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..2000 {
        // xorshift: deterministic pseudo-random coverage of the range.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let v = x as i64 >> (x % 64);
        let text = format_duration(v);
        assert_eq!(parse_duration(&text), Ok(v), "text {text:?}");
    }
}

#[test]
fn quote_matches_go_time_quote() {
    assert_eq!(go_time_quote("abc"), r#""abc""#);
    assert_eq!(go_time_quote("a\"b\\c"), r#""a\"b\\c""#);
    assert_eq!(go_time_quote("\t"), r#""\x09""#);
    assert_eq!(go_time_quote("\u{7f}"), "\"\u{7f}\"");
    assert_eq!(go_time_quote("é"), r#""\xc3\xa9""#);
    assert_eq!(go_time_quote("\u{03bc}"), r#""\xce\xbc""#);
}
