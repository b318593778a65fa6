//! What the operator's caches keep of each watched object. At 5,000 nodes the caches are most of
//! the operator's memory, so fields no decision reads are dropped as objects arrive: managed
//! fields everywhere; a Node's status except gpunode's own condition; a report's identifiers
//! (but the GPUs' UUIDs), power readings and counters that no check compares. `evaluate` on a
//! trimmed report gives the same verdict as on the full one (a property test holds it to that).

use gpunode_crds::GpuNodeReport;
use k8s_openapi::api::core::v1::{Node, NodeStatus};

use crate::markers::CONDITION_TYPE;

/// Keeps of a Node what gpunode reads: metadata (labels, annotations), spec (taints, cordon)
/// and gpunode's condition.
pub fn node(n: &mut Node) {
    n.metadata.managed_fields = None;
    let ours = n
        .status
        .take()
        .and_then(|s| s.conditions)
        .map(|cs| {
            cs.into_iter()
                .filter(|c| c.type_ == CONDITION_TYPE)
                .collect::<Vec<_>>()
        })
        .filter(|cs| !cs.is_empty());
    if let Some(conditions) = ours {
        n.status = Some(NodeStatus {
            conditions: Some(conditions),
            ..NodeStatus::default()
        });
    }
}

/// Drops from a report what no check reads.
pub fn report(r: &mut GpuNodeReport) {
    r.metadata.managed_fields = None;
    let Some(s) = r.status.as_mut() else { return };
    s.probe_version = None;
    s.boot_id = None;
    for g in &mut s.gpus {
        // The UUID stays: a GPU's quarantine finds its DRA device and its pods by it.
        g.pci_bus_id = None;
        g.power_watts = None;
        g.power_limit_watts = None;
        g.shutdown_celsius = None;
    }
    if let Some(c) = s.cooling.as_mut() {
        for sensor in &mut c.sensors {
            sensor.crit_celsius = None;
        }
    }
    if let Some(n) = s.network.as_mut() {
        for d in &mut n.rdma_devices {
            d.netdev = None;
            d.pfc_pause = Vec::new();
        }
    }
}
