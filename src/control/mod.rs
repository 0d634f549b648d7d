//! The CLI ↔ server protocol: one JSON request and one JSON response per connection over
//! the Unix socket. It is ours (upstream speaks Go gob); only the CLI uses it.

use serde::{Deserialize, Serialize};

use crate::gotime::GoDuration;
use std::collections::BTreeMap;

pub use crate::router::{DeployArgs, RolloutDeployArgs};

pub mod client;
pub mod list;
pub mod server;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    Deploy(Box<DeployArgs>),
    Remove {
        service: String,
    },
    Pause {
        service: String,
        drain_timeout: GoDuration,
        pause_timeout: GoDuration,
    },
    Stop {
        service: String,
        drain_timeout: GoDuration,
        message: String,
    },
    Resume {
        service: String,
    },
    List,
    /// Stop accepting, finish what is in flight, save state, exit (fork F28); answered
    /// once the drain is over. A zero timeout means the server's shutdown timeout.
    Drain {
        drain_timeout: GoDuration,
    },
    RolloutDeploy(RolloutDeployArgs),
    RolloutSet {
        service: String,
        percentage: i64,
        #[serde(default)]
        allowlist: Vec<String>,
    },
    RolloutStop {
        service: String,
    },
}

impl Request {
    /// Reads one request as the server receives it. Public so the property tests and the
    /// fuzz targets exercise exactly the server's decoder.
    pub fn decode(bytes: &[u8]) -> Result<Request, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("invalid request: {e}"))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServiceDescription {
    pub host: String,
    pub path: String,
    pub tls: bool,
    pub target: String,
    pub state: String,
    pub hosts: Vec<String>,
    pub path_prefixes: Vec<String>,
    pub targets: Vec<String>,
    pub reader_targets: Vec<String>,
    /// Every target of the rollout pool, writers then readers (the fork's key), empty
    /// without a rollout; and its readers alone and its split (added keys).
    #[serde(default)]
    pub rollout_targets: Vec<String>,
    #[serde(default)]
    pub rollout_reader_targets: Vec<String>,
    #[serde(default)]
    pub rollout_percentage: Option<i64>,
    #[serde(default)]
    pub rollout_allowlist: Vec<String>,
    /// Scale-to-zero (added keys, beyond the fork's shape): `off` without sleep, else
    /// `active`, `freezing`, `frozen`, `stopping`, `sleeping` or `waking`; and the containers the proxy stops
    /// and starts, so a pruning script can spare a sleeping service's stopped containers.
    pub sleep_state: String,
    pub sleep_containers: Vec<String>,
    /// Whole seconds the service has been frozen or asleep; absent while awake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asleep_seconds: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListResponse {
    pub services: BTreeMap<String, ServiceDescription>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok,
    List(ListResponse),
    Error(String),
}
