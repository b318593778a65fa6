//! A fatal XID outlives the probe that saw it, until the node reboots: the real probe binary
//! (fake NVML, fixture sysfs, the chart's ServiceAccount) sees XID 79 and the in-process operator
//! cordons the node; the probe is SIGKILLed and restarted on the same boot and the node stays
//! drifted and cordoned past `recovery.healthyFor`; restarted with a new boot id (a reboot), it
//! reports no XID and the node is uncordoned after `healthyFor`.
//!
//! The fake NVML library, like the real one, delivers an XID only to a process that had
//! registered for events when it happened, so nothing but the probe's state directory
//! (`--state-dir`) carries the XID over a restart.
//!
//! Needs the binaries built (`make test` builds them first): `gpunode-probe` and
//! `libfake_nvml.so` next to this test's target directory.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use gpunode_crds::GpuNodeReport;
use gpunode_e2e::{probe::Probe, rig::Rig, wait};
use kube::Api;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);
/// `recovery.healthyFor` of the test's policy.
const HEALTHY_FOR: Duration = Duration::from_secs(5);
/// How far past `healthyFor` the node must still be cordoned after a restart on the same boot:
/// well over the operator's reaction time to a report.
const MARGIN: Duration = Duration::from_secs(4);

/// The XIDs in the stored report, once `probe` has written its first one (its log says so after
/// the write; observedAt has whole seconds only, too coarse to tell two probes apart).
async fn first_report(probe: &Probe, reports: &Api<GpuNodeReport>, node: &str) -> Vec<u32> {
    probe.logged("first observation", DEADLINE).await.unwrap();
    let status = reports.get(node).await.unwrap().status.unwrap_or_default();
    status
        .gpus
        .iter()
        .flat_map(|g| g.xids.iter().map(|x| x.xid))
        .collect()
}

#[tokio::test]
async fn a_fatal_xid_keeps_the_node_cordoned_across_a_probe_restart_until_a_reboot() {
    let rig = Rig::start("xid-restart", None, |node| {
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {},
            "remediation": [{"classes": ["Xid"], "action": "Cordon"}],
            "recovery": {"healthyFor": "5s"},
            "staleAfter": "5m",
        })
    })
    .await
    .unwrap();
    let (host, node, reports) = (&rig.host, &rig.node, &rig.reports);

    // Boot A. The XID happens once the probe has registered for events (NVML delivers nothing
    // that happened before).
    let first = host.start_probe("boot-a").unwrap();
    first.logged("listening for XID events", DEADLINE).await.unwrap();
    rig.until("the node compliant", "compliant", false, DEADLINE)
        .await
        .unwrap();
    host.inject_xid(5, 79).unwrap();
    rig.until(
        "the node drifted and cordoned for XID 79",
        "drifted",
        true,
        DEADLINE,
    )
    .await
    .unwrap();
    // Saved at once (the first XID after a quiet spell is not held back).
    let saved = host.dir.join("state/xids.json");
    wait::until("XID 79 in the probe's state file", DEADLINE, || async {
        let text = std::fs::read_to_string(&saved).unwrap_or_default();
        Ok(text.contains(r#""xid":79"#).then_some(()))
    })
    .await
    .unwrap();
    assert!(first.kill().unwrap(), "the probe exited by itself");

    // Restarted on the same boot: the XID comes back from the state directory, and the node stays
    // cordoned while healthyFor, and more, passes after the restarted probe's report.
    let second = host.start_probe("boot-a").unwrap();
    let xids = first_report(&second, reports, node).await;
    let published = Instant::now();
    assert_eq!(xids, vec![79], "the restarted probe forgot the XID of this boot");
    assert!(
        second
            .lines()
            .iter()
            .any(|l| l.contains("restored the XIDs of this boot")),
        "{:?}",
        second.lines()
    );
    rig.stays_cordoned(published, HEALTHY_FOR + MARGIN).await.unwrap();
    assert!(second.kill().unwrap(), "the probe exited by itself");

    // Boot B: the node rebooted, the XIDs of boot A are forgotten and the node recovers after
    // healthyFor.
    let third = host.start_probe("boot-b").unwrap();
    let xids = first_report(&third, reports, node).await;
    let clear = Instant::now();
    third.logged("the node rebooted", DEADLINE).await.unwrap();
    assert_eq!(xids, Vec::<u32>::new());
    rig.until("the node uncordoned and compliant", "compliant", false, DEADLINE)
        .await
        .unwrap();
    assert!(
        clear.elapsed() >= HEALTHY_FOR - Duration::from_millis(500),
        "uncordoned {:?} after the first clear report, before healthyFor",
        clear.elapsed()
    );
    eprintln!(
        "recovered {:?} after the rebooted probe's first report",
        clear.elapsed()
    );
    assert!(third.kill().unwrap(), "the probe exited by itself");
    rig.finish().await.unwrap();
}
