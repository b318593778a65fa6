//! The planner: from a policy, the verdicts of its nodes and what gpunode already did to them,
//! decide what each node should look like now. Pure: time is a parameter, nothing is written.
//!
//! Rules (DESIGN §3):
//! - **Hysteresis.** A class is *active* while it drifts and until it has stayed clear for
//!   `recovery.healthyFor`; a drift that returns within that time keeps its original start. A rule
//!   fires once one of its classes has been active for the rule's `after`; what it did is undone
//!   only when none of its classes is active any more. Flapping input therefore gives one action
//!   and one undo, never a flapping taint.
//! - **Budget.** NoSchedule/NoExecute taints, cordons and drains are disruptive. A node that is
//!   not yet disrupted by gpunode is admitted only while fewer than `maxUnavailable` of the
//!   policy's nodes are; the rest queue, oldest drift first. Undoing is never limited.
//! - **Circuit breaker.** When more than `maxDriftedPercent` of the nodes (and more than one
//!   node) began drifting within `window`, no disruption is added anywhere.
//! - **Conflict, skip, dry run, pause.** A node selected by another policy gets no new disruption,
//!   and only the first of the overlapping policies by name writes it (`NodePlan::defer_to`);
//!   `gpunode.dev/skip=true` and a paused policy leave the node untouched; dry run writes only
//!   the labels, the condition and the bookkeeping, and lists every action as pending.
//! - **Time.** Each node plan says when it next changes with time alone and why
//!   (`NodePlan::next_change`: an `after`, a `healthyFor`, a drain timeout, a report going
//!   stale); [`requeue_after`] turns that into when the policy is looked at again.
//! - **People win.** gpunode never uncordons a node it did not cordon; a person who uncordons a
//!   node gpunode cordoned or is draining cancels that, and gpunode does not cordon it again until
//!   the node has recovered.

pub mod gpus;
pub mod repair;
pub mod validation;
pub mod windows;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use gpunode_crds::{
    DriftClass, GpuNodePolicySpec,
    policy::{APPROVE_ANNOTATION, RemediationAction, TaintEffect},
};
use jiff::{SignedDuration, Timestamp};

use k8s_openapi::api::core::v1::Node;

use crate::{
    markers::{self, ClassTrack, DriftTaint, GpuTrack, Markers},
    reasons::Reason,
    verdict::{NodeState, Verdict},
};

pub use gpus::{
    DeviceRef, Escalation, GpuPods, GpuTaint, GpuView, NodeDevices, PodRef, Quarantine, QuarantineTarget,
    quarantine_of,
};
pub use repair::{EnsureObject, MadeFrom, RepairPlan, RepairState, StepObject};
pub use validation::{JobState, ValidationPlan, ValidationState};

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
    /// What gpunode has in effect on `node`: skip label, cordon, its taints, its bookkeeping,
    /// its state label and condition reason. Unreadable bookkeeping is returned to be logged.
    pub fn observe(
        node: &Node,
        verdict: Verdict,
        conflicts: Vec<String>,
    ) -> (NodeView, Vec<markers::MarkerError>) {
        let empty = BTreeMap::new();
        let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
        let (markers, errors) =
            Markers::from_annotations(node.metadata.annotations.as_ref().unwrap_or(&empty));
        let spec = node.spec.as_ref();
        let reason = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == markers::CONDITION_TYPE))
            .and_then(|c| c.reason.as_deref())
            .and_then(Reason::parse);
        let view = NodeView {
            name: node.metadata.name.clone().unwrap_or_default(),
            skip: labels.get(markers::SKIP_LABEL).is_some_and(|v| v == "true"),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            taints: markers::drift_taints(node),
            markers,
            current_state: labels.get(markers::STATE_LABEL).and_then(|v| match v.as_str() {
                "compliant" => Some(NodeState::Compliant),
                "drifted" => Some(NodeState::Drifted),
                "unknown" => Some(NodeState::Unknown),
                _ => None,
            }),
            current_reason: reason,
            verdict,
            conflicts,
            last_heard: None,
            gpus: Arc::default(),
            devices: NodeDevices::Unknown,
            repair_object: None,
            validation_job: None,
            approved: node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(APPROVE_ANNOTATION))
                .map(|v| approvals(v))
                .unwrap_or_default(),
        };
        (view, errors)
    }

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

/// An action of the ladder as it applies to one node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Add a gpunode taint.
    Taint(DriftTaint),
    /// Mark the node unschedulable.
    Cordon,
    /// Evict the node's pods.
    Drain,
    /// Quarantine one GPU.
    TaintDevice(GpuTaint),
}

impl Action {
    /// Takes capacity away (counts against `maxUnavailable`).
    pub fn is_disruptive(&self) -> bool {
        match self {
            Action::Taint(t) => t.effect.is_disruptive(),
            Action::TaintDevice(t) => t.effect.is_disruptive(),
            Action::Cordon | Action::Drain => true,
        }
    }

    /// A node-wide action (a taint, the cordon, the drain), which a validation gates the undo of.
    pub fn is_node_level(&self) -> bool {
        !matches!(self, Action::TaintDevice(_))
    }

    /// For status and events: `Taint NoSchedule (thermal)`, `Cordon`, `Drain`,
    /// `TaintDevice NoExecute (gpu 5, GPU-…)`.
    pub fn describe(&self) -> String {
        match self {
            Action::Taint(t) => format!("Taint {} ({})", t.effect.as_str(), t.value),
            Action::Cordon => "Cordon".to_string(),
            Action::Drain => "Drain".to_string(),
            Action::TaintDevice(t) => format!("TaintDevice {} ({})", t.effect.as_str(), t.subject()),
        }
    }
}

/// Why wanted actions are not taken.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Block {
    /// The policy is in dry run.
    DryRun,
    /// The policy is paused.
    Paused,
    /// The node is labelled `gpunode.dev/skip=true`.
    Skip,
    /// Another policy selects the node too.
    Conflict(Vec<String>),
    /// The circuit breaker is open.
    CircuitOpen,
    /// `maxUnavailable` nodes are already disrupted.
    Budget,
    /// Outside the policy's maintenance windows (`spec.maintenance`).
    OutsideWindow {
        /// When the next window opens.
        opens: Timestamp,
    },
    /// A maintenance window cannot be read: every window stays closed.
    InvalidWindow(String),
    /// A rung requires a person's approval (`requireApproval`).
    Approval {
        /// The rungs awaiting it.
        rungs: Vec<String>,
        /// The command that approves them.
        command: String,
    },
}

impl Block {
    /// A short reason for status and events.
    pub fn describe(&self) -> String {
        match self {
            Block::DryRun => "dry run".to_string(),
            Block::Paused => "policy paused".to_string(),
            Block::Skip => "node labelled gpunode.dev/skip=true".to_string(),
            Block::Conflict(others) => format!("node also selected by {}", others.join(", ")),
            Block::CircuitOpen => "circuit breaker open".to_string(),
            Block::Budget => "disruption budget exhausted".to_string(),
            Block::OutsideWindow { opens } => {
                format!("outside the maintenance windows; the next opens at {opens}")
            }
            Block::InvalidWindow(why) => format!("no maintenance window can open: {why}"),
            Block::Approval { rungs, command } => {
                format!("waiting for approval of {}: {command}", rungs.join(", "))
            }
        }
    }
}

/// The state of a drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainStep {
    /// No drain.
    None,
    /// Evict pods; the drain began at `started` and is stuck once its timeout has passed.
    Run {
        /// When it began.
        started: Timestamp,
        /// It has run longer than `disruption.drain.timeout`.
        stuck: bool,
    },
    /// The drain found nothing left to evict: the node stays cordoned, no more eviction passes
    /// (and no pod listings) run until the node recovers.
    Done {
        /// When it began.
        started: Timestamp,
        /// When it found nothing left to evict.
        finished: Timestamp,
    },
}

/// What a node should look like now.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    /// Node name.
    pub node: String,
    /// False when nothing may be written to the node (skip label, paused policy, or another
    /// policy writes it: see `defer_to`).
    pub write: bool,
    /// The policy that writes this node instead: with overlapping policies only the first by
    /// name writes a node, so the two do not flip its labels back and forth.
    pub defer_to: Option<String>,
    /// The verdict's state.
    pub state: NodeState,
    /// Classes for the `gpunode.dev/drift.<class>` labels: those drifting now.
    pub drifting: BTreeSet<DriftClass>,
    /// Bookkeeping to store.
    pub markers: Markers,
    /// gpunode's taints the node should carry (the complete set).
    pub taints: BTreeSet<DriftTaint>,
    /// `Some(true)`: cordon; `Some(false)`: uncordon (only ever what gpunode cordoned); `None`:
    /// leave `spec.unschedulable` alone.
    pub cordon: Option<bool>,
    /// Whether pods should be evicted.
    pub drain: DrainStep,
    /// Actions in effect after this plan (for status).
    pub actions: Vec<Action>,
    /// Actions wanted but not taken, and why.
    pub pending: Vec<Action>,
    /// Why the pending actions wait.
    pub blocked: Option<Block>,
    /// The node condition: status, reason and message.
    pub condition: NodeCondition,
    /// Transitions worth an Event.
    pub events: Vec<PlannedEvent>,
    /// When the oldest active drift began.
    pub since: Option<Timestamp>,
    /// What gpunode had in effect on the node before this plan (what stays in effect when the
    /// plan is not written).
    pub before: InEffect,
    /// When this node's plan next changes with time alone, and why (`None`: only a change of
    /// the node, its report or the policy changes it).
    pub next_change: Option<NextChange>,
    /// The GPU quarantines in effect after this plan, each with where it goes.
    pub quarantines: Vec<Quarantine>,
    /// The node recovered with nothing of gpunode's in effect: a person's approvals on it
    /// (`gpunode.dev/approve`) were for this incident and are removed, so the next drift asks
    /// again.
    pub forget_approval: bool,
    /// Why the node's own rules act on its GPU faults, if they do.
    pub escalation: Option<Escalation>,
    /// For the `gpunode.dev/healthy-gpus` label: GPUs neither drifting nor quarantined.
    pub healthy_gpus: Option<u32>,
    /// The repair of the drained node: its step, objects to make and delete.
    pub repair: RepairPlan,
    /// The validation of the recovered node (`spec.validation`).
    pub validation: ValidationPlan,
}

impl NodePlan {
    /// Whether its GPU quarantines evict pods on their own (not while the node drains: the
    /// drain evicts them all).
    pub fn evicts_gpu_holders(&self) -> bool {
        !matches!(self.drain, DrainStep::Run { .. })
            && self.quarantines.iter().any(|q| !q.evicts().is_empty())
    }

    /// What gpunode has in effect on the node once this plan is written.
    pub fn after(&self) -> InEffect {
        InEffect {
            actions: self.actions.clone(),
            tainted: !self.taints.is_empty(),
            cordoned: self.markers.cordoned_by_us,
            drain: self.drain,
            repair: RepairInEffect::of(&self.markers.repair),
            validating: validating(self.markers.validation.as_ref()),
        }
    }
}

/// Where a node's repair stands, as its bookkeeping records it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairInEffect {
    /// The step running, if any.
    pub running: Option<String>,
    /// The repair stopped and needs a person.
    pub needs_human: bool,
}

impl RepairInEffect {
    /// What `track` records.
    pub fn of(track: &markers::RepairTrack) -> RepairInEffect {
        RepairInEffect {
            running: track
                .step
                .as_ref()
                .filter(|s| s.ended.is_none())
                .map(|s| s.name.clone()),
            needs_human: track.needs_human.is_some(),
        }
    }
}

/// What gpunode has in effect on a node: its taints, cordon and drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InEffect {
    /// The actions in effect, in order.
    pub actions: Vec<Action>,
    /// A gpunode taint is on the node.
    pub tainted: bool,
    /// gpunode's cordon is on the node.
    pub cordoned: bool,
    /// The drain.
    pub drain: DrainStep,
    /// The repair.
    pub repair: RepairInEffect,
    /// A validation Job runs on the node.
    pub validating: bool,
}

/// Whether the bookkeeping records a validation running.
fn validating(track: Option<&markers::ValidationTrack>) -> bool {
    track.is_some_and(|t| t.ended.is_none())
}

/// When a plan changes with time alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextChange {
    /// When.
    pub at: Timestamp,
    /// Why.
    pub cause: ChangeCause,
}

/// What changes a plan when its time comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeCause {
    /// A remediation rule's `after` passes for a class.
    RuleAfter {
        /// The class.
        class: DriftClass,
        /// The rule's action.
        action: RemediationAction,
    },
    /// A class has been clear for `recovery.healthyFor`: what it caused is undone.
    HealthyFor(DriftClass),
    /// The report goes stale (`staleAfter` since the probe was last heard from).
    Stale,
    /// The drain reaches its timeout.
    DrainTimeout,
    /// A `TaintDevice` rule's `after` passes for a class of one GPU.
    GpuRuleAfter {
        /// The GPU's index.
        gpu: u32,
        /// The class.
        class: DriftClass,
    },
    /// A class of one GPU has been clear for `recovery.healthyFor`.
    GpuHealthyFor {
        /// The GPU's index.
        gpu: u32,
        /// The class.
        class: DriftClass,
    },
    /// A repair step (or the wait for a report after it) reaches its timeout.
    RepairTimeout,
    /// A validation Job reaches its timeout.
    ValidationTimeout,
    /// A maintenance window opens, and what waits for it may start.
    WindowOpens,
}

impl std::fmt::Display for NextChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cause {
            ChangeCause::RuleAfter { class, action } => write!(
                f,
                "{}: the {action:?} rule's `after` passes for {}",
                self.at,
                class.as_str()
            ),
            ChangeCause::HealthyFor(class) => write!(
                f,
                "{}: {} has been clear for `recovery.healthyFor`",
                self.at,
                class.as_str()
            ),
            ChangeCause::Stale => write!(f, "{}: the report goes stale (`staleAfter`)", self.at),
            ChangeCause::DrainTimeout => write!(f, "{}: the drain reaches its timeout", self.at),
            ChangeCause::GpuRuleAfter { gpu, class } => write!(
                f,
                "{}: the TaintDevice rule's `after` passes for {} on gpu {gpu}",
                self.at,
                class.as_str()
            ),
            ChangeCause::GpuHealthyFor { gpu, class } => write!(
                f,
                "{}: {} of gpu {gpu} has been clear for `recovery.healthyFor`",
                self.at,
                class.as_str()
            ),
            ChangeCause::RepairTimeout => write!(f, "{}: the repair step reaches its timeout", self.at),
            ChangeCause::ValidationTimeout => {
                write!(f, "{}: the validation Job reaches its timeout", self.at)
            }
            ChangeCause::WindowOpens => write!(f, "{}: a maintenance window opens", self.at),
        }
    }
}

/// The `GpuPolicyCompliant` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCondition {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// Why.
    pub reason: Reason,
    /// One line.
    pub message: String,
}

/// An Event to publish on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    /// A Warning (drift, stuck drain) rather than Normal.
    pub warning: bool,
    /// Why.
    pub reason: Reason,
    /// One line.
    pub note: String,
}

/// The plan for every node of a policy, plus the policy-wide decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyPlan {
    /// One per node, in the order disruption was admitted (oldest drift first).
    pub nodes: Vec<NodePlan>,
    /// Nodes that may be disrupted at once.
    pub budget_allowed: u32,
    /// Nodes disrupted by gpunode now or after this plan (an undo frees its slot once written).
    pub budget_in_use: u32,
    /// Nodes waiting for the budget.
    pub budget_queued: u32,
    /// The circuit breaker is open.
    pub circuit_open: bool,
    /// Nodes that began drifting within the breaker window.
    pub recently_drifted: u32,
    /// Where the maintenance windows stand.
    pub window: windows::WindowState,
    /// Why `spec.validation.template` cannot be used, if it cannot.
    pub invalid_validation: Option<String>,
}

impl PolicyPlan {
    /// The first time any node's plan changes with time alone.
    pub fn next_change(&self) -> Option<NextChange> {
        self.nodes
            .iter()
            .filter_map(|n| n.next_change)
            .min_by_key(|c| c.at)
    }
}

/// Longest a policy waits between two looks when nothing is due.
pub const IDLE_REQUEUE: std::time::Duration = std::time::Duration::from_secs(300);

/// How often a policy with a running drain is looked at: evictions refused by a
/// PodDisruptionBudget are retried.
pub const DRAIN_REQUEUE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long after `now` the policy should be looked at again if nothing else changes: just after
/// its plan's next change, at most [`DRAIN_REQUEUE`] while a drain runs and [`IDLE_REQUEUE`]
/// otherwise.
pub fn requeue_after(plan: &PolicyPlan, now: Timestamp) -> std::time::Duration {
    let wait = plan.next_change().map_or(IDLE_REQUEUE, |c| {
        std::time::Duration::try_from(c.at.duration_since(now)).unwrap_or(IDLE_REQUEUE)
    });
    // Evictions (a drain, or the pods of a quarantined GPU) are retried soon: a refusal by a
    // PodDisruptionBudget lifts without any change gpunode watches. A repair step's object has
    // no watch either: it is looked at as often.
    let draining = plan.nodes.iter().any(|n| {
        matches!(n.drain, DrainStep::Run { .. })
            || n.evicts_gpu_holders()
            || n.repair.polls()
            || n.validation.polls()
    });
    let cap = if draining { DRAIN_REQUEUE } else { IDLE_REQUEUE };
    // Just after: a change due exactly `now` has not happened yet.
    (wait + std::time::Duration::from_millis(100)).min(cap)
}

fn elapsed(now: Timestamp, since: Timestamp) -> SignedDuration {
    now.duration_since(since)
}

fn signed(d: gpunode_crds::Duration) -> SignedDuration {
    SignedDuration::try_from(d.get()).unwrap_or(SignedDuration::MAX)
}

/// Updates the per-class tracks from a verdict: drifting classes start (or resume within
/// `healthy_for`), cleared ones get a clear time, and those clear for `healthy_for` are dropped.
/// While some check is unknown nothing new is considered cleared: unknown is not healthy.
pub fn track_classes(
    old: &BTreeMap<DriftClass, ClassTrack>,
    verdict: &Verdict,
    healthy_for: SignedDuration,
    now: Timestamp,
) -> BTreeMap<DriftClass, ClassTrack> {
    track_set(
        old,
        &verdict.classes(),
        verdict.unknowns.is_empty(),
        healthy_for,
        now,
    )
}

/// [`track_classes`] for a set of drifting classes; `evidence_of_health` is false while some
/// check is unknown (only Stale clears then).
fn track_set(
    old: &BTreeMap<DriftClass, ClassTrack>,
    drifting: &BTreeSet<DriftClass>,
    evidence_of_health: bool,
    healthy_for: SignedDuration,
    now: Timestamp,
) -> BTreeMap<DriftClass, ClassTrack> {
    let mut out = BTreeMap::new();
    for class in drifting {
        let since = match old.get(class) {
            Some(t) if t.cleared_at.is_none_or(|c| elapsed(now, c) < healthy_for) => t.since,
            _ => now,
        };
        out.insert(
            *class,
            ClassTrack {
                since,
                cleared_at: None,
            },
        );
    }
    for (class, track) in old {
        if drifting.contains(class) {
            continue;
        }
        let cleared_at = match track.cleared_at {
            Some(c) => Some(c),
            None if evidence_of_health || *class == DriftClass::Stale => Some(now),
            None => None,
        };
        if cleared_at.is_some_and(|c| elapsed(now, c) >= healthy_for) {
            continue;
        }
        out.insert(
            *class,
            ClassTrack {
                since: track.since,
                cleared_at,
            },
        );
    }
    out
}

/// What the node rules ask for given the tracks (ignoring budget, breaker and the rest). A class
/// handled per GPU (`gpu_handled`) counts for them only on an escalated node.
fn wanted(
    policy: &GpuNodePolicySpec,
    tracks: &BTreeMap<DriftClass, ClassTrack>,
    gpu_handled: &BTreeSet<DriftClass>,
    escalated: bool,
    now: Timestamp,
) -> (BTreeSet<Action>, BTreeMap<Action, String>) {
    let mut taints: BTreeMap<TaintEffect, DriftClass> = BTreeMap::new();
    let mut out = BTreeSet::new();
    // Actions only rules that require approval want, with the rung that approves them; and
    // what rules without approval want (those need none).
    let mut gated: BTreeMap<Action, String> = BTreeMap::new();
    let mut free: BTreeSet<Action> = BTreeSet::new();
    let mut taint_gated: BTreeSet<TaintEffect> = BTreeSet::new();
    let mut taint_free: BTreeSet<TaintEffect> = BTreeSet::new();
    for rule in &policy.remediation {
        let after = signed(rule.after);
        let firing: Vec<DriftClass> = rule
            .classes
            .iter()
            .copied()
            .filter(|c| escalated || !gpu_handled.contains(c))
            .filter(|c| tracks.get(c).is_some_and(|t| elapsed(now, t.since) >= after))
            .collect();
        let Some(first) = firing.iter().min().copied() else {
            continue;
        };
        let mut mark = |action: Action| {
            if rule.require_approval {
                gated
                    .entry(action.clone())
                    .or_insert_with(|| rung(rule.action).to_string());
            } else {
                free.insert(action.clone());
            }
            out.insert(action);
        };
        match (rule.action, rule.effect) {
            (RemediationAction::Label, _) => {}
            (RemediationAction::Taint, Some(effect)) => {
                let e = taints.entry(effect).or_insert(first);
                *e = (*e).min(first);
                if rule.require_approval {
                    taint_gated.insert(effect);
                } else {
                    taint_free.insert(effect);
                }
            }
            // Rejected by the API server; a rule that slipped through does nothing.
            (RemediationAction::Taint, None) => {}
            (RemediationAction::Cordon, _) => mark(Action::Cordon),
            (RemediationAction::Drain, _) => {
                mark(Action::Cordon);
                mark(Action::Drain);
            }
            // Planned per GPU (`gpus::decide`).
            (RemediationAction::TaintDevice, _) => {}
        }
    }
    for (effect, class) in taints {
        let action = Action::Taint(DriftTaint {
            effect,
            value: class.label(),
        });
        if taint_gated.contains(&effect) && !taint_free.contains(&effect) {
            gated.insert(action.clone(), rung(RemediationAction::Taint).to_string());
        }
        out.insert(action);
    }
    gated.retain(|a, _| !free.contains(a));
    (out, gated)
}

/// The name a person approves a rule's action by.
fn rung(action: RemediationAction) -> &'static str {
    match action {
        RemediationAction::Label => "Label",
        RemediationAction::Taint => "Taint",
        RemediationAction::Cordon => "Cordon",
        RemediationAction::Drain => "Drain",
        RemediationAction::TaintDevice => "TaintDevice",
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

/// The command that approves `rungs` on `node`, keeping what is approved already.
pub fn approve_command(node: &str, approved: &BTreeSet<String>, rungs: &[String]) -> String {
    let all: BTreeSet<&str> = approved
        .iter()
        .map(String::as_str)
        .chain(rungs.iter().map(String::as_str))
        .collect();
    format!(
        "kubectl annotate --overwrite node {node} {APPROVE_ANNOTATION}={}",
        all.into_iter().collect::<Vec<_>>().join(",")
    )
}

/// What gpunode has in effect on a node now.
fn current(node: &NodeView) -> BTreeSet<Action> {
    let mut out: BTreeSet<Action> = node.taints.iter().cloned().map(Action::Taint).collect();
    if node.markers.cordoned_by_us && node.unschedulable {
        out.insert(Action::Cordon);
    }
    if node.markers.drain_started.is_some() {
        out.insert(Action::Drain);
    }
    out.extend(node.markers.quarantines().map(|(gpu, index, effect)| {
        Action::TaintDevice(GpuTaint {
            gpu: gpu.to_string(),
            index,
            effect,
        })
    }));
    out
}

fn is_disrupted(actions: &BTreeSet<Action>) -> bool {
    actions.iter().any(Action::is_disruptive)
}

/// Plans every node of policy `name` (whose spec is `policy`).
pub fn plan(name: &str, policy: &GpuNodePolicySpec, nodes: &[NodeView], now: Timestamp) -> PolicyPlan {
    let healthy_for = signed(policy.recovery.healthy_for);
    let matched = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
    let gpu_handled = gpus::handled(policy);
    // A failed validation is a drift of the node (class Validation) until a repair step mends
    // it: only those nodes' views are copied.
    let nodes: Vec<std::borrow::Cow<'_, NodeView>> = nodes
        .iter()
        .map(|n| {
            let failed = policy.validation.as_ref().and_then(|v| {
                validation::failure_drift(
                    n.markers.validation.as_ref(),
                    n.validation_job.as_ref(),
                    &n.markers.repair,
                    v.timeout,
                    now,
                )
            });
            match failed {
                Some(drift) => {
                    let mut n = n.clone();
                    let mut drifts = n.verdict.drifts.clone();
                    drifts.push(drift);
                    n.verdict = Verdict::new(drifts, n.verdict.unknowns.clone());
                    std::borrow::Cow::Owned(n)
                }
                None => std::borrow::Cow::Borrowed(n),
            }
        })
        .collect();

    // Per node: tracks, what the ladder wants, what is in effect.
    struct Work<'a> {
        node: &'a NodeView,
        tracks: BTreeMap<DriftClass, ClassTrack>,
        wanted: BTreeSet<Action>,
        current: BTreeSet<Action>,
        user_uncordoned: Option<Timestamp>,
        since: Option<Timestamp>,
        gpu_tracks: BTreeMap<String, GpuTrack>,
        escalation: Option<Escalation>,
        awaiting: BTreeMap<Action, String>,
        due: bool,
    }
    let mut work: Vec<Work> = nodes
        .iter()
        .map(|node| {
            let node: &NodeView = node;
            let tracks = track_classes(&node.markers.classes, &node.verdict, healthy_for, now);
            let gpu_tracks = gpus::track(&node.markers.gpus, node, &gpu_handled, healthy_for, now);
            let gpu = gpus::decide(policy, &gpu_tracks, &node.devices, now);
            let (mut wanted, gated) = wanted(policy, &tracks, &gpu_handled, gpu.escalation.is_some(), now);
            wanted.extend(gpu.taints.into_values().map(Action::TaintDevice));
            let mut current = current(node);
            // A rung a person has not approved yet is not taken; what is in effect already stays.
            let awaiting: BTreeMap<Action, String> = gated
                .into_iter()
                .filter(|(a, rung)| !current.contains(a) && !node.approved.contains(rung))
                .collect();
            for a in awaiting.keys() {
                wanted.remove(a);
            }
            // A person uncordoned what gpunode cordoned: cancel, and hold off until recovery.
            let mut user_uncordoned = node.markers.user_uncordoned;
            if node.markers.cordoned_by_us && !node.unschedulable {
                user_uncordoned = Some(now);
                current.remove(&Action::Drain);
            }
            if user_uncordoned.is_some() {
                // A drain a person cancelled is over, whatever the ladder wants now: its stale
                // marker takes no capacity and must not count against the budget (it would let
                // another disruptive action onto the node without a slot).
                current.remove(&Action::Drain);
                if wanted.contains(&Action::Cordon) {
                    wanted.remove(&Action::Cordon);
                    wanted.remove(&Action::Drain);
                } else {
                    user_uncordoned = None;
                }
            }
            // A recovered node keeps gpunode's cordon, drain and taints until its validation
            // passed.
            // A PreferNoSchedule taint alone is a hint, not worth a validation.
            let due = policy.validation.is_some()
                && current.iter().any(|a| a.is_node_level() && a.is_disruptive())
                && !wanted.iter().any(Action::is_node_level);
            if due && !validation::passed(node.markers.validation.as_ref(), node.validation_job.as_ref()) {
                wanted.extend(current.iter().filter(|a| a.is_node_level()).cloned());
            }
            let since = tracks
                .values()
                .filter(|t| t.cleared_at.is_none())
                .map(|t| t.since)
                .min();
            Work {
                node,
                tracks,
                wanted,
                current,
                user_uncordoned,
                since,
                gpu_tracks,
                escalation: gpu.escalation,
                awaiting,
                due,
            }
        })
        .collect();

    // Oldest drift first gets the budget; ties by name for determinism.
    work.sort_by(|a, b| {
        (a.since.is_none(), a.since, &a.node.name).cmp(&(b.since.is_none(), b.since, &b.node.name))
    });

    let passive = |node: &NodeView| {
        if node.skip {
            Some(Block::Skip)
        } else if policy.paused {
            Some(Block::Paused)
        } else if policy.dry_run {
            Some(Block::DryRun)
        } else {
            None
        }
    };
    // What stays in effect before anything new is admitted: everything when nothing may be
    // written, otherwise what the ladder still wants.
    let kept: Vec<BTreeSet<Action>> = work
        .iter()
        .map(|w| match passive(w.node) {
            Some(_) => w.current.clone(),
            None => w.current.intersection(&w.wanted).cloned().collect(),
        })
        .collect();

    let budget_allowed = policy.disruption.max_unavailable.resolve(matched);
    // A node counts while it is disrupted now or will be after this plan: an undo frees its
    // slot only once written. The writes of one reconcile run concurrently, so handing the slot
    // to a queued node in the same plan could put both out of service at once; the reconcile
    // that the undo's node update triggers admits the queued node instead.
    // A validation running counts too: its Job holds the node's GPUs.
    let validating = |w: &Work| {
        w.node
            .markers
            .validation
            .as_ref()
            .is_some_and(|t| t.ended.is_none() && (w.due || t.periodic))
    };
    let mut in_use = u32::try_from(
        work.iter()
            .zip(&kept)
            .filter(|(w, k)| is_disrupted(k) || is_disrupted(&w.current) || validating(w))
            .count(),
    )
    .unwrap_or(u32::MAX);
    let mut validation_slots = policy.validation.as_ref().map_or(0, |v| {
        v.max_concurrent
            .saturating_sub(u32::try_from(work.iter().filter(|w| validating(w)).count()).unwrap_or(u32::MAX))
    });
    // Periodic validations started within the last hour, across the policy's nodes.
    let hour_ago = now.checked_sub(SignedDuration::from_hours(1)).unwrap_or(now);
    let mut started_last_hour = u32::try_from(
        work.iter()
            .filter(|w| {
                w.node
                    .markers
                    .validation
                    .as_ref()
                    .is_some_and(|t| t.periodic && t.started > hour_ago)
            })
            .count(),
    )
    .unwrap_or(u32::MAX);
    let template = policy
        .validation
        .as_ref()
        .map(|v| v.pod_template())
        .unwrap_or(Err(String::new()));

    let window = signed(policy.disruption.circuit_breaker.window);
    let recently_drifted = u32::try_from(
        work.iter()
            .filter(|w| w.since.is_some_and(|s| elapsed(now, s) <= window))
            .count(),
    )
    .unwrap_or(u32::MAX);
    let pct = policy.disruption.circuit_breaker.max_drifted_percent;
    // A single drifting node is a node fault, never a systemic one: the threshold is at least 1.
    let threshold = (u64::from(pct) * u64::from(matched) / 100).max(1);
    let circuit_open = pct < 100 && u64::from(recently_drifted) > threshold;

    let window_state = windows::state(policy.maintenance.as_ref(), now);
    let mut queued = 0;
    let mut plans = Vec::with_capacity(work.len());
    for (w, kept) in work.into_iter().zip(kept) {
        let node = w.node;
        // Outside the windows, disruption waits unless the node drifts in an urgent class.
        let active = w
            .tracks
            .iter()
            .chain(w.gpu_tracks.values().flat_map(|g| g.classes.iter()))
            .filter(|(_, t)| t.cleared_at.is_none())
            .map(|(c, _)| c);
        let window_block = match &window_state {
            _ if windows::urgent(policy.maintenance.as_ref(), active) => None,
            windows::WindowState::Open => None,
            windows::WindowState::Closed { opens } => Some(Block::OutsideWindow { opens: *opens }),
            windows::WindowState::Invalid(why) => Some(Block::InvalidWindow(why.clone())),
        };
        // What keeps a repair step from starting: what keeps any disruption from starting,
        // except the budget (a drained node already holds its slot).
        let repair_gate = passive(node)
            .or_else(|| (!node.conflicts.is_empty()).then(|| Block::Conflict(node.conflicts.clone())))
            .or_else(|| circuit_open.then_some(Block::CircuitOpen))
            .or_else(|| window_block.clone());
        let additions: Vec<Action> = w.wanted.difference(&kept).cloned().collect();
        let (effective, pending, blocked) = if let Some(b) = passive(node) {
            (kept, additions, Some(b))
        } else {
            let disruptive_additions = additions.iter().any(Action::is_disruptive);
            let gate = if !disruptive_additions {
                None
            } else if !node.conflicts.is_empty() {
                Some(Block::Conflict(node.conflicts.clone()))
            } else if circuit_open {
                Some(Block::CircuitOpen)
            } else if let Some(b) = window_block.clone() {
                Some(b)
            } else if !is_disrupted(&kept) && !is_disrupted(&w.current) && in_use >= budget_allowed {
                Some(Block::Budget)
            } else {
                None
            };
            match gate {
                None => {
                    if disruptive_additions && !is_disrupted(&kept) && !is_disrupted(&w.current) {
                        in_use += 1;
                    }
                    (w.wanted.clone(), Vec::new(), None)
                }
                Some(gate) => {
                    if gate == Block::Budget {
                        queued += 1;
                    }
                    // Take the harmless additions, hold back the disruptive ones.
                    let (held, harmless): (Vec<Action>, Vec<Action>) =
                        additions.into_iter().partition(Action::is_disruptive);
                    let mut eff = kept;
                    eff.extend(harmless);
                    (eff, held, Some(gate))
                }
            }
        };
        // What awaits a person's approval waits too, and says how to give it.
        let (pending, blocked) = if w.awaiting.is_empty() {
            (pending, blocked)
        } else {
            let mut pending = pending;
            pending.extend(w.awaiting.keys().cloned());
            let rungs: Vec<String> = w
                .awaiting
                .values()
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let command = approve_command(&node.name, &node.approved, &rungs);
            (pending, blocked.or(Some(Block::Approval { rungs, command })))
        };
        // A validation starts only where a disruption could, and takes a slot of the budget if
        // the node holds none.
        let holds_slot = is_disrupted(&effective) || is_disrupted(&w.current);
        let validation_gate = passive(node)
            .or_else(|| (!node.conflicts.is_empty()).then(|| Block::Conflict(node.conflicts.clone())))
            .or_else(|| circuit_open.then_some(Block::CircuitOpen))
            .or_else(|| (!holds_slot && in_use >= budget_allowed).then_some(Block::Budget));
        // Quiet: healthy, nothing of gpunode's on it or wanted, nothing recovering.
        let quiet = node.verdict.state == NodeState::Compliant
            && w.current.is_empty()
            && w.wanted.is_empty()
            && w.tracks.is_empty()
            && w.gpu_tracks.is_empty();
        let periodic = match policy.validation.as_ref() {
            Some(v) if let Some(p) = &v.periodic => {
                quiet
                    && validation_gate.is_none()
                    && window_block.is_none()
                    && validation_slots > 0
                    && started_last_hour < p.max_per_hour
                    && validation::periodic_due(
                        node.markers.validation.as_ref(),
                        &node.markers.repair,
                        signed(p.every),
                        now,
                    )
                    && validation::idle(node.gpus.len(), &node.devices, &v.namespace)
            }
            _ => false,
        };
        let validation = validation::decide(validation::ValidationInput {
            policy: policy.validation.as_ref(),
            policy_name: name,
            template: template.as_ref().map_err(String::as_str),
            node: &node.name,
            track: node.markers.validation.as_ref(),
            job: node.validation_job.as_ref(),
            due: w.due,
            settled: w.tracks.is_empty(),
            quiet,
            periodic,
            repair: &node.markers.repair,
            gate: validation_gate.as_ref(),
            slots: validation_slots,
            now,
        });
        if validation.started {
            validation_slots = validation_slots.saturating_sub(1);
            if !w.due {
                started_last_hour += 1;
            }
            if !holds_slot {
                in_use += 1;
            }
        }
        plans.push(node_plan(
            name,
            policy,
            node,
            Tracks {
                classes: w.tracks,
                gpus: w.gpu_tracks,
                escalation: w.escalation,
            },
            w.user_uncordoned,
            w.since,
            effective,
            pending,
            Gates {
                blocked,
                repair: repair_gate,
            },
            validation,
            now,
        ));
    }

    PolicyPlan {
        nodes: plans,
        budget_allowed,
        budget_in_use: in_use,
        budget_queued: queued,
        circuit_open,
        recently_drifted,
        window: window_state,
        invalid_validation: template.err().filter(|e| !e.is_empty()),
    }
}

/// Why wanted actions wait, and what keeps a repair step from starting.
struct Gates {
    blocked: Option<Block>,
    repair: Option<Block>,
}

/// A node's tracks after this plan: its classes, its GPUs, and its escalation.
struct Tracks {
    classes: BTreeMap<DriftClass, ClassTrack>,
    gpus: BTreeMap<String, GpuTrack>,
    escalation: Option<Escalation>,
}

#[allow(clippy::too_many_arguments)]
fn node_plan(
    name: &str,
    policy: &GpuNodePolicySpec,
    node: &NodeView,
    tracks: Tracks,
    user_uncordoned: Option<Timestamp>,
    since: Option<Timestamp>,
    effective: BTreeSet<Action>,
    pending: Vec<Action>,
    gates: Gates,
    validation: ValidationPlan,
    now: Timestamp,
) -> NodePlan {
    let blocked = gates.blocked;
    let defer_to = node.conflicts.iter().filter(|c| c.as_str() < name).min().cloned();
    let write = defer_to.is_none() && !matches!(blocked, Some(Block::Skip | Block::Paused));
    let disrupted_after = is_disrupted(&effective);
    let taints: BTreeSet<DriftTaint> = effective
        .iter()
        .filter_map(|a| match a {
            Action::Taint(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let want_cordon = effective.contains(&Action::Cordon);
    let want_drain = effective.contains(&Action::Drain);

    // Cordon: only if nobody else did; uncordon only what gpunode cordoned.
    let (cordon, cordoned_by_us) = if want_cordon {
        if node.markers.cordoned_by_us && node.unschedulable {
            (None, true)
        } else if node.unschedulable {
            (None, false) // cordoned by someone else: leave it theirs
        } else {
            (Some(true), true)
        }
    } else if node.markers.cordoned_by_us && node.unschedulable {
        (Some(false), false)
    } else {
        (None, false)
    };

    let drain_started = if want_drain {
        Some(node.markers.drain_started.unwrap_or(now))
    } else {
        None
    };
    let timeout = signed(policy.disruption.drain.timeout);
    // A drain that starts now is not done, whatever an old `drained` marker says.
    let drained_before = node.markers.drain_started.and(node.markers.drained);
    let drain = drain_step(drain_started, drained_before, timeout, now);
    let before = InEffect {
        actions: current(node).into_iter().collect(),
        tainted: !node.taints.is_empty(),
        cordoned: node.markers.cordoned_by_us && node.unschedulable,
        drain: drain_step(node.markers.drain_started, node.markers.drained, timeout, now),
        repair: RepairInEffect::of(&node.markers.repair),
        validating: validating(node.markers.validation.as_ref()),
    };
    let drained = match drain {
        DrainStep::Done { finished, .. } => Some(finished),
        _ => None,
    };

    // Each GPU's track records the quarantine in effect after this plan.
    let gpu_taints: BTreeMap<&str, &GpuTaint> = effective
        .iter()
        .filter_map(|a| match a {
            Action::TaintDevice(t) => Some((t.gpu.as_str(), t)),
            _ => None,
        })
        .collect();
    let mut gpu_tracks = tracks.gpus;
    for (key, track) in &mut gpu_tracks {
        track.quarantined = gpu_taints.get(key.as_str()).map(|t| t.effect);
    }
    gpu_tracks.retain(|_, t| !t.classes.is_empty() || t.quarantined.is_some());
    let driver = policy.quarantine.dra_driver.as_str();
    let quarantines: Vec<Quarantine> = gpu_taints
        .values()
        .filter_map(|t| {
            gpus::target(&t.gpu, t.effect, &node.devices, driver)
                .ok()
                .map(|target| Quarantine {
                    taint: (*t).clone(),
                    target,
                })
        })
        .collect();
    let quarantined: BTreeSet<u32> = gpu_taints.values().map(|t| t.index).collect();
    let healthy_gpus = gpus::healthy(node, &quarantined);
    let escalation = tracks.escalation;
    let escalated = escalation.as_ref().map(|_| node.markers.escalated.unwrap_or(now));

    let state = node.verdict.state;
    let drifting = node.verdict.classes();
    let repair = repair::decide(repair::RepairInput {
        policy: policy.repair.as_ref(),
        node: &node.name,
        track: &node.markers.repair,
        drain: &drain,
        state,
        drifting: &drifting,
        last_heard: node.last_heard,
        object: node.repair_object.as_ref(),
        drifting_gpus: &drifting_gpus(node),
        approved: &node.approved,
        quarantined: &quarantines.iter().filter_map(Quarantine::idle_gpu).collect(),
        gate: gates.repair.as_ref(),
        drain_pending: pending.contains(&Action::Drain),
        now,
    });

    let markers = Markers {
        classes: tracks.classes,
        cordoned_by_us,
        drain_started,
        drained,
        user_uncordoned,
        gpus: gpu_tracks,
        escalated,
        repair: repair.track.clone(),
        validation: validation.track.clone(),
    };

    let mut condition = condition(node, &drain, &blocked, &pending);
    validation_condition(&mut condition, &validation.state);
    repair_condition(&mut condition, &repair.state);
    // A rung waits for a person: the condition says so, and how to approve it.
    let approval = match (&blocked, &repair.state) {
        (Some(Block::Approval { command, .. }), _)
        | (
            _,
            RepairState::Waiting {
                block: Block::Approval { command, .. },
                ..
            },
        ) => Some(command.clone()),
        _ => None,
    };
    if approval.is_some() && matches!(condition.reason, Reason::Drifted | Reason::Drained) {
        condition.reason = Reason::AwaitingApproval;
    }
    if !gpu_taints.is_empty() {
        let list: Vec<String> = gpu_taints
            .values()
            .map(|t| {
                format!(
                    "{} {}{}",
                    t.subject(),
                    t.effect.as_str(),
                    on_device(&quarantines, t)
                )
            })
            .collect();
        condition.message = format!("{}; quarantined: {}", condition.message, list.join(", "));
    }
    if let Some(e) = &escalation {
        condition.message = format!("{}; escalated: {}", condition.message, e.describe());
    }
    let mut events = events(
        node,
        state,
        &taints,
        cordon,
        &drain,
        user_uncordoned,
        &blocked,
        &pending,
    );
    events.extend(gpu_events(node, &gpu_taints, &quarantines, escalation.as_ref()));
    events.extend(validation.events.iter().cloned());
    events.extend(repair.events.iter().cloned());
    if let Some(command) = approval
        && condition.reason == Reason::AwaitingApproval
        && node.current_reason != Some(Reason::AwaitingApproval)
    {
        events.push(PlannedEvent {
            warning: true,
            reason: Reason::AwaitingApproval,
            note: format!("a rung of the policy requires a person's approval; to approve it: {command}"),
        });
    }
    let next_change = next_change(policy, &markers, &drain, node.last_heard, now);
    let next_change = earliest(
        next_change,
        repair.deadline.filter(|d| *d > now),
        ChangeCause::RepairTimeout,
    );
    let next_change = earliest(
        next_change,
        validation.deadline.filter(|d| *d > now),
        ChangeCause::ValidationTimeout,
    );
    // What waits for a window is planned again when it opens.
    let repair_waits = match &repair.state {
        RepairState::Waiting { block, .. } => Some(block),
        _ => None,
    };
    let window_opens = [blocked.as_ref().filter(|_| !pending.is_empty()), repair_waits]
        .into_iter()
        .flatten()
        .find_map(|b| match b {
            Block::OutsideWindow { opens } if *opens > now => Some(*opens),
            _ => None,
        });
    let next_change = earliest(next_change, window_opens, ChangeCause::WindowOpens);
    NodePlan {
        node: node.name.clone(),
        write,
        defer_to,
        state,
        drifting,
        markers,
        taints,
        cordon,
        drain,
        actions: effective.into_iter().collect(),
        pending,
        blocked,
        condition,
        events,
        since,
        before,
        next_change,
        forget_approval: !node.approved.is_empty()
            && state == NodeState::Compliant
            && !disrupted_after
            && drain == DrainStep::None
            && repair.state == RepairState::Idle
            && validation.state == ValidationState::Idle,
        quarantines,
        escalation,
        healthy_gpus,
        repair,
        validation,
    }
}

/// The node's drifting GPUs by class, those with a UUID (a GpuReset step's targets).
fn drifting_gpus(node: &NodeView) -> BTreeMap<DriftClass, BTreeSet<markers::ResetGpu>> {
    let uuids: BTreeMap<u32, &str> = node
        .gpus
        .iter()
        .filter_map(|g| Some((g.index, g.uuid.as_deref()?)))
        .collect();
    let mut out: BTreeMap<DriftClass, BTreeSet<markers::ResetGpu>> = BTreeMap::new();
    for d in &node.verdict.drifts {
        if let Some(index) = d.gpu
            && let Some(uuid) = uuids.get(&index)
        {
            out.entry(d.class).or_default().insert(markers::ResetGpu {
                index,
                uuid: (*uuid).to_string(),
            });
        }
    }
    out
}

/// The node condition while a repair runs, waits or has stopped.
/// `next`, or the change at `at` for `cause` if that comes first.
fn earliest(next: Option<NextChange>, at: Option<Timestamp>, cause: ChangeCause) -> Option<NextChange> {
    match at {
        Some(at) if next.is_none_or(|c| at < c.at) => Some(NextChange { at, cause }),
        _ => next,
    }
}

fn validation_condition(condition: &mut NodeCondition, state: &ValidationState) {
    match state {
        ValidationState::Idle | ValidationState::Passed { .. } => {}
        ValidationState::Running { job, since } => {
            condition.reason = Reason::Validating;
            condition.message = format!(
                "{}; validation Job {job} running since {since}, gpunode's cordon and taints stay until it passes",
                condition.message
            );
        }
        ValidationState::Failed {
            job,
            outcome,
            message,
        } => {
            condition.status = "False";
            condition.reason = Reason::ValidationFailed;
            condition.message = format!(
                "{}; validation Job {job} {}: {message}",
                condition.message,
                outcome.as_str()
            );
        }
        ValidationState::Waiting(wait) => {
            condition.reason = Reason::Validating;
            condition.message = format!(
                "{}; validation waiting ({}), gpunode's cordon and taints stay until it passes",
                condition.message,
                wait.describe()
            );
        }
    }
}

fn repair_condition(condition: &mut NodeCondition, state: &RepairState) {
    match state {
        RepairState::Idle => {}
        RepairState::Running { step, since } => {
            condition.reason = Reason::Repairing;
            condition.message = format!("{}; repair step {step} running since {since}", condition.message);
        }
        RepairState::AwaitingReport { step } => {
            condition.message = format!(
                "{}; repair step {step} finished, waiting for the probe's next report",
                condition.message
            );
        }
        RepairState::Waiting { step, block } => {
            condition.message = format!(
                "{}; repair step {step} waiting ({})",
                condition.message,
                block.describe()
            );
        }
        RepairState::NeedsHuman(why) => {
            condition.reason = Reason::NeedsHuman;
            condition.message = format!("{}; repair stopped, needs a person: {why}", condition.message);
        }
    }
}

/// ` on device <driver>/<pool>/<device>` when the GPU's quarantine is a DRA device taint.
fn on_device(quarantines: &[Quarantine], t: &GpuTaint) -> String {
    match quarantine_of(quarantines, &t.gpu).map(|q| &q.target) {
        Some(QuarantineTarget::Dra(device)) => format!(" on device {device}"),
        _ => String::new(),
    }
}

/// Events for the GPUs: quarantines added and lifted, and an escalation that begins.
fn gpu_events(
    node: &NodeView,
    taints: &BTreeMap<&str, &GpuTaint>,
    quarantines: &[Quarantine],
    escalation: Option<&Escalation>,
) -> Vec<PlannedEvent> {
    let mut out = Vec::new();
    let before: BTreeMap<&str, (u32, TaintEffect)> =
        node.markers.quarantines().map(|(k, i, e)| (k, (i, e))).collect();
    for (key, t) in taints {
        if before.get(key).map(|(_, e)| *e) != Some(t.effect) {
            let mut note = format!(
                "quarantined {}{} with effect {}",
                t.subject(),
                on_device(quarantines, t),
                t.effect.as_str()
            );
            if let Some(q) = quarantine_of(quarantines, &t.gpu).filter(|q| !q.evicts().is_empty()) {
                note.push_str(&format!("; evicting the pods holding it: {}", q.evicted_names()));
            }
            out.push(PlannedEvent {
                warning: true,
                reason: Reason::GpuQuarantined,
                note,
            });
        }
    }
    for (key, (index, _)) in &before {
        if !taints.contains_key(key) {
            let t = GpuTaint {
                gpu: (*key).to_string(),
                index: *index,
                effect: TaintEffect::None,
            };
            out.push(PlannedEvent {
                warning: false,
                reason: Reason::GpuReleased,
                note: format!("quarantine of {} lifted after recovery", t.subject()),
            });
        }
    }
    if let Some(e) = escalation
        && node.markers.escalated.is_none()
    {
        out.push(PlannedEvent {
            warning: true,
            reason: Reason::Escalated,
            note: e.describe(),
        });
    }
    out
}

/// The drain that began at `started` (if any): done once it found nothing left to evict at
/// `drained`, stuck once it has run for `timeout`.
fn drain_step(
    started: Option<Timestamp>,
    drained: Option<Timestamp>,
    timeout: SignedDuration,
    now: Timestamp,
) -> DrainStep {
    match (started, drained) {
        (Some(started), Some(finished)) => DrainStep::Done { started, finished },
        (Some(started), None) => DrainStep::Run {
            started,
            stuck: elapsed(now, started) >= timeout,
        },
        (None, _) => DrainStep::None,
    }
}

/// When a node's plan next changes with time alone: a rule's `after` passing for one of its
/// classes, a cleared class reaching `healthyFor`, the drain reaching its timeout, the report
/// going stale. The earliest after `now`. (A fatal XID leaving `gpu.xidWindow` is not among
/// them: that verdict change waits for the next look, at most [`IDLE_REQUEUE`] away.)
fn next_change(
    policy: &GpuNodePolicySpec,
    markers: &Markers,
    drain: &DrainStep,
    last_heard: Option<Timestamp>,
    now: Timestamp,
) -> Option<NextChange> {
    let at = |from: Timestamp, after: gpunode_crds::Duration, cause| {
        from.checked_add(signed(after))
            .ok()
            .map(|at| NextChange { at, cause })
    };
    let mut changes: Vec<NextChange> = Vec::new();
    for (class, track) in &markers.classes {
        changes.extend(
            policy
                .remediation
                .iter()
                .filter(|r| r.action != RemediationAction::TaintDevice && r.classes.contains(class))
                .filter_map(|r| {
                    at(
                        track.since,
                        r.after,
                        ChangeCause::RuleAfter {
                            class: *class,
                            action: r.action,
                        },
                    )
                }),
        );
        if let Some(cleared) = track.cleared_at {
            changes.extend(at(
                cleared,
                policy.recovery.healthy_for,
                ChangeCause::HealthyFor(*class),
            ));
        }
    }
    for g in markers.gpus.values() {
        for (class, track) in &g.classes {
            changes.extend(
                policy
                    .remediation
                    .iter()
                    .filter(|r| r.action == RemediationAction::TaintDevice && r.classes.contains(class))
                    .filter_map(|r| {
                        at(
                            track.since,
                            r.after,
                            ChangeCause::GpuRuleAfter {
                                gpu: g.index,
                                class: *class,
                            },
                        )
                    }),
            );
            if let Some(cleared) = track.cleared_at {
                changes.extend(at(
                    cleared,
                    policy.recovery.healthy_for,
                    ChangeCause::GpuHealthyFor {
                        gpu: g.index,
                        class: *class,
                    },
                ));
            }
        }
    }
    if let DrainStep::Run {
        started,
        stuck: false,
    } = drain
    {
        changes.extend(at(
            *started,
            policy.disruption.drain.timeout,
            ChangeCause::DrainTimeout,
        ));
    }
    // From the heartbeat as it is now: a verdict cache's bound would be from when the verdict
    // was computed, and a pass would wake for each node's long-renewed heartbeat in turn.
    if let Some(heard) = last_heard {
        changes.extend(at(heard, policy.stale_after, ChangeCause::Stale));
    }
    changes.into_iter().filter(|c| c.at > now).min_by_key(|c| c.at)
}

fn condition(
    node: &NodeView,
    drain: &DrainStep,
    blocked: &Option<Block>,
    pending: &[Action],
) -> NodeCondition {
    let summary = node.verdict.summary();
    let (status, reason) = match node.verdict.state {
        NodeState::Compliant => ("True", Reason::Compliant),
        NodeState::Drifted => ("False", Reason::Drifted),
        NodeState::Unknown => ("Unknown", Reason::Unknown),
    };
    let (reason, mut message) = match drain {
        DrainStep::Run { stuck: true, started } => (
            Reason::DrainStuck,
            format!("{summary}; drain running since {started} is stuck"),
        ),
        DrainStep::Run { .. } => (Reason::Draining, format!("{summary}; draining")),
        DrainStep::Done { finished, .. } => (Reason::Drained, format!("{summary}; drained at {finished}")),
        DrainStep::None => (reason, summary),
    };
    if let Some(b) = blocked
        && !pending.is_empty()
    {
        let actions: Vec<String> = pending.iter().map(Action::describe).collect();
        message = match b {
            Block::OutsideWindow { opens } => format!(
                "{message}; waiting for the maintenance window that opens at {opens}: {}",
                actions.join(", ")
            ),
            Block::Approval { rungs, command } => format!(
                "{message}; {} waiting for approval of {} ({command})",
                actions.join(", "),
                rungs.join(", ")
            ),
            _ => format!("{message}; waiting ({}): {}", b.describe(), actions.join(", ")),
        };
    }
    NodeCondition {
        status,
        reason,
        message,
    }
}

#[allow(clippy::too_many_arguments)]
fn events(
    node: &NodeView,
    state: NodeState,
    taints: &BTreeSet<DriftTaint>,
    cordon: Option<bool>,
    drain: &DrainStep,
    user_uncordoned: Option<Timestamp>,
    blocked: &Option<Block>,
    pending: &[Action],
) -> Vec<PlannedEvent> {
    let mut out = Vec::new();
    // A node's first verdict being Compliant is not news: an Event per node there made a third
    // of all writes when a policy is first applied (the scale benchmark).
    let first_and_fine = node.current_state.is_none() && state == NodeState::Compliant;
    if node.current_state != Some(state) && !first_and_fine {
        let (warning, reason) = match state {
            NodeState::Compliant => (false, Reason::Compliant),
            NodeState::Drifted => (true, Reason::Drifted),
            NodeState::Unknown => (true, Reason::Unknown),
        };
        out.push(PlannedEvent {
            warning,
            reason,
            note: node.verdict.summary(),
        });
    }
    if blocked.is_some() && !matches!(blocked, Some(Block::DryRun | Block::Skip | Block::Paused)) {
        // Only when something new is held back, so a queue does not repeat itself.
        if !pending.is_empty() && node.current_state != Some(state) {
            out.push(PlannedEvent {
                warning: false,
                reason: Reason::RemediationWaiting,
                note: blocked.as_ref().map(Block::describe).unwrap_or_default(),
            });
        }
    }
    for t in taints.difference(&node.taints) {
        out.push(PlannedEvent {
            warning: true,
            reason: Reason::Tainted,
            note: format!("added taint {}", t.display()),
        });
    }
    for t in node.taints.difference(taints) {
        out.push(PlannedEvent {
            warning: false,
            reason: Reason::TaintRemoved,
            note: format!("removed taint {}", t.display()),
        });
    }
    match cordon {
        Some(true) => out.push(PlannedEvent {
            warning: true,
            reason: Reason::Cordoned,
            note: "marked unschedulable by gpunode".to_string(),
        }),
        Some(false) => out.push(PlannedEvent {
            warning: false,
            reason: Reason::Uncordoned,
            note: "gpunode's cordon lifted after recovery".to_string(),
        }),
        None => {}
    }
    match (node.markers.drain_started, drain) {
        (None, DrainStep::Run { .. }) => out.push(PlannedEvent {
            warning: true,
            reason: Reason::DrainStarted,
            note: "evicting pods through the Eviction API".to_string(),
        }),
        (Some(_), DrainStep::Run { stuck: true, .. })
            if node.current_reason != Some(Reason::DrainStuck) =>
        {
            out.push(PlannedEvent {
                warning: true,
                reason: Reason::DrainStuck,
                note: "drain has run past its timeout; still retrying, never forcing".to_string(),
            })
        }
        // Once: the condition says Drained from then on, or what the repair after it says.
        (Some(_), DrainStep::Done { .. })
            if !matches!(
                node.current_reason,
                Some(
                    Reason::Drained
                        | Reason::Repairing
                        | Reason::NeedsHuman
                        | Reason::AwaitingApproval
                        | Reason::Validating
                        | Reason::ValidationFailed
                )
            ) =>
        {
            out.push(PlannedEvent {
                warning: false,
                reason: Reason::Drained,
                note: "every pod the drain may evict has been evicted; the node stays cordoned until it recovers"
                    .to_string(),
            })
        }
        (Some(_), DrainStep::None) if user_uncordoned.is_some() && node.markers.user_uncordoned.is_none() => {
            out.push(PlannedEvent {
                warning: true,
                reason: Reason::DrainCancelled,
                note: "node uncordoned by a user; gpunode will not cordon it again until it recovers"
                    .to_string(),
            })
        }
        (Some(_), DrainStep::None) => out.push(PlannedEvent {
            warning: false,
            reason: Reason::DrainEnded,
            note: "drain no longer needed".to_string(),
        }),
        _ => {}
    }
    out
}
