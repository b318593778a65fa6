//! One watch on the benchmark's nodes, recording the moment each node first shows what a phase
//! waits for: gpunode's state label and condition, gpunode's taint (and its removal), NFD's
//! label. Times are taken when the watch event arrives in this process.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use tokio::sync::watch;

use crate::error::Error;

/// Label every benchmark node carries (nodes.sh's template).
pub const NODE_SELECTOR: &str = "nvidia.com/gpu.present=true";
/// gpunode's verdict label.
pub const STATE_LABEL: &str = "gpunode.dev/state";
/// gpunode's node condition.
pub const CONDITION: &str = "GpuPolicyCompliant";
/// Key of gpunode's drift taints.
pub const TAINT_KEY: &str = "gpunode.dev/drift";
/// The label the benchmark's NodeFeatureRule gives a node (NFD adds its default prefix).
pub const NFD_LABEL: &str = "feature.node.kubernetes.io/gpunode-bench-compliant";

/// What one node shows and since when.
#[derive(Debug, Clone)]
pub struct NodeEntry {
    /// First time the node carried the state label and the condition since it last carried
    /// neither (gpunode released it).
    pub converged_at: Option<Instant>,
    /// The state label's value.
    pub state: Option<String>,
    /// Whether gpunode's taint is on the node, and when that last changed.
    pub tainted: bool,
    /// When the taint last appeared or went.
    pub taint_changed_at: Instant,
    /// The same moment on the wall clock (to compare with a probe's log, on this machine).
    pub taint_changed_wall: jiff::Timestamp,
    /// First time the node carried NFD's label.
    pub nfd_at: Option<Instant>,
}

/// Everything the watch has seen.
#[derive(Debug, Default)]
pub struct Seen {
    /// Per node.
    pub nodes: HashMap<String, NodeEntry>,
    /// Nodes that have converged and not been released since.
    pub converged: usize,
    /// Nodes NFD has labelled.
    pub nfd_labelled: usize,
    /// The initial list is complete.
    pub synced: bool,
}

/// The node watch and its state.
#[derive(Clone)]
pub struct Tracker {
    seen: Arc<Mutex<Seen>>,
    tick: Arc<watch::Sender<u64>>,
}

fn has_condition(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == CONDITION))
}

fn has_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT_KEY))
}

impl Tracker {
    /// Starts watching the benchmark's nodes; stops with the runtime.
    pub fn start(client: Client) -> Tracker {
        let tracker = Tracker {
            seen: Arc::new(Mutex::new(Seen::default())),
            tick: Arc::new(watch::channel(0).0),
        };
        let t = tracker.clone();
        tokio::spawn(async move {
            let api: Api<Node> = Api::all(client);
            let mut stream = watcher(api, watcher::Config::default().labels(NODE_SELECTOR))
                .default_backoff()
                .boxed();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => t.observe(&n),
                    Ok(watcher::Event::InitDone) => {
                        t.lock().synced = true;
                        t.bump();
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "node watch"),
                }
            }
        });
        tracker
    }

    fn lock(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.tick.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn observe(&self, node: &Node) {
        let now = Instant::now();
        let wall = jiff::Timestamp::now();
        let name = node.name_any();
        let state = node.labels().get(STATE_LABEL).cloned();
        let converged = state.is_some() && has_condition(node);
        let tainted = has_taint(node);
        let nfd = node.labels().contains_key(NFD_LABEL);
        {
            let mut seen = self.lock();
            let Seen {
                nodes,
                converged: conv_count,
                nfd_labelled,
                ..
            } = &mut *seen;
            let e = nodes.entry(name).or_insert_with(|| NodeEntry {
                converged_at: None,
                state: None,
                tainted,
                taint_changed_at: now,
                taint_changed_wall: wall,
                nfd_at: None,
            });
            e.state = state;
            if converged && e.converged_at.is_none() {
                e.converged_at = Some(now);
                *conv_count += 1;
            } else if !converged && !has_condition(node) && e.converged_at.is_some() && e.state.is_none() {
                // Released (the policy was deleted): the next convergence counts again.
                e.converged_at = None;
                *conv_count -= 1;
            }
            if tainted != e.tainted {
                e.tainted = tainted;
                e.taint_changed_at = now;
                e.taint_changed_wall = wall;
            }
            if nfd && e.nfd_at.is_none() {
                e.nfd_at = Some(now);
                *nfd_labelled += 1;
            }
        }
        self.bump();
    }

    /// Reads the state.
    pub fn with<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.lock())
    }

    /// Waits until `f` returns a value, re-checking after every watch event.
    pub async fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Seen) -> Option<T>,
    ) -> Result<T, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.tick.subscribe();
        loop {
            rx.borrow_and_update();
            if let Some(v) = f(&self.lock()) {
                return Ok(v);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::Other(format!("node watch ended while waiting for {what}"))),
                Err(_) => {
                    return Err(Error::Timeout {
                        what: what.to_string(),
                        after: timeout,
                    });
                }
            }
        }
    }
}
