//! Fake GPU nodes managed by KWOK, from the same template `e2e/cluster/nodes.sh` uses.

use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams},
};

use std::time::Duration;

use crate::{Error, fixtures::repo_root, wait};

/// Shape of a fake GPU node.
#[derive(Debug, Clone)]
pub struct GpuNodeShape {
    /// `nvidia.com/gpu.product`.
    pub product: String,
    /// GPUs per node.
    pub gpus: u32,
    /// MiB per GPU.
    pub gpu_memory_mib: u64,
}

impl Default for GpuNodeShape {
    fn default() -> Self {
        GpuNodeShape {
            product: "NVIDIA-H100-80GB-HBM3".to_string(),
            gpus: 8,
            gpu_memory_mib: 81559,
        }
    }
}

/// The node template with every placeholder filled in.
pub fn render(name: &str, shape: &GpuNodeShape) -> Result<Node, Error> {
    let path = repo_root().join("e2e/cluster/templates/fake-gpu-node.yaml");
    let template =
        std::fs::read_to_string(&path).map_err(|e| Error::Unexpected(format!("{}: {e}", path.display())))?;
    let yaml = template
        .replace("@NAME@", name)
        .replace("@PRODUCT@", &shape.product)
        .replace("@GPUS@", &shape.gpus.to_string())
        .replace("@GPU_MEMORY@", &shape.gpu_memory_mib.to_string())
        .replace("@CPU@", "32")
        .replace("@MEMORY@", "256Gi")
        .replace("@PODS@", "110");
    Ok(serde_yaml::from_str(&yaml)?)
}

/// Creates (or updates) one fake GPU node of the default shape and returns it.
pub async fn create_one(client: &Client, name: &str) -> Result<Node, Error> {
    let mut nodes = create(client, &[name.to_string()], &GpuNodeShape::default()).await?;
    nodes
        .pop()
        .ok_or_else(|| Error::Unexpected(format!("node {name} was not created")))
}

/// Creates (or updates) fake GPU nodes named `names` and returns them.
pub async fn create(client: &Client, names: &[String], shape: &GpuNodeShape) -> Result<Vec<Node>, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let pp = PatchParams::apply("gpunode-e2e").force();
    let mut nodes = Vec::with_capacity(names.len());
    for name in names {
        let node = render(name, shape)?;
        nodes.push(api.patch(name, &pp, &Patch::Apply(&node)).await?);
    }
    Ok(nodes)
}

/// True when the node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// True when the node is cordoned (`spec.unschedulable`).
pub fn cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
}

/// True when the node carries a taint that keeps pods off (NoSchedule or NoExecute) whose key
/// `key` accepts.
pub fn tainted_off(node: &Node, key: impl Fn(&str) -> bool) -> bool {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    taints.is_some_and(|ts| {
        ts.iter()
            .any(|t| key(&t.key) && matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
    })
}

/// The reason and message of gpunode's `GpuPolicyCompliant` condition (empty when absent).
pub fn compliance(node: &Node) -> (String, String) {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuPolicyCompliant"))
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
        .unwrap_or_default()
}

/// The value of label `key` on `node`.
pub fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref().and_then(|l| l.get(key).cloned())
}

/// Waits until node `name` carries every label of `want`, and returns it.
pub async fn until_labelled(
    client: &Client,
    name: &str,
    want: &[(&str, &str)],
    timeout: Duration,
) -> Result<Node, Error> {
    let api: Api<Node> = Api::all(client.clone());
    wait::until(&format!("node {name} labelled {want:?}"), timeout, || async {
        let n = api.get(name).await?;
        Ok(want
            .iter()
            .all(|(k, v)| label(&n, k).as_deref() == Some(*v))
            .then_some(n))
    })
    .await
}

/// The Events about node `node` (Events about a cluster-scoped object go to `default`).
pub async fn events(client: &Client, node: &str) -> Result<Vec<Event>, Error> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
        .collect())
}
