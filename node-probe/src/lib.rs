//! gpunode node-probe: observes one GPU node (NVML, cooling sensors, RoCE lossless settings)
//! and publishes what it saw as that node's `GpuNodeReport`.
//!
//! * [`collect`]: the collector trait and the [`collect::Probe`] that runs them into a report.
//! * [`nvml`], [`cooling`], [`network`]: the collectors.
//! * [`limits`]: keeps a report inside the CRD schema's bounds.
#![warn(missing_docs)]

pub mod collect;
pub mod cooling;
pub mod limits;
pub mod network;
pub mod nvml;
pub mod sysfs;
