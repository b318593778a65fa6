//! Watches that check a wave's invariants at every instant the API server shows, not only at the
//! end of a run: how many nodes gpunode has out of service at once, a person's cordon, other
//! controllers' taints and labels, and when each pod's eviction was committed.
//!
//! The pod watch is the eviction oracle that does not trust the answers: the audit log says what
//! each eviction request was answered, but an eviction answered 5xx (or never answered) may still
//! have been committed. The watch sees the deletion itself; any eviction request the API server
//! received after a pod's deletion was committed is a repeat, whatever either was answered.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, reflector, watcher},
};

use crate::{
    audit::AuditEvent,
    faults::{
        checks::Check,
        cluster::watch_config,
        labels::{BYSTANDER_LABEL, FOREIGN_LABEL, FOREIGN_TAINT},
        marks::TAINT_KEY,
    },
};

#[derive(Debug, Default)]
struct Seen {
    max_disrupted: usize,
    node_changes: usize,
    bystander_seen: usize,
    /// `node at time` for every observed state of a person's cordoned node without the cordon.
    cordon_lifted: Vec<String>,
    /// `node: what` for every observed state missing another controller's label or taint.
    foreign_lost: Vec<String>,
    /// Per pod: the earliest time its deletion is known to have been committed.
    committed: BTreeMap<String, jiff::Timestamp>,
    /// Every observed state of a node out of service, in order.
    disruptions: Vec<Disruption>,
    /// Errors either watch returned (each a reconnect), and the node watch's completed lists
    /// (the first, then one per expired resume): what the monitor's record may have gaps at.
    watch_errors: usize,
    node_lists: usize,
    /// Pods a relist found gone, whose deletion no event showed.
    unseen_deletions: usize,
}

impl Seen {
    /// One observed state of `node`, with `disrupted` of the wave's nodes out of service then.
    fn observe_node(&mut self, node: &Node, disrupted: usize) {
        self.max_disrupted = self.max_disrupted.max(disrupted);
        self.node_changes += 1;
        let name = node.metadata.name.clone().unwrap_or_default();
        if out_of_service(node) {
            let approved = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(APPROVE_ANNOTATION))
                .cloned();
            self.disruptions.push(Disruption {
                node: name.clone(),
                at: jiff::Timestamp::now(),
                approved,
            });
        }
        let (label, taint) = has_foreign(node);
        if !label || !taint {
            self.foreign_lost
                .push(format!("{name}: label {label}, taint {taint}"));
        }
        if is_bystander(node) {
            self.bystander_seen += 1;
            if !node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
                self.cordon_lifted
                    .push(format!("{name} at {}", jiff::Timestamp::now()));
            }
        }
    }

    /// What the record may have missed, for a check's detail.
    fn gaps(&self) -> String {
        format!(
            "{} watch errors, {} node lists, {} deletions found by a relist",
            self.watch_errors, self.node_lists, self.unseen_deletions
        )
    }
}

/// One observed state of a node out of service (cordoned, or tainted off by gpunode's key).
#[derive(Debug, Clone)]
pub struct Disruption {
    pub node: String,
    /// When the monitor saw it.
    pub at: jiff::Timestamp,
    /// The node's `gpunode.dev/approve` annotation then (what a person had approved).
    pub approved: Option<String>,
}

/// What a person writes to approve a node's pending actions (README, Manual approval).
const APPROVE_ANNOTATION: &str = "gpunode.dev/approve";

fn has_foreign(node: &Node) -> (bool, bool) {
    let label = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(FOREIGN_LABEL.0))
        .is_some_and(|v| v == FOREIGN_LABEL.1);
    let taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.key == FOREIGN_TAINT.0
                    && t.value.as_deref() == Some(FOREIGN_TAINT.1)
                    && t.effect == FOREIGN_TAINT.2
            })
        });
    (label, taint)
}

/// Out of service, judged from the node itself and not from gpunode's bookkeeping (its
/// annotations): cordoned, unless it is the wave's bystander (a person cordoned it), or tainted
/// NoSchedule/NoExecute with gpunode's key. A cordon gpunode made without recording it counts.
fn out_of_service(node: &Node) -> bool {
    let cordoned = crate::nodes::cordoned(node) && !is_bystander(node);
    cordoned || crate::nodes::tainted_off(node, |key| key == TAINT_KEY)
}

fn is_bystander(node: &Node) -> bool {
    node.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(BYSTANDER_LABEL))
}

/// The earliest moment a terminating pod's deletion is known to be committed: when it was seen
/// terminating, or earlier by its own stamps (`deletionTimestamp` is the commit time plus the
/// grace period, in whole seconds).
fn commit_bound(pod: &Pod, seen_at: jiff::Timestamp) -> jiff::Timestamp {
    let stamped = pod.metadata.deletion_timestamp.as_ref().and_then(|t| {
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        t.0.checked_sub(jiff::SignedDuration::from_secs(grace - 1)).ok()
    });
    match stamped {
        Some(s) if s < seen_at => s,
        _ => seen_at,
    }
}

/// The watches' backoff after an error: a short constant retry, so the monitor is back within a
/// fraction of a second of the API server (kube's default grows to 30 s, long enough to miss a
/// whole drain, and the next resume may then be expired and relist without the deletions).
#[derive(Debug, Clone, Copy)]
struct Prompt;

impl Iterator for Prompt {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::from_millis(200))
    }
}

impl kube::runtime::utils::Backoff for Prompt {
    fn reset(&mut self) {}
}

/// Pod names known to exist, and the relist in progress: a pod the relist does not show was
/// deleted while the watch was down, a deletion the monitor did not see happen.
#[derive(Debug, Default)]
struct PodNames {
    known: std::collections::BTreeSet<String>,
    relisting: Option<std::collections::BTreeSet<String>>,
}

impl PodNames {
    /// Takes one watch event; returns pods found gone by a finished relist.
    fn take(&mut self, event: &watcher::Event<Pod>) -> Vec<String> {
        let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        match event {
            watcher::Event::Init => self.relisting = Some(Default::default()),
            watcher::Event::InitApply(p) => {
                self.relisting
                    .get_or_insert_with(Default::default)
                    .insert(name(p));
            }
            watcher::Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                let gone = self.known.difference(&listed).cloned().collect();
                self.known = listed;
                return gone;
            }
            watcher::Event::Apply(p) => {
                self.known.insert(name(p));
            }
            watcher::Event::Delete(p) => {
                self.known.remove(&name(p));
            }
        }
        Vec::new()
    }
}

/// The watches of one wave: its nodes (`selector`, with any bystander) and its pods.
pub struct WaveMonitor {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    has_bystander: bool,
}

impl WaveMonitor {
    /// Starts watching the nodes labelled `selector` and the pods of `namespace`.
    pub fn start(client: &Client, selector: &str, namespace: &str, has_bystander: bool) -> WaveMonitor {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (reader, writer) = reflector::store::<Node>();
        let nodes = watcher(Api::<Node>::all(client.clone()), watch_config().labels(selector))
            .backoff(Prompt)
            .reflect(writer);
        let s = seen.clone();
        let node_task = tokio::spawn(async move {
            let mut nodes = std::pin::pin!(nodes);
            while let Some(item) = nodes.next().await {
                let node = match item {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => n,
                    Ok(watcher::Event::InitDone) => {
                        let Ok(mut seen) = s.lock() else { return };
                        seen.node_lists += 1;
                        continue;
                    }
                    // Errors are the faults themselves (API server down); the watcher retries.
                    Err(_) => {
                        let Ok(mut seen) = s.lock() else { return };
                        seen.watch_errors += 1;
                        continue;
                    }
                    Ok(_) => continue,
                };
                let now = reader.state().iter().filter(|n| out_of_service(n)).count();
                let Ok(mut seen) = s.lock() else { return };
                seen.observe_node(&node, now);
            }
        });
        let pods = watcher(Api::<Pod>::namespaced(client.clone(), namespace), watch_config()).backoff(Prompt);
        let s = seen.clone();
        let pod_task = tokio::spawn(async move {
            let mut pods = std::pin::pin!(pods);
            let mut names = PodNames::default();
            while let Some(item) = pods.next().await {
                let now = jiff::Timestamp::now();
                let Ok(mut seen) = s.lock() else { return };
                let event = match item {
                    Ok(e) => e,
                    Err(_) => {
                        seen.watch_errors += 1;
                        continue;
                    }
                };
                for gone in names.take(&event) {
                    // Deleted unseen while the watch was down: committed by now at the latest.
                    seen.unseen_deletions += 1;
                    seen.committed.entry(gone).or_insert(now);
                }
                let (pod, deleted) = match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (p, false),
                    watcher::Event::Delete(p) => (p, true),
                    _ => continue,
                };
                if !deleted && pod.metadata.deletion_timestamp.is_none() {
                    continue;
                }
                let at = commit_bound(&pod, now);
                let name = pod.metadata.name.clone().unwrap_or_default();
                let e = seen.committed.entry(name).or_insert(at);
                *e = (*e).min(at);
            }
        });
        WaveMonitor {
            seen,
            tasks: vec![node_task, pod_task],
            has_bystander,
        }
    }

    /// Every observed state of a node out of service so far, in order.
    pub fn disruptions(&self) -> Vec<Disruption> {
        self.seen
            .lock()
            .map(|s| s.disruptions.clone())
            .unwrap_or_default()
    }

    /// Waits (up to 10 s) until the pod watch has seen the deletion of every pod `evicted` names,
    /// the watch's lag behind the API server; returns those it still has not.
    async fn caught_up(&self, evicted: &std::collections::BTreeSet<String>) -> Vec<String> {
        let missing = || -> Vec<String> {
            let Ok(seen) = self.seen.lock() else {
                return evicted.iter().cloned().collect();
            };
            evicted
                .iter()
                .filter(|p| !seen.committed.contains_key(*p))
                .cloned()
                .collect()
        };
        let waited = crate::wait::until(
            "the wave monitor's pod watch",
            Duration::from_secs(10),
            || async {
                let m = missing();
                Ok(m.is_empty().then_some(()))
            },
        )
        .await;
        if waited.is_ok() { Vec::new() } else { missing() }
    }

    /// Every invariant the watches hold for a wave under a budget of `allowed` nodes, with the
    /// audit log's eviction requests for the wave's `namespace`. Each check fails, too, when the
    /// watches saw too little to judge: no node state at all, no node out of service in a wave
    /// whose pods gpunode evicted, an evicted pod whose deletion the pod watch never saw.
    pub async fn checks(&self, allowed: usize, audit: &[AuditEvent], namespace: &str) -> Vec<Check> {
        let evictions: Vec<&AuditEvent> = audit.iter().filter(|e| e.is_eviction_in(namespace)).collect();
        let evicted: std::collections::BTreeSet<String> = evictions
            .iter()
            .filter(|e| e.succeeded())
            .map(|e| e.name.clone())
            .collect();
        let unseen = self.caught_up(&evicted).await;
        let Ok(seen) = self.seen.lock() else {
            return vec![Check::new("monitor alive", false, "poisoned")];
        };
        let gaps = seen.gaps();
        let mut out = vec![Check::new(
            "budget held at every observed instant",
            seen.max_disrupted <= allowed
                && seen.node_changes > 0
                && (evictions.is_empty() || seen.max_disrupted > 0),
            format!(
                "max {} disrupted of {allowed} allowed over {} observed node changes, {} eviction requests; {gaps}",
                seen.max_disrupted,
                seen.node_changes,
                evictions.len()
            ),
        )];
        out.push(Check::new(
            "other controllers' taints and labels kept at every observed instant",
            seen.foreign_lost.is_empty() && seen.node_changes > 0,
            format!(
                "{} observed node states, missing in: {:?}",
                seen.node_changes,
                seen.foreign_lost.iter().take(5).collect::<Vec<_>>()
            ),
        ));
        if self.has_bystander {
            out.push(Check::new(
                "a person's cordon never lifted",
                seen.cordon_lifted.is_empty() && seen.bystander_seen > 0,
                format!(
                    "{} observed states of the node a person cordoned, uncordoned in: {:?}",
                    seen.bystander_seen,
                    seen.cordon_lifted.iter().take(5).collect::<Vec<_>>()
                ),
            ));
        }
        let repeats: Vec<String> = evictions
            .iter()
            .filter_map(|e| {
                let committed = seen.committed.get(&e.name)?;
                (e.at > *committed)
                    .then(|| format!("{} at {} ({}), committed by {committed}", e.name, e.at, e.code))
            })
            .collect();
        out.push(Check::new(
            "no eviction requested after the pod's eviction was committed (pod watch)",
            repeats.is_empty() && unseen.is_empty(),
            format!(
                "{} eviction requests, {} pods seen deleted, evicted but never seen deleted: {unseen:?}; \
                 repeats: {repeats:?}",
                evictions.len(),
                seen.committed.len()
            ),
        ));
        out
    }
}

impl Drop for WaveMonitor {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn pod(name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p
    }

    #[test]
    fn a_relist_finds_the_pods_deleted_while_the_watch_was_down() {
        let mut names = PodNames::default();
        let first = [
            watcher::Event::Init,
            watcher::Event::InitApply(pod("a")),
            watcher::Event::InitApply(pod("b")),
            watcher::Event::InitDone,
            watcher::Event::Apply(pod("c")),
            watcher::Event::Delete(pod("c")),
        ];
        let found: Vec<String> = first.iter().flat_map(|e| names.take(e)).collect();
        assert!(found.is_empty(), "{found:?}");
        // The watch comes back expired: only `b` is listed again, so `a` went unseen.
        let relist = [
            watcher::Event::Init,
            watcher::Event::InitApply(pod("b")),
            watcher::Event::InitDone,
        ];
        let found: Vec<String> = relist.iter().flat_map(|e| names.take(e)).collect();
        assert_eq!(found, vec!["a".to_string()]);
    }

    #[test]
    fn the_commit_bound_is_the_earlier_of_the_stamp_and_the_observation() {
        let mut pod = Pod::default();
        let seen: jiff::Timestamp = "2026-12-01T12:00:10Z".parse().unwrap_or_default();
        assert_eq!(commit_bound(&pod, seen), seen);
        // Deleted at 12:00:00 with 30 s of grace: stamped 12:00:30; committed before 12:00:01.
        pod.metadata.deletion_timestamp = Some(Time("2026-12-01T12:00:30Z".parse().unwrap_or_default()));
        pod.metadata.deletion_grace_period_seconds = Some(30);
        assert_eq!(commit_bound(&pod, seen).to_string(), "2026-12-01T12:00:01Z");
        // Seen before the stamp's bound: the observation is the bound.
        let early: jiff::Timestamp = "2026-12-01T12:00:00.5Z".parse().unwrap_or_default();
        assert_eq!(commit_bound(&pod, early), early);
    }
}
