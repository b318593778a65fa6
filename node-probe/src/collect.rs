//! The collectors' common trait and the [`Probe`] that runs them all into one report.
//!
//! Collectors are independent: one failing makes only its own section unknown (and is recorded
//! in `collectors[]`), the others still run.
//!
//! The collectors import this module, never the other way round: it knows them only as
//! `dyn Collector`, and their errors only as a [`CollectError`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use gpunode_crds::ThrottleReason;
use gpunode_crds::report::{
    CollectorErrorKind, CollectorName, CollectorStatus, GpuNodeReportStatus, GpuStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::limits;

/// What a collector that completed has to say.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Node-level values it could not read (per-GPU and per-device ones go into their `errors`).
    pub note: Option<String>,
}

/// Why a collector failed as a whole: the collector's own typed error, kept as the source (its
/// message is what `collectors[]` records). Each collector module converts its error into this
/// one (`impl From<..> for CollectError`), so that this module, which the collectors import,
/// names none of them.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct CollectError {
    error: Box<dyn std::error::Error + Send + Sync + 'static>,
    kind: CollectorErrorKind,
}

impl CollectError {
    /// Wraps a collector's error: it failed.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        CollectError {
            error: Box::new(error),
            kind: CollectorErrorKind::Failed,
        }
    }

    /// Wraps a collector's error: it did not finish within its deadline.
    pub fn hung(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        CollectError {
            error: Box::new(error),
            kind: CollectorErrorKind::Hung,
        }
    }

    /// Whether the collector failed or hung.
    pub fn kind(&self) -> CollectorErrorKind {
        self.kind
    }
}

/// One source of observations.
pub trait Collector: Send + Sync {
    /// Which collector this is.
    fn name(&self) -> CollectorName;
    /// Fills this collector's section of `report`. An error leaves the section absent (unknown).
    fn collect(&self, report: &mut GpuNodeReportStatus) -> Result<Outcome, CollectError>;
}

/// Clock-throttle reasons that cost performance; the others (idle, power cap, ...) are
/// informational.
pub const THROTTLING: [ThrottleReason; 4] = [
    ThrottleReason::HwSlowdown,
    ThrottleReason::SwThermalSlowdown,
    ThrottleReason::HwThermalSlowdown,
    ThrottleReason::HwPowerBrakeSlowdown,
];

/// Whether a GPU is throttled by a performance-limiting reason.
pub fn is_throttled(gpu: &GpuStatus) -> bool {
    gpu.throttle_reasons.iter().any(|r| THROTTLING.contains(r))
}

/// All collectors plus the node-level facts of a report.
pub struct Probe {
    collectors: Vec<Arc<dyn Collector>>,
    proc_root: PathBuf,
}

impl Probe {
    /// A probe running `collectors` in order; `proc_root` is where `sys/kernel/random/boot_id` is.
    pub fn new(collectors: Vec<Arc<dyn Collector>>, proc_root: PathBuf) -> Self {
        Probe {
            collectors,
            proc_root,
        }
    }

    /// One observation of the node: every collector, the summary counts, schema limits applied.
    pub fn observe(&self) -> GpuNodeReportStatus {
        let _span = tracing::info_span!("observe").entered();
        let mut report = GpuNodeReportStatus {
            probe_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            boot_id: crate::sysfs::read_text(&self.proc_root.join("sys/kernel/random/boot_id")).ok(),
            ..GpuNodeReportStatus::default()
        };
        for collector in &self.collectors {
            let name = collector.name();
            let _span = tracing::info_span!("collect", collector = ?name).entered();
            let started = Instant::now();
            // Work on a scratch copy so a failed collector leaves nothing half-written behind.
            let mut scratch = report.clone();
            let result = collector.collect(&mut scratch);
            let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let status = match result {
                Ok(outcome) => {
                    report = scratch;
                    CollectorStatus {
                        name,
                        ok: true,
                        error: outcome.note,
                        error_kind: None,
                        duration_ms,
                    }
                }
                Err(e) => {
                    tracing::warn!(collector = ?name, error = %e, "collector failed");
                    CollectorStatus {
                        name,
                        ok: false,
                        error: Some(e.to_string()),
                        error_kind: Some(e.kind()),
                        duration_ms,
                    }
                }
            };
            report.collectors.push(status);
        }
        summarize(&mut report);
        report.observed_at = Some(Time(jiff::Timestamp::now()));
        limits::fit(&mut report);
        report
    }
}

/// Fills the throttled-GPU count (the GPU count comes from NVML itself).
pub fn summarize(report: &mut GpuNodeReportStatus) {
    let nvml_ok = report
        .collectors
        .iter()
        .any(|c| c.name == CollectorName::Nvml && c.ok);
    report.throttled_gpus = nvml_ok
        .then(|| u32::try_from(report.gpus.iter().filter(|g| is_throttled(g)).count()).unwrap_or(u32::MAX));
}
