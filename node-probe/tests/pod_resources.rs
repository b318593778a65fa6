//! `gpunode-probe --once` with the fake NVML library and a fake kubelet serving PodResources on a
//! real unix socket: each GPU lists the pods the device plugin allocated it to, whichever id
//! scheme the plugin uses; a kubelet that cannot be asked makes the collector fail and leaves
//! every GPU's pods unknown (absent), never empty.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{path::Path, process::Command, sync::Arc, time::Duration};

use common::{FakeNvml, sysfs_tree};
use gpunode_crds::{
    GpuNodeReport,
    report::{CollectorName, GpuNodeReportStatus},
};
use gpunode_podresources::{
    ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
    fake::{FakeKubelet, serve},
};

fn once(fake: &FakeNvml, socket: &Path) -> GpuNodeReportStatus {
    let root = sysfs_tree("lossless-8port");
    let out = Command::new(env!("CARGO_BIN_EXE_gpunode-probe"))
        .args([
            "--once",
            "-o",
            "json",
            "--node-name",
            "gpu-node-1",
            "--no-xid-events",
        ])
        .arg("--nvml-lib")
        .arg(&fake.lib)
        .arg("--sysfs-root")
        .arg(root.join("sys"))
        .arg("--net-fixtures")
        .arg(&root)
        .arg("--pod-resources-socket")
        .arg(socket)
        .env_remove("FAKE_NVML_FIXTURE")
        .env_remove("NODE_NAME")
        .env_remove("GPUNODE_STATE_DIR")
        .env_remove("GPUNODE_GPU_RESOURCES")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: GpuNodeReport = serde_json::from_slice(&out.stdout).unwrap();
    report.status.unwrap()
}

fn pod(name: &str, resource: &str, ids: &[&str]) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: "ml".into(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
            }],
        }],
    }
}

fn pods_of(status: &GpuNodeReportStatus, index: u32) -> Option<Vec<String>> {
    let gpu = status.gpus.iter().find(|g| g.index == index).unwrap();
    gpu.pods
        .as_ref()
        .map(|p| p.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_gpu_lists_the_pods_that_hold_it() {
    let fake = FakeNvml::new("healthy-8xh100");
    let fixture: serde_json::Value = serde_json::from_slice(&std::fs::read(&fake.fixture).unwrap()).unwrap();
    let uuid = |i: usize| fixture["devices"][i]["uuid"].as_str().unwrap().to_string();
    let (u5, u2) = (uuid(5), uuid(2));
    let answer = ListPodResourcesResponse {
        pod_resources: vec![
            pod("on-gpu-5", "nvidia.com/gpu", &[&u5]),
            pod("by-index", "nvidia.com/gpu", &["3"]),
            pod("slice-a", "nvidia.com/gpu.shared", &[&format!("{u2}::0")]),
            pod("slice-b", "nvidia.com/gpu.shared", &[&format!("{u2}::1")]),
            pod("nic-only", "rdma/hca", &["0"]),
        ],
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let socket = socket.clone();
        let answer = answer.clone();
        tokio::spawn(async move {
            serve(
                &socket,
                FakeKubelet::new(Arc::new(move || Ok(answer.clone()))),
                async {
                    let _ = stopped.await;
                },
            )
            .await
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "fake kubelet did not bind"
        );
        tokio::task::yield_now().await;
    }

    let status = {
        let socket = socket.clone();
        tokio::task::spawn_blocking(move || once(&fake, &socket))
            .await
            .unwrap()
    };
    let collector = status
        .collectors
        .iter()
        .find(|c| c.name == CollectorName::PodResources)
        .unwrap();
    assert!(collector.ok && collector.error.is_none(), "{collector:?}");
    assert_eq!(pods_of(&status, 5), Some(vec!["ml/on-gpu-5".to_string()]));
    assert_eq!(pods_of(&status, 3), Some(vec!["ml/by-index".to_string()]));
    assert_eq!(
        pods_of(&status, 2),
        Some(vec!["ml/slice-a".to_string(), "ml/slice-b".to_string()])
    );
    for free in [0, 1, 4, 6, 7] {
        assert_eq!(
            pods_of(&status, free),
            Some(vec![]),
            "gpu {free} is known to be free"
        );
    }
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[test]
fn a_kubelet_that_cannot_be_asked_leaves_pods_unknown() {
    let fake = FakeNvml::new("healthy-8xh100");
    let dir = tempfile::tempdir().unwrap();
    let status = once(&fake, &dir.path().join("no-kubelet.sock"));
    let collector = status
        .collectors
        .iter()
        .find(|c| c.name == CollectorName::PodResources)
        .unwrap();
    assert!(!collector.ok, "{collector:?}");
    assert!(
        collector
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("no-kubelet.sock"),
        "{collector:?}"
    );
    // The other collectors are unaffected, and no GPU claims to be free.
    assert!(
        status
            .collectors
            .iter()
            .filter(|c| c.name != CollectorName::PodResources)
            .all(|c| c.ok)
    );
    assert_eq!(status.gpus.len(), 8);
    assert!(status.gpus.iter().all(|g| g.pods.is_none()));
}
