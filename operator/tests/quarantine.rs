//! Per-GPU quarantine in the planner: one bad GPU takes away one GPU, not the node; the node's
//! rules take over only on escalation; the budget counts a node once; recovery undoes it after
//! `healthyFor`. Driven through the same apply-back loop as tests/plan.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use gpunode_crds::{DriftClass, GpuNodePolicySpec, policy::TaintEffect};
use gpunode_operator::{
    plan::{
        Action, Block, ChangeCause, DeviceRef, Escalation, GpuPods, GpuView, NodeDevices, NodePlan, NodeView,
        PodRef, QuarantineTarget,
    },
    reasons::Reason,
    verdict::{Drift, Verdict},
};
use jiff::{SignedDuration, Timestamp};

mod support;
use support::{of, step};

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_790_000_000).unwrap() + SignedDuration::from_secs(secs)
}

fn policy(yaml: &str) -> GpuNodePolicySpec {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("policy fixture: {e}"))
}

/// Xid and Memory quarantine the GPU at once (NoExecute); Xid, Memory and Driver drain the node.
fn per_gpu() -> GpuNodePolicySpec {
    policy(
        r#"
remediation:
  - {classes: [Xid, Memory], action: TaintDevice, effect: NoExecute}
  - {classes: [Xid, Memory, Driver], action: Drain}
quarantine: {maxGpusPerNode: 2}
disruption:
  maxUnavailable: 1
  circuitBreaker: {maxDriftedPercent: 100}
recovery: {healthyFor: 5m}
"#,
    )
}

fn uuid(i: u32) -> String {
    format!("GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd")
}

fn xid_on(gpus: &[u32]) -> Verdict {
    let drifts = gpus
        .iter()
        .map(|g| Drift {
            class: DriftClass::Xid,
            check: "gpu.fatalXids".to_string(),
            expected: "none".to_string(),
            actual: "79".to_string(),
            gpu: Some(*g),
            device: None,
        })
        .collect();
    Verdict::new(drifts, Vec::new())
}

fn driver_drift() -> Drift {
    Drift {
        class: DriftClass::Driver,
        check: "gpu.driverVersion".to_string(),
        expected: ">=550".to_string(),
        actual: "535.129.03".to_string(),
        gpu: None,
        device: None,
    }
}

fn dra_devices(node: &str, gpus: u32) -> NodeDevices {
    NodeDevices::Dra(
        (0..gpus)
            .map(|i| {
                (
                    uuid(i),
                    DeviceRef {
                        driver: "gpu.nvidia.com".to_string(),
                        pool: node.to_string(),
                        device: format!("gpu-{i}"),
                    },
                )
            })
            .collect(),
    )
}

/// An 8-GPU DRA node, compliant.
fn node(name: &str) -> NodeView {
    let gpus = (0..8)
        .map(|i| GpuView {
            index: i,
            uuid: Some(uuid(i)),
            recovery_action: None,
        })
        .collect::<Vec<_>>();
    NodeView::new(name, Verdict::new(Vec::new(), Vec::new())).with_gpus(gpus, dra_devices(name, 8))
}

fn quarantined(np: &NodePlan) -> Vec<(u32, TaintEffect)> {
    np.actions
        .iter()
        .filter_map(|a| match a {
            Action::TaintDevice(t) => Some((t.index, t.effect)),
            _ => None,
        })
        .collect()
}

fn reasons(np: &NodePlan) -> Vec<Reason> {
    np.events.iter().map(|e| e.reason).collect()
}

#[test]
fn one_bad_gpu_is_quarantined_alone_and_the_node_stays_in_service() {
    let policy = per_gpu();
    let mut nodes = vec![node("n1")];
    nodes[0].verdict = xid_on(&[5]);
    let p = step(&policy, &mut nodes, at(0));
    let n1 = of(&p, "n1");
    assert_eq!(quarantined(n1), [(5, TaintEffect::NoExecute)]);
    assert_eq!(
        n1.cordon, None,
        "the node's Drain rule does not act on a GPU-handled class"
    );
    assert!(!n1.actions.contains(&Action::Drain));
    assert_eq!(n1.healthy_gpus, Some(7));
    assert_eq!(n1.escalation, None);
    assert_eq!(
        n1.quarantines[0].target,
        QuarantineTarget::Dra(DeviceRef {
            driver: "gpu.nvidia.com".to_string(),
            pool: "n1".to_string(),
            device: "gpu-5".to_string(),
        }),
        "matched on the UUID, found in the node's ResourceSlices"
    );
    assert!(reasons(n1).contains(&Reason::GpuQuarantined));
    // The condition and the event name the GPU by index and UUID, and its device.
    assert!(
        n1.condition.message.contains(&format!(
            "gpu 5 ({}) NoExecute on device gpu.nvidia.com/n1/gpu-5",
            uuid(5)
        )),
        "{}",
        n1.condition.message
    );
    assert!(
        n1.events.iter().any(|e| e.note
            == format!(
                "quarantined gpu 5 ({}) on device gpu.nvidia.com/n1/gpu-5 with effect NoExecute",
                uuid(5)
            )),
        "{:?}",
        n1.events
    );
    assert_eq!(
        p.budget_in_use, 1,
        "a NoExecute quarantine counts against the budget"
    );
    // Bookkeeping: the GPU is tracked by UUID, and a second pass changes nothing.
    assert_eq!(
        nodes[0].markers.gpus[&uuid(5)].quarantined,
        Some(TaintEffect::NoExecute)
    );
    let again = step(&policy, &mut nodes, at(10));
    assert!(
        of(&again, "n1").events.is_empty(),
        "{:?}",
        of(&again, "n1").events
    );
    assert_eq!(quarantined(of(&again, "n1")), [(5, TaintEffect::NoExecute)]);
}

#[test]
fn a_quarantine_waits_for_after_and_the_plan_says_when() {
    let policy = policy(
        r#"
remediation:
  - {classes: [Xid], action: TaintDevice, effect: NoSchedule, after: 1m}
recovery: {healthyFor: 5m}
"#,
    );
    let mut nodes = vec![node("n1")];
    nodes[0].verdict = xid_on(&[3]);
    let p = step(&policy, &mut nodes, at(0));
    let n1 = of(&p, "n1");
    assert!(quarantined(n1).is_empty());
    let next = n1.next_change.unwrap();
    assert_eq!(next.at, at(60));
    assert_eq!(
        next.cause,
        ChangeCause::GpuRuleAfter {
            gpu: 3,
            class: DriftClass::Xid
        }
    );
    assert_eq!(
        n1.healthy_gpus,
        Some(7),
        "a drifting GPU is not healthy, quarantined or not"
    );
    let p = step(&policy, &mut nodes, at(60));
    assert_eq!(quarantined(of(&p, "n1")), [(3, TaintEffect::NoSchedule)]);
}

#[test]
fn recovery_lifts_the_quarantine_after_healthy_for_and_not_before() {
    let policy = per_gpu();
    let mut nodes = vec![node("n1")];
    nodes[0].verdict = xid_on(&[5]);
    step(&policy, &mut nodes, at(0));
    nodes[0].verdict = Verdict::new(Vec::new(), Vec::new());
    let p = step(&policy, &mut nodes, at(100));
    let n1 = of(&p, "n1");
    assert_eq!(
        quarantined(n1),
        [(5, TaintEffect::NoExecute)],
        "held through healthyFor"
    );
    assert_eq!(n1.healthy_gpus, Some(7));
    assert_eq!(
        n1.next_change.map(|c| c.at),
        Some(at(400)),
        "healthyFor after the clear"
    );
    // A flap within healthyFor keeps the quarantine and its start.
    nodes[0].verdict = xid_on(&[5]);
    let p = step(&policy, &mut nodes, at(200));
    let flap = reasons(of(&p, "n1"));
    assert!(
        !flap.contains(&Reason::GpuQuarantined) && !flap.contains(&Reason::GpuReleased),
        "{flap:?}"
    );
    nodes[0].verdict = Verdict::new(Vec::new(), Vec::new());
    step(&policy, &mut nodes, at(250));
    let p = step(&policy, &mut nodes, at(250 + 299));
    assert_eq!(quarantined(of(&p, "n1")).len(), 1);
    let p = step(&policy, &mut nodes, at(250 + 300));
    let n1 = of(&p, "n1");
    assert!(quarantined(n1).is_empty());
    assert!(reasons(n1).contains(&Reason::GpuReleased));
    assert_eq!(n1.healthy_gpus, Some(8));
    assert!(nodes[0].markers.gpus.is_empty(), "nothing left to track");
    assert_eq!(p.budget_in_use, 1, "the undo frees its slot once written");
    let p = step(&policy, &mut nodes, at(600));
    assert_eq!(p.budget_in_use, 0);
}

#[test]
fn more_bad_gpus_than_allowed_escalate_to_the_node_rules() {
    let policy = per_gpu();
    let mut nodes = vec![node("n1")];
    nodes[0].verdict = xid_on(&[1, 2]);
    let p = step(&policy, &mut nodes, at(0));
    assert_eq!(quarantined(of(&p, "n1")).len(), 2);
    assert_eq!(
        of(&p, "n1").cordon,
        None,
        "two of maxGpusPerNode 2: still per GPU"
    );
    nodes[0].verdict = xid_on(&[1, 2, 6]);
    let p = step(&policy, &mut nodes, at(10));
    let n1 = of(&p, "n1");
    assert_eq!(
        n1.escalation,
        Some(Escalation::TooMany {
            due: vec![1, 2, 6],
            max: 2
        })
    );
    assert_eq!(n1.cordon, Some(true), "the node's Drain rule acts");
    assert!(n1.actions.contains(&Action::Drain));
    assert_eq!(
        quarantined(n1).len(),
        3,
        "the GPUs stay quarantined under the drain"
    );
    assert!(reasons(n1).contains(&Reason::Escalated));
    assert_eq!(p.budget_in_use, 1, "a node counts once, however many of its GPUs");
    let again = step(&policy, &mut nodes, at(20));
    assert!(
        !reasons(of(&again, "n1")).contains(&Reason::Escalated),
        "the escalation is announced once"
    );
}

#[test]
fn a_gpu_whose_device_is_not_published_is_reported_and_escalated_never_guessed() {
    let policy = per_gpu();
    let mut nodes = vec![node("n1")];
    // The node's ResourceSlices list GPUs 0-3 only.
    nodes[0].devices = dra_devices("n1", 4);
    nodes[0].verdict = xid_on(&[5]);
    let p = step(&policy, &mut nodes, at(0));
    let n1 = of(&p, "n1");
    assert!(quarantined(n1).is_empty(), "no device is guessed for gpu 5");
    match &n1.escalation {
        Some(Escalation::NotQuarantinable { index: 5, why }) => {
            assert!(why.contains(&uuid(5)) && why.contains("gpu.nvidia.com"), "{why}")
        }
        other => panic!("expected gpu 5 not quarantinable, got {other:?}"),
    }
    assert!(
        n1.actions.contains(&Action::Drain),
        "the node's rules act instead"
    );
    assert!(
        n1.condition.message.contains("cannot be quarantined on its own"),
        "{}",
        n1.condition.message
    );

    // A GPU the probe reports without a UUID cannot be matched either.
    let mut nodes = vec![node("n2")];
    let mut gpus = nodes[0].gpus.to_vec();
    gpus[2].uuid = None;
    nodes[0].gpus = gpus.into();
    nodes[0].verdict = xid_on(&[2]);
    let p = step(&policy, &mut nodes, at(0));
    assert!(matches!(
        of(&p, "n2").escalation,
        Some(Escalation::NotQuarantinable { index: 2, .. })
    ));
}

#[test]
fn node_scoped_classes_still_go_to_the_node_rules() {
    let policy = per_gpu();
    let mut nodes = vec![node("n1")];
    let mut drifts = xid_on(&[5]).drifts;
    drifts.push(driver_drift());
    nodes[0].verdict = Verdict::new(drifts, Vec::new());
    let p = step(&policy, &mut nodes, at(0));
    let n1 = of(&p, "n1");
    assert!(n1.actions.contains(&Action::Drain), "Driver drains the node");
    assert_eq!(quarantined(n1), [(5, TaintEffect::NoExecute)]);
    assert_eq!(n1.escalation, None);
}

#[test]
fn the_budget_gates_disruptive_quarantines_and_never_effect_none() {
    let policy = per_gpu();
    let mut nodes = vec![node("a"), node("b")];
    nodes[0].verdict = xid_on(&[0]);
    nodes[1].verdict = xid_on(&[4]);
    let p = step(&policy, &mut nodes, at(0));
    assert_eq!(quarantined(of(&p, "a")), [(0, TaintEffect::NoExecute)]);
    let b = of(&p, "b");
    assert!(quarantined(b).is_empty());
    assert_eq!(b.blocked, Some(Block::Budget));
    assert_eq!(b.pending.len(), 1);
    assert!(
        b.pending[0]
            .describe()
            .starts_with("TaintDevice NoExecute (gpu 4"),
        "{:?}",
        b.pending
    );

    let marking = policy_with(
        "- {classes: [Xid], action: TaintDevice, effect: None}",
        "maxUnavailable: 0",
    );
    let mut nodes = vec![node("a"), node("b")];
    nodes[0].verdict = xid_on(&[0]);
    nodes[1].verdict = xid_on(&[4]);
    let p = step(&marking, &mut nodes, at(0));
    assert_eq!(quarantined(of(&p, "a")), [(0, TaintEffect::None)]);
    assert_eq!(
        quarantined(of(&p, "b")),
        [(4, TaintEffect::None)],
        "None only marks: never limited"
    );
    assert_eq!(p.budget_in_use, 0);
}

fn policy_with(rule: &str, disruption: &str) -> GpuNodePolicySpec {
    policy(&format!(
        "remediation:\n  {rule}\ndisruption:\n  {disruption}\n  circuitBreaker: {{maxDriftedPercent: 100}}\n"
    ))
}

#[test]
fn dry_run_lists_the_quarantine_and_pause_stops_it() {
    let mut dry = per_gpu();
    dry.dry_run = true;
    let mut nodes = vec![node("n1")];
    nodes[0].verdict = xid_on(&[5]);
    let p = step(&dry, &mut nodes, at(0));
    let n1 = of(&p, "n1");
    assert!(quarantined(n1).is_empty());
    assert_eq!(n1.blocked, Some(Block::DryRun));
    assert!(
        n1.pending
            .iter()
            .any(|a| matches!(a, Action::TaintDevice(t) if t.index == 5))
    );
    assert!(n1.quarantines.is_empty());

    let mut paused = per_gpu();
    paused.paused = true;
    let mut nodes = vec![node("n1")];
    nodes[0].verdict = xid_on(&[5]);
    let p = step(&paused, &mut nodes, at(0));
    assert!(!of(&p, "n1").write);
    assert!(quarantined(of(&p, "n1")).is_empty());
}

#[test]
fn the_strongest_effect_wins_as_rules_fire() {
    let policy = policy(
        r#"
remediation:
  - {classes: [Xid], action: TaintDevice, effect: NoSchedule}
  - {classes: [Xid], action: TaintDevice, effect: NoExecute, after: 2m}
disruption: {maxUnavailable: 1}
"#,
    );
    let mut nodes = vec![node("n1")];
    nodes[0].verdict = xid_on(&[5]);
    let p = step(&policy, &mut nodes, at(0));
    assert_eq!(quarantined(of(&p, "n1")), [(5, TaintEffect::NoSchedule)]);
    let p = step(&policy, &mut nodes, at(120));
    let n1 = of(&p, "n1");
    assert_eq!(quarantined(n1), [(5, TaintEffect::NoExecute)]);
    assert!(
        reasons(n1).contains(&Reason::GpuQuarantined),
        "the new effect is announced"
    );
    assert_eq!(p.budget_in_use, 1);
}

#[test]
fn on_a_device_plugin_node_only_noexecute_evicts_the_pods_holding_the_gpu() {
    let pods = |names: &[&str]| -> Vec<PodRef> {
        names
            .iter()
            .map(|n| PodRef {
                namespace: "train".to_string(),
                name: (*n).to_string(),
            })
            .collect()
    };
    let devices = NodeDevices::DevicePlugin(Some(GpuPods::new(BTreeMap::from([
        (uuid(5), pods(&["job-5"])),
        (uuid(6), pods(&["job-6"])),
        (uuid(7), pods(&[])),
    ]))));
    let mut nodes = vec![node("n1")];
    nodes[0].devices = devices.clone();
    nodes[0].verdict = xid_on(&[5]);
    let p = step(&per_gpu(), &mut nodes, at(0));
    assert_eq!(
        of(&p, "n1").quarantines[0].target,
        QuarantineTarget::DevicePlugin {
            evict: pods(&["job-5"]),
            observed_at: None,
        },
        "only the pod on gpu 5"
    );

    let marking = policy_with(
        "- {classes: [Xid], action: TaintDevice, effect: NoSchedule}",
        "maxUnavailable: 1",
    );
    let mut nodes = vec![node("n1")];
    nodes[0].devices = devices;
    nodes[0].verdict = xid_on(&[5]);
    let p = step(&marking, &mut nodes, at(0));
    assert_eq!(
        of(&p, "n1").quarantines[0].target,
        QuarantineTarget::DevicePlugin {
            evict: Vec::new(),
            observed_at: None,
        }
    );

    // Without the pods in the report, NoExecute cannot be done to one GPU: the node's rules act.
    // The same when the report lists pods for other GPUs but not for this one.
    let partial =
        NodeDevices::DevicePlugin(Some(GpuPods::new(BTreeMap::from([(uuid(6), pods(&["job-6"]))]))));
    for devices in [NodeDevices::DevicePlugin(None), partial] {
        let mut nodes = vec![node("n1")];
        nodes[0].devices = devices;
        nodes[0].verdict = xid_on(&[5]);
        let p = step(&per_gpu(), &mut nodes, at(0));
        let n1 = of(&p, "n1");
        assert!(matches!(
            n1.escalation,
            Some(Escalation::NotQuarantinable { index: 5, .. })
        ));
        assert!(n1.actions.contains(&Action::Drain));
        assert!(quarantined(n1).is_empty());
    }

    // A GPU nobody holds is quarantined with nothing to evict.
    let mut nodes = vec![node("n1")];
    nodes[0].devices = NodeDevices::DevicePlugin(Some(GpuPods::new(BTreeMap::from([(uuid(7), pods(&[]))]))));
    nodes[0].verdict = xid_on(&[7]);
    let p = step(&per_gpu(), &mut nodes, at(0));
    let n1 = of(&p, "n1");
    assert_eq!(n1.escalation, None);
    assert_eq!(
        n1.quarantines[0].target,
        QuarantineTarget::DevicePlugin {
            evict: Vec::new(),
            observed_at: None,
        }
    );
}

#[test]
fn a_policy_without_taint_device_rules_plans_exactly_as_before() {
    let policy = policy(
        r#"
remediation:
  - {classes: [Xid], action: Drain}
disruption: {maxUnavailable: 1}
"#,
    );
    let mut nodes = vec![node("n1")];
    nodes[0].verdict = xid_on(&[5]);
    let p = step(&policy, &mut nodes, at(0));
    let n1 = of(&p, "n1");
    assert!(n1.actions.contains(&Action::Drain));
    assert!(quarantined(n1).is_empty() && n1.quarantines.is_empty());
    assert!(nodes[0].markers.gpus.is_empty(), "no per-GPU bookkeeping");
    assert_eq!(n1.escalation, None);
}

#[test]
fn a_gpu_that_clears_while_another_drifts_says_when_its_quarantine_lifts() {
    let policy = per_gpu();
    let mut nodes = vec![node("n1")];
    nodes[0].verdict = xid_on(&[5, 6]);
    step(&policy, &mut nodes, at(0));
    nodes[0].verdict = xid_on(&[6]);
    let p = step(&policy, &mut nodes, at(100));
    let n1 = of(&p, "n1");
    assert_eq!(quarantined(n1).len(), 2);
    assert_eq!(
        n1.next_change.map(|c| (c.at, c.cause)),
        Some((
            at(400),
            ChangeCause::GpuHealthyFor {
                gpu: 5,
                class: DriftClass::Xid
            }
        )),
        "the node's Xid is still active (gpu 6): only gpu 5's clock runs"
    );
    let p = step(&policy, &mut nodes, at(400));
    assert_eq!(quarantined(of(&p, "n1")), [(6, TaintEffect::NoExecute)]);
}
