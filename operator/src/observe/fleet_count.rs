//! The fleet cap's count (`--fleet-max-unavailable`), kept as nodes change instead of counted over
//! every node by every pass: which GPU nodes (nodes some policy selects) there are and which of
//! them are unavailable.
//!
//! A node is counted again when its Node changed in a way that matters (the watch's trigger:
//! labels, taints, `unschedulable`, the Ready condition's status, gpunode's annotations) or
//! gpunode wrote it; every node is, when the policies' selectors changed or a node vanished
//! unseen. Between those the count cannot change: it reads nothing else. The count reads the
//! nodes as passes do, the cache's version or gpunode's own later write.
//!
//! It only counts; the cap and the reservations are [`crate::fleet`]'s.

use std::{
    collections::{BTreeSet, HashSet},
    sync::{Arc, Mutex, PoisonError},
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};

use super::{index::SelectorIndex, own_writes::OwnWrites, trim};

/// Whether a node is unavailable to the fleet cap: not Ready, cordoned, tainted NoSchedule or
/// NoExecute by anyone (except with a key in `ignored_taints`), or validated by gpunode.
pub fn unavailable(node: &Node, ignored_taints: &[String]) -> bool {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
        ts.iter()
            .filter(|t| !ignored_taints.contains(&t.key))
            .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    });
    let not_ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == trim::READY))
        .is_some_and(|c| c.status != "True");
    let validating = || {
        let annotations = node.metadata.annotations.as_ref();
        annotations.is_some_and(|a| {
            let (markers, _) = crate::markers::Markers::from_annotations(a);
            markers.validation.is_some_and(|t| t.ended.is_none())
        })
    };
    cordoned || tainted || not_ready || validating()
}

/// What the fleet cap counts: the unavailable GPU nodes, and how many GPU nodes there are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// The GPU nodes that are unavailable, by name.
    pub unavailable: Arc<BTreeSet<String>>,
    /// How many GPU nodes there are.
    pub gpu_nodes: u32,
}

/// The count, and what changed since it was made.
#[derive(Default)]
pub struct FleetCount {
    inner: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    /// The selectors the count was made under (`None`: not counted yet).
    under: Option<SelectorIndex>,
    /// Every node is to be counted again.
    everything: bool,
    /// The nodes to count again.
    changed: HashSet<String>,
    gpu: HashSet<String>,
    unavailable: Arc<BTreeSet<String>>,
}

impl FleetCount {
    /// Node `name` changed, or gpunode wrote it.
    pub fn changed(&self, name: &str) {
        let mut kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if !kept.everything {
            kept.changed.insert(name.to_string());
        }
    }

    /// Any node may have changed (one vanished unseen): the next count counts every node.
    pub fn everything(&self) {
        let mut kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        kept.everything = true;
        kept.changed.clear();
    }

    /// The count now, under `index`'s selectors, of the nodes `nodes` holds read with
    /// gpunode's own later writes: counted again only for what changed since the last call.
    pub fn count(
        &self,
        nodes: &Store<Node>,
        written: &OwnWrites,
        index: &SelectorIndex,
        ignored_taints: &[String],
    ) -> Counted {
        let mut kept = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let same = kept.under.as_ref().is_some_and(|u| u.selects_as(index));
        if kept.everything || !same {
            let all = written.overlay(nodes.state());
            kept.recount(all, index, ignored_taints);
        } else if !kept.changed.is_empty() {
            let changed = std::mem::take(&mut kept.changed);
            kept.count_again(changed, nodes, written, index, ignored_taints);
        }
        Counted {
            unavailable: kept.unavailable.clone(),
            gpu_nodes: u32::try_from(kept.gpu.len()).unwrap_or(u32::MAX),
        }
    }
}

impl Kept {
    fn recount(&mut self, all: Vec<Arc<Node>>, index: &SelectorIndex, ignored_taints: &[String]) {
        let gpu: Vec<Arc<Node>> = all
            .into_iter()
            .filter(|n| index.selects_any(n.labels()))
            .collect();
        self.unavailable = Arc::new(
            gpu.iter()
                .filter(|n| unavailable(n, ignored_taints))
                .map(|n| n.name_any())
                .collect(),
        );
        self.gpu = gpu.iter().map(|n| n.name_any()).collect();
        self.under = Some(index.clone());
        self.everything = false;
        self.changed.clear();
    }

    fn count_again(
        &mut self,
        changed: HashSet<String>,
        nodes: &Store<Node>,
        written: &OwnWrites,
        index: &SelectorIndex,
        ignored_taints: &[String],
    ) {
        let cached: Vec<Arc<Node>> = changed
            .iter()
            .filter_map(|name| nodes.get(&ObjectRef::new(name)))
            .collect();
        let mut present = HashSet::with_capacity(cached.len());
        let unavailable_now = Arc::make_mut(&mut self.unavailable);
        for node in written.overlay_some(cached) {
            let name = node.name_any();
            if index.selects_any(node.labels()) {
                self.gpu.insert(name.clone());
                if unavailable(&node, ignored_taints) {
                    unavailable_now.insert(name.clone());
                } else {
                    unavailable_now.remove(&name);
                }
            } else {
                self.gpu.remove(&name);
                unavailable_now.remove(&name);
            }
            present.insert(name);
        }
        // Deleted nodes.
        for name in changed.difference(&present) {
            self.gpu.remove(name);
            unavailable_now.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunode_crds::GpuNodePolicy;
    use kube::{
        core::DeserializeGuard,
        runtime::{reflector::store::Writer, watcher::Event},
    };
    use proptest::prelude::*;

    fn policy(pool: &str) -> Arc<DeserializeGuard<GpuNodePolicy>> {
        let p: GpuNodePolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodePolicy",
            "metadata": {"name": format!("p-{pool}"), "uid": "u"},
            "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}}
        }))
        .unwrap();
        Arc::new(DeserializeGuard(Ok(p)))
    }

    /// One step of a node's life, or a change of the policies.
    #[derive(Clone, Debug)]
    enum Step {
        /// Node `n` applied by the watch with this pool, cordon, taint, Ready.
        Apply(u8, u8, bool, Option<&'static str>, bool),
        /// gpunode wrote node `n` (a later version than the watch's), cordoning it or not.
        Wrote(u8, bool),
        Delete(u8),
        /// The policies now select pools `0..k`.
        Policies(u8),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0u8..12, 0u8..3, any::<bool>(),
                  prop::option::of(prop::sample::select(vec!["nvidia.com/gpu", "maint"])), any::<bool>())
                .prop_map(|(n, p, c, t, r)| Step::Apply(n, p, c, t, r)),
            2 => (0u8..12, any::<bool>()).prop_map(|(n, c)| Step::Wrote(n, c)),
            1 => (0u8..12).prop_map(Step::Delete),
            1 => (0u8..4).prop_map(Step::Policies),
        ]
    }

    fn node(n: u8, pool: u8, cordon: bool, taint: Option<&str>, ready: bool, rv: u64) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("n{n}"), "uid": format!("u{n}"),
                         "resourceVersion": rv.to_string(), "labels": {"pool": pool.to_string()}},
            "spec": {"unschedulable": cordon,
                     "taints": taint.map(|k| vec![serde_json::json!({"key": k, "effect": "NoSchedule"})])},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    proptest! {
        /// After every step, the kept count is the count over every node.
        #[test]
        fn the_kept_count_is_the_count_over_every_node(steps in prop::collection::vec(step(), 1..60)) {
            let ignored = vec!["nvidia.com/gpu".to_string()];
            let mut writer: Writer<Node> = Writer::default();
            let nodes = writer.as_reader();
            writer.apply_watcher_event(&Event::Init);
            writer.apply_watcher_event(&Event::InitDone);
            let written = OwnWrites::default();
            let kept = FleetCount::default();
            let mut policies: Vec<Arc<DeserializeGuard<GpuNodePolicy>>> = vec![policy("0")];
            let mut rv = 1;
            for s in steps {
                rv += 1;
                match s {
                    Step::Apply(n, p, c, t, r) => {
                        writer.apply_watcher_event(&Event::Apply(node(n, p, c, t, r, rv)));
                        kept.changed(&format!("n{n}"));
                    }
                    Step::Wrote(n, c) => {
                        if let Some(mut cached) = nodes.get(&ObjectRef::new(&format!("n{n}"))).map(|n| (*n).clone()) {
                            cached.metadata.resource_version = Some(rv.to_string());
                            cached.spec.get_or_insert_default().unschedulable = Some(c);
                            written.wrote(cached, &nodes);
                            kept.changed(&format!("n{n}"));
                        }
                    }
                    Step::Delete(n) => {
                        if let Some(cached) = nodes.get(&ObjectRef::new(&format!("n{n}"))) {
                            writer.apply_watcher_event(&Event::Delete((*cached).clone()));
                        }
                        kept.changed(&format!("n{n}"));
                    }
                    Step::Policies(k) => {
                        policies = (0..k).map(|p| policy(&p.to_string())).collect();
                    }
                }
                let index = SelectorIndex::new(&policies);
                let got = kept.count(&nodes, &written, &index, &ignored);
                let all = written.overlay(nodes.state());
                let gpu: Vec<&Arc<Node>> = all.iter().filter(|n| index.selects_any(n.labels())).collect();
                let want = Counted {
                    unavailable: Arc::new(gpu.iter().filter(|n| unavailable(n, &ignored)).map(|n| n.name_any()).collect()),
                    gpu_nodes: u32::try_from(gpu.len()).unwrap(),
                };
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn a_change_not_told_is_not_counted_until_everything_is() {
        let mut writer: Writer<Node> = Writer::default();
        let nodes = writer.as_reader();
        writer.apply_watcher_event(&Event::Apply(node(1, 0, false, None, true, 1)));
        let (written, kept) = (OwnWrites::default(), FleetCount::default());
        let index = SelectorIndex::new(&[policy("0")]);
        assert!(kept.count(&nodes, &written, &index, &[]).unavailable.is_empty());
        writer.apply_watcher_event(&Event::Apply(node(1, 0, true, None, true, 2)));
        assert!(
            kept.count(&nodes, &written, &index, &[]).unavailable.is_empty(),
            "counted again without being told"
        );
        kept.everything();
        assert_eq!(kept.count(&nodes, &written, &index, &[]).unavailable.len(), 1);
    }
}
