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
//! Then what the fence costs everyone else: with no Lease and etcd stopped, a write of one of
//! the operator's kinds (by the admin) is refused because the Lease cannot be resolved, a
//! ConfigMap write is not (it fails as etcd makes it fail); after a kube-apiserver restart, the
//! refusals of the operator's kinds until its Lease informer synced are counted and printed.
//!
//! It runs on the reliability suite's control plane (the one with an audit log). The chart is
//! rendered as its own release in its own namespace, so the policy fences only this test's
//! ServiceAccount, never the operators other tests run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{cell::Cell, time::Duration};

use gpunode_e2e::{
    accounts, chart, crds,
    faults::{
        cluster::{FaultCluster, Restore},
        late::{self, Targets},
    },
    remediator, wait,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Pod},
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
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
const NOT_HOLDER: &str = late::NOT_HOLDER;
/// Part of the fence's message for a token without a pod.
const NO_POD: &str = "this token names no pod";
const DEADLINE: Duration = Duration::from_secs(60);
/// The fence's policy and binding (the release's operator fullname).
const FENCE: &str = "fence-gpunode-operator-leader-fence";

/// What this test's writes are aimed at.
fn targets() -> Targets {
    Targets {
        node: NODE.to_string(),
        namespace: JOBS.to_string(),
        events: "default".to_string(),
        pod: "fence-pod".to_string(),
        policy: POLICY.to_string(),
        prefix: "fence".to_string(),
    }
}

async fn every_write(client: &Client, dry: bool) -> late::Outcomes {
    late::every_write(client, &targets(), dry).await.unwrap()
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
        Ok(late::unexpected(&outcomes, refused).is_empty().then_some(()))
    })
    .await;
    match r {
        Ok(()) => Vec::new(),
        Err(_) => late::unexpected(&every_write(client, true).await, refused),
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
    late::api(
        admin,
        ("gpunode.dev", "v1alpha1", "GpuNodePolicy"),
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
    let a = apply_pod(admin, NS, "fence-a", SA).await;
    let b = apply_pod(admin, NS, "fence-b", SA).await;
    apply_pod(admin, JOBS, "fence-pod", "default").await;
    let pods = [a, b];
    let a = accounts::client_for(admin, NS, SA, Some(&pods[0])).await.unwrap();
    let b = accounts::client_for(admin, NS, SA, Some(&pods[1])).await.unwrap();
    let unbound = accounts::client_for(admin, NS, SA, None).await.unwrap();
    (a, b, unbound)
}

/// Creates (or keeps) pod `ns/name` of ServiceAccount `sa`.
async fn apply_pod(admin: &Client, ns: &str, name: &str, sa: &str) -> Pod {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"serviceAccountName": sa, "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "gpunode/operator"}]}});
    Api::<Pod>::namespaced(admin.clone(), ns)
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
    let gone = late::created(admin, &targets());
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
    apply_pod(admin, JOBS, "fence-pod", "default").await;
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
            let user = format!("system:serviceaccount:{NS}:{SA}");
            let w = late::witnessed(&fc.audit()?, |e| e.user == user && e.pod == pod, since);
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
    let not_refused = late::unexpected(&late, Some(NOT_HOLDER));
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
    let refused = late::unexpected(&now, None);
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

    // What the fence costs everyone else while the API server cannot resolve the Lease.
    etcd_down_without_a_lease(&fc, &admin).await;
    hold(&admin, "fence-b").await;
    apiserver_restart(&fc, &admin).await;
    // The fence stays, its Lease held: deleting its binding would stop the API server's Lease
    // informer for good (kubernetes/kubernetes#130887: the last binding of a built-in paramKind
    // gone, a binding made later reuses the stopped informer and judges by the Lease as it was),
    // and the next run here would be judged by a stale Lease. Left in place it costs the later
    // tests on this control plane nothing: it matches only this release's account, and the
    // Lease it resolves for them is in the API server's cache, whatever etcd does.
}

/// An admin client that gives up after 5 s (with etcd down a write otherwise waits out the API
/// server's own timeout).
async fn impatient(fc: &FaultCluster) -> Client {
    let mut config = fc.config().await.unwrap();
    config.read_timeout = Some(Duration::from_secs(5));
    config.write_timeout = Some(Duration::from_secs(5));
    Client::try_from(config).unwrap()
}

/// A write of one of the fence's kinds by the admin: an Event about the node, a dry run (a
/// create: admission runs before anything is read from storage).
async fn fenced_kind(client: &Client) -> Result<(), kube::Error> {
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "fence-admin-event", "namespace": "default"},
        "eventTime": "2026-12-06T00:00:00.000000Z", "reportingController": "gpunode.dev/e2e",
        "reportingInstance": "admin", "action": "Probe", "reason": "Probed", "type": "Normal",
        "regarding": {"kind": "Node", "name": NODE, "apiVersion": "v1"}});
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let api = late::api(
        client,
        ("events.k8s.io", "v1", "Event"),
        "events",
        Some("default"),
    );
    let event: kube::api::DynamicObject = serde_json::from_value(event).unwrap();
    api.create(&params, &event).await.map(drop)
}

/// A write of a kind the operator never makes: a ConfigMap, a dry run.
async fn other_kind(client: &Client) -> Result<(), kube::Error> {
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "fence-other"}})).unwrap();
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .create(&params, &cm)
        .await
        .map(drop)
}

/// Whether `r` is a refusal by this fence's policy (any reason: the holder check, 403, or an
/// unresolved Lease, which the API server answers 422 Invalid), as opposed to an outage's error
/// or another plugin's refusal.
fn by_the_fence(r: &Result<(), kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.message.contains(FENCE))
}

/// Whether `r` is the fence's refusal for a Lease the API server could not resolve.
fn unresolved(r: &Result<(), kube::Error>) -> bool {
    by_the_fence(r)
        && matches!(r, Err(kube::Error::Api(s)) if s.message.contains("failed to configure binding"))
}

/// No Lease (nobody has led yet) and etcd stopped: the API server cannot fetch the Lease (it
/// falls back to a read of etcd when its cache has none, with a second to answer), so the
/// fence refuses the writes it matches, everyone's. It matches only the operator's kinds: a
/// ConfigMap write fails as etcd makes it fail, not with the fence's 403 (with every resource
/// matched, as before, it did: the denial of reliability_faults' PDB write in CI).
async fn etcd_down_without_a_lease(fc: &FaultCluster, admin: &Client) {
    let client = impatient(fc).await;
    let guard = Restore::new(fc, "etcd", "start");
    fc.ctl("stop", "etcd").await.unwrap();
    let other = other_kind(&client).await;
    let fenced = fenced_kind(&client).await;
    fc.ctl("start", "etcd").await.unwrap();
    guard.done();
    wait::until("the API server to read from etcd again", DEADLINE, || async {
        Ok(Api::<Node>::all(admin.clone()).get_opt(NODE).await.ok().map(drop))
    })
    .await
    .unwrap();
    println!("etcd down, no Lease: a ConfigMap write: {other:?}; an Event write: {fenced:?}");
    assert!(other.is_err(), "a write with etcd down succeeded: {other:?}");
    assert!(
        !by_the_fence(&other),
        "the fence refused a kind the operator never writes: {other:?}"
    );
    assert!(
        unresolved(&fenced),
        "an Event write with etcd down and no Lease: {fenced:?}"
    );
}

/// A kube-apiserver restarting, the Lease held: from its first answer, how long it refuses the
/// fence's kinds to everyone because its Lease informer has not synced yet (measured, printed;
/// docs/reliability.md quotes it), and never a kind the operator does not write.
async fn apiserver_restart(fc: &FaultCluster, admin: &Client) {
    let admitted = settle(admin, None, "the admin's writes to be admitted").await;
    assert!(admitted.is_empty(), "before the restart: {admitted:?}");
    let guard = Restore::new(fc, "kube-apiserver", "start");
    fc.ctl("stop", "kube-apiserver").await.unwrap();
    fc.ctl("start", "kube-apiserver").await.unwrap();
    guard.done();
    let client = impatient(fc).await;
    let (first, refused, others, answered) = (Cell::new(None), Cell::new(0), Cell::new(0), Cell::new(0));
    wait::until("an Event write admitted after the restart", DEADLINE, || async {
        let (fenced, other) = (fenced_kind(&client).await, other_kind(&client).await);
        if matches!(fenced, Err(kube::Error::Api(_)) | Ok(())) {
            first.set(first.get().or(Some(std::time::Instant::now())));
            answered.set(answered.get() + 1);
        }
        refused.set(refused.get() + usize::from(by_the_fence(&fenced)));
        others.set(others.get() + usize::from(by_the_fence(&other)));
        Ok(fenced.is_ok().then_some(()))
    })
    .await
    .unwrap();
    let window = first.get().map(|t| t.elapsed()).unwrap_or_default();
    println!(
        "kube-apiserver restarted: {} of {} answered Event writes refused by the fence over {} ms from its first answer; ConfigMap writes refused by it: {}",
        refused.get(),
        answered.get(),
        window.as_millis(),
        others.get()
    );
    assert_eq!(
        others.get(),
        0,
        "the fence refused ConfigMap writes after the restart"
    );
    fc.wait_api(admin, DEADLINE).await.unwrap();
}
