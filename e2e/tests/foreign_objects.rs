//! gpunode deletes only what it made (issue #43, item 3), on the real API server: a healthy node
//! whose `gpunode.dev/repair` record names objects (as a repair that is over leaves it) has them
//! deleted when the operator forgets the repair, but only those that carry gpunode's labels for
//! the node and, where the record has one, the uid gpunode recorded:
//! - another team's GpuResetRequest (no gpunode labels) named in the record survives;
//! - another team's remediation object (a `FakeReboot` of the fake remediator) survives;
//! - a GpuResetRequest with gpunode's labels but another uid than the recorded one (replaced
//!   since gpunode made it) survives;
//! - gpunode's own GpuResetRequest, recorded without a uid (a record an older gpunode wrote), is
//!   deleted as before;
//! - each refusal is counted: `gpunode_actions_total{action="delete",result="refused"}`.
//!
//! (A separate test binary: one operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::GpuResetRequest;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, remediator, reports, scratch::Scratch,
    scratch::rand_suffix, wait,
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);
/// A uid no object has: the one "recorded" for the request that was replaced since.
const OTHER_UID: &str = "0b7f6a4e-5f64-4d2c-9a43-1c2d3e4f5a6b";

fn policy(node: &str, namespace: &str) -> serde_json::Value {
    json!({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "gpu": {},
        "remediation": [{"classes": ["Xid"], "action": "Drain"}],
        "disruption": {"maxUnavailable": 2, "circuitBreaker": {"maxDriftedPercent": 100}},
        "recovery": {"healthyFor": "5s"},
        "repair": {"steps": [
            {"name": "gpu-reset", "action": "GpuReset", "classes": ["Xid"], "timeout": "60s"},
            {"name": "reboot", "action": "Remediator", "classes": ["Xid"], "timeout": "60s",
             "remediator": {
                 "apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
                 "kind": "FakeRebootTemplate", "name": "reboot", "namespace": namespace,
             }},
        ], "maxAttempts": 2, "window": "1h"},
    })
}

fn requests(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<GpuResetRequest>(&()))
}

/// Creates GPU `index`'s reset request of `node` with `labels`; returns its uid.
async fn create_request(client: &Client, node: &str, index: u32, labels: serde_json::Value) -> String {
    let ar = ApiResource::erase::<GpuResetRequest>(&());
    let mut obj = DynamicObject::new(&format!("{node}-gpu-{index}"), &ar).data(json!({
        "spec": {"nodeName": node, "index": index, "uuid": format!("GPU-0000000{index}")},
    }));
    obj.metadata.labels = serde_json::from_value(labels).unwrap();
    let made = requests(client)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
    made.metadata.uid.unwrap()
}

fn gpunode_labels(node: &str) -> serde_json::Value {
    json!({"app.kubernetes.io/managed-by": "gpunode", gpunode_crds::reset::NODE_LABEL: node})
}

fn recorded(name: &str, uid: Option<&str>) -> serde_json::Value {
    let mut r = json!({"apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuResetRequest", "name": name});
    if let Some(uid) = uid {
        r["uid"] = uid.into();
    }
    r
}

#[tokio::test]
async fn a_repair_record_naming_objects_gpunode_did_not_make_deletes_only_its_own() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let ns = Scratch::new(&client, "foreign").await.unwrap();
    remediator::install_and_grant(&client, &ns.name).await.unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();

    let id = format!("{:06x}", rand_suffix());
    let node = format!("foreign-{id}");
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    reports::publish(&client, &node, reports::one_gpu("550.54.15", "boot-1", json!([])))
        .await
        .unwrap();

    // Another team's request and remediation object, named as gpunode would name its own.
    create_request(&client, &node, 0, json!({"team": "storage"})).await;
    let reboots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &remediator::reboot_resource());
    let reboot = DynamicObject::new(&node, &remediator::reboot_resource())
        .within(&ns.name)
        .data(json!({"spec": {"behavior": "Hang"}}));
    reboots.create(&PostParams::default(), &reboot).await.unwrap();
    // gpunode's own request, in a record without uids (an older gpunode's).
    create_request(&client, &node, 1, gpunode_labels(&node)).await;
    // A request with gpunode's labels, but not the one whose uid gpunode recorded.
    create_request(&client, &node, 2, gpunode_labels(&node)).await;

    // The record a repair that is over leaves, written as the operator writes it.
    let record = json!({"objects": [
        recorded(&format!("{node}-gpu-0"), None),
        recorded(&format!("{node}-gpu-1"), None),
        recorded(&format!("{node}-gpu-2"), Some(OTHER_UID)),
        {"apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION), "kind": "FakeReboot",
         "namespace": ns.name, "name": node},
    ]});
    let nodes_api: Api<Node> = Api::all(client.clone());
    let patch = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "annotations": {"gpunode.dev/repair": record.to_string()}}});
    nodes_api
        .patch_status(
            &node,
            &PatchParams::apply(gpunode_crds::names::OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .unwrap();

    crds::create_policy(&client, &node, policy(&node, &ns.name))
        .await
        .unwrap();
    let operator = InProcess::start(&operator_client, "foreign-objects");

    // The node is compliant and not drained: the repair is over and its record forgotten.
    wait::until(&format!("{node}'s repair record forgotten"), DEADLINE, || async {
        let n = nodes_api.get(&node).await?;
        let forgotten = !n
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("gpunode.dev/repair");
        Ok(forgotten.then_some(()))
    })
    .await
    .unwrap();

    let reqs = requests(&client);
    wait::until("gpunode's own GpuResetRequest deleted", DEADLINE, || async {
        Ok(reqs
            .get_opt(&format!("{node}-gpu-1"))
            .await?
            .is_none()
            .then_some(()))
    })
    .await
    .unwrap();
    assert!(
        reqs.get_opt(&format!("{node}-gpu-0")).await.unwrap().is_some(),
        "another team's GpuResetRequest {node}-gpu-0, named in {node}'s repair record, was deleted"
    );
    assert!(
        reqs.get_opt(&format!("{node}-gpu-2")).await.unwrap().is_some(),
        "the GpuResetRequest {node}-gpu-2, whose uid is not the recorded one, was deleted"
    );
    assert!(
        reboots.get_opt(&node).await.unwrap().is_some(),
        "another team's FakeReboot {}/{node}, named in {node}'s repair record, was deleted",
        ns.name
    );
    let text = operator.metrics.encode();
    let refused = text
        .lines()
        .find(|l| l.starts_with(r#"gpunode_actions_total{action="delete",result="refused"}"#))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        refused.is_some_and(|n| n >= 3.0),
        "three deletes refused, not {refused:?}:\n{text}"
    );
    operator.stop().await.unwrap();
}
