//! NVML's recovery action and the per-GPU quarantine, on the real API server with the real probe
//! on the fake NVML library and a fake kubelet's PodResources API (a device-plugin node, no pod
//! on any GPU): GPU 5 asking for a reset drifts (Xid) and is quarantined alone; when its action
//! returns to None the quarantine is released after `healthyFor`. (A separate test binary: one
//! operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use gpunode_e2e::nodes::label;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, probe::Host, scratch::rand_suffix, wait,
};
use gpunode_podresources::{ListPodResourcesResponse, fake::spawn};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::DeleteParams};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);
const GPU: usize = 5;

fn annotation(n: &Node, key: &str) -> Option<String> {
    n.metadata.annotations.as_ref().and_then(|a| a.get(key).cloned())
}

/// Every GPU's recovery action: `action` on GPU [`GPU`], none on the others.
fn set_actions(f: &mut serde_json::Value, action: u32) {
    for gpu in 0..8 {
        f["devices"][gpu]["recovery_action"] = (if gpu == GPU { action } else { 0 }).into();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_quarantined_for_its_recovery_action_is_released_when_the_action_is_none() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let node = format!("recq-{:06x}", rand_suffix());
    nodes::create_one(&client, &node).await.unwrap();
    let host = Host::prepare(&client, &node).await.unwrap();
    host.edit_fixture(|f| set_actions(f, 0)).unwrap();
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(host.fixture()).unwrap()).unwrap();
    let uuid = fixture["devices"][GPU]["uuid"].as_str().unwrap().to_string();

    // The kubelet: no pod holds any GPU.
    let socket = host.dir.join("kubelet.sock");
    let kubelet = spawn(
        &socket,
        Arc::new(|| Ok::<_, String>(ListPodResourcesResponse::default())),
    )
    .unwrap();
    let probe = host
        .start_probe_with(
            "boot-1",
            &[
                std::ffi::OsStr::new("--pod-resources-socket"),
                socket.as_os_str(),
                // The recovery is published at once, not after the default 2m.
                std::ffi::OsStr::new("--recovery-gap"),
                std::ffi::OsStr::new("1s"),
            ],
        )
        .unwrap();
    crds::create_policy(
        &client,
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {"recoveryAction": {}},
            "remediation": [{"classes": ["Xid"], "action": "TaintDevice", "effect": "NoExecute"}],
            "recovery": {"healthyFor": "5s"},
        }),
    )
    .await
    .unwrap();
    let operator = InProcess::start(&operator_client, "e2e-recovery-quarantine");
    nodes::until_labelled(
        &client,
        &node,
        &[
            ("gpunode.dev/state", "compliant"),
            ("gpunode.dev/healthy-gpus", "8"),
        ],
        DEADLINE,
    )
    .await
    .unwrap();

    // The driver asks for GPU 5's reset: that GPU alone is quarantined.
    host.edit_fixture(|f| set_actions(f, 1)).unwrap();
    let node_api: Api<Node> = Api::all(client.clone());
    wait::until("GPU 5 quarantined", DEADLINE, || async {
        let n = node_api.get(&node).await?;
        Ok(
            (annotation(&n, "gpunode.dev/unhealthy-gpus").as_deref() == Some(uuid.as_str())
                && label(&n, "gpunode.dev/healthy-gpus").as_deref() == Some("7"))
            .then_some(()),
        )
    })
    .await
    .unwrap();

    // The action is done (NVML says None again): the quarantine goes after healthyFor.
    host.edit_fixture(|f| set_actions(f, 0)).unwrap();
    wait::until("GPU 5 released", DEADLINE, || async {
        let n = node_api.get(&node).await?;
        Ok((annotation(&n, "gpunode.dev/unhealthy-gpus").is_none()
            && label(&n, "gpunode.dev/healthy-gpus").as_deref() == Some("8")
            && label(&n, "gpunode.dev/state").as_deref() == Some("compliant"))
        .then_some(()))
    })
    .await
    .unwrap();

    operator.stop().await.unwrap();
    let _ = probe.kill();
    kubelet.stop().await.unwrap();
    let policies: Api<gpunode_crds::GpuNodePolicy> = Api::all(client.clone());
    policies.delete(&node, &DeleteParams::default()).await.unwrap();
    host.cleanup(&client).await;
}
