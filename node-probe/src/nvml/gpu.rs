//! Reading one GPU into a [`GpuStatus`]: every field on its own, so a call that fails leaves
//! that field unknown (None) with a [`FieldError`] and the rest of the GPU intact.
//!
//! Queries only: it changes no GPU setting, uses no `unsafe` (the calls nvml-wrapper does not
//! wrap go through `super::raw`) and leaves the XIDs and pods of a GPU to their own sources.

use gpunode_crds::report::{
    EccCounters, FieldError, GpuStatus, NvlinkStatus, PcieStatus, RemappedRows, RetiredPages,
};
use gpunode_crds::{EnabledState, GpuRecoveryAction, ThrottleReason};
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};

use super::nvlink::{self, LinkCounters};
use super::raw;
use super::reason::nvml_reason;

/// NVML_FI_DEV_MEMORY_TEMP: HBM temperature, only readable as a field value.
const FIELD_MEMORY_TEMP: u32 = 82;
/// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION as nvml.h numbers it (230: outside the ids nvml-wrapper
/// renumbers for drivers from 580.82, so the same on every driver).
const FIELD_RECOVERY_ACTION: u32 = nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
/// NVML_NVLINK_MAX_LINKS.
const MAX_NVLINKS: u32 = 18;
/// Temperatures outside this range (°C) are a driver or sensor fault, not a reading.
const PLAUSIBLE_CELSIUS: std::ops::RangeInclusive<i64> = -40..=200;
/// Power readings above this (W) are a driver fault; the largest boards draw about 1.2 kW.
const MAX_PLAUSIBLE_WATTS: u32 = 5_000;

/// Why a value was rejected.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("{}", nvml_reason(.0))]
    Nvml(#[from] NvmlError),
    #[error("implausible value {0}")]
    Implausible(String),
}

/// Collects field errors while a GPU is read.
struct Errors(Vec<FieldError>);

impl Errors {
    /// The value, or None with an error for `field`.
    fn take<T>(&mut self, field: &str, result: Result<T, ReadError>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(e) => {
                self.0.push(FieldError {
                    field: field.to_owned(),
                    reason: e.to_string(),
                });
                None
            }
        }
    }
}

/// Reads every field of GPU `index`, and the raw error counters of its active NVLinks (which
/// the collector turns into counts over the last hour). A GPU whose handle cannot be obtained is
/// still listed, with only its index and the error.
pub fn read_gpu(nvml: &Nvml, index: u32) -> (GpuStatus, Vec<LinkCounters>) {
    let _span = tracing::debug_span!("read_gpu", gpu = index).entered();
    let device = match nvml.device_by_index(index) {
        Ok(device) => device,
        Err(e) => {
            let gpu = GpuStatus {
                index,
                errors: vec![FieldError {
                    field: "device".to_owned(),
                    reason: nvml_reason(&e),
                }],
                ..GpuStatus::default()
            };
            return (gpu, Vec::new());
        }
    };
    let mut errors = Errors(Vec::new());
    let mut gpu = GpuStatus {
        index,
        ..GpuStatus::default()
    };
    read_identity(nvml, &device, &mut gpu, &mut errors);
    read_thermal(&device, &mut gpu, &mut errors);
    let active = read_links_and_modes(&device, &mut gpu, &mut errors);
    gpu.fabric = errors.take("fabric", nvlink::fabric(nvml, &device).map_err(ReadError::from));
    let (links, counter_errors) = nvlink::read_counters(&device, &active);
    errors.0.extend(counter_errors);
    gpu.errors = errors.0;
    (gpu, links)
}

/// Identity, memory and its health: UUID, product, PCI bus id, memory size, ECC mode and
/// counters, retired pages, remapped rows.
fn read_identity(nvml: &Nvml, device: &Device<'_>, gpu: &mut GpuStatus, e: &mut Errors) {
    gpu.uuid = e.take("uuid", device.uuid().map_err(ReadError::from));
    gpu.product = e.take("product", device.name().map_err(ReadError::from));
    gpu.pci_bus_id = e.take(
        "pciBusId",
        device.pci_info().map(|p| p.bus_id).map_err(ReadError::from),
    );
    gpu.memory_mib = e.take(
        "memoryMiB",
        device
            .memory_info()
            .map(|m| m.total / (1024 * 1024))
            .map_err(ReadError::from),
    );
    gpu.ecc_mode = e.take(
        "eccMode",
        device
            .is_ecc_enabled()
            .map(|m| enabled(m.currently_enabled))
            .map_err(ReadError::from),
    );
    gpu.ecc = e.take("ecc", ecc_counters(device));
    gpu.retired_pages = e.take("retiredPages", retired_pages(device));
    gpu.remapped_rows = e.take("remappedRows", remapped_rows(nvml, device));
}

/// Temperatures and their thresholds, power and its limit, throttle reasons.
fn read_thermal(device: &Device<'_>, gpu: &mut GpuStatus, e: &mut Errors) {
    gpu.temperature_celsius = e.take(
        "temperatureCelsius",
        celsius(device.temperature(TemperatureSensor::Gpu)),
    );
    gpu.memory_temperature_celsius = e.take("memoryTemperatureCelsius", memory_temperature(device));
    gpu.slowdown_celsius = e.take(
        "slowdownCelsius",
        celsius(device.temperature_threshold(TemperatureThreshold::Slowdown)),
    );
    gpu.shutdown_celsius = e.take(
        "shutdownCelsius",
        celsius(device.temperature_threshold(TemperatureThreshold::Shutdown)),
    );
    gpu.power_watts = e.take("powerWatts", watts(device.power_usage()));
    gpu.power_limit_watts = e.take("powerLimitWatts", watts(device.enforced_power_limit()));
    gpu.default_power_limit_watts = e.take(
        "defaultPowerLimitWatts",
        watts(device.power_management_limit_default()),
    );
    gpu.throttle_reasons = e
        .take(
            "throttleReasons",
            device
                .current_throttle_reasons()
                .map(|r| ThrottleReason::from_bits(r.bits()))
                .map_err(ReadError::from),
        )
        .unwrap_or_default();
}

/// PCIe (with its replay counter), NVLink, persistence and MIG modes; returns the active
/// NVLinks. `xids` and `pods` are left empty: the XID log and the PodResources collector fill
/// them.
fn read_links_and_modes(device: &Device<'_>, gpu: &mut GpuStatus, e: &mut Errors) -> Vec<u32> {
    gpu.pcie = e.take("pcie", pcie(device));
    let (status, active) = e.take("nvlink", nvlink_links(device)).unzip();
    gpu.nvlink = status;
    gpu.persistence_mode = e.take(
        "persistenceMode",
        device
            .is_in_persistent_mode()
            .map(enabled)
            .map_err(ReadError::from),
    );
    gpu.mig_mode = e.take("migMode", mig_mode(device));
    gpu.recovery_action = e.take("recoveryAction", recovery_action(device)).flatten();
    if let Some(pcie) = gpu.pcie.as_mut() {
        match device.pcie_replay_counter() {
            Ok(replays) => pcie.replay_counter = u64::from(replays),
            Err(err) => e.0.push(FieldError {
                field: "pcie.replayCounter".to_owned(),
                reason: nvml_reason(&err),
            }),
        }
    }
    active.unwrap_or_default()
}

fn enabled(on: bool) -> EnabledState {
    if on {
        EnabledState::Enabled
    } else {
        EnabledState::Disabled
    }
}

fn ecc_counters(device: &Device<'_>) -> Result<EccCounters, ReadError> {
    use EccCounter::{Aggregate, Volatile};
    use MemoryError::{Corrected, Uncorrected};
    Ok(EccCounters {
        volatile_corrected: device.total_ecc_errors(Corrected, Volatile)?,
        volatile_uncorrected: device.total_ecc_errors(Uncorrected, Volatile)?,
        aggregate_corrected: device.total_ecc_errors(Corrected, Aggregate)?,
        aggregate_uncorrected: device.total_ecc_errors(Uncorrected, Aggregate)?,
    })
}

fn retired_pages(device: &Device<'_>) -> Result<RetiredPages, ReadError> {
    Ok(RetiredPages {
        single_bit: device
            .retired_pages(RetirementCause::MultipleSingleBitEccErrors)?
            .len() as u64,
        double_bit: device.retired_pages(RetirementCause::DoubleBitEccError)?.len() as u64,
        pending: device.are_pages_pending_retired()?,
    })
}

fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Result<RemappedRows, ReadError> {
    let raw = raw::remapped_rows(nvml, device)?;
    Ok(RemappedRows {
        correctable: u64::from(raw.correctable),
        uncorrectable: u64::from(raw.uncorrectable),
        pending: raw.pending != 0,
        failure: raw.failure != 0,
    })
}

/// A temperature from NVML's unsigned API, rejected when no sensor could read it.
fn celsius(value: Result<u32, NvmlError>) -> Result<i32, ReadError> {
    plausible_celsius(i64::from(value?))
}

fn plausible_celsius(value: i64) -> Result<i32, ReadError> {
    if !PLAUSIBLE_CELSIUS.contains(&value) {
        return Err(ReadError::Implausible(format!("{value} °C")));
    }
    i32::try_from(value).map_err(|_| ReadError::Implausible(format!("{value} °C")))
}

/// Milliwatts to watts, rejecting readings no board can draw.
fn watts(milliwatts: Result<u32, NvmlError>) -> Result<u32, ReadError> {
    let milliwatts = milliwatts?;
    let w = milliwatts / 1000;
    if w > MAX_PLAUSIBLE_WATTS {
        return Err(ReadError::Implausible(format!("{milliwatts} mW")));
    }
    Ok(w)
}

fn memory_temperature(device: &Device<'_>) -> Result<i32, ReadError> {
    let samples = device.field_values_for(&[FieldId(FIELD_MEMORY_TEMP)])?;
    let sample = samples.into_iter().next().ok_or(NvmlError::NoData)??;
    let value = match sample.value? {
        SampleValue::U32(v) => i64::from(v),
        SampleValue::U64(v) => i64::try_from(v).unwrap_or(i64::MAX),
        SampleValue::I64(v) => v,
        SampleValue::F64(v) => v as i64,
    };
    plausible_celsius(value)
}

/// NVML's recovery action; `None` (and no error) where the driver cannot report it, so that
/// older drivers are not unknown for a check no policy asks for.
fn recovery_action(device: &Device<'_>) -> Result<Option<GpuRecoveryAction>, ReadError> {
    let samples = match device.field_values_for(&[FieldId(FIELD_RECOVERY_ACTION)]) {
        Err(NvmlError::NotSupported) => return Ok(None),
        other => other?,
    };
    let sample = match samples.into_iter().next().ok_or(NvmlError::NoData)? {
        Err(NvmlError::NotSupported) => return Ok(None),
        other => other?,
    };
    let value = match sample.value {
        Err(NvmlError::NotSupported) => return Ok(None),
        other => other?,
    };
    let raw = match value {
        SampleValue::U32(v) => u64::from(v),
        SampleValue::U64(v) => v,
        SampleValue::I64(v) => u64::try_from(v).unwrap_or(u64::MAX),
        SampleValue::F64(v) => v as u64,
    };
    GpuRecoveryAction::from_nvml(raw)
        .map(Some)
        .ok_or_else(|| ReadError::Implausible(format!("recovery action {raw}")))
}

fn pcie(device: &Device<'_>) -> Result<PcieStatus, ReadError> {
    Ok(PcieStatus {
        current_generation: device.current_pcie_link_gen()?,
        max_generation: device.max_pcie_link_gen()?,
        current_width: device.current_pcie_link_width()?,
        max_width: device.max_pcie_link_width()?,
        ..PcieStatus::default()
    })
}

/// Counts links 0..18 until NVML says a link does not exist (InvalidArg) or NVLink is not
/// supported at all; also returns the active ones.
fn nvlink_links(device: &Device<'_>) -> Result<(NvlinkStatus, Vec<u32>), ReadError> {
    let mut status = NvlinkStatus::default();
    let mut active_links = Vec::new();
    for link in 0..MAX_NVLINKS {
        match device.link_wrapper_for(link).is_active() {
            Ok(active) => {
                status.total += 1;
                status.active += u32::from(active);
                if active {
                    active_links.push(link);
                }
            }
            Err(NvmlError::InvalidArg | NvmlError::NotSupported) => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok((status, active_links))
}

/// MIG mode; GPUs without MIG (NotSupported) run with it disabled.
fn mig_mode(device: &Device<'_>) -> Result<EnabledState, ReadError> {
    match device.mig_mode() {
        Ok(mode) => match mode.current {
            0 => Ok(EnabledState::Disabled),
            1 => Ok(EnabledState::Enabled),
            other => Err(ReadError::Implausible(format!("MIG mode {other}"))),
        },
        Err(NvmlError::NotSupported) => Ok(EnabledState::Disabled),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_implausible_temperatures() {
        assert_eq!(plausible_celsius(41).ok(), Some(41));
        assert!(plausible_celsius(4_294_967_291).is_err());
        assert!(plausible_celsius(4000).is_err());
        assert!(celsius(Err(NvmlError::GpuLost)).is_err());
    }

    #[test]
    fn converts_and_bounds_power() {
        assert_eq!(watts(Ok(700_000)).ok(), Some(700));
        assert!(watts(Ok(u32::MAX)).is_err());
    }
}
