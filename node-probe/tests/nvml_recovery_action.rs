//! NVML's recovery action through the real nvml-wrapper calls against the fake library: read per
//! GPU, absent where the driver cannot report it, the same field on 580.82 drivers (not among the renumbered ids), and cleared
//! only by the reset or the reboot it asks for.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::FakeNvml;
use gpunode_crds::GpuRecoveryAction;
use gpunode_crds::report::GpuNodeReportStatus;
use gpunode_probe::collect::Collector;
use gpunode_probe::nvml::{NvmlCollector, NvmlConfig};

fn collector(fake: &FakeNvml) -> NvmlCollector {
    NvmlCollector::new(NvmlConfig {
        lib_path: fake.lib.clone().into(),
        watch_xids: false,
        ..NvmlConfig::default()
    })
}

fn collect(c: &NvmlCollector) -> GpuNodeReportStatus {
    let mut report = GpuNodeReportStatus::default();
    c.collect(&mut report).expect("collect");
    report
}

fn actions(report: &GpuNodeReportStatus) -> Vec<Option<GpuRecoveryAction>> {
    report.gpus.iter().map(|g| g.recovery_action).collect()
}

/// GPU 1 asks for a reset, 2 for a reboot, 3 to drain P2P, 4 to drain and reset, 0 for nothing.
fn asking(driver: &str) -> FakeNvml {
    let fake = FakeNvml::new("healthy-8xh100");
    fake.edit(|f| {
        f["driver_version"] = driver.into();
        for (gpu, action) in [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)] {
            f["devices"][gpu]["recovery_action"] = action.into();
        }
    });
    fake
}

#[test]
fn reads_each_gpus_action_and_leaves_it_absent_where_not_supported() {
    use GpuRecoveryAction::*;
    let fake = asking("550.90.07");
    let report = collect(&collector(&fake));
    assert_eq!(
        actions(&report),
        [
            Some(None),
            Some(GpuReset),
            Some(NodeReboot),
            Some(DrainP2p),
            Some(DrainAndReset),
            Option::None,
            Option::None,
            Option::None
        ]
    );
    assert!(
        report.gpus.iter().all(|g| g.errors.is_empty()),
        "NotSupported is no error: {:?}",
        report.gpus.iter().map(|g| &g.errors).collect::<Vec<_>>()
    );
}

#[test]
fn a_580_82_driver_is_asked_for_the_same_field_which_is_not_renumbered() {
    let fake = asking("580.82.07");
    let report = collect(&collector(&fake));
    assert_eq!(
        report.gpus[2].recovery_action,
        Some(GpuRecoveryAction::NodeReboot)
    );
}

#[test]
fn a_value_nvml_does_not_define_is_a_field_error() {
    let fake = FakeNvml::new("healthy-8xh100");
    fake.edit(|f| f["devices"][6]["recovery_action"] = 9.into());
    let report = collect(&collector(&fake));
    assert_eq!(report.gpus[6].recovery_action, None);
    let error = report.gpus[6].errors.first().expect("an error");
    assert_eq!(error.field, "recoveryAction");
    assert!(error.reason.contains("recovery action 9"), "{}", error.reason);
}

#[test]
fn a_failing_read_is_a_field_error_not_absent() {
    let fake = FakeNvml::new("healthy-8xh100");
    fake.edit(|f| {
        f["devices"][6]["recovery_action"] = 2.into();
        f["devices"][6]["errors"]["field:230"] = 999.into();
    });
    let report = collect(&collector(&fake));
    assert_eq!(report.gpus[6].recovery_action, None);
    assert!(report.gpus[6].errors.iter().any(|e| e.field == "recoveryAction"));
}

#[test]
fn a_gpu_reset_clears_only_the_actions_it_does_and_a_reboot_clears_all() {
    use GpuRecoveryAction::*;
    let fake = asking("550.90.07");
    let c = collector(&fake);
    assert_eq!(collect(&c).gpus[1].recovery_action, Some(GpuReset));
    for gpu in 1..=4u32 {
        let uuid = collect(&c).gpus[gpu as usize].uuid.clone().expect("uuid");
        c.reset(gpu, &uuid).expect("reset");
    }
    let after = actions(&collect(&c));
    assert_eq!(
        &after[..5],
        [
            Some(None),
            Some(None),
            Some(NodeReboot),
            Some(DrainP2p),
            Some(None)
        ],
        "a reset does GpuReset and DrainAndReset; NodeReboot and DrainP2P persist"
    );
    // A fixture rewritten with the same values still shows the reset done.
    fake.edit(|f| f["comment"] = "touched".into());
    assert_eq!(collect(&c).gpus[1].recovery_action, Some(None));

    // The reboot: the hardware state is gone and the GPUs come back without the fault.
    let _ = std::fs::remove_file(format!("{}.hardware", fake.fixture.display()));
    fake.edit(|f| {
        for gpu in 0..5 {
            f["devices"][gpu]["recovery_action"] = 0.into();
        }
    });
    assert!(actions(&collect(&c))[..5].iter().all(|a| *a == Some(None)));
}
