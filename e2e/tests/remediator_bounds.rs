//! Remediation objects only where the chart grants them (issue #43, item 4), on the real API
//! server: the fake remediation kind granted by an `operator.remediators` entry limited to one
//! namespace; a drained node whose repair step's template lives in another namespace gets no
//! object there, and the step fails at once, its event naming the field and the chart value.
//!
//! (A separate test binary: one operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, remediator, reports, scratch::Scratch,
    scratch::rand_suffix, wait,
};
use kube::{Api, api::DynamicObject};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);

#[tokio::test]
async fn a_repair_step_outside_the_granted_namespaces_makes_nothing_and_fails_naming_the_value() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let granted = Scratch::new(&client, "remediators-granted").await.unwrap();
    let other = Scratch::new(&client, "remediators-other").await.unwrap();
    remediator::install(&client).await.unwrap();
    let entry = json!({
        "apiGroup": remediator::GROUP, "resources": ["fakereboots"],
        "templates": ["fakereboottemplates"], "namespaces": [granted.name],
    });
    chart::grant_remediators_in(
        &client,
        &entry,
        &format!("{}/fakereboots", remediator::GROUP),
        &granted.name,
    )
    .await
    .unwrap();
    remediator::create_template(&client, &other.name, "reboot", "Succeed")
        .await
        .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();

    let node = format!("rembounds-{:06x}", rand_suffix());
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    reports::publish(&client, &node, reports::one_gpu("550.54.15", "boot-1", json!([])))
        .await
        .unwrap();
    let policy = json!({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "gpu": {},
        "remediation": [{"classes": ["Xid"], "action": "Drain"}],
        "disruption": {"maxUnavailable": 2, "circuitBreaker": {"maxDriftedPercent": 100}},
        "recovery": {"healthyFor": "5s"},
        "repair": {"steps": [{
            "name": "reboot", "action": "Remediator", "classes": ["Xid"], "timeout": "60s",
            "remediator": {
                "apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
                "kind": "FakeRebootTemplate", "name": "reboot", "namespace": other.name,
            },
        }], "maxAttempts": 1, "window": "1h"},
    });
    crds::create_policy(&client, &node, policy).await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e-remediator-bounds");
    nodes::until_labelled(&client, &node, &[("gpunode.dev/state", "compliant")], DEADLINE)
        .await
        .unwrap();
    let xid = json!([{"xid": 79, "at": jiff::Timestamp::now().to_string()}]);
    reports::publish(&client, &node, reports::one_gpu("550.54.15", "boot-1", xid))
        .await
        .unwrap();

    let want = format!(
        "spec.repair.steps[].remediator.namespace: fakereboots.{} may not be made in namespace {} \
         (chart value operator.remediators[].namespaces)",
        remediator::GROUP,
        other.name
    );
    let note = wait::until("the step's failure naming the chart value", DEADLINE, || async {
        let events = nodes::events(&client, &node).await?;
        Ok(events
            .into_iter()
            .filter_map(|e| e.note)
            .find(|n| n.contains("operator.remediators")))
    })
    .await
    .unwrap();
    assert!(note.contains(&want), "{note:?} names {want:?}");
    let reboots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &other.name, &remediator::reboot_resource());
    assert!(
        reboots.get_opt(&node).await.unwrap().is_none(),
        "no FakeReboot made in {}",
        other.name
    );
    operator.stop().await.unwrap();
}
