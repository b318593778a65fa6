//! What the incremental reconcile (`--planning incremental`) keeps of each policy between
//! passes: its incremental planner ([`Incremental`]), what is in effect on each node after the
//! last apply (for the status), the nodes whose write failed (planned again), and when the next
//! whole pass is due.
//!
//! A pass looks again at whole policy when it has no state yet, when anything recorded in
//! [`crate::observe::changed`] says so (a node vanished unseen, a new leader), when the
//! policy's spec or the policies' selectors changed (every verdict, or every node's conflicts,
//! may differ), and every [`RESYNC`] (a heartbeat reviving a stale node changes no object the
//! watches see). Otherwise it looks at the nodes that changed, those the planner wants again,
//! and those whose write failed.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, PoisonError},
};

use gpunode_crds::{GpuNodePolicy, GpuNodePolicySpec};
use jiff::{SignedDuration, Timestamp};

use crate::{
    apply::Applied,
    observe::{SelectorIndex, changed::Changes},
    plan::{InEffect, NodePlan, NodeView, PolicyPlan, incremental::Incremental},
};

/// How often a policy is looked at whole at the latest.
pub const RESYNC: SignedDuration = SignedDuration::from_secs(300);

/// One policy's state between incremental passes.
pub struct PolicyState {
    planner: Incremental,
    spec: GpuNodePolicySpec,
    index: Arc<SelectorIndex>,
    resync_at: Timestamp,
    /// Nodes whose last plan did not take effect (a failed write, or not the leader).
    retry: BTreeSet<String>,
    /// What is in effect on each node after its last apply.
    effect: HashMap<String, InEffect>,
    /// When the status was last made from every node.
    status_at: Option<Timestamp>,
}

/// Which nodes a pass looks at.
pub enum Look {
    /// Every node the policy selects.
    Whole,
    /// These (a node gone or no longer selected is dropped).
    Some(BTreeSet<String>),
}

impl PolicyState {
    /// A policy seen for the first time (or again after its state was dropped).
    pub fn new(policy: &GpuNodePolicy, index: Arc<SelectorIndex>, now: Timestamp) -> PolicyState {
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        PolicyState {
            planner: Incremental::new(name, policy.spec.clone()),
            spec: policy.spec.clone(),
            index,
            resync_at: now,
            retry: BTreeSet::new(),
            effect: HashMap::new(),
            status_at: None,
        }
    }

    /// Which nodes the pass at `now` looks at, given what changed.
    pub fn look(
        &mut self,
        policy: &GpuNodePolicy,
        index: &Arc<SelectorIndex>,
        changes: Changes,
        now: Timestamp,
    ) -> Look {
        let whole = changes.whole
            || now >= self.resync_at
            || self.spec != policy.spec
            || !(Arc::ptr_eq(&self.index, index) || self.index.selects_as(index));
        if whole {
            self.spec = policy.spec.clone();
            self.planner.set_policy(policy.spec.clone());
            self.index = index.clone();
            self.resync_at = now.checked_add(RESYNC).unwrap_or(Timestamp::MAX);
            return Look::Whole;
        }
        self.index = index.clone();
        let mut names = changes.nodes;
        names.extend(self.planner.wanted(now));
        names.extend(std::mem::take(&mut self.retry));
        Look::Some(names)
    }

    /// The views looked at; on a whole pass, `whole` drops the nodes not among them.
    pub fn update(&mut self, views: Vec<NodeView>, gone: &[String], whole: bool) {
        if whole {
            let seen: BTreeSet<&str> = views.iter().map(|v| v.name.as_str()).collect();
            let left: Vec<String> = self
                .planner
                .names()
                .filter(|n| !seen.contains(n))
                .map(str::to_string)
                .collect();
            for n in &left {
                self.forget(n);
            }
        }
        for n in gone {
            self.forget(n);
        }
        for v in views {
            self.planner.upsert(v);
        }
    }

    fn forget(&mut self, node: &str) {
        self.planner.remove(node);
        self.effect.remove(node);
        self.retry.remove(node);
    }

    /// The planner.
    pub fn planner(&mut self) -> &mut Incremental {
        &mut self.planner
    }

    /// `None` when the status may be made now (and records that it is), else how long until
    /// it may: at most once per `interval`.
    pub fn status_due(
        &mut self,
        now: Timestamp,
        interval: std::time::Duration,
    ) -> Option<std::time::Duration> {
        let since = self
            .status_at
            .and_then(|at| std::time::Duration::try_from(now.duration_since(at)).ok());
        match since {
            Some(since) if since < interval => Some(interval - since),
            _ => {
                self.status_at = Some(now);
                None
            }
        }
    }

    /// When the next whole pass is due.
    pub fn resync_at(&self) -> Timestamp {
        self.resync_at
    }

    /// What the apply of `plan` (the nodes a pass planned) left in effect; a node whose plan
    /// did not take effect is planned again at the next pass.
    pub fn applied(&mut self, plan: &PolicyPlan, applied: &Applied) {
        for ((np, effect), took) in applied.in_effect(plan).zip(applied.took_effect()) {
            if !took && np.write {
                self.retry.insert(np.node.clone());
            }
            self.effect.insert(np.node.clone(), effect);
        }
    }

    /// Every node's last plan with what is in effect on it, in the admission order: what the
    /// status is made from.
    pub fn in_effect(&self) -> Vec<(&NodePlan, InEffect)> {
        self.planner
            .plans()
            .map(|np| {
                let effect = self
                    .effect
                    .get(&np.node)
                    .cloned()
                    .unwrap_or_else(|| np.before.clone());
                (np, effect)
            })
            .collect()
    }

    /// The policy-level results of the last pass and every node's last plan.
    pub fn summary(&self) -> PolicyPlan {
        self.planner.partial(&crate::plan::incremental::Pass::default())
    }
}

/// Every policy's state. A reconcile takes its policy's out and puts it back when it is done:
/// kube's controller never runs two reconciles of one policy at once, and a pass that fails
/// part-way leaves none, so the next is whole.
#[derive(Default)]
pub struct PolicyStates {
    states: Mutex<HashMap<String, PolicyState>>,
}

impl PolicyStates {
    /// The state of `policy`, taken out.
    pub fn take(&self, policy: &str) -> Option<PolicyState> {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(policy)
    }

    /// Puts the state of `policy` back.
    pub fn put(&self, policy: &str, state: PolicyState) {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(policy.to_string(), state);
    }

    /// `policy` is gone.
    pub fn forget(&self, policy: &str) {
        self.take(policy);
    }
}

/// How a policy's reconcile plans: every node each pass, or only what changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Planning {
    /// Every node of the policy, each pass (the default).
    #[default]
    Full,
    /// Only the nodes that changed, with a whole pass every [`RESYNC`].
    Incremental,
}

impl std::str::FromStr for Planning {
    type Err = String;

    fn from_str(s: &str) -> Result<Planning, String> {
        match s {
            "full" => Ok(Planning::Full),
            "incremental" => Ok(Planning::Incremental),
            other => Err(format!("planning: {other:?} is neither full nor incremental")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_unavailable: u32) -> GpuNodePolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gpunode.dev/v1alpha1",
            "kind": "GpuNodePolicy",
            "metadata": {"name": "h100"},
            "spec": {
                "nodeSelector": {"matchLabels": {"gpu": "h100"}},
                "disruption": {"maxUnavailable": max_unavailable},
            },
        }))
        .unwrap()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_790_000_000 + secs).unwrap()
    }

    fn changed(nodes: &[&str]) -> Changes {
        Changes {
            whole: false,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn a_pass_is_whole_first_on_a_spec_or_selector_change_and_every_resync_else_it_looks_at_what_changed() {
        let index = Arc::new(SelectorIndex::default());
        let mut state = PolicyState::new(&policy(1), index.clone(), at(0));
        assert!(matches!(
            state.look(&policy(1), &index, changed(&[]), at(0)),
            Look::Whole
        ));
        let Look::Some(names) = state.look(&policy(1), &index, changed(&["gpu-1"]), at(1)) else {
            panic!("nothing but one node changed")
        };
        assert_eq!(names, BTreeSet::from(["gpu-1".to_string()]));
        // A new index that selects as the old one did (a policy's status was written).
        let same = Arc::new(SelectorIndex::default());
        assert!(matches!(
            state.look(&policy(1), &same, changed(&[]), at(2)),
            Look::Some(_)
        ));
        assert!(
            matches!(state.look(&policy(2), &same, changed(&[]), at(3)), Look::Whole),
            "spec changed"
        );
        let whole = Changes {
            whole: true,
            nodes: BTreeSet::new(),
        };
        assert!(
            matches!(state.look(&policy(2), &same, whole, at(4)), Look::Whole),
            "a new leader"
        );
        assert!(matches!(
            state.look(&policy(2), &same, changed(&[]), at(5)),
            Look::Some(_)
        ));
        let resync = 4 + RESYNC.as_secs();
        assert!(matches!(
            state.look(&policy(2), &same, changed(&[]), at(resync)),
            Look::Whole
        ));
    }

    #[test]
    fn the_status_is_made_at_most_once_per_interval() {
        let mut state = PolicyState::new(&policy(1), Arc::new(SelectorIndex::default()), at(0));
        let second = std::time::Duration::from_secs(1);
        assert_eq!(state.status_due(at(0), second), None);
        assert_eq!(state.status_due(at(0), second), Some(second));
        assert_eq!(state.status_due(at(1), second), None);
    }

    #[test]
    fn planning_is_full_or_incremental() {
        assert_eq!("incremental".parse(), Ok(Planning::Incremental));
        assert_eq!("full".parse(), Ok(Planning::Full));
        assert!("partial".parse::<Planning>().unwrap_err().contains("partial"));
    }
}
