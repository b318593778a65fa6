//! The node's ladder: what the policy's remediation rules ask for on a node given its tracks
//! (taints, the cordon, the drain), which of those a person must approve first, and what
//! gpunode has in effect on the node now, and the rule that people win (a person's uncordon
//! cancels gpunode's cordon and drain). Per-GPU quarantines are planned by [`super::gpus`].
//!
//! A feature planner: pure, it says what is *wanted*, never whether it may start (that is
//! admission's). It may import the layers below it (view, output, hysteresis), never admission (it
//! decides nothing), the node plan, the pass or another feature planner.

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{
    DriftClass, GpuNodePolicySpec,
    policy::{RemediationAction, TaintEffect},
};
use jiff::Timestamp;

use super::{
    hysteresis::{elapsed, signed},
    output::{Action, GpuTaint},
    view::NodeView,
};
use crate::markers::{ClassTrack, DriftTaint};

/// What the node rules ask for given the tracks (ignoring budget, breaker and the rest). A class
/// handled per GPU (`gpu_handled`) counts for them only on an escalated node. Also returns the
/// actions only rules that require approval want, each with the rung that approves it.
pub(super) fn wanted(
    policy: &GpuNodePolicySpec,
    tracks: &BTreeMap<DriftClass, ClassTrack>,
    gpu_handled: &BTreeSet<DriftClass>,
    escalated: bool,
    now: Timestamp,
) -> (BTreeSet<Action>, BTreeMap<Action, String>) {
    let mut taints: BTreeMap<TaintEffect, DriftClass> = BTreeMap::new();
    let mut out = BTreeSet::new();
    // Actions only rules that require approval want, with the rung that approves them; and
    // what rules without approval want (those need none).
    let mut gated: BTreeMap<Action, String> = BTreeMap::new();
    let mut free: BTreeSet<Action> = BTreeSet::new();
    let mut taint_gated: BTreeSet<TaintEffect> = BTreeSet::new();
    let mut taint_free: BTreeSet<TaintEffect> = BTreeSet::new();
    for rule in &policy.remediation {
        let after = signed(rule.after);
        let firing: Vec<DriftClass> = rule
            .classes
            .iter()
            .copied()
            .filter(|c| escalated || !gpu_handled.contains(c))
            .filter(|c| tracks.get(c).is_some_and(|t| elapsed(now, t.since) >= after))
            .collect();
        let Some(first) = firing.iter().min().copied() else {
            continue;
        };
        let mut mark = |action: Action| {
            if rule.require_approval {
                gated
                    .entry(action.clone())
                    .or_insert_with(|| rung(rule.action).to_string());
            } else {
                free.insert(action.clone());
            }
            out.insert(action);
        };
        match (rule.action, rule.effect) {
            (RemediationAction::Label, _) => {}
            (RemediationAction::Taint, Some(effect)) => {
                let e = taints.entry(effect).or_insert(first);
                *e = (*e).min(first);
                if rule.require_approval {
                    taint_gated.insert(effect);
                } else {
                    taint_free.insert(effect);
                }
            }
            // Rejected by the API server; a rule that slipped through does nothing.
            (RemediationAction::Taint, None) => {}
            (RemediationAction::Cordon, _) => mark(Action::Cordon),
            (RemediationAction::Drain, _) => {
                mark(Action::Cordon);
                mark(Action::Drain);
            }
            // Planned per GPU (`gpus::decide`).
            (RemediationAction::TaintDevice, _) => {}
        }
    }
    for (effect, class) in taints {
        let action = Action::Taint(DriftTaint {
            effect,
            value: class.label(),
        });
        if taint_gated.contains(&effect) && !taint_free.contains(&effect) {
            gated.insert(action.clone(), rung(RemediationAction::Taint).to_string());
        }
        out.insert(action);
    }
    gated.retain(|a, _| !free.contains(a));
    (out, gated)
}

/// The name a person approves a rule's action by.
fn rung(action: RemediationAction) -> &'static str {
    match action {
        RemediationAction::Label => "Label",
        RemediationAction::Taint => "Taint",
        RemediationAction::Cordon => "Cordon",
        RemediationAction::Drain => "Drain",
        RemediationAction::TaintDevice => "TaintDevice",
    }
}

/// What gpunode has in effect on a node now.
pub(super) fn current(node: &NodeView) -> BTreeSet<Action> {
    let mut out: BTreeSet<Action> = node.taints.iter().cloned().map(Action::Taint).collect();
    if node.markers.cordoned_by_us && node.unschedulable {
        out.insert(Action::Cordon);
    }
    if node.markers.drain_started.is_some() {
        out.insert(Action::Drain);
    }
    out.extend(node.markers.quarantines().map(|(gpu, index, effect)| {
        Action::TaintDevice(GpuTaint {
            gpu: gpu.to_string(),
            index,
            effect,
        })
    }));
    out
}

/// People win: a person who uncordons a node gpunode cordoned (or is draining) cancels that,
/// and gpunode does not cordon it again until the node has recovered. Takes the cordon and the
/// drain out of what is `wanted` and the cancelled drain out of what is `current`ly in effect;
/// returns since when a person's uncordon holds (none once the ladder no longer wants the
/// cordon).
pub(super) fn people_win(
    node: &NodeView,
    wanted: &mut BTreeSet<Action>,
    current: &mut BTreeSet<Action>,
    now: Timestamp,
) -> Option<Timestamp> {
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
    user_uncordoned
}
