//! `kubectl gpunode approve|unapprove NODE RUNG...`: the edit of the node annotation
//! `gpunode.dev/approve` that the node's condition prints, done safely. Approve accepts only
//! rungs the node waits for and keeps those approved already; unapprove removes only what is
//! there. Each write is a merge patch carrying the node's resourceVersion: if the node changed
//! since it was read (another approval, the operator forgetting one), the API server refuses
//! it with 409 Conflict and the edit is made again on the node as it is now.

use std::collections::BTreeSet;

use gpunode_crds::policy::APPROVE_ANNOTATION;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::{
    error::Error,
    fetch,
    live::{self, Snapshot},
};

/// How often an edit is made again after a 409 Conflict before giving up.
const ATTEMPTS: usize = 5;

/// The field manager of the plugin's writes.
const FIELD_MANAGER: &str = "kubectl-gpunode";

/// Approve or withdraw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edit {
    /// Add rungs the node waits for.
    Approve,
    /// Remove approved rungs.
    Unapprove,
}

/// What an edit changed.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The node.
    pub node: String,
    /// The rungs approved before.
    pub before: BTreeSet<String>,
    /// The rungs approved after.
    pub after: BTreeSet<String>,
}

impl Outcome {
    /// One line for the person: what changed and the annotation as it is now.
    pub fn text(&self) -> String {
        let added: Vec<&str> = self.after.difference(&self.before).map(String::as_str).collect();
        let removed: Vec<&str> = self.before.difference(&self.after).map(String::as_str).collect();
        let change = match (added.is_empty(), removed.is_empty()) {
            (false, _) => format!("approved {}", added.join(", ")),
            (true, false) => format!("withdrew {}", removed.join(", ")),
            (true, true) => "already so, nothing changed".to_string(),
        };
        let now = if self.after.is_empty() {
            format!("{APPROVE_ANNOTATION} removed")
        } else {
            format!("{APPROVE_ANNOTATION}={}", join(&self.after))
        };
        format!("node/{}: {change} ({now})\n", self.node)
    }
}

fn join(rungs: &BTreeSet<String>) -> String {
    rungs.iter().cloned().collect::<Vec<_>>().join(",")
}

/// Makes the edit on `node`, reading it again and retrying when it changed meanwhile.
pub async fn edit(
    client: &Client,
    namespace: &str,
    node: &str,
    rungs: &[String],
    edit: Edit,
) -> Result<Outcome, Error> {
    let requested: BTreeSet<String> = rungs.iter().map(|r| r.trim().to_string()).collect();
    if let Some(bad) = requested.iter().find(|r| r.is_empty() || r.contains(',')) {
        return Err(Error::Usage(format!(
            "{bad:?} is not a rung: name one rule action or repair step per argument"
        )));
    }
    for _ in 0..ATTEMPTS {
        let current = fetch::node(client, node).await?;
        let before = live::approved(&current);
        let after = match edit {
            Edit::Approve => approve_set(client, namespace, &current, &before, &requested).await?,
            Edit::Unapprove => unapprove_set(node, &before, &requested)?,
        };
        if after == before {
            return Ok(Outcome {
                node: node.to_string(),
                before,
                after,
            });
        }
        match write(client, &current, &after).await {
            Ok(()) => {
                return Ok(Outcome {
                    node: node.to_string(),
                    before,
                    after,
                });
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => {
                return Err(Error::from_kube(
                    &format!("patch node {node}"),
                    || format!("node {node} not found"),
                    e,
                ));
            }
        }
    }
    Err(Error::Api {
        what: format!("patch node {node}"),
        message: format!("the node kept changing: {ATTEMPTS} attempts met a newer resourceVersion"),
    })
}

/// The approvals after approving `requested`: each must be a rung the node waits for now.
async fn approve_set(
    client: &Client,
    namespace: &str,
    node: &Node,
    before: &BTreeSet<String>,
    requested: &BTreeSet<String>,
) -> Result<BTreeSet<String>, Error> {
    let name = node.name_any();
    let snapshot = Snapshot::read_for(client, node, namespace).await?;
    let policy = snapshot.governing(node)?;
    let governed = snapshot.govern(policy);
    let awaited = governed.awaited_rungs(&name, snapshot.now);
    check_awaited(&name, &policy.name_any(), &awaited, requested)?;
    Ok(before.union(requested).cloned().collect())
}

/// Refuses a rung the node does not wait for, naming those it does.
pub fn check_awaited(
    node: &str,
    policy: &str,
    awaited: &BTreeSet<String>,
    requested: &BTreeSet<String>,
) -> Result<(), Error> {
    let unknown: Vec<&str> = requested.difference(awaited).map(String::as_str).collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let waits = if awaited.is_empty() {
        "it waits for no approval".to_string()
    } else {
        format!("it waits for: {}", join(awaited))
    };
    Err(Error::Usage(format!(
        "node {node} does not wait for approval of {} under policy {policy}; {waits}",
        unknown.join(", ")
    )))
}

/// The approvals after withdrawing `requested`: each must be approved now.
pub fn unapprove_set(
    node: &str,
    before: &BTreeSet<String>,
    requested: &BTreeSet<String>,
) -> Result<BTreeSet<String>, Error> {
    let missing: Vec<&str> = requested.difference(before).map(String::as_str).collect();
    if !missing.is_empty() {
        let approved = if before.is_empty() {
            "nothing is approved on it".to_string()
        } else {
            format!("approved: {}", join(before))
        };
        return Err(Error::Usage(format!(
            "node {node} has no approval of {}; {approved}",
            missing.join(", ")
        )));
    }
    Ok(before.difference(requested).cloned().collect())
}

/// Writes the annotation (removes it when `after` is empty), on the node's resourceVersion.
async fn write(client: &Client, node: &Node, after: &BTreeSet<String>) -> Result<(), kube::Error> {
    let value = if after.is_empty() {
        serde_json::Value::Null
    } else {
        json!(join(after))
    };
    let patch = json!({
        "metadata": {
            "resourceVersion": node.resource_version(),
            "annotations": {APPROVE_ANNOTATION: value},
        }
    });
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    Api::<Node>::all(client.clone())
        .patch(&node.name_any(), &pp, &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_rung_the_node_does_not_wait_for_is_refused_naming_those_it_does() {
        let e = check_awaited("n", "p", &set(&["Drain", "reboot"]), &set(&["Cordon", "Drain"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "node n does not wait for approval of Cordon under policy p; it waits for: Drain,reboot"
        );
        assert_eq!(e.exit_code(), crate::error::exit::USAGE);
        let e = check_awaited("n", "p", &set(&[]), &set(&["Drain"])).unwrap_err();
        assert!(e.to_string().ends_with("it waits for no approval"), "{e}");
        assert!(check_awaited("n", "p", &set(&["Drain"]), &set(&["Drain"])).is_ok());
    }

    #[test]
    fn unapprove_keeps_the_others_and_refuses_what_is_not_approved() {
        assert_eq!(
            unapprove_set("n", &set(&["Drain", "reboot"]), &set(&["Drain"])).unwrap(),
            set(&["reboot"])
        );
        let e = unapprove_set("n", &set(&["reboot"]), &set(&["Drain"])).unwrap_err();
        assert_eq!(e.to_string(), "node n has no approval of Drain; approved: reboot");
    }

    #[test]
    fn the_outcome_says_what_changed_and_what_the_annotation_is_now() {
        let o = Outcome {
            node: "n".into(),
            before: set(&["reboot"]),
            after: set(&["Drain", "reboot"]),
        };
        assert_eq!(
            o.text(),
            "node/n: approved Drain (gpunode.dev/approve=Drain,reboot)\n"
        );
        let o = Outcome {
            node: "n".into(),
            before: set(&["Drain"]),
            after: set(&[]),
        };
        assert_eq!(o.text(), "node/n: withdrew Drain (gpunode.dev/approve removed)\n");
    }
}
