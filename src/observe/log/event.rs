//! The event formatter: one Go `log/slog` `JSONHandler` line per tracing event.

use std::fmt::{self, Write as _};
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use super::json::{Escaping, write_escaped, write_go_json_float};
use super::time::write_rfc3339_nano_utc;

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
pub(super) fn write_event<W: fmt::Write>(
    out: &mut W,
    now: SystemTime,
    event: &Event<'_>,
) -> fmt::Result {
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
