//! What the planner reads: one [`NodeView`] per node the policy selects, with the node's GPUs
//! ([`GpuView`]), how they reach pods ([`NodeDevices`]), and the state of the objects a repair
//! step or a validation made ([`StepObject`], [`JobState`]); and the policy-level inputs of a
//! pass that are not nodes ([`PassInputs`]): where the circuit breaker stood ([`BreakerState`],
//! from the policy status, and a person's close) and the fleet-wide disruption cap ([`Fleet`]).
//!
//! The bottom layer of the planner: plain data, no decision. It imports nothing of the planner.
//! Building a view from a Node, a report, a Job or a ResourceSlice is observe's work
//! (`crate::observe`, `NodeView::observe` there); here a view is only made by hand (the tests,
//! benchmarks and `check` without a node).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use gpunode_crds::GpuRecoveryAction;
use jiff::Timestamp;

use crate::{
    markers::{DriftTaint, Markers, gpu_key},
    reasons::Reason,
    verdict::{NodeState, Verdict},
};

/// What the planner needs to know about one node selected by the policy.
#[derive(Clone, Debug)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// Labelled `gpunode.dev/skip=true`.
    pub skip: bool,
    /// `spec.unschedulable` as observed.
    pub unschedulable: bool,
    /// gpunode's taints currently on the node.
    pub taints: BTreeSet<DriftTaint>,
    /// gpunode's bookkeeping as read from the node.
    pub markers: Markers,
    /// The state label as observed, if any.
    pub current_state: Option<NodeState>,
    /// The reason of the node's `GpuPolicyCompliant` condition as observed, if gpunode wrote it.
    pub current_reason: Option<Reason>,
    /// What the policy says about the node now.
    pub verdict: Verdict,
    /// Other policies that also select this node.
    pub conflicts: Vec<String>,
    /// When the node's probe was last heard from (its report's `observedAt` or a later
    /// heartbeat): the report goes stale `staleAfter` later.
    pub last_heard: Option<Timestamp>,
    /// The GPUs the node's report lists.
    pub gpus: Arc<[GpuView]>,
    /// How the node's GPUs reach pods (DRA devices or the device plugin).
    pub devices: NodeDevices,
    /// The running repair step's object, as looked at before planning.
    pub repair_object: Option<StepObject>,
    /// The running validation's Job, as looked at (only while one runs).
    pub validation_job: Option<JobState>,
    /// The rungs a person approved on the node (annotation `gpunode.dev/approve`): rule actions
    /// (`Taint`, `Cordon`, `Drain`) and repair step names.
    pub approved: BTreeSet<String>,
}

impl NodeView {
    /// The same view, with the GPUs the report lists and how they reach pods.
    pub fn with_gpus(mut self, gpus: impl Into<Arc<[GpuView]>>, devices: NodeDevices) -> NodeView {
        self.gpus = gpus.into();
        self.devices = devices;
        self
    }

    /// A view of a node with nothing on it from gpunode, no GPUs listed and no conflict: the
    /// starting point of the planner's tests, benchmarks and `check` without a node.
    pub fn new(name: &str, verdict: Verdict) -> NodeView {
        NodeView {
            name: name.to_string(),
            skip: false,
            unschedulable: false,
            taints: BTreeSet::new(),
            markers: Markers::default(),
            current_state: None,
            current_reason: None,
            verdict,
            conflicts: Vec::new(),
            last_heard: None,
            gpus: Arc::default(),
            devices: NodeDevices::Unknown,
            repair_object: None,
            validation_job: None,
            approved: BTreeSet::new(),
        }
    }

    /// The same view, with through when its verdict holds.
    pub fn heard_at(mut self, last_heard: Option<Timestamp>) -> NodeView {
        self.last_heard = last_heard;
        self
    }

    /// The same view, with its repair step's object as looked at.
    pub fn with_repair(mut self, object: Option<StepObject>) -> NodeView {
        self.repair_object = object;
        self
    }

    /// The same view, with its validation Job as looked at.
    pub fn with_validation(mut self, job: Option<JobState>) -> NodeView {
        self.validation_job = job;
        self
    }
}

/// The rungs an approval annotation lists (comma-separated, blanks ignored).
pub fn approvals(value: &str) -> BTreeSet<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_string)
        .collect()
}

/// One GPU of the node, as its report lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuView {
    /// NVML's index.
    pub index: u32,
    /// NVML's UUID (`GPU-…`), if the probe read it.
    pub uuid: Option<String>,
    /// What NVML says the GPU needs before it can be used again, if the probe read it.
    pub recovery_action: Option<GpuRecoveryAction>,
}

impl GpuView {
    /// The GPU's key in the bookkeeping.
    pub fn key(&self) -> String {
        gpu_key(self.index, self.uuid.as_deref())
    }
}

/// A device a DRA driver publishes in a ResourceSlice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceRef {
    /// The driver (`gpu.nvidia.com`).
    pub driver: String,
    /// The pool (the NVIDIA driver names it after the node).
    pub pool: String,
    /// The device's name in its pool (`gpu-5`).
    pub device: String,
}

impl std::fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// A pod, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The pods a node's report says hold each of its GPUs (the kubelet's PodResources API, read by
/// the probe).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuPods {
    /// When the probe observed them: a pod created later is not the one it saw, even with the
    /// same name (a StatefulSet's pod recreated after its eviction).
    pub observed_at: Option<Timestamp>,
    /// The pods, by GPU UUID; a GPU the report gives no list for is not here (not known).
    pub by_gpu: BTreeMap<String, Vec<PodRef>>,
}

impl GpuPods {
    /// Pods by GPU UUID, observed at an unknown time.
    pub fn new(by_gpu: BTreeMap<String, Vec<PodRef>>) -> Self {
        GpuPods {
            observed_at: None,
            by_gpu,
        }
    }
}

/// How the node's GPUs are handed to pods, and so how one of them is quarantined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodeDevices {
    /// The node has ResourceSlices of the policy's DRA driver: its devices by GPU UUID.
    Dra(BTreeMap<String, DeviceRef>),
    /// No ResourceSlice of the driver names the node: GPUs go through the device plugin. The
    /// pods the probe saw holding each GPU; `None` when its report does not say (then a
    /// NoExecute quarantine cannot be done on its own).
    DevicePlugin(Option<GpuPods>),
    /// Not known (the planner's tests, `check` without a cluster): a device-plugin node whose
    /// pods are not known.
    #[default]
    Unknown,
}

/// What the running repair step's object looks like, as observed before planning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepObject {
    /// It does not exist.
    Absent,
    /// It exists and has not finished.
    Running,
    /// Its completion condition is True, since then (its lastTransitionTime, if it has one).
    Succeeded(Option<Timestamp>),
    /// Its completion condition is False: the message says why.
    Failed(String),
    /// It cannot be made or read for good: its template is missing, or its kind is not served.
    Unavailable(String),
}

/// A validation Job, as observed before planning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    /// It does not exist (or it is a leftover of an earlier run).
    Absent,
    /// It exists and has not finished.
    Running,
    /// It completed.
    Passed,
    /// It failed: the reason and message of its Failed condition.
    Failed(String),
    /// It ran past its deadline (Failed, reason DeadlineExceeded).
    TimedOut(String),
}

/// The policy-level inputs of a pass besides the policy and its nodes.
#[derive(Clone, Debug, Default)]
pub struct PassInputs {
    /// The circuit breaker as the policy status last recorded it.
    pub breaker: BreakerState,
    /// The annotation `gpunode.dev/close-breaker`, read as a time: a person closes the trip
    /// that opened then (`None` when absent or not a time).
    pub close_breaker: Option<Timestamp>,
    /// The operator's fleet-wide disruption cap; `None`: no cap.
    pub fleet: Option<Fleet>,
    /// What the chart grants validation Jobs: a template outside them is unusable (no Job, the
    /// policy Degraded naming the field). `None`: unbounded (offline views).
    pub validation_bounds: Option<crate::bounds::ValidationBounds>,
}

/// Where the circuit breaker stands: read from `status.circuitBreaker` before a pass, planned
/// by the pass, written back by the status step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BreakerState {
    /// It is open.
    pub open: bool,
    /// When the open (or last) trip began.
    pub opened_at: Option<Timestamp>,
    /// Nodes that had begun drifting within the window when it opened.
    pub drifted: u32,
    /// Nodes the policy selected when it opened.
    pub of: u32,
    /// When it last closed: drifts that began before do not open it again.
    pub closed_at: Option<Timestamp>,
    /// Who closed it last.
    pub closed_by: Option<gpunode_crds::policy::BreakerClosedBy>,
}

impl BreakerState {
    /// It never opened: nothing to record.
    pub fn is_pristine(&self) -> bool {
        *self == BreakerState::default()
    }
}

/// The fleet-wide disruption cap as one pass sees it: every node selected by any policy that is
/// unavailable now (NotReady, cordoned, or tainted NoSchedule or NoExecute, by anyone), with
/// the nodes other policies' passes reserved and have not written yet.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    /// Most GPU nodes that may be unavailable at once.
    pub allowed: u32,
    /// The GPU nodes unavailable now, or reserved by another pass.
    pub unavailable: Arc<BTreeSet<String>>,
}
