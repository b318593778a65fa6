//! A GPU reset the way NVML does one: drain the GPU (no new work lands on it), remove it from
//! the bus, discover it again. A reset applies a pending row remap and clears the volatile ECC
//! counters (and recovers some XIDs); it needs the GPU free of every process. The probe does it
//! only on the operator's request, for the GPU the request names by index and UUID.

use nvml_wrapper::{
    Nvml,
    enum_wrappers::device::{DetachGpuState, PcieLinkState},
    error::NvmlError,
};

use super::reason::nvml_reason;

/// Why a reset was not done, or did not finish.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ResetError {
    /// The GPU at that index has another UUID: indices can change (a GPU lost, a reboot), so the
    /// request no longer names this GPU and nothing is touched.
    #[error("GPU {index} is {found}, not {wanted}: nothing was reset")]
    OtherGpu {
        /// The index asked for.
        index: u32,
        /// The UUID asked for.
        wanted: String,
        /// The UUID at that index.
        found: String,
    },
    /// Processes use the GPU: a reset would kill them, so it is refused.
    #[error("GPU {index} is in use by processes {pids:?}: not reset")]
    InUse {
        /// The index.
        index: u32,
        /// Their process ids (compute and graphics).
        pids: Vec<u32>,
    },
    /// A step failed. After `discover` failed the GPU is off the bus until a reboot; after
    /// `persistence`, `drain` or `remove` failed it was left as it was (undrained, persistence
    /// mode as before).
    #[error("GPU {index}: {step} failed: {reason}")]
    Nvml {
        /// The index.
        index: u32,
        /// `load`, `read`, `persistence`, `drain`, `remove` or `discover`.
        step: &'static str,
        /// NVML's error.
        reason: String,
    },
}

impl ResetError {
    /// A condition reason (CamelCase) for the request's status.
    pub fn reason(&self) -> &'static str {
        match self {
            ResetError::OtherGpu { .. } => "OtherGpu",
            ResetError::InUse { .. } => "InUse",
            ResetError::Nvml { .. } => "NvmlError",
        }
    }
}

/// Resets GPU `index` if it is the GPU with `uuid` and no process uses it.
pub fn reset_gpu(nvml: &Nvml, index: u32, uuid: &str) -> Result<(), ResetError> {
    let failed = |step: &'static str| {
        move |e: NvmlError| ResetError::Nvml {
            index,
            step,
            reason: nvml_reason(&e),
        }
    };
    let mut device = nvml.device_by_index(index).map_err(failed("read"))?;
    let found = device.uuid().map_err(failed("read"))?;
    if found != uuid {
        return Err(ResetError::OtherGpu {
            index,
            wanted: uuid.to_string(),
            found,
        });
    }
    let mut pids: Vec<u32> = device
        .running_compute_processes()
        .map_err(failed("read"))?
        .into_iter()
        .chain(device.running_graphics_processes().map_err(failed("read"))?)
        .map(|p| p.pid)
        .collect();
    if !pids.is_empty() {
        pids.sort_unstable();
        pids.dedup();
        return Err(ResetError::InUse { index, pids });
    }
    let pci = device.pci_info().map_err(failed("read"))?;
    // Persistence mode counts as an attachment: NVML drains and removes a GPU only without it.
    // It is turned back on once the GPU is back, as it was.
    let persistent = device.is_in_persistent_mode().map_err(failed("read"))?;
    if persistent {
        device.set_persistent(false).map_err(failed("persistence"))?;
    }
    let restore = |d: &mut nvml_wrapper::Device<'_>| {
        if persistent && let Err(e) = d.set_persistent(true) {
            tracing::warn!(index, error = %nvml_reason(&e), "cannot turn persistence mode back on");
        }
    };
    if let Err(e) = device.set_drain(true, pci.clone()) {
        restore(&mut device);
        return Err(failed("drain")(e));
    }
    let (removed, back) = device.remove(pci.clone(), DetachGpuState::Remove, PcieLinkState::ShutDown);
    if let Err(e) = removed {
        // Still on the bus: undo the drain, so it takes work again as before.
        if let Some(mut d) = back {
            let _ = d.set_drain(false, pci);
            restore(&mut d);
        }
        return Err(failed("remove")(e.error));
    }
    nvml.discover_gpus(pci).map_err(failed("discover"))?;
    // Handles from before the discovery are not valid any more: find the GPU again.
    if persistent {
        match nvml.device_by_uuid(uuid) {
            Ok(mut d) => restore(&mut d),
            Err(e) => {
                tracing::warn!(index, error = %nvml_reason(&e), "cannot find the GPU again to turn persistence mode back on")
            }
        }
    }
    Ok(())
}
