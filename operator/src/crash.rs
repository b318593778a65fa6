//! Crash points: places between two writes of one action where the reliability suite kills the
//! leader (issue 46). Compiled only with the `failpoints` feature, which the e2e crate turns on
//! for the test builds (`cargo build --workspace`); a release build of the operator alone
//! (`cargo build --release -p gpunode-operator`) has none of this, and [`crash_point!`]
//! expands to nothing.
//!
//! A test starts the replica with `GPUNODE_CRASH_POINT=<name>`: the first time the named point
//! is reached the process logs that line to stderr and aborts (no destructor, no graceful
//! shutdown, no Lease release: a crash, as SIGKILL is). A name that is not in [`POINTS`] stops
//! the replica at start-up, so a misspelt point cannot make a run that crashes nowhere pass.

/// Every crash point, in the order an action reaches them.
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
    // A released node's repair objects are deleted; its taints and cordon are not removed yet.
    "release::after_repair_objects",
];

/// The environment variable naming the point to crash at.
pub const ENV: &str = "GPUNODE_CRASH_POINT";

/// Why the crash point configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum CrashPointError {
    /// The name is not a crash point.
    #[error("{ENV}={0}: not a crash point (known: {known})", known = POINTS.join(", "))]
    Unknown(String),
    /// This binary was built without the `failpoints` feature.
    #[error("{ENV}={0}: this binary was built without crash points (feature failpoints)")]
    NotBuilt(String),
    /// The fail crate refused the action.
    #[error("{ENV}={0}: {1}")]
    Config(String, String),
}

/// Arms the point `GPUNODE_CRASH_POINT` names, if any. Returns the armed point.
pub fn arm_from_env() -> Result<Option<String>, CrashPointError> {
    let Ok(name) = std::env::var(ENV) else {
        return Ok(None);
    };
    if !POINTS.contains(&name.as_str()) {
        return Err(CrashPointError::Unknown(name));
    }
    arm(name)
}

#[cfg(feature = "failpoints")]
fn arm(name: String) -> Result<Option<String>, CrashPointError> {
    // `1*return`: the first time only; the closure at the point aborts.
    fail::cfg(&name, "1*return").map_err(|e| CrashPointError::Config(name.clone(), e))?;
    Ok(Some(name))
}

#[cfg(not(feature = "failpoints"))]
fn arm(name: String) -> Result<Option<String>, CrashPointError> {
    Err(CrashPointError::NotBuilt(name))
}

/// Logs that `point` was reached and aborts the process. Generic so that [`crash_point!`]
/// fits in any function, whatever it returns.
#[cfg(feature = "failpoints")]
pub fn crash<T>(point: &str) -> T {
    eprintln!("gpunode crash point {point} reached: aborting");
    std::process::abort()
}

/// A crash point (see the module): with the `failpoints` feature and the point armed, the
/// process aborts here; otherwise nothing.
#[cfg(feature = "failpoints")]
macro_rules! crash_point {
    ($name:literal) => {
        fail::fail_point!($name, |_| $crate::crash::crash($name))
    };
}

/// A crash point (see the module): without the `failpoints` feature, nothing.
#[cfg(not(feature = "failpoints"))]
macro_rules! crash_point {
    ($name:literal) => {};
}

pub(crate) use crash_point;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_is_named_once() {
        let unique: std::collections::BTreeSet<_> = POINTS.iter().collect();
        assert_eq!(unique.len(), POINTS.len());
    }

    /// Every `crash_point!` in the source is in [`POINTS`], and every point is placed once: a
    /// test arming a point that the code no longer reaches would wait for a crash in vain.
    #[test]
    fn the_points_placed_in_the_source_are_the_known_points() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut placed = Vec::new();
        let mut dirs = vec![src];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                for part in text.split("crash_point!(\"").skip(1) {
                    placed.push(part.split('"').next().unwrap().to_string());
                }
            }
        }
        placed.sort();
        let mut known: Vec<String> = POINTS.iter().map(|p| p.to_string()).collect();
        known.sort();
        assert_eq!(placed, known);
    }

    /// A build without the feature (a release build of this crate) refuses a known point
    /// rather than running without the crash a test asked for.
    #[cfg(not(feature = "failpoints"))]
    #[test]
    fn without_the_feature_a_known_point_is_refused() {
        let e = arm(POINTS[0].to_string()).map_err(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("built without crash points")),
            "{e:?}"
        );
    }

    #[test]
    fn an_unknown_point_is_refused_with_the_known_ones() {
        let e = CrashPointError::Unknown("apply::nowhere".into()).to_string();
        assert!(e.contains("GPUNODE_CRASH_POINT=apply::nowhere"), "{e}");
        assert!(e.contains("drain::after_first_eviction"), "{e}");
    }
}
