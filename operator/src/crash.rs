//! The operator's crash points (the `gpunode-crashpoints` crate says how they work): where the
//! reliability suite aborts the leader between two writes of one action
//! (e2e/tests/reliability_crash.rs). Only in builds with the `failpoints` feature.

pub use gpunode_crashpoints::{ACTION_ENV, CrashPointError, ENV, RELEASE_ENV};

/// Every crash point of the operator, in the order an action reaches them.
pub const POINTS: [&str; 8] = [
    // The taints and cordon are written; the bookkeeping that a drain started is not.
    "apply::after_spec",
    // A drain's first eviction is committed, the node's other pods are not evicted yet.
    "drain::after_first_eviction",
    // Nothing was left to evict; that the drain is done is not recorded yet.
    "drain::before_done_record",
    // A GPU's DeviceTaintRule exists; the quarantine is not recorded on the node yet.
    "devices::after_rule",
    // A repair step's object (a GpuResetRequest or a remediator's object) exists; its making
    // and its uid are not recorded yet.
    "repair::after_object",
    // A validation's Job exists (its start was recorded before).
    "validation::after_job",
    // A released node's taints and cordon are gone; its labels, annotations and condition not yet.
    "release::after_spec",
    // A released node's repair objects are deleted (if it had any); its taints and cordon are not
    // removed yet.
    "release::after_repair_objects",
];

/// Arms the point `GPUNODE_CRASH_POINT` names, if any (one of [`POINTS`]).
pub fn arm_from_env() -> Result<Option<String>, CrashPointError> {
    gpunode_crashpoints::arm_from_env(&POINTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_is_named_once() {
        let unique: std::collections::BTreeSet<_> = POINTS.iter().collect();
        assert_eq!(unique.len(), POINTS.len());
    }

    /// Every crash point in the source is in [`POINTS`], and every point is placed once: a test
    /// arming a point that the code no longer reaches would wait for a crash in vain.
    #[test]
    fn the_points_placed_in_the_source_are_the_known_points() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let placed = gpunode_crashpoints::placed_in(&src).unwrap();
        let mut known: Vec<String> = POINTS.iter().map(|p| p.to_string()).collect();
        known.sort();
        assert_eq!(placed, known);
    }
}
