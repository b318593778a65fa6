//! The validation gate (`spec.validation`). Pure: the Job's state is observed before planning
//! and passed in; the Job to create or delete is handed to the applier.
//!
//! - A validation is due on a node that recovered (nothing of gpunode's is wanted on it any
//!   more) while gpunode's cordon, drain or a disruptive taint is in effect: instead of undoing
//!   them, gpunode holds them, and once every drift class has been clear for `healthyFor`, runs
//!   a Job on the node. Passed: the undo goes ahead.
//! - With `periodic`, an idle healthy node (nothing of gpunode's on it, its GPUs' pods known and
//!   none but validation pods) is validated at most once per `every`, at most `maxPerHour` a
//!   policy, within the windows (admission's `Step::PeriodicValidation`); the node is not
//!   cordoned.
//! - Failed or timed out: the node drifts in class Validation ([`failure_drift`]) until a
//!   repair step that started after the failure succeeds (or a person removes the record): the
//!   policy's rules and repair steps for Validation act on it like on any drift.
//! - A validation starts only when admission lets it (`Step::Validation`: pause, dry run, skip,
//!   a conflict, the circuit breaker, a disruption slot the node holds or one that is free,
//!   fewer than `maxConcurrent` of the policy's nodes validating). It is recorded
//!   on the node before its Job is made; the Job carries its start, so a new leader resumes it
//!   and a leftover of an earlier run is told apart.
//! - A validation no longer wanted (the node drifts again, or a person undid gpunode's
//!   actions) is forgotten; a Job still running is deleted.
//!
//! A feature planner: it holds no gate of its own, it asks [`super::admission`]. It may import
//! the layers below it (view, output, hysteresis, admission), never the node plan, the pass or
//! another feature planner.

use std::{borrow::Cow, collections::BTreeSet};

use gpunode_crds::{DriftClass, names, validation::ValidationPolicy};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::{
    api::{
        batch::v1::{Job, JobSpec},
        core::v1::{
            Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PodTemplateSpec,
            Toleration,
        },
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

pub use super::view::JobState;
use super::{
    admission::{Admission, Block, Candidate, Step},
    hysteresis::signed,
    output::{Action, NodeCondition, PlannedEvent},
    view::{NodeDevices, NodeView},
};
use crate::{
    markers::{self, RepairTrack, StepOutcome, ValidationEnd, ValidationOutcome, ValidationTrack},
    reasons::Reason,
    verdict::{Drift, Verdict},
};

/// The label on a validation Job and its pod: the node it validates (through
/// `names::label_value`). A drain never evicts a pod carrying it.
pub const NODE_LABEL: &str = "gpunode.dev/validation-node";
/// The annotation on a validation Job: when its validation started.
pub const STARTED_ANNOTATION: &str = "gpunode.dev/validation-started";
/// How long a finished validation Job is kept, for a person to read its logs.
pub const KEEP_FINISHED_SECS: i32 = 24 * 3600;

/// Where a node's validation stands after this plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValidationState {
    /// None is due.
    Idle,
    /// Its Job runs.
    Running {
        /// The Job.
        job: String,
        /// Since when.
        since: Timestamp,
    },
    /// It passed: the undo goes ahead.
    Passed {
        /// The Job.
        job: String,
    },
    /// It failed or timed out: the node stays as it is.
    Failed {
        /// The Job.
        job: String,
        /// How.
        outcome: ValidationOutcome,
        /// Why.
        message: String,
    },
    /// It is due but cannot start yet.
    Waiting(ValidationWait),
}

/// Why a due validation does not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValidationWait {
    /// What gates disruption on the node.
    Blocked(Block),
    /// `maxConcurrent` of the policy's nodes are validating.
    Concurrency(u32),
    /// A drift class of the node is still active (clear for less than `healthyFor`).
    Recovering,
    /// The template cannot be read (fail closed).
    Invalid(String),
}

impl ValidationWait {
    /// For the condition.
    pub fn describe(&self) -> String {
        match self {
            ValidationWait::Blocked(b) => b.describe(),
            ValidationWait::Concurrency(n) => {
                format!("{n} of the policy's nodes are validating already (maxConcurrent)")
            }
            ValidationWait::Invalid(why) => format!("the validation template cannot be used: {why}"),
            ValidationWait::Recovering => "the node is healthy for recovery.healthyFor first".to_string(),
        }
    }
}

/// The Job to make for a validation.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateJob {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// When its validation started.
    pub started: Timestamp,
    /// The Job.
    pub job: Box<Job>,
}

/// The validation part of a node's plan.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidationPlan {
    /// The bookkeeping after this plan.
    pub track: Option<ValidationTrack>,
    /// The Job to make, unless it exists.
    pub create: Option<CreateJob>,
    /// A Job to delete (namespace, name): a run that is no longer wanted.
    pub delete: Option<(String, String)>,
    /// Where it stands.
    pub state: ValidationState,
    /// Events.
    pub events: Vec<PlannedEvent>,
    /// When the running Job times out.
    pub deadline: Option<Timestamp>,
    /// A validation started in this plan (it takes a slot of `maxConcurrent`).
    pub started: bool,
    /// A validation that ended in this plan (for metrics): whether it was periodic, and how.
    pub ended: Option<(bool, ValidationOutcome)>,
}

impl Default for ValidationPlan {
    fn default() -> Self {
        ValidationPlan::idle(None)
    }
}

impl ValidationPlan {
    fn idle(track: Option<ValidationTrack>) -> ValidationPlan {
        ValidationPlan {
            track,
            create: None,
            delete: None,
            state: ValidationState::Idle,
            events: Vec::new(),
            deadline: None,
            started: false,
            ended: None,
        }
    }

    /// The Job is looked at again soon: it has no watch.
    pub fn polls(&self) -> bool {
        matches!(self.state, ValidationState::Running { .. })
    }

    /// The node label, while a validation runs or a failed one holds the node.
    pub fn label(&self) -> Option<&'static str> {
        match self.state {
            ValidationState::Running { .. } => Some("running"),
            ValidationState::Failed { .. } => Some("failed"),
            _ => None,
        }
    }
}

/// Whether a node's validation lets the undo go ahead: one before an undo passed before, or its
/// Job passed now.
pub fn passed(track: Option<&ValidationTrack>, job: Option<&JobState>) -> bool {
    match track {
        Some(t) if !t.periodic => match &t.ended {
            Some(end) => end.outcome == ValidationOutcome::Passed,
            None => job == Some(&JobState::Passed),
        },
        _ => false,
    }
}

/// Whether a validation before an undo is due on `node`: the policy validates, gpunode's
/// cordon, drain or a disruptive taint is in effect (`current`), and the ladder wants nothing
/// of the node's any more (a PreferNoSchedule taint alone is a hint, not worth a validation).
/// Until it passed, the node keeps what is in effect: it stays `wanted`.
pub fn hold(
    policy: Option<&ValidationPolicy>,
    node: &NodeView,
    wanted: &mut BTreeSet<Action>,
    current: &BTreeSet<Action>,
) -> bool {
    let due = policy.is_some()
        && current.iter().any(|a| a.is_node_level() && a.is_disruptive())
        && !wanted.iter().any(Action::is_node_level);
    if due && !passed(node.markers.validation.as_ref(), node.validation_job.as_ref()) {
        wanted.extend(current.iter().filter(|a| a.is_node_level()).cloned());
    }
    due
}

/// A validation that failed and that no repair step has succeeded since: the node drifts in
/// class Validation.
fn unrepaired(t: &ValidationTrack, repair: &RepairTrack) -> bool {
    t.ended.as_ref().is_some_and(|end| {
        end.outcome != ValidationOutcome::Passed && repaired_since(repair, end.at).is_none()
    })
}

/// The drift a failed validation puts on the node (class Validation) until a repair step
/// succeeds after it or a person removes the record: the policy's rules and repair steps for
/// Validation act on it. A running one whose Job failed, or whose timeout passed, counts from
/// the plan that sees it.
pub fn failure_drift(
    track: Option<&ValidationTrack>,
    job: Option<&JobState>,
    repair: &RepairTrack,
    timeout: gpunode_crds::Duration,
    now: Timestamp,
) -> Option<Drift> {
    let t = track?;
    let (outcome, message) = match &t.ended {
        Some(end) if unrepaired(t, repair) => (end.outcome, end.message.clone()),
        Some(_) => return None,
        None => ending(job, t.started, timeout, now).filter(|(o, _)| *o != ValidationOutcome::Passed)?,
    };
    Some(Drift {
        class: DriftClass::Validation,
        check: "validation".to_string(),
        expected: "a passing validation Job".to_string(),
        actual: format!("Job {} {}: {message}", t.job, outcome.as_str()),
        gpu: None,
        device: None,
    })
}

/// The node as the planner sees it: with the drift of a failed validation
/// ([`failure_drift`]) added to its verdict, if it has one (only then is the view copied).
pub fn with_failure<'a>(
    policy: Option<&ValidationPolicy>,
    node: &'a NodeView,
    now: Timestamp,
) -> Cow<'a, NodeView> {
    let failed = policy.and_then(|v| {
        failure_drift(
            node.markers.validation.as_ref(),
            node.validation_job.as_ref(),
            &node.markers.repair,
            v.timeout,
            now,
        )
    });
    match failed {
        Some(drift) => {
            let mut node = node.clone();
            let mut drifts = node.verdict.drifts.clone();
            drifts.push(drift);
            node.verdict = Verdict::new(drifts, node.verdict.unknowns.clone());
            Cow::Owned(node)
        }
        None => Cow::Borrowed(node),
    }
}

/// When a repair step that started after `at` succeeded, if one did.
fn repaired_since(repair: &RepairTrack, at: Timestamp) -> Option<Timestamp> {
    let step = repair.step.as_ref().filter(|s| s.started >= at)?;
    let end = step
        .ended
        .as_ref()
        .filter(|e| e.outcome == StepOutcome::Succeeded)?;
    Some(end.at)
}

/// Whether an idle node may have its periodic validation now, as far as the node's own record
/// says: none ran within `every`, and no failed one holds it.
pub fn periodic_due(
    track: Option<&ValidationTrack>,
    repair: &RepairTrack,
    every: SignedDuration,
    now: Timestamp,
) -> bool {
    match track {
        None => true,
        Some(t) if t.ended.is_none() || unrepaired(t, repair) => false,
        Some(t) if t.periodic => now.duration_since(t.started) >= every,
        Some(_) => true,
    }
}

/// Whether a node's GPUs are known to be idle: the report lists the pods of every GPU, and the
/// only ones are validation pods (in `namespace`, named after their Job).
pub fn idle(gpus: usize, devices: &NodeDevices, namespace: &str) -> bool {
    let NodeDevices::DevicePlugin(Some(pods)) = devices else {
        return false;
    };
    gpus > 0
        && pods.by_gpu.len() >= gpus
        && pods
            .by_gpu
            .values()
            .flatten()
            .all(|p| p.namespace == namespace && p.name.starts_with(JOB_PREFIX))
}

/// The prefix of every validation Job's name (and so of its pods').
pub use gpunode_crds::names::JOB_PREFIX;

/// What [`decide`] needs to know about one node.
#[derive(Clone, Copy, Debug)]
pub struct ValidationInput<'a> {
    /// `spec.validation`.
    pub policy: Option<&'a ValidationPolicy>,
    /// The policy's name (a label on the Job).
    pub policy_name: &'a str,
    /// The template, or why it cannot be used.
    pub template: Result<&'a PodTemplateSpec, &'a str>,
    /// The node, as admission knows it (its view holds the bookkeeping, the Job as observed,
    /// its GPUs and their pods).
    pub node: &'a Candidate<'a>,
    /// Whether a validation may start on the node now.
    pub admission: &'a Admission,
    /// A validation is due before an undo: the node recovered while gpunode's cordon, drain or
    /// a disruptive taint is in effect.
    pub due: bool,
    /// No drift class is active on the node any more (each was clear for `healthyFor`): a
    /// validation before an undo may start.
    pub settled: bool,
    /// The node is healthy with nothing of gpunode's on it: a periodic validation may go on.
    pub quiet: bool,
    /// Now.
    pub now: Timestamp,
}

impl<'a> ValidationInput<'a> {
    /// The node's name.
    fn name(&self) -> &'a str {
        &self.node.view.name
    }

    /// The bookkeeping as read from the node.
    fn track(&self) -> Option<&'a ValidationTrack> {
        self.node.view.markers.validation.as_ref()
    }

    /// The Job, as observed (only while one runs).
    fn job(&self) -> Option<&'a JobState> {
        self.node.view.validation_job.as_ref()
    }

    /// The repair as read from the node.
    fn repair(&self) -> &'a RepairTrack {
        &self.node.view.markers.repair
    }

    /// A periodic validation may start on the node now: it is quiet and idle, none ran within
    /// `every`, and admission lets it (the windows, the hourly bound, `maxConcurrent`, the
    /// budget and what holds disruption on the node).
    fn periodic(&self, policy: &ValidationPolicy) -> bool {
        let Some(periodic) = &policy.periodic else {
            return false;
        };
        let view = self.node.view;
        self.quiet
            && self.admission.may(self.node, Step::PeriodicValidation).is_none()
            && periodic_due(self.track(), self.repair(), signed(periodic.every), self.now)
            && idle(view.gpus.len(), &view.devices, &policy.namespace)
    }
}

/// The name of the Job that validates `node`, started at `started`
/// ([`names::validation_job_name`]: a DNS label made of the node's name, cut to fit, a digest of
/// the whole name and the start time).
pub fn job_name(node: &str, started: Timestamp) -> String {
    names::validation_job_name(node, started.as_second())
}

fn add(at: Timestamp, d: SignedDuration) -> Timestamp {
    at.checked_add(d).unwrap_or(Timestamp::MAX)
}

/// Plans the validation of one node.
pub fn decide(input: ValidationInput<'_>) -> ValidationPlan {
    let Some(policy) = input.policy else {
        // No validation configured (or it was removed): its record goes. A Job still running
        // finishes on its own deadline (the namespace it ran in is no longer known).
        return ValidationPlan::idle(None);
    };
    match input.track() {
        Some(t) if t.ended.is_none() => {
            let wanted = if t.periodic { input.quiet } else { input.due };
            // A Job that finished is recorded even if the node changed meanwhile (a failure is
            // itself the drift that changes it).
            let finished = ending(input.job(), t.started, policy.timeout, input.now).is_some();
            if !wanted && !finished {
                // The node drifts again, or a person undid gpunode's actions: cancelled.
                let mut plan = ValidationPlan::idle(None);
                plan.delete = Some((policy.namespace.clone(), t.job.clone()));
                return plan;
            }
            follow(policy, &input, t)
        }
        Some(t) if unrepaired(t, input.repair()) => failed(t),
        Some(t)
            if !t.periodic
                && t.ended
                    .as_ref()
                    .is_some_and(|e| e.outcome == ValidationOutcome::Passed) =>
        {
            if input.due {
                ValidationPlan {
                    state: ValidationState::Passed { job: t.job.clone() },
                    ..ValidationPlan::idle(Some(t.clone()))
                }
            } else {
                // Undone: the next incident is validated again.
                ValidationPlan::idle(None)
            }
        }
        // No record, a periodic one that ended, or a failure a repair step has mended since.
        _ if input.due => start(policy, &input, false),
        _ if input.periodic(policy) => start(policy, &input, true),
        // A periodic record is kept: it says when the node was last validated.
        t => ValidationPlan::idle(t.filter(|t| t.periodic).cloned()),
    }
}

fn failed(t: &ValidationTrack) -> ValidationPlan {
    let (outcome, message) = t
        .ended
        .as_ref()
        .map_or((ValidationOutcome::Failed, String::new()), |e| {
            (e.outcome, e.message.clone())
        });
    ValidationPlan {
        state: ValidationState::Failed {
            job: t.job.clone(),
            outcome,
            message,
        },
        ..ValidationPlan::idle(Some(t.clone()))
    }
}

/// Follows a running validation's Job.
fn follow(policy: &ValidationPolicy, input: &ValidationInput<'_>, t: &ValidationTrack) -> ValidationPlan {
    let now = input.now;
    let mut t = t.clone();
    let deadline = add(t.started, signed(policy.timeout));
    let Some((outcome, message)) = ending(input.job(), t.started, policy.timeout, now) else {
        let mut plan = ValidationPlan::idle(Some(t.clone()));
        if input.job().is_none_or(|j| *j == JobState::Absent) {
            plan.create = make(policy, input, &t.job, t.started);
        }
        plan.state = ValidationState::Running {
            job: t.job.clone(),
            since: t.started,
        };
        plan.deadline = Some(deadline);
        return plan;
    };
    let ran = human(now.duration_since(t.started));
    let what = kind(t.periodic);
    let job_ref = format!("Job {}/{}", policy.namespace, t.job);
    t.ended = Some(ValidationEnd {
        at: now,
        outcome,
        message: message.clone(),
    });
    let mut plan = ValidationPlan::idle(Some(t.clone()));
    plan.ended = Some((t.periodic, outcome));
    if outcome == ValidationOutcome::TimedOut {
        // A Job past its deadline may still hold the GPUs.
        plan.delete = Some((policy.namespace.clone(), t.job.clone()));
    }
    if outcome == ValidationOutcome::Passed {
        let then = if t.periodic {
            "the node stays in service"
        } else {
            "undoing gpunode's cordon and taints"
        };
        plan.events.push(PlannedEvent {
            warning: false,
            reason: Reason::ValidationPassed,
            note: format!("{what} {job_ref} passed after {ran}; {then}"),
        });
        plan.state = ValidationState::Passed { job: t.job };
    } else {
        plan.events.push(PlannedEvent {
            warning: true,
            reason: Reason::ValidationFailed,
            note: format!(
                "{what} {job_ref} {} after {ran}: {message}; the node drifts in class Validation until a repair step succeeds (the policy's rules and repair steps for Validation act). To validate it again: kubectl annotate node {} {}-",
                outcome.as_str(),
                input.name(),
                markers::VALIDATION_ANNOTATION
            ),
        });
        plan.state = ValidationState::Failed {
            job: t.job,
            outcome,
            message,
        };
    }
    plan
}

/// How a running validation ended, if it has: its Job's outcome, or a timeout once `timeout`
/// has passed since it started. The one place that says so (the plan's drift, the decision to
/// cancel or record, and the record itself all ask it).
fn ending(
    job: Option<&JobState>,
    started: Timestamp,
    timeout: gpunode_crds::Duration,
    now: Timestamp,
) -> Option<(ValidationOutcome, String)> {
    match job {
        Some(JobState::Passed) => Some((ValidationOutcome::Passed, String::new())),
        Some(JobState::Failed(m)) => Some((ValidationOutcome::Failed, m.clone())),
        Some(JobState::TimedOut(m)) => Some((ValidationOutcome::TimedOut, m.clone())),
        _ if now >= add(started, signed(timeout)) => Some((
            ValidationOutcome::TimedOut,
            format!("it ran past its timeout of {timeout}"),
        )),
        _ => None,
    }
}

fn kind(periodic: bool) -> &'static str {
    if periodic {
        "periodic validation"
    } else {
        "validation"
    }
}

/// Starts a validation (before an undo, or `periodic`) if nothing keeps it from starting.
fn start(policy: &ValidationPolicy, input: &ValidationInput<'_>, periodic: bool) -> ValidationPlan {
    let now = input.now;
    let keep = input.track().filter(|t| t.periodic).cloned();
    let wait = if let Err(why) = input.template {
        Some(ValidationWait::Invalid(why.to_string()))
    } else if periodic {
        // The planner allowed it, bounds included.
        None
    } else if !input.settled {
        Some(ValidationWait::Recovering)
    } else {
        match input.admission.may(input.node, Step::Validation) {
            Some(Block::Validations(max)) => Some(ValidationWait::Concurrency(max)),
            b => b.map(ValidationWait::Blocked),
        }
    };
    if let Some(w) = wait {
        if periodic {
            return ValidationPlan::idle(keep);
        }
        return ValidationPlan {
            state: ValidationState::Waiting(w),
            ..ValidationPlan::idle(keep)
        };
    }
    let job = job_name(input.name(), now);
    let track = ValidationTrack {
        job: job.clone(),
        started: now,
        periodic,
        ended: None,
    };
    let mut plan = ValidationPlan::idle(Some(track));
    plan.create = make(policy, input, &job, now);
    let then = if periodic {
        "the node is labelled gpunode.dev/validation=running meanwhile"
    } else {
        "gpunode's cordon and taints stay until it passes"
    };
    plan.events.push(PlannedEvent {
        warning: false,
        reason: Reason::Validating,
        note: format!(
            "{} Job {}/{job} started (timeout {}); {then}",
            kind(periodic),
            policy.namespace,
            policy.timeout
        ),
    });
    plan.state = ValidationState::Running { job, since: now };
    plan.deadline = Some(add(now, signed(policy.timeout)));
    plan.started = true;
    plan
}

/// The Job to make (none without a usable template: a validation never starts without one).
fn make(
    policy: &ValidationPolicy,
    input: &ValidationInput<'_>,
    name: &str,
    started: Timestamp,
) -> Option<CreateJob> {
    let template = input.template.ok()?;
    let job = job(
        template.clone(),
        policy,
        input.policy_name,
        input.name(),
        name,
        started,
    );
    Some(CreateJob {
        namespace: policy.namespace.clone(),
        name: name.to_string(),
        started,
        job: Box::new(job),
    })
}

fn human(d: SignedDuration) -> String {
    let secs = u64::try_from(d.as_secs()).unwrap_or(0);
    gpunode_crds::Duration::from_secs(secs.max(1)).to_string()
}

/// The Job that validates `node`: the policy's pod template, pinned to the node by a required
/// node affinity on its name, tolerating gpunode's taint and the cordon, never restarted, with
/// the timeout as its deadline.
pub fn job(
    template: PodTemplateSpec,
    policy: &ValidationPolicy,
    policy_name: &str,
    node: &str,
    name: &str,
    started: Timestamp,
) -> Job {
    let mut template = template;
    let labels = |extra: Option<std::collections::BTreeMap<String, String>>| {
        let mut l = extra.unwrap_or_default();
        l.insert(NODE_LABEL.to_string(), names::label_value(node));
        l.insert(markers::POLICY_LABEL.to_string(), names::label_value(policy_name));
        l.insert("app.kubernetes.io/managed-by".to_string(), "gpunode".to_string());
        l
    };
    let meta = template.metadata.get_or_insert_with(ObjectMeta::default);
    meta.labels = Some(labels(meta.labels.take()));
    let spec = template.spec.get_or_insert_with(Default::default);
    spec.restart_policy = Some("Never".to_string());
    let term = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".to_string(),
            operator: "In".to_string(),
            values: Some(vec![node.to_string()]),
        }]),
        ..NodeSelectorTerm::default()
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let node_affinity = affinity.node_affinity.get_or_insert_with(NodeAffinity::default);
    // Replaces any required node affinity of the template: the pod runs on this node or not at
    // all.
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![term],
    });
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    tolerations.push(Toleration {
        key: Some(markers::TAINT_KEY.to_string()),
        operator: Some("Exists".to_string()),
        ..Toleration::default()
    });
    tolerations.push(Toleration {
        key: Some("node.kubernetes.io/unschedulable".to_string()),
        operator: Some("Exists".to_string()),
        effect: Some("NoSchedule".to_string()),
        ..Toleration::default()
    });
    let deadline = i64::try_from(policy.timeout.get().as_secs())
        .unwrap_or(i64::MAX)
        .max(1);
    Job {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(policy.namespace.clone()),
            labels: Some(labels(None)),
            annotations: Some(std::collections::BTreeMap::from([
                (STARTED_ANNOTATION.to_string(), started.to_string()),
                ("gpunode.dev/node".to_string(), node.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(deadline),
            ttl_seconds_after_finished: Some(KEEP_FINISHED_SECS),
            template,
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// How a Job stands, for a validation that started at `started`.
pub fn job_state(job: Option<&Job>, started: Timestamp) -> JobState {
    let Some(job) = job else {
        return JobState::Absent;
    };
    let ours = job
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STARTED_ANNOTATION))
        .and_then(|v| v.parse::<Timestamp>().ok())
        == Some(started);
    if !ours {
        return JobState::Absent;
    }
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let true_condition = |t: &str| conditions.iter().find(|c| c.type_ == t && c.status == "True");
    if true_condition("Complete").is_some() {
        return JobState::Passed;
    }
    if let Some(c) = true_condition("Failed") {
        let why = match (c.reason.as_deref(), c.message.as_deref()) {
            (Some(r), Some(m)) if !m.is_empty() => format!("{r}: {m}"),
            (Some(r), _) => r.to_string(),
            (None, Some(m)) => m.to_string(),
            (None, None) => "the Job failed".to_string(),
        };
        return if c.reason.as_deref() == Some("DeadlineExceeded") {
            JobState::TimedOut(why)
        } else {
            JobState::Failed(why)
        };
    }
    JobState::Running
}

/// The node condition while a validation runs, waits or has failed.
pub fn condition(condition: &mut NodeCondition, state: &ValidationState) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn job_names_are_dns_labels_that_tell_nodes_and_runs_apart() {
        let at = ts("2026-12-02T10:00:00Z");
        let short = job_name("gpu-node-1", at);
        assert!(short.starts_with("gpunode-validation-gpu-node-1-"), "{short}");
        let long = "a".repeat(100) + ".example.com";
        let other = "a".repeat(100) + ".example.org";
        for n in [&long, &other] {
            let name = job_name(n, at);
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
        }
        assert_ne!(job_name(&long, at), job_name(&other, at));
        assert_ne!(job_name("n", at), job_name("n", ts("2026-12-02T10:00:01Z")));
        assert_eq!(job_name("Node.A", at), job_name("Node.A", at));
    }

    #[test]
    fn long_node_names_make_label_values() {
        assert_eq!(names::label_value("node-1"), "node-1");
        let v = names::label_value(&("n".repeat(70)));
        assert!(v.len() <= 63, "{v}");
    }
}
