//! Property tests (seeded, bounded) of the evaluator and the planner on hostile input: reports
//! mutated field by field into wrong types, extreme values, unicode and huge lists; nodes with
//! garbage bookkeeping annotations and taints. Nothing panics; a verdict is Compliant only
//! without drifts or unknowns; a missing report is Unknown; the planner never admits more new
//! disruption than the budget leaves, and none while the circuit breaker is open.
//! `PROPTEST_CASES` raises the case count (`make reliability-long`).

use std::collections::BTreeMap;

use gpunode_crds::{DriftClass, GpuNodePolicy, GpuNodeReport};
use gpunode_operator::{
    evaluate::evaluate,
    plan::{DrainStep, NodeView, plan},
    verdict::{Drift, NodeState, Unknown, Verdict},
};
use gpunode_testkit::{cases, record, runner};
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
    let mut out = vec![];
    for f in ["strict-policy.yaml", "network-only-policy.yaml"] {
        out.push(serde_json::from_value(fixture(f)).unwrap_or_else(|e| panic!("{f}: {e}")));
    }
    for f in ["h100-training.yaml", "a100-inference.yaml", "fabric-only.yaml"] {
        let path = format!("{}/../examples/{f}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        out.push(serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}")));
    }
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

fn consistent(v: &Verdict) -> Result<(), TestCaseError> {
    if v.state == NodeState::Compliant {
        prop_assert!(
            v.drifts.is_empty() && v.unknowns.is_empty(),
            "compliant with findings: {v:?}"
        );
    }
    if !v.drifts.is_empty() {
        prop_assert_eq!(v.state, NodeState::Drifted);
    }
    prop_assert!(!v.summary().is_empty());
    Ok(())
}

#[test]
fn evaluate_survives_mutated_reports() {
    let base = fixture("healthy-h100-report.yaml");
    let broken = fixture("broken-h100-report.yaml");
    let policies = policies();
    let observed: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap_or_else(|e| panic!("{e}"));
    let strategy = (prop::bool::ANY, mutations(), -100_000i64..100_000);
    let parsed = std::cell::Cell::new(0u32);
    let outcome = runner(&SEED, 256).run(&strategy, |(which, ms, offset)| {
        let report = mutate(if which { &base } else { &broken }, &ms);
        // What the API server's schema would reject never reaches evaluate as a typed
        // report; the operator's watch turns it into Unknown (DeserializeGuard).
        let Ok(report) = serde_json::from_value::<GpuNodeReport>(report) else {
            return Ok(());
        };
        parsed.set(parsed.get() + 1);
        let now = observed + SignedDuration::from_secs(offset);
        // What the operator's cache keeps of the report decides the same.
        let mut trimmed = report.clone();
        gpunode_operator::trim::report(&mut trimmed);
        for p in &policies {
            let verdict = evaluate(&p.spec, Some(&report), now);
            consistent(&verdict)?;
            prop_assert_eq!(&verdict, &evaluate(&p.spec, Some(&trimmed), now));
        }
        Ok(())
    });
    assert!(
        parsed.get() > 0,
        "no mutated report deserialized: the generator is too destructive"
    );
    for p in &policies {
        let v = evaluate(&p.spec, None, observed);
        assert_eq!(v.state, NodeState::Unknown, "a missing report is Unknown");
    }
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "evaluate-reports",
        format!(
            "proptest: evaluate on mutated reports × 5 policies ({} cases)",
            cases(256)
        ),
        &[
            (
                "no panic on any input",
                format!("{} mutated reports deserialized", parsed.get()),
            ),
            (
                "Compliant only without drifts or unknowns",
                "every verdict".into(),
            ),
            ("missing report is Unknown", "5 policies".into()),
            (
                "the cache's trimmed report gives the same verdict",
                "every verdict".into(),
            ),
        ],
        &outcome,
    );
    outcome.unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn evaluate_survives_mutated_policies() {
    let report: GpuNodeReport =
        serde_json::from_value(fixture("healthy-h100-report.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let base = fixture("strict-policy.yaml");
    let now: Timestamp = "2026-11-29T12:00:30Z".parse().unwrap_or_else(|e| panic!("{e}"));
    let outcome = runner(&SEED, 256).run(&mutations(), |ms| {
        if let Ok(p) = serde_json::from_value::<GpuNodePolicy>(mutate(&base, &ms)) {
            consistent(&evaluate(&p.spec, Some(&report), now))?;
        }
        Ok(())
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "evaluate-policies",
        format!("proptest: evaluate with mutated policies ({} cases)", cases(256)),
        &[("no panic on any input", "every policy that deserializes".into())],
        &outcome,
    );
    outcome.unwrap_or_else(|e| panic!("{e}"));
}

const CLASSES: [DriftClass; 5] = [
    DriftClass::Xid,
    DriftClass::Throttle,
    DriftClass::Thermal,
    DriftClass::Driver,
    DriftClass::Memory,
];

fn verdict() -> impl Strategy<Value = Verdict> {
    prop_oneof![
        Just(Verdict::new(vec![], vec![])),
        Just(Verdict::new(
            vec![],
            vec![Unknown {
                check: "report".into(),
                reason: "stale".into(),
                gpu: None
            }]
        )),
        prop::collection::btree_set(0usize..CLASSES.len(), 1..3).prop_map(|cs| Verdict::new(
            cs.into_iter()
                .map(|i| Drift {
                    class: CLASSES[i],
                    check: "fuzz".into(),
                    expected: "ok".into(),
                    actual: "bad".into(),
                    gpu: Some(0),
                    device: None,
                })
                .collect(),
            vec![]
        )),
    ]
}

fn annotation_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("true".to_string()),
        Just("2026-11-29T11:00:00Z".to_string()),
        Just("2026-11-29T12:10:00Z".to_string()),
        Just("{\"Xid\":{\"since\":\"2026-11-29T11:59:00Z\"}}".to_string()),
        Just("not json ☃".to_string()),
        "\\PC{0,30}",
    ]
}

fn node() -> impl Strategy<Value = Node> {
    let keys = prop::sample::select(vec![
        "gpunode.dev/cordoned",
        "gpunode.dev/drain-started",
        "gpunode.dev/uncordoned-by-user",
        "gpunode.dev/classes",
        "gpunode.dev/user-uncordoned",
        "gpunode.dev/taints",
    ]);
    (
        prop::collection::btree_map(keys, annotation_value(), 0..4),
        prop::bool::ANY,
        prop::bool::ANY,
        prop::collection::vec(
            (
                prop::sample::select(vec!["gpunode.dev/drift", "other.example.com/maint"]),
                prop::sample::select(vec!["xid", "throttle", "", "Ü"]),
                prop::sample::select(vec!["NoSchedule", "NoExecute", "PreferNoSchedule", "Bogus"]),
            ),
            0..3,
        ),
    )
        .prop_map(|(ann, unschedulable, skip, taints)| {
            let taints: Vec<Value> = taints
                .into_iter()
                .map(|(k, v, e)| json!({"key": k, "value": v, "effect": e}))
                .collect();
            let mut labels = BTreeMap::new();
            if skip {
                labels.insert("gpunode.dev/skip", "true");
            }
            serde_json::from_value(json!({
                "metadata": {"name": "n", "annotations": ann, "labels": labels},
                "spec": {"unschedulable": unschedulable, "taints": taints},
            }))
            .unwrap_or_else(|e| panic!("node: {e}"))
        })
}

/// In effect before the plan: a disruptive gpunode taint, gpunode's cordon, or a drain its
/// bookkeeping says is under way (resumed, not newly admitted).
/// Whether the node is out of service by gpunode's doing. A drain a person cancelled (by
/// uncordoning the node gpunode cordoned, now or before) leaves a schedulable node that takes
/// no capacity away: its stale drain marker does not make it disrupted.
fn was_disrupted(v: &NodeView) -> bool {
    let cancelled = v.markers.user_uncordoned.is_some() || (v.markers.cordoned_by_us && !v.unschedulable);
    v.taints.iter().any(|t| t.effect.is_disruptive())
        || (v.unschedulable && v.markers.cordoned_by_us)
        || (v.markers.drain_started.is_some() && !cancelled)
}

#[test]
fn plan_never_exceeds_the_budget_on_hostile_nodes() {
    let now: Timestamp = "2026-11-29T12:00:00Z".parse().unwrap_or_else(|e| panic!("{e}"));
    let strategy = (
        prop::collection::vec((node(), verdict(), prop::bool::ANY), 1..12),
        0u32..4,
        prop::bool::ANY,
    );
    let outcome = runner(&SEED, 256).run(&strategy, |(nodes, max_unavailable, breaker)| {
        let policy: GpuNodePolicy = serde_json::from_value(json!({
            "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodePolicy", "metadata": {"name": "p"},
            "spec": {
                "remediation": [
                    {"classes": ["Throttle", "Thermal"], "action": "Taint", "effect": "NoSchedule"},
                    {"classes": ["Driver"], "action": "Cordon"},
                    {"classes": ["Xid", "Memory"], "action": "Drain"},
                ],
                "disruption": {"maxUnavailable": max_unavailable,
                               "circuitBreaker": {"maxDriftedPercent": if breaker { 30 } else { 100 }}},
            }
        }))
        .unwrap_or_else(|e| panic!("policy: {e}"));
        let views: Vec<NodeView> = nodes
            .into_iter()
            .enumerate()
            .map(|(i, (mut n, v, conflict))| {
                n.metadata.name = Some(format!("n{i}"));
                let conflicts = if conflict {
                    vec!["other".to_string()]
                } else {
                    vec![]
                };
                NodeView::observe(&n, v, conflicts).0
            })
            .collect();
        let p = plan(&policy.spec, &views, now);
        prop_assert_eq!(p.nodes.len(), views.len());
        let before = views.iter().filter(|v| was_disrupted(v)).count();
        let mut newly = 0usize;
        for np in &p.nodes {
            let Some(v) = views.iter().find(|v| v.name == np.node) else {
                return Err(TestCaseError::fail(format!("plan for unknown node {}", np.node)));
            };
            let disrupts = np.taints.iter().any(|t| t.effect.is_disruptive())
                || np.cordon == Some(true)
                || matches!(np.drain, DrainStep::Run { .. });
            if disrupts && !was_disrupted(v) && np.write {
                newly += 1;
                prop_assert!(!v.skip, "a skipped node was disrupted");
                prop_assert!(
                    v.conflicts.is_empty(),
                    "a node with a conflicting policy was disrupted"
                );
            }
        }
        let allowed = usize::try_from(p.budget_allowed).unwrap_or(usize::MAX);
        prop_assert!(
            newly <= allowed.saturating_sub(before),
            "{newly} newly disrupted with {before} already disrupted of {allowed} allowed"
        );
        if p.circuit_open {
            prop_assert_eq!(newly, 0, "new disruption while the circuit breaker is open");
        }
        Ok(())
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "plan",
        format!(
            "proptest: plan on hostile nodes and annotations ({} cases)",
            cases(256)
        ),
        &[
            ("no panic on any input", "1-11 nodes per case".into()),
            (
                "budget never exceeded",
                "new disruption ≤ allowed − already disrupted".into(),
            ),
            (
                "no new disruption with the breaker open, on skipped or conflicting nodes",
                "every plan".into(),
            ),
        ],
        &outcome,
    );
    outcome.unwrap_or_else(|e| panic!("{e}"));
}
