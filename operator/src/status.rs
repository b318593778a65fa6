//! Policy status from what was applied: counts, the capped list of drifted nodes and the
//! conditions. Pure. What a node counts as (tainted, cordoned, draining, its actions) is what is
//! in effect on it ([`Applied::in_effect`]): a node whose write failed counts as it was, not as it
//! was planned. Conditions keep their `lastTransitionTime` unless their status flips, and
//! [`same_ignoring_time`] lets the controller skip a patch that would change only timestamps.
//! It reads the plan's words and apply's results; it decides nothing and writes nothing.

use gpunode_crds::{
    GpuNodePolicyStatus,
    policy::{CircuitBreakerStatus, DriftedNode},
    selector::InvalidSelector,
};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::{
    apply::Applied,
    plan::{
        Action, Block, BreakerState, DrainStep, InEffect, NodePlan, PolicyPlan, RepairState,
        windows::WindowState,
    },
    reasons::{PolicyCondition, PolicyReason},
    verdict::NodeState,
};

/// Most nodes listed in `status.driftedNodes`.
pub const MAX_DRIFTED_NODES: usize = 50;

fn condition(
    type_: PolicyCondition,
    on: bool,
    reason: PolicyReason,
    message: String,
    generation: Option<i64>,
    old: &[Condition],
    now: Timestamp,
) -> Condition {
    let status = if on { "True" } else { "False" };
    let since = old
        .iter()
        .find(|c| c.type_ == type_.as_str() && c.status == status)
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

/// The status of a policy whose plan was applied (`applied`), given the previous status (for
/// transition times).
pub fn status(
    plan: &PolicyPlan,
    applied: &Applied,
    generation: Option<i64>,
    paused: bool,
    old: Option<&GpuNodePolicyStatus>,
    now: Timestamp,
) -> GpuNodePolicyStatus {
    status_of(
        plan,
        applied.in_effect(plan).collect(),
        generation,
        paused,
        old,
        now,
    )
}

/// The policy status from the policy-level results of a pass (`plan`; its `nodes` are not
/// read) and every node's plan with what is in effect on it (`nodes`): the incremental
/// reconcile keeps both between passes.
pub fn status_of(
    plan: &PolicyPlan,
    nodes: Vec<(&NodePlan, InEffect)>,
    generation: Option<i64>,
    paused: bool,
    old: Option<&GpuNodePolicyStatus>,
    now: Timestamp,
) -> GpuNodePolicyStatus {
    let old_conditions = old.map(|s| s.conditions.as_slice()).unwrap_or_default();
    let count = |f: &dyn Fn(&NodePlan, &InEffect) -> bool| {
        u32::try_from(nodes.iter().filter(|(n, e)| f(n, e)).count()).unwrap_or(u32::MAX)
    };
    let matched = count(&|_, _| true);
    let compliant = count(&|n, _| n.state == NodeState::Compliant);
    let drifted = count(&|n, _| n.state == NodeState::Drifted);
    let unknown = count(&|n, _| n.state == NodeState::Unknown);
    let stuck = count(&|_, e| matches!(e.drain, DrainStep::Run { stuck: true, .. }));
    let quarantined_gpus = u32::try_from(
        nodes
            .iter()
            .flat_map(|(_, e)| &e.actions)
            .filter(|a| matches!(a, Action::TaintDevice(_)))
            .count(),
    )
    .unwrap_or(u32::MAX);
    let (drifted_nodes, truncated) = drifted_nodes(&nodes);
    let stamp = |type_, (on, reason, message): (bool, PolicyReason, String)| {
        condition(type_, on, reason, message, generation, old_conditions, now)
    };
    let ready =
        format!("{matched} nodes evaluated: {compliant} compliant, {drifted} drifted, {unknown} unknown");
    let conditions = vec![
        stamp(PolicyCondition::Ready, (true, PolicyReason::Reconciled, ready)),
        stamp(PolicyCondition::Degraded, degraded(plan, stuck)),
        stamp(PolicyCondition::BudgetExhausted, budget_exhausted(plan)),
        stamp(PolicyCondition::CircuitOpen, circuit_open(plan, matched)),
        stamp(PolicyCondition::Conflict, conflict(&nodes)),
        stamp(PolicyCondition::Paused, paused_condition(paused)),
    ];
    GpuNodePolicyStatus {
        observed_generation: generation,
        conditions,
        matched,
        compliant,
        drifted,
        unknown,
        tainted: count(&|_, e| e.tainted),
        cordoned: count(&|_, e| e.cordoned),
        draining: count(&|_, e| matches!(e.drain, DrainStep::Run { .. })),
        quarantined_gpus,
        repairing: count(&|_, e| e.repair.running.is_some()),
        needs_human: count(&|_, e| e.repair.needs_human),
        validating: count(&|_, e| e.validating),
        circuit_breaker: (!plan.breaker.is_pristine()).then(|| breaker_status(&plan.breaker)),
        fleet_queued: plan.fleet_queued,
        drifted_nodes,
        drifted_nodes_truncated: truncated,
    }
}

/// `status.driftedNodes`: the nodes that are not compliant, oldest drift first, at most
/// [`MAX_DRIFTED_NODES`]; and whether some were left out.
fn drifted_nodes(nodes: &[(&NodePlan, InEffect)]) -> (Vec<DriftedNode>, bool) {
    let mut listed: Vec<&(&NodePlan, InEffect)> = nodes
        .iter()
        .filter(|(n, _)| n.state != NodeState::Compliant)
        .collect();
    listed.sort_by(|(a, _), (b, _)| {
        (a.since.is_none(), a.since, &a.node).cmp(&(b.since.is_none(), b.since, &b.node))
    });
    let truncated = listed.len() > MAX_DRIFTED_NODES;
    let drifted_nodes = listed
        .into_iter()
        .take(MAX_DRIFTED_NODES)
        .map(|(n, effect)| DriftedNode {
            node: n.node.clone(),
            classes: n.drifting.iter().copied().collect(),
            since: n.since.map(Time),
            actions: effect
                .actions
                .iter()
                .map(Action::describe)
                .chain(effect.repair.running.iter().map(|s| format!("Repair {s}")))
                .collect(),
            pending_actions: n
                .pending
                .iter()
                .map(Action::describe)
                .chain(match &n.repair.state {
                    RepairState::Waiting { step, .. } => Some(format!("Repair {step}")),
                    _ => None,
                })
                .collect(),
            message: n.condition.message.clone(),
        })
        .collect();
    (drifted_nodes, truncated)
}

/// Degraded: the validation template or a maintenance window cannot be used, or drains are
/// stuck.
fn degraded(plan: &PolicyPlan, stuck: u32) -> (bool, PolicyReason, String) {
    let invalid_window = match &plan.window {
        WindowState::Invalid(why) => Some(why),
        _ => None,
    };
    let on = stuck > 0 || invalid_window.is_some() || plan.invalid_validation.is_some();
    let reason = if plan.invalid_validation.is_some() {
        PolicyReason::InvalidValidation
    } else if invalid_window.is_some() {
        PolicyReason::InvalidMaintenanceWindow
    } else if stuck > 0 {
        PolicyReason::DrainStuck
    } else {
        PolicyReason::AsExpected
    };
    let message = match (&plan.invalid_validation, invalid_window) {
        (Some(why), _) => format!("recovered nodes stay as they are, no validation can run: {why}"),
        (None, Some(why)) => format!("every maintenance window stays closed: {why}"),
        (None, None) if stuck > 0 => format!("{stuck} drains have run past their timeout"),
        (None, None) => "no stuck drains".to_string(),
    };
    (on, reason, message)
}

/// BudgetExhausted: nodes wait for a slot of `maxUnavailable`, or for the operator's fleet-wide
/// cap.
fn budget_exhausted(plan: &PolicyPlan) -> (bool, PolicyReason, String) {
    let on = plan.budget_queued > 0 || plan.fleet_queued > 0;
    let reason = if plan.budget_queued > 0 {
        PolicyReason::NodesQueued
    } else if on {
        PolicyReason::FleetCapReached
    } else {
        PolicyReason::WithinBudget
    };
    let mut message = format!(
        "{} of {} nodes disrupted; {} waiting",
        plan.budget_in_use, plan.budget_allowed, plan.budget_queued
    );
    if let Some((unavailable, allowed)) = plan.fleet {
        message.push_str(&format!(
            "; fleet-wide {unavailable} of at most {allowed} GPU nodes unavailable, {} waiting",
            plan.fleet_queued
        ));
    }
    (on, reason, message)
}

/// CircuitOpen: the breaker opened (too many of the `matched` nodes began drifting within its
/// window) and nobody closed it yet; the message says how to.
fn circuit_open(plan: &PolicyPlan, matched: u32) -> (bool, PolicyReason, String) {
    let b = &plan.breaker;
    if !plan.circuit_open {
        let message = format!(
            "{} of {matched} nodes began drifting within the breaker window",
            plan.recently_drifted
        );
        return (false, PolicyReason::Closed, message);
    }
    let reason = if plan.recently_drifted > plan.breaker_threshold {
        PolicyReason::TooManyDrifting
    } else {
        PolicyReason::Latched
    };
    let opened = b.opened_at.map(|t| t.to_string()).unwrap_or_default();
    let message = format!(
        "opened at {opened}: {} of {} nodes began drifting within the breaker window; {} drifting now; {}",
        b.drifted, b.of, plan.drifting, plan.close_breaker
    );
    (true, reason, message)
}

/// `status.circuitBreaker` from where the plan left the breaker.
fn breaker_status(b: &BreakerState) -> CircuitBreakerStatus {
    CircuitBreakerStatus {
        open: b.open,
        opened_at: b.opened_at.map(Time),
        drifted: b.drifted,
        of: b.of,
        closed_at: b.closed_at.map(Time),
        closed_by: b.closed_by,
    }
}

/// Where the breaker stood, from the policy status: the planner's input.
pub fn breaker_memory(status: Option<&GpuNodePolicyStatus>) -> BreakerState {
    let Some(b) = status.and_then(|s| s.circuit_breaker.as_ref()) else {
        return BreakerState::default();
    };
    BreakerState {
        open: b.open,
        opened_at: b.opened_at.as_ref().map(|t| t.0),
        drifted: b.drifted,
        of: b.of,
        closed_at: b.closed_at.as_ref().map(|t| t.0),
        closed_by: b.closed_by,
    }
}

/// Conflict: nodes another policy selects too.
fn conflict(nodes: &[(&NodePlan, InEffect)]) -> (bool, PolicyReason, String) {
    let conflicts: Vec<&str> = nodes
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| matches!(n.blocked, Some(Block::Conflict(_))))
        .map(|n| n.node.as_str())
        .collect();
    if conflicts.is_empty() {
        let message = "no node is selected by another policy".to_string();
        (false, PolicyReason::NoOverlap, message)
    } else {
        let message = format!("nodes also selected by another policy: {}", conflicts.join(", "));
        (true, PolicyReason::OverlappingPolicies, message)
    }
}

/// Paused: `spec.paused`.
fn paused_condition(paused: bool) -> (bool, PolicyReason, String) {
    if paused {
        let message = "spec.paused is true: no action is taken or undone".to_string();
        (true, PolicyReason::Paused, message)
    } else {
        (false, PolicyReason::Active, "acting on drift".to_string())
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
            PolicyCondition::Ready,
            false,
            PolicyReason::InvalidSelector,
            message.clone(),
            generation,
            old_conditions,
            now,
        ),
        condition(
            PolicyCondition::Degraded,
            true,
            PolicyReason::InvalidSelector,
            message,
            generation,
            old_conditions,
            now,
        ),
    ];
    conditions.extend(
        old_conditions
            .iter()
            .filter(|c| {
                c.type_ != PolicyCondition::Ready.as_str() && c.type_ != PolicyCondition::Degraded.as_str()
            })
            .cloned(),
    );
    GpuNodePolicyStatus {
        observed_generation: generation,
        conditions,
        // The breaker latches whatever the selector: an open one stays open.
        circuit_breaker: old.and_then(|s| s.circuit_breaker.clone()),
        ..GpuNodePolicyStatus::default()
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        apply::{ApplyError, NodeOutcome, NodeResult},
        plan::{NodeView, plan},
        verdict::{Drift, Verdict},
    };
    use gpunode_crds::{DriftClass, GpuNodePolicySpec};

    fn xid(name: &str) -> NodeView {
        let verdict = Verdict::new(
            vec![Drift {
                class: DriftClass::Xid,
                check: "gpu.xid".into(),
                expected: "none".into(),
                actual: "79".into(),
                gpu: Some(0),
                device: None,
            }],
            Vec::new(),
        );
        let mut node = k8s_openapi::api::core::v1::Node::default();
        node.metadata.name = Some(name.to_string());
        NodeView::observe(&node, verdict, Vec::new()).0
    }

    #[test]
    fn a_node_whose_write_failed_counts_as_it_was_not_as_planned() {
        let spec: GpuNodePolicySpec = serde_json::from_value(serde_json::json!({
            "remediation": [{"classes": ["Xid"], "action": "Drain"}],
            "disruption": {"maxUnavailable": 2, "circuitBreaker": {"maxDriftedPercent": 100}},
        }))
        .unwrap();
        let now = Timestamp::now();
        let p = plan("p", &spec, &[xid("a"), xid("b")], now);
        assert!(
            p.nodes.iter().all(|n| n.cordon == Some(true)),
            "both are cordoned and drained"
        );
        let applied = Applied {
            results: vec![
                NodeResult::Applied(Box::<NodeOutcome>::default()),
                NodeResult::Failed(ApplyError::Conflict("b".into())),
            ],
        };
        let s = status(&p, &applied, Some(1), false, None, now);
        assert_eq!((s.matched, s.drifted), (2, 2), "the verdicts stand either way");
        assert_eq!(
            (s.cordoned, s.draining),
            (1, 1),
            "only the node written is cordoned and draining"
        );
        let listed = |n: &str| {
            s.drifted_nodes
                .iter()
                .find(|d| d.node == n)
                .map(|d| d.actions.clone())
                .unwrap_or_else(|| panic!("{n} is listed"))
        };
        assert_eq!(listed("a"), ["Cordon", "Drain"]);
        assert!(
            listed("b").is_empty(),
            "nothing is in effect on b: {:?}",
            listed("b")
        );
        // Written in full: the plan is what is in effect.
        let all = Applied {
            results: vec![NodeResult::Unchanged, NodeResult::Applied(Box::default())],
        };
        let s = status(&p, &all, Some(1), false, None, now);
        assert_eq!((s.cordoned, s.draining), (2, 2));
    }

    #[test]
    fn an_open_breaker_is_recorded_read_back_and_its_condition_says_how_to_close_it() {
        let spec: GpuNodePolicySpec = serde_json::from_value(serde_json::json!({
            "remediation": [{"classes": ["Xid"], "action": "Cordon"}],
            "disruption": {"circuitBreaker": {"maxDriftedPercent": 10}},
        }))
        .unwrap();
        let now: Timestamp = "2026-12-06T01:00:00.700Z".parse().unwrap();
        let p = plan("pool", &spec, &[xid("a"), xid("b"), xid("c")], now);
        assert!(p.circuit_open);
        let applied = Applied {
            results: vec![
                NodeResult::Unchanged,
                NodeResult::Unchanged,
                NodeResult::Unchanged,
            ],
        };
        let s = status(&p, &applied, Some(1), false, None, now);
        let b = s.circuit_breaker.clone().unwrap();
        assert!(b.open);
        assert_eq!(
            b.opened_at.as_ref().map(|t| t.0.to_string()).as_deref(),
            Some("2026-12-06T01:00:00Z")
        );
        assert_eq!((b.drifted, b.of), (3, 3));
        let c = s.conditions.iter().find(|c| c.type_ == "CircuitOpen").unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "TooManyDrifting")
        );
        assert!(
            c.message
                .contains("kubectl gpunode close-breaker pool (or kubectl annotate --overwrite gpunodepolicy pool gpunode.dev/close-breaker=2026-12-06T01:00:00Z)"),
            "{}",
            c.message
        );
        let back: GpuNodePolicyStatus = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(breaker_memory(Some(&back)), p.breaker, "what the next pass reads");
        // An unusable selector keeps the breaker as it was.
        let e = gpunode_crds::selector::InvalidSelector {
            field: "spec.nodeSelector".into(),
            reason: "empty".into(),
        };
        assert_eq!(
            invalid(&e, Some(2), Some(&s), now).circuit_breaker,
            s.circuit_breaker
        );
    }
}
