//! Property tests (seeded, bounded) of the evaluator and the planner on hostile input: reports
//! mutated field by field into wrong types, extreme values, unicode and huge lists; nodes with
//! garbage bookkeeping annotations and taints. Nothing panics; a report lacking a section the
//! strict policy reads is never Compliant; a missing report is Unknown; what the planner admits
//! equals what an oracle written here from the documented budget, breaker, skip, conflict,
//! hysteresis and people-win rules expects, on nodes generated from a description the oracle
//! reads (never from the planner's own budget or breaker fields).
//! `PROPTEST_CASES` raises the case count (`make reliability-long`).

// clippy.toml allows unwrap and expect in #[test] fns only; this test crate's helper fns fail
// the same way (a panic naming what broke), so the allow covers the whole crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{DriftClass, GpuNodePolicy, GpuNodeReport};
use gpunode_operator::{
    evaluate::evaluate,
    plan::{DrainStep, NodeView, plan},
    verdict::{Drift, NodeState, Unknown, Verdict},
};
use gpunode_testkit::{Counter, record, runner};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use proptest::prelude::*;
use serde_json::{Value, json};

/// Fixed seed: every run explores the same cases; failures reproduce.
const SEED: [u8; 32] = *b"gpunode-reliability-fuzz-seed-01";

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/evaluate/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn policies() -> Vec<GpuNodePolicy> {
    let mut out: Vec<GpuNodePolicy> = vec![];
    for f in ["strict-policy.yaml", "network-only-policy.yaml"] {
        out.push(serde_json::from_value(fixture(f)).unwrap_or_else(|e| panic!("{f}: {e}")));
    }
    for f in ["h100-training.yaml", "a100-inference.yaml", "fabric-only.yaml"] {
        let path = format!("{}/../examples/{f}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        out.push(serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}")));
    }
    // The strict policy with the power limit range and the PCIe replay budget: checks that read
    // fields the operator's cache could trim (powerLimitWatts).
    let mut powered = out[0].clone();
    if let Some(gpu) = powered.spec.gpu.as_mut() {
        gpu.power = Some(gpunode_crds::power::PowerRequirements {
            min_limit_percent_of_default: Some(90),
            min_limit_watts: Some(100),
            max_limit_watts: Some(700),
            ..Default::default()
        });
        gpu.pcie.get_or_insert_default().max_replays_per_hour = Some(100);
    }
    out.push(powered);
    out
}

/// Every JSON pointer in `v` (objects and arrays included).
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{at}/{k}");
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        _ => {}
    }
}

/// Values a broken or hostile probe might write.
fn hostile() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!(1e308)),
        Just(json!(-0.5)),
        Just(json!(true)),
        Just(json!("")),
        Just(json!("ÄÖÜ – 温度 – 🔥\u{202e}")),
        Just(json!("550.54.15")),
        Just(json!("9999999999.1.2.3.4")),
        Just(json!("2026-13-45T99:99:99Z")),
        Just(json!([])),
        Just(json!({})),
        Just(Value::Array(vec![
            json!({"xid": 79, "at": "2026-11-29T12:00:00Z"});
            500
        ])),
        Just(Value::Array(vec![json!(7); 10_000])),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,40}".prop_map(Value::String),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Remove(usize),
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(
        prop_oneof![
            (any::<usize>(), hostile()).prop_map(|(i, v)| Mutation::Replace(i, v)),
            any::<usize>().prop_map(Mutation::Remove),
        ],
        1..6,
    )
}

fn mutate(base: &Value, ms: &[Mutation]) -> Value {
    let mut v = base.clone();
    for m in ms {
        let mut ps = Vec::new();
        pointers(&v, String::new(), &mut ps);
        if ps.is_empty() {
            break;
        }
        let (i, replacement) = match m {
            Mutation::Replace(i, r) => (*i, Some(r.clone())),
            Mutation::Remove(i) => (*i, None),
        };
        let p = &ps[i % ps.len()];
        let (parent, key) = p.rsplit_once('/').unwrap_or(("", p));
        let Some(target) = v.pointer_mut(parent) else {
            continue;
        };
        match (target, replacement) {
            (Value::Object(o), Some(r)) => {
                o.insert(key.to_string(), r);
            }
            (Value::Object(o), None) => {
                o.remove(key);
            }
            (Value::Array(a), r) => {
                if let Ok(idx) = key.parse::<usize>()
                    && idx < a.len()
                {
                    match r {
                        Some(r) => a[idx] = r,
                        None => {
                            a.remove(idx);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    v
}

/// What the strict policy reads of a report (its spec names them): a report without one of these
/// can never show the node compliant with it.
const STRICT_READS: [&str; 7] = [
    "observedAt",
    "driverVersion",
    "cudaVersion",
    "gpuCount",
    "gpus",
    "cooling",
    "network",
];

/// The sections of `STRICT_READS` that `report` lacks (absent or null, or no status at all).
fn missing_sections(report: &Value) -> Vec<&'static str> {
    STRICT_READS
        .iter()
        .copied()
        .filter(|k| report.pointer(&format!("/status/{k}")).is_none_or(Value::is_null))
        .collect()
}

#[test]
fn evaluate_survives_mutated_reports() {
    let base = fixture("healthy-h100-report.yaml");
    let broken = fixture("broken-h100-report.yaml");
    let policies = policies();
    let strict = &policies[0];
    let observed: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
    let strategy = (prop::bool::ANY, mutations(), -100_000i64..100_000);
    let (parsed, missing) = (Counter::default(), Counter::default());
    let outcome = runner(&SEED, 256).run(&strategy, |(which, ms, offset)| {
        let value = mutate(if which { &base } else { &broken }, &ms);
        let gone = missing_sections(&value);
        // What the API server's schema would reject never reaches evaluate as a typed
        // report; the operator's watch turns it into Unknown (DeserializeGuard).
        let Ok(report) = serde_json::from_value::<GpuNodeReport>(value) else {
            return Ok(());
        };
        parsed.hit();
        let now = observed + SignedDuration::from_secs(offset);
        // What the operator's cache keeps of the report (trimmed, then compacted and decoded
        // when evaluated) decides the same.
        let mut trimmed = report.clone();
        gpunode_operator::observe::trim::report(&mut trimmed);
        let cached =
            gpunode_operator::observe::CachedReport::new(&kube::core::DeserializeGuard(Ok(trimmed.clone())));
        let decoded = cached.report().map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&decoded, &trimmed);
        for p in &policies {
            let verdict = evaluate(&p.spec, Some(&report), now);
            prop_assert!(!verdict.summary().is_empty());
            prop_assert_eq!(&verdict, &evaluate(&p.spec, Some(&trimmed), now));
        }
        if !gone.is_empty() {
            missing.hit();
            let verdict = evaluate(&strict.spec, Some(&report), now);
            prop_assert!(
                verdict.state != NodeState::Compliant,
                "Compliant with the strict policy although the report lacks {gone:?}"
            );
        }
        Ok(())
    });
    let mut unknown_when_missing = Ok(());
    for p in &policies {
        let v = evaluate(&p.spec, None, observed);
        if v.state != NodeState::Unknown {
            unknown_when_missing = Err(format!("a missing report is {:?}", v.state));
        }
    }
    let outcome = outcome.map_err(|e| e.to_string()).and_then(|()| {
        if parsed.get() == 0 || missing.get() == 0 {
            Err(format!(
                "generator too destructive or too mild: {} reports deserialized, {} lacked a section",
                parsed.get(),
                missing.get()
            ))
        } else {
            unknown_when_missing
        }
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "evaluate-reports",
        "proptest: evaluate on mutated reports × 5 policies (cases: reports that deserialize)",
        parsed.get(),
        &[
            (
                "no panic on any input",
                format!("{} mutated reports deserialized", parsed.get()),
            ),
            (
                "a report lacking a section the policy reads is never Compliant",
                format!("{} reports lacking one", missing.get()),
            ),
            ("missing report is Unknown", "5 policies".into()),
            (
                "the cache's trimmed, compacted report gives the same verdict",
                "every verdict".into(),
            ),
        ],
        &outcome,
    );
    outcome.unwrap();
}

#[test]
fn evaluate_survives_mutated_policies() {
    let report: GpuNodeReport = serde_json::from_value(fixture("healthy-h100-report.yaml")).unwrap();
    let base = fixture("strict-policy.yaml");
    let now: Timestamp = "2026-11-29T12:00:30Z".parse().unwrap();
    let ran = Counter::default();
    let outcome = runner(&SEED, 256).run(&mutations(), |ms| {
        if let Ok(p) = serde_json::from_value::<GpuNodePolicy>(mutate(&base, &ms)) {
            ran.hit();
            prop_assert!(!evaluate(&p.spec, Some(&report), now).summary().is_empty());
        }
        Ok(())
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "evaluate-policies",
        "proptest: evaluate with mutated policies (cases: policies that deserialize)",
        ran.get(),
        &[("no panic on any input", "every policy that deserializes".into())],
        &outcome,
    );
    outcome.unwrap();
}

const CLASSES: [DriftClass; 5] = [
    DriftClass::Xid,
    DriftClass::Throttle,
    DriftClass::Thermal,
    DriftClass::Driver,
    DriftClass::Memory,
];

/// An annotation as a hostile node may carry it: absent, readable, or unreadable (hand-edited,
/// truncated). The markers' contract (markers.rs): an unreadable one counts as absent.
#[derive(Debug, Clone)]
enum Ann<T> {
    Absent,
    Valid(T),
    Garbage(String),
}

impl<T> Ann<T> {
    fn valid(&self) -> Option<&T> {
        match self {
            Ann::Valid(t) => Some(t),
            _ => None,
        }
    }
}

/// Strings no RFC 3339 or JSON reader accepts (the leading "x" sees to it for random ones).
fn garbage() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("yesterday".to_string()),
        Just("2026-13-45T99:99:99Z".to_string()),
        Just("not json ☃".to_string()),
        Just("{\"Bogus\":{\"since\":\"2026-11-29T11:00:00Z\"}}".to_string()),
        "\\PC{0,30}".prop_map(|s| format!("x{s}")),
    ]
}

/// Seconds before `now`.
fn ago() -> impl Strategy<Value = i64> {
    prop::sample::select(vec![0i64, 60, 100, 300, 3_600])
}

fn ann<T: std::fmt::Debug + Clone>(valid: impl Strategy<Value = T>) -> impl Strategy<Value = Ann<T>> {
    prop_oneof![
        3 => Just(Ann::Absent),
        2 => valid.prop_map(Ann::Valid),
        1 => garbage().prop_map(Ann::Garbage),
    ]
}

/// One node as the test means it; [`render`] writes it as a Node (with foreign noise), and the
/// oracle reads only this.
#[derive(Debug, Clone)]
struct Spec {
    /// Indices into CLASSES drifting now.
    drifting: BTreeSet<usize>,
    /// Some check unknown (the Stale class).
    unknown: bool,
    /// `gpunode.dev/classes`: per class, began (s ago) and cleared (s ago).
    tracked: Ann<BTreeMap<usize, (i64, Option<i64>)>>,
    /// `gpunode.dev/cordoned`: `Valid(())` is the literal "true".
    cordoned: Ann<()>,
    unschedulable: bool,
    drain_started: Ann<i64>,
    drained: Ann<i64>,
    user_uncordoned: Ann<i64>,
    /// (gpunode's key?, value, effect as written).
    taints: Vec<(bool, &'static str, &'static str)>,
    skip: bool,
    conflict: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    let drifting = prop_oneof![
        1 => Just(BTreeSet::new()),
        3 => prop::collection::btree_set(0usize..CLASSES.len(), 1..3),
    ];
    let tracked = ann(prop::collection::btree_map(
        0usize..CLASSES.len(),
        (
            ago(),
            prop::option::of(prop::sample::select(vec![10i64, 200, 600])),
        ),
        1..3,
    ));
    let taints = prop::collection::vec(
        (
            prop::bool::ANY,
            prop::sample::select(vec!["xid", "throttle", "", "Ü"]),
            prop::sample::select(vec!["NoSchedule", "NoExecute", "PreferNoSchedule", "Bogus"]),
        ),
        0..2,
    );
    (
        (drifting, prop::bool::weighted(0.15), tracked),
        (ann(Just(())), prop::bool::ANY, ann(ago()), ann(ago()), ann(ago())),
        (taints, prop::bool::weighted(0.1), prop::bool::weighted(0.1)),
    )
        .prop_map(
            |(
                (drifting, unknown, tracked),
                (cordoned, unschedulable, drain_started, drained, user_uncordoned),
                (taints, skip, conflict),
            )| Spec {
                drifting,
                unknown,
                tracked,
                cordoned,
                unschedulable,
                drain_started,
                drained,
                user_uncordoned,
                taints,
                skip,
                conflict,
            },
        )
}

fn render(name: &str, s: &Spec, now: Timestamp) -> (Node, Verdict) {
    let at = |secs: i64| (now - SignedDuration::from_secs(secs)).to_string();
    let mut ann = BTreeMap::new();
    let mut put = |key: &str, v: Option<String>| {
        if let Some(v) = v {
            ann.insert(key.to_string(), v);
        }
    };
    let text = |a: &Ann<i64>| match a {
        Ann::Absent => None,
        Ann::Valid(secs) => Some(at(*secs)),
        Ann::Garbage(g) => Some(g.clone()),
    };
    put(
        "gpunode.dev/classes",
        match &s.tracked {
            Ann::Absent => None,
            Ann::Valid(m) => {
                let m: serde_json::Map<String, Value> = m
                    .iter()
                    .map(|(c, (since, cleared))| {
                        let mut t = json!({"since": at(*since)});
                        if let Some(c) = cleared {
                            t["clearedAt"] = json!(at(*c));
                        }
                        (format!("{:?}", CLASSES[*c]), t)
                    })
                    .collect();
                Some(Value::Object(m).to_string())
            }
            Ann::Garbage(g) => Some(g.clone()),
        },
    );
    put(
        "gpunode.dev/cordoned",
        match &s.cordoned {
            Ann::Absent => None,
            Ann::Valid(()) => Some("true".into()),
            // "true" is the only value that means cordoned.
            Ann::Garbage(g) => Some(if g == "true" { "TRUE".into() } else { g.clone() }),
        },
    );
    put("gpunode.dev/drain-started", text(&s.drain_started));
    put("gpunode.dev/drained", text(&s.drained));
    put("gpunode.dev/uncordoned-by-user", text(&s.user_uncordoned));
    // Look-alikes of gpunode's annotations, which must not be read as them.
    put("gpunode.dev/user-uncordoned", Some(at(0)));
    put("example.com/cordoned", Some("true".into()));
    let taints: Vec<Value> = s
        .taints
        .iter()
        .map(|(ours, v, e)| {
            let key = if *ours {
                "gpunode.dev/drift"
            } else {
                "other.example.com/maint"
            };
            json!({"key": key, "value": v, "effect": e})
        })
        .collect();
    let mut labels = BTreeMap::new();
    if s.skip {
        labels.insert("gpunode.dev/skip", "true");
    }
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": ann, "labels": labels},
        "spec": {"unschedulable": s.unschedulable, "taints": taints},
    }))
    .unwrap_or_else(|e| panic!("node: {e}"));
    let drifts = s
        .drifting
        .iter()
        .map(|i| Drift {
            class: CLASSES[*i],
            check: "fuzz".into(),
            expected: "ok".into(),
            actual: "bad".into(),
            gpu: Some(0),
            device: None,
        })
        .collect();
    let unknowns = if s.unknown {
        vec![Unknown {
            check: "report".into(),
            reason: "stale".into(),
            gpu: None,
        }]
    } else {
        vec![]
    };
    (node, Verdict::new(drifts, unknowns))
}

/// The test's policy knobs.
#[derive(Debug, Clone)]
struct Knobs {
    /// `maxUnavailable`: a count, or a percentage when `percent`.
    max_unavailable: u32,
    percent: bool,
    /// `circuitBreaker.maxDriftedPercent`.
    breaker: u32,
    /// `after` of the Drain rule (s).
    drain_after: i64,
    dry_run: bool,
    paused: bool,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        prop_oneof![
            3 => (0u32..4).prop_map(|n| (n, false)),
            1 => prop::sample::select(vec![0u32, 10, 25, 50, 100]).prop_map(|p| (p, true)),
        ],
        prop::sample::select(vec![30u32, 50, 100, 100, 100]),
        prop::sample::select(vec![0i64, 0, 120]),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.05),
    )
        .prop_map(
            |((max_unavailable, percent), breaker, drain_after, dry_run, paused)| Knobs {
                max_unavailable,
                percent,
                breaker,
                drain_after,
                dry_run,
                paused,
            },
        )
}

/// healthyFor (default 5m) and the breaker window (default 10m), from the CRD docs.
const HEALTHY_FOR: i64 = 300;
const WINDOW: i64 = 600;

/// What the oracle derives for one node from its [`Spec`] and the documented rules alone.
struct Expect {
    /// Out of service by gpunode's doing now: a NoSchedule/NoExecute gpunode taint, gpunode's
    /// cordon in effect, or a drain under way that no person cancelled. (A node whose drain a
    /// person cancelled by uncordoning it is schedulable and takes no capacity: not disrupted.)
    disrupted: bool,
    /// The ladder asks for a disruptive action gpunode may take on it.
    wants: bool,
    /// When its oldest drift still drifting began (s ago); None when nothing drifts.
    since: Option<i64>,
}

fn expect(s: &Spec, k: &Knobs) -> Expect {
    let tracked: BTreeMap<usize, (i64, Option<i64>)> = s.tracked.valid().cloned().unwrap_or_default();
    let cordoned = s.cordoned.valid().is_some();
    let cancelled = s.user_uncordoned.valid().is_some() || (cordoned && !s.unschedulable);
    let our_disruptive_taint = s
        .taints
        .iter()
        .any(|(ours, _, e)| *ours && (*e == "NoSchedule" || *e == "NoExecute"));
    let disrupted = our_disruptive_taint
        || (cordoned && s.unschedulable)
        || (s.drain_started.valid().is_some() && !cancelled);
    // Hysteresis (plan.rs docs): a class is active while it drifts and until it has stayed
    // clear for healthyFor; a drift returning within healthyFor keeps its start. Unknown is not
    // evidence of health: a tracked class does not start clearing while a check is unknown.
    let mut active: BTreeMap<usize, i64> = BTreeMap::new();
    let mut still_drifting: Vec<i64> = Vec::new();
    for c in 0..CLASSES.len() {
        let track = tracked.get(&c);
        let recent = |t: &(i64, Option<i64>)| t.1.is_none_or(|cleared| cleared < HEALTHY_FOR);
        if s.drifting.contains(&c) {
            let since = track.filter(|t| recent(t)).map_or(0, |t| t.0);
            active.insert(c, since);
            still_drifting.push(since);
        } else if let Some(t) = track.filter(|t| recent(t)) {
            active.insert(c, t.0);
            if t.1.is_none() && s.unknown {
                still_drifting.push(t.0);
            }
        }
    }
    if s.unknown {
        // Stale is a drift class of its own (no rule here acts on it); new unless tracked.
        still_drifting.push(0);
    }
    let fires = |c: DriftClass, after: i64| {
        CLASSES
            .iter()
            .position(|x| *x == c)
            .and_then(|i| active.get(&i))
            .is_some_and(|since| *since >= after)
    };
    // The ladder of the test's policy; Taint PreferNoSchedule is not disruptive.
    let taint = fires(DriftClass::Throttle, 0) || fires(DriftClass::Thermal, 0);
    let cordon = fires(DriftClass::Driver, 0)
        || fires(DriftClass::Xid, k.drain_after)
        || fires(DriftClass::Memory, k.drain_after);
    // People win: a person's uncordon holds off gpunode's cordon and drain until recovery.
    let wants = taint || (cordon && !cancelled);
    Expect {
        disrupted,
        wants,
        since: still_drifting.into_iter().max(),
    }
}

/// The policy's node budget, from the CRD docs: a count as written; a percentage of the
/// selected nodes rounded down, at least 1 above 0%.
fn allowed(k: &Knobs, nodes: usize) -> usize {
    let n = k.max_unavailable as usize;
    if !k.percent {
        n
    } else if n == 0 {
        0
    } else {
        (nodes * n / 100).max(1)
    }
}

/// Whether the plan leaves the node out of service by gpunode's doing.
fn disrupts(np: &gpunode_operator::plan::NodePlan) -> bool {
    np.actions.iter().any(|a| a.is_disruptive())
        || np.taints.iter().any(|t| t.effect.is_disruptive())
        || np.cordon == Some(true)
        || matches!(np.drain, DrainStep::Run { .. })
}

#[test]
fn plan_never_exceeds_the_budget_on_hostile_nodes() {
    let now: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap();
    let strategy = (prop::collection::vec(spec(), 1..12), knobs());
    let (ran, binding, breaker_held, admitted) = (
        Counter::default(),
        Counter::default(),
        Counter::default(),
        Counter::default(),
    );
    let outcome = runner(&SEED, 256).run(&strategy, |(specs, k)| {
        ran.hit();
        let max_unavailable = if k.percent {
            json!(format!("{}%", k.max_unavailable))
        } else {
            json!(k.max_unavailable)
        };
        let policy: GpuNodePolicy = serde_json::from_value(json!({
            "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodePolicy", "metadata": {"name": "p"},
            "spec": {
                "dryRun": k.dry_run,
                "paused": k.paused,
                "remediation": [
                    {"classes": ["Throttle", "Thermal"], "action": "Taint", "effect": "NoSchedule"},
                    {"classes": ["Thermal"], "action": "Taint", "effect": "PreferNoSchedule"},
                    {"classes": ["Driver"], "action": "Cordon"},
                    {"classes": ["Xid", "Memory"], "action": "Drain", "after": format!("{}s", k.drain_after)},
                ],
                "disruption": {"maxUnavailable": max_unavailable,
                               "circuitBreaker": {"maxDriftedPercent": k.breaker}},
            }
        }))
        .unwrap_or_else(|e| panic!("policy: {e}"));
        let names: Vec<String> = (0..specs.len()).map(|i| format!("n{i}")).collect();
        let views: Vec<NodeView> = specs
            .iter()
            .zip(&names)
            .map(|(s, name)| {
                let (node, verdict) = render(name, s, now);
                let conflicts = if s.conflict { vec!["other".to_string()] } else { vec![] };
                NodeView::observe(&node, verdict, conflicts).0
            })
            .collect();
        let p = plan("p", &policy.spec, &views, now);

        // The oracle, from the specs and the documented rules only.
        let expects: Vec<Expect> = specs.iter().map(|s| expect(s, &k)).collect();
        let before = expects.iter().filter(|e| e.disrupted).count();
        // Breaker: more than maxDriftedPercent of the nodes (and more than one) began drifting
        // within the window; 100 disables it.
        let recent = expects.iter().filter(|e| e.since.is_some_and(|s| s <= WINDOW)).count();
        let threshold = (k.breaker as usize * specs.len() / 100).max(1);
        let breaker_open = k.breaker < 100 && recent > threshold;
        let mut candidates: Vec<(Option<i64>, &String)> = specs
            .iter()
            .zip(&expects)
            .zip(&names)
            .filter(|((s, e), _)| e.wants && !e.disrupted && !s.skip && !s.conflict)
            .map(|((_, e), name)| (e.since, name))
            .collect();
        // Oldest drift first (most seconds ago), nodes without a drift last, then by name.
        candidates.sort_by(|a, b| (a.0.is_none(), std::cmp::Reverse(a.0), a.1).cmp(&(b.0.is_none(), std::cmp::Reverse(b.0), b.1)));
        let slots = allowed(&k, specs.len()).saturating_sub(before);
        let expected: BTreeSet<&String> = if breaker_open || k.dry_run || k.paused {
            BTreeSet::new()
        } else {
            candidates.iter().take(slots).map(|(_, n)| *n).collect()
        };
        if !(breaker_open || k.dry_run || k.paused) && candidates.len() > slots {
            binding.hit();
        }
        if breaker_open && !candidates.is_empty() && !(k.dry_run || k.paused) {
            breaker_held.hit();
        }

        prop_assert_eq!(p.nodes.len(), views.len());
        let mut newly = BTreeSet::new();
        for np in &p.nodes {
            let Some(i) = names.iter().position(|n| *n == np.node) else {
                return Err(TestCaseError::fail(format!("plan for unknown node {}", np.node)));
            };
            if disrupts(np) && !expects[i].disrupted {
                newly.insert(&names[i]);
            }
        }
        if !expected.is_empty() {
            admitted.hit();
        }
        prop_assert_eq!(
            &newly,
            &expected,
            "admitted (left) differs from the oracle (right): {} already disrupted of {} allowed, breaker {}, candidates {:?}",
            before,
            allowed(&k, specs.len()),
            if breaker_open { "open" } else { "closed" },
            candidates
        );
        Ok(())
    });
    // Not vacuous: the budget must bind (and the breaker hold) in a good share of the cases.
    let ran_n = ran.get();
    let vacuous = binding.get() * 5 < ran_n || breaker_held.get() * 50 < ran_n;
    let outcome = outcome.map_err(|e| e.to_string()).and_then(|()| {
        if vacuous {
            Err(format!(
                "generator too weak: budget binding in {} and breaker holding in {} of {ran_n} cases",
                binding.get(),
                breaker_held.get()
            ))
        } else {
            Ok(())
        }
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "plan",
        "proptest: plan on hostile nodes and annotations vs. a budget/breaker oracle",
        ran_n,
        &[
            ("no panic on any input", "1-11 nodes per case".into()),
            (
                "admissions = the oracle's (budget, oldest drift first)",
                format!(
                    "{} cases with a binding budget, {} admitting at least one node",
                    binding.get(),
                    admitted.get()
                ),
            ),
            (
                "no new disruption with the breaker open, on skipped or conflicting nodes, in dry run or paused",
                format!("{} cases held by the breaker", breaker_held.get()),
            ),
        ],
        &outcome,
    );
    outcome.unwrap();
}
