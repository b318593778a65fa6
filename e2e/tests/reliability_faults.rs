//! Faults from outside the operator and the control plane's processes, each mid-wave on a wave of
//! three nodes under `maxUnavailable: 1` (the budget binds) with a bystander a person cordoned:
//! - a node deleted while its drain is held by a PodDisruptionBudget: the operator forgets it,
//!   its budget slot goes to the next node, the rest of the wave finishes;
//! - the policy edited mid-drain (Drain → Taint NoSchedule): the drain stops, the cordon becomes
//!   the taint on the same node, nothing is evicted any more;
//! - the policy deleted mid-drain: every gpunode marker released, the held evictions stop;
//! - gpunode's CRDs deleted mid-drain (policies and reports go with them) and reinstalled: the
//!   markers of the vanished policy are released, and the wave resumes when the CRDs, the policy
//!   and the reports come back;
//! - etcd stopped and started again (a restart, not a pause) mid-drain;
//! - the API server answering 429 to the operator (a FlowSchema sending only its ServiceAccount
//!   to a priority level with one seat that rejects) during a wave, then the schema removed;
//! - an admission webhook that is down (failurePolicy Fail, a closed loopback port) on the wave's
//!   node updates and evictions, installed mid-drain and removed; and one that hangs
//!   (failurePolicy Ignore, timeoutSeconds 1, a loopback port that never answers) through a wave:
//!   every write is slow but goes through.
//!
//! After each: no pod evicted twice, none after its eviction was committed, the budget, a
//! person's cordon and other controllers' markers held at every observed instant, and the end
//! state the fault implies (the policy's when it survives, every marker released when it went).
//! One operator process throughout (it must never die). The steps share one test: two operators
//! at once would both act on every policy. `GPUNODE_REL_OUTAGE_SECS` sets the fault lengths
//! (default 30: etcd down a third of it, throttling and the webhook a sixth).

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    audit::{self, AuditEvent},
    crds,
    faults::{
        checks::{self, Check},
        cluster::{self, FaultCluster, Restore},
        marks,
        record::{self, Recorder, Run, Until},
        replica::Operator,
        wave::{self, Wave, WaveSpec},
    },
    monitor::WaveMonitor,
    reports, wait,
};
use k8s_openapi::api::{
    admissionregistration::v1::ValidatingWebhookConfiguration,
    core::v1::Node,
    flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(120);
/// One drain retry cycle of the operator (it revisits draining nodes every 5 s) and a margin:
/// how long the tests watch for evictions that must not come.
const RETRY_WINDOW: Duration = Duration::from_secs(7);

fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("GPUNODE_REL_OUTAGE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    )
}

#[tokio::test]
async fn nodes_policies_crds_etcd_throttling_and_admission_faults_lose_and_repeat_nothing() {
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "faults");
    let mut op = Operator::start(&fc, &client, "rel-faults", "rel-faults")
        .await
        .unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    let only = std::env::var("GPUNODE_REL_FAULTS_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only.split(',').any(|o| o == name);
    if run("node") {
        node_deleted_mid_drain(&fc, &client, &mut op, &mut rec).await;
    }
    if run("edit") {
        policy_edited_mid_drain(&fc, &client, &mut op, &mut rec).await;
    }
    if run("delete") {
        policy_deleted_mid_drain(&fc, &client, &mut op, &mut rec).await;
    }
    if run("crds") {
        crds_removed_and_reinstalled(&fc, &client, &mut op, &mut rec).await;
    }
    if run("etcd") {
        etcd_restarted(&fc, &client, &mut op, &mut rec).await;
    }
    if run("throttle") {
        throttled(&fc, &client, &mut op, &mut rec).await;
    }
    if run("webhook-down") {
        webhook_down(&fc, &client, &mut op, &mut rec).await;
    }
    if run("webhook-slow") {
        webhook_hangs(&fc, &client, &mut op, &mut rec).await;
    }
    rec.assert_clean();
}

/// A wave set up and compliant, watched from before its drifts.
async fn wave(client: &Client, tag: &str, pdb: bool) -> (Wave, WaveMonitor) {
    let mut spec = WaveSpec::drain(tag, 3, 2);
    spec.pdb = pdb;
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    (wave, monitor)
}

async fn drain_started(wave: &Wave, except: &[&str]) -> String {
    wave.drain_started(except, DEADLINE).await.unwrap()
}

fn alive(op: &mut Operator) -> Check {
    Check::new(
        "operator process survived without restart",
        op.alive(),
        format!("exit status: {:?}", op.exited()),
    )
}

/// Eviction requests by `user` for pods of `namespace` received after `since`.
fn evictions_after(
    events: &[AuditEvent],
    user: &str,
    namespace: &str,
    since: jiff::Timestamp,
) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.user == user && e.is_eviction_in(namespace) && e.at > since)
        .map(|e| format!("{} at {} ({})", e.name, e.at, e.code))
        .collect()
}

/// What gpunode still has on a node: any `gpunode.dev/` label, annotation or taint, its node
/// condition, and a cordon on a node no person cordoned.
fn gpunode_marks(node: &Node, person_cordoned: bool) -> Vec<String> {
    let ours = |k: &String| k.starts_with("gpunode.dev/");
    let mut out: Vec<String> = Vec::new();
    let meta = &node.metadata;
    out.extend(
        meta.labels
            .iter()
            .flatten()
            .map(|(k, _)| k)
            .filter(|k| ours(k))
            .cloned(),
    );
    out.extend(
        meta.annotations
            .iter()
            .flatten()
            .map(|(k, _)| k)
            .filter(|k| ours(k))
            .cloned(),
    );
    let spec = node.spec.as_ref();
    out.extend(
        spec.and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .filter(|t| ours(&t.key))
            .map(|t| format!("taint {}", t.key)),
    );
    out.extend(
        node.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.type_ == gpunode_operator::markers::CONDITION_TYPE)
            .map(|c| format!("condition {}", c.type_)),
    );
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    if cordoned != person_cordoned {
        out.push(format!("unschedulable {cordoned}"));
    }
    out
}

/// Every node of the wave's policy as the API server has them now.
async fn policy_nodes(client: &Client, wave: &Wave) -> Result<Vec<Node>, gpunode_e2e::Error> {
    Ok(Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&wave.policy_selector()))
        .await?
        .items)
}

/// Nodes of the wave (bystander included) still carrying something of gpunode's, or missing
/// another controller's label or taint, or the person's cordon.
async fn unreleased(client: &Client, wave: &Wave) -> Result<Vec<String>, gpunode_e2e::Error> {
    let nodes = policy_nodes(client, wave).await?;
    let mut wrong = Vec::new();
    for n in &nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let person = wave.bystander.as_ref() == Some(&name);
        let mut marks = gpunode_marks(n, person);
        if marks::label(n, wave::FOREIGN_LABEL.0).as_deref() != Some(wave::FOREIGN_LABEL.1) {
            marks.push("foreign label lost".into());
        }
        let foreign_taint = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| t.key == wave::FOREIGN_TAINT.0));
        if !foreign_taint {
            marks.push("foreign taint lost".into());
        }
        if !marks.is_empty() {
            wrong.push(format!("{name}: {marks:?}"));
        }
    }
    let expected = wave.nodes.len() + usize::from(wave.bystander.is_some());
    if nodes.len() != expected {
        wrong.push(format!("{} of {expected} nodes", nodes.len()));
    }
    Ok(wrong)
}

/// The expected end state after the policy went: nothing of gpunode's left on any of its nodes,
/// everything else (other controllers' markers, the person's cordon) kept.
async fn released_check(client: &Client, wave: &Wave) -> Check {
    let wrong = unreleased(client, wave).await.unwrap();
    Check::new(
        "every gpunode marker released, nothing else touched",
        wrong.is_empty(),
        format!("not as expected: {wrong:?}"),
    )
}

/// Waits until the policy is gone and every node of it released; whether they were in time (a
/// release that never comes is recorded as a violation by the checks after it, not a panic).
async fn wait_released(client: &Client, wave: &Wave, timeout: Duration) -> bool {
    let policies = Api::<GpuNodePolicy>::all(client.clone());
    wait::until(&format!("{} released", wave.id), timeout, || async {
        if policies.get_opt(&wave.policy).await?.is_some() {
            return Err(gpunode_e2e::Error::Unexpected("the policy is still there".into()));
        }
        let wrong = unreleased(client, wave).await?;
        if wrong.is_empty() {
            Ok(Some(()))
        } else {
            Err(gpunode_e2e::Error::Unexpected(format!("{wrong:?}")))
        }
    })
    .await
    .map_err(|e| eprintln!("{e}"))
    .is_ok()
}

/// Reports every node healthy and waits until each is compliant, untainted and uncordoned
/// (for waves whose drains the fault stopped, so `Wave::drive` would wait for them for ever).
async fn heal(client: &Client, wave: &Wave) {
    for n in &wave.nodes {
        reports::publish(client, n, wave::report_status(false, "boot-1"))
            .await
            .unwrap();
    }
    wait::until(&format!("{} healed", wave.id), DEADLINE, || async {
        let nodes = wave.nodes_now().await?;
        Ok((nodes.len() == wave.nodes.len()
            && nodes.iter().all(|n| {
                marks::label(n, marks::STATE_LABEL).as_deref() == Some("compliant")
                    && marks::gpunode_taints(n).is_empty()
                    && !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
            }))
        .then_some(()))
    })
    .await
    .unwrap();
}

/// A node deleted (its Node object) while its drain is held by a PDB, with two nodes queued
/// behind it for the budget.
async fn node_deleted_mid_drain(fc: &FaultCluster, client: &Client, op: &mut Operator, rec: &mut Recorder) {
    let (mut wave, monitor) = wave(client, "fdel", true).await;
    wave.drift_all().await.unwrap();
    let first = drain_started(&wave, &[]).await;
    let before = wave.alive_pods().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.delete(&first, &DeleteParams::default()).await.unwrap();
    wait::until("the Node object to be gone", DEADLINE, || async {
        Ok(nodes.get_opt(&first).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    let deleted = Instant::now();
    // Its budget slot is free: the next node starts draining while the PDB still holds.
    let second = drain_started(&wave, &[first.as_str()]).await;
    let recovery = record::elapsed_ms(deleted);
    let forgot_by = jiff::Timestamp::now();
    // The deleted node leaves the wave: the others must end as the policy implies.
    let gone_pods = wave.pods.remove(&first).unwrap_or_default();
    wave.nodes.retain(|n| *n != first);
    wave.release_pdb().await.unwrap();
    wave.drive(DEADLINE * 2).await.unwrap();
    let mut checks = vec![
        alive(op),
        Check::new(
            "the node was mid-drain when deleted",
            before.get(&first).copied() == Some(gone_pods.len()) && !gone_pods.is_empty(),
            format!(
                "pods alive on {first}: {:?} of {}",
                before.get(&first),
                gone_pods.len()
            ),
        ),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    let audit = fc.audit().unwrap();
    let user = op.user();
    let late: Vec<String> = audit
        .iter()
        .filter(|e| e.user == user && e.is_write() && e.at > forgot_by)
        .filter(|e| {
            (e.resource == "nodes" && e.name == first)
                || (e.is_eviction_in(&wave.namespace) && gone_pods.contains(&e.name))
        })
        .map(|e| {
            format!(
                "{} {}/{} {} ({})",
                e.verb, e.resource, e.subresource, e.name, e.code
            )
        })
        .collect();
    checks.push(Check::new(
        "the deleted node forgotten: no write to it or eviction of its pods afterwards",
        late.is_empty(),
        format!("{second} drained next; writes after: {late:?}"),
    ));
    rec.push(Run {
        class: "concurrency".into(),
        fault: "a node deleted while its drain was held, two nodes queued behind it".into(),
        seed: None,
        checks,
        recovery: Some(Until::Answered.after(recovery)),
    })
    .unwrap();
    wave.cleanup().await;
}

/// The policy's remediation changed from Drain to Taint NoSchedule while a drain is held.
async fn policy_edited_mid_drain(fc: &FaultCluster, client: &Client, op: &mut Operator, rec: &mut Recorder) {
    let (wave, monitor) = wave(client, "fedit", true).await;
    wave.drift_all().await.unwrap();
    let first = drain_started(&wave, &[]).await;
    let policies = Api::<GpuNodePolicy>::all(client.clone());
    let edit =
        json!({"spec": {"remediation": [{"classes": ["Xid"], "action": "Taint", "effect": "NoSchedule"}]}});
    policies
        .patch(&wave.policy, &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let edited = Instant::now();
    // The edit took effect: gpunode's cordon is gone, one node carries the NoSchedule taint.
    let tainted = wait::until("the taint to replace the drain", DEADLINE, || async {
        let ns = wave.nodes_now().await?;
        let cordoned = ns
            .iter()
            .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false))
            .count();
        let tainted: Vec<String> = ns
            .iter()
            .filter(|n| {
                marks::gpunode_taints(n)
                    .iter()
                    .any(|t| t.ends_with(":NoSchedule"))
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        Ok((cordoned == 0 && !tainted.is_empty()).then_some(tainted))
    })
    .await
    .unwrap();
    let recovery = record::elapsed_ms(edited);
    let took_effect = jiff::Timestamp::now();
    // Evictions would go through from now on: a drain that went on would show.
    wave.release_pdb().await.unwrap();
    cluster::hold("a drain retry cycle without the PDB", RETRY_WINDOW)
        .await
        .unwrap();
    let pods_now = wave.alive_pods().await.unwrap();
    heal(client, &wave).await;
    let audit = fc.audit().unwrap();
    let mut checks = vec![alive(op)];
    checks.extend(monitor.checks(1, &audit, &wave.namespace).await);
    checks.extend(checks::eviction_checks(&audit, &wave.namespace, &[]));
    checks.extend(wave.final_checks().await.unwrap());
    let late = evictions_after(&audit, &op.user(), &wave.namespace, took_effect);
    let evicted = audit::evictions(&audit, &wave.namespace);
    checks.push(Check::new(
        "the drain stopped when the policy stopped asking for it: no eviction after the edit",
        late.is_empty() && evicted.is_empty() && pods_now.values().all(|n| *n == 2),
        format!(
            "{first} was draining, {tainted:?} tainted instead; evictions requested after: {late:?}; \
             evicted: {evicted:?}; pods alive: {pods_now:?}"
        ),
    ));
    rec.push(Run {
        class: "concurrency".into(),
        fault: "policy edited mid-drain (Drain to Taint NoSchedule)".into(),
        seed: None,
        checks,
        recovery: Some(Until::Answered.after(recovery)),
    })
    .unwrap();
    wave.cleanup().await;
}

/// The policy deleted while a drain is held and two nodes are queued.
async fn policy_deleted_mid_drain(fc: &FaultCluster, client: &Client, op: &mut Operator, rec: &mut Recorder) {
    let (wave, monitor) = wave(client, "fpdel", true).await;
    wave.drift_all().await.unwrap();
    let first = drain_started(&wave, &[]).await;
    Api::<GpuNodePolicy>::all(client.clone())
        .delete(&wave.policy, &DeleteParams::default())
        .await
        .unwrap();
    let deleted = Instant::now();
    let released = wait_released(client, &wave, DEADLINE).await;
    let recovery = released.then(|| record::elapsed_ms(deleted));
    let gone = jiff::Timestamp::now();
    wave.release_pdb().await.unwrap();
    cluster::hold("a drain retry cycle without the PDB", RETRY_WINDOW)
        .await
        .unwrap();
    let pods_now = wave.alive_pods().await.unwrap();
    let audit = fc.audit().unwrap();
    let mut checks = vec![alive(op)];
    checks.extend(monitor.checks(1, &audit, &wave.namespace).await);
    checks.extend(checks::eviction_checks(&audit, &wave.namespace, &[]));
    checks.push(released_check(client, &wave).await);
    let late = evictions_after(&audit, &op.user(), &wave.namespace, gone);
    checks.push(Check::new(
        "the held evictions stopped with the policy",
        late.is_empty() && pods_now.values().all(|n| *n == 2),
        format!(
            "{first} was draining; evictions requested after the release: {late:?}; pods alive: {pods_now:?}"
        ),
    ));
    rec.push(Run {
        class: "concurrency".into(),
        fault: "policy deleted mid-drain".into(),
        seed: None,
        checks,
        recovery: recovery.map(|ms| Until::Answered.after(ms)),
    })
    .unwrap();
    wave.cleanup().await;
}

/// `kubectl delete crd` of gpunode's CRDs while a drain is held, then the CRDs, the policy and
/// the reports put back.
async fn crds_removed_and_reinstalled(
    fc: &FaultCluster,
    client: &Client,
    op: &mut Operator,
    rec: &mut Recorder,
) {
    let (wave, monitor) = wave(client, "fcrd", true).await;
    wave.drift_all().await.unwrap();
    let first = drain_started(&wave, &[]).await;
    let policy_spec = Api::<GpuNodePolicy>::all(client.clone())
        .get(&wave.policy)
        .await
        .unwrap()
        .spec;
    let removed = Instant::now();
    // The CRDs go only once every policy is gone, i.e. once the operator has run each policy's
    // cleanup and removed its finalizer.
    crds::uninstall(client, DEADLINE).await.unwrap();
    let mut checks = vec![released_check(client, &wave).await];
    let cleanup_ms = record::elapsed_ms(removed);
    crds::install(client).await.unwrap();
    crds::create_policy(client, &wave.policy, serde_json::to_value(&policy_spec).unwrap())
        .await
        .unwrap();
    let back = jiff::Timestamp::now();
    // The probes write their reports again: still the fatal XID, and the bystander healthy.
    wave.drift_all().await.unwrap();
    if let Some(n) = &wave.bystander {
        reports::publish(client, n, wave::report_status(false, "boot-1"))
            .await
            .unwrap();
    }
    let resumed = drain_started(&wave, &[]).await;
    let recovery = record::first_write_ms(&fc.audit().unwrap(), &op.user(), back);
    wave.release_pdb().await.unwrap();
    wave.drive(DEADLINE * 2).await.unwrap();
    checks[0].detail = format!(
        "{first} was draining; released {cleanup_ms} ms after the deletion; {resumed} drained first after \
         the reinstall; {}",
        checks[0].detail
    );
    checks.push(alive(op));
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: "control plane".into(),
        fault: "gpunode's CRDs deleted mid-drain (policies and reports with them), then reinstalled".into(),
        seed: None,
        checks,
        recovery: recovery.map(|ms| Until::Acting.after(ms)),
    })
    .unwrap();
    wave.cleanup().await;
}

/// etcd's pid as ctl.sh knows it.
fn etcd_pid(fc: &FaultCluster) -> Option<String> {
    std::fs::read_to_string(fc.dir.join("run/etcd.pid"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// etcd stopped (TERM, then started again from the same data) while a drain is held.
async fn etcd_restarted(fc: &FaultCluster, client: &Client, op: &mut Operator, rec: &mut Recorder) {
    let (wave, monitor) = wave(client, "fetcd", true).await;
    wave.drift_all().await.unwrap();
    drain_started(&wave, &[]).await;
    let pid_before = etcd_pid(fc);
    let guard = Restore::new(fc, "etcd", "start");
    fc.ctl("stop", "etcd").await.unwrap();
    let down = fc.ctl("pid", "etcd").await.is_err();
    cluster::hold("etcd down", outage() / 3).await.unwrap();
    fc.ctl("start", "etcd").await.unwrap();
    guard.done();
    let started = jiff::Timestamp::now();
    wait::until("the API server to read from etcd again", DEADLINE, || async {
        Ok(wave.nodes_now().await.ok().map(|_| ()))
    })
    .await
    .unwrap();
    let pid_after = etcd_pid(fc);
    wave.release_pdb().await.unwrap();
    wave.drive(DEADLINE * 2).await.unwrap();
    let recovery = record::first_write_ms(&fc.audit().unwrap(), &op.user(), started);
    let mut checks = vec![
        Check::new(
            "etcd was down and restarted (a new process)",
            down && pid_before.is_some() && pid_after.is_some() && pid_before != pid_after,
            format!("pid {pid_before:?} -> {pid_after:?}, down between: {down}"),
        ),
        alive(op),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: "control plane".into(),
        fault: format!(
            "etcd stopped {} s mid-drain and restarted",
            (outage() / 3).as_secs()
        ),
        seed: None,
        checks,
        recovery: recovery.map(|ms| Until::Acting.after(ms)),
    })
    .unwrap();
    wave.cleanup().await;
}

const THROTTLE: &str = "rel-faults-throttle";
const BALLAST: &str = "rel-faults-ballast";

/// Sends every request of `op` to a priority level of one seat that rejects what does not fit.
/// The level's seats are its share of the server's: a ballast level (matched by no schema)
/// takes enough shares that the operator's gets one seat, and it may borrow none.
async fn throttle(client: &Client, op: &Operator) -> Result<(), gpunode_e2e::Error> {
    let pp = PatchParams::apply("gpunode-rel").force();
    let levels = Api::<PriorityLevelConfiguration>::all(client.clone());
    for (name, shares, lendable) in [(BALLAST, 500, 100), (THROTTLE, 1, 0)] {
        let level = json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
            "metadata": {"name": name},
            "spec": {"type": "Limited", "limited": {
                "nominalConcurrencyShares": shares, "lendablePercent": lendable, "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"}}},
        });
        levels.patch(name, &pp, &Patch::Apply(&level)).await?;
    }
    let schema = json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": THROTTLE},
        "spec": {
            "priorityLevelConfiguration": {"name": THROTTLE},
            // Before every suggested schema but `exempt` (1).
            "matchingPrecedence": 2,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount",
                              "serviceAccount": {"name": op.identity, "namespace": op.namespace}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                   "clusterScope": true, "namespaces": ["*"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    });
    let schemas = Api::<FlowSchema>::all(client.clone());
    schemas.patch(THROTTLE, &pp, &Patch::Apply(&schema)).await?;
    // The API server marks a schema it has taken up (Dangling names whether its level exists).
    wait::until("the FlowSchema to be in effect", DEADLINE, || async {
        let s = schemas.get(THROTTLE).await?;
        let taken_up = s
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_.as_deref() == Some("Dangling") && c.status.as_deref() == Some("False"));
        Ok(taken_up.then_some(()))
    })
    .await
}

async fn unthrottle(client: &Client) {
    let _ = Api::<FlowSchema>::all(client.clone())
        .delete(THROTTLE, &DeleteParams::default())
        .await;
    for name in [THROTTLE, BALLAST] {
        let _ = Api::<PriorityLevelConfiguration>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await;
    }
}

/// Removes the throttle if the test fails while it is in place (from a thread of its own with a
/// client of its own: the test's runtime is unwinding).
struct Unthrottle(Option<FaultCluster>);

impl Drop for Unthrottle {
    fn drop(&mut self) {
        if let Some(fc) = self.0.take() {
            let _ = std::thread::spawn(move || {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    rt.block_on(async {
                        if let Ok(client) = fc.client().await {
                            unthrottle(&client).await;
                        }
                    });
                }
            })
            .join();
        }
    }
}

/// 429s the API server answered `user` since `since` (the audit log has writes and lists).
fn rejected(fc: &FaultCluster, user: &str, since: jiff::Timestamp) -> Vec<AuditEvent> {
    fc.audit()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.user == user && e.code == 429 && e.at > since)
        .collect()
}

/// The operator throttled to one seat with rejection during a wave (no PDB: the wave drains
/// under the throttle as far as it gets), then the schema removed.
async fn throttled(fc: &FaultCluster, client: &Client, op: &mut Operator, rec: &mut Recorder) {
    let (wave, monitor) = wave(client, "fapf", false).await;
    let since = jiff::Timestamp::now();
    let mut guard = Unthrottle(Some(fc.clone()));
    throttle(client, op).await.unwrap();
    wave.drift_all().await.unwrap();
    let user = op.user();
    wait::until("the API server to answer the operator 429", DEADLINE, || async {
        Ok((!rejected(fc, &user, since).is_empty()).then_some(()))
    })
    .await
    .unwrap();
    cluster::hold("the operator throttled", outage() / 6)
        .await
        .unwrap();
    let during = wave.alive_pods().await.unwrap();
    unthrottle(client).await;
    guard.0 = None;
    let lifted = jiff::Timestamp::now();
    wave.drive(DEADLINE * 2).await.unwrap();
    let recovery = record::first_write_ms(&fc.audit().unwrap(), &user, lifted);
    let refused = rejected(fc, &user, since);
    let mut by_kind: std::collections::BTreeMap<String, usize> = Default::default();
    for e in &refused {
        *by_kind
            .entry(format!("{} {}/{}", e.verb, e.resource, e.subresource))
            .or_default() += 1;
    }
    let mut checks = vec![
        Check::new(
            "the operator was throttled (429s in the audit log)",
            !refused.is_empty(),
            format!(
                "{} requests answered 429: {by_kind:?}; pods alive when lifted: {during:?}",
                refused.len()
            ),
        ),
        alive(op),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: "control plane".into(),
        fault: format!(
            "API server answering the operator 429 (one seat, Reject) {} s into a wave",
            (outage() / 6).as_secs()
        ),
        seed: None,
        checks,
        recovery: recovery.map(|ms| Until::Acting.after(ms)),
    })
    .unwrap();
    wave.cleanup().await;
}

/// A validating webhook on the wave's node updates (merge patches are UPDATEs to admission) and
/// its pods' evictions, served at `url`; scoped to the wave's nodes and namespace only.
async fn install_webhook(
    client: &Client,
    name: &str,
    wave: &Wave,
    url: &str,
    failure_policy: &str,
    timeout_s: i32,
) -> Result<(), gpunode_e2e::Error> {
    let hook = |hook: &str, resource: &str, op: &str, scope: &str| {
        let mut h = json!({
            "name": format!("{hook}.rel.gpunode.test"),
            "clientConfig": {"url": url},
            "rules": [{"operations": [op], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": [resource], "scope": scope}],
            "failurePolicy": failure_policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": timeout_s,
        });
        if scope == "Cluster" {
            h["objectSelector"] = json!({"matchLabels": {wave::RUN_LABEL: wave.id}});
        } else {
            h["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": wave.namespace}});
        }
        h
    };
    let config = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [hook("nodes", "nodes", "UPDATE", "Cluster"),
                     hook("evictions", "pods/eviction", "CREATE", "Namespaced")],
    });
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("gpunode-rel").force(),
            &Patch::Apply(&config),
        )
        .await?;
    Ok(())
}

async fn remove_webhook(client: &Client, name: &str) {
    let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The operator's requests on the wave refused by the API server (not 429, which is a PDB)
/// since `since`.
fn refused_writes(events: &[AuditEvent], user: &str, wave: &Wave, since: jiff::Timestamp) -> Vec<AuditEvent> {
    events
        .iter()
        .filter(|e| e.user == user && e.at > since && e.is_write() && e.code >= 400 && e.code != 429)
        .filter(|e| {
            e.is_eviction_in(&wave.namespace) || (e.resource == "nodes" && wave.nodes.contains(&e.name))
        })
        .cloned()
        .collect()
}

/// An admission webhook that is down (failurePolicy Fail) installed while a drain is held, the
/// PDB lifted under it, then the webhook removed.
async fn webhook_down(fc: &FaultCluster, client: &Client, op: &mut Operator, rec: &mut Recorder) {
    const NAME: &str = "rel-faults-down";
    let (wave, monitor) = wave(client, "fhook", true).await;
    wave.drift_all().await.unwrap();
    let first = drain_started(&wave, &[]).await;
    let since = jiff::Timestamp::now();
    let url = format!("https://127.0.0.1:{}/", closed_port());
    install_webhook(client, NAME, &wave, &url, "Fail", 2)
        .await
        .unwrap();
    let user = op.user();
    // The API server loads webhook configurations asynchronously: the PDB is lifted only once
    // the webhook has refused a write, or an eviction could get in before it is in effect.
    let in_effect = wait::until("the webhook to refuse the operator", DEADLINE, || async {
        Ok(refused_writes(&fc.audit()?, &user, &wave, since)
            .first()
            .map(|e| e.at))
    })
    .await
    .unwrap();
    // Evictions would go through now, but for the webhook.
    wave.release_pdb().await.unwrap();
    cluster::hold("admission down", outage() / 6).await.unwrap();
    let until = jiff::Timestamp::now();
    let during = wave.alive_pods().await.unwrap();
    remove_webhook(client, NAME).await;
    let removed = Instant::now();
    wave.drive(DEADLINE * 2).await.unwrap();
    let recovery = record::elapsed_ms(removed);
    let audit = fc.audit().unwrap();
    let refused = refused_writes(&audit, &user, &wave, since);
    let through: Vec<String> = audit
        .iter()
        .filter(|e| e.is_eviction_in(&wave.namespace) && e.succeeded() && e.at > in_effect && e.at < until)
        .map(|e| e.name.clone())
        .collect();
    let mut checks = vec![
        Check::new(
            "the webhook refused the operator's writes while down, and nothing got past it",
            !refused.is_empty() && through.is_empty() && during.get(&first).copied() == Some(2),
            format!(
                "{} writes refused (codes {:?}); evicted while it was down: {through:?}; pods alive on {first}: {:?}",
                refused.len(),
                refused
                    .iter()
                    .map(|e| e.code)
                    .collect::<std::collections::BTreeSet<_>>(),
                during.get(&first)
            ),
        ),
        alive(op),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: "admission".into(),
        fault: format!(
            "validating webhook down (failurePolicy Fail) {} s mid-drain on node updates and evictions",
            (outage() / 6).as_secs()
        ),
        seed: None,
        checks,
        recovery: Some(Until::Converged.after(recovery)),
    })
    .unwrap();
    wave.cleanup().await;
}

/// Audit lines of `user` whose webhook failed open (the API server annotates them), with how long
/// each request took.
fn failed_open(fc: &FaultCluster, user: &str) -> Vec<(String, f64)> {
    let dir = fc
        .audit_log
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return out;
    };
    for f in entries.filter_map(Result::ok).map(|e| e.path()) {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !(name.starts_with("audit") && name.ends_with(".log")) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for line in text
            .lines()
            .filter(|l| l.contains("failed-open.validating.webhook.admission.k8s.io"))
        {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v.pointer("/user/username").and_then(|u| u.as_str()) != Some(user) {
                continue;
            }
            let at = |p: &str| {
                v.pointer(p)
                    .and_then(|t| t.as_str())
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            };
            let took = match (at("/requestReceivedTimestamp"), at("/stageTimestamp")) {
                (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
                _ => 0.0,
            };
            let what = format!(
                "{} {}/{}",
                v.pointer("/verb").and_then(|x| x.as_str()).unwrap_or_default(),
                v.pointer("/objectRef/resource")
                    .and_then(|x| x.as_str())
                    .unwrap_or_default(),
                v.pointer("/objectRef/subresource")
                    .and_then(|x| x.as_str())
                    .unwrap_or_default()
            );
            out.push((what, took));
        }
    }
    out
}

/// A webhook that never answers (a loopback listener that accepts no connection), failing open
/// after its 1 s timeout, on every node update and eviction of a whole wave.
async fn webhook_hangs(fc: &FaultCluster, client: &Client, op: &mut Operator, rec: &mut Recorder) {
    const NAME: &str = "rel-faults-slow";
    // Connections queue in the backlog and the TLS handshake is never answered.
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = black_hole.local_addr().unwrap().port();
    let (wave, monitor) = wave(client, "fslow", false).await;
    let before = failed_open(fc, &op.user()).len();
    install_webhook(
        client,
        NAME,
        &wave,
        &format!("https://127.0.0.1:{port}/"),
        "Ignore",
        1,
    )
    .await
    .unwrap();
    wave.drift_all().await.unwrap();
    let start = Instant::now();
    let driven = wave.drive(DEADLINE * 2).await;
    let wave_ms = record::elapsed_ms(start);
    remove_webhook(client, NAME).await;
    drop(black_hole);
    driven.unwrap();
    let slow = failed_open(fc, &op.user());
    let slow = &slow[before.min(slow.len())..];
    let mut kinds: std::collections::BTreeMap<&str, usize> = Default::default();
    for (what, _) in slow {
        *kinds.entry(what.as_str()).or_default() += 1;
    }
    let min_took = slow.iter().map(|(_, t)| *t).fold(f64::INFINITY, f64::min);
    let mut checks = vec![
        Check::new(
            "the webhook hung on the operator's writes, which went through after its timeout",
            !slow.is_empty() && min_took >= 0.9,
            format!(
                "{} writes failed open ({kinds:?}), the quickest in {min_took:.2} s; wave done in {wave_ms} ms",
                slow.len()
            ),
        ),
        alive(op),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: "slow control plane".into(),
        fault: "validating webhook hanging (failurePolicy Ignore, timeoutSeconds 1) through a wave".into(),
        seed: None,
        checks,
        recovery: Some(Until::WaveUnderFault.after(wave_ms)),
    })
    .unwrap();
    wave.cleanup().await;
}
