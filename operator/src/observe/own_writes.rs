//! Reading gpunode's own writes before the watch delivers them.
//!
//! A reconcile pass that starts before the node watch has delivered the previous pass's writes
//! would see the nodes as they were: it would write them again (at 1,000 nodes a third of
//! convergence's writes were such repeats) and count disruption budgets from a past state. So
//! every write's response (the node as the API server stored it) is kept until the watch has
//! caught up with that version, and passes read the later of the two. A pass that writes
//! thousands of nodes (convergence) forgets, as it goes, the versions the watch has delivered:
//! only the watch's lag is kept, not a copy of every node written.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
};

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{ObjectRef, Store};

/// Written versions kept before looking for those the watch has delivered.
const PRUNE_FROM: usize = 256;

/// Nodes as gpunode's writes returned them (trimmed like the cache's).
#[derive(Default)]
pub struct OwnWrites {
    inner: Mutex<Written>,
}

#[derive(Default)]
struct Written {
    nodes: HashMap<String, Arc<Node>>,
    /// Size at which [`OwnWrites::wrote`] next prunes (twice what the last prune kept, so
    /// pruning stays amortised O(1) per write even when the watch lags far behind).
    prune_at: usize,
}

/// Whether `a` is a later version of a node than `b`. Kubernetes calls resourceVersions opaque,
/// but the etcd3 storage issues increasing integers; anything else counts as not later, so the
/// watch's version wins.
fn later(a: &Node, b: &Node) -> bool {
    let rv = |n: &Node| {
        n.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    matches!((rv(a), rv(b)), (Some(a), Some(b)) if a > b)
}

impl OwnWrites {
    /// Remembers a node as gpunode's write returned it; now and then forgets the written
    /// versions `cached` (the watch's store) has caught up with, and nodes it no longer has.
    pub fn wrote(&self, mut node: Node, cached: &Store<Node>) {
        super::trim::node(&mut node);
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut w = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        w.nodes.insert(name, Arc::new(node));
        if w.nodes.len() >= w.prune_at.max(PRUNE_FROM) {
            w.nodes
                .retain(|name, mine| cached.get(&ObjectRef::new(name)).is_some_and(|c| later(mine, &c)));
            w.prune_at = 2 * w.nodes.len();
        }
    }

    /// The cached nodes, each replaced by the version gpunode wrote where that is later.
    /// Written versions the cache has caught up with, and those of nodes no longer cached,
    /// are forgotten.
    pub fn overlay(&self, cached: Vec<Arc<Node>>) -> Vec<Arc<Node>> {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let written = &mut guard.nodes;
        if written.is_empty() {
            return cached;
        }
        let mut ahead = HashSet::with_capacity(written.len());
        let out = cached
            .into_iter()
            .map(|n| {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                match written.get(name) {
                    Some(mine) if later(mine, &n) => {
                        ahead.insert(name.to_string());
                        mine.clone()
                    }
                    _ => n,
                }
            })
            .collect();
        written.retain(|name, _| ahead.contains(name));
        out
    }

    /// Some of the cached nodes (those an incremental pass looks at), each replaced by the
    /// version gpunode wrote where that is later. Only their written versions the cache has
    /// caught up with are forgotten: the others' are still ahead of the cache, as far as this
    /// call knows.
    pub fn overlay_some(&self, cached: Vec<Arc<Node>>) -> Vec<Arc<Node>> {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let written = &mut guard.nodes;
        if written.is_empty() {
            return cached;
        }
        cached
            .into_iter()
            .map(|n| {
                let name = n.metadata.name.as_deref().unwrap_or_default();
                match written.get(name) {
                    Some(mine) if later(mine, &n) => mine.clone(),
                    Some(_) => {
                        written.remove(name);
                        n
                    }
                    None => n,
                }
            })
            .collect()
    }

    /// How many written versions the cache has not caught up with yet.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .nodes
            .len()
    }

    /// Whether the cache has caught up with every write.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, rv: &str, label: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                labels: Some([("state".to_string(), label.to_string())].into()),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    #[test]
    fn a_partial_overlay_forgets_only_what_it_looked_at_and_the_cache_caught_up_with() {
        let own = OwnWrites::default();
        let cache = empty();
        own.wrote(node("a", "5", "mine"), &cache);
        own.wrote(node("b", "7", "mine"), &cache);
        let seen = own.overlay_some(vec![Arc::new(node("a", "4", "cached"))]);
        assert_eq!(state(&seen[0]), "mine", "a's write is later than the cache");
        assert_eq!(own.len(), 2);
        let seen = own.overlay_some(vec![Arc::new(node("a", "6", "cached"))]);
        assert_eq!(state(&seen[0]), "cached", "the cache caught up with a");
        assert_eq!(own.len(), 1, "b, not looked at, is kept");
    }

    fn empty() -> Store<Node> {
        kube::runtime::reflector::store::<Node>().0
    }

    fn state(n: &Node) -> &str {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("state"))
            .map_or("", String::as_str)
    }

    #[test]
    fn a_pass_reads_its_own_write_until_the_watch_delivers_it() {
        let own = OwnWrites::default();
        own.wrote(node("a", "20", "drifted"), &empty());
        let cached = vec![
            Arc::new(node("a", "10", "compliant")),
            Arc::new(node("b", "11", "compliant")),
        ];
        let seen = own.overlay(cached);
        assert_eq!(state(&seen[0]), "drifted", "the write is later than the cache");
        assert_eq!(state(&seen[1]), "compliant");
        assert_eq!(own.len(), 1, "kept until the watch catches up");

        // The watch delivered it: the cache wins and the write is forgotten.
        let seen = own.overlay(vec![Arc::new(node("a", "20", "drifted"))]);
        assert_eq!(state(&seen[0]), "drifted");
        assert!(own.is_empty());
    }

    #[test]
    fn a_later_change_by_someone_else_wins_over_an_older_own_write() {
        let own = OwnWrites::default();
        own.wrote(node("a", "20", "drifted"), &empty());
        let seen = own.overlay(vec![Arc::new(node("a", "25", "by-someone-else"))]);
        assert_eq!(state(&seen[0]), "by-someone-else");
        assert!(own.is_empty());
    }

    #[test]
    fn unreadable_versions_and_vanished_nodes_leave_the_cache_as_it_is() {
        let own = OwnWrites::default();
        own.wrote(node("a", "not-a-number", "drifted"), &empty());
        own.wrote(node("gone", "30", "drifted"), &empty());
        let seen = own.overlay(vec![Arc::new(node("a", "10", "compliant"))]);
        assert_eq!(state(&seen[0]), "compliant");
        assert_eq!(
            seen.len(),
            1,
            "a node the cache no longer has is not brought back"
        );
        assert!(own.is_empty());
    }
}

#[cfg(test)]
mod prune_tests {
    use super::*;
    use kube::runtime::{reflector, watcher};

    fn node(name: &str, rv: u64) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.to_string());
        n.metadata.resource_version = Some(rv.to_string());
        n
    }

    #[test]
    fn a_long_pass_keeps_only_the_writes_the_watch_has_not_delivered() {
        let (store, mut writer) = reflector::store::<Node>();
        let own = OwnWrites::default();
        for i in 0..1000u64 {
            let name = format!("n{i}");
            writer.apply_watcher_event(&watcher::Event::Apply(node(&name, 1)));
            own.wrote(node(&name, 100 + i), &store);
            // The watch delivers each write 10 writes later.
            if i >= 10 {
                let seen = format!("n{}", i - 10);
                writer.apply_watcher_event(&watcher::Event::Apply(node(&seen, 100 + i - 10)));
            }
        }
        assert!(own.len() < PRUNE_FROM, "kept {} of 1,000 writes", own.len());
        let seen = own.overlay(store.state());
        let undelivered = seen
            .iter()
            .filter(|n| {
                n.metadata
                    .resource_version
                    .as_deref()
                    .and_then(|v| v.parse::<u64>().ok())
                    >= Some(1090)
            })
            .count();
        assert_eq!(undelivered, 10, "the last ten writes are still read back");
        assert_eq!(own.len(), 10);
    }
}
