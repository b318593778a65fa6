//! The publish loop's two seams: where observations come from ([`Observe`]) and where they go
//! ([`ReportSink`]), with what a write can return ([`Beat`], [`PublishError`]).
//!
//! Traits and their small types only: no timing, no decision, no Kubernetes client (that is
//! [`super::kube_sink`]). Every other publish module may depend on it; it depends on none of them.

use std::future::Future;

use gpunode_crds::report::GpuNodeReportStatus;

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
