//! Crash points: places between two writes of one action where the reliability suite kills a
//! binary (issue 46). Each binary names its points (the operator's `crash::POINTS`, the probe's)
//! and arms one from `GPUNODE_CRASH_POINT` at start with [`arm_from_env`]. Compiled only with
//! the `failpoints` feature, which the binaries' test builds have (`cargo build --workspace`,
//! through the e2e crate); in a release build of a binary alone [`crash_point!`] expands to
//! nothing and the fail crate is not built.
//!
//! Armed, the first time the named point is reached the process logs that line to stderr and
//! aborts: no destructor, no graceful shutdown, no Lease release, as SIGKILL would. Armed with
//! `GPUNODE_CRASH_ACTION=hold`, the action waits there instead until the file
//! `GPUNODE_CRASH_RELEASE` names exists, and then goes on: the suite cuts the process's network or
//! stops the API server with the action held exactly between its two writes, while the rest of
//! the process (its Lease renewal) runs on. A name that is not one of the binary's points, or an
//! unknown action, stops it at start, so a misspelt point cannot make a run that crashes nowhere
//! pass.

/// The environment variable naming the point to crash at.
pub const ENV: &str = "GPUNODE_CRASH_POINT";
/// The environment variable saying how many times the point is passed before the crash
/// (default 0: the first time it is reached).
pub const SKIP_ENV: &str = "GPUNODE_CRASH_SKIP";
/// The environment variable saying what the point does when reached: `abort` (the default) or
/// `hold`.
pub const ACTION_ENV: &str = "GPUNODE_CRASH_ACTION";
/// The environment variable naming the file whose existence releases a held point.
pub const RELEASE_ENV: &str = "GPUNODE_CRASH_RELEASE";

/// What an armed point does when it is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Aborts the process, as SIGKILL would.
    Abort,
    /// Holds the action (its thread blocked) until the file [`RELEASE_ENV`] names exists, then
    /// goes on.
    Hold,
}

impl Action {
    fn parse(v: &str) -> Option<Action> {
        match v {
            "abort" => Some(Action::Abort),
            "hold" => Some(Action::Hold),
            _ => None,
        }
    }

    /// The argument the fail crate hands the point's closure.
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    fn arg(self) -> &'static str {
        match self {
            Action::Abort => "abort",
            Action::Hold => "hold",
        }
    }
}

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
    let action = match std::env::var(ACTION_ENV) {
        Err(_) => Action::Abort,
        Ok(v) => Action::parse(&v).ok_or_else(|| {
            CrashPointError::Config(name.clone(), format!("{ACTION_ENV}={v}: not abort or hold"))
        })?,
    };
    if action == Action::Hold && std::env::var_os(RELEASE_ENV).is_none() {
        return Err(CrashPointError::Config(
            name,
            format!("{ACTION_ENV}=hold needs {RELEASE_ENV}, the file that releases it"),
        ));
    }
    arm_checked(name, skip, action, known).map(Some)
}

fn arm_checked(name: String, skip: u32, action: Action, known: &[&str]) -> Result<String, CrashPointError> {
    if !known.contains(&name.as_str()) {
        return Err(CrashPointError::Unknown {
            name,
            known: known.join(", "),
        });
    }
    arm(name, skip, action)
}

#[cfg(feature = "failpoints")]
fn arm(name: String, skip: u32, action: Action) -> Result<String, CrashPointError> {
    // Passed `skip` times, then once `return(<action>)`: the point's closure gets the action.
    let fire = format!("1*return({})", action.arg());
    let actions = if skip == 0 {
        fire
    } else {
        format!("{skip}*off->{fire}")
    };
    fail::cfg(&name, &actions).map_err(|e| CrashPointError::Config(name.clone(), e))?;
    Ok(name)
}

#[cfg(not(feature = "failpoints"))]
fn arm(name: String, _skip: u32, _action: Action) -> Result<String, CrashPointError> {
    Err(CrashPointError::NotBuilt(name))
}

/// `point` was reached armed with `action` (the fail crate's argument): logs it and aborts the
/// process, or holds the action until the release file exists.
#[cfg(feature = "failpoints")]
pub fn reached(point: &str, action: Option<&str>) {
    let release = std::env::var_os(RELEASE_ENV).map(std::path::PathBuf::from);
    let Some(release) = release.filter(|_| action == Some(Action::Hold.arg())) else {
        eprintln!("gpunode crash point {point} reached: aborting");
        std::process::abort()
    };
    eprintln!(
        "gpunode crash point {point} reached: holding until {} exists",
        release.display()
    );
    // Only this action waits (its thread blocked); the rest of the process runs on.
    while !release.exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    eprintln!("gpunode crash point {point}: released");
}

#[cfg(feature = "failpoints")]
#[doc(hidden)]
pub use fail;

/// A crash point (see the crate): with the `failpoints` feature and the point armed, the
/// process aborts or holds here; otherwise nothing.
#[cfg(feature = "failpoints")]
#[macro_export]
macro_rules! crash_point {
    ($name:literal) => {
        if let Some(action) = $crate::fail::eval($name, |action| action) {
            $crate::reached($name, action.as_deref());
        }
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
        let e =
            arm_checked("a::nowhere".into(), 0, Action::Abort, &["a::b", "c::d"]).map_err(|e| e.to_string());
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
        arm_checked("t::skipped".into(), 2, Action::Abort, &["t::skipped"]).unwrap();
        let fired: Vec<bool> = (0..5)
            .map(|_| fail::eval("t::skipped", |_| ()).is_some())
            .collect();
        assert_eq!(fired, [false, false, true, false, false]);
    }

    /// Armed to hold, the point hands its closure the action that [`reached`] holds on.
    #[cfg(feature = "failpoints")]
    #[test]
    fn an_armed_point_carries_its_action() {
        arm_checked("t::held".into(), 0, Action::Hold, &["t::held"]).unwrap();
        assert_eq!(fail::eval("t::held", |a| a), Some(Some("hold".to_string())));
        arm_checked("t::aborted".into(), 0, Action::Abort, &["t::aborted"]).unwrap();
        assert_eq!(fail::eval("t::aborted", |a| a), Some(Some("abort".to_string())));
    }

    #[test]
    fn actions_parse_and_unknown_ones_are_refused() {
        assert_eq!(Action::parse("hold"), Some(Action::Hold));
        assert_eq!(Action::parse("abort"), Some(Action::Abort));
        assert_eq!(Action::parse("stop"), None);
    }

    /// A build without the feature refuses a known point rather than running without the
    /// crash a test asked for.
    #[cfg(not(feature = "failpoints"))]
    #[test]
    fn without_the_feature_a_known_point_is_refused() {
        let e = arm_checked("a::b".into(), 0, Action::Abort, &["a::b"]).map_err(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("built without crash points")),
            "{e:?}"
        );
    }
}
