//! Periodic validation on the real API server, with the real Job controller and scheduler and
//! KWOK running the pods: two idle healthy nodes (their reports list no pod on their GPU), each
//! under a policy with `spec.validation.periodic`. Each is validated without being cordoned,
//! labelled `gpunode.dev/validation=running` meanwhile; the one whose pod completes stays in
//! service, the one whose pod fails drifts in class Validation and its policy's rule cordons it.
//! A node whose GPU holds a pod is never validated on its own.
//!
//! (A separate test binary: one operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_e2e::{
    chart,
    cluster::admin_client,
    crds, nodes,
    operator::InProcess,
    reports,
    scratch::{Scratch, rand_suffix},
    wait,
};
use k8s_openapi::api::{batch::v1::Job, core::v1::Node};
use kube::{Api, api::ListParams};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(120);

/// A healthy one-GPU report whose GPU's pods are listed (`pods`).
fn report(pods: Value) -> Value {
    let mut r = reports::one_gpu("550.54.15", "boot-1", json!([]));
    r["gpus"][0]["uuid"] = json!("GPU-00000000-0000-0000-0000-000000000000");
    r["gpus"][0]["pods"] = pods;
    r
}

fn policy(node: &str, ns: &str, outcome: Option<&str>) -> Value {
    let mut labels = json!({"app": "gpu-diag"});
    if let Some(o) = outcome {
        labels["gpunode.test/outcome"] = json!(o);
    }
    json!({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "gpu": {"driverVersion": ">=550"},
        "remediation": [{"classes": ["Validation"], "action": "Cordon"}],
        "disruption": {"maxUnavailable": 1, "circuitBreaker": {"maxDriftedPercent": 100}},
        "recovery": {"healthyFor": "2s"},
        "staleAfter": "5m",
        "validation": {
            "namespace": ns,
            "timeout": "60s",
            "periodic": {"every": "1h", "maxPerHour": 1},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": "diag",
                    "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
                    "command": ["dcgmi", "diag", "-r", "1"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }]},
            },
        },
    })
}

#[tokio::test]
async fn idle_nodes_are_validated_in_service_and_a_failure_is_a_drift_the_rules_act_on() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let ns = Scratch::new(&client, "periodic").await.unwrap();
    chart::grant_validation(&client, &ns.name).await.unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();

    let id = format!("{:06x}", rand_suffix());
    let (good, bad, busy) = (
        format!("periodic-good-{id}"),
        format!("periodic-bad-{id}"),
        format!("periodic-busy-{id}"),
    );
    nodes::create(
        &client,
        &[good.clone(), bad.clone(), busy.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    for n in [&good, &bad] {
        reports::publish(&client, n, report(json!([]))).await.unwrap();
    }
    reports::publish(
        &client,
        &busy,
        report(json!([{"namespace": "ml", "name": "trainer-0"}])),
    )
    .await
    .unwrap();
    for (node, outcome) in [(&good, None), (&bad, Some("Fail")), (&busy, None)] {
        crds::create_policy(&client, node, policy(node, &ns.name, outcome))
            .await
            .unwrap();
    }
    let operator = InProcess::start(&operator_client, "e2e-validation-periodic");
    let node_api: Api<Node> = Api::all(client.clone());
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let job_of = |node: &str| {
        let (jobs, label) = (jobs.clone(), format!("gpunode.dev/validation-node={node}"));
        async move {
            Ok::<_, gpunode_e2e::Error>(
                jobs.list(&ListParams::default().labels(&label))
                    .await?
                    .items
                    .into_iter()
                    .next(),
            )
        }
    };

    // The idle node is validated in service: never cordoned, and its Job completes.
    let job = wait::until(&format!("{good}'s periodic validation Job"), DEADLINE, || {
        job_of(&good)
    })
    .await
    .unwrap();
    let name = job.metadata.name.clone().unwrap();
    wait::until(&format!("{good}'s Job passed"), DEADLINE, || async {
        let n = node_api.get(&good).await?;
        assert!(!nodes::cordoned(&n), "a periodic validation does not cordon");
        let c = nodes::compliance(&n);
        Ok((c.0 == "Compliant" && nodes::label(&n, "gpunode.dev/validation").is_none()).then_some(()))
    })
    .await
    .unwrap();
    let j = jobs.get(&name).await.unwrap();
    let complete = j
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Complete" && c.status == "True");
    assert!(
        complete,
        "the node returned to plain Compliant once its Job completed"
    );
    let annotation = node_api
        .get(&good)
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default();
    assert!(
        annotation
            .get("gpunode.dev/validation")
            .is_some_and(|v| v.contains(&name) && v.contains("\"periodic\":true") && v.contains("Passed")),
        "the record says when it was validated: {annotation:?}"
    );

    // The failing one drifts in Validation, and its policy's rule cordons it.
    let n = wait::until(
        &format!("{bad} cordoned for its failed validation"),
        DEADLINE,
        || async {
            let n = node_api.get(&bad).await?;
            Ok(nodes::cordoned(&n).then_some(n))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        nodes::label(&n, "gpunode.dev/drift.validation").as_deref(),
        Some("true")
    );
    assert_eq!(
        nodes::label(&n, "gpunode.dev/validation").as_deref(),
        Some("failed")
    );
    let (reason, message) = nodes::compliance(&n);
    assert_eq!(reason, "ValidationFailed");
    assert!(message.contains("BackoffLimitExceeded"), "{message}");

    // The busy node: its GPU holds a pod, so no Job was ever made for it.
    assert!(
        job_of(&busy).await.unwrap().is_none(),
        "a busy node is not validated"
    );

    operator.stop().await.unwrap();
}
