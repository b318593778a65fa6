//! One node's plan ([`NodePlan`]): what the node should look like after this pass, assembled
//! from what the pass decided for it (the actions admitted, the validation) and the feature
//! planners' parts (its GPUs' quarantines, its repair), with the words for it: its condition,
//! its Events, and when it next changes with time alone.
//!
//! Pure. It may import every layer below it (view, output, hysteresis, admission, the feature
//! planners), never the pass ([`super::plan`]).

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use jiff::{SignedDuration, Timestamp};

use super::{
    admission::Block,
    gpus::{self, Escalation, Quarantine},
    hysteresis::{changes, elapsed, signed},
    ladder::current,
    output::{
        Action, ChangeCause, DrainStep, GpuTaint, InEffect, NextChange, NodeCondition, PlannedEvent,
        RepairInEffect, is_disrupted, validating,
    },
    repair::{self, RepairPlan, RepairState},
    validation::{self, ValidationPlan, ValidationState},
    view::NodeView,
};
use crate::{
    markers::{self, ClassTrack, DriftTaint, GpuTrack, Markers},
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

/// Why wanted actions wait, and what keeps a repair step from starting.
pub(super) struct Gates {
    pub(super) blocked: Option<Block>,
    pub(super) repair: Option<Block>,
}

/// A node's tracks after this plan: its classes, its GPUs, and its escalation.
pub(super) struct Tracks {
    pub(super) classes: BTreeMap<DriftClass, ClassTrack>,
    pub(super) gpus: BTreeMap<String, GpuTrack>,
    pub(super) escalation: Option<Escalation>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn node_plan(
    name: &str,
    policy: &GpuNodePolicySpec,
    node: &NodeView,
    tracks: Tracks,
    user_uncordoned: Option<Timestamp>,
    since: Option<Timestamp>,
    effective: BTreeSet<Action>,
    pending: Vec<Action>,
    gates: Gates,
    validation: ValidationPlan,
    now: Timestamp,
) -> NodePlan {
    let blocked = gates.blocked;
    let defer_to = node.conflicts.iter().filter(|c| c.as_str() < name).min().cloned();
    let write = defer_to.is_none() && !matches!(blocked, Some(Block::Skip | Block::Paused));
    let disrupted_after = is_disrupted(&effective);
    let taints: BTreeSet<DriftTaint> = effective
        .iter()
        .filter_map(|a| match a {
            Action::Taint(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let want_cordon = effective.contains(&Action::Cordon);
    let want_drain = effective.contains(&Action::Drain);

    // Cordon: only if nobody else did; uncordon only what gpunode cordoned.
    let (cordon, cordoned_by_us) = if want_cordon {
        if node.markers.cordoned_by_us && node.unschedulable {
            (None, true)
        } else if node.unschedulable {
            (None, false) // cordoned by someone else: leave it theirs
        } else {
            (Some(true), true)
        }
    } else if node.markers.cordoned_by_us && node.unschedulable {
        (Some(false), false)
    } else {
        (None, false)
    };

    let drain_started = if want_drain {
        Some(node.markers.drain_started.unwrap_or(now))
    } else {
        None
    };
    let timeout = signed(policy.disruption.drain.timeout);
    // A drain that starts now is not done, whatever an old `drained` marker says.
    let drained_before = node.markers.drain_started.and(node.markers.drained);
    let drain = drain_step(drain_started, drained_before, timeout, now);
    let before = InEffect {
        actions: current(node).into_iter().collect(),
        tainted: !node.taints.is_empty(),
        cordoned: node.markers.cordoned_by_us && node.unschedulable,
        drain: drain_step(node.markers.drain_started, node.markers.drained, timeout, now),
        repair: RepairInEffect::of(&node.markers.repair),
        validating: validating(node.markers.validation.as_ref()),
    };
    let drained = match drain {
        DrainStep::Done { finished, .. } => Some(finished),
        _ => None,
    };

    // Each GPU's track records the quarantine in effect after this plan.
    let gpu_taints: BTreeMap<&str, &GpuTaint> = effective
        .iter()
        .filter_map(|a| match a {
            Action::TaintDevice(t) => Some((t.gpu.as_str(), t)),
            _ => None,
        })
        .collect();
    let mut gpu_tracks = tracks.gpus;
    for (key, track) in &mut gpu_tracks {
        track.quarantined = gpu_taints.get(key.as_str()).map(|t| t.effect);
    }
    gpu_tracks.retain(|_, t| !t.classes.is_empty() || t.quarantined.is_some());
    let driver = policy.quarantine.dra_driver.as_str();
    let quarantines: Vec<Quarantine> = gpu_taints
        .values()
        .filter_map(|t| {
            gpus::target(&t.gpu, t.effect, &node.devices, driver)
                .ok()
                .map(|target| Quarantine {
                    taint: (*t).clone(),
                    target,
                })
        })
        .collect();
    let quarantined: BTreeSet<u32> = gpu_taints.values().map(|t| t.index).collect();
    let healthy_gpus = gpus::healthy(node, &quarantined);
    let escalation = tracks.escalation;
    let escalated = escalation.as_ref().map(|_| node.markers.escalated.unwrap_or(now));

    let state = node.verdict.state;
    let drifting = node.verdict.classes();
    let repair = repair::decide(repair::RepairInput {
        policy: policy.repair.as_ref(),
        node: &node.name,
        track: &node.markers.repair,
        drain: &drain,
        state,
        drifting: &drifting,
        last_heard: node.last_heard,
        object: node.repair_object.as_ref(),
        drifting_gpus: &drifting_gpus(node),
        approved: &node.approved,
        quarantined: &quarantines.iter().filter_map(Quarantine::idle_gpu).collect(),
        gate: gates.repair.as_ref(),
        drain_pending: pending.contains(&Action::Drain),
        now,
    });

    let markers = Markers {
        classes: tracks.classes,
        cordoned_by_us,
        drain_started,
        drained,
        user_uncordoned,
        gpus: gpu_tracks,
        escalated,
        repair: repair.track.clone(),
        validation: validation.track.clone(),
    };

    let mut condition = condition(node, &drain, &blocked, &pending);
    validation::condition(&mut condition, &validation.state);
    repair::condition(&mut condition, &repair.state);
    // A rung waits for a person: the condition says so, and how to approve it.
    let approval = match (&blocked, &repair.state) {
        (Some(Block::Approval { command, .. }), _)
        | (
            _,
            RepairState::Waiting {
                block: Block::Approval { command, .. },
                ..
            },
        ) => Some(command.clone()),
        _ => None,
    };
    if approval.is_some() && matches!(condition.reason, Reason::Drifted | Reason::Drained) {
        condition.reason = Reason::AwaitingApproval;
    }
    if !gpu_taints.is_empty() {
        let list: Vec<String> = gpu_taints
            .values()
            .map(|t| {
                format!(
                    "{} {}{}",
                    t.subject(),
                    t.effect.as_str(),
                    gpus::on_device(&quarantines, t)
                )
            })
            .collect();
        condition.message = format!("{}; quarantined: {}", condition.message, list.join(", "));
    }
    if let Some(e) = &escalation {
        condition.message = format!("{}; escalated: {}", condition.message, e.describe());
    }
    let mut events = events(
        node,
        state,
        &taints,
        cordon,
        &drain,
        user_uncordoned,
        &blocked,
        &pending,
    );
    events.extend(gpus::events(node, &gpu_taints, &quarantines, escalation.as_ref()));
    events.extend(validation.events.iter().cloned());
    events.extend(repair.events.iter().cloned());
    if let Some(command) = approval
        && condition.reason == Reason::AwaitingApproval
        && node.current_reason != Some(Reason::AwaitingApproval)
    {
        events.push(PlannedEvent {
            warning: true,
            reason: Reason::AwaitingApproval,
            note: format!("a rung of the policy requires a person's approval; to approve it: {command}"),
        });
    }
    let next_change = next_change(policy, &markers, &drain, node.last_heard, now);
    let next_change = NextChange::earliest(
        next_change,
        repair.deadline.filter(|d| *d > now),
        ChangeCause::RepairTimeout,
    );
    let next_change = NextChange::earliest(
        next_change,
        validation.deadline.filter(|d| *d > now),
        ChangeCause::ValidationTimeout,
    );
    // What waits for a window is planned again when it opens.
    let repair_waits = match &repair.state {
        RepairState::Waiting { block, .. } => Some(block),
        _ => None,
    };
    let window_opens = [blocked.as_ref().filter(|_| !pending.is_empty()), repair_waits]
        .into_iter()
        .flatten()
        .find_map(|b| match b {
            Block::OutsideWindow { opens } if *opens > now => Some(*opens),
            _ => None,
        });
    let next_change = NextChange::earliest(next_change, window_opens, ChangeCause::WindowOpens);
    NodePlan {
        node: node.name.clone(),
        write,
        defer_to,
        state,
        drifting,
        markers,
        taints,
        cordon,
        drain,
        actions: effective.into_iter().collect(),
        pending,
        blocked,
        condition,
        events,
        since,
        before,
        next_change,
        forget_approval: !node.approved.is_empty()
            && state == NodeState::Compliant
            && !disrupted_after
            && drain == DrainStep::None
            && repair.state == RepairState::Idle
            && validation.state == ValidationState::Idle,
        quarantines,
        escalation,
        healthy_gpus,
        repair,
        validation,
    }
}

/// The node's drifting GPUs by class, those with a UUID (a GpuReset step's targets).
fn drifting_gpus(node: &NodeView) -> BTreeMap<DriftClass, BTreeSet<markers::ResetGpu>> {
    let uuids: BTreeMap<u32, &str> = node
        .gpus
        .iter()
        .filter_map(|g| Some((g.index, g.uuid.as_deref()?)))
        .collect();
    let mut out: BTreeMap<DriftClass, BTreeSet<markers::ResetGpu>> = BTreeMap::new();
    for d in &node.verdict.drifts {
        if let Some(index) = d.gpu
            && let Some(uuid) = uuids.get(&index)
        {
            out.entry(d.class).or_default().insert(markers::ResetGpu {
                index,
                uuid: (*uuid).to_string(),
            });
        }
    }
    out
}

/// The drain that began at `started` (if any): done once it found nothing left to evict at
/// `drained`, stuck once it has run for `timeout`.
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

/// When a node's plan next changes with time alone: a rule's `after` passing for one of its
/// classes, a cleared class reaching `healthyFor`, the drain reaching its timeout, the report
/// going stale. The earliest after `now`. (A fatal XID leaving `gpu.xidWindow` is not among
/// them: that verdict change waits for the next look, at most [`super::IDLE_REQUEUE`] away.)
fn next_change(
    policy: &GpuNodePolicySpec,
    markers: &Markers,
    drain: &DrainStep,
    last_heard: Option<Timestamp>,
    now: Timestamp,
) -> Option<NextChange> {
    let mut changes = changes(policy, &markers.classes, &markers.gpus);
    if let DrainStep::Run {
        started,
        stuck: false,
    } = drain
    {
        changes.extend(super::hysteresis::at(
            *started,
            policy.disruption.drain.timeout,
            ChangeCause::DrainTimeout,
        ));
    }
    // From the heartbeat as it is now: a verdict cache's bound would be from when the verdict
    // was computed, and a pass would wake for each node's long-renewed heartbeat in turn.
    if let Some(heard) = last_heard {
        changes.extend(super::hysteresis::at(
            heard,
            policy.stale_after,
            ChangeCause::Stale,
        ));
    }
    changes.into_iter().filter(|c| c.at > now).min_by_key(|c| c.at)
}

fn condition(
    node: &NodeView,
    drain: &DrainStep,
    blocked: &Option<Block>,
    pending: &[Action],
) -> NodeCondition {
    let summary = node.verdict.summary();
    let (status, reason) = match node.verdict.state {
        NodeState::Compliant => ("True", Reason::Compliant),
        NodeState::Drifted => ("False", Reason::Drifted),
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

#[allow(clippy::too_many_arguments)]
fn events(
    node: &NodeView,
    state: NodeState,
    taints: &BTreeSet<DriftTaint>,
    cordon: Option<bool>,
    drain: &DrainStep,
    user_uncordoned: Option<Timestamp>,
    blocked: &Option<Block>,
    pending: &[Action],
) -> Vec<PlannedEvent> {
    let mut out = Vec::new();
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
    for t in taints.difference(&node.taints) {
        out.push(PlannedEvent {
            warning: true,
            reason: Reason::Tainted,
            note: format!("added taint {}", t.display()),
        });
    }
    for t in node.taints.difference(taints) {
        out.push(PlannedEvent {
            warning: false,
            reason: Reason::TaintRemoved,
            note: format!("removed taint {}", t.display()),
        });
    }
    match cordon {
        Some(true) => out.push(PlannedEvent {
            warning: true,
            reason: Reason::Cordoned,
            note: "marked unschedulable by gpunode".to_string(),
        }),
        Some(false) => out.push(PlannedEvent {
            warning: false,
            reason: Reason::Uncordoned,
            note: "gpunode's cordon lifted after recovery".to_string(),
        }),
        None => {}
    }
    match (node.markers.drain_started, drain) {
        (None, DrainStep::Run { .. }) => out.push(PlannedEvent {
            warning: true,
            reason: Reason::DrainStarted,
            note: "evicting pods through the Eviction API".to_string(),
        }),
        (Some(_), DrainStep::Run { stuck: true, .. })
            if node.current_reason != Some(Reason::DrainStuck) =>
        {
            out.push(PlannedEvent {
                warning: true,
                reason: Reason::DrainStuck,
                note: "drain has run past its timeout; still retrying, never forcing".to_string(),
            })
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
            out.push(PlannedEvent {
                warning: false,
                reason: Reason::Drained,
                note: "every pod the drain may evict has been evicted; the node stays cordoned until it recovers"
                    .to_string(),
            })
        }
        (Some(_), DrainStep::None) if user_uncordoned.is_some() && node.markers.user_uncordoned.is_none() => {
            out.push(PlannedEvent {
                warning: true,
                reason: Reason::DrainCancelled,
                note: "node uncordoned by a user; gpunode will not cordon it again until it recovers"
                    .to_string(),
            })
        }
        (Some(_), DrainStep::None) => out.push(PlannedEvent {
            warning: false,
            reason: Reason::DrainEnded,
            note: "drain no longer needed".to_string(),
        }),
        _ => {}
    }
    out
}
