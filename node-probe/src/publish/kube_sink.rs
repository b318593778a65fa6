//! [`KubeSink`]: the [`ReportSink`] that writes the node's `GpuNodeReport` with server-side
//! apply (the object with its owner reference to the Node, then its status) and renews the
//! node's heartbeat Lease ([`gpunode_crds::heartbeat`]); [`publish_once`] for one write.
//!
//! The sink handles what the API server answers: a report deleted under it is recreated once,
//! and a Lease it may not write (403, 404) turns heartbeats into report writes. It may not
//! decide when to write or retry (that is [`super::machine`]); within [`crate::publish`] it
//! imports only [`super::seams`].

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

use super::seams::{Beat, PublishError, ReportSink};

/// Field manager of every write the probe makes.
pub const FIELD_MANAGER: &str = "gpunode-node-probe";

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
    /// This sink renewed the Lease at least once.
    lease_renewed: bool,
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
            lease_renewed: false,
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

    /// Renews the Lease as of `status`'s observation; false when there is no Lease to renew
    /// (none, or the probe may not write it: no RBAC for Leases, a chart older than the probe,
    /// or no namespace; heartbeats then write the whole report, as before Leases).
    async fn renew(&mut self, status: &GpuNodeReportStatus) -> Result<bool, PublishError> {
        let Some((leases, name)) = &self.lease else {
            return Ok(false);
        };
        let observed = status
            .observed_at
            .as_ref()
            .map_or_else(jiff::Timestamp::now, |t| t.0);
        match self.renew_lease(leases, name, observed).await {
            Ok(()) => {
                self.lease_renewed = true;
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 404 => {
                tracing::warn!(namespace = leases.namespace().unwrap_or_default(), lease = %name, error = %s,
                    "cannot write the heartbeat Lease; heartbeats write the whole report instead");
                self.lease = None;
                Ok(false)
            }
            Err(e) => Err(e.into()),
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
        if !self.lease_renewed {
            // A heartbeat before the first report: the operator times a renewal by its own clock
            // as it arrives, but a report by the probe's `observedAt`, which a clock running
            // behind makes look stale. Without the renewal a restarted probe's node would turn
            // Unknown until its first heartbeat.
            if let Err(e) = self.renew(status).await {
                tracing::warn!(node = %self.node, error = %e, "cannot renew the heartbeat Lease before the report");
            }
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
        if self.renew(status).await? {
            return Ok(Beat::Lease);
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
