//! The cooling and network collectors against the committed fixture trees.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::sysfs_tree;
use gpunode_crds::ObservedTrust;
use gpunode_crds::report::{CoolingStatus, NetworkStatus, PauseCounters, RdmaDevice};
use gpunode_probe::cooling::CoolingCollector;
use gpunode_probe::network::NetworkCollector;

fn network(tree: &str) -> NetworkStatus {
    let root = sysfs_tree(tree);
    NetworkCollector::with_fixtures(root.join("sys"), &root)
        .read()
        .unwrap_or_else(|e| panic!("{tree}: {e}"))
}

fn cooling(tree: &str) -> CoolingStatus {
    CoolingCollector::new(sysfs_tree(tree).join("sys"))
        .read()
        .unwrap_or_else(|e| panic!("{tree}: {e}"))
}

fn port<'a>(n: &'a NetworkStatus, device: &str) -> &'a RdmaDevice {
    n.rdma_devices
        .iter()
        .find(|d| d.device == device)
        .unwrap_or_else(|| panic!("no {device}"))
}

fn fields(d: &RdmaDevice) -> Vec<&str> {
    d.errors.iter().map(|e| e.field.as_str()).collect()
}

#[test]
fn lossless_node_reports_every_port_healthy() {
    let n = network("lossless-8port");
    assert_eq!(n.rdma_devices.len(), 8);
    for (i, d) in n.rdma_devices.iter().enumerate() {
        assert_eq!(d.device, format!("mlx5_{i}"));
        assert_eq!(d.port, 1);
        assert_eq!(d.netdev, Some(format!("ens{}f0np0", i + 1)));
        assert_eq!(d.state.as_deref(), Some("Active"));
        assert_eq!(d.physical_state.as_deref(), Some("LinkUp"));
        assert_eq!(d.rate_gbps, Some(400));
        assert_eq!(d.roce_v2_gid, Some(true));
        assert_eq!(d.mtu, Some(9000));
        assert_eq!(d.pfc_priorities, Some(vec![3]));
        assert_eq!(d.trust, Some(ObservedTrust::Dscp));
        assert_eq!(d.ecn_priorities, Some(vec![3]));
        assert_eq!(
            d.pfc_pause,
            vec![PauseCounters {
                priority: 3,
                rx: 120,
                tx: 5
            }]
        );
        assert!(d.errors.is_empty(), "{}: {:?}", d.device, d.errors);
    }
}

#[test]
fn misconfigured_ports_are_reported_as_observed() {
    let n = network("pfc-wrong-priority");
    assert_eq!(port(&n, "mlx5_3").pfc_priorities, Some(vec![4]));
    assert_eq!(port(&n, "mlx5_2").pfc_priorities, Some(vec![3]));

    let n = network("trust-pcp");
    assert!(n.rdma_devices.iter().all(|d| d.trust == Some(ObservedTrust::Pcp)));

    let n = network("mtu-1500");
    assert!(n.rdma_devices.iter().all(|d| d.mtu == Some(1500)));

    let n = network("no-rocev2-gid");
    let d = port(&n, "mlx5_5");
    assert_eq!(d.roce_v2_gid, Some(false));
    assert!(
        d.errors.is_empty(),
        "an unreadable GID index is an empty one: {:?}",
        d.errors
    );
    assert_eq!(port(&n, "mlx5_4").roce_v2_gid, Some(true));

    let n = network("one-port-down");
    let d = port(&n, "mlx5_6");
    assert_eq!(
        (d.state.as_deref(), d.physical_state.as_deref()),
        (Some("Down"), Some("Disabled"))
    );
    assert_eq!(port(&n, "mlx5_5").state.as_deref(), Some("Active"));
}

#[test]
fn inbox_driver_leaves_ecn_unknown_and_derives_trust_from_the_app_table() {
    let n = network("ofed-ecn-absent");
    for d in &n.rdma_devices {
        assert_eq!(d.ecn_priorities, None, "ECN must be unknown, not empty");
        assert_eq!(d.trust, Some(ObservedTrust::Dscp));
        assert!(d.errors.is_empty(), "{:?}", d.errors);
    }
}

#[test]
fn a_bond_is_the_netdev_and_its_slave_carries_dcb() {
    let n = network("bonded-netdev");
    let d = port(&n, "mlx5_bond_0");
    assert_eq!(d.netdev.as_deref(), Some("bond0"));
    assert_eq!(d.mtu, Some(9000));
    assert_eq!(d.pfc_priorities, Some(vec![3]));
    assert_eq!(d.trust, Some(ObservedTrust::Dscp));
    assert!(d.errors.is_empty(), "{:?}", d.errors);
    assert_eq!(port(&n, "mlx5_2").netdev.as_deref(), Some("ens3f0np0"));
}

#[test]
fn cooling_reads_hwmon_and_thermal_zones() {
    let c = cooling("lossless-8port");
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let find = |chip: &str, label: &str| {
        c.sensors
            .iter()
            .find(|s| s.chip == chip && s.label == label)
            .map(|s| (s.celsius, s.crit_celsius))
    };
    assert_eq!(find("coretemp", "Package id 0"), Some((54.0, Some(96.0))));
    assert_eq!(find("coretemp", "Core 0"), Some((50.0, None)));
    assert_eq!(find("nvme", "Composite"), Some((38.85, Some(84.85))));
    assert_eq!(find("nct6798", "Inlet"), Some((24.5, None)));
    assert_eq!(find("x86_pkg_temp", "thermal_zone0"), Some((55.0, Some(96.0))));
    assert_eq!(find("acpitz", "thermal_zone1"), Some((27.8, None)));
    let fans: Vec<(&str, u32)> = c.fans.iter().map(|f| (f.name.as_str(), f.rpm)).collect();
    assert_eq!(fans, vec![("nct6798/SYS_FAN1", 5400), ("nct6798/fan2", 5350)]);
}

#[test]
fn a_node_without_sensors_or_rdma_is_empty_not_failed() {
    let empty = tempfile::tempdir().unwrap();
    let c = CoolingCollector::new(empty.path()).read().unwrap();
    assert!(c.sensors.is_empty() && c.fans.is_empty() && c.errors.is_empty());
    let n = NetworkCollector::with_fixtures(empty.path(), empty.path())
        .read()
        .unwrap();
    assert!(n.rdma_devices.is_empty());
}

#[test]
fn garbage_sysfs_files_become_field_errors() {
    let n = network("bad-input");
    let d = port(&n, "mlx5_0");
    assert_eq!(
        (d.state.as_ref(), d.rate_gbps, d.physical_state.as_ref()),
        (None, None, None)
    );
    assert_eq!(d.mtu, None);
    assert_eq!(d.ecn_priorities, None);
    assert_eq!(d.pfc_priorities, None);
    assert_eq!(
        d.trust,
        Some(ObservedTrust::Unknown),
        "bad trust file and failing netlink → unknown"
    );
    assert!(d.pfc_pause.is_empty());
    assert_eq!(
        fields(d),
        vec![
            "state",
            "physicalState",
            "rateGbps",
            "mtu",
            "ecnPriorities",
            "trust",
            "pfcPriorities",
            "pfcPause",
            "errorRates.linkDowned",
            "errorRates.symbolErrors"
        ]
    );
    // The counters that could be read are still counted.
    let rates = d.error_rates.as_ref().expect("the readable counters");
    assert_eq!((rates.link_downed, rates.symbol_errors), (None, None));
    assert_eq!(rates.rcv_errors, Some(0));
    let reason = |field: &str| {
        d.errors
            .iter()
            .find(|e| e.field == field)
            .map(|e| e.reason.clone())
            .unwrap_or_default()
    };
    assert!(reason("state").contains("banana"), "{}", reason("state"));
    assert!(reason("rateGbps").contains("empty"), "{}", reason("rateGbps"));
    assert!(
        reason("pfcPriorities").contains("EOPNOTSUPP"),
        "{}",
        reason("pfcPriorities")
    );
    assert!(
        reason("pfcPause").contains("Operation not supported"),
        "{}",
        reason("pfcPause")
    );
    // The healthy parts of the same port are still there.
    assert_eq!(
        (d.netdev.as_deref(), d.roce_v2_gid),
        (Some("ens1f0np0"), Some(true))
    );

    let d = port(&n, "mlx5_1");
    assert_eq!(fields(d), vec!["mtu", "pfcPriorities", "pfcPause"]);
    assert_eq!(d.state.as_deref(), Some("Active"));
    assert_eq!(
        d.trust,
        Some(ObservedTrust::Dscp),
        "the OFED trust file still answers"
    );

    let c = cooling("bad-input");
    let errored: Vec<&str> = c.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        errored,
        vec![
            "coretemp/Package id 0",
            "coretemp/Core 0",
            "nvme/Composite",
            "hwmon2/fan1_input",
            "mlx5/asic",
            "acpitz/thermal_zone1"
        ]
    );
    // Unreadable sensors carry the names policies match (`<chip>/<label>`); the file is in the
    // reason.
    assert!(
        c.errors[2].reason.starts_with("hwmon1/temp1_input: "),
        "{}",
        c.errors[2].reason
    );
    assert!(c.sensors.iter().any(|s| s.label == "Inlet"));
    assert!(c.fans.iter().any(|f| f.name == "nct6798/fan2"));
}
