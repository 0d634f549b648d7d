use super::json::write_go_json_float;
use super::time::civil_from_days;
use super::*;
use serde_json::Value;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing_subscriber::fmt::MakeWriter;

/// In-memory writer shared between the subscriber and the test.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Buf {
    fn contents(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl io::Write for Buf {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Buf {
    type Writer = Buf;

    fn make_writer(&'a self) -> Buf {
        self.clone()
    }
}

/// Runs `f` under a SlogJson subscriber (all levels) and returns the
/// output.
fn capture(f: impl FnOnce()) -> String {
    let buf = Buf::default();
    let subscriber = tracing_subscriber::fmt()
        .event_format(SlogJson)
        .with_writer(buf.clone())
        .with_max_level(Level::TRACE)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    buf.contents()
}

/// Captures exactly one line and returns it raw and parsed.
fn one_line(f: impl FnOnce()) -> (String, serde_json::Map<String, Value>) {
    let out = capture(f);
    assert!(out.ends_with('\n'), "line not terminated: {out:?}");
    let line = out.strip_suffix('\n').unwrap().to_string();
    assert!(!line.contains('\n'), "more than one line: {out:?}");
    let value: Value = serde_json::from_str(&line).unwrap();
    let Value::Object(map) = value else {
        panic!("not an object: {line}")
    };
    (line, map)
}

/// Strips the variable `time` member so whole lines can be compared.
fn without_time(line: &str) -> &str {
    let rest = line.strip_prefix("{\"time\":\"").unwrap();
    let end = rest.find('"').unwrap();
    &rest[end + 1..]
}

#[test]
fn basic_line_shape_and_key_order() {
    let (line, map) = one_line(|| {
        tracing::info!(host = "example.com", port = 80u16, tls = false, "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","host":"example.com","port":80,"tls":false}"#
    );
    assert_eq!(map["level"], "INFO");
    assert_eq!(map["msg"], "Request");
    assert_eq!(map["host"], "example.com");
    assert_eq!(map["port"], 80);
    assert_eq!(map["tls"], false);
    // time looks like RFC 3339 UTC and is close to now.
    let time = map["time"].as_str().unwrap();
    assert!(time.ends_with('Z'), "{time}");
    assert_eq!(&time[4..5], "-");
    assert_eq!(&time[10..11], "T");
    let now = rfc3339_nano_utc(SystemTime::now());
    assert_eq!(&time[..10], &now[..10], "date differs from now");
}

#[test]
fn levels_use_slog_names() {
    let out = capture(|| {
        tracing::error!("e");
        tracing::warn!("w");
        tracing::info!("i");
        tracing::debug!("d");
        tracing::trace!("t");
    });
    let levels: Vec<String> = out
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["level"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(levels, ["ERROR", "WARN", "INFO", "DEBUG", "DEBUG-4"]);
}

#[test]
fn message_comes_first_whatever_the_field_order() {
    let (line, _) = one_line(|| {
        tracing::info!(a = 1, b = 2, "hello {}", "world");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"hello world","a":1,"b":2}"#
    );
    // Explicit `message` field placed after others.
    let (line, _) = one_line(|| {
        tracing::info!(a = 1, message = "late");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"late","a":1}"#
    );
}

#[test]
fn missing_message_gives_empty_msg() {
    let (line, _) = one_line(|| {
        tracing::info!(a = "x");
    });
    assert_eq!(without_time(&line), r#","level":"INFO","msg":"","a":"x"}"#);
}

#[test]
fn value_types() {
    #[derive(Debug)]
    #[allow(dead_code)] // `x` is only read through Debug
    struct Point {
        x: i32,
    }
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 8080));
    let err = io::Error::other("boom \"quoted\"");
    let (line, map) = one_line(|| {
        tracing::info!(
            neg = -5i64,
            big = u64::MAX,
            small = 7u8,
            size = 3usize,
            wide = i128::MIN,
            yes = true,
            ratio = 0.25f64,
            owned = String::from("s"),
            disp = %addr,
            dbg = ?Point { x: 1 },
            dbg_str = ?"q",
            error = &err as &(dyn std::error::Error + 'static),
            "types"
        );
    });
    assert_eq!(map["neg"], -5);
    assert_eq!(map["big"], u64::MAX);
    assert_eq!(map["small"], 7);
    assert_eq!(map["size"], 3);
    assert_eq!(map["yes"], true);
    assert_eq!(map["ratio"], 0.25);
    assert_eq!(map["owned"], "s");
    assert_eq!(map["disp"], "127.0.0.1:8080");
    assert_eq!(map["dbg"], "Point { x: 1 }");
    assert_eq!(map["dbg_str"], "\"q\"");
    assert_eq!(map["error"], "boom \"quoted\"");
    // i128::MIN exceeds what serde_json parses into Value without the
    // arbitrary_precision feature, so check the raw text.
    assert!(
        line.contains(r#""wide":-170141183460469231731687303715884105728,"#),
        "{line}"
    );
}

#[test]
fn floats_match_go_json() {
    let cases: &[(f64, &str)] = &[
        (0.0, "0"),
        (-0.0, "-0"),
        (1.0, "1"),
        (0.25, "0.25"),
        (-1.5, "-1.5"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e300, "1.5e+300"),
        (0.000001, "0.000001"),
        (1.5e-7, "1.5e-7"),
        (1e-10, "1e-10"),
        (f64::NAN, "\"!ERROR:json: unsupported value: NaN\""),
        (f64::INFINITY, "\"!ERROR:json: unsupported value: +Inf\""),
        (
            f64::NEG_INFINITY,
            "\"!ERROR:json: unsupported value: -Inf\"",
        ),
    ];
    for &(value, want) in cases {
        let mut out = String::new();
        write_go_json_float(&mut out, value).unwrap();
        assert_eq!(out, want, "value {value:e}");
        // Finite values must be valid JSON numbers that round-trip.
        if value.is_finite() {
            let parsed: f64 = serde_json::from_str(&out).unwrap();
            assert_eq!(parsed, value);
        }
    }
}

#[test]
fn escaping_of_strings_and_messages() {
    let nasty = "quote\" backslash\\ nl\n cr\r tab\t nul\u{0} bell\u{7} bs\u{8} ff\u{c} \
                 us\u{1f} del\u{7f} <html>&amp; é 日本 🎉 ls\u{2028} ps\u{2029}";
    let (line, map) = one_line(|| {
        tracing::info!(value = nasty, shown = %nasty, "{}", nasty);
    });
    assert_eq!(map["value"], nasty);
    assert_eq!(map["shown"], nasty);
    assert_eq!(map["msg"], nasty);
    let escaped =
        r#"quote\" backslash\\ nl\n cr\r tab\t nul\u0000 bell\u0007 bs\u0008 ff\u000c us\u001f "#;
    assert!(line.contains(escaped), "{line}");
    // DEL, HTML and non-ASCII are left alone; U+2028/9 are escaped.
    assert!(
        line.contains("del\u{7f} <html>&amp; é 日本 🎉 ls\\u2028 ps\\u2029"),
        "{line}"
    );
    assert_eq!(line.lines().count(), 1);
}

#[test]
fn escape_roundtrips_every_char_class() {
    // Every ASCII character plus a selection of multi-byte ones, each
    // alone and embedded, must decode back to itself.
    let mut samples: Vec<String> = (0u8..=0x7f).map(|b| char::from(b).to_string()).collect();
    for c in [
        '\u{80}',
        '\u{ff}',
        '\u{2027}',
        '\u{2028}',
        '\u{2029}',
        '\u{202a}',
        '\u{fffd}',
        '\u{10ffff}',
    ] {
        samples.push(c.to_string());
        samples.push(format!("a{c}b{c}"));
    }
    samples.push(String::new());
    samples.push("plain text".into());
    for s in samples {
        let mut out = String::new();
        json_escape_into(&mut out, &s);
        let back: String = serde_json::from_str(&out).unwrap();
        assert_eq!(back, s, "escaped as {out}");
    }
}

#[test]
fn header_bytes_are_escaped_as_text_and_invalid_utf8_replaced() {
    for (bytes, want) in [
        (&b"curl/8.5.0"[..], r#""curl/8.5.0""#),
        (&b""[..], r#""""#),
        (&b"a\"b\\c"[..], r#""a\"b\\c""#),
        ("caf\u{e9}".as_bytes(), "\"caf\u{e9}\""),
        (&b"bad\xff"[..], "\"bad\u{fffd}\""),
        (&b"tab\t"[..], r#""tab\t""#),
    ] {
        let mut out = String::new();
        json_escape_bytes_into(&mut out, bytes);
        assert_eq!(out, want, "{bytes:?}");
    }
}

#[test]
fn json_escape_into_appends_literal() {
    let mut out = String::from("\"k\":");
    json_escape_into(&mut out, "a\"b");
    assert_eq!(out, r#""k":"a\"b""#);
    let mut out = String::new();
    json_escape_into(&mut out, "");
    assert_eq!(out, r#""""#);
    let mut out = String::new();
    json_escape_into(&mut out, "\u{1}\u{2028}");
    assert_eq!(out, r#""\u0001\u2028""#);
}

#[test]
fn json_fields_fragment_is_spliced_verbatim() {
    let mut fragment = String::new();
    fragment.push_str("\"host\":");
    json_escape_into(&mut fragment, "a\"b");
    fragment.push_str(",\"port\":80,\"tls\":true");

    // &str / String values take the allocation-free path.
    let (line, map) = one_line(|| {
        tracing::info!(json_fields = fragment.as_str(), "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","host":"a\"b","port":80,"tls":true}"#
    );
    assert_eq!(map["host"], "a\"b");
    assert!(!map.contains_key("json_fields"));

    // `%` (Display) works too.
    let (line, _) = one_line(|| {
        tracing::info!(json_fields = %fragment, "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","host":"a\"b","port":80,"tls":true}"#
    );

    // Owned String.
    let owned = fragment.clone();
    let (line, _) = one_line(move || {
        tracing::info!(json_fields = owned, "Request");
    });
    assert!(line.ends_with(r#""msg":"Request","host":"a\"b","port":80,"tls":true}"#));
}

#[test]
fn string_lists_are_written_as_slog_writes_a_go_slice() {
    let mut fragment = String::new();
    json_string_list_member(&mut fragment, "targets", &["a:80".into(), "b\"c".into()]);
    fragment.push(',');
    json_string_list_member(&mut fragment, "allowlist", &[]);
    let (line, _) = one_line(|| {
        tracing::info!(service = "app", json_fields = fragment.as_str(), "m");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"m","service":"app","targets":["a:80","b\"c"],"allowlist":null}"#
    );
}

#[test]
fn json_fields_keeps_field_position_and_skips_empty() {
    let (line, _) = one_line(|| {
        tracing::info!(a = 1, json_fields = "\"b\":2", c = 3, "m");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"m","a":1,"b":2,"c":3}"#
    );
    let (line, _) = one_line(|| {
        tracing::info!(json_fields = "", "m");
    });
    assert_eq!(without_time(&line), r#","level":"INFO","msg":"m"}"#);
    let empty = String::new();
    let (line, _) = one_line(|| {
        tracing::info!(json_fields = %empty, c = 3, "m");
    });
    assert_eq!(without_time(&line), r#","level":"INFO","msg":"m","c":3}"#);
}

#[test]
fn field_named_target_both_spellings() {
    let addr = "10.0.0.1:3000";
    let (line, map) = one_line(|| {
        tracing::info!(target = %addr, "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","target":"10.0.0.1:3000"}"#
    );
    assert_eq!(map["target"], addr);

    let (line, _) = one_line(|| {
        tracing::info!("target" = %addr, status = 200, "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","target":"10.0.0.1:3000","status":200}"#
    );

    // `target:` (colon) sets the metadata target, which is not printed.
    let (line, map) = one_line(|| {
        tracing::info!(target: "kamal_proxy::access", host = "h", "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","host":"h"}"#
    );
    assert!(!map.contains_key("target"));

    // Metadata target and a `target` field together (the identifier
    // spelling; see the module docs for why not the literal one here).
    let (line, _) = one_line(|| {
        tracing::info!(target: "access", target = %addr, "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","target":"10.0.0.1:3000"}"#
    );
    let (line, _) = one_line(|| {
        tracing::info!(target: "access", { "target" = %addr }, "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","target":"10.0.0.1:3000"}"#
    );

    // Plain &str value, no sigil, and a raw identifier.
    let (line, _) = one_line(|| {
        tracing::info!(target = addr, "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","target":"10.0.0.1:3000"}"#
    );
    let (line, _) = one_line(|| {
        tracing::info!(r#target = addr, "Request");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"INFO","msg":"Request","target":"10.0.0.1:3000"}"#
    );
}

#[test]
fn spans_are_not_printed() {
    let (line, _) = one_line(|| {
        let span = tracing::info_span!("conn", peer = "p");
        let _entered = span.enter();
        tracing::warn!(x = 1, "inside");
    });
    assert_eq!(
        without_time(&line),
        r#","level":"WARN","msg":"inside","x":1}"#
    );
}

#[test]
fn field_names_are_escaped() {
    let (line, map) = one_line(|| {
        tracing::info!("we\"ird" = 1, "dotted.name" = 2, "m");
    });
    assert!(line.contains(r#","we\"ird":1,"dotted.name":2}"#), "{line}");
    assert_eq!(map["we\"ird"], 1);
}

#[test]
fn many_events_one_line_each() {
    let out = capture(|| {
        for i in 0..100 {
            tracing::info!(i, "n");
        }
    });
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 100);
    for (i, line) in lines.iter().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["i"], i);
    }
}

#[test]
fn rfc3339_formatting() {
    let at = |secs: u64, nanos: u32| UNIX_EPOCH + Duration::new(secs, nanos);
    let cases: &[(SystemTime, &str)] = &[
        (UNIX_EPOCH, "1970-01-01T00:00:00Z"),
        (at(0, 1), "1970-01-01T00:00:00.000000001Z"),
        (at(0, 100_000_000), "1970-01-01T00:00:00.1Z"),
        (at(0, 120_000_000), "1970-01-01T00:00:00.12Z"),
        (at(0, 999_999_999), "1970-01-01T00:00:00.999999999Z"),
        (at(951_782_400, 0), "2000-02-29T00:00:00Z"),
        // The second before, again: each thread keeps only its last second's text.
        (at(0, 50), "1970-01-01T00:00:00.00000005Z"),
        (at(951_782_400, 7), "2000-02-29T00:00:00.000000007Z"),
        (at(951_868_799, 0), "2000-02-29T23:59:59Z"),
        (at(951_868_800, 0), "2000-03-01T00:00:00Z"),
        (at(1_709_164_800, 0), "2024-02-29T00:00:00Z"),
        (at(1_735_689_599, 0), "2024-12-31T23:59:59Z"),
        (
            at(1_798_582_443, 123_456_789),
            "2026-12-29T22:14:03.123456789Z",
        ),
        (
            at(1_795_990_443, 123_456_789),
            "2026-11-29T22:14:03.123456789Z",
        ),
        (at(4_102_444_800, 0), "2100-01-01T00:00:00Z"),
        (at(4_107_542_400, 0), "2100-03-01T00:00:00Z"),
        (at(253_402_300_799, 0), "9999-12-31T23:59:59Z"),
        (UNIX_EPOCH - Duration::from_secs(1), "1969-12-31T23:59:59Z"),
        (
            UNIX_EPOCH - Duration::from_nanos(1),
            "1969-12-31T23:59:59.999999999Z",
        ),
        (
            UNIX_EPOCH - Duration::new(86_400, 500_000_000),
            "1969-12-30T23:59:59.5Z",
        ),
        (
            UNIX_EPOCH - Duration::from_secs(2_208_988_800),
            "1900-01-01T00:00:00Z",
        ),
    ];
    for &(t, want) in cases {
        assert_eq!(rfc3339_nano_utc(t), want);
    }
}

#[test]
fn civil_from_days_matches_day_by_day_walk() {
    // Walk the calendar one day at a time from 1600-01-01 to 2400-12-31
    // with the plain Gregorian rules and compare every day.
    fn is_leap(y: i64) -> bool {
        (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
    }
    fn month_len(y: i64, m: u32) -> u32 {
        match m {
            2 if is_leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        }
    }
    // Days from 1600-01-01 to 1970-01-01.
    let start: i64 = -135_140;
    assert_eq!(civil_from_days(start), (1600, 1, 1));
    let (mut y, mut m, mut d) = (1600i64, 1u32, 1u32);
    for days in start..start + 300_000 {
        assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
        d += 1;
        if d > month_len(y, m) {
            d = 1;
            m += 1;
            if m > 12 {
                m = 1;
                y += 1;
            }
        }
    }
}

#[test]
fn subscriber_level_filter() {
    for (debug, want) in [
        (false, vec!["INFO", "WARN"]),
        (true, vec!["DEBUG", "INFO", "WARN"]),
    ] {
        let buf = Buf::default();
        tracing::subscriber::with_default(build_subscriber(debug, buf.clone()), || {
            tracing::trace!("t");
            tracing::debug!("d");
            tracing::info!("i");
            tracing::warn!("w");
        });
        let levels: Vec<String> = buf
            .contents()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                v["level"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(levels, want, "debug={debug}");
    }
}

/// Each event handed to a [`sink::Sink`] as its own batch.
#[derive(Clone)]
struct ToSink(sink::Sink);

impl io::Write for ToSink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut line = String::from_utf8(data.to_vec()).unwrap();
        assert!(self.0.send(&mut line), "the writer stopped early");
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for ToSink {
    type Writer = ToSink;

    fn make_writer(&'a self) -> ToSink {
        self.clone()
    }
}

#[test]
fn the_writer_thread_delivers_every_line_in_order_by_the_guards_drop() {
    // As `init` builds it, over a buffer instead of stdout, with a queue of a few bytes so
    // that nearly every line waits for room (back-pressure, nothing dropped).
    let buf = Buf::default();
    let (sink, guard) = sink::Sink::new(buf.clone(), 4, "test-log").unwrap();
    tracing::subscriber::with_default(build_subscriber(false, ToSink(sink)), || {
        for i in 0..500 {
            tracing::info!(i, "line");
        }
    });
    drop(guard);
    let out = buf.contents();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 500, "lines were dropped");
    for (i, line) in lines.iter().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["i"], i);
    }
}

#[test]
fn plain_check_matches_a_byte_by_byte_test_at_every_length_and_position() {
    let byte_by_byte = |bytes: &[u8]| {
        bytes
            .iter()
            .all(|&b| (0x20..0x80).contains(&b) && b != b'"' && b != b'\\')
    };
    // Every byte value at every position of every length up to three 16-byte blocks, in
    // an otherwise plain value: the word and block checks must see each one.
    for len in 0..=48usize {
        let clean = vec![b'a'; len];
        assert!(super::json::plain(&clean), "{len} plain bytes");
        for at in 0..len {
            for b in 0..=u8::MAX {
                let mut value = clean.clone();
                value[at] = b;
                assert_eq!(
                    super::json::plain(&value),
                    byte_by_byte(&value),
                    "byte {b:#04x} at {at} of {len}"
                );
            }
        }
    }
}
