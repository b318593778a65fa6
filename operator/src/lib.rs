//! gpunode operator: reconciles GpuNodePolicies against GpuNodeReports and acts on nodes.
//!
//! The pipeline is observe → evaluate (pure) → plan (pure) → apply (the only writer) → status.

pub mod apply;
pub mod cache;
pub mod check;
pub mod controller;
pub mod crdgen;
pub mod evaluate;
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
pub mod verdict;
