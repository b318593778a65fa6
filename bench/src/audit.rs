//! Requests counted by the API server itself: its audit log (policy bench/audit-policy.yaml
//! logs, at Metadata level, only the requests of the operator's and nfd-master's accounts).
//! Each request is counted once (by audit ID), in the window its `requestReceivedTimestamp`
//! falls into, by verb and resource.

use std::{
    collections::{BTreeMap, HashSet},
    path::Path,
};

use jiff::Timestamp;
use serde::Deserialize;

use crate::error::Error;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: String,
    verb: String,
    user: User,
    object_ref: Option<ObjectRef>,
    request_received_timestamp: Timestamp,
}

#[derive(Deserialize)]
struct User {
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    resource: Option<String>,
    subresource: Option<String>,
}

/// One request as the API server logged it.
#[derive(Debug, Clone)]
pub struct Request {
    /// Who sent it.
    pub user: String,
    /// `verb resource[/subresource]`.
    pub what: String,
    /// When the API server received it.
    pub at: Timestamp,
}

/// Every request in the audit log at `path`.
pub fn read(path: &Path) -> Result<Vec<Request>, Error> {
    let text = std::fs::read_to_string(path).map_err(Error::io(format!("reading {}", path.display())))?;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Event>(line) else {
            continue;
        };
        // Long-running requests (watches) are logged when the response starts, the rest
        // when it completes; either way once.
        if !matches!(e.stage.as_str(), "ResponseStarted" | "ResponseComplete" | "Panic") {
            continue;
        }
        if !seen.insert(e.audit_id) {
            continue;
        }
        let resource = e
            .object_ref
            .as_ref()
            .and_then(|o| o.resource.clone())
            .unwrap_or_else(|| "-".to_string());
        let what = match e.object_ref.and_then(|o| o.subresource) {
            Some(sub) => format!("{} {resource}/{sub}", e.verb),
            None => format!("{} {resource}", e.verb),
        };
        out.push(Request {
            user: e.user.username,
            what,
            at: e.request_received_timestamp,
        });
    }
    Ok(out)
}

/// Requests of `user` received in `[from, to)`, by `verb resource`.
pub fn count(requests: &[Request], user: &str, from: Timestamp, to: Timestamp) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for r in requests
        .iter()
        .filter(|r| r.user == user && r.at >= from && r.at < to)
    {
        *out.entry(r.what.clone()).or_insert(0) += 1;
    }
    out
}

/// The sum of a count.
pub fn total(counts: &BTreeMap<String, u64>) -> u64 {
    counts.values().sum()
}
