//! `gpu.power.*`: the enforced power limit against the policy's range or a share of the GPU's
//! default limit (Config: a limit is a setting someone made), and a hardware power brake that
//! lasted (Throttle: it is a clock-throttle reason, and the steps for throttling apply).

use gpunode_crds::{DriftClass, power::PowerRequirements, report::GpuStatus};
use jiff::Timestamp;

use super::{
    check,
    findings::{Findings, missing_reason},
};

/// The power checks `power` asks for.
pub(super) fn checks(power: Option<&PowerRequirements>) -> Vec<&'static str> {
    let Some(p) = power else { return Vec::new() };
    [
        (
            p.min_limit_percent_of_default.is_some(),
            check::GPU_POWER_MIN_LIMIT_PERCENT,
        ),
        (p.min_limit_watts.is_some(), check::GPU_POWER_MIN_LIMIT_WATTS),
        (p.max_limit_watts.is_some(), check::GPU_POWER_MAX_LIMIT_WATTS),
        (p.max_power_brake.is_some(), check::GPU_POWER_MAX_POWER_BRAKE),
    ]
    .into_iter()
    .filter_map(|(asked, name)| asked.then_some(name))
    .collect()
}

/// The power checks of one GPU.
pub(super) fn check(p: &PowerRequirements, now: Timestamp, gpu: &GpuStatus, f: &mut Findings) {
    limits(p, gpu, f);
    if let Some(max) = p.max_power_brake {
        power_brake(max, now, gpu, f);
    }
}

fn limits(p: &PowerRequirements, gpu: &GpuStatus, f: &mut Findings) {
    let i = Some(gpu.index);
    let asked = p.min_limit_percent_of_default.is_some()
        || p.min_limit_watts.is_some()
        || p.max_limit_watts.is_some();
    if !asked {
        return;
    }
    let Some(limit) = gpu.power_limit_watts else {
        let reason = missing_reason(&gpu.errors, "powerLimitWatts");
        for name in checks(Some(p))
            .into_iter()
            .filter(|c| *c != check::GPU_POWER_MAX_POWER_BRAKE)
        {
            f.unknown(name, i, reason.clone());
        }
        return;
    };
    let mut drift = |name: &str, expected: String| {
        f.drift(
            DriftClass::Config,
            name,
            i,
            None,
            expected,
            format!("{limit} W enforced"),
        );
    };
    if let Some(min) = p.min_limit_watts.filter(|m| limit < *m) {
        drift(check::GPU_POWER_MIN_LIMIT_WATTS, format!(">= {min} W"));
    }
    if let Some(max) = p.max_limit_watts.filter(|m| limit > *m) {
        drift(check::GPU_POWER_MAX_LIMIT_WATTS, format!("<= {max} W"));
    }
    let Some(percent) = p.min_limit_percent_of_default else {
        return;
    };
    let Some(default) = gpu.default_power_limit_watts else {
        let reason = missing_reason(&gpu.errors, "defaultPowerLimitWatts");
        f.unknown(check::GPU_POWER_MIN_LIMIT_PERCENT, i, reason);
        return;
    };
    // Whole watts on both sides: limit * 100 < default * percent, without rounding.
    if u64::from(limit) * 100 < u64::from(default) * u64::from(percent) {
        drift(
            check::GPU_POWER_MIN_LIMIT_PERCENT,
            format!(">= {percent}% of the {default} W default"),
        );
    }
}

fn power_brake(max: gpunode_crds::Duration, now: Timestamp, gpu: &GpuStatus, f: &mut Findings) {
    let Some(since) = gpu.power_brake_since.as_ref() else {
        // Not braking now, or the reasons could not be read (then the time is unknown).
        if gpu.errors.iter().any(|e| e.field == "throttleReasons") {
            let reason = missing_reason(&gpu.errors, "throttleReasons");
            f.unknown(check::GPU_POWER_MAX_POWER_BRAKE, Some(gpu.index), reason);
        }
        return;
    };
    let held = now.duration_since(since.0);
    // A start stamped in the future (clock skew) has not lasted.
    if !held.is_negative() && held.unsigned_abs() > max.get() {
        f.drift(
            DriftClass::Throttle,
            check::GPU_POWER_MAX_POWER_BRAKE,
            Some(gpu.index),
            None,
            format!("hardware power brake for at most {max}"),
            format!("braking since {}", since.0),
        );
    }
}

/// When a power brake still within `maxPowerBrake` outlasts it: the operator looks again then.
pub(crate) fn brake_outlasts(p: Option<&PowerRequirements>, gpu: &GpuStatus) -> Option<Timestamp> {
    let max = p?.max_power_brake?;
    let since = gpu.power_brake_since.as_ref()?;
    let span = jiff::SignedDuration::try_from(max.get()).ok()?;
    since.0.checked_add(span).ok()
}
