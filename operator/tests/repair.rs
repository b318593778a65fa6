//! The repair ladder after a drain (`spec.repair`), one behaviour per test, through the same
//! apply-back loop as the planner's tests, plus what the applier records: a drain that found
//! nothing left to evict, and a step's object once it exists.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use gpunode_operator::{
    markers::{REPAIR_ANNOTATION, ResetGpu, StepOutcome},
    plan::{
        ChangeCause, DrainStep, GpuPods, GpuView, MadeFrom, NodeDevices, NodeView, PodRef, PolicyPlan,
        RepairState, StepObject, plan, repair::fold,
    },
    reasons::Reason,
    verdict::{Drift, Verdict},
};
use jiff::{SignedDuration, Timestamp};

mod support;
use support::{of, step};

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_790_000_000).unwrap() + SignedDuration::from_secs(secs)
}

fn policy(extra: &str) -> GpuNodePolicySpec {
    let yaml = format!(
        r#"
remediation:
  - {{classes: [Xid, Memory, Driver], action: Drain}}
disruption:
  maxUnavailable: 1
  circuitBreaker: {{maxDriftedPercent: 100}}
recovery: {{healthyFor: 60s}}
repair:
  steps:
    - name: reboot
      action: Remediator
      classes: [Xid, Memory]
      timeout: 10m
      remediator: {{apiVersion: remediation.example.com/v1, kind: RebootTemplate, name: reboot, namespace: ops}}
    - name: replace
      action: Remediator
      classes: [Xid, Memory]
      timeout: 30m
      remediator: {{apiVersion: remediation.example.com/v1, kind: ReplaceTemplate, name: replace, namespace: ops}}
{extra}"#
    );
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("policy fixture: {e}\n{yaml}"))
}

fn drifted(class: DriftClass) -> Verdict {
    Verdict::new(
        vec![Drift {
            class,
            check: "gpu.xid".to_string(),
            expected: "none".to_string(),
            actual: "79".to_string(),
            gpu: Some(0),
            device: None,
        }],
        Vec::new(),
    )
}

/// A node whose probe was last heard from at `heard`.
fn node(verdict: Verdict, heard: Timestamp) -> NodeView {
    NodeView::new("gpu-1", verdict).heard_at(Some(heard))
}

/// Plans once and applies it back as the applier does: a drain that runs finds nothing left
/// to evict, and a step's object that is made is recorded as made.
fn pass(policy: &GpuNodePolicySpec, nodes: &mut [NodeView], now: Timestamp) -> PolicyPlan {
    let p = step(policy, nodes, now);
    let np = of(&p, "gpu-1");
    let n = &mut nodes[0];
    if np.write && matches!(np.drain, DrainStep::Run { .. }) {
        n.markers.drained = Some(now);
    }
    if np.write
        && !np.repair.ensure.is_empty()
        && let Some(s) = n.markers.repair.step.as_mut()
    {
        s.created = true;
    }
    p
}

/// Drifts and is drained at 0: the first step starts at the next pass.
fn drained(policy: &GpuNodePolicySpec) -> Vec<NodeView> {
    let mut nodes = vec![node(drifted(DriftClass::Xid), at(0))];
    let p = pass(policy, &mut nodes, at(0));
    assert!(
        matches!(of(&p, "gpu-1").drain, DrainStep::Run { .. }),
        "not draining"
    );
    assert!(nodes[0].markers.drained.is_some(), "not drained");
    nodes
}

fn look(nodes: &mut [NodeView], object: StepObject) {
    nodes[0].repair_object = Some(object);
}

fn events(p: &PolicyPlan) -> Vec<(Reason, String)> {
    of(p, "gpu-1")
        .events
        .iter()
        .map(|e| (e.reason, e.note.clone()))
        .collect()
}

#[test]
fn a_drained_node_that_still_drifts_starts_the_first_step_and_makes_its_object_once() {
    let policy = policy("");
    let mut nodes = vec![node(drifted(DriftClass::Xid), at(0))];
    let p = pass(&policy, &mut nodes, at(0));
    assert_eq!(
        of(&p, "gpu-1").repair.state,
        RepairState::Idle,
        "no step while draining"
    );
    assert!(of(&p, "gpu-1").repair.ensure.is_empty());

    let p = pass(&policy, &mut nodes, at(2));
    let np = of(&p, "gpu-1");
    assert_eq!(
        np.repair.state,
        RepairState::Running {
            step: "reboot".to_string(),
            since: at(2)
        }
    );
    let e = np.repair.ensure.first().expect("the step's object is made");
    assert_eq!(e.object.to_string(), "Reboot ops/gpu-1");
    assert_eq!(e.started, at(2));
    assert_eq!(np.condition.reason, Reason::Repairing);
    assert!(
        np.condition.message.contains("repair step reboot running since"),
        "{}",
        np.condition.message
    );
    let started = events(&p);
    assert!(
        started.iter().any(|(r, n)| *r == Reason::RepairStarted
            && n.contains("creating Reboot ops/gpu-1 (attempt 1 of 2 within 24h; timeout 10m)")),
        "{started:?}"
    );
    assert!(np.markers.to_annotations().contains_key(REPAIR_ANNOTATION));
    assert_eq!(np.repair.deadline, Some(at(2 + 600)));
    // The report goes stale first (180 s after the probe was heard from at 0).
    assert_eq!(np.next_change.map(|c| c.cause), Some(ChangeCause::Stale));
    nodes[0].last_heard = Some(at(590));
    let p = plan("p", &policy, &nodes, at(595));
    assert_eq!(
        of(&p, "gpu-1").next_change.map(|c| (c.at, c.cause)),
        Some((at(2 + 600), ChangeCause::RepairTimeout))
    );

    // Made and running: nothing is made again, no event repeats.
    look(&mut nodes, StepObject::Running);
    let p = pass(&policy, &mut nodes, at(30));
    let np = of(&p, "gpu-1");
    assert!(np.repair.ensure.is_empty());
    assert!(np.events.is_empty(), "{:?}", np.events);
    assert!(np.repair.polls());
}

#[test]
fn a_step_recorded_but_not_made_is_made_and_one_made_by_a_stopped_leader_is_ensured_to_be_adopted() {
    let policy = policy("");
    let mut nodes = drained(&policy);
    // The step's start was recorded; the leader stopped before making the object.
    let p = plan("p", &policy, &nodes, at(2));
    support::apply(&mut nodes, &p);
    assert!(!nodes[0].markers.repair.step.as_ref().unwrap().created);
    look(&mut nodes, StepObject::Absent);
    let p = plan("p", &policy, &nodes, at(5));
    let np = of(&p, "gpu-1");
    assert!(!np.repair.ensure.is_empty(), "an object never made is made");
    assert!(
        !events(&p).iter().any(|(r, _)| *r == Reason::RepairStarted),
        "not a second start"
    );
    assert_eq!(np.markers.repair.attempts.len(), 1, "not a second attempt");

    // It was made, but the leader stopped before recording that: ensured again, so that the
    // apply's create finds it, adopts it (made at this step's start, not made twice) and
    // records its making with its uid; neither a second attempt nor a second start.
    look(&mut nodes, StepObject::Running);
    let p = plan("p", &policy, &nodes, at(6));
    let np = of(&p, "gpu-1");
    assert!(
        !np.repair.ensure.is_empty(),
        "ensured, to be recorded with its uid"
    );
    assert_eq!(np.markers.repair.attempts.len(), 1, "not a second attempt");
    assert!(
        !events(&p).iter().any(|(r, _)| *r == Reason::RepairStarted),
        "not a second start"
    );
}

#[test]
fn a_succeeded_step_waits_for_a_report_after_it_then_moves_on_while_the_node_still_drifts() {
    let policy = policy("");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    look(&mut nodes, StepObject::Succeeded(None));
    let p = pass(&policy, &mut nodes, at(40));
    let np = of(&p, "gpu-1");
    assert_eq!(
        np.repair.state,
        RepairState::AwaitingReport {
            step: "reboot".to_string()
        }
    );
    assert_eq!(
        np.repair.ended.as_ref().map(|e| e.1),
        Some(StepOutcome::Succeeded)
    );
    assert!(
        events(&p)
            .iter()
            .any(|(r, n)| *r == Reason::RepairSucceeded
                && n.contains("Reboot ops/gpu-1 reports Succeeded=True")),
        "{:?}",
        events(&p)
    );
    assert_eq!(np.condition.reason, Reason::Drained);

    // The report from before the step says nothing; a later one that still drifts moves on.
    nodes[0].repair_object = None;
    let p = pass(&policy, &mut nodes, at(45));
    assert!(matches!(
        of(&p, "gpu-1").repair.state,
        RepairState::AwaitingReport { .. }
    ));
    nodes[0].last_heard = Some(at(50));
    let p = pass(&policy, &mut nodes, at(51));
    let np = of(&p, "gpu-1");
    assert_eq!(
        np.repair.state,
        RepairState::Running {
            step: "replace".to_string(),
            since: at(51)
        }
    );
    assert_eq!(
        np.repair.ensure.first().unwrap().object.to_string(),
        "Replace ops/gpu-1"
    );
}

#[test]
fn a_repaired_node_recovers_as_usual_and_its_objects_are_deleted() {
    let policy = policy("");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    look(&mut nodes, StepObject::Absent);
    let p = pass(&policy, &mut nodes, at(40));
    assert!(
        events(&p)
            .iter()
            .any(|(r, n)| *r == Reason::RepairSucceeded && n.contains("was deleted by its remediator")),
        "deleted by its remediator counts as finished: {:?}",
        events(&p)
    );
    nodes[0].repair_object = None;
    nodes[0].verdict = Verdict::new(Vec::new(), Vec::new());
    nodes[0].last_heard = Some(at(50));
    let p = pass(&policy, &mut nodes, at(50));
    let np = of(&p, "gpu-1");
    assert_eq!(np.repair.state, RepairState::Idle, "compliant: no next step");
    assert!(np.markers.cordoned_by_us, "still cordoned until healthyFor");
    assert!(np.repair.delete.is_empty());

    let p = pass(&policy, &mut nodes, at(111));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, Some(false), "released after healthyFor");
    assert_eq!(
        np.repair
            .delete
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        vec!["Reboot ops/gpu-1"]
    );
    assert!(np.markers.repair.step.is_none());
    assert_eq!(
        np.markers.repair.attempts,
        vec![at(2)],
        "attempts are kept for the window"
    );
}

#[test]
fn a_failed_step_moves_to_the_next_at_once() {
    let policy = policy("");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    look(
        &mut nodes,
        StepObject::Failed("Reboot gpu-1 reports Succeeded=False: BMC unreachable".to_string()),
    );
    let p = pass(&policy, &mut nodes, at(20));
    let np = of(&p, "gpu-1");
    assert_eq!(np.repair.ended.as_ref().map(|e| e.1), Some(StepOutcome::Failed));
    assert!(matches!(&np.repair.state, RepairState::Running { step, .. } if step == "replace"));
    let seen = events(&p);
    assert!(
        seen.iter()
            .any(|(r, n)| *r == Reason::RepairFailed && n.contains("BMC unreachable")),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|(r, n)| *r == Reason::RepairStarted && n.contains("attempt 2 of 2"))
    );
}

#[test]
fn a_template_that_cannot_be_used_fails_its_step() {
    let policy = policy("");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    look(
        &mut nodes,
        StepObject::Unavailable("the template RebootTemplate ops/reboot does not exist".to_string()),
    );
    let p = pass(&policy, &mut nodes, at(3));
    assert!(
        events(&p)
            .iter()
            .any(|(r, n)| *r == Reason::RepairFailed && n.contains("does not exist")),
        "{:?}",
        events(&p)
    );
}

#[test]
fn a_step_that_never_finishes_times_out_and_the_next_starts() {
    let policy = policy("");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    look(&mut nodes, StepObject::Running);
    let p = pass(&policy, &mut nodes, at(2 + 599));
    assert!(matches!(&of(&p, "gpu-1").repair.state, RepairState::Running { step, .. } if step == "reboot"));
    let p = pass(&policy, &mut nodes, at(2 + 600));
    let np = of(&p, "gpu-1");
    assert_eq!(np.repair.ended.as_ref().map(|e| e.1), Some(StepOutcome::TimedOut));
    assert!(
        events(&p)
            .iter()
            .any(|(r, n)| *r == Reason::RepairTimedOut && n.contains("timeout of 10m")),
        "{:?}",
        events(&p)
    );
    assert!(matches!(&np.repair.state, RepairState::Running { step, .. } if step == "replace"));
}

#[test]
fn a_succeeded_step_without_a_report_before_its_timeout_counts_as_timed_out() {
    let policy = policy("");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    look(&mut nodes, StepObject::Succeeded(None));
    pass(&policy, &mut nodes, at(40));
    nodes[0].repair_object = None;
    let p = pass(&policy, &mut nodes, at(2 + 600));
    let np = of(&p, "gpu-1");
    assert!(
        events(&p)
            .iter()
            .any(|(r, n)| *r == Reason::RepairTimedOut && n.contains("no report")),
        "{:?}",
        events(&p)
    );
    assert!(matches!(&np.repair.state, RepairState::Running { step, .. } if step == "replace"));
}

#[test]
fn a_node_that_used_its_attempts_needs_a_person_and_stays_cordoned() {
    let policy = policy("  maxAttempts: 1\n  window: 1h\n");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    look(&mut nodes, StepObject::Failed("no".to_string()));
    let p = pass(&policy, &mut nodes, at(10));
    let np = of(&p, "gpu-1");
    assert!(
        matches!(&np.repair.state, RepairState::NeedsHuman(why) if why.contains("used its 1 repair attempts within 1h"))
    );
    assert_eq!(np.condition.reason, Reason::NeedsHuman);
    assert!(np.markers.cordoned_by_us);
    assert!(np.repair.ensure.is_empty());
    assert!(
        events(&p).iter().any(|(r, n)| *r == Reason::NeedsHuman
            && n.contains("kubectl annotate node gpu-1 gpunode.dev/repair-")),
        "{:?}",
        events(&p)
    );
    // It stays so, with no second event.
    nodes[0].repair_object = None;
    let p = pass(&policy, &mut nodes, at(4000));
    assert_eq!(of(&p, "gpu-1").condition.reason, Reason::NeedsHuman);
    assert!(events(&p).is_empty(), "{:?}", events(&p));
}

#[test]
fn a_node_whose_steps_were_all_tried_needs_a_person() {
    let policy = policy("  maxAttempts: 5\n");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    look(&mut nodes, StepObject::Failed("no".to_string()));
    pass(&policy, &mut nodes, at(3));
    look(&mut nodes, StepObject::Failed("no".to_string()));
    let p = pass(&policy, &mut nodes, at(4));
    assert!(
        matches!(&of(&p, "gpu-1").repair.state, RepairState::NeedsHuman(why) if why.contains("every repair step for Xid was tried")),
        "{:?}",
        of(&p, "gpu-1").repair.state
    );
}

/// A node drained for a Driver drift, which no step repairs, after the pass that stopped for a
/// person: the nodes and that pass's plan.
fn stopped_for_a_person(policy: &GpuNodePolicySpec) -> (Vec<NodeView>, PolicyPlan) {
    let mut nodes = vec![node(drifted(DriftClass::Driver), at(0))];
    pass(policy, &mut nodes, at(0));
    let p = pass(policy, &mut nodes, at(1));
    (nodes, p)
}

#[test]
fn only_steps_that_repair_the_drifting_class_run() {
    let (_, p) = stopped_for_a_person(&policy(""));
    let np = of(&p, "gpu-1");
    assert!(
        matches!(&np.repair.state, RepairState::NeedsHuman(why) if why == "no repair step repairs Driver"),
        "{:?}",
        np.repair.state
    );
    assert!(np.repair.ensure.is_empty());
    assert!(np.markers.repair.attempts.is_empty());
}

#[test]
fn a_stop_ends_when_the_node_recovers_and_a_later_drift_climbs_the_ladder() {
    let policy = policy("");
    let (mut nodes, p) = stopped_for_a_person(&policy);
    assert!(matches!(
        &of(&p, "gpu-1").repair.state,
        RepairState::NeedsHuman(_)
    ));
    // The driver is fixed: the report is compliant, the node still drained (healthyFor).
    nodes[0].verdict = Verdict::new(Vec::new(), Vec::new());
    nodes[0].last_heard = Some(at(10));
    let p = pass(&policy, &mut nodes, at(10));
    let np = of(&p, "gpu-1");
    assert_eq!(np.repair.state, RepairState::Idle);
    assert!(np.markers.repair.needs_human.is_none(), "the stop is forgotten");
    assert!(np.markers.cordoned_by_us, "still cordoned until healthyFor");
    // Before it returns, an XID: the ladder starts, not the old stop.
    nodes[0].verdict = drifted(DriftClass::Xid);
    nodes[0].last_heard = Some(at(20));
    let p = pass(&policy, &mut nodes, at(20));
    assert!(
        matches!(&of(&p, "gpu-1").repair.state, RepairState::Running { step, .. } if step == "reboot"),
        "{:?}",
        of(&p, "gpu-1").repair.state
    );
}

#[test]
fn pause_and_an_open_breaker_hold_the_next_step_and_say_so() {
    let mut paused = policy("");
    let mut nodes = drained(&paused);
    paused.paused = true;
    let p = pass(&paused, &mut nodes, at(2));
    let np = of(&p, "gpu-1");
    assert!(!np.write);
    assert!(matches!(&np.repair.state, RepairState::Waiting { step, .. } if step == "reboot"));

    let open = policy("");
    let mut nodes = drained(&open);
    let mut breaker = open.clone();
    breaker.disruption.circuit_breaker.max_drifted_percent = 0;
    let mut other = node(drifted(DriftClass::Xid), at(0));
    other.name = "gpu-2".to_string();
    nodes.push(other);
    let p = plan("p", &breaker, &nodes, at(2));
    let np = of(&p, "gpu-1");
    assert!(p.circuit_open);
    assert!(np.repair.ensure.is_empty());
    assert!(
        np.condition
            .message
            .contains("repair step reboot waiting (circuit breaker open; it stays open until a person closes it; close it with: kubectl gpunode close-breaker p"),
        "{}",
        np.condition.message
    );
}

#[test]
fn attempts_outside_the_window_are_forgotten() {
    let policy = policy("  maxAttempts: 1\n  window: 1h\n");
    let mut nodes = drained(&policy);
    nodes[0].markers.repair.attempts = vec![at(-3600)];
    let p = pass(&policy, &mut nodes, at(2));
    assert!(matches!(
        &of(&p, "gpu-1").repair.state,
        RepairState::Running { .. }
    ));
    assert_eq!(of(&p, "gpu-1").markers.repair.attempts, vec![at(2)]);
}

#[test]
fn a_person_who_uncordons_ends_the_repair_and_its_objects_go() {
    let policy = policy("");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    nodes[0].unschedulable = false;
    look(&mut nodes, StepObject::Running);
    let p = pass(&policy, &mut nodes, at(10));
    let np = of(&p, "gpu-1");
    assert_eq!(np.repair.state, RepairState::Idle);
    assert_eq!(np.repair.delete.len(), 1);
    assert!(np.repair.ensure.is_empty());
}

#[test]
fn a_report_between_the_remediators_success_and_the_next_look_counts_as_after_it() {
    let policy = policy("");
    let mut nodes = drained(&policy);
    pass(&policy, &mut nodes, at(2));
    // Succeeded at 35 by its own clock; the rebooted node reported at 38; looked at at 40.
    look(&mut nodes, StepObject::Succeeded(Some(at(35))));
    nodes[0].last_heard = Some(at(38));
    let p = pass(&policy, &mut nodes, at(40));
    let np = of(&p, "gpu-1");
    assert!(
        matches!(&np.repair.state, RepairState::Running { step, .. } if step == "replace"),
        "still drifted after the report that followed the step: {:?}",
        np.repair.state
    );
}

#[test]
fn a_dry_run_lists_the_step_that_would_follow_the_drain() {
    let mut policy = policy("");
    policy.dry_run = true;
    let mut nodes = vec![node(drifted(DriftClass::Xid), at(0))];
    let p = pass(&policy, &mut nodes, at(0));
    let np = of(&p, "gpu-1");
    assert!(np.pending.contains(&gpunode_operator::plan::Action::Drain));
    assert!(
        matches!(&np.repair.state, RepairState::Waiting { step, block: gpunode_operator::plan::Block::DryRun } if step == "reboot"),
        "{:?}",
        np.repair.state
    );
    assert!(np.repair.ensure.is_empty());
    assert!(
        np.markers.repair.attempts.is_empty(),
        "nothing is started in a dry run"
    );
}

/// A ladder that resets the drifting GPUs first, then hands the node to a remediator.
fn reset_policy() -> GpuNodePolicySpec {
    policy("").tap_steps(|steps| {
        let reset: gpunode_crds::repair::RepairStep =
            serde_yaml::from_str("{name: gpu-reset, action: GpuReset, classes: [Xid, Memory], timeout: 5m}")
                .unwrap();
        steps.insert(0, reset);
    })
}

trait TapSteps {
    fn tap_steps(self, f: impl FnOnce(&mut Vec<gpunode_crds::repair::RepairStep>)) -> Self;
}

impl TapSteps for GpuNodePolicySpec {
    fn tap_steps(mut self, f: impl FnOnce(&mut Vec<gpunode_crds::repair::RepairStep>)) -> Self {
        f(&mut self.repair.as_mut().unwrap().steps);
        self
    }
}

fn with_gpus(mut nodes: Vec<NodeView>) -> Vec<NodeView> {
    let gpus = (0..4)
        .map(|index| GpuView {
            index,
            uuid: Some(format!("GPU-0000000{index}")),
            recovery_action: None,
        })
        .collect::<Vec<_>>();
    nodes[0] = nodes[0].clone().with_gpus(gpus, NodeDevices::Unknown);
    nodes
}

#[test]
fn a_gpu_reset_step_skips_a_gpu_whose_recovery_action_is_a_node_reboot() {
    use gpunode_crds::GpuRecoveryAction;
    let policy = reset_policy();
    let mut nodes = drained(&policy);
    let gpus = (0..4)
        .map(|index| GpuView {
            index,
            uuid: Some(format!("GPU-0000000{index}")),
            recovery_action: Some(if index == 0 {
                GpuRecoveryAction::NodeReboot
            } else {
                GpuRecoveryAction::None
            }),
        })
        .collect::<Vec<_>>();
    nodes[0] = nodes[0].clone().with_gpus(gpus, NodeDevices::Unknown);
    nodes[0].verdict = drifted(DriftClass::Xid);
    let p = pass(&policy, &mut nodes, at(2));
    let np = of(&p, "gpu-1");
    assert_eq!(
        np.repair.state,
        RepairState::Running {
            step: "reboot".to_string(),
            since: at(2)
        },
        "GPU 0 asks for a reboot: the reset step has nothing to reset, the reboot is next"
    );
    assert!(
        np.repair
            .ensure
            .iter()
            .all(|e| !e.object.to_string().contains("GpuResetRequest")),
        "{:?}",
        np.repair.ensure
    );

    // The same GPU asking for a reset (or nothing) gets the reset step.
    let mut nodes = with_gpus(drained(&policy));
    nodes[0].verdict = drifted(DriftClass::Xid);
    let p = pass(&policy, &mut nodes, at(2));
    assert!(
        matches!(&of(&p, "gpu-1").repair.state, RepairState::Running { step, .. } if step == "gpu-reset")
    );
}

#[test]
fn a_gpu_reset_step_asks_the_probe_to_reset_each_drifting_gpu_by_index_and_uuid() {
    let policy = reset_policy();
    let mut nodes = with_gpus(drained(&policy));
    let mut verdict = drifted(DriftClass::Xid);
    verdict.drifts.push(Drift {
        class: DriftClass::Memory,
        check: "gpu.rowRemapPending".to_string(),
        expected: "false".to_string(),
        actual: "true".to_string(),
        gpu: Some(2),
        device: None,
    });
    // Not a class the step repairs: GPU 3's throttle is left alone.
    verdict.drifts.push(Drift {
        class: DriftClass::Thermal,
        check: "cooling.forbiddenThrottleReasons".to_string(),
        expected: "none".to_string(),
        actual: "HwThermalSlowdown".to_string(),
        gpu: Some(3),
        device: None,
    });
    nodes[0].verdict = verdict;
    let p = pass(&policy, &mut nodes, at(2));
    let np = of(&p, "gpu-1");
    assert_eq!(
        np.repair.state,
        RepairState::Running {
            step: "gpu-reset".to_string(),
            since: at(2)
        }
    );
    let made: Vec<String> = np.repair.ensure.iter().map(|e| e.object.to_string()).collect();
    assert_eq!(
        made,
        ["GpuResetRequest gpu-1-gpu-0", "GpuResetRequest gpu-1-gpu-2"]
    );
    assert_eq!(
        np.repair
            .ensure
            .iter()
            .map(|e| e.made_from.clone())
            .collect::<Vec<_>>(),
        [0, 2]
            .map(|index| MadeFrom::GpuReset(ResetGpu {
                index,
                uuid: format!("GPU-0000000{index}")
            }))
            .to_vec()
    );
    let run = np.markers.repair.step.as_ref().unwrap();
    assert_eq!(
        run.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
        [0, 2],
        "the GPUs are chosen once, at the start"
    );
    assert!(
        events(&p).iter().any(|(r, n)| *r == Reason::RepairStarted
            && n.contains(
                "repair step gpu-reset started: creating GpuResetRequest gpu-1-gpu-0, gpu-1-gpu-2"
            )),
        "{:?}",
        events(&p)
    );

    // The probe failed one: the step fails at once, and the remediator is next.
    look(
        &mut nodes,
        StepObject::Failed("gpu-1-gpu-2 reports Succeeded=False (InUse): GPU 2 is in use".to_string()),
    );
    let p = pass(&policy, &mut nodes, at(20));
    let np = of(&p, "gpu-1");
    assert!(
        events(&p)
            .iter()
            .any(|(r, n)| *r == Reason::RepairFailed && n.contains("in use")),
        "{:?}",
        events(&p)
    );
    assert_eq!(
        np.repair.state,
        RepairState::Running {
            step: "reboot".to_string(),
            since: at(20)
        }
    );
}

#[test]
fn a_reset_request_deleted_under_the_step_fails_it() {
    let policy = reset_policy();
    let mut nodes = with_gpus(drained(&policy));
    pass(&policy, &mut nodes, at(2));
    look(&mut nodes, StepObject::Absent);
    let p = pass(&policy, &mut nodes, at(30));
    assert!(
        events(&p).iter().any(|(r, n)| *r == Reason::RepairFailed
            && n.contains("GpuResetRequest gpu-1-gpu-0 was deleted before the probe finished")),
        "{:?}",
        events(&p)
    );
}

#[test]
fn a_node_wide_drift_or_a_gpu_without_uuid_skips_the_gpu_reset_step() {
    let policy = reset_policy();
    // GPU 0 drifts, but the report gives it no UUID: never reset by index alone.
    let mut nodes = drained(&policy);
    let p = pass(&policy, &mut nodes, at(2));
    assert_eq!(
        of(&p, "gpu-1").repair.state,
        RepairState::Running {
            step: "reboot".to_string(),
            since: at(2)
        }
    );
    // A node-wide drift (no GPU) in a class the reset lists.
    let mut verdict = drifted(DriftClass::Xid);
    verdict.drifts[0].gpu = None;
    let mut nodes = with_gpus(drained(&policy));
    nodes[0].verdict = verdict;
    let p = pass(&policy, &mut nodes, at(2));
    assert!(matches!(
        &of(&p, "gpu-1").repair.state,
        RepairState::Running { step, .. } if step == "reboot"
    ));
}

#[test]
fn the_objects_of_a_step_stand_together() {
    let t = |s: i64| Some(at(s));
    assert_eq!(fold(Vec::new()), StepObject::Absent);
    assert_eq!(
        fold(vec![StepObject::Succeeded(t(5)), StepObject::Succeeded(t(9))]),
        StepObject::Succeeded(t(9)),
        "succeeded when the last did"
    );
    assert_eq!(
        fold(vec![StepObject::Succeeded(t(5)), StepObject::Succeeded(None)]),
        StepObject::Succeeded(None),
        "a success without a time is now"
    );
    assert_eq!(
        fold(vec![StepObject::Succeeded(t(5)), StepObject::Running]),
        StepObject::Running
    );
    assert_eq!(
        fold(vec![StepObject::Running, StepObject::Absent]),
        StepObject::Absent,
        "one not made yet is made"
    );
    assert_eq!(
        fold(vec![
            StepObject::Failed("a".into()),
            StepObject::Absent,
            StepObject::Failed("b".into())
        ]),
        StepObject::Failed("a; b".into())
    );
    assert_eq!(
        fold(vec![
            StepObject::Failed("a".into()),
            StepObject::Unavailable("gone".into())
        ]),
        StepObject::Unavailable("gone".into())
    );
}

/// GPU 5's fatal XID quarantines the GPU (NoExecute) instead of draining the node; a driver
/// mismatch drains it. Device-plugin node: the report says which pods hold each GPU.
fn quarantine_policy(steps: &str) -> GpuNodePolicySpec {
    let yaml = format!(
        r#"
remediation:
  - {{classes: [Xid, Memory], action: TaintDevice, effect: NoExecute}}
  - {{classes: [Driver], action: Drain}}
quarantine: {{maxGpusPerNode: 2}}
disruption:
  maxUnavailable: 1
  circuitBreaker: {{maxDriftedPercent: 100}}
recovery: {{healthyFor: 60s}}
repair:
  steps:
{steps}
"#
    );
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("policy fixture: {e}\n{yaml}"))
}

const RESET_THEN_REBOOT: &str = r#"    - {name: gpu-reset, action: GpuReset, classes: [Xid, Memory], timeout: 5m}
    - name: reboot
      action: Remediator
      classes: [Xid, Memory]
      remediator: {apiVersion: remediation.example.com/v1, kind: RebootTemplate, name: reboot, namespace: ops}"#;

/// An 8-GPU device-plugin node whose GPU 5 has a fatal XID; `holders` hold GPU 5.
fn quarantine_node(holders: Vec<PodRef>) -> Vec<NodeView> {
    let uuid = |i: u32| format!("GPU-0000000{i}");
    let gpus = (0..8)
        .map(|index| GpuView {
            index,
            uuid: Some(uuid(index)),
            recovery_action: None,
        })
        .collect::<Vec<_>>();
    let by_gpu = (0..8)
        .map(|i| (uuid(i), if i == 5 { holders.clone() } else { Vec::new() }))
        .collect();
    let mut verdict = drifted(DriftClass::Xid);
    verdict.drifts[0].gpu = Some(5);
    vec![node(verdict, at(0)).with_gpus(gpus, NodeDevices::DevicePlugin(Some(GpuPods::new(by_gpu))))]
}

#[test]
fn a_quarantined_gpu_no_pod_holds_is_reset_in_place_and_the_node_is_never_drained_for_it() {
    let policy = quarantine_policy(RESET_THEN_REBOOT);
    let mut nodes = quarantine_node(Vec::new());
    let p = pass(&policy, &mut nodes, at(0));
    let np = of(&p, "gpu-1");
    assert_eq!(np.drain, DrainStep::None, "a GPU fault does not drain the node");
    assert_ne!(np.cordon, Some(true));
    let made: Vec<String> = np.repair.ensure.iter().map(|e| e.object.to_string()).collect();
    assert_eq!(
        made,
        ["GpuResetRequest gpu-1-gpu-5"],
        "only the quarantined GPU is reset"
    );
    assert!(matches!(&np.repair.state, RepairState::Running { step, .. } if step == "gpu-reset"));

    // The reset fails: the reboot is for a drained node, so the quarantine stays and a person
    // is asked for; the node is still not cordoned.
    look(&mut nodes, StepObject::Failed("GPU 5 is in use".to_string()));
    let p = pass(&policy, &mut nodes, at(10));
    let np = of(&p, "gpu-1");
    assert!(
        matches!(&np.repair.state, RepairState::NeedsHuman(why) if why.contains("every repair step for Xid was tried")),
        "{:?}",
        np.repair.state
    );
    assert_ne!(np.cordon, Some(true));
    assert!(np.repair.ensure.is_empty());
    assert!(
        events(&p)
            .iter()
            .any(|(r, n)| *r == Reason::NeedsHuman && n.contains("its quarantined GPUs stay quarantined")),
        "{:?}",
        events(&p)
    );
}

#[test]
fn a_quarantined_gpu_that_recovers_after_its_reset_ends_the_repair() {
    let policy = quarantine_policy(RESET_THEN_REBOOT);
    let mut nodes = quarantine_node(Vec::new());
    pass(&policy, &mut nodes, at(0));
    look(&mut nodes, StepObject::Succeeded(Some(at(5))));
    let p = pass(&policy, &mut nodes, at(6));
    assert!(matches!(
        &of(&p, "gpu-1").repair.state,
        RepairState::AwaitingReport { .. }
    ));
    // The probe's report after the reset: the GPU is clean.
    nodes[0].repair_object = None;
    nodes[0].verdict = Verdict::new(Vec::new(), Vec::new());
    nodes[0].last_heard = Some(at(8));
    let p = pass(&policy, &mut nodes, at(8));
    let np = of(&p, "gpu-1");
    assert_eq!(np.repair.state, RepairState::Idle, "nothing left to repair");
    assert!(!events(&p).iter().any(|(r, _)| *r == Reason::NeedsHuman));
    // The quarantine goes after healthyFor; with it the request.
    let p = pass(&policy, &mut nodes, at(80));
    let np = of(&p, "gpu-1");
    assert!(np.quarantines.is_empty(), "{:?}", np.quarantines);
    assert_eq!(
        np.repair
            .delete
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["GpuResetRequest gpu-1-gpu-5"]
    );
}

#[test]
fn a_quarantined_gpu_a_pod_still_holds_or_a_ladder_without_a_reset_leaves_the_quarantine_alone() {
    let held = vec![PodRef {
        namespace: "train".to_string(),
        name: "job-0".to_string(),
    }];
    let policy = quarantine_policy(RESET_THEN_REBOOT);
    let mut nodes = quarantine_node(held);
    let p = pass(&policy, &mut nodes, at(0));
    let np = of(&p, "gpu-1");
    assert!(!np.quarantines.is_empty());
    assert_eq!(
        np.repair.state,
        RepairState::Idle,
        "not while a pod holds the GPU"
    );
    assert!(np.repair.ensure.is_empty());

    let reboot_only = quarantine_policy(
        r#"    - name: reboot
      action: Remediator
      classes: [Xid, Memory]
      remediator: {apiVersion: remediation.example.com/v1, kind: RebootTemplate, name: reboot, namespace: ops}"#,
    );
    let mut nodes = quarantine_node(Vec::new());
    let p = pass(&reboot_only, &mut nodes, at(0));
    let np = of(&p, "gpu-1");
    assert_eq!(
        np.repair.state,
        RepairState::Idle,
        "no NeedsHuman for a plain quarantine"
    );
    assert!(np.events.iter().all(|e| e.reason != Reason::NeedsHuman));
}
