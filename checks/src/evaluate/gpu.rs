//! `gpu.*`: inventory, driver and CUDA versions, modes, memory health, PCIe, NVLink, fatal XIDs.

use gpunode_crds::{
    DriftClass, EnabledState, GpuRecoveryAction, Version, VersionRange, policy::GpuRequirements,
    report::CollectorName, report::GpuStatus,
};
use jiff::Timestamp;

use super::{
    check,
    findings::{Context, Findings, list, missing_reason},
    nvlink,
};

pub(super) fn check(req: &GpuRequirements, ctx: &Context<'_>, f: &mut Findings) {
    let node = node_checks(req);
    let per_gpu = per_gpu_checks(req);
    if let Some(reason) = ctx.collector_failure(CollectorName::Nvml) {
        if ctx.collector_hung(CollectorName::Nvml) && !(node.is_empty() && per_gpu.is_empty()) {
            f.unknown(check::NVML_HUNG, None, reason.clone());
        }
        f.all_unknown(&node, &reason);
        f.all_unknown(&per_gpu, &reason);
        return;
    }

    if let Some(want) = req.count {
        match ctx.status.gpu_count {
            None => f.unknown(check::GPU_COUNT, None, "not reported".to_string()),
            Some(have) if have != want => f.drift(
                DriftClass::Inventory,
                check::GPU_COUNT,
                None,
                None,
                want.to_string(),
                have.to_string(),
            ),
            Some(_) => {}
        }
    }
    if let Some(range) = &req.driver_version {
        version(
            f,
            check::GPU_DRIVER_VERSION,
            "driver",
            range,
            ctx.status.driver_version.as_deref(),
        );
    }
    if let Some(range) = &req.cuda_version {
        version(
            f,
            check::GPU_CUDA_VERSION,
            "CUDA",
            range,
            ctx.status.cuda_version.as_deref(),
        );
    }

    ctx.for_each_gpu(&per_gpu, f, |gpu, f| each_gpu(req, ctx.now, gpu, f));
}

/// The node-level checks the policy asks for.
fn node_checks(req: &GpuRequirements) -> Vec<&'static str> {
    [
        (req.count.is_some(), check::GPU_COUNT),
        (req.driver_version.is_some(), check::GPU_DRIVER_VERSION),
        (req.cuda_version.is_some(), check::GPU_CUDA_VERSION),
    ]
    .into_iter()
    .filter_map(|(asked, name)| asked.then_some(name))
    .collect()
}

/// The per-GPU checks the policy asks for.
fn per_gpu_checks(req: &GpuRequirements) -> Vec<&'static str> {
    let pcie = req.pcie.as_ref();
    [
        (!req.products.is_empty(), check::GPU_PRODUCTS),
        (req.min_memory_mib.is_some(), check::GPU_MIN_MEMORY_MIB),
        (req.ecc_mode.is_some(), check::GPU_ECC_MODE),
        (req.persistence_mode.is_some(), check::GPU_PERSISTENCE_MODE),
        (req.mig_mode.is_some(), check::GPU_MIG_MODE),
        (
            pcie.is_some_and(|p| p.min_generation.is_some()),
            check::GPU_PCIE_MIN_GENERATION,
        ),
        (
            pcie.is_some_and(|p| p.min_width.is_some()),
            check::GPU_PCIE_MIN_WIDTH,
        ),
        (
            pcie.is_some_and(|p| p.max_replays_per_hour.is_some()),
            check::GPU_PCIE_MAX_REPLAYS_PER_HOUR,
        ),
        (
            min_active_links(req).is_some(),
            check::GPU_NVLINK_MIN_ACTIVE_LINKS,
        ),
        (
            req.max_volatile_uncorrected_ecc.is_some(),
            check::GPU_MAX_VOLATILE_UNCORRECTED_ECC,
        ),
        (req.max_retired_pages.is_some(), check::GPU_MAX_RETIRED_PAGES),
        (!req.allow_row_remap_failure, check::GPU_ALLOW_ROW_REMAP_FAILURE),
        (!req.fatal_xids.is_empty(), check::GPU_FATAL_XIDS),
        (req.xid_resolution.is_some(), check::GPU_XID_RESOLUTION),
        (req.recovery_action.is_some(), check::GPU_RECOVERY_ACTION),
    ]
    .into_iter()
    .filter_map(|(asked, name)| asked.then_some(name))
    .chain(super::power::checks(req.power.as_ref()))
    .chain(nvlink::asked(req.nvlink.as_ref()))
    .collect()
}

/// `nvlink.minActiveLinks`, unless it is 0, which every GPU satisfies (with or without NVLink).
fn min_active_links(req: &GpuRequirements) -> Option<u32> {
    req.nvlink.as_ref().map(|n| n.min_active_links).filter(|n| *n > 0)
}

fn version(f: &mut Findings, check: &str, what: &str, range: &VersionRange, observed: Option<&str>) {
    let Some(observed) = observed else {
        f.unknown(check, None, "not reported".to_string());
        return;
    };
    match observed.parse::<Version>() {
        Err(e) => f.unknown(check, None, format!("cannot parse the {what} version: {e}")),
        Ok(v) if !range.matches(&v) => f.drift(
            DriftClass::Driver,
            check,
            None,
            None,
            range.to_string(),
            observed.to_string(),
        ),
        Ok(_) => {}
    }
}

fn each_gpu(req: &GpuRequirements, now: Timestamp, gpu: &GpuStatus, f: &mut Findings) {
    let i = Some(gpu.index);
    // Whether the GPU reported the field a check reads; when not, the check is Unknown.
    let observed = |f: &mut Findings, check: &str, field: &str, present: bool| {
        if !present {
            f.unknown(check, i, missing_reason(&gpu.errors, field));
        }
        present
    };

    if !req.products.is_empty() {
        match gpu.product.as_deref() {
            None => f.unknown(check::GPU_PRODUCTS, i, missing_reason(&gpu.errors, "product")),
            Some(product) => {
                if !req.products.iter().any(|p| contains_ignoring_case(product, p)) {
                    f.drift(
                        DriftClass::Inventory,
                        check::GPU_PRODUCTS,
                        i,
                        None,
                        format!("one of {}", list(&req.products)),
                        product.to_string(),
                    );
                }
            }
        }
    }

    if let Some(min) = req.min_memory_mib
        && observed(
            f,
            check::GPU_MIN_MEMORY_MIB,
            "memoryMiB",
            gpu.memory_mib.is_some(),
        )
        && let Some(have) = gpu.memory_mib.filter(|have| *have < min)
    {
        f.drift(
            DriftClass::Inventory,
            check::GPU_MIN_MEMORY_MIB,
            i,
            None,
            format!(">= {min} MiB"),
            format!("{have} MiB"),
        );
    }

    let modes = [
        (req.ecc_mode, gpu.ecc_mode, check::GPU_ECC_MODE, "eccMode"),
        (
            req.persistence_mode,
            gpu.persistence_mode,
            check::GPU_PERSISTENCE_MODE,
            "persistenceMode",
        ),
        (req.mig_mode, gpu.mig_mode, check::GPU_MIG_MODE, "migMode"),
    ];
    for (want, have, check, field) in modes {
        if let Some(want) = want
            && observed(f, check, field, have.is_some())
            && let Some(have) = have.filter(|have| *have != want)
        {
            f.drift(
                DriftClass::Config,
                check,
                i,
                None,
                enabled(want).to_string(),
                enabled(have).to_string(),
            );
        }
    }

    if let Some(pcie) = &req.pcie {
        if let Some(min) = pcie.min_generation
            && observed(f, check::GPU_PCIE_MIN_GENERATION, "pcie", gpu.pcie.is_some())
            && let Some(link) = gpu.pcie.as_ref().filter(|l| l.current_generation < min)
        {
            f.drift(
                DriftClass::Pcie,
                check::GPU_PCIE_MIN_GENERATION,
                i,
                None,
                format!(">= Gen{min}"),
                format!("Gen{} (max Gen{})", link.current_generation, link.max_generation),
            );
        }
        if let Some(min) = pcie.min_width
            && observed(f, check::GPU_PCIE_MIN_WIDTH, "pcie", gpu.pcie.is_some())
            && let Some(link) = gpu.pcie.as_ref().filter(|l| l.current_width < min)
        {
            f.drift(
                DriftClass::Pcie,
                check::GPU_PCIE_MIN_WIDTH,
                i,
                None,
                format!(">= x{min}"),
                format!("x{} (max x{})", link.current_width, link.max_width),
            );
        }
    }

    if let Some(max) = req.pcie.as_ref().and_then(|p| p.max_replays_per_hour) {
        pcie_replays(max, gpu, f);
    }
    if let Some(power) = &req.power {
        super::power::check(power, now, gpu, f);
    }

    if let Some(min) = min_active_links(req)
        && observed(
            f,
            check::GPU_NVLINK_MIN_ACTIVE_LINKS,
            "nvlink",
            gpu.nvlink.is_some(),
        )
        && let Some(links) = gpu.nvlink.as_ref().filter(|l| l.active < min)
    {
        f.drift(
            DriftClass::Nvlink,
            check::GPU_NVLINK_MIN_ACTIVE_LINKS,
            i,
            None,
            format!(">= {min} active"),
            format!("{} active of {}", links.active, links.total),
        );
    }

    if let Some(nvlink) = &req.nvlink {
        nvlink::each_gpu(nvlink, gpu, f);
    }

    if let Some(max) = req.max_volatile_uncorrected_ecc
        && observed(
            f,
            check::GPU_MAX_VOLATILE_UNCORRECTED_ECC,
            "ecc",
            gpu.ecc.is_some(),
        )
        && let Some(ecc) = gpu.ecc.as_ref().filter(|e| e.volatile_uncorrected > max)
    {
        f.drift(
            DriftClass::Memory,
            check::GPU_MAX_VOLATILE_UNCORRECTED_ECC,
            i,
            None,
            format!("<= {max}"),
            ecc.volatile_uncorrected.to_string(),
        );
    }

    if let Some(max) = req.max_retired_pages
        && !not_supported(gpu, "retiredPages")
        && observed(
            f,
            check::GPU_MAX_RETIRED_PAGES,
            "retiredPages",
            gpu.retired_pages.is_some(),
        )
        && let Some(pages) = gpu.retired_pages.as_ref()
    {
        let total = pages.single_bit.saturating_add(pages.double_bit);
        if total > max || pages.pending {
            let pending = if pages.pending { ", retirement pending" } else { "" };
            f.drift(
                DriftClass::Memory,
                check::GPU_MAX_RETIRED_PAGES,
                i,
                None,
                format!("<= {max} retired pages, none pending"),
                format!(
                    "{total} retired pages ({} single-bit, {} double-bit){pending}",
                    pages.single_bit, pages.double_bit
                ),
            );
        }
    }

    if !req.allow_row_remap_failure
        && !not_supported(gpu, "remappedRows")
        && observed(
            f,
            check::GPU_ALLOW_ROW_REMAP_FAILURE,
            "remappedRows",
            gpu.remapped_rows.is_some(),
        )
        && let Some(rows) = gpu.remapped_rows.as_ref().filter(|r| r.failure || r.pending)
    {
        let what = match (rows.failure, rows.pending) {
            (true, true) => "row remap failed and a remap is pending",
            (true, false) => "row remap failed",
            _ => "row remap pending",
        };
        f.drift(
            DriftClass::Memory,
            check::GPU_ALLOW_ROW_REMAP_FAILURE,
            i,
            None,
            "no failed or pending row remap".to_string(),
            format!(
                "{what} ({} correctable, {} uncorrectable rows remapped)",
                rows.correctable, rows.uncorrectable
            ),
        );
    }

    if !req.fatal_xids.is_empty() || req.xid_resolution.is_some() {
        super::xid::check(req, now, gpu, f);
    }

    if let Some(wanted) = &req.recovery_action
        && observed(
            f,
            check::GPU_RECOVERY_ACTION,
            "recoveryAction",
            gpu.recovery_action.is_some(),
        )
        && let Some(action) = gpu.recovery_action.filter(|a| {
            // None never drifts, whatever the list says (the API refuses it there anyway).
            *a != GpuRecoveryAction::None && wanted.drift_on.contains(a)
        })
    {
        // Class Xid: the driver sets a recovery action when it reports the fault, usually as an
        // XID, so the steps that handle XIDs (reset, reboot) are the ones that do the action.
        f.drift(
            DriftClass::Xid,
            check::GPU_RECOVERY_ACTION,
            i,
            None,
            format!("none of {}", list(&wanted.drift_on)),
            action.to_string(),
        );
    }
}

/// PCIe replays over the last hour against the budget. A link that replays at all is not
/// drift: only one that replays more than the policy allows.
fn pcie_replays(max: u64, gpu: &GpuStatus, f: &mut Findings) {
    let i = Some(gpu.index);
    let counted = gpu
        .pcie
        .as_ref()
        .and_then(|p| Some((p.replays_last_hour?, p.replay_window_minutes)));
    let Some((count, minutes)) = counted else {
        let reason = missing_reason(&gpu.errors, "pcie.replayCounter");
        f.unknown(check::GPU_PCIE_MAX_REPLAYS_PER_HOUR, i, reason);
        return;
    };
    if count > max {
        f.drift(
            DriftClass::Pcie,
            check::GPU_PCIE_MAX_REPLAYS_PER_HOUR,
            i,
            None,
            format!("<= {max} replays per hour"),
            format!("{count} replays in the last {} min", minutes.unwrap_or(60)),
        );
    }
}

/// Whether `text` contains `word`, ignoring case. Product names are ASCII: compare bytes in
/// place instead of lower-casing copies of both for every GPU.
fn contains_ignoring_case(text: &str, word: &str) -> bool {
    if text.is_ascii() && word.is_ascii() {
        let (t, w) = (text.as_bytes(), word.as_bytes());
        return w.is_empty() || t.windows(w.len()).any(|win| win.eq_ignore_ascii_case(w));
    }
    text.to_lowercase().contains(&word.to_lowercase())
}

pub(super) fn enabled(state: EnabledState) -> &'static str {
    match state {
        EnabledState::Enabled => "Enabled",
        EnabledState::Disabled => "Disabled",
    }
}

/// The GPU has no such feature: NVML answered NotSupported for this field. Page retirement ended
/// with Ampere (row remapping replaced it) and row remapping began there, so on any GPU one of
/// the two is NotSupported: it cannot drift, and is not unknown either.
fn not_supported(gpu: &gpunode_crds::report::GpuStatus, field: &str) -> bool {
    gpu.errors
        .iter()
        .any(|e| e.field == field && e.reason.ends_with("NotSupported"))
}
