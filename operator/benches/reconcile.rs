//! The steady state at 5,000 nodes: what one report change costs.
//! `cargo bench -p gpunode-operator --bench reconcile` prints medians over 21 runs of:
//!
//! - a reconcile pass (views, plan, and the check of which nodes need a write) after one report
//!   changed: *cold* re-evaluates every node (what every event cost before verdicts were
//!   remembered), *warm* reuses the remembered verdicts and evaluates the changed one (and the
//!   medians of its three steps);
//! - one report heartbeat event (new `observedAt` and temperatures, same verdict): the check
//!   that finds it immaterial, so it triggers no reconcile at all.
//!
//! The nodes already carry what the plan wants, so no pass finds anything to write.

// clippy.toml allows unwrap and expect in #[test] fns only; this bench's helper fns fail
// the same way (a panic naming what broke), so the allow covers the whole crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::Arc, time::Instant};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use gpunode_operator::{
    apply::Applier,
    cache::{GuardedReport, PolicyVerdicts, VerdictCache},
    observe::{CachedReport, Heartbeats, Inputs, SelectorIndex, views},
    plan::plan,
};
use jiff::Timestamp;
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, NodeCondition, NodeStatus},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, Time},
};
use kube::{
    core::DeserializeGuard,
    runtime::{reflector, watcher},
};

fn node(name: &str, policy: &str) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.to_string());
    n.metadata.uid = Some(format!("uid-{name}"));
    n.metadata.labels = Some(
        [
            ("kubernetes.io/hostname", name),
            ("nvidia.com/gpu.product", "H100"),
            ("gpunode.dev/policy", policy),
            ("gpunode.dev/state", "compliant"),
            ("gpunode.dev/healthy-gpus", "8"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    n.status = Some(NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "GpuPolicyCompliant".to_string(),
            status: "True".to_string(),
            reason: Some("Compliant".to_string()),
            message: Some("compliant: every check of the policy passed".to_string()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    n
}

fn lease(node: &str, renewed: Timestamp) -> Lease {
    let name = gpunode_crds::heartbeat::lease_name(node).unwrap_or_default();
    let mut l = gpunode_crds::heartbeat::lease(&name, node, None, 180, MicroTime(renewed));
    l.metadata.namespace = Some("gpunode-system".to_string());
    l
}

fn report(base: &GpuNodeReport, name: &str, version: u64, observed: Timestamp) -> GuardedReport {
    let mut r = base.clone();
    r.metadata.name = Some(name.to_string());
    r.metadata.resource_version = Some(version.to_string());
    if let Some(s) = r.status.as_mut() {
        s.observed_at = Some(Time(observed));
        // A heartbeat's temperatures differ a little each time.
        for g in &mut s.gpus {
            g.temperature_celsius = g.temperature_celsius.map(|t| 40 + (t + (version % 5) as i32) % 5);
        }
    }
    DeserializeGuard(Ok(r))
}

fn main() {
    let (node_count, runs) = support::size();
    let mut policy: GpuNodePolicy = support::load("strict-policy.yaml");
    policy.metadata.uid = Some("policy-uid".to_string());
    policy.metadata.generation = Some(1);
    let name = policy.metadata.name.clone().unwrap_or_default();
    let healthy: GpuNodeReport = support::load("healthy-h100-report.yaml");
    let observed: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
    let now: Timestamp = "2026-11-29T12:00:30Z".parse().unwrap();
    let index = SelectorIndex::new(&[Arc::new(DeserializeGuard(Ok(policy.clone())))]);

    let (reports, mut report_writer) = reflector::store::<CachedReport>();
    // Every probe's heartbeat Lease, renewed since its report: each view looks one up.
    let (leases, mut lease_writer) = reflector::store::<Lease>();
    let nodes: Vec<Arc<Node>> = (0..node_count)
        .map(|i| {
            let n = format!("gpu-node-{i:05}");
            report_writer.apply_watcher_event(&watcher::Event::Apply(CachedReport::new(&report(
                &healthy, &n, 1, observed,
            ))));
            lease_writer.apply_watcher_event(&watcher::Event::Apply(lease(&n, observed)));
            Arc::new(node(&n, &name))
        })
        .collect();
    let heartbeats = Heartbeats::new(leases, "gpunode-system");

    let mut version = 1;
    let mut pass = |verdicts: &mut PolicyVerdicts| {
        // One node's report changed since the last pass.
        version += 1;
        let changed = format!("gpu-node-{:05}", version as usize % node_count);
        report_writer.apply_watcher_event(&watcher::Event::Apply(CachedReport::new(&report(
            &healthy, &changed, version, observed,
        ))));
        let t = Instant::now();
        let inputs = Inputs {
            reports: &reports,
            heartbeats: &heartbeats,
            index: &index,
            dra: None,
            repair_objects: Default::default(),
            validation_jobs: Default::default(),
        };
        let v = views(&policy, &nodes, &inputs, verdicts, now);
        let viewed = t.elapsed();
        let plan = plan(&name, &policy.spec, &v, now);
        let planned = t.elapsed();
        let writes = plan
            .nodes
            .iter()
            .zip(&nodes)
            .filter(|(np, n)| Applier::needs_work(&name, np, n))
            .count();
        let checked = t.elapsed();
        (
            [viewed, planned - viewed, checked - planned],
            writes,
            verdicts.stats(),
        )
    };

    let mut cold = Vec::new();
    let mut cold_stats = (0, 0);
    for _ in 0..runs {
        let (steps, writes, stats) = pass(&mut PolicyVerdicts::default());
        assert_eq!(writes, 0, "nodes already as planned");
        cold.push(steps.iter().sum());
        cold_stats = stats;
    }
    let mut warm_verdicts = PolicyVerdicts::default();
    let _ = pass(&mut warm_verdicts);
    let mut warm = Vec::new();
    let mut warm_steps: [Vec<_>; 3] = Default::default();
    let mut warm_stats = (0, 0);
    for _ in 0..runs {
        let (steps, writes, stats) = pass(&mut warm_verdicts);
        assert_eq!(writes, 0, "nodes already as planned");
        warm.push(steps.iter().sum());
        for (all, step) in warm_steps.iter_mut().zip(steps) {
            all.push(step);
        }
        warm_stats = stats;
    }

    // A heartbeat: the cache knows the verdict the last reconcile acted on.
    let cache = VerdictCache::new();
    {
        let pv = cache.policy(&name);
        let mut pv = pv.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let inputs = Inputs {
            reports: &reports,
            heartbeats: &heartbeats,
            index: &index,
            dra: None,
            repair_objects: Default::default(),
            validation_jobs: Default::default(),
        };
        let _ = views(&policy, &nodes, &inputs, &mut pv, now);
    }
    let mut events = Vec::new();
    for i in 0..1_000u64 {
        let n = format!("gpu-node-{:05}", i as usize % node_count);
        let hb = report(&healthy, &n, 100 + i, observed);
        let t = Instant::now();
        let material = cache.report_is_material(&policy, &n, Some(&hb), heartbeats.heard(&n), now);
        events.push(t.elapsed());
        assert!(!material, "a heartbeat is not material");
    }

    println!("nodes: {node_count}, runs: {runs}, one report changed per pass, nothing to write");
    println!(
        "reconcile pass, cold (every verdict evaluated, {} evaluated): median {:?}",
        cold_stats.1,
        support::median(cold)
    );
    println!(
        "reconcile pass, warm ({} reused, {} evaluated):           median {:?}",
        warm_stats.0,
        warm_stats.1,
        support::median(warm)
    );
    let [viewed, planned, checked] = warm_steps.map(support::median);
    println!("  of which views {viewed:?}, plan {planned:?}, check of what to write {checked:?}");
    println!(
        "heartbeat event (immaterial, triggers no reconcile):       median {:?}",
        support::median(events)
    );
}
