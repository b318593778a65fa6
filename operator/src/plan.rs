//! The planner: from a policy, the verdicts of its nodes and what gpunode already did to them,
//! decide what each node should look like now. Pure: time is a parameter, nothing is written.
//!
//! Rules (DESIGN §3):
//! - **Hysteresis.** A class is *active* while it drifts and until it has stayed clear for
//!   `recovery.healthyFor`; a drift that returns within that time keeps its original start. A rule
//!   fires once one of its classes has been active for the rule's `after`; what it did is undone
//!   only when none of its classes is active any more. Flapping input therefore gives one action
//!   and one undo, never a flapping taint.
//! - **Budget.** NoSchedule/NoExecute taints, cordons and drains are disruptive. A node that is
//!   not yet disrupted by gpunode is admitted only while fewer than `maxUnavailable` of the
//!   policy's nodes are; the rest queue, oldest drift first. Undoing is never limited.
//! - **Circuit breaker.** When more than `maxDriftedPercent` of the nodes (and more than one
//!   node) began drifting within `window`, no disruption is added anywhere.
//! - **Conflict, skip, dry run, pause.** A node selected by another policy gets no new disruption,
//!   and only the first of the overlapping policies by name writes it (`NodePlan::defer_to`);
//!   `gpunode.dev/skip=true` and a paused policy leave the node untouched; dry run writes only
//!   the labels, the condition and the bookkeeping, and lists every action as pending.
//! - **Time.** Each node plan says when it next changes with time alone and why
//!   (`NodePlan::next_change`: an `after`, a `healthyFor`, a drain timeout, a report going
//!   stale); [`requeue_after`] turns that into when the policy is looked at again.
//! - **People win.** gpunode never uncordons a node it did not cordon; a person who uncordons a
//!   node gpunode cordoned or is draining cancels that, and gpunode does not cordon it again until
//!   the node has recovered.
//!
//! The planner is built in layers, each a module with one concept; a module imports only the
//! layers below it:
//!
//! | layer | module | what it holds |
//! | --- | --- | --- |
//! | what it reads | [`view`] | the per-node view ([`NodeView`]); observe builds it |
//! | what it says | [`output`] | actions, the drain, what is in effect, next changes, conditions, Events |
//! | hysteresis | [`hysteresis`] | the per-class tracks, `after` and `healthyFor` |
//! | the calendar | [`windows`] | where the maintenance windows stand |
//! | admission | [`admission`] | why a step waits ([`Block`]) |
//! | feature planners | [`ladder`], [`gpus`], [`repair`], [`validation`] | what each part of the policy wants, and its words |
//! | one node's plan | [`node`] | [`NodePlan`], assembled from the decisions, its condition and Events |
//! | the pass | this module | [`plan`]: every node of a policy, in order, and [`requeue_after`] |

pub mod admission;
pub mod gpus;
pub mod hysteresis;
pub mod ladder;
pub mod node;
pub mod output;
pub mod repair;
pub mod validation;
pub mod view;
pub mod windows;

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use jiff::{SignedDuration, Timestamp};

use crate::{
    markers::{ClassTrack, GpuTrack},
    verdict::{NodeState, Verdict},
};

pub use admission::{Block, approve_command};
pub use gpus::{Escalation, Quarantine, QuarantineTarget, quarantine_of};
pub use hysteresis::track_classes;
pub use node::NodePlan;
pub use output::{
    Action, ChangeCause, DrainStep, GpuTaint, InEffect, NextChange, NodeCondition, PlannedEvent,
    RepairInEffect,
};
pub use repair::{EnsureObject, MadeFrom, RepairPlan, RepairState};
pub use validation::{ValidationPlan, ValidationState};
pub use view::{DeviceRef, GpuPods, GpuView, JobState, NodeDevices, NodeView, PodRef, StepObject, approvals};

use hysteresis::{elapsed, signed};
use ladder::{current, wanted};
use node::{Gates, Tracks, node_plan};
use output::is_disrupted;

/// The plan for every node of a policy, plus the policy-wide decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyPlan {
    /// One per node, in the order disruption was admitted (oldest drift first).
    pub nodes: Vec<NodePlan>,
    /// Nodes that may be disrupted at once.
    pub budget_allowed: u32,
    /// Nodes disrupted by gpunode now or after this plan (an undo frees its slot once written).
    pub budget_in_use: u32,
    /// Nodes waiting for the budget.
    pub budget_queued: u32,
    /// The circuit breaker is open.
    pub circuit_open: bool,
    /// Nodes that began drifting within the breaker window.
    pub recently_drifted: u32,
    /// Where the maintenance windows stand.
    pub window: windows::WindowState,
    /// Why `spec.validation.template` cannot be used, if it cannot.
    pub invalid_validation: Option<String>,
}

impl PolicyPlan {
    /// The first time any node's plan changes with time alone.
    pub fn next_change(&self) -> Option<NextChange> {
        self.nodes
            .iter()
            .filter_map(|n| n.next_change)
            .min_by_key(|c| c.at)
    }
}

/// Longest a policy waits between two looks when nothing is due.
pub const IDLE_REQUEUE: std::time::Duration = std::time::Duration::from_secs(300);

/// How often a policy with a running drain is looked at: evictions refused by a
/// PodDisruptionBudget are retried.
pub const DRAIN_REQUEUE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long after `now` the policy should be looked at again if nothing else changes: just after
/// its plan's next change, at most [`DRAIN_REQUEUE`] while a drain runs and [`IDLE_REQUEUE`]
/// otherwise.
pub fn requeue_after(plan: &PolicyPlan, now: Timestamp) -> std::time::Duration {
    let wait = plan.next_change().map_or(IDLE_REQUEUE, |c| {
        std::time::Duration::try_from(c.at.duration_since(now)).unwrap_or(IDLE_REQUEUE)
    });
    // Evictions (a drain, or the pods of a quarantined GPU) are retried soon: a refusal by a
    // PodDisruptionBudget lifts without any change gpunode watches. A repair step's object has
    // no watch either: it is looked at as often.
    let draining = plan.nodes.iter().any(|n| {
        matches!(n.drain, DrainStep::Run { .. })
            || n.evicts_gpu_holders()
            || n.repair.polls()
            || n.validation.polls()
    });
    let cap = if draining { DRAIN_REQUEUE } else { IDLE_REQUEUE };
    // Just after: a change due exactly `now` has not happened yet.
    (wait + std::time::Duration::from_millis(100)).min(cap)
}

/// Plans every node of policy `name` (whose spec is `policy`).
pub fn plan(name: &str, policy: &GpuNodePolicySpec, nodes: &[NodeView], now: Timestamp) -> PolicyPlan {
    let healthy_for = signed(policy.recovery.healthy_for);
    let matched = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
    let gpu_handled = gpus::handled(policy);
    // A failed validation is a drift of the node (class Validation) until a repair step mends
    // it: only those nodes' views are copied.
    let nodes: Vec<std::borrow::Cow<'_, NodeView>> = nodes
        .iter()
        .map(|n| {
            let failed = policy.validation.as_ref().and_then(|v| {
                validation::failure_drift(
                    n.markers.validation.as_ref(),
                    n.validation_job.as_ref(),
                    &n.markers.repair,
                    v.timeout,
                    now,
                )
            });
            match failed {
                Some(drift) => {
                    let mut n = n.clone();
                    let mut drifts = n.verdict.drifts.clone();
                    drifts.push(drift);
                    n.verdict = Verdict::new(drifts, n.verdict.unknowns.clone());
                    std::borrow::Cow::Owned(n)
                }
                None => std::borrow::Cow::Borrowed(n),
            }
        })
        .collect();

    // Per node: tracks, what the ladder wants, what is in effect.
    struct Work<'a> {
        node: &'a NodeView,
        tracks: BTreeMap<DriftClass, ClassTrack>,
        wanted: BTreeSet<Action>,
        current: BTreeSet<Action>,
        user_uncordoned: Option<Timestamp>,
        since: Option<Timestamp>,
        gpu_tracks: BTreeMap<String, GpuTrack>,
        escalation: Option<Escalation>,
        awaiting: BTreeMap<Action, String>,
        due: bool,
    }
    let mut work: Vec<Work> = nodes
        .iter()
        .map(|node| {
            let node: &NodeView = node;
            let tracks = track_classes(&node.markers.classes, &node.verdict, healthy_for, now);
            let gpu_tracks = gpus::track(&node.markers.gpus, node, &gpu_handled, healthy_for, now);
            let gpu = gpus::decide(policy, &gpu_tracks, &node.devices, now);
            let (mut wanted, gated) = wanted(policy, &tracks, &gpu_handled, gpu.escalation.is_some(), now);
            wanted.extend(gpu.taints.into_values().map(Action::TaintDevice));
            let mut current = current(node);
            // A rung a person has not approved yet is not taken; what is in effect already stays.
            let awaiting: BTreeMap<Action, String> = gated
                .into_iter()
                .filter(|(a, rung)| !current.contains(a) && !node.approved.contains(rung))
                .collect();
            for a in awaiting.keys() {
                wanted.remove(a);
            }
            // A person uncordoned what gpunode cordoned: cancel, and hold off until recovery.
            let mut user_uncordoned = node.markers.user_uncordoned;
            if node.markers.cordoned_by_us && !node.unschedulable {
                user_uncordoned = Some(now);
                current.remove(&Action::Drain);
            }
            if user_uncordoned.is_some() {
                // A drain a person cancelled is over, whatever the ladder wants now: its stale
                // marker takes no capacity and must not count against the budget (it would let
                // another disruptive action onto the node without a slot).
                current.remove(&Action::Drain);
                if wanted.contains(&Action::Cordon) {
                    wanted.remove(&Action::Cordon);
                    wanted.remove(&Action::Drain);
                } else {
                    user_uncordoned = None;
                }
            }
            // A recovered node keeps gpunode's cordon, drain and taints until its validation
            // passed.
            // A PreferNoSchedule taint alone is a hint, not worth a validation.
            let due = policy.validation.is_some()
                && current.iter().any(|a| a.is_node_level() && a.is_disruptive())
                && !wanted.iter().any(Action::is_node_level);
            if due && !validation::passed(node.markers.validation.as_ref(), node.validation_job.as_ref()) {
                wanted.extend(current.iter().filter(|a| a.is_node_level()).cloned());
            }
            let since = hysteresis::since(&tracks);
            Work {
                node,
                tracks,
                wanted,
                current,
                user_uncordoned,
                since,
                gpu_tracks,
                escalation: gpu.escalation,
                awaiting,
                due,
            }
        })
        .collect();

    // Oldest drift first gets the budget; ties by name for determinism.
    work.sort_by(|a, b| {
        (a.since.is_none(), a.since, &a.node.name).cmp(&(b.since.is_none(), b.since, &b.node.name))
    });

    let passive = |node: &NodeView| {
        if node.skip {
            Some(Block::Skip)
        } else if policy.paused {
            Some(Block::Paused)
        } else if policy.dry_run {
            Some(Block::DryRun)
        } else {
            None
        }
    };
    // What stays in effect before anything new is admitted: everything when nothing may be
    // written, otherwise what the ladder still wants.
    let kept: Vec<BTreeSet<Action>> = work
        .iter()
        .map(|w| match passive(w.node) {
            Some(_) => w.current.clone(),
            None => w.current.intersection(&w.wanted).cloned().collect(),
        })
        .collect();

    let budget_allowed = policy.disruption.max_unavailable.resolve(matched);
    // A node counts while it is disrupted now or will be after this plan: an undo frees its
    // slot only once written. The writes of one reconcile run concurrently, so handing the slot
    // to a queued node in the same plan could put both out of service at once; the reconcile
    // that the undo's node update triggers admits the queued node instead.
    // A validation running counts too: its Job holds the node's GPUs.
    let validating = |w: &Work| {
        w.node
            .markers
            .validation
            .as_ref()
            .is_some_and(|t| t.ended.is_none() && (w.due || t.periodic))
    };
    let mut in_use = u32::try_from(
        work.iter()
            .zip(&kept)
            .filter(|(w, k)| is_disrupted(k) || is_disrupted(&w.current) || validating(w))
            .count(),
    )
    .unwrap_or(u32::MAX);
    let mut validation_slots = policy.validation.as_ref().map_or(0, |v| {
        v.max_concurrent
            .saturating_sub(u32::try_from(work.iter().filter(|w| validating(w)).count()).unwrap_or(u32::MAX))
    });
    // Periodic validations started within the last hour, across the policy's nodes.
    let hour_ago = now.checked_sub(SignedDuration::from_hours(1)).unwrap_or(now);
    let mut started_last_hour = u32::try_from(
        work.iter()
            .filter(|w| {
                w.node
                    .markers
                    .validation
                    .as_ref()
                    .is_some_and(|t| t.periodic && t.started > hour_ago)
            })
            .count(),
    )
    .unwrap_or(u32::MAX);
    let template = policy
        .validation
        .as_ref()
        .map(|v| v.pod_template())
        .unwrap_or(Err(String::new()));

    let window = signed(policy.disruption.circuit_breaker.window);
    let recently_drifted = u32::try_from(
        work.iter()
            .filter(|w| w.since.is_some_and(|s| elapsed(now, s) <= window))
            .count(),
    )
    .unwrap_or(u32::MAX);
    let pct = policy.disruption.circuit_breaker.max_drifted_percent;
    // A single drifting node is a node fault, never a systemic one: the threshold is at least 1.
    let threshold = (u64::from(pct) * u64::from(matched) / 100).max(1);
    let circuit_open = pct < 100 && u64::from(recently_drifted) > threshold;

    let window_state = windows::state(policy.maintenance.as_ref(), now);
    let mut queued = 0;
    let mut plans = Vec::with_capacity(work.len());
    for (w, kept) in work.into_iter().zip(kept) {
        let node = w.node;
        // Outside the windows, disruption waits unless the node drifts in an urgent class.
        let urgent = windows::urgent(
            policy.maintenance.as_ref(),
            hysteresis::active(&w.tracks, &w.gpu_tracks),
        );
        let window_block = match &window_state {
            _ if urgent => None,
            windows::WindowState::Open => None,
            windows::WindowState::Closed { opens } => Some(Block::OutsideWindow { opens: *opens }),
            windows::WindowState::Invalid(why) => Some(Block::InvalidWindow(why.clone())),
        };
        // What keeps a repair step from starting: what keeps any disruption from starting,
        // except the budget (a drained node already holds its slot).
        let repair_gate = passive(node)
            .or_else(|| (!node.conflicts.is_empty()).then(|| Block::Conflict(node.conflicts.clone())))
            .or_else(|| circuit_open.then_some(Block::CircuitOpen))
            .or_else(|| window_block.clone());
        let additions: Vec<Action> = w.wanted.difference(&kept).cloned().collect();
        let (effective, pending, blocked) = if let Some(b) = passive(node) {
            (kept, additions, Some(b))
        } else {
            let disruptive_additions = additions.iter().any(Action::is_disruptive);
            let gate = if !disruptive_additions {
                None
            } else if !node.conflicts.is_empty() {
                Some(Block::Conflict(node.conflicts.clone()))
            } else if circuit_open {
                Some(Block::CircuitOpen)
            } else if let Some(b) = window_block.clone() {
                Some(b)
            } else if !is_disrupted(&kept) && !is_disrupted(&w.current) && in_use >= budget_allowed {
                Some(Block::Budget)
            } else {
                None
            };
            match gate {
                None => {
                    if disruptive_additions && !is_disrupted(&kept) && !is_disrupted(&w.current) {
                        in_use += 1;
                    }
                    (w.wanted.clone(), Vec::new(), None)
                }
                Some(gate) => {
                    if gate == Block::Budget {
                        queued += 1;
                    }
                    // Take the harmless additions, hold back the disruptive ones.
                    let (held, harmless): (Vec<Action>, Vec<Action>) =
                        additions.into_iter().partition(Action::is_disruptive);
                    let mut eff = kept;
                    eff.extend(harmless);
                    (eff, held, Some(gate))
                }
            }
        };
        // What awaits a person's approval waits too, and says how to give it.
        let (pending, blocked) = if w.awaiting.is_empty() {
            (pending, blocked)
        } else {
            let mut pending = pending;
            pending.extend(w.awaiting.keys().cloned());
            let rungs: Vec<String> = w
                .awaiting
                .values()
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let command = approve_command(&node.name, &node.approved, &rungs);
            (pending, blocked.or(Some(Block::Approval { rungs, command })))
        };
        // A validation starts only where a disruption could, and takes a slot of the budget if
        // the node holds none.
        let holds_slot = is_disrupted(&effective) || is_disrupted(&w.current);
        let validation_gate = passive(node)
            .or_else(|| (!node.conflicts.is_empty()).then(|| Block::Conflict(node.conflicts.clone())))
            .or_else(|| circuit_open.then_some(Block::CircuitOpen))
            .or_else(|| (!holds_slot && in_use >= budget_allowed).then_some(Block::Budget));
        // Quiet: healthy, nothing of gpunode's on it or wanted, nothing recovering.
        let quiet = node.verdict.state == NodeState::Compliant
            && w.current.is_empty()
            && w.wanted.is_empty()
            && w.tracks.is_empty()
            && w.gpu_tracks.is_empty();
        let periodic = match policy.validation.as_ref() {
            Some(v) if let Some(p) = &v.periodic => {
                quiet
                    && validation_gate.is_none()
                    && window_block.is_none()
                    && validation_slots > 0
                    && started_last_hour < p.max_per_hour
                    && validation::periodic_due(
                        node.markers.validation.as_ref(),
                        &node.markers.repair,
                        signed(p.every),
                        now,
                    )
                    && validation::idle(node.gpus.len(), &node.devices, &v.namespace)
            }
            _ => false,
        };
        let validation = validation::decide(validation::ValidationInput {
            policy: policy.validation.as_ref(),
            policy_name: name,
            template: template.as_ref().map_err(String::as_str),
            node: &node.name,
            track: node.markers.validation.as_ref(),
            job: node.validation_job.as_ref(),
            due: w.due,
            settled: w.tracks.is_empty(),
            quiet,
            periodic,
            repair: &node.markers.repair,
            gate: validation_gate.as_ref(),
            slots: validation_slots,
            now,
        });
        if validation.started {
            validation_slots = validation_slots.saturating_sub(1);
            if !w.due {
                started_last_hour += 1;
            }
            if !holds_slot {
                in_use += 1;
            }
        }
        plans.push(node_plan(
            name,
            policy,
            node,
            Tracks {
                classes: w.tracks,
                gpus: w.gpu_tracks,
                escalation: w.escalation,
            },
            w.user_uncordoned,
            w.since,
            effective,
            pending,
            Gates {
                blocked,
                repair: repair_gate,
            },
            validation,
            now,
        ));
    }

    PolicyPlan {
        nodes: plans,
        budget_allowed,
        budget_in_use: in_use,
        budget_queued: queued,
        circuit_open,
        recently_drifted,
        window: window_state,
        invalid_validation: template.err().filter(|e| !e.is_empty()),
    }
}
