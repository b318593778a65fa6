//! `GpuResetRequest`: the operator asks a node's probe to reset one GPU (a `GpuReset` repair
//! step), and the probe writes back how it went. One per node and GPU, named
//! `<node>-gpu-<index>` ([`crate::names::reset_request_name`]), cluster-scoped like the node.
//!
//! The operator creates and deletes requests; the probe only reads its own node's and patches
//! their status (RBAC and the chart's admission policy keep it to its own node). A request
//! names the GPU by index and UUID: a probe whose GPU at that index has another UUID resets
//! nothing and fails the request.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label on every request naming its node through [`crate::names::label_value`] (the probe lists
/// its own node's by it).
pub const NODE_LABEL: &str = "gpunode.dev/node";
/// The condition a request's status carries when the reset finished: True succeeded, False
/// failed (the medik8s remediation convention, so the repair step reads it like any
/// remediator's).
pub const SUCCEEDED: &str = "Succeeded";

/// GpuResetRequest asks the gpunode node-probe on `spec.nodeName` to reset one GPU through NVML.
/// The operator makes one for a GpuReset repair step; the probe writes the outcome to status.
// Each printcolumn(...) repeats the same keys, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpunode.dev",
    version = "v1alpha1",
    kind = "GpuResetRequest",
    plural = "gpuresetrequests",
    shortname = "grr",
    category = "gpunode",
    status = "GpuResetRequestStatus",
    derive = "PartialEq",
    doc = "GpuResetRequest asks the gpunode node-probe on a node to reset one of its GPUs through NVML; the probe writes the outcome to status.",
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".spec.nodeName",
        description = "The node"
    ),
    printcolumn(
        name = "GPU",
        type_ = "integer",
        json_path = ".spec.index",
        description = "NVML's index of the GPU"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Resetting, Succeeded or Failed"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.message",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("a GpuResetRequest's spec is immutable: delete it and create another"))]
pub struct GpuResetRequestSpec {
    /// The node whose probe resets the GPU.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,

    /// NVML's index of the GPU on that node.
    #[schemars(range(max = 63))]
    pub index: u32,

    /// NVML's UUID of the GPU (GPU-...). The probe resets nothing when the GPU at `index` has
    /// another UUID: indices can change when a GPU falls off the bus or the node reboots.
    #[schemars(length(min = 5, max = 64), regex(pattern = "^GPU-[0-9a-fA-F-]+$"))]
    pub uuid: String,
}

/// Where a reset stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ResetPhase {
    /// The probe took the request and is resetting the GPU.
    Resetting,
    /// The GPU was drained, removed and discovered again.
    Succeeded,
    /// The reset was refused or failed: `message` says why.
    Failed,
}

/// What the probe reports about the reset.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuResetRequestStatus {
    /// Resetting, Succeeded or Failed; absent until the probe takes the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ResetPhase>,

    /// What happened, for example "GPU 3 is in use by processes [4242]: not reset".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,

    /// When the probe took the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,

    /// When the reset finished (succeeded or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,

    /// `Succeeded`: True once the reset succeeded, False once it failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl GpuResetRequestStatus {
    /// Whether the reset finished, one way or the other.
    pub fn finished(&self) -> bool {
        matches!(self.phase, Some(ResetPhase::Succeeded | ResetPhase::Failed))
    }
}

/// The name of the request to reset GPU `index` of `node`
/// ([`crate::names::reset_request_name`]).
pub use crate::names::reset_request_name as request_name;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_named_after_its_node_and_gpu() {
        assert_eq!(request_name("gpu-07", 3).as_deref(), Some("gpu-07-gpu-3"));
        assert_eq!(request_name("", 3), None);
        assert_eq!(request_name(&"n".repeat(247), 3).map(|n| n.len()), Some(253));
        assert_eq!(request_name(&"n".repeat(248), 10), None);
    }
}
