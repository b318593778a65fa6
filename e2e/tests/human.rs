//! People win, on the real API server (the operator in-process):
//!
//! - a node a person cordoned before it drifted stays cordoned through the drift, the drain and
//!   the recovery: gpunode never uncordons what it did not cordon, and never claims that
//!   cordon as its own; a person's taint on it survives too;
//! - a person who uncordons a node gpunode cordoned for a drain cancels the drain, and gpunode
//!   does not cordon it again while the drift lasts; a cordon that person adds afterwards is
//!   theirs and survives the recovery;
//! - heart-beating reports (a fresh `observedAt`, other temperatures, the same verdict) make
//!   no Node writes at all.
//!
//! One test function with one operator: the controller reconciles every policy in the cluster,
//! so a second in-process operator would fight over the same nodes.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, reports, scratch::rand_suffix, wait,
};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);
const CORDONED: &str = "gpunode.dev/cordoned";
const DRAIN_STARTED: &str = "gpunode.dev/drain-started";
const USER_UNCORDONED: &str = "gpunode.dev/uncordoned-by-user";
const CLASSES: &str = "gpunode.dev/classes";

/// A report with these fatal XIDs (empty: healthy) and this GPU temperature.
async fn publish(client: &Client, node: &str, xids: &[u32], celsius: u32) {
    let at = jiff::Timestamp::now().to_string();
    let xids: Vec<serde_json::Value> = xids.iter().map(|x| json!({"xid": x, "at": at})).collect();
    let status = json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "gpuCount": 1,
        "gpus": [{"index": 0, "temperatureCelsius": celsius,
                  "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
                  "xids": xids}],
    });
    reports::publish(client, node, status).await.unwrap();
}

fn annotation(node: &Node, key: &str) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key).cloned())
}

fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref().and_then(|l| l.get(key).cloned())
}

fn unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
}

fn condition(node: &Node) -> Option<NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuPolicyCompliant").cloned())
}

fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect()
}

/// What a person does with kubectl cordon/uncordon.
async fn set_unschedulable(api: &Api<Node>, node: &str, on: bool) {
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"unschedulable": on}})),
    )
    .await
    .unwrap();
}

async fn until_node(api: &Api<Node>, node: &str, what: &str, ok: impl Fn(&Node) -> bool) -> Node {
    wait::until(&format!("{node}: {what}"), DEADLINE, || async {
        let n = api.get(node).await?;
        Ok(ok(&n).then_some(n))
    })
    .await
    .unwrap()
}

/// Compliant again and every bookkeeping annotation gone: `healthyFor` has passed and the
/// recovery is complete (the condition is written last, the annotations go with the labels).
fn recovered(n: &Node) -> bool {
    label(n, "gpunode.dev/state").as_deref() == Some("compliant")
        && condition(n).is_some_and(|c| c.status == "True")
        && [CLASSES, DRAIN_STARTED, USER_UNCORDONED, CORDONED]
            .iter()
            .all(|k| annotation(n, k).is_none())
}

#[tokio::test]
async fn gpunode_never_lifts_a_cordon_it_did_not_set_and_a_human_uncordon_cancels_its_drain() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let client = admin_client().await.unwrap();
    // The operator acts as the chart's ServiceAccount; the test plays the people with admin.
    let operator_client = chart::operator_client(&client).await.unwrap();
    let id = format!("{:06x}", rand_suffix());
    let (early, late) = (format!("human-early-{id}"), format!("human-late-{id}"));
    nodes::create(
        &client,
        &[early.clone(), late.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let api: Api<Node> = Api::all(client.clone());

    // A person cordoned `early` and tainted it before gpunode ever saw it drift.
    set_unschedulable(&api, &early, true).await;
    let taint = json!({"spec": {"taints": [{"key": "example.com/repair", "value": "ticket-42", "effect": "NoSchedule"}]}});
    api.patch(&early, &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .unwrap();
    for n in [&early, &late] {
        publish(&client, n, &[], 40).await;
    }

    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    crds::create_policy(
        &client,
        &format!("human-{id}"),
        json!({
            "nodeSelector": {"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [early, late]}]},
            "gpu": {"fatalXids": [48, 79]},
            "remediation": [{"classes": ["Xid"], "action": "Drain"}],
            // Both nodes drift at once on purpose: neither the budget nor the breaker may
            // hold one back.
            "disruption": {"maxUnavailable": "100%", "circuitBreaker": {"maxDriftedPercent": 100}},
            "recovery": {"healthyFor": "2s"},
            "staleAfter": "10m",
        }),
    )
    .await
    .unwrap();

    let operator = InProcess::start(&operator_client, "e2e-human");
    let metrics = operator.metrics.clone();
    for n in [&early, &late] {
        until_node(&api, n, "compliant", recovered).await;
    }

    // Heartbeats: a fresh observedAt and another temperature, the same verdict. They are seen
    // and skipped, and nothing is written to any node.
    let (writes, skipped) = (metrics.node_writes(), metrics.watch_events("report", false));
    for (i, celsius) in [41, 43, 42].into_iter().enumerate() {
        for n in [&early, &late] {
            publish(&client, n, &[], celsius).await;
        }
        let want = skipped + 2 * (i as u64 + 1);
        wait::until("heartbeats seen and skipped", DEADLINE, || async {
            Ok((metrics.watch_events("report", false) >= want).then_some(()))
        })
        .await
        .unwrap();
    }
    assert_eq!(metrics.node_writes(), writes, "heartbeats wrote to a node");

    // Both drift: gpunode drains both, but cordons only `late`; `early`'s cordon stays the
    // person's (no marker claims it).
    for n in [&early, &late] {
        publish(&client, n, &[79], 40).await;
    }
    let n = until_node(&api, &early, "draining", |n| {
        annotation(n, DRAIN_STARTED).is_some()
            // With no pods to evict the drain may already be done when this looks.
            && condition(n).is_some_and(|c| matches!(c.reason.as_deref(), Some("Draining" | "Drained")))
    })
    .await;
    assert!(unschedulable(&n));
    assert_eq!(
        annotation(&n, CORDONED),
        None,
        "gpunode claimed a person's cordon"
    );
    until_node(&api, &late, "cordoned and draining by gpunode", |n| {
        unschedulable(n)
            && annotation(n, CORDONED).as_deref() == Some("true")
            && annotation(n, DRAIN_STARTED).is_some()
    })
    .await;

    // A person uncordons `late` mid-drain: the drain is cancelled and remembered.
    set_unschedulable(&api, &late, false).await;
    let n = until_node(&api, &late, "drain cancelled by the uncordon", |n| {
        annotation(n, USER_UNCORDONED).is_some()
            && annotation(n, DRAIN_STARTED).is_none()
            && annotation(n, CORDONED).is_none()
    })
    .await;
    assert!(
        !unschedulable(&n),
        "gpunode re-cordoned after a person uncordoned"
    );

    // The drift goes on (another fatal XID): gpunode acts on it (the condition names it) but
    // does not cordon again. The condition is the last write of a reconcile, so the cordon
    // decision of that reconcile is already applied when it shows.
    publish(&client, &late, &[79, 48], 40).await;
    let n = until_node(&api, &late, "the new XID reported in the condition", |n| {
        condition(n)
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("XID 48"))
    })
    .await;
    assert!(
        !unschedulable(&n),
        "gpunode cordoned again while the person's uncordon stands"
    );
    assert!(annotation(&n, USER_UNCORDONED).is_some());

    // Now the person cordons `late` themselves; both nodes recover.
    set_unschedulable(&api, &late, true).await;
    for n in [&early, &late] {
        publish(&client, n, &[], 40).await;
    }
    for node in [&early, &late] {
        let n = until_node(&api, node, "recovered (healthyFor passed)", recovered).await;
        assert!(unschedulable(&n), "{node}: gpunode lifted a person's cordon");
    }
    let n = api.get(&early).await.unwrap();
    assert!(
        taint_keys(&n).contains(&"example.com/repair".to_string()),
        "a person's taint went missing: {:?}",
        taint_keys(&n)
    );

    policies
        .delete(&format!("human-{id}"), &Default::default())
        .await
        .unwrap();
    wait::until("policy gone (finalizer removed)", DEADLINE, || async {
        Ok(policies
            .get_opt(&format!("human-{id}"))
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .unwrap();
    for node in [&early, &late] {
        let n = api.get(node).await.unwrap();
        assert!(
            unschedulable(&n),
            "{node}: releasing the policy lifted a person's cordon"
        );
    }
    operator.stop().await.unwrap();
    for node in [&early, &late] {
        let _ = api.delete(node, &Default::default()).await;
    }
}
