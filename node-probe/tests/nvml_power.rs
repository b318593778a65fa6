//! The enforced power limit and the PCIe replay counter through the real nvml-wrapper calls
//! against the fake library: a limit set the way `nvidia-smi -pl` sets it (root only, within
//! the board's constraints) reaches the report and drifts under `gpu.power`; the replays are
//! counted over the last hour, kept across a probe restart on the same boot (not a reboot), and
//! drift under `gpu.pcie.maxReplaysPerHour` only when they come fast.

// clippy.toml allows unwrap and expect in #[test] fns only; the helper fns fail the test the
// same way (a panic naming what broke).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::FakeNvml;
use gpunode_checks::evaluate::evaluate;
use gpunode_checks::verdict::{NodeState, Verdict};
use gpunode_crds::policy::{GpuRequirements, PcieRequirements};
use gpunode_crds::power::PowerRequirements;
use gpunode_crds::report::GpuNodeReportStatus;
use gpunode_crds::{DriftClass, GpuNodePolicySpec, GpuNodeReport, GpuNodeReportSpec};
use gpunode_probe::boot_state::BootFile;
use gpunode_probe::collect::Collector;
use gpunode_probe::nvml::{NvmlCollector, NvmlConfig, signals};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

const T0: i64 = 1_800_000_000;

fn collector(fake: &FakeNvml, state: Option<BootFile>, now: i64) -> NvmlCollector {
    NvmlCollector::new(NvmlConfig {
        lib_path: fake.lib.clone().into(),
        watch_xids: false,
        pcie_state: state,
        ..NvmlConfig::default()
    })
    .with_clock(move || now)
}

fn collect(c: &NvmlCollector, now: i64) -> GpuNodeReportStatus {
    let mut report = GpuNodeReportStatus {
        observed_at: Some(Time(jiff::Timestamp::from_second(now).unwrap())),
        ..GpuNodeReportStatus::default()
    };
    c.collect(&mut report).expect("collect");
    report
}

/// The PCIe replay state file of node n1 in `dir`, during `boot`.
fn state_file(dir: &Path, boot: &str) -> BootFile {
    let proc = dir.join(format!("proc-{boot}"));
    std::fs::create_dir_all(proc.join("sys/kernel/random")).unwrap();
    std::fs::write(proc.join("sys/kernel/random/boot_id"), format!("{boot}\n")).unwrap();
    BootFile::open(
        &dir.join("state"),
        signals::FILE_NAME,
        signals::FORMAT,
        signals::MAX_FILE_BYTES,
        "n1",
        &proc,
    )
    .unwrap()
}

/// GPU `gpu`'s cumulative replay counter is `value`.
fn set_replays(fake: &FakeNvml, gpu: usize, value: u64) {
    fake.edit(|f| f["devices"][gpu]["pcie"]["replay"] = value.into());
}

/// At least 90% of the default limit, at most 100 replays an hour.
fn policy() -> GpuNodePolicySpec {
    GpuNodePolicySpec {
        gpu: Some(GpuRequirements {
            fatal_xids: Vec::new(),
            allow_row_remap_failure: true,
            pcie: Some(PcieRequirements {
                max_replays_per_hour: Some(100),
                ..PcieRequirements::default()
            }),
            power: Some(PowerRequirements {
                min_limit_percent_of_default: Some(90),
                ..PowerRequirements::default()
            }),
            ..GpuRequirements::default()
        }),
        ..GpuNodePolicySpec::default()
    }
}

fn verdict(status: &GpuNodeReportStatus, now: i64) -> Verdict {
    let mut report = GpuNodeReport::new(
        "n1",
        GpuNodeReportSpec {
            node_name: "n1".into(),
        },
    );
    report.status = Some(status.clone());
    evaluate(
        &policy(),
        Some(&report),
        jiff::Timestamp::from_second(now).unwrap(),
    )
}

fn replays(status: &GpuNodeReportStatus, gpu: usize) -> (Option<u64>, Option<u32>) {
    let pcie = status.gpus[gpu].pcie.as_ref().unwrap();
    (pcie.replays_last_hour, pcie.replay_window_minutes)
}

#[test]
fn a_limit_set_like_nvidia_smi_pl_reaches_the_report_and_drifts() {
    let fake = FakeNvml::new("healthy-8xh100");
    let status = collect(&collector(&fake, None, T0), T0);
    assert_eq!(status.gpus[2].power_limit_watts, Some(700));
    assert_eq!(status.gpus[2].default_power_limit_watts, Some(700));
    let v = verdict(&status, T0);
    assert_eq!(v.state, NodeState::Compliant, "{}", v.summary());

    // `nvidia-smi -i 2 -pl 400`, through the same NVML call: a user may not, root may, and
    // only within the board's constraints.
    let nvml = Nvml::builder().lib_path(fake.lib.as_os_str()).init().unwrap();
    let mut gpu = nvml.device_by_index(2).unwrap();
    assert!(matches!(
        gpu.set_power_management_limit(400_000),
        Err(NvmlError::NoPermission)
    ));
    fake.edit(|f| f["privileged"] = true.into());
    let constraints = gpu.power_management_limit_constraints().unwrap();
    assert_eq!((constraints.min_limit, constraints.max_limit), (200_000, 700_000));
    assert!(matches!(
        gpu.set_power_management_limit(150_000),
        Err(NvmlError::InvalidArg)
    ));
    gpu.set_power_management_limit(400_000).unwrap();

    let status = collect(&collector(&fake, None, T0 + 10), T0 + 10);
    assert_eq!(status.gpus[2].power_limit_watts, Some(400));
    assert_eq!(status.gpus[2].default_power_limit_watts, Some(700));
    let v = verdict(&status, T0 + 10);
    assert_eq!(v.state, NodeState::Drifted, "{}", v.summary());
    assert_eq!(v.drifts.len(), 1, "{}", v.summary());
    let d = &v.drifts[0];
    assert_eq!(
        (d.class, d.check.as_str(), d.gpu),
        (DriftClass::Config, "gpu.power.minLimitPercentOfDefault", Some(2))
    );
    assert_eq!(
        (d.expected.as_str(), d.actual.as_str()),
        (">= 90% of the 700 W default", "400 W enforced")
    );
}

#[test]
fn replays_are_counted_over_the_hour_and_a_fast_rise_drifts() {
    let fake = FakeNvml::new("healthy-8xh100");
    set_replays(&fake, 5, 1_000);
    let probe = collector(&fake, None, T0);
    // Replays since the driver loaded are not in the window.
    assert_eq!(replays(&collect(&probe, T0), 5), (Some(0), Some(0)));
    // A slow rate (3 in 5 minutes) is compliant; 500 more in the next 5 minutes is not.
    set_replays(&fake, 5, 1_003);
    let probe = probe.with_clock(|| T0 + 300);
    let status = collect(&probe, T0 + 300);
    assert_eq!(replays(&status, 5), (Some(3), Some(5)));
    assert_eq!(verdict(&status, T0 + 300).state, NodeState::Compliant);
    set_replays(&fake, 5, 1_503);
    let probe = probe.with_clock(|| T0 + 600);
    let status = collect(&probe, T0 + 600);
    assert_eq!(replays(&status, 5), (Some(503), Some(10)));
    let v = verdict(&status, T0 + 600);
    assert_eq!(v.drifts.len(), 1, "{}", v.summary());
    let d = &v.drifts[0];
    assert_eq!(
        (d.class, d.check.as_str(), d.gpu),
        (DriftClass::Pcie, "gpu.pcie.maxReplaysPerHour", Some(5))
    );
    assert_eq!(d.actual, "503 replays in the last 10 min");
}

#[test]
fn the_replay_history_outlives_a_probe_restart_on_the_same_boot_but_not_a_reboot() {
    let fake = FakeNvml::new("healthy-8xh100");
    let dir = tempfile::tempdir().unwrap();
    set_replays(&fake, 0, 10);
    collect(&collector(&fake, Some(state_file(dir.path(), "boot-a")), T0), T0);
    assert!(dir.path().join("state").join(signals::FILE_NAME).exists());
    // 300 replays while the probe was away: the restarted probe on the same boot counts them.
    set_replays(&fake, 0, 310);
    let restarted = collector(&fake, Some(state_file(dir.path(), "boot-a")), T0 + 400);
    let status = collect(&restarted, T0 + 400);
    assert_eq!(replays(&status, 0), (Some(300), Some(6)));
    assert_eq!(verdict(&status, T0 + 400).state, NodeState::Drifted);
    // A new boot forgets them: the counter restarted with the driver anyway.
    let rebooted = collector(&fake, Some(state_file(dir.path(), "boot-b")), T0 + 800);
    let status = collect(&rebooted, T0 + 800);
    assert_eq!(replays(&status, 0), (Some(0), Some(0)));
    assert_eq!(verdict(&status, T0 + 800).state, NodeState::Compliant);
}
