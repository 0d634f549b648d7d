//! Timestamps as slog writes them: Go's RFC 3339 with nanoseconds, in UTC.

use crate::observe::text::{ascii, put_padded};
use std::cell::Cell;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

thread_local! {
    /// This thread's last whole second (since the epoch) and its
    /// `YYYY-MM-DDTHH:MM:SS`.
    static LAST_SECOND: Cell<(i64, [u8; 19])> = const { Cell::new((i64::MIN, [0; 19])) };
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

/// Appends [`rfc3339_nano_utc`] to `out`.
pub fn push_rfc3339_nano_utc(out: &mut String, t: SystemTime) {
    let _ = write_rfc3339_nano_utc(out, t);
}

/// Writes [`rfc3339_nano_utc`] without allocating.
///
/// Always UTC (`Z`): the upstream Docker image has no local zone, so slog
/// prints `Z` there too, and it avoids depending on the host's tz database.
pub(super) fn write_rfc3339_nano_utc<W: fmt::Write + ?Sized>(
    out: &mut W,
    t: SystemTime,
) -> fmt::Result {
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
    // Every line carries a time stamp: digits by hand rather than through `fmt`, and the
    // date and time of day once a second (lines mostly share their second).
    if let Some(whole) = LAST_SECOND
        .with(|last| {
            let (at, text) = last.get();
            (at == secs).then_some(text)
        })
        .or_else(|| {
            let text = whole_second(secs)?;
            LAST_SECOND.with(|last| last.set((secs, text)));
            Some(text)
        })
    {
        let mut buf = *b"0000-00-00T00:00:00.000000000Z";
        buf[..19].copy_from_slice(&whole);
        let len = if nanos == 0 {
            19
        } else {
            put_padded(&mut buf[20..29], u64::from(nanos));
            // Trailing zeros of the fraction are dropped, as Go does.
            let mut end = 29;
            while buf[end - 1] == b'0' {
                end -= 1;
            }
            end
        };
        buf[len] = b'Z';
        // Only ASCII digits and separators were written.
        return out.write_str(ascii(&buf[..=len]));
    }
    // A year outside 0..=9999.
    let second_of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
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

/// `YYYY-MM-DDTHH:MM:SS` for `secs` since the epoch; `None` for a year of more or fewer
/// than four digits.
fn whole_second(secs: i64) -> Option<[u8; 19]> {
    let second_of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    if !(0..=9999).contains(&year) {
        return None;
    }
    let mut text = *b"0000-00-00T00:00:00";
    put_padded(&mut text[0..4], year as u64);
    put_padded(&mut text[5..7], u64::from(month));
    put_padded(&mut text[8..10], u64::from(day));
    put_padded(&mut text[11..13], (second_of_day / 3600) as u64);
    put_padded(&mut text[14..16], (second_of_day / 60 % 60) as u64);
    put_padded(&mut text[17..19], (second_of_day % 60) as u64);
    Some(text)
}

/// Converts days since 1970-01-01 to a proleptic Gregorian (year, month,
/// day), using Howard Hinnant's `civil_from_days` algorithm: shift the year
/// to start on March 1st so the leap day is last, then split into 400-year
/// eras (146097 days each), which repeat exactly.
pub(super) fn civil_from_days(days: i64) -> (i64, u32, u32) {
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
