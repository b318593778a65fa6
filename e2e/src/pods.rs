//! Workload pods placed directly on a (fake) node, and waiting for them to run.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;

use crate::{Error, wait};

/// A single-container pod bound to `node` with `labels` (the image is never pulled on KWOK nodes).
pub fn on_node(name: &str, node: &str, labels: serde_json::Value) -> Result<Pod, Error> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "registry.invalid/workload:1"}],
        }
    }))?)
}

/// Waits until the pod is Running and Ready, and returns it.
pub async fn running(api: &Api<Pod>, name: &str, timeout: Duration) -> Result<Pod, Error> {
    wait::until(&format!("pod {name} Running and Ready"), timeout, || async {
        let p = api.get(name).await?;
        let ready = p.status.as_ref().is_some_and(|s| {
            s.phase.as_deref() == Some("Running")
                && s.conditions
                    .as_ref()
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        Ok(ready.then_some(p))
    })
    .await
}

/// Whether pod `name` exists, runs and is not being deleted (an eviction sets its deletion
/// timestamp at once).
pub async fn is_running(api: &Api<Pod>, name: &str) -> bool {
    api.get_opt(name).await.ok().flatten().is_some_and(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.status.and_then(|s| s.phase).is_some_and(|ph| ph == "Running")
    })
}
