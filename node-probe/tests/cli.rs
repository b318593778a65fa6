//! The `gpunode-probe --once` binary end to end, with the fake NVML library and fixture trees.

mod common;

use std::process::Command;

use common::{FakeNvml, sysfs_tree};
use gpunode_crds::GpuNodeReport;
use gpunode_crds::report::CollectorName;

fn probe(fake_lib: &std::path::Path, tree: &str, format: &str) -> (i32, String, String) {
    let root = sysfs_tree(tree);
    let out = Command::new(env!("CARGO_BIN_EXE_gpunode-probe"))
        .args(["--once", "-o", format, "--node-name", "gpu-node-1"])
        .arg("--nvml-lib")
        .arg(fake_lib)
        .arg("--sysfs-root")
        .arg(root.join("sys"))
        .arg("--net-fixtures")
        .arg(&root)
        .env_remove("FAKE_NVML_FIXTURE")
        .env_remove("NODE_NAME")
        .output()
        .unwrap_or_else(|e| panic!("run gpunode-probe: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn parse_yaml(text: &str) -> GpuNodeReport {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("not a GpuNodeReport: {e}\n{text}"))
}

#[test]
fn once_prints_a_full_report() {
    let fake = FakeNvml::new("throttled");
    let (code, stdout, stderr) = probe(&fake.lib, "lossless-8port", "yaml");
    assert_eq!(code, 0, "{stderr}");
    let report = parse_yaml(&stdout);
    assert_eq!(report.metadata.name.as_deref(), Some("gpu-node-1"));
    assert_eq!(report.spec.node_name, "gpu-node-1");
    let status = report.status.unwrap_or_default();
    let collectors: Vec<(CollectorName, bool)> = status.collectors.iter().map(|c| (c.name, c.ok)).collect();
    assert_eq!(
        collectors,
        vec![
            (CollectorName::Nvml, true),
            (CollectorName::Cooling, true),
            (CollectorName::Network, true)
        ]
    );
    assert_eq!(status.gpu_count, Some(8));
    assert_eq!(status.throttled_gpus, Some(1));
    assert_eq!(status.driver_version.as_deref(), Some("550.90.07"));
    assert_eq!(status.network.map(|n| n.rdma_devices.len()), Some(8));
    assert!(status.cooling.is_some_and(|c| !c.sensors.is_empty()));
    assert!(status.observed_at.is_some() && status.probe_version.is_some());

    let (code, json, _) = probe(&fake.lib, "lossless-8port", "json");
    assert_eq!(code, 0);
    let report: GpuNodeReport = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.status.and_then(|s| s.throttled_gpus), Some(1));
}

#[test]
fn once_shows_queued_xids() {
    let fake = FakeNvml::new("ecc-xid79");
    let (code, stdout, stderr) = probe(&fake.lib, "lossless-8port", "yaml");
    assert_eq!(code, 0, "{stderr}");
    let status = parse_yaml(&stdout).status.unwrap_or_default();
    let xids: Vec<u32> = status
        .gpus
        .iter()
        .flat_map(|g| g.xids.iter().map(|x| x.xid))
        .collect();
    assert_eq!(xids, vec![79]);
}

#[test]
fn a_missing_library_fails_only_the_nvml_collector() {
    let (code, stdout, stderr) = probe(
        std::path::Path::new("/nonexistent/libnvidia-ml.so.1"),
        "lossless-8port",
        "yaml",
    );
    assert_eq!(code, 0, "{stderr}");
    let status = parse_yaml(&stdout).status.unwrap_or_default();
    let nvml = status.collectors.iter().find(|c| c.name == CollectorName::Nvml);
    assert_eq!(nvml.map(|c| c.ok), Some(false));
    let error = nvml.and_then(|c| c.error.clone()).unwrap_or_default();
    assert!(error.contains("cannot open shared object file"), "{error}");
    assert!(
        status
            .collectors
            .iter()
            .filter(|c| c.name != CollectorName::Nvml)
            .all(|c| c.ok)
    );
    assert!(status.gpus.is_empty() && status.gpu_count.is_none() && status.throttled_gpus.is_none());
    assert_eq!(status.network.map(|n| n.rdma_devices.len()), Some(8));
}

#[test]
fn a_failing_init_is_reported_with_its_reason() {
    let fake = FakeNvml::new("init-fails");
    let (code, stdout, stderr) = probe(&fake.lib, "ofed-ecn-absent", "yaml");
    assert_eq!(code, 0, "{stderr}");
    let status = parse_yaml(&stdout).status.unwrap_or_default();
    let nvml = status.collectors.iter().find(|c| c.name == CollectorName::Nvml);
    assert!(
        nvml.and_then(|c| c.error.clone())
            .is_some_and(|e| e.contains("DriverNotLoaded"))
    );
    assert!(status.cooling.is_some());
}

#[test]
fn bad_input_everywhere_still_prints_a_report() {
    let fake = FakeNvml::new("absurd-values");
    let (code, stdout, stderr) = probe(&fake.lib, "bad-input", "yaml");
    assert_eq!(code, 0, "{stderr}");
    let status = parse_yaml(&stdout).status.unwrap_or_default();
    assert!(status.collectors.iter().all(|c| c.ok), "{:?}", status.collectors);
    assert_eq!(status.gpus.len(), 8);
    assert!(status.gpus.iter().take(2).all(|g| !g.errors.is_empty()));
    assert!(
        status
            .network
            .is_some_and(|n| n.rdma_devices.iter().all(|d| !d.errors.is_empty()))
    );
    assert!(status.cooling.is_some_and(|c| !c.errors.is_empty()));
}
