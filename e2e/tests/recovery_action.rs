//! NVML's recovery action on the real API server, with the real probe on the fake NVML library:
//! a GPU whose driver asks for a node reboot drifts (Xid), the repair ladder skips its GpuReset
//! step (a reset would not do) and hands the node to the next step, the fake remediator, whose
//! "reboot" clears the action; the node is then released. No GpuResetRequest is ever made.
//!
//! (A separate test binary: one operator per process.) Needs the binaries built (`make test`
//! builds them first): `gpunode-probe` and `libfake_nvml.so`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport, GpuRecoveryAction, GpuResetRequest};
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, probe::Host, remediator,
    scratch::Scratch, scratch::rand_suffix, wait,
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{DynamicObject, ListParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);
/// The GPU whose driver asks for a reboot.
const GPU: usize = 3;

fn policy(node: &str, ns: &str) -> serde_json::Value {
    json!({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "gpu": {"recoveryAction": {"driftOn": ["GpuReset", "NodeReboot", "DrainAndReset"]}},
        "remediation": [{"classes": ["Xid"], "action": "Drain"}],
        "disruption": {"maxUnavailable": 1, "circuitBreaker": {"maxDriftedPercent": 100},
            // The probe's stand-in pod (the DaemonSet pod a drain skips) lives there: its token
            // is bound to it.
            "drain": {"protectedNamespaces": ["kube-system", chart::NAMESPACE]}},
        "recovery": {"healthyFor": "5s"},
        "staleAfter": "5m",
        "repair": {
            "steps": [
                {"name": "gpu-reset", "action": "GpuReset", "classes": ["Xid"], "timeout": "60s"},
                {"name": "reboot", "action": "Remediator", "classes": ["Xid"], "timeout": "60s",
                 "remediator": {
                     "apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
                     "kind": "FakeRebootTemplate", "name": "reboot", "namespace": ns,
                 }},
            ],
            "maxAttempts": 3,
            "window": "1h",
        },
    })
}

/// Every GPU's recovery action: `action` on GPU [`GPU`], none on the others.
fn set_actions(f: &mut serde_json::Value, action: u32) {
    for gpu in 0..8 {
        f["devices"][gpu]["recovery_action"] = (if gpu == GPU { action } else { 0 }).into();
    }
}

#[tokio::test]
async fn a_gpu_asking_for_a_node_reboot_skips_the_reset_step_and_is_rebooted() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let ns = Scratch::new(&client, "recovery-action").await.unwrap();
    remediator::install_and_grant(&client, &ns.name).await.unwrap();
    remediator::create_template(&client, &ns.name, "reboot", "Succeed")
        .await
        .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();

    let node = format!("recovery-{:06x}", rand_suffix());
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let host = Arc::new(Host::prepare(&client, &node).await.unwrap());
    host.edit_fixture(|f| set_actions(f, 0)).unwrap();
    crds::create_policy(&client, &node, policy(&node, &ns.name))
        .await
        .unwrap();
    let probe = host.start_probe("boot-1").unwrap();
    // The remediator's "reboot": a new boot, the driver asks for nothing any more.
    let rebooted = host.clone();
    let fake = remediator::spawn(client.clone(), move |_| {
        let host = rebooted.clone();
        async move {
            host.reboot("boot-1", "boot-2").unwrap();
            host.edit_fixture(|f| set_actions(f, 0)).unwrap();
        }
    });
    let operator = InProcess::start(&operator_client, "e2e-recovery-action");
    nodes::until_labelled(&client, &node, &[("gpunode.dev/state", "compliant")], DEADLINE)
        .await
        .unwrap();

    // The driver asks for a node reboot for GPU 3.
    host.edit_fixture(|f| set_actions(f, 2)).unwrap();
    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    wait::until("the report shows NodeReboot", DEADLINE, || async {
        let status = reports.get(&node).await?.status.unwrap_or_default();
        Ok(
            (status.gpus.get(GPU).and_then(|g| g.recovery_action) == Some(GpuRecoveryAction::NodeReboot))
                .then_some(()),
        )
    })
    .await
    .unwrap();
    nodes::until_labelled(&client, &node, &[("gpunode.dev/drift.xid", "true")], DEADLINE)
        .await
        .unwrap();

    // The ladder skips the reset and hands the node to the reboot step.
    let reboots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &remediator::reboot_resource());
    wait::until("the node handed to the reboot step", DEADLINE, || async {
        Ok(reboots.get_opt(&node).await?)
    })
    .await
    .unwrap();
    let requests: Api<GpuResetRequest> = Api::all(client.clone());
    let made = requests.list(&ListParams::default()).await.unwrap();
    assert!(
        made.items.iter().all(|r| r.spec.node_name != node),
        "no reset is asked for a GPU that needs a reboot: {:?}",
        made.items.iter().map(|r| &r.spec).collect::<Vec<_>>()
    );

    remediator::go(&client, &ns.name, &node).await.unwrap();
    let api: Api<Node> = Api::all(client.clone());
    wait::until(&format!("{node} released"), DEADLINE, || async {
        let n = api.get(&node).await?;
        let ok =
            !nodes::cordoned(&n) && nodes::label(&n, "gpunode.dev/state").as_deref() == Some("compliant");
        Ok(ok.then_some(()))
    })
    .await
    .unwrap();

    fake.abort();
    operator.stop().await.unwrap();
    let _ = Api::<GpuNodePolicy>::all(client.clone())
        .delete(&node, &Default::default())
        .await;
    drop(probe);
    host.cleanup(&client).await;
}
