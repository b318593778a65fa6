//! How an NVML error reads in a report ([`nvml_reason`]).
//!
//! A leaf: the other NVML modules import it, it imports none of them.

use nvml_wrapper::error::NvmlError;

/// A short, stable reason for an NVML error, as shown in `FieldError.reason`.
pub fn nvml_reason(e: &NvmlError) -> String {
    match e {
        NvmlError::UnexpectedVariant(n) => format!("NVML: unexpected value or return code {n}"),
        NvmlError::LibloadingError(e) => format!("NVML library: {e}"),
        NvmlError::FailedToLoadSymbol(s) => format!("NVML: missing symbol: {s}"),
        other => format!("NVML: {other:?}"),
    }
}
