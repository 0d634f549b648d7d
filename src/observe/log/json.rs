//! JSON text as slog writes it: string escaping and Go's float notation.

use std::fmt;

use crate::short_copy::append_str;

/// Adapter that JSON-escapes everything written through it, so `Debug` and
/// `Display` values can be escaped without formatting into a temporary.
pub(super) struct Escaping<'a, W: fmt::Write + ?Sized>(pub(super) &'a mut W);

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
///
/// Inlined, with the rare escaping out of line: the access line calls it and
/// [`json_escape_bytes_into`] for nine short values, and the call cost about as much as
/// the test.
#[inline]
pub fn json_escape_into(out: &mut String, s: &str) {
    // Nearly every value of an access line (host, path, ids, user agent) has nothing to
    // escape: a test the compiler vectorises, and one copy with the quotes.
    if plain(s.as_bytes()) {
        push_quoted(out, s);
    } else {
        push_escaped(out, s);
    }
}

/// Appends text that needs no escaping (checked, or digits, a method, a protocol) in quotes.
#[inline]
fn push_quoted(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    out.push('"');
    append_str(out, text);
    out.push('"');
}

#[cold]
#[inline(never)]
fn push_escaped(out: &mut String, s: &str) {
    out.push('"');
    // Writing to a String cannot fail.
    let _ = write_escaped(out, s);
    out.push('"');
}

/// Appends the member `"key":["a","b"]` to a `json_fields` fragment, as slog writes a
/// `[]string` attribute. An empty list is `null`: an empty list reaches upstream's server as
/// Go's nil slice (gob does not send empty slices), which slog writes as `null`.
pub fn json_string_list_member(out: &mut String, key: &str, values: &[String]) {
    json_escape_into(out, key);
    out.push(':');
    if values.is_empty() {
        out.push_str("null");
        return;
    }
    out.push('[');
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_escape_into(out, v);
    }
    out.push(']');
}

/// Appends header bytes as a JSON string: as they are when they are plain ASCII (no
/// UTF-8 check needed), else decoded as UTF-8 (invalid sequences replaced) and escaped.
#[inline]
pub fn json_escape_bytes_into(out: &mut String, bytes: &[u8]) {
    if plain(bytes) {
        // SAFETY: `plain` bytes are all ASCII, which is valid UTF-8.
        push_quoted(out, unsafe { std::str::from_utf8_unchecked(bytes) });
    } else {
        push_escaped_bytes(out, bytes);
    }
}

#[cold]
#[inline(never)]
fn push_escaped_bytes(out: &mut String, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => push_escaped(out, text),
        Err(_) => push_escaped(out, &String::from_utf8_lossy(bytes)),
    }
}

/// Nothing in `bytes` to escape, and all of it ASCII. Every access line checks about ten
/// values, most of them short: checked a byte at a time this was ~300 instructions a
/// request. Here 16 bytes at a time (a fold of fixed length, which the compiler turns into a
/// few vector instructions), 8 at a time in a word below that, and the ends by overlapping
/// the last block rather than looping over a remainder.
#[inline]
pub fn plain(bytes: &[u8]) -> bool {
    let n = bytes.len();
    if n >= 16 {
        let clean = bytes.chunks_exact(16).fold(true, |clean, block| {
            clean & plain_block(block.try_into().expect("16 bytes"))
        });
        let last: &[u8; 16] = bytes[n - 16..].try_into().expect("16 bytes");
        return clean & plain_block(last);
    }
    if n >= 8 {
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        return plain_word(word(0)) & plain_word(word(n - 8));
    }
    !bytes.iter().fold(false, |seen, &b| seen | needs_escape(b))
}

#[inline]
fn plain_block(block: &[u8; 16]) -> bool {
    !block.iter().fold(false, |seen, &b| seen | needs_escape(b))
}

/// [`plain`] for eight bytes in a word: whether any byte is below 0x20, at or above 0x80, a
/// quote or a backslash, with the usual "has a byte less than" and "has a zero byte" tricks
/// (exact as a yes/no answer: a borrow only crosses into a byte above one that matched).
fn plain_word(x: u64) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v;
    let below_space = x.wrapping_sub(ONES * 0x20) & !x;
    let quote = has_zero(x ^ (ONES * u64::from(b'"')));
    let backslash = has_zero(x ^ (ONES * u64::from(b'\\')));
    (x | below_space | quote | backslash) & HIGH == 0
}

/// A byte [`write_escaped`] may have to replace: a quote, a backslash, a control character, or the
/// first byte of U+2028/U+2029 (any non-ASCII byte, to keep the test branch-free). One signed
/// comparison finds both the control characters and the bytes from 0x80 (negative as `i8`),
/// and `|` rather than `||` lets a fixed-length fold of it become vector instructions.
fn needs_escape(b: u8) -> bool {
    ((b as i8) < 0x20) | (b == b'"') | (b == b'\\')
}

/// Writes the JSON-escaped contents of `s` (without quotes).
///
/// This reproduces slog's `appendEscapedJSONString` byte for byte rather
/// than using serde_json, whose output differs in two places: slog writes
/// U+2028/U+2029 as `\u2028`/`\u2029` (they break JavaScript consumers) and
/// writes `\b`/`\f` as `\u0008`/`\u000c`. Like slog (and unlike Go's default
/// `json.Marshal`) it does not escape `<`, `>` and `&`. The tests check that
/// serde_json decodes our output back to the input.
pub(super) fn write_escaped<W: fmt::Write + ?Sized>(out: &mut W, s: &str) -> fmt::Result {
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
pub(super) fn write_go_json_float<W: fmt::Write>(out: &mut W, value: f64) -> fmt::Result {
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
