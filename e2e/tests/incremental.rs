//! Incremental planning (`--planning incremental`) on the real API server: with thirty nodes
//! under one policy, a throttled report on one of them taints that node and its recovery
//! untaints it, and together the two changes make fewer node plans than one whole pass of the
//! policy, with no whole pass between them (`gpunode_node_plans_total`); the other nodes are
//! never written. The suite as a whole runs incrementally with `GPUNODE_PLANNING=incremental`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, reports, scratch::rand_suffix, wait,
};
use gpunode_operator::policy_state::Planning;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);
const NODES: usize = 30;

fn report(throttle: &[&str]) -> serde_json::Value {
    json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "driverVersion": "550.90.07",
        "gpuCount": 1,
        "gpus": [{"index": 0, "product": "NVIDIA H100 80GB HBM3", "temperatureCelsius": 70,
                  "slowdownCelsius": 87, "throttleReasons": throttle}],
    })
}

fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref().and_then(|l| l.get(key).cloned())
}

fn tainted(node: &Node) -> bool {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    taints.is_some_and(|ts| ts.iter().any(|t| t.key == "gpunode.dev/drift"))
}

#[tokio::test]
async fn one_changed_node_of_thirty_is_planned_without_a_whole_pass() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let policy = format!("inc-{:06x}", rand_suffix());
    let names: Vec<String> = (0..NODES).map(|i| format!("{policy}-{i:02}")).collect();
    nodes::create(&client, &names, &nodes::GpuNodeShape::default())
        .await
        .unwrap();
    for n in &names {
        reports::publish(&client, n, report(&[])).await.unwrap();
    }
    crds::create_policy(
        &client,
        &policy,
        json!({
            "nodeSelector": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": names}]},
            "cooling": {},
            "remediation": [{"classes": ["Throttle"], "action": "Taint", "effect": "NoSchedule"}],
            "recovery": {"healthyFor": "2s"},
            "staleAfter": "5m",
        }),
    )
    .await
    .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start_with(
        &operator_client,
        "e2e-incremental",
        gpunode_crds::MaxUnavailable::Percent(100),
        Planning::Incremental,
    );
    let node_api: Api<Node> = Api::all(client.clone());
    let compliant = |node_api: Api<Node>, names: Vec<String>| async move {
        wait::until("every node labelled compliant", DEADLINE, || async {
            let mut all = true;
            for n in &names {
                let node = node_api.get(n).await?;
                all &= label(&node, "gpunode.dev/state").as_deref() == Some("compliant") && !tainted(&node);
            }
            Ok(all.then_some(()))
        })
        .await
    };
    compliant(node_api.clone(), names.clone()).await.unwrap();
    // The whole first pass wrote every node; each write, read back by the node watch, is
    // planned once more (what was written is then what the view shows). Measured from there.
    let metrics = operator.metrics.clone();
    wait::until("the first pass's writes read back", DEADLINE, || async {
        let (_, partial) = metrics.node_plans_of(&policy);
        Ok::<_, gpunode_e2e::Error>((partial >= NODES as u64).then_some(()))
    })
    .await
    .unwrap();
    let versions = |node_api: Api<Node>, names: Vec<String>| async move {
        let mut v = Vec::new();
        for n in &names {
            v.push(node_api.get(n).await?.metadata.resource_version);
        }
        Ok::<_, kube::Error>(v)
    };
    let others: Vec<String> = names.iter().filter(|n| **n != names[7]).cloned().collect();
    let others_before = versions(node_api.clone(), others.clone()).await.unwrap();
    let (whole_before, partial_before) = operator.metrics.node_plans_of(&policy);
    assert!(
        whole_before >= NODES as u64,
        "the first pass is whole: {whole_before}"
    );

    // One node throttles, then recovers.
    let target = names[7].clone();
    reports::publish(&client, &target, report(&["HwThermalSlowdown"]))
        .await
        .unwrap();
    wait::until("the throttled node tainted", DEADLINE, || async {
        Ok(tainted(&node_api.get(&target).await?).then_some(()))
    })
    .await
    .unwrap();
    reports::publish(&client, &target, report(&[])).await.unwrap();
    compliant(node_api.clone(), names.clone()).await.unwrap();

    let (whole, partial) = operator.metrics.node_plans_of(&policy);
    let planned = partial - partial_before;
    eprintln!(
        "node plans: whole passes {whole_before} -> {whole}, partial {partial_before} -> {partial} ({planned} for the two changes; a whole pass is {NODES})"
    );
    assert_eq!(whole, whole_before, "no whole pass for one node's changes");
    assert!(planned >= 2, "the changed node was planned: {planned}");
    assert!(
        planned < NODES as u64,
        "two changes of one node made {planned} node plans, more than a whole pass ({NODES})"
    );
    assert_eq!(
        versions(node_api.clone(), others).await.unwrap(),
        others_before,
        "no other node written"
    );
    operator.stop().await.unwrap();
}
