//! Go duration syntax: `time.ParseDuration` and `time.Duration.String()`.
//!
//! Upstream kamal-proxy parses every duration flag (and every duration field
//! of its deploy options) with Go's `time.ParseDuration`, and prints durations
//! with `Duration.String()`. To be a drop-in replacement we must accept exactly
//! the same strings, reject exactly the same strings with the same messages,
//! and print the same text, so this module follows Go's documented behaviour
//! rather than any Rust duration crate (which all differ in the details:
//! `d` units, spaces, bare numbers, rounding of long fractions, `µ` spelling).
//!
//! Durations are carried as signed nanoseconds (`i64`), like Go's
//! `time.Duration`, so the full Go range (about ±292 years) round-trips.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Nanoseconds in a second: Go's `time.Second`, the unit of every duration we store.
pub const NS_PER_SEC: i64 = 1_000_000_000;

/// A Go `time.Duration`: signed nanoseconds, stored and sent as the bare integer (the
/// state file's and Go's JSON encoding), parsed and printed in Go's syntax.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct GoDuration(i64);

impl GoDuration {
    pub const ZERO: GoDuration = GoDuration(0);

    pub const fn from_nanos(nanos: i64) -> GoDuration {
        GoDuration(nanos)
    }

    pub const fn from_secs(secs: i64) -> GoDuration {
        GoDuration(secs * NS_PER_SEC)
    }

    pub const fn from_millis(ms: i64) -> GoDuration {
        GoDuration(ms * 1_000_000)
    }

    pub const fn nanos(self) -> i64 {
        self.0
    }

    pub const fn is_positive(self) -> bool {
        self.0 > 0
    }

    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// As a `std` duration; a negative one is zero (Go treats a negative timeout as an
    /// already expired one).
    pub fn to_std(self) -> std::time::Duration {
        to_std(self.0)
    }
}

impl fmt::Display for GoDuration {
    /// Go's `Duration.String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl std::str::FromStr for GoDuration {
    type Err = DurationError;

    /// Go's `time.ParseDuration`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(GoDuration)
    }
}

/// Nanoseconds per unit, as Go's `time` package defines them.
const NANOSECOND: u64 = 1;
const MICROSECOND: u64 = 1_000 * NANOSECOND;
const MILLISECOND: u64 = 1_000 * MICROSECOND;
const SECOND: u64 = 1_000 * MILLISECOND;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

/// 2^63: the magnitude of `i64::MIN`. Accumulating the *magnitude* as `u64`
/// and allowing it to reach 2^63 lets `-9223372036854775808ns` parse while
/// `9223372036854775808ns` is rejected, exactly as Go does.
const MAX_MAGNITUDE: u64 = 1 << 63;

/// Why a duration string was rejected. `Display` reproduces Go's messages
/// byte for byte, because upstream surfaces them to users (CLI errors, HTTP
/// 400 bodies) and scripts may match on them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    /// `time: invalid duration "<orig>"` — bad syntax or overflow.
    Invalid { orig: String },
    /// `time: missing unit in duration "<orig>"` — a number with no unit.
    MissingUnit { orig: String },
    /// `time: unknown unit "<unit>" in duration "<orig>"`.
    UnknownUnit { unit: String, orig: String },
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Invalid { orig } => {
                write!(f, "time: invalid duration {}", go_time_quote(orig))
            }
            DurationError::MissingUnit { orig } => {
                write!(f, "time: missing unit in duration {}", go_time_quote(orig))
            }
            DurationError::UnknownUnit { unit, orig } => write!(
                f,
                "time: unknown unit {} in duration {}",
                go_time_quote(unit),
                go_time_quote(orig)
            ),
        }
    }
}

impl std::error::Error for DurationError {}

/// Quotes a string the way Go's `time` package does in its error messages.
///
/// The `time` package cannot import `strconv`, so it has its own small
/// `quote`: printable ASCII is copied (with `"` and `\` backslash-escaped),
/// and every byte of a control character or of any non-ASCII character is
/// written as `\xNN`. That is *not* `strconv.Quote` (which would keep `é`
/// as is and write `\n` as `\n`), so we mirror the `time` variant to get
/// identical messages, e.g. `"\xc2\xb5"` for a lone `µ`.
fn go_time_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c.is_ascii() && c >= ' ' {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    out.push('"');
    out
}

/// Looks up a unit suffix. Both micro spellings are accepted because Go
/// accepts both: U+00B5 MICRO SIGN (what Go prints) and U+03BC GREEK SMALL
/// LETTER MU (what many keyboards produce).
fn unit_nanos(unit: &str) -> Option<u64> {
    match unit {
        "ns" => Some(NANOSECOND),
        "us" | "\u{00b5}s" | "\u{03bc}s" => Some(MICROSECOND),
        "ms" => Some(MILLISECOND),
        "s" => Some(SECOND),
        "m" => Some(MINUTE),
        "h" => Some(HOUR),
        _ => None,
    }
}

/// Splits off the leading run of ASCII digits.
fn split_digits(s: &str) -> (&str, &str) {
    let end = s
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(s.len());
    s.split_at(end)
}

/// Value of the integer part of one `<number><unit>` term, or `None` when it
/// exceeds 2^63 (Go rejects those as invalid, never saturates).
fn integer_part(digits: &str) -> Option<u64> {
    let mut x: u64 = 0;
    for b in digits.bytes() {
        x = x.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        if x > MAX_MAGNITUDE {
            return None;
        }
    }
    Some(x)
}

/// Digits of the fractional part as `(numerator, scale)` so that the fraction
/// is `numerator / scale`.
///
/// Fractions are never an error, however long: like Go, we keep accumulating
/// digits while the numerator stays within 2^63, then ignore the rest (they
/// are worth less than 1e-18 of a unit). `scale` is the matching power of ten
/// as an `f64`, which is exact for every power we can reach (at most 10^19),
/// because the caller reproduces Go's float64 arithmetic with it.
fn fraction_part(digits: &str) -> (u64, f64) {
    let mut x: u64 = 0;
    let mut scale: f64 = 1.0;
    for b in digits.bytes() {
        // Once the next digit could overflow, stop consuming precision; the
        // ignored digits are worth less than 1e-18 of a unit.
        if x > (MAX_MAGNITUDE - 1) / 10 {
            break;
        }
        let y = x * 10 + u64::from(b - b'0');
        if y > MAX_MAGNITUDE {
            break;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale)
}

/// Parses a Go duration string (`"1h30m"`, `"-1.5s"`, `"300ms"`, `"0"`)
/// into signed nanoseconds, with Go's `time.ParseDuration` semantics.
///
/// Grammar: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, or a lone `0` (optionally
/// signed). Every number needs a unit, there is no `d` unit, and no spaces
/// are allowed anywhere.
pub fn parse_duration(s: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid {
        orig: s.to_string(),
    };

    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };

    // A bare zero is the one number that needs no unit.
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }

    // Magnitude accumulated as u64 so that it can reach exactly 2^63 (the
    // magnitude of i64::MIN); the sign is applied at the end.
    let mut total: u64 = 0;
    while !rest.is_empty() {
        // Each term must start with a digit or a decimal point; anything
        // else (a letter, a space, a second sign) is plain invalid syntax.
        let first = rest.as_bytes()[0];
        if !(first == b'.' || first.is_ascii_digit()) {
            return Err(invalid());
        }

        let (int_digits, after_int) = split_digits(rest);
        let int_value = integer_part(int_digits).ok_or_else(invalid)?;
        rest = after_int;

        // Optional fractional part. `5.s` and `.5s` are fine, `.s` is not:
        // at least one digit must appear on one side of the point.
        let mut frac_digits = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let (digits, after_frac) = split_digits(after_dot);
            frac_digits = digits;
            rest = after_frac;
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(invalid());
        }

        // The unit is everything up to the next digit or point, so junk such
        // as `1d` or `5s ` is reported as an *unknown unit*, like Go does.
        let unit_len = rest
            .bytes()
            .position(|b| b == b'.' || b.is_ascii_digit())
            .unwrap_or(rest.len());
        if unit_len == 0 {
            return Err(DurationError::MissingUnit {
                orig: s.to_string(),
            });
        }
        // Safe to slice: the cut is at an ASCII byte or at the end.
        let (unit, after_unit) = rest.split_at(unit_len);
        rest = after_unit;
        let unit_ns = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
            unit: unit.to_string(),
            orig: s.to_string(),
        })?;

        if int_value > MAX_MAGNITUDE / unit_ns {
            return Err(invalid());
        }
        let mut term = int_value * unit_ns;

        let (frac, scale) = fraction_part(frac_digits);
        if frac > 0 {
            // Go computes the fractional nanoseconds in float64 and truncates:
            // `uint64(float64(f) * (float64(unit) / scale))`. We must do the
            // same, not exact decimal arithmetic, because the rounding is
            // observable: Go parses "0.3333333333333333333h" as exactly 20m,
            // whereas exact arithmetic would give 19m59.999999999s. The
            // product is below `unit_ns` (< 2^42), so the cast cannot
            // saturate.
            let frac_ns = (frac as f64 * (unit_ns as f64 / scale)) as u64;
            term = term.checked_add(frac_ns).ok_or_else(invalid)?;
            if term > MAX_MAGNITUDE {
                return Err(invalid());
            }
        }

        // Go lets `total` wrap here when both operands are exactly 2^63
        // (e.g. "-9223372036854775808ns9223372036854775808ns" parses as 0);
        // we deliberately report that as invalid instead.
        total = total.checked_add(term).ok_or_else(invalid)?;
        if total > MAX_MAGNITUDE {
            return Err(invalid());
        }
    }

    if neg {
        // total <= 2^63, so its negation always fits in i64.
        Ok(0i64.wrapping_sub_unsigned(total))
    } else {
        i64::try_from(total).map_err(|_| invalid())
    }
}

/// [`parse_duration`] with the error as a `String`, so it can be used
/// directly as a clap `value_parser` (clap wants `Fn(&str) -> Result<T, E>`
/// where `E` converts into a boxed error; `String` does).
pub fn parse_flag(s: &str) -> Result<GoDuration, String> {
    s.parse().map_err(|e: DurationError| e.to_string())
}

/// Converts Go-style signed nanoseconds to a `std::time::Duration`.
///
/// Negative values become zero: Go code treats a negative timeout the same
/// as an already-expired one, and `std::time::Duration` cannot be negative.
pub fn to_std(nanos: i64) -> std::time::Duration {
    u64::try_from(nanos)
        .map(std::time::Duration::from_nanos)
        .unwrap_or_default()
}

/// Appends `v / 10^prec` as a fraction (".123") with trailing zeros dropped,
/// and the point dropped too when the fraction is zero. Returns `v / 10^prec`.
///
/// Digits are produced least-significant first, so they are collected in a
/// small buffer and appended in order.
fn push_fraction(out: &mut String, v: u64, prec: u32) -> u64 {
    let mut v = v;
    let mut digits = [0u8; 9];
    let mut len = 0usize;
    let mut seen_nonzero = false;
    for _ in 0..prec {
        let digit = (v % 10) as u8;
        seen_nonzero = seen_nonzero || digit != 0;
        if seen_nonzero {
            digits[len] = b'0' + digit;
            len += 1;
        }
        v /= 10;
    }
    if len > 0 {
        out.push('.');
        out.extend(digits[..len].iter().rev().map(|&d| char::from(d)));
    }
    v
}

/// Formats signed nanoseconds exactly like Go's `time.Duration.String()`:
/// `0s`, `1ns`, `1.1µs`, `2.2ms`, `3.3s`, `4m5s`, `5h6m7.001s`, `1h30m0s`.
///
/// Below one second the largest fitting sub-second unit is used, with a
/// fraction; from one second up the form is `[Nh][Nm]N[.fff]s` (hours are the
/// largest unit because days vary in length). The micro sign is U+00B5, as
/// Go prints it.
pub fn format_duration(nanos: i64) -> String {
    let mut out = String::with_capacity(24);
    if nanos < 0 {
        out.push('-');
    }
    // unsigned_abs handles i64::MIN, whose magnitude does not fit in i64.
    let u = nanos.unsigned_abs();

    if u == 0 {
        return "0s".to_string();
    }

    if u < SECOND {
        let (prec, unit) = if u < MICROSECOND {
            (0, "ns")
        } else if u < MILLISECOND {
            (3, "\u{00b5}s")
        } else {
            (6, "ms")
        };
        let mut frac = String::new();
        let whole = push_fraction(&mut frac, u, prec);
        out.push_str(&whole.to_string());
        out.push_str(&frac);
        out.push_str(unit);
        return out;
    }

    let mut frac = String::new();
    let whole_seconds = push_fraction(&mut frac, u, 9);
    let seconds = whole_seconds % 60;
    let total_minutes = whole_seconds / 60;
    if total_minutes > 0 {
        let minutes = total_minutes % 60;
        let hours = total_minutes / 60;
        if hours > 0 {
            out.push_str(&format!("{hours}h"));
        }
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&format!("{seconds}{frac}s"));
    out
}

#[cfg(test)]
mod tests;
