//! gpunode end-to-end test support: the cluster (local control plane or `GPUNODE_KUBECONFIG`),
//! admin and ServiceAccount clients, scratch namespaces, fake GPU nodes, storm stages, waits with deadlines,
//! and the fixtures shared with the schema tests.

pub mod accounts;
pub mod audit;
pub mod chart;
pub mod cluster;
pub mod crds;
pub mod device;
pub mod faults;
pub mod fixtures;
pub mod http;
pub mod kind;
pub mod monitor;
pub mod netns;
pub mod nodes;
pub mod operator;
pub mod pods;
pub mod probe;
pub mod remediator;
pub mod reports;
pub mod rig;
pub mod scratch;
pub mod storm;
pub mod tools;
pub mod upgrade;
pub mod wait;
pub mod window;

use std::time::Duration;

/// Why a harness step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cluster could not be started or found.
    #[error("test cluster: {0}")]
    ClusterStart(String),
    /// The kubeconfig could not be loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// An API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A manifest could not be (de)serialized.
    #[error("manifest: {0}")]
    Json(#[from] serde_json::Error),
    /// A YAML manifest could not be parsed.
    #[error("manifest: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// A wait ran out of time.
    #[error("timed out after {after:?} waiting for {what} (last: {last})")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The deadline.
        after: Duration,
        /// The last observation.
        last: String,
    },
    /// Anything else, with its explanation.
    #[error("{0}")]
    Unexpected(String),
}
