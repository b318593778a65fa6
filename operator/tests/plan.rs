//! The planner's rules, one behaviour per test, driven through a small simulator that applies
//! each plan back onto the nodes the way the operator's apply step does.

// clippy.toml allows unwrap and expect in #[test] fns only; this test crate's helper fns fail
// the same way (a panic naming what broke), so the allow covers the whole crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use gpunode_crds::{
    DriftClass, GpuNodePolicySpec,
    policy::{BreakerClosedBy, RemediationAction, RemediationRule, TaintEffect},
};
use gpunode_operator::{
    markers::DriftTaint,
    plan::{Action, Block, DrainStep, Fleet, NodeView, PassInputs, plan, plan_with},
    reasons::Reason,
    verdict::{Drift, NodeState, Unknown, Verdict},
};
use jiff::{SignedDuration, Timestamp};

mod support;
use support::{of, step};

fn t0() -> Timestamp {
    Timestamp::from_second(1_790_000_000).unwrap()
}

fn at(secs: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(secs)
}

fn policy(yaml: &str) -> GpuNodePolicySpec {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("policy fixture: {e}"))
}

/// Throttle taints NoSchedule after 30s, Xid drains, healthyFor 5m, budget 1, breaker off.
fn ladder() -> GpuNodePolicySpec {
    policy(
        r#"
remediation:
  - {classes: [Throttle, Thermal], action: Taint, effect: NoSchedule, after: 30s}
  - {classes: [Memory, Xid], action: Drain}
disruption:
  maxUnavailable: 1
  circuitBreaker: {maxDriftedPercent: 100}
recovery: {healthyFor: 5m}
"#,
    )
}

fn drift(class: DriftClass) -> Drift {
    Drift {
        class,
        check: format!("check.{}", class.label()),
        expected: "ok".to_string(),
        actual: "bad".to_string(),
        gpu: Some(0),
        device: None,
    }
}

fn drifted(classes: &[DriftClass]) -> Verdict {
    Verdict::new(classes.iter().copied().map(drift).collect(), Vec::new())
}

fn compliant() -> Verdict {
    Verdict::new(Vec::new(), Vec::new())
}

fn stale() -> Verdict {
    Verdict::new(
        Vec::new(),
        vec![Unknown {
            check: "report".to_string(),
            reason: "report is 10m old (staleAfter 3m)".to_string(),
            gpu: None,
        }],
    )
}

fn node(name: &str) -> NodeView {
    NodeView::new(name, compliant())
}

fn no_schedule(class: &str) -> DriftTaint {
    DriftTaint {
        effect: TaintEffect::NoSchedule,
        value: class.to_string(),
    }
}

#[test]
fn a_taint_waits_for_after() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Throttle]);
    let p = step(&policy, &mut nodes, at(0));
    assert!(of(&p, "a").taints.is_empty(), "tainted before 30s");
    assert_eq!(of(&p, "a").state, NodeState::Drifted);
    assert_eq!(of(&p, "a").drifting, BTreeSet::from([DriftClass::Throttle]));
    let p = step(&policy, &mut nodes, at(29));
    assert!(of(&p, "a").taints.is_empty());
    let p = step(&policy, &mut nodes, at(30));
    assert_eq!(of(&p, "a").taints, BTreeSet::from([no_schedule("throttle")]));
    assert!(of(&p, "a").events.iter().any(|e| e.reason == Reason::Tainted));
}

#[test]
fn recovery_waits_for_healthy_for_then_removes_only_gpunode_taints() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Thermal]);
    step(&policy, &mut nodes, at(0));
    step(&policy, &mut nodes, at(30));
    assert_eq!(nodes[0].taints, BTreeSet::from([no_schedule("thermal")]));

    nodes[0].verdict = compliant();
    let p = step(&policy, &mut nodes, at(60));
    assert_eq!(of(&p, "a").state, NodeState::Compliant);
    assert_eq!(nodes[0].taints.len(), 1, "undone before healthyFor");
    step(&policy, &mut nodes, at(60 + 299));
    assert_eq!(nodes[0].taints.len(), 1);
    let p = step(&policy, &mut nodes, at(60 + 300));
    assert!(nodes[0].taints.is_empty());
    assert!(
        of(&p, "a")
            .events
            .iter()
            .any(|e| e.reason == Reason::TaintRemoved)
    );
    assert!(
        nodes[0].markers.classes.is_empty(),
        "bookkeeping cleared after recovery"
    );
}

#[test]
fn a_drift_returning_within_healthy_for_keeps_its_start() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Throttle]);
    step(&policy, &mut nodes, at(0));
    nodes[0].verdict = compliant();
    step(&policy, &mut nodes, at(20));
    nodes[0].verdict = drifted(&[DriftClass::Throttle]);
    // 35s after the first sighting, though only 5s into the second episode.
    step(&policy, &mut nodes, at(35));
    assert_eq!(nodes[0].taints, BTreeSet::from([no_schedule("throttle")]));
}

#[test]
fn a_flapping_input_gives_one_taint_and_no_flapping() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    let mut changes = 0;
    let mut last = BTreeSet::new();
    // Drifting 10s, healthy 10s, for 30 minutes.
    for i in 0..180 {
        nodes[0].verdict = if i % 2 == 0 {
            drifted(&[DriftClass::Throttle])
        } else {
            compliant()
        };
        step(&policy, &mut nodes, at(i * 10));
        if nodes[0].taints != last {
            changes += 1;
            last = nodes[0].taints.clone();
        }
    }
    assert_eq!(
        changes, 1,
        "the taint was added once and never removed while flapping"
    );
    assert_eq!(last, BTreeSet::from([no_schedule("throttle")]));
}

#[test]
fn drain_cordons_then_evicts_and_recovery_uncordons() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Xid]);
    let p = step(&policy, &mut nodes, at(0));
    let a = of(&p, "a");
    assert_eq!(a.cordon, Some(true));
    assert_eq!(
        a.drain,
        DrainStep::Run {
            started: at(0),
            stuck: false
        }
    );
    assert!(nodes[0].unschedulable && nodes[0].markers.cordoned_by_us);

    // The drain keeps its start across reconciles and turns stuck after the 10m default timeout.
    let p = step(&policy, &mut nodes, at(600));
    assert_eq!(
        of(&p, "a").drain,
        DrainStep::Run {
            started: at(0),
            stuck: true
        }
    );
    assert_eq!(of(&p, "a").condition.reason, Reason::DrainStuck);
    assert!(of(&p, "a").events.iter().any(|e| e.reason == Reason::DrainStuck));
    let p = step(&policy, &mut nodes, at(610));
    assert!(
        !of(&p, "a").events.iter().any(|e| e.reason == Reason::DrainStuck),
        "stuck reported once"
    );

    nodes[0].verdict = compliant();
    step(&policy, &mut nodes, at(700));
    let p = step(&policy, &mut nodes, at(1000));
    assert_eq!(of(&p, "a").cordon, Some(false));
    assert_eq!(of(&p, "a").drain, DrainStep::None);
    assert!(!nodes[0].unschedulable && !nodes[0].markers.cordoned_by_us);
}

#[test]
fn a_finished_drain_is_reported_once_never_turns_stuck_and_ends_on_recovery() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Xid]);
    step(&policy, &mut nodes, at(0));
    // The apply step found nothing left to evict and recorded it.
    nodes[0].markers.drained = Some(at(30));

    let p = step(&policy, &mut nodes, at(40));
    let a = of(&p, "a");
    assert_eq!(
        a.drain,
        DrainStep::Done {
            started: at(0),
            finished: at(30)
        }
    );
    assert_eq!(a.condition.reason, Reason::Drained);
    assert_eq!(a.markers.drained, Some(at(30)), "kept while the drain rule holds");
    assert_eq!(a.cordon, None, "still cordoned: nothing to change");
    assert!(nodes[0].unschedulable);
    assert!(a.events.iter().any(|e| e.reason == Reason::Drained));

    // Long past the drain timeout: done is not stuck, and the event is not repeated.
    let p = step(&policy, &mut nodes, at(3600));
    let a = of(&p, "a");
    assert_eq!(a.condition.reason, Reason::Drained);
    assert!(a.events.is_empty(), "{:?}", a.events);

    nodes[0].verdict = compliant();
    step(&policy, &mut nodes, at(3700));
    let p = step(&policy, &mut nodes, at(4000));
    let a = of(&p, "a");
    assert_eq!(a.drain, DrainStep::None);
    assert_eq!(a.markers.drained, None, "cleared with the drain");
    assert_eq!(a.cordon, Some(false));
}

#[test]
fn a_first_compliant_verdict_is_not_an_event_but_a_return_to_compliance_is() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    let p = step(&policy, &mut nodes, at(0));
    assert!(of(&p, "a").events.is_empty(), "{:?}", of(&p, "a").events);
    nodes[0].verdict = drifted(&[DriftClass::Driver]);
    let p = step(&policy, &mut nodes, at(10));
    assert!(of(&p, "a").events.iter().any(|e| e.reason == Reason::Drifted));
    nodes[0].verdict = compliant();
    let p = step(&policy, &mut nodes, at(20));
    assert!(of(&p, "a").events.iter().any(|e| e.reason == Reason::Compliant));
}

#[test]
fn a_human_cordon_is_never_lifted() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].unschedulable = true; // cordoned by someone else
    nodes[0].verdict = drifted(&[DriftClass::Memory]);
    let p = step(&policy, &mut nodes, at(0));
    assert_eq!(of(&p, "a").cordon, None);
    assert!(matches!(of(&p, "a").drain, DrainStep::Run { .. }));
    assert!(!nodes[0].markers.cordoned_by_us);
    nodes[0].verdict = compliant();
    step(&policy, &mut nodes, at(10));
    let p = step(&policy, &mut nodes, at(400));
    assert_eq!(of(&p, "a").cordon, None);
    assert!(nodes[0].unschedulable, "the human's cordon stays");
}

#[test]
fn a_human_uncordon_cancels_the_drain_until_the_node_recovers() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Xid]);
    step(&policy, &mut nodes, at(0));
    nodes[0].unschedulable = false; // kubectl uncordon
    let p = step(&policy, &mut nodes, at(5));
    let a = of(&p, "a");
    assert_eq!(a.drain, DrainStep::None);
    assert_eq!(a.cordon, None);
    assert!(a.events.iter().any(|e| e.reason == Reason::DrainCancelled));
    assert!(nodes[0].markers.user_uncordoned.is_some());
    // Still drifting: gpunode does not fight the human.
    let p = step(&policy, &mut nodes, at(60));
    assert_eq!(of(&p, "a").cordon, None);
    assert!(!nodes[0].unschedulable);
    // After recovery the hold is lifted, and a new drift is acted on again.
    nodes[0].verdict = compliant();
    step(&policy, &mut nodes, at(100));
    step(&policy, &mut nodes, at(400));
    assert!(nodes[0].markers.user_uncordoned.is_none());
    nodes[0].verdict = drifted(&[DriftClass::Xid]);
    let p = step(&policy, &mut nodes, at(500));
    assert_eq!(of(&p, "a").cordon, Some(true));
}

/// Found by `make reliability-long` (the budget fuzz at 5,000 cases): a drain a person cancelled
/// leaves a stale `drain-started` marker on a schedulable node. That node is not disrupted, so
/// it takes no budget slot, and it gets no disruptive action without one.
#[test]
fn a_drain_a_person_cancelled_takes_no_budget_and_gives_none() {
    let mut policy = ladder();
    policy.remediation.push(gpunode_crds::policy::RemediationRule {
        classes: vec![DriftClass::Driver],
        action: RemediationAction::Cordon,
        effect: None,
        after: gpunode_crds::Duration::from_secs(0),
        require_approval: false,
    });
    let cancelled = |name: &str, class: DriftClass| {
        let mut n = node(name);
        n.verdict = drifted(&[class]);
        n.markers.drain_started = Some(at(-3600));
        n.markers.user_uncordoned = Some(at(-3600));
        n
    };
    // Budget 1, held by nobody: the other node's fatal XID is admitted.
    let nodes = vec![cancelled("b", DriftClass::Driver), {
        let mut a = node("a");
        a.verdict = drifted(&[DriftClass::Xid]);
        a
    }];
    let p = plan("p", &policy, &nodes, at(0));
    assert_eq!(p.budget_in_use, 1, "only a's new drain holds the slot");
    assert_eq!(of(&p, "a").cordon, Some(true));
    assert_eq!(of(&p, "b").cordon, None, "the person's uncordon is respected");
    // Budget 0: the cancelled node's throttling gets no taint, having no slot.
    let mut policy0 = ladder();
    policy0.disruption.max_unavailable = gpunode_crds::MaxUnavailable::Count(0);
    let nodes = vec![cancelled("c", DriftClass::Throttle)];
    let p = plan("p", &policy0, &nodes, at(60));
    assert!(
        of(&p, "c").taints.is_empty(),
        "tainted with no budget: {:?}",
        of(&p, "c").taints
    );
    assert_eq!(p.budget_in_use, 0);
}

#[test]
fn thirty_nodes_drifting_under_a_ten_percent_budget_proceed_three_at_a_time() {
    let policy = policy(
        r#"
remediation:
  - {classes: [Xid], action: Drain}
disruption:
  maxUnavailable: "10%"
  circuitBreaker: {maxDriftedPercent: 100}
recovery: {healthyFor: 1m}
"#,
    );
    let mut nodes: Vec<NodeView> = (0..30).map(|i| node(&format!("n{i:02}"))).collect();
    for (i, n) in nodes.iter_mut().enumerate() {
        n.verdict = drifted(&[DriftClass::Xid]);
        // Staggered starts make the queue order observable: n00 drifted first.
        n.markers.classes.insert(
            DriftClass::Xid,
            gpunode_operator::markers::ClassTrack {
                since: at(i64::try_from(i).unwrap_or(0) - 100),
                cleared_at: None,
            },
        );
    }
    let p = step(&policy, &mut nodes, at(0));
    let draining: Vec<&str> = p
        .nodes
        .iter()
        .filter(|n| n.actions.contains(&Action::Drain))
        .map(|n| n.node.as_str())
        .collect();
    assert_eq!(
        draining,
        ["n00", "n01", "n02"],
        "exactly the budget acts, oldest first"
    );
    assert_eq!(p.budget_allowed, 3);
    assert_eq!(p.budget_in_use, 3);
    assert_eq!(p.budget_queued, 27);
    assert!(
        p.nodes
            .iter()
            .filter(|n| n.blocked == Some(Block::Budget))
            .all(|n| n.pending.contains(&Action::Drain))
    );

    // The queue holds while the first three are still out.
    let p = step(&policy, &mut nodes, at(30));
    assert_eq!(p.budget_in_use, 3);
    assert_eq!(p.budget_queued, 27);

    // Repair the first three; once healthy for 1m their slots go to the next three.
    let mut t = 60;
    let mut admitted = vec!["n00".to_string(), "n01".to_string(), "n02".to_string()];
    for round in 1..10 {
        for n in nodes.iter_mut().filter(|n| admitted.contains(&n.name)) {
            n.verdict = compliant();
        }
        step(&policy, &mut nodes, at(t));
        // Healthy for 1m: undone; the slots go to the queue once the undo is written.
        let p = step(&policy, &mut nodes, at(t + 60));
        assert!(
            p.nodes.iter().all(|n| !n.actions.contains(&Action::Drain)),
            "round {round}: nobody is admitted in the plan that undoes (both would be out at once)"
        );
        assert_eq!(
            p.budget_in_use, 3,
            "round {round}: the undone nodes hold their slots until written"
        );
        let p = step(&policy, &mut nodes, at(t + 60));
        let now_draining: Vec<String> = p
            .nodes
            .iter()
            .filter(|n| n.actions.contains(&Action::Drain))
            .map(|n| n.node.clone())
            .collect();
        let expected: Vec<String> = (round * 3..round * 3 + 3).map(|i| format!("n{i:02}")).collect();
        assert_eq!(now_draining, expected, "round {round}");
        assert!(p.budget_in_use <= 3);
        admitted = expected;
        t += 120;
    }
}

#[test]
fn escalating_an_already_disrupted_node_needs_no_extra_budget() {
    let policy = ladder();
    let mut nodes = vec![node("a"), node("b")];
    nodes[0].verdict = drifted(&[DriftClass::Throttle]);
    step(&policy, &mut nodes, at(0));
    step(&policy, &mut nodes, at(30));
    assert_eq!(nodes[0].taints.len(), 1);
    nodes[0].verdict = drifted(&[DriftClass::Throttle, DriftClass::Xid]);
    nodes[1].verdict = drifted(&[DriftClass::Xid]);
    let p = step(&policy, &mut nodes, at(40));
    assert!(
        of(&p, "a").actions.contains(&Action::Drain),
        "a escalates within its slot"
    );
    assert_eq!(of(&p, "b").blocked, Some(Block::Budget));
}

#[test]
fn the_circuit_breaker_stops_new_disruption_when_many_nodes_drift_at_once() {
    let policy = policy(
        r#"
remediation:
  - {classes: [Driver], action: Cordon}
  - {classes: [Driver], action: Taint, effect: PreferNoSchedule}
disruption:
  maxUnavailable: "100%"
  circuitBreaker: {maxDriftedPercent: 30, window: 10m}
"#,
    );
    let mut nodes: Vec<NodeView> = (0..10).map(|i| node(&format!("n{i}"))).collect();
    for n in nodes.iter_mut().take(4) {
        n.verdict = drifted(&[DriftClass::Driver]);
    }
    let p = step(&policy, &mut nodes, at(0));
    assert!(p.circuit_open);
    assert_eq!(p.recently_drifted, 4);
    for n in p.nodes.iter().filter(|n| n.state == NodeState::Drifted) {
        assert!(matches!(n.blocked, Some(Block::CircuitOpen { .. })));
        assert_eq!(n.cordon, None);
        assert_eq!(n.pending, vec![Action::Cordon]);
        // A non-disruptive taint is not held back.
        assert_eq!(n.taints.len(), 1);
        assert_eq!(n.condition.status, "False");
        assert!(
            n.condition.message.contains("circuit breaker open"),
            "{}",
            n.condition.message
        );
    }
    // Outside the window the drifts no longer count as a sudden wave, but the breaker latched:
    // it stays open (until #43 it closed itself here and cordoned all four drifted nodes).
    let mut inputs = PassInputs {
        breaker: p.breaker.clone(),
        ..PassInputs::default()
    };
    for t in [601, 3600, 86_400] {
        let p = step_with(&policy, &mut nodes, &mut inputs, at(t));
        assert!(p.circuit_open, "closed itself at t+{t}s");
        assert_eq!(p.nodes.iter().filter(|n| n.cordon == Some(true)).count(), 0);
    }
    // A person closes that trip (kubectl gpunode close-breaker): the queue moves.
    inputs.close_breaker = p.breaker.opened_at;
    let p = step_with(&policy, &mut nodes, &mut inputs, at(86_401));
    assert!(!p.circuit_open);
    assert_eq!(p.breaker.closed_by, Some(BreakerClosedBy::Person));
    assert_eq!(p.nodes.iter().filter(|n| n.cordon == Some(true)).count(), 4);
}

/// Plans with `inputs` and applies once, carrying the breaker forward as the status would.
fn step_with(
    policy: &GpuNodePolicySpec,
    nodes: &mut [NodeView],
    inputs: &mut PassInputs,
    now: Timestamp,
) -> gpunode_operator::plan::PolicyPlan {
    let p = plan_with("first", policy, nodes, inputs, now);
    support::apply(nodes, &p);
    inputs.breaker = p.breaker.clone();
    p
}

#[test]
fn an_open_breaker_outlasts_a_slow_ramp_and_a_stale_close() {
    let policy = policy(
        r#"
remediation:
  - {classes: [Driver], action: Cordon}
disruption:
  maxUnavailable: "100%"
  circuitBreaker: {maxDriftedPercent: 10, window: 1m}
"#,
    );
    let mut nodes: Vec<NodeView> = (0..10).map(|i| node(&format!("n{i}"))).collect();
    let mut inputs = PassInputs::default();
    // Two nodes drift within a minute: it opens.
    nodes[0].verdict = drifted(&[DriftClass::Driver]);
    step_with(&policy, &mut nodes, &mut inputs, at(0));
    nodes[1].verdict = drifted(&[DriftClass::Driver]);
    nodes[2].verdict = drifted(&[DriftClass::Driver]);
    let p = step_with(&policy, &mut nodes, &mut inputs, at(30));
    assert!(p.circuit_open);
    let opened = p.breaker.opened_at;
    // Then one more a minute, each alone in the window: still open, the same trip.
    for (i, n) in (3..8).enumerate() {
        nodes[n].verdict = drifted(&[DriftClass::Driver]);
        let t = 100 + 70 * i64::try_from(i).unwrap();
        let p = step_with(&policy, &mut nodes, &mut inputs, at(t));
        assert!(p.circuit_open, "closed at t+{t}s");
        assert_eq!(p.breaker.opened_at, opened);
        assert_eq!(of(&p, &format!("n{n}")).cordon, None);
    }
    // An annotation naming an earlier trip closes nothing.
    inputs.close_breaker = Some(at(-3600));
    assert!(step_with(&policy, &mut nodes, &mut inputs, at(1000)).circuit_open);
}

#[test]
fn an_automatic_breaker_closes_once_the_drifted_nodes_fall_under_the_threshold() {
    let policy = policy(
        r#"
remediation:
  - {classes: [Driver], action: Cordon}
disruption:
  maxUnavailable: "100%"
  circuitBreaker: {maxDriftedPercent: 20, window: 1m, reset: Automatic}
"#,
    );
    let mut nodes: Vec<NodeView> = (0..10).map(|i| node(&format!("n{i}"))).collect();
    for n in nodes.iter_mut().take(4) {
        n.verdict = drifted(&[DriftClass::Driver]);
    }
    let mut inputs = PassInputs::default();
    assert!(step_with(&policy, &mut nodes, &mut inputs, at(0)).circuit_open);
    let p = step_with(&policy, &mut nodes, &mut inputs, at(601));
    assert!(p.circuit_open, "four of ten still drift: above 20%");
    nodes[0].verdict = compliant();
    nodes[1].verdict = compliant();
    // Recovered nodes stay active for healthyFor (5m by default); then two drift: at 20%.
    let p = step_with(&policy, &mut nodes, &mut inputs, at(1000));
    assert!(!p.circuit_open);
    assert_eq!(p.breaker.closed_by, Some(BreakerClosedBy::Recovered));
    assert_eq!(of(&p, "n2").cordon, Some(true));
}

#[test]
fn the_fleet_cap_holds_nodes_beyond_it_counting_nodes_unavailable_for_any_reason() {
    let policy = policy(
        r#"
remediation:
  - {classes: [Driver], action: Cordon}
disruption:
  maxUnavailable: "100%"
  circuitBreaker: {maxDriftedPercent: 100}
"#,
    );
    let mut nodes: Vec<NodeView> = (0..6).map(|i| node(&format!("n{i}"))).collect();
    for n in nodes.iter_mut().take(4) {
        n.verdict = drifted(&[DriftClass::Driver]);
    }
    // Of a fleet capped at 3: another policy's node is NotReady, n5 was cordoned by a person.
    let fleet = |unavailable: &[&str]| Fleet {
        allowed: 3,
        unavailable: Arc::new(unavailable.iter().map(|s| s.to_string()).collect()),
    };
    let mut inputs = PassInputs {
        fleet: Some(fleet(&["other-notready", "n5"])),
        validation_bounds: None,
        ..PassInputs::default()
    };
    let p = step_with(&policy, &mut nodes, &mut inputs, at(0));
    let cordoned: Vec<&str> = p
        .nodes
        .iter()
        .filter(|n| n.cordon == Some(true))
        .map(|n| n.node.as_str())
        .collect();
    assert_eq!(cordoned, ["n0"], "one slot left of three");
    assert_eq!(p.fleet_taken, ["n0".to_string()]);
    assert_eq!(p.fleet_queued, 3);
    let n1 = of(&p, "n1");
    assert_eq!(
        n1.blocked,
        Some(Block::FleetCap {
            unavailable: 3,
            allowed: 3
        })
    );
    assert!(
        n1.condition.message.contains("fleet-wide disruption cap"),
        "{}",
        n1.condition.message
    );
    // The NotReady node comes back: one more slot.
    inputs.fleet = Some(fleet(&["n0", "n5"]));
    let p = step_with(&policy, &mut nodes, &mut inputs, at(10));
    assert_eq!(of(&p, "n1").cordon, Some(true));
    assert_eq!(p.fleet_queued, 2);
}

#[test]
fn a_conflicting_node_gets_labels_but_no_disruption() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].conflicts = vec!["other-policy".to_string()];
    nodes[0].verdict = drifted(&[DriftClass::Xid]);
    let p = step(&policy, &mut nodes, at(0));
    let a = of(&p, "a");
    assert!(a.write);
    assert_eq!(a.blocked, Some(Block::Conflict(vec!["other-policy".to_string()])));
    assert_eq!(a.cordon, None);
    assert_eq!(a.drain, DrainStep::None);
    assert_eq!(a.drifting, BTreeSet::from([DriftClass::Xid]));
}

#[test]
fn a_skipped_node_is_evaluated_but_never_written() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].skip = true;
    nodes[0].verdict = drifted(&[DriftClass::Xid]);
    let p = step(&policy, &mut nodes, at(0));
    let a = of(&p, "a");
    assert!(!a.write);
    assert_eq!(a.state, NodeState::Drifted);
    assert_eq!(a.blocked, Some(Block::Skip));
    assert!(!nodes[0].unschedulable);
}

#[test]
fn dry_run_lists_what_would_happen_and_does_nothing_disruptive() {
    let mut policy = ladder();
    policy.dry_run = true;
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Xid, DriftClass::Throttle]);
    step(&policy, &mut nodes, at(0));
    let p = step(&policy, &mut nodes, at(30));
    let a = of(&p, "a");
    assert!(a.write, "labels, condition and bookkeeping are still written");
    assert_eq!(a.blocked, Some(Block::DryRun));
    assert_eq!(
        a.pending,
        vec![
            Action::Taint(no_schedule("throttle")),
            Action::Cordon,
            Action::Drain
        ]
    );
    assert!(a.taints.is_empty() && a.cordon.is_none() && a.drain == DrainStep::None);
    assert!(a.condition.message.contains("dry run"));
}

#[test]
fn a_paused_policy_neither_acts_nor_undoes() {
    let mut policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Thermal]);
    step(&policy, &mut nodes, at(0));
    step(&policy, &mut nodes, at(30));
    assert_eq!(nodes[0].taints.len(), 1);
    policy.paused = true;
    nodes[0].verdict = compliant();
    let p = step(&policy, &mut nodes, at(1000));
    assert!(!of(&p, "a").write);
    assert_eq!(nodes[0].taints.len(), 1, "paused: the taint stays");
}

#[test]
fn a_hung_nvml_names_itself_in_the_condition_a_dead_probe_does_not() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    let reason = "nvml collector hung: an NVML call has not returned for 5.0s (deadline 5.0s)";
    nodes[0].verdict = Verdict::new(
        Vec::new(),
        ["collectors.nvml", "gpu.eccMode"]
            .map(|check| Unknown {
                check: check.to_string(),
                reason: reason.to_string(),
                gpu: None,
            })
            .to_vec(),
    );
    let p = step(&policy, &mut nodes, at(0));
    let a = of(&p, "a");
    assert_eq!(a.condition.status, "Unknown");
    assert_eq!(a.condition.reason, Reason::NvmlHung);
    assert!(
        a.condition.message.contains("nvml collector hung"),
        "{}",
        a.condition.message
    );
    assert!(a.actions.is_empty(), "unknown, not drifted: nothing is done");

    let mut nodes = vec![node("a")];
    nodes[0].verdict = stale();
    let p = step(&policy, &mut nodes, at(0));
    assert_eq!(of(&p, "a").condition.reason, Reason::Unknown);
}

#[test]
fn unknown_is_never_acted_on_unless_the_policy_lists_stale() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = stale();
    let p = step(&policy, &mut nodes, at(0));
    let p2 = step(&policy, &mut nodes, at(3600));
    for p in [&p, &p2] {
        let a = of(p, "a");
        assert_eq!(a.state, NodeState::Unknown);
        assert!(a.actions.is_empty() && a.pending.is_empty());
        assert_eq!(a.condition.status, "Unknown");
    }

    let explicit = policy_with_stale_rule();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = stale();
    step(&explicit, &mut nodes, at(0));
    let p = step(&explicit, &mut nodes, at(600));
    assert_eq!(of(&p, "a").cordon, Some(true));
}

fn policy_with_stale_rule() -> GpuNodePolicySpec {
    let mut p = ladder();
    p.remediation.push(RemediationRule {
        classes: vec![DriftClass::Stale],
        action: RemediationAction::Cordon,
        effect: None,
        after: gpunode_crds::Duration::from_secs(300),
        require_approval: false,
    });
    p
}

#[test]
fn unknown_does_not_count_as_recovery() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Thermal]);
    step(&policy, &mut nodes, at(0));
    step(&policy, &mut nodes, at(30));
    nodes[0].verdict = stale();
    step(&policy, &mut nodes, at(60));
    step(&policy, &mut nodes, at(3600));
    assert_eq!(nodes[0].taints.len(), 1, "no evidence of health, no undo");
}

#[test]
fn the_oldest_class_in_ladder_order_names_the_taint() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Throttle, DriftClass::Thermal]);
    step(&policy, &mut nodes, at(0));
    step(&policy, &mut nodes, at(30));
    let values: BTreeMap<TaintEffect, String> = nodes[0]
        .taints
        .iter()
        .map(|t| (t.effect, t.value.clone()))
        .collect();
    assert_eq!(
        values,
        BTreeMap::from([(TaintEffect::NoSchedule, "thermal".to_string())])
    );
}

#[test]
fn a_single_drifting_node_never_opens_the_breaker() {
    let policy = policy(
        r#"
remediation:
  - {classes: [Xid], action: Cordon}
"#,
    );
    let mut nodes = vec![node("only")];
    nodes[0].verdict = drifted(&[DriftClass::Xid]);
    let p = step(&policy, &mut nodes, at(0));
    assert!(!p.circuit_open);
    assert_eq!(of(&p, "only").cordon, Some(true));

    let mut three: Vec<NodeView> = (0..3).map(|i| node(&format!("n{i}"))).collect();
    for n in three.iter_mut().take(2) {
        n.verdict = drifted(&[DriftClass::Xid]);
    }
    let p = step(&policy, &mut three, at(0));
    assert!(
        p.circuit_open,
        "two of three is more than 30% and more than one node"
    );
}

#[test]
fn with_overlapping_policies_only_the_first_by_name_writes_a_node() {
    let policy = ladder();
    let mut a = node("a");
    a.conflicts = vec!["z-policy".to_string(), "b-policy".to_string()];
    a.verdict = drifted(&[DriftClass::Xid]);
    let first = plan("a-policy", &policy, std::slice::from_ref(&a), at(0));
    assert!(of(&first, "a").write);
    assert_eq!(of(&first, "a").defer_to, None);
    let later = plan("c-policy", &policy, std::slice::from_ref(&a), at(0));
    let np = of(&later, "a");
    assert!(!np.write, "a later policy writes nothing to the node");
    assert_eq!(
        np.defer_to.as_deref(),
        Some("b-policy"),
        "the first by name writes it"
    );
    // Both still hold back the disruption: the node is in conflict either way.
    for p in [&first, &later] {
        assert!(matches!(of(p, "a").blocked, Some(Block::Conflict(_))));
        assert_eq!(of(p, "a").cordon, None);
    }
}

#[test]
fn each_node_plan_says_when_it_next_changes_and_why() {
    use gpunode_operator::plan::{ChangeCause, DRAIN_REQUEUE, IDLE_REQUEUE, requeue_after};
    let policy = ladder();
    let secs = |d: gpunode_crds::Duration| i64::try_from(d.get().as_secs()).unwrap_or(i64::MAX);
    let healthy_for = secs(policy.recovery.healthy_for);
    let drain_timeout = secs(policy.disruption.drain.timeout);

    // Throttling: the taint rule's `after` (30 s) is the next change.
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Throttle]);
    let p = step(&policy, &mut nodes, at(0));
    let next = of(&p, "a")
        .next_change
        .unwrap_or_else(|| panic!("a change is due"));
    assert_eq!(next.at, at(30));
    assert_eq!(
        next.cause,
        ChangeCause::RuleAfter {
            class: DriftClass::Throttle,
            action: RemediationAction::Taint
        }
    );
    assert!(next.to_string().contains("after"), "{next}");
    assert_eq!(requeue_after(&p, at(0)), std::time::Duration::from_millis(30_100));
    // Tainted at 30 s, healthy again at 40 s: the undo comes `healthyFor` later.
    let p = step(&policy, &mut nodes, at(30));
    assert!(!of(&p, "a").taints.is_empty());
    nodes[0].verdict = compliant();
    let p = step(&policy, &mut nodes, at(40));
    let next = of(&p, "a")
        .next_change
        .unwrap_or_else(|| panic!("the undo is due"));
    assert_eq!(
        (next.at, next.cause),
        (
            at(40 + healthy_for),
            ChangeCause::HealthyFor(DriftClass::Throttle)
        )
    );
    // A report last heard from at 35 s goes stale before that, `staleAfter` later.
    let stale_after = secs(policy.stale_after);
    assert!(
        35 + stale_after < 40 + healthy_for,
        "the fixture's staleAfter is the shorter"
    );
    nodes[0].last_heard = Some(at(35));
    let p = plan("first", &policy, &nodes, at(41));
    let next = of(&p, "a")
        .next_change
        .unwrap_or_else(|| panic!("a change is due"));
    assert_eq!((next.at, next.cause), (at(35 + stale_after), ChangeCause::Stale));
    // Not one that has passed.
    nodes[0].last_heard = Some(at(41 - stale_after));
    let p = plan("first", &policy, &nodes, at(41));
    assert_eq!(
        of(&p, "a").next_change.map(|c| c.cause),
        Some(ChangeCause::HealthyFor(DriftClass::Throttle))
    );

    // A drain: its timeout is due, and the policy is looked at every few seconds meanwhile.
    let mut nodes = vec![node("b")];
    nodes[0].verdict = drifted(&[DriftClass::Xid]);
    let p = step(&policy, &mut nodes, at(0));
    let next = of(&p, "b")
        .next_change
        .unwrap_or_else(|| panic!("the drain timeout is due"));
    assert_eq!(
        (next.at, next.cause),
        (at(drain_timeout), ChangeCause::DrainTimeout)
    );
    assert_eq!(requeue_after(&p, at(0)), DRAIN_REQUEUE);

    // Compliant and never heard from: nothing is due; looked at again after the idle interval.
    let p = plan("first", &policy, &[node("c")], at(0));
    assert_eq!(of(&p, "c").next_change, None);
    assert_eq!(p.next_change(), None);
    assert_eq!(requeue_after(&p, at(0)), IDLE_REQUEUE);
}

#[test]
fn a_plan_keeps_what_was_in_effect_before_it() {
    let policy = ladder();
    let mut nodes = vec![node("a")];
    nodes[0].verdict = drifted(&[DriftClass::Xid]);
    let p = step(&policy, &mut nodes, at(0));
    let a = of(&p, "a");
    assert!(a.before.actions.is_empty() && !a.before.cordoned && a.before.drain == DrainStep::None);
    let after = a.after();
    assert!(after.cordoned, "{after:?}");
    assert!(matches!(after.drain, DrainStep::Run { .. }));
    assert_eq!(after.actions, [Action::Cordon, Action::Drain]);
    // Written: the next plan's `before` is the first one's `after`.
    let p = step(&policy, &mut nodes, at(1));
    let a = of(&p, "a");
    assert!(a.before.cordoned && matches!(a.before.drain, DrainStep::Run { .. }));
    assert_eq!(a.before.actions, [Action::Cordon, Action::Drain]);
}
