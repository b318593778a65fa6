//! One node's plan ([`NodePlan`]): what the node should look like after this pass, assembled
//! from what the pass decided for it (the node as it worked on it, [`Work`]; what admission let
//! its actions do, [`Admitted`]; its validation) and the parts the feature planners add (its
//! GPUs' quarantines, its repair), with the words for it: its condition, its Events, and when it
//! next changes with time alone.
//!
//! Pure. It decides nothing of its own: the repair planner it calls asks admission whether a
//! step may start. It may import every layer below it (view, output, hysteresis, admission, the
//! feature planners), never the pass ([`super::plan`]).

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use jiff::{SignedDuration, Timestamp};

use super::{
    admission::{Admission, Block, Candidate},
    gpus::{self, Escalation, GpusAfter, Quarantine},
    hysteresis::{at, changes, elapsed, signed},
    ladder::current,
    output::{
        Action, ChangeCause, DrainStep, InEffect, NextChange, NodeCondition, PlannedEvent, RepairInEffect,
        is_disrupted, validating,
    },
    repair::{self, RepairPlan, RepairState},
    validation::{self, ValidationPlan, ValidationState},
    view::NodeView,
};
use crate::{
    markers::{ClassTrack, DriftTaint, GpuTrack, Markers},
    reasons::Reason,
    verdict::NodeState,
};

/// What a node should look like now.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    /// Node name.
    pub node: String,
    /// False when nothing may be written to the node (skip label, paused policy, or another
    /// policy writes it: see `defer_to`).
    pub write: bool,
    /// The policy that writes this node instead: with overlapping policies only the first by
    /// name writes a node, so the two do not flip its labels back and forth.
    pub defer_to: Option<String>,
    /// The verdict's state.
    pub state: NodeState,
    /// Classes for the `gpunode.dev/drift.<class>` labels: those drifting now.
    pub drifting: BTreeSet<DriftClass>,
    /// Bookkeeping to store.
    pub markers: Markers,
    /// gpunode's taints the node should carry (the complete set).
    pub taints: BTreeSet<DriftTaint>,
    /// `Some(true)`: cordon; `Some(false)`: uncordon (only ever what gpunode cordoned); `None`:
    /// leave `spec.unschedulable` alone.
    pub cordon: Option<bool>,
    /// Whether pods should be evicted.
    pub drain: DrainStep,
    /// Actions in effect after this plan (for status).
    pub actions: Vec<Action>,
    /// Actions wanted but not taken, and why.
    pub pending: Vec<Action>,
    /// Why the pending actions wait.
    pub blocked: Option<Block>,
    /// The node condition: status, reason and message.
    pub condition: NodeCondition,
    /// Transitions worth an Event.
    pub events: Vec<PlannedEvent>,
    /// When the oldest active drift began.
    pub since: Option<Timestamp>,
    /// What gpunode had in effect on the node before this plan (what stays in effect when the
    /// plan is not written).
    pub before: InEffect,
    /// When this node's plan next changes with time alone, and why (`None`: only a change of
    /// the node, its report or the policy changes it).
    pub next_change: Option<NextChange>,
    /// The GPU quarantines in effect after this plan, each with where it goes.
    pub quarantines: Vec<Quarantine>,
    /// The node recovered with nothing of gpunode's in effect: a person's approvals on it
    /// (`gpunode.dev/approve`) were for this incident and are removed, so the next drift asks
    /// again.
    pub forget_approval: bool,
    /// Why the node's own rules act on its GPU faults, if they do.
    pub escalation: Option<Escalation>,
    /// For the `gpunode.dev/healthy-gpus` label: GPUs neither drifting nor quarantined.
    pub healthy_gpus: Option<u32>,
    /// The repair of the drained node: its step, objects to make and delete.
    pub repair: RepairPlan,
    /// The validation of the recovered node (`spec.validation`).
    pub validation: ValidationPlan,
}

impl NodePlan {
    /// Whether its GPU quarantines evict pods on their own (not while the node drains: the
    /// drain evicts them all).
    pub fn evicts_gpu_holders(&self) -> bool {
        !matches!(self.drain, DrainStep::Run { .. })
            && self.quarantines.iter().any(|q| !q.evicts().is_empty())
    }

    /// What gpunode has in effect on the node once this plan is written.
    pub fn after(&self) -> InEffect {
        InEffect {
            actions: self.actions.clone(),
            tainted: !self.taints.is_empty(),
            cordoned: self.markers.cordoned_by_us,
            drain: self.drain,
            repair: RepairInEffect::of(&self.markers.repair),
            validating: validating(self.markers.validation.as_ref()),
        }
    }
}

/// One node as the pass works on it: what admission knows of it, its tracks, what the ladder
/// wants and what gpunode has in effect.
pub(super) struct Work<'a> {
    /// The node, as admission knows it.
    pub(super) node: Candidate<'a>,
    /// Its classes' tracks after this plan.
    pub(super) tracks: BTreeMap<DriftClass, ClassTrack>,
    /// Its GPUs' tracks after this plan (the quarantines in effect are recorded at the end).
    pub(super) gpu_tracks: BTreeMap<String, GpuTrack>,
    /// Why the node's own rules act on its GPU faults, if they do.
    pub(super) escalation: Option<Escalation>,
    /// What the ladder wants in effect (what a due validation holds included), but what waits
    /// for a person.
    pub(super) wanted: BTreeSet<Action>,
    /// What gpunode has in effect now (a drain a person cancelled is not).
    pub(super) current: BTreeSet<Action>,
    /// The actions that wait for a person's approval.
    pub(super) awaiting: BTreeSet<Action>,
    /// Why they wait, and the command that approves them.
    pub(super) approval: Option<Block>,
    /// Since when a person's uncordon holds gpunode's cordon off.
    pub(super) user_uncordoned: Option<Timestamp>,
}

/// What admission let the node's actions do.
pub(super) struct Admitted {
    /// The actions in effect after this plan.
    pub(super) effective: BTreeSet<Action>,
    /// The actions wanted but held back.
    pub(super) pending: Vec<Action>,
    /// Why they are held back.
    pub(super) blocked: Option<Block>,
}

/// A node's plan before it is put together: what its condition, Events and next change are
/// said from.
struct Parts<'p> {
    node: &'p NodeView,
    blocked: &'p Option<Block>,
    pending: &'p [Action],
    taints: &'p BTreeSet<DriftTaint>,
    cordon: Option<bool>,
    drain: DrainStep,
    user_uncordoned: Option<Timestamp>,
    gpus: &'p GpusAfter<'p>,
    escalation: Option<&'p Escalation>,
    repair: &'p RepairPlan,
    validation: &'p ValidationPlan,
}

/// The plan of one node of policy `name`: the node as the pass worked on it (`w`), what
/// admission let its actions do, and its validation.
pub(super) fn node_plan(
    name: &str,
    policy: &GpuNodePolicySpec,
    admission: &Admission,
    w: &mut Work<'_>,
    admitted: Admitted,
    validation: ValidationPlan,
    now: Timestamp,
) -> NodePlan {
    let node = w.node.view;
    let timeout = signed(policy.disruption.drain.timeout);
    let level = node_level(node, &admitted, timeout, now);
    let Admitted {
        effective,
        pending,
        blocked,
    } = admitted;
    let mut gpus = gpus::after(policy, node, &effective, std::mem::take(&mut w.gpu_tracks));
    let drifting = node.verdict.classes();
    let repair = repair_of(policy, admission, &w.node, &level, &gpus, &drifting, now);
    let markers = markers(w, &level, &mut gpus, &repair, &validation, now);
    let parts = Parts {
        node,
        blocked: &blocked,
        pending: &pending,
        taints: &level.taints,
        cordon: level.cordon,
        drain: level.drain,
        user_uncordoned: w.user_uncordoned,
        gpus: &gpus,
        escalation: w.escalation.as_ref(),
        repair: &repair,
        validation: &validation,
    };
    let condition = condition(&parts);
    let events = events(&parts, &condition);
    let next_change = next_change(policy, &markers, &parts, now);
    let forget_approval = forget_approval(&parts, &effective);
    let defer_to = node.conflicts.iter().filter(|c| c.as_str() < name).min().cloned();
    let (quarantines, healthy_gpus) = (gpus.quarantines, gpus.healthy);
    NodePlan {
        node: node.name.clone(),
        write: defer_to.is_none() && !matches!(blocked, Some(Block::Skip | Block::Paused)),
        defer_to,
        state: node.verdict.state,
        drifting,
        markers,
        taints: level.taints,
        cordon: level.cordon,
        drain: level.drain,
        actions: effective.into_iter().collect(),
        pending,
        blocked,
        condition,
        events,
        since: w.node.since,
        before: before(node, timeout, now),
        next_change,
        forget_approval,
        quarantines,
        escalation: w.escalation.take(),
        healthy_gpus,
        repair,
        validation,
    }
}

/// What gpunode records on the node after this plan: the tracks of its classes and GPUs, its
/// cordon and drain, and the state of its repair and validation.
fn markers(
    w: &mut Work<'_>,
    level: &NodeLevel,
    gpus: &mut gpus::GpusAfter<'_>,
    repair: &RepairPlan,
    validation: &ValidationPlan,
    now: Timestamp,
) -> Markers {
    let node = w.node.view;
    Markers {
        classes: std::mem::take(&mut w.tracks),
        cordoned_by_us: level.cordoned_by_us,
        drain_started: level.drain_started,
        drained: match level.drain {
            DrainStep::Done { finished, .. } => Some(finished),
            _ => None,
        },
        user_uncordoned: w.user_uncordoned,
        gpus: std::mem::take(&mut gpus.tracks),
        escalated: w
            .escalation
            .as_ref()
            .map(|_| node.markers.escalated.unwrap_or(now)),
        repair: repair.track.clone(),
        validation: validation.track.clone(),
    }
}

/// What the node's own actions come to after this plan: gpunode's taints, cordon and drain.
struct NodeLevel {
    taints: BTreeSet<DriftTaint>,
    /// What to write to `spec.unschedulable`, if anything.
    cordon: Option<bool>,
    /// gpunode's cordon is on the node after this plan.
    cordoned_by_us: bool,
    drain_started: Option<Timestamp>,
    drain: DrainStep,
    /// The drain is wanted but held back.
    drain_pending: bool,
}

/// The node's taints, cordon and drain once `admitted` is in effect.
fn node_level(node: &NodeView, admitted: &Admitted, timeout: SignedDuration, now: Timestamp) -> NodeLevel {
    let effective = &admitted.effective;
    let taints: BTreeSet<DriftTaint> = effective
        .iter()
        .filter_map(|a| match a {
            Action::Taint(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let (cordon, cordoned_by_us) = cordon(node, effective.contains(&Action::Cordon));
    let drain_started = effective
        .contains(&Action::Drain)
        .then(|| node.markers.drain_started.unwrap_or(now));
    // A drain that starts now is not done, whatever an old `drained` marker says.
    let drained_before = node.markers.drain_started.and(node.markers.drained);
    NodeLevel {
        taints,
        cordon,
        cordoned_by_us,
        drain_started,
        drain: drain_step(drain_started, drained_before, timeout, now),
        drain_pending: admitted.pending.contains(&Action::Drain),
    }
}

/// The node's repair, once its drain and its GPUs' quarantines are known.
fn repair_of(
    policy: &GpuNodePolicySpec,
    admission: &Admission,
    candidate: &Candidate<'_>,
    level: &NodeLevel,
    gpus: &GpusAfter<'_>,
    drifting: &BTreeSet<DriftClass>,
    now: Timestamp,
) -> RepairPlan {
    let node = candidate.view;
    repair::decide(repair::RepairInput {
        policy: policy.repair.as_ref(),
        node: &node.name,
        track: &node.markers.repair,
        drain: &level.drain,
        state: node.verdict.state,
        drifting,
        last_heard: node.last_heard,
        object: node.repair_object.as_ref(),
        drifting_gpus: &repair::drifting_gpus(node),
        quarantined: &gpus.quarantines.iter().filter_map(Quarantine::idle_gpu).collect(),
        admission,
        candidate,
        drain_pending: level.drain_pending,
        now,
    })
}

/// The node recovered with nothing of gpunode's in effect: a person's approvals on it were for
/// this incident and are removed, so the next drift asks again.
fn forget_approval(p: &Parts<'_>, effective: &BTreeSet<Action>) -> bool {
    !p.node.approved.is_empty()
        && p.node.verdict.state == NodeState::Compliant
        && !is_disrupted(effective)
        && p.drain == DrainStep::None
        && p.repair.state == RepairState::Idle
        && p.validation.state == ValidationState::Idle
}

/// Cordon only if nobody else did; uncordon only what gpunode cordoned. What to write
/// (`Some(true)`: cordon, `Some(false)`: uncordon), and whether gpunode's cordon is on the node
/// after this plan.
fn cordon(node: &NodeView, want: bool) -> (Option<bool>, bool) {
    let ours = node.markers.cordoned_by_us && node.unschedulable;
    match (want, ours, node.unschedulable) {
        (true, true, _) => (None, true),
        // Cordoned by someone else: leave it theirs.
        (true, false, true) => (None, false),
        (true, false, false) => (Some(true), true),
        (false, true, _) => (Some(false), false),
        (false, false, _) => (None, false),
    }
}

/// What gpunode had in effect on the node before this plan (what stays in effect when the plan
/// is not written).
fn before(node: &NodeView, timeout: SignedDuration, now: Timestamp) -> InEffect {
    InEffect {
        actions: current(node).into_iter().collect(),
        tainted: !node.taints.is_empty(),
        cordoned: node.markers.cordoned_by_us && node.unschedulable,
        drain: drain_step(node.markers.drain_started, node.markers.drained, timeout, now),
        repair: RepairInEffect::of(&node.markers.repair),
        validating: validating(node.markers.validation.as_ref()),
    }
}

/// The command that approves what waits for a person on the node (an action of the ladder or
/// a repair step), if anything does.
fn approval<'p>(p: &Parts<'p>) -> Option<&'p str> {
    match (p.blocked, &p.repair.state) {
        (Some(Block::Approval { command, .. }), _)
        | (
            _,
            RepairState::Waiting {
                block: Block::Approval { command, .. },
                ..
            },
        ) => Some(command),
        _ => None,
    }
}

/// The node's condition: its verdict and drain, what waits and why, its validation and repair,
/// a person's approval awaited, its GPUs.
fn condition(p: &Parts<'_>) -> NodeCondition {
    let mut condition = verdict_condition(p.node, &p.drain, p.blocked, p.pending);
    validation::condition(&mut condition, &p.validation.state);
    repair::condition(&mut condition, &p.repair.state);
    // A rung waits for a person: the condition says so, and how to approve it.
    if approval(p).is_some() && matches!(condition.reason, Reason::Drifted | Reason::Drained) {
        condition.reason = Reason::AwaitingApproval;
    }
    gpus::condition(&mut condition, &p.gpus.taints, &p.gpus.quarantines, p.escalation);
    condition
}

/// The node's Events: its state, taints, cordon and drain, its GPUs, its validation and repair,
/// and a person's approval newly awaited.
fn events(p: &Parts<'_>, condition: &NodeCondition) -> Vec<PlannedEvent> {
    let node = p.node;
    let mut events = state_events(node, p.blocked, p.pending);
    events.extend(taint_events(node, p.taints));
    events.extend(cordon_event(p.cordon));
    events.extend(drain_event(node, &p.drain, p.user_uncordoned));
    events.extend(gpus::events(
        node,
        &p.gpus.taints,
        &p.gpus.quarantines,
        p.escalation,
    ));
    events.extend(p.validation.events.iter().cloned());
    events.extend(p.repair.events.iter().cloned());
    if let Some(command) = approval(p)
        && condition.reason == Reason::AwaitingApproval
        && node.current_reason != Some(Reason::AwaitingApproval)
    {
        events.push(PlannedEvent {
            warning: true,
            reason: Reason::AwaitingApproval,
            note: format!("a rung of the policy requires a person's approval; to approve it: {command}"),
        });
    }
    events
}

/// When a node's plan next changes with time alone: a rule's `after` passing for one of its
/// classes, a cleared class reaching `healthyFor`, the drain reaching its timeout, the report
/// going stale, a repair step or validation timing out, a window opening for what waits for it.
/// The earliest after `now`. (A fatal XID leaving `gpu.xidWindow` is not among them: that
/// verdict change waits for the next look, at most [`super::IDLE_REQUEUE`] away.)
fn next_change(
    policy: &GpuNodePolicySpec,
    markers: &Markers,
    p: &Parts<'_>,
    now: Timestamp,
) -> Option<NextChange> {
    let mut changes = changes(policy, &markers.classes, &markers.gpus);
    if let DrainStep::Run {
        started,
        stuck: false,
    } = p.drain
    {
        changes.extend(at(
            started,
            policy.disruption.drain.timeout,
            ChangeCause::DrainTimeout,
        ));
    }
    // From the heartbeat as it is now: a verdict cache's bound would be from when the verdict
    // was computed, and a pass would wake for each node's long-renewed heartbeat in turn.
    if let Some(heard) = p.node.last_heard {
        changes.extend(at(heard, policy.stale_after, ChangeCause::Stale));
    }
    changes.extend(p.node.verdict.changes_at.map(|at| NextChange {
        at,
        cause: ChangeCause::Verdict,
    }));
    let next = changes.into_iter().filter(|c| c.at > now).min_by_key(|c| c.at);
    let repair = p.repair.deadline.filter(|d| *d > now);
    let next = NextChange::earliest(next, repair, ChangeCause::RepairTimeout);
    let validation = p.validation.deadline.filter(|d| *d > now);
    let next = NextChange::earliest(next, validation, ChangeCause::ValidationTimeout);
    // What waits for a window is planned again when it opens.
    let repair_waits = match &p.repair.state {
        RepairState::Waiting { block, .. } => Some(block),
        _ => None,
    };
    let window_opens = [p.blocked.as_ref().filter(|_| !p.pending.is_empty()), repair_waits]
        .into_iter()
        .flatten()
        .find_map(|b| match b {
            Block::OutsideWindow { opens } if *opens > now => Some(*opens),
            _ => None,
        });
    NextChange::earliest(next, window_opens, ChangeCause::WindowOpens)
}

fn drain_step(
    started: Option<Timestamp>,
    drained: Option<Timestamp>,
    timeout: SignedDuration,
    now: Timestamp,
) -> DrainStep {
    match (started, drained) {
        (Some(started), Some(finished)) => DrainStep::Done { started, finished },
        (Some(started), None) => DrainStep::Run {
            started,
            stuck: elapsed(now, started) >= timeout,
        },
        (None, _) => DrainStep::None,
    }
}

/// The condition from the verdict and the drain, with what waits and why.
fn verdict_condition(
    node: &NodeView,
    drain: &DrainStep,
    blocked: &Option<Block>,
    pending: &[Action],
) -> NodeCondition {
    let summary = node.verdict.summary();
    let (status, reason) = match node.verdict.state {
        NodeState::Compliant => ("True", Reason::Compliant),
        NodeState::Drifted => ("False", Reason::Drifted),
        NodeState::Unknown if nvml_hung(&node.verdict) => ("Unknown", Reason::NvmlHung),
        NodeState::Unknown => ("Unknown", Reason::Unknown),
    };
    let (reason, mut message) = match drain {
        DrainStep::Run { stuck: true, started } => (
            Reason::DrainStuck,
            format!("{summary}; drain running since {started} is stuck"),
        ),
        DrainStep::Run { .. } => (Reason::Draining, format!("{summary}; draining")),
        DrainStep::Done { finished, .. } => (Reason::Drained, format!("{summary}; drained at {finished}")),
        DrainStep::None => (reason, summary),
    };
    if let Some(b) = blocked
        && !pending.is_empty()
    {
        let actions: Vec<String> = pending.iter().map(Action::describe).collect();
        message = match b {
            Block::OutsideWindow { opens } => format!(
                "{message}; waiting for the maintenance window that opens at {opens}: {}",
                actions.join(", ")
            ),
            Block::Approval { rungs, command } => format!(
                "{message}; {} waiting for approval of {} ({command})",
                actions.join(", "),
                rungs.join(", ")
            ),
            _ => format!("{message}; waiting ({}): {}", b.describe(), actions.join(", ")),
        };
    }
    NodeCondition {
        status,
        reason,
        message,
    }
}

/// Whether the verdict is unknown because the probe's NVML calls hang.
fn nvml_hung(verdict: &crate::verdict::Verdict) -> bool {
    verdict
        .unknowns
        .iter()
        .any(|u| u.check == crate::evaluate::check::NVML_HUNG)
}

/// An Event when the node's state changes (its first verdict being Compliant is not news), and
/// one when something new waits for a gate other than skip, pause or dry run.
fn state_events(node: &NodeView, blocked: &Option<Block>, pending: &[Action]) -> Vec<PlannedEvent> {
    let mut out = Vec::new();
    let state = node.verdict.state;
    // A node's first verdict being Compliant is not news: an Event per node there made a third
    // of all writes when a policy is first applied (the scale benchmark).
    let first_and_fine = node.current_state.is_none() && state == NodeState::Compliant;
    if node.current_state != Some(state) && !first_and_fine {
        let (warning, reason) = match state {
            NodeState::Compliant => (false, Reason::Compliant),
            NodeState::Drifted => (true, Reason::Drifted),
            NodeState::Unknown => (true, Reason::Unknown),
        };
        out.push(PlannedEvent {
            warning,
            reason,
            note: node.verdict.summary(),
        });
    }
    if blocked.is_some() && !matches!(blocked, Some(Block::DryRun | Block::Skip | Block::Paused)) {
        // Only when something new is held back, so a queue does not repeat itself.
        if !pending.is_empty() && node.current_state != Some(state) {
            out.push(PlannedEvent {
                warning: false,
                reason: Reason::RemediationWaiting,
                note: blocked.as_ref().map(Block::describe).unwrap_or_default(),
            });
        }
    }
    out
}

/// Events for gpunode's taints added and removed.
fn taint_events(node: &NodeView, taints: &BTreeSet<DriftTaint>) -> Vec<PlannedEvent> {
    let added = taints.difference(&node.taints).map(|t| PlannedEvent {
        warning: true,
        reason: Reason::Tainted,
        note: format!("added taint {}", t.display()),
    });
    let removed = node.taints.difference(taints).map(|t| PlannedEvent {
        warning: false,
        reason: Reason::TaintRemoved,
        note: format!("removed taint {}", t.display()),
    });
    added.chain(removed).collect()
}

/// The Event for a cordon written or lifted.
fn cordon_event(cordon: Option<bool>) -> Option<PlannedEvent> {
    match cordon {
        Some(true) => Some(PlannedEvent {
            warning: true,
            reason: Reason::Cordoned,
            note: "marked unschedulable by gpunode".to_string(),
        }),
        Some(false) => Some(PlannedEvent {
            warning: false,
            reason: Reason::Uncordoned,
            note: "gpunode's cordon lifted after recovery".to_string(),
        }),
        None => None,
    }
}

/// The Event for a drain that starts, gets stuck, is done, is cancelled by a person or ends.
fn drain_event(
    node: &NodeView,
    drain: &DrainStep,
    user_uncordoned: Option<Timestamp>,
) -> Option<PlannedEvent> {
    let event = |warning, reason, note: &str| {
        Some(PlannedEvent {
            warning,
            reason,
            note: note.to_string(),
        })
    };
    match (node.markers.drain_started, drain) {
        (None, DrainStep::Run { .. }) => event(
            true,
            Reason::DrainStarted,
            "evicting pods through the Eviction API",
        ),
        (Some(_), DrainStep::Run { stuck: true, .. }) if node.current_reason != Some(Reason::DrainStuck) => {
            event(
                true,
                Reason::DrainStuck,
                "drain has run past its timeout; still retrying, never forcing",
            )
        }
        // Once: the condition says Drained from then on, or what the repair after it says.
        (Some(_), DrainStep::Done { .. })
            if !matches!(
                node.current_reason,
                Some(
                    Reason::Drained
                        | Reason::Repairing
                        | Reason::NeedsHuman
                        | Reason::AwaitingApproval
                        | Reason::Validating
                        | Reason::ValidationFailed
                )
            ) =>
        {
            event(
                false,
                Reason::Drained,
                "every pod the drain may evict has been evicted; the node stays cordoned until it recovers",
            )
        }
        (Some(_), DrainStep::None) if user_uncordoned.is_some() && node.markers.user_uncordoned.is_none() => {
            event(
                true,
                Reason::DrainCancelled,
                "node uncordoned by a user; gpunode will not cordon it again until it recovers",
            )
        }
        (Some(_), DrainStep::None) => event(false, Reason::DrainEnded, "drain no longer needed"),
        _ => None,
    }
}
