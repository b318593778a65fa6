//! Crash points: places between two writes of one action where the reliability suite kills a
//! binary (issue 46). Each binary names its points (the operator's `crash::POINTS`, the probe's)
//! and arms one from `GPUNODE_CRASH_POINT` at start with [`arm_from_env`]. Compiled only with
//! the `failpoints` feature, which the binaries' test builds have (`cargo build --workspace`,
//! through the e2e crate); in a release build of a binary alone [`crash_point!`] expands to
//! nothing and the fail crate is not built.
//!
//! Armed, the first time the named point is reached the process logs that line to stderr and
//! aborts: no destructor, no graceful shutdown, no Lease release, as SIGKILL would. A name that
//! is not one of the binary's points stops it at start, so a misspelt point cannot make a run
//! that crashes nowhere pass.

/// The environment variable naming the point to crash at.
pub const ENV: &str = "GPUNODE_CRASH_POINT";
/// The environment variable saying how many times the point is passed before the crash
/// (default 0: the first time it is reached).
pub const SKIP_ENV: &str = "GPUNODE_CRASH_SKIP";

/// Why the crash point configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum CrashPointError {
    /// The name is not one of the binary's crash points.
    #[error("{ENV}={name}: not a crash point (known: {known})")]
    Unknown {
        /// The name given.
        name: String,
        /// The binary's points.
        known: String,
    },
    /// This binary was built without the `failpoints` feature.
    #[error("{ENV}={0}: this binary was built without crash points (feature failpoints)")]
    NotBuilt(String),
    /// The fail crate refused the action.
    #[error("{ENV}={0}: {1}")]
    Config(String, String),
}

/// Arms the point `GPUNODE_CRASH_POINT` names, if it is one of `known`. Returns the armed point.
pub fn arm_from_env(known: &[&str]) -> Result<Option<String>, CrashPointError> {
    let Ok(name) = std::env::var(ENV) else {
        return Ok(None);
    };
    let skip = match std::env::var(SKIP_ENV) {
        Err(_) => 0,
        Ok(v) => v
            .parse()
            .map_err(|e| CrashPointError::Config(name.clone(), format!("{SKIP_ENV}={v}: {e}")))?,
    };
    arm_checked(name, skip, known).map(Some)
}

fn arm_checked(name: String, skip: u32, known: &[&str]) -> Result<String, CrashPointError> {
    if !known.contains(&name.as_str()) {
        return Err(CrashPointError::Unknown {
            name,
            known: known.join(", "),
        });
    }
    arm(name, skip)
}

#[cfg(feature = "failpoints")]
fn arm(name: String, skip: u32) -> Result<String, CrashPointError> {
    // Passed `skip` times, then once `return`: the closure at the point aborts.
    let actions = if skip == 0 {
        "1*return".to_string()
    } else {
        format!("{skip}*off->1*return")
    };
    fail::cfg(&name, &actions).map_err(|e| CrashPointError::Config(name.clone(), e))?;
    Ok(name)
}

#[cfg(not(feature = "failpoints"))]
fn arm(name: String, _skip: u32) -> Result<String, CrashPointError> {
    Err(CrashPointError::NotBuilt(name))
}

/// Logs that `point` was reached and aborts the process. Generic so that [`crash_point!`] fits
/// in any function, whatever it returns.
#[cfg(feature = "failpoints")]
pub fn crash<T>(point: &str) -> T {
    eprintln!("gpunode crash point {point} reached: aborting");
    std::process::abort()
}

#[cfg(feature = "failpoints")]
#[doc(hidden)]
pub use fail;

/// A crash point (see the crate): with the `failpoints` feature and the point armed, the
/// process aborts here; otherwise nothing.
#[cfg(feature = "failpoints")]
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        $crate::fail::fail_point!($name, |_| $crate::crash($name))
    };
}

/// A crash point (see the crate): without the `failpoints` feature, nothing.
#[cfg(not(feature = "failpoints"))]
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {};
}

/// The crash points placed in the Rust sources under `dir` (every `crash_point!("…")`), sorted:
/// a binary's test compares them with its list, so a point armed by a test is one the code
/// reaches.
pub fn placed_in(dir: &std::path::Path) -> std::io::Result<Vec<String>> {
    let mut placed = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)?;
                for part in text.split(concat!("crash_point!", "(\"")).skip(1) {
                    placed.extend(part.split('"').next().map(str::to_string));
                }
            }
        }
    }
    placed.sort();
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_point_is_refused_with_the_known_ones() {
        let e = arm_checked("a::nowhere".into(), 0, &["a::b", "c::d"]).map_err(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("GPUNODE_CRASH_POINT=a::nowhere") && e.contains("a::b, c::d")),
            "{e:?}"
        );
    }

    /// Armed with a skip of 2, the point is passed twice and fires the third time, once.
    #[cfg(feature = "failpoints")]
    #[test]
    fn an_armed_point_fires_once_after_its_skips() {
        arm_checked("t::skipped".into(), 2, &["t::skipped"]).unwrap();
        let fired: Vec<bool> = (0..5)
            .map(|_| fail::eval("t::skipped", |_| ()).is_some())
            .collect();
        assert_eq!(fired, [false, false, true, false, false]);
    }

    /// A build without the feature refuses a known point rather than running without the
    /// crash a test asked for.
    #[cfg(not(feature = "failpoints"))]
    #[test]
    fn without_the_feature_a_known_point_is_refused() {
        let e = arm_checked("a::b".into(), 0, &["a::b"]).map_err(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("built without crash points")),
            "{e:?}"
        );
    }
}
