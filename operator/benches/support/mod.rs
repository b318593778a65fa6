//! What the operator's micro-benchmarks share.

use std::time::Duration;

/// Nodes and runs: the full size under `cargo bench` (which passes `--bench`); a small smoke run
/// under `cargo test --benches` (part of `make test`), so the bench's own assertions keep it honest.
pub fn size() -> (usize, usize) {
    if std::env::args().any(|a| a == "--bench") {
        (5_000, 21)
    } else {
        (50, 3)
    }
}

/// A fixture of the evaluate tests.
pub fn load<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/evaluate/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The median of the runs.
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}
