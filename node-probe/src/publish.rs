//! Publishing observations as the node's `GpuNodeReport`.
//!
//! [`run_loop`] observes on an interval (and right after an XID arrives), publishes at once when
//! [`material_changes`] finds a difference from the last published observation, otherwise at the
//! heartbeat. A failed publish is retried with capped exponential backoff, always with the newest
//! observation (the latest replaces what was waiting; nothing queues up). [`KubeSink`] writes with
//! server-side apply: the object (spec and an owner reference to the Node) and its status.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gpunode_crds::GpuNodeReport;
use gpunode_crds::report::GpuNodeReportStatus;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::change::{ChangeConfig, material_changes};
use crate::state::ProbeState;

/// Field manager of every write the probe makes.
pub const FIELD_MANAGER: &str = "gpunode-node-probe";

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The API server refused or could not be reached.
    #[error("kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// The observation could not be encoded.
    #[error("encoding the report: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Somewhere observations are published to.
pub trait ReportSink: Send {
    /// Publishes one observation.
    fn publish(
        &mut self,
        status: &GpuNodeReportStatus,
    ) -> impl Future<Output = Result<(), PublishError>> + Send;
}

/// Something that observes the node (blocking; run off the async threads).
pub trait Observe: Send + Sync + 'static {
    /// One observation.
    fn observe(&self) -> GpuNodeReportStatus;
}

impl Observe for crate::collect::Probe {
    fn observe(&self) -> GpuNodeReportStatus {
        crate::collect::Probe::observe(self)
    }
}

/// Timing of the publish loop.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    /// How often to observe.
    pub interval: Duration,
    /// Longest time without a publish while nothing changes.
    pub heartbeat: Duration,
    /// Shortest time between two observations triggered by XIDs, and between two publishes:
    /// bounds the work an XID storm causes.
    pub min_gap: Duration,
    /// First retry delay after a failed publish.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// What counts as a material change.
    pub change: ChangeConfig,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            interval: Duration::from_secs(10),
            heartbeat: Duration::from_secs(60),
            min_gap: Duration::from_secs(1),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            change: ChangeConfig::default(),
        }
    }
}

/// Publishes the report of `node` with server-side apply.
pub struct KubeSink {
    reports: Api<GpuNodeReport>,
    nodes: Api<Node>,
    node: String,
    /// The object (spec + owner reference) has been applied.
    object_applied: bool,
    /// The owner reference to the Node is in place.
    owner_set: bool,
}

impl KubeSink {
    /// A sink writing `gpunodereports/<node>`.
    pub fn new(client: Client, node: &str) -> Self {
        KubeSink {
            reports: Api::all(client.clone()),
            nodes: Api::all(client),
            node: node.to_owned(),
            object_applied: false,
            owner_set: false,
        }
    }

    fn params() -> PatchParams {
        // The probe is the only writer of its report, so it takes over fields from anyone else.
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Applies the object itself: name, `spec.nodeName` and, when the Node can be read, an owner
    /// reference to it (so the report is garbage-collected with the Node). Without the Node's
    /// uid the report is still published and the reference is retried on the next publish.
    async fn apply_object(&mut self) -> Result<(), PublishError> {
        let owner = match self.nodes.get(&self.node).await {
            Ok(node) => node.metadata.uid.map(|uid| {
                json!([{
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.node,
                    "uid": uid,
                    "blockOwnerDeletion": false,
                }])
            }),
            Err(e) => {
                tracing::warn!(node = %self.node, error = %e, "cannot read the Node; publishing without an owner reference");
                None
            }
        };
        let mut metadata = json!({ "name": self.node });
        if let Some(owner) = &owner {
            metadata["ownerReferences"] = owner.clone();
        }
        let object = json!({
            "apiVersion": GpuNodeReport::api_version(&()),
            "kind": GpuNodeReport::kind(&()),
            "metadata": metadata,
            "spec": { "nodeName": self.node },
        });
        self.reports
            .patch(&self.node, &Self::params(), &Patch::Apply(&object))
            .await?;
        self.object_applied = true;
        self.owner_set = owner.is_some();
        Ok(())
    }

    async fn apply_status(&self, status: &GpuNodeReportStatus) -> Result<(), PublishError> {
        let patch = json!({
            "apiVersion": GpuNodeReport::api_version(&()),
            "kind": GpuNodeReport::kind(&()),
            "status": serde_json::to_value(status)?,
        });
        self.reports
            .patch_status(&self.node, &Self::params(), &Patch::Apply(&patch))
            .await?;
        Ok(())
    }
}

impl ReportSink for KubeSink {
    async fn publish(&mut self, status: &GpuNodeReportStatus) -> Result<(), PublishError> {
        if !self.object_applied || !self.owner_set {
            self.apply_object().await?;
        }
        match self.apply_status(status).await {
            // Someone deleted the report: recreate it once.
            Err(PublishError::Api(kube::Error::Api(s))) if s.is_not_found() => {
                self.apply_object().await?;
                self.apply_status(status).await
            }
            other => other,
        }
    }
}

/// Publishes one observation of `node` (creating the report if missing).
pub async fn publish_once(
    client: &Client,
    node: &str,
    report: &GpuNodeReportStatus,
) -> Result<(), PublishError> {
    KubeSink::new(client.clone(), node).publish(report).await
}

/// Why the next publish happens.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Due {
    Change(String),
    Heartbeat,
}

/// The publish loop; returns when `shutdown` completes. `xids` wakes it when an XID arrives.
pub async fn run_loop<O: Observe, S: ReportSink>(
    config: &PublishConfig,
    observer: Arc<O>,
    sink: &mut S,
    mut xids: Option<watch::Receiver<u64>>,
    state: Arc<ProbeState>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let start = Instant::now();
    let mut next_tick = start;
    let mut last_observe: Option<Instant> = None;
    let mut xid_pending = false;
    let mut published: Option<GpuNodeReportStatus> = None;
    let mut last_publish_at: Option<Instant> = None;
    let mut pending: Option<(GpuNodeReportStatus, Due)> = None;
    let mut next_attempt = start;
    let mut backoff = config.backoff_initial;

    loop {
        let observe_at = if xid_pending {
            next_tick.min(last_observe.map_or(start, |t| t + config.min_gap))
        } else {
            next_tick
        };
        let wake = if pending.is_some() {
            observe_at.min(next_attempt)
        } else {
            observe_at
        };
        let xid_changed = async {
            match xids.as_mut() {
                Some(rx) if !xid_pending => rx.changed().await.is_ok(),
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep_until(wake) => {}
            alive = xid_changed => {
                if alive {
                    xid_pending = true;
                } else {
                    xids = None;
                }
                continue;
            }
        }

        let now = Instant::now();
        if now >= observe_at {
            let reason = if xid_pending { "xid" } else { "interval" };
            let obs = {
                let observer = observer.clone();
                match tokio::task::spawn_blocking(move || observer.observe()).await {
                    Ok(obs) => obs,
                    Err(e) => {
                        tracing::error!(error = %e, "observation panicked");
                        next_tick = now + config.interval;
                        continue;
                    }
                }
            };
            tracing::debug!(reason, "observed");
            last_observe = Some(now);
            xid_pending = false;
            while next_tick <= now {
                next_tick += config.interval;
            }
            state.set_latest(obs.clone());
            let due = match &published {
                None => Some(Due::Change("first observation".into())),
                Some(prev) => {
                    let changes = material_changes(prev, &obs, &config.change);
                    if !changes.is_empty() {
                        let text: Vec<String> = changes.iter().map(ToString::to_string).collect();
                        Some(Due::Change(text.join("; ")))
                    } else if last_publish_at.is_none_or(|t| now.duration_since(t) >= config.heartbeat) {
                        Some(Due::Heartbeat)
                    } else {
                        None
                    }
                }
            };
            // Keep only the newest observation; a change still waiting stays the reason.
            pending = match (pending.take(), due) {
                (Some((_, Due::Change(why))), _) => Some((obs, Due::Change(why))),
                (_, Some(due)) => Some((obs, due)),
                (Some((_, due)), None) => Some((obs, due)),
                (None, None) => None,
            };
        }

        let now = Instant::now();
        if now < next_attempt {
            continue;
        }
        let Some((status, due)) = pending.take() else {
            continue;
        };
        let reason = match &due {
            Due::Change(why) => why.as_str(),
            Due::Heartbeat => "heartbeat",
        };
        let span = tracing::info_span!("publish", reason, gpus = status.gpus.len());
        let result = sink.publish(&status).instrument(span).await;
        match result {
            Ok(()) => {
                tracing::info!(reason, "published");
                state.record_publish(true);
                published = Some(status);
                last_publish_at = Some(now);
                backoff = config.backoff_initial;
                next_attempt = now + config.min_gap;
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "publish failed");
                state.record_publish(false);
                pending = Some((status, due));
                next_attempt = now + backoff;
                backoff = (backoff * 2).min(config.backoff_max);
            }
        }
    }
    tracing::info!("publish loop stopped");
}
