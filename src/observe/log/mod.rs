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

/// Bytes of lines the log writer thread may fall behind by before loggers wait (about
/// 8,000 access lines).
const LOG_QUEUE_BYTES: usize = 4 << 20;

mod batch;
mod event;
mod json;
mod sink;
mod time;

pub use batch::{
    WORKER_FLUSH_DELAY, flush_thread, thread_idle, thread_stopping, worker_idle, write_line,
};
pub use event::SlogJson;
pub use json::{json_escape_bytes_into, json_escape_into, json_string_list_member, plain};
pub use time::{push_rfc3339_nano_utc, rfc3339_nano_utc};

pub use sink::Guard;

use tracing::{Level, Subscriber};
use tracing_subscriber::fmt::MakeWriter;

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
/// Lines are handed to a dedicated writer thread (`sink`) so request-handling threads
/// never wait on the stdout lock or a slow pipe. Nothing is dropped: when the writer
/// falls [`LOG_QUEUE_BYTES`] behind, logging threads wait (back-pressure).
///
/// Keep the returned guard alive for the life of the process (e.g. bind it in
/// `main`); dropping it writes the queued lines. `std::process::exit` skips
/// destructors, so drop the guard before calling it. If a global subscriber
/// was already installed (a second call), the existing one stays in place.
/// `None`: the writer thread could not start, and lines are written to stdout by the
/// threads that log them.
pub fn init(debug: bool) -> Option<Guard> {
    let guard = match sink::Sink::new(std::io::stdout(), LOG_QUEUE_BYTES, "kamal-proxy-log") {
        // Access lines are batched per thread (see `batch`) and reach the writer thread;
        // other events first push out their thread's batch, so each thread's lines keep
        // their order.
        Ok((sink, guard)) => {
            batch::set_sink(sink);
            Some(guard)
        }
        Err(e) => {
            eprintln!("kamal-proxy: no log writer thread ({e}); logging from each thread");
            None
        }
    };
    // Ignoring the error keeps the first subscriber; the new writer thread
    // then simply idles until the guard is dropped.
    let _ = tracing::subscriber::set_global_default(build_subscriber(debug, batch::InOrder));
    guard
}

#[cfg(test)]
mod tests;
