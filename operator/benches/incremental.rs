//! The incremental pass against the full one: the planner's CPU per report change at 100, 1,000,
//! 5,000 and 100,000 nodes (one node in twenty drifted and cordoned, the rest healthy), one
//! node's verdict changing per pass and its plan written back. Prints the median and p99 of a
//! pass after one change, the full pass's median, and the ratio of the largest fleet's median
//! to the smallest's (#45: CPU per change at 5,000 ≤ 1.5x that at 100).
//! `cargo bench -p gpunode-operator --bench incremental`; under `cargo test --benches` it runs
//! small and checks that one change plans one node.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use gpunode_operator::{
    plan::{NodePlan, NodeView, PassInputs, incremental::Incremental, plan},
    verdict::{Drift, Verdict},
};
use jiff::{SignedDuration, Timestamp};

fn policy() -> GpuNodePolicySpec {
    serde_yaml::from_str(
        r#"
remediation:
  - {classes: [Throttle], action: Taint, effect: NoSchedule}
  - {classes: [Xid], action: Cordon}
disruption:
  maxUnavailable: 10%
  circuitBreaker: {maxDriftedPercent: 50, window: 10m}
recovery: {healthyFor: 1s}
"#,
    )
    .unwrap()
}

fn verdict(broken: bool) -> Verdict {
    let drifts = if broken {
        vec![Drift {
            class: DriftClass::Xid,
            check: "gpu.fatalXids".to_string(),
            expected: "none".to_string(),
            actual: "79".to_string(),
            gpu: Some(3),
            device: None,
        }]
    } else {
        Vec::new()
    };
    Verdict::new(drifts, Vec::new())
}

/// Writes `p` back onto `n` as the apply step would; whether anything changed (a write the
/// operator's watch would see).
fn write_back(n: &mut NodeView, p: &NodePlan) -> bool {
    let before = (
        n.taints.clone(),
        n.markers.clone(),
        n.unschedulable,
        n.current_state,
        n.current_reason,
    );
    n.taints = p.taints.clone();
    n.markers = p.markers.clone();
    if let Some(c) = p.cordon {
        n.unschedulable = c;
    }
    n.current_state = Some(p.state);
    n.current_reason = Some(p.condition.reason);
    before
        != (
            n.taints.clone(),
            n.markers.clone(),
            n.unschedulable,
            n.current_state,
            n.current_reason,
        )
}

/// Passes and writes back until a pass plans nothing (at most ten).
fn settle(views: &mut [NodeView], inc: &mut Incremental, inputs: &PassInputs, now: Timestamp) {
    for _ in 0..10 {
        let pass = inc.pass(inputs, now);
        if pass.planned.is_empty() {
            return;
        }
        write_back_all(views, inc, &pass.planned);
    }
}

/// Writes back every plan of `planned`, as the apply step would.
fn write_back_all(views: &mut [NodeView], inc: &mut Incremental, planned: &[String]) {
    for n in planned {
        let Some(j) = n.strip_prefix("gpu-node-").and_then(|i| i.parse::<usize>().ok()) else {
            continue;
        };
        let p = inc.plan(n).unwrap().clone();
        if write_back(&mut views[j], &p) {
            inc.upsert(views[j].clone());
        }
    }
}

fn percentile(mut v: Vec<Duration>, p: usize) -> Duration {
    v.sort();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

struct Figures {
    nodes: usize,
    changes: usize,
    median: Duration,
    p99: Duration,
    planned_per_change: f64,
    full: Duration,
}

fn measure(nodes: usize, changes: usize, full_runs: usize) -> Figures {
    let policy = policy();
    let mut now: Timestamp = "2026-12-06T12:00:00Z".parse().unwrap();
    let inputs = PassInputs::default();
    let name = |i: usize| format!("gpu-node-{i:06}");
    let mut views: Vec<NodeView> = (0..nodes)
        .map(|i| NodeView::new(&name(i), verdict(i.is_multiple_of(20))))
        .collect();
    let mut inc = Incremental::new("bench", policy.clone());
    for v in &views {
        inc.upsert(v.clone());
    }
    settle(&mut views, &mut inc, &inputs, now);
    let mut times = Vec::with_capacity(changes);
    let mut planned = 0usize;
    for k in 0..changes {
        // A healthy node breaks, then mends (two changes, each with its write-back).
        let i = (k / 2 * 7919 + 1) % nodes;
        let i = if i.is_multiple_of(20) { (i + 1) % nodes } else { i };
        // What time alone changes (a mended node's healthyFor) is planned first, on its own,
        // and what was written is read back: the fleet is quiet before each change.
        now += SignedDuration::from_secs(2);
        settle(&mut views, &mut inc, &inputs, now);
        views[i].verdict = verdict(k % 2 == 0);
        let t = Instant::now();
        inc.upsert(views[i].clone());
        let pass = inc.pass(&inputs, now);
        times.push(t.elapsed());
        planned += pass.planned.len();
        write_back_all(&mut views, &mut inc, &pass.planned);
    }
    let full: Vec<Duration> = (0..full_runs)
        .map(|_| {
            let t = Instant::now();
            let p = plan("bench", &policy, &views, now);
            let d = t.elapsed();
            assert_eq!(p.nodes.len(), nodes);
            d
        })
        .collect();
    Figures {
        nodes,
        changes,
        median: percentile(times.clone(), 50),
        p99: percentile(times, 99),
        planned_per_change: planned as f64 / changes as f64,
        full: percentile(full, 50),
    }
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let sizes: &[(usize, usize, usize)] = if bench {
        &[
            (100, 2_000, 21),
            (1_000, 2_000, 21),
            (5_000, 2_000, 11),
            (100_000, 1_000, 3),
        ]
    } else {
        &[(20, 40, 1), (200, 40, 1)]
    };
    let figures: Vec<Figures> = sizes.iter().map(|(n, c, f)| measure(*n, *c, *f)).collect();
    println!("nodes     changes  incremental median   p99        nodes planned/change  full pass median");
    for f in &figures {
        println!(
            "{:>7}  {:>7}  {:>18?}  {:>10?}  {:>20.2}  {:>16?}",
            f.nodes, f.changes, f.median, f.p99, f.planned_per_change, f.full
        );
        // A change of one healthy node of a quiet fleet plans that node alone.
        assert!(
            f.planned_per_change <= 1.0 + f64::EPSILON,
            "{} nodes planned per change at {} nodes",
            f.planned_per_change,
            f.nodes
        );
    }
    if let (Some(small), Some(large)) = (figures.first(), figures.last()) {
        println!(
            "median per change at {} nodes / at {} nodes: {:.2}x",
            large.nodes,
            small.nodes,
            large.median.as_secs_f64() / small.median.as_secs_f64()
        );
    }
}
