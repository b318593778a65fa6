//! evaluate (pure): what a policy says about one node, given the node's report and the time.
//!
//! `evaluate(policy, report, now) → Verdict`. No I/O, no client, no clock: the same inputs give
//! the same verdict, with drifts and unknowns in a stable order.
//!
//! The rules, in order:
//! 1. No report, a report without status or `observedAt`, or one older than `staleAfter` makes
//!    the node Unknown, with that reason and no drift: old data is not evidence.
//! 2. Each section the policy has (`gpu`, `cooling`, `network`) is checked; an omitted section,
//!    an unset field and an empty list are not checked.
//! 3. A failed collector makes every check that reads its data Unknown with the collector's
//!    error: nvml → `gpu.*` and the cooling checks on GPU temperatures and throttling; cooling →
//!    `cooling.sensors` and `cooling.minFanRpm`; network → `network.*`.
//! 4. A field the probe did not report makes its check Unknown, with the reason from the GPU's,
//!    device's or chassis' `errors` entry that names the field, else `not reported`.
//! 5. Drifted if anything drifted (a drift is a certain fact, whatever else is unknown), else
//!    Unknown if anything is unknown, else Compliant.
//!
//! Check names are the policy fields (`gpu.driverVersion`, `cooling.maxGpuCelsius`,
//! `network.pfcPriorities`); see [`check`] for the full list.

mod cooling;
mod glob;
mod gpu;
mod network;

use gpunode_crds::{
    Duration, GpuNodePolicySpec,
    report::{CollectorName, FieldError, GpuNodeReport, GpuNodeReportStatus, GpuStatus},
};
use jiff::Timestamp;

pub use glob::glob_match;

use crate::verdict::{Drift, REPORT_CHECK, Unknown, Verdict};

/// The name of every check, as used in [`Drift::check`] and [`Unknown::check`].
pub mod check {
    /// No fresh report (missing, no status, no observedAt, older than staleAfter).
    pub use crate::verdict::REPORT_CHECK as REPORT;

    /// Number of GPUs NVML sees (Inventory, node).
    pub const GPU_COUNT: &str = "gpu.count";
    /// Product name contains one of the accepted models (Inventory, per GPU).
    pub const GPU_PRODUCTS: &str = "gpu.products";
    /// Framebuffer memory (Inventory, per GPU).
    pub const GPU_MIN_MEMORY_MIB: &str = "gpu.minMemoryMiB";
    /// Driver version range (Driver, node).
    pub const GPU_DRIVER_VERSION: &str = "gpu.driverVersion";
    /// CUDA driver API version range (Driver, node).
    pub const GPU_CUDA_VERSION: &str = "gpu.cudaVersion";
    /// ECC mode (Config, per GPU).
    pub const GPU_ECC_MODE: &str = "gpu.eccMode";
    /// Persistence mode (Config, per GPU).
    pub const GPU_PERSISTENCE_MODE: &str = "gpu.persistenceMode";
    /// MIG mode (Config, per GPU).
    pub const GPU_MIG_MODE: &str = "gpu.migMode";
    /// PCIe link generation (Pcie, per GPU).
    pub const GPU_PCIE_MIN_GENERATION: &str = "gpu.pcie.minGeneration";
    /// PCIe link width (Pcie, per GPU).
    pub const GPU_PCIE_MIN_WIDTH: &str = "gpu.pcie.minWidth";
    /// Active NVLinks (Nvlink, per GPU).
    pub const GPU_NVLINK_MIN_ACTIVE_LINKS: &str = "gpu.nvlink.minActiveLinks";
    /// Volatile uncorrectable ECC errors (Memory, per GPU).
    pub const GPU_MAX_VOLATILE_UNCORRECTED_ECC: &str = "gpu.maxVolatileUncorrectedEcc";
    /// Retired pages and pending retirement (Memory, per GPU).
    pub const GPU_MAX_RETIRED_PAGES: &str = "gpu.maxRetiredPages";
    /// Row-remap failure or pending remap (Memory, per GPU).
    pub const GPU_ALLOW_ROW_REMAP_FAILURE: &str = "gpu.allowRowRemapFailure";
    /// Fatal XIDs within the window (Xid, per GPU).
    pub const GPU_FATAL_XIDS: &str = "gpu.fatalXids";

    /// GPU core temperature (Thermal, per GPU).
    pub const COOLING_MAX_GPU_CELSIUS: &str = "cooling.maxGpuCelsius";
    /// Distance to the slowdown threshold (Thermal, per GPU).
    pub const COOLING_MIN_SLOWDOWN_MARGIN_CELSIUS: &str = "cooling.minSlowdownMarginCelsius";
    /// HBM temperature (Thermal, per GPU).
    pub const COOLING_MAX_MEMORY_CELSIUS: &str = "cooling.maxMemoryCelsius";
    /// Forbidden clock-throttle reasons (Throttle, per GPU).
    pub const COOLING_FORBIDDEN_THROTTLE_REASONS: &str = "cooling.forbiddenThrottleReasons";
    /// Chassis sensor limits (Cooling, per sensor).
    pub const COOLING_SENSORS: &str = "cooling.sensors";
    /// Fan speed (Cooling, per fan).
    pub const COOLING_MIN_FAN_RPM: &str = "cooling.minFanRpm";

    /// Number of matching RDMA devices (Network, node).
    pub const NETWORK_RDMA_MIN_DEVICES: &str = "network.rdma.minDevices";
    /// RoCE v2 GID present (Network, per device).
    pub const NETWORK_ROCE_V2: &str = "network.roceV2";
    /// Exact set of PFC-enabled priorities (Network, per device).
    pub const NETWORK_PFC_PRIORITIES: &str = "network.pfcPriorities";
    /// QoS trust mode (Network, per device).
    pub const NETWORK_TRUST: &str = "network.trust";
    /// ECN enabled on the priorities (Network, per device).
    pub const NETWORK_ECN_PRIORITIES: &str = "network.ecnPriorities";
    /// MTU of the netdev (Network, per device).
    pub const NETWORK_MIN_MTU: &str = "network.minMtu";
    /// Negotiated rate (Network, per device).
    pub const NETWORK_MIN_RATE_GBPS: &str = "network.minRateGbps";
    /// Port state (Network, per device).
    pub const NETWORK_PORT_STATE: &str = "network.portState";
}

/// Evaluates `policy` against a node's `report` (None when the node has none) at `now`.
pub fn evaluate(policy: &GpuNodePolicySpec, report: Option<&GpuNodeReport>, now: Timestamp) -> Verdict {
    evaluate_heard(policy, report, None, now)
}

/// [`evaluate`], with the report fresh from the later of its `observedAt` and `heard`: when the
/// node's probe last renewed its heartbeat Lease ([`gpunode_crds::heartbeat`]). Between
/// material changes a probe renews only its Lease, so a report whose content still holds can
/// be older than `staleAfter` while its probe is alive.
pub fn evaluate_heard(
    policy: &GpuNodePolicySpec,
    report: Option<&GpuNodeReport>,
    heard: Option<Timestamp>,
    now: Timestamp,
) -> Verdict {
    let status = match fresh_status(policy, report, heard, now) {
        Ok(status) => status,
        Err(reason) => {
            return Verdict::new(
                Vec::new(),
                vec![Unknown {
                    check: REPORT_CHECK.to_string(),
                    reason,
                    gpu: None,
                }],
            );
        }
    };
    let ctx = Context { status, now };
    let mut findings = Findings::default();
    if let Some(req) = &policy.gpu {
        gpu::check(req, &ctx, &mut findings);
    }
    if let Some(req) = &policy.cooling {
        cooling::check(req, &ctx, &mut findings);
    }
    if let Some(req) = &policy.network {
        network::check(req, &ctx, &mut findings);
    }
    Verdict::new(findings.drifts, findings.unknowns)
}

/// Until when the verdict [`evaluate`] gives at `now` stays exactly the same while only time
/// passes (inclusive), so it can be reused: time matters only when the report goes stale and
/// when a fatal XID leaves `gpu.xidWindow`. `None` when it may change at any moment: a stale
/// report's reason says how old it is.
pub fn unchanged_until(
    policy: &GpuNodePolicySpec,
    report: Option<&GpuNodeReport>,
    now: Timestamp,
) -> Option<Timestamp> {
    unchanged_until_heard(policy, report, None, now)
}

/// [`unchanged_until`] for [`evaluate_heard`].
pub fn unchanged_until_heard(
    policy: &GpuNodePolicySpec,
    report: Option<&GpuNodeReport>,
    heard: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    let signed =
        |d: std::time::Duration| jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX);
    let Some(observed_at) = report
        .and_then(|r| r.status.as_ref())
        .and_then(|s| s.observed_at.as_ref())
    else {
        // No report, status or observedAt: the reason does not depend on the time.
        return Some(Timestamp::MAX);
    };
    let fresh_until = last_heard(observed_at.0, heard)
        .checked_add(signed(policy.stale_after.get()))
        .unwrap_or(Timestamp::MAX);
    if fresh_until < now {
        return None;
    }
    let mut until = fresh_until;
    if let (Some(gpu), Some(status)) = (&policy.gpu, report.and_then(|r| r.status.as_ref()))
        && let Some(window) = gpu.xid_window
    {
        // Each fatal XID still within the window drops out of it after `at + window`.
        for xid in status.gpus.iter().flat_map(|g| &g.xids) {
            if gpu.fatal_xids.contains(&xid.xid)
                && let Ok(leaves) = xid.at.0.checked_add(signed(window.get()))
                && leaves >= now
            {
                until = until.min(leaves);
            }
        }
    }
    Some(until)
}

/// The later of a report's `observedAt` and its probe's last heartbeat.
pub fn last_heard(observed_at: Timestamp, heard: Option<Timestamp>) -> Timestamp {
    heard.map_or(observed_at, |h| h.max(observed_at))
}

/// The report's status when it is fresh enough to be evidence, else why not.
fn fresh_status<'a>(
    policy: &GpuNodePolicySpec,
    report: Option<&'a GpuNodeReport>,
    heard: Option<Timestamp>,
    now: Timestamp,
) -> Result<&'a GpuNodeReportStatus, String> {
    let report = report.ok_or("no GpuNodeReport for this node")?;
    let status = report.status.as_ref().ok_or("report has no status")?;
    let observed_at = status.observed_at.as_ref().ok_or("report has no observedAt")?;
    let last = last_heard(observed_at.0, heard);
    let age = now.duration_since(last);
    // A report from the future (clock skew between node and operator) counts as fresh.
    if !age.is_negative() && age.unsigned_abs() > policy.stale_after.get() {
        let secs = u64::try_from(age.as_secs()).unwrap_or(u64::MAX);
        let what = if last > observed_at.0 {
            "the probe's last heartbeat is"
        } else {
            "report is"
        };
        return Err(format!(
            "{what} {} old (staleAfter {})",
            Duration::from_secs(secs),
            policy.stale_after
        ));
    }
    Ok(status)
}

/// What every section check reads: the fresh report and the time.
pub(crate) struct Context<'a> {
    pub(crate) status: &'a GpuNodeReportStatus,
    pub(crate) now: Timestamp,
}

impl Context<'_> {
    /// Why the collector failed, when it did.
    pub(crate) fn collector_failure(&self, name: CollectorName) -> Option<String> {
        self.status
            .collectors
            .iter()
            .find(|c| c.name == name && !c.ok)
            .map(|c| match c.error.as_deref() {
                Some(e) if !e.trim().is_empty() => format!("{} collector failed: {e}", collector(name)),
                _ => format!("{} collector failed", collector(name)),
            })
    }

    /// Runs `body` on every GPU when any of the per-GPU `checks` is asked for. GPUs the report
    /// does not list (none at all, or fewer than `gpuCount`) make those checks Unknown.
    pub(crate) fn for_each_gpu(
        &self,
        checks: &[&str],
        findings: &mut Findings,
        mut body: impl FnMut(&GpuStatus, &mut Findings),
    ) {
        if checks.is_empty() {
            return;
        }
        let listed = self.status.gpus.len();
        let missing = match self.status.gpu_count {
            None if listed == 0 => Some("no GPUs reported".to_string()),
            Some(n) if usize::try_from(n).is_ok_and(|n| n > listed) => {
                Some(format!("report lists {listed} of the {n} GPUs NVML sees"))
            }
            _ => None,
        };
        if let Some(reason) = missing {
            for check in checks {
                findings.unknown(check, None, reason.clone());
            }
        }
        for gpu in &self.status.gpus {
            body(gpu, findings);
        }
    }
}

fn collector(name: CollectorName) -> &'static str {
    match name {
        CollectorName::Nvml => "nvml",
        CollectorName::Cooling => "cooling",
        CollectorName::Network => "network",
        CollectorName::PodResources => "podResources",
    }
}

/// Drifts and unknowns as the section checks find them; [`Verdict::new`] sorts them.
#[derive(Default)]
pub(crate) struct Findings {
    drifts: Vec<Drift>,
    unknowns: Vec<Unknown>,
}

impl Findings {
    pub(crate) fn drift(
        &mut self,
        class: gpunode_crds::DriftClass,
        check: &str,
        gpu: Option<u32>,
        device: Option<&str>,
        expected: String,
        actual: String,
    ) {
        self.drifts.push(Drift {
            class,
            check: check.to_string(),
            expected,
            actual,
            gpu,
            device: device.map(str::to_string),
        });
    }

    pub(crate) fn unknown(&mut self, check: &str, gpu: Option<u32>, reason: String) {
        self.unknowns.push(Unknown {
            check: check.to_string(),
            reason,
            gpu,
        });
    }

    /// Every check Unknown for one reason (a failed collector, a missing section).
    pub(crate) fn all_unknown(&mut self, checks: &[&str], reason: &str) {
        for check in checks {
            self.unknown(check, None, reason.to_string());
        }
    }
}

/// Error fields that make a whole GPU or RDMA port unknown: the probe lists a GPU whose NVML
/// handle it could not get with a `device` error, and a device whose ports it could not list
/// with a `ports` error.
const WHOLE_ENTRY_FIELDS: [&str; 2] = ["device", "ports"];

/// Why `field` is missing: the reason of the first error that names it (or one of its
/// sub-fields, `pcie.currentWidth` for `pcie`, or the whole GPU or port), else "not reported".
pub(crate) fn missing_reason(errors: &[FieldError], field: &str) -> String {
    field_error(errors, field).map_or_else(|| "not reported".to_string(), |e| e.reason.clone())
}

/// The error that names `field`, one of its sub-fields, or the whole GPU or port, if any.
pub(crate) fn field_error<'a>(errors: &'a [FieldError], field: &str) -> Option<&'a FieldError> {
    errors.iter().find(|e| names_field(&e.field, field)).or_else(|| {
        errors
            .iter()
            .find(|e| WHOLE_ENTRY_FIELDS.contains(&e.field.as_str()))
    })
}

fn names_field(error_field: &str, field: &str) -> bool {
    error_field == field
        || error_field
            .strip_prefix(field)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// `[a, b, c]`.
pub(crate) fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunode_crds::report::FieldError;

    fn err(field: &str, reason: &str) -> FieldError {
        FieldError {
            field: field.to_string(),
            reason: reason.to_string(),
        }
    }

    #[test]
    fn missing_reason_uses_the_error_naming_the_field_or_a_sub_field() {
        let errors = [
            err("remappedRows", "NVML: NotSupported"),
            err("pcie.currentWidth", "NVML: Unknown"),
        ];
        assert_eq!(missing_reason(&errors, "remappedRows"), "NVML: NotSupported");
        assert_eq!(missing_reason(&errors, "pcie"), "NVML: Unknown");
        assert_eq!(missing_reason(&errors, "pci"), "not reported");
        assert_eq!(missing_reason(&errors, "ecc"), "not reported");
    }

    #[test]
    fn an_error_on_the_whole_gpu_or_port_explains_every_missing_field() {
        let errors = [err("device", "NVML: GpuIsLost"), err("ecc", "NVML: NotSupported")];
        assert_eq!(missing_reason(&errors, "ecc"), "NVML: NotSupported");
        assert_eq!(missing_reason(&errors, "temperatureCelsius"), "NVML: GpuIsLost");
        assert_eq!(missing_reason(&[err("ports", "EACCES")], "mtu"), "EACCES");
    }

    #[test]
    fn lists_print_in_brackets() {
        assert_eq!(list([3u8, 4]), "[3, 4]");
        assert_eq!(list(Vec::<u8>::new()), "[]");
    }
}
