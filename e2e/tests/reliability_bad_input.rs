//! Bad input: deterministic hostile reports (every field of a real H100 report × wrong types,
//! extremes, unicode, huge lists and strings, missing sections) and hostile policies, written
//! through the API server while the operator runs. Each is either rejected with a message that
//! names the field, or stored and then judged by `evaluate` (the operator's own code) without a
//! crash: a report the operator's types cannot read is Unknown, a missing section never yields
//! Compliant. At the end the operator process is alive and still turns a bad report into
//! Unknown and a good one into Compliant.

use std::{collections::BTreeMap, time::Duration};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use gpunode_e2e::{
    faults::{Check, FaultCluster, Operator, Recorder, Run, Wave, WaveSpec},
    fixtures::repo_root,
    reports,
};
use gpunode_operator::{evaluate::evaluate, verdict::NodeState};
use kube::{
    Api,
    api::{ApiResource, DynamicObject, PostParams},
};
use serde_json::{Value, json};

const CLASS: &str = "bad input";
const DEADLINE: Duration = Duration::from_secs(120);

fn fail(e: impl std::fmt::Display) -> ! {
    panic!("{e}")
}

fn yaml(path: &str) -> Value {
    let p = repo_root().join(path);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| fail(format!("{}: {e}", p.display())));
    serde_yaml::from_str(&text).unwrap_or_else(|e| fail(format!("{}: {e}", p.display())))
}

/// Hostile values: (name, value); `None` deletes the field.
fn hostile() -> Vec<(&'static str, Option<Value>)> {
    vec![
        ("missing", None),
        ("null", Some(Value::Null)),
        ("wrong type: string", Some(json!("eighty"))),
        ("wrong type: bool", Some(json!(true))),
        ("wrong type: object", Some(json!({"a": 1}))),
        ("wrong type: list", Some(json!([1, 2]))),
        ("negative", Some(json!(-1))),
        ("beyond i64", Some(json!(u64::MAX))),
        ("float", Some(json!(1.5e300))),
        ("unicode", Some(json!("GPU\u{202e}☢ 温度 \u{0}"))),
        ("huge string", Some(json!("x".repeat(100_000)))),
        ("huge list", Some(Value::Array(vec![json!(7); 2_000]))),
    ]
}

/// Fields of a report status to break (JSON pointers under `status`).
const REPORT_FIELDS: [&str; 20] = [
    "/observedAt",
    "/bootId",
    "/probeVersion",
    "/collectors",
    "/collectors/0/ok",
    "/collectors/0/name",
    "/driverVersion",
    "/cudaVersion",
    "/gpuCount",
    "/gpus",
    "/gpus/0/index",
    "/gpus/0/memoryMiB",
    "/gpus/0/eccMode",
    "/gpus/0/ecc",
    "/gpus/0/temperatureCelsius",
    "/gpus/0/throttleReasons",
    "/gpus/0/xids",
    "/gpus/0/pcie/currentGeneration",
    "/cooling",
    "/network",
];

/// Fields of a policy spec to break.
const POLICY_FIELDS: [&str; 8] = [
    "/spec/gpu/count",
    "/spec/gpu/driverVersion",
    "/spec/cooling/maxGpuCelsius",
    "/spec/network/pfcPriorities",
    "/spec/remediation",
    "/spec/disruption/maxUnavailable",
    "/spec/staleAfter",
    "/spec/nodeSelector",
];

fn set(doc: &mut Value, pointer: &str, v: Option<Value>) -> bool {
    let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    match (doc.pointer_mut(parent), v) {
        (Some(Value::Object(o)), Some(v)) => {
            o.insert(key.to_string(), v);
            true
        }
        (Some(Value::Object(o)), None) => o.remove(key).is_some(),
        (Some(Value::Array(a)), v) => match (key.parse::<usize>(), v) {
            (Ok(i), Some(v)) if i < a.len() => {
                a[i] = v;
                true
            }
            (Ok(i), None) if i < a.len() => {
                a.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
    }
}

/// The leaf names a rejection must mention, e.g. `gpus[0].index` → `index`.
fn leaf(pointer: &str) -> String {
    pointer
        .rsplit('/')
        .find(|s| s.parse::<usize>().is_err())
        .unwrap_or_default()
        .to_string()
}

#[derive(Default, Debug)]
struct Tally {
    cases: usize,
    rejected: usize,
    rejected_naming_field: usize,
    rejected_without_field: Vec<String>,
    accepted: BTreeMap<String, usize>,
    wrong: Vec<String>,
}

impl Tally {
    fn outcome(&mut self, what: &str) {
        *self.accepted.entry(what.to_string()).or_default() += 1;
    }

    fn rejection(&mut self, case: &str, field: &str, message: &str) {
        self.rejected += 1;
        if message.contains(field) {
            self.rejected_naming_field += 1;
        } else {
            self.rejected_without_field.push(format!(
                "{case}: {}",
                message.chars().take(200).collect::<String>()
            ));
        }
    }
}

#[tokio::test]
async fn hostile_reports_and_policies_are_rejected_or_unknown_and_crash_nothing() {
    let (fc, client) = FaultCluster::up().await.unwrap_or_else(|e| fail(e));
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "bad-input");
    let mut op = Operator::start(&fc, &client, "rel-bad", "rel-bad")
        .await
        .unwrap_or_else(|e| fail(e));
    op.wait_leading(DEADLINE).await.unwrap_or_else(|e| fail(e));
    let strict = yaml("operator/tests/fixtures/evaluate/strict-policy.yaml");
    let mut spec = WaveSpec::drain("bad", 1, 0);
    spec.policy_spec = strict["spec"].clone();
    let wave = Wave::setup(&client, &spec).await.unwrap_or_else(|e| fail(e));
    let node = wave.nodes[0].clone();
    let policy: GpuNodePolicy = serde_json::from_value(strict.clone()).unwrap_or_else(|e| fail(e));
    let healthy = yaml("operator/tests/fixtures/evaluate/healthy-h100-report.yaml")["status"].clone();

    let reports_api: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::erase::<GpuNodeReport>(&()));
    // Reports: every field × every hostile value.
    let mut t = Tally::default();
    for field in REPORT_FIELDS {
        for (name, value) in hostile() {
            let mut status = healthy.clone();
            status["observedAt"] = json!(jiff::Timestamp::now().to_string());
            if !set(&mut status, field, value) {
                continue;
            }
            t.cases += 1;
            let case = format!("status{field} = {name}");
            match reports::publish(&client, &node, status.clone()).await {
                // A value of the wrong shape for server-side apply is refused while building the
                // typed patch, which the API server answers with 500 (naming the field).
                Err(gpunode_e2e::Error::Kube(kube::Error::Api(s)))
                    if matches!(s.code, 400 | 413 | 422)
                        || (s.code == 500 && s.message.contains("failed to create typed patch object")) =>
                {
                    t.rejection(&case, &leaf(field), &s.message);
                }
                Err(e) => t.wrong.push(format!("{case}: unexpected error {e}")),
                Ok(()) => {
                    // Judge what was stored (the API server prunes and defaults), as the
                    // operator's watch sees it.
                    let stored = reports_api.get(&node).await.unwrap_or_else(|e| fail(e));
                    let report = serde_json::to_value(&stored).unwrap_or_else(|e| fail(e));
                    match serde_json::from_value::<GpuNodeReport>(report) {
                        // The operator's watch reads it as unreadable: Unknown with the reason.
                        Err(_) => t.outcome("stored, unreadable → Unknown"),
                        Ok(r) => {
                            let v = evaluate(&policy.spec, Some(&r), jiff::Timestamp::now());
                            if name == "missing" && v.state == NodeState::Compliant && !harmless(field) {
                                t.wrong
                                    .push(format!("{case}: a missing section made the node Compliant"));
                            }
                            t.outcome(&format!("stored → {}", v.state.as_str()));
                        }
                    }
                }
            }
        }
    }
    let report_cases = t.cases;

    // Policies: dry-run creates, so nothing is left behind and CEL rules run as for real ones.
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<GpuNodePolicy>(&()));
    let healthy_report: GpuNodeReport = serde_json::from_value(json!({
        "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport",
        "metadata": {"name": "n"}, "spec": {"nodeName": "n"}, "status": healthy}))
    .unwrap_or_else(|e| fail(e));
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for field in POLICY_FIELDS {
        for (name, value) in hostile() {
            let mut doc = strict.clone();
            doc["metadata"] = json!({"name": format!("bad-{:06x}", gpunode_e2e::scratch::rand_suffix())});
            if !set(&mut doc, field, value) {
                continue;
            }
            t.cases += 1;
            let case = format!("policy{field} = {name}");
            let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap_or_else(|e| fail(e));
            match api.create(&dry, &obj).await {
                Err(kube::Error::Api(s)) if matches!(s.code, 400 | 413 | 422) => {
                    t.rejection(&case, &leaf(field), &s.message);
                    // What the schema keeps out is still fed to the evaluator where it parses.
                    if let Ok(p) = serde_json::from_value::<GpuNodePolicy>(doc) {
                        let _ = evaluate(&p.spec, Some(&healthy_report), jiff::Timestamp::now());
                    }
                }
                Err(e) => t.wrong.push(format!("{case}: unexpected error {e}")),
                Ok(stored) => match serde_json::to_value(&stored)
                    .map_err(|e| e.to_string())
                    .and_then(|v| serde_json::from_value::<GpuNodePolicy>(v).map_err(|e| e.to_string()))
                {
                    Err(e) => t
                        .wrong
                        .push(format!("{case}: accepted by the API, unreadable: {e}")),
                    Ok(p) => {
                        let v = evaluate(&p.spec, Some(&healthy_report), jiff::Timestamp::now());
                        t.outcome(&format!("policy accepted → {}", v.state.as_str()));
                    }
                },
            }
        }
    }
    let policy_cases = t.cases - report_cases;

    // The operator lived through all of it and still judges: a failed collector → Unknown, a
    // healthy report → Compliant.
    let mut failed = healthy.clone();
    failed["observedAt"] = json!(jiff::Timestamp::now().to_string());
    failed["collectors"][0]["ok"] = json!(false);
    failed["collectors"][0]["error"] = json!("NVML: driver not loaded");
    reports::publish(&client, &node, failed)
        .await
        .unwrap_or_else(|e| fail(e));
    wave.wait_all("unknown", DEADLINE)
        .await
        .unwrap_or_else(|e| fail(e));
    let mut good = healthy.clone();
    good["observedAt"] = json!(jiff::Timestamp::now().to_string());
    reports::publish(&client, &node, good)
        .await
        .unwrap_or_else(|e| fail(e));
    wave.wait_all("compliant", DEADLINE)
        .await
        .unwrap_or_else(|e| fail(e));
    let alive = op.alive();
    let panicked = op.log_text().contains("panicked");

    eprintln!("bad input: {t:#?}");
    let checks = vec![
        Check::new(
            "at least 200 generated cases",
            t.cases >= 200,
            format!("{report_cases} reports, {policy_cases} policies"),
        ),
        Check::new(
            "operator did not crash",
            alive && !panicked,
            format!("alive {alive}, panicked {panicked}"),
        ),
        Check::new(
            "every rejection names the field",
            t.rejected_without_field.is_empty(),
            format!(
                "{} of {} rejections name it; others: {:?}",
                t.rejected_naming_field, t.rejected, t.rejected_without_field
            ),
        ),
        Check::new(
            "every stored case judged (Unknown for unreadable; missing sections never Compliant)",
            t.wrong.is_empty(),
            format!("outcomes {:?}; wrong: {:?}", t.accepted, t.wrong),
        ),
    ];
    rec.push(Run {
        class: CLASS.into(),
        fault: format!("{} hostile reports and policies through the API", t.cases),
        seed: None,
        checks,
        recovery_ms: None,
    })
    .unwrap_or_else(|e| fail(e));
    wave.cleanup().await;
    rec.assert_clean();
}

/// Fields whose absence is legitimately fine under the strict policy (descriptive only).
fn harmless(field: &str) -> bool {
    // Descriptive fields, and lists the probe omits when empty (no XIDs, full clocks); without
    // a collectors list the sections are judged from their data.
    matches!(
        field,
        "/bootId" | "/probeVersion" | "/gpus/0/xids" | "/gpus/0/throttleReasons" | "/collectors"
    )
}
