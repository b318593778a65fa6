//! NVML returning values no driver should and codes nvml-wrapper does not map: every affected
//! field is unknown with a reason, the rest of the GPU and of the node is still reported.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{FakeNvml, wait_until};
use gpunode_crds::report::{GpuNodeReportStatus, GpuStatus, MAX_XIDS_PER_GPU};
use gpunode_probe::collect::Collector;
use gpunode_probe::nvml::{NvmlCollector, NvmlConfig};

const DEADLINE: Duration = Duration::from_secs(30);

fn collector(fake: &FakeNvml) -> NvmlCollector {
    NvmlCollector::new(NvmlConfig {
        lib_path: fake.lib.clone().into(),
        watch_xids: true,
        event_wait: Duration::from_millis(50),
        ..NvmlConfig::default()
    })
}

fn reason(g: &GpuStatus, field: &str) -> String {
    g.errors
        .iter()
        .filter(|e| e.field == field)
        .map(|e| e.reason.clone())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[test]
fn absurd_values_become_field_errors() {
    let fake = FakeNvml::without_events("absurd-values");
    let c = collector(&fake);
    assert!(c.prepare(DEADLINE));
    fake.write_fixture("absurd-values");
    assert!(wait_until(DEADLINE, || c.xids().total() == 1), "no XID");
    let mut report = GpuNodeReportStatus::default();
    c.collect(&mut report).unwrap();
    assert_eq!(report.gpus.len(), 8);

    let g = &report.gpus[0];
    assert_eq!(g.ecc_mode, None);
    assert!(
        reason(g, "eccMode").contains("unexpected value or return code 2"),
        "{:?}",
        g.errors
    );
    assert_eq!(g.memory_mib, None);
    assert!(reason(g, "memoryMiB").contains("code 25"), "{:?}", g.errors);
    assert_eq!(g.persistence_mode, None);
    assert!(reason(g, "persistenceMode").contains("code 30"), "{:?}", g.errors);
    assert_eq!(g.temperature_celsius, None);
    assert!(
        reason(g, "temperatureCelsius").contains("implausible value 4294967291"),
        "{:?}",
        g.errors
    );
    assert_eq!(g.power_watts, None);
    assert!(reason(g, "powerWatts").contains("implausible"), "{:?}", g.errors);
    // The XID with an absurd code is kept (evidence is never dropped) and flagged.
    assert_eq!(
        g.xids.iter().map(|x| x.xid).collect::<Vec<_>>(),
        vec![1_000_000_000]
    );
    assert!(
        reason(g, "xids").contains("implausible XID code 1000000000"),
        "{:?}",
        g.errors
    );
    // Unaffected fields of the same GPU are there.
    assert!(g.uuid.is_some() && g.pcie.is_some() && g.nvlink.is_some() && g.ecc.is_some());

    let g = &report.gpus[1];
    assert_eq!(g.slowdown_celsius, None);
    assert!(reason(g, "slowdownCelsius").contains("4000"));
    assert_eq!(g.mig_mode, None);
    assert!(reason(g, "migMode").contains("MIG mode 7"));
    assert_eq!(g.shutdown_celsius, Some(92));

    let lost_handle = &report.gpus[6];
    assert_eq!(lost_handle.index, 6);
    assert_eq!(lost_handle.uuid, None);
    assert!(
        reason(lost_handle, "device").contains("GpuLost"),
        "{:?}",
        lost_handle.errors
    );

    let lost = &report.gpus[7];
    assert!(lost.uuid.is_none() && lost.temperature_celsius.is_none());
    assert!(lost.errors.len() >= 15, "{:?}", lost.errors);
    assert!(lost.errors.iter().all(|e| e.reason.contains("GpuLost")));

    assert!(report.gpus[2..6].iter().all(|g| g.errors.is_empty()));
    assert!(report.gpus[2..6].iter().all(|g| g.xids.is_empty()));
    c.shutdown();
}

#[test]
fn a_billion_xids_keep_memory_bounded_and_stop_cleanly() {
    let fake = FakeNvml::without_events("xid-flood");
    let c = collector(&fake);
    assert!(c.prepare(DEADLINE));
    fake.write_fixture("xid-flood");
    let log = c.xids();
    assert!(
        wait_until(DEADLINE, || log.total() >= 5_000),
        "only {} XIDs",
        log.total()
    );
    let mut report = GpuNodeReportStatus::default();
    c.collect(&mut report).unwrap();
    let g = &report.gpus[0];
    assert_eq!(g.xids.len(), MAX_XIDS_PER_GPU);
    assert!(g.xids.iter().all(|x| x.xid == 13));
    assert_eq!(log.counts().len(), 1);
    let started = std::time::Instant::now();
    c.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopping took {:?}",
        started.elapsed()
    );
}

#[test]
fn an_unmapped_code_on_a_whole_call_fails_only_that_field() {
    let fake = FakeNvml::new("healthy-8xh100");
    fake.edit(|f| {
        f["devices"][3]["errors"] = serde_json::json!({
            "nvmlDeviceGetRemappedRows": 25,
            "nvmlDeviceGetFieldValues": 999,
            "nvmlDeviceGetNvLinkState": 15,
            "nvmlDeviceGetPcieReplayCounter": 3,
            "nvmlDeviceGetCurrentClocksThrottleReasons": 26,
        })
    });
    let c = NvmlCollector::new(NvmlConfig {
        lib_path: fake.lib.clone().into(),
        watch_xids: false,
        ..NvmlConfig::default()
    });
    let mut report = GpuNodeReportStatus::default();
    c.collect(&mut report).unwrap();
    let g = &report.gpus[3];
    let fields: Vec<&str> = g.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "remappedRows",
            "memoryTemperatureCelsius",
            "throttleReasons",
            "nvlink",
            // The failed field-value call leaves the recovery action unknown too.
            "recoveryAction",
            "pcie.replayCounter"
        ]
    );
    assert!(g.throttle_reasons.is_empty());
    assert_eq!(g.pcie.as_ref().map(|p| p.current_generation), Some(5));
    assert!(
        report
            .gpus
            .iter()
            .filter(|g| g.index != 3)
            .all(|g| g.errors.is_empty())
    );
}
