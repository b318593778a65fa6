//! `evaluate(policy, report, now)`: one behaviour per test.
//!
//! Most tests start from two fixtures, a healthy 8x H100 node (`healthy-h100-report.yaml`) and a
//! policy that sets every check (`strict-policy.yaml`), change one value with `.set(path, yaml)`
//! or `.remove(path)`, and state the exact verdict that follows.

// clippy.toml allows unwrap and expect in #[test] fns only; this test crate's helper fns fail
// the same way (a panic naming what broke), so the allow covers the whole crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpunode_crds::{DriftClass, GpuNodePolicy, GpuNodePolicySpec, GpuNodeReport};
use gpunode_operator::{
    evaluate::evaluate,
    verdict::{Drift, NodeState, Unknown, Verdict},
};
use jiff::Timestamp;
use serde_yaml::Value;

/// When every test evaluates: 30 s after the healthy report was observed.
const NOW: &str = "2026-11-29T12:00:30Z";

fn now() -> Timestamp {
    NOW.parse().unwrap_or_else(|e| panic!("{NOW}: {e}"))
}

fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/evaluate")
}

/// A YAML document (report or policy) that tests change one path at a time.
#[derive(Clone)]
struct Doc(Value);

impl Doc {
    fn load(name: &str) -> Doc {
        let path = fixtures_dir().join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Doc(serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    /// Sets the value at a dotted path (`status.gpus.3.temperatureCelsius`; numbers index
    /// lists) to `yaml`, creating the last key when it is missing.
    fn set(mut self, path: &str, yaml: &str) -> Doc {
        let value: Value = serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        let (parent, last) = self.parent(path);
        match parent {
            Value::Mapping(m) => {
                m.insert(Value::String(last.to_string()), value);
            }
            Value::Sequence(s) => {
                let i: usize = last.parse().unwrap_or_else(|e| panic!("{path}: {e}"));
                match i.cmp(&s.len()) {
                    std::cmp::Ordering::Less => s[i] = value,
                    std::cmp::Ordering::Equal => s.push(value),
                    std::cmp::Ordering::Greater => panic!("{path}: index past the end"),
                }
            }
            other => panic!("{path}: parent is {other:?}"),
        }
        self
    }

    /// Removes the value at a dotted path.
    fn remove(mut self, path: &str) -> Doc {
        let (parent, last) = self.parent(path);
        let removed = match parent {
            Value::Mapping(m) => m.remove(last).is_some(),
            Value::Sequence(s) => {
                let i: usize = last.parse().unwrap_or_else(|e| panic!("{path}: {e}"));
                i < s.len() && {
                    s.remove(i);
                    true
                }
            }
            _ => false,
        };
        assert!(removed, "{path}: nothing to remove");
        self
    }

    fn parent<'a>(&mut self, path: &'a str) -> (&mut Value, &'a str) {
        let mut parts: Vec<&str> = path.split('.').collect();
        let last = parts.pop().unwrap_or_else(|| panic!("{path}: empty path"));
        let mut node = &mut self.0;
        for part in parts {
            node = match part.parse::<usize>() {
                Ok(i) if node.is_sequence() => node.get_mut(i),
                _ => node.get_mut(part),
            }
            .unwrap_or_else(|| panic!("{path}: no {part:?}"));
        }
        (node, last)
    }

    fn report(&self) -> GpuNodeReport {
        serde_yaml::from_value(self.0.clone()).unwrap_or_else(|e| panic!("report: {e}"))
    }

    fn policy(&self) -> GpuNodePolicySpec {
        let policy: GpuNodePolicy =
            serde_yaml::from_value(self.0.clone()).unwrap_or_else(|e| panic!("policy: {e}"));
        policy.spec
    }
}

fn healthy() -> Doc {
    Doc::load("healthy-h100-report.yaml")
}

fn strict() -> Doc {
    Doc::load("strict-policy.yaml")
}

fn eval(policy: &Doc, report: &Doc) -> Verdict {
    evaluate(&policy.policy(), Some(&report.report()), now())
}

fn drift(
    class: DriftClass,
    check: &str,
    gpu: Option<u32>,
    device: Option<&str>,
    expected: &str,
    actual: &str,
) -> Drift {
    Drift {
        class,
        check: check.to_string(),
        expected: expected.to_string(),
        actual: actual.to_string(),
        gpu,
        device: device.map(str::to_string),
    }
}

fn unknown(check: &str, gpu: Option<u32>, reason: &str) -> Unknown {
    Unknown {
        check: check.to_string(),
        reason: reason.to_string(),
        gpu,
    }
}

/// The verdict is Drifted with exactly `drifts` and no unknown.
#[track_caller]
fn assert_drifts(v: &Verdict, drifts: &[Drift]) {
    assert_eq!(v.drifts, drifts, "drifts");
    assert_eq!(v.unknowns, [], "unknowns");
    assert_eq!(v.state, NodeState::Drifted);
}

/// The verdict is Unknown with exactly `unknowns` and no drift.
#[track_caller]
fn assert_unknowns(v: &Verdict, unknowns: &[Unknown]) {
    assert_eq!(v.drifts, [], "drifts");
    assert_eq!(v.unknowns, unknowns, "unknowns");
    assert_eq!(v.state, NodeState::Unknown);
}

#[track_caller]
fn assert_compliant(v: &Verdict) {
    assert_eq!(v.drifts, [], "drifts");
    assert_eq!(v.unknowns, [], "unknowns");
    assert_eq!(v.state, NodeState::Compliant);
}

use DriftClass::*;

// ---------------------------------------------------------------------------------------------
// The baseline

#[test]
fn a_healthy_h100_node_is_compliant_with_the_strict_policy() {
    let v = eval(&strict(), &healthy());
    assert_compliant(&v);
    assert!(v.classes().is_empty());
    assert_eq!(v.summary(), "compliant: every check of the policy passed");
}

#[test]
fn the_shipped_examples_accept_the_healthy_h100_node() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for name in ["h100-training.yaml", "fabric-only.yaml"] {
        let path = examples.join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let policy: GpuNodePolicy = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let v = evaluate(&policy.spec, Some(&healthy().report()), now());
        assert_eq!(v.state, NodeState::Compliant, "{name}: {}", v.summary());
    }
}

#[test]
fn a_policy_without_sections_checks_nothing() {
    let empty = Doc(serde_yaml::from_str(
        "{kind: GpuNodePolicy, apiVersion: gpunode.dev/v1alpha1, metadata: {name: empty}, spec: {}}",
    )
    .unwrap());
    let broken = healthy()
        .set("status.driverVersion", "garbage")
        .set("status.collectors.0.ok", "false")
        .remove("status.network");
    assert_compliant(&eval(&empty, &broken));
}

// ---------------------------------------------------------------------------------------------
// gpu: inventory

#[test]
fn a_gpu_count_other_than_count_is_inventory_drift() {
    let report = healthy().set("status.gpuCount", "7").remove("status.gpus.7");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(Inventory, "gpu.count", None, None, "8", "7")],
    );
}

#[test]
fn a_product_matching_no_accepted_model_is_inventory_drift_of_that_gpu() {
    let report = healthy().set("status.gpus.2.product", "NVIDIA A100-SXM4-80GB");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Inventory,
            "gpu.products",
            Some(2),
            None,
            "one of [H100]",
            "NVIDIA A100-SXM4-80GB",
        )],
    );
}

#[test]
fn products_match_case_insensitive_substrings_of_the_nvml_name() {
    let policy = strict().set("spec.gpu.products", "[a100, h100 80gb]");
    assert_compliant(&eval(&policy, &healthy()));
}

#[test]
fn less_memory_than_min_memory_mib_is_inventory_drift() {
    let report = healthy().set("status.gpus.4.memoryMiB", "40960");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Inventory,
            "gpu.minMemoryMiB",
            Some(4),
            None,
            ">= 81000 MiB",
            "40960 MiB",
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// gpu: driver and CUDA

#[test]
fn a_driver_outside_the_driver_version_range_is_driver_drift_of_the_node() {
    let report = healthy().set("status.driverVersion", "535.183.01");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Driver,
            "gpu.driverVersion",
            None,
            None,
            ">=550.54.15, <560",
            "535.183.01",
        )],
    );
}

#[test]
fn a_cuda_version_outside_the_cuda_version_range_is_driver_drift() {
    let report = healthy().set("status.cudaVersion", "'12.2'");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(Driver, "gpu.cudaVersion", None, None, ">=12.4", "12.2")],
    );
}

#[test]
fn driver_versions_compare_numerically() {
    // 550.100 is newer than 550.54.15, although it sorts before it as a string.
    let report = healthy().set("status.driverVersion", "'550.100'");
    assert_compliant(&eval(&strict(), &report));
}

// ---------------------------------------------------------------------------------------------
// gpu: modes

#[test]
fn ecc_disabled_where_ecc_mode_requires_enabled_is_config_drift() {
    let report = healthy().set("status.gpus.1.eccMode", "Disabled");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(Config, "gpu.eccMode", Some(1), None, "Enabled", "Disabled")],
    );
}

#[test]
fn persistence_mode_disabled_is_config_drift() {
    let report = healthy().set("status.gpus.6.persistenceMode", "Disabled");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Config,
            "gpu.persistenceMode",
            Some(6),
            None,
            "Enabled",
            "Disabled",
        )],
    );
}

#[test]
fn mig_enabled_where_mig_mode_requires_disabled_is_config_drift() {
    let report = healthy().set("status.gpus.0.migMode", "Enabled");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(Config, "gpu.migMode", Some(0), None, "Disabled", "Enabled")],
    );
}

// ---------------------------------------------------------------------------------------------
// gpu: PCIe and NVLink

#[test]
fn a_link_trained_below_min_generation_is_pcie_drift() {
    let report = healthy().set("status.gpus.5.pcie.currentGeneration", "4");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Pcie,
            "gpu.pcie.minGeneration",
            Some(5),
            None,
            ">= Gen5",
            "Gen4 (max Gen5)",
        )],
    );
}

#[test]
fn a_link_narrower_than_min_width_is_pcie_drift() {
    let report = healthy().set("status.gpus.5.pcie.currentWidth", "8");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Pcie,
            "gpu.pcie.minWidth",
            Some(5),
            None,
            ">= x16",
            "x8 (max x16)",
        )],
    );
}

#[test]
fn fewer_active_nvlinks_than_min_active_links_is_nvlink_drift() {
    let report = healthy().set("status.gpus.7.nvlink.active", "17");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Nvlink,
            "gpu.nvlink.minActiveLinks",
            Some(7),
            None,
            ">= 18 active",
            "17 active of 18",
        )],
    );
}

#[test]
fn min_active_links_zero_accepts_gpus_without_nvlink() {
    let policy = strict().set("spec.gpu.nvlink.minActiveLinks", "0");
    let report = healthy().remove("status.gpus.7.nvlink");
    assert_compliant(&eval(&policy, &report));
}

// ---------------------------------------------------------------------------------------------
// gpu: NVLink error counters and the NVSwitch fabric

/// Budgets a platform team might set for an HGX H100 board.
fn nvlink_budgets() -> Doc {
    strict().set(
        "spec.gpu.nvlink",
        "{minActiveLinks: 18, maxReplayErrorsPerHour: 100, maxRecoveryErrorsPerHour: 0, \
         maxCrcErrorsPerHour: 1000, requireFabricRegistration: true}",
    )
}

/// One link's counts over the last hour, as a healthy link moves: a few CRC errors and the
/// replays they cause, no recovery.
fn healthy_link(link: usize) -> String {
    format!(
        "{{link: {link}, windowMinutes: 60, replayErrors: {}, recoveryErrors: 0, crcFlitErrors: {}, crcDataErrors: {}}}",
        link % 5,
        3 + link * 7,
        link % 3
    )
}

/// The healthy report with every GPU registered with the fabric and every link's counts moving
/// at healthy rates.
fn nvlink_healthy() -> Doc {
    (0..8).fold(healthy(), |doc, i| {
        let links: Vec<String> = (0..18).map(healthy_link).collect();
        doc.set(
            &format!("status.gpus.{i}.nvlink.errorRates"),
            &format!("[{}]", links.join(", ")),
        )
        .set(
            &format!("status.gpus.{i}.fabric"),
            "{state: Completed, status: Success, cliqueId: 1, \
             clusterUuid: 6f1d0e54-9a1e-4c37-9b0e-1f5e6a7b8c9d, bandwidthDegraded: false, healthMask: 10}",
        )
    })
}

#[test]
fn healthy_nvlink_counters_moving_at_normal_rates_never_drift() {
    assert_compliant(&eval(&nvlink_budgets(), &nvlink_healthy()));
    // At the edge of every budget, still compliant: a budget is the most allowed.
    let edge = nvlink_healthy().set(
        "status.gpus.2.nvlink.errorRates.4",
        "{link: 4, windowMinutes: 60, replayErrors: 100, recoveryErrors: 0, crcFlitErrors: 1000, crcDataErrors: 1000}",
    );
    assert_compliant(&eval(&nvlink_budgets(), &edge));
}

#[test]
fn an_nvlink_crc_burst_is_nvlink_drift_of_that_gpu_naming_link_counter_and_window() {
    let report = nvlink_healthy().set(
        "status.gpus.5.nvlink.errorRates.3",
        "{link: 3, windowMinutes: 25, replayErrors: 40, recoveryErrors: 0, crcFlitErrors: 4812, crcDataErrors: 3}",
    );
    assert_drifts(
        &eval(&nvlink_budgets(), &report),
        &[drift(
            Nvlink,
            "gpu.nvlink.maxCrcErrorsPerHour",
            Some(5),
            None,
            "<= 1000 per link per hour",
            "link 3: 4812 NVML_NVLINK_ERROR_DL_CRC_FLIT (last 25m)",
        )],
    );
}

#[test]
fn each_nvlink_counter_over_its_budget_drifts_under_its_own_check() {
    let cases = [
        ("replayErrors", "101", "gpu.nvlink.maxReplayErrorsPerHour"),
        ("recoveryErrors", "1", "gpu.nvlink.maxRecoveryErrorsPerHour"),
        ("crcFlitErrors", "1001", "gpu.nvlink.maxCrcErrorsPerHour"),
        ("crcDataErrors", "1001", "gpu.nvlink.maxCrcErrorsPerHour"),
    ];
    for (field, value, check) in cases {
        let report = nvlink_healthy().set(&format!("status.gpus.1.nvlink.errorRates.9.{field}"), value);
        let v = eval(&nvlink_budgets(), &report);
        let checks: Vec<(&str, Option<u32>)> = v.drifts.iter().map(|d| (d.check.as_str(), d.gpu)).collect();
        assert_eq!(checks, vec![(check, Some(1))], "{field}");
        assert_eq!(v.drifts[0].class, Nvlink);
    }
}

#[test]
fn a_gpu_whose_fabric_registration_did_not_complete_is_nvlink_drift() {
    for (fabric, actual) in [
        ("{state: NotStarted}", "NotStarted"),
        ("{state: InProgress}", "InProgress"),
        ("{state: Completed, status: Unknown}", "Completed, status Unknown"),
        ("{state: NotSupported}", "NotSupported"),
    ] {
        let report = nvlink_healthy().set("status.gpus.6.fabric", fabric);
        assert_drifts(
            &eval(&nvlink_budgets(), &report),
            &[drift(
                Nvlink,
                "gpu.nvlink.requireFabricRegistration",
                Some(6),
                None,
                "fabric registration Completed, status Success",
                actual,
            )],
        );
    }
}

#[test]
fn nvlink_checks_not_asked_for_are_not_judged() {
    // The strict policy sets only minActiveLinks: no fabric and huge counts are not its business.
    let report = nvlink_healthy()
        .set("status.gpus.6.fabric", "{state: NotStarted}")
        .set(
            "status.gpus.0.nvlink.errorRates.0",
            "{link: 0, windowMinutes: 60, recoveryErrors: 9999}",
        );
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn missing_nvlink_data_is_unknown_only_where_it_was_asked_for_and_not_read() {
    // No fabric section at all (an older probe): Unknown, not drifted.
    let report = nvlink_healthy().remove("status.gpus.4.fabric");
    assert_unknowns(
        &eval(&nvlink_budgets(), &report),
        &[unknown(
            "gpu.nvlink.requireFabricRegistration",
            Some(4),
            "not reported",
        )],
    );
    // A counter NVML does not report for a link is not judged.
    let report = nvlink_healthy().set(
        "status.gpus.4.nvlink.errorRates.2",
        "{link: 2, windowMinutes: 60}",
    );
    assert_compliant(&eval(&nvlink_budgets(), &report));
    // One the probe failed to read is Unknown, with the probe's reason.
    let report = nvlink_healthy()
        .set(
            "status.gpus.4.nvlink.errorRates.2",
            "{link: 2, windowMinutes: 60, replayErrors: 0, crcFlitErrors: 0, crcDataErrors: 0}",
        )
        .set(
            "status.gpus.4.errors",
            "[{field: nvlink.errorRates.recoveryErrors, reason: 'link 2: NVML: Unknown'}]",
        );
    assert_unknowns(
        &eval(&nvlink_budgets(), &report),
        &[unknown(
            "gpu.nvlink.maxRecoveryErrorsPerHour",
            Some(4),
            "link 2: NVML: Unknown",
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// gpu: memory health

#[test]
fn volatile_uncorrected_ecc_errors_above_the_max_are_memory_drift() {
    let report = healthy().set("status.gpus.3.ecc.volatileUncorrected", "1");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Memory,
            "gpu.maxVolatileUncorrectedEcc",
            Some(3),
            None,
            "<= 0",
            "1",
        )],
    );
}

#[test]
fn more_retired_pages_than_max_retired_pages_is_memory_drift() {
    let report = healthy().set(
        "status.gpus.2.retiredPages",
        "{singleBit: 40, doubleBit: 21, pending: false}",
    );
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Memory,
            "gpu.maxRetiredPages",
            Some(2),
            None,
            "<= 60 retired pages, none pending",
            "61 retired pages (40 single-bit, 21 double-bit)",
        )],
    );
}

#[test]
fn exactly_max_retired_pages_is_compliant() {
    let report = healthy().set(
        "status.gpus.2.retiredPages",
        "{singleBit: 40, doubleBit: 20, pending: false}",
    );
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn a_page_pending_retirement_is_memory_drift_even_below_the_max() {
    let report = healthy().set("status.gpus.2.retiredPages.pending", "true");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Memory,
            "gpu.maxRetiredPages",
            Some(2),
            None,
            "<= 60 retired pages, none pending",
            "0 retired pages (0 single-bit, 0 double-bit), retirement pending",
        )],
    );
}

#[test]
fn a_failed_row_remap_is_memory_drift() {
    let report = healthy().set("status.gpus.4.remappedRows.failure", "true");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Memory,
            "gpu.allowRowRemapFailure",
            Some(4),
            None,
            "no failed or pending row remap",
            "row remap failed (1 correctable, 0 uncorrectable rows remapped)",
        )],
    );
}

#[test]
fn a_pending_row_remap_is_memory_drift() {
    let report = healthy().set("status.gpus.4.remappedRows.pending", "true");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Memory,
            "gpu.allowRowRemapFailure",
            Some(4),
            None,
            "no failed or pending row remap",
            "row remap pending (1 correctable, 0 uncorrectable rows remapped)",
        )],
    );
}

#[test]
fn allow_row_remap_failure_accepts_failed_and_pending_remaps() {
    let policy = strict().set("spec.gpu.allowRowRemapFailure", "true");
    let report = healthy()
        .set("status.gpus.4.remappedRows.failure", "true")
        .set("status.gpus.4.remappedRows.pending", "true")
        // Nor is the field needed any more.
        .remove("status.gpus.5.remappedRows");
    assert_compliant(&eval(&policy, &report));
}

// ---------------------------------------------------------------------------------------------
// gpu: XIDs

#[test]
fn a_fatal_xid_is_xid_drift_of_that_gpu() {
    let report = healthy().set("status.gpus.3.xids", "[{xid: 79, at: '2026-11-29T11:58:00Z'}]");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Xid,
            "gpu.fatalXids",
            Some(3),
            None,
            "none of [48, 64, 74, 79, 94, 95, 119, 120, 140] since boot",
            "XID 79 (RESTART_BM) at 2026-11-29T11:58:00Z",
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// gpu: NVML's recovery action

/// The healthy report with every GPU's recovery action None but GPU `gpu`'s `action`.
fn recovery(gpu: usize, action: &str) -> Doc {
    (0..8).fold(healthy(), |doc, i| {
        let value = if i == gpu { action } else { "None" };
        doc.set(&format!("status.gpus.{i}.recoveryAction"), value)
    })
}

#[test]
fn a_gpu_asking_for_a_reboot_is_xid_drift_of_that_gpu() {
    let policy = strict().set("spec.gpu.recoveryAction", "{}");
    assert_drifts(
        &eval(&policy, &recovery(2, "NodeReboot")),
        &[drift(
            Xid,
            "gpu.recoveryAction",
            Some(2),
            None,
            "none of [GpuReset, NodeReboot, DrainAndReset]",
            "NodeReboot",
        )],
    );
}

#[test]
fn recovery_action_none_never_drifts() {
    let policy = strict().set(
        "spec.gpu.recoveryAction",
        "{driftOn: [GpuReset, NodeReboot, DrainP2P, DrainAndReset]}",
    );
    assert_compliant(&eval(&policy, &recovery(0, "None")));
}

#[test]
fn an_action_outside_drift_on_is_not_drift() {
    let policy = strict().set("spec.gpu.recoveryAction", "{}");
    assert_compliant(&eval(&policy, &recovery(5, "DrainP2P")));
    let policy = strict().set("spec.gpu.recoveryAction", "{driftOn: [DrainP2P]}");
    assert_eq!(eval(&policy, &recovery(5, "DrainP2P")).drifts.len(), 1);
}

#[test]
fn an_unreported_recovery_action_is_unknown_only_when_the_policy_asks() {
    let report = healthy().set("status.gpus.4.recoveryAction", "GpuReset");
    assert_compliant(&eval(&strict(), &report));
    let v = eval(&strict().set("spec.gpu.recoveryAction", "{}"), &healthy());
    assert_eq!(v.state, NodeState::Unknown);
    assert!(
        v.unknowns.iter().all(|u| u.check == "gpu.recoveryAction"),
        "{:?}",
        v.unknowns
    );
    assert_eq!(v.unknowns[0].reason, "not reported");
}

#[test]
fn a_non_fatal_xid_is_not_drift() {
    let report = healthy().set(
        "status.gpus.3.xids",
        "[{xid: 13, at: '2026-11-29T11:58:00Z'}, {xid: 31, at: '2026-11-29T11:59:00Z'}]",
    );
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn without_xid_window_every_fatal_xid_in_the_report_counts() {
    let report = healthy().set("status.gpus.0.xids", "[{xid: 48, at: '2026-11-20T03:00:00Z'}]");
    let v = eval(&strict(), &report);
    assert_eq!(v.drifts.len(), 1);
    assert_eq!(
        v.drifts[0].actual,
        "XID 48 (WORKFLOW_XID_48) at 2026-11-20T03:00:00Z"
    );
}

#[test]
fn a_fatal_xid_older_than_xid_window_is_not_drift() {
    let policy = strict().set("spec.gpu.xidWindow", "1h");
    let report = healthy().set("status.gpus.3.xids", "[{xid: 79, at: '2026-11-29T10:59:00Z'}]");
    assert_compliant(&eval(&policy, &report));
}

#[test]
fn a_fatal_xid_within_xid_window_is_drift_with_the_latest_time_per_code() {
    let policy = strict().set("spec.gpu.xidWindow", "1h");
    let report = healthy().set(
        "status.gpus.3.xids",
        "[{xid: 79, at: '2026-11-29T10:00:00Z'}, {xid: 94, at: '2026-11-29T11:10:00Z'}, {xid: 79, at: '2026-11-29T11:30:00Z'}]",
    );
    assert_drifts(
        &eval(&policy, &report),
        &[drift(
            Xid,
            "gpu.fatalXids",
            Some(3),
            None,
            "none of [48, 64, 74, 79, 94, 95, 119, 120, 140] within 1h",
            "XID 79 (RESTART_BM) at 2026-11-29T11:30:00Z, XID 94 (RESTART_APP) at 2026-11-29T11:10:00Z",
        )],
    );
}

#[test]
fn fatal_xids_default_to_dcgms_fatal_set_plus_64() {
    let policy = strict().remove("spec.gpu.fatalXids");
    let report = healthy().set("status.gpus.3.xids", "[{xid: 94, at: '2026-11-29T11:58:00Z'}]");
    // 94 (contained ECC error) is in the strict policy's list but not in the default one.
    assert_compliant(&eval(&policy, &report));
    let report = healthy().set("status.gpus.3.xids", "[{xid: 64, at: '2026-11-29T11:58:00Z'}]");
    assert_eq!(eval(&policy, &report).drifts[0].check, "gpu.fatalXids");
}

// ---------------------------------------------------------------------------------------------
// gpu: XIDs by the resolution of NVIDIA's catalogue

/// The strict policy with `xidResolution` at its defaults and DCGM's fatal set by number.
fn by_resolution() -> Doc {
    strict()
        .remove("spec.gpu.fatalXids")
        .set("spec.gpu.xidResolution", "{}")
}

#[test]
fn an_xid_whose_resolution_is_in_drift_on_is_xid_drift_naming_the_resolution() {
    // 109 (context-switch timeout) is in no fatal list; the catalogue says RESET_GPU.
    let report = healthy().set("status.gpus.6.xids", "[{xid: 109, at: '2026-11-29T11:58:00Z'}]");
    assert_drifts(
        &eval(&by_resolution(), &report),
        &[drift(
            Xid,
            "gpu.xidResolution",
            Some(6),
            None,
            "no XID resolved by [RESET_GPU, RESTART_BM, WORKFLOW_XID_48] since boot",
            "XID 109 (RESET_GPU) at 2026-11-29T11:58:00Z",
        )],
    );
}

#[test]
fn xids_that_end_one_application_or_are_ignored_never_drift_by_default() {
    // 94 (contained ECC error), 13, 31, 45: RESTART_APP or a workflow; 43, 63, 92: IGNORE;
    // 200: not in the catalogue.
    let xids = [94, 13, 31, 45, 43, 63, 92, 200]
        .iter()
        .map(|x| format!("{{xid: {x}, at: '2026-11-29T11:58:00Z'}}"))
        .collect::<Vec<_>>()
        .join(", ");
    let report = healthy().set("status.gpus.2.xids", &format!("[{xids}]"));
    assert_compliant(&eval(&by_resolution(), &report));
    // Even when every resolution but IGNORE is listed, an IGNORE XID does not drift.
    let all = "{driftOn: [RESTART_APP, RESET_GPU, RESTART_BM, RESTART_VM, CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW, CHECK_UVM, WORKFLOW_XID_45, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR, XID_154]}";
    let report = healthy()
        .set("status.gpus.2.xids", "[{xid: 63, at: '2026-11-29T11:58:00Z'}]")
        // The fixture's XID 13 (RESTART_APP) on GPU 6 would drift with this list.
        .set("status.gpus.6.xids", "[]");
    assert_compliant(&eval(
        &by_resolution().set("spec.gpu.xidResolution", all),
        &report,
    ));
}

#[test]
fn an_xid_listed_by_number_is_reported_once_by_fatal_xids_with_its_resolution() {
    let report = healthy().set(
        "status.gpus.1.xids",
        "[{xid: 79, at: '2026-11-29T11:58:00Z'}, {xid: 143, at: '2026-11-29T11:59:00Z'}]",
    );
    let v = eval(&by_resolution(), &report);
    let found: Vec<(&str, &str)> = v
        .drifts
        .iter()
        .map(|d| (d.check.as_str(), d.actual.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("gpu.fatalXids", "XID 79 (RESTART_BM) at 2026-11-29T11:58:00Z"),
            ("gpu.xidResolution", "XID 143 (RESET_GPU) at 2026-11-29T11:59:00Z"),
        ]
    );
}

#[test]
fn a_policy_without_xid_resolution_still_drifts_by_number_only() {
    // A policy stored before xidResolution existed: 109 is not in its list, 79 is.
    let report = healthy().set("status.gpus.6.xids", "[{xid: 109, at: '2026-11-29T11:58:00Z'}]");
    assert_compliant(&eval(&strict(), &report));
    let report = healthy().set("status.gpus.6.xids", "[{xid: 79, at: '2026-11-29T11:58:00Z'}]");
    assert_eq!(eval(&strict(), &report).drifts[0].check, "gpu.fatalXids");
}

#[test]
fn an_xid_resolved_by_drift_on_older_than_xid_window_is_not_drift() {
    let policy = by_resolution().set("spec.gpu.xidWindow", "1h");
    // 143 (GPU init error): RESET_GPU, and in no fatal list.
    let report = healthy().set("status.gpus.6.xids", "[{xid: 143, at: '2026-11-29T10:59:00Z'}]");
    assert_compliant(&eval(&policy, &report));
    let report = healthy().set("status.gpus.6.xids", "[{xid: 143, at: '2026-11-29T11:01:00Z'}]");
    assert_eq!(eval(&policy, &report).drifts[0].check, "gpu.xidResolution");
}

#[test]
fn xid_resolution_is_unknown_when_the_probe_could_not_listen() {
    let report = healthy().set(
        "status.gpus.0.errors",
        "[{field: xids, reason: 'NVML: NotSupported'}]",
    );
    let v = eval(&by_resolution(), &report);
    let checks: Vec<&str> = v
        .unknowns
        .iter()
        .filter(|u| u.gpu == Some(0))
        .map(|u| u.check.as_str())
        .collect();
    assert_eq!(checks, ["gpu.fatalXids", "gpu.xidResolution"]);
}

// ---------------------------------------------------------------------------------------------
// gpu: power limit, power brake, PCIe replays per hour

/// The healthy report with every GPU's default limit 700 W and replays counted over the hour.
fn powered() -> Doc {
    (0..8).fold(healthy(), |doc, i| {
        doc.set(&format!("status.gpus.{i}.defaultPowerLimitWatts"), "700")
            .set(&format!("status.gpus.{i}.pcie.replaysLastHour"), "3")
            .set(&format!("status.gpus.{i}.pcie.replayWindowMinutes"), "60")
    })
}

#[test]
fn an_enforced_limit_below_the_share_of_the_default_is_config_drift() {
    let policy = strict().set("spec.gpu.power", "{minLimitPercentOfDefault: 90}");
    // 630 W is exactly 90% of 700 W: compliant.
    assert_compliant(&eval(
        &policy,
        &powered().set("status.gpus.1.powerLimitWatts", "630"),
    ));
    assert_drifts(
        &eval(&policy, &powered().set("status.gpus.1.powerLimitWatts", "629")),
        &[drift(
            Config,
            "gpu.power.minLimitPercentOfDefault",
            Some(1),
            None,
            ">= 90% of the 700 W default",
            "629 W enforced",
        )],
    );
}

#[test]
fn an_enforced_limit_outside_the_watt_range_is_config_drift() {
    let policy = strict().set("spec.gpu.power", "{minLimitWatts: 650, maxLimitWatts: 700}");
    assert_compliant(&eval(&policy, &powered()));
    let v = eval(&policy, &powered().set("status.gpus.4.powerLimitWatts", "500"));
    assert_eq!(v.drifts.len(), 1);
    assert_eq!(v.drifts[0].check, "gpu.power.minLimitWatts");
    let v = eval(&policy, &powered().set("status.gpus.4.powerLimitWatts", "750"));
    assert_eq!(v.drifts[0].check, "gpu.power.maxLimitWatts");
}

#[test]
fn an_unreported_default_limit_is_unknown_only_for_the_share_check() {
    let policy = strict().set("spec.gpu.power", "{minLimitPercentOfDefault: 90}");
    let v = eval(&policy, &healthy());
    assert_eq!(v.state, NodeState::Unknown);
    assert!(
        v.unknowns
            .iter()
            .all(|u| u.check == "gpu.power.minLimitPercentOfDefault"),
        "{:?}",
        v.unknowns
    );
}

#[test]
fn a_power_brake_that_lasts_is_throttle_drift_and_a_brief_one_is_not() {
    let policy = strict().set("spec.gpu.power", "{maxPowerBrake: 2m}");
    // Braking for 90 s of the 2 minutes allowed: compliant, and the verdict says when that
    // changes by time alone (a second past the 2 minutes), so the operator looks again then.
    let brief = eval(
        &policy,
        &powered().set("status.gpus.3.powerBrakeSince", "'2026-11-29T11:59:00Z'"),
    );
    assert_compliant(&brief);
    assert_eq!(
        brief.changes_at,
        Some("2026-11-29T12:01:01Z".parse::<jiff::Timestamp>().unwrap())
    );
    assert_drifts(
        &eval(
            &policy,
            &powered().set("status.gpus.3.powerBrakeSince", "'2026-11-29T11:55:00Z'"),
        ),
        &[drift(
            Throttle,
            "gpu.power.maxPowerBrake",
            Some(3),
            None,
            "hardware power brake for at most 2m",
            "braking since 2026-11-29T11:55:00Z",
        )],
    );
}

#[test]
fn pcie_replays_over_the_hourly_budget_are_pcie_drift() {
    let policy = strict().set("spec.gpu.pcie.maxReplaysPerHour", "100");
    // Replays at a healthy rate (3 an hour) never drift.
    assert_compliant(&eval(&policy, &powered()));
    assert_drifts(
        &eval(
            &policy,
            &powered().set("status.gpus.7.pcie.replaysLastHour", "101"),
        ),
        &[drift(
            Pcie,
            "gpu.pcie.maxReplaysPerHour",
            Some(7),
            None,
            "<= 100 replays per hour",
            "101 replays in the last 60 min",
        )],
    );
    // Not counted: unknown, not compliant.
    let v = eval(&policy, &healthy());
    assert_eq!(v.state, NodeState::Unknown);
}

// ---------------------------------------------------------------------------------------------
// cooling: GPU temperatures and throttling

#[test]
fn a_gpu_hotter_than_max_gpu_celsius_is_thermal_drift() {
    let policy = strict().remove("spec.cooling.minSlowdownMarginCelsius");
    let report = healthy().set("status.gpus.3.temperatureCelsius", "91");
    assert_drifts(
        &eval(&policy, &report),
        &[drift(
            Thermal,
            "cooling.maxGpuCelsius",
            Some(3),
            None,
            "<= 85 C",
            "91 C",
        )],
    );
}

#[test]
fn a_gpu_closer_to_slowdown_than_the_margin_is_thermal_drift() {
    // 83 C with slowdown at 87 C: 4 C of margin, 5 required, though below maxGpuCelsius 85.
    let report = healthy().set("status.gpus.3.temperatureCelsius", "83");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Thermal,
            "cooling.minSlowdownMarginCelsius",
            Some(3),
            None,
            ">= 5 C below slowdown",
            "4 C (83 C, slowdown at 87 C)",
        )],
    );
}

#[test]
fn a_margin_of_exactly_min_slowdown_margin_is_compliant() {
    let report = healthy().set("status.gpus.3.temperatureCelsius", "82");
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn an_implausible_gpu_temperature_is_unknown_never_compliant_or_hot() {
    // A probe bug or a dead sensor, not a GPU at -2,147,483,648 C (or at 2,147,483,647 C).
    let why = |t: i32| {
        format!(
            "temperatureCelsius {t} C is outside what a GPU sensor reports (-40 to 200 C): a sensor or probe fault"
        )
    };
    for t in [i32::MIN, -41, 201, i32::MAX] {
        let report = healthy().set("status.gpus.3.temperatureCelsius", &t.to_string());
        assert_unknowns(
            &eval(&strict(), &report),
            &[
                unknown("cooling.maxGpuCelsius", Some(3), &why(t)),
                unknown("cooling.minSlowdownMarginCelsius", Some(3), &why(t)),
            ],
        );
    }
    let cold = healthy().set("status.gpus.3.temperatureCelsius", "-40");
    assert_compliant(&eval(&strict(), &cold));
}

#[test]
fn an_implausible_slowdown_or_memory_temperature_is_unknown() {
    let report = healthy()
        .set("status.gpus.3.slowdownCelsius", "-2147483648")
        .set("status.gpus.6.memoryTemperatureCelsius", "4000");
    let v = eval(&strict(), &report);
    let checks: Vec<(&str, Option<u32>)> = v.unknowns.iter().map(|u| (u.check.as_str(), u.gpu)).collect();
    assert_eq!(
        checks,
        [
            ("cooling.maxMemoryCelsius", Some(6)),
            ("cooling.minSlowdownMarginCelsius", Some(3))
        ]
    );
    assert!(v.drifts.is_empty(), "{:?}", v.drifts);
}

#[test]
fn hbm_hotter_than_max_memory_celsius_is_thermal_drift() {
    let report = healthy().set("status.gpus.6.memoryTemperatureCelsius", "97");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Thermal,
            "cooling.maxMemoryCelsius",
            Some(6),
            None,
            "<= 95 C",
            "97 C",
        )],
    );
}

#[test]
fn a_forbidden_throttle_reason_is_throttle_drift_listing_every_active_reason() {
    let policy = strict().set("spec.cooling.forbiddenThrottleReasons", "[HwThermalSlowdown]");
    let report = healthy().set(
        "status.gpus.3.throttleReasons",
        "[SwThermalSlowdown, HwThermalSlowdown]",
    );
    let v = eval(&policy, &report);
    assert_drifts(
        &v,
        &[drift(
            Throttle,
            "cooling.forbiddenThrottleReasons",
            Some(3),
            None,
            "none of [HwThermalSlowdown]",
            "[HwThermalSlowdown, SwThermalSlowdown]",
        )],
    );
    assert_eq!(
        v.drifts[0].message(),
        "gpu 3: cooling.forbiddenThrottleReasons: expected none of [HwThermalSlowdown], got [HwThermalSlowdown, SwThermalSlowdown]"
    );
}

#[test]
fn throttle_reasons_that_are_not_forbidden_are_compliant() {
    let report = healthy().set(
        "status.gpus.3.throttleReasons",
        "[SwPowerCap, SyncBoost, GpuIdle]",
    );
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn forbidden_throttle_reasons_default_to_the_four_that_cost_performance() {
    let policy = strict().set("spec.cooling", "{}");
    let report = healthy().set("status.gpus.0.throttleReasons", "[HwPowerBrakeSlowdown]");
    assert_drifts(
        &eval(&policy, &report),
        &[drift(
            Throttle,
            "cooling.forbiddenThrottleReasons",
            Some(0),
            None,
            "none of [HwPowerBrakeSlowdown, HwSlowdown, HwThermalSlowdown, SwThermalSlowdown]",
            "[HwPowerBrakeSlowdown]",
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// cooling: chassis

#[test]
fn a_sensor_above_the_limit_of_its_pattern_is_cooling_drift_of_that_sensor() {
    let report = healthy().set("status.cooling.sensors.0.celsius", "38.5");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Cooling,
            "cooling.sensors",
            None,
            Some("ipmi/Inlet Temp"),
            "<= 35 C (sensors matching \"*/Inlet*\")",
            "38.5 C",
        )],
    );
}

#[test]
fn sensor_patterns_are_globs_on_chip_slash_label() {
    // nvme0/Composite and nvme1/Composite both match "nvme*/*".
    let report = healthy()
        .set("status.cooling.sensors.2.celsius", "71")
        .set("status.cooling.sensors.3.celsius", "72.5");
    let v = eval(&strict(), &report);
    let devices: Vec<Option<&str>> = v.drifts.iter().map(|d| d.device.as_deref()).collect();
    assert_eq!(devices, [Some("nvme0/Composite"), Some("nvme1/Composite")]);
    assert!(
        v.drifts
            .iter()
            .all(|d| d.check == "cooling.sensors" && d.class == Cooling)
    );
}

#[test]
fn sensors_matching_no_pattern_are_not_checked() {
    let report = healthy().set("status.cooling.sensors.5.celsius", "105");
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn a_fan_slower_than_min_fan_rpm_is_cooling_drift_of_that_fan() {
    let report = healthy().set("status.cooling.fans.1.rpm", "0");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Cooling,
            "cooling.minFanRpm",
            None,
            Some("nct6775/fan2"),
            ">= 1000 RPM",
            "0 RPM",
        )],
    );
}

#[test]
fn a_node_without_visible_fans_passes_min_fan_rpm() {
    let report = healthy().remove("status.cooling.fans");
    assert_compliant(&eval(&strict(), &report));
}

// ---------------------------------------------------------------------------------------------
// network

#[test]
fn fewer_matching_rdma_devices_than_min_devices_is_network_drift() {
    let report = healthy().remove("status.network.rdmaDevices.7");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.rdma.minDevices",
            None,
            None,
            ">= 8 devices matching \"mlx5_*\"",
            "7 (mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6)",
        )],
    );
}

#[test]
fn min_devices_counts_devices_not_ports() {
    let report = healthy().remove("status.network.rdmaDevices.7").set(
        "status.network.rdmaDevices.7",
        "{device: mlx5_6, port: 2, state: ACTIVE, rateGbps: 400, roceV2Gid: true, mtu: 9000, pfcPriorities: [3], trust: dscp, ecnPriorities: [3]}",
    );
    let v = eval(&strict(), &report);
    assert_eq!(v.drifts.len(), 1);
    assert_eq!(v.drifts[0].check, "network.rdma.minDevices");
}

#[test]
fn devices_not_matching_device_pattern_are_not_checked() {
    // bnxt_re0 in the healthy report is down with MTU 1500 and no PFC: only "*" sees it.
    let policy = strict().set("spec.network.rdma.devicePattern", "'*'");
    let v = eval(&policy, &healthy());
    assert_eq!(v.state, NodeState::Drifted);
    assert!(
        v.drifts.iter().all(|d| d.device.as_deref() == Some("bnxt_re0")),
        "{v:?}"
    );
    let checks: Vec<&str> = v.drifts.iter().map(|d| d.check.as_str()).collect();
    assert_eq!(
        checks,
        [
            "network.minMtu",
            "network.minRateGbps",
            "network.pfcPriorities",
            "network.portState",
            "network.roceV2",
            "network.trust",
        ]
    );
    // ECN is not reported for bnxt_re0, which is unknown rather than drift.
    assert_eq!(
        v.unknowns,
        [unknown(
            "network.ecnPriorities",
            None,
            "bnxt_re0: ECN not reported (no NVIDIA OFED ECN settings)"
        )]
    );
}

#[test]
fn a_port_without_a_roce_v2_gid_is_network_drift() {
    let report = healthy().set("status.network.rdmaDevices.2.roceV2Gid", "false");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.roceV2",
            None,
            Some("mlx5_2"),
            "a RoCE v2 GID",
            "no RoCE v2 GID",
        )],
    );
}

#[test]
fn pfc_on_an_extra_priority_is_network_drift() {
    let report = healthy().set("status.network.rdmaDevices.0.pfcPriorities", "[4, 3]");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.pfcPriorities",
            None,
            Some("mlx5_0"),
            "[3]",
            "[3, 4]",
        )],
    );
}

#[test]
fn pfc_off_on_a_required_priority_is_network_drift() {
    let report = healthy().set("status.network.rdmaDevices.0.pfcPriorities", "[]");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.pfcPriorities",
            None,
            Some("mlx5_0"),
            "[3]",
            "[]",
        )],
    );
}

#[test]
fn the_wrong_trust_mode_is_network_drift() {
    let report = healthy().set("status.network.rdmaDevices.1.trust", "pcp");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.trust",
            None,
            Some("mlx5_1"),
            "dscp",
            "pcp",
        )],
    );
}

#[test]
fn ecn_off_on_a_required_priority_is_network_drift() {
    let report = healthy().set("status.network.rdmaDevices.5.ecnPriorities", "[]");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.ecnPriorities",
            None,
            Some("mlx5_5"),
            "enabled on [3]",
            "enabled on []",
        )],
    );
}

#[test]
fn ecn_on_more_priorities_than_required_is_compliant() {
    let report = healthy().set("status.network.rdmaDevices.5.ecnPriorities", "[3, 6]");
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn an_mtu_below_min_mtu_is_network_drift() {
    let report = healthy().set("status.network.rdmaDevices.3.mtu", "1500");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.minMtu",
            None,
            Some("mlx5_3"),
            ">= 9000",
            "1500",
        )],
    );
}

#[test]
fn a_rate_below_min_rate_gbps_is_network_drift() {
    let report = healthy().set("status.network.rdmaDevices.3.rateGbps", "200");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.minRateGbps",
            None,
            Some("mlx5_3"),
            ">= 400 Gb/s",
            "200 Gb/s",
        )],
    );
}

#[test]
fn a_port_not_in_port_state_is_network_drift() {
    let report = healthy().set("status.network.rdmaDevices.4.state", "DOWN");
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.portState",
            None,
            Some("mlx5_4"),
            "Active",
            "DOWN",
        )],
    );
}

#[test]
fn port_state_defaults_to_active() {
    let policy = strict().remove("spec.network.portState");
    let report = healthy().set("status.network.rdmaDevices.4.state", "INIT");
    assert_eq!(eval(&policy, &report).drifts[0].expected, "Active");
}

#[test]
fn port_states_compare_case_insensitively() {
    // The healthy report already spells ACTIVE and Active; add the sysfs and lowercase forms.
    let report = healthy()
        .set("status.network.rdmaDevices.0.state", "'4: ACTIVE'")
        .set("status.network.rdmaDevices.1.state", "active");
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn a_second_port_of_a_device_is_named_device_slash_port() {
    let report = healthy().set(
        "status.network.rdmaDevices.9",
        "{device: mlx5_0, port: 2, state: DOWN, rateGbps: 400, roceV2Gid: true, mtu: 9000, pfcPriorities: [3], trust: dscp, ecnPriorities: [3]}",
    );
    assert_drifts(
        &eval(&strict(), &report),
        &[drift(
            Network,
            "network.portState",
            None,
            Some("mlx5_0/2"),
            "Active",
            "DOWN",
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// network: fabric error counters

/// The strict policy with error budgets for an NDR fabric.
fn fabric_budgets() -> Doc {
    strict()
        .set(
            "spec.network.infiniband",
            "{maxLinkDownedPerHour: 2, maxSymbolErrorsPerHour: 100}",
        )
        .set("spec.network.maxPauseStormEventsPerHour", "0")
        .set("spec.network.maxDiscardsPerHour", "1000")
}

#[test]
fn ports_without_error_counts_are_not_judged() {
    // The healthy fixture has no errorRates: an older kernel, driver or probe.
    assert_compliant(&eval(&fabric_budgets(), &healthy()));
}

#[test]
fn error_counts_within_the_budgets_are_compliant() {
    let report = healthy().set(
        "status.network.rdmaDevices.3.errorRates",
        "{windowMinutes: 60, linkDowned: 2, symbolErrors: 100, rxDiscards: 1000, pauseStormWarnings: 9, pauseStormErrors: 0}",
    );
    assert_compliant(&eval(&fabric_budgets(), &report));
}

#[test]
fn a_port_over_an_error_budget_is_network_drift_naming_the_counter() {
    let report = healthy()
        .set(
            "status.network.rdmaDevices.3.errorRates",
            "{windowMinutes: 60, linkDowned: 5, symbolErrors: 4}",
        )
        .set(
            "status.network.rdmaDevices.6.errorRates",
            "{windowMinutes: 25, pauseStormErrors: 2, rxDiscards: 40000}",
        );
    assert_drifts(
        &eval(&fabric_budgets(), &report),
        &[
            drift(
                Network,
                "network.infiniband.maxLinkDownedPerHour",
                None,
                Some("mlx5_3"),
                "<= 2 per hour",
                "5 (link_downed on port 1, last 60m)",
            ),
            drift(
                Network,
                "network.maxDiscardsPerHour",
                None,
                Some("mlx5_6"),
                "<= 1000 per hour",
                "40000 (rx_discards_phy on port 1, last 25m)",
            ),
            drift(
                Network,
                "network.maxPauseStormEventsPerHour",
                None,
                Some("mlx5_6"),
                "<= 0 per hour",
                "2 (tx_pause_storm_error_events on port 1, last 25m)",
            ),
        ],
    );
}

#[test]
fn an_error_counter_that_could_not_be_read_is_unknown() {
    let report = healthy()
        .set(
            "status.network.rdmaDevices.1.errorRates",
            "{windowMinutes: 60, symbolErrors: 0}",
        )
        .set(
            "status.network.rdmaDevices.1.errors",
            "[{field: errorRates.linkDowned, reason: 'counters/link_downed: Is a directory'}]",
        );
    assert_unknowns(
        &eval(&fabric_budgets(), &report),
        &[unknown(
            "network.infiniband.maxLinkDownedPerHour",
            None,
            "mlx5_1: counters/link_downed: Is a directory",
        )],
    );
}

// ---------------------------------------------------------------------------------------------
// Unknown: no fresh report

#[test]
fn a_node_without_a_report_is_unknown() {
    let v = evaluate(&strict().policy(), None, now());
    assert_unknowns(&v, &[unknown("report", None, "no GpuNodeReport for this node")]);
    assert_eq!(v.classes().into_iter().collect::<Vec<_>>(), [Stale]);
}

#[test]
fn a_report_without_status_is_unknown() {
    let report = healthy().remove("status");
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown("report", None, "report has no status")],
    );
}

#[test]
fn a_report_without_observed_at_is_unknown() {
    let report = healthy().remove("status.observedAt");
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown("report", None, "report has no observedAt")],
    );
}

#[test]
fn a_report_older_than_stale_after_is_unknown_and_its_drift_is_ignored() {
    // 5m12s old at NOW, and the driver it shows is wrong: old data is not evidence.
    let report = healthy()
        .set("status.observedAt", "'2026-11-29T11:55:18Z'")
        .set("status.driverVersion", "535.183.01");
    let v = eval(&strict(), &report);
    assert_unknowns(
        &v,
        &[unknown("report", None, "report is 5m12s old (staleAfter 3m)")],
    );
    assert_eq!(v.summary(), "unknown: report is 5m12s old (staleAfter 3m)");
}

#[test]
fn a_report_exactly_stale_after_old_is_still_fresh() {
    let report = healthy().set("status.observedAt", "'2026-11-29T11:57:30Z'");
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn stale_after_comes_from_the_policy() {
    let policy = strict().set("spec.staleAfter", "10m");
    let report = healthy().set("status.observedAt", "'2026-11-29T11:55:18Z'");
    assert_compliant(&eval(&policy, &report));
}

#[test]
fn a_report_from_the_future_counts_as_fresh() {
    // The node's clock runs ahead of the operator's.
    let report = healthy().set("status.observedAt", "'2026-11-29T12:02:00Z'");
    assert_compliant(&eval(&strict(), &report));
}

// ---------------------------------------------------------------------------------------------
// Unknown: failed collectors

#[test]
fn a_hung_nvml_collector_is_unknown_and_says_it_hung() {
    let report = healthy().set(
        "status.collectors.0",
        "{name: nvml, ok: false, errorKind: Hung, error: 'an NVML call has not returned for 5.0s (deadline 5.0s)'}",
    );
    let v = eval(&strict(), &report);
    assert_eq!(v.state, NodeState::Unknown);
    assert_eq!(v.drifts, []);
    let reason = "nvml collector hung: an NVML call has not returned for 5.0s (deadline 5.0s)";
    assert!(
        v.unknowns
            .iter()
            .any(|u| u.check == "collectors.nvml" && u.reason == reason),
        "{:?}",
        v.unknowns
    );
    assert!(v.unknowns.iter().all(|u| u.reason == reason), "{:?}", v.unknowns);
    assert!(v.summary().contains("nvml collector hung"), "{}", v.summary());

    // A failure that is not a hang has no such check.
    let failed = healthy().set(
        "status.collectors.0",
        "{name: nvml, ok: false, errorKind: Failed, error: 'NVML: DriverNotLoaded'}",
    );
    let v = eval(&strict(), &failed);
    assert!(!v.unknowns.iter().any(|u| u.check == "collectors.nvml"));
}

#[test]
fn a_failed_nvml_collector_makes_every_gpu_check_unknown_not_drifted() {
    // The GPU data left in the report shows drift, but a failed collector is not evidence.
    let report = healthy()
        .set(
            "status.collectors.0",
            "{name: nvml, ok: false, error: 'NVML: DriverNotLoaded'}",
        )
        .set("status.driverVersion", "535.183.01")
        .set("status.gpus.3.temperatureCelsius", "99");
    let reason = "nvml collector failed: NVML: DriverNotLoaded";
    let checks = [
        "cooling.forbiddenThrottleReasons",
        "cooling.maxGpuCelsius",
        "cooling.maxMemoryCelsius",
        "cooling.minSlowdownMarginCelsius",
        "gpu.allowRowRemapFailure",
        "gpu.count",
        "gpu.cudaVersion",
        "gpu.driverVersion",
        "gpu.eccMode",
        "gpu.fatalXids",
        "gpu.maxRetiredPages",
        "gpu.maxVolatileUncorrectedEcc",
        "gpu.migMode",
        "gpu.minMemoryMiB",
        "gpu.nvlink.minActiveLinks",
        "gpu.pcie.minGeneration",
        "gpu.pcie.minWidth",
        "gpu.persistenceMode",
        "gpu.products",
    ];
    let expected: Vec<Unknown> = checks.iter().map(|c| unknown(c, None, reason)).collect();
    assert_unknowns(&eval(&strict(), &report), &expected);
}

#[test]
fn a_failed_cooling_collector_makes_sensor_and_fan_checks_unknown() {
    let report = healthy().set(
        "status.collectors.1",
        "{name: cooling, ok: false, error: 'read /sys/class/hwmon: permission denied'}",
    );
    let reason = "cooling collector failed: read /sys/class/hwmon: permission denied";
    assert_unknowns(
        &eval(&strict(), &report),
        &[
            unknown("cooling.minFanRpm", None, reason),
            unknown("cooling.sensors", None, reason),
        ],
    );
}

#[test]
fn an_unreadable_sensor_a_pattern_names_is_unknown_and_others_are_not() {
    // The probe names an unreadable sensor `<chip>/<label>`, as policies match sensors.
    let report = healthy().set(
        "status.cooling.errors",
        "[{field: nvme/Composite, reason: 'hwmon1/temp1_input: invalid digit'}, \
          {field: coretemp/Core 0, reason: 'hwmon0/temp2_input: empty'}]",
    );
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown(
            "cooling.sensors",
            None,
            "nvme/Composite: hwmon1/temp1_input: invalid digit",
        )],
    );
}

#[test]
fn a_failed_cooling_collector_leaves_gpu_temperatures_checked() {
    let report = healthy()
        .set("status.collectors.1", "{name: cooling, ok: false, error: boom}")
        .set("status.gpus.6.memoryTemperatureCelsius", "97");
    let v = eval(&strict(), &report);
    assert_eq!(v.state, NodeState::Drifted);
    assert_eq!(v.drifts[0].check, "cooling.maxMemoryCelsius");
    assert_eq!(v.unknowns.len(), 2);
}

#[test]
fn a_failed_network_collector_makes_every_network_check_unknown() {
    let report = healthy().set(
        "status.collectors.2",
        "{name: network, ok: false, error: 'DCB netlink: Operation not supported (-95)'}",
    );
    let reason = "network collector failed: DCB netlink: Operation not supported (-95)";
    let checks = [
        "network.ecnPriorities",
        "network.minMtu",
        "network.minRateGbps",
        "network.pfcPriorities",
        "network.portState",
        "network.rdma.minDevices",
        "network.roceV2",
        "network.trust",
    ];
    let expected: Vec<Unknown> = checks.iter().map(|c| unknown(c, None, reason)).collect();
    assert_unknowns(&eval(&strict(), &report), &expected);
}

#[test]
fn a_failed_collector_without_an_error_still_says_which_failed() {
    let report = healthy().set("status.collectors.2", "{name: network, ok: false}");
    let v = eval(&strict(), &report);
    assert!(
        v.unknowns.iter().all(|u| u.reason == "network collector failed"),
        "{v:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Unknown: missing fields

#[test]
fn a_field_the_policy_checks_but_the_report_lacks_is_unknown() {
    let report = healthy().remove("status.gpus.2.memoryTemperatureCelsius");
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown("cooling.maxMemoryCelsius", Some(2), "not reported")],
    );
}

#[test]
fn a_missing_field_takes_the_reason_of_the_gpu_error_naming_it() {
    let report = healthy().remove("status.gpus.2.remappedRows").set(
        "status.gpus.2.errors",
        "[{field: remappedRows, reason: 'NVML: Unknown'}]",
    );
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown("gpu.allowRowRemapFailure", Some(2), "NVML: Unknown")],
    );
}

#[test]
fn retired_pages_not_supported_on_ampere_and_later_is_not_applicable() {
    // H100s retire no pages (row remapping replaced page retirement): NVML says NotSupported.
    let report = healthy().remove("status.gpus.2.retiredPages").set(
        "status.gpus.2.errors",
        "[{field: retiredPages, reason: 'NVML: NotSupported'}]",
    );
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn remapped_rows_not_supported_before_ampere_is_not_applicable() {
    let report = healthy().remove("status.gpus.2.remappedRows").set(
        "status.gpus.2.errors",
        "[{field: remappedRows, reason: 'NVML: NotSupported'}]",
    );
    assert_compliant(&eval(&strict(), &report));
}

#[test]
fn a_gpu_the_probe_could_not_open_makes_each_of_its_checks_unknown_with_that_reason() {
    let report = healthy().set(
        "status.gpus.7",
        "{index: 7, errors: [{field: device, reason: 'NVML: GpuIsLost'}]}",
    );
    let v = eval(&strict(), &report);
    assert_eq!(v.state, NodeState::Unknown);
    assert_eq!(v.drifts, []);
    // Every per-GPU check of the strict policy: 12 gpu.* and 4 cooling.* ones, throttle
    // reasons and XIDs included although their lists are merely empty.
    assert_eq!(v.unknowns.len(), 16, "{:#?}", v.unknowns);
    assert!(
        v.unknowns
            .iter()
            .all(|u| u.gpu == Some(7) && u.reason == "NVML: GpuIsLost")
    );
    assert!(
        v.unknowns
            .iter()
            .any(|u| u.check == "cooling.forbiddenThrottleReasons")
    );
    assert!(v.unknowns.iter().any(|u| u.check == "gpu.fatalXids"));
}

#[test]
fn an_rdma_device_whose_ports_could_not_be_read_is_unknown_with_that_reason() {
    let report = healthy().set(
        "status.network.rdmaDevices.7",
        "{device: mlx5_7, port: 0, errors: [{field: ports, reason: 'read ports: Permission denied'}]}",
    );
    let v = eval(&strict(), &report);
    assert_eq!(v.state, NodeState::Unknown);
    // roceV2, pfcPriorities, trust, ecnPriorities, minMtu, minRateGbps, portState.
    assert_eq!(v.unknowns.len(), 7, "{:#?}", v.unknowns);
    assert!(
        v.unknowns
            .iter()
            .all(|u| u.reason == "mlx5_7: read ports: Permission denied")
    );
}

#[test]
fn a_missing_node_field_is_unknown_for_the_node() {
    let report = healthy().remove("status.gpuCount").remove("status.cudaVersion");
    assert_unknowns(
        &eval(&strict(), &report),
        &[
            unknown("gpu.count", None, "not reported"),
            unknown("gpu.cudaVersion", None, "not reported"),
        ],
    );
}

#[test]
fn an_unparsable_driver_version_is_unknown() {
    let report = healthy().set("status.driverVersion", "550.x");
    let v = eval(&strict(), &report);
    assert_eq!(v.state, NodeState::Unknown);
    assert_eq!(v.drifts, []);
    assert_eq!(v.unknowns.len(), 1);
    assert_eq!(v.unknowns[0].check, "gpu.driverVersion");
    assert!(
        v.unknowns[0]
            .reason
            .starts_with("cannot parse the driver version")
            && v.unknowns[0].reason.contains("550.x"),
        "{:?}",
        v.unknowns[0].reason
    );
}

#[test]
fn ecn_the_probe_could_not_read_is_unknown_not_drift() {
    let report = healthy().remove("status.network.rdmaDevices.0.ecnPriorities");
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown(
            "network.ecnPriorities",
            None,
            "mlx5_0: ECN not reported (no NVIDIA OFED ECN settings)",
        )],
    );
}

#[test]
fn an_ecn_read_error_gives_its_reason() {
    let report = healthy()
        .remove("status.network.rdmaDevices.0.ecnPriorities")
        .set(
            "status.network.rdmaDevices.0.errors",
            "[{field: ecnPriorities, reason: 'read ecn/roce_np/enable/3: Input/output error'}]",
        );
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown(
            "network.ecnPriorities",
            None,
            "mlx5_0: read ecn/roce_np/enable/3: Input/output error",
        )],
    );
}

#[test]
fn an_unknown_trust_mode_is_unknown_not_drift() {
    let report = healthy().set("status.network.rdmaDevices.6.trust", "unknown");
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown(
            "network.trust",
            None,
            "mlx5_6: trust mode could not be read",
        )],
    );
}

#[test]
fn a_missing_network_section_makes_network_checks_unknown() {
    let report = healthy().remove("status.network");
    let v = eval(&strict(), &report);
    assert_eq!(v.state, NodeState::Unknown);
    assert_eq!(v.unknowns.len(), 8);
    assert!(
        v.unknowns
            .iter()
            .all(|u| u.check.starts_with("network.") && u.reason == "not reported")
    );
}

#[test]
fn a_missing_cooling_section_makes_sensor_and_fan_checks_unknown() {
    let report = healthy().remove("status.cooling");
    assert_unknowns(
        &eval(&strict(), &report),
        &[
            unknown("cooling.minFanRpm", None, "not reported"),
            unknown("cooling.sensors", None, "not reported"),
        ],
    );
}

#[test]
fn an_unreadable_sensor_matching_a_pattern_is_unknown() {
    let report = healthy().set(
        "status.cooling.errors",
        "[{field: nvme2/Composite, reason: 'read temp1_input: No such device'}]",
    );
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown(
            "cooling.sensors",
            None,
            "nvme2/Composite: read temp1_input: No such device",
        )],
    );
}

#[test]
fn an_unreadable_fan_is_unknown() {
    let report = healthy().set(
        "status.cooling.errors",
        "[{field: nct6775/fan4, reason: 'read fan4_input: Invalid argument'}]",
    );
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown(
            "cooling.minFanRpm",
            None,
            "nct6775/fan4: read fan4_input: Invalid argument",
        )],
    );
}

#[test]
fn throttle_reasons_the_probe_could_not_read_are_unknown() {
    let report = healthy().set(
        "status.gpus.1.errors",
        "[{field: throttleReasons, reason: 'NVML: Unknown'}]",
    );
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown(
            "cooling.forbiddenThrottleReasons",
            Some(1),
            "NVML: Unknown",
        )],
    );
}

#[test]
fn xids_the_probe_could_not_listen_for_are_unknown() {
    let report = healthy().set(
        "status.gpus.1.errors",
        "[{field: xids, reason: 'NVML: event registration NotSupported'}]",
    );
    assert_unknowns(
        &eval(&strict(), &report),
        &[unknown(
            "gpu.fatalXids",
            Some(1),
            "NVML: event registration NotSupported",
        )],
    );
}

#[test]
fn gpus_the_report_does_not_list_make_per_gpu_checks_unknown() {
    let policy = strict()
        .set(
            "spec.gpu",
            "{eccMode: Enabled, allowRowRemapFailure: true, fatalXids: []}",
        )
        .remove("spec.cooling")
        .remove("spec.network");
    let report = healthy().remove("status.gpus.7");
    assert_unknowns(
        &eval(&policy, &report),
        &[unknown(
            "gpu.eccMode",
            None,
            "report lists 7 of the 8 GPUs NVML sees",
        )],
    );
    let report = healthy().remove("status.gpuCount").set("status.gpus", "[]");
    assert_unknowns(
        &eval(&policy, &report),
        &[unknown("gpu.eccMode", None, "no GPUs reported")],
    );
}

// ---------------------------------------------------------------------------------------------
// Sections and combinations

#[test]
fn a_network_only_policy_ignores_gpu_and_cooling_problems() {
    let policy = Doc::load("network-only-policy.yaml");
    let report = healthy()
        .set("status.collectors.0.ok", "false")
        .set("status.driverVersion", "535.183.01")
        .set("status.gpus.3.temperatureCelsius", "99")
        .set("status.gpus.3.throttleReasons", "[HwThermalSlowdown]")
        .remove("status.cooling");
    assert_compliant(&eval(&policy, &report));
}

#[test]
fn drift_and_unknown_together_make_the_node_drifted() {
    let v = eval(&strict(), &Doc::load("broken-h100-report.yaml"));
    assert_eq!(v.state, NodeState::Drifted);
    let expected: Verdict = serde_yaml::from_str(
        &std::fs::read_to_string(fixtures_dir().join("broken-h100-verdict.yaml"))
            .unwrap_or_else(|e| panic!("broken-h100-verdict.yaml: {e}")),
    )
    .unwrap_or_else(|e| panic!("broken-h100-verdict.yaml: {e}"));
    assert_eq!(v, expected, "{}", serde_yaml::to_string(&v).unwrap_or_default());
    assert_eq!(
        v.classes().into_iter().collect::<Vec<_>>(),
        [Inventory, Driver, Memory, Xid, Network, Stale]
    );
}

#[test]
fn the_summary_names_the_classes_the_first_drift_and_what_else_there_is() {
    let v = eval(&strict(), &Doc::load("broken-h100-report.yaml"));
    assert_eq!(
        v.summary(),
        "drifted (Inventory, Driver, Memory, Xid, Network): gpu 3: gpu.allowRowRemapFailure: expected no failed or pending row remap, got row remap failed (2 correctable, 1 uncorrectable rows remapped); 5 more drifts, 2 checks unknown"
    );
}

#[test]
fn findings_are_sorted_by_check_then_gpu_then_device_whatever_the_report_order() {
    let report = healthy()
        .set("status.gpus.6.temperatureCelsius", "86")
        .set("status.gpus.1.temperatureCelsius", "86")
        .set("status.network.rdmaDevices.5.mtu", "1500")
        .set("status.network.rdmaDevices.2.mtu", "1500")
        .set("status.gpus.0.eccMode", "Disabled");
    let v = eval(&strict(), &report);
    let order: Vec<(&str, Option<u32>, Option<&str>)> = v
        .drifts
        .iter()
        .map(|d| (d.check.as_str(), d.gpu, d.device.as_deref()))
        .collect();
    assert_eq!(
        order,
        [
            ("cooling.maxGpuCelsius", Some(1), None),
            ("cooling.maxGpuCelsius", Some(6), None),
            ("cooling.minSlowdownMarginCelsius", Some(1), None),
            ("cooling.minSlowdownMarginCelsius", Some(6), None),
            ("gpu.eccMode", Some(0), None),
            ("network.minMtu", None, Some("mlx5_2")),
            ("network.minMtu", None, Some("mlx5_5")),
        ]
    );

    // Reversing every list of the report changes nothing.
    let mut reversed = report.clone();
    for list in ["gpus", "collectors"] {
        if let Some(Value::Sequence(s)) = reversed.0.get_mut("status").and_then(|s| s.get_mut(list)) {
            s.reverse();
        }
    }
    if let Some(Value::Sequence(s)) = reversed
        .0
        .get_mut("status")
        .and_then(|s| s.get_mut("network"))
        .and_then(|n| n.get_mut("rdmaDevices"))
    {
        s.reverse();
    }
    assert_eq!(eval(&strict(), &reversed), v);
    assert_eq!(eval(&strict(), &report), v);
}

// ---------------------------------------------------------------------------------------------
// Robustness: arbitrary reports and policies

mod arbitrary {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Seg {
        Key(String),
        Idx(usize),
    }

    /// Every path in a document, containers included.
    fn paths(v: &Value, prefix: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
        match v {
            Value::Mapping(m) => {
                for (k, child) in m {
                    if let Some(k) = k.as_str() {
                        prefix.push(Seg::Key(k.to_string()));
                        out.push(prefix.clone());
                        paths(child, prefix, out);
                        prefix.pop();
                    }
                }
            }
            Value::Sequence(s) => {
                for (i, child) in s.iter().enumerate() {
                    prefix.push(Seg::Idx(i));
                    out.push(prefix.clone());
                    paths(child, prefix, out);
                    prefix.pop();
                }
            }
            _ => {}
        }
    }

    fn at_mut<'a>(v: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
        path.iter().try_fold(v, |v, seg| match seg {
            Seg::Key(k) => v.get_mut(k.as_str()),
            Seg::Idx(i) => v.get_mut(*i),
        })
    }

    #[derive(Clone, Debug)]
    enum Mutation {
        Remove,
        Number(i64),
        Float(f64),
        Text(String),
        Bool(bool),
        Null,
        EmptyList,
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        let words = prop::sample::select(vec![
            "Enabled",
            "Disabled",
            "dscp",
            "pcp",
            "unknown",
            "ACTIVE",
            "Active",
            "DOWN",
            "4: ACTIVE",
            "",
            "550.x",
            "12.4",
            "99999999999.1",
            "1.2.3.4.5",
            "HwSlowdown",
            "GpuIdle",
            "SwThermalSlowdown",
            "nvml",
            "cooling",
            "network",
            "*",
            "mlx5_*",
            "é?*",
            "1h",
            "0s",
            "2026-11-29T11:59:00Z",
            "1970-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
            "xids",
            "remappedRows",
            "ecnPriorities",
            "fans",
            "sensors",
        ]);
        prop_oneof![
            3 => Just(Mutation::Remove),
            3 => prop_oneof![any::<i64>(), -5i64..200, Just(i64::from(u32::MAX)), Just(i64::MAX)]
                .prop_map(Mutation::Number),
            1 => prop_oneof![any::<f64>(), Just(f64::NAN), Just(f64::INFINITY), -100.0..200.0f64]
                .prop_map(Mutation::Float),
            3 => prop_oneof![words.prop_map(str::to_string), ".{0,10}"].prop_map(Mutation::Text),
            1 => any::<bool>().prop_map(Mutation::Bool),
            1 => Just(Mutation::Null),
            1 => Just(Mutation::EmptyList),
        ]
    }

    /// Applies `m` at `path`. Scalars are replaced by a value of the kind the mutation carries
    /// (only where the kind fits, so most edits keep the document valid); lists can be emptied;
    /// anything can be removed.
    fn apply(doc: &mut Value, path: &[Seg], m: &Mutation) {
        let Some((last, parent_path)) = path.split_last() else {
            return;
        };
        if let Mutation::Remove = m {
            match (at_mut(doc, parent_path), last) {
                (Some(Value::Mapping(map)), Seg::Key(k)) => {
                    map.remove(k.as_str());
                }
                (Some(Value::Sequence(s)), Seg::Idx(i)) if *i < s.len() => {
                    s.remove(*i);
                }
                _ => {}
            }
            return;
        }
        let Some(slot) = at_mut(doc, path) else {
            return;
        };
        let new = match (&*slot, m) {
            (Value::Number(n), Mutation::Number(x)) if !n.is_f64() => Value::from(*x),
            (Value::Number(n), Mutation::Float(x)) if n.is_f64() => Value::from(*x),
            (Value::String(_), Mutation::Text(t)) => Value::String(t.clone()),
            (Value::Bool(_), Mutation::Bool(b)) => Value::Bool(*b),
            (Value::Sequence(_), Mutation::EmptyList) => Value::Sequence(Vec::new()),
            (_, Mutation::Null) => Value::Null,
            _ => return,
        };
        *slot = new;
    }

    /// `base` with the `edits` that keep it a valid `T`, applied in order at paths chosen by
    /// index among the document's current paths.
    fn mutated<T: serde::de::DeserializeOwned>(base: &Doc, edits: &[(prop::sample::Index, Mutation)]) -> T {
        let mut doc = base.0.clone();
        for (index, m) in edits {
            let mut all = Vec::new();
            paths(&doc, &mut Vec::new(), &mut all);
            if all.is_empty() {
                break;
            }
            let mut next = doc.clone();
            apply(&mut next, &all[index.index(all.len())], m);
            if serde_yaml::from_value::<T>(next.clone()).is_ok() {
                doc = next;
            }
        }
        serde_yaml::from_value(doc).unwrap_or_else(|e| panic!("kept only valid edits: {e}"))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

        /// Whatever the probe writes and whatever the policy says, evaluate returns a consistent
        /// verdict, the same one every time, and never panics.
        #[test]
        fn evaluate_never_panics_and_stays_consistent(
            report_edits in prop::collection::vec((any::<prop::sample::Index>(), mutation()), 0..32),
            policy_edits in prop::collection::vec((any::<prop::sample::Index>(), mutation()), 0..8),
            offset in prop_oneof![4 => -400i64..400, 1 => any::<i32>().prop_map(i64::from)],
        ) {
            let report: GpuNodeReport = mutated(&healthy(), &report_edits);
            let policy: GpuNodePolicy = mutated(&strict(), &policy_edits);
            let now = now()
                .checked_add(jiff::SignedDuration::from_secs(offset))
                .unwrap_or_else(|_| now());

            let v = evaluate(&policy.spec, Some(&report), now);
            prop_assert_eq!(&evaluate(&policy.spec, Some(&report), now), &v);
            let state = if !v.drifts.is_empty() {
                NodeState::Drifted
            } else if !v.unknowns.is_empty() {
                NodeState::Unknown
            } else {
                NodeState::Compliant
            };
            prop_assert_eq!(v.state, state);
            prop_assert!(v.drifts.iter().all(|d| d.class != DriftClass::Stale));
            if v.unknowns.iter().any(|u| u.check == "report") {
                prop_assert!(v.drifts.is_empty() && v.unknowns.len() == 1);
            }
            let mut sorted = v.drifts.clone();
            sorted.sort_by(|a, b| (&a.check, a.gpu, &a.device).cmp(&(&b.check, b.gpu, &b.device)));
            prop_assert_eq!(&sorted, &v.drifts);
            prop_assert!(!v.summary().is_empty());
        }
    }
}
