//! The repair ladder after a drain (`spec.repair`). Pure: the step objects' state is observed
//! before planning and passed in; what to create and delete is handed to the applier.
//!
//! - A repair begins once a drain has evicted everything it may ([`DrainStep::Done`]) and the
//!   node still drifts; it ends (its objects are deleted, the step forgotten) once the drain is
//!   no longer in effect: the node recovered, or a person uncordoned it.
//! - A node that is not drained but has GPUs under a NoExecute quarantine that no pod holds
//!   any more gets a GPU-scoped repair: only GpuReset steps, only of those GPUs; it ends when
//!   the quarantines do.
//! - One step at a time. A step starts only when admission lets it (`Step::Repair`: pause,
//!   dry run, skip, a conflict, the circuit breaker, the windows, then a person's approval of a
//!   step with `requireApproval`) and the node has attempts left in the window; it is recorded on the node before its object is created, and its object is created
//!   once (by name), so a new leader resumes it and never runs it twice.
//! - A step ends when its object reports its completion condition (True: succeeded, False:
//!   failed), is deleted by its remediator (succeeded), cannot be made (failed), or at its
//!   timeout. Failed and timed out move to the next step at once; succeeded waits for the
//!   probe's next report after it (within the same timeout): still drifted moves on, compliant
//!   lets the node recover as usual.
//! - No step left, or no attempt left: `NeedsHuman`, kept until the node recovers (its report
//!   is compliant again, even while it is still drained) or a person removes the
//!   `gpunode.dev/repair` annotation.
//!
//! A feature planner: it holds no gate of its own, it asks [`super::admission`]. It may import
//! the layers below it (view, output, hysteresis, admission), never the node plan, the pass or
//! another feature planner.

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{
    DriftClass, GpuRecoveryAction, GpuResetRequest, names,
    repair::{RemediatorTemplate, RepairAction, RepairPolicy, RepairStep},
    reset::SUCCEEDED,
};
use jiff::{SignedDuration, Timestamp};
use kube::Resource;

use super::{
    admission::{Admission, Block, Candidate, Step},
    hysteresis::signed,
    output::{DrainStep, NodeCondition, PlannedEvent},
    view::{NodeView, StepObject},
};
use crate::{
    markers::{
        NeedsHuman, REPAIR_ANNOTATION, RepairTrack, ResetGpu, StepEnd, StepObjectRef, StepOutcome, StepRun,
    },
    reasons::Reason,
    verdict::NodeState,
};

/// An object a step needs, to be created if it does not exist.
#[derive(Clone, Debug, PartialEq)]
pub struct EnsureObject {
    /// The step.
    pub step: String,
    /// What it is made from.
    pub made_from: MadeFrom,
    /// The object.
    pub object: StepObjectRef,
    /// When the step started (written on the object, so a leftover of an earlier run is told
    /// apart).
    pub started: Timestamp,
}

/// What a step's object is made from.
#[derive(Clone, Debug, PartialEq)]
pub enum MadeFrom {
    /// A remediator's template (a Remediator step).
    Template(RemediatorTemplate),
    /// A GpuResetRequest for this GPU (a GpuReset step).
    GpuReset(ResetGpu),
}

impl EnsureObject {
    /// The condition type that says the object finished.
    pub fn completion_condition(&self) -> &str {
        match &self.made_from {
            MadeFrom::Template(t) => &t.completion_condition,
            MadeFrom::GpuReset(_) => SUCCEEDED,
        }
    }
}

/// How the objects of one step stand together: failed as soon as one failed, running while one
/// is absent or running, succeeded (at the latest time) once all did. No object: absent.
pub fn fold(objects: Vec<StepObject>) -> StepObject {
    let mut failed = Vec::new();
    let (mut absent, mut running, mut latest) = (false, false, Some(None::<Timestamp>));
    let empty = objects.is_empty();
    for o in objects {
        match o {
            StepObject::Unavailable(m) => return StepObject::Unavailable(m),
            StepObject::Failed(m) => failed.push(m),
            StepObject::Absent => absent = true,
            StepObject::Running => running = true,
            // A success without a time counts as now: the latest of all.
            StepObject::Succeeded(t) => {
                latest = match (latest, t) {
                    (Some(Some(a)), Some(b)) => Some(Some(a.max(b))),
                    (Some(None), Some(b)) => Some(Some(b)),
                    (Some(_), None) | (None, _) => None,
                }
            }
        }
    }
    if !failed.is_empty() {
        StepObject::Failed(failed.join("; "))
    } else if empty || absent {
        StepObject::Absent
    } else if running {
        StepObject::Running
    } else {
        StepObject::Succeeded(latest.flatten())
    }
}

/// Where a node's repair stands after this plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RepairState {
    /// No repair (none configured, not drained, or the node does not drift).
    Idle,
    /// A step runs.
    Running {
        /// The step.
        step: String,
        /// Since when.
        since: Timestamp,
    },
    /// A step succeeded; the probe's next report decides.
    AwaitingReport {
        /// The step.
        step: String,
    },
    /// The next step waits for what blocks disruption.
    Waiting {
        /// The step.
        step: String,
        /// Why.
        block: Block,
    },
    /// The repair stopped.
    NeedsHuman(String),
}

/// The repair part of a node's plan.
#[derive(Clone, Debug, PartialEq)]
pub struct RepairPlan {
    /// The bookkeeping after this plan.
    pub track: RepairTrack,
    /// The objects the running step needs.
    pub ensure: Vec<EnsureObject>,
    /// Objects of a repair that is over.
    pub delete: Vec<StepObjectRef>,
    /// Where it stands.
    pub state: RepairState,
    /// Events.
    pub events: Vec<PlannedEvent>,
    /// A step that ended in this plan: its name, outcome and how long it ran (for metrics).
    pub ended: Option<(String, StepOutcome, SignedDuration)>,
    /// When the running step (or the wait for a report after it) times out.
    pub deadline: Option<Timestamp>,
}

impl Default for RepairPlan {
    /// No repair: nothing to make, delete or say.
    fn default() -> Self {
        RepairPlan::idle(RepairTrack::default())
    }
}

impl RepairPlan {
    fn idle(track: RepairTrack) -> RepairPlan {
        RepairPlan {
            track,
            ensure: Vec::new(),
            delete: Vec::new(),
            state: RepairState::Idle,
            events: Vec::new(),
            ended: None,
            deadline: None,
        }
    }

    /// A step's object is looked at again soon: it has no watch.
    pub fn polls(&self) -> bool {
        matches!(self.state, RepairState::Running { .. })
    }
}

/// What [`decide`] needs to know about one node.
#[derive(Clone, Copy, Debug)]
pub struct RepairInput<'a> {
    /// `spec.repair`.
    pub policy: Option<&'a RepairPolicy>,
    /// The node's name (the name of the objects).
    pub node: &'a str,
    /// The bookkeeping as read from the node.
    pub track: &'a RepairTrack,
    /// The drain after this plan.
    pub drain: &'a DrainStep,
    /// The verdict's state.
    pub state: NodeState,
    /// The classes drifting now.
    pub drifting: &'a BTreeSet<DriftClass>,
    /// When the node's probe was last heard from: its report holds through then (the probe
    /// publishes every change, and renews a heartbeat while nothing changes).
    pub last_heard: Option<Timestamp>,
    /// The running step's objects, as looked at together ([`fold`]), if they were.
    pub object: Option<&'a StepObject>,
    /// The node's GPUs that drift, by class (only those with a UUID: a GPU is reset only by
    /// its UUID).
    pub drifting_gpus: &'a BTreeMap<DriftClass, BTreeSet<ResetGpu>>,
    /// The node's GPUs under a NoExecute quarantine that no pod holds any more: on a node that
    /// is not drained, the GpuReset steps repair these.
    pub quarantined: &'a BTreeSet<ResetGpu>,
    /// Whether a step may start on the node now (what holds disruption on it, a person's
    /// approval of the step).
    pub admission: &'a Admission,
    /// The node, as admission knows it.
    pub candidate: &'a Candidate<'a>,
    /// The drain is wanted but held back (dry run, pause, ...): the step that would follow it
    /// is listed as waiting too.
    pub drain_pending: bool,
    /// Now.
    pub now: Timestamp,
}

impl RepairInput<'_> {
    /// What holds `step` back on the node now, if anything (`approval`: ask for a person's
    /// approval of it too, when it requires one).
    fn may_start(&self, step: &RepairStep, approval: bool) -> Option<Block> {
        let step = Step::Repair {
            step: &step.name,
            approval,
        };
        self.admission.may(self.candidate, step)
    }
}

/// The node's drifting GPUs by class, those with a UUID (a GpuReset step's targets). A GPU for
/// which NVML asks for a node reboot is left out: a reset would not do, so a GpuReset step
/// skips it and the ladder goes on to its next step.
pub fn drifting_gpus(node: &NodeView) -> BTreeMap<DriftClass, BTreeSet<ResetGpu>> {
    let uuids: BTreeMap<u32, &str> = node
        .gpus
        .iter()
        .filter(|g| g.recovery_action != Some(GpuRecoveryAction::NodeReboot))
        .filter_map(|g| Some((g.index, g.uuid.as_deref()?)))
        .collect();
    let mut out: BTreeMap<DriftClass, BTreeSet<ResetGpu>> = BTreeMap::new();
    for d in &node.verdict.drifts {
        if let Some(index) = d.gpu
            && let Some(uuid) = uuids.get(&index)
        {
            out.entry(d.class).or_default().insert(ResetGpu {
                index,
                uuid: (*uuid).to_string(),
            });
        }
    }
    out
}

/// The object a step creates on `node`.
pub fn object_of(template: &RemediatorTemplate, node: &str) -> StepObjectRef {
    StepObjectRef {
        api_version: template.api_version.clone(),
        kind: template.created_kind().to_string(),
        namespace: template.namespace.clone(),
        name: names::remediation_name(node),
        uid: None,
    }
}

/// The request that resets `gpu` of `node` (none when its name would be too long).
pub fn reset_request_of(node: &str, gpu: &ResetGpu) -> Option<StepObjectRef> {
    Some(StepObjectRef {
        api_version: GpuResetRequest::api_version(&()).into_owned(),
        kind: GpuResetRequest::kind(&()).into_owned(),
        namespace: None,
        name: names::reset_request_name(node, gpu.index)?,
        uid: None,
    })
}

/// The objects of `run` of `step` on `node`.
pub fn step_objects(step: &RepairStep, node: &str, run: &StepRun) -> Vec<EnsureObject> {
    let ensure = |made_from: MadeFrom, object: StepObjectRef| EnsureObject {
        step: step.name.clone(),
        made_from,
        object,
        started: run.started,
    };
    match step.action {
        RepairAction::Remediator => step
            .remediator
            .iter()
            .map(|t| ensure(MadeFrom::Template(t.clone()), object_of(t, node)))
            .collect(),
        RepairAction::GpuReset => run
            .gpus
            .iter()
            .filter_map(|g| Some(ensure(MadeFrom::GpuReset(g.clone()), reset_request_of(node, g)?)))
            .collect(),
    }
}

/// The GPUs a GpuReset step would reset now: those drifting in one of its classes.
fn reset_targets(
    step: &RepairStep,
    drifting_gpus: &BTreeMap<DriftClass, BTreeSet<ResetGpu>>,
) -> Vec<ResetGpu> {
    let gpus: BTreeSet<&ResetGpu> = step
        .classes
        .iter()
        .filter_map(|c| drifting_gpus.get(c))
        .flatten()
        .collect();
    gpus.into_iter().cloned().collect()
}

/// Whether `step` has something to do on the node: a GpuReset step needs a drifting GPU; a
/// Remediator step needs the node drained (not just GPUs quarantined).
fn applies(step: &RepairStep, input: &RepairInput<'_>) -> bool {
    match step.action {
        RepairAction::Remediator => !gpu_scoped(input),
        RepairAction::GpuReset => !reset_targets(step, input.drifting_gpus).is_empty(),
    }
}

/// The repair is of quarantined GPUs only (the node is not drained, and some of its GPUs are
/// quarantined and idle).
fn gpu_scoped(input: &RepairInput<'_>) -> bool {
    matches!(input.drain, DrainStep::None) && !input.quarantined.is_empty()
}

/// The drifting GPUs among `quarantined`, by class.
fn gpu_scope(
    drifting: &BTreeMap<DriftClass, BTreeSet<ResetGpu>>,
    quarantined: &BTreeSet<ResetGpu>,
) -> BTreeMap<DriftClass, BTreeSet<ResetGpu>> {
    drifting
        .iter()
        .map(|(c, gpus)| {
            (
                *c,
                gpus.intersection(quarantined).cloned().collect::<BTreeSet<_>>(),
            )
        })
        .filter(|(_, gpus)| !gpus.is_empty())
        .collect()
}

/// The objects, as events name them.
fn names(objects: &[EnsureObject]) -> String {
    match objects {
        [] => "no object".to_string(),
        [one] => one.object.to_string(),
        [first, ..] => format!(
            "{} {}",
            first.object.kind,
            objects
                .iter()
                .map(|o| o.object.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn add(at: Timestamp, d: SignedDuration) -> Timestamp {
    at.checked_add(d).unwrap_or(Timestamp::MAX)
}

/// As policies write durations (`1m30s`, `500ms`), to the second (to the millisecond below one).
fn human(d: SignedDuration) -> String {
    let d = std::time::Duration::try_from(d).unwrap_or_default();
    let d = if d.as_secs() > 0 {
        std::time::Duration::from_secs(d.as_secs())
    } else {
        std::time::Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(0))
    };
    gpunode_crds::Duration::from(d).to_string()
}

/// Plans the repair of one node.
pub fn decide(input: RepairInput<'_>) -> RepairPlan {
    let now = input.now;
    let mut track = input.track.clone();
    let Some(policy) = input.policy else {
        // No repair configured (or it was removed): whatever an earlier one made goes.
        let delete = std::mem::take(&mut track.objects);
        let mut plan = RepairPlan::idle(RepairTrack::default());
        plan.delete = delete;
        return plan;
    };
    let window = signed(policy.window);
    track.attempts.retain(|t| now.duration_since(*t) < window);
    // A node that is not drained but has idle quarantined GPUs: only those GPUs are repaired,
    // and only by GpuReset steps (a reboot is for a drained node).
    if gpu_scoped(&input) {
        let scoped_gpus = gpu_scope(input.drifting_gpus, input.quarantined);
        let scoped_classes: BTreeSet<DriftClass> = scoped_gpus.keys().copied().collect();
        let input = RepairInput {
            drifting: &scoped_classes,
            drifting_gpus: &scoped_gpus,
            ..input
        };
        let mut plan = RepairPlan::idle(track);
        if running(&mut plan, policy, &input) {
            return plan;
        }
        return next(plan, policy, &input);
    }
    match input.drain {
        DrainStep::None => {
            // The drain is over (the node recovered, or a person uncordoned it): so is the repair.
            let delete = std::mem::take(&mut track.objects);
            track.step = None;
            track.needs_human = None;
            let mut plan = RepairPlan::idle(track);
            plan.delete = delete;
            // A dry run (or a pause, a conflict) lists the step that would follow the drain.
            if input.drain_pending
                && input.state == NodeState::Drifted
                && let Some(step) = first_for(policy, 0, &input)
                && let Some(block) = input.may_start(step, false)
            {
                plan.state = RepairState::Waiting {
                    step: step.name.clone(),
                    block,
                };
            }
            return plan;
        }
        DrainStep::Run { .. } => return RepairPlan::idle(track),
        DrainStep::Done { .. } => {}
    }
    let mut plan = RepairPlan::idle(track);
    if running(&mut plan, policy, &input) {
        return plan;
    }
    next(plan, policy, &input)
}

/// Follows the running step, if one runs: true while it still runs.
fn running(plan: &mut RepairPlan, policy: &RepairPolicy, input: &RepairInput<'_>) -> bool {
    let now = input.now;
    let Some(step) = plan.track.step.as_mut().filter(|s| s.ended.is_none()) else {
        return false;
    };
    let spec = policy.step(&step.name).map(|(_, s)| s);
    let objects = spec
        .map(|s| step_objects(s, input.node, step))
        .unwrap_or_default();
    let reset = spec.is_some_and(|s| s.action == RepairAction::GpuReset);
    // How it ended, and when: a remediator's own time of success (so a report sent between it
    // and this look counts as after it), else now.
    let started = step.started;
    let at = |t: Option<Timestamp>| t.unwrap_or(now).clamp(started, now);
    let finished = match (spec, input.object) {
        (None, _) => Some((
            StepOutcome::Failed,
            "the step is no longer in spec.repair".to_string(),
            now,
        )),
        (Some(_), Some(StepObject::Succeeded(t))) => Some((
            StepOutcome::Succeeded,
            objects.first().map_or_else(String::new, |o| {
                format!("{} reports {}=True", names(&objects), o.completion_condition())
            }),
            at(*t),
        )),
        (Some(_), Some(StepObject::Failed(m) | StepObject::Unavailable(m))) => {
            Some((StepOutcome::Failed, m.clone(), now))
        }
        // A reset request deleted by someone else tells nothing of the reset.
        (Some(_), Some(StepObject::Absent)) if step.created && reset => Some((
            StepOutcome::Failed,
            format!("{} was deleted before the probe finished", names(&objects)),
            now,
        )),
        (Some(_), Some(StepObject::Absent)) if step.created => Some((
            StepOutcome::Succeeded,
            format!("{} was deleted by its remediator", names(&objects)),
            now,
        )),
        // Running but not recorded made: made by a leader that stopped before recording it.
        // It is ensured again below: the create finds it, adopts it as the step's own (its
        // started annotation) and records its making with its uid, never making it twice.
        (Some(_), Some(StepObject::Absent | StepObject::Running) | None) => None,
    };
    let timeout = spec.map_or(SignedDuration::ZERO, |s| signed(s.timeout));
    let deadline = add(step.started, timeout);
    let finished = finished.or_else(|| {
        (now >= deadline).then(|| {
            (
                StepOutcome::TimedOut,
                format!("it ran past its timeout of {}", human(timeout)),
                now,
            )
        })
    });
    match finished {
        Some((outcome, why, at)) => {
            let ran = at.duration_since(step.started);
            step.ended = Some(StepEnd { at, outcome });
            let name = step.name.clone();
            plan.events.push(ended_event(&name, outcome, ran, &why));
            plan.ended = Some((name, outcome, ran));
            false
        }
        None => {
            let (name, since, created) = (step.name.clone(), step.started, step.created);
            if !created {
                plan.ensure = objects;
            }
            plan.state = RepairState::Running { step: name, since };
            plan.deadline = Some(deadline);
            true
        }
    }
}

fn ended_event(step: &str, outcome: StepOutcome, ran: SignedDuration, why: &str) -> PlannedEvent {
    let (warning, reason, what) = match outcome {
        StepOutcome::Succeeded => (
            false,
            Reason::RepairSucceeded,
            "finished; the probe's next report decides whether the node is repaired",
        ),
        StepOutcome::Failed => (true, Reason::RepairFailed, "failed"),
        StepOutcome::TimedOut => (true, Reason::RepairTimedOut, "timed out"),
    };
    PlannedEvent {
        warning,
        reason,
        note: format!("repair step {step} {what} after {}: {why}", human(ran)),
    }
}

/// The first step from position `from` on that repairs one of the node's drifting classes and
/// has something to do on it.
fn first_for<'p>(policy: &'p RepairPolicy, from: usize, input: &RepairInput<'_>) -> Option<&'p RepairStep> {
    policy
        .steps
        .iter()
        .skip(from)
        .find(|s| s.classes.iter().any(|c| input.drifting.contains(c)) && applies(s, input))
}

/// After the last step (or before the first): wait for the report, start the next step, or
/// stop.
fn next(mut plan: RepairPlan, policy: &RepairPolicy, input: &RepairInput<'_>) -> RepairPlan {
    if still_stopped(&mut plan, input) || awaiting_report(&mut plan, policy, input) {
        return plan;
    }
    // Nothing (left) to repair: in a GPU-scoped repair, the quarantined GPUs no longer drift.
    if input.state != NodeState::Drifted || input.drifting.is_empty() {
        return plan;
    }
    let from = plan
        .track
        .step
        .as_ref()
        .and_then(|s| policy.step(&s.name))
        .map_or(0, |(i, _)| i + 1);
    let Some(step) = first_for(policy, from, input) else {
        if gpu_scoped(input) && from == 0 {
            // No GpuReset step for these quarantines: they stay, as without a repair.
            return plan;
        }
        let classes: Vec<&str> = input.drifting.iter().map(|c| c.as_str()).collect();
        let why = if from == 0 {
            format!("no repair step repairs {}", classes.join(", "))
        } else {
            format!("every repair step for {} was tried", classes.join(", "))
        };
        stop(&mut plan, input, why);
        return plan;
    };
    if let Some(block) = input.may_start(step, step.require_approval) {
        plan.state = RepairState::Waiting {
            step: step.name.clone(),
            block,
        };
        return plan;
    }
    let used = u32::try_from(plan.track.attempts.len()).unwrap_or(u32::MAX);
    if used >= policy.max_attempts {
        let why = format!(
            "the node used its {} repair attempts within {}",
            policy.max_attempts,
            human(signed(policy.window))
        );
        stop(&mut plan, input, why);
        return plan;
    }
    start(plan, policy, input, step, used)
}

/// A repair that stopped stays stopped while the node is not compliant (true then). The node
/// recovered while still drained (it waits out `healthyFor`, or its validation): the drift that
/// stopped the repair is gone, and so is the stop; a drift that follows (a failed validation)
/// climbs the ladder from where it was.
fn still_stopped(plan: &mut RepairPlan, input: &RepairInput<'_>) -> bool {
    let Some(h) = &plan.track.needs_human else {
        return false;
    };
    if input.state != NodeState::Compliant {
        plan.state = RepairState::NeedsHuman(h.why.clone());
        return true;
    }
    plan.track.needs_human = None;
    false
}

/// A step that succeeded waits for the probe's next report within its timeout (true while it
/// does); with no report by then it counts as timed out.
fn awaiting_report(plan: &mut RepairPlan, policy: &RepairPolicy, input: &RepairInput<'_>) -> bool {
    let now = input.now;
    let Some(step) = plan.track.step.as_mut() else {
        return false;
    };
    let Some(end) = step.ended.as_mut() else {
        return false;
    };
    if end.outcome != StepOutcome::Succeeded || input.last_heard.is_some_and(|r| r >= end.at) {
        return false;
    }
    let timeout = policy
        .step(&step.name)
        .map_or(SignedDuration::ZERO, |(_, s)| signed(s.timeout));
    let deadline = add(step.started, timeout);
    if now < deadline {
        plan.state = RepairState::AwaitingReport {
            step: step.name.clone(),
        };
        plan.deadline = Some(deadline);
        return true;
    }
    // No report since it finished: not shown to have repaired anything.
    end.outcome = StepOutcome::TimedOut;
    let ran = now.duration_since(step.started);
    let why = format!(
        "the probe sent no report within its timeout of {} after it finished",
        human(timeout)
    );
    plan.events
        .push(ended_event(&step.name, StepOutcome::TimedOut, ran, &why));
    false
}

/// The repair stops for `why` and waits for a person.
fn stop(plan: &mut RepairPlan, input: &RepairInput<'_>, why: String) {
    let stays = if gpu_scoped(input) {
        "its quarantined GPUs stay quarantined"
    } else {
        "the node stays cordoned"
    };
    plan.events.push(PlannedEvent {
        warning: true,
        reason: Reason::NeedsHuman,
        note: format!(
            "{why}; {stays}. To start its repair again: kubectl annotate node {} {REPAIR_ANNOTATION}-",
            input.node
        ),
    });
    plan.track.needs_human = Some(NeedsHuman {
        at: input.now,
        why: why.clone(),
    });
    plan.state = RepairState::NeedsHuman(why);
}

/// Starts `step`, the node's attempt `used + 1`: recorded on the node before its objects are
/// made.
fn start(
    mut plan: RepairPlan,
    policy: &RepairPolicy,
    input: &RepairInput<'_>,
    step: &RepairStep,
    used: u32,
) -> RepairPlan {
    let now = input.now;
    let run = StepRun {
        name: step.name.clone(),
        started: now,
        created: false,
        ended: None,
        gpus: match step.action {
            RepairAction::GpuReset => reset_targets(step, input.drifting_gpus),
            RepairAction::Remediator => Vec::new(),
        },
    };
    let ensure = step_objects(step, input.node, &run);
    plan.track.attempts.push(now);
    plan.track.step = Some(run);
    // An object a step made before under the same name is made anew (its leftover deleted
    // first): its uid is recorded again once the new one exists.
    for e in &ensure {
        match plan.track.objects.iter_mut().find(|o| o.same_object(&e.object)) {
            Some(o) => o.uid = None,
            None => plan.track.objects.push(e.object.clone()),
        }
    }
    let what = if ensure.is_empty() {
        String::new()
    } else {
        format!(": creating {}", names(&ensure))
    };
    plan.events.push(PlannedEvent {
        warning: true,
        reason: Reason::RepairStarted,
        note: format!(
            "repair step {} started{what} (attempt {} of {} within {}; timeout {})",
            step.name,
            used + 1,
            policy.max_attempts,
            human(signed(policy.window)),
            human(signed(step.timeout))
        ),
    });
    plan.ensure = ensure;
    plan.state = RepairState::Running {
        step: step.name.clone(),
        since: now,
    };
    plan.deadline = Some(add(now, signed(step.timeout)));
    plan
}

/// The node condition while a repair runs, waits or has stopped.
pub fn condition(condition: &mut NodeCondition, state: &RepairState) {
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
