//! The leader fence on the real API server (charts/gpunode/templates/leader-fence.yaml): every
//! kind of write the operator makes — node labels and annotations, node status, evictions,
//! DeviceTaintRules, GpuResetRequests, remediation objects, Jobs, Events, policy status — is
//! refused to a replica of its ServiceAccount that does not hold the leader Lease, and to a token
//! that names no pod; once the Lease changes hands, the old holder is refused and the new one
//! admitted. Those probes are dry runs: admission runs on them, nothing is stored.
//!
//! Then the deposed replica writes every kind for real, after the takeover, and the API server's
//! audit log is the witness: each kind attempted by its pod after the new holder acquired the
//! Lease, each answered 403, none stored; the new holder's same writes are stored (the witness
//! sees a commit when there is one).
//!
//! It runs on the reliability suite's control plane (the one with an audit log). The chart is
//! rendered as its own release in its own namespace, so the policy fences only this test's
//! ServiceAccount, never the operators other tests run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_e2e::{
    accounts, audit::AuditEvent, chart, crds, faults::cluster::FaultCluster, remediator, wait,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, Patch, PatchParams,
        PostParams,
    },
};
use serde_json::json;

const NS: &str = "gpunode-fence";
const JOBS: &str = "gpunode-fence-jobs";
const RELEASE: &str = "fence";
const SA: &str = "fence-gpunode-operator";
/// operator/src/leader.rs DEFAULT_LEASE_NAME.
const LEASE: &str = "gpunode-operator";
const NODE: &str = "fence-node";
const POLICY: &str = "fence-policy";
/// Part of the fence's message for a replica that does not hold the Lease.
const NOT_HOLDER: &str = "does not hold the leader Lease";
/// Part of the fence's message for a token without a pod.
const NO_POD: &str = "this token names no pod";
const DEADLINE: Duration = Duration::from_secs(60);

/// Each kind of write [`every_write`] makes, in its order, as the audit log names it: (what,
/// verb, resource, subresource).
const KINDS: [(&str, &str, &str, &str); 9] = [
    ("node labels and annotations", "patch", "nodes", ""),
    ("node status", "patch", "nodes", "status"),
    ("eviction", "create", "pods", "eviction"),
    ("DeviceTaintRule", "create", "devicetaintrules", ""),
    ("GpuResetRequest", "create", "gpuresetrequests", ""),
    ("remediation object", "create", "fakereboots", ""),
    ("Job", "create", "jobs", ""),
    ("Event", "create", "events", ""),
    ("policy status", "patch", "gpunodepolicies", "status"),
];

fn post(dry_run: bool) -> PostParams {
    PostParams {
        dry_run,
        ..PostParams::default()
    }
}

fn patch(dry_run: bool) -> PatchParams {
    PatchParams {
        dry_run,
        ..PatchParams::default()
    }
}

fn api(
    client: &Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn object(value: serde_json::Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// Every kind of write the operator makes, as `client` (dry runs when `dry`): (what, the
/// outcome), in the order of [`KINDS`].
async fn every_write(client: &Client, dry: bool) -> Vec<(&'static str, Result<(), kube::Error>)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let label = json!({"metadata": {"labels": {"gpunode.dev/state": "drifted"},
        "annotations": {"gpunode.dev/actions": "cordon"}}});
    let status = json!({"status": {"conditions": [{"type": "GpuPolicyCompliant", "status": "False",
        "reason": "Drifted", "message": "fence test", "lastHeartbeatTime": null,
        "lastTransitionTime": jiff::Timestamp::now().to_string()}]}});
    let evict = EvictParams {
        delete_options: Some(DeleteParams {
            dry_run: dry,
            ..DeleteParams::default()
        }),
        post_options: post(dry),
    };
    let rule = object(
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
        "metadata": {"name": "fence-gpu-0"},
        "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-0"},
            "taint": {"key": "gpunode.dev/drift", "value": POLICY, "effect": "NoSchedule"}}}),
    );
    let reset = object(
        json!({"apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuResetRequest",
        "metadata": {"name": format!("{NODE}-gpu-0")},
        "spec": {"nodeName": NODE, "index": 0, "uuid": "GPU-0000"}}),
    );
    let reboot = object(
        json!({"apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
        "kind": "FakeReboot", "metadata": {"name": NODE, "namespace": JOBS},
        "spec": {"behavior": "Succeed"}}),
    );
    let job = object(json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "fence-validate", "namespace": JOBS},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "check", "image": "busybox"}]}}}}));
    let event = object(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "fence-event", "namespace": "default"},
        "eventTime": "2026-12-06T00:00:00.000000Z", "reportingController": "gpunode.dev/operator",
        "reportingInstance": "fence", "action": "Cordon", "reason": "Cordoned", "type": "Normal",
        "regarding": {"kind": "Node", "name": NODE, "apiVersion": "v1"}}));
    let policy_status = json!({"status": {"matched": 1}});
    let mut out = Vec::new();
    let ok = |r: Result<DynamicObject, kube::Error>| r.map(|_| ());
    out.push((
        "node labels and annotations",
        nodes
            .patch(NODE, &patch(dry), &Patch::Merge(&label))
            .await
            .map(|_| ()),
    ));
    out.push((
        "node status",
        nodes
            .patch_status(NODE, &patch(dry), &Patch::Merge(&status))
            .await
            .map(|_| ()),
    ));
    out.push((
        "eviction",
        Api::<Pod>::namespaced(client.clone(), NS)
            .evict("fence-pod", &evict)
            .await
            .map(|_| ()),
    ));
    out.push((
        "DeviceTaintRule",
        ok(api(
            client,
            "resource.k8s.io",
            "v1",
            "DeviceTaintRule",
            "devicetaintrules",
            None,
        )
        .create(&post(dry), &rule)
        .await),
    ));
    out.push((
        "GpuResetRequest",
        ok(api(
            client,
            "gpunode.dev",
            "v1alpha1",
            "GpuResetRequest",
            "gpuresetrequests",
            None,
        )
        .create(&post(dry), &reset)
        .await),
    ));
    out.push((
        "remediation object",
        ok(
            Api::<DynamicObject>::namespaced_with(client.clone(), JOBS, &remediator::reboot_resource())
                .create(&post(dry), &reboot)
                .await,
        ),
    ));
    out.push((
        "Job",
        ok(api(client, "batch", "v1", "Job", "jobs", Some(JOBS))
            .create(&post(dry), &job)
            .await),
    ));
    out.push((
        "Event",
        ok(
            api(client, "events.k8s.io", "v1", "Event", "events", Some("default"))
                .create(&post(dry), &event)
                .await,
        ),
    ));
    out.push((
        "policy status",
        ok(api(
            client,
            "gpunode.dev",
            "v1alpha1",
            "GpuNodePolicy",
            "gpunodepolicies",
            None,
        )
        .patch_status(POLICY, &patch(dry), &Patch::Merge(&policy_status))
        .await),
    ));
    out
}

fn refused_with(r: &Result<(), kube::Error>, message: &str) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(message))
}

/// The writes whose outcome is not `expected` (admitted, or refused by the fence with `message`).
fn unexpected(outcomes: &[(&str, Result<(), kube::Error>)], refused: Option<&str>) -> Vec<String> {
    outcomes
        .iter()
        .filter(|(_, r)| match refused {
            Some(m) => !refused_with(r, m),
            None => r.is_err(),
        })
        .map(|(what, r)| format!("{what}: {r:?}"))
        .collect()
}

async fn hold(admin: &Client, holder: &str) {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": NS},
        "spec": {"holderIdentity": (!holder.is_empty()).then_some(holder), "leaseDurationSeconds": 15,
            "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}});
    leases
        .patch(
            LEASE,
            &PatchParams::apply("gpunode-e2e").force(),
            &Patch::Apply(&lease),
        )
        .await
        .unwrap();
}

/// Waits until `client`'s writes turn out as `refused` says (the policy and RBAC take effect
/// asynchronously), and returns the last outcome's mismatches (empty on success).
async fn settle(client: &Client, refused: Option<&'static str>, what: &str) -> Vec<String> {
    let r = wait::until(what, DEADLINE, || async {
        let outcomes = every_write(client, true).await;
        Ok(unexpected(&outcomes, refused).is_empty().then_some(()))
    })
    .await;
    match r {
        Ok(()) => Vec::new(),
        Err(_) => unexpected(&every_write(client, true).await, refused),
    }
}

async fn setup(admin: &Client) -> (Client, Client, Client) {
    crds::install(admin).await.unwrap();
    remediator::install(admin).await.unwrap();
    for ns in [NS, JOBS] {
        chart::ensure_namespace(admin, ns).await.unwrap();
    }
    let remediators = format!(
        "operator.remediators=[{{\"apiGroup\":\"{}\",\"resources\":[\"fakereboots\"],\"templates\":[\"fakereboottemplates\"]}}]",
        remediator::GROUP
    );
    let objects = chart::template(
        admin,
        RELEASE,
        NS,
        &[
            "--show-only",
            "templates/serviceaccounts.yaml",
            "--show-only",
            "templates/rbac-operator.yaml",
            "--show-only",
            "templates/leader-fence.yaml",
            "--set-json",
            &remediators,
            "--set",
            &format!("operator.validation.namespaces={{{JOBS}}}"),
        ],
    )
    .await
    .unwrap();
    assert!(
        objects.iter().any(|o| o
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "ValidatingAdmissionPolicy")),
        "the chart renders the fence by default"
    );
    chart::apply(admin, &objects, NS, false).await.unwrap();
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}});
    Api::<Node>::all(admin.clone())
        .patch(
            NODE,
            &PatchParams::apply("gpunode-e2e").force(),
            &Patch::Apply(&node),
        )
        .await
        .unwrap();
    let policy = json!({"apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodePolicy",
        "metadata": {"name": POLICY},
        "spec": {"nodeSelector": {"matchLabels": {"gpunode.dev/fence": "true"}}}});
    api(
        admin,
        "gpunode.dev",
        "v1alpha1",
        "GpuNodePolicy",
        "gpunodepolicies",
        None,
    )
    .patch(
        POLICY,
        &PatchParams::apply("gpunode-e2e").force(),
        &Patch::Apply(&policy),
    )
    .await
    .unwrap();
    let a = apply_pod(admin, "fence-a", SA).await;
    let b = apply_pod(admin, "fence-b", SA).await;
    apply_pod(admin, "fence-pod", "default").await;
    let pods = [a, b];
    let a = accounts::client_for(admin, NS, SA, Some(&pods[0])).await.unwrap();
    let b = accounts::client_for(admin, NS, SA, Some(&pods[1])).await.unwrap();
    let unbound = accounts::client_for(admin, NS, SA, None).await.unwrap();
    (a, b, unbound)
}

/// Creates (or keeps) pod `name` of ServiceAccount `sa` in the fence's namespace.
async fn apply_pod(admin: &Client, name: &str, sa: &str) -> Pod {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {"serviceAccountName": sa, "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "gpunode/operator"}]}});
    Api::<Pod>::namespaced(admin.clone(), NS)
        .patch(
            name,
            &PatchParams::apply("gpunode-e2e").force(),
            &Patch::Apply(&pod),
        )
        .await
        .unwrap()
}

/// Deletes what the real writes create (a leftover would make a create conflict) and puts back
/// the pod an eviction deletes.
async fn reset_objects(admin: &Client) {
    let gone = [
        (
            api(
                admin,
                "resource.k8s.io",
                "v1",
                "DeviceTaintRule",
                "devicetaintrules",
                None,
            ),
            "fence-gpu-0".to_string(),
        ),
        (
            api(
                admin,
                "gpunode.dev",
                "v1alpha1",
                "GpuResetRequest",
                "gpuresetrequests",
                None,
            ),
            format!("{NODE}-gpu-0"),
        ),
        (
            Api::namespaced_with(admin.clone(), JOBS, &remediator::reboot_resource()),
            NODE.to_string(),
        ),
        (
            api(admin, "batch", "v1", "Job", "jobs", Some(JOBS)),
            "fence-validate".to_string(),
        ),
        (
            api(admin, "events.k8s.io", "v1", "Event", "events", Some("default")),
            "fence-event".to_string(),
        ),
    ];
    for (api, name) in &gone {
        let _ = api.delete(name, &DeleteParams::background()).await;
    }
    wait::until("the written objects gone", DEADLINE, || async {
        for (api, name) in &gone {
            if api.get_opt(name).await?.is_some() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
    .unwrap();
    apply_pod(admin, "fence-pod", "default").await;
}

/// What the audit log recorded of pod `pod`'s real writes (not dry runs) of each kind since
/// `since`: (what, attempted, stored).
fn witnessed(events: &[AuditEvent], pod: &str, since: jiff::Timestamp) -> Vec<(&'static str, usize, usize)> {
    let user = format!("system:serviceaccount:{NS}:{SA}");
    KINDS
        .iter()
        .map(|(what, verb, resource, sub)| {
            let of_kind: Vec<&AuditEvent> = events
                .iter()
                .filter(|e| e.user == user && e.pod == pod && e.at >= since && !e.dry_run)
                .filter(|e| e.verb == *verb && e.resource == *resource && e.subresource == *sub)
                .collect();
            (
                *what,
                of_kind.len(),
                of_kind.iter().filter(|e| e.committed()).count(),
            )
        })
        .collect()
}

/// Waits until the audit log shows every kind of write by `pod` since `since`, and returns it.
async fn until_witnessed(
    fc: &FaultCluster,
    pod: &str,
    since: jiff::Timestamp,
) -> Vec<(&'static str, usize, usize)> {
    wait::until(
        &format!("the audit log to record {pod}'s writes"),
        DEADLINE,
        || async {
            let w = witnessed(&fc.audit()?, pod, since);
            Ok(w.iter().all(|(_, attempted, _)| *attempted > 0).then_some(w))
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn only_the_replica_holding_the_lease_may_write_and_a_takeover_fences_the_old_one() {
    let (fc, admin) = FaultCluster::up().await.unwrap();
    let (a, b, unbound) = setup(&admin).await;
    reset_objects(&admin).await;
    hold(&admin, "fence-a").await;
    let admitted = settle(&a, None, "the holder's writes to be admitted").await;
    assert!(
        admitted.is_empty(),
        "the holder fence-a was refused: {admitted:?}"
    );
    let refused = settle(&b, Some(NOT_HOLDER), "the follower's writes to be refused").await;
    assert!(
        refused.is_empty(),
        "fence-b does not hold the Lease, yet: {refused:?}"
    );
    let no_pod = settle(&unbound, Some(NO_POD), "a token without a pod to be refused").await;
    assert!(no_pod.is_empty(), "a token naming no pod, yet: {no_pod:?}");

    // fence-b takes the Lease over: from then on fence-a is the one refused.
    let took_over = jiff::Timestamp::now();
    hold(&admin, "fence-b").await;
    let refused = settle(&a, Some(NOT_HOLDER), "the old holder's writes to be refused").await;
    assert!(refused.is_empty(), "fence-a lost the Lease, yet: {refused:?}");
    let admitted = settle(&b, None, "the new holder's writes to be admitted").await;
    assert!(
        admitted.is_empty(),
        "the new holder fence-b was refused: {admitted:?}"
    );

    // fence-a, deposed, writes every kind for real. The audit log is the witness: each kind
    // attempted after the takeover, each refused, nothing stored.
    let late = every_write(&a, false).await;
    let not_refused = unexpected(&late, Some(NOT_HOLDER));
    assert!(not_refused.is_empty(), "fence-a's late writes: {not_refused:?}");
    for (what, attempted, stored) in until_witnessed(&fc, "fence-a", took_over).await {
        println!("late {what}: {attempted} attempted, {stored} stored (audit log)");
        assert_eq!(stored, 0, "fence-a's late {what} was stored");
    }
    let stored: Vec<String> = fc
        .audit()
        .unwrap()
        .iter()
        .filter(|e| e.pod == "fence-a" && e.at >= took_over && e.committed())
        .map(|e| format!("{} {}/{} {}", e.verb, e.resource, e.subresource, e.name))
        .collect();
    assert!(
        stored.is_empty(),
        "writes of fence-a stored after the takeover: {stored:?}"
    );
    // The new holder's same writes are stored, and the witness sees them.
    let now = every_write(&b, false).await;
    let refused = unexpected(&now, None);
    assert!(refused.is_empty(), "the holder's real writes: {refused:?}");
    for (what, _, stored) in until_witnessed(&fc, "fence-b", took_over).await {
        assert!(stored > 0, "the audit log shows no stored {what} of the holder");
    }
    reset_objects(&admin).await;

    // The Lease released (held by nobody): nobody writes.
    hold(&admin, "").await;
    let refused = settle(
        &b,
        Some("(held by nobody)"),
        "writes while nobody holds the Lease to be refused",
    )
    .await;
    assert!(refused.is_empty(), "nobody holds the Lease, yet: {refused:?}");

    // The Lease deleted: the fence stands aside rather than refuse every user's writes (the
    // API server resolves the parameter before the policy's matchConditions).
    Api::<Lease>::namespaced(admin.clone(), NS)
        .delete(LEASE, &DeleteParams::default())
        .await
        .unwrap();
    let admitted = settle(&admin, None, "everyone's writes to be admitted without a Lease").await;
    assert!(
        admitted.is_empty(),
        "without a Lease the admin was refused: {admitted:?}"
    );
}
