//! Manual approval on the real API server: a drain that requires approval waits, the node's
//! condition and an AwaitingApproval event print the command, and once a person runs it (the
//! annotation `gpunode.dev/approve`) the node is cordoned and drained; once it recovers it is
//! uncordoned and the approval removed.
//!
//! (A separate test binary: one operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, reports, scratch::rand_suffix, wait,
};
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);

fn report(driver: &str) -> serde_json::Value {
    reports::one_gpu(driver, "boot-1", json!([]))
}

#[tokio::test]
async fn a_drain_that_requires_approval_waits_for_the_annotation_the_event_prints() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let node = format!("approval-{:06x}", rand_suffix());
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    reports::publish(&client, &node, report("550.54.15"))
        .await
        .unwrap();
    crds::create_policy(
        &client,
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {"driverVersion": ">=550"},
            "remediation": [{"classes": ["Driver"], "action": "Drain", "requireApproval": true}],
            "disruption": {"maxUnavailable": 1, "circuitBreaker": {"maxDriftedPercent": 100}},
            "recovery": {"healthyFor": "2s"},
            "staleAfter": "5m",
        }),
    )
    .await
    .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e-approval");
    nodes::until_labelled(&client, &node, &[("gpunode.dev/state", "compliant")], DEADLINE)
        .await
        .unwrap();
    reports::publish(&client, &node, report("535.129.03"))
        .await
        .unwrap();

    let api: Api<Node> = Api::all(client.clone());
    let command = format!("kubectl annotate --overwrite node {node} gpunode.dev/approve=Drain");
    let (reason, message) = wait::until("the node to await approval", DEADLINE, || async {
        let c = nodes::compliance(&api.get(&node).await?);
        Ok((c.0 == "AwaitingApproval").then_some(c))
    })
    .await
    .unwrap();
    assert!(message.contains(&command), "{reason}: {message}");
    assert!(!nodes::cordoned(&api.get(&node).await.unwrap()));
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let note = wait::until("the AwaitingApproval event", DEADLINE, || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str()))
            .find(|e| e.reason.as_deref() == Some("AwaitingApproval"))
            .and_then(|e| e.note))
    })
    .await
    .unwrap();
    assert!(note.ends_with(&command), "{note}");

    // What the command does.
    let patch = json!({"metadata": {"annotations": {"gpunode.dev/approve": "Drain"}}});
    api.patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait::until("the approved node cordoned and drained", DEADLINE, || async {
        let n = api.get(&node).await?;
        Ok((nodes::cordoned(&n) && nodes::compliance(&n).0 == "Drained").then_some(()))
    })
    .await
    .unwrap();

    // Recovered: uncordoned after healthyFor, and the approval goes with the incident.
    reports::publish(&client, &node, report("550.54.15"))
        .await
        .unwrap();
    wait::until(
        "the recovered node uncordoned and its approval removed",
        DEADLINE,
        || async {
            let n = api.get(&node).await?;
            let approved = n
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("gpunode.dev/approve"));
            Ok((!nodes::cordoned(&n) && !approved).then_some(()))
        },
    )
    .await
    .unwrap();

    operator.stop().await.unwrap();
    let _ = Api::<GpuNodePolicy>::all(client.clone())
        .delete(&node, &Default::default())
        .await;
}
