//! What the operator's caches keep of each watched object. At 5,000 nodes the caches are most of
//! the operator's memory, so fields no decision reads are dropped as objects arrive: managed
//! fields everywhere; a Node's status except gpunode's own condition and Ready (the fleet cap
//! counts NotReady nodes), its spec except taints and the cordon, and annotations other than gpunode's (real nodes carry kilobytes of them:
//! NFD's, CSI's, the kubelet's); a report's metadata but its name and version, its identifiers
//! (but the GPUs' UUIDs), power draw and counters that no check compares (the enforced and
//! default power limits stay: `gpu.power` compares them). `evaluate` on a
//! trimmed report gives the same verdict as on the full one (a property test holds it to that).
//!
//! It trims the cache's copy only; nothing is written back.

use gpunode_crds::GpuNodeReport;
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};

use crate::markers::{CONDITION_TYPE, PREFIX};

/// Keeps of a Node what gpunode reads: metadata (labels, gpunode's annotations), spec (taints,
/// cordon), gpunode's condition and Ready (its status only: no message). gpunode never writes a Node back whole (merge patches and
/// server-side apply of its own fields only), so nothing dropped here can be erased.
pub fn node(n: &mut Node) {
    n.metadata.managed_fields = None;
    n.metadata.owner_references = None;
    if let Some(a) = n.metadata.annotations.as_mut() {
        a.retain(|k, _| k.starts_with(PREFIX));
    }
    n.spec = n.spec.take().map(|s| NodeSpec {
        taints: s.taints.map(shrunk),
        unschedulable: s.unschedulable,
        ..NodeSpec::default()
    });
    let ours = n
        .status
        .take()
        .and_then(|s| s.conditions)
        .map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == CONDITION_TYPE || c.type_ == READY)
                .map(|mut c| {
                    if c.type_ == READY {
                        c.message = None;
                        c.last_heartbeat_time = None;
                    }
                    c
                })
                .collect::<Vec<_>>()
        })
        // Collected in place: without this, the one condition kept would hold the room of all.
        .map(shrunk)
        .filter(|cs| !cs.is_empty());
    if let Some(conditions) = ours {
        n.status = Some(NodeStatus {
            conditions: Some(conditions),
            ..NodeStatus::default()
        });
    }
}

/// The kubelet's Ready condition.
pub const READY: &str = "Ready";

/// `v` without spare capacity.
fn shrunk<T>(mut v: Vec<T>) -> Vec<T> {
    v.shrink_to_fit();
    v
}

/// Drops from a report what no check reads.
pub fn report(r: &mut GpuNodeReport) {
    let meta = &mut r.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.labels = None;
    meta.annotations = None;
    meta.finalizers = None;
    let Some(s) = r.status.as_mut() else { return };
    s.probe_version = None;
    s.boot_id = None;
    // Lists are decoded by pushing, which doubles their capacity: nine RDMA devices hold room
    // for sixteen. Giving the spare room back is a fifth of a cached report (measured on the
    // H100 fixture: 9.1 KB before).
    s.collectors.shrink_to_fit();
    s.gpus.shrink_to_fit();
    for g in &mut s.gpus {
        // The UUID stays: a GPU's quarantine finds its DRA device and its pods by it.
        g.pci_bus_id = None;
        // The enforced limit stays: `gpu.power` compares it (with the default limit).
        g.power_watts = None;
        g.shutdown_celsius = None;
        g.throttle_reasons.shrink_to_fit();
        g.xids.shrink_to_fit();
        g.errors.shrink_to_fit();
    }
    if let Some(c) = s.cooling.as_mut() {
        c.sensors.shrink_to_fit();
        c.fans.shrink_to_fit();
        c.errors.shrink_to_fit();
        for sensor in &mut c.sensors {
            sensor.crit_celsius = None;
        }
    }
    if let Some(n) = s.network.as_mut() {
        n.rdma_devices.shrink_to_fit();
        for d in &mut n.rdma_devices {
            d.netdev = None;
            d.pfc_pause = Vec::new();
            d.errors.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, Taint};
    use kube::api::ObjectMeta;

    #[test]
    fn a_node_keeps_labels_our_annotations_taints_cordon_ready_and_our_condition() {
        let mut n = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                resource_version: Some("7".into()),
                labels: Some([("gpu".to_string(), "h100".to_string())].into()),
                annotations: Some(
                    [
                        ("gpunode.dev/classes".to_string(), "Thermal".to_string()),
                        (
                            "nfd.node.kubernetes.io/feature-labels".to_string(),
                            "x".repeat(4096),
                        ),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: "k".into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]),
                unschedulable: Some(true),
                pod_cidr: Some("10.0.0.0/24".into()),
                provider_id: Some("kwok://n1".into()),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![
                    NodeCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        message: Some("kubelet is posting ready status".into()),
                        ..NodeCondition::default()
                    },
                    NodeCondition {
                        type_: "MemoryPressure".into(),
                        status: "False".into(),
                        ..NodeCondition::default()
                    },
                    NodeCondition {
                        type_: CONDITION_TYPE.into(),
                        status: "False".into(),
                        ..NodeCondition::default()
                    },
                ]),
                ..NodeStatus::default()
            }),
        };
        node(&mut n);
        assert_eq!(n.metadata.labels.as_ref().map(|l| l.len()), Some(1));
        let annotations: Vec<&str> = n
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(annotations, ["gpunode.dev/classes"]);
        assert_eq!(n.metadata.resource_version.as_deref(), Some("7"));
        let spec = n.spec.as_ref().expect("spec kept");
        assert_eq!(spec.taints.as_ref().map(Vec::len), Some(1));
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!((spec.pod_cidr.as_ref(), spec.provider_id.as_ref()), (None, None));
        let kept: Vec<&str> = n
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(kept, [READY, CONDITION_TYPE], "the fleet cap reads Ready");
        let conditions = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .expect("ours");
        assert_eq!(
            conditions.capacity(),
            2,
            "the dropped conditions' room is given back"
        );
        assert_eq!(conditions[0].message, None, "Ready's status only");
    }

    #[test]
    fn a_decoded_reports_lists_keep_no_spare_room() {
        let device = |i: usize| serde_json::json!({"device": format!("mlx5_{i}"), "port": 1});
        let sensor =
            |i: usize| serde_json::json!({"chip": "coretemp", "label": format!("Core {i}"), "celsius": 40.0});
        // From text, as the watch decodes it: a JSON array's length is not known in advance.
        let text = serde_json::json!({
            "apiVersion": "gpunode.dev/v1alpha1",
            "kind": "GpuNodeReport",
            "metadata": {"name": "n1"},
            "spec": {"nodeName": "n1"},
            "status": {
                "gpus": (0..5).map(|i| serde_json::json!({"index": i})).collect::<Vec<_>>(),
                "cooling": {"sensors": (0..6).map(sensor).collect::<Vec<_>>()},
                "network": {"rdmaDevices": (0..9).map(device).collect::<Vec<_>>()},
            },
        })
        .to_string();
        let mut r: GpuNodeReport = serde_json::from_str(&text).expect("a valid report");
        let devices = |r: &GpuNodeReport| {
            let d = &r
                .status
                .as_ref()
                .and_then(|s| s.network.as_ref())
                .expect("network")
                .rdma_devices;
            (d.len(), d.capacity())
        };
        // The premise: decoding leaves room to spare (else this test shows nothing).
        assert!(
            devices(&r).1 > devices(&r).0,
            "decoded with capacity {:?}",
            devices(&r)
        );
        report(&mut r);
        assert_eq!(devices(&r), (9, 9));
        let s = r.status.as_ref().expect("status");
        assert_eq!((s.gpus.len(), s.gpus.capacity()), (5, 5));
        let sensors = &s.cooling.as_ref().expect("cooling").sensors;
        assert_eq!((sensors.len(), sensors.capacity()), (6, 6));
    }
}
