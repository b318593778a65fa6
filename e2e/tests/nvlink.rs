//! NVLink and the NVSwitch fabric, end to end: the real probe binary reads the fake NVML library
//! of an HGX board whose GPUs are registered with the fabric. When GPU 6's registration goes
//! back to NotStarted (the Fabric Manager stopped), the probe publishes the fabric state and the
//! in-process operator cordons the node for `gpu.nvlink.requireFabricRegistration` (class
//! Nvlink) with a message naming the GPU and the state; registered again, the node returns
//! after `healthyFor`. Then a burst of CRC errors on one link of GPU 3 is counted over the last
//! hour and cordons the node for `gpu.nvlink.maxCrcErrorsPerHour`, naming the link and counter.
//!
//! Needs the binaries built (`make test` builds them first): `gpunode-probe` and
//! `libfake_nvml.so` next to this test's target directory.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::{FabricState, GpuNodePolicy, GpuNodeReport};
use gpunode_e2e::{
    chart, cluster, crds, nodes, operator::InProcess, probe::Host, scratch::rand_suffix, wait,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::DeleteParams};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

fn state(n: &Node) -> Option<String> {
    nodes::label(n, "gpunode.dev/state")
}

/// GPU `gpu`'s fabric as the fake NVML reports it: state `state`, registration succeeded.
fn set_fabric(f: &mut serde_json::Value, gpu: usize, state: u32) {
    f["devices"][gpu]["fabric"] = json!({"state": state, "status": 0, "clique_id": 1, "health_mask": 2});
}

/// Waits until the node is drifted and cordoned, and returns its condition's message.
async fn until_cordoned(node_api: &Api<Node>, node: &str, why: &str) -> String {
    let n = wait::until(why, DEADLINE, || async {
        let n = node_api.get(node).await?;
        let nvlink = nodes::label(&n, "gpunode.dev/drift.nvlink").as_deref() == Some("true");
        Ok((state(&n).as_deref() == Some("drifted") && nvlink && nodes::cordoned(&n)).then_some(n))
    })
    .await
    .unwrap();
    nodes::compliance(&n).1
}

async fn until_released(node_api: &Api<Node>, node: &str) {
    wait::until("the node uncordoned and compliant", DEADLINE, || async {
        let n = node_api.get(node).await?;
        Ok((!nodes::cordoned(&n) && state(&n).as_deref() == Some("compliant")).then_some(()))
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn an_unregistered_gpu_and_an_nvlink_crc_burst_cordon_the_node() {
    let client = cluster::admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let node = format!("nvlink-{:06x}", rand_suffix());
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let host = Host::prepare(&client, &node).await.unwrap();
    host.edit_fixture(|f| (0..8).for_each(|gpu| set_fabric(f, gpu, 3)))
        .unwrap();
    crds::create_policy(
        &client,
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {"nvlink": {"minActiveLinks": 18, "maxCrcErrorsPerHour": 1000,
                               "requireFabricRegistration": true}},
            "remediation": [{"classes": ["Nvlink"], "action": "Cordon"}],
            "recovery": {"healthyFor": "5s"},
            "staleAfter": "5m",
        }),
    )
    .await
    .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e-nvlink");
    let node_api: Api<Node> = Api::all(client.clone());
    let reports: Api<GpuNodeReport> = Api::all(client.clone());

    let probe = host.start_probe("boot-a").unwrap();
    until_released(&node_api, &node).await;

    // The Fabric Manager stops: GPU 6's registration starts over and does not complete.
    host.edit_fixture(|f| set_fabric(f, 6, 1)).unwrap();
    let message = until_cordoned(&node_api, &node, "the node cordoned for GPU 6's fabric").await;
    assert!(
        message.contains("gpu 6: gpu.nvlink.requireFabricRegistration") && message.contains("got NotStarted"),
        "{message}"
    );
    let status = reports.get(&node).await.unwrap().status.unwrap_or_default();
    let fabric = status.gpus[6].fabric.as_ref().unwrap();
    assert_eq!(fabric.state, FabricState::NotStarted);

    // Registered again: released after healthyFor.
    host.edit_fixture(|f| set_fabric(f, 6, 3)).unwrap();
    until_released(&node_api, &node).await;

    // GPU 3's link 5 receives 5000 damaged flits.
    host.edit_fixture(|f| {
        let mut links = vec![json!({}); 18];
        links[5] = json!({"crc_flit": 5000, "replay": 12});
        f["devices"][3]["nvlink_errors"] = json!(links);
    })
    .unwrap();
    let message = until_cordoned(&node_api, &node, "the node cordoned for GPU 3's CRC errors").await;
    assert!(
        message.contains("gpu 3: gpu.nvlink.maxCrcErrorsPerHour")
            && message.contains("link 5: 5000 NVML_NVLINK_ERROR_DL_CRC_FLIT"),
        "{message}"
    );

    drop(probe);
    operator.stop().await.unwrap();
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    let _ = policies.delete(&node, &DeleteParams::default()).await;
    host.cleanup(&client).await;
}
