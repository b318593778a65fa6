//! The simulated fleet's objects: kubelet-sized Nodes (the labels, annotations, managed fields,
//! capacity, conditions, node info and image list a kubelet and its neighbours write: about
//! 11 KB of JSON each), the probe's reports (the benchmark's healthy 8x H100 report, GPU 0
//! thermally throttled when drifting) and the probes' heartbeat Leases.

use gpunode_crds::{GpuNodeReport, heartbeat, report::GpuNodeReportStatus};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde_json::{Value, json};

use crate::{error::Error, loadgen::THROTTLE, tracker::NODE_SELECTOR};

/// Where the objects live in the synthetic API.
pub const NODES: &str = "/api/v1/nodes";
/// The probes' reports.
pub const REPORTS: &str = "/apis/gpunode.dev/v1alpha1/gpunodereports";
/// The policies.
pub const POLICIES: &str = "/apis/gpunode.dev/v1alpha1/gpunodepolicies";
/// The namespace of the heartbeat Leases (the operator's default).
pub const LEASE_NAMESPACE: &str = "gpunode-system";

/// The heartbeat Leases' collection.
pub fn leases() -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases")
}

/// The name of node `i`.
pub fn node_name(i: usize) -> String {
    format!("sim-gpu-{i:06}")
}

fn managed_fields(now: &str) -> Value {
    // What the kubelet, the node lifecycle controller and a device plugin's labeller own on a
    // real node: the field sets are the bulk of their size.
    let fields = |keys: &[&str]| -> Value {
        let mut m = serde_json::Map::new();
        for k in keys {
            m.insert(format!("f:{k}"), json!({}));
        }
        Value::Object(m)
    };
    json!([
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": now,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": fields(&[
            "node.alpha.kubernetes.io/ttl", "volumes.kubernetes.io/controller-managed-attach-detach"]),
            "f:labels": fields(&["beta.kubernetes.io/arch", "beta.kubernetes.io/os", "kubernetes.io/arch",
                "kubernetes.io/hostname", "kubernetes.io/os", "node.kubernetes.io/instance-type",
                "topology.kubernetes.io/region", "topology.kubernetes.io/zone"])},
            "f:spec": fields(&["podCIDR", "podCIDRs", "providerID"])}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": now,
         "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": fields(&[
            "allocatable", "capacity", "conditions", "daemonEndpoints", "images", "nodeInfo",
            "addresses", "volumesAttached", "volumesInUse"])}},
        {"manager": "nvidia-feature-discovery", "operation": "Update", "apiVersion": "v1", "time": now,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": fields(&[
            "nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/gpu.count",
            "nvidia.com/gpu.family", "nvidia.com/gpu.memory", "nvidia.com/gpu.product",
            "nvidia.com/gpu.present", "nvidia.com/mig.capable"])}}}
    ])
}

fn images() -> Value {
    let names = [
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "nvcr.io/nvidia/k8s-device-plugin:v0.17.0",
        "nvcr.io/nvidia/gpu-feature-discovery:v0.17.0",
        "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.6-3.4.2-ubuntu22.04",
        "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v24.3.0",
        "nvcr.io/nvidia/driver:550.90.07-ubuntu22.04",
        "nvcr.io/nvidia/nemo:24.05",
        "nvcr.io/nvidia/tritonserver:24.05-py3",
        "registry.k8s.io/kube-proxy:v1.33.1",
        "registry.k8s.io/pause:3.10",
        "docker.io/calico/node:v3.28.0",
        "docker.io/calico/cni:v3.28.0",
        "ghcr.io/gpunode/node-probe:0.1.0",
        "quay.io/prometheus/node-exporter:v1.8.1",
        "registry.k8s.io/nfd/node-feature-discovery:v0.16.3",
        "docker.io/mellanox/network-operator-init-container:v0.0.2",
    ];
    // The kubelet reports up to 50 images (nodeStatusMaxImages); a GPU node keeps a few
    // releases of each.
    let versions = ["", "-r1", "-r2"];
    let tagged: Vec<String> = versions
        .iter()
        .flat_map(|v| names.iter().map(move |n| format!("{n}{v}")))
        .take(40)
        .collect();
    Value::Array(
        tagged
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let digest = format!("{:064x}", (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let repo = n.split(':').next().unwrap_or(n);
                json!({"names": [format!("{repo}@sha256:{digest}"), n], "sizeBytes": 100_000_000 + i as u64 * 7_340_033})
            })
            .collect(),
    )
}

/// Node `i` as its kubelet (and the labellers beside it) keep it: Ready, selected by the
/// benchmark policy.
pub fn node(i: usize, now: Timestamp) -> Value {
    let name = node_name(i);
    let now = now.to_string();
    let (key, value) = NODE_SELECTOR.split_once('=').unwrap_or((NODE_SELECTOR, "true"));
    let condition = |t: &str, status: &str, reason: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": format!("kubelet has {reason}"),
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/region": "us-east-1", "topology.kubernetes.io/zone": format!("us-east-1{}", ["a", "b", "c"][i % 3]),
                "nvidia.com/cuda.driver.major": "550", "nvidia.com/cuda.driver.minor": "90",
                "nvidia.com/gpu.count": "8", "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.capable": "true",
                key: value
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"i-{i:017x}\"}}"),
                "projectcalico.org/IPv4Address": format!("10.{}.{}.{}/16", i / 65536 % 256, i / 256 % 256, i % 256)
            },
            "managedFields": managed_fields(&now)
        },
        "spec": {
            "podCIDR": format!("100.{}.{}.0/24", i / 256 % 256, i % 256),
            "podCIDRs": [format!("100.{}.{}.0/24", i / 256 % 256, i % 256)],
            "providerID": format!("aws:///us-east-1a/i-{i:017x}"),
            "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
        },
        "status": {
            "capacity": {"cpu": "192", "memory": "2097152000Ki", "ephemeral-storage": "30000000000Ki",
                "hugepages-1Gi": "0", "hugepages-2Mi": "0", "nvidia.com/gpu": "8", "pods": "110",
                "rdma/rdma_shared_device_a": "63", "vpc.amazonaws.com/efa": "32"},
            "allocatable": {"cpu": "191450m", "memory": "2070000000Ki", "ephemeral-storage": "27000000000Ki",
                "hugepages-1Gi": "0", "hugepages-2Mi": "0", "nvidia.com/gpu": "8", "pods": "110",
                "rdma/rdma_shared_device_a": "63", "vpc.amazonaws.com/efa": "32"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady")
            ],
            "addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", i / 65536 % 256, i / 256 % 256, i % 256)},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("ec2{i:029x}"),
                "bootID": format!("{:08x}-0000-4000-8000-{i:012x}", i), "kernelVersion": "5.15.0-1063-aws",
                "osImage": "Ubuntu 22.04.4 LTS", "containerRuntimeVersion": "containerd://1.7.19",
                "kubeletVersion": "v1.33.1", "kubeProxyVersion": "v1.33.1", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images()
        }
    })
}

/// The report of node `i`: the benchmark's healthy report, observed at `now`, GPU 0 thermally
/// throttled when `drifting`.
pub fn report(
    template: &GpuNodeReportStatus,
    i: usize,
    drifting: bool,
    now: Timestamp,
) -> Result<Value, Error> {
    let name = node_name(i);
    let mut status = template.clone();
    status.observed_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
    if drifting {
        if let Some(g) = status.gpus.first_mut() {
            g.throttle_reasons.push(THROTTLE);
        }
        status.throttled_gpus = Some(1);
    }
    let mut report = GpuNodeReport::new(
        &name,
        gpunode_crds::report::GpuNodeReportSpec {
            node_name: name.clone(),
        },
    );
    report.status = Some(status);
    Ok(serde_json::to_value(report)?)
}

/// The heartbeat Lease of node `i`, renewed at `now`.
pub fn lease(i: usize, now: Timestamp) -> Result<Value, Error> {
    let node = node_name(i);
    let name =
        heartbeat::lease_name(&node).ok_or_else(|| Error::Other(format!("no Lease name for {node}")))?;
    let mut lease = heartbeat::lease(&name, &node, None, 120, MicroTime(now));
    lease.metadata.namespace = Some(LEASE_NAMESPACE.to_string());
    let mut v = serde_json::to_value(lease)?;
    v["apiVersion"] = json!("coordination.k8s.io/v1");
    v["kind"] = json!("Lease");
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_kubelet_sized_and_reads_as_a_node() {
        let n = node(7, Timestamp::now());
        let size = n.to_string().len();
        assert!((9_000..16_000).contains(&size), "{size} bytes");
        let typed: k8s_openapi::api::core::v1::Node = serde_json::from_value(n).unwrap();
        assert_eq!(typed.metadata.name.as_deref(), Some("sim-gpu-000007"));
    }
}
