//! Which pods hold which GPU on a device-plugin node, from the kubelet's PodResources API: the
//! operator's per-GPU quarantine evicts exactly these pods (and no others) when one GPU goes bad.
//!
//! The NVIDIA device plugin names a GPU by its UUID (the default `DEVICE_ID_STRATEGY=uuid`), by its
//! index (`index`), and a time-sliced replica as `<id>::<n>`; all three are mapped to the GPU NVML
//! reports. A device id that matches no GPU (a MIG device, another plugin's scheme) is left
//! unattributed and named in the collector's note, never guessed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use gpunode_crds::report::{CollectorName, GpuNodeReportStatus, PodName};
use gpunode_podresources::PodResources;

use crate::collect::{CollectError, Collector, Outcome};

/// The extended resources that are whole or time-sliced NVIDIA GPUs, by default.
pub const DEFAULT_GPU_RESOURCES: &str = "nvidia.com/gpu,nvidia.com/gpu.shared";

/// Why the kubelet could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The call failed.
    #[error(transparent)]
    List(#[from] gpunode_podresources::ListError),
    /// No runtime for the call could be made.
    #[error("cannot start the runtime for the PodResources call: {0}")]
    Runtime(#[source] std::io::Error),
}

impl From<PodResourcesError> for CollectError {
    fn from(e: PodResourcesError) -> Self {
        CollectError::new(e)
    }
}

/// Reads the kubelet's PodResources socket and fills each GPU's `pods`.
pub struct PodResourcesCollector {
    socket: PathBuf,
    resources: Vec<String>,
    timeout: Duration,
}

impl PodResourcesCollector {
    /// A collector asking the kubelet at `socket`, counting the devices of `resources` as GPUs.
    pub fn new(socket: PathBuf, resources: Vec<String>, timeout: Duration) -> Self {
        PodResourcesCollector {
            socket,
            resources,
            timeout,
        }
    }
}

impl Collector for PodResourcesCollector {
    fn name(&self) -> CollectorName {
        CollectorName::PodResources
    }

    fn collect(&self, report: &mut GpuNodeReportStatus) -> Result<Outcome, CollectError> {
        // Observations run on a blocking thread; the call gets a small runtime of its own.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(PodResourcesError::Runtime)?;
        let pods = runtime
            .block_on(gpunode_podresources::list(&self.socket, self.timeout))
            .map_err(PodResourcesError::List)?;
        Ok(Outcome {
            note: attribute(report, &pods, &self.resources),
        })
    }
}

/// Sets every GPU's `pods` to the pods the kubelet lists with one of `resources` allocated from
/// it (sorted, each once; empty when none). Returns a note naming the device ids that match no
/// GPU of the report, if any.
pub fn attribute(
    report: &mut GpuNodeReportStatus,
    pods: &[PodResources],
    resources: &[String],
) -> Option<String> {
    let by_uuid: BTreeMap<String, u32> = report
        .gpus
        .iter()
        .filter_map(|g| g.uuid.as_ref().map(|u| (u.to_ascii_lowercase(), g.index)))
        .collect();
    let indexes: BTreeSet<u32> = report.gpus.iter().map(|g| g.index).collect();
    let mut holders: BTreeMap<u32, BTreeSet<PodName>> = BTreeMap::new();
    let mut unmatched: BTreeSet<String> = BTreeSet::new();
    for pod in pods {
        let name = PodName {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
        };
        let ids = pod
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .filter(|d| resources.iter().any(|r| r == &d.resource_name))
            .flat_map(|d| &d.device_ids);
        for id in ids {
            match gpu_of(id, &by_uuid, &indexes) {
                Some(index) => {
                    holders.entry(index).or_default().insert(name.clone());
                }
                None => {
                    unmatched.insert(id.clone());
                }
            }
        }
    }
    for gpu in &mut report.gpus {
        let pods = holders.remove(&gpu.index).unwrap_or_default();
        gpu.pods = Some(pods.into_iter().collect());
    }
    if unmatched.is_empty() {
        return None;
    }
    let list: Vec<&str> = unmatched.iter().map(String::as_str).take(8).collect();
    Some(format!(
        "{} allocated device id(s) match no GPU NVML reports, pods holding them are not attributed: {}",
        unmatched.len(),
        list.join(", ")
    ))
}

/// The GPU a device plugin's id names: its UUID (case as NVML or the plugin spells it), or its
/// index; a replica suffix `::<n>` is dropped.
fn gpu_of(id: &str, by_uuid: &BTreeMap<String, u32>, indexes: &BTreeSet<u32>) -> Option<u32> {
    let id = id.split_once("::").map_or(id, |(base, _)| base);
    if let Some(index) = by_uuid.get(&id.to_ascii_lowercase()) {
        return Some(*index);
    }
    id.parse::<u32>().ok().filter(|i| indexes.contains(i))
}

#[cfg(test)]
mod tests {
    use gpunode_crds::report::GpuStatus;
    use gpunode_podresources::{ContainerDevices, ContainerResources};

    use super::*;

    fn report(gpus: u32) -> GpuNodeReportStatus {
        GpuNodeReportStatus {
            gpus: (0..gpus)
                .map(|i| GpuStatus {
                    index: i,
                    uuid: Some(format!("GPU-{i}aaa")),
                    ..GpuStatus::default()
                })
                .collect(),
            ..GpuNodeReportStatus::default()
        }
    }

    fn pod(ns: &str, name: &str, devices: &[(&str, &[&str])]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![ContainerResources {
                name: "main".into(),
                devices: devices
                    .iter()
                    .map(|(r, ids)| ContainerDevices {
                        resource_name: (*r).into(),
                        device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
                    })
                    .collect(),
            }],
        }
    }

    fn names(r: &GpuNodeReportStatus, i: usize) -> Vec<String> {
        r.gpus[i]
            .pods
            .as_ref()
            .map(|p| p.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect())
            .unwrap_or_else(|| vec!["<unknown>".into()])
    }

    fn resources() -> Vec<String> {
        DEFAULT_GPU_RESOURCES.split(',').map(str::to_string).collect()
    }

    #[test]
    fn uuids_indexes_and_replicas_name_their_gpu() {
        let mut r = report(4);
        let pods = [
            pod("ml", "a", &[("nvidia.com/gpu", &["GPU-1aaa"])]),
            pod("ml", "b", &[("nvidia.com/gpu", &["2"])]),
            pod("ml", "c", &[("nvidia.com/gpu.shared", &["gpu-3AAA::0"])]),
            pod("ml", "d", &[("nvidia.com/gpu.shared", &["GPU-3aaa::1"])]),
        ];
        assert_eq!(attribute(&mut r, &pods, &resources()), None);
        assert_eq!(names(&r, 0), Vec::<String>::new(), "read, and nobody holds GPU 0");
        assert_eq!(names(&r, 1), ["ml/a"]);
        assert_eq!(names(&r, 2), ["ml/b"]);
        assert_eq!(names(&r, 3), ["ml/c", "ml/d"]);
    }

    #[test]
    fn other_resources_are_not_gpus() {
        let mut r = report(2);
        let pods = [pod("net", "sriov", &[("intel.com/sriov", &["0", "1"])])];
        assert_eq!(attribute(&mut r, &pods, &resources()), None);
        assert_eq!(names(&r, 0), Vec::<String>::new());
        assert_eq!(names(&r, 1), Vec::<String>::new());
    }

    #[test]
    fn a_pod_with_two_gpus_is_listed_on_both_once() {
        let mut r = report(2);
        let c2 = ContainerResources {
            name: "side".into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-0aaa".into()],
            }],
        };
        let mut p = pod("ml", "big", &[("nvidia.com/gpu", &["GPU-0aaa", "GPU-1aaa"])]);
        p.containers.push(c2);
        attribute(&mut r, &[p], &resources());
        assert_eq!(names(&r, 0), ["ml/big"]);
        assert_eq!(names(&r, 1), ["ml/big"]);
    }

    #[test]
    fn an_id_matching_no_gpu_is_named_not_guessed() {
        let mut r = report(2);
        let pods = [pod("ml", "mig", &[("nvidia.com/gpu", &["MIG-1234", "7"])])];
        let note = attribute(&mut r, &pods, &resources()).unwrap();
        assert!(
            note.contains("MIG-1234") && note.contains('7') && note.starts_with("2 "),
            "{note}"
        );
        assert_eq!(names(&r, 0), Vec::<String>::new());
        assert_eq!(names(&r, 1), Vec::<String>::new());
    }
}
