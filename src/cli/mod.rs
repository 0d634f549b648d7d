//! The command line: upstream's commands and flags, with Go/pflag value syntax
//! (`--flag=value`, `--bool=false`, Go durations, repeatable comma-separated lists).
//! Every error prints `Error: <message>` on stderr and exits 1, as upstream does.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Parser, Subcommand};
use std::error::Error as _;

pub mod deploy;
pub mod list;
pub mod rollout;
pub mod run;
pub mod service_cmds;
pub mod upgrade;
pub mod upstream;

use crate::control::{Request, Response, client};

#[derive(Parser, Debug)]
#[command(
    name = "kamal-proxy",
    about = "HTTP proxy for zero downtime deployments",
    long_about = "HTTP proxy for zero downtime deployments, with scale-to-zero.\n\n\
Run the server with `kamal-proxy run`; every other command talks to it over its control socket\n\
($KAMAL_PROXY_SOCKET, else $XDG_RUNTIME_DIR/kamal-proxy.sock, else /tmp/kamal-proxy.sock).",
    disable_version_flag = true,
    // pflag semantics: a repeated scalar flag is not an error, the last one wins.
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the server
    Run(run::RunArgs),
    // The service is collected as a list so a wrong count gets cobra's message
    // (`accepts 1 arg(s), received N`); the usage line still says exactly one. No doc
    // comment here: it would replace the command's own long help (with its example).
    #[command(override_usage = "kamal-proxy deploy <SERVICE> --target=<HOST:PORT> [OPTIONS]")]
    Deploy(Box<deploy::DeployCmd>),
    /// Remove the service
    #[command(visible_alias = "rm", override_usage = "kamal-proxy remove <SERVICE>")]
    Remove(service_cmds::ServiceArg),
    /// Pause a service
    #[command(override_usage = "kamal-proxy pause <SERVICE> [OPTIONS]")]
    Pause(service_cmds::PauseCmd),
    /// Stop a service
    #[command(override_usage = "kamal-proxy stop <SERVICE> [OPTIONS]")]
    Stop(service_cmds::StopCmd),
    /// Resume a service
    #[command(override_usage = "kamal-proxy resume <SERVICE>")]
    Resume(service_cmds::ServiceArg),
    /// List the services currently running
    #[command(visible_alias = "ls")]
    List(list::ListCmd),
    /// Stop accepting, finish in-flight requests, save state and exit (for a proxy
    /// upgrade: the new generation serves meanwhile)
    #[command(
        long_about = "Stop accepting connections, let in-flight requests finish, save the state and exit.\n\n\
Used to end the old generation in a proxy upgrade: a new `kamal-proxy run --reuse-port` has taken\n\
over the listening sockets (see README, \"Upgrading the proxy without dropping requests\"). The\n\
command returns once the drain is over.\n\n\
Example:\n  kamal-proxy drain --drain-timeout=30s"
    )]
    Drain(upgrade::DrainCmd),
    /// Wait for SIGTERM/SIGINT, doing nothing: owns a network namespace for proxy
    /// generations to join
    #[command(hide = true)]
    Hold,
    // About and long help (with examples) are on `RolloutCmd`.
    Rollout(rollout::RolloutCmd),
}

/// Entry point of the binary; returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return report_parse_error(e),
    };
    let result = match cli.command {
        None => {
            let _ = <Cli as clap::CommandFactory>::command().print_help();
            return 0;
        }
        Some(Command::Run(args)) => return run::run(args),
        Some(Command::Deploy(cmd)) => cmd.execute(),
        Some(Command::Remove(a)) => service_cmds::remove(a),
        Some(Command::Pause(c)) => c.execute(),
        Some(Command::Stop(c)) => c.execute(),
        Some(Command::Resume(a)) => service_cmds::resume(a),
        Some(Command::List(c)) => c.execute(),
        Some(Command::Drain(c)) => c.execute(),
        Some(Command::Hold) => return upgrade::hold(),
        Some(Command::Rollout(c)) => c.execute(),
    };
    match result {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("Error: {message}");
            1
        }
    }
}

/// Cobra's `ExactArgs(1)`: service commands name exactly one service.
pub fn exactly_one(args: &[String]) -> Result<String, String> {
    match args {
        [one] => Ok(one.clone()),
        _ => Err(format!("accepts 1 arg(s), received {}", args.len())),
    }
}

/// Sends one request to the running server.
pub fn call(request: Request) -> Result<Response, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let socket = crate::config::socket_path();
    match runtime.block_on(client::call(&socket, &request))? {
        Response::Error(e) => Err(e),
        other => Ok(other),
    }
}

/// Maps clap's errors to upstream's wording; help goes to stdout with exit 0.
fn report_parse_error(e: clap::Error) -> i32 {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            return 0;
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return 0;
        }
        _ => {}
    }
    let context = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        Some(ContextValue::Strings(v)) => v.join(", "),
        _ => String::new(),
    };
    let message = match e.kind() {
        ErrorKind::UnknownArgument => {
            let arg = context(ContextKind::InvalidArg);
            let flag = arg.split('=').next().unwrap_or(&arg).to_string();
            if flag.starts_with("--") {
                format!("unknown flag: {flag}")
            } else if flag.starts_with('-') {
                format!(
                    "unknown shorthand flag: '{}' in {flag}",
                    flag.trim_start_matches('-')
                )
            } else {
                format!("unexpected argument \"{flag}\"")
            }
        }
        ErrorKind::InvalidSubcommand => {
            // The command the unknown one was given to (`kamal-proxy rollout`), from clap's
            // usage line, for cobra's wording.
            let rendered = e.render().to_string();
            let parent = rendered
                .lines()
                .find_map(|l| l.trim().strip_prefix("Usage: "))
                .map(|usage| {
                    usage
                        .split(' ')
                        .take_while(|w| !w.starts_with(['[', '<', '-']))
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "kamal-proxy".to_string());
            format!(
                "unknown command \"{}\" for \"{parent}\"\nRun '{parent} --help' for usage.",
                context(ContextKind::InvalidSubcommand)
            )
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let arg = context(ContextKind::InvalidArg);
            let flag = arg
                .split([' ', '=', '['])
                .next()
                .unwrap_or(&arg)
                .to_string();
            let value = context(ContextKind::InvalidValue);
            let reason = e
                .source()
                .map(|s| s.to_string())
                .unwrap_or_else(|| "invalid value".to_string());
            format!("invalid argument \"{value}\" for \"{flag}\" flag: {reason}")
        }
        ErrorKind::MissingRequiredArgument => {
            let missing = context(ContextKind::InvalidArg);
            if missing.starts_with("--") {
                let names: Vec<String> = missing
                    .split(", ")
                    .map(|m| {
                        format!(
                            "\"{}\"",
                            m.trim_start_matches("--")
                                .split([' ', '=', '<'])
                                .next()
                                .unwrap_or("")
                        )
                    })
                    .collect();
                format!("required flag(s) {} not set", names.join(", "))
            } else {
                "accepts 1 arg(s), received 0".to_string()
            }
        }
        ErrorKind::TooManyValues | ErrorKind::WrongNumberOfValues => {
            format!("too many arguments: {}", context(ContextKind::InvalidValue))
        }
        _ => {
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("").trim();
            first.strip_prefix("error: ").unwrap_or(first).to_string()
        }
    };
    eprintln!("Error: {message}");
    1
}

/// Flag value parsers with Go's semantics.
pub mod values {
    /// Go's `strconv.ParseBool`, for `--flag=false`.
    pub fn go_bool(s: &str) -> Result<bool, String> {
        crate::config::parse_go_bool(s)
    }

    pub fn duration(s: &str) -> Result<crate::gotime::GoDuration, String> {
        crate::gotime::parse_flag(s)
    }

    /// pflag's integers: Go's `strconv.ParseInt(s, 0, 64)`, for byte sizes and ports.
    ///
    /// Base 0 is Go's literal syntax, which a drop-in must accept as upstream does: an
    /// optional sign, then `0x`/`0X` hex, `0o`/`0O` or a bare leading `0` octal (so `010`
    /// is 8), `0b`/`0B` binary, else decimal, with `_` allowed between digits.
    pub fn int64(s: &str) -> Result<i64, String> {
        let error = |why: &str| format!("strconv.ParseInt: parsing {}: {why}", go_quote(s));
        let (negative, unsigned) = match s.as_bytes().first() {
            Some(b'+') => (false, &s[1..]),
            Some(b'-') => (true, &s[1..]),
            _ => (false, s),
        };
        let magnitude = parse_uint_base0(unsigned).map_err(|e| match e {
            UintError::Syntax => error("invalid syntax"),
            UintError::Range => error("value out of range"),
        })?;
        if negative {
            0i64.checked_sub_unsigned(magnitude)
        } else {
            i64::try_from(magnitude).ok()
        }
        .ok_or_else(|| error("value out of range"))
    }

    enum UintError {
        Syntax,
        Range,
    }

    /// Go's `strconv.ParseUint(s, 0, 64)` (no sign).
    fn parse_uint_base0(s: &str) -> Result<u64, UintError> {
        let bytes = s.as_bytes();
        let (radix, digits) = match bytes {
            [] => return Err(UintError::Syntax),
            [b'0', p, _, ..] if p.eq_ignore_ascii_case(&b'b') => (2, &bytes[2..]),
            [b'0', p, _, ..] if p.eq_ignore_ascii_case(&b'o') => (8, &bytes[2..]),
            [b'0', p, _, ..] if p.eq_ignore_ascii_case(&b'x') => (16, &bytes[2..]),
            [b'0', ..] => (8, &bytes[1..]),
            _ => (10, bytes),
        };
        let mut n: u64 = 0;
        for &c in digits {
            if c == b'_' {
                continue;
            }
            let d = char::from(c).to_digit(radix).ok_or(UintError::Syntax)?;
            n = n
                .checked_mul(u64::from(radix))
                .and_then(|n| n.checked_add(u64::from(d)))
                .ok_or(UintError::Range)?;
        }
        if s.contains('_') && !underscores_ok(s) {
            return Err(UintError::Syntax);
        }
        Ok(n)
    }

    /// Go's `underscoreOK`: each `_` sits between two digits, or between the base prefix
    /// and a digit.
    fn underscores_ok(s: &str) -> bool {
        let b = s.as_bytes();
        let (mut i, mut saw, hex) = match b {
            [b'0', p, ..] if matches!(p.to_ascii_lowercase(), b'b' | b'o' | b'x') => {
                (2, b'0', p.eq_ignore_ascii_case(&b'x'))
            }
            _ => (0, b'^', false),
        };
        while i < b.len() {
            let c = b[i];
            if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
                saw = b'0';
            } else if c == b'_' {
                if saw != b'0' {
                    return false;
                }
                saw = b'_';
            } else {
                if saw == b'_' {
                    return false;
                }
                saw = b'!';
            }
            i += 1;
        }
        saw != b'_'
    }

    /// Go's `strconv.Quote` for the ASCII range (what pflag prints in its messages):
    /// quotes and backslashes escaped, control characters as `\n`-style or `\xNN`
    /// escapes. Other characters are kept as they are, as Go keeps printable ones.
    pub fn go_quote(s: &str) -> String {
        let mut out = String::with_capacity(s.len() + 2);
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\u{07}' => out.push_str("\\a"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{0b}' => out.push_str("\\v"),
                c if c.is_ascii_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    /// Go's `strconv.ParseFloat` (a finite number; `NaN` and infinities are refused).
    pub fn float64(s: &str) -> Result<f64, String> {
        s.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .ok_or_else(|| {
                format!(
                    "strconv.ParseFloat: parsing {}: invalid syntax",
                    go_quote(s)
                )
            })
    }

    /// A port, with `strconv.ParseInt`'s wording for what is not one.
    pub fn port(s: &str) -> Result<u16, String> {
        let n = int64(s)?;
        u16::try_from(n).map_err(|_| {
            format!(
                "strconv.ParseInt: parsing {}: value out of range",
                go_quote(s)
            )
        })
    }

    /// pflag's string slices drop empty items, so `--host=""` means no hosts.
    pub fn non_empty(list: Vec<String>) -> Vec<String> {
        list.into_iter().filter(|s| !s.is_empty()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::values::*;

    /// pflag reads integers with `strconv.ParseInt(s, 0, 64)`; these are Go's answers.
    #[test]
    fn integers_follow_go_base_prefix_syntax() {
        for (text, want) in [
            ("1048576", 1048576),
            ("+5", 5),
            ("-5", -5),
            ("0", 0),
            ("-0", 0),
            ("010", 8),
            ("0o17", 15),
            ("0O17", 15),
            ("0x1F", 31),
            ("0X1f", 31),
            ("0b101", 5),
            ("1_048_576", 1048576),
            ("0x_1", 1),
            ("0_1", 1),
            ("9223372036854775807", i64::MAX),
            ("-9223372036854775808", i64::MIN),
            ("-0x8000000000000000", i64::MIN),
        ] {
            assert_eq!(int64(text), Ok(want), "{text}");
        }
        for (text, why) in [
            ("", "invalid syntax"),
            ("-", "invalid syntax"),
            ("+-5", "invalid syntax"),
            (" 5", "invalid syntax"),
            ("5 ", "invalid syntax"),
            ("08", "invalid syntax"),
            ("0x", "invalid syntax"),
            ("0b2", "invalid syntax"),
            ("1__0", "invalid syntax"),
            ("_10", "invalid syntax"),
            ("10_", "invalid syntax"),
            ("1e3", "invalid syntax"),
            ("1MB", "invalid syntax"),
            ("9223372036854775808", "value out of range"),
            ("-9223372036854775809", "value out of range"),
            ("99999999999999999999", "value out of range"),
        ] {
            assert_eq!(
                int64(text),
                Err(format!(
                    "strconv.ParseInt: parsing {}: {why}",
                    go_quote(text)
                )),
                "{text}"
            );
        }
        assert_eq!(
            int64("1\"\n"),
            Err(r#"strconv.ParseInt: parsing "1\"\n": invalid syntax"#.to_string())
        );
        assert_eq!(port("0x50"), Ok(80));
        assert_eq!(
            port("65536"),
            Err(r#"strconv.ParseInt: parsing "65536": value out of range"#.to_string())
        );
    }
}
