//! The state file: every service, its options, targets, pause and idle state, so a
//! restarted proxy serves exactly what it served before.
//!
//! The file is upstream's format, so that a user who rolls back to the Go image keeps
//! every service: a top-level JSON array of services with upstream's keys and types
//! (durations as integer nanoseconds, `null` for absent rollout pools). Our additions
//! (scale-to-zero, access gates, the idle state) are extra keys, which Go's decoder
//! ignores. Two rules keep it that way:
//! - never give one of upstream's keys a value Go would refuse (a target weight does not
//!   belong in `active_targets`, which Go parses as `host:port`): put it in a key of ours;
//! - never name an added key so that it matches one of Go's case-insensitively (Go's
//!   decoder folds case), e.g. no `Hosts` beside `hosts`.
//!
//! Everything any release of ours wrote still loads:
//! - upstream's array, including its legacy keys (`active_target`, top-level `hosts`, …);
//! - `{"version": 2, "services": [...]}`, written by our 0.x releases.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::balancer::LoadBalancer;
use crate::balancer::affinity::PinKey;
use crate::balancer::rollout::RolloutSplit;
use crate::balancer::spec::{self, TargetSpec};
use crate::options::{ServiceOptions, TargetOptions};
use crate::service::pause::PauseSnapshot;

/// The highest `{"version": N, …}` wrapper an earlier release of ours wrote; files are
/// written without a wrapper now.
const NEWEST_WRAPPED_VERSION: u32 = 2;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ServiceState {
    pub name: String,
    #[serde(default)]
    pub options: ServiceOptions,
    #[serde(default)]
    pub target_options: TargetOptions,
    #[serde(default)]
    pub active_targets: Vec<String>,
    #[serde(default)]
    pub active_readers: Vec<String>,
    #[serde(default)]
    pub rollout_targets: Option<Vec<String>>,
    #[serde(default)]
    pub rollout_readers: Option<Vec<String>>,
    #[serde(default)]
    pub pause_controller: PauseSnapshot,
    #[serde(default)]
    pub rollout_controller: Option<RolloutSplit>,
    /// `active`, `sleeping`, … (absent in upstream files: awake).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub idle_state: String,
    /// With `--sleep-label`: the container ids the last freeze or stop acted on, which
    /// the next wake brings back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idle_containers: Vec<String>,
    /// Unix seconds since which the service has been frozen or asleep (0: awake).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub idle_since: i64,
    /// Target weights (fork F16), one per entry of the list each is named after; omitted
    /// when every weight of that list is 1. Kept apart from upstream's lists, which Go
    /// parses as plain `host:port` (a weight there would make Go drop every service).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active_target_weights: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active_reader_weights: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollout_target_weights: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollout_reader_weights: Vec<u32>,
    /// The key of the service's session affinity pins (fork F17), while affinity is on:
    /// kept so that a restart or an upgrade does not re-pin every client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_key: Option<PinKey>,
    // Legacy upstream keys, read for compatibility and never written.
    #[serde(default, skip_serializing)]
    pub active_target: String,
    #[serde(default, skip_serializing)]
    pub rollout_target: String,
    #[serde(default, skip_serializing)]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing)]
    pub path_prefixes: Vec<String>,
}

impl ServiceState {
    /// A service as it is saved: its options, its active pool, pause and idle state.
    pub fn new(
        name: &str,
        options: ServiceOptions,
        target_options: TargetOptions,
        active: &LoadBalancer,
        pause_controller: PauseSnapshot,
        idle_state: String,
    ) -> ServiceState {
        let (active_targets, active_target_weights) = split_specs(&active.writer_specs());
        let (active_readers, active_reader_weights) = split_specs(&active.reader_specs());
        let session_affinity_key = options.session_affinity.then(|| active.pin_key().clone());
        ServiceState {
            name: name.to_string(),
            options,
            target_options,
            active_targets,
            active_readers,
            rollout_targets: None,
            rollout_readers: None,
            pause_controller,
            rollout_controller: None,
            idle_state,
            idle_containers: Vec::new(),
            idle_since: 0,
            active_target_weights,
            active_reader_weights,
            rollout_target_weights: Vec::new(),
            rollout_reader_weights: Vec::new(),
            session_affinity_key,
            active_target: String::new(),
            rollout_target: String::new(),
            hosts: Vec::new(),
            path_prefixes: Vec::new(),
        }
    }

    /// Adds the service's rollout pool and split (upstream writes `null` for each that
    /// is absent).
    pub fn with_rollout(
        mut self,
        pool: Option<&LoadBalancer>,
        split: Option<&RolloutSplit>,
    ) -> ServiceState {
        let writers = pool.map(|p| split_specs(&p.writer_specs()));
        let readers = pool.map(|p| split_specs(&p.reader_specs()));
        (self.rollout_targets, self.rollout_target_weights) = match writers {
            Some((addresses, weights)) => (Some(addresses), weights),
            None => (None, Vec::new()),
        };
        (self.rollout_readers, self.rollout_reader_weights) = match readers {
            Some((addresses, weights)) => (Some(addresses), weights),
            None => (None, Vec::new()),
        };
        self.rollout_controller = split.cloned();
        self
    }

    /// The active pool's writers and readers with their weights.
    pub fn active_specs(&self) -> (Vec<TargetSpec>, Vec<TargetSpec>) {
        (
            TargetSpec::zip(&self.active_targets, &self.active_target_weights),
            TargetSpec::zip(&self.active_readers, &self.active_reader_weights),
        )
    }

    /// The rollout pool's writers and readers with their weights (none without a pool).
    pub fn rollout_specs(&self) -> (Vec<TargetSpec>, Vec<TargetSpec>) {
        (
            TargetSpec::zip(
                self.rollout_targets.as_deref().unwrap_or_default(),
                &self.rollout_target_weights,
            ),
            TargetSpec::zip(
                self.rollout_readers.as_deref().unwrap_or_default(),
                &self.rollout_reader_weights,
            ),
        )
    }

    /// Applies upstream's legacy upgrades and normalises the options.
    fn upgrade(&mut self) {
        if self.active_targets.is_empty() && !self.active_target.is_empty() {
            self.active_targets = vec![std::mem::take(&mut self.active_target)];
        }
        if self.rollout_targets.as_ref().is_none_or(|t| t.is_empty())
            && !self.rollout_target.is_empty()
        {
            self.rollout_targets = Some(vec![std::mem::take(&mut self.rollout_target)]);
        }
        if self.options.hosts.is_empty() && !self.hosts.is_empty() {
            self.options.hosts = std::mem::take(&mut self.hosts);
        }
        if self.options.path_prefixes.is_empty() && !self.path_prefixes.is_empty() {
            self.options.path_prefixes = std::mem::take(&mut self.path_prefixes);
        }
        self.options.normalize();
    }

    /// The Go fork keeps weights inside upstream's lists (`web:80;weight=5`): such a file
    /// loads, the weights moved to our keys, so the next save is one Go reads again.
    fn move_fork_weights(&mut self) -> Result<(), String> {
        fn split(list: &mut [String], weights: &mut Vec<u32>) -> Result<(), String> {
            if !list.iter().any(|t| t.contains(';')) {
                return Ok(());
            }
            let specs = list
                .iter()
                .map(|t| TargetSpec::parse(t))
                .collect::<Result<Vec<_>, _>>()?;
            let (addresses, parsed) = split_specs(&specs);
            list.clone_from_slice(&addresses);
            *weights = parsed;
            Ok(())
        }
        split(&mut self.active_targets, &mut self.active_target_weights)?;
        split(&mut self.active_readers, &mut self.active_reader_weights)?;
        if let Some(list) = self.rollout_targets.as_mut() {
            split(list, &mut self.rollout_target_weights)?;
        }
        if let Some(list) = self.rollout_readers.as_mut() {
            split(list, &mut self.rollout_reader_weights)?;
        }
        Ok(())
    }

    /// What upstream refuses while decoding: a file naming an impossible target is
    /// corrupt as a whole (all or nothing), so it is set aside rather than half-restored
    /// and then overwritten without the service it lost.
    fn check(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("service without a name".into());
        }
        let rollout = self
            .rollout_targets
            .iter()
            .chain(self.rollout_readers.iter())
            .flatten();
        self.active_targets
            .iter()
            .chain(self.active_readers.iter())
            .chain(rollout)
            .try_for_each(|t| crate::balancer::target::validate_target(t))?;
        let lists: [(&str, usize, &[u32]); 4] = [
            (
                "active_targets",
                self.active_targets.len(),
                &self.active_target_weights,
            ),
            (
                "active_readers",
                self.active_readers.len(),
                &self.active_reader_weights,
            ),
            (
                "rollout_targets",
                self.rollout_targets.as_ref().map_or(0, Vec::len),
                &self.rollout_target_weights,
            ),
            (
                "rollout_readers",
                self.rollout_readers.as_ref().map_or(0, Vec::len),
                &self.rollout_reader_weights,
            ),
        ];
        for (list, len, weights) in lists {
            if !weights.is_empty() && weights.len() != len {
                return Err(format!(
                    "{} weights for the {len} entries of {list}",
                    weights.len()
                ));
            }
            for &w in weights {
                spec::check_weight(i64::from(w))?;
            }
        }
        Ok(())
    }
}

/// Addresses for upstream's list, and the weights for ours: none when all are 1, so an
/// unweighted service is saved exactly as before.
fn split_specs(specs: &[TargetSpec]) -> (Vec<String>, Vec<u32>) {
    let addresses = specs.iter().map(|s| s.address.clone()).collect();
    let weights = if specs.iter().all(|s| s.weight == spec::DEFAULT_WEIGHT) {
        Vec::new()
    } else {
        specs.iter().map(|s| s.weight).collect()
    };
    (addresses, weights)
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// What our 0.x releases wrote.
#[derive(Deserialize)]
struct WrappedStateFile {
    services: Vec<ServiceState>,
}

#[derive(Debug)]
pub enum LoadError {
    Io(std::io::Error),
    Corrupt(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Io(e) => write!(f, "{e}"),
            LoadError::Corrupt(e) => write!(f, "{e}"),
        }
    }
}

/// `Ok(None)` when there is no state file yet.
pub fn load(path: &Path) -> Result<Option<Vec<ServiceState>>, LoadError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LoadError::Io(e)),
    };
    parse(&bytes).map(Some)
}

pub fn parse(bytes: &[u8]) -> Result<Vec<ServiceState>, LoadError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| LoadError::Corrupt(e.to_string()))?;
    let mut services: Vec<ServiceState> = match value {
        serde_json::Value::Array(_) => {
            serde_json::from_value(value).map_err(|e| LoadError::Corrupt(e.to_string()))?
        }
        serde_json::Value::Object(ref o) => {
            let version = o.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
            if version == 0 || version > u64::from(NEWEST_WRAPPED_VERSION) {
                return Err(LoadError::Corrupt(format!(
                    "unsupported state file version {version} (this proxy reads 1 to {NEWEST_WRAPPED_VERSION})"
                )));
            }
            let file: WrappedStateFile =
                serde_json::from_value(value).map_err(|e| LoadError::Corrupt(e.to_string()))?;
            file.services
        }
        serde_json::Value::Null => Vec::new(),
        _ => return Err(LoadError::Corrupt("expected a list of services".into())),
    };
    for s in &mut services {
        s.upgrade();
        s.move_fork_weights()
            .and_then(|()| s.check())
            .map_err(|e| LoadError::Corrupt(format!("service \"{}\": {e}", s.name)))?;
    }
    Ok(services)
}

/// Writes atomically: a temp file in the same directory, fsync, rename, fsync the
/// directory. A crash at any point leaves either the old file or the new one.
pub fn save(path: &Path, services: &[ServiceState]) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(services).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = tmp_path(path);
    {
        // 0600: the file carries basic-auth digests (as the fork).
        let mut f = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?
        };
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// `<state>.tmp-<pid>-<generation>`: two proxy generations share the data directory
/// during an upgrade and both may be pid 1 in their containers, so the pid alone does
/// not tell their temp files apart; the generation (random, fixed for the process's
/// life) does.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(
        "{TMP_INFIX}{}-{}",
        std::process::id(),
        generation()
    ));
    path.with_file_name(name)
}

const TMP_INFIX: &str = ".tmp-";

/// Removes the temp files a killed process left beside the state file
/// (`<name>.tmp-<pid>-<generation>`), and returns them. Only a dead writer's: during a proxy upgrade
/// two generations may share the data dir, and the other one's save may be in flight.
/// Our own pid's are left too: both generations may be pid 1 in their containers.
pub fn remove_stale_temp_files(path: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}{TMP_INFIX}", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            // `<pid>-<generation>`, or `<pid>` from releases before generations.
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me || process_alive(pid) {
            continue;
        }
        if std::fs::remove_file(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

/// Whether a process with this pid exists (in our pid namespace). Only "no such
/// process" counts as dead: one we may not signal is alive.
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 sends nothing; kill only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// This process's generation: 16 random hex digits, drawn once.
pub fn generation() -> &'static str {
    static GENERATION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    GENERATION.get_or_init(|| {
        let id = uuid::Uuid::new_v4().simple().to_string();
        id[..16].to_string()
    })
}

/// Moves a corrupt file aside (never overwritten silently) and returns where it went.
pub fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    // Never replace an earlier set-aside file: a crash loop can produce several within
    // the same second.
    let aside = (0u32..)
        .map(|n| {
            let mut name = base.clone();
            match n {
                0 => name.push(format!(".corrupt-{stamp}")),
                n => name.push(format!(".corrupt-{stamp}-{n}")),
            }
            path.with_file_name(name)
        })
        .find(|candidate| !candidate.exists())
        .unwrap_or_else(|| path.with_file_name(&base));
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

#[cfg(test)]
mod tests;
