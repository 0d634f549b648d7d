//! slog-compatible JSON log lines for `tracing`.
//!
//! Upstream kamal-proxy logs with Go's `log/slog` JSON handler on stdout, and
//! operators feed those lines to log shippers and `jq` scripts, so we emit the
//! same shape: one JSON object per line with the keys
//! `time`, `level`, `msg`, then the event's own fields in call order:
//!
//! ```text
//! {"time":"2026-11-29T22:14:03.123456789Z","level":"INFO","msg":"Request","host":"a","port":80}
//! ```
//!
//! tracing's own metadata (target, module path, file, line, spans) is *not*
//! printed: slog has no such keys, and our access log has a field that is
//! literally called `target` which must not collide with anything.
//!
//! # Writing a field named `target`
//!
//! In tracing 0.1's macros `target:` (with a colon) sets the event's metadata
//! target, but `target = value` (with `=`) is an ordinary field named
//! `target`. Write it as an identifier:
//!
//! ```ignore
//! tracing::info!(target = %addr, status = 200, "Request");
//! ```
//!
//! `r#target = ...` and the string-literal form `"target" = %addr` also work,
//! with one trap: after a `target:`/`name:` prefix a string-literal field
//! cannot come first (`info!(target: "x", "target" = %a, "m")` fails to
//! compile, the literal is taken for the format string) — the identifier form
//! or braces (`info!(target: "x", { "target" = %a }, "m")`) are fine. Never
//! write `target: addr` meaning the field: that silently changes the metadata
//! target instead, and the value never reaches the log line. The tests pin
//! all of these spellings.
//!
//! # The `json_fields` fast path
//!
//! The access log has ~20 attributes per request. Recording them as 20
//! tracing fields would cost 20 visitor calls plus escaping on the hot path,
//! so the access log pre-serialises them (with [`json_escape_into`]) into a
//! fragment such as `"host":"a","port":80` and passes it as one field named
//! `json_fields`; the formatter splices that fragment verbatim into the
//! object, at that field's position, instead of writing a `json_fields` key.
//! The fragment must be a comma-separated list of `"key":value` members with
//! no leading or trailing comma; an empty fragment is skipped.

use std::fmt::{self, Write as _};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// Name of the field whose value is a pre-serialised JSON fragment.
const JSON_FIELDS: &str = "json_fields";

/// Name tracing gives to the format-string part of an event.
const MESSAGE: &str = "message";

/// Event formatter producing Go `log/slog` `JSONHandler` lines.
///
/// Use with `tracing_subscriber::fmt().event_format(SlogJson)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlogJson;

impl<S, N> FormatEvent<S, N> for SlogJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write_event(&mut writer, SystemTime::now(), event)
    }
}

/// Writes one complete line for `event`, stamped with `now`.
///
/// tracing-subscriber's fmt layer hands us a writer backed by a thread-local
/// `String` and copies it to the real output in one go afterwards, so we
/// write straight into it. Because `msg` must precede the other fields but
/// tracing may deliver the message anywhere in the field list, the event is
/// visited twice (once for the message, once for the rest) rather than
/// buffering the fields in a temporary string.
fn write_event<W: fmt::Write>(out: &mut W, now: SystemTime, event: &Event<'_>) -> fmt::Result {
    out.write_str("{\"time\":\"")?;
    write_rfc3339_nano_utc(out, now)?;
    out.write_str("\",\"level\":\"")?;
    out.write_str(level_name(event.metadata().level()))?;
    // slog always writes `msg`, even when empty.
    out.write_str("\",\"msg\":\"")?;
    let mut message = MessageVisitor {
        out: &mut *out,
        result: Ok(()),
    };
    event.record(&mut message);
    message.result?;
    out.write_char('"')?;
    let mut fields = FieldsVisitor {
        out: &mut *out,
        result: Ok(()),
    };
    event.record(&mut fields);
    fields.result?;
    out.write_str("}\n")
}

/// slog's level names. tracing's TRACE (below DEBUG) has no slog name; slog
/// prints a level 4 below DEBUG as `DEBUG-4`, so we do the same.
fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "DEBUG-4",
    }
}

/// First pass: writes only the (escaped) message text.
struct MessageVisitor<'w, W: fmt::Write> {
    out: &'w mut W,
    result: fmt::Result,
}

impl<W: fmt::Write> Visit for MessageVisitor<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.result.is_ok() && field.name() == MESSAGE {
            self.result = write_escaped(self.out, value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // The usual `info!("text {x}")` message arrives here as
        // `fmt::Arguments`, whose Debug output is the formatted text.
        if self.result.is_ok() && field.name() == MESSAGE {
            self.result = write!(Escaping(&mut *self.out), "{value:?}");
        }
    }
}

/// Second pass: writes every field except the message, each as
/// `,"name":value`.
struct FieldsVisitor<'w, W: fmt::Write> {
    out: &'w mut W,
    result: fmt::Result,
}

impl<W: fmt::Write> FieldsVisitor<'_, W> {
    /// Runs `write` for an ordinary field after its key, unless an earlier
    /// write failed or the field is handled elsewhere.
    fn field(&mut self, field: &Field, write: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_err() || field.name() == MESSAGE {
            return;
        }
        self.result = (|| {
            self.out.write_str(",\"")?;
            write_escaped(self.out, field.name())?;
            self.out.write_str("\":")?;
            write(self.out)
        })();
    }

    fn splice(&mut self, fragment: &str) {
        if self.result.is_ok() && !fragment.is_empty() {
            self.result = self
                .out
                .write_char(',')
                .and_then(|()| self.out.write_str(fragment));
        }
    }
}

impl<W: fmt::Write> Visit for FieldsVisitor<'_, W> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.field(field, |out| write_go_json_float(out, value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, |out| write!(out, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, |out| write!(out, "{value}"));
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.field(field, |out| write!(out, "{value}"));
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.field(field, |out| write!(out, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, |out| {
            out.write_str(if value { "true" } else { "false" })
        });
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == JSON_FIELDS {
            self.splice(value);
            return;
        }
        self.field(field, |out| {
            out.write_char('"')?;
            write_escaped(out, value)?;
            out.write_char('"')
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == JSON_FIELDS {
            // `json_fields = %fragment` comes through Debug. We must know
            // whether it is empty before writing the separating comma, so
            // this (rarer) spelling costs one allocation; callers on the hot
            // path should pass a `&str`/`String`, which uses `record_str`.
            let fragment = format!("{value:?}");
            self.splice(&fragment);
            return;
        }
        self.field(field, |out| {
            out.write_char('"')?;
            write!(Escaping(&mut *out), "{value:?}")?;
            out.write_char('"')
        });
    }
}

/// Adapter that JSON-escapes everything written through it, so `Debug` and
/// `Display` values can be escaped without formatting into a temporary.
struct Escaping<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // `fmt` never splits a `&str` inside a character, so escaping each
        // chunk independently is the same as escaping the whole.
        write_escaped(self.0, s)
    }
}

/// Appends `s` as a JSON string literal (with the surrounding quotes),
/// escaped exactly as slog's JSON handler does. Used to build `json_fields`
/// fragments, e.g. for keys and string values of the access log.
pub fn json_escape_into(out: &mut String, s: &str) {
    out.push('"');
    // Writing to a String cannot fail.
    let _ = write_escaped(out, s);
    out.push('"');
}

/// Writes the JSON-escaped contents of `s` (without quotes).
///
/// This reproduces slog's `appendEscapedJSONString` byte for byte rather
/// than using serde_json, whose output differs in two places: slog writes
/// U+2028/U+2029 as `\u2028`/`\u2029` (they break JavaScript consumers) and
/// writes `\b`/`\f` as `\u0008`/`\u000c`. Like slog (and unlike Go's default
/// `json.Marshal`) it does not escape `<`, `>` and `&`. The tests check that
/// serde_json decodes our output back to the input.
fn write_escaped<W: fmt::Write + ?Sized>(out: &mut W, s: &str) -> fmt::Result {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    // Unescaped runs are copied in one `write_str`. Every cut point is an
    // ASCII byte or the lead byte of U+2028/U+2029, so slices of `s` always
    // fall on character boundaries.
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (escape, width): (&str, usize) = match b {
            b'"' => ("\\\"", 1),
            b'\\' => ("\\\\", 1),
            b'\n' => ("\\n", 1),
            b'\r' => ("\\r", 1),
            b'\t' => ("\\t", 1),
            0x00..=0x1f => ("", 1),
            // U+2028 is E2 80 A8, U+2029 is E2 80 A9 in UTF-8.
            0xe2 if bytes.get(i + 1) == Some(&0x80) && bytes.get(i + 2) == Some(&0xa8) => {
                ("\\u2028", 3)
            }
            0xe2 if bytes.get(i + 1) == Some(&0x80) && bytes.get(i + 2) == Some(&0xa9) => {
                ("\\u2029", 3)
            }
            _ => {
                i += 1;
                continue;
            }
        };
        out.write_str(&s[start..i])?;
        if escape.is_empty() {
            // Other control characters: \u00XX with lowercase hex, as slog.
            out.write_str("\\u00")?;
            out.write_char(char::from(HEX[usize::from(b >> 4)]))?;
            out.write_char(char::from(HEX[usize::from(b & 0x0f)]))?;
        } else {
            out.write_str(escape)?;
        }
        i += width;
        start = i;
    }
    out.write_str(&s[start..])
}

/// Writes a float the way slog does (it defers to Go's `json.Marshal`):
/// shortest round-trip digits, plain notation for 1e-6 <= |x| < 1e21,
/// otherwise exponent notation with an explicit `+` (`1e+21`, `1.5e-7`).
/// NaN and infinities are not JSON; slog then writes the marshalling error
/// as a string value, which we reproduce.
fn write_go_json_float<W: fmt::Write>(out: &mut W, value: f64) -> fmt::Result {
    if value.is_nan() {
        return out.write_str("\"!ERROR:json: unsupported value: NaN\"");
    }
    if value.is_infinite() {
        let sign = if value > 0.0 { '+' } else { '-' };
        return write!(out, "\"!ERROR:json: unsupported value: {sign}Inf\"");
    }
    let abs = value.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let text = format!("{value:e}");
        match text.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => write!(out, "{mantissa}e+{exp}"),
            _ => out.write_str(&text),
        }
    } else {
        write!(out, "{value}")
    }
}

/// Formats `t` as RFC 3339 in UTC with Go's `RFC3339Nano` layout
/// (`2006-01-02T15:04:05.999999999Z07:00`), which is what slog's JSON handler
/// uses for `time`: up to nine fractional digits with trailing zeros removed,
/// and no fraction at all on a whole second.
pub fn rfc3339_nano_utc(t: SystemTime) -> String {
    let mut out = String::with_capacity(30);
    // Writing to a String cannot fail.
    let _ = write_rfc3339_nano_utc(&mut out, t);
    out
}

/// Writes [`rfc3339_nano_utc`] without allocating.
///
/// Always UTC (`Z`): the upstream Docker image has no local zone, so slog
/// prints `Z` there too, and it avoids depending on the host's tz database.
fn write_rfc3339_nano_utc<W: fmt::Write + ?Sized>(out: &mut W, t: SystemTime) -> fmt::Result {
    // Seconds are floored (not truncated toward zero) so that times before
    // the epoch get a positive sub-second part, as calendars expect.
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_nanos(),
        ),
        Err(before) => {
            let d = before.duration();
            let secs = i64::try_from(d.as_secs()).map_or(i64::MIN, |s| -s);
            match d.subsec_nanos() {
                0 => (secs, 0),
                n => (secs.saturating_sub(1), 1_000_000_000 - n),
            }
        }
    };
    let days = secs.div_euclid(86_400);
    let second_of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    )?;
    if nanos != 0 {
        let mut digits = nanos;
        let mut width = 9;
        while digits % 10 == 0 {
            digits /= 10;
            width -= 1;
        }
        write!(out, ".{digits:0width$}")?;
    }
    out.write_char('Z')
}

/// Converts days since 1970-01-01 to a proleptic Gregorian (year, month,
/// day), using Howard Hinnant's `civil_from_days` algorithm: shift the year
/// to start on March 1st so the leap day is last, then split into 400-year
/// eras (146097 days each), which repeat exactly.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch from 1970-01-01 to 0000-03-01.
    let z = days.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097); // [0, 146096]
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365; // [0, 399]
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100); // [0, 365]
    let month_from_march = (5 * day_of_year + 2) / 153; // [0, 11]
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1; // [1, 31]
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    }; // [1, 12]
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // Both are small by construction (see ranges above).
    (year, month as u32, day as u32)
}

/// Builds the subscriber [`init`] installs, over any writer (tests use an
/// in-memory one).
fn build_subscriber<W>(debug: bool, writer: W) -> impl Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    // A static max level (rather than an EnvFilter) lets tracing skip
    // disabled `debug!` callsites almost for free.
    let level = if debug { Level::DEBUG } else { Level::INFO };
    tracing_subscriber::fmt()
        .event_format(SlogJson)
        .with_writer(writer)
        .with_max_level(level)
        .finish()
}

/// Installs the global subscriber: slog-style JSON lines on stdout, at INFO
/// (DEBUG when `debug`).
///
/// Lines are handed to a dedicated writer thread (`tracing_appender`'s
/// non-blocking writer) so request-handling threads never wait on the stdout
/// lock or a slow pipe. It is built with `lossy(false)`: when its queue is
/// full, logging threads wait (back-pressure) rather than silently dropping
/// access-log lines.
///
/// Keep the returned guard alive for the life of the process (e.g. bind it in
/// `main`); dropping it flushes the queued lines. `std::process::exit` skips
/// destructors, so drop the guard before calling it. If a global subscriber
/// was already installed (a second call), the existing one stays in place.
/// Lines the log writer thread may fall behind by before loggers wait.
const LOG_QUEUE_LINES: usize = 8192;

pub fn init(debug: bool) -> WorkerGuard {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(false)
        // The queue is allocated up front: the default 128,000 lines cost 4 MiB of
        // resident memory for nothing. 8,192 lines absorb any burst a writer thread
        // draining to a pipe falls behind by.
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .thread_name("kamal-proxy-log")
        // The writer thread drains every queued line, then flushes: behind a BufWriter
        // a burst of lines costs one write(2) instead of one per line (stdout alone is
        // line-buffered), and a lone line is still written at once.
        .finish(std::io::BufWriter::with_capacity(
            64 * 1024,
            std::io::stdout(),
        ));
    // Ignoring the error keeps the first subscriber; the new writer thread
    // then simply idles until the guard is dropped.
    let _ = tracing::subscriber::set_global_default(build_subscriber(debug, writer));
    guard
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::io;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

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
        let escaped = r#"quote\" backslash\\ nl\n cr\r tab\t nul\u0000 bell\u0007 bs\u0008 ff\u000c us\u001f "#;
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

    #[test]
    fn non_blocking_writer_delivers_all_lines_on_guard_drop() {
        // Same construction as `init`, over a buffer instead of stdout, with
        // a tiny queue so that back-pressure (lossy=false) is exercised.
        let buf = Buf::default();
        let (writer, guard) = NonBlockingBuilder::default()
            .lossy(false)
            .buffered_lines_limit(4)
            .finish(buf.clone());
        tracing::subscriber::with_default(build_subscriber(false, writer), || {
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
}
