//! The planner: from a policy, the verdicts of its nodes and what gpunode already did to them,
//! decide what each node should look like now. Pure: time is a parameter, nothing is written.
//!
//! Rules (README "What happens to a node"):
//! - **Hysteresis.** A class is *active* while it drifts and until it has stayed clear for
//!   `recovery.healthyFor`; a drift that returns within that time keeps its original start. A rule
//!   fires once one of its classes has been active for the rule's `after`; what it did is undone
//!   only when none of its classes is active any more. Flapping input therefore gives one action
//!   and one undo, never a flapping taint.
//! - **Budget.** NoSchedule/NoExecute taints, cordons and drains are disruptive. A node that is
//!   not yet disrupted by gpunode is admitted only while fewer than `maxUnavailable` of the
//!   policy's nodes are; the rest queue, oldest drift first. Undoing is never limited.
//! - **Circuit breaker.** When more than `maxDriftedPercent` of the nodes (and more than one
//!   node) began drifting within `window`, no disruption is added anywhere, and it stays so
//!   (latched, through the policy status) until a person closes it or, with `reset: Automatic`,
//!   the drifted nodes fall back to the threshold.
//! - **Fleet cap.** The operator may cap the GPU nodes unavailable at once across every policy
//!   ([`Fleet`], an input of the pass); a node beyond it waits.
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
//!
//! The planner is built in layers, each a module with one concept; a module imports only the
//! layers below it:
//!
//! | layer | module | what it holds |
//! | --- | --- | --- |
//! | what it reads | [`view`] | the per-node view ([`NodeView`]); observe builds it |
//! | what it says | [`output`] | actions, the drain, what is in effect, next changes, conditions, Events |
//! | hysteresis | [`hysteresis`] | the per-class tracks, `after` and `healthyFor` |
//! | the calendar | [`windows`] | where the maintenance windows stand |
//! | admission | [`admission`] | the one answer to "may this node start this step now, and if not, why" ([`Block`]) for every step and gate |
//! | feature planners | [`ladder`], [`gpus`], [`repair`], [`validation`] | what each part of the policy wants, and its words |
//! | one node's plan | [`node`] | [`NodePlan`], assembled from the decisions, its condition and Events |
//! | the pass | this module | [`plan`]: every node of a policy, in order, through admission, and [`requeue_after`] |

pub mod admission;
pub mod gpus;
pub mod hysteresis;
pub mod incremental;
pub mod ladder;
pub mod node;
pub mod output;
pub mod repair;
pub mod validation;
pub mod view;
pub mod windows;
mod work;

use gpunode_crds::GpuNodePolicySpec;
use jiff::Timestamp;

pub use admission::{Block, approve_command};
pub use gpus::{Escalation, Quarantine, QuarantineTarget, quarantine_of};
pub use hysteresis::track_classes;
pub use node::NodePlan;
pub use output::{
    Action, ChangeCause, DrainStep, GpuTaint, InEffect, NextChange, NodeCondition, PlannedEvent,
    RepairInEffect,
};
pub use repair::{EnsureObject, MadeFrom, RepairPlan, RepairState};
pub use validation::{ValidationPlan, ValidationState};
pub use view::{
    BreakerState, DeviceRef, Fleet, GpuPods, GpuView, JobState, NodeDevices, NodeView, PassInputs, PodRef,
    StepObject, approvals,
};

use admission::Admission;
use node::Work;
use work::{decide, template, want};

/// The plan for every node of a policy, plus the policy-wide decisions.
#[derive(Clone, Debug, Default, PartialEq)]
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
    /// Nodes that began drifting within the breaker window (and after it last closed).
    pub recently_drifted: u32,
    /// Nodes drifting now.
    pub drifting: u32,
    /// Most drifting nodes the breaker allows: above, it opens.
    pub breaker_threshold: u32,
    /// Where the breaker stands after this pass (the status records it).
    pub breaker: BreakerState,
    /// How the breaker closes, in words (the command a person runs).
    pub close_breaker: String,
    /// GPU nodes unavailable fleet-wide (with this plan's) and the cap, if the fleet is capped.
    pub fleet: Option<(u32, u32)>,
    /// Nodes waiting for the fleet cap.
    pub fleet_queued: u32,
    /// Nodes this plan disrupts that were available: they count against the fleet cap until
    /// written.
    pub fleet_taken: Vec<String>,
    /// Where the maintenance windows stand.
    pub window: windows::WindowState,
    /// Why `spec.validation.template` cannot be used, if it cannot.
    pub invalid_validation: Option<String>,
}

impl PolicyPlan {
    /// The policy-level decisions of a pass whose admission is `admission` (`invalid_template`:
    /// why the validation template cannot be used; empty when there is none), with no node and
    /// nobody queued: the full pass and the incremental one fill those in.
    pub(crate) fn decided(admission: &Admission, invalid_template: Option<&str>) -> PolicyPlan {
        PolicyPlan {
            nodes: Vec::new(),
            budget_allowed: admission.budget_allowed(),
            budget_in_use: admission.budget_in_use(),
            budget_queued: 0,
            circuit_open: admission.circuit_open(),
            recently_drifted: admission.recently_drifted(),
            drifting: admission.drifting(),
            breaker_threshold: admission.breaker_threshold(),
            breaker: admission.breaker(),
            close_breaker: admission.close_command().to_string(),
            fleet: admission.fleet(),
            fleet_queued: 0,
            fleet_taken: admission.fleet_taken().to_vec(),
            window: admission.window().clone(),
            invalid_validation: invalid_template.filter(|e| !e.is_empty()).map(str::to_string),
        }
    }

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
    // Evictions (a drain, or the pods of a quarantined GPU) are retried soon: a refusal by a
    // PodDisruptionBudget lifts without any change gpunode watches. A repair step's object has
    // no watch either: it is looked at as often.
    let draining = plan.nodes.iter().any(|n| {
        matches!(n.drain, DrainStep::Run { .. })
            || n.evicts_gpu_holders()
            || n.repair.polls()
            || n.validation.polls()
    });
    requeue_at(plan.next_change(), draining, plan.fleet_queued, now)
}

/// [`requeue_after`] from its parts: the plan's next change, whether some node's plan polls
/// (a drain, a repair step's object, a validation Job) and how many nodes wait for the fleet
/// cap (the incremental reconcile keeps them).
pub fn requeue_at(
    next_change: Option<NextChange>,
    draining: bool,
    fleet_queued: u32,
    now: Timestamp,
) -> std::time::Duration {
    let wait = next_change.map_or(IDLE_REQUEUE, |c| {
        std::time::Duration::try_from(c.at.duration_since(now)).unwrap_or(IDLE_REQUEUE)
    });
    // A node waiting for the fleet cap waits on other policies' nodes, which do not wake this
    // policy: it is looked at as often.
    let cap = if draining || fleet_queued > 0 {
        DRAIN_REQUEUE
    } else {
        IDLE_REQUEUE
    };
    // Just after: a change due exactly `now` has not happened yet.
    (wait + std::time::Duration::from_millis(100)).min(cap)
}

/// Plans every node of policy `name` (whose spec is `policy`), with no input besides: a breaker
/// that never opened, no fleet cap, its validation template unbounded (offline: `gpunode-operator
/// check`, benchmarks); the operator plans with the chart's bounds ([`PassInputs`]).
pub fn plan(name: &str, policy: &GpuNodePolicySpec, nodes: &[NodeView], now: Timestamp) -> PolicyPlan {
    plan_with(name, policy, nodes, &PassInputs::default(), now)
}

/// Plans every node of policy `name` (whose spec is `policy`), given where its breaker stood
/// and the fleet cap (`inputs`).
pub fn plan_with(
    name: &str,
    policy: &GpuNodePolicySpec,
    nodes: &[NodeView],
    inputs: &PassInputs,
    now: Timestamp,
) -> PolicyPlan {
    // A failed validation is a drift of the node (class Validation) until a repair step mends it.
    let nodes: Vec<_> = nodes
        .iter()
        .map(|n| validation::with_failure(policy.validation.as_ref(), n, now))
        .collect();
    let mut admission = Admission::with_inputs(name, policy, nodes.len(), inputs, now);
    let gpu_handled = gpus::handled(policy);
    let mut work: Vec<Work<'_>> = nodes
        .iter()
        .map(|n| want(policy, &admission, n, &gpu_handled, now))
        .collect();
    // Oldest drift first gets the budget; ties by name for determinism. (The order is sorted,
    // not the nodes: a node's work is large to move.)
    let mut order: Vec<_> = work
        .iter()
        .enumerate()
        .map(|(i, w)| (w.node.since.is_none(), w.node.since, w.node.view.name.as_str(), i))
        .collect();
    order.sort_unstable();
    for w in &work {
        admission.count(&w.node);
    }
    admission.settle();
    let template = template(policy, inputs);
    let template = template.as_ref().map_err(String::as_str);
    let plans: Vec<NodePlan> = order
        .into_iter()
        .map(|(.., i)| decide(name, policy, &mut admission, template, &mut work[i], now))
        .collect();
    let queued = plans.iter().filter(|p| p.blocked == Some(Block::Budget)).count();
    let fleet_queued = plans
        .iter()
        .filter(|p| matches!(p.blocked, Some(Block::FleetCap { .. })))
        .count();
    PolicyPlan {
        nodes: plans,
        budget_queued: u32::try_from(queued).unwrap_or(u32::MAX),
        fleet_queued: u32::try_from(fleet_queued).unwrap_or(u32::MAX),
        ..PolicyPlan::decided(&admission, template.err())
    }
}
