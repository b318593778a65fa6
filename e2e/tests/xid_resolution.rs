//! XIDs acted on by the resolution NVIDIA's XID catalogue gives them, on the real API server with
//! the real probe on the fake NVML library: a policy that lists no XID by number and drifts on
//! `xidResolution` (RESET_GPU, RESTART_BM, WORKFLOW_XID_48) leaves a node with XID 94 (a
//! contained ECC error, RESTART_APP) compliant, and cordons it for XID 109 (RESET_GPU), with a
//! condition that names the resolution.
//!
//! (A separate test binary: one operator per process.) Needs the binaries built (`make test`
//! builds them first): `gpunode-probe` and `libfake_nvml.so`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, probe::Host, scratch::rand_suffix, wait,
};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);
/// The GPU that reports the XIDs.
const GPU: usize = 2;

/// GPU [`GPU`]'s XID events: `xids` in order, each with its own event id, so that the fake
/// library delivers only those added since the last edit.
fn set_xids(f: &mut serde_json::Value, xids: &[u32]) {
    let events: Vec<_> = xids
        .iter()
        .zip(1u64..)
        .map(|(xid, id)| json!({"id": id, "type": 8, "xid": xid}))
        .collect();
    f["devices"][GPU]["events"] = events.into();
}

#[tokio::test]
async fn a_reset_gpu_xid_drifts_by_resolution_and_a_contained_ecc_error_does_not() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let node = format!("xid-resolution-{:06x}", rand_suffix());
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let host = Host::prepare(&client, &node).await.unwrap();
    crds::create_policy(
        &client,
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {"fatalXids": [], "xidResolution": {}},
            "remediation": [{"classes": ["Xid"], "action": "Cordon"}],
            "recovery": {"healthyFor": "5s"},
            "staleAfter": "5m",
        }),
    )
    .await
    .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e-xid-resolution");
    let probe = host.start_probe("boot-1").unwrap();
    probe.logged("listening for XID events", DEADLINE).await.unwrap();
    nodes::until_labelled(&client, &node, &[("gpunode.dev/state", "compliant")], DEADLINE)
        .await
        .unwrap();

    // XID 94: NVIDIA says restart the application. The probe publishes it; nothing drifts.
    host.edit_fixture(|f| set_xids(f, &[94])).unwrap();
    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    wait::until("the report shows XID 94", DEADLINE, || async {
        let status = reports.get(&node).await?.status.unwrap_or_default();
        let xids: Vec<u32> = status
            .gpus
            .get(GPU)
            .map(|g| g.xids.iter().map(|x| x.xid).collect())
            .unwrap_or_default();
        Ok((xids == [94]).then_some(()))
    })
    .await
    .unwrap();

    // XID 109 (context-switch timeout): NVIDIA says reset the GPU.
    host.edit_fixture(|f| set_xids(f, &[94, 109])).unwrap();
    let api: Api<Node> = Api::all(client.clone());
    let message = wait::until("the node drifted (Xid) and cordoned", DEADLINE, || async {
        let n = api.get(&node).await?;
        let drifted = nodes::label(&n, "gpunode.dev/drift.xid").as_deref() == Some("true");
        Ok((drifted && nodes::cordoned(&n)).then(|| nodes::compliance(&n).1))
    })
    .await
    .unwrap();
    assert!(
        message.contains("gpu.xidResolution") && message.contains("XID 109 (RESET_GPU) at"),
        "{message}"
    );
    // 94 is on the same GPU and would be listed in the same drift had it drifted.
    assert!(!message.contains("XID 94"), "{message}");

    operator.stop().await.unwrap();
    let _ = Api::<GpuNodePolicy>::all(client.clone())
        .delete(&node, &Default::default())
        .await;
    drop(probe);
    host.cleanup(&client).await;
}
