//! The CLI ↔ server protocol: one JSON request and one JSON response per connection over
//! the Unix socket. It is ours (upstream speaks Go gob); only the CLI uses it.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::service::options::{DeploymentOptions, ServiceOptions, TargetOptions};

pub mod client;
pub mod server;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeployArgs {
    pub service: String,
    pub targets: Vec<String>,
    #[serde(default)]
    pub readers: Vec<String>,
    pub deployment: DeploymentOptions,
    pub service_options: ServiceOptions,
    pub target_options: TargetOptions,
    /// The sleep flags given on the command line (by name, e.g. `sleep-after`), even at
    /// their zero value: those win over container labels (see `service::sleep::labels`).
    #[serde(default)]
    pub sleep_flags: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    Deploy(Box<DeployArgs>),
    Remove {
        service: String,
    },
    Pause {
        service: String,
        drain_timeout: i64,
        pause_timeout: i64,
    },
    Stop {
        service: String,
        drain_timeout: i64,
        message: String,
    },
    Resume {
        service: String,
    },
    List,
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
    /// Scale-to-zero (added keys, beyond the fork's shape): `off` without sleep, else
    /// `active`, `stopping`, `sleeping` or `waking`; and the containers the proxy stops
    /// and starts, so a pruning script can spare a sleeping service's stopped containers.
    pub sleep_state: String,
    pub sleep_containers: Vec<String>,
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
