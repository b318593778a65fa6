//! Bad input: hostile reports (every field of a real H100 report × wrong types, extremes,
//! unicode, huge lists and strings, missing sections, then seeded combinations of up to three)
//! and hostile policies, written through the API server while the operator runs —
//! `GPUNODE_REL_BAD_INPUTS` in all (600 in `make test`, 10,000 in `make reliability-long`).
//! Each is either rejected with a message that names the field, or stored and then judged by the
//! running operator, whose verdict (the node's state label) must be what `evaluate` makes of the
//! stored object: Unknown when its types cannot read it, a missing section never Compliant. (Two
//! cases in a row with the same verdict get a report of another verdict between them, so every
//! wait sees the operator judge its case.) Every hostile policy the API server accepts is stored
//! and must be reconciled (a status for its generation). At the end the operator process is alive
//! and still turns a bad report into Unknown and a good one into Compliant.

use std::{collections::BTreeMap, time::Duration};

use futures::{StreamExt, future::join_all};
use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use gpunode_e2e::{
    faults::{
        checks::Check,
        cluster::FaultCluster,
        marks,
        record::{Recorder, Run},
        replica::Operator,
        wave::{self, Wave, WaveSpec},
    },
    fixtures::repo_root,
    reports, wait,
};
use gpunode_operator::{evaluate::evaluate, verdict::NodeState};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, PostParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::{Value, json};

const CLASS: &str = "bad input";
const DEADLINE: Duration = Duration::from_secs(120);

fn yaml(path: &str) -> Value {
    let p = repo_root().join(path);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
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
    judged_by_operator: usize,
    sentinels: usize,
    wrong: Vec<String>,
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.cases += o.cases;
        self.rejected += o.rejected;
        self.rejected_naming_field += o.rejected_naming_field;
        self.rejected_without_field.extend(o.rejected_without_field);
        for (k, v) in o.accepted {
            *self.accepted.entry(k).or_default() += v;
        }
        self.judged_by_operator += o.judged_by_operator;
        self.sentinels += o.sentinels;
        self.wrong.extend(o.wrong);
    }

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

/// Bad inputs in all, reports and policies (`GPUNODE_REL_BAD_INPUTS`; `make reliability-long`
/// sets 10,000). The deterministic sweep (every field × every hostile value) comes first, then
/// seeded combinations of one to three of them.
fn budget() -> usize {
    std::env::var("GPUNODE_REL_BAD_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600)
}

/// Nodes the report cases are spread over, judged concurrently.
const NODES: usize = 24;

/// Hostile documents: the sweep of `fields` × [`hostile`] values, then seeded combinations, `n`
/// in all. `base` is the healthy document the mutations start from.
fn cases(base: &Value, fields: &[&str], n: usize, salt: u64) -> Vec<(String, Value)> {
    let values = hostile();
    let mut out = Vec::new();
    for field in fields {
        for (name, value) in &values {
            let mut doc = base.clone();
            if set(&mut doc, field, value.clone()) {
                out.push((format!("{field} = {name}"), doc));
            }
        }
    }
    let mut i = 0u64;
    while out.len() < n {
        let seed = wave::mix(salt + i);
        i += 1;
        let mut doc = base.clone();
        let mut names = Vec::new();
        for j in 0..=(seed % 3) {
            let r = wave::mix(seed ^ (j + 1));
            let field = fields[usize::try_from(r % fields.len() as u64).unwrap_or(0)];
            let (name, value) = &values[usize::try_from((r >> 32) % values.len() as u64).unwrap_or(0)];
            if set(&mut doc, field, value.clone()) {
                names.push(format!("{field} = {name}"));
            }
        }
        if !names.is_empty() {
            out.push((format!("seed {}: {}", salt + i - 1, names.join(", ")), doc));
        }
    }
    out
}

/// The mutations a case name lists, as (field, hostile value name): `"/a = null"` or
/// `"seed 7: /a = null, /b = missing"`.
fn mutations(case: &str) -> Vec<(&str, &str)> {
    let list = case
        .split_once(": ")
        .filter(|(p, _)| p.starts_with("seed "))
        .map_or(case, |(_, l)| l);
    list.split(", ").filter_map(|m| m.split_once(" = ")).collect()
}

/// The leaf of a field the case broke that `message` names, if any.
fn names_a_field(case: &str, message: &str) -> Option<String> {
    mutations(case)
        .iter()
        .map(|(f, _)| leaf(f))
        .find(|l| message.contains(l.as_str()))
}

/// What the running operator must say of a stored report: Unknown when its types cannot read
/// it, else what `evaluate` says.
fn expected(policy: &GpuNodePolicy, stored: &DynamicObject) -> Result<NodeState, String> {
    let report = serde_json::to_value(stored).map_err(|e| e.to_string())?;
    Ok(match serde_json::from_value::<GpuNodeReport>(report) {
        Err(_) => NodeState::Unknown,
        Ok(r) => evaluate(&policy.spec, Some(&r), jiff::Timestamp::now()).state,
    })
}

/// A status whose verdict under the strict policy is `state` (Compliant or Drifted), to put
/// between two cases of the same expected verdict, so each wait sees the operator judge the case.
fn sentinel(healthy: &Value, state: NodeState) -> Value {
    let mut s = healthy.clone();
    s["observedAt"] = json!(jiff::Timestamp::now().to_string());
    if state == NodeState::Drifted {
        s["driverVersion"] = json!("400.1");
    }
    s
}

struct Judge<'a> {
    client: &'a Client,
    reports: Api<DynamicObject>,
    policy: &'a GpuNodePolicy,
    healthy: &'a Value,
    nodes: reflector::Store<Node>,
}

impl Judge<'_> {
    fn label(&self, node: &str) -> Option<String> {
        self.nodes
            .get(&reflector::ObjectRef::new(node))
            .and_then(|n| n.metadata.labels.as_ref()?.get(marks::STATE_LABEL).cloned())
    }

    async fn says(&self, node: &str, state: NodeState) -> Result<(), gpunode_e2e::Error> {
        wait::until(
            &format!("the operator to say {} of {node}", state.as_str()),
            CASE_DEADLINE,
            || async {
                let now = self.label(node);
                if now.as_deref() == Some(state.as_str()) {
                    Ok(Some(()))
                } else {
                    Err(gpunode_e2e::Error::Unexpected(format!("it says {now:?}")))
                }
            },
        )
        .await
    }

    /// Writes each case to `node` in turn and checks what the operator makes of it.
    async fn run(&self, node: &str, cases: &[(String, Value)]) -> Tally {
        let mut t = Tally::default();
        let mut last = self.label(node);
        for (case, status) in cases {
            let mut status = status.clone();
            // Fresh, or the operator would judge it stale; unless the case is about observedAt.
            if !case.contains("/observedAt") {
                status["observedAt"] = json!(jiff::Timestamp::now().to_string());
            }
            t.cases += 1;

            match reports::publish_status(self.client, node, status.clone()).await {
                // A value of the wrong shape for server-side apply is refused while building the
                // typed patch, which the API server answers with 500 (naming the field).
                Err(gpunode_e2e::Error::Kube(kube::Error::Api(s)))
                    if matches!(s.code, 400 | 413 | 422)
                        || (s.code == 500 && s.message.contains("failed to create typed patch object")) =>
                {
                    let named = names_a_field(case, &s.message)
                        .unwrap_or_else(|| mutations(case).first().map(|(f, _)| leaf(f)).unwrap_or_default());
                    t.rejection(case, &named, &s.message);
                    continue;
                }
                Err(e) => {
                    t.wrong.push(format!("{case}: unexpected error {e}"));
                    continue;
                }
                Ok(()) => {}
            }
            // Judge what was stored (the API server prunes and defaults), as the watch sees it.
            let stored = match self.reports.get(node).await {
                Ok(s) => s,
                Err(e) => {
                    t.wrong.push(format!("{case}: reading it back: {e}"));
                    continue;
                }
            };
            let want = match expected(self.policy, &stored) {
                Ok(w) => w,
                Err(e) => {
                    t.wrong.push(format!("{case}: {e}"));
                    continue;
                }
            };
            let removed_needed = mutations(case)
                .iter()
                .any(|(f, v)| *v == "missing" && !harmless(f));
            if removed_needed && want == NodeState::Compliant {
                t.wrong
                    .push(format!("{case}: a missing section made the node Compliant"));
            }
            // The same verdict as the last one would not show the operator judged this case:
            // put a report of another verdict between them, then write the case again.
            if last.as_deref() == Some(want.as_str()) {
                let other = if want == NodeState::Compliant {
                    NodeState::Drifted
                } else {
                    NodeState::Compliant
                };
                t.sentinels += 1;
                let between = async {
                    reports::publish_status(self.client, node, sentinel(self.healthy, other)).await?;
                    self.says(node, other).await?;
                    reports::publish_status(self.client, node, status.clone()).await
                };
                if let Err(e) = between.await {
                    t.wrong.push(format!("{case}: writing the sentinel: {e}"));
                    continue;
                }
            }
            match self.says(node, want).await {
                Ok(()) => {
                    t.judged_by_operator += 1;
                    t.outcome(&format!("stored → {}", want.as_str()));
                }
                Err(e) => t
                    .wrong
                    .push(format!("{case}: evaluate says {}, but {e}", want.as_str())),
            }
            last = Some(want.as_str().to_string());
        }
        t
    }
}

/// How long the operator may take to judge one case on a loaded machine.
const CASE_DEADLINE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn hostile_reports_and_policies_are_rejected_or_judged_by_the_running_operator() {
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "bad-input");
    let mut op = Operator::start(&fc, &client, "rel-bad", "rel-bad").await.unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    let strict = yaml("operator/tests/fixtures/evaluate/strict-policy.yaml");
    let mut spec = WaveSpec::drain("bad", NODES, 0);
    spec.policy_spec = strict["spec"].clone();
    spec.bystander = false;
    let wave = Wave::setup(&client, &spec).await.unwrap();
    let policy: GpuNodePolicy = serde_json::from_value(strict.clone()).unwrap();
    let healthy = yaml("operator/tests/fixtures/evaluate/healthy-h100-report.yaml")["status"].clone();
    let (store, writer) = reflector::store::<Node>();
    let watch = tokio::spawn(
        watcher(
            Api::<Node>::all(client.clone()),
            gpunode_e2e::faults::cluster::watch_config().labels(&wave.selector()),
        )
        .default_backoff()
        .reflect(writer)
        .for_each(|_| async {}),
    );
    store.wait_until_ready().await.unwrap();
    let started = std::time::Instant::now();

    // Reports: four in five of the budget, spread over the nodes and judged concurrently.
    let n_reports = budget() * 4 / 5;
    let mut base = healthy.clone();
    base["observedAt"] = json!(jiff::Timestamp::now().to_string());
    let report_cases = cases(&base, &REPORT_FIELDS, n_reports, 1);
    let judge = Judge {
        client: &client,
        reports: Api::all_with(client.clone(), &ApiResource::erase::<GpuNodeReport>(&())),
        policy: &policy,
        healthy: &healthy,
        nodes: store.clone(),
    };
    let mut shares: Vec<Vec<(String, Value)>> = vec![Vec::new(); NODES];
    for (i, c) in report_cases.into_iter().enumerate() {
        shares[i % NODES].push(c);
    }
    let tallies = join_all(wave.nodes.iter().zip(&shares).map(|(n, cs)| judge.run(n, cs))).await;
    let mut t = Tally::default();
    for x in tallies {
        t.merge(x);
    }
    let report_cases = t.cases;

    // Policies: dry-run creates, so CEL rules run as for real ones; each one the API server
    // accepts is then created for real (selecting no node) and the running operator must give
    // it a status for its generation.
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<GpuNodePolicy>(&()));
    let healthy_report: GpuNodeReport = serde_json::from_value(json!({
        "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport",
        "metadata": {"name": "n"}, "spec": {"nodeName": "n"}, "status": healthy}))
    .unwrap();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut base = strict.clone();
    base["spec"]["nodeSelector"] = json!({"matchLabels": {"rel.gpunode.test/none": "none"}});
    let policy_cases = cases(&base, &POLICY_FIELDS, budget() - n_reports, 1 << 40);
    let run_id = format!("{:06x}", gpunode_e2e::scratch::rand_suffix());
    let mut created = Vec::new();
    for (i, (case, mut doc)) in policy_cases.into_iter().enumerate() {
        let name = format!("bad-{run_id}-{i}");
        doc["metadata"] = json!({"name": name, "labels": {"rel.gpunode.test/bad": run_id}});
        t.cases += 1;

        let obj: DynamicObject = match serde_json::from_value(doc.clone()) {
            Ok(o) => o,
            Err(e) => {
                t.wrong.push(format!("policy {case}: {e}"));
                continue;
            }
        };
        match api.create(&dry, &obj).await {
            Err(kube::Error::Api(s)) if matches!(s.code, 400 | 413 | 422) => {
                let named = names_a_field(&case, &s.message)
                    .unwrap_or_else(|| mutations(&case).first().map(|(f, _)| leaf(f)).unwrap_or_default());
                t.rejection(&format!("policy {case}"), &named, &s.message);
                // What the schema keeps out is still fed to the evaluator where it parses.
                if let Ok(p) = serde_json::from_value::<GpuNodePolicy>(doc) {
                    let _ = evaluate(&p.spec, Some(&healthy_report), jiff::Timestamp::now());
                }
            }
            Err(e) => t.wrong.push(format!("policy {case}: unexpected error {e}")),
            Ok(stored) => match serde_json::to_value(&stored)
                .map_err(|e| e.to_string())
                .and_then(|v| serde_json::from_value::<GpuNodePolicy>(v).map_err(|e| e.to_string()))
            {
                Err(e) => t
                    .wrong
                    .push(format!("policy {case}: accepted by the API, unreadable: {e}")),
                Ok(p) => {
                    let v = evaluate(&p.spec, Some(&healthy_report), jiff::Timestamp::now());
                    t.outcome(&format!("policy accepted → {}", v.state.as_str()));
                    // An accepted selector other than the one that selects nothing could take
                    // the wave's nodes: those stay dry-run.
                    if doc["spec"]["nodeSelector"] == base["spec"]["nodeSelector"] {
                        match api.create(&PostParams::default(), &obj).await {
                            Ok(_) => created.push((case, name)),
                            Err(e) => t
                                .wrong
                                .push(format!("policy {case}: dry run accepted, create: {e}")),
                        }
                    }
                }
            },
        }
    }
    let policy_cases = t.cases - report_cases;
    // The operator reconciles every stored hostile policy: a status for its generation.
    let typed: Api<GpuNodePolicy> = Api::all(client.clone());
    let mut unreconciled = Vec::new();
    for (case, name) in &created {
        let done = wait::until(&format!("a status for policy {name}"), CASE_DEADLINE, || async {
            let p = typed.get(name).await?;
            let observed = p.status.as_ref().and_then(|s| s.observed_generation);
            Ok((observed.is_some() && observed == p.metadata.generation).then_some(()))
        })
        .await;
        if let Err(e) = done {
            unreconciled.push(format!("{case}: {e}"));
        }
    }
    for (_, name) in &created {
        let _ = typed.delete(name, &Default::default()).await;
    }
    let elapsed = started.elapsed().as_secs_f64();

    // The operator lived through all of it and still judges: a failed collector → Unknown, a
    // healthy report → Compliant.
    let node = wave.nodes[0].clone();
    let mut failed = healthy.clone();
    failed["observedAt"] = json!(jiff::Timestamp::now().to_string());
    failed["collectors"][0]["ok"] = json!(false);
    failed["collectors"][0]["error"] = json!("NVML: driver not loaded");
    reports::publish(&client, &node, failed).await.unwrap();
    judge.says(&node, NodeState::Unknown).await.unwrap();
    reports::publish(&client, &node, sentinel(&healthy, NodeState::Compliant))
        .await
        .unwrap();
    judge.says(&node, NodeState::Compliant).await.unwrap();
    let alive = op.alive();
    let panicked = op.log_text().contains("panicked");
    watch.abort();

    eprintln!("bad input: {t:#?}");
    let checks = vec![
        Check::new(
            "as many cases as asked for",
            t.cases >= budget(),
            format!("{report_cases} reports, {policy_cases} policies in {elapsed:.0} s"),
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
                t.rejected_naming_field,
                t.rejected,
                t.rejected_without_field.iter().take(10).collect::<Vec<_>>()
            ),
        ),
        Check::new(
            "every stored report judged by the running operator as evaluate judges it (Unknown for unreadable; missing sections never Compliant)",
            t.wrong.is_empty() && t.judged_by_operator > 0,
            format!(
                "{} judged by the operator ({} sentinels between equal verdicts); outcomes {:?}; wrong: {:?}",
                t.judged_by_operator,
                t.sentinels,
                t.accepted,
                t.wrong.iter().take(10).collect::<Vec<_>>()
            ),
        ),
        Check::new(
            "every stored hostile policy reconciled by the running operator",
            unreconciled.is_empty() && !created.is_empty(),
            format!(
                "{} created, not reconciled: {:?}",
                created.len(),
                unreconciled.iter().take(10).collect::<Vec<_>>()
            ),
        ),
    ];
    rec.push(Run {
        class: CLASS.into(),
        fault: "hostile reports and policies through the API".into(),
        seed: None,
        checks,
        recovery: None,
    })
    .unwrap();
    rec.assert_clean();
    wave.cleanup().await;
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
