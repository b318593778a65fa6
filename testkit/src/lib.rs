//! Test support shared by the crates' own tests (a dev-dependency only): the seeded, bounded
//! property-test runner of the fuzz tests, and the record each fuzz test leaves for the
//! reliability report (`make reliability-report`).

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

/// Leaves a fuzz test's outcome for the reliability report: `fuzz-<file>.json` in
/// `GPUNODE_RELIABILITY_DIR`, else in `<tmpdir>/reliability` (pass the test's
/// `env!("CARGO_TARGET_TMPDIR")`). `checks` are (invariant, detail) pairs that held.
pub fn record(tmpdir: &str, file: &str, fault: String, checks: &[(&str, String)]) {
    let dir = std::env::var_os("GPUNODE_RELIABILITY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(tmpdir).join("reliability"));
    let checks: Vec<serde_json::Value> = checks
        .iter()
        .map(|(i, d)| serde_json::json!({"invariant": i, "ok": true, "detail": d}))
        .collect();
    let run = serde_json::json!([{"class": "bad input (fuzz)", "fault": fault, "seed": 1,
                                   "checks": checks, "recovery_ms": null}]);
    // A report that cannot be written leaves a gap in the table, which the report names;
    // it is not a reason to fail the test that passed.
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("fuzz-{file}.json")), run.to_string());
}
