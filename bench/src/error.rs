//! Why a benchmark step failed: the API call, file, process, decoding or wait that failed, each
//! variant saying what was being done, so a failed run says where it stopped.

use std::time::Duration;

/// Why a benchmark step failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A harness helper failed.
    #[error(transparent)]
    Harness(#[from] gpunode_e2e::Error),
    /// A file or process could not be used.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// JSON could not be (de)serialized.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// YAML could not be (de)serialized.
    #[error("yaml: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// A wait ran out of time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The deadline.
        after: Duration,
    },
    /// Anything else, with its explanation.
    #[error("{0}")]
    Other(String),
}

impl Error {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}
