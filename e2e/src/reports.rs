//! Writing a node's GpuNodeReport as a probe would (server-side apply of the object, then of
//! its status), for tests that play the probe.

use gpunode_crds::GpuNodeReport;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
};
use serde_json::json;

use crate::Error;

/// Creates or updates `node`'s report with `status` (the `status` object of a GpuNodeReport).
/// Untyped, so tests can also write reports the operator's types cannot read.
pub async fn publish(client: &Client, node: &str, status: serde_json::Value) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<GpuNodeReport>(&()));
    let pp = PatchParams::apply("gpunode-e2e").force();
    let object = json!({
        "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport",
        "metadata": {"name": node}, "spec": {"nodeName": node},
    });
    api.patch(node, &pp, &Patch::Apply(&object)).await?;
    let status = json!({"apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport", "status": status});
    api.patch_status(node, &pp, &Patch::Apply(&status)).await?;
    Ok(())
}

/// Writes only the `status` of `node`'s existing report (one request instead of two).
pub async fn publish_status(client: &Client, node: &str, status: serde_json::Value) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<GpuNodeReport>(&()));
    let pp = PatchParams::apply("gpunode-e2e").force();
    let status = json!({"apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport", "status": status});
    api.patch_status(node, &pp, &Patch::Apply(&status)).await?;
    Ok(())
}

/// The status of a one-GPU report as a probe observes it now: NVML's collector ok, driver
/// `driver`, boot `boot`, its GPU's row remapping healthy and `xids` on it.
pub fn one_gpu(driver: &str, boot: &str, xids: serde_json::Value) -> serde_json::Value {
    json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "bootId": boot,
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "driverVersion": driver,
        "gpuCount": 1,
        "gpus": [{"index": 0, "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
                  "xids": xids}],
    })
}
