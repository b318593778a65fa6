//! A flapping InfiniBand port, end to end: the real probe binary reads a copy of the
//! `ib-ndr-healthy` fixture tree; `link_downed` of mlx5_3 rises under it, the probe publishes the
//! port's flaps over the last hour and the in-process operator cordons the node for the policy's
//! `network.infiniband.maxLinkDownedPerHour`. A probe restarted on the same boot still counts
//! the flaps (its counter history is in the state directory), so the node stays cordoned; a
//! probe on a new boot starts counting again and the node is uncordoned after `healthyFor`.
//!
//! Needs the binaries built (`make test` builds them first): `gpunode-probe` and
//! `libfake_nvml.so` next to this test's target directory.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use gpunode_crds::GpuNodeReport;
use gpunode_e2e::{probe::Probe, rig::Rig};
use kube::Api;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);
/// `recovery.healthyFor` of the test's policy.
const HEALTHY_FOR: Duration = Duration::from_secs(5);
/// How far past `healthyFor` the node must stay cordoned after a restart on the same boot.
const MARGIN: Duration = Duration::from_secs(4);

/// Sets a counter of the copied tree, atomically (a new file renamed over the old one).
fn set_counter(tree: &Path, device: &str, counter: &str, value: u64) {
    let dir = tree
        .join("sys/class/infiniband")
        .join(device)
        .join("ports/1/counters");
    let tmp = dir.join(format!(".{counter}.tmp"));
    std::fs::write(&tmp, format!("{value}\n")).unwrap();
    std::fs::rename(&tmp, dir.join(counter)).unwrap();
}

/// mlx5_3's flaps in the stored report, once `probe` has written its first one.
async fn first_flaps(probe: &Probe, reports: &Api<GpuNodeReport>, node: &str) -> Option<u64> {
    probe.logged("first observation", DEADLINE).await.unwrap();
    flaps(reports, node).await
}

async fn flaps(reports: &Api<GpuNodeReport>, node: &str) -> Option<u64> {
    let status = reports.get(node).await.unwrap().status.unwrap_or_default();
    status
        .network
        .unwrap_or_default()
        .rdma_devices
        .iter()
        .find(|d| d.device == "mlx5_3")
        .and_then(|d| d.error_rates.as_ref())
        .and_then(|r| r.link_downed)
}

#[tokio::test]
async fn a_flapping_port_cordons_the_node_across_a_probe_restart_until_a_reboot() {
    let rig = Rig::start("fabric", Some("ib-ndr-healthy"), |node| {
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "network": {"minRateGbps": 400, "infiniband": {"maxLinkDownedPerHour": 2}},
            "remediation": [{"classes": ["Network"], "action": "Cordon"}],
            "recovery": {"healthyFor": "5s"},
            "staleAfter": "5m",
        })
    })
    .await
    .unwrap();
    let (host, node, reports) = (&rig.host, &rig.node, &rig.reports);

    // Boot A: healthy, then mlx5_3 flaps six times.
    let first = host.start_probe("boot-a").unwrap();
    rig.until("the node compliant", "compliant", false, DEADLINE)
        .await
        .unwrap();
    let saved = host.dir.join("state/fabric-counters.json");
    assert!(saved.exists(), "no counter history in {}", saved.display());
    set_counter(host.tree(), "mlx5_3", "link_downed", 7);
    let drifted = rig
        .until(
            "the node drifted and cordoned for link flaps",
            "drifted",
            true,
            DEADLINE,
        )
        .await
        .unwrap();
    let (_, message) = gpunode_e2e::nodes::compliance(&drifted);
    assert!(
        message.contains("maxLinkDownedPerHour") && message.contains("link_downed on port 1"),
        "{message}"
    );
    assert_eq!(flaps(reports, node).await, Some(6));
    assert!(first.kill().unwrap(), "the probe exited by itself");

    // Restarted on the same boot: the history in the state directory still counts the flaps.
    let second = host.start_probe("boot-a").unwrap();
    assert_eq!(first_flaps(&second, reports, node).await, Some(6));
    let published = Instant::now();
    assert!(
        second
            .lines()
            .iter()
            .any(|l| l.contains("restored the fabric counter history of this boot")),
        "{:?}",
        second.lines()
    );
    rig.stays_cordoned(published, HEALTHY_FOR + MARGIN).await.unwrap();
    assert!(second.kill().unwrap(), "the probe exited by itself");

    // Boot B: the counters restarted with the node (and so does the history): no flaps.
    set_counter(host.tree(), "mlx5_3", "link_downed", 1);
    let third = host.start_probe("boot-b").unwrap();
    assert_eq!(first_flaps(&third, reports, node).await, Some(0));
    rig.until("the node uncordoned and compliant", "compliant", false, DEADLINE)
        .await
        .unwrap();
    assert!(third.kill().unwrap(), "the probe exited by itself");
    rig.finish().await.unwrap();
}
