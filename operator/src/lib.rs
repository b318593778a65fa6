//! gpunode operator: reconciles GpuNodePolicies against GpuNodeReports and acts on nodes.
//!
//! The pipeline is observe → evaluate (pure) → plan (pure) → apply (the only writer) → status.

pub mod apply;
pub mod cache;
pub mod check;
pub mod controller;
pub mod crdgen;
pub mod events;
pub mod heartbeats;
pub mod leader;
pub mod markers;
pub mod metrics;
pub mod own_writes;
pub mod plan;
pub mod server;
pub mod status;
pub mod sweep;
pub mod triggers;
pub mod trim;

// The pure evaluator lives in gpunode-checks, which the node-probe shares; these keep the
// operator's paths (`crate::evaluate`, `crate::verdict`).
pub use gpunode_checks::{evaluate, verdict};
