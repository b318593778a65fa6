//! The enforced power limit and the PCIe replay rate, end to end: the real probe binary reads the
//! fake NVML library of an H100 board, the in-process operator judges its reports on the real
//! API server. Healthy values never drift: GPU 1 capped at exactly 90% of its default (630 of
//! 700 W, the policy's share) and GPU 5's replay counter moving at a normal slow rate keep the
//! node compliant. GPU 2's limit set far below its default (400 W, as `nvidia-smi -pl 400` would)
//! cordons the node in class Config for `gpu.power.minLimitPercentOfDefault`, naming the GPU;
//! back at its default, the node is released after `healthyFor`. Then GPU 5's replay counter
//! rising fast cordons it in class Pcie for `gpu.pcie.maxReplaysPerHour`, naming the GPU. Before
//! that, GPU 4's hardware power brake held past `gpu.power.maxPowerBrake` (the probe stamps when
//! it began, the operator looks again when it outlasts the limit) cordons it in class Throttle,
//! and the brake released, the node returns.
//!
//! (A separate test binary: one operator per process.) Needs the binaries built (`make test`
//! builds them first): `gpunode-probe` and `libfake_nvml.so`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_e2e::{nodes, rig::Rig, wait};
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);

/// GPU `gpu` runs under a power limit of `watts` (management and enforced).
fn set_limit(f: &mut serde_json::Value, gpu: usize, watts: u64) {
    f["devices"][gpu]["power_limit_mw"] = json!(watts * 1000);
    f["devices"][gpu]["enforced_limit_mw"] = json!(watts * 1000);
}

/// GPU `gpu`'s cumulative PCIe replay counter is `value`.
fn set_replays(f: &mut serde_json::Value, gpu: usize, value: u64) {
    f["devices"][gpu]["pcie"]["replay"] = json!(value);
}

/// Waits until the node is drifted in `class` (its `gpunode.dev/drift.<class>` label) and
/// cordoned, and returns its condition's message.
async fn until_cordoned(rig: &Rig, class: &str, why: &str) -> String {
    let label = format!("gpunode.dev/drift.{class}");
    let n = wait::until(why, DEADLINE, || async {
        let n = rig.nodes.get(&rig.node).await?;
        let drifted = nodes::label(&n, &label).as_deref() == Some("true");
        Ok((drifted && nodes::cordoned(&n)).then_some(n))
    })
    .await
    .unwrap();
    nodes::compliance(&n).1
}

/// The node is compliant and schedulable.
fn healthy(n: &Node) -> bool {
    nodes::label(n, "gpunode.dev/state").as_deref() == Some("compliant") && !nodes::cordoned(n)
}

#[tokio::test]
async fn a_capped_power_limit_and_fast_pcie_replays_cordon_the_node_and_healthy_values_do_not() {
    let rig = Rig::start("power", None, |node| {
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {"power": {"minLimitPercentOfDefault": 90, "maxPowerBrake": "3s"},
                    "pcie": {"maxReplaysPerHour": 100}},
            "remediation": [{"classes": ["Config", "Pcie", "Throttle"], "action": "Cordon"}],
            "recovery": {"healthyFor": "5s"},
            "staleAfter": "5m",
        })
    })
    .await
    .unwrap();
    // GPU 5 has replayed since the driver loaded: those are not in the window.
    rig.host.edit_fixture(|f| set_replays(f, 5, 40_000)).unwrap();
    let probe = rig.host.start_probe("boot-a").unwrap();
    rig.until("the node compliant", "compliant", false, DEADLINE)
        .await
        .unwrap();

    // Healthy values: GPU 1 at exactly the policy's share of its default, GPU 5 replaying a few
    // times. The probe publishes both; the node stays compliant and schedulable throughout.
    rig.host
        .edit_fixture(|f| {
            set_limit(f, 1, 630);
            set_replays(f, 5, 40_007);
        })
        .unwrap();
    wait::until("the report shows 630 W and 7 replays", DEADLINE, || async {
        let n = rig.nodes.get(&rig.node).await?;
        assert!(healthy(&n), "{:?}", nodes::compliance(&n));
        let status = rig.reports.get(&rig.node).await?.status.unwrap_or_default();
        let limit = status.gpus.get(1).and_then(|g| g.power_limit_watts);
        let replays = status
            .gpus
            .get(5)
            .and_then(|g| g.pcie.as_ref())
            .and_then(|p| p.replays_last_hour);
        Ok((limit == Some(630) && replays == Some(7)).then_some(()))
    })
    .await
    .unwrap();
    // The operator judged that report too: the node holds for a few more observations.
    let since = std::time::Instant::now();
    wait::until("the node compliant for 5 s more", DEADLINE, || async {
        let n = rig.nodes.get(&rig.node).await?;
        assert!(healthy(&n), "{:?}", nodes::compliance(&n));
        Ok((since.elapsed() >= Duration::from_secs(5)).then_some(()))
    })
    .await
    .unwrap();

    // GPU 2 capped at 400 W of its 700 W default.
    rig.host.edit_fixture(|f| set_limit(f, 2, 400)).unwrap();
    let message = until_cordoned(&rig, "config", "the node cordoned for GPU 2's power limit").await;
    assert!(
        message.contains("gpu 2: gpu.power.minLimitPercentOfDefault")
            && message.contains(">= 90% of the 700 W default")
            && message.contains("400 W enforced"),
        "{message}"
    );
    // GPU 1 at 630 W is not named.
    assert!(!message.contains("gpu 1:"), "{message}");

    // Back at the default: released after healthyFor.
    rig.host.edit_fixture(|f| set_limit(f, 2, 700)).unwrap();
    rig.until("the node released", "compliant", false, DEADLINE)
        .await
        .unwrap();

    // GPU 4's clocks held down by the hardware power brake (NVML's clocks-event reason bit
    // 0x80), past maxPowerBrake.
    rig.host
        .edit_fixture(|f| f["devices"][4]["throttle_reasons"] = json!(0x80))
        .unwrap();
    let started = std::time::Instant::now();
    let message = until_cordoned(&rig, "throttle", "the node cordoned for GPU 4's power brake").await;
    assert!(
        message.contains("gpu 4: gpu.power.maxPowerBrake")
            && message.contains("hardware power brake for at most 3s")
            && message.contains("braking since"),
        "{message}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "cordoned {:?} after the brake began, before maxPowerBrake",
        started.elapsed()
    );
    // The brake released: so is the node, after healthyFor.
    rig.host
        .edit_fixture(|f| f["devices"][4]["throttle_reasons"] = json!(0x1))
        .unwrap();
    rig.until("the node released", "compliant", false, DEADLINE)
        .await
        .unwrap();

    // GPU 5's link starts replaying fast: 5,000 more within seconds.
    rig.host.edit_fixture(|f| set_replays(f, 5, 45_007)).unwrap();
    let message = until_cordoned(&rig, "pcie", "the node cordoned for GPU 5's PCIe replays").await;
    assert!(
        message.contains("gpu 5: gpu.pcie.maxReplaysPerHour")
            && message.contains("<= 100 replays per hour")
            && message.contains("replays in the last"),
        "{message}"
    );

    drop(probe);
    rig.finish().await.unwrap();
}
