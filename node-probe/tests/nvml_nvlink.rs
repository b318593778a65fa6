//! NVLink error counters and the NVSwitch fabric registration through the real nvml-wrapper
//! calls against the fake library: the counters become counts over the last hour (kept across
//! a probe restart on the same boot, restarted by a counter reset), a registration that did not
//! complete is published as such, and the operator's checks judge both. Healthy counters moving
//! at normal rates never drift and, with the policies known, never write the report.

// clippy.toml allows unwrap and expect in #[test] fns only; the helper fns fail the test the
// same way (a panic naming what broke).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::FakeNvml;
use gpunode_checks::evaluate::evaluate;
use gpunode_checks::verdict::{NodeState, Verdict};
use gpunode_crds::nvlink::{FabricState, NvlinkErrorRates};
use gpunode_crds::policy::{GpuRequirements, NvlinkRequirements};
use gpunode_crds::report::GpuNodeReportStatus;
use gpunode_crds::{DriftClass, GpuNodePolicySpec, GpuNodeReport, GpuNodeReportSpec};
use gpunode_probe::boot_state::BootFile;
use gpunode_probe::change::{ChangeConfig, KnownPolicy, decide};
use gpunode_probe::collect::Collector;
use gpunode_probe::nvml::{NvmlCollector, NvmlConfig, nvlink};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

const T0: i64 = 1_800_000_000;

/// An HGX H100 board: every GPU registered with the fabric, no NVLink error yet.
fn hgx() -> FakeNvml {
    let fake = FakeNvml::new("healthy-8xh100");
    fake.edit(|f| {
        for d in f["devices"].as_array_mut().unwrap() {
            d["fabric"] = json!({"state": 3, "status": 0, "clique_id": 1, "health_mask": 2});
        }
    });
    fake
}

/// Sets GPU `gpu`'s link `link` counters to `counters` (`{"crc_flit": 10, ...}`).
fn set_counters(fake: &FakeNvml, gpu: usize, link: usize, counters: serde_json::Value) {
    fake.edit(|f| {
        let mut links = vec![json!({}); 18];
        if let Some(old) = f["devices"][gpu]["nvlink_errors"].as_array() {
            for (i, l) in old.iter().enumerate() {
                links[i] = l.clone();
            }
        }
        links[link] = counters;
        f["devices"][gpu]["nvlink_errors"] = json!(links);
    });
}

fn collector(fake: &FakeNvml, state: Option<BootFile>, now: i64) -> NvmlCollector {
    NvmlCollector::new(NvmlConfig {
        lib_path: fake.lib.clone().into(),
        watch_xids: false,
        nvlink_state: state,
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

/// The state file of node n1 in `dir`, during `boot`.
fn state_file(dir: &Path, boot: &str) -> BootFile {
    let proc = dir.join(format!("proc-{boot}"));
    std::fs::create_dir_all(proc.join("sys/kernel/random")).unwrap();
    std::fs::write(proc.join("sys/kernel/random/boot_id"), format!("{boot}\n")).unwrap();
    BootFile::open(
        &dir.join("state"),
        nvlink::FILE_NAME,
        nvlink::FORMAT,
        nvlink::MAX_FILE_BYTES,
        "n1",
        &proc,
    )
    .unwrap()
}

/// Budgets for an HGX board, and a completed fabric registration.
fn policy() -> GpuNodePolicySpec {
    GpuNodePolicySpec {
        gpu: Some(GpuRequirements {
            fatal_xids: Vec::new(),
            allow_row_remap_failure: true,
            nvlink: Some(NvlinkRequirements {
                min_active_links: 18,
                max_replay_errors_per_hour: Some(100),
                max_recovery_errors_per_hour: Some(0),
                max_crc_errors_per_hour: Some(1000),
                require_fabric_registration: true,
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

fn rates(status: &GpuNodeReportStatus, gpu: usize) -> &[NvlinkErrorRates] {
    &status.gpus[gpu].nvlink.as_ref().unwrap().error_rates
}

#[test]
fn a_registered_board_without_errors_is_compliant_and_lists_no_link() {
    let fake = hgx();
    let status = collect(&collector(&fake, None, T0), T0);
    for gpu in &status.gpus {
        let fabric = gpu.fabric.as_ref().unwrap();
        assert!(fabric.registered(), "{fabric:?}");
        assert_eq!(fabric.bandwidth_degraded, Some(false));
        assert_eq!(
            fabric.cluster_uuid.as_deref(),
            Some("6f1d0e54-9a1e-4c37-9b0e-1f5e6a7b8c9d")
        );
        assert!(gpu.nvlink.as_ref().unwrap().error_rates.is_empty());
        assert!(gpu.errors.is_empty(), "{:?}", gpu.errors);
    }
    let v = verdict(&status, T0);
    assert_eq!(v.state, NodeState::Compliant, "{}", v.summary());
}

#[test]
fn a_crc_burst_on_one_link_is_counted_over_the_hour_and_drifts() {
    let fake = hgx();
    set_counters(&fake, 3, 5, json!({"crc_flit": 120, "replay": 30}));
    let probe = collector(&fake, None, T0);
    collect(&probe, T0);
    // Ten minutes later the link counted 4812 more damaged flits.
    set_counters(&fake, 3, 5, json!({"crc_flit": 4932, "replay": 70}));
    let probe = probe.with_clock(|| T0 + 600);
    let status = collect(&probe, T0 + 600);
    let link = &rates(&status, 3)[0];
    assert_eq!(
        (
            link.link,
            link.crc_flit_errors,
            link.replay_errors,
            link.window_minutes
        ),
        (5, Some(4812), Some(40), 10)
    );
    assert_eq!((link.recovery_errors, link.crc_data_errors), (Some(0), Some(0)));
    let v = verdict(&status, T0 + 600);
    assert_eq!(v.state, NodeState::Drifted);
    assert_eq!(v.drifts.len(), 1, "{v:?}");
    assert_eq!(v.drifts[0].class, DriftClass::Nvlink);
    assert_eq!(
        v.drifts[0].message(),
        "gpu 3: gpu.nvlink.maxCrcErrorsPerHour: expected <= 1000 per link per hour, \
         got link 5: 4812 NVML_NVLINK_ERROR_DL_CRC_FLIT (last 10m)"
    );
}

#[test]
fn the_history_outlives_a_probe_restart_on_the_same_boot_but_not_a_reboot() {
    let fake = hgx();
    let dir = tempfile::tempdir().unwrap();
    set_counters(&fake, 0, 2, json!({"recovery": 1}));
    collect(&collector(&fake, Some(state_file(dir.path(), "boot-a")), T0), T0);
    set_counters(&fake, 0, 2, json!({"recovery": 3}));
    // A restarted probe on the same boot counts the recoveries while it was away.
    let restarted = collector(&fake, Some(state_file(dir.path(), "boot-a")), T0 + 400);
    let status = collect(&restarted, T0 + 400);
    assert_eq!(rates(&status, 0)[0].recovery_errors, Some(2));
    assert_eq!(verdict(&status, T0 + 400).state, NodeState::Drifted);
    // A new boot forgets them: the counters restarted with the driver anyway.
    let rebooted = collector(&fake, Some(state_file(dir.path(), "boot-b")), T0 + 800);
    let status = collect(&rebooted, T0 + 800);
    assert!(rates(&status, 0).is_empty(), "{:?}", rates(&status, 0));
}

#[test]
fn counters_going_backwards_restart_the_count() {
    let fake = hgx();
    set_counters(&fake, 1, 0, json!({"crc_data": 500}));
    let probe = collector(&fake, None, T0);
    collect(&probe, T0);
    // Cleared (a GPU reset, a driver reload): nothing before counts.
    set_counters(&fake, 1, 0, json!({"crc_data": 4}));
    let probe = probe.with_clock(|| T0 + 300);
    assert!(rates(&collect(&probe, T0 + 300), 1).is_empty());
}

#[test]
fn a_registration_that_did_not_complete_drifts_and_a_board_without_fabric_reports_not_supported() {
    let fake = hgx();
    fake.edit(|f| {
        f["devices"][6]["fabric"] = json!({"state": 1});
        f["devices"][7]["fabric"] = json!({"state": 3, "status": 999});
    });
    let status = collect(&collector(&fake, None, T0), T0);
    assert_eq!(
        status.gpus[6].fabric.as_ref().unwrap().state,
        FabricState::NotStarted
    );
    let v = verdict(&status, T0);
    let messages: Vec<String> = v.drifts.iter().map(|d| d.message()).collect();
    assert_eq!(
        messages,
        [
            "gpu 6: gpu.nvlink.requireFabricRegistration: expected fabric registration Completed, \
             status Success, got NotStarted",
            "gpu 7: gpu.nvlink.requireFabricRegistration: expected fabric registration Completed, \
             status Success, got Completed, status Unknown",
        ]
    );
    // A PCIe board: the call is NotSupported, which is no error, and the GPU is not registered.
    let pcie = FakeNvml::new("healthy-8xh100nvl");
    let status = collect(&collector(&pcie, None, T0), T0);
    let fabric = status.gpus[0].fabric.as_ref().unwrap();
    assert_eq!(
        (fabric.state, fabric.status.as_deref()),
        (FabricState::NotSupported, None)
    );
    assert!(status.gpus[0].errors.is_empty(), "{:?}", status.gpus[0].errors);
}

#[test]
fn a_counter_nvml_fails_to_read_is_a_field_error_and_unknown() {
    let fake = hgx();
    fake.edit(|f| f["devices"][2]["errors"] = json!({"nvmlDeviceGetNvLinkErrorCounter": 999}));
    let status = collect(&collector(&fake, None, T0), T0);
    let fields: Vec<&str> = status.gpus[2].errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "nvlink.errorRates.replayErrors",
            "nvlink.errorRates.recoveryErrors",
            "nvlink.errorRates.crcFlitErrors",
            "nvlink.errorRates.crcDataErrors"
        ]
    );
    let v = verdict(&status, T0);
    assert_eq!(v.state, NodeState::Unknown, "{}", v.summary());
    assert!(v.unknowns.iter().all(|u| u.gpu == Some(2)), "{v:?}");
    assert_eq!(v.unknowns[0].reason, "link 0: NVML: Unknown");
}

/// Every link's counters `secs` after the probe started, moving as healthy links do: a CRC
/// error every few minutes and the replay it causes, no recovery.
fn healthy_counters(secs: i64) -> serde_json::Value {
    let every = |period: i64| secs / period;
    json!({"crc_flit": 20 + every(240), "crc_data": every(900), "replay": 5 + every(240)})
}

/// Three hours of one-minute collections of an HGX board whose links all count errors at
/// healthy rates, published as the probe's publish loop decides; returns the writes per hour
/// and the worst verdict.
fn writes_per_hour(policies: Option<&[KnownPolicy]>) -> (Vec<usize>, NodeState) {
    let fake = hgx();
    let mut published = GpuNodeReportStatus::default();
    let mut writes = vec![0; 3];
    let mut worst = NodeState::Compliant;
    let mut probe = collector(&fake, None, T0);
    for step in 0..180 {
        let secs = step * 60;
        let now = T0 + secs;
        fake.edit(|f| {
            for d in f["devices"].as_array_mut().unwrap() {
                d["nvlink_errors"] = json!(vec![healthy_counters(secs); 18]);
            }
        });
        probe = probe.with_clock(move || now);
        let next = collect(&probe, now);
        if verdict(&next, now).state != NodeState::Compliant {
            worst = verdict(&next, now).state;
        }
        let at = jiff::Timestamp::from_second(now).unwrap();
        if step > 0 && !decide(&published, &next, policies, &ChangeConfig::default(), at).is_empty() {
            writes[usize::try_from(secs / 3600).unwrap()] += 1;
        }
        if step == 0 || !decide(&published, &next, policies, &ChangeConfig::default(), at).is_empty() {
            published = next;
        }
    }
    (writes, worst)
}

#[test]
fn healthy_nvlink_counters_moving_at_normal_rates_never_drift_nor_flood_writes() {
    let policies = [KnownPolicy {
        name: "hgx".into(),
        spec: policy(),
    }];
    // With the policies known, only a verdict change writes: none.
    assert_eq!(
        writes_per_hour(Some(&policies)),
        (vec![0, 0, 0], NodeState::Compliant)
    );
    // Without them, a count reaching another order of magnitude writes; once the window is
    // full the counts hold steady and nothing writes.
    let (writes, worst) = writes_per_hour(None);
    assert_eq!(worst, NodeState::Compliant);
    assert!(writes[0] <= 6, "{writes:?}");
    assert_eq!(writes[2], 0, "{writes:?}");
}
