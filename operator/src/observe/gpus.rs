//! What a report says of its GPUs, as the planner reads it: their indexes, UUIDs and recovery
//! actions, and the
//! pods that hold each. Pure; the report cache ([`super::compact`]) keeps these beside the
//! compressed report so that a pass reads them without decoding it.

use std::collections::BTreeMap;

use gpunode_crds::GpuNodeReport;

use crate::plan::{GpuPods, GpuView, PodRef};

/// The GPUs a readable report lists, by index and UUID.
pub fn gpu_views(report: Option<&GpuNodeReport>) -> Vec<GpuView> {
    report
        .and_then(|r| r.status.as_ref())
        .map(|s| {
            s.gpus
                .iter()
                .map(|g| GpuView {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    recovery_action: g.recovery_action,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The pods a readable report says hold each GPU, by GPU UUID (the device plugin's view, from
/// the kubelet's PodResources API); `None` when it lists them for no GPU (the probe does not read
/// PodResources, or could not), so a NoExecute quarantine on a device-plugin node escalates
/// instead. A GPU without a UUID or without a list is left out: its pods are not known.
pub fn gpu_pods(report: Option<&GpuNodeReport>) -> Option<GpuPods> {
    let status = report?.status.as_ref()?;
    let by_gpu: BTreeMap<String, Vec<PodRef>> = status
        .gpus
        .iter()
        .filter_map(|g| {
            let pods = g.pods.as_ref()?;
            let refs = pods
                .iter()
                .map(|p| PodRef {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                })
                .collect();
            Some((g.uuid.clone()?, refs))
        })
        .collect();
    if by_gpu.is_empty() {
        return None;
    }
    Some(GpuPods {
        observed_at: status.observed_at.as_ref().map(|t| t.0),
        by_gpu,
    })
}
