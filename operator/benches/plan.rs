//! Evaluate and plan one policy over 5,000 nodes (target: under 50 ms together).
//! `cargo bench -p gpunode-operator --bench plan` prints medians over 21 runs.

// clippy.toml allows unwrap and expect in #[test] fns only; this bench's helper fns fail
// the same way (a panic naming what broke), so the allow covers the whole crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Instant;

use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use gpunode_operator::{
    evaluate::evaluate,
    plan::{NodeView, plan},
};
use jiff::Timestamp;

fn main() {
    let (node_count, runs) = support::size();
    let policy: GpuNodePolicy = support::load("strict-policy.yaml");
    let healthy: GpuNodeReport = support::load("healthy-h100-report.yaml");
    let broken: GpuNodeReport = support::load("broken-h100-report.yaml");
    let now: Timestamp = "2026-11-29T12:00:30Z".parse().unwrap();
    // One node in twenty is broken, the rest healthy.
    let reports: Vec<GpuNodeReport> = (0..node_count)
        .map(|i| {
            let mut r = if i % 20 == 0 {
                broken.clone()
            } else {
                healthy.clone()
            };
            r.metadata.name = Some(format!("gpu-node-{i:05}"));
            r
        })
        .collect();

    let (mut eval_times, mut plan_times) = (Vec::new(), Vec::new());
    let mut drifted = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let verdicts: Vec<_> = reports
            .iter()
            .map(|r| evaluate(&policy.spec, Some(r), now))
            .collect();
        eval_times.push(t.elapsed());
        let views: Vec<NodeView> = reports
            .iter()
            .zip(verdicts)
            .map(|(r, verdict)| NodeView::new(&r.metadata.name.clone().unwrap_or_default(), verdict))
            .collect();
        let t = Instant::now();
        let p = plan("bench", &policy.spec, &views, now);
        plan_times.push(t.elapsed());
        drifted = p.nodes.iter().filter(|n| !n.drifting.is_empty()).count();
    }
    let (e, p) = (support::median(eval_times), support::median(plan_times));
    println!("nodes: {node_count} ({drifted} drifted), runs: {runs}");
    println!("evaluate: median {e:?} ({:?} per node)", e / node_count as u32);
    println!("plan:     median {p:?}");
    println!("total:    median {:?} (target < 50ms)", e + p);
}
