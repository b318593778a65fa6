//! Which nodes changed since each policy's last pass: what the incremental reconcile looks at
//! again (`--planning incremental`). The watches' triggers record every node whose Node,
//! report or DRA objects changed in a way that matters ([`super::triggers`]), for every policy
//! at once (a node that left a policy's selector is news to it too); a policy's reconcile takes
//! its own set. A node that vanished unseen, a new leader, or a policy seen for the first time
//! makes the next pass of a policy a whole one.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Mutex, PoisonError},
};

/// What changed for one policy since its last pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Every node is to be looked at again.
    pub whole: bool,
    /// The nodes that changed.
    pub nodes: BTreeSet<String>,
}

/// The changed nodes of every policy that has had a pass.
#[derive(Debug, Default)]
pub struct ChangedNodes {
    policies: Mutex<HashMap<String, Changes>>,
}

impl ChangedNodes {
    /// Nothing recorded, no policy known.
    pub fn new() -> ChangedNodes {
        ChangedNodes::default()
    }

    /// Node `name` changed: news to every policy.
    pub fn node(&self, name: &str) {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        for c in policies.values_mut() {
            if !c.whole {
                c.nodes.insert(name.to_string());
            }
        }
    }

    /// Anything may have changed (a node vanished unseen, this replica became the leader):
    /// every policy's next pass is whole.
    pub fn everything(&self) {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        for c in policies.values_mut() {
            c.whole = true;
            c.nodes.clear();
        }
    }

    /// What changed for `policy` since its last call, which starts recording anew; the first
    /// call for a policy is whole.
    pub fn take(&self, policy: &str) -> Changes {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        match policies.get_mut(policy) {
            Some(c) => std::mem::take(c),
            None => {
                policies.insert(policy.to_string(), Changes::default());
                Changes {
                    whole: true,
                    nodes: BTreeSet::new(),
                }
            }
        }
    }

    /// `policy` is gone: nothing is recorded for it any more.
    pub fn forget(&self, policy: &str) {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        policies.remove(policy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_sees_what_changed_since_its_last_take_and_its_first_is_whole() {
        let c = ChangedNodes::new();
        c.node("before");
        assert!(c.take("a").whole, "first take");
        c.node("gpu-1");
        c.node("gpu-2");
        let got = c.take("a");
        assert!(!got.whole);
        assert_eq!(
            got.nodes,
            BTreeSet::from(["gpu-1".to_string(), "gpu-2".to_string()])
        );
        assert_eq!(c.take("a"), Changes::default(), "taken");
        c.everything();
        assert!(c.take("a").whole);
        c.forget("a");
        assert!(c.take("a").whole, "forgotten, then first again");
    }
}
