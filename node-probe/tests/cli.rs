//! The `gpunode-probe --once` binary end to end, with the fake NVML library and fixture trees.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::process::Command;

use common::{FakeNvml, sysfs_tree};
use gpunode_crds::GpuNodeReport;
use gpunode_crds::report::{CollectorName, XidEvent};
use gpunode_probe::xid_state::XidStore;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn probe(fake_lib: &std::path::Path, tree: &str, format: &str) -> (i32, String, String) {
    probe_with(fake_lib, tree, format, &[])
}

fn probe_with(
    fake_lib: &std::path::Path,
    tree: &str,
    format: &str,
    extra: &[&std::ffi::OsStr],
) -> (i32, String, String) {
    let root = sysfs_tree(tree);
    let out = Command::new(env!("CARGO_BIN_EXE_gpunode-probe"))
        .args(["--once", "-o", format, "--node-name", "gpu-node-1"])
        .args(extra)
        .arg("--nvml-lib")
        .arg(fake_lib)
        .arg("--sysfs-root")
        .arg(root.join("sys"))
        .arg("--net-fixtures")
        .arg(&root)
        .env_remove("FAKE_NVML_FIXTURE")
        .env_remove("NODE_NAME")
        .env_remove("GPUNODE_STATE_DIR")
        .output()
        .expect("run gpunode-probe");
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
    let report: GpuNodeReport = serde_json::from_str(&json).unwrap();
    assert_eq!(report.status.and_then(|s| s.throttled_gpus), Some(1));
}

/// `--no-network` (the chart's nodeProbe.hostNetwork false): no RoCE NIC is read, and the
/// report has no network collector and no network section; the rest is as without it.
#[test]
fn no_network_reads_no_nic() {
    let fake = FakeNvml::new("throttled");
    let (code, stdout, stderr) = probe_with(
        &fake.lib,
        "lossless-8port",
        "yaml",
        &[std::ffi::OsStr::new("--no-network")],
    );
    assert_eq!(code, 0, "{stderr}");
    let status = parse_yaml(&stdout).status.unwrap_or_default();
    let collectors: Vec<CollectorName> = status.collectors.iter().map(|c| c.name).collect();
    assert_eq!(collectors, vec![CollectorName::Nvml, CollectorName::Cooling]);
    assert!(status.network.is_none(), "{:?}", status.network);
    assert_eq!(status.gpu_count, Some(8));
}

#[test]
fn once_shows_the_xids_of_this_boot_from_the_state_dir_not_from_before_it_started() {
    // XIDs in the fixture before the process started happened before it could register: NVML
    // never delivers them.
    let fake = FakeNvml::new("ecc-xid79");
    let xids_of = |stdout: &str| -> Vec<u32> {
        let status = parse_yaml(stdout).status.unwrap_or_default();
        status
            .gpus
            .iter()
            .flat_map(|g| g.xids.iter().map(|x| x.xid))
            .collect()
    };
    let (code, stdout, stderr) = probe(&fake.lib, "lossless-8port", "yaml");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(xids_of(&stdout), Vec::<u32>::new());

    // What the running probe saved during this boot is shown, and left as it was.
    let dir = tempfile::tempdir().unwrap();
    let proc_root = dir.path().join("proc");
    let random = proc_root.join("sys/kernel/random");
    std::fs::create_dir_all(&random).unwrap();
    std::fs::write(random.join("boot_id"), "boot-1\n").unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let store = XidStore::open(&state, "gpu-node-1", &proc_root).unwrap();
    let saved = XidEvent {
        xid: 79,
        at: Time(jiff::Timestamp::from_second(1_700_000_000).unwrap()),
    };
    let gpus: BTreeMap<u32, VecDeque<XidEvent>> = [(5, VecDeque::from([saved.clone()]))].into();
    store.save(&gpus).unwrap();
    let before = std::fs::read(store.path()).unwrap();
    let run = |proc_root: &std::path::Path| {
        probe_with(
            &fake.lib,
            "lossless-8port",
            "yaml",
            &[
                "--state-dir".as_ref(),
                state.as_os_str(),
                "--proc-root".as_ref(),
                proc_root.as_os_str(),
            ],
        )
    };
    let (code, stdout, stderr) = run(&proc_root);
    assert_eq!(code, 0, "{stderr}");
    let status = parse_yaml(&stdout).status.unwrap_or_default();
    assert_eq!(status.gpus.get(5).map(|g| g.xids.clone()), Some(vec![saved]));
    assert_eq!(xids_of(&stdout), vec![79]);
    assert_eq!(std::fs::read(store.path()).ok(), Some(before.clone()));

    // After a reboot (another boot id) they are gone.
    std::fs::write(random.join("boot_id"), "boot-2\n").unwrap();
    let (code, stdout, stderr) = run(&proc_root);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(xids_of(&stdout), Vec::<u32>::new());
    assert!(stderr.contains("the node rebooted"), "{stderr}");
    assert_eq!(std::fs::read(store.path()).ok(), Some(before));
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
