//! Drain on the real API server: a fatal XID cordons the node and evicts its pods through the
//! Eviction API while a PodDisruptionBudget holds one back until the budget allows; an operator
//! killed mid-drain is replaced by a fresh one that finishes the same drain without starting
//! over. (A separate test binary: one operator per process.)

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, pods, reports, scratch::Scratch,
    scratch::rand_suffix, wait,
};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    events::v1::Event,
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

async fn publish_report(client: &Client, node: &str, xids: serde_json::Value) {
    let status = json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "gpuCount": 1,
        "gpus": [{"index": 0, "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
                  "xids": xids}],
    });
    reports::publish(client, node, status).await.unwrap();
}

/// The policy's drain grace period, shorter than the pods' own.
const DRAIN_GRACE_S: i64 = 7;

fn pod(name: &str, node: &str) -> Pod {
    let mut p = pods::on_node(name, node, json!({"app": "train"})).unwrap();
    if let Some(spec) = p.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(600);
    }
    p
}

/// Pod name → the grace period its deletion was given.
type Graces = Arc<Mutex<BTreeMap<String, Option<i64>>>>;

/// The grace period each pod of `pods` was given when its deletion began, as the first watch
/// event with a deletion timestamp shows it (whatever shortens it afterwards).
fn deletion_graces(pods: Api<Pod>) -> (Graces, tokio::task::JoinHandle<()>) {
    let seen: Graces = Arc::default();
    let sink = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(p) = event else { continue };
            if p.metadata.deletion_timestamp.is_some()
                && let Ok(mut seen) = sink.lock()
            {
                seen.entry(p.metadata.name.clone().unwrap_or_default())
                    .or_insert(p.metadata.deletion_grace_period_seconds);
            }
        }
    });
    (seen, task)
}

async fn ready(api: &Api<Pod>, name: &str) {
    pods::running(api, name, DEADLINE).await.unwrap();
}

/// Pods still on the node and not terminating.
async fn alive(pods: &Api<Pod>, names: &[&str]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for n in names {
        if let Ok(Some(p)) = pods.get_opt(n).await
            && p.metadata.deletion_timestamp.is_none()
        {
            out.insert((*n).to_string());
        }
    }
    out
}

fn annotation(node: &Node, key: &str) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key).cloned())
}

#[tokio::test]
async fn an_xid_drains_the_node_within_its_pdb_and_a_restarted_operator_finishes_the_same_drain() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    // Fixtures are made as admin; only the operator runs as the chart's ServiceAccount.
    let operator_client = chart::operator_client(&client).await.unwrap();
    let id = format!("{:06x}", rand_suffix());
    let (bad, spare) = (format!("drain-{id}"), format!("spare-{id}"));
    nodes::create(
        &client,
        &[bad.clone(), spare.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let ns = Scratch::new(&client, "drain").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "train"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}}))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    for p in ["a", "b"] {
        pods.create(&PostParams::default(), &pod(p, &bad)).await.unwrap();
        ready(&pods, p).await;
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns.name);
    wait::until("PDB to count both pods", DEADLINE, || async {
        let s = pdbs.get("train").await?.status.unwrap_or_default();
        Ok((s.current_healthy == 2 && s.disruptions_allowed == 1).then_some(()))
    })
    .await
    .unwrap();

    publish_report(&client, &bad, json!([])).await;
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    crds::create_policy(
        &client,
        &bad,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": bad}},
            "gpu": {},
            "remediation": [{"classes": ["Xid"], "action": "Drain"}],
            "disruption": {"drain": {"gracePeriodSeconds": DRAIN_GRACE_S}},
        }),
    )
    .await
    .unwrap();

    let node_api: Api<Node> = Api::all(client.clone());
    let (graces, grace_watch) = deletion_graces(pods.clone());
    let first = InProcess::start(&operator_client, "e2e-drain");
    wait::until("node labelled compliant", DEADLINE, || async {
        let n = node_api.get(&bad).await?;
        Ok((n
            .metadata
            .labels
            .unwrap_or_default()
            .get("gpunode.dev/state")
            .map(String::as_str)
            == Some("compliant"))
        .then_some(()))
    })
    .await
    .unwrap();

    publish_report(
        &client,
        &bad,
        json!([{"xid": 79, "at": jiff::Timestamp::now().to_string()}]),
    )
    .await;
    let cordoned = wait::until("cordon and drain start", DEADLINE, || async {
        let n = node_api.get(&bad).await?;
        let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        Ok((unschedulable && annotation(&n, "gpunode.dev/drain-started").is_some()).then_some(n))
    })
    .await
    .unwrap();
    assert_eq!(
        annotation(&cordoned, "gpunode.dev/cordoned").as_deref(),
        Some("true")
    );
    let started = annotation(&cordoned, "gpunode.dev/drain-started");

    // The budget lets exactly one pod go; the other is held back.
    let held = wait::until("one pod evicted, one held back", DEADLINE, || async {
        let left = alive(&pods, &["a", "b"]).await;
        Ok((left.len() == 1).then_some(left))
    })
    .await
    .unwrap();
    let held = held.into_iter().next().expect("no pod left");

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let drain_events = || async {
        let list = events.list(&ListParams::default()).await?;
        Ok::<usize, kube::Error>(
            list.items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(bad.as_str()))
                .filter(|e| e.reason.as_deref() == Some("DrainStarted"))
                .count(),
        )
    };
    wait::until("the DrainStarted event", DEADLINE, || async {
        Ok((drain_events().await? >= 1).then_some(()))
    })
    .await
    .unwrap();

    // Kill the operator mid-drain (no graceful shutdown), then start a fresh one.
    first.kill().await;
    let second = InProcess::start(&operator_client, "e2e-drain");

    // A new healthy replica elsewhere frees the budget: the held pod is evicted now.
    pods.create(&PostParams::default(), &pod("c", &spare))
        .await
        .unwrap();
    ready(&pods, "c").await;
    wait::until(&format!("held-back pod {held} evicted"), DEADLINE, || async {
        Ok(alive(&pods, &[held.as_str()]).await.is_empty().then_some(()))
    })
    .await
    .unwrap();
    assert!(
        !alive(&pods, &["c"]).await.is_empty(),
        "the pod on the healthy node stays"
    );
    // Each eviction carried the policy's grace period, not the pods' own 600 s.
    let graces = wait::until("both evictions seen by the watch", DEADLINE, || async {
        let g = graces.lock().map(|g| g.clone()).unwrap_or_default();
        Ok((g.len() == 2).then_some(g))
    })
    .await
    .unwrap();
    grace_watch.abort();
    assert_eq!(
        graces,
        BTreeMap::from([
            ("a".to_string(), Some(DRAIN_GRACE_S)),
            ("b".to_string(), Some(DRAIN_GRACE_S))
        ]),
        "the grace period each evicted pod was given"
    );

    // The same drain was resumed, not started over.
    let n = node_api.get(&bad).await.unwrap();
    assert_eq!(annotation(&n, "gpunode.dev/drain-started"), started);
    let drain_started = drain_events().await.unwrap();
    assert_eq!(drain_started, 1, "one DrainStarted event across both operators");

    // Deleting the policy undoes what it did: cordon, labels, annotations, condition.
    policies.delete(&bad, &Default::default()).await.unwrap();
    let released = wait::until("node released by the deleted policy", DEADLINE, || async {
        let n = node_api.get(&bad).await?;
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let annotations = n.metadata.annotations.clone().unwrap_or_default();
        let conditions = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let clean = !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
            && !labels.keys().any(|k| k.starts_with("gpunode.dev/"))
            && !annotations.keys().any(|k| k.starts_with("gpunode.dev/"))
            && !conditions.iter().any(|c| c.type_ == "GpuPolicyCompliant");
        Ok(clean.then_some(n))
    })
    .await
    .unwrap();
    assert!(
        released
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("nvidia.com/gpu.product")
    );
    wait::until("policy gone (finalizer removed)", DEADLINE, || async {
        Ok(policies.get_opt(&bad).await?.is_none().then_some(()))
    })
    .await
    .unwrap();

    second.stop().await.unwrap();
    ns.delete().await.unwrap();
}
