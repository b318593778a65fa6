//! The probe's crash points (the `gpunode-crashpoints` crate says how they work): where the
//! reliability suite aborts a probe process between two steps of one action
//! (e2e/tests/reliability_crash.rs). Only in builds with the `failpoints` feature.

pub use gpunode_crashpoints::{CrashPointError, ENV};

/// Every crash point of the probe.
pub const POINTS: [&str; 2] = [
    // The GPU was reset (`--gpu-reset-only`, `--gpu-reset`); its outcome is not written to the
    // GpuResetRequest yet.
    "reset::after_reset",
    // The XID state's new content is written to a temporary file beside it, not yet renamed
    // over the state file.
    "state::xids_before_rename",
];

/// Arms the point `GPUNODE_CRASH_POINT` names, if any (one of [`POINTS`]).
pub fn arm_from_env() -> Result<Option<String>, CrashPointError> {
    gpunode_crashpoints::arm_from_env(&POINTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every crash point in the source is in [`POINTS`], and every point is placed once.
    #[test]
    fn the_points_placed_in_the_source_are_the_known_points() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let placed = gpunode_crashpoints::placed_in(&src).unwrap();
        let mut known: Vec<String> = POINTS.iter().map(|p| p.to_string()).collect();
        known.sort();
        assert_eq!(placed, known);
    }
}
