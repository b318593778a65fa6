//! `cooling.*`: GPU temperatures and throttling (from NVML), chassis sensors and fans (from the
//! cooling collector).

use std::collections::BTreeSet;

use gpunode_crds::{
    DriftClass, ThrottleReason,
    policy::{CoolingRequirements, SensorLimit},
    report::{CollectorName, CoolingStatus, FieldError, GpuStatus},
};

use super::{
    check,
    findings::{Context, Findings, field_error, list, missing_reason},
    glob::glob_match,
};

pub(super) fn check(req: &CoolingRequirements, ctx: &Context<'_>, f: &mut Findings) {
    gpu_checks(req, ctx, f);
    chassis_checks(req, ctx, f);
}

/// The checks on NVML data: temperatures, slowdown margin, throttle reasons.
fn gpu_checks(req: &CoolingRequirements, ctx: &Context<'_>, f: &mut Findings) {
    let checks: Vec<&str> = [
        (req.max_gpu_celsius.is_some(), check::COOLING_MAX_GPU_CELSIUS),
        (
            req.min_slowdown_margin_celsius.is_some(),
            check::COOLING_MIN_SLOWDOWN_MARGIN_CELSIUS,
        ),
        (
            req.max_memory_celsius.is_some(),
            check::COOLING_MAX_MEMORY_CELSIUS,
        ),
        (
            !req.forbidden_throttle_reasons.is_empty(),
            check::COOLING_FORBIDDEN_THROTTLE_REASONS,
        ),
    ]
    .into_iter()
    .filter_map(|(asked, name)| asked.then_some(name))
    .collect();
    if let Some(reason) = ctx.collector_failure(CollectorName::Nvml) {
        f.all_unknown(&checks, &reason);
        return;
    }
    ctx.for_each_gpu(&checks, f, |gpu, f| each_gpu(req, gpu, f));
}

/// GPU temperatures a sensor can really report, in degrees Celsius. NVML reads an unsigned
/// value and a GPU shuts itself down near 100 C: anything outside is a sensor or probe fault,
/// judged unknown rather than compliant (−2,147,483,648 C is not cool) or hot.
const PLAUSIBLE_CELSIUS: std::ops::RangeInclusive<i32> = -40..=200;

/// A temperature field of `gpu`, or why it cannot be judged: missing, or implausible.
fn celsius(gpu: &GpuStatus, value: Option<i32>, field: &str) -> Result<i32, String> {
    match value {
        None => Err(missing_reason(&gpu.errors, field)),
        Some(t) if !PLAUSIBLE_CELSIUS.contains(&t) => Err(format!(
            "{field} {t} C is outside what a GPU sensor reports ({} to {} C): a sensor or probe fault",
            PLAUSIBLE_CELSIUS.start(),
            PLAUSIBLE_CELSIUS.end()
        )),
        Some(t) => Ok(t),
    }
}

fn each_gpu(req: &CoolingRequirements, gpu: &GpuStatus, f: &mut Findings) {
    let i = Some(gpu.index);
    let core = celsius(gpu, gpu.temperature_celsius, "temperatureCelsius");

    if let Some(max) = req.max_gpu_celsius {
        match &core {
            Err(why) => f.unknown(check::COOLING_MAX_GPU_CELSIUS, i, why.clone()),
            Ok(t) if *t > max => f.drift(
                DriftClass::Thermal,
                check::COOLING_MAX_GPU_CELSIUS,
                i,
                None,
                format!("<= {max} C"),
                format!("{t} C"),
            ),
            Ok(_) => {}
        }
    }

    if let Some(min) = req.min_slowdown_margin_celsius {
        let slowdown = celsius(gpu, gpu.slowdown_celsius, "slowdownCelsius");
        match (&core, &slowdown) {
            (Err(why), _) | (_, Err(why)) => {
                f.unknown(check::COOLING_MIN_SLOWDOWN_MARGIN_CELSIUS, i, why.clone());
            }
            (Ok(t), Ok(slowdown)) => {
                let margin = i64::from(*slowdown) - i64::from(*t);
                if margin < i64::from(min) {
                    f.drift(
                        DriftClass::Thermal,
                        check::COOLING_MIN_SLOWDOWN_MARGIN_CELSIUS,
                        i,
                        None,
                        format!(">= {min} C below slowdown"),
                        format!("{margin} C ({t} C, slowdown at {slowdown} C)"),
                    );
                }
            }
        }
    }

    if let Some(max) = req.max_memory_celsius {
        match celsius(gpu, gpu.memory_temperature_celsius, "memoryTemperatureCelsius") {
            Err(why) => f.unknown(check::COOLING_MAX_MEMORY_CELSIUS, i, why),
            Ok(t) if t > max => f.drift(
                DriftClass::Thermal,
                check::COOLING_MAX_MEMORY_CELSIUS,
                i,
                None,
                format!("<= {max} C"),
                format!("{t} C"),
            ),
            Ok(_) => {}
        }
    }

    if !req.forbidden_throttle_reasons.is_empty() {
        // Sets only for the message: most GPUs pass, and both lists are short.
        let hit = gpu
            .throttle_reasons
            .iter()
            .any(|r| req.forbidden_throttle_reasons.contains(r));
        if hit {
            let forbidden: BTreeSet<&str> = req.forbidden_throttle_reasons.iter().map(name).collect();
            let active: BTreeSet<&str> = gpu.throttle_reasons.iter().map(name).collect();
            f.drift(
                DriftClass::Throttle,
                check::COOLING_FORBIDDEN_THROTTLE_REASONS,
                i,
                None,
                format!("none of {}", list(&forbidden)),
                list(&active),
            );
        } else if let Some(err) = field_error(&gpu.errors, "throttleReasons") {
            f.unknown(check::COOLING_FORBIDDEN_THROTTLE_REASONS, i, err.reason.clone());
        }
    }
}

fn name(reason: &ThrottleReason) -> &'static str {
    match reason {
        ThrottleReason::GpuIdle => "GpuIdle",
        ThrottleReason::ApplicationsClocksSetting => "ApplicationsClocksSetting",
        ThrottleReason::SwPowerCap => "SwPowerCap",
        ThrottleReason::HwSlowdown => "HwSlowdown",
        ThrottleReason::SyncBoost => "SyncBoost",
        ThrottleReason::SwThermalSlowdown => "SwThermalSlowdown",
        ThrottleReason::HwThermalSlowdown => "HwThermalSlowdown",
        ThrottleReason::HwPowerBrakeSlowdown => "HwPowerBrakeSlowdown",
        ThrottleReason::DisplayClockSetting => "DisplayClockSetting",
    }
}

/// The checks on the cooling collector's data: chassis sensors and fans.
fn chassis_checks(req: &CoolingRequirements, ctx: &Context<'_>, f: &mut Findings) {
    let checks: Vec<&str> = [
        (!req.sensors.is_empty(), check::COOLING_SENSORS),
        (req.min_fan_rpm.is_some(), check::COOLING_MIN_FAN_RPM),
    ]
    .into_iter()
    .filter_map(|(asked, name)| asked.then_some(name))
    .collect();
    if checks.is_empty() {
        return;
    }
    if let Some(reason) = ctx.collector_failure(CollectorName::Cooling) {
        f.all_unknown(&checks, &reason);
        return;
    }
    let Some(cooling) = &ctx.status.cooling else {
        f.all_unknown(&checks, "not reported");
        return;
    };
    for limit in &req.sensors {
        sensor_limit(limit, cooling, f);
    }
    if let Some(min) = req.min_fan_rpm {
        fans(min, cooling, f);
    }
}

/// A cooling error is about a fan when it names the fan list or a `<chip>/fanN` reading.
fn is_fan_error(e: &FieldError) -> bool {
    e.field == "fans"
        || e.field
            .split_once('/')
            .is_some_and(|(_, label)| label.starts_with("fan"))
}

fn sensor_limit(limit: &SensorLimit, cooling: &CoolingStatus, f: &mut Findings) {
    let check = check::COOLING_SENSORS;
    let expected = || {
        format!(
            "<= {} C (sensors matching {:?})",
            limit.max_celsius, limit.pattern
        )
    };
    // One buffer for every sensor's `<chip>/<label>`; a String is made only for a drift.
    let mut name = String::new();
    for sensor in &cooling.sensors {
        name.clear();
        name.push_str(&sensor.chip);
        name.push('/');
        name.push_str(&sensor.label);
        if !glob_match(&limit.pattern, &name) {
            continue;
        }
        if !sensor.celsius.is_finite() {
            f.unknown(check, None, format!("{name}: reading is {}", sensor.celsius));
        } else if sensor.celsius > f64::from(limit.max_celsius) {
            f.drift(
                DriftClass::Cooling,
                check,
                None,
                Some(&name),
                expected(),
                format!("{} C", sensor.celsius),
            );
        }
    }
    for e in cooling.errors.iter().filter(|e| !is_fan_error(e)) {
        if e.field == "sensors" || glob_match(&limit.pattern, &e.field) {
            f.unknown(check, None, format!("{}: {}", e.field, e.reason));
        }
    }
}

fn fans(min: u32, cooling: &CoolingStatus, f: &mut Findings) {
    let check = check::COOLING_MIN_FAN_RPM;
    // A node whose fans are invisible to the OS (most SXM systems) lists none and passes.
    for fan in cooling.fans.iter().filter(|fan| fan.rpm < min) {
        f.drift(
            DriftClass::Cooling,
            check,
            None,
            Some(&fan.name),
            format!(">= {min} RPM"),
            format!("{} RPM", fan.rpm),
        );
    }
    for e in cooling.errors.iter().filter(|e| is_fan_error(e)) {
        f.unknown(check, None, format!("{}: {}", e.field, e.reason));
    }
}
