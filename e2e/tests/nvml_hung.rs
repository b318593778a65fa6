//! A hung NVML on the real API server, with the real probe on the fake NVML library: a driver
//! call that does not return makes the probe report its nvml collector Hung within
//! `--nvml-timeout`, and the operator's condition says `NvmlHung` (the probe is alive; not a
//! stale report); when the call returns the node is compliant again.
//!
//! (A separate test binary: one operator per process.) Needs the binaries built (`make test`
//! builds them first): `gpunode-probe` and `libfake_nvml.so`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{ffi::OsStr, time::Duration};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport, report::CollectorErrorKind};
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, probe::Host, scratch::rand_suffix, wait,
};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);

#[tokio::test]
async fn a_hung_nvml_call_is_reported_as_hung_not_as_a_dead_probe() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let node = format!("nvml-hung-{:06x}", rand_suffix());
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let host = Host::prepare(&client, &node).await.unwrap();
    let policy = json!({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "gpu": {"count": 8, "eccMode": "Enabled"},
        "remediation": [{"classes": ["Memory"], "action": "Cordon"}],
        "staleAfter": "5m",
    });
    crds::create_policy(&client, &node, policy).await.unwrap();
    let timeout = [OsStr::new("--nvml-timeout"), OsStr::new("1s")];
    let probe = host.start_probe_with("boot-1", &timeout).unwrap();
    let operator = InProcess::start(&operator_client, "e2e-nvml-hung");
    nodes::until_labelled(&client, &node, &[("gpunode.dev/state", "compliant")], DEADLINE)
        .await
        .unwrap();

    // The driver stops answering temperature reads.
    host.edit_fixture(|f| f["hang"] = json!(["nvmlDeviceGetTemperature"]))
        .unwrap();
    let api: Api<Node> = Api::all(client.clone());
    let (reason, message) = wait::until("the condition says NvmlHung", DEADLINE, || async {
        let (reason, message) = nodes::compliance(&api.get(&node).await?);
        Ok((reason == "NvmlHung").then_some((reason, message)))
    })
    .await
    .unwrap();
    assert_eq!(reason, "NvmlHung");
    assert!(message.contains("nvml collector hung"), "{message}");
    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    let status = reports.get(&node).await.unwrap().status.unwrap_or_default();
    let nvml = status
        .collectors
        .iter()
        .find(|c| !c.ok)
        .expect("a failed collector");
    assert_eq!(nvml.error_kind, Some(CollectorErrorKind::Hung), "{nvml:?}");
    nodes::until_labelled(&client, &node, &[("gpunode.dev/state", "unknown")], DEADLINE)
        .await
        .unwrap();
    assert!(
        !nodes::cordoned(&api.get(&node).await.unwrap()),
        "unknown is not acted on"
    );

    // The call returns: the node is compliant again.
    host.edit_fixture(|f| f["hang"] = json!([])).unwrap();
    nodes::until_labelled(&client, &node, &[("gpunode.dev/state", "compliant")], DEADLINE)
        .await
        .unwrap();

    operator.stop().await.unwrap();
    let _ = Api::<GpuNodePolicy>::all(client.clone())
        .delete(&node, &Default::default())
        .await;
    drop(probe);
    host.cleanup(&client).await;
}
