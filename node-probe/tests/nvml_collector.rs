//! The NVML collector through the real nvml-wrapper code path, against the fake library.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{FakeNvml, wait_until};
use gpunode_crds::report::{EccCounters, GpuNodeReportStatus, GpuStatus, NvlinkStatus, RemappedRows};
use gpunode_crds::{EnabledState, ThrottleReason};
use gpunode_probe::collect::{Collector, is_throttled};
use gpunode_probe::nvml::{NvmlCollector, NvmlConfig};

const DEADLINE: Duration = Duration::from_secs(20);

fn collector(fake: &FakeNvml, watch_xids: bool) -> NvmlCollector {
    NvmlCollector::new(NvmlConfig {
        lib_path: fake.lib.clone().into(),
        watch_xids,
        event_wait: Duration::from_millis(50),
        ..NvmlConfig::default()
    })
}

fn collect(c: &NvmlCollector) -> GpuNodeReportStatus {
    let mut report = GpuNodeReportStatus::default();
    c.collect(&mut report).expect("collect");
    report
}

fn gpu(report: &GpuNodeReportStatus, index: usize) -> &GpuStatus {
    report.gpus.get(index).unwrap_or_else(|| panic!("no GPU {index}"))
}

#[test]
fn healthy_node_fills_every_field() {
    let fake = FakeNvml::new("healthy-8xh100");
    let c = collector(&fake, false);
    let report = collect(&c);
    assert_eq!(report.driver_version.as_deref(), Some("550.90.07"));
    assert_eq!(report.cuda_version.as_deref(), Some("12.4"));
    assert_eq!(report.gpu_count, Some(8));
    assert_eq!(report.gpus.len(), 8);
    for (i, g) in report.gpus.iter().enumerate() {
        assert_eq!(g.index as usize, i);
        assert!(g.errors.is_empty(), "GPU {i}: {:?}", g.errors);
        assert!(!is_throttled(g));
    }
    let g = gpu(&report, 0);
    assert_eq!(
        g.uuid.as_deref(),
        Some("GPU-5c3f0a10-7e21-4b9c-9d1e-2f6a40000018")
    );
    assert_eq!(g.product.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(g.pci_bus_id.as_deref(), Some("00000000:18:00.0"));
    assert_eq!(g.memory_mib, Some(81559));
    assert_eq!(g.ecc_mode, Some(EnabledState::Enabled));
    assert_eq!(g.ecc, Some(EccCounters::default()));
    assert_eq!(
        g.retired_pages
            .as_ref()
            .map(|r| (r.single_bit, r.double_bit, r.pending)),
        Some((0, 0, false))
    );
    assert_eq!(g.remapped_rows, Some(RemappedRows::default()));
    assert_eq!(g.temperature_celsius, Some(38));
    assert_eq!(g.memory_temperature_celsius, Some(44));
    assert_eq!((g.slowdown_celsius, g.shutdown_celsius), (Some(89), Some(92)));
    assert_eq!((g.power_watts, g.power_limit_watts), (Some(71), Some(700)));
    assert_eq!(g.throttle_reasons, vec![ThrottleReason::GpuIdle]);
    let pcie = g.pcie.as_ref().map(|p| {
        (
            p.current_generation,
            p.max_generation,
            p.current_width,
            p.max_width,
        )
    });
    assert_eq!(pcie, Some((5, 5, 16, 16)));
    assert_eq!(
        g.nvlink,
        Some(NvlinkStatus {
            active: 18,
            total: 18,
            ..NvlinkStatus::default()
        })
    );
    assert_eq!(g.persistence_mode, Some(EnabledState::Enabled));
    assert_eq!(g.mig_mode, Some(EnabledState::Disabled));
    assert!(g.xids.is_empty());
}

#[test]
fn throttled_gpu_reports_reasons_by_name() {
    let fake = FakeNvml::new("throttled");
    let report = collect(&collector(&fake, false));
    let g = gpu(&report, 2);
    assert_eq!(
        g.throttle_reasons,
        vec![
            ThrottleReason::HwSlowdown,
            ThrottleReason::SwThermalSlowdown,
            ThrottleReason::HwThermalSlowdown
        ]
    );
    assert_eq!(g.temperature_celsius, Some(87));
    assert_eq!(g.slowdown_celsius, Some(89));
    assert!(is_throttled(g));
    assert_eq!(report.gpus.iter().filter(|g| is_throttled(g)).count(), 1);
}

#[test]
fn memory_faults_and_link_degradation_are_reported() {
    let report = collect(&collector(&FakeNvml::new("ecc-xid79"), false));
    let g = gpu(&report, 5);
    assert_eq!(
        g.ecc
            .as_ref()
            .map(|e| (e.volatile_uncorrected, e.aggregate_uncorrected)),
        Some((1, 1))
    );
    assert_eq!(
        g.remapped_rows
            .as_ref()
            .map(|r| (r.uncorrectable, r.pending, r.failure)),
        Some((1, true, false))
    );

    let report = collect(&collector(&FakeNvml::new("row-remap-failure"), false));
    assert_eq!(
        gpu(&report, 3).remapped_rows.as_ref().map(|r| r.failure),
        Some(true)
    );

    let report = collect(&collector(&FakeNvml::new("pcie-gen4-x8"), false));
    let pcie = gpu(&report, 1)
        .pcie
        .as_ref()
        .map(|p| (p.current_generation, p.current_width, p.max_generation));
    assert_eq!(pcie, Some((4, 8, 5)));

    let report = collect(&collector(&FakeNvml::new("nvlink-two-down"), false));
    assert_eq!(
        gpu(&report, 4).nvlink,
        Some(NvlinkStatus {
            active: 16,
            total: 18,
            ..NvlinkStatus::default()
        })
    );
    assert_eq!(
        gpu(&report, 3).nvlink,
        Some(NvlinkStatus {
            active: 18,
            total: 18,
            ..NvlinkStatus::default()
        })
    );
}

#[test]
fn driver_versions_are_reported_as_found() {
    let report = collect(&collector(&FakeNvml::new("old-driver"), false));
    assert_eq!(report.driver_version.as_deref(), Some("525.85.12"));
    assert_eq!(report.cuda_version.as_deref(), Some("12.0"));
    let report = collect(&collector(&FakeNvml::new("driver-580"), false));
    assert_eq!(report.driver_version.as_deref(), Some("580.82.07"));
    assert_eq!(gpu(&report, 0).memory_temperature_celsius, Some(44));
}

#[test]
fn init_failure_fails_the_collector_with_the_reason() {
    let fake = FakeNvml::new("init-fails");
    let c = collector(&fake, true);
    let mut report = GpuNodeReportStatus::default();
    let err = c
        .collect(&mut report)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("DriverNotLoaded"), "{err}");
    assert!(report.gpus.is_empty() && report.gpu_count.is_none());
    // The driver comes up later: the next collection loads it.
    fake.write(&std::fs::read_to_string(common::nvml_fixture("healthy-8xh100")).unwrap_or_default());
    assert_eq!(collect(&c).gpus.len(), 8);
}

#[test]
fn a_running_collector_sees_a_flipped_fixture() {
    let fake = FakeNvml::new("healthy-8xh100");
    let c = collector(&fake, false);
    assert!(!collect(&c).gpus.iter().any(is_throttled));
    fake.edit(|f| f["devices"][6]["throttle_reasons"] = 0x40.into());
    let report = collect(&c);
    assert_eq!(
        gpu(&report, 6).throttle_reasons,
        vec![ThrottleReason::HwThermalSlowdown]
    );
}

#[test]
fn xids_that_happen_after_registration_arrive_through_the_event_thread() {
    let fake = FakeNvml::without_events("ecc-xid79");
    let c = collector(&fake, true);
    assert!(c.prepare(DEADLINE), "XID thread not ready");
    fake.write_fixture("ecc-xid79");
    let log = c.xids();
    assert!(wait_until(DEADLINE, || log.total() == 1), "no XID");
    let report = collect(&c);
    let xids: Vec<u32> = gpu(&report, 5).xids.iter().map(|x| x.xid).collect();
    assert_eq!(xids, vec![79]);
    assert!(
        report
            .gpus
            .iter()
            .filter(|g| g.index != 5)
            .all(|g| g.xids.is_empty())
    );
    // Re-reading the fixture does not replay it.
    fake.edit(|f| f["comment"] = "touched".into());
    let report = collect(&c);
    assert_eq!(gpu(&report, 5).xids.len(), 1);
    c.shutdown();
}

#[test]
fn xids_from_before_registration_are_never_delivered() {
    // In the fixture when the library loads: happened before anyone could register.
    let fake = FakeNvml::new("ecc-xid79");
    let c = collector(&fake, true);
    assert!(c.prepare(DEADLINE), "XID thread not ready");
    fake.edit(|f| f["comment"] = "touched".into());
    let report = collect(&c);
    assert!(
        report.gpus.iter().all(|g| g.xids.is_empty()),
        "an XID from before registration arrived"
    );

    // Delivered to the process that had registered, never to one that starts afterwards.
    let later = FakeNvml::without_events("ecc-xid79");
    let first = collector(&later, true);
    assert!(first.prepare(DEADLINE), "XID thread not ready");
    later.write_fixture("ecc-xid79");
    assert!(wait_until(DEADLINE, || first.xids().total() == 1), "no XID");
    let second_lib = later.another_instance();
    let second = collector(&second_lib, true);
    assert!(second.prepare(DEADLINE), "XID thread not ready");
    second_lib.edit(|f| f["comment"] = "touched".into());
    let report = collect(&second);
    assert!(
        report.gpus.iter().all(|g| g.xids.is_empty()),
        "a second instance saw an old XID"
    );
    c.shutdown();
    first.shutdown();
    second.shutdown();
}

#[tokio::test]
async fn an_injected_xid_notifies_without_polling() {
    let fake = FakeNvml::new("healthy-8xh100");
    let c = collector(&fake, true);
    assert!(c.prepare(DEADLINE), "XID thread not ready");
    let log = c.xids();
    let mut rx = log.subscribe();
    fake.edit(|f| f["devices"][2]["events"] = serde_json::json!([{"id": 1, "type": 8, "xid": 48}]));
    tokio::time::timeout(DEADLINE, rx.changed())
        .await
        .expect("no XID notification")
        .unwrap();
    let report = collect(&c);
    let x = gpu(&report, 2).xids.first().map(|x| x.xid);
    assert_eq!(x, Some(48));
    // Appending delivers only the new event.
    fake.edit(|f| {
        f["devices"][2]["events"] =
            serde_json::json!([{"id": 1, "type": 8, "xid": 48}, {"id": 2, "type": 8, "xid": 79}])
    });
    assert!(wait_until(DEADLINE, || log.for_gpu(2).len() == 2));
    assert_eq!(
        log.for_gpu(2).iter().map(|x| x.xid).collect::<Vec<_>>(),
        vec![48, 79]
    );
    c.shutdown();
}

#[test]
fn a_missing_library_fails_cleanly() {
    let c = NvmlCollector::new(NvmlConfig {
        lib_path: "/nonexistent/libnvidia-ml.so.1".into(),
        ..NvmlConfig::default()
    });
    let mut report = GpuNodeReportStatus::default();
    assert!(c.collect(&mut report).is_err());
    assert!(!c.prepare(Duration::from_millis(10)));
}
