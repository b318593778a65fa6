//! The chart's least privilege on the real API server: what each ServiceAccount may and may not
//! do (SubjectAccessReview, as `kubectl auth can-i --as` asks), and the admission policies that
//! let a probe write only its own node's GpuNodeReport and heartbeat Lease.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpunode_crds::{
    GpuNodeReport,
    heartbeat::{self, LEASE_LABEL, LEASE_LABEL_VALUE, lease_name, lease_node},
};
use gpunode_e2e::{
    accounts,
    chart::{
        self, Accounts, LEASE_HOLDER_MESSAGE, LEASE_NO_NODE_MESSAGE, LEASE_OTHER_NODE_MESSAGE,
        NO_NODE_MESSAGE, OTHER_NODE_MESSAGE,
    },
    cluster::admin_client,
    nodes,
    scratch::rand_suffix,
};
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Node},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams},
};
use serde_json::json;

/// One row of the matrix: `verb` on `resource` (`[group/]resource[/subresource]`), optionally in
/// a namespace and on a named object.
struct Ask {
    verb: &'static str,
    resource: &'static str,
    namespace: Option<&'static str>,
    name: Option<&'static str>,
}

const fn ask(verb: &'static str, resource: &'static str) -> Ask {
    Ask {
        verb,
        resource,
        namespace: None,
        name: None,
    }
}

const fn ask_in(verb: &'static str, resource: &'static str, namespace: &'static str) -> Ask {
    Ask {
        verb,
        resource,
        namespace: Some(namespace),
        name: None,
    }
}

const fn ask_named(
    verb: &'static str,
    resource: &'static str,
    namespace: &'static str,
    name: &'static str,
) -> Ask {
    Ask {
        verb,
        resource,
        namespace: Some(namespace),
        name: Some(name),
    }
}

/// Asks every row for `user` and returns the rows whose answer differs from `expected`.
async fn mismatches(admin: &Client, user: &str, rows: &[Ask], expected: bool) -> Vec<String> {
    let mut wrong = Vec::new();
    for a in rows {
        let allowed = chart::can_i(admin, user, a.verb, a.resource, a.namespace, a.name)
            .await
            .unwrap();
        if allowed != expected {
            wrong.push(format!(
                "{} {} {}{} -> {}",
                a.verb,
                a.resource,
                a.namespace.map(|n| format!("-n {n} ")).unwrap_or_default(),
                a.name.unwrap_or(""),
                if allowed { "allowed" } else { "denied" }
            ));
        }
    }
    wrong
}

const NS: &str = chart::NAMESPACE;

#[tokio::test]
async fn each_service_account_may_do_exactly_what_its_binary_needs() {
    let admin = admin_client().await.unwrap();
    let acc: Accounts = chart::install_accounts(&admin).await.unwrap();

    // Every call gpunode-operator makes (operator/src/{controller,apply,leader}.rs).
    let operator_allowed = [
        ask("get", "nodes"),
        ask("list", "nodes"),
        ask("watch", "nodes"),
        ask("patch", "nodes"),
        ask("patch", "nodes/status"),
        ask("list", "pods"),
        ask_in("create", "pods/eviction", "workloads"),
        ask("list", "gpunode.dev/gpunodepolicies"),
        ask("watch", "gpunode.dev/gpunodepolicies"),
        ask("patch", "gpunode.dev/gpunodepolicies"),
        ask("patch", "gpunode.dev/gpunodepolicies/status"),
        ask("list", "gpunode.dev/gpunodereports"),
        ask("watch", "gpunode.dev/gpunodereports"),
        ask_in("create", "coordination.k8s.io/leases", NS),
        ask_named("get", "coordination.k8s.io/leases", NS, "gpunode-operator"),
        ask_named("update", "coordination.k8s.io/leases", NS, "gpunode-operator"),
        // The probes' heartbeat Leases.
        ask_in("list", "coordination.k8s.io/leases", NS),
        ask_in("watch", "coordination.k8s.io/leases", NS),
        ask_in("create", "events.k8s.io/events", "default"),
        ask_in("patch", "events.k8s.io/events", "default"),
    ];
    let operator_denied = [
        ask("get", "secrets"),
        ask("list", "secrets"),
        ask_in("get", "secrets", NS),
        ask_in("create", "pods/exec", "workloads"),
        ask("delete", "pods"),
        ask("delete", "nodes"),
        ask("create", "nodes"),
        ask("update", "nodes"),
        ask("create", "gpunode.dev/gpunodepolicies"),
        ask("delete", "gpunode.dev/gpunodepolicies"),
        ask("update", "gpunode.dev/gpunodepolicies"),
        ask("create", "gpunode.dev/gpunodereports"),
        ask("patch", "gpunode.dev/gpunodereports"),
        ask("delete", "gpunode.dev/gpunodereports"),
        ask("patch", "gpunode.dev/gpunodereports/status"),
        ask_named("get", "coordination.k8s.io/leases", NS, "someone-elses-lease"),
        ask_named("delete", "coordination.k8s.io/leases", NS, "gpunode-operator"),
        ask_in("create", "coordination.k8s.io/leases", "kube-system"),
        ask_in("list", "coordination.k8s.io/leases", "kube-system"),
        ask_in("watch", "coordination.k8s.io/leases", "kube-system"),
        ask("list", "coordination.k8s.io/leases"),
        // Reads the probes' heartbeats, never writes them.
        ask_in("patch", "coordination.k8s.io/leases", NS),
        ask_named("update", "coordination.k8s.io/leases", NS, "gpunode-probe-node-a"),
        ask_in("create", "events.k8s.io/events", "kube-system"),
        ask("create", "serviceaccounts/token"),
        ask("escalate", "rbac.authorization.k8s.io/clusterroles"),
        ask("create", "rbac.authorization.k8s.io/clusterrolebindings"),
        ask(
            "patch",
            "admissionregistration.k8s.io/validatingadmissionpolicies",
        ),
    ];
    // Every call gpunode-probe makes (node-probe/src/publish/kube_sink.rs, policies.rs).
    let probe_allowed = [
        ask("create", "gpunode.dev/gpunodereports"),
        // The read-only policy watch the publish decision runs the operator's checks on.
        ask("get", "gpunode.dev/gpunodepolicies"),
        ask("list", "gpunode.dev/gpunodepolicies"),
        ask("watch", "gpunode.dev/gpunodepolicies"),
        ask("patch", "gpunode.dev/gpunodereports"),
        ask("patch", "gpunode.dev/gpunodereports/status"),
        ask("get", "nodes"),
        // Its heartbeat Lease, by server-side apply (which creates it the first time).
        ask_in("create", "coordination.k8s.io/leases", NS),
        ask_in("patch", "coordination.k8s.io/leases", NS),
        ask_named("patch", "coordination.k8s.io/leases", NS, "gpunode-probe-node-a"),
    ];
    let probe_denied = [
        ask("get", "secrets"),
        ask("list", "secrets"),
        ask_in("get", "secrets", NS),
        ask_in("create", "pods/exec", NS),
        ask("list", "pods"),
        ask("list", "nodes"),
        ask("watch", "nodes"),
        ask("patch", "nodes"),
        ask("patch", "nodes/status"),
        ask("update", "nodes"),
        ask("delete", "nodes"),
        ask("list", "gpunode.dev/gpunodereports"),
        ask("watch", "gpunode.dev/gpunodereports"),
        ask("delete", "gpunode.dev/gpunodereports"),
        ask("deletecollection", "gpunode.dev/gpunodereports"),
        ask("create", "gpunode.dev/gpunodepolicies"),
        ask("patch", "gpunode.dev/gpunodepolicies"),
        ask("update", "gpunode.dev/gpunodepolicies"),
        ask("delete", "gpunode.dev/gpunodepolicies"),
        ask("deletecollection", "gpunode.dev/gpunodepolicies"),
        ask("patch", "gpunode.dev/gpunodepolicies/status"),
        ask("update", "gpunode.dev/gpunodepolicies/status"),
        ask("create", "pods/eviction"),
        // Leases: never read, never deleted, and written only in the release namespace.
        ask_in("get", "coordination.k8s.io/leases", NS),
        ask_in("list", "coordination.k8s.io/leases", NS),
        ask_in("watch", "coordination.k8s.io/leases", NS),
        ask_in("update", "coordination.k8s.io/leases", NS),
        ask_in("delete", "coordination.k8s.io/leases", NS),
        ask_in("deletecollection", "coordination.k8s.io/leases", NS),
        ask_in("create", "coordination.k8s.io/leases", "kube-system"),
        ask_in("patch", "coordination.k8s.io/leases", "kube-system"),
        ask_in("create", "coordination.k8s.io/leases", "default"),
        ask_in("patch", "coordination.k8s.io/leases", "default"),
        ask("list", "coordination.k8s.io/leases"),
        ask("patch", "coordination.k8s.io/leases"),
        ask_in("create", "events.k8s.io/events", "default"),
        ask(
            "patch",
            "admissionregistration.k8s.io/validatingadmissionpolicies",
        ),
        ask(
            "delete",
            "admissionregistration.k8s.io/validatingadmissionpolicybindings",
        ),
    ];

    let mut wrong = Vec::new();
    let (op, probe) = (acc.operator_user(), acc.probe_user());
    for (who, rows, expected) in [
        ("operator", &operator_allowed[..], true),
        ("operator", &operator_denied[..], false),
        ("probe", &probe_allowed[..], true),
        ("probe", &probe_denied[..], false),
    ] {
        let user = if who == "operator" { &op } else { &probe };
        for m in mismatches(&admin, user, rows, expected).await {
            wrong.push(format!("{who}: {m}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "RBAC differs from what the binaries need:\n{}",
        wrong.join("\n")
    );
}

fn reports(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<GpuNodeReport>(&()))
}

/// What the probe writes: the object (server-side apply), then its status.
async fn write_report(client: &Client, node: &str, driver: &str) -> Result<(), kube::Error> {
    let api = reports(client);
    let pp = PatchParams::apply("gpunode-probe").force();
    let object = json!({
        "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport",
        "metadata": {"name": node}, "spec": {"nodeName": node},
    });
    api.patch(node, &pp, &Patch::Apply(&object)).await?;
    let status = json!({
        "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport",
        "status": {"driverVersion": driver},
    });
    api.patch_status(node, &pp, &Patch::Apply(&status)).await?;
    Ok(())
}

fn expect_refused(result: Result<(), kube::Error>, message: &str, what: &str) {
    match result {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "{what}: expected 403 Forbidden, got {s:?}");
            assert!(
                s.message.contains(message),
                "{what}: the refusal does not carry the policy's message ({message:?}): {}",
                s.message
            );
            eprintln!("{what}: refused: {}", s.message);
        }
        Err(e) => panic!("{what}: expected the admission policy's 403, got {e}"),
        Ok(()) => panic!("{what}: was admitted"),
    }
}

#[tokio::test]
async fn a_probe_writes_only_its_own_nodes_report() {
    let admin = admin_client().await.unwrap();
    chart::install_accounts(&admin).await.unwrap();
    let suffix = rand_suffix();
    let (a, b) = (format!("sec-a-{suffix:06x}"), format!("sec-b-{suffix:06x}"));
    nodes::create(&admin, &[a.clone(), b.clone()], &nodes::GpuNodeShape::default())
        .await
        .unwrap();
    let pod_a = chart::probe_pod(&admin, &a).await.unwrap();
    let probe_a = chart::probe_client(&admin, &pod_a).await.unwrap();

    // Its own node: created, then updated.
    write_report(&probe_a, &a, "550.54.15")
        .await
        .unwrap_or_else(|e| panic!("probe on {a} writing its own report: {e}"));
    write_report(&probe_a, &a, "550.90.07")
        .await
        .unwrap_or_else(|e| panic!("probe on {a} updating its own report: {e}"));
    let stored = reports(&admin).get(&a).await.unwrap();
    assert_eq!(stored.data["status"]["driverVersion"], "550.90.07");

    // Another node's report: refused on create, and on update of one that exists.
    expect_refused(
        write_report(&probe_a, &b, "550.54.15").await,
        OTHER_NODE_MESSAGE,
        &format!("probe on {a} creating {b}'s report"),
    );
    assert!(
        reports(&admin).get_opt(&b).await.unwrap().is_none(),
        "the refused create left a report behind"
    );
    gpunode_e2e::reports::publish(&admin, &b, json!({"driverVersion": "550.54.15"}))
        .await
        .unwrap();
    expect_refused(
        write_report(&probe_a, &b, "1.0").await,
        OTHER_NODE_MESSAGE,
        &format!("probe on {a} updating {b}'s report"),
    );
    // The status subresource alone is policed too.
    let status = json!({
        "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport",
        "status": {"driverVersion": "1.0"},
    });
    expect_refused(
        reports(&probe_a)
            .patch_status(
                &b,
                &PatchParams::apply("gpunode-probe").force(),
                &Patch::Apply(&status),
            )
            .await
            .map(|_| ()),
        OTHER_NODE_MESSAGE,
        &format!("probe on {a} writing {b}'s report status"),
    );
    let b_report = reports(&admin).get(&b).await.unwrap();
    assert_eq!(b_report.data["status"]["driverVersion"], "550.54.15");

    // Deleting is not even granted by RBAC, own report or not.
    match reports(&probe_a).delete(&a, &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("probe deleting its report: expected 403, got {other:?}"),
    }

    // A probe token that is not bound to a pod carries no node: refused even for "its" node.
    let unbound = accounts::client_for(&admin, chart::NAMESPACE, chart::PROBE_SA, None)
        .await
        .unwrap();
    expect_refused(
        write_report(&unbound, &a, "550.54.15").await,
        NO_NODE_MESSAGE,
        "an unbound probe token writing a report",
    );

    chart::delete_probe_pod(&admin, &a).await.unwrap();
}

fn leases(client: &Client, namespace: &str) -> Api<Lease> {
    Api::namespaced(client.clone(), namespace)
}

/// What the probe writes as its heartbeat (node-probe/src/publish/kube_sink.rs
/// KubeSink::heartbeat()): a server-side apply of Lease `name` in `namespace`, held by `holder`,
/// owned by `owner`.
async fn renew_lease(
    client: &Client,
    namespace: &str,
    name: &str,
    holder: &str,
    owner: &Node,
) -> Result<(), kube::Error> {
    let owner = owner.metadata.name.as_deref().zip(owner.metadata.uid.as_deref());
    let lease = heartbeat::lease(name, holder, owner, 180, MicroTime(jiff::Timestamp::now()));
    leases(client, namespace)
        .patch(
            name,
            &PatchParams::apply("gpunode-node-probe").force(),
            &Patch::Apply(&lease),
        )
        .await
        .map(|_| ())
}

/// Holder and renewal time of a stored Lease, read as admin.
async fn stored_lease(admin: &Client, name: &str) -> Option<(Option<String>, Option<MicroTime>)> {
    leases(admin, NS).get_opt(name).await.unwrap().map(|l| {
        let spec = l.spec.unwrap_or_default();
        (spec.holder_identity, spec.renew_time)
    })
}

fn lease_of(node: &str) -> String {
    lease_name(node).unwrap_or_else(|| panic!("node {node} has no heartbeat Lease name"))
}

#[tokio::test]
async fn a_probe_writes_only_its_own_nodes_heartbeat_lease() {
    let admin = admin_client().await.unwrap();
    chart::install_accounts(&admin).await.unwrap();
    let suffix = rand_suffix();
    let (a, b) = (format!("sec-la-{suffix:06x}"), format!("sec-lb-{suffix:06x}"));
    nodes::create(&admin, &[a.clone(), b.clone()], &nodes::GpuNodeShape::default())
        .await
        .unwrap();
    let node_api: Api<Node> = Api::all(admin.clone());
    let node_a = node_api.get(&a).await.unwrap();
    let node_b = node_api.get(&b).await.unwrap();
    let pod_a = chart::probe_pod(&admin, &a).await.unwrap();
    let probe_a = chart::probe_client(&admin, &pod_a).await.unwrap();
    let (lease_a, lease_b) = (lease_of(&a), lease_of(&b));

    // Its own Lease, held as its node: created, then renewed.
    renew_lease(&probe_a, NS, &lease_a, &a, &node_a)
        .await
        .unwrap_or_else(|e| panic!("probe on {a} creating its heartbeat Lease: {e}"));
    let (_, first) = stored_lease(&admin, &lease_a)
        .await
        .expect("the created Lease is not stored");
    renew_lease(&probe_a, NS, &lease_a, &a, &node_a)
        .await
        .unwrap_or_else(|e| panic!("probe on {a} renewing its heartbeat Lease: {e}"));
    let stored = leases(&admin, NS).get(&lease_a).await.unwrap();
    let holder = stored.spec.as_ref().and_then(|s| s.holder_identity.as_deref());
    // What the operator reads from it (crds/src/heartbeat.rs).
    assert_eq!(lease_node(&lease_a, holder), Some(a.as_str()));
    assert_ne!(
        stored.spec.as_ref().and_then(|s| s.renew_time.clone()),
        first,
        "the renewal did not move renewTime"
    );
    assert_eq!(
        stored
            .metadata
            .labels
            .unwrap_or_default()
            .get(LEASE_LABEL)
            .map(String::as_str),
        Some(LEASE_LABEL_VALUE)
    );
    let owners = stored.metadata.owner_references.unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o.kind == "Node" && Some(&o.uid) == node_a.metadata.uid.as_ref()),
        "the Lease is not owned by its Node: {owners:?}"
    );

    // Another node's Lease: refused on create, and on renewal of one that exists.
    let other = format!("probe on node {a} {LEASE_OTHER_NODE_MESSAGE}{a}, not Lease {lease_b}");
    expect_refused(
        renew_lease(&probe_a, NS, &lease_b, &b, &node_b).await,
        &other,
        &format!("probe on {a} creating {b}'s heartbeat Lease"),
    );
    assert!(
        stored_lease(&admin, &lease_b).await.is_none(),
        "the refused create left a Lease behind"
    );
    renew_lease(&admin, NS, &lease_b, &b, &node_b).await.unwrap();
    let before = stored_lease(&admin, &lease_b).await;
    expect_refused(
        renew_lease(&probe_a, NS, &lease_b, &b, &node_b).await,
        &other,
        &format!("probe on {a} renewing {b}'s heartbeat Lease"),
    );
    assert_eq!(
        stored_lease(&admin, &lease_b).await,
        before,
        "the refused renewal changed the Lease"
    );

    // Its own Lease, but held as another node: the operator would take it as that node's.
    expect_refused(
        renew_lease(&probe_a, NS, &lease_a, &b, &node_a).await,
        &format!("probe on node {a} may hold its heartbeat Lease {lease_a} {LEASE_HOLDER_MESSAGE} '{b}'"),
        &format!("probe on {a} holding its Lease as {b}"),
    );
    assert_eq!(
        stored_lease(&admin, &lease_a).await.and_then(|(h, _)| h),
        Some(a.clone())
    );

    // The operator's leader Lease is in the same namespace, and the probe's Role covers it: the
    // policy keeps the probe out of leader election.
    expect_refused(
        renew_lease(&probe_a, NS, "gpunode-operator", &a, &node_a).await,
        &format!("{LEASE_OTHER_NODE_MESSAGE}{a}, not Lease gpunode-operator"),
        &format!("probe on {a} writing the operator's leader Lease"),
    );

    // Its own Lease outside the release namespace: not granted by RBAC.
    match renew_lease(&probe_a, "default", &lease_a, &a, &node_a).await {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 403 && s.message.contains("cannot patch resource"),
            "{s:?}"
        ),
        other => panic!("probe writing its Lease in default: expected 403, got {other:?}"),
    }
    // Deleting is not granted either, own Lease or not.
    match leases(&probe_a, NS)
        .delete(&lease_a, &DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("probe deleting its Lease: expected 403, got {other:?}"),
    }

    // A probe token that is not bound to a pod carries no node: refused even for "its" Lease.
    let unbound = accounts::client_for(&admin, chart::NAMESPACE, chart::PROBE_SA, None)
        .await
        .unwrap();
    expect_refused(
        renew_lease(&unbound, NS, &lease_a, &a, &node_a).await,
        LEASE_NO_NODE_MESSAGE,
        "an unbound probe token renewing a Lease",
    );

    for name in [&lease_a, &lease_b] {
        leases(&admin, NS)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    chart::delete_probe_pod(&admin, &a).await.unwrap();
}

/// The probe pod as rendered: the probe is non-root and can write only its XID state directory;
/// the one container that runs as root (to hand that directory to the probe's user) holds
/// CAP_CHOWN and nothing else.
#[tokio::test]
async fn the_probe_pod_writes_only_its_xid_state_dir_and_only_its_init_container_is_root() {
    let admin = admin_client().await.unwrap();
    let objects = chart::template(&admin, "r", NS, &[]).await.unwrap();
    let ds = objects
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "DaemonSet"))
        .expect("no DaemonSet rendered");
    let pod = &ds.data["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);

    let probe = &pod["containers"][0];
    let sc = &probe["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"], json!({"drop": ["ALL"]}));
    assert!(
        sc.get("runAsUser").is_none(),
        "the probe runs as the pod's user: {sc}"
    );
    let writable: Vec<&str> = probe["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["readOnly"] != true)
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    assert_eq!(writable, vec!["/var/lib/gpunode"]);
    let host_paths: Vec<(&str, &str)> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["hostPath"]["path"].as_str()?, v["hostPath"]["type"].as_str()?)))
        .collect();
    assert_eq!(
        host_paths,
        vec![("/sys", "Directory"), ("/var/lib/gpunode", "DirectoryOrCreate")]
    );

    let inits = pod["initContainers"].as_array().cloned().unwrap_or_default();
    assert_eq!(inits.len(), 1, "{inits:?}");
    let init = &inits[0];
    let sc = &init["securityContext"];
    assert_eq!(sc["runAsUser"], 0);
    assert_eq!(sc["capabilities"], json!({"drop": ["ALL"], "add": ["CHOWN"]}));
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(sc.get("privileged").is_none_or(|p| p == false), "{sc}");
    assert_eq!(
        init["volumeMounts"],
        json!([{"name": "xid-state", "mountPath": "/var/lib/gpunode"}])
    );
}
