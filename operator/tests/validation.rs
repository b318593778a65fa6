//! The validation gate (`spec.validation`) in the planner: a recovered node keeps gpunode's
//! cordon, drain and taints until a Job pinned to it passes; a failure or a timeout keeps them
//! and continues the repair ladder; a repair that succeeded is validated again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use gpunode_operator::{
    markers::{StepOutcome, ValidationOutcome},
    plan::{
        DrainStep, JobState, NodeView, PolicyPlan, RepairState, StepObject, ValidationState,
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
      classes: [Xid]
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
    // The ladder continues: the node recovered from its Xid, yet its repair starts.
    assert!(
        matches!(&np.repair.state, RepairState::Running { step, .. } if step == "reboot"),
        "{:?}",
        np.repair.state
    );
    assert_eq!(np.condition.reason, Reason::Repairing);
    assert_eq!(np.validation.label(), Some("failed"));

    // The reboot succeeds and the probe reports after it: validated again, a new Job.
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
    let np = of(&p, "gpu-1");
    let ValidationState::Running { job, .. } = &np.validation.state else {
        panic!("{:?}", np.validation.state)
    };
    assert_ne!(*job, first, "a new run, a new Job");
    assert!(np.validation.create.is_some());
    assert_eq!(np.cordon, None);

    nodes[0].validation_job = Some(JobState::Passed);
    let p = pass(&policy, &mut nodes, at(260));
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
