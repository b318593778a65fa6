//! Policy status from a plan: counts, the capped list of drifted nodes and the conditions.
//! Pure. Conditions keep their `lastTransitionTime` unless their status flips, and
//! [`same_ignoring_time`] lets the controller skip a patch that would change only timestamps.

use gpunode_crds::{GpuNodePolicyStatus, policy::DriftedNode, selector::InvalidSelector};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::{
    plan::{Action, Block, DrainStep, PolicyPlan},
    verdict::NodeState,
};

/// Most nodes listed in `status.driftedNodes`.
pub const MAX_DRIFTED_NODES: usize = 50;

fn condition(
    type_: &str,
    on: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    old: &[Condition],
    now: Timestamp,
) -> Condition {
    let status = if on { "True" } else { "False" };
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The status a plan implies, given the previous status (for transition times).
pub fn status(
    plan: &PolicyPlan,
    generation: Option<i64>,
    paused: bool,
    old: Option<&GpuNodePolicyStatus>,
    now: Timestamp,
) -> GpuNodePolicyStatus {
    let old_conditions = old.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let count = |f: &dyn Fn(&crate::plan::NodePlan) -> bool| {
        u32::try_from(plan.nodes.iter().filter(|n| f(n)).count()).unwrap_or(u32::MAX)
    };
    let matched = count(&|_| true);
    let compliant = count(&|n| n.state == NodeState::Compliant);
    let drifted = count(&|n| n.state == NodeState::Drifted);
    let unknown = count(&|n| n.state == NodeState::Unknown);
    let tainted = count(&|n| !n.taints.is_empty());
    let cordoned = count(&|n| n.markers.cordoned_by_us);
    let draining = count(&|n| matches!(n.drain, DrainStep::Run { .. }));
    let stuck = count(&|n| matches!(n.drain, DrainStep::Run { stuck: true, .. }));
    let conflicts: Vec<&str> = plan
        .nodes
        .iter()
        .filter(|n| matches!(n.blocked, Some(Block::Conflict(_))))
        .map(|n| n.node.as_str())
        .collect();

    let mut listed: Vec<&crate::plan::NodePlan> = plan
        .nodes
        .iter()
        .filter(|n| n.state != NodeState::Compliant)
        .collect();
    listed.sort_by(|a, b| (a.since.is_none(), a.since, &a.node).cmp(&(b.since.is_none(), b.since, &b.node)));
    let truncated = listed.len() > MAX_DRIFTED_NODES;
    let drifted_nodes = listed
        .into_iter()
        .take(MAX_DRIFTED_NODES)
        .map(|n| DriftedNode {
            node: n.node.clone(),
            classes: n.drifting.iter().copied().collect(),
            since: n.since.map(Time),
            actions: n.actions.iter().map(Action::describe).collect(),
            pending_actions: n.pending.iter().map(Action::describe).collect(),
            message: n.condition.message.clone(),
        })
        .collect();

    let g = generation;
    let conditions = vec![
        condition(
            "Ready",
            true,
            "Reconciled",
            format!("{matched} nodes evaluated: {compliant} compliant, {drifted} drifted, {unknown} unknown"),
            g,
            old_conditions,
            now,
        ),
        condition(
            "Degraded",
            stuck > 0,
            if stuck > 0 { "DrainStuck" } else { "AsExpected" },
            if stuck > 0 {
                format!("{stuck} drains have run past their timeout")
            } else {
                "no stuck drains".to_string()
            },
            g,
            old_conditions,
            now,
        ),
        condition(
            "BudgetExhausted",
            plan.budget_queued > 0,
            if plan.budget_queued > 0 {
                "NodesQueued"
            } else {
                "WithinBudget"
            },
            format!(
                "{} of {} nodes disrupted; {} waiting",
                plan.budget_in_use, plan.budget_allowed, plan.budget_queued
            ),
            g,
            old_conditions,
            now,
        ),
        condition(
            "CircuitOpen",
            plan.circuit_open,
            if plan.circuit_open {
                "TooManyDrifting"
            } else {
                "Closed"
            },
            format!(
                "{} of {matched} nodes began drifting within the breaker window",
                plan.recently_drifted
            ),
            g,
            old_conditions,
            now,
        ),
        condition(
            "Conflict",
            !conflicts.is_empty(),
            if conflicts.is_empty() {
                "NoOverlap"
            } else {
                "OverlappingPolicies"
            },
            if conflicts.is_empty() {
                "no node is selected by another policy".to_string()
            } else {
                format!("nodes also selected by another policy: {}", conflicts.join(", "))
            },
            g,
            old_conditions,
            now,
        ),
        condition(
            "Paused",
            paused,
            if paused { "Paused" } else { "Active" },
            if paused {
                "spec.paused is true: no action is taken or undone".to_string()
            } else {
                "acting on drift".to_string()
            },
            g,
            old_conditions,
            now,
        ),
    ];

    GpuNodePolicyStatus {
        observed_generation: generation,
        conditions,
        matched,
        compliant,
        drifted,
        unknown,
        tainted,
        cordoned,
        draining,
        drifted_nodes,
        drifted_nodes_truncated: truncated,
    }
}

/// The status of a policy whose selector cannot be used: it selects no node (every count 0),
/// Ready is False and Degraded names the field. Conditions that need a plan keep their state.
pub fn invalid(
    error: &InvalidSelector,
    generation: Option<i64>,
    old: Option<&GpuNodePolicyStatus>,
    now: Timestamp,
) -> GpuNodePolicyStatus {
    let old_conditions = old.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let message = format!("{error}; the policy selects no node and acts on nothing until it is fixed");
    let mut conditions = vec![
        condition(
            "Ready",
            false,
            INVALID_SELECTOR,
            message.clone(),
            generation,
            old_conditions,
            now,
        ),
        condition(
            "Degraded",
            true,
            INVALID_SELECTOR,
            message,
            generation,
            old_conditions,
            now,
        ),
    ];
    conditions.extend(
        old_conditions
            .iter()
            .filter(|c| c.type_ != "Ready" && c.type_ != "Degraded")
            .cloned(),
    );
    GpuNodePolicyStatus {
        observed_generation: generation,
        conditions,
        ..GpuNodePolicyStatus::default()
    }
}

/// The reason of the Ready and Degraded conditions of a policy with an unusable selector.
pub const INVALID_SELECTOR: &str = "InvalidSelector";

/// Equal apart from condition transition times: no patch needed.
pub fn same_ignoring_time(a: &GpuNodePolicyStatus, b: &GpuNodePolicyStatus) -> bool {
    let strip = |s: &GpuNodePolicyStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}
