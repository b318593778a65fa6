//! Publishing observations as the node's `GpuNodeReport`.
//!
//! [`run_loop`] observes on an interval (and right after an XID arrives or the policies change)
//! and publishes the whole report at once when [`decide`] finds a difference from the last
//! published observation (under the known policies, one in the operator's verdict; see
//! [`crate::change`] for the contract), and otherwise every `report_refresh`. In between, every `heartbeat`, it only
//! renews the node's heartbeat Lease ([`gpunode_crds::heartbeat`]: a report write costs the API
//! server six times a Lease renewal). A failed write is retried with capped exponential backoff,
//! always with the newest observation (the latest replaces what was waiting; nothing queues up),
//! and the first write after a failure or a gap is the whole report. [`KubeSink`] writes with
//! server-side apply: the object (spec and an owner reference to the Node), its status, and the
//! Lease.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gpunode_crds::GpuNodeReport;
use gpunode_crds::heartbeat::{self, lease_name};
use gpunode_crds::report::GpuNodeReportStatus;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use crate::change::{ChangeConfig, decide};
use crate::policies::Known;
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

/// What a heartbeat wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Only the heartbeat Lease was renewed.
    Lease,
    /// The whole report was written (no Lease to renew).
    Report,
}

/// Somewhere observations are published to.
pub trait ReportSink: Send {
    /// Publishes one observation: the whole report.
    fn publish(
        &mut self,
        status: &GpuNodeReportStatus,
    ) -> impl Future<Output = Result<(), PublishError>> + Send;

    /// Says the probe is alive, `status` being no material change from the last published
    /// observation. Without a cheaper way (the default), publishes the whole report.
    fn heartbeat(
        &mut self,
        status: &GpuNodeReportStatus,
    ) -> impl Future<Output = Result<Beat, PublishError>> + Send {
        async move { self.publish(status).await.map(|()| Beat::Report) }
    }
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
    /// Longest time without a write while nothing changes: the heartbeat (a Lease renewal where
    /// the sink has one).
    pub heartbeat: Duration,
    /// Longest time without writing the whole report while nothing material changes (temperatures
    /// within their band, power, counters no check reads).
    pub report_refresh: Duration,
    /// Shortest time between two observations triggered by notifications (XIDs, policy
    /// changes), and between two report writes: bounds the work an XID storm causes. A
    /// periodic observation or a Lease renewal does not hold back the next notification.
    pub min_gap: Duration,
    /// First retry delay after a failed publish.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Shortest time from a report write to a write that only clears findings (a drift or an
    /// unknown that went away, nothing new): a value sitting on a threshold publishes its drift at
    /// once but not every flip back.
    pub recovery_gap: Duration,
    /// What counts as a material change when no policy is known.
    pub change: ChangeConfig,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            interval: Duration::from_secs(10),
            heartbeat: Duration::from_secs(60),
            report_refresh: Duration::from_secs(600),
            min_gap: Duration::from_secs(1),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            recovery_gap: Duration::from_secs(120),
            change: ChangeConfig::default(),
        }
    }
}

/// Publishes the report of `node` with server-side apply.
pub struct KubeSink {
    client: Client,
    reports: Api<GpuNodeReport>,
    nodes: Api<Node>,
    node: String,
    /// The object (spec + owner reference) has been applied.
    object_applied: bool,
    /// The Node's uid, once read: the owner of the report and the Lease.
    node_uid: Option<String>,
    /// The heartbeat Lease and its name, while heartbeats may renew it.
    lease: Option<(Api<Lease>, String)>,
    /// `spec.leaseDurationSeconds` of the Lease.
    lease_seconds: i32,
}

impl KubeSink {
    /// A sink writing `gpunodereports/<node>`; heartbeats write the whole report until
    /// [`KubeSink::with_heartbeat_lease`].
    pub fn new(client: Client, node: &str) -> Self {
        KubeSink {
            client: client.clone(),
            reports: Api::all(client.clone()),
            nodes: Api::all(client),
            node: node.to_owned(),
            object_applied: false,
            node_uid: None,
            lease: None,
            lease_seconds: 0,
        }
    }

    /// Heartbeats renew the Lease `gpunode-probe-<node>` in `namespace` instead of writing the
    /// report; the Lease says it lapses after three `heartbeat`s.
    pub fn with_heartbeat_lease(mut self, namespace: &str, heartbeat: Duration) -> Self {
        match lease_name(&self.node) {
            Some(name) => self.lease = Some((Api::namespaced(self.client.clone(), namespace), name)),
            None => {
                tracing::warn!(node = %self.node, "node name too long for a heartbeat Lease name; heartbeats write the whole report")
            }
        }
        self.lease_seconds = i32::try_from(heartbeat.as_secs().saturating_mul(3))
            .unwrap_or(i32::MAX)
            .max(1);
        self
    }

    fn owner(&self) -> Option<serde_json::Value> {
        self.node_uid.as_ref().map(|uid| {
            json!([{
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": uid,
                "blockOwnerDeletion": false,
            }])
        })
    }

    /// Renews the heartbeat Lease (creating it the first time) as of `observed`: the time of
    /// the observation that found nothing to publish, not of the write. The operator takes the
    /// published report as holding through the renewal, so it must not count a write that lags
    /// its observation (a retry, a GPU reset in between) as newer than it is.
    async fn renew_lease(
        &self,
        leases: &Api<Lease>,
        name: &str,
        observed: jiff::Timestamp,
    ) -> Result<(), kube::Error> {
        let owner = self.node_uid.as_deref().map(|uid| (self.node.as_str(), uid));
        let lease = heartbeat::lease(name, &self.node, owner, self.lease_seconds, MicroTime(observed));
        leases.patch(name, &Self::params(), &Patch::Apply(&lease)).await?;
        Ok(())
    }

    fn params() -> PatchParams {
        // The probe is the only writer of its report, so it takes over fields from anyone else.
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Applies the object itself: name, `spec.nodeName` and, when the Node can be read, an owner
    /// reference to it (so the report is garbage-collected with the Node). Without the Node's
    /// uid the report is still published and the reference is retried on the next publish.
    async fn apply_object(&mut self) -> Result<(), PublishError> {
        match self.nodes.get(&self.node).await {
            Ok(node) => self.node_uid = node.metadata.uid,
            Err(e) => {
                tracing::warn!(node = %self.node, error = %e, "cannot read the Node; publishing without an owner reference");
            }
        }
        let owner = self.owner();
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
        if !self.object_applied || self.node_uid.is_none() {
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

    async fn heartbeat(&mut self, status: &GpuNodeReportStatus) -> Result<Beat, PublishError> {
        if let Some((leases, name)) = &self.lease {
            let observed = status
                .observed_at
                .as_ref()
                .map_or_else(jiff::Timestamp::now, |t| t.0);
            match self.renew_lease(leases, name, observed).await {
                Ok(()) => return Ok(Beat::Lease),
                // No RBAC for Leases (a chart older than the probe) or no namespace: still
                // heartbeat, with the whole report, as before Leases.
                Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {
                    tracing::warn!(namespace = leases.namespace().unwrap_or_default(), lease = %name, error = %s,
                        "cannot write the heartbeat Lease; heartbeats write the whole report instead");
                    self.lease = None;
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.publish(status).await.map(|()| Beat::Report)
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

/// Why the next write happens.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Due {
    /// A material change: the whole report, now (a recovery: after `recovery_gap`).
    Change {
        /// What changed.
        why: String,
        /// Only findings cleared (see [`crate::change::Change::is_recovery`]).
        recovery: bool,
    },
    /// `report_refresh` passed: the whole report.
    Refresh,
    /// `heartbeat` passed: the Lease (see [`ReportSink::heartbeat`]).
    Heartbeat,
}

impl Due {
    /// Of two reasons, the one that writes more wins (the earlier change keeps its text).
    fn merge(old: Due, new: Due) -> Due {
        let rank = |d: &Due| match d {
            Due::Change { recovery: false, .. } => 3,
            Due::Change { recovery: true, .. } => 2,
            Due::Refresh => 1,
            Due::Heartbeat => 0,
        };
        if rank(&old) >= rank(&new) { old } else { new }
    }
}

/// When a write for `due` may happen: after the backoff or `min_gap` (`next_attempt`), and a
/// recovery only `recovery_gap` after the last report write.
fn ready_at(
    due: &Due,
    next_attempt: Instant,
    last_report_at: Option<Instant>,
    config: &PublishConfig,
) -> Instant {
    match (due, last_report_at) {
        (Due::Change { recovery: true, .. }, Some(last)) => next_attempt.max(last + config.recovery_gap),
        _ => next_attempt,
    }
}

/// The publish loop; returns when `shutdown` completes. `xids` wakes it when an XID arrives.
/// Without policies: see [`run_loop_with_policies`].
pub async fn run_loop<O: Observe, S: ReportSink>(
    config: &PublishConfig,
    observer: Arc<O>,
    sink: &mut S,
    xids: Option<watch::Receiver<u64>>,
    state: Arc<ProbeState>,
    shutdown: impl Future<Output = ()>,
) {
    run_loop_with_policies(config, observer, sink, xids, None, state, shutdown).await;
}

/// [`run_loop`], deciding by the operator's checks under the policies `policies` holds (see
/// [`crate::policies`]; while it holds `None`, or without it, by temperature bands). A change of
/// the policies triggers an observation, since the last published report may judge differently
/// under the new ones.
pub async fn run_loop_with_policies<O: Observe, S: ReportSink>(
    config: &PublishConfig,
    observer: Arc<O>,
    sink: &mut S,
    mut xids: Option<watch::Receiver<u64>>,
    mut policies: Option<watch::Receiver<Known>>,
    state: Arc<ProbeState>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let start = Instant::now();
    let mut next_tick = start;
    // The last observation an XID, and the last a policy change, triggered: each storm bound
    // counts from its own kind alone. Counting from any observation made a notification that
    // came just after a periodic (or the other kind's) observation wait for `min_gap` behind a
    // timer that had nothing to do with it.
    let mut last_xid_observe: Option<Instant> = None;
    let mut last_policy_observe: Option<Instant> = None;
    let mut xid_pending = false;
    let mut policy_pending = false;
    // The XID count last seen: a notification that leaves it unchanged is a wake (after a GPU
    // reset), whose observation is written whole even when nothing changed, since the operator
    // judges the reset by the first report written after its outcome.
    let mut xids_seen = xids.as_mut().map(|rx| *rx.borrow_and_update());
    let mut woken = false;
    let mut published: Option<GpuNodeReportStatus> = None;
    // Last write of the whole report, and last write of anything (report or Lease).
    let mut last_report_at: Option<Instant> = None;
    let mut last_write_at: Option<Instant> = None;
    // A write failed since the last success: the next one is the whole report, so that an
    // operator that saw this node go stale sees it back (a Lease renewal alone is no report
    // event) whatever it missed meanwhile.
    let mut failed_since_write = false;
    let mut pending: Option<(GpuNodeReportStatus, Due)> = None;
    let mut next_attempt = start;
    let mut backoff = config.backoff_initial;

    loop {
        let allowed = |last: Option<Instant>| last.map_or(start, |t| t + config.min_gap);
        let mut observe_at = next_tick;
        if xid_pending {
            observe_at = observe_at.min(allowed(last_xid_observe));
        }
        if policy_pending {
            observe_at = observe_at.min(allowed(last_policy_observe));
        }
        // When what waits may be written: after the backoff or `min_gap`, and a recovery only
        // `recovery_gap` after the last report write.
        let wake = match &pending {
            Some((_, due)) => observe_at.min(ready_at(due, next_attempt, last_report_at, config)),
            None => observe_at,
        };
        let xid_changed = async {
            match xids.as_mut() {
                Some(rx) if !xid_pending => rx.changed().await.ok().map(|()| *rx.borrow_and_update()),
                _ => std::future::pending().await,
            }
        };
        let policies_changed = async {
            match policies.as_mut() {
                Some(rx) if !policy_pending => rx.changed().await.is_ok(),
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep_until(wake) => {}
            seen = xid_changed => {
                match seen {
                    Some(total) => {
                        xid_pending = true;
                        woken |= xids_seen == Some(total);
                        xids_seen = Some(total);
                    }
                    None => xids = None,
                }
                continue;
            }
            alive = policies_changed => {
                if alive {
                    policy_pending = true;
                } else {
                    policies = None;
                }
                continue;
            }
        }

        let now = Instant::now();
        if now >= observe_at {
            let reason = if xid_pending {
                "xid"
            } else if policy_pending {
                "policies"
            } else {
                "interval"
            };
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
            if xid_pending {
                last_xid_observe = Some(now);
            }
            if policy_pending {
                last_policy_observe = Some(now);
            }
            xid_pending = false;
            policy_pending = false;
            let forced = std::mem::take(&mut woken);
            while next_tick <= now {
                next_tick += config.interval;
            }
            state.set_latest(obs.clone());
            let due = match &published {
                None => Some(Due::Change {
                    why: "first observation".into(),
                    recovery: false,
                }),
                Some(prev) => {
                    let known = policies.as_ref().and_then(|rx| rx.borrow().clone());
                    let changes = decide(
                        prev,
                        &obs,
                        known.as_deref().map(Vec::as_slice),
                        &config.change,
                        jiff::Timestamp::now(),
                    );
                    if !changes.is_empty() {
                        let text: Vec<String> = changes.iter().map(ToString::to_string).collect();
                        Some(Due::Change {
                            why: text.join("; "),
                            recovery: changes.iter().all(crate::change::Change::is_recovery),
                        })
                    } else if forced
                        || last_report_at.is_none_or(|t| now.duration_since(t) >= config.report_refresh)
                    {
                        Some(Due::Refresh)
                    } else if last_write_at.is_none_or(|t| now.duration_since(t) >= config.heartbeat) {
                        Some(Due::Heartbeat)
                    } else {
                        None
                    }
                }
            };
            // Keep only the newest observation. After a failed write the reason that writes most
            // stays (what failed must still be written); otherwise what waits was decided
            // against the same published report as `due`, which replaces it (a recovery
            // that reverted before its gap passed is not written).
            pending = match (pending.take(), due) {
                (None, None) => None,
                (Some(_), None) if !failed_since_write => None,
                (Some((_, due)), None) | (None, Some(due)) => Some((obs, due)),
                (Some(_), Some(new)) if !failed_since_write => Some((obs, new)),
                (Some((_, old)), Some(new)) => Some((obs, Due::merge(old, new))),
            };
        }

        let now = Instant::now();
        if pending
            .as_ref()
            .is_none_or(|(_, due)| now < ready_at(due, next_attempt, last_report_at, config))
        {
            continue;
        }
        let Some((status, due)) = pending.take() else {
            continue;
        };
        // A heartbeat after a failure, or long after the last write (the loop stalled, the node
        // was suspended), writes the whole report.
        let lapsed = last_write_at.is_none_or(|t| now.duration_since(t) >= config.heartbeat * 2);
        let lease_only = due == Due::Heartbeat && !failed_since_write && !lapsed;
        let reason = match &due {
            Due::Change { why, .. } => why.as_str(),
            Due::Refresh => "refresh",
            Due::Heartbeat if lease_only => "heartbeat",
            Due::Heartbeat => "heartbeat after a failure or a gap",
        };
        let span = tracing::info_span!("publish", reason, gpus = status.gpus.len());
        let result = if lease_only {
            sink.heartbeat(&status).instrument(span).await
        } else {
            sink.publish(&status)
                .instrument(span)
                .await
                .map(|()| Beat::Report)
        };
        match result {
            Ok(beat) => {
                state.record_publish(true);
                if beat == Beat::Report {
                    tracing::info!(reason, "published");
                    published = Some(status);
                    last_report_at = Some(now);
                } else {
                    tracing::debug!("heartbeat Lease renewed");
                }
                last_write_at = Some(now);
                failed_since_write = false;
                backoff = config.backoff_initial;
                // `min_gap` bounds how often the report is rewritten; a Lease renewal (once a
                // minute) does not hold back the report change that follows it.
                next_attempt = if beat == Beat::Report {
                    now + config.min_gap
                } else {
                    now
                };
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "publish failed");
                state.record_publish(false);
                failed_since_write = true;
                pending = Some((status, due));
                next_attempt = now + backoff;
                backoff = (backoff * 2).min(config.backoff_max);
            }
        }
    }
    tracing::info!("publish loop stopped");
}
