//! What gpunode writes on a node, as a user (and every check) reads it: its taint key, state
//! label, cordon and drain markers (README "What happens to a node"), and the accessors the checks share.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;

/// gpunode's taint key, state label and cordon marker (README "What happens to a node"), as a user sees them.
pub const TAINT_KEY: &str = "gpunode.dev/drift";
/// The verdict label.
pub const STATE_LABEL: &str = "gpunode.dev/state";
/// Set with gpunode's own cordon.
pub const CORDONED_ANNOTATION: &str = "gpunode.dev/cordoned";
/// Written when gpunode starts a drain.
pub const DRAIN_STARTED_ANNOTATION: &str = "gpunode.dev/drain-started";

/// Whether gpunode's taints or its cordon take the node out of service.
pub fn disrupted(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
        ts.iter()
            .any(|t| t.key == TAINT_KEY && matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
    });
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false)
        && annotation(node, CORDONED_ANNOTATION).as_deref() == Some("true");
    tainted || cordoned
}

/// A node's annotation.
pub fn annotation(node: &Node, key: &str) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key).cloned())
}

/// A node's label.
pub fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref().and_then(|a| a.get(key).cloned())
}

/// gpunode's taints on a node, as `value:effect`.
pub fn gpunode_taints(node: &Node) -> BTreeSet<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.key == TAINT_KEY)
        .map(|t| format!("{}:{}", t.value.as_deref().unwrap_or_default(), t.effect))
        .collect()
}
