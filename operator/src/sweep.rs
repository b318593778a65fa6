//! Nodes that carry gpunode's markers (labels, annotations, taint, condition, cordon) while no
//! policy governs them: left by a finalizer someone removed by hand, an older gpunode, or a
//! release that was cut short. A deleted policy releases its own nodes before its finalizer goes;
//! this finds whatever is left, at start-up and whenever a policy goes away, so nothing gpunode
//! did outlives every policy that could undo it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::{markers, observe::SelectorIndex};

/// Whether gpunode left anything on the node.
pub fn has_markers(node: &Node) -> bool {
    let meta = &node.metadata;
    let labels = meta
        .labels
        .iter()
        .flatten()
        .any(|(k, _)| crate::apply::is_ours_label(k));
    let annotations = meta
        .annotations
        .iter()
        .flatten()
        .any(|(k, _)| k.starts_with(crate::markers::PREFIX));
    let taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == markers::TAINT_KEY));
    let condition = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == markers::CONDITION_TYPE));
    labels || annotations || taint || condition
}

/// The nodes with gpunode's markers that no policy governs: the policy their label names does
/// not exist, and no policy that is not being deleted selects them. `None` when that cannot be
/// told: a policy that cannot be read might select any node, so nothing is released.
pub fn unowned(nodes: &[Arc<Node>], index: &SelectorIndex) -> Option<Vec<Arc<Node>>> {
    if index.has_unreadable() {
        return None;
    }
    Some(
        nodes
            .iter()
            .filter(|n| has_markers(n))
            .filter(|n| {
                n.labels()
                    .get(markers::POLICY_LABEL)
                    .is_none_or(|p| !index.labels_a_policy(p))
            })
            .filter(|n| !index.selects_any(n.labels()))
            .cloned()
            .collect(),
    )
}
