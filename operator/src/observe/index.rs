//! Which policies select which nodes: every policy's selectors parsed once, answering "which
//! policies select node N", "which others also select it" (conflicts) and "does any select it"
//! (orphans, the sweep), so those answers cannot disagree.
//!
//! It parses and answers; it lists or watches nothing itself (observe does).

use std::{
    collections::BTreeMap,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex, PoisonError},
};

use gpunode_crds::{
    GpuNodePolicy,
    selector::{self, InvalidSelector},
};
use kube::{
    Resource, ResourceExt,
    core::{DeserializeGuard as Guarded, Selector, SelectorExt},
    runtime::reflector::Store,
};

/// Where the drain's pod selector is, in errors and conditions.
pub use gpunode_crds::policy::POD_SELECTOR_FIELD;

/// The policy's node selector, parsed as strictly as the API server validates it (an empty one
/// is refused: it would select every node). Also checks the drain's pod selector: a policy with
/// any unusable selector selects no node at all.
pub fn selector_of(policy: &GpuNodePolicy) -> Result<Selector, InvalidSelector> {
    if let Some(pods) = &policy.spec.disruption.drain.pod_selector {
        selector::parse(POD_SELECTOR_FIELD, pods)?;
    }
    selector::parse_nodes("spec.nodeSelector", &policy.spec.node_selector)
}

/// A readable policy's `spec.nodeSelector`.
fn node_selector(
    g: &Guarded<GpuNodePolicy>,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector> {
    g.0.as_ref().ok().map(|p| &p.spec.node_selector)
}

/// The parsed selectors of a set of policies.
#[derive(Clone, Default)]
pub struct SelectorIndex {
    /// Policies that select nodes (readable, not being deleted, usable selectors), by name.
    selecting: Vec<(Arc<Guarded<GpuNodePolicy>>, Selector)>,
    /// Some policy could not be read: it might select any node.
    unreadable: bool,
    /// The name of every policy, readable or not, deleted or not.
    names: std::collections::BTreeSet<String>,
    /// The same names as the `gpunode.dev/policy` label of their nodes has them
    /// (`names::label_value`).
    labels: std::collections::BTreeSet<String>,
}

impl SelectorIndex {
    /// The index of `policies` (a policy store's state).
    pub fn new(policies: &[Arc<Guarded<GpuNodePolicy>>]) -> SelectorIndex {
        let mut index = SelectorIndex::default();
        for g in policies {
            index
                .labels
                .insert(gpunode_crds::names::label_value(&g.name_any()));
            index.names.insert(g.name_any());
            let Ok(policy) = g.0.as_ref() else {
                index.unreadable = true;
                continue;
            };
            if policy.metadata.deletion_timestamp.is_some() {
                continue;
            }
            // A policy whose selector cannot be used selects nothing.
            if let Ok(s) = selector_of(policy) {
                index.selecting.push((g.clone(), s));
            }
        }
        index.selecting.sort_by_key(|(g, _)| g.name_any());
        index
    }

    /// The policies that select a node with these labels, by name.
    pub fn selecting<'a>(
        &'a self,
        labels: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a Arc<Guarded<GpuNodePolicy>>> + 'a {
        self.selecting
            .iter()
            .filter(move |(_, s)| s.matches(labels))
            .map(|(g, _)| g)
    }

    /// Whether any policy selects a node with these labels.
    pub fn selects_any(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selecting(labels).next().is_some()
    }

    /// The policies other than `policy` that select a node with these labels, by name.
    pub fn conflicts(&self, policy: &str, labels: &BTreeMap<String, String>) -> Vec<String> {
        // Asked for every node of every pass: names are copied only for the conflicts.
        self.selecting(labels)
            .filter(|g| g.meta().name.as_deref() != Some(policy))
            .map(|g| g.name_any())
            .collect()
    }

    /// Whether a policy of this name exists (readable or not, deleted or not).
    pub fn exists(&self, policy: &str) -> bool {
        self.names.contains(policy)
    }

    /// Whether the policy that a node's `gpunode.dev/policy` label `value` names exists
    /// (readable or not, deleted or not).
    pub fn labels_a_policy(&self, value: &str) -> bool {
        self.labels.contains(value)
    }

    /// Whether `other` says the same of every node: the same policies exist, and the same
    /// select with the same selectors (a policy's status write makes a new index that selects
    /// as the old one did).
    pub fn selects_as(&self, other: &SelectorIndex) -> bool {
        self.unreadable == other.unreadable
            && self.names == other.names
            && self.selecting.len() == other.selecting.len()
            && self
                .selecting
                .iter()
                .zip(&other.selecting)
                .all(|((a, _), (b, _))| a.name_any() == b.name_any() && node_selector(a) == node_selector(b))
    }

    /// Some policy cannot be read: which nodes it selects cannot be told.
    pub fn has_unreadable(&self) -> bool {
        self.unreadable
    }
}

/// The [`SelectorIndex`] of a policy store, parsed again only when the store's policies change.
/// Every node and report event asks which policies select its node; parsing every selector for
/// each of them was most of the work of a quiet fleet's events.
#[derive(Clone)]
pub struct IndexCache {
    policies: Store<Guarded<GpuNodePolicy>>,
    memo: Arc<Mutex<Option<Memo>>>,
}

/// The last index built, with the [`versions`] of the policies it was built from.
type Memo = (u64, Arc<SelectorIndex>);

impl IndexCache {
    /// The index cache of `policies`.
    pub fn new(policies: Store<Guarded<GpuNodePolicy>>) -> IndexCache {
        IndexCache {
            policies,
            memo: Arc::default(),
        }
    }

    /// The index of the policies the store holds now.
    pub fn get(&self) -> Arc<SelectorIndex> {
        let state = self.policies.state();
        let Some(key) = versions(&state) else {
            return Arc::new(SelectorIndex::new(&state));
        };
        let mut memo = self.memo.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((k, index)) = memo.as_ref()
            && *k == key
        {
            return index.clone();
        }
        let index = Arc::new(SelectorIndex::new(&state));
        *memo = Some((key, index.clone()));
        index
    }
}

/// What identifies this set of policies: every name and resourceVersion (the API server gives a
/// changed object a new one). `None` when some policy has none, which only objects that never
/// came from an API server lack: those are parsed every time.
fn versions(policies: &[Arc<Guarded<GpuNodePolicy>>]) -> Option<u64> {
    let mut keys: Vec<(String, &str)> = Vec::with_capacity(policies.len());
    for g in policies {
        keys.push((g.name_any(), g.meta().resource_version.as_deref()?));
    }
    keys.sort_unstable();
    // In memory only (compared with the last value of this process, never written anywhere):
    // DefaultHasher may change between Rust releases, which cannot matter here.
    let mut h = DefaultHasher::new();
    keys.hash(&mut h);
    Some(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, selector: serde_json::Value, deleting: bool) -> Arc<Guarded<GpuNodePolicy>> {
        let mut v = serde_json::json!({
            "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodePolicy",
            "metadata": {"name": name},
            "spec": {"nodeSelector": selector},
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
        Arc::new(serde_json::from_value(v).unwrap_or_else(|e| panic!("{name}: {e}")))
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn one_index_answers_selection_conflicts_and_orphans_alike() {
        let h100 = serde_json::json!({"matchLabels": {"gpu": "h100"}});
        let index = SelectorIndex::new(&[
            policy("b", h100.clone(), false),
            policy("a", h100.clone(), false),
            policy("gone", h100, true),
            policy(
                "other",
                serde_json::json!({"matchLabels": {"gpu": "a100"}}),
                false,
            ),
            // Fails closed: a selector that cannot be used selects nothing.
            policy(
                "bad",
                serde_json::json!({"matchExpressions": [{"key": "gpu", "operator": "Near"}]}),
                false,
            ),
        ]);
        let node = labels(&[("gpu", "h100")]);
        let names: Vec<String> = index.selecting(&node).map(|g| g.name_any()).collect();
        assert_eq!(
            names,
            ["a", "b"],
            "by name; a policy being deleted selects nothing"
        );
        assert_eq!(index.conflicts("b", &node), ["a"]);
        assert!(index.conflicts("other", &labels(&[("gpu", "a100")])).is_empty());
        assert!(!index.selects_any(&labels(&[("gpu", "l4")])));
        assert!(!index.selects_any(&BTreeMap::new()), "no labels, no policy");
        assert!(index.exists("gone") && index.exists("bad") && !index.exists("x"));
        assert!(index.labels_a_policy("gone") && !index.labels_a_policy("x"));
        assert!(!index.has_unreadable());
    }

    #[test]
    fn the_cached_index_follows_the_store() {
        use kube::runtime::watcher::Event;
        let (store, mut writer) = kube::runtime::reflector::store::<Guarded<GpuNodePolicy>>();
        let cache = IndexCache::new(store);
        let versioned = |name: &str, gpu: &str, version: &str| {
            let mut g = (*policy(name, serde_json::json!({"matchLabels": {"gpu": gpu}}), false)).clone();
            g.meta_mut().resource_version = Some(version.to_string());
            g
        };
        writer.apply_watcher_event(&Event::Apply(versioned("a", "h100", "1")));
        let first = cache.get();
        assert!(
            Arc::ptr_eq(&first, &cache.get()),
            "unchanged store: the same index"
        );
        assert!(first.selects_any(&labels(&[("gpu", "h100")])));
        writer.apply_watcher_event(&Event::Apply(versioned("a", "a100", "2")));
        let second = cache.get();
        assert!(
            !second.selects_any(&labels(&[("gpu", "h100")])),
            "a changed policy is parsed again"
        );
        assert!(second.selects_any(&labels(&[("gpu", "a100")])));
        writer.apply_watcher_event(&Event::Delete(versioned("a", "a100", "2")));
        assert!(
            !cache.get().selects_any(&labels(&[("gpu", "a100")])),
            "a deleted policy selects nothing"
        );
    }

    /// A node's `gpunode.dev/policy` label names its policy through `names::label_value`: a
    /// policy name too long for a label is found by its hashed value, and a policy of the same
    /// first 63 characters is not taken for it.
    #[test]
    fn a_long_policy_name_is_found_by_its_label_value() {
        let long = format!("{}-1", "p".repeat(70));
        let index = SelectorIndex::new(&[policy(&long, serde_json::json!({}), false)]);
        assert!(index.labels_a_policy(&gpunode_crds::names::label_value(&long)));
        assert!(!index.labels_a_policy(&gpunode_crds::names::label_value(&format!(
            "{}-2",
            "p".repeat(70)
        ))));
        assert!(!index.labels_a_policy(&"p".repeat(63)));
    }
}
