//! What the reaction phases (`reaction.rs`) measured, per controller and repetition, with their
//! raw samples.

use serde::{Deserialize, Serialize};

/// Open loop: a rate is sustained while its p99 stays within this (the reaction target).
pub const SUSTAINED_P99_MS: f64 = 1000.0;

/// Which controller answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    /// gpunode-operator.
    Gpunode,
    /// The minimal controller (`gpunode-bench floor`).
    Floor,
}

/// Single faults, one at a time.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Single {
    /// Report written → taint seen, ms, in order.
    pub written_to_taint_ms: Vec<f64>,
    /// Observation changed in the publish loop → taint seen, ms.
    pub change_to_taint_ms: Vec<f64>,
    /// Clear report written → taint gone, ms.
    pub recovery_ms: Vec<f64>,
    /// Faults or recoveries not answered within the deadline.
    pub failures: usize,
    /// The controller's CPU time over the phase per report change (two per fault), ms.
    pub cpu_ms_per_change: f64,
    /// gpunode's passes (`gpunode_reconciles_total`) over the phase per report change; none
    /// for the floor.
    #[serde(default)]
    pub passes_per_change: Option<f64>,
}

/// One burst.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Burst {
    /// Nodes faulted at once.
    pub size: usize,
    /// The last of the burst's reports written → the last node tainted, ms.
    pub last_written_to_all_ms: f64,
    /// Injection (all observations changed) → the last node tainted, ms.
    pub injected_to_all_ms: f64,
    /// Injection → the last report written, ms (the writers' share).
    pub injected_to_last_written_ms: f64,
    /// Per node: report written → taint seen, ms.
    pub written_to_taint_ms: Vec<f64>,
    /// Nodes not tainted within the deadline.
    pub failures: usize,
}

/// One rate of the open loop.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OpenLoop {
    /// Faults offered per second.
    pub rate: f64,
    /// Faults offered.
    pub offered: usize,
    /// Per fault answered: report written → taint seen, ms.
    pub written_to_taint_ms: Vec<f64>,
    /// Faults not answered within the deadline, or not injected because every node was busy.
    pub failures: usize,
    /// Whether the rate was sustained (no failure, p99 within `SUSTAINED_P99_MS`).
    pub sustained: bool,
}

/// Everything one controller answered in one repetition.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// The controller.
    pub controller: Controller,
    /// Repetition, from 0.
    pub rep: usize,
    /// Wall-clock start and end of each phase (RFC 3339), to match a spike with its cause.
    pub phases: Vec<(String, String, String)>,
    /// Single faults.
    pub single: Single,
    /// Bursts.
    pub bursts: Vec<Burst>,
    /// The open loop, rate by rate, up to the first rate not sustained.
    pub open_loop: Vec<OpenLoop>,
    /// The highest rate sustained, faults per second (0 when none was).
    pub saturation_rate: f64,
}
