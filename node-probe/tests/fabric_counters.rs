//! Fabric error counters from the committed fixture trees: InfiniBand NDR HCAs (healthy, one
//! port down-trained to 200 Gb/s, one flapping) and RoCE NICs in a pause storm, through the
//! collector, its counter history across a probe restart, and the operator's checks.
//!
//! Each failure tree is its healthy tree some time later: a probe reads the healthy tree, a
//! restarted probe (same state directory, same boot) reads the failure tree, and the counters'
//! increase is what the failure added.

// clippy.toml allows unwrap and expect in #[test] fns only; the helper fns fail the test the
// same way (a panic naming what broke).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::sysfs_tree;
use gpunode_checks::evaluate::evaluate;
use gpunode_checks::verdict::{NodeState, Verdict};
use gpunode_crds::GpuNodePolicySpec;
use gpunode_crds::policy::{NetworkRequirements, PortErrorBudgets};
use gpunode_crds::report::{GpuNodeReportStatus, NetworkStatus, PortErrorRates, RdmaDevice};
use gpunode_probe::boot_state::BootFile;
use gpunode_probe::change::{ChangeConfig, KnownPolicy, decide};
use gpunode_probe::network::NetworkCollector;
use gpunode_probe::network::counters::{ErrorCounter, RawCounters};
use gpunode_probe::network::history::History;
use gpunode_probe::network::history_store::{self, HistoryStore};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const T0: i64 = 1_800_000_000;

/// A state directory and the proc roots of two boots.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        Node {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn proc_root(&self, boot: &str) -> PathBuf {
        let root = self.dir.path().join(format!("proc-{boot}"));
        let random = root.join("sys/kernel/random");
        std::fs::create_dir_all(&random).unwrap();
        std::fs::write(random.join("boot_id"), format!("{boot}\n")).unwrap();
        root
    }

    /// A probe (a new process: a fresh history loaded from the state directory) reading `tree`
    /// at `now` during `boot`.
    fn probe(&self, tree: &str, boot: &str, now: i64) -> NetworkStatus {
        let state = self.dir.path().join("state");
        let file = BootFile::open(
            &state,
            history_store::FILE_NAME,
            history_store::FORMAT,
            history_store::MAX_FILE_BYTES,
            "n1",
            &self.proc_root(boot),
        )
        .unwrap();
        collector(tree)
            .with_history(HistoryStore::persistent(file))
            .with_clock(move || now)
            .read()
            .unwrap()
    }
}

fn collector(tree: &str) -> NetworkCollector {
    let root = sysfs_tree(tree);
    NetworkCollector::with_fixtures(root.join("sys"), &root)
}

fn port<'a>(n: &'a NetworkStatus, device: &str) -> &'a RdmaDevice {
    n.rdma_devices
        .iter()
        .find(|d| d.device == device)
        .unwrap_or_else(|| panic!("no {device}"))
}

fn rates<'a>(n: &'a NetworkStatus, device: &str) -> &'a PortErrorRates {
    port(n, device)
        .error_rates
        .as_ref()
        .unwrap_or_else(|| panic!("{device}: no errorRates"))
}

/// Budgets for an NDR fabric, with the lossless and link settings the trees are healthy for.
fn fabric_policy() -> GpuNodePolicySpec {
    GpuNodePolicySpec {
        network: Some(NetworkRequirements {
            min_rate_gbps: Some(400),
            infiniband: Some(PortErrorBudgets {
                max_link_downed_per_hour: Some(2),
                max_symbol_errors_per_hour: Some(100),
                max_link_error_recovery_per_hour: Some(5),
                max_rcv_errors_per_hour: Some(1000),
                max_xmit_discards_per_hour: Some(1000),
                max_buffer_overruns_per_hour: Some(10),
                max_link_integrity_errors_per_hour: Some(10),
            }),
            max_pause_storm_events_per_hour: Some(0),
            max_discards_per_hour: Some(1000),
            ..NetworkRequirements::default()
        }),
        ..GpuNodePolicySpec::default()
    }
}

fn status(network: NetworkStatus, now: i64) -> GpuNodeReportStatus {
    GpuNodeReportStatus {
        observed_at: Some(Time(jiff::Timestamp::from_second(now).unwrap())),
        network: Some(network),
        ..GpuNodeReportStatus::default()
    }
}

fn verdict(network: NetworkStatus, now: i64) -> Verdict {
    let report = gpunode_probe::app::report_object("n1", status(network, now));
    evaluate(
        &fabric_policy(),
        Some(&report),
        jiff::Timestamp::from_second(now).unwrap(),
    )
}

fn messages(v: &Verdict) -> Vec<String> {
    v.drifts.iter().map(|d| d.message()).collect()
}

#[test]
fn ndr_hcas_report_their_counters_and_are_compliant() {
    let n = collector("ib-ndr-healthy").with_clock(|| T0).read().unwrap();
    assert_eq!(n.rdma_devices.len(), 8);
    for d in &n.rdma_devices {
        assert_eq!(
            (d.rate_gbps, d.netdev.as_deref()),
            (Some(400), None),
            "{}",
            d.device
        );
        assert!(d.errors.is_empty(), "{}: {:?}", d.device, d.errors);
        // The first observation: what the counters held before the probe started is not counted.
        let r = rates(&n, &d.device);
        assert_eq!(
            (r.link_downed, r.symbol_errors, r.window_minutes),
            (Some(0), Some(0), 0)
        );
        // InfiniBand HCAs have no RoCE NIC statistics; out_of_buffer comes from hw_counters.
        assert_eq!((r.pause_storm_errors, r.out_of_buffer), (None, Some(0)));
    }
    assert_eq!(verdict(n, T0).state, NodeState::Compliant);
}

#[test]
fn a_port_down_trained_to_200_drifts_on_its_rate_not_its_counters() {
    let node = Node::new();
    node.probe("ib-ndr-healthy", "boot-a", T0);
    let n = node.probe("ib-ndr-downtrained", "boot-a", T0 + 600);
    assert_eq!(port(&n, "mlx5_4").rate_gbps, Some(200));
    assert_eq!(
        messages(&verdict(n, T0 + 600)),
        vec!["mlx5_4: network.minRateGbps: expected >= 400 Gb/s, got 200 Gb/s"]
    );
}

#[test]
fn a_flapping_port_drifts_after_a_probe_restart_on_the_same_boot() {
    let node = Node::new();
    node.probe("ib-ndr-healthy", "boot-a", T0);
    // A restarted probe still counts from the first one's samples.
    let n = node.probe("ib-ndr-flapping", "boot-a", T0 + 600);
    let r = rates(&n, "mlx5_3");
    assert_eq!(
        (
            r.link_downed,
            r.link_error_recovery,
            r.symbol_errors,
            r.window_minutes
        ),
        (Some(6), Some(4), Some(1497), 10)
    );
    assert_eq!(rates(&n, "mlx5_2").link_downed, Some(0));
    assert_eq!(
        messages(&verdict(n, T0 + 600)),
        vec![
            "mlx5_3: network.infiniband.maxLinkDownedPerHour: expected <= 2 per hour, got 6 (link_downed on port 1, last 10m)",
            "mlx5_3: network.infiniband.maxSymbolErrorsPerHour: expected <= 100 per hour, got 1497 (symbol_error on port 1, last 10m)",
        ]
    );
}

#[test]
fn a_new_boot_forgets_the_counter_history() {
    let node = Node::new();
    node.probe("ib-ndr-healthy", "boot-a", T0);
    let n = node.probe("ib-ndr-flapping", "boot-b", T0 + 600);
    assert_eq!(rates(&n, "mlx5_3").link_downed, Some(0));
    assert_eq!(verdict(n, T0 + 600).state, NodeState::Compliant);
}

#[test]
fn a_counter_reset_restarts_the_count() {
    let node = Node::new();
    node.probe("ib-ndr-flapping", "boot-a", T0);
    // The counters went back to the healthy tree's lower values: cleared, not negative.
    let n = node.probe("ib-ndr-healthy", "boot-a", T0 + 600);
    let r = rates(&n, "mlx5_3");
    assert_eq!(
        (r.link_downed, r.symbol_errors, r.window_minutes),
        (Some(0), Some(0), 0)
    );
    assert_eq!(verdict(n, T0 + 600).state, NodeState::Compliant);
}

#[test]
fn roce_nics_in_a_pause_storm_drift_naming_the_watchdog_and_discards() {
    let node = Node::new();
    node.probe("lossless-8port", "boot-a", T0);
    let n = node.probe("roce-pause-storm", "boot-a", T0 + 900);
    let r = rates(&n, "mlx5_2");
    assert_eq!(
        (
            r.pause_storm_errors,
            r.pause_storm_warnings,
            r.rx_discards,
            r.out_of_buffer
        ),
        (Some(3), Some(14), Some(250_000), Some(89_988))
    );
    assert_eq!(
        messages(&verdict(n, T0 + 900)),
        vec![
            "mlx5_2: network.maxDiscardsPerHour: expected <= 1000 per hour, got 250000 (rx_discards_phy on port 1, last 15m)",
            "mlx5_2: network.maxDiscardsPerHour: expected <= 1000 per hour, got 89988 (out_of_buffer on port 1, last 15m)",
            "mlx5_2: network.maxPauseStormEventsPerHour: expected <= 0 per hour, got 3 (tx_pause_storm_error_events on port 1, last 15m)",
        ]
    );
}

#[test]
fn unreadable_counters_are_field_errors_and_unknown_not_drift() {
    let n = collector("bad-input").with_clock(|| T0).read().unwrap();
    let d = port(&n, "mlx5_0");
    let fields: Vec<&str> = d
        .errors
        .iter()
        .map(|e| e.field.as_str())
        .filter(|f| f.starts_with("errorRates"))
        .collect();
    assert_eq!(fields, vec!["errorRates.linkDowned", "errorRates.symbolErrors"]);
    let v = verdict(n, T0);
    assert!(
        v.drifts
            .iter()
            .all(|d| !d.check.starts_with("network.infiniband")),
        "{v:?}"
    );
    let unknown: Vec<&str> = v.unknowns.iter().map(|u| u.check.as_str()).collect();
    assert!(
        unknown.contains(&"network.infiniband.maxLinkDownedPerHour"),
        "{unknown:?}"
    );
    assert!(
        unknown.contains(&"network.infiniband.maxSymbolErrorsPerHour"),
        "{unknown:?}"
    );
}

/// Counters of a healthy port, `secs` after the probe started: a few symbol errors, receive
/// errors, transmit discards and out-of-buffer drops, as busy real links count them.
fn healthy_counters(secs: i64) -> RawCounters {
    let every = |period: i64| u64::try_from(secs / period).unwrap_or(0);
    RawCounters::from([
        (ErrorCounter::LinkDowned, 1),
        (ErrorCounter::SymbolErrors, 3 + every(360)),
        (ErrorCounter::LinkErrorRecovery, 0),
        (ErrorCounter::RcvErrors, every(1200)),
        (ErrorCounter::XmitDiscards, 40 + every(10)),
        (ErrorCounter::OutOfBuffer, 12 + every(30)),
        (ErrorCounter::PauseStormWarnings, 0),
        (ErrorCounter::PauseStormErrors, 0),
    ])
}

/// Publishes (as the probe's publish loop decides) three hours of 10-second observations of a
/// node whose counters move at healthy rates; returns the writes per hour and the worst verdict.
fn writes_per_hour(policies: Option<&[KnownPolicy]>) -> (Vec<usize>, NodeState) {
    let base = collector("lossless-8port").read().unwrap();
    let mut history = History::default();
    let mut observe = |secs: i64| {
        let mut network = base.clone();
        for d in &mut network.rdma_devices {
            let key = format!("{}/{}", d.device, d.port);
            d.error_rates = history.observe(&key, &healthy_counters(secs), T0 + secs).rates;
        }
        network
    };
    let mut published = status(observe(0), T0);
    let mut writes = vec![0; 3];
    let mut worst = NodeState::Compliant;
    for step in 1..(3 * 360) {
        let secs = step * 10;
        let now = T0 + secs;
        let network = observe(secs);
        if verdict(network.clone(), now).state != NodeState::Compliant {
            worst = NodeState::Drifted;
        }
        let next = status(network, now);
        let at = jiff::Timestamp::from_second(now).unwrap();
        if !decide(&published, &next, policies, &ChangeConfig::default(), at).is_empty() {
            writes[usize::try_from(secs / 3600).unwrap()] += 1;
            published = next;
        }
    }
    (writes, worst)
}

#[test]
fn healthy_counters_moving_at_normal_rates_never_drift_nor_flood_writes() {
    let policies = [KnownPolicy {
        name: "fabric".into(),
        spec: fabric_policy(),
    }];
    // With the policies known, only a verdict change writes: none.
    assert_eq!(
        writes_per_hour(Some(&policies)),
        (vec![0, 0, 0], NodeState::Compliant)
    );
    // Without them, a count reaching another order of magnitude writes; once the window is
    // full the counts hold steady and nothing writes.
    let (writes, _) = writes_per_hour(None);
    assert!(writes[0] <= 12, "{writes:?}");
    assert_eq!(writes[2], 0, "{writes:?}");
}
