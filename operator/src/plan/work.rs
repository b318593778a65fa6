//! One node through a pass: what it wants before admission ([`want`]: its tracks, what the
//! ladder wants, what gpunode has in effect, what admission needs to know of it), then its plan
//! ([`decide`]: its actions through admission, its validation, the rest). The full pass
//! ([`super::plan_with`]) and the incremental one ([`super::incremental`]) both plan a node
//! with these two, so they cannot disagree on what one node's plan is.
//!
//! Pure. It imports the layers below the pass, never the pass.

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::PodTemplateSpec;

use super::{
    admission::{Admission, Candidate, Step},
    gpus,
    hysteresis::{self, signed, track_classes},
    ladder,
    node::{Admitted, NodePlan, Work, node_plan},
    output::{Action, is_disrupted},
    validation::{self, ValidationInput},
    view::{NodeView, PassInputs},
    windows,
};
use crate::verdict::NodeState;

/// One node before admission: its tracks, what the ladder wants (less what waits for a person),
/// what gpunode has in effect, and what admission needs to know of it.
pub(super) fn want<'a>(
    policy: &GpuNodePolicySpec,
    admission: &Admission,
    view: &'a NodeView,
    gpu_handled: &BTreeSet<DriftClass>,
    now: Timestamp,
) -> Work<'a> {
    let healthy_for = signed(policy.recovery.healthy_for);
    let tracks = track_classes(&view.markers.classes, &view.verdict, healthy_for, now);
    let gpu_tracks = gpus::track(&view.markers.gpus, view, gpu_handled, healthy_for, now);
    let gpu = gpus::decide(policy, &gpu_tracks, &view.devices, now);
    let escalated = gpu.escalation.is_some();
    let (mut wanted, gated) = ladder::wanted(policy, &tracks, gpu_handled, escalated, now);
    wanted.extend(gpu.taints.into_values().map(Action::TaintDevice));
    let mut current = ladder::current(view);
    let mut node = Candidate::new(view);
    // A rung a person has not approved yet is not taken; what is in effect already stays.
    let awaiting: BTreeMap<Action, String> = gated
        .into_iter()
        .filter(|(a, rung)| {
            !current.contains(a)
                && admission
                    .may(&node, Step::Rungs(std::slice::from_ref(rung)))
                    .is_some()
        })
        .collect();
    let rungs: Vec<String> = awaiting.values().cloned().collect();
    let approval = if rungs.is_empty() {
        None
    } else {
        admission.may(&node, Step::Rungs(&rungs))
    };
    for a in awaiting.keys() {
        wanted.remove(a);
    }
    let user_uncordoned = ladder::people_win(view, &mut wanted, &mut current, now);
    // A recovered node keeps gpunode's cordon, drain and taints until its validation passed.
    node.due = validation::hold(policy.validation.as_ref(), view, &mut wanted, &current);
    node.since = hysteresis::since(&tracks);
    node.holds_slot = is_disrupted(&current);
    // Outside the windows, disruption waits unless the node drifts in an urgent class.
    let active = hysteresis::active(&tracks, &gpu_tracks);
    node.urgent = windows::urgent(policy.maintenance.as_ref(), active);
    Work {
        node,
        tracks,
        gpu_tracks,
        escalation: gpu.escalation,
        wanted,
        current,
        awaiting: awaiting.into_keys().collect(),
        approval,
        user_uncordoned,
    }
}

/// One node's plan: its actions through admission, then its validation, then the rest.
pub(super) fn decide(
    name: &str,
    policy: &GpuNodePolicySpec,
    admission: &mut Admission,
    template: Result<&PodTemplateSpec, &str>,
    w: &mut Work<'_>,
    now: Timestamp,
) -> NodePlan {
    let admitted = admit(admission, w);
    // Quiet: healthy, nothing of gpunode's on it or wanted, nothing recovering.
    let quiet = w.node.view.verdict.state == NodeState::Compliant
        && w.current.is_empty()
        && w.wanted.is_empty()
        && w.tracks.is_empty()
        && w.gpu_tracks.is_empty();
    let validation = validation::decide(ValidationInput {
        policy: policy.validation.as_ref(),
        policy_name: name,
        template,
        node: &w.node,
        admission,
        due: w.node.due,
        settled: w.tracks.is_empty(),
        quiet,
        now,
    });
    if validation.started {
        let step = if w.node.due {
            Step::Validation
        } else {
            Step::PeriodicValidation
        };
        admission.started(&mut w.node, step);
    }
    node_plan(name, policy, admission, w, admitted, validation, now)
}

/// The node's actions through admission: what is kept (everything, where nothing may be
/// written; what the ladder still wants otherwise), each addition admitted or held back, and
/// why the held ones wait.
fn admit(admission: &mut Admission, w: &mut Work<'_>) -> Admitted {
    let mut blocked = admission.may(&w.node, Step::Undo);
    let mut effective: BTreeSet<Action> = match blocked {
        Some(_) => w.current.clone(),
        None => w.current.intersection(&w.wanted).cloned().collect(),
    };
    let additions: Vec<Action> = w.wanted.difference(&effective).cloned().collect();
    let mut pending = Vec::new();
    for action in additions {
        match admission.may(&w.node, Step::Action(&action)) {
            None => {
                admission.started(&mut w.node, Step::Action(&action));
                effective.insert(action);
            }
            Some(b) => {
                blocked.get_or_insert(b);
                pending.push(action);
            }
        }
    }
    // What awaits a person's approval waits too, and says how to give it.
    pending.extend(w.awaiting.iter().cloned());
    Admitted {
        effective,
        pending,
        blocked: blocked.or_else(|| w.approval.clone()),
    }
}

/// The policy's validation template within what the chart grants (`inputs.validation_bounds`),
/// or why it cannot be used (empty: the policy has no validation).
pub(super) fn template(policy: &GpuNodePolicySpec, inputs: &PassInputs) -> Result<PodTemplateSpec, String> {
    policy
        .validation
        .as_ref()
        .map(|v| {
            let t = v.pod_template()?;
            match &inputs.validation_bounds {
                Some(b) => b.admit(&v.namespace, t),
                None => Ok(t),
            }
        })
        .unwrap_or(Err(String::new()))
}
