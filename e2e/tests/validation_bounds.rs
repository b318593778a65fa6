//! Validation templates within the chart's bounds (issue #43, item 4), on the real API server
//! with the real Job controller: a namespace granted by the chart's
//! `operator.validation.namespaces` as a bare name (no privileges, the chart's ServiceAccount
//! only) and three idle healthy nodes, each under a policy with periodic validation there:
//! - a plain template: its Job is made, with the chart's ServiceAccount set on its pod;
//! - a template with `hostPID: true`: the policy is Degraded (reason InvalidValidation) naming
//!   `spec.validation.template.spec.hostPID` and the chart value that would allow it, and no Job
//!   is made;
//! - a privileged container: the same, naming `...containers[0].securityContext.privileged`.
//!
//! (A separate test binary: one operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    chart,
    cluster::admin_client,
    crds, nodes,
    operator::InProcess,
    reports,
    scratch::{Scratch, rand_suffix},
    wait,
};
use k8s_openapi::api::batch::v1::Job;
use kube::{Api, api::ListParams};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(120);

fn report() -> Value {
    let mut r = reports::one_gpu("550.54.15", "boot-1", json!([]));
    r["gpus"][0]["uuid"] = json!("GPU-00000000-0000-0000-0000-000000000000");
    r["gpus"][0]["pods"] = json!([]);
    r
}

fn policy(node: &str, ns: &str, spec: Value) -> Value {
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
            "template": {"spec": spec},
        },
    })
}

fn container(security: Value) -> Value {
    json!({
        "name": "diag",
        "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        "command": ["dcgmi", "diag", "-r", "1"],
        "securityContext": security,
    })
}

/// The policy's Degraded condition: (status, reason, message).
async fn degraded(api: &Api<GpuNodePolicy>, name: &str) -> Option<(String, String, String)> {
    let p = api.get(name).await.ok()?;
    let c = p.status?.conditions.into_iter().find(|c| c.type_ == "Degraded")?;
    Some((c.status, c.reason, c.message))
}

#[tokio::test]
async fn a_template_beyond_the_charts_bounds_makes_no_job_and_degrades_its_policy_naming_the_field() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let ns = Scratch::new(&client, "bounds").await.unwrap();
    chart::grant_validation(&client, &ns.name).await.unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();

    let id = format!("{:06x}", rand_suffix());
    let (plain, host, privileged) = (
        format!("bounds-plain-{id}"),
        format!("bounds-host-{id}"),
        format!("bounds-priv-{id}"),
    );
    nodes::create(
        &client,
        &[plain.clone(), host.clone(), privileged.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    for (node, spec) in [
        (&plain, json!({"containers": [container(json!({}))]})),
        (
            &host,
            json!({"hostPID": true, "containers": [container(json!({}))]}),
        ),
        (
            &privileged,
            json!({"containers": [container(json!({"privileged": true}))]}),
        ),
    ] {
        reports::publish(&client, node, report()).await.unwrap();
        crds::create_policy(&client, node, policy(node, &ns.name, spec))
            .await
            .unwrap();
    }
    let operator = InProcess::start(&operator_client, "e2e-validation-bounds");
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let jobs_of = |node: &str| {
        let (jobs, label) = (jobs.clone(), format!("gpunode.dev/validation-node={node}"));
        async move {
            jobs.list(&ListParams::default().labels(&label))
                .await
                .unwrap()
                .items
        }
    };

    for (node, field, why) in [
        (
            &host,
            "spec.validation.template.spec.hostPID",
            "host namespaces are not allowed",
        ),
        (
            &privileged,
            "spec.validation.template.spec.containers[0].securityContext.privileged",
            "privileged containers are not allowed",
        ),
    ] {
        let (status, reason, message) =
            wait::until(&format!("{node}'s policy Degraded"), DEADLINE, || async {
                Ok(degraded(&policies, node).await.filter(|c| c.0 == "True"))
            })
            .await
            .unwrap();
        assert_eq!(reason, "InvalidValidation", "{message}");
        let want = format!(
            "{field}: {why} in namespace {} (chart value operator.validation.namespaces[]",
            ns.name
        );
        assert!(message.contains(&want), "{message:?} names {want:?}");
        assert_eq!(status, "True");
    }

    // The plain template's Job is made, with the chart's ServiceAccount, in the same passes
    // that refused the other two.
    let job = wait::until(&format!("{plain}'s validation Job"), DEADLINE, || async {
        Ok(jobs_of(&plain).await.into_iter().next())
    })
    .await
    .unwrap();
    let account = job
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.service_account_name);
    assert_eq!(account.as_deref(), Some("gpunode-validation"));
    // Its status follows within a second (an incremental pass writes a policy's status at most
    // once a second).
    wait::until(&format!("{plain}'s policy not Degraded"), DEADLINE, || async {
        Ok(degraded(&policies, &plain).await.filter(|c| c.0 == "False"))
    })
    .await
    .unwrap();
    for node in [&host, &privileged] {
        assert!(jobs_of(node).await.is_empty(), "no validation Job of {node}");
        let n = nodes::events(&client, node).await.unwrap();
        assert!(
            !n.iter().any(|e| e.reason.as_deref() == Some("Validating")),
            "{node} was not validated"
        );
    }
    operator.stop().await.unwrap();
}
