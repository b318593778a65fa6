//! gpunode checks: what a GpuNodePolicy says about one node's GpuNodeReport.
//!
//! The pure evaluator the operator acts on ([`evaluate`], [`verdict`]), in its own crate so that
//! the node-probe runs the very same code to decide what to publish at once
//! (`gpunode_probe::change`): a probe that copied the checks by hand would drift from them.
//! The operator re-exports both modules (`gpunode_operator::evaluate`, `gpunode_operator::verdict`).

pub mod evaluate;
pub mod verdict;
