//! `spec.repair`: the steps gpunode takes after a drain, to bring a drained node back (a GPU reset
//! by the node's probe, a hand-off to a remediator that reboots or replaces it), with timeouts and
//! a limit on attempts per window.
//!
//! Field docs are the text `kubectl explain gpunodepolicy.spec.repair...` prints: they are user
//! docs.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::{duration::Duration, types::DriftClass};

/// A DNS label (RFC 1123): what a step's name must be, so it can name events and metrics.
pub const STEP_NAME_RE: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// The suffix of a remediation template's kind: the object created from it has the same kind
/// without it (the NodeHealthCheck convention).
pub const TEMPLATE_SUFFIX: &str = "Template";

/// What gpunode does to a drained node that is still drifted, in order, one step at a time.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
// The API server refuses duplicate names through the list's map keys too; this rule says it in
// words, and lets `gpunode-operator check` (which has no list-map validation) refuse them as well.
#[x_kube(validation = Rule::new("self.steps.all(s, self.steps.exists_one(t, t.name == s.name))")
    .message("Duplicate value: each repair step needs its own name")
    .field_path(".steps"))]
pub struct RepairPolicy {
    /// The steps, in order. Once the drain of a node has evicted everything it may, the first
    /// step whose `classes` include one of the node's drifting classes starts. A step that
    /// fails or times out moves to the next such step; a step that succeeds is judged by the
    /// probe's next report after it: still drifted moves to the next step, compliant lets the
    /// node recover as usual (gpunode's cordon and taints go after `recovery.healthyFor`). When
    /// no step is left, the node gets the condition reason NeedsHuman and stays cordoned.
    #[schemars(length(min = 1, max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub steps: Vec<RepairStep>,

    /// Most steps gpunode starts on one node within `window`. A node that has used them stops
    /// escalating: condition reason NeedsHuman, a NeedsHuman event, and it stays cordoned.
    /// Defaults to 2.
    #[serde(default = "default_max_attempts")]
    #[schemars(range(min = 1, max = 100))]
    pub max_attempts: u32,

    /// The sliding window `maxAttempts` counts over. Defaults to 24h.
    #[serde(default = "default_window")]
    pub window: Duration,
}

fn default_max_attempts() -> u32 {
    2
}

fn default_window() -> Duration {
    Duration::from_secs(24 * 3600)
}

/// One step of the repair ladder.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.action != 'Remediator' || has(self.remediator)")
    .message("remediator is required when action is Remediator: the template gpunode copies")
    .field_path(".remediator"))]
#[x_kube(validation = Rule::new("self.action != 'GpuReset' || !has(self.remediator)")
    .message("remediator is only for action Remediator: a GpuReset step is done by the node's probe")
    .field_path(".remediator"))]
pub struct RepairStep {
    /// The step's name (a DNS label, unique in the list): it names the step in events, the
    /// node's condition, the policy status and the metrics.
    #[schemars(length(min = 1, max = 63), regex(pattern = STEP_NAME_RE))]
    pub name: String,

    /// What the step does.
    /// - GpuReset: the node's probe resets, through NVML, each GPU that drifts in one of the
    ///   step's `classes` (a GpuResetRequest per GPU; the chart's `nodeProbe.gpuReset.enabled`
    ///   must be on). A reset applies a pending row remap and clears volatile ECC counters and
    ///   the GPU's XIDs; it is refused while any process uses the GPU. A node with no such GPU
    ///   (a node-wide drift) skips the step. GpuReset steps also run without a drain, for GPUs
    ///   under a TaintDevice NoExecute quarantine once the node's report lists no pod on them.
    /// - Remediator: create a custom resource from `remediator`'s template (medik8s Self Node
    ///   Remediation, a machine deletion, Cluster API, Metal3, a cloud's repair controller), and
    ///   wait for it to finish.
    pub action: RepairAction,

    /// The drift classes this step can repair (at least one): the step runs only on a node that
    /// drifts in one of them. A reboot repairs Xid and Memory; it does not repair Driver.
    #[schemars(length(min = 1, max = 13))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub classes: Vec<DriftClass>,

    /// How long the step may take: from its start until the probe reports on the node after
    /// the step finished. A step still running then has timed out, and the next step starts.
    /// Defaults to 30m.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,

    /// Start the step only once a person approved it on the node: the annotation
    /// gpunode.dev/approve lists the step's name, for example
    /// `kubectl annotate --overwrite node NODE gpunode.dev/approve=replace`. Until then the step
    /// waits (the node's condition, an AwaitingApproval event and the policy status print that
    /// command). Defaults to false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_approval: bool,

    /// The template a Remediator step copies (only for action Remediator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediator: Option<RemediatorTemplate>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(30 * 60)
}

/// The action of a repair step.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, schemars::JsonSchema,
)]
#[schemars(transform = crate::types::without_description)]
pub enum RepairAction {
    /// Reset the node's drifting GPUs through NVML, by its probe.
    GpuReset,
    /// Hand the node to a remediator through a custom resource made from a template.
    Remediator,
}

/// A remediation template, as medik8s NodeHealthCheck names one: an object of kind
/// `<Kind>Template` whose `spec.template.spec` gpunode copies into a new object of kind `<Kind>`,
/// named after the node, in the template's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(format!("self.kind.endsWith('{TEMPLATE_SUFFIX}') && size(self.kind) > {}", TEMPLATE_SUFFIX.len()))
    .message("kind must be a template kind, <Kind>Template (for example SelfNodeRemediationTemplate): gpunode creates a <Kind> from it")
    .field_path(".kind"))]
pub struct RemediatorTemplate {
    /// The template's apiVersion, group/version (for example
    /// self-node-remediation.medik8s.io/v1alpha1). The created object has the same one.
    #[schemars(length(min = 3, max = 317), regex(pattern = "^[a-z0-9.-]+/[a-z0-9]+$"))]
    pub api_version: String,

    /// The template's kind, ending in Template (for example SelfNodeRemediationTemplate). The
    /// operator's ServiceAccount must be allowed to get it and to get, create and delete the
    /// kind without the suffix: the chart's `operator.remediators` value grants exactly that.
    #[schemars(length(min = 9, max = 63))]
    pub kind: String,

    /// The template's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// The template's namespace, where the object is created; omit for a cluster-scoped
    /// template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,

    /// The condition type that says the remediation finished: status True is success, False is
    /// failure (the next step starts at once), anything else is still running. The object being
    /// deleted by its remediator also counts as finished. Defaults to Succeeded (the medik8s
    /// convention).
    #[serde(default = "default_completion_condition")]
    #[schemars(length(min = 1, max = 316))]
    pub completion_condition: String,
}

fn default_completion_condition() -> String {
    "Succeeded".to_string()
}

impl RemediatorTemplate {
    /// The kind of the object created from the template.
    pub fn created_kind(&self) -> &str {
        self.kind.strip_suffix(TEMPLATE_SUFFIX).unwrap_or(&self.kind)
    }
}

impl RepairPolicy {
    /// The step named `name`, with its position.
    pub fn step(&self, name: &str) -> Option<(usize, &RepairStep)> {
        self.steps.iter().enumerate().find(|(_, s)| s.name == name)
    }
}
