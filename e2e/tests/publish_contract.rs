//! The contract between the node-probe's publish decision and the operator (issue #14): when
//! the probe would not publish an observation at once, the operator decides nothing differently
//! on it than on the last published report. Property-tested (seeded, bounded) over report
//! pairs with temperature, power and sensor noise, fabric error counts moving around the
//! example's budgets, threshold-crossing values and discrete faults,
//! under generated cooling policies and the repository's fixture and example policies. Both
//! sides are real code: the probe's pure `gpunode_probe::change::decide` and the operator's
//! `gpunode_operator::evaluate::evaluate_heard` on the report as the API server would hold it.
//!
//! The same property run against the fallback alone (the band heuristic the probe used before it
//! knew the policies) finds counterexamples, so the property can fail; the example
//! (84 -> 86 C under `maxGpuCelsius: 85`, slowdown 97 C) is a fixed regression test.
//! `PROPTEST_CASES` raises the case count.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use gpunode_crds::{
    DriftClass, GpuNodePolicy, GpuNodePolicySpec, GpuNodeReport, ThrottleReason,
    report::{GpuNodeReportStatus, PortErrorRates},
};
use gpunode_operator::{evaluate::evaluate_heard, verdict::Verdict};
use gpunode_probe::change::{ChangeConfig, KnownPolicy, decide};
use gpunode_testkit::{cases, runner};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const SEED: [u8; 32] = *b"gpunode-publish-contract-seed-01";

fn yaml<T: serde::de::DeserializeOwned>(path: &str) -> T {
    let path = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn healthy() -> GpuNodeReport {
    yaml("operator/tests/fixtures/evaluate/healthy-h100-report.yaml")
}

/// The fixture and example policies: every check gpunode has, at realistic settings.
fn fixed_policies() -> Vec<GpuNodePolicySpec> {
    [
        "operator/tests/fixtures/evaluate/strict-policy.yaml",
        "operator/tests/fixtures/evaluate/network-only-policy.yaml",
        "examples/h100-training.yaml",
        "examples/a100-inference.yaml",
        "examples/fabric-only.yaml",
    ]
    .iter()
    .map(|p| yaml::<GpuNodePolicy>(p).spec)
    .collect()
}

/// Everything the operator's plan and status read from a verdict: the state, the drift classes,
/// whether anything is unknown, and which drifts (class, check, GPU, device) and unknown checks
/// (check, GPU) there are. Not the free text of expected/actual values.
type PlanView = (
    String,
    BTreeSet<DriftClass>,
    bool,
    BTreeSet<(DriftClass, String, Option<u32>, Option<String>)>,
    BTreeSet<(String, Option<u32>)>,
);

fn plan_view(v: &Verdict) -> PlanView {
    (
        v.state.to_string(),
        v.classes(),
        v.unknowns.is_empty(),
        v.drifts
            .iter()
            .map(|d| (d.class, d.check.clone(), d.gpu, d.device.clone()))
            .collect(),
        v.unknowns.iter().map(|u| (u.check.clone(), u.gpu)).collect(),
    )
}

/// The operator's verdict on `status` as the stored report, its probe's Lease renewed at `now`
/// (heartbeats keep an unchanged report fresh), evaluated a little later.
fn operator_view(policy: &GpuNodePolicySpec, status: &GpuNodeReportStatus, now: Timestamp) -> PlanView {
    let mut report = healthy();
    report.status = Some(status.clone());
    let later = now + SignedDuration::from_millis(300);
    plan_view(&evaluate_heard(policy, Some(&report), Some(now), later))
}

/// A generated cooling policy: the thresholds a user can set, around the generated values.
fn cooling_policy() -> impl Strategy<Value = GpuNodePolicySpec> {
    (
        proptest::option::of(60i32..100),
        proptest::option::of(0i32..20),
        proptest::option::of(60i32..100),
        proptest::option::of(20i32..80),
        proptest::option::of(500u32..6000),
        any::<bool>(),
    )
        .prop_map(|(max_gpu, margin, max_mem, inlet, fan, throttle)| {
            let mut cooling = serde_json::json!({});
            if let Some(v) = max_gpu {
                cooling["maxGpuCelsius"] = v.into();
            }
            if let Some(v) = margin {
                cooling["minSlowdownMarginCelsius"] = v.into();
            }
            if let Some(v) = max_mem {
                cooling["maxMemoryCelsius"] = v.into();
            }
            if let Some(v) = inlet {
                cooling["sensors"] = serde_json::json!([{ "match": "*", "maxCelsius": v }]);
            }
            if let Some(v) = fan {
                cooling["minFanRpm"] = v.into();
            }
            if throttle {
                cooling["forbiddenThrottleReasons"] = serde_json::json!(["HwSlowdown", "SwThermalSlowdown"]);
            }
            serde_json::from_value(serde_json::json!({ "cooling": cooling })).expect("generated policy")
        })
}

/// Per GPU: temperature, HBM temperature, slowdown threshold, power; and the noise on each.
#[derive(Debug, Clone)]
struct GpuGen {
    temp: i32,
    mem: i32,
    slowdown: i32,
    power: u32,
    d_temp: i32,
    d_mem: i32,
    d_power: i32,
}

fn gpu_gen() -> impl Strategy<Value = GpuGen> {
    (
        60i32..100,
        60i32..100,
        85i32..100,
        100u32..700,
        -3i32..=3,
        -3i32..=3,
        -80i32..=80,
    )
        .prop_map(|(temp, mem, slowdown, power, d_temp, d_mem, d_power)| GpuGen {
            temp,
            mem,
            slowdown,
            power,
            d_temp,
            d_mem,
            d_power,
        })
}

/// Per RDMA port: its error counts over the last hour (flaps, symbol errors, pause storms, NIC
/// drops) in the published report, and how each moved by the next observation (errors arriving
/// and older ones leaving the window), around the fabric example's budgets.
#[derive(Debug, Clone)]
struct PortGen {
    counts: [u64; 4],
    deltas: [i64; 4],
}

fn port_gen() -> impl Strategy<Value = PortGen> {
    (
        (0u64..4, 0u64..1500, 0u64..2, 0u64..12_000),
        (-2i64..=2, -300i64..=300, -1i64..=1, -3000i64..=3000),
    )
        .prop_map(|((a, b, c, d), (da, db, dc, dd))| PortGen {
            counts: [a, b, c, d],
            deltas: [da, db, dc, dd],
        })
}

impl PortGen {
    /// The port's counts, `moved` or not.
    fn rates(&self, moved: bool) -> PortErrorRates {
        let at = |i: usize| {
            let delta = if moved { self.deltas[i] } else { 0 };
            Some(self.counts[i].saturating_add_signed(delta))
        };
        PortErrorRates {
            window_minutes: 60,
            link_downed: at(0),
            symbol_errors: at(1),
            pause_storm_errors: at(2),
            rx_discards: at(3),
            ..PortErrorRates::default()
        }
    }
}

/// A discrete fault in the next observation (or none).
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    Throttle(usize),
    NvlinkDown(usize),
    EccUncorrected(usize),
    FanStopped,
    GpuTemperatureLost(usize),
    NvmlFailed,
    Mtu,
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        6 => Just(Fault::None),
        1 => (0usize..8).prop_map(Fault::Throttle),
        1 => (0usize..8).prop_map(Fault::NvlinkDown),
        1 => (0usize..8).prop_map(Fault::EccUncorrected),
        1 => Just(Fault::FanStopped),
        1 => (0usize..8).prop_map(Fault::GpuTemperatureLost),
        1 => Just(Fault::NvmlFailed),
        1 => Just(Fault::Mtu),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    gpus: Vec<GpuGen>,
    sensor: f64,
    d_sensor: f64,
    fault: Fault,
    policies: Vec<GpuNodePolicySpec>,
    /// One RDMA port whose error counts move (the others report none).
    port: Option<(usize, PortGen)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(gpu_gen(), 8),
        20.0f64..80.0,
        -3.0f64..3.0,
        fault(),
        proptest::collection::vec(cooling_policy(), 1..4),
        proptest::option::weighted(0.3, (0usize..8, port_gen())),
    )
        .prop_map(|(gpus, sensor, d_sensor, fault, policies, port)| Case {
            gpus,
            sensor,
            d_sensor,
            fault,
            policies,
            port,
        })
}

/// (last published, next observed) from the healthy fixture.
fn pair(c: &Case, now: Timestamp) -> (GpuNodeReportStatus, GpuNodeReportStatus) {
    let base = healthy().status.expect("fixture has no status");
    let mut prev = base.clone();
    prev.observed_at = Some(Time(now - SignedDuration::from_mins(7)));
    for (g, x) in prev.gpus.iter_mut().zip(&c.gpus) {
        g.temperature_celsius = Some(x.temp);
        g.memory_temperature_celsius = Some(x.mem);
        g.slowdown_celsius = Some(x.slowdown);
        g.power_watts = Some(x.power);
    }
    if let Some(cooling) = prev.cooling.as_mut() {
        for s in &mut cooling.sensors {
            s.celsius = c.sensor;
        }
    }
    let counts = |r: &mut GpuNodeReportStatus, moved: bool| {
        let Some((i, x)) = &c.port else { return };
        if let Some(d) = r.network.as_mut().and_then(|n| n.rdma_devices.get_mut(*i)) {
            d.error_rates = Some(x.rates(moved));
        }
    };
    counts(&mut prev, false);
    let mut next = prev.clone();
    next.observed_at = Some(Time(now));
    counts(&mut next, true);
    for (g, x) in next.gpus.iter_mut().zip(&c.gpus) {
        g.temperature_celsius = Some(x.temp + x.d_temp);
        g.memory_temperature_celsius = Some(x.mem + x.d_mem);
        g.power_watts = Some(x.power.saturating_add_signed(x.d_power));
    }
    if let Some(cooling) = next.cooling.as_mut() {
        for s in &mut cooling.sensors {
            s.celsius = c.sensor + c.d_sensor;
        }
    }
    match c.fault {
        Fault::None => {}
        Fault::Throttle(i) => next.gpus[i].throttle_reasons.push(ThrottleReason::HwSlowdown),
        Fault::NvlinkDown(i) => {
            if let Some(n) = next.gpus[i].nvlink.as_mut() {
                n.active -= 1;
            }
        }
        Fault::EccUncorrected(i) => {
            if let Some(e) = next.gpus[i].ecc.as_mut() {
                e.volatile_uncorrected += 1;
            }
        }
        Fault::FanStopped => {
            if let Some(f) = next.cooling.as_mut().and_then(|c| c.fans.first_mut()) {
                f.rpm = 0;
            }
        }
        Fault::GpuTemperatureLost(i) => next.gpus[i].temperature_celsius = None,
        Fault::NvmlFailed => {
            if let Some(c) = next.collectors.iter_mut().find(|c| c.ok) {
                c.ok = false;
                c.error = Some("NVML: Unknown".into());
            }
        }
        Fault::Mtu => {
            if let Some(d) = next.network.as_mut().and_then(|n| n.rdma_devices.first_mut()) {
                d.mtu = Some(1500);
            }
        }
    }
    (prev, next)
}

/// The property, with the probe deciding by `known` (None: its fallback alone).
fn holds(c: &Case, known: Option<&[KnownPolicy]>, now: Timestamp) -> Result<(), TestCaseError> {
    let (prev, next) = pair(c, now);
    let mut all = c.policies.clone();
    all.extend(fixed_policies());
    let decision = decide(&prev, &next, known, &ChangeConfig::default(), now);
    if decision.is_empty() {
        for (i, policy) in all.iter().enumerate() {
            let (a, b) = (
                operator_view(policy, &prev, now),
                operator_view(policy, &next, now),
            );
            prop_assert_eq!(
                &a,
                &b,
                "the probe would not publish, but the operator decides differently under policy {}",
                i
            );
        }
    }
    Ok(())
}

fn known_from(c: &Case) -> Vec<KnownPolicy> {
    let mut all = c.policies.clone();
    all.extend(fixed_policies());
    all.into_iter()
        .enumerate()
        .map(|(i, spec)| KnownPolicy {
            name: format!("p{i}"),
            spec,
        })
        .collect()
}

#[test]
fn what_the_probe_does_not_publish_the_operator_decides_the_same_on() {
    let now = Timestamp::now();
    let published = std::cell::Cell::new(0u32);
    let total = std::cell::Cell::new(0u32);
    runner(&SEED, 256)
        .run(&case(), |c| {
            let known = known_from(&c);
            let (prev, next) = pair(&c, now);
            total.set(total.get() + 1);
            if !decide(&prev, &next, Some(&known), &ChangeConfig::default(), now).is_empty() {
                published.set(published.get() + 1);
            }
            holds(&c, Some(&known), now)
        })
        .unwrap();
    let (published, total) = (published.get(), total.get());
    // Both sides of the property were exercised: pairs published and pairs held back.
    assert!(
        published > 0 && published < total,
        "{published} of {total} published"
    );
}

#[test]
fn the_band_fallback_alone_breaks_the_contract() {
    // The property can fail: against the decision the probe made before it knew the policies
    // (node-probe/src/change.rs material_changes), the runner finds counterexamples.
    let now = Timestamp::now();
    let result = runner(&SEED, cases(256)).run(&case(), |c| holds(&c, None, now));
    if let Err(e) = &result {
        let text = e.to_string();
        eprintln!(
            "counterexample to the fallback: {}",
            text.lines().next().unwrap_or_default()
        );
    }
    assert!(
        result.is_err(),
        "the band heuristic alone satisfied the contract; the property cannot fail"
    );
}

#[test]
fn a_gpu_from_84_to_86_c_under_max_85_is_published_at_once() {
    // The example: slowdown 97 C, margin 13 -> 11 C crosses no band edge (15, 10).
    let now = Timestamp::now();
    let mut prev = healthy().status.expect("fixture has no status");
    prev.observed_at = Some(Time(now));
    for g in &mut prev.gpus {
        g.slowdown_celsius = Some(97);
    }
    prev.gpus[3].temperature_celsius = Some(84);
    let mut next = prev.clone();
    next.gpus[3].temperature_celsius = Some(86);
    let policy: GpuNodePolicySpec =
        serde_json::from_value(serde_json::json!({ "cooling": { "maxGpuCelsius": 85 } })).unwrap();
    assert_ne!(
        operator_view(&policy, &prev, now),
        operator_view(&policy, &next, now),
        "the operator sees a drift"
    );
    let cfg = ChangeConfig::default();
    assert!(
        decide(&prev, &next, None, &cfg, now).is_empty(),
        "the fallback waits for the refresh (as before the policy watch)"
    );
    let known = [KnownPolicy {
        name: "hot".into(),
        spec: policy,
    }];
    let changes = decide(&prev, &next, Some(&known), &cfg, now);
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(!changes[0].is_recovery());
    // Noise while drifted (86 -> 88 C) changes only the text of the drift: not published.
    let mut noisy = next.clone();
    noisy.gpus[3].temperature_celsius = Some(88);
    assert!(decide(&next, &noisy, Some(&known), &cfg, now).is_empty());
    // Back to 84 C: a recovery (published after --recovery-gap).
    let changes = decide(&next, &prev, Some(&known), &cfg, now);
    assert!(changes.len() == 1 && changes[0].is_recovery(), "{changes:?}");
}
