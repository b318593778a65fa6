//! Report decoding as the operator meets it: JSON bytes -> GpuNodeReport -> gpunode-checks'
//! evaluate against the fixture policies. Beyond not panicking: a report lacking a section the
//! strict policy reads (per its spec, listed here) is never Compliant with it; a report gives the
//! same verdict after a serialize/deserialize round trip.
#![no_main]

use std::sync::OnceLock;

use gpunode_checks::{evaluate::evaluate, verdict::NodeState};
use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use jiff::Timestamp;
use libfuzzer_sys::fuzz_target;

/// The strict policy first: the section oracle applies to it.
const POLICIES: [&str; 4] = [
    include_str!("../../operator/tests/fixtures/evaluate/strict-policy.yaml"),
    include_str!("../../operator/tests/fixtures/evaluate/network-only-policy.yaml"),
    include_str!("../../examples/h100-training.yaml"),
    include_str!("../../examples/fabric-only.yaml"),
];

/// What the strict policy reads of a report.
const STRICT_READS: [&str; 7] = [
    "observedAt",
    "driverVersion",
    "cudaVersion",
    "gpuCount",
    "gpus",
    "cooling",
    "network",
];

fn policies() -> &'static [GpuNodePolicy] {
    static P: OnceLock<Vec<GpuNodePolicy>> = OnceLock::new();
    P.get_or_init(|| {
        POLICIES
            .iter()
            .map(|y| serde_yaml::from_str(y).unwrap_or_else(|e| panic!("fixture policy: {e}")))
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let missing: Vec<&str> = STRICT_READS
        .iter()
        .copied()
        .filter(|k| {
            value
                .pointer(&format!("/status/{k}"))
                .is_none_or(serde_json::Value::is_null)
        })
        .collect();
    let Ok(report) = serde_json::from_value::<GpuNodeReport>(value) else {
        return;
    };
    // The fixtures' reports were observed at 12:00:00; half a minute later they are fresh.
    let now: Timestamp = "2026-11-29T12:00:30Z".parse().unwrap_or_else(|e| panic!("{e}"));
    let again: GpuNodeReport = serde_json::to_string(&report)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| panic!("a decoded report does not survive a round trip"));
    for (i, p) in policies().iter().enumerate() {
        let verdict = evaluate(&p.spec, Some(&report), now);
        assert!(!verdict.summary().is_empty());
        assert_eq!(
            verdict,
            evaluate(&p.spec, Some(&again), now),
            "round trip changed the verdict"
        );
        if i == 0 && !missing.is_empty() {
            assert!(
                verdict.state != NodeState::Compliant,
                "Compliant with the strict policy although the report lacks {missing:?}"
            );
        }
    }
});
