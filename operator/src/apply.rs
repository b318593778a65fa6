//! apply: the only code that writes to nodes. Each write is idempotent and skipped when the node
//! already looks as planned, so a reconcile that changes nothing writes nothing.
//!
//! - Labels and bookkeeping annotations: server-side apply with one field manager.
//! - Taints and cordon: read-modify-write with a resourceVersion precondition, retried on
//!   conflict. `spec.taints` is an atomic list, so SSA or a merge patch without the precondition
//!   would clobber other owners' taints; only taints with gpunode's key are ever changed. The
//!   cordon marker travels in the same write as the cordon, so a crash never leaves one without
//!   the other.
//! - The `GpuPolicyCompliant` condition: server-side apply of the status (conditions merge by
//!   type), `lastTransitionTime` moved only when the status flips.
//! - Drain: the Eviction API (PodDisruptionBudgets honoured; a refusal is retried on the next
//!   reconcile); DaemonSet and mirror pods, pods in protected namespaces and terminating pods are
//!   skipped, so a restarted operator resumes without evicting anything twice.
//! - Per-GPU quarantine with NoExecute on a device-plugin node: the same Eviction API and rules,
//!   for only the pods the node's report lists as holding the quarantined GPU, each with its uid
//!   as a precondition and only if it existed when the probe saw it (a pod recreated under the
//!   same name is not the one that held the GPU). The rest of the node stays schedulable.
//!
//! [`Applier::apply_policy`] writes a policy's plan: the nodes with something to do, many at
//! once, each node's result ([`NodeResult`]) handed to the caller as it completes and all of them
//! returned as [`Applied`], from which the status counts what is in effect, not what was planned.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    num::NonZeroUsize,
    sync::Arc,
};

use futures::StreamExt;

use gpunode_crds::{
    policy::{DrainPolicy, POD_SELECTOR_FIELD},
    selector::{self, InvalidSelector},
};
use jiff::Timestamp;
use k8s_openapi::{
    api::{
        batch::v1::Job,
        core::v1::{Node, Pod, Taint},
    },
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
    core::{Selector, SelectorExt},
};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::{
    leader::Leadership,
    markers::{
        self, CONDITION_TYPE, CORDONED_ANNOTATION, DRIFT_LABEL_PREFIX, DriftTaint, TAINT_KEY, drift_taints,
    },
    metrics::{ActionKind, ActionResult, ErrorKind, Metrics, WritePart},
    plan::{DrainStep, InEffect, NodePlan, PolicyPlan, Quarantine, QuarantineTarget},
    remediators::{Deletion, Remediators},
};

/// The field manager of every gpunode write.
pub const FIELD_MANAGER: &str = gpunode_crds::names::OPERATOR_FIELD_MANAGER;

/// How often a conflicting taint/cordon write is retried before the reconcile gives up.
const MAX_CONFLICT_RETRIES: usize = 5;

/// How many nodes of one policy are written at once unless `--apply-concurrency` says otherwise.
/// The scale benchmark's sweep of gpunode's own request: 8 in flight leaves the API server idle
/// between requests; 16–32 is its fastest at 100 nodes (128 was 27 % slower); from 32 to 512
/// all are alike at 1,000 and 5,000. 32 also leaves most of the API server's default mutating
/// in-flight budget (200) to others.
pub const DEFAULT_APPLY_CONCURRENCY: NonZeroUsize = NonZeroUsize::new(32).unwrap();

/// Why a write failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The API server refused or failed a request.
    #[error("{step} on node {node}: {source}")]
    Api {
        /// What was being written.
        step: Step,
        /// The node.
        node: String,
        /// The error.
        source: kube::Error,
    },
    /// The node changed under every retry.
    #[error("node {0} kept changing while its taints were updated; retrying later")]
    Conflict(String),
    /// This replica stopped leading before the write (its lease term passed, e.g. after the
    /// process was paused): nothing more is written.
    #[error("node {0}: not the leader any more; write skipped")]
    NotLeader(String),
    /// The node's DeviceTaintRules cannot be written yet (their policy is not in the cache).
    #[error("node {node}: {source}")]
    Devices {
        /// The node.
        node: String,
        /// Why.
        source: devices::SyncError,
    },
    /// A repair step's object could not be made or deleted.
    #[error("node {node}: repair: {source}")]
    Repair {
        /// The node.
        node: String,
        /// Why.
        source: crate::remediators::RemediatorError,
    },
    /// The drain's pod selector cannot be used: nothing is evicted.
    #[error("node {node}: nothing evicted: {source}")]
    InvalidSelector {
        /// The node.
        node: String,
        /// The field and why.
        source: InvalidSelector,
    },
}

impl ApplyError {
    /// The metric kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ApplyError::Api { step, .. } => step.kind(),
            ApplyError::Conflict(_) => ErrorKind::Conflict,
            ApplyError::Devices { .. } => ErrorKind::Taints,
            ApplyError::Repair { .. } => ErrorKind::Repair,
            ApplyError::NotLeader(_) | ApplyError::InvalidSelector { .. } => ErrorKind::Other,
        }
    }
}

pub mod devices;

/// Which request of a node's apply failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Reading the node before a taint or cordon write.
    ReadNode,
    /// The taints or the cordon.
    Taints,
    /// Labels, annotations and the condition (one apply through nodes/status).
    LabelsAndCondition,
    /// Deleting the condition on release.
    Condition,
    /// Listing the node's pods for a drain.
    ListPods,
    /// The DeviceTaintRules of the node's GPU quarantines.
    DeviceTaints,
    /// Deleting a validation Job no longer wanted.
    Validation,
}

impl Step {
    fn kind(self) -> ErrorKind {
        match self {
            Step::ReadNode => ErrorKind::Read,
            Step::Taints => ErrorKind::Taints,
            Step::LabelsAndCondition => ErrorKind::Labels,
            Step::Condition => ErrorKind::Condition,
            Step::ListPods => ErrorKind::Drain,
            Step::DeviceTaints => ErrorKind::Taints,
            Step::Validation => ErrorKind::Repair,
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::ReadNode => "read node",
            Step::Taints => "taints",
            Step::LabelsAndCondition => "labels and condition",
            Step::Condition => "condition",
            Step::ListPods => "list pods",
            Step::DeviceTaints => "device taint rules",
            Step::Validation => "validation job",
        })
    }
}

/// Which pods a drain may evict, from the policy's pod selector.
#[derive(Debug, Clone, PartialEq)]
pub enum PodSelection {
    /// No selector: every pod that is otherwise evictable.
    All,
    /// Only pods whose labels match.
    Matching(Selector),
}

impl PodSelection {
    /// The selection of `policy`; an unusable selector is an error, never "every pod".
    pub fn of(policy: &DrainPolicy) -> Result<PodSelection, InvalidSelector> {
        match &policy.pod_selector {
            None => Ok(PodSelection::All),
            Some(s) => selector::parse(POD_SELECTOR_FIELD, s).map(PodSelection::Matching),
        }
    }

    fn admits(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            PodSelection::All => true,
            PodSelection::Matching(s) => s.matches(labels),
        }
    }
}

/// The pods a drain pass evicts, in list order. Fails closed: with a pod selector it cannot
/// parse, it evicts nothing.
pub fn to_evict<'a>(pods: &'a [Pod], policy: &DrainPolicy) -> Result<Vec<&'a Pod>, InvalidSelector> {
    let selection = PodSelection::of(policy)?;
    Ok(pods.iter().filter(|p| evictable(p, policy, &selection)).collect())
}

/// The pods per-GPU quarantines evict on a device-plugin node, in list order: those the node's
/// report lists as holding a GPU quarantined with NoExecute that are still on the node (`pods`
/// is the node's pod list), existed when the probe saw them there, and that a drain would evict.
/// Fails closed like [`to_evict`].
pub fn gpu_holders_to_evict<'a>(
    pods: &'a [Pod],
    quarantines: &[Quarantine],
    policy: &DrainPolicy,
) -> Result<Vec<&'a Pod>, InvalidSelector> {
    let selection = PodSelection::of(policy)?;
    let wanted: BTreeMap<(&str, &str), Option<Timestamp>> = quarantines
        .iter()
        .filter_map(|q| match &q.target {
            QuarantineTarget::DevicePlugin { evict, observed_at } => Some((evict, *observed_at)),
            QuarantineTarget::Dra(_) => None,
        })
        .flat_map(|(evict, seen)| {
            evict
                .iter()
                .map(move |p| ((p.namespace.as_str(), p.name.as_str()), seen))
        })
        .collect();
    Ok(pods
        .iter()
        .filter(|p| {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let name = p.metadata.name.as_deref().unwrap_or_default();
            let Some(seen) = wanted.get(&(ns, name)) else {
                return false;
            };
            let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let existed = match (seen, created) {
                (Some(seen), Some(created)) => created <= *seen,
                _ => true,
            };
            existed && evictable(p, policy, &selection)
        })
        .collect())
}

/// What one node's apply did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct NodeOutcome {
    /// The node as the API server returned it after this apply's last write (`None`: nothing
    /// was written), so the next pass can read its own writes before the watch delivers them.
    /// Boxed: a pass keeps every node's outcome until it ends, and a Node inline would make
    /// each 1.5 KB even once the node is taken (7.5 MiB over a 5,000-node convergence).
    pub written: Option<Box<Node>>,
    /// Labels or annotations were written.
    pub wrote_metadata: bool,
    /// Taints or the cordon were written.
    pub wrote_spec: bool,
    /// The condition was written.
    pub wrote_condition: bool,
    /// Pods evicted in this pass.
    pub evicted: u32,
    /// Evictable pods still on the node (0: the drain is complete).
    pub remaining: u32,
    /// Evictions refused by a PodDisruptionBudget in this pass.
    pub refused: u32,
    /// DeviceTaintRules written or deleted.
    pub device_rules: u32,
    /// A repair step's object could not be made after the node's record (the step's start) was
    /// written: the plan took effect, and the next pass makes the object (its events are
    /// published, since the start they announce is recorded).
    pub repair_failed: Option<String>,
    /// The validation Job could not be made or deleted (the API server's reason): the next
    /// pass tries again, until the validation's timeout.
    pub validation_failed: Option<String>,
}

impl NodeOutcome {
    /// The parts of the node this apply wrote.
    pub fn parts_written(&self) -> impl Iterator<Item = WritePart> + use<> {
        [
            (WritePart::Metadata, self.wrote_metadata),
            (WritePart::Spec, self.wrote_spec),
            (WritePart::Condition, self.wrote_condition),
        ]
        .into_iter()
        .filter_map(|(part, wrote)| wrote.then_some(part))
    }
}

/// How one node of a policy's plan went.
#[derive(Debug)]
pub enum NodeResult {
    /// Nothing to do: the node already is as planned.
    Unchanged,
    /// Nothing may be written to the node by this policy (skip label, paused policy, another
    /// policy writes it).
    NotWritten,
    /// Written (and drained) as planned.
    Applied(Box<NodeOutcome>),
    /// A request failed (or this replica stopped leading): the node is as it was, or partly
    /// written, and the next pass tries again.
    Failed(ApplyError),
}

impl NodeResult {
    /// Whether what the plan says is in effect on the node now.
    pub fn took_effect(&self) -> bool {
        matches!(self, NodeResult::Unchanged | NodeResult::Applied(_))
    }

    /// The error, if the node failed.
    pub fn failure(&self) -> Option<&ApplyError> {
        match self {
            NodeResult::Failed(e) => Some(e),
            _ => None,
        }
    }

    fn into_failure(self) -> Option<ApplyError> {
        match self {
            NodeResult::Failed(e) => Some(e),
            _ => None,
        }
    }
}

/// What applying a policy's plan did, node by node (in the plan's order).
#[derive(Debug)]
pub struct Applied {
    /// One per node of the plan.
    pub results: Vec<NodeResult>,
}

impl Applied {
    /// What gpunode has in effect on each of the plan's nodes: the plan where it was written
    /// (or had nothing to write), what was there before where it was not.
    pub fn in_effect<'a>(
        &'a self,
        plan: &'a PolicyPlan,
    ) -> impl Iterator<Item = (&'a NodePlan, InEffect)> + 'a {
        plan.nodes.iter().zip(&self.results).map(|(np, r)| {
            let effect = if r.took_effect() {
                np.after()
            } else {
                np.before.clone()
            };
            (np, effect)
        })
    }

    /// Whether each of the plan's nodes' plan took effect (written, or nothing to write).
    pub fn took_effect(&self) -> impl Iterator<Item = bool> + '_ {
        self.results.iter().map(NodeResult::took_effect)
    }

    /// Nodes written.
    pub fn written(&self) -> usize {
        self.results
            .iter()
            .filter(|r| matches!(r, NodeResult::Applied(_)))
            .count()
    }

    /// Pods evicted and evictions refused by a PodDisruptionBudget, over all nodes.
    pub fn evictions(&self) -> (u32, u32) {
        self.results.iter().fold((0, 0), |(e, r), n| match n {
            NodeResult::Applied(o) => (e + o.evicted, r + o.refused),
            _ => (e, r),
        })
    }

    /// The failures.
    pub fn failures(&self) -> impl Iterator<Item = &ApplyError> {
        self.results.iter().filter_map(NodeResult::failure)
    }

    /// How many nodes failed, and the first failure.
    pub fn into_failure(self) -> Option<(usize, ApplyError)> {
        let failed = self.failures().count();
        let first = self.results.into_iter().find_map(NodeResult::into_failure)?;
        Some((failed, first))
    }
}

/// The labels a node plan implies: every `gpunode.dev/` label gpunode owns.
pub fn desired_labels(policy: &str, plan: &NodePlan) -> BTreeMap<String, String> {
    let mut out = BTreeMap::from([
        (
            markers::POLICY_LABEL.to_string(),
            gpunode_crds::names::label_value(policy),
        ),
        (markers::STATE_LABEL.to_string(), plan.state.to_string()),
    ]);
    for c in &plan.drifting {
        out.insert(markers::drift_label(*c), "true".to_string());
    }
    if let Some(v) = plan.validation.label() {
        out.insert(markers::VALIDATION_LABEL.to_string(), v.to_string());
    }
    if let Some(n) = plan.healthy_gpus {
        out.insert(markers::HEALTHY_GPUS_LABEL.to_string(), n.to_string());
    }
    out
}

/// The bookkeeping annotations written by server-side apply (the cordon marker travels with
/// the cordon itself).
fn desired_annotations(plan: &NodePlan) -> BTreeMap<String, String> {
    let mut a = plan.markers.to_annotations();
    a.remove(CORDONED_ANNOTATION);
    a
}

pub(crate) fn is_ours_label(key: &str) -> bool {
    key == markers::POLICY_LABEL
        || key == markers::STATE_LABEL
        || key == markers::HEALTHY_GPUS_LABEL
        || key == markers::VALIDATION_LABEL
        || key.starts_with(DRIFT_LABEL_PREFIX)
}

fn is_ours_annotation(key: &str) -> bool {
    key.starts_with(crate::markers::PREFIX) && key != CORDONED_ANNOTATION
}

/// The entries of `map` whose keys `keep` accepts, in key order.
fn ours(
    map: Option<&BTreeMap<String, String>>,
    keep: fn(&str) -> bool,
) -> impl Iterator<Item = (&String, &String)> {
    map.into_iter().flatten().filter(move |(k, _)| keep(k))
}

fn to_taint(t: &DriftTaint, now: Timestamp) -> Taint {
    Taint {
        key: TAINT_KEY.to_string(),
        value: Some(t.value.clone()),
        effect: t.effect.as_str().to_string(),
        time_added: Some(Time(now)),
    }
}

/// gpunode's condition on the node, if any.
fn our_condition(node: &Node) -> Option<&k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_TYPE))
}

fn condition_unchanged(plan: &NodePlan, observed: &Node) -> bool {
    let c = &plan.condition;
    our_condition(observed).is_some_and(|e| {
        e.status == c.status
            && e.reason.as_deref() == Some(c.reason.as_str())
            && e.message.as_deref() == Some(c.message.as_str())
    })
}

fn metadata_unchanged(policy: &str, plan: &NodePlan, observed: &Node) -> bool {
    let meta = &observed.metadata;
    // Both sides iterate in key order, so comparing the sequences compares the maps (every
    // pass checks every node: no map is built for the observed side).
    ours(meta.labels.as_ref(), is_ours_label).eq(&desired_labels(policy, plan))
        && ours(meta.annotations.as_ref(), is_ours_annotation).eq(&desired_annotations(plan))
}

/// The write of taints and cordon that brings `node` to the plan.
#[derive(Debug)]
struct SpecChange {
    /// The complete new taint list.
    taints: Vec<Taint>,
    unschedulable: bool,
    /// The new value of the cordon marker, when it changes.
    marker: Option<bool>,
}

/// What taints/cordon write `node` needs to carry exactly gpunode's `desired` taints and apply
/// `cordon` (`ours`: gpunode's cordon, if any, is still the one in place); `None` when nothing.
fn spec_change(
    desired: &BTreeSet<DriftTaint>,
    cordon: Option<bool>,
    ours: bool,
    node: &Node,
    now: Timestamp,
) -> Option<SpecChange> {
    let spec = node.spec.as_ref();
    let current: &[Taint] = spec.and_then(|s| s.taints.as_deref()).unwrap_or_default();
    let unschedulable = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let cordoned_by_us = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(CORDONED_ANNOTATION).is_some_and(|v| v == "true"));
    // Cordon only a schedulable node; uncordon only what gpunode cordoned. The marker says
    // whether gpunode's cordon is the one in place, and is cleared when a person lifted it.
    let (new_unschedulable, marker) = match cordon {
        Some(true) if !unschedulable => (true, true),
        Some(false) if cordoned_by_us && unschedulable => (false, false),
        _ => (unschedulable, cordoned_by_us && unschedulable && ours),
    };
    let keep =
        |t: &Taint| t.key != TAINT_KEY || markers::drift_taint(t).is_some_and(|d| desired.contains(&d));
    let existing_ours = drift_taints(node);
    let taints_unchanged = current.iter().all(keep) && desired.iter().all(|d| existing_ours.contains(d));
    if taints_unchanged && new_unschedulable == unschedulable && marker == cordoned_by_us {
        return None;
    }
    // Keep everyone else's taints untouched and in order; keep our unchanged ones as they are
    // (their timeAdded), add the new ones.
    let mut taints: Vec<Taint> = current.iter().filter(|t| keep(t)).cloned().collect();
    taints.extend(desired.difference(&existing_ours).map(|t| to_taint(t, now)));
    Some(SpecChange {
        taints,
        unschedulable: new_unschedulable,
        marker: (marker != cordoned_by_us).then_some(marker),
    })
}

/// Whether gpunode's field manager still owns metadata through the node's main resource (how
/// gpunode applied labels before they moved to the status subresource).
pub fn has_legacy_metadata_owner(node: &Node) -> bool {
    node.metadata.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER)
            && m.operation.as_deref() == Some("Apply")
            && m.subresource.as_deref().unwrap_or_default().is_empty()
            && m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.get("f:metadata").is_some())
    })
}

/// The error of API request `step` on `node`.
/// An owner reference to `node` (none without a uid: nothing to refer to). Not the Job's
/// controller, and it does not block the node's deletion.
fn node_owner(node: &Node) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "v1".to_string(),
        kind: "Node".to_string(),
        name: node.metadata.name.clone()?,
        uid: node.metadata.uid.clone()?,
        ..OwnerReference::default()
    })
}

fn api_error(step: Step, node: &str) -> impl FnOnce(kube::Error) -> ApplyError {
    let node = node.to_string();
    move |source| ApplyError::Api { step, node, source }
}

/// Writes nodes as planned.
#[derive(Clone)]
pub struct Applier {
    nodes: Api<Node>,
    client: Client,
    /// Checked right before every request: a replica paused mid-apply (SIGSTOP, a long GC-like
    /// stall) must not finish its writes once its lease term has passed.
    gate: Option<Leadership>,
    /// The DeviceTaintRule writer, on a cluster that serves DRA.
    devices: Option<devices::DeviceWriter>,
    /// The repair steps' objects.
    remediators: Remediators,
    /// How many nodes of one policy are written at once.
    concurrency: NonZeroUsize,
    /// Where deletes (and deletes refused: the object is not gpunode's) are counted.
    metrics: Option<Arc<Metrics>>,
}

impl Applier {
    /// An applier; `client` should have kube's automatic 429 retry off, so a refused eviction
    /// returns at once and is retried by the next reconcile.
    pub fn new(client: Client) -> Self {
        Applier {
            nodes: Api::all(client.clone()),
            remediators: Remediators::new(client.clone()),
            client,
            gate: None,
            devices: None,
            concurrency: DEFAULT_APPLY_CONCURRENCY,
            metrics: None,
        }
    }

    /// Makes repair steps' remediation objects only as `bounds` (the chart's) grant.
    pub fn with_remediator_bounds(mut self, bounds: crate::bounds::RemediatorBounds) -> Self {
        self.remediators = self.remediators.with_bounds(bounds);
        self
    }

    /// Counts deletes in `metrics` (`gpunode_actions_total{action="delete"}`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        if let Some(d) = self.devices.take() {
            self.devices = Some(d.with_metrics(metrics.clone()));
        }
        self.metrics = Some(metrics);
        self
    }

    /// Counts what became of a delete.
    fn count(&self, deletion: &Deletion) {
        let result = match deletion {
            Deletion::Deleted => ActionResult::Ok,
            Deletion::Gone => return,
            Deletion::Refused(_) => ActionResult::Refused,
        };
        if let Some(m) = &self.metrics {
            m.action(ActionKind::Delete, result);
        }
    }

    /// Writes at most `concurrency` nodes of one policy at once.
    pub fn with_concurrency(mut self, concurrency: NonZeroUsize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// How many nodes are written at once: a policy's nodes, and the nodes released together.
    pub fn concurrency(&self) -> NonZeroUsize {
        self.concurrency
    }

    /// Makes a validation's Job unless it exists; a leftover of an earlier run under the same
    /// name is deleted (the next pass makes the Job). The Job is owned by `node`: a node that
    /// is deleted (scaled down, replaced) takes its validation with it through the garbage
    /// collector, where gpunode, no longer seeing the node, would never delete it.
    async fn create_job(
        &self,
        create: &crate::plan::validation::CreateJob,
        node: &Node,
    ) -> Result<(), kube::Error> {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &create.namespace);
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        let mut job = (*create.job).clone();
        job.metadata.owner_references = node_owner(node).map(|o| vec![o]);
        match jobs.create(&pp, &job).await {
            Ok(_) => {
                info!(namespace = %create.namespace, job = %create.name, "validation Job created");
                gpunode_crashpoints::crash_point!("validation::after_job");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = jobs.get_opt(&create.name).await?;
                if crate::plan::validation::job_state(existing.as_ref(), create.started)
                    == crate::plan::validation::JobState::Absent
                    && existing.is_some()
                {
                    warn!(job = %create.name, "deleting a leftover validation Job of an earlier run");
                    let node = node.metadata.name.as_deref().unwrap_or_default();
                    self.delete_job(&create.namespace, &create.name, node).await?;
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes a validation's Job of `node` and its pod (gone already is fine), and only that:
    /// the Job is read first and must carry gpunode's labels for `node`; the delete has its uid
    /// as a precondition. Any other Job is left alone (logged and counted).
    async fn delete_job(&self, namespace: &str, name: &str, node: &str) -> Result<(), kube::Error> {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        let Some(job) = jobs.get_opt(name).await? else {
            return Ok(());
        };
        let refused = |why: String| {
            warn!(
                namespace,
                job = name,
                node,
                "not deleting Job {namespace}/{name}: {why}"
            );
            Deletion::Refused(why)
        };
        let labels = job.metadata.labels.as_ref();
        let deletion =
            match crate::remediators::owned_by_labels(labels, crate::plan::validation::NODE_LABEL, node) {
                Err(why) => refused(why),
                Ok(()) => {
                    let params = crate::remediators::uid_precondition(job.metadata.uid.clone());
                    match jobs.delete(name, &params).await {
                        Ok(_) => {
                            info!(namespace, job = name, "validation Job deleted");
                            Deletion::Deleted
                        }
                        Err(kube::Error::Api(s)) if s.code == 404 => Deletion::Gone,
                        Err(kube::Error::Api(s)) if s.code == 409 => refused(
                            "it was replaced by another Job of the same name before the delete".into(),
                        ),
                        Err(e) => return Err(e),
                    }
                }
            };
        self.count(&deletion);
        Ok(())
    }

    /// The client (for the reads before planning).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The writer of repair steps' objects (shared with the reads before planning).
    pub fn remediators(&self) -> &Remediators {
        &self.remediators
    }

    /// Writes GPU quarantines on DRA nodes as DeviceTaintRules through `devices`.
    pub fn with_devices(mut self, devices: devices::DeviceWriter) -> Self {
        self.devices = Some(devices);
        self
    }

    /// Writes only while `leadership` says this replica leads, checked before each request.
    pub fn with_gate(mut self, leadership: Leadership) -> Self {
        self.gate = Some(leadership);
        self
    }

    fn may_write(&self, node: &str) -> Result<(), ApplyError> {
        match &self.gate {
            Some(l) if !l.is_leader() => Err(ApplyError::NotLeader(node.to_string())),
            _ => Ok(()),
        }
    }

    /// Whether [`Applier::apply`] would do anything for this plan: write the node, drain it,
    /// or publish an event. Pure and cheap (nothing is cloned), so a reconcile that changes
    /// nothing skips the node without a request.
    pub fn needs_work(policy: &str, plan: &NodePlan, observed: &Node) -> bool {
        plan.write
            && (!plan.events.is_empty()
                || matches!(plan.drain, DrainStep::Run { .. })
                || plan.evicts_gpu_holders()
                || plan.forget_approval
                || !plan.repair.ensure.is_empty()
                || !plan.repair.delete.is_empty()
                || plan.validation.create.is_some()
                || plan.validation.delete.is_some()
                || spec_change(
                    &plan.taints,
                    plan.cordon,
                    plan.markers.cordoned_by_us,
                    observed,
                    Timestamp::UNIX_EPOCH,
                )
                .is_some()
                || !metadata_unchanged(policy, plan, observed)
                || !condition_unchanged(plan, observed))
    }

    /// Applies policy `policy`'s plan to its nodes (`nodes`, as observed; each node's copy is
    /// released as soon as its write completes): only nodes with something to write, drain or
    /// announce get a request, at most the applier's concurrency at once. `done` sees each
    /// node's result as it completes (and may take the written node out of it); the results
    /// come back in the plan's order.
    #[tracing::instrument(skip_all, fields(policy = policy, nodes = plan.nodes.len()))]
    pub async fn apply_policy(
        &self,
        policy: &str,
        plan: &PolicyPlan,
        nodes: Vec<Arc<Node>>,
        drain: &DrainPolicy,
        now: Timestamp,
        mut done: impl FnMut(&NodePlan, &Node, &mut NodeResult),
    ) -> Applied {
        let mut results: Vec<NodeResult> = plan
            .nodes
            .iter()
            .map(|np| {
                if np.write {
                    NodeResult::Unchanged
                } else {
                    NodeResult::NotWritten
                }
            })
            .collect();
        let jobs: Vec<(usize, Arc<Node>)> = {
            let by_name: HashMap<&str, &Arc<Node>> = nodes
                .iter()
                .map(|n| (n.metadata.name.as_deref().unwrap_or_default(), n))
                .collect();
            plan.nodes
                .iter()
                .enumerate()
                .filter_map(|(i, np)| {
                    let node = *by_name.get(np.node.as_str())?;
                    let devices = np.write && self.devices.as_ref().is_some_and(|d| d.differs(policy, np));
                    (devices || Applier::needs_work(policy, np, node)).then(|| (i, node.clone()))
                })
                .collect()
        };
        // Only the jobs' copies are kept: the cache moves on to the written versions while the
        // writes run (at 5,000 nodes, a second copy of every node for the length of convergence).
        drop(nodes);
        let mut completed = futures::stream::iter(jobs)
            .map(|(i, node)| async move {
                let np = &plan.nodes[i];
                let result = match self.apply(policy, np, &node, drain, now).await {
                    Ok(outcome) => NodeResult::Applied(Box::new(outcome)),
                    Err(e) => NodeResult::Failed(e),
                };
                (i, node, result)
            })
            .buffer_unordered(self.concurrency.get());
        while let Some((i, node, mut result)) = completed.next().await {
            done(&plan.nodes[i], &node, &mut result);
            results[i] = result;
        }
        Applied { results }
    }

    /// Brings `observed` to what `plan` says, writing only what differs.
    #[tracing::instrument(skip_all, fields(node = %plan.node, policy = policy))]
    pub async fn apply(
        &self,
        policy: &str,
        plan: &NodePlan,
        observed: &Node,
        drain: &DrainPolicy,
        now: Timestamp,
    ) -> Result<NodeOutcome, ApplyError> {
        let mut out = NodeOutcome::default();
        if !plan.write {
            return Ok(out);
        }
        self.clear_leftovers(policy, plan, &mut out).await?;
        if let Some(n) = self.apply_spec(plan, observed, now).await? {
            gpunode_crashpoints::crash_point!("apply::after_spec");
            out.wrote_spec = true;
            out.written = Some(Box::new(n));
        }
        let (metadata, condition, written) = self.apply_record(policy, plan, observed, now).await?;
        (out.wrote_metadata, out.wrote_condition) = (metadata, condition);
        out.written = written.map(Box::new).or(out.written);
        self.ensure_repair(policy, plan, observed, now, &mut out).await?;
        // A validation's Job, like a repair step's object, is made only once its start is
        // recorded on the node: a new leader finds the record and resumes it.
        if let Some(create) = &plan.validation.create {
            self.may_write(&plan.node)?;
            if let Err(e) = self.create_job(create, observed).await {
                out.validation_failed =
                    Some(format!("creating Job {}/{}: {e}", create.namespace, create.name));
            }
        }
        if plan.forget_approval {
            self.forget_approval(&plan.node).await?;
        }
        if plan.evicts_gpu_holders() {
            let (evicted, refused) = self.evict_gpu_holders(plan, drain).await?;
            out.evicted = evicted;
            out.refused = refused;
        }
        if let DrainStep::Run { .. } = plan.drain {
            self.drain_step(policy, plan, observed, drain, now, &mut out)
                .await?;
        }
        Ok(out)
    }

    /// What goes before the bookkeeping is written: the device taints (the bookkeeping records
    /// a quarantine only once its rule exists, and a rule left over by a failed write is
    /// deleted by the next pass), the objects of a repair that is over, and the Job of a
    /// validation no longer wanted (a failed delete keeps the record, and is tried again).
    async fn clear_leftovers(
        &self,
        policy: &str,
        plan: &NodePlan,
        out: &mut NodeOutcome,
    ) -> Result<(), ApplyError> {
        if let Some(d) = &self.devices {
            self.may_write(&plan.node)?;
            let (written, deleted) = d.sync(policy, plan).await.map_err(|e| match e {
                devices::SyncError::Api(source) => api_error(Step::DeviceTaints, &plan.node)(source),
                source => ApplyError::Devices {
                    node: plan.node.clone(),
                    source,
                },
            })?;
            out.device_rules = written + deleted;
        }
        for object in &plan.repair.delete {
            self.may_write(&plan.node)?;
            let deletion = self
                .remediators
                .delete(object, &plan.node)
                .await
                .map_err(|source| ApplyError::Repair {
                    node: plan.node.clone(),
                    source,
                })?;
            self.count(&deletion);
        }
        if let Some((namespace, name)) = &plan.validation.delete {
            self.may_write(&plan.node)?;
            self.delete_job(namespace, name, &plan.node)
                .await
                .map_err(|source| ApplyError::Api {
                    step: Step::Validation,
                    node: plan.node.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// A repair step's object is made only once its start is recorded on the node, and its
    /// making is recorded as soon as it exists: a new leader resumes the step, never makes it
    /// twice, and tells its remediator deleting it from it not being made yet.
    async fn ensure_repair(
        &self,
        policy: &str,
        plan: &NodePlan,
        observed: &Node,
        now: Timestamp,
        out: &mut NodeOutcome,
    ) -> Result<(), ApplyError> {
        if plan.repair.ensure.is_empty() {
            return Ok(());
        }
        self.may_write(&plan.node)?;
        let mut exists = true;
        let mut made = plan.clone();
        for e in &plan.repair.ensure {
            match self.remediators.ensure(policy, &plan.node, e).await {
                Ok(Some(uid)) => {
                    gpunode_crashpoints::crash_point!("repair::after_object");
                    // Its uid is recorded with its making: only this object is ever deleted.
                    let recorded = made.markers.repair.objects.iter_mut();
                    for o in recorded.filter(|o| o.same_object(&e.object)) {
                        o.uid = Some(uid.clone());
                    }
                }
                Ok(None) => exists = false,
                Err(source) => {
                    let e = ApplyError::Repair {
                        node: plan.node.clone(),
                        source,
                    };
                    out.repair_failed = Some(e.to_string());
                    exists = false;
                }
            }
        }
        if exists {
            if let Some(step) = made.markers.repair.step.as_mut() {
                step.created = true;
            }
            let (metadata, _, written) = self.apply_record(policy, &made, observed, now).await?;
            out.wrote_metadata |= metadata;
            out.written = written.map(Box::new).or(out.written.take());
        }
        Ok(())
    }

    /// Removes a person's approvals from a recovered node. A merge patch: the annotation is a
    /// person's (kubectl's field manager), not in gpunode's server-side apply. No
    /// precondition: at worst an approval given in the same instant to a compliant node is
    /// dropped, and the next drift asks again.
    async fn forget_approval(&self, node: &str) -> Result<(), ApplyError> {
        self.may_write(node)?;
        let patch = json!({"metadata": {"annotations": {gpunode_crds::policy::APPROVE_ANNOTATION: null}}});
        self.nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error(Step::LabelsAndCondition, node))?;
        info!(node = %node, "the node recovered: its approvals removed");
        Ok(())
    }

    /// One eviction pass of a running drain; once it finds nothing left to evict, that is
    /// recorded, so the drain is reported done and later reconciles stop listing the node's
    /// pods.
    async fn drain_step(
        &self,
        policy: &str,
        plan: &NodePlan,
        observed: &Node,
        drain: &DrainPolicy,
        now: Timestamp,
        out: &mut NodeOutcome,
    ) -> Result<(), ApplyError> {
        let (evicted, remaining, refused) = self.drain(&plan.node, drain).await?;
        out.evicted = evicted;
        out.remaining = remaining;
        out.refused = refused;
        if evicted == 0 && remaining == 0 {
            gpunode_crashpoints::crash_point!("drain::before_done_record");
            let mut done = plan.clone();
            done.markers.drained = Some(now);
            let (metadata, _, written) = self.apply_record(policy, &done, observed, now).await?;
            out.wrote_metadata |= metadata;
            out.written = written.map(Box::new).or(out.written.take());
        }
        Ok(())
    }

    /// Taints and cordon in one write with a resourceVersion precondition.
    async fn apply_spec(
        &self,
        plan: &NodePlan,
        observed: &Node,
        now: Timestamp,
    ) -> Result<Option<Node>, ApplyError> {
        self.write_spec(
            &plan.node,
            &plan.taints,
            plan.cordon,
            plan.markers.cordoned_by_us,
            observed,
            now,
        )
        .await
    }

    /// Sets gpunode's taints to `desired` and applies `cordon`, keeping everything else.
    /// `ours` says whether gpunode's cordon, if any, is still the one in place. Returns the node
    /// as written, or `None` when it already was as desired.
    async fn write_spec(
        &self,
        name: &str,
        desired: &BTreeSet<DriftTaint>,
        cordon: Option<bool>,
        ours: bool,
        observed: &Node,
        now: Timestamp,
    ) -> Result<Option<Node>, ApplyError> {
        // Only a node re-read after a conflict is owned; the first attempt borrows.
        let mut fresh: Option<Node> = None;
        for _ in 0..MAX_CONFLICT_RETRIES {
            let node = fresh.as_ref().unwrap_or(observed);
            let Some(change) = spec_change(desired, cordon, ours, node, now) else {
                return Ok(None);
            };
            let new_unschedulable = change.unschedulable;
            let mut patch = json!({
                "metadata": {"resourceVersion": node.metadata.resource_version},
                "spec": {"taints": change.taints, "unschedulable": change.unschedulable},
            });
            if let Some(marker) = change.marker {
                patch["metadata"]["annotations"] =
                    json!({CORDONED_ANNOTATION: if marker { json!("true") } else { json!(null) }});
            }
            self.may_write(name)?;
            match self
                .nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => {
                    info!(taints = ?desired, unschedulable = new_unschedulable, "taints/cordon written");
                    return Ok(Some(written));
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    debug!("node changed under us; re-reading");
                    fresh = Some(
                        self.nodes
                            .get(name)
                            .await
                            .map_err(api_error(Step::ReadNode, name))?,
                    );
                }
                Err(source) => return Err(api_error(Step::Taints, name)(source)),
            }
        }
        Err(ApplyError::Conflict(name.to_string()))
    }

    /// Labels, bookkeeping annotations and the `GpuPolicyCompliant` condition in one
    /// server-side apply to the node's status subresource; returns (metadata, condition)
    /// written. The node status strategy resets only `spec` (metadata written through
    /// `nodes/status` is kept; NodeRestriction polices labels there for this reason), so one
    /// request per node does what took two: convergence at scale is bounded by requests.
    /// The node as written comes back with them.
    async fn apply_record(
        &self,
        policy: &str,
        plan: &NodePlan,
        observed: &Node,
        now: Timestamp,
    ) -> Result<(bool, bool, Option<Node>), ApplyError> {
        let same_metadata = metadata_unchanged(policy, plan, observed);
        let same_condition = condition_unchanged(plan, observed);
        if same_metadata && same_condition {
            return Ok((false, false, None));
        }
        let c = &plan.condition;
        let since = our_condition(observed)
            .filter(|e| e.status == c.status)
            .and_then(|e| e.last_transition_time.clone())
            .map_or(now, |t| t.0);
        let patch = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": plan.node,
                "labels": desired_labels(policy, plan),
                "annotations": desired_annotations(plan),
            },
            "status": {"conditions": [{
                "type": CONDITION_TYPE,
                "status": c.status,
                "reason": c.reason.as_str(),
                "message": c.message,
                "lastTransitionTime": since.to_string(),
                "lastHeartbeatTime": now.to_string(),
            }]},
        });
        self.may_write(&plan.node)?;
        let written = self
            .nodes
            .patch_status(
                &plan.node,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(api_error(Step::LabelsAndCondition, &plan.node))?;
        self.release_legacy_metadata(&plan.node, &written).await?;
        debug!("labels, annotations and condition applied");
        Ok((!same_metadata, !same_condition, Some(written)))
    }

    /// Releases labels and annotations that an older gpunode applied to the main resource
    /// (before they moved to the status subresource), so a label gpunode stops applying is
    /// removed instead of being kept by that older owner. Once per node; `written` is the
    /// node as the last apply returned it (with its managed fields).
    async fn release_legacy_metadata(&self, name: &str, written: &Node) -> Result<(), ApplyError> {
        if !has_legacy_metadata_owner(written) {
            return Ok(());
        }
        let bare = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        self.may_write(name)?;
        self.nodes
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&bare),
            )
            .await
            .map_err(api_error(Step::LabelsAndCondition, name))?;
        info!(
            node = name,
            "released the labels an older gpunode applied to the main resource"
        );
        Ok(())
    }

    /// Undoes everything gpunode did to a node its policy no longer governs (the policy was
    /// deleted, or the node left its selector): its labels, annotations and condition, its
    /// taints, and its cordon if gpunode's. Returns whether anything was written.
    #[tracing::instrument(skip_all, fields(node = %observed.metadata.name.as_deref().unwrap_or_default()))]
    pub async fn release(&self, observed: &Node, now: Timestamp) -> Result<bool, ApplyError> {
        let name = observed.metadata.name.clone().unwrap_or_default();
        let meta = &observed.metadata;
        let has_condition = observed
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == CONDITION_TYPE));
        let has_metadata = ours(meta.labels.as_ref(), is_ours_label).next().is_some()
            || ours(meta.annotations.as_ref(), is_ours_annotation)
                .next()
                .is_some();
        let mut wrote = false;
        if let Some(d) = &self.devices {
            self.may_write(&name)?;
            wrote |= d
                .release(&name)
                .await
                .map_err(api_error(Step::DeviceTaints, &name))?
                > 0;
        }
        // The objects of its repair go first: its bookkeeping is what names them.
        let (recorded, _) =
            markers::Markers::from_annotations(meta.annotations.as_ref().unwrap_or(&BTreeMap::new()));
        for object in &recorded.repair.objects {
            self.may_write(&name)?;
            let deletion =
                self.remediators
                    .delete(object, &name)
                    .await
                    .map_err(|source| ApplyError::Repair {
                        node: name.clone(),
                        source,
                    })?;
            self.count(&deletion);
            wrote = true;
        }
        gpunode_crashpoints::crash_point!("release::after_repair_objects");
        wrote |= self
            .write_spec(&name, &BTreeSet::new(), Some(false), false, observed, now)
            .await?
            .is_some();
        gpunode_crashpoints::crash_point!("release::after_spec");
        if has_metadata {
            self.release_metadata(&name).await?;
            wrote = true;
        }
        if has_condition {
            // Other writers of the conditions list (the kubelet, kwok) co-own our entry, so
            // releasing it through apply is not enough: delete it by its merge key.
            let delete = json!({"status": {"conditions": [{"type": CONDITION_TYPE, "$patch": "delete"}]}});
            self.may_write(&name)?;
            self.nodes
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&delete))
                .await
                .map_err(api_error(Step::Condition, &name))?;
            wrote = true;
        }
        if wrote {
            info!("released: gpunode's labels, taints, cordon and condition removed");
        }
        Ok(wrote)
    }

    /// Removes gpunode's labels and annotations from a node it releases. Applying nothing under
    /// gpunode's field manager removes every one it owns (through the status subresource, where
    /// gpunode applies them; then from an older gpunode's apply to the main resource, if any).
    /// Keys under gpunode's prefix that another manager holds (a late write that lost its owner,
    /// a copy by hand) are then deleted by name: the node would otherwise keep them and be
    /// released again on every sweep.
    async fn release_metadata(&self, name: &str) -> Result<(), ApplyError> {
        let bare = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        self.may_write(name)?;
        let written = self
            .nodes
            .patch_status(name, &pp, &Patch::Apply(&bare))
            .await
            .map_err(api_error(Step::LabelsAndCondition, name))?;
        self.release_legacy_metadata(name, &written).await?;
        let meta = &written.metadata;
        let labels: serde_json::Map<String, serde_json::Value> = ours(meta.labels.as_ref(), is_ours_label)
            .map(|(k, _)| (k.clone(), serde_json::Value::Null))
            .collect();
        let annotations: serde_json::Map<String, serde_json::Value> =
            ours(meta.annotations.as_ref(), is_ours_annotation)
                .map(|(k, _)| (k.clone(), serde_json::Value::Null))
                .collect();
        if labels.is_empty() && annotations.is_empty() {
            return Ok(());
        }
        let delete = json!({"metadata": {"labels": labels, "annotations": annotations}});
        self.may_write(name)?;
        self.nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&delete))
            .await
            .map_err(api_error(Step::LabelsAndCondition, name))?;
        info!(
            node = name,
            keys = labels.len() + annotations.len(),
            "released gpunode's labels and annotations that another field manager held"
        );
        Ok(())
    }

    /// The pods bound to `node`.
    async fn pods_on(&self, node: &str) -> Result<Vec<Pod>, ApplyError> {
        Api::<Pod>::all(self.client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map(|l| l.items)
            .map_err(api_error(Step::ListPods, node))
    }

    /// Asks the Eviction API to evict `pod` of `node` with the drain's grace period; with
    /// `exactly`, only this incarnation of it (its uid as a precondition).
    async fn evict(
        &self,
        node: &str,
        pod: &Pod,
        grace: Option<i64>,
        exactly: bool,
    ) -> Result<Eviction, ApplyError> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let mut body = eviction(&ns, &name, grace);
        if exactly {
            body["deleteOptions"]["preconditions"] = json!({"uid": pod.metadata.uid});
        }
        self.may_write(node)?;
        let result = Api::<Pod>::namespaced(self.client.clone(), &ns)
            .create_subresource::<_, serde_json::Value>("eviction", &name, &PostParams::default(), &body)
            .await;
        let pod = format!("{ns}/{name}");
        Ok(match result {
            Ok(_) => {
                info!(pod = %pod, "evicted");
                Eviction::Done
            }
            Err(kube::Error::Api(s)) if s.code == 429 => {
                debug!(pod = %pod, "eviction refused by a PodDisruptionBudget");
                Eviction::Refused
            }
            // Gone, or (with the uid precondition) replaced: nothing to evict.
            Err(kube::Error::Api(s)) if s.code == 404 || (exactly && s.code == 409) => Eviction::Gone,
            Err(e) => {
                warn!(pod = %pod, error = %e, "eviction failed");
                Eviction::Failed
            }
        })
    }

    /// One pass of evictions of the pods holding the node's quarantined GPUs; returns (evicted,
    /// refused by a PodDisruptionBudget). The pods left are evicted by later passes while the
    /// report still lists them.
    async fn evict_gpu_holders(
        &self,
        plan: &NodePlan,
        policy: &DrainPolicy,
    ) -> Result<(u32, u32), ApplyError> {
        let node = plan.node.as_str();
        let pods = self.pods_on(node).await?;
        let holders = gpu_holders_to_evict(&pods, &plan.quarantines, policy).map_err(|source| {
            ApplyError::InvalidSelector {
                node: node.to_string(),
                source,
            }
        })?;
        let (mut evicted, mut refused) = (0, 0);
        for pod in holders {
            // Exactly the pod the probe saw: not one recreated under its name meanwhile.
            match self.evict(node, pod, policy.grace_period_seconds, true).await? {
                Eviction::Done => evicted += 1,
                Eviction::Refused => refused += 1,
                Eviction::Gone | Eviction::Failed => {}
            }
        }
        Ok((evicted, refused))
    }

    /// One pass of evictions; returns (evicted, remaining, refused).
    async fn drain(&self, node: &str, policy: &DrainPolicy) -> Result<(u32, u32, u32), ApplyError> {
        let pods = self.pods_on(node).await?;
        let pods = to_evict(&pods, policy).map_err(|source| ApplyError::InvalidSelector {
            node: node.to_string(),
            source,
        })?;
        let (mut evicted, mut remaining, mut refused) = (0, 0, 0);
        for pod in pods {
            match self.evict(node, pod, policy.grace_period_seconds, false).await? {
                Eviction::Done => {
                    evicted += 1;
                    gpunode_crashpoints::crash_point!("drain::after_first_eviction");
                }
                Eviction::Refused => {
                    refused += 1;
                    remaining += 1;
                }
                Eviction::Gone => {}
                Eviction::Failed => remaining += 1,
            }
        }
        Ok((evicted, remaining, refused))
    }
}

/// How one eviction request went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Eviction {
    /// The pod is being evicted.
    Done,
    /// A PodDisruptionBudget refused it for now.
    Refused,
    /// The pod is gone (or was replaced).
    Gone,
    /// Another error, logged; the next pass tries again.
    Failed,
}

/// The body of a pod's Eviction, with the policy's grace period as its `deleteOptions`. Written
/// here rather than through kube's `EvictParams`, which (kube 5.0) sends the delete options as
/// `delete_options`, a field the API server drops: the grace period never arrived.
fn eviction(namespace: &str, pod: &str, grace_period_seconds: Option<i64>) -> serde_json::Value {
    let mut body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
    });
    if let Some(g) = grace_period_seconds {
        body["deleteOptions"] = json!({"gracePeriodSeconds": g});
    }
    body
}

/// Whether a drain evicts this pod: not already terminating or finished, not a DaemonSet or
/// mirror pod, not in a protected namespace, selected by the policy's pod selector, and without
/// emptyDir data unless the policy allows losing it.
pub fn evictable(pod: &Pod, policy: &DrainPolicy, selection: &PodSelection) -> bool {
    let meta = &pod.metadata;
    if meta.deletion_timestamp.is_some() {
        return false;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return false;
    }
    // A validation's own pod: the drain makes room for it, not the other way round.
    if meta
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(crate::plan::validation::NODE_LABEL))
    {
        return false;
    }
    if meta.owner_references.as_ref().is_some_and(|os| {
        os.iter()
            .any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
    }) {
        return false;
    }
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
    {
        return false;
    }
    if meta
        .namespace
        .as_ref()
        .is_some_and(|ns| policy.protected_namespaces.iter().any(|p| p == ns))
    {
        return false;
    }
    if !selection.admits(meta.labels.as_ref().unwrap_or(&BTreeMap::new())) {
        return false;
    }
    let has_empty_dir = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.empty_dir.is_some()));
    !has_empty_dir || policy.delete_empty_dir_data
}

#[cfg(test)]
mod tests;
