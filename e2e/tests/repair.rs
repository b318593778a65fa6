//! Repair after the drain (`spec.repair`) on the real API server, with the chart's RBAC for a
//! remediation kind (`operator.remediators`) and a fake remediator (`gpunode_e2e::remediator`):
//! - a fatal XID drains a node, and its first step hands it to the remediator through an object
//!   made from the policy's template; the operator is killed mid-step and a fresh one resumes the
//!   same step (same object, one RepairStarted event); the remediator "reboots" the node (a new
//!   boot id, the XID gone); the node is released after `healthyFor` and the object deleted;
//! - on another node a step that never finishes times out, the next step fails, and the node,
//!   having used its attempts, stops at NeedsHuman and stays cordoned; deleting the policy
//!   releases it and deletes its step's object.
//!
//! (A separate test binary: one operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, remediator, reports, scratch::Scratch,
    scratch::rand_suffix, wait,
};
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);

fn report(boot: &str, xids: serde_json::Value) -> serde_json::Value {
    reports::one_gpu("550.54.15", boot, xids)
}

fn xid_79() -> serde_json::Value {
    json!([{"xid": 79, "at": jiff::Timestamp::now().to_string()}])
}

fn step(name: &str, template: &str, namespace: &str, timeout: &str) -> serde_json::Value {
    json!({
        "name": name, "action": "Remediator", "classes": ["Xid"], "timeout": timeout,
        "remediator": {
            "apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
            "kind": "FakeRebootTemplate", "name": template, "namespace": namespace,
        },
    })
}

fn policy(node: &str, steps: serde_json::Value, max_attempts: u32) -> serde_json::Value {
    json!({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "gpu": {},
        "remediation": [{"classes": ["Xid"], "action": "Drain"}],
        "disruption": {"maxUnavailable": 2, "circuitBreaker": {"maxDriftedPercent": 100}},
        "recovery": {"healthyFor": "5s"},
        "repair": {"steps": steps, "maxAttempts": max_attempts, "window": "1h"},
    })
}

/// The events gpunode published about `node`, oldest first: reason, note, and how many times it
/// happened (an event the recorder aggregated into a series counts each repeat; its note is the
/// first one's).
async fn events_of(client: &Client, node: &str) -> Vec<(String, String, i32)> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let mut list: Vec<Event> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
        .collect();
    list.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    list.into_iter()
        .map(|e| {
            let times = e.series.as_ref().map_or(1, |s| s.count);
            (e.reason.unwrap_or_default(), e.note.unwrap_or_default(), times)
        })
        .collect()
}

/// How many times events with `reason` happened.
fn count(events: &[(String, String, i32)], reason: &str) -> i32 {
    events
        .iter()
        .filter(|(r, _, _)| r == reason)
        .map(|(_, _, n)| n)
        .sum()
}

fn condition_reason(n: &Node) -> Option<String> {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuPolicyCompliant"))
        .and_then(|c| c.reason.clone())
}

#[tokio::test]
async fn a_drained_node_is_handed_to_a_remediator_and_returned_and_a_failing_ladder_stops_for_a_person() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let ns = Scratch::new(&client, "repair").await.unwrap();
    remediator::install_and_grant(&client, &ns.name).await.unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    for (name, behavior) in [("reboot", "Succeed"), ("hang", "Hang"), ("fail", "Fail")] {
        remediator::create_template(&client, &ns.name, name, behavior)
            .await
            .unwrap();
    }

    let id = format!("{:06x}", rand_suffix());
    let (good, stuck) = (format!("repair-ok-{id}"), format!("repair-stuck-{id}"));
    nodes::create(
        &client,
        &[good.clone(), stuck.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    for n in [&good, &stuck] {
        reports::publish(&client, n, report("boot-1", json!([])))
            .await
            .unwrap();
    }
    crds::create_policy(
        &client,
        &good,
        policy(&good, json!([step("reboot", "reboot", &ns.name, "60s")]), 2),
    )
    .await
    .unwrap();
    crds::create_policy(
        &client,
        &stuck,
        policy(
            &stuck,
            json!([
                step("wait", "hang", &ns.name, "3s"),
                step("bmc", "fail", &ns.name, "60s"),
                step("reboot", "reboot", &ns.name, "60s"),
            ]),
            2,
        ),
    )
    .await
    .unwrap();

    // The remediator's "reboot": the node comes back on a new boot, without the XID.
    let reporter = client.clone();
    let fake = remediator::spawn(client.clone(), move |node| {
        let client = reporter.clone();
        async move {
            reports::publish(&client, &node, report("boot-2", json!([])))
                .await
                .unwrap();
        }
    });
    let first = InProcess::start(&operator_client, "e2e-repair");
    let node_api: Api<Node> = Api::all(client.clone());
    nodes::until_labelled(&client, &good, &[("gpunode.dev/state", "compliant")], DEADLINE)
        .await
        .unwrap();
    for n in [&good, &stuck] {
        reports::publish(&client, n, report("boot-1", xid_79()))
            .await
            .unwrap();
    }

    // Drained (nothing to evict), then the first step makes its object.
    let reboots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &remediator::reboot_resource());
    let made = wait::until("the reboot step's object", DEADLINE, || async {
        Ok(reboots.get_opt(&good).await?)
    })
    .await
    .unwrap();
    assert_eq!(
        made.labels().get("gpunode.dev/node").map(String::as_str),
        Some(good.as_str())
    );
    assert_eq!(
        made.data.pointer("/spec/behavior").and_then(|b| b.as_str()),
        Some("Succeed"),
        "the template's spec.template.spec is copied"
    );
    let n = node_api.get(&good).await.unwrap();
    assert!(nodes::cordoned(&n));
    assert_eq!(condition_reason(&n).as_deref(), Some("Repairing"));

    // Killed mid-step: the next operator resumes the same step. (Events are published in the
    // background and a killed operator loses those still queued: wait until both nodes' starts
    // are out, so the counts below are about the steps, not about the kill.)
    wait::until("both nodes' first steps announced", DEADLINE, || async {
        let (a, b) = (events_of(&client, &good).await, events_of(&client, &stuck).await);
        Ok((count(&a, "RepairStarted") == 1 && count(&b, "RepairStarted") >= 1).then_some(()))
    })
    .await
    .unwrap();
    first.kill().await;
    let second = InProcess::start(&operator_client, "e2e-repair");
    remediator::go(&client, &ns.name, &good).await.unwrap();

    // Repaired: released after healthyFor, and the step's object deleted.
    wait::until("the repaired node released", DEADLINE, || async {
        let n = node_api.get(&good).await?;
        let released =
            !nodes::cordoned(&n) && nodes::label(&n, "gpunode.dev/state").as_deref() == Some("compliant");
        Ok(released.then_some(()))
    })
    .await
    .unwrap();
    wait::until("the reboot object deleted", DEADLINE, || async {
        Ok(reboots.get_opt(&good).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    let seen = events_of(&client, &good).await;
    assert_eq!(
        count(&seen, "RepairStarted"),
        1,
        "one start across both operators: {seen:?}"
    );
    assert_eq!(count(&seen, "RepairSucceeded"), 1, "{seen:?}");
    assert_eq!(count(&seen, "NeedsHuman"), 0, "{seen:?}");
    let n = node_api.get(&good).await.unwrap();
    let kept = n
        .annotations()
        .get("gpunode.dev/repair")
        .cloned()
        .unwrap_or_default();
    let kept: serde_json::Value = serde_json::from_str(&kept).unwrap();
    assert_eq!(
        kept.get("attempts").and_then(|a| a.as_array()).map(Vec::len),
        Some(1),
        "the attempt is remembered for the window, nothing else: {kept}"
    );
    assert!(
        kept.get("step").is_none() && kept.get("objects").is_none(),
        "{kept}"
    );

    // The other node: timed out, failed, then out of attempts.
    let stopped = wait::until("the stuck node to need a person", DEADLINE, || async {
        let n = node_api.get(&stuck).await?;
        Ok((condition_reason(&n).as_deref() == Some("NeedsHuman")).then_some(n))
    })
    .await
    .unwrap();
    assert!(
        nodes::cordoned(&stopped),
        "a node that needs a person stays cordoned"
    );
    let seen = events_of(&client, &stuck).await;
    // The recorder folds repeats of a reason into one event's series, so the order of the
    // steps is checked through their counts and notes, not the order of the events.
    for (reason, times) in [
        ("RepairStarted", 2),
        ("RepairTimedOut", 1),
        ("RepairFailed", 1),
        ("NeedsHuman", 1),
        ("RepairSucceeded", 0),
    ] {
        assert_eq!(count(&seen, reason), times, "{reason}: {seen:?}");
    }
    let (_, timed_out, _) = seen.iter().find(|(r, _, _)| r == "RepairTimedOut").unwrap();
    assert!(
        timed_out.contains("repair step wait timed out") && timed_out.contains("timeout of 3s"),
        "{timed_out}"
    );
    let (_, why, _) = seen.iter().find(|(r, _, _)| r == "NeedsHuman").unwrap();
    assert!(
        why.contains("used its 2 repair attempts within 1h")
            && why.contains(&format!("kubectl annotate node {stuck} gpunode.dev/repair-")),
        "{why}"
    );
    let (_, failed, _) = seen.iter().find(|(r, _, _)| r == "RepairFailed").unwrap();
    assert!(
        failed.contains("repair step bmc failed") && failed.contains("BmcUnreachable"),
        "{failed}"
    );
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    wait::until("the policy status to count the node", DEADLINE, || async {
        let p = policies.get(&stuck).await?;
        Ok(p.status
            .filter(|s| s.needs_human == 1 && s.repairing == 0)
            .map(|_| ()))
    })
    .await
    .unwrap();

    // Deleting the policy releases the node and deletes its step's object.
    assert!(reboots.get_opt(&stuck).await.unwrap().is_some());
    policies.delete(&stuck, &Default::default()).await.unwrap();
    wait::until("the stuck node released", DEADLINE, || async {
        let n = node_api.get(&stuck).await?;
        Ok((!nodes::cordoned(&n) && !n.annotations().contains_key("gpunode.dev/repair")).then_some(()))
    })
    .await
    .unwrap();
    wait::until("its step's object deleted", DEADLINE, || async {
        Ok(reboots.get_opt(&stuck).await?.is_none().then_some(()))
    })
    .await
    .unwrap();

    policies.delete(&good, &Default::default()).await.unwrap();
    second.stop().await.unwrap();
    fake.abort();
    ns.delete().await.unwrap();
}
