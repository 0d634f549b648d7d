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

    /// Go's `strconv.ParseInt` for byte sizes and ports.
    pub fn int64(s: &str) -> Result<i64, String> {
        s.parse::<i64>()
            .map_err(|_| format!("strconv.ParseInt: parsing \"{s}\": invalid syntax"))
    }

    /// Go's `strconv.ParseFloat` (a finite number; `NaN` and infinities are refused).
    pub fn float64(s: &str) -> Result<f64, String> {
        s.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .ok_or_else(|| format!("strconv.ParseFloat: parsing \"{s}\": invalid syntax"))
    }

    /// A port, with `strconv.ParseInt`'s wording for what is not one.
    pub fn port(s: &str) -> Result<u16, String> {
        let n = int64(s)?;
        u16::try_from(n)
            .map_err(|_| format!("strconv.ParseInt: parsing \"{s}\": value out of range"))
    }

    /// pflag's string slices drop empty items, so `--host=""` means no hosts.
    pub fn non_empty(list: Vec<String>) -> Vec<String> {
        list.into_iter().filter(|s| !s.is_empty()).collect()
    }
}
