//! The validation gate on the real API server, with the real Job controller and scheduler and
//! KWOK running the pods: three nodes drift (a driver mismatch), are cordoned and drained, and
//! recover. Before gpunode uncordons them, a validation Job from the policy's template runs on
//! each, pinned to it and labelled `gpunode.dev/validation=running` meanwhile:
//! - its pod completes (kwok's pod-complete stage): the Job passes, the node is uncordoned;
//! - its pod fails (the stage of kwok-stages-outcome.yaml): the node stays cordoned and its
//!   repair ladder continues (a repair step starts), though its repair had stopped for a
//!   person on the driver mismatch (no step repairs it) before the driver was fixed;
//! - its pod never finishes: the Job times out, is deleted, and the node stays cordoned.
//!
//! The operator runs as the chart's ServiceAccount with the chart's RBAC for the validation
//! namespace (`operator.validation.namespaces`). (A separate test binary: one operator per
//! process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_e2e::{
    chart,
    cluster::admin_client,
    crds, nodes,
    operator::InProcess,
    remediator, reports,
    scratch::{Scratch, rand_suffix},
    wait,
};
use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(120);

fn report(driver: &str) -> Value {
    reports::one_gpu(driver, "boot-1", json!([]))
}

fn validation_label(n: &Node) -> Option<String> {
    nodes::label(n, "gpunode.dev/validation")
}

/// The notes of `node`'s events with `reason`.
async fn notes(client: &Client, node: &str, reason: &str) -> Vec<String> {
    nodes::events(client, node)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// Waits until Job `name` is gone (or going).
async fn until_job_gone(jobs: &Api<Job>, what: &str, name: &str) {
    wait::until(what, DEADLINE, || async {
        Ok(jobs
            .get_opt(name)
            .await?
            .is_none_or(|j| j.metadata.deletion_timestamp.is_some())
            .then_some(()))
    })
    .await
    .unwrap();
}

/// A policy for `node`: a driver mismatch drains it; a validation Job whose pods carry
/// `outcome` (none: they complete) with `timeout`; `repair` steps, if any.
fn policy(node: &str, ns: &str, outcome: Option<&str>, timeout: &str, repair: Option<Value>) -> Value {
    let mut labels = json!({"app": "gpu-diag"});
    if let Some(o) = outcome {
        labels["gpunode.test/outcome"] = json!(o);
    }
    let mut spec = json!({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "gpu": {"driverVersion": ">=550"},
        "remediation": [{"classes": ["Driver", "Validation"], "action": "Drain"}],
        "disruption": {"maxUnavailable": 1, "circuitBreaker": {"maxDriftedPercent": 100}},
        "recovery": {"healthyFor": "2s"},
        "staleAfter": "5m",
        "validation": {
            "namespace": ns,
            "timeout": timeout,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": "diag",
                    "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
                    "command": ["dcgmi", "diag", "-r", "2"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }]},
            },
        },
    });
    if let Some(steps) = repair {
        spec["repair"] = json!({"steps": steps, "maxAttempts": 3});
    }
    spec
}

/// Drifts `node` (driver 535) and waits until gpunode cordoned it (and, with `first`, until
/// its condition says `first`); then recovers it (driver 550) and waits for its validation Job,
/// which it returns.
async fn drift_and_recover(client: &Client, node: &str, ns: &str, first: Option<&str>) -> Job {
    reports::publish(client, node, report("535.129.03"))
        .await
        .unwrap();
    let node_api: Api<Node> = Api::all(client.clone());
    wait::until(&format!("{node} cordoned"), DEADLINE, || async {
        let n = node_api.get(node).await?;
        Ok((nodes::cordoned(&n) && first.is_none_or(|r| nodes::compliance(&n).0 == r)).then_some(()))
    })
    .await
    .unwrap();
    reports::publish(client, node, report("550.54.15")).await.unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let label = format!("gpunode.dev/validation-node={node}");
    wait::until(&format!("the validation Job of {node}"), DEADLINE, || async {
        Ok(jobs
            .list(&ListParams::default().labels(&label))
            .await?
            .items
            .into_iter()
            .next())
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_recovered_node_returns_only_after_its_validation_job_passes() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let ns = Scratch::new(&client, "validation").await.unwrap();
    chart::grant_validation(&client, &ns.name).await.unwrap();
    remediator::install_and_grant(&client, &ns.name).await.unwrap();
    remediator::create_template(&client, &ns.name, "hang", "Hang")
        .await
        .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();

    let id = format!("{:06x}", rand_suffix());
    let (pass, fail, hang) = (
        format!("validate-pass-{id}"),
        format!("validate-fail-{id}"),
        format!("validate-hang-{id}"),
    );
    nodes::create(
        &client,
        &[pass.clone(), fail.clone(), hang.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    for n in [&pass, &fail, &hang] {
        reports::publish(&client, n, report("550.54.15")).await.unwrap();
    }
    let reboot = json!([{
        "name": "reboot", "action": "Remediator", "classes": ["Validation"], "timeout": "10m",
        "remediator": {"apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
                       "kind": "FakeRebootTemplate", "name": "hang", "namespace": ns.name},
    }]);
    for (node, spec) in [
        (&pass, policy(&pass, &ns.name, None, "60s", None)),
        (&fail, policy(&fail, &ns.name, Some("Fail"), "60s", Some(reboot))),
        (&hang, policy(&hang, &ns.name, Some("Hang"), "4s", None)),
    ] {
        crds::create_policy(&client, node, spec).await.unwrap();
    }
    let operator = InProcess::start(&operator_client, "e2e-validation");
    for n in [&pass, &fail, &hang] {
        nodes::until_labelled(&client, n, &[("gpunode.dev/state", "compliant")], DEADLINE)
            .await
            .unwrap();
    }
    let node_api: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    // Passes: the Job runs pinned to the node while it is labelled; then the node returns.
    let job = drift_and_recover(&client, &pass, &ns.name, None).await;
    let job_name = job.metadata.name.clone().unwrap();
    let pod_spec = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let terms = serde_json::to_value(&pod_spec.affinity).unwrap();
    assert_eq!(
        terms.pointer("/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0"),
        Some(&json!(pass)),
        "pinned to the node"
    );
    let n = node_api.get(&pass).await.unwrap();
    assert!(nodes::cordoned(&n), "still cordoned while it validates");
    let owners: Vec<(String, String, String)> = job
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| (o.kind.clone(), o.name.clone(), o.uid.clone()))
        .collect();
    assert_eq!(
        owners,
        [("Node".to_string(), pass.clone(), n.metadata.uid.clone().unwrap())],
        "the Job is owned by its node"
    );
    let pod = wait::until("the validation pod on the node", DEADLINE, || async {
        let label = format!("job-name={job_name}");
        Ok(pods
            .list(&ListParams::default().labels(&label))
            .await?
            .items
            .into_iter()
            .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(pass.as_str())))
    })
    .await
    .unwrap();
    assert!(
        pod.metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("gpunode.dev/validation-node")
    );
    wait::until(
        &format!("{pass} uncordoned after the validation"),
        DEADLINE,
        || async {
            let n = node_api.get(&pass).await?;
            Ok((!nodes::cordoned(&n) && validation_label(&n).is_none()).then_some(()))
        },
    )
    .await
    .unwrap();
    let passed = wait::until("the ValidationPassed event", DEADLINE, || async {
        Ok(notes(&client, &pass, "ValidationPassed").await.into_iter().next())
    })
    .await
    .unwrap();
    assert!(passed.contains(&job_name), "the event names the Job: {passed}");

    // Fails: the node stays cordoned, the event names the Job, the repair ladder continues.
    // Its repair has no step for a driver mismatch: it stops for a person (NeedsHuman) before
    // the driver is fixed; the fix ends the stop, and the failed validation climbs the ladder.
    let job = drift_and_recover(&client, &fail, &ns.name, Some("NeedsHuman")).await;
    let job_name = job.metadata.name.clone().unwrap();
    let (reason, message) = wait::until(&format!("{fail}'s validation failed"), DEADLINE, || async {
        let n = node_api.get(&fail).await?;
        let c = nodes::compliance(&n);
        Ok((!notes(&client, &fail, "ValidationFailed").await.is_empty()).then_some(c))
    })
    .await
    .unwrap();
    let failed = notes(&client, &fail, "ValidationFailed").await;
    assert!(
        failed[0].contains(&job_name) && failed[0].contains("failed"),
        "{failed:?}"
    );
    let n = node_api.get(&fail).await.unwrap();
    assert!(nodes::cordoned(&n), "a failed validation keeps the node cordoned");
    wait::until(&format!("{fail}'s repair continues"), DEADLINE, || async {
        let n = node_api.get(&fail).await?;
        Ok((nodes::compliance(&n).0 == "Repairing"
            && !notes(&client, &fail, "RepairStarted").await.is_empty())
        .then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; condition was {reason}: {message}"));
    assert!(nodes::cordoned(&node_api.get(&fail).await.unwrap()));

    // Never finishes: timed out, its Job deleted, the node stays cordoned.
    let job = drift_and_recover(&client, &hang, &ns.name, None).await;
    let job_name = job.metadata.name.clone().unwrap();
    let n = node_api.get(&hang).await.unwrap();
    assert_eq!(validation_label(&n).as_deref(), Some("running"));
    assert_eq!(nodes::compliance(&n).0, "Validating");
    let (reason, message) = wait::until(&format!("{hang}'s validation timed out"), DEADLINE, || async {
        let c = nodes::compliance(&node_api.get(&hang).await?);
        Ok((c.0 == "ValidationFailed").then_some(c))
    })
    .await
    .unwrap();
    assert_eq!(reason, "ValidationFailed");
    assert!(
        message.contains(&job_name) && message.contains("timed out"),
        "{message}"
    );
    let n = node_api.get(&hang).await.unwrap();
    assert!(nodes::cordoned(&n));
    assert_eq!(validation_label(&n).as_deref(), Some("failed"));
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    until_job_gone(&jobs, "the timed-out Job deleted", &job_name).await;

    // A person removes the record: validated again.
    node_api
        .patch(
            &hang,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"gpunode.dev/validation": null}}})),
        )
        .await
        .unwrap();
    wait::until(&format!("{hang} validated again"), DEADLINE, || async {
        let n = node_api.get(&hang).await?;
        Ok((validation_label(&n).as_deref() == Some("running")).then_some(()))
    })
    .await
    .unwrap();

    // The node goes away mid-validation (scaled down): its Job goes with it, through the
    // garbage collector (gpunode no longer sees the node).
    let label = format!("gpunode.dev/validation-node={hang}");
    let running = wait::until(&format!("{hang}'s new Job"), DEADLINE, || async {
        Ok(jobs
            .list(&ListParams::default().labels(&label))
            .await?
            .items
            .into_iter()
            .find(|j| j.metadata.deletion_timestamp.is_none())
            .and_then(|j| j.metadata.name))
    })
    .await
    .unwrap();
    node_api.delete(&hang, &DeleteParams::default()).await.unwrap();
    until_job_gone(&jobs, &format!("{running} collected with its node"), &running).await;

    operator.stop().await.unwrap();
}
