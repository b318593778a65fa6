//! Manual approval (`requireApproval` on remediation rules and repair steps) in the planner: a
//! rung waits for the node annotation `gpunode.dev/approve` naming it, and says how to give it
//! in the condition and one event; what is in effect already stays when the approval goes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use gpunode_operator::{
    plan::{Action, Block, DrainStep, NodeView, RepairState, approvals},
    reasons::Reason,
    verdict::Verdict,
};
use jiff::{SignedDuration, Timestamp};

mod support;
use support::{node_drift as drifted, of, step};

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_790_000_000).unwrap() + SignedDuration::from_secs(secs)
}

fn policy(rules: &str, repair: &str) -> GpuNodePolicySpec {
    let yaml = format!(
        r#"
remediation:
{rules}
disruption:
  maxUnavailable: 1
  circuitBreaker: {{maxDriftedPercent: 100}}
recovery: {{healthyFor: 60s}}
{repair}
"#
    );
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("policy fixture: {e}\n{yaml}"))
}

fn approve(node: &mut NodeView, value: &str) {
    node.approved = approvals(value);
}

const COMMAND: &str = "kubectl annotate --overwrite node gpu-1 gpunode.dev/approve=Drain";

#[test]
fn a_drain_that_requires_approval_waits_says_how_to_approve_it_and_acts_once_approved() {
    let policy = policy(
        "  - {classes: [Driver], action: Drain, requireApproval: true}",
        "",
    );
    let mut nodes = vec![NodeView::new("gpu-1", drifted(DriftClass::Driver))];
    let p = step(&policy, &mut nodes, at(0));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, None, "nothing disruptive before the approval");
    assert_eq!(np.pending, [Action::Cordon, Action::Drain]);
    assert_eq!(
        np.blocked,
        Some(Block::Approval {
            rungs: vec!["Drain".to_string()],
            command: COMMAND.to_string()
        })
    );
    assert_eq!(np.condition.reason, Reason::AwaitingApproval);
    assert!(
        np.condition.message.ends_with(&format!(
            "Cordon, Drain waiting for approval of Drain ({COMMAND})"
        )),
        "{}",
        np.condition.message
    );
    let asked: Vec<&str> = np
        .events
        .iter()
        .filter(|e| e.reason == Reason::AwaitingApproval)
        .map(|e| e.note.as_str())
        .collect();
    assert_eq!(asked.len(), 1, "{:?}", np.events);
    assert!(asked[0].ends_with(COMMAND), "{}", asked[0]);

    // Asked once, not on every pass.
    let p = step(&policy, &mut nodes, at(10));
    assert!(
        of(&p, "gpu-1")
            .events
            .iter()
            .all(|e| e.reason != Reason::AwaitingApproval),
        "{:?}",
        of(&p, "gpu-1").events
    );

    approve(&mut nodes[0], "Drain");
    let p = step(&policy, &mut nodes, at(20));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, Some(true));
    assert!(matches!(np.drain, DrainStep::Run { .. }));
    assert!(np.pending.is_empty());
    assert_ne!(np.condition.reason, Reason::AwaitingApproval);

    // The approval removed while the drain is in effect: it stays.
    approve(&mut nodes[0], "");
    let p = step(&policy, &mut nodes, at(30));
    let np = of(&p, "gpu-1");
    assert!(np.actions.contains(&Action::Drain), "{:?}", np.actions);
    assert_ne!(np.cordon, Some(false));
}

#[test]
fn an_approval_is_for_one_incident_and_is_removed_once_the_node_recovered() {
    let policy = policy(
        "  - {classes: [Driver], action: Drain, requireApproval: true}",
        "",
    );
    let mut nodes = vec![NodeView::new("gpu-1", drifted(DriftClass::Driver))];
    approve(&mut nodes[0], "Drain");
    let p = step(&policy, &mut nodes, at(0));
    assert_eq!(of(&p, "gpu-1").cordon, Some(true));
    assert!(
        !of(&p, "gpu-1").forget_approval,
        "not while the drain is in effect"
    );
    nodes[0].markers.drained = Some(at(0));
    nodes[0].verdict = Verdict::new(Vec::new(), Vec::new());
    let p = step(&policy, &mut nodes, at(10));
    assert!(
        !of(&p, "gpu-1").forget_approval,
        "compliant, but still cordoned until healthyFor"
    );
    let p = step(&policy, &mut nodes, at(80));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, Some(false), "uncordoned after healthyFor");
    assert!(np.forget_approval, "the approval goes with the incident");
}

#[test]
fn a_rule_without_approval_acts_at_once_beside_one_that_waits() {
    let policy = policy(
        "  - {classes: [Driver], action: Cordon}\n  - {classes: [Driver], action: Drain, requireApproval: true}",
        "",
    );
    let mut nodes = vec![NodeView::new("gpu-1", drifted(DriftClass::Driver))];
    let p = step(&policy, &mut nodes, at(0));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, Some(true), "the Cordon rule needs no approval");
    assert_eq!(np.pending, [Action::Drain]);
    approve(&mut nodes[0], "Cordon, Taint");
    let p = step(&policy, &mut nodes, at(1));
    assert_eq!(
        of(&p, "gpu-1").pending,
        [Action::Drain],
        "approving other rungs approves nothing else"
    );
}

#[test]
fn a_repair_step_that_requires_approval_waits_for_it() {
    let policy = policy(
        "  - {classes: [Driver], action: Drain}",
        r#"repair:
  steps:
    - name: replace
      action: Remediator
      classes: [Driver]
      requireApproval: true
      remediator: {apiVersion: remediation.example.com/v1, kind: ReplaceTemplate, name: replace, namespace: ops}"#,
    );
    let mut nodes = vec![NodeView::new("gpu-1", drifted(DriftClass::Driver)).heard_at(Some(at(0)))];
    let p = step(&policy, &mut nodes, at(0));
    assert!(matches!(of(&p, "gpu-1").drain, DrainStep::Run { .. }));
    nodes[0].markers.drained = Some(at(0));
    let p = step(&policy, &mut nodes, at(1));
    let np = of(&p, "gpu-1");
    let command = "kubectl annotate --overwrite node gpu-1 gpunode.dev/approve=replace";
    assert_eq!(
        np.repair.state,
        RepairState::Waiting {
            step: "replace".to_string(),
            block: Block::Approval {
                rungs: vec!["replace".to_string()],
                command: command.to_string()
            }
        }
    );
    assert!(np.repair.ensure.is_empty());
    assert!(
        np.markers.repair.attempts.is_empty(),
        "no attempt used while waiting"
    );
    assert_eq!(np.condition.reason, Reason::AwaitingApproval);
    assert!(
        np.events
            .iter()
            .any(|e| e.reason == Reason::AwaitingApproval && e.note.ends_with(command)),
        "{:?}",
        np.events
    );

    approve(&mut nodes[0], "replace");
    let p = step(&policy, &mut nodes, at(2));
    let np = of(&p, "gpu-1");
    assert!(matches!(&np.repair.state, RepairState::Running { step, .. } if step == "replace"));
    assert_eq!(np.repair.ensure.len(), 1);
}

#[test]
fn the_approval_annotation_lists_rungs_separated_by_commas() {
    assert_eq!(
        approvals(" Drain, replace ,,Taint"),
        BTreeSet::from(["Drain".to_string(), "Taint".to_string(), "replace".to_string()])
    );
    assert!(approvals("").is_empty());
}
