//! What can go wrong, each with its exit code: one line for a person, never a Debug dump.

/// Exit codes (also in `--help` and the README).
pub mod exit {
    /// Done; a read found nothing wrong.
    pub const OK: u8 = 0;
    /// A read found a problem: a node drifted or unknown, a GPU drifting or quarantined.
    pub const FOUND: u8 = 1;
    /// Usage or bad input: an unknown flag, a bad selector, a rung the node does not wait for.
    pub const USAGE: u8 = 2;
    /// Not found: no such node, report or policy, or a node no policy governs.
    pub const NOT_FOUND: u8 = 3;
    /// The cluster said no or could not be asked: forbidden (RBAC), another API error, no
    /// kubeconfig, unreachable.
    pub const API: u8 = 4;
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input on the command line.
    #[error("{0}")]
    Usage(String),
    /// An object the command needs does not exist, or a node no policy governs.
    #[error("{0}")]
    NotFound(String),
    /// RBAC refused a request.
    #[error("forbidden: cannot {what}: {message}")]
    Forbidden {
        /// What the plugin tried, e.g. `list nodes`.
        what: String,
        /// The API server's message.
        message: String,
    },
    /// Any other error from the API server or the connection to it.
    #[error("cannot {what}: {message}")]
    Api {
        /// What the plugin tried.
        what: String,
        /// Why it failed.
        message: String,
    },
    /// No usable kubeconfig or context.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// The output could not be written or encoded.
    #[error("output: {0}")]
    Output(String),
}

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => exit::USAGE,
            Error::NotFound(_) => exit::NOT_FOUND,
            Error::Forbidden { .. } | Error::Api { .. } | Error::Kubeconfig(_) | Error::Output(_) => {
                exit::API
            }
        }
    }

    /// Maps a kube error of the request `what` (`get node h100-xid`): 403 is [`Error::Forbidden`],
    /// 404 is [`Error::NotFound`] with `missing` as its message, anything else [`Error::Api`].
    pub fn from_kube(what: &str, missing: impl FnOnce() -> String, e: kube::Error) -> Error {
        match e {
            kube::Error::Api(status) if status.is_forbidden() => Error::Forbidden {
                what: what.to_string(),
                message: status.message.clone(),
            },
            kube::Error::Api(status) if status.is_not_found() => Error::NotFound(missing()),
            kube::Error::Api(status) => Error::Api {
                what: what.to_string(),
                message: if status.message.is_empty() {
                    format!("{} ({})", status.reason, status.code)
                } else {
                    status.message.clone()
                },
            },
            other => Error::Api {
                what: what.to_string(),
                message: one_line(&other),
            },
        }
    }
}

/// An error and its sources on one line (`a: b: c`), without repeating a source its parent
/// already prints.
pub fn one_line(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str, message: &str) -> kube::Error {
        let s: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": code, "reason": reason, "message": message,
        }))
        .unwrap_or_default();
        kube::Error::Api(Box::new(s))
    }

    #[test]
    fn forbidden_not_found_and_other_api_errors_get_their_own_exit_codes() {
        let forbidden = Error::from_kube(
            "list nodes",
            || "x".into(),
            status(403, "Forbidden", "nodes is forbidden: User \"u\" cannot list"),
        );
        assert_eq!(forbidden.exit_code(), exit::API);
        assert_eq!(
            forbidden.to_string(),
            "forbidden: cannot list nodes: nodes is forbidden: User \"u\" cannot list"
        );
        let missing = Error::from_kube(
            "get node n",
            || "node n not found".into(),
            status(404, "NotFound", "nodes \"n\" not found"),
        );
        assert_eq!(missing.exit_code(), exit::NOT_FOUND);
        assert_eq!(missing.to_string(), "node n not found");
        let other = Error::from_kube("get node n", || "x".into(), status(500, "InternalError", ""));
        assert_eq!(other.exit_code(), exit::API);
        assert_eq!(other.to_string(), "cannot get node n: InternalError (500)");
    }
}
