//! Reading gpunode's own writes before the watch delivers them.
//!
//! A reconcile pass that starts before the node watch has delivered the previous pass's writes
//! would see the nodes as they were: it would write them again (at 1,000 nodes a third of
//! convergence's writes were such repeats) and count disruption budgets from a past state. So
//! every write's response (the node as the API server stored it) is kept until the watch has
//! caught up with that version, and passes read the later of the two.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
};

use k8s_openapi::api::core::v1::Node;

/// Nodes as gpunode's writes returned them (trimmed like the cache's).
#[derive(Default)]
pub struct OwnWrites {
    nodes: Mutex<HashMap<String, Arc<Node>>>,
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
    /// Remembers a node as gpunode's write returned it.
    pub fn wrote(&self, mut node: Node) {
        crate::trim::node(&mut node);
        let name = node.metadata.name.clone().unwrap_or_default();
        self.nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, Arc::new(node));
    }

    /// The cached nodes, each replaced by the version gpunode wrote where that is later.
    /// Written versions the cache has caught up with, and those of nodes no longer cached,
    /// are forgotten.
    pub fn overlay(&self, cached: Vec<Arc<Node>>) -> Vec<Arc<Node>> {
        let mut written = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
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

    /// How many written versions the cache has not caught up with yet.
    pub fn len(&self) -> usize {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner).len()
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
        own.wrote(node("a", "20", "drifted"));
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
        own.wrote(node("a", "20", "drifted"));
        let seen = own.overlay(vec![Arc::new(node("a", "25", "by-someone-else"))]);
        assert_eq!(state(&seen[0]), "by-someone-else");
        assert!(own.is_empty());
    }

    #[test]
    fn unreadable_versions_and_vanished_nodes_leave_the_cache_as_it_is() {
        let own = OwnWrites::default();
        own.wrote(node("a", "not-a-number", "drifted"));
        own.wrote(node("gone", "30", "drifted"));
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
