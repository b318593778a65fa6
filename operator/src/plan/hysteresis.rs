//! Hysteresis: the per-class tracks of a node (and of each of its GPUs), and the times a rule's
//! `after` and `recovery.healthyFor` are measured with.
//!
//! - A class is *active* while it drifts and until it has stayed clear for `healthyFor`; a drift
//!   that returns within that time keeps its original start.
//! - While some check is unknown nothing new is considered cleared (unknown is not healthy);
//!   only Stale clears then.
//!
//! Pure. It may import what the planner says ([`super::output`]) and the bookkeeping, never a
//! layer above (admission, the feature planners, the pass).

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{DriftClass, GpuNodePolicySpec, policy::RemediationAction};
use jiff::{SignedDuration, Timestamp};

use super::output::{ChangeCause, NextChange};
use crate::{
    markers::{ClassTrack, GpuTrack},
    verdict::Verdict,
};

/// How long from `since` to `now`.
pub(super) fn elapsed(now: Timestamp, since: Timestamp) -> SignedDuration {
    now.duration_since(since)
}

/// A policy's duration as a signed one (saturating).
pub(super) fn signed(d: gpunode_crds::Duration) -> SignedDuration {
    SignedDuration::try_from(d.get()).unwrap_or(SignedDuration::MAX)
}

/// Updates the per-class tracks from a verdict: drifting classes start (or resume within
/// `healthy_for`), cleared ones get a clear time, and those clear for `healthy_for` are dropped.
/// While some check is unknown nothing new is considered cleared: unknown is not healthy.
pub fn track_classes(
    old: &BTreeMap<DriftClass, ClassTrack>,
    verdict: &Verdict,
    healthy_for: SignedDuration,
    now: Timestamp,
) -> BTreeMap<DriftClass, ClassTrack> {
    track_set(
        old,
        &verdict.classes(),
        verdict.unknowns.is_empty(),
        healthy_for,
        now,
    )
}

/// [`track_classes`] for a set of drifting classes; `evidence_of_health` is false while some
/// check is unknown (only Stale clears then).
pub(super) fn track_set(
    old: &BTreeMap<DriftClass, ClassTrack>,
    drifting: &BTreeSet<DriftClass>,
    evidence_of_health: bool,
    healthy_for: SignedDuration,
    now: Timestamp,
) -> BTreeMap<DriftClass, ClassTrack> {
    let mut out = BTreeMap::new();
    for class in drifting {
        let since = match old.get(class) {
            Some(t) if t.cleared_at.is_none_or(|c| elapsed(now, c) < healthy_for) => t.since,
            _ => now,
        };
        out.insert(
            *class,
            ClassTrack {
                since,
                cleared_at: None,
            },
        );
    }
    for (class, track) in old {
        if drifting.contains(class) {
            continue;
        }
        let cleared_at = match track.cleared_at {
            Some(c) => Some(c),
            None if evidence_of_health || *class == DriftClass::Stale => Some(now),
            None => None,
        };
        if cleared_at.is_some_and(|c| elapsed(now, c) >= healthy_for) {
            continue;
        }
        out.insert(
            *class,
            ClassTrack {
                since: track.since,
                cleared_at,
            },
        );
    }
    out
}

/// When the oldest still active drift among `tracks` began.
pub(super) fn since(tracks: &BTreeMap<DriftClass, ClassTrack>) -> Option<Timestamp> {
    tracks
        .values()
        .filter(|t| t.cleared_at.is_none())
        .map(|t| t.since)
        .min()
}

/// The classes active on a node or one of its GPUs.
pub(super) fn active<'a>(
    classes: &'a BTreeMap<DriftClass, ClassTrack>,
    gpus: &'a BTreeMap<String, GpuTrack>,
) -> impl Iterator<Item = &'a DriftClass> {
    classes
        .iter()
        .chain(gpus.values().flat_map(|g| g.classes.iter()))
        .filter(|(_, t)| t.cleared_at.is_none())
        .map(|(c, _)| c)
}

/// The times the tracks change with time alone: a rule's `after` passing for one of its
/// classes (node rules for the node's classes, `TaintDevice` rules for a GPU's), a cleared
/// class reaching `healthyFor`.
pub(super) fn changes(
    policy: &GpuNodePolicySpec,
    classes: &BTreeMap<DriftClass, ClassTrack>,
    gpus: &BTreeMap<String, GpuTrack>,
) -> Vec<NextChange> {
    let mut out: Vec<NextChange> = Vec::new();
    for (class, track) in classes {
        let node_rules = policy
            .remediation
            .iter()
            .filter(|r| r.action != RemediationAction::TaintDevice && r.classes.contains(class));
        out.extend(node_rules.filter_map(|r| {
            let cause = ChangeCause::RuleAfter {
                class: *class,
                action: r.action,
            };
            at(track.since, r.after, cause)
        }));
        if let Some(cleared) = track.cleared_at {
            out.extend(at(
                cleared,
                policy.recovery.healthy_for,
                ChangeCause::HealthyFor(*class),
            ));
        }
    }
    for g in gpus.values() {
        for (class, track) in &g.classes {
            let gpu_rules = policy
                .remediation
                .iter()
                .filter(|r| r.action == RemediationAction::TaintDevice && r.classes.contains(class));
            let (gpu, class) = (g.index, *class);
            out.extend(
                gpu_rules.filter_map(|r| at(track.since, r.after, ChangeCause::GpuRuleAfter { gpu, class })),
            );
            if let Some(cleared) = track.cleared_at {
                let cause = ChangeCause::GpuHealthyFor { gpu, class };
                out.extend(at(cleared, policy.recovery.healthy_for, cause));
            }
        }
    }
    out
}

/// The change for `cause` at `after` past `from` (none past the end of time).
pub(super) fn at(from: Timestamp, after: gpunode_crds::Duration, cause: ChangeCause) -> Option<NextChange> {
    from.checked_add(signed(after))
        .ok()
        .map(|at| NextChange { at, cause })
}
