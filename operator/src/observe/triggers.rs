//! Which node and report changes are worth a reconcile.
//!
//! With thousands of nodes, probes heart-beat reports (a fresh `observedAt`, slightly different
//! temperatures and counters) and kubelets heart-beat Node status all the time. None of that can
//! change what gpunode decides, so none of it should cost a whole-policy reconcile:
//!
//! - a **Node** change matters when something gpunode reads changed: its labels (selectors,
//!   skip, gpunode's own), gpunode's annotations, taints, `spec.unschedulable`, gpunode's
//!   condition, the Ready condition's status (the fleet cap counts it), or its deletion ([`NodeFingerprints`]);
//! - a **report** change matters when it changes the verdict of a policy selecting the node,
//!   compared with the verdict the last reconcile acted on ([`ReportVerdicts`], using
//!   [`VerdictCache::report_is_material`]).
//!
//! Deletions always matter. Objects that vanished while a watch was re-listing come out as an
//! object with only a name (no uid), which the controller maps to every policy that may have
//! selected it. Time-driven changes (a report going stale, `after`, `healthyFor`) do not come
//! from watches at all: the reconcile requeues itself for them.

use std::{
    collections::{HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};

use futures::{Stream, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Resource, ResourceExt,
    core::DeserializeGuard,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tracing::info;

use crate::{
    cache::{GuardedReport, VerdictCache},
    markers::CONDITION_TYPE,
    metrics::Metrics,
};

/// Decides whether an applied object's change matters; told about deletions.
pub trait Materiality<K>: Send {
    /// Whether this new version of the object could change a decision.
    fn applied(&mut self, obj: &K) -> bool;
    /// The object is gone.
    fn deleted(&mut self, name: &str);
}

/// Keeps the objects of a reflected watch whose change matters (and every deletion), counting
/// both outcomes under `source` in `gpunode_watch_events_total`. `vanished` makes the stand-in
/// for an object that disappeared during a re-list.
pub fn material_changes<K, M>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    source: &'static str,
    metrics: Arc<Metrics>,
    mut materiality: M,
    vanished: fn(&str) -> K,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Send + 'static,
    M: Materiality<K> + 'static,
{
    let mut known: HashSet<String> = HashSet::new();
    let mut relisted: Option<HashSet<String>> = None;
    events
        .map(move |event| {
            let out: Vec<Result<K, watcher::Error>> = match event {
                Err(e) => vec![Err(e)],
                Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                    let name = obj.meta().name.clone().unwrap_or_default();
                    if let Some(r) = relisted.as_mut() {
                        r.insert(name.clone());
                    }
                    known.insert(name);
                    let material = materiality.applied(&obj);
                    metrics.watch_event(source, material);
                    if material { vec![Ok(obj)] } else { Vec::new() }
                }
                Ok(watcher::Event::Delete(obj)) => {
                    let name = obj.meta().name.as_deref().unwrap_or_default();
                    known.remove(name);
                    materiality.deleted(name);
                    metrics.watch_event(source, true);
                    vec![Ok(obj)]
                }
                Ok(watcher::Event::Init) => {
                    relisted = Some(HashSet::new());
                    Vec::new()
                }
                Ok(watcher::Event::InitDone) => {
                    let listed = relisted.take().unwrap_or_default();
                    // Also how a reader of the log times a relist after an outage.
                    info!(source, objects = listed.len(), "watch listed");
                    let gone: Vec<String> = known.iter().filter(|n| !listed.contains(*n)).cloned().collect();
                    gone.into_iter()
                        .map(|name| {
                            known.remove(&name);
                            materiality.deleted(&name);
                            metrics.watch_event(source, true);
                            Ok(vanished(&name))
                        })
                        .collect()
                }
            };
            futures::stream::iter(out)
        })
        .flatten()
}

/// Everything about a Node that gpunode reads, hashed. In memory only (compared with the last
/// fingerprint this process saw, never persisted): `DefaultHasher` may change between Rust
/// releases, which cannot matter here; persisted names use `gpunode_crds::names`.
pub fn node_fingerprint(node: &Node) -> u64 {
    let mut h = DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    for (k, v) in node.metadata.annotations.iter().flatten() {
        if k.starts_with(crate::markers::PREFIX) {
            (k, v).hash(&mut h);
        }
    }
    node.metadata.deletion_timestamp.is_some().hash(&mut h);
    if let Some(spec) = &node.spec {
        spec.unschedulable.hash(&mut h);
        for t in spec.taints.iter().flatten() {
            (&t.key, &t.value, &t.effect).hash(&mut h);
        }
    }
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    let condition = |type_: &str| conditions.and_then(|cs| cs.iter().find(|c| c.type_ == type_));
    if let Some(c) = condition(CONDITION_TYPE) {
        (&c.status, &c.reason, &c.message).hash(&mut h);
    }
    // Only its status (not its heartbeat): the fleet cap counts a node that is not Ready.
    condition(super::trim::READY).map(|c| &c.status).hash(&mut h);
    h.finish()
}

/// A Node change matters when its [`node_fingerprint`] changed.
#[derive(Debug, Default)]
pub struct NodeFingerprints {
    seen: HashMap<String, u64>,
}

impl Materiality<Node> for NodeFingerprints {
    fn applied(&mut self, node: &Node) -> bool {
        let fp = node_fingerprint(node);
        let name = node.metadata.name.clone().unwrap_or_default();
        self.seen.insert(name, fp) != Some(fp)
    }

    fn deleted(&mut self, name: &str) {
        self.seen.remove(name);
    }
}

/// The stand-in for a Node that vanished during a re-list: a name, no labels, no uid.
pub fn vanished_node(name: &str) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.to_string());
    n
}

/// Whether a Node came from [`vanished_node`] (real objects always have a uid).
pub fn is_stand_in(meta: &kube::api::ObjectMeta) -> bool {
    meta.uid.is_none()
}

/// The stand-in for a report that vanished during a re-list.
pub fn vanished_report(name: &str) -> GuardedReport {
    DeserializeGuard(Ok(gpunode_crds::GpuNodeReport::new(name, Default::default())))
}

/// A report change matters when it changes the verdict of a policy selecting its node.
pub struct ReportVerdicts {
    /// Nodes, for the labels the policies select on.
    pub nodes: Store<Node>,
    /// The policies' selectors.
    pub selectors: super::index::IndexCache,
    /// The verdicts the last reconciles acted on.
    pub verdicts: Arc<VerdictCache>,
    /// The probes' heartbeats: a report refreshed after its `observedAt` went past `staleAfter`
    /// is no change while the heartbeat kept it fresh.
    pub heartbeats: super::heartbeats::Heartbeats,
}

impl Materiality<GuardedReport> for ReportVerdicts {
    fn applied(&mut self, report: &GuardedReport) -> bool {
        let name = report.name_any();
        let Some(node) = self.nodes.get(&ObjectRef::new(&name)) else {
            // No node yet: its arrival triggers the reconcile.
            return false;
        };
        let now = Timestamp::now();
        let heard = self.heartbeats.heard(&name);
        let index = self.selectors.get();
        index
            .selecting(node.labels())
            .filter_map(|g| g.0.as_ref().ok())
            .any(|p| {
                self.verdicts
                    .report_is_material(p, &name, Some(report), heard, now)
            })
    }

    fn deleted(&mut self, _name: &str) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint};

    fn node() -> Node {
        let mut n = vanished_node("n1");
        n.metadata.uid = Some("u".to_string());
        n.metadata.labels = Some([("gpu".to_string(), "h100".to_string())].into());
        n.spec = Some(NodeSpec::default());
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_string(),
                status: "True".to_string(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        n
    }

    #[test]
    fn kubelet_heartbeats_are_not_material_but_what_gpunode_reads_is() {
        let mut f = NodeFingerprints::default();
        let n = node();
        assert!(f.applied(&n), "first sight");
        let mut heartbeat = n.clone();
        heartbeat.metadata.resource_version = Some("2".to_string());
        if let Some(cs) = heartbeat.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            cs[0].last_heartbeat_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now(),
            ));
        }
        heartbeat
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string());
        assert!(!f.applied(&heartbeat));

        let mut changes: Vec<Node> = Vec::new();
        let mut c = heartbeat.clone();
        c.metadata
            .labels
            .get_or_insert_default()
            .insert("gpunode.dev/skip".to_string(), "true".to_string());
        changes.push(c);
        let mut c = heartbeat.clone();
        c.spec.get_or_insert_default().unschedulable = Some(true);
        changes.push(c);
        let mut c = heartbeat.clone();
        c.spec.get_or_insert_default().taints = Some(vec![Taint {
            key: "example.com/x".to_string(),
            effect: "NoSchedule".to_string(),
            ..Default::default()
        }]);
        changes.push(c);
        let mut c = heartbeat.clone();
        c.metadata
            .annotations
            .get_or_insert_default()
            .insert("gpunode.dev/cordoned".to_string(), "true".to_string());
        changes.push(c);
        let mut c = heartbeat.clone();
        if let Some(cs) = c.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            cs.push(NodeCondition {
                type_: CONDITION_TYPE.to_string(),
                status: "False".to_string(),
                ..Default::default()
            });
        }
        changes.push(c);
        let mut c = heartbeat.clone();
        if let Some(cs) = c.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            cs[0].status = "Unknown".to_string();
        }
        changes.push(c);
        for c in changes {
            let mut f = NodeFingerprints::default();
            assert!(f.applied(&heartbeat));
            assert!(f.applied(&c), "{c:?}");
        }

        f.deleted("n1");
        assert!(f.applied(&heartbeat), "a re-created node is new");
    }

    #[tokio::test]
    async fn deletions_and_objects_vanished_during_a_relist_always_pass() {
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(node())),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(node())),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
        ]);
        let metrics = Arc::new(Metrics::new());
        let out: Vec<Node> = material_changes(
            events,
            "node",
            metrics.clone(),
            NodeFingerprints::default(),
            vanished_node,
        )
        .filter_map(|r| async move { r.ok() })
        .collect()
        .await;
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(!is_stand_in(&out[0].metadata), "the first sight passes");
        assert!(
            is_stand_in(&out[1].metadata),
            "the vanished node passes as a stand-in"
        );
        assert_eq!(metrics.watch_events("node", false), 1, "the unchanged re-apply");
        assert_eq!(metrics.watch_events("node", true), 2);
    }
}
