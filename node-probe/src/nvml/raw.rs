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
