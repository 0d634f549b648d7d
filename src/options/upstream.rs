//! The upstream leg's options (fork F18–F21): how long a request may wait for, and retry
//! on, a target (`--target-try-duration`, `--target-try-interval`), each target's
//! connection pool (`--target-max-conns` and friends) and per-path timeouts
//! (`--path-timeout`, `--path-request-timeout`).
//!
//! Stored under the fork's state keys (`target_try_duration` in the service options;
//! `max_conns_per_host`, `path_response_timeouts`, … in the target options), each omitted
//! while unset, so a file without them is upstream's and Go reads every file we write. As
//! in the fork, a zero means "the default", resolved here and not by the CLI: a restored
//! service, or one deployed by an older client, gets the same pool as a fresh deploy.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::{is_zero, null_as_empty};

use crate::gotime::GoDuration;

/// `--target-try-interval` when unset (fork F18).
pub const DEFAULT_TARGET_TRY_INTERVAL: GoDuration = GoDuration::from_millis(250);
/// `--target-max-idle-conns` when unset (fork F19, the proxy's long-standing 100).
pub const DEFAULT_TARGET_MAX_IDLE_CONNS: i64 = 100;
/// `--target-idle-conn-timeout` when unset (fork F19).
pub const DEFAULT_TARGET_IDLE_CONN_TIMEOUT: GoDuration = GoDuration::from_secs(90);
/// `--target-dial-timeout` when unset (fork F19).
pub const DEFAULT_TARGET_DIAL_TIMEOUT: GoDuration = GoDuration::from_secs(30);

// === Retries and the hold for a healthy target (fork F18) ===

/// `--target-try-duration` and `--target-try-interval`, part of the service options.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct RetryOptions {
    /// How long a request may keep trying to reach a target; 0 = one attempt.
    #[serde(skip_serializing_if = "is_zero")]
    pub target_try_duration: GoDuration,
    /// The pause between attempts once every healthy target has been tried; 0 = 250 ms.
    #[serde(skip_serializing_if = "is_zero")]
    pub target_try_interval: GoDuration,
}

/// Resolved [`RetryOptions`], for the request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    pub try_duration: Duration,
    pub interval: Duration,
}

impl RetryOptions {
    /// The fork's messages (after `service options invalid: `).
    pub fn validate(&self) -> Result<(), String> {
        if self.target_try_duration.is_negative() {
            return Err("target-try-duration cannot be negative".into());
        }
        if self.target_try_interval.is_negative() {
            return Err("target-try-interval cannot be negative".into());
        }
        if self.target_try_interval.is_positive() && !self.target_try_duration.is_positive() {
            return Err("target-try-interval requires target-try-duration".into());
        }
        Ok(())
    }

    /// `None`: a single attempt, the proxy's behaviour without the flag.
    pub fn policy(&self) -> Option<RetryPolicy> {
        if !self.target_try_duration.is_positive() {
            return None;
        }
        let interval = if self.target_try_interval.is_positive() {
            self.target_try_interval
        } else {
            DEFAULT_TARGET_TRY_INTERVAL
        };
        Some(RetryPolicy {
            try_duration: self.target_try_duration.to_std(),
            interval: interval.to_std(),
        })
    }
}

// === The connection pool and per-path timeouts (fork F19–F21) ===

/// The pool flags and the per-path timeouts, part of the target options.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct UpstreamOptions {
    /// `--target-max-conns`: connections to each target (connecting, busy and idle);
    /// 0 = unlimited. Requests over it wait for one.
    #[serde(rename = "max_conns_per_host", skip_serializing_if = "is_zero")]
    pub max_conns: i64,
    /// `--target-max-idle-conns`: idle connections kept per target; 0 = 100.
    #[serde(rename = "max_idle_conns_per_host", skip_serializing_if = "is_zero")]
    pub max_idle_conns: i64,
    /// `--target-idle-conn-timeout`: an idle connection is closed after this; 0 = 90 s.
    #[serde(skip_serializing_if = "is_zero")]
    pub idle_conn_timeout: GoDuration,
    /// `--target-dial-timeout`: how long connecting to a target may take; 0 = 30 s.
    #[serde(skip_serializing_if = "is_zero")]
    pub dial_timeout: GoDuration,
    /// `--target-disable-keep-alives`: one request per connection.
    #[serde(skip_serializing_if = "is_zero")]
    pub disable_keep_alives: bool,
    /// `--path-timeout`: `--target-timeout` below these prefixes, longest first.
    #[serde(
        rename = "path_response_timeouts",
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub path_timeouts: Vec<PathTimeout>,
    /// `--path-request-timeout`: `--request-timeout` below these prefixes, longest first.
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_empty"
    )]
    pub path_request_timeouts: Vec<PathTimeout>,
}

/// Resolved pool settings of one service's targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSettings {
    /// Connections per target at most (connecting, busy and idle); `None`: unlimited.
    pub max_conns: Option<usize>,
    pub max_idle: usize,
    pub idle_timeout: Duration,
    pub dial_timeout: Duration,
    pub keep_alive: bool,
}

impl Default for PoolSettings {
    fn default() -> Self {
        UpstreamOptions::default().pool_settings()
    }
}

impl UpstreamOptions {
    /// The fork's messages (after `target options invalid: `).
    pub fn validate(&self) -> Result<(), String> {
        if self.max_conns < 0 {
            return Err("target-max-conns cannot be negative".into());
        }
        if self.max_idle_conns < 0 {
            return Err("target-max-idle-conns cannot be negative".into());
        }
        if self.idle_conn_timeout.is_negative() {
            return Err("target-idle-conn-timeout cannot be negative".into());
        }
        if self.dial_timeout.is_negative() {
            return Err("target-dial-timeout cannot be negative".into());
        }
        validate_path_timeouts("path-timeout", &self.path_timeouts)?;
        validate_path_timeouts("path-request-timeout", &self.path_request_timeouts)
    }

    /// Every zero resolved to its default. A negative value can only come from a
    /// hand-edited state file (deploys validate): it is clamped to the default too.
    pub fn pool_settings(&self) -> PoolSettings {
        let positive =
            |d: GoDuration, default: GoDuration| if d.is_positive() { d } else { default }.to_std();
        let max_idle = if self.max_idle_conns > 0 {
            self.max_idle_conns
        } else {
            DEFAULT_TARGET_MAX_IDLE_CONNS
        };
        PoolSettings {
            max_conns: usize::try_from(self.max_conns).ok().filter(|n| *n > 0),
            max_idle: usize::try_from(max_idle).unwrap_or(usize::MAX),
            idle_timeout: positive(self.idle_conn_timeout, DEFAULT_TARGET_IDLE_CONN_TIMEOUT),
            dial_timeout: positive(self.dial_timeout, DEFAULT_TARGET_DIAL_TIMEOUT),
            keep_alive: !self.disable_keep_alives,
        }
    }
}

// === Per-path timeouts (fork F20, F21) ===

/// One `PREFIX=DURATION` of `--path-timeout` or `--path-request-timeout`: the fork's
/// state shape (`{"path_prefix": "/api", "timeout": <nanoseconds>}`). A zero timeout
/// means none below that prefix, not the service's.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct PathTimeout {
    pub path_prefix: String,
    pub timeout: GoDuration,
}

/// One value of a `PREFIX=DURATION` flag, as pflag's string-to-string flags read it: a
/// single pair when it holds one `=` (surrounding double quotes dropped), else
/// comma-separated pairs (a CSV record), each split at its first `=`.
pub fn parse_pairs(value: &str) -> Result<Vec<(String, String)>, String> {
    let items = match value.matches('=').count() {
        0 => return Err(format!("{value} must be formatted as key=value")),
        1 => vec![value.trim_matches('"').to_string()],
        _ => csv_record(value)?,
    };
    items
        .into_iter()
        .map(|item| match item.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => Err(format!("{item} must be formatted as key=value")),
        })
        .collect()
}

/// One record of Go's `encoding/csv` reader with its defaults: fields split at commas, a
/// field that starts with `"` quoted (`""` inside is one quote).
fn csv_record(value: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut rest = value;
    loop {
        let (field, tail) = if let Some(quoted) = rest.strip_prefix('"') {
            let mut field = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next() {
                    Some((i, '"')) => {
                        if quoted[i + 1..].starts_with('"') {
                            field.push('"');
                            chars.next();
                        } else {
                            break i + 1;
                        }
                    }
                    Some((_, c)) => field.push(c),
                    None => return Err("extraneous or missing \" in quoted-field".into()),
                }
            };
            let tail = &quoted[end..];
            if !(tail.is_empty() || tail.starts_with(',')) {
                return Err("extraneous or missing \" in quoted-field".into());
            }
            (field, tail)
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            let field = &rest[..end];
            if field.contains('"') {
                return Err("bare \" in non-quoted-field".into());
            }
            (field.to_string(), &rest[end..])
        };
        fields.push(field);
        match tail.strip_prefix(',') {
            Some(t) => rest = t,
            None => return Ok(fields),
        }
    }
}

/// The pairs of every `--<flag>` given, in order, as the deploy stores them: durations
/// in Go's syntax, not negative; see [`normalize`] for the prefixes.
pub fn from_pairs(flag: &str, pairs: &[(String, String)]) -> Result<Vec<PathTimeout>, String> {
    let list = pairs
        .iter()
        .map(|(prefix, value)| match crate::gotime::parse_flag(value) {
            Ok(timeout) if !timeout.is_negative() => Ok(PathTimeout {
                path_prefix: prefix.clone(),
                timeout,
            }),
            _ => Err(format!("invalid --{flag} duration for '{prefix}': {value}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(normalize(list))
}

/// Prefixes as `--path-prefix` normalises them (`api/` → `/api`), one timeout per prefix
/// (the last given wins, as a repeated map key does in pflag), longest first.
pub fn normalize(list: Vec<PathTimeout>) -> Vec<PathTimeout> {
    let mut out: Vec<PathTimeout> = Vec::with_capacity(list.len());
    for mut p in list {
        p.path_prefix = super::normalize_prefix(&p.path_prefix);
        match out.iter_mut().find(|o| o.path_prefix == p.path_prefix) {
            Some(same) => same.timeout = p.timeout,
            None => out.push(p),
        }
    }
    out.sort_by(|a, b| {
        b.path_prefix
            .len()
            .cmp(&a.path_prefix.len())
            .then_with(|| a.path_prefix.cmp(&b.path_prefix))
    });
    out
}

fn validate_path_timeouts(flag: &str, list: &[PathTimeout]) -> Result<(), String> {
    match list.iter().find(|p| p.timeout.is_negative()) {
        Some(p) => Err(format!(
            "invalid --{flag} duration for '{}': {}",
            p.path_prefix, p.timeout
        )),
        None => Ok(()),
    }
}

/// Whether `path` lies below `prefix` by whole segments: `/api` covers `/api` and
/// `/api/x`, not `/apix`; `/` covers everything.
pub fn covers(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// Per-path timeouts compiled for the request path: prefixes longest first, a zero
/// timeout as `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathTimeouts {
    entries: Box<[(Box<str>, Option<Duration>)]>,
}

impl PathTimeouts {
    pub fn compile(list: &[PathTimeout]) -> PathTimeouts {
        let entries = normalize(list.to_vec())
            .into_iter()
            .map(|p| {
                let t = p.timeout.is_positive().then(|| p.timeout.to_std());
                (p.path_prefix.into_boxed_str(), t)
            })
            .collect();
        PathTimeouts { entries }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The timeout of the longest prefix covering `path`: `Some(None)` when that prefix
    /// has none, `None` when no prefix covers the path (the service's own applies).
    pub fn resolve(&self, path: &str) -> Option<Option<Duration>> {
        self.entries
            .iter()
            .find(|(prefix, _)| covers(prefix, path))
            .map(|(_, t)| *t)
    }

    /// [`Self::resolve`], falling back to `default` (itself `None` for no timeout).
    pub fn for_path(&self, path: &str, default: Option<Duration>) -> Option<Duration> {
        if self.entries.is_empty() {
            return default;
        }
        self.resolve(path).unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &str) -> Vec<(String, String)> {
        parse_pairs(v).unwrap()
    }

    #[test]
    fn flag_values_read_as_pflag_string_to_string() {
        assert_eq!(pairs("/api=5s"), [("/api".into(), "5s".into())]);
        assert_eq!(pairs("\"/api=5s\""), [("/api".into(), "5s".into())]);
        assert_eq!(
            pairs("/a=1s,/b=2s"),
            [("/a".into(), "1s".into()), ("/b".into(), "2s".into())]
        );
        assert_eq!(
            pairs("\"/a=1s\",/b=2s"),
            [("/a".into(), "1s".into()), ("/b".into(), "2s".into())]
        );
        // One `=`: the comma belongs to the value, whose duration is then refused.
        assert_eq!(pairs("/a=1s,x"), [("/a".into(), "1s,x".into())]);
        assert_eq!(
            parse_pairs("/api").unwrap_err(),
            "/api must be formatted as key=value"
        );
        assert_eq!(
            parse_pairs("/a=1s,b,/c=2s").unwrap_err(),
            "b must be formatted as key=value"
        );
        assert!(parse_pairs("/a=1s,\"/b=2s").is_err());
    }

    #[test]
    fn durations_are_checked_and_prefixes_normalised_longest_first() {
        let list = from_pairs(
            "path-timeout",
            &pairs("api/=5s,/api/reports=0,/=1m,/b=1s,b=2s"),
        )
        .unwrap();
        let got: Vec<(&str, String)> = list
            .iter()
            .map(|p| (p.path_prefix.as_str(), p.timeout.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("/api/reports", "0s".to_string()),
                ("/api", "5s".into()),
                ("/b", "2s".into()),
                ("/", "1m0s".into()),
            ]
        );
        for bad in ["5", "-1s", "soon", ""] {
            assert_eq!(
                from_pairs("path-timeout", &[("/api".into(), bad.into())]).unwrap_err(),
                format!("invalid --path-timeout duration for '/api': {bad}")
            );
        }
    }

    #[test]
    fn the_longest_prefix_by_whole_segment_wins() {
        let t = PathTimeouts::compile(&[
            PathTimeout {
                path_prefix: "/api".into(),
                timeout: GoDuration::from_secs(5),
            },
            PathTimeout {
                path_prefix: "/api/reports".into(),
                timeout: GoDuration::ZERO,
            },
        ]);
        let secs = |s| Some(Some(Duration::from_secs(s)));
        assert_eq!(t.resolve("/api"), secs(5));
        assert_eq!(t.resolve("/api/"), secs(5));
        assert_eq!(t.resolve("/api/users"), secs(5));
        assert_eq!(t.resolve("/api/reports/1"), Some(None));
        assert_eq!(t.resolve("/api/reportsx"), secs(5));
        assert_eq!(t.resolve("/apix"), None);
        assert_eq!(t.resolve("/"), None);
        let d = Some(Duration::from_secs(30));
        assert_eq!(t.for_path("/apix", d), d);
        assert_eq!(t.for_path("/api/reports", d), None);
        assert!(covers("/", "/anything"));
    }

    #[test]
    fn zeros_mean_the_defaults() {
        let s = UpstreamOptions::default().pool_settings();
        assert_eq!(
            s,
            PoolSettings {
                max_conns: None,
                max_idle: 100,
                idle_timeout: Duration::from_secs(90),
                dial_timeout: Duration::from_secs(30),
                keep_alive: true,
            }
        );
        // What only a hand-edited file can hold: clamped, never trusted.
        let s = UpstreamOptions {
            max_conns: -3,
            max_idle_conns: -1,
            dial_timeout: GoDuration::from_nanos(-5),
            ..Default::default()
        }
        .pool_settings();
        assert_eq!((s.max_conns, s.max_idle), (None, 100));
        assert_eq!(s.dial_timeout, Duration::from_secs(30));
        assert_eq!(RetryOptions::default().policy(), None);
        let p = RetryOptions {
            target_try_duration: GoDuration::from_secs(5),
            ..Default::default()
        }
        .policy()
        .unwrap();
        assert_eq!(p.interval, Duration::from_millis(250));
    }

    #[test]
    fn validation_uses_the_forks_words() {
        let err = |o: UpstreamOptions| o.validate().unwrap_err();
        assert_eq!(
            err(UpstreamOptions {
                max_conns: -1,
                ..Default::default()
            }),
            "target-max-conns cannot be negative"
        );
        assert_eq!(
            err(UpstreamOptions {
                path_request_timeouts: vec![PathTimeout {
                    path_prefix: "/x".into(),
                    timeout: GoDuration::from_nanos(-1),
                }],
                ..Default::default()
            }),
            "invalid --path-request-timeout duration for '/x': -1ns"
        );
        let r = RetryOptions {
            target_try_interval: GoDuration::from_secs(1),
            ..Default::default()
        };
        assert_eq!(
            r.validate().unwrap_err(),
            "target-try-interval requires target-try-duration"
        );
    }

    #[test]
    fn state_keys_are_the_forks_and_absent_when_unset() {
        let none = serde_json::to_string(&UpstreamOptions::default()).unwrap();
        assert_eq!(none, "{}");
        let o = UpstreamOptions {
            max_conns: 4,
            max_idle_conns: 2,
            idle_conn_timeout: GoDuration::from_secs(5),
            dial_timeout: GoDuration::from_secs(1),
            disable_keep_alives: true,
            path_timeouts: vec![PathTimeout {
                path_prefix: "/api".into(),
                timeout: GoDuration::from_secs(1),
            }],
            path_request_timeouts: Vec::new(),
        };
        let json = serde_json::to_value(&o).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "max_conns_per_host": 4, "max_idle_conns_per_host": 2,
                "idle_conn_timeout": 5_000_000_000i64, "dial_timeout": 1_000_000_000,
                "disable_keep_alives": true,
                "path_response_timeouts": [{"path_prefix": "/api", "timeout": 1_000_000_000}],
            })
        );
        let back: UpstreamOptions =
            serde_json::from_str(r#"{"path_request_timeouts":null}"#).unwrap();
        assert_eq!(back, UpstreamOptions::default());
    }
}
