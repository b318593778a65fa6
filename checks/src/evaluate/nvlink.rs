//! `gpu.nvlink.max*ErrorsPerHour` and `gpu.nvlink.requireFabricRegistration`: each GPU's NVLink
//! error counters over the last hour against the policy's budgets, and its NVSwitch fabric
//! registration (class Nvlink).
//!
//! The probe publishes per active link how much each NVML error counter rose over the last hour
//! (`nvlink.errorRates`). A counter it did not publish is not judged (a link that is down has
//! none, and a driver may lack one); only a counter it tried and failed to read (a GPU `errors`
//! entry naming it) makes its check Unknown, as does a GPU without any NVLink section.

use gpunode_crds::{
    DriftClass, NvlinkCounter,
    nvlink::{FABRIC_SUCCESS, FabricState},
    policy::NvlinkRequirements,
    report::GpuStatus,
};

use super::{
    check,
    findings::{Findings, field_error, missing_reason},
};

/// Most over-budget links one drift names; the rest are counted.
const MAX_LINKS_NAMED: usize = 4;

/// One budget the policy sets: the check, the counter it judges and the most per hour.
#[derive(Debug, Clone, Copy)]
struct Budget {
    check: &'static str,
    counter: NvlinkCounter,
    limit: u32,
}

/// The budgets the policy sets, in a stable order.
fn budgets(req: &NvlinkRequirements) -> Vec<Budget> {
    [
        (
            check::GPU_NVLINK_MAX_REPLAY_ERRORS,
            NvlinkCounter::Replay,
            req.max_replay_errors_per_hour,
        ),
        (
            check::GPU_NVLINK_MAX_RECOVERY_ERRORS,
            NvlinkCounter::Recovery,
            req.max_recovery_errors_per_hour,
        ),
        (
            check::GPU_NVLINK_MAX_CRC_ERRORS,
            NvlinkCounter::CrcFlit,
            req.max_crc_errors_per_hour,
        ),
        (
            check::GPU_NVLINK_MAX_CRC_ERRORS,
            NvlinkCounter::CrcData,
            req.max_crc_errors_per_hour,
        ),
    ]
    .into_iter()
    .filter_map(|(check, counter, limit)| {
        limit.map(|limit| Budget {
            check,
            counter,
            limit,
        })
    })
    .collect()
}

/// The per-GPU checks of `req` this module makes, each once.
pub(super) fn asked(req: Option<&NvlinkRequirements>) -> Vec<&'static str> {
    let Some(req) = req else { return Vec::new() };
    let mut names = asked_budget_checks(&budgets(req));
    if req.require_fabric_registration {
        names.push(check::GPU_NVLINK_REQUIRE_FABRIC_REGISTRATION);
    }
    names
}

/// Judges one GPU's NVLink error counts and fabric registration.
pub(super) fn each_gpu(req: &NvlinkRequirements, gpu: &GpuStatus, f: &mut Findings) {
    let budgets = budgets(req);
    if !budgets.is_empty() {
        match &gpu.nvlink {
            None => {
                let reason = missing_reason(&gpu.errors, "nvlink");
                for check in asked_budget_checks(&budgets) {
                    f.unknown(check, Some(gpu.index), reason.clone());
                }
            }
            Some(_) => {
                for check in asked_budget_checks(&budgets) {
                    let of_check: Vec<Budget> =
                        budgets.iter().copied().filter(|b| b.check == check).collect();
                    judge_budget(check, &of_check, gpu, f);
                }
            }
        }
    }
    if req.require_fabric_registration {
        fabric_registration(gpu, f);
    }
}

fn asked_budget_checks(budgets: &[Budget]) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = budgets.iter().map(|b| b.check).collect();
    names.dedup();
    names
}

/// One check (its budgets: one, or two for the CRC counters) over every link of the GPU: one
/// drift per GPU naming the links over budget, else Unknown when a counter could not be read.
fn judge_budget(check: &'static str, budgets: &[Budget], gpu: &GpuStatus, f: &mut Findings) {
    let links = gpu.nvlink.as_ref().map_or(&[][..], |n| n.error_rates.as_slice());
    let mut over = Vec::new();
    for rates in links {
        for budget in budgets {
            if let Some(count) = rates.get(budget.counter).filter(|c| *c > u64::from(budget.limit)) {
                over.push(format!(
                    "link {}: {count} {} (last {}m)",
                    rates.link,
                    budget.counter.nvml_name(),
                    rates.window_minutes
                ));
            }
        }
    }
    if over.is_empty() {
        if let Some(error) = budgets
            .iter()
            .find_map(|b| field_error(&gpu.errors, b.counter.field()))
        {
            f.unknown(check, Some(gpu.index), error.reason.clone());
        }
        return;
    }
    let limit = budgets.first().map_or(0, |b| b.limit);
    let extra = over.len().saturating_sub(MAX_LINKS_NAMED);
    over.truncate(MAX_LINKS_NAMED);
    let mut actual = over.join(", ");
    if extra > 0 {
        actual.push_str(&format!(" and {extra} more"));
    }
    f.drift(
        DriftClass::Nvlink,
        check,
        Some(gpu.index),
        None,
        format!("<= {limit} per link per hour"),
        actual,
    );
}

/// Drift unless the GPU's fabric registration completed with success.
fn fabric_registration(gpu: &GpuStatus, f: &mut Findings) {
    let check = check::GPU_NVLINK_REQUIRE_FABRIC_REGISTRATION;
    let Some(fabric) = &gpu.fabric else {
        f.unknown(check, Some(gpu.index), missing_reason(&gpu.errors, "fabric"));
        return;
    };
    if fabric.registered() {
        return;
    }
    let actual = match (fabric.state, fabric.status.as_deref()) {
        (FabricState::Completed, Some(status)) => format!("Completed, status {status}"),
        (FabricState::Completed, None) => "Completed, no status".to_string(),
        (state, _) => state.to_string(),
    };
    f.drift(
        DriftClass::Nvlink,
        check,
        Some(gpu.index),
        None,
        format!("fabric registration Completed, status {FABRIC_SUCCESS}"),
        actual,
    );
}
