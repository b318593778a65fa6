//! The incremental pass equals the full pass: over random sequences of events (verdicts that
//! drift and recover, plans written back or not, time passing, people cordoning, uncordoning,
//! approving and skipping, nodes coming and going, validation Jobs and repair objects finishing,
//! the status recording the breaker, a person closing it, the fleet cap moving), after every
//! event `Incremental::to_policy_plan` equals `plan_with` over the same views and inputs, for
//! policies that use the budget, the breaker (latched and automatic), validations (periodic
//! ones too), repair steps, maintenance windows, approvals, per-GPU quarantine (DRA and device
//! plugin nodes) and dry run. Seeded; more cases with
//! `PROPTEST_CASES`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use gpunode_operator::{
    plan::{
        DeviceRef, DrainStep, Fleet, GpuPods, GpuView, JobState, NodeDevices, NodeView, PassInputs, PodRef,
        PolicyPlan, StepObject, incremental::Incremental, plan_with,
    },
    verdict::{Drift, Unknown, Verdict},
};
use jiff::{SignedDuration, Timestamp};
use proptest::{prelude::*, test_runner::RngAlgorithm};

const SEED: [u8; 32] = *b"gpunode-incremental-plan-seed-01";

const TEMPLATE: &str = r#"{metadata: {labels: {app: diag}}, spec: {containers: [{name: diag, image: "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04", command: [dcgmi, diag, -r, "2"]}]}}"#;

const REPAIR: &str = r#"repair:
  steps:
    - name: reboot
      action: Remediator
      classes: [Xid, Validation]
      timeout: 10m
      remediator: {apiVersion: remediation.example.com/v1, kind: RebootTemplate, name: reboot, namespace: ops}"#;

fn policies() -> Vec<GpuNodePolicySpec> {
    let yaml = [
        // The budget and a latched breaker.
        r#"
remediation:
  - {classes: [Throttle, Thermal], action: Taint, effect: NoSchedule, after: 30s}
  - {classes: [Memory, Xid], action: Drain}
  - {classes: [Driver], action: Cordon, after: 60s}
disruption:
  maxUnavailable: 2
  circuitBreaker: {maxDriftedPercent: 30, window: 10m}
recovery: {healthyFor: 2m}
"#
        .to_string(),
        // Validations (periodic too), repair, an automatic breaker, a percentage budget.
        format!(
            r#"
remediation:
  - {{classes: [Xid, Driver], action: Drain}}
  - {{classes: [Throttle], action: Taint, effect: NoSchedule}}
disruption:
  maxUnavailable: 30%
  circuitBreaker: {{maxDriftedPercent: 50, window: 5m, reset: Automatic}}
recovery: {{healthyFor: 60s}}
validation:
  namespace: gpu-validation
  timeout: 10m
  maxConcurrent: 1
  periodic: {{every: 1h, maxPerHour: 2}}
  template: {TEMPLATE}
{REPAIR}
"#
        ),
        // Maintenance windows, an urgent class, approval.
        r#"
remediation:
  - {classes: [Driver, Throttle], action: Cordon}
  - {classes: [Driver, Xid], action: Drain, requireApproval: true}
disruption:
  maxUnavailable: 1
  circuitBreaker: {maxDriftedPercent: 100}
recovery: {healthyFor: 60s}
maintenance:
  windows:
    - {days: [Mon, Tue, Wed, Thu, Fri, Sat, Sun], start: "12:10", end: "12:40", timeZone: UTC}
  urgentClasses: [Xid]
"#
        .to_string(),
        // Per-GPU quarantine, escalating to the node's drain.
        r#"
remediation:
  - {classes: [Xid, Memory], action: TaintDevice, effect: NoExecute}
  - {classes: [Xid, Memory, Driver], action: Drain}
quarantine: {maxGpusPerNode: 2}
disruption:
  maxUnavailable: 2
  circuitBreaker: {maxDriftedPercent: 40, window: 10m}
recovery: {healthyFor: 90s}
"#
        .to_string(),
        // Dry run.
        r#"
dryRun: true
remediation:
  - {classes: [Xid, Driver], action: Drain}
disruption:
  maxUnavailable: 1
recovery: {healthyFor: 60s}
"#
        .to_string(),
    ];
    yaml.iter()
        .map(|y| serde_yaml::from_str(y).unwrap_or_else(|e| panic!("policy fixture: {e}\n{y}")))
        .collect()
}

fn t0() -> Timestamp {
    // 12:00 UTC: the windows of the third policy open ten minutes later.
    "2026-12-02T12:00:00Z".parse().unwrap()
}

const CLASSES: [DriftClass; 5] = [
    DriftClass::Xid,
    DriftClass::Throttle,
    DriftClass::Driver,
    DriftClass::Memory,
    DriftClass::Thermal,
];

fn verdict(v: u8) -> Verdict {
    match v {
        0..=5 => Verdict::new(Vec::new(), Vec::new()),
        6 => Verdict::new(
            Vec::new(),
            vec![Unknown {
                check: "report".to_string(),
                reason: "report is 10m old (staleAfter 3m)".to_string(),
                gpu: None,
            }],
        ),
        _ => {
            let class = CLASSES[usize::from(v) % CLASSES.len()];
            Verdict::new(
                vec![Drift {
                    class,
                    check: format!("check.{}", class.label()),
                    expected: "ok".to_string(),
                    actual: "bad".to_string(),
                    gpu: (!v.is_multiple_of(3)).then_some(u32::from(v) % 4),
                    device: None,
                }],
                Vec::new(),
            )
        }
    }
}

/// Something that happens to the policy's nodes or inputs.
#[derive(Clone, Debug)]
enum Event {
    Verdict(usize, u8),
    /// The node's last plan is written back (as the apply step would).
    Apply(usize),
    ApplyAll,
    Advance(i64),
    PersonCordon(usize, bool),
    Skip(usize, bool),
    Conflict(usize, bool),
    Approve(usize, bool),
    Remove(usize),
    Add(usize),
    Job(usize, u8),
    Repair(usize, u8),
    /// The status records where the breaker stands.
    StatusBack,
    /// A person closes the open breaker.
    CloseBreaker,
    Fleet(Option<(u32, u8)>),
}

fn event(nodes: usize) -> impl Strategy<Value = Event> {
    let i = 0..nodes;
    prop_oneof![
        6 => (i.clone(), 0u8..14).prop_map(|(i, v)| Event::Verdict(i, v)),
        4 => i.clone().prop_map(Event::Apply),
        4 => Just(Event::ApplyAll),
        5 => prop_oneof![Just(1i64), Just(20), Just(31), Just(61), Just(130), Just(400), Just(700), Just(3700)]
            .prop_map(Event::Advance),
        1 => (i.clone(), any::<bool>()).prop_map(|(i, b)| Event::PersonCordon(i, b)),
        1 => (i.clone(), any::<bool>()).prop_map(|(i, b)| Event::Skip(i, b)),
        1 => (i.clone(), any::<bool>()).prop_map(|(i, b)| Event::Conflict(i, b)),
        1 => (i.clone(), any::<bool>()).prop_map(|(i, b)| Event::Approve(i, b)),
        1 => i.clone().prop_map(Event::Remove),
        1 => i.clone().prop_map(Event::Add),
        2 => (i.clone(), 0u8..5).prop_map(|(i, s)| Event::Job(i, s)),
        2 => (i, 0u8..5).prop_map(|(i, s)| Event::Repair(i, s)),
        2 => Just(Event::StatusBack),
        1 => Just(Event::CloseBreaker),
        1 => proptest::option::of((0u32..6, any::<u8>())).prop_map(Event::Fleet),
    ]
}

/// The nodes, the inputs, the time and the incremental planner, moved by events.
struct World {
    policy: GpuNodePolicySpec,
    all: usize,
    views: BTreeMap<String, NodeView>,
    inputs: PassInputs,
    now: Timestamp,
    inc: Incremental,
    last: Option<PolicyPlan>,
}

fn name(i: usize) -> String {
    format!("gpu-{i:02}")
}

fn uuid(i: u32) -> String {
    format!("GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd")
}

/// Node `i` with four GPUs: DRA devices on even nodes, the device plugin with a pod per GPU on
/// odd ones.
fn fresh(i: usize, now: Timestamp) -> NodeView {
    let gpus: Vec<GpuView> = (0..4)
        .map(|g| GpuView {
            index: g,
            uuid: Some(uuid(g)),
            recovery_action: None,
        })
        .collect();
    let devices = if i.is_multiple_of(2) {
        NodeDevices::Dra(
            (0..4)
                .map(|g| {
                    let device = DeviceRef {
                        driver: "gpu.nvidia.com".to_string(),
                        pool: name(i),
                        device: format!("gpu-{g}"),
                    };
                    (uuid(g), device)
                })
                .collect(),
        )
    } else {
        NodeDevices::DevicePlugin(Some(GpuPods::new(
            (0..4)
                .map(|g| {
                    let pod = PodRef {
                        namespace: "training".to_string(),
                        name: format!("trainer-{i}-{g}"),
                    };
                    (uuid(g), vec![pod])
                })
                .collect(),
        )))
    };
    NodeView::new(&name(i), verdict(0))
        .heard_at(Some(now))
        .with_gpus(gpus, devices)
}

impl World {
    fn new(policy: GpuNodePolicySpec, nodes: usize) -> World {
        let mut inc = Incremental::new("first", policy.clone());
        let mut views = BTreeMap::new();
        for i in 0..nodes {
            let v = fresh(i, t0());
            inc.upsert(v.clone());
            views.insert(name(i), v);
        }
        World {
            policy,
            all: nodes,
            views,
            inputs: PassInputs::default(),
            now: t0(),
            inc,
            last: None,
        }
    }

    /// Applies `e`; returns the nodes whose view changed.
    fn apply(&mut self, e: &Event) -> Vec<String> {
        let now = self.now;
        let mut changed = Vec::new();
        let mut edit =
            |views: &mut BTreeMap<String, NodeView>, i: usize, f: &mut dyn FnMut(&mut NodeView)| {
                if let Some(v) = views.get_mut(&name(i)) {
                    f(v);
                    changed.push(name(i));
                }
            };
        match e {
            Event::Verdict(i, v) => edit(&mut self.views, *i, &mut |n| {
                n.verdict = verdict(*v);
                n.last_heard = Some(now);
            }),
            Event::Apply(i) => {
                if let Some(p) = self.inc.plan(&name(*i)).cloned() {
                    edit(&mut self.views, *i, &mut |n| write_back(n, &p, now));
                }
            }
            Event::ApplyAll => {
                let plans: Vec<_> = self.last.iter().flat_map(|p| p.nodes.clone()).collect();
                for p in plans {
                    if let Some(n) = self.views.get_mut(&p.node) {
                        write_back(n, &p, now);
                        changed.push(p.node.clone());
                    }
                }
            }
            Event::Advance(s) => self.now = now + SignedDuration::from_secs(*s),
            Event::PersonCordon(i, b) => edit(&mut self.views, *i, &mut |n| n.unschedulable = *b),
            Event::Skip(i, b) => edit(&mut self.views, *i, &mut |n| n.skip = *b),
            Event::Conflict(i, b) => edit(&mut self.views, *i, &mut |n| {
                n.conflicts = if *b { vec!["other".to_string()] } else { Vec::new() };
            }),
            Event::Approve(i, b) => edit(&mut self.views, *i, &mut |n| {
                n.approved = if *b {
                    ["Cordon", "Drain", "Taint", "reboot"].map(str::to_string).into()
                } else {
                    BTreeSet::new()
                };
            }),
            Event::Remove(i) => {
                if self.views.remove(&name(*i)).is_some() {
                    self.inc.remove(&name(*i));
                }
            }
            Event::Add(i) => {
                if let std::collections::btree_map::Entry::Vacant(e) = self.views.entry(name(*i)) {
                    e.insert(fresh(*i, now));
                    changed.push(name(*i));
                }
            }
            Event::Job(i, s) => edit(&mut self.views, *i, &mut |n| {
                n.validation_job = match s {
                    0 => None,
                    1 => Some(JobState::Running),
                    2 => Some(JobState::Passed),
                    3 => Some(JobState::Failed("BackoffLimitExceeded: diag failed".to_string())),
                    _ => Some(JobState::Absent),
                };
            }),
            Event::Repair(i, s) => edit(&mut self.views, *i, &mut |n| {
                n.repair_object = match s {
                    0 => None,
                    1 => Some(StepObject::Running),
                    2 => Some(StepObject::Succeeded(Some(now))),
                    3 => Some(StepObject::Failed("reboot failed".to_string())),
                    _ => Some(StepObject::Absent),
                };
            }),
            Event::StatusBack => {
                if let Some(p) = &self.last {
                    self.inputs.breaker = p.breaker.clone();
                }
            }
            Event::CloseBreaker => self.inputs.close_breaker = self.inputs.breaker.opened_at,
            Event::Fleet(f) => {
                self.inputs.fleet = f.map(|(allowed, mask)| Fleet {
                    allowed,
                    unavailable: Arc::new(
                        (0..self.all)
                            .filter(|i| mask & (1 << (i % 8)) != 0)
                            .map(name)
                            .collect(),
                    ),
                });
            }
        }
        changed
    }
}

/// Writes node plan `p` onto `n` as the apply step would: labels, taints, cordon, bookkeeping;
/// a drain that runs finds nothing left to evict; a repair object made is recorded as made.
fn write_back(n: &mut NodeView, p: &gpunode_operator::plan::NodePlan, now: Timestamp) {
    if !p.write {
        return;
    }
    n.taints = p.taints.clone();
    n.markers = p.markers.clone();
    if let Some(c) = p.cordon {
        n.unschedulable = c;
    }
    n.current_state = Some(p.state);
    n.current_reason = Some(p.condition.reason);
    if matches!(p.drain, DrainStep::Run { .. }) {
        n.markers.drained = Some(now);
    }
    if !p.repair.ensure.is_empty()
        && let Some(s) = n.markers.repair.step.as_mut()
    {
        s.created = true;
    }
}

fn run(policy: usize, nodes: usize, events: &[Event]) -> Result<(u64, u64), TestCaseError> {
    let mut w = World::new(policies().swap_remove(policy), nodes);
    let (mut planned, mut full) = (0u64, 0u64);
    for (k, e) in std::iter::once(None).chain(events.iter().map(Some)).enumerate() {
        if let Some(e) = e {
            for n in w.apply(e) {
                if let Some(v) = w.views.get(&n) {
                    w.inc.upsert(v.clone());
                }
            }
        }
        let pass = w.inc.pass(&w.inputs, w.now);
        planned += pass.planned.len() as u64;
        full += w.views.len() as u64;
        let got = w.inc.to_policy_plan();
        let views: Vec<NodeView> = w.views.values().cloned().collect();
        let want = plan_with("first", &w.policy, &views, &w.inputs, w.now);
        if got != want {
            let diff: Vec<String> = want
                .nodes
                .iter()
                .zip(&got.nodes)
                .filter(|(a, b)| a != b)
                .map(|(a, b)| format!("full:        {a:?}\nincremental: {b:?}"))
                .take(2)
                .collect();
            return Err(TestCaseError::fail(format!(
                "after event {k} ({:?}) at {}: the incremental plan differs from the full one\n{}\nfull summary: {:?}\nincr summary: {:?}",
                e,
                w.now,
                diff.join("\n"),
                PolicyPlan {
                    nodes: Vec::new(),
                    ..want.clone()
                },
                PolicyPlan {
                    nodes: Vec::new(),
                    ..got.clone()
                },
            )));
        }
        w.last = Some(got);
    }
    Ok((planned, full))
}

fn config() -> ProptestConfig {
    ProptestConfig {
        rng_algorithm: RngAlgorithm::ChaCha,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn cases() -> impl Strategy<Value = (usize, usize, Vec<Event>)> {
    (0..5usize, 2..12usize)
        .prop_flat_map(|(p, n)| (Just(p), Just(n), proptest::collection::vec(event(n), 1..60)))
}

#[test]
fn the_incremental_plan_equals_the_full_plan_after_every_event() {
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        config(),
        proptest::test_runner::TestRng::from_seed(RngAlgorithm::ChaCha, &SEED),
    );
    let totals = std::cell::Cell::new((0u64, 0u64));
    let result = runner.run(&cases(), |(p, n, events)| {
        let (a, b) = run(p, n, &events)?;
        let (x, y) = totals.get();
        totals.set((x + a, y + b));
        Ok(())
    });
    let (planned, full) = totals.get();
    if let Err(e) = result {
        panic!("{e}");
    }
    // Not a tautology: the incremental pass planned fewer nodes than a full pass would have.
    assert!(
        planned < full,
        "planned {planned} node plans, a full pass each time {full}"
    );
    eprintln!("node plans made: incremental {planned}, full passes {full}");
}

/// A quiet fleet: a change of one node plans that node alone.
#[test]
fn one_changed_node_of_a_quiet_fleet_is_the_only_one_planned() {
    let mut w = World::new(policies().swap_remove(0), 50);
    let first = w.inc.pass(&w.inputs, w.now);
    assert!(first.whole);
    assert_eq!(first.planned.len(), 50);
    w.now += SignedDuration::from_secs(10);
    let quiet = w.inc.pass(&w.inputs, w.now);
    assert_eq!(
        quiet.planned,
        Vec::<String>::new(),
        "nothing changed, nothing planned"
    );
    for e in [Event::Verdict(7, 9), Event::Advance(1)] {
        for n in w.apply(&e) {
            w.inc.upsert(w.views[&n].clone());
        }
    }
    let one = w.inc.pass(&w.inputs, w.now);
    assert_eq!(one.planned, [name(7)]);
    assert!(!one.whole);
}
