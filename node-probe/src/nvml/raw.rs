//! The NVML calls nvml-wrapper does not wrap, made through its raw symbol table.
//!
//! This is the only module of the probe allowed to use `unsafe`. It uses the *field* form of the
//! symbol table (`nvml.lib().nvmlX.as_ref()`), which returns an error for a missing symbol; the
//! method form would panic.
#![allow(unsafe_code)]

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::{Device, Nvml};

/// Outputs of `nvmlDeviceGetRemappedRows` (Ampere and later).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemappedRowsRaw {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// Non-zero when a remap waits for a GPU reset.
    pub pending: u32,
    /// Non-zero when a remap failed.
    pub failure: u32,
}

/// `nvmlDeviceGetRemappedRows(device, &corr, &unc, &pending, &failure)`.
pub fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Result<RemappedRowsRaw, NvmlError> {
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let mut out = RemappedRowsRaw {
        correctable: 0,
        uncorrectable: 0,
        pending: 0,
        failure: 0,
    };
    // SAFETY: `device` is a live handle of this `nvml` (its lifetime ties it to the library), and
    // the four out-pointers are valid, writable `unsigned int`s for the duration of the call.
    let code = unsafe {
        sym(
            device.handle(),
            &mut out.correctable,
            &mut out.uncorrectable,
            &mut out.pending,
            &mut out.failure,
        )
    };
    nvml_try(code)?;
    Ok(out)
}

/// What `nvmlDeviceGetGpuFabricInfoV` (or, on drivers without it, `nvmlDeviceGetGpuFabricInfo`)
/// says about the GPU's NVSwitch fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricInfoRaw {
    /// `nvmlGpuFabricState_t` (0 not supported, 1 not started, 2 in progress, 3 completed).
    pub state: u8,
    /// The registration's `nvmlReturn_t`; meaningful only once completed.
    pub status: u32,
    /// The fabric clique the GPU belongs to.
    pub clique_id: u32,
    /// The fabric cluster's UUID (all zeros: none).
    pub cluster_uuid: [u8; 16],
    /// `NVML_GPU_FABRIC_HEALTH_MASK_*`; None from the unversioned call, which has no mask.
    pub health_mask: Option<u32>,
}

/// `nvmlGpuFabricInfo_v2`: `NVML_STRUCT_VERSION(GpuFabricInfo, 2)`, the size of the v2 struct
/// with the version in the top byte. The probe asks for v2 (the health mask is all it reads),
/// which every driver with the versioned call accepts, later ones included.
fn fabric_info_v2_version() -> u32 {
    let size = std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_v2_t>() as u32;
    size | (2 << 24)
}

/// The GPU's fabric registration, through the versioned call, else (a driver that predates it:
/// the symbol is missing) the unversioned one.
pub fn gpu_fabric_info(nvml: &Nvml, device: &Device<'_>) -> Result<FabricInfoRaw, NvmlError> {
    match nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfoV.as_ref()) {
        Ok(sym) => {
            // The sys crate's type is v3, a superset of v2: a driver told v2 writes only v2's
            // fields, so the buffer is large enough whatever it supports.
            // SAFETY: all-zero bytes are a valid value of this plain C struct.
            let mut info: nvml_wrapper_sys::bindings::nvmlGpuFabricInfoV_t = unsafe { std::mem::zeroed() };
            info.version = fabric_info_v2_version();
            // SAFETY: `device` is a live handle of this `nvml`, `info` a valid, writable struct
            // at least as large as the version it names, for the duration of the call.
            nvml_try(unsafe { sym(device.handle(), &mut info) })?;
            Ok(FabricInfoRaw {
                state: info.state,
                status: info.status,
                clique_id: info.cliqueId,
                cluster_uuid: info.clusterUuid,
                health_mask: Some(info.healthMask),
            })
        }
        Err(NvmlError::FailedToLoadSymbol(_)) => {
            let sym = nvml_sym(nvml.lib().nvmlDeviceGetGpuFabricInfo.as_ref())?;
            // SAFETY: as above, for the unversioned struct.
            let mut info: nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `device` is a live handle of this `nvml`, `info` a valid, writable struct.
            nvml_try(unsafe { sym(device.handle(), &mut info) })?;
            Ok(FabricInfoRaw {
                state: info.state,
                status: info.status,
                clique_id: info.cliqueId,
                cluster_uuid: info.clusterUuid,
                health_mask: None,
            })
        }
        Err(e) => Err(e),
    }
}
