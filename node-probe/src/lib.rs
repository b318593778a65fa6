//! gpunode node-probe: observes one GPU node (NVML, cooling sensors, RoCE lossless settings)
//! and publishes what it saw as that node's `GpuNodeReport`.
//!
//! * [`collect`]: the collector trait and the [`collect::Probe`] that runs them into a report.
//! * [`nvml`], [`cooling`], [`network`], [`pods`]: the collectors.
//! * [`limits`]: keeps a report inside the CRD schema's bounds.
//! * [`change`]: whether an observation differs materially from the last published one (the
//!   contract with the operator); [`policies`]: the GpuNodePolicies it decides by.
//! * [`publish`]: the publish loop (a pure state machine and the driver that carries out its
//!   actions) and the server-side-apply sink; [`metrics`]: `/metrics`, `/healthz`; [`app`]:
//!   wiring for the binary (`--once` and [`app::run`]).
//! * [`xid_state`]: the XIDs of the current boot, kept across probe restarts; [`boot_state`]:
//!   the per-boot state file it and the fabric counter history use.
//! * [`resets`]: `--gpu-reset` and `--gpu-reset-only`, the GPU resets the operator requests
//!   (GpuResetRequest); `--follow-resets`, a probe following resets another process does.
//!
//! * [`crash`]: the reliability suite's crash points (test builds only).
//!
//! The probe writes nothing but its own node's report and heartbeat Lease and the status of
//! the GpuResetRequests for its node; it never labels, taints or drains (the operator does).
#![warn(missing_docs)]

pub mod app;
pub mod boot_state;
pub mod change;
pub mod collect;
pub mod config;
pub mod cooling;
pub mod crash;
pub mod limits;
pub mod metrics;
pub mod network;
pub mod nvml;
pub mod pods;
pub mod policies;
pub mod publish;
pub mod resets;
pub mod state;
pub mod sysfs;
pub mod xid_state;
