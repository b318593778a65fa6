//! A GPU reset the way NVML does one (drain on, remove from the bus, discover again), through
//! the real nvml-wrapper calls against the fake library: what it clears, what the collector
//! then reports, how each of the three calls fails, and the probe's `reset_gpu`, which refuses
//! a GPU that is not the one asked for or that a process uses.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::FakeNvml;
use gpunode_crds::report::{EccCounters, GpuNodeReportStatus, RemappedRows};
use gpunode_probe::collect::Collector;
use gpunode_probe::nvml::{
    NvmlCollector, NvmlConfig,
    reset::{ResetError, reset_gpu},
};
use nvml_wrapper::{
    Nvml,
    enum_wrappers::device::{DetachGpuState, PcieLinkState},
    error::NvmlError,
};

fn collect(fake: &FakeNvml) -> GpuNodeReportStatus {
    let collector = NvmlCollector::new(NvmlConfig {
        lib_path: fake.lib.clone().into(),
        watch_xids: false,
        ..NvmlConfig::default()
    });
    let mut report = GpuNodeReportStatus::default();
    collector.collect(&mut report).expect("collect");
    report
}

fn open(fake: &FakeNvml) -> Nvml {
    Nvml::builder()
        .lib_path(fake.lib.as_os_str())
        .init()
        .expect("init the fake NVML")
}

/// Persistence off, drain on, remove, discover: the reset sequence of `nvidia-smi drain` and
/// the GPU Operator.
fn reset(nvml: &Nvml, index: u32) -> Result<(), NvmlError> {
    let mut device = nvml.device_by_index(index)?;
    let pci = device.pci_info()?;
    device.set_persistent(false)?;
    device.set_drain(true, pci.clone())?;
    let (removed, _) = device.remove(pci.clone(), DetachGpuState::Remove, PcieLinkState::ShutDown);
    removed.map_err(|e| e.error)?;
    nvml.discover_gpus(pci)
}

/// GPU 5 with a pending row remap and two volatile uncorrectable ECC errors.
fn faulty() -> FakeNvml {
    let fake = FakeNvml::new("healthy-8xh100");
    fake.edit(|f| {
        f["devices"][5]["remapped_rows"]["pending"] = 1.into();
        f["devices"][5]["remapped_rows"]["unc"] = 1.into();
        f["devices"][5]["ecc"]["vol"]["unc"] = 2.into();
        f["devices"][5]["ecc"]["agg"]["unc"] = 7.into();
    });
    fake
}

#[test]
fn a_reset_applies_the_pending_remap_and_clears_volatile_ecc_only() {
    let fake = faulty();
    let before = collect(&fake);
    let g = &before.gpus[5];
    assert_eq!(g.remapped_rows.as_ref().map(|r| r.pending), Some(true));
    assert_eq!(g.ecc.as_ref().map(|e| e.volatile_uncorrected), Some(2));

    let nvml = open(&fake);
    reset(&nvml, 5).expect("reset");
    let after = collect(&fake);
    let g = &after.gpus[5];
    assert_eq!(
        g.remapped_rows,
        Some(RemappedRows {
            correctable: 0,
            uncorrectable: 1,
            pending: false,
            failure: false
        }),
        "the pending remap is applied: the remapped row stays counted"
    );
    assert_eq!(
        g.ecc,
        Some(EccCounters {
            volatile_corrected: 0,
            volatile_uncorrected: 0,
            aggregate_corrected: 0,
            aggregate_uncorrected: 7
        }),
        "volatile counters restart with the driver's view of the GPU; aggregate ones persist"
    );
    assert_eq!(
        after.gpus[4].ecc, before.gpus[4].ecc,
        "the other GPUs are untouched"
    );

    // It is the hardware's state: it outlives this process's handle to the library.
    drop(nvml);
    assert_eq!(
        collect(&fake).gpus[5].remapped_rows.as_ref().map(|r| r.pending),
        Some(false),
        "a reset survives nvmlShutdown"
    );
    // The reset describes that hardware state: a rewritten fixture that still shows it keeps
    // it cleared, one with new errors shows them.
    fake.edit(|f| f["comment"] = "touched".into());
    assert_eq!(
        collect(&fake).gpus[5].remapped_rows.as_ref().map(|r| r.pending),
        Some(false)
    );
    fake.edit(|f| f["devices"][5]["ecc"]["vol"]["unc"] = 3.into());
    assert_eq!(
        collect(&fake).gpus[5]
            .ecc
            .as_ref()
            .map(|e| e.volatile_uncorrected),
        Some(3)
    );
}

#[test]
fn a_gpu_is_removed_only_once_drained_and_is_lost_until_discovered() {
    let fake = faulty();
    let nvml = open(&fake);
    let device = nvml.device_by_index(5).unwrap();
    let pci = device.pci_info().unwrap();
    let (refused, device) = device.remove(pci.clone(), DetachGpuState::Remove, PcieLinkState::ShutDown);
    assert!(
        matches!(refused.map_err(|e| e.error), Err(NvmlError::InUse)),
        "a GPU not drained is in use"
    );
    let mut device = device.expect("the device is handed back after a failed remove");
    device.set_persistent(false).unwrap();
    device.set_drain(true, pci.clone()).unwrap();
    assert!(device.is_drain_enabled(pci.clone()).unwrap());
    let (removed, _) = device.remove(pci.clone(), DetachGpuState::Remove, PcieLinkState::ShutDown);
    removed.map_err(|e| e.error).unwrap();
    assert!(
        matches!(
            nvml.device_by_index(5)
                .unwrap()
                .temperature(nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu),
            Err(NvmlError::GpuLost)
        ),
        "removed from the bus"
    );
    nvml.discover_gpus(pci.clone()).unwrap();
    let back = nvml.device_by_index(5).unwrap();
    assert!(
        back.temperature(nvml_wrapper::enum_wrappers::device::TemperatureSensor::Gpu)
            .is_ok()
    );
    assert!(!back.is_drain_enabled(pci).unwrap(), "discovered undrained");
}

#[test]
fn each_step_of_a_reset_can_be_made_to_fail() {
    for (symbol, want) in [
        ("nvmlDeviceModifyDrainState", NvmlError::NotSupported),
        ("nvmlDeviceRemoveGpu_v2", NvmlError::InUse),
        ("nvmlDeviceDiscoverGpus", NvmlError::Unknown),
    ] {
        let fake = faulty();
        let code = match want {
            NvmlError::NotSupported => 3,
            NvmlError::InUse => 19,
            _ => 999,
        };
        fake.edit(|f| f["devices"][5]["errors"][symbol] = code.into());
        let nvml = open(&fake);
        let got = reset(&nvml, 5).expect_err(symbol);
        assert_eq!(
            std::mem::discriminant(&got),
            std::mem::discriminant(&want),
            "{symbol}: {got:?}"
        );
        if symbol != "nvmlDeviceDiscoverGpus" {
            assert_eq!(
                collect(&fake).gpus[5].remapped_rows.as_ref().map(|r| r.pending),
                Some(true),
                "{symbol}: a failed reset clears nothing"
            );
        }
    }
}

#[test]
fn a_gpu_with_processes_lists_them_and_cannot_be_removed() {
    let fake = faulty();
    fake.edit(|f| {
        f["devices"][5]["processes"] = serde_json::json!([
            {"pid": 4242, "used_memory": 1073741824u64},
            {"pid": 77, "used_memory": 4096, "graphics": true},
        ]);
    });
    let nvml = open(&fake);
    let mut device = nvml.device_by_index(5).unwrap();
    let compute: Vec<u32> = device
        .running_compute_processes()
        .unwrap()
        .iter()
        .map(|p| p.pid)
        .collect();
    assert_eq!(compute, [4242]);
    let graphics: Vec<u32> = device
        .running_graphics_processes()
        .unwrap()
        .iter()
        .map(|p| p.pid)
        .collect();
    assert_eq!(graphics, [77]);
    assert!(
        nvml.device_by_index(4)
            .unwrap()
            .running_compute_processes()
            .unwrap()
            .is_empty(),
        "an idle GPU lists none"
    );
    let pci = device.pci_info().unwrap();
    device.set_persistent(false).unwrap();
    device.set_drain(true, pci.clone()).unwrap();
    let (refused, _) = device.remove(pci, DetachGpuState::Remove, PcieLinkState::ShutDown);
    assert!(
        matches!(refused.map_err(|e| e.error), Err(NvmlError::InUse)),
        "a drained GPU that a process still uses is in use"
    );
}

#[test]
fn persistence_mode_holds_a_gpu_and_the_probe_turns_it_off_for_the_reset_and_back_on() {
    let fake = faulty();
    let nvml = open(&fake);
    let mut device = nvml.device_by_index(5).unwrap();
    assert!(
        device.is_in_persistent_mode().unwrap(),
        "the fixture's GPUs are persistent"
    );
    let pci = device.pci_info().unwrap();
    assert!(
        matches!(device.set_drain(true, pci), Err(NvmlError::InUse)),
        "NVML drains a GPU only with persistence mode off"
    );
    reset_gpu(&nvml, 5, &uuid(&fake, 5)).expect("the probe's reset handles persistence mode");
    assert_eq!(
        collect(&fake).gpus[5].remapped_rows.as_ref().map(|r| r.pending),
        Some(false)
    );
    assert!(
        nvml.device_by_index(5).unwrap().is_in_persistent_mode().unwrap(),
        "persistence mode is back on, as it was"
    );

    // A reset that fails leaves persistence mode as it was too.
    let fake = faulty();
    fake.edit(|f| f["devices"][5]["errors"]["nvmlDeviceRemoveGpu_v2"] = 999.into());
    let nvml = open(&fake);
    assert!(reset_gpu(&nvml, 5, &uuid(&fake, 5)).is_err());
    assert!(nvml.device_by_index(5).unwrap().is_in_persistent_mode().unwrap());
}

fn uuid(fake: &FakeNvml, index: usize) -> String {
    fake.json()["devices"][index]["uuid"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn the_probe_resets_only_the_gpu_asked_for_and_only_when_idle() {
    let fake = faulty();
    let nvml = open(&fake);
    let five = uuid(&fake, 5);
    assert_eq!(
        reset_gpu(&nvml, 5, &uuid(&fake, 4)),
        Err(ResetError::OtherGpu {
            index: 5,
            wanted: uuid(&fake, 4),
            found: five.clone()
        }),
        "an index that names another GPU now"
    );
    fake.edit(|f| {
        f["devices"][5]["processes"] = serde_json::json!([{"pid": 9}, {"pid": 3, "graphics": true}])
    });
    assert_eq!(
        reset_gpu(&nvml, 5, &five),
        Err(ResetError::InUse {
            index: 5,
            pids: vec![3, 9]
        })
    );
    assert_eq!(
        collect(&fake).gpus[5].remapped_rows.as_ref().map(|r| r.pending),
        Some(true),
        "nothing was reset"
    );
    fake.edit(|f| f["devices"][5]["processes"] = serde_json::json!([]));
    reset_gpu(&nvml, 5, &five).expect("an idle GPU is reset");
    assert_eq!(
        collect(&fake).gpus[5].remapped_rows.as_ref().map(|r| r.pending),
        Some(false)
    );
}

#[test]
fn a_failed_remove_leaves_the_gpu_undrained_and_a_failed_discover_says_so() {
    let fake = faulty();
    fake.edit(|f| f["devices"][5]["errors"]["nvmlDeviceRemoveGpu_v2"] = 999.into());
    let nvml = open(&fake);
    let five = uuid(&fake, 5);
    let err = reset_gpu(&nvml, 5, &five).unwrap_err();
    assert!(matches!(err, ResetError::Nvml { step: "remove", .. }), "{err:?}");
    let device = nvml.device_by_index(5).unwrap();
    let pci = device.pci_info().unwrap();
    assert!(!device.is_drain_enabled(pci).unwrap(), "the drain was undone");

    let fake = faulty();
    fake.edit(|f| f["devices"][5]["errors"]["nvmlDeviceDiscoverGpus"] = 999.into());
    let nvml = open(&fake);
    let err = reset_gpu(&nvml, 5, &uuid(&fake, 5)).unwrap_err();
    assert!(
        matches!(err, ResetError::Nvml { step: "discover", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("GPU 5: discover failed"), "{err}");
}
