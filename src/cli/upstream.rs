//! The deploy flags of the upstream leg (fork F18–F21): retries and the hold for a healthy
//! target, the connection pool of each target, per-path timeouts. Kept apart from the
//! other deploy flags, which they follow in `--help`.

use clap::{ArgAction, Args};

use super::values::{duration, go_bool, int64};
use crate::gotime::GoDuration;
use crate::options::upstream::{self, RetryOptions, UpstreamOptions};

#[derive(Args, Debug, Default)]
pub struct UpstreamFlags {
    /// Override --target-timeout below a path prefix, as PREFIX=DURATION: the longest
    /// prefix that matches the path by whole segments wins (/api covers /api/x, not
    /// /apix); 0 = no timeout there (repeatable, or comma-separated)
    #[arg(long = "path-timeout", action = ArgAction::Append, value_parser = pairs, value_name = "PREFIX=DURATION")]
    path_timeout: Vec<Pairs>,
    /// Override --request-timeout below a path prefix, as PREFIX=DURATION (matched as
    /// --path-timeout, against the path the client sent); 0 = no deadline there
    /// (repeatable, or comma-separated)
    #[arg(long = "path-request-timeout", action = ArgAction::Append, value_parser = pairs, value_name = "PREFIX=DURATION")]
    path_request_timeout: Vec<Pairs>,

    /// Keep trying to place a request for this long: while no target is healthy it
    /// waits (any method), and a GET, HEAD, OPTIONS, TRACE, PUT or DELETE without a body
    /// goes to the next target when its target could not be connected to (0 = a single
    /// attempt)
    #[arg(long = "target-try-duration", value_parser = duration, default_value = "0", value_name = "DURATION")]
    target_try_duration: GoDuration,
    /// Pause between attempts once every healthy target has been tried (0 = 250ms;
    /// requires --target-try-duration)
    #[arg(long = "target-try-interval", value_parser = duration, default_value = "0", value_name = "DURATION")]
    target_try_interval: GoDuration,

    /// Connections to each target at most, idle ones included; requests over it wait
    /// for one (0 = unlimited)
    #[arg(long = "target-max-conns", value_parser = int64, default_value = "0", value_name = "N")]
    target_max_conns: i64,
    /// Idle connections kept open to each target (0 = 100)
    #[arg(long = "target-max-idle-conns", value_parser = int64, default_value = "0", value_name = "N")]
    target_max_idle_conns: i64,
    /// How long an idle connection to a target is kept before closing; set it below the
    /// target's own keep-alive timeout (0 = 90s)
    #[arg(long = "target-idle-conn-timeout", value_parser = duration, default_value = "0", value_name = "DURATION")]
    target_idle_conn_timeout: GoDuration,
    /// How long connecting to a target may take; past it the request gets 504 (0 = 30s;
    /// health checks are not affected)
    #[arg(long = "target-dial-timeout", value_parser = duration, default_value = "0", value_name = "DURATION")]
    target_dial_timeout: GoDuration,
    /// Close each connection to a target after one request
    #[arg(long = "target-disable-keep-alives", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, value_name = "BOOL")]
    target_disable_keep_alives: Option<bool>,
}

/// The `PREFIX=DURATION` pairs of one flag value.
#[derive(Clone, Debug)]
struct Pairs(Vec<(String, String)>);

fn pairs(value: &str) -> Result<Pairs, String> {
    upstream::parse_pairs(value).map(Pairs)
}

impl UpstreamFlags {
    pub fn retry(&self) -> RetryOptions {
        RetryOptions {
            target_try_duration: self.target_try_duration,
            target_try_interval: self.target_try_interval,
        }
    }

    /// The pool flags and the path timeouts; a duration that is not one is refused here
    /// with the fork's message.
    pub fn options(&self) -> Result<UpstreamOptions, String> {
        let flatten = |v: &[Pairs]| -> Vec<(String, String)> {
            v.iter().flat_map(|p| p.0.iter().cloned()).collect()
        };
        Ok(UpstreamOptions {
            max_conns: self.target_max_conns,
            max_idle_conns: self.target_max_idle_conns,
            idle_conn_timeout: self.target_idle_conn_timeout,
            dial_timeout: self.target_dial_timeout,
            disable_keep_alives: self.target_disable_keep_alives.unwrap_or(false),
            path_timeouts: upstream::from_pairs("path-timeout", &flatten(&self.path_timeout))?,
            path_request_timeouts: upstream::from_pairs(
                "path-request-timeout",
                &flatten(&self.path_request_timeout),
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        flags: UpstreamFlags,
    }

    fn parse(args: &[&str]) -> Result<UpstreamFlags, String> {
        let argv = std::iter::once("deploy").chain(args.iter().copied());
        Wrapper::try_parse_from(argv)
            .map(|w| w.flags)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_forks_quoted_lines_parse() {
        let f = parse(&[
            "--path-timeout=/api=5s",
            "--path-timeout=/api/reports=0,/slow=2m",
            "--path-request-timeout=/=10s",
            "--target-try-duration=5s",
            "--target-try-interval=100ms",
            "--target-max-conns=8",
            "--target-max-idle-conns=4",
            "--target-idle-conn-timeout=30s",
            "--target-dial-timeout=2s",
            "--target-disable-keep-alives",
        ])
        .unwrap();
        let o = f.options().unwrap();
        let prefixes: Vec<&str> = o
            .path_timeouts
            .iter()
            .map(|p| p.path_prefix.as_str())
            .collect();
        assert_eq!(prefixes, ["/api/reports", "/slow", "/api"]);
        assert_eq!(o.path_request_timeouts.len(), 1);
        assert_eq!((o.max_conns, o.max_idle_conns), (8, 4));
        assert!(o.disable_keep_alives);
        assert_eq!(f.retry().target_try_duration, GoDuration::from_secs(5));
        let none = parse(&[]).unwrap();
        assert_eq!(none.options().unwrap(), UpstreamOptions::default());
        assert_eq!(none.retry(), RetryOptions::default());
    }

    #[test]
    fn bad_values_are_refused_with_the_forks_words() {
        let f = parse(&["--path-timeout=/api=5"]).unwrap();
        assert_eq!(
            f.options().unwrap_err(),
            "invalid --path-timeout duration for '/api': 5"
        );
        assert!(
            parse(&["--path-timeout=/api"])
                .unwrap_err()
                .contains("/api must be formatted as key=value")
        );
    }
}
