//! Test support shared by the crates' own tests (a dev-dependency only, and the e2e harness):
//! the seeded, bounded property-test runner of the fuzz tests, the record each fuzz test leaves
//! for the reliability report (`make reliability-report`), and the commit every record names.

use std::path::{Path, PathBuf};

use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// How many cases a fuzz test runs: `PROPTEST_CASES` (raised by `make reliability-long`), or
/// the test's own default.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A runner with a fixed seed, so every run explores the same cases and a failure reproduces;
/// no failure persistence files.
pub fn runner(seed: &[u8; 32], default_cases: u32) -> TestRunner {
    TestRunner::new_with_rng(
        Config {
            cases: cases(default_cases),
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, seed),
    )
}

/// Where [`record`] leaves its files.
fn results_dir(tmpdir: &str) -> PathBuf {
    std::env::var_os("GPUNODE_RELIABILITY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(tmpdir).join("reliability"))
}

/// Leaves a fuzz test's outcome for the reliability report: `fuzz-<file>.json` in
/// `GPUNODE_RELIABILITY_DIR`, else in `<tmpdir>/reliability` (pass the test's
/// `env!("CARGO_TARGET_TMPDIR")`). `fault` names the run, and `cases_run` (counted inside the
/// test body, so cases the strategy rejected and early returns do not count) is appended to it.
/// `checks` are the (invariant, detail) pairs the run checks; `outcome` is the run's result,
/// recorded as it is (a failure marks every check of the run failed, with the failure as its
/// detail) before the caller fails the test with it. A run that executed no case proved
/// nothing: every check is recorded failed.
pub fn record<E: std::fmt::Display>(
    tmpdir: &str,
    file: &str,
    fault: &str,
    cases_run: u64,
    checks: &[(&str, String)],
    outcome: &Result<(), E>,
) {
    let dir = results_dir(tmpdir);
    let checks: Vec<serde_json::Value> = checks
        .iter()
        .map(|(i, d)| {
            // The run's outcome decides: a failure, or a run of no case, fails every check.
            let failure = match outcome {
                Err(e) => Some(e.to_string()),
                Ok(()) if cases_run == 0 => Some("no case ran".to_string()),
                Ok(()) => None,
            };
            serde_json::json!({"invariant": i, "ok": failure.is_none(),
                               "detail": failure.unwrap_or_else(|| d.clone())})
        })
        .collect();
    let fault = format!("{fault} ({cases_run} cases run)");
    let run = results(
        serde_json::json!([{"class": "bad input (fuzz)", "fault": fault, "seed": 1,
                                   "checks": checks, "recovery": null}]),
    );
    // A report that cannot be written leaves a gap in the table, which the report names;
    // it is not a reason to fail the test that passed.
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("fuzz-{file}.json")), run.to_string());
}

/// A results file of the reliability report: the commit of the code that produced `runs`
/// ([`source_commit`]) and the runs (a JSON list of the e2e harness's `Run`).
pub fn results(runs: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"commit": source_commit(), "runs": runs})
}

/// The commit the code under test is at: the checkout's HEAD (7 digits), marked "(with
/// uncommitted changes)" when a tracked file outside docs/ differs from it (the results then
/// describe code no commit contains); "unknown" outside a git checkout. Tests run the binaries
/// cargo built from this tree just before, so this is the commit of those binaries.
pub fn source_commit() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let Some(head) = git(&["rev-parse", "--short=7", "HEAD"]) else {
        return "unknown".to_string();
    };
    let dirty = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ".",
        ":!docs",
    ])
    .is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head} (with uncommitted changes)")
    } else {
        head
    }
}

/// Counts the cases a property test actually executed (call [`Counter::hit`] in the body).
#[derive(Debug, Default)]
pub struct Counter(std::cell::Cell<u64>);

impl Counter {
    /// One more.
    pub fn hit(&self) {
        self.0.set(self.0.get() + 1);
    }

    /// How many so far.
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(outcome: &Result<(), String>, cases_run: u64) -> serde_json::Value {
        let file = format!("unit-{}-{cases_run}", outcome.is_ok());
        // A directory per case: the tests run side by side, and each removes its own.
        let tmp = std::env::temp_dir().join(format!("gpunode-testkit-{}-{file}", std::process::id()));
        let dir = tmp.to_string_lossy().into_owned();
        record(&dir, &file, "f", cases_run, &[("holds", "why".into())], outcome);
        let path = results_dir(&dir).join(format!("fuzz-{file}.json"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_dir_all(&tmp);
        let file: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        // Every results file names the commit of the code that produced it.
        assert!(file["commit"].as_str().is_some_and(|c| !c.is_empty()), "{file}");
        file["runs"].clone()
    }

    #[test]
    fn a_failed_run_is_recorded_as_failed() {
        let ok = recorded(&Ok(()), 3);
        assert_eq!(ok[0]["checks"][0]["ok"], true);
        assert_eq!(ok[0]["checks"][0]["detail"], "why");
        assert_eq!(ok[0]["fault"], "f (3 cases run)");
        let failed = recorded(&Err("minimal failing input: x".into()), 3);
        assert_eq!(failed[0]["checks"][0]["ok"], false);
        assert_eq!(failed[0]["checks"][0]["detail"], "minimal failing input: x");
    }

    #[test]
    fn a_run_without_cases_is_recorded_as_failed() {
        let none = recorded(&Ok(()), 0);
        assert_eq!(none[0]["checks"][0]["ok"], false);
        assert_eq!(none[0]["checks"][0]["detail"], "no case ran");
        assert_eq!(none[0]["fault"], "f (0 cases run)");
    }

    #[test]
    fn the_counter_counts() {
        let c = Counter::default();
        c.hit();
        c.hit();
        assert_eq!(c.get(), 2);
    }
}
