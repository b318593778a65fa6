//! The validation gate (`spec.validation`) in the planner: a recovered node keeps gpunode's
//! cordon, drain and taints until a Job pinned to it passes; a failure or a timeout keeps them
//! and continues the repair ladder; a repair that succeeded is validated again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use gpunode_operator::{
    markers::{StepOutcome, ValidationOutcome},
    plan::{
        DrainStep, GpuPods, GpuView, JobState, NodeDevices, NodeView, PodRef, PolicyPlan, RepairState,
        StepObject, ValidationState,
        validation::{NODE_LABEL, ValidationWait},
    },
    reasons::Reason,
    verdict::Verdict,
};
use jiff::{SignedDuration, Timestamp};

mod support;
use support::{node_drift, of, step};

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_790_000_000).unwrap() + SignedDuration::from_secs(secs)
}

const TEMPLATE: &str = r#"{metadata: {labels: {app: diag}}, spec: {containers: [{name: diag, image: "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04", command: [dcgmi, diag, -r, "2"]}]}}"#;

fn policy(extra: &str) -> GpuNodePolicySpec {
    let yaml = format!(
        r#"
remediation:
  - {{classes: [Xid, Driver], action: Drain}}
disruption:
  maxUnavailable: 2
  circuitBreaker: {{maxDriftedPercent: 100}}
recovery: {{healthyFor: 60s}}
validation:
  namespace: gpu-validation
  timeout: 10m
  template: {TEMPLATE}
{extra}"#
    );
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("policy fixture: {e}\n{yaml}"))
}

const REPAIR: &str = r#"repair:
  steps:
    - name: reboot
      action: Remediator
      classes: [Xid, Validation]
      timeout: 10m
      remediator: {apiVersion: remediation.example.com/v1, kind: RebootTemplate, name: reboot, namespace: ops}"#;

fn compliant() -> Verdict {
    Verdict::new(Vec::new(), Vec::new())
}

/// Plans once and applies it back as the applier does: a drain that runs finds nothing left to
/// evict, and a repair step's object that is made is recorded as made.
fn pass(policy: &GpuNodePolicySpec, nodes: &mut [NodeView], now: Timestamp) -> PolicyPlan {
    let p = step(policy, nodes, now);
    for np in &p.nodes {
        let n = nodes.iter_mut().find(|n| n.name == np.node).unwrap();
        if np.write && matches!(np.drain, DrainStep::Run { .. }) {
            n.markers.drained = Some(now);
        }
        if np.write
            && !np.repair.ensure.is_empty()
            && let Some(s) = n.markers.repair.step.as_mut()
        {
            s.created = true;
        }
    }
    p
}

/// `names` drift at 0 and are drained (no repair step starts: they recover before the next
/// pass), recover at 10 (the probe heard then) and are healthy for `healthyFor` at 70.
fn recovered(policy: &GpuNodePolicySpec, names: &[&str]) -> Vec<NodeView> {
    let mut nodes: Vec<NodeView> = names
        .iter()
        .map(|n| NodeView::new(n, node_drift(DriftClass::Xid)).heard_at(Some(at(0))))
        .collect();
    pass(policy, &mut nodes, at(0));
    for n in &mut nodes {
        assert!(n.markers.drained.is_some(), "{} not drained", n.name);
        n.verdict = compliant();
        n.last_heard = Some(at(10));
    }
    pass(policy, &mut nodes, at(10));
    nodes
}

fn reasons(p: &PolicyPlan, node: &str) -> Vec<(Reason, String)> {
    of(p, node)
        .events
        .iter()
        .map(|e| (e.reason, e.note.clone()))
        .collect()
}

#[test]
fn a_recovered_node_stays_cordoned_until_its_validation_job_passes() {
    let policy = policy("");
    let mut nodes = recovered(&policy, &["gpu-1"]);
    let p = pass(&policy, &mut nodes, at(70));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, None, "not uncordoned before the validation");
    assert!(np.markers.cordoned_by_us);
    assert!(
        matches!(np.drain, DrainStep::Done { .. }),
        "the drain stays done: {:?}",
        np.drain
    );
    let ValidationState::Running { job, since } = &np.validation.state else {
        panic!("{:?}", np.validation.state)
    };
    assert_eq!(*since, at(70));
    assert!(job.starts_with("gpunode-validation-gpu-1-"), "{job}");
    assert_eq!(np.validation.label(), Some("running"));
    assert_eq!(np.condition.reason, Reason::Validating);
    assert!(
        np.condition.message.contains(job.as_str()),
        "{}",
        np.condition.message
    );
    let events = reasons(&p, "gpu-1");
    assert!(
        events
            .iter()
            .any(|(r, n)| *r == Reason::Validating && n.contains("timeout 10m")),
        "{events:?}"
    );

    // The Job: in the policy's namespace, pinned to the node, tolerating the cordon and
    // gpunode's taint, never retried, the timeout as its deadline.
    let create = np.validation.create.as_ref().expect("a Job to make");
    assert_eq!(create.namespace, "gpu-validation");
    let job_spec = create.job.spec.as_ref().unwrap();
    assert_eq!(job_spec.backoff_limit, Some(0));
    assert_eq!(job_spec.active_deadline_seconds, Some(600));
    let pod = job_spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    let terms = &pod
        .affinity
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .as_ref()
        .unwrap()
        .node_selector_terms;
    let fields = terms[0].match_fields.as_ref().unwrap();
    assert_eq!(fields[0].key, "metadata.name");
    assert_eq!(fields[0].values.as_deref(), Some(&["gpu-1".to_string()][..]));
    let tolerated: Vec<&str> = pod
        .tolerations
        .as_ref()
        .unwrap()
        .iter()
        .filter_map(|t| t.key.as_deref())
        .collect();
    assert_eq!(
        tolerated,
        ["gpunode.dev/drift", "node.kubernetes.io/unschedulable"]
    );
    let labels = job_spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref()
        .unwrap();
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("diag"),
        "the template's labels stay"
    );
    assert_eq!(labels.get(NODE_LABEL).map(String::as_str), Some("gpu-1"));

    // Running: nothing new is made, the node stays.
    nodes[0].validation_job = Some(JobState::Running);
    let p = pass(&policy, &mut nodes, at(100));
    let np = of(&p, "gpu-1");
    assert!(np.validation.create.is_none());
    assert_eq!(np.cordon, None);
    assert!(np.events.is_empty(), "{:?}", np.events);

    // Passed: the undo goes ahead in the same pass.
    nodes[0].validation_job = Some(JobState::Passed);
    let p = pass(&policy, &mut nodes, at(130));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, Some(false), "uncordoned once the validation passed");
    assert_eq!(np.drain, DrainStep::None);
    assert!(matches!(np.validation.state, ValidationState::Passed { .. }));
    assert_eq!(
        np.validation.ended,
        Some((false, ValidationOutcome::Passed)),
        "counted once"
    );
    let events = reasons(&p, "gpu-1");
    assert!(
        events
            .iter()
            .any(|(r, n)| *r == Reason::ValidationPassed && n.contains("passed after 1m")),
        "{events:?}"
    );
    assert!(events.iter().any(|(r, _)| *r == Reason::Uncordoned), "{events:?}");

    // Undone: the record goes, so the next incident is validated again.
    nodes[0].validation_job = None;
    let p = pass(&policy, &mut nodes, at(131));
    let np = of(&p, "gpu-1");
    assert_eq!(np.validation.state, ValidationState::Idle);
    assert!(np.markers.validation.is_none());
    assert!(
        np.validation.delete.is_none(),
        "a finished Job is kept for its logs"
    );
}

#[test]
fn a_failed_validation_keeps_the_node_and_continues_the_repair_then_validates_again() {
    let policy = policy(REPAIR);
    let mut nodes = recovered(&policy, &["gpu-1"]);
    pass(&policy, &mut nodes, at(70));
    let first = nodes[0].markers.validation.clone().unwrap().job;
    nodes[0].validation_job = Some(JobState::Failed(
        "BackoffLimitExceeded: Job has reached the specified backoff limit".into(),
    ));
    let p = pass(&policy, &mut nodes, at(100));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, None, "the node stays cordoned");
    assert!(matches!(
        np.validation.state,
        ValidationState::Failed {
            outcome: ValidationOutcome::Failed,
            ..
        }
    ));
    let events = reasons(&p, "gpu-1");
    let failed = events
        .iter()
        .find(|(r, _)| *r == Reason::ValidationFailed)
        .unwrap_or_else(|| panic!("{events:?}"));
    assert!(failed.1.contains(&first), "the event names the Job: {}", failed.1);
    assert!(failed.1.contains("BackoffLimitExceeded"), "{}", failed.1);
    // The node drifts in class Validation: its repair continues with the steps for it.
    assert!(np.drifting.contains(&DriftClass::Validation), "{:?}", np.drifting);
    assert_eq!(np.state, gpunode_operator::verdict::NodeState::Drifted);
    assert!(
        matches!(&np.repair.state, RepairState::Running { step, .. } if step == "reboot"),
        "{:?}",
        np.repair.state
    );
    assert_eq!(np.condition.reason, Reason::Repairing);
    assert_eq!(np.validation.label(), Some("failed"));

    // The reboot succeeds: the Validation drift clears, the node recovers as usual, and after
    // healthyFor it is validated again, with a new Job.
    nodes[0].validation_job = None;
    nodes[0].repair_object = Some(StepObject::Succeeded(Some(at(200))));
    let p = pass(&policy, &mut nodes, at(201));
    assert_eq!(
        of(&p, "gpu-1")
            .markers
            .repair
            .step
            .as_ref()
            .unwrap()
            .ended
            .as_ref()
            .unwrap()
            .outcome,
        StepOutcome::Succeeded
    );
    nodes[0].repair_object = None;
    nodes[0].last_heard = Some(at(230));
    let p = pass(&policy, &mut nodes, at(230));
    assert!(!of(&p, "gpu-1").drifting.contains(&DriftClass::Validation));
    assert_eq!(
        of(&p, "gpu-1").validation.state,
        ValidationState::Waiting(ValidationWait::Recovering),
        "validated again once healthy for healthyFor"
    );
    assert_eq!(of(&p, "gpu-1").cordon, None);
    let p = pass(&policy, &mut nodes, at(291));
    let np = of(&p, "gpu-1");
    let ValidationState::Running { job, .. } = &np.validation.state else {
        panic!("{:?}", np.validation.state)
    };
    assert_ne!(*job, first, "a new run, a new Job");
    assert!(np.validation.create.is_some());
    assert_eq!(np.cordon, None);

    nodes[0].validation_job = Some(JobState::Passed);
    let p = pass(&policy, &mut nodes, at(320));
    assert_eq!(of(&p, "gpu-1").cordon, Some(false), "passed: returned to service");
}

#[test]
fn a_validation_that_never_finishes_times_out_its_job_is_deleted_and_the_node_needs_a_person() {
    let policy = policy("");
    let mut nodes = recovered(&policy, &["gpu-1"]);
    let p = pass(&policy, &mut nodes, at(70));
    let job = nodes[0].markers.validation.clone().unwrap().job;
    assert_eq!(of(&p, "gpu-1").validation.deadline, Some(at(70 + 600)));
    // With the probe heard from meanwhile, the next change is the Job's timeout.
    nodes[0].last_heard = Some(at(600));
    let p = pass(&policy, &mut nodes, at(600));
    let next = of(&p, "gpu-1").next_change.unwrap();
    assert_eq!(
        next.at,
        at(70 + 600),
        "looked at again when the Job times out: {next}"
    );
    nodes[0].validation_job = Some(JobState::Running);
    let p = pass(&policy, &mut nodes, at(70 + 600));
    let np = of(&p, "gpu-1");
    assert!(matches!(
        np.validation.state,
        ValidationState::Failed {
            outcome: ValidationOutcome::TimedOut,
            ..
        }
    ));
    assert_eq!(
        np.validation.delete,
        Some(("gpu-validation".to_string(), job.clone())),
        "a Job past its timeout may hold the GPUs"
    );
    assert_eq!(np.cordon, None);
    assert_eq!(np.condition.reason, Reason::ValidationFailed);
    assert_eq!(np.condition.status, "False");
    let events = reasons(&p, "gpu-1");
    assert!(
        events.iter().any(|(r, n)| *r == Reason::ValidationFailed
            && n.contains("timed out")
            && n.contains("kubectl annotate node gpu-1 gpunode.dev/validation-")),
        "{events:?}"
    );
    // It stays so; a person who removes the record runs it again.
    nodes[0].validation_job = None;
    let p = pass(&policy, &mut nodes, at(2000));
    assert_eq!(of(&p, "gpu-1").condition.reason, Reason::ValidationFailed);
    assert_eq!(of(&p, "gpu-1").cordon, None);
    nodes[0].markers.validation = None;
    let p = pass(&policy, &mut nodes, at(2001));
    assert_eq!(
        of(&p, "gpu-1").validation.state,
        ValidationState::Waiting(ValidationWait::Recovering)
    );
    assert_eq!(of(&p, "gpu-1").cordon, None, "held while it waits");
    let p = pass(&policy, &mut nodes, at(2062));
    assert!(matches!(
        of(&p, "gpu-1").validation.state,
        ValidationState::Running { .. }
    ));
}

#[test]
fn a_job_that_ran_past_its_deadline_counts_as_timed_out() {
    let policy = policy("");
    let mut nodes = recovered(&policy, &["gpu-1"]);
    pass(&policy, &mut nodes, at(70));
    nodes[0].validation_job = Some(JobState::TimedOut(
        "DeadlineExceeded: Job was active longer than specified deadline".into(),
    ));
    let p = pass(&policy, &mut nodes, at(400));
    assert!(matches!(
        of(&p, "gpu-1").validation.state,
        ValidationState::Failed {
            outcome: ValidationOutcome::TimedOut,
            ..
        }
    ));
}

#[test]
fn no_more_nodes_validate_at_once_than_max_concurrent() {
    let policy = policy("");
    let mut nodes = recovered(&policy, &["gpu-1", "gpu-2"]);
    let p = pass(&policy, &mut nodes, at(70));
    let states: Vec<&ValidationState> = p.nodes.iter().map(|n| &n.validation.state).collect();
    assert_eq!(
        states
            .iter()
            .filter(|s| matches!(s, ValidationState::Running { .. }))
            .count(),
        1,
        "{states:?}"
    );
    let waiting = p
        .nodes
        .iter()
        .find(|n| {
            matches!(
                n.validation.state,
                ValidationState::Waiting(ValidationWait::Concurrency(1))
            )
        })
        .expect("the other waits for maxConcurrent");
    assert_eq!(waiting.cordon, None, "and stays cordoned");
    assert!(
        waiting.condition.message.contains("maxConcurrent"),
        "{}",
        waiting.condition.message
    );
    let (first, second) = (
        p.nodes
            .iter()
            .find(|n| n.node != waiting.node)
            .unwrap()
            .node
            .clone(),
        waiting.node.clone(),
    );

    // Still one while the first runs.
    nodes.iter_mut().find(|n| n.name == first).unwrap().validation_job = Some(JobState::Running);
    let p = pass(&policy, &mut nodes, at(80));
    assert!(matches!(
        of(&p, &second).validation.state,
        ValidationState::Waiting(_)
    ));

    // The first passes and is undone; then the second starts.
    nodes.iter_mut().find(|n| n.name == first).unwrap().validation_job = Some(JobState::Passed);
    let p = pass(&policy, &mut nodes, at(90));
    assert_eq!(of(&p, &first).cordon, Some(false));
    nodes.iter_mut().find(|n| n.name == first).unwrap().validation_job = None;
    let p = pass(&policy, &mut nodes, at(91));
    assert!(matches!(
        of(&p, &second).validation.state,
        ValidationState::Running { .. }
    ));
}

#[test]
fn a_drift_that_returns_during_the_validation_cancels_it() {
    let policy = policy("");
    let mut nodes = recovered(&policy, &["gpu-1"]);
    pass(&policy, &mut nodes, at(70));
    let job = nodes[0].markers.validation.clone().unwrap().job;
    nodes[0].validation_job = Some(JobState::Running);
    nodes[0].verdict = node_drift(DriftClass::Driver);
    let p = pass(&policy, &mut nodes, at(80));
    let np = of(&p, "gpu-1");
    assert_eq!(np.validation.delete, Some(("gpu-validation".to_string(), job)));
    assert!(np.markers.validation.is_none());
    assert_eq!(np.validation.label(), None);
    assert!(np.markers.cordoned_by_us, "the new drift keeps the node cordoned");
}

#[test]
fn a_template_the_operator_cannot_read_keeps_the_node_and_degrades_the_policy() {
    let mut policy = policy("");
    policy.validation.as_mut().unwrap().template = serde_json::json!({"spec": {"containers": "diag"}});
    let mut nodes = recovered(&policy, &["gpu-1"]);
    let p = pass(&policy, &mut nodes, at(70));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, None, "fail closed: no undo without a validation");
    assert!(
        matches!(&np.validation.state, ValidationState::Waiting(ValidationWait::Invalid(why)) if why.starts_with("spec.validation.template.spec.containers")),
        "{:?}",
        np.validation.state
    );
    assert!(np.validation.create.is_none());
    assert!(
        p.invalid_validation
            .as_deref()
            .is_some_and(|w| w.starts_with("spec.validation.template.spec.containers: invalid type")),
        "{:?}",
        p.invalid_validation
    );
}

#[test]
fn a_paused_policy_starts_no_validation() {
    let mut policy = policy("");
    let mut nodes = recovered(&policy, &["gpu-1"]);
    policy.paused = true;
    let p = pass(&policy, &mut nodes, at(70));
    let np = of(&p, "gpu-1");
    assert!(matches!(
        np.validation.state,
        ValidationState::Waiting(ValidationWait::Blocked(_))
    ));
    assert!(np.validation.create.is_none());
}

#[test]
fn without_spec_validation_a_recovered_node_is_undone_at_once() {
    let mut policy = policy("");
    policy.validation = None;
    let mut nodes = recovered(&policy, &["gpu-1"]);
    let p = pass(&policy, &mut nodes, at(70));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, Some(false));
    assert_eq!(np.validation.state, ValidationState::Idle);
}

// ---------------------------------------------------------------------------------------------
// Periodic validation of idle nodes (`spec.validation.periodic`).

const PERIODIC: &str = "  periodic: {every: 24h, maxPerHour: 1}\n  maxConcurrent: 2";

/// A healthy node with one GPU whose pods the report lists (`pods` of them, in `ml`).
fn idle_node(name: &str, pods: usize) -> NodeView {
    let pods = (0..pods)
        .map(|i| PodRef {
            namespace: "ml".to_string(),
            name: format!("trainer-{i}"),
        })
        .collect();
    NodeView::new(name, compliant()).heard_at(Some(at(0))).with_gpus(
        vec![GpuView {
            index: 0,
            uuid: Some("GPU-0".to_string()),
            recovery_action: None,
        }],
        NodeDevices::DevicePlugin(Some(GpuPods {
            observed_at: Some(at(0)),
            by_gpu: BTreeMap::from([("GPU-0".to_string(), pods)]),
        })),
    )
}

fn periodic_policy(rules: &str) -> GpuNodePolicySpec {
    let yaml = format!(
        r#"
remediation:
{rules}
disruption:
  maxUnavailable: 3
  circuitBreaker: {{maxDriftedPercent: 100}}
recovery: {{healthyFor: 60s}}
validation:
  namespace: gpu-validation
  timeout: 10m
  template: {TEMPLATE}
{PERIODIC}
"#
    );
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("policy fixture: {e}\n{yaml}"))
}

fn running(p: &PolicyPlan) -> Vec<String> {
    p.nodes
        .iter()
        .filter(|n| matches!(n.validation.state, ValidationState::Running { .. }))
        .map(|n| n.node.clone())
        .collect()
}

#[test]
fn idle_nodes_are_validated_now_and_then_bounded_per_hour_and_by_every() {
    let policy = periodic_policy("  - {classes: [Validation], action: Cordon}");
    let mut nodes = vec![idle_node("gpu-1", 0), idle_node("gpu-2", 0)];
    let p = pass(&policy, &mut nodes, at(0));
    assert_eq!(running(&p), ["gpu-1"], "one per hour (maxPerHour 1)");
    let np = of(&p, "gpu-1");
    assert_eq!(np.validation.label(), Some("running"));
    assert_eq!(np.cordon, None, "a periodic validation does not cordon");
    assert!(np.validation.create.is_some());
    assert_eq!(np.condition.reason, Reason::Validating);
    assert!(
        reasons(&p, "gpu-1")
            .iter()
            .any(|(r, n)| *r == Reason::Validating && n.starts_with("periodic validation Job")),
        "{:?}",
        reasons(&p, "gpu-1")
    );
    assert_eq!(p.budget_in_use, 1, "it holds a slot of the budget");

    // Its own pod on the GPU keeps the node idle; it passes and the node stays in service.
    nodes[0] = idle_node("gpu-1", 0).with_validation(Some(JobState::Passed));
    nodes[0].markers = p.nodes[0].markers.clone();
    let p = pass(&policy, &mut nodes, at(300));
    let np = of(&p, "gpu-1");
    assert!(matches!(np.validation.state, ValidationState::Passed { .. }));
    assert!(
        reasons(&p, "gpu-1")
            .iter()
            .any(|(r, n)| *r == Reason::ValidationPassed && n.contains("stays in service"))
    );
    assert_eq!(running(&p), Vec::<String>::new(), "gpu-2 waits for the hour");
    nodes[0].validation_job = None;

    let p = pass(&policy, &mut nodes, at(3601));
    assert_eq!(running(&p), ["gpu-2"], "the next hour, the next node");
    assert!(
        nodes[0].markers.validation.as_ref().is_some_and(|t| t.periodic),
        "the record says when"
    );

    // gpu-1 again only after `every`.
    nodes[1].validation_job = Some(JobState::Passed);
    pass(&policy, &mut nodes, at(3700));
    nodes[1].validation_job = None;
    let p = pass(&policy, &mut nodes, at(3 * 3600));
    assert_eq!(running(&p), Vec::<String>::new());
    let p = pass(&policy, &mut nodes, at(24 * 3600 + 1));
    assert_eq!(running(&p), ["gpu-1"]);
}

#[test]
fn a_node_whose_gpus_are_busy_or_not_known_is_not_validated_and_it_is_off_by_default() {
    let policy = periodic_policy("  - {classes: [Validation], action: Cordon}");
    let mut unknown = idle_node("gpu-3", 0);
    unknown.devices = NodeDevices::DevicePlugin(None);
    let mut nodes = vec![idle_node("gpu-1", 1), unknown];
    let p = pass(&policy, &mut nodes, at(0));
    assert_eq!(running(&p), Vec::<String>::new());

    let mut off = policy.clone();
    off.validation.as_mut().unwrap().periodic = None;
    let mut nodes = vec![idle_node("gpu-1", 0)];
    let p = pass(&off, &mut nodes, at(0));
    assert_eq!(running(&p), Vec::<String>::new());
}

#[test]
fn a_failed_periodic_validation_is_a_validation_drift_that_the_rules_act_on() {
    let policy = periodic_policy("  - {classes: [Validation], action: Cordon}");
    let mut nodes = vec![idle_node("gpu-1", 0)];
    pass(&policy, &mut nodes, at(0));
    let job = nodes[0].markers.validation.clone().unwrap().job;
    nodes[0].validation_job = Some(JobState::Failed("BackoffLimitExceeded".into()));
    let p = pass(&policy, &mut nodes, at(120));
    let np = of(&p, "gpu-1");
    assert_eq!(np.state, gpunode_operator::verdict::NodeState::Drifted);
    assert!(np.drifting.contains(&DriftClass::Validation));
    assert_eq!(np.cordon, Some(true), "the Validation rule cordons it at once");
    assert_eq!(np.condition.reason, Reason::ValidationFailed);
    assert!(np.condition.message.contains(&job), "{}", np.condition.message);
    assert_eq!(np.validation.label(), Some("failed"));
    assert_eq!(np.validation.ended, Some((true, ValidationOutcome::Failed)));
    nodes[0].validation_job = None;

    // No repair: it stays until a person removes the record; then, once healthy for
    // healthyFor, the cordon's undo waits for a validation that passes.
    let p = pass(&policy, &mut nodes, at(600));
    assert_eq!(of(&p, "gpu-1").cordon, None);
    assert_eq!(
        of(&p, "gpu-1").validation.ended,
        None,
        "counted when it ended, not after"
    );
    assert!(nodes[0].unschedulable);
    nodes[0].markers.validation = None;
    pass(&policy, &mut nodes, at(601));
    let p = pass(&policy, &mut nodes, at(662));
    let np = of(&p, "gpu-1");
    assert!(
        matches!(np.validation.state, ValidationState::Running { .. }),
        "{:?}",
        np.validation.state
    );
    assert!(
        !nodes[0].markers.validation.as_ref().unwrap().periodic,
        "a validation before the undo"
    );
    assert!(nodes[0].unschedulable, "still cordoned");
    nodes[0].validation_job = Some(JobState::Passed);
    let p = pass(&policy, &mut nodes, at(700));
    assert_eq!(of(&p, "gpu-1").cordon, Some(false));
}

#[test]
fn a_drift_during_a_periodic_validation_cancels_it() {
    let policy = periodic_policy("  - {classes: [Driver], action: Cordon}");
    let mut nodes = vec![idle_node("gpu-1", 0)];
    pass(&policy, &mut nodes, at(0));
    let job = nodes[0].markers.validation.clone().unwrap().job;
    nodes[0].validation_job = Some(JobState::Running);
    nodes[0].verdict = node_drift(DriftClass::Driver);
    let p = pass(&policy, &mut nodes, at(30));
    let np = of(&p, "gpu-1");
    assert_eq!(np.validation.delete, Some(("gpu-validation".to_string(), job)));
    assert!(np.markers.validation.is_none());
    assert_eq!(np.cordon, Some(true));
}
