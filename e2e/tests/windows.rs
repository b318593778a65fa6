//! Maintenance windows on the real API server: a policy whose only window opens at the next
//! whole minute (UTC). A driver mismatch waits, and the node's condition says until when; an XID
//! (an urgent class) is acted on at once; when the window opens the waiting node is cordoned,
//! not before.
//!
//! (A separate test binary: one operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, reports, scratch::rand_suffix, wait,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);

fn report(driver: &str, xids: serde_json::Value) -> serde_json::Value {
    reports::one_gpu(driver, "boot-1", xids)
}

fn message(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuPolicyCompliant"))
        .and_then(|c| c.message.clone())
        .unwrap_or_default()
}

async fn node(client: &Client, name: &str) -> Node {
    Api::<Node>::all(client.clone()).get(name).await.unwrap()
}

#[tokio::test]
async fn a_drift_waits_for_the_window_that_opens_seconds_later_and_an_urgent_one_does_not() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let id = format!("{:06x}", rand_suffix());
    let (waits, urgent) = (format!("window-wait-{id}"), format!("window-urgent-{id}"));
    nodes::create(
        &client,
        &[waits.clone(), urgent.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    for n in [&waits, &urgent] {
        reports::publish(&client, n, report("550.54.15", json!([])))
            .await
            .unwrap();
    }
    // The window opens at the next whole minute at least 10 s away, and lasts 10 minutes.
    let (window, opens) = gpunode_e2e::window::next_minute(Duration::from_secs(10)).unwrap();
    for n in [&waits, &urgent] {
        crds::create_policy(
            &client,
            n,
            json!({
                "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": n}},
                "gpu": {"driverVersion": ">=550"},
                "remediation": [{"classes": ["Driver", "Xid"], "action": "Cordon"}],
                "disruption": {"maxUnavailable": 2, "circuitBreaker": {"maxDriftedPercent": 100}},
                "maintenance": {"windows": [window], "urgentClasses": ["Xid"]},
                "staleAfter": "5m",
            }),
        )
        .await
        .unwrap();
    }
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e-windows");
    for n in [&waits, &urgent] {
        nodes::until_labelled(&client, n, &[("gpunode.dev/state", "compliant")], DEADLINE)
            .await
            .unwrap();
    }

    reports::publish(&client, &waits, report("535.129.03", json!([])))
        .await
        .unwrap();
    reports::publish(
        &client,
        &urgent,
        report(
            "550.54.15",
            json!([{"xid": 79, "at": Timestamp::now().to_string()}]),
        ),
    )
    .await
    .unwrap();

    // The urgent one at once; the other drifted, labelled and told when, not cordoned.
    wait::until("the urgent node cordoned", DEADLINE, || async {
        Ok(nodes::cordoned(&node(&client, &urgent).await).then_some(()))
    })
    .await
    .unwrap();
    let expected = format!("waiting for the maintenance window that opens at {opens}: Cordon");
    let n = wait::until("the waiting node to say until when", DEADLINE, || async {
        let n = node(&client, &waits).await;
        Ok(message(&n).contains(&expected).then_some(n))
    })
    .await
    .unwrap();
    assert_eq!(nodes::label(&n, "gpunode.dev/state").as_deref(), Some("drifted"));
    assert!(!nodes::cordoned(&n), "cordoned before its window");
    assert!(Timestamp::now() < opens, "the test ran past the window's opening");

    // The window opens: cordoned, and not before.
    wait::until(
        "the waiting node cordoned once the window opens",
        DEADLINE,
        || async { Ok(nodes::cordoned(&node(&client, &waits).await).then_some(())) },
    )
    .await
    .unwrap();
    let cordoned_at = Timestamp::now();
    assert!(
        cordoned_at >= opens,
        "cordoned at {cordoned_at}, before the window opened at {opens}"
    );
    eprintln!(
        "cordoned {} ms after the window opened",
        cordoned_at.duration_since(opens).as_millis()
    );

    operator.stop().await.unwrap();
    for n in [&waits, &urgent] {
        let _ = Api::<GpuNodePolicy>::all(client.clone())
            .delete(n, &Default::default())
            .await;
    }
}
