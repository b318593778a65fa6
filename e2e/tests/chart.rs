//! The Helm chart with the real helm CLI: `helm lint --strict`; `helm template` with the defaults
//! and with each documented toggle (asserting what each one changes); every rendered manifest
//! accepted by the real API server (server-side dry run); and `helm install`, `helm upgrade` with
//! changed values and `helm uninstall` on the local control plane, which leaves nothing behind
//! but the CRDs.
//!
//! Releases here get their own names and namespaces, so they never collide with the accounts
//! `gpunode_e2e::chart::install_accounts` puts into `gpunode-system` for the other tests.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, path::PathBuf, time::Duration};

use gpunode_e2e::{
    chart,
    cluster::{self, admin_client},
    crds,
    scratch::{Scratch, rand_suffix},
    wait,
};
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment},
        core::v1::Namespace,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{DynamicObject, GroupVersionKind, ListParams},
    discovery,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(90);

/// Every optional object switched on.
const ALL_ON: [&str; 6] = [
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "metrics.prometheusRule.enabled=true",
    "--set",
    "metrics.grafanaDashboard.enabled=true",
];

fn chart_path() -> String {
    chart::chart_dir().display().to_string()
}

async fn helm(args: Vec<String>) -> Result<String, gpunode_e2e::Error> {
    helm_env(args, None).await
}

/// Runs helm off the async runtime, with `KUBECONFIG` when given.
async fn helm_env(args: Vec<String>, kubeconfig: Option<PathBuf>) -> Result<String, gpunode_e2e::Error> {
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        match &kubeconfig {
            Some(k) => chart::run_helm_env(&refs, &[("KUBECONFIG", k.as_path())]),
            None => chart::run_helm(&refs),
        }
    })
    .await
    .unwrap()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The rendered manifests of release `r` in `ns` with `sets` (`key=value` pairs for `--set`).
async fn render(admin: &Client, sets: &[&str]) -> Vec<DynamicObject> {
    let mut extra = Vec::new();
    for s in sets {
        extra.push("--set");
        extra.push(*s);
    }
    chart::template(admin, "r", "ns", &extra).await.unwrap()
}

fn kind_of(o: &DynamicObject) -> &str {
    o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or_default()
}

fn kinds(objects: &[DynamicObject]) -> BTreeSet<String> {
    objects.iter().map(|o| kind_of(o).to_string()).collect()
}

fn count(objects: &[DynamicObject], kind: &str) -> usize {
    objects.iter().filter(|o| kind_of(o) == kind).count()
}

/// The one object of `kind` whose name ends with `suffix`.
fn one<'a>(objects: &'a [DynamicObject], kind: &str, suffix: &str) -> &'a DynamicObject {
    let found: Vec<_> = objects
        .iter()
        .filter(|o| kind_of(o) == kind && o.metadata.name.as_deref().is_some_and(|n| n.ends_with(suffix)))
        .collect();
    match found.as_slice() {
        [o] => o,
        _ => panic!(
            "expected exactly one {kind} named *{suffix}, found {}",
            found.len()
        ),
    }
}

/// The names of the Roles among `objects`.
fn role_names(objects: &[DynamicObject]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|o| kind_of(o) == "Role")
        .filter_map(|o| o.metadata.name.clone())
        .collect()
}

fn container(o: &DynamicObject) -> &Value {
    &o.data["spec"]["template"]["spec"]["containers"][0]
}

fn args(o: &DynamicObject) -> Vec<String> {
    container(o)["args"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn env(o: &DynamicObject, name: &str) -> Value {
    container(o)["env"]
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == name).cloned())
        .unwrap_or(Value::Null)
}

#[tokio::test]
async fn helm_lint_is_clean_and_the_values_schema_is_strict() {
    for extra in [&[][..], &ALL_ON[..]] {
        let mut a = strings(&["lint", "--strict", &chart_path()]);
        a.extend(strings(extra));
        let out = helm(a).await.unwrap();
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
    // Misspelt or mistyped values are refused, naming the key.
    for (set, key) in [
        ("operator.replica=3", "replica"),
        ("nodeProbe.privileged=maybe", "privileged"),
        ("nodeProbe.reportRefresh=soon", "reportRefresh"),
        ("nodeProbe.xidState.hostPath=relative", "hostPath"),
        ("nodeProbe.xidState.enable=true", "enable"),
        ("nodeProbe.podResources.gpuResources={gpu}", "gpuResources"),
        ("metrics.prometheusRule.for.drifted=soon", "drifted"),
        ("operator.image.pullPolicy=Sometimes", "pullPolicy"),
        ("operator.applyConcurrency=0", "applyConcurrency"),
    ] {
        let err = helm(strings(&["template", "r", &chart_path(), "--set", set]))
            .await
            .err()
            .unwrap_or_else(|| panic!("--set {set} was accepted"));
        let msg = err.to_string();
        assert!(
            msg.contains("values don't meet the specifications of the schema") && msg.contains(key),
            "--set {set}: {msg}"
        );
    }
}

#[tokio::test]
async fn helm_template_defaults_and_each_toggle() {
    let admin = admin_client().await.unwrap();
    let d = render(&admin, &[]).await;
    let expected: BTreeSet<String> = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "Deployment",
        "PodDisruptionBudget",
        "DaemonSet",
        "Service",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(kinds(&d), expected);
    // Cluster-scoped names carry the release, so two releases do not collide.
    for o in d.iter().filter(|o| o.metadata.namespace.is_none()) {
        let name = o.metadata.name.clone().unwrap_or_default();
        let ns_ok = matches!(kind_of(o), "ClusterRole" | "ClusterRoleBinding")
            || kind_of(o).starts_with("ValidatingAdmissionPolicy");
        assert!(ns_ok, "{} {name} has no namespace", kind_of(o));
        assert!(name.starts_with("r-gpunode-"), "{} {name}", kind_of(o));
    }
    // The events Role lives where the Recorder writes Node events; everything else in the release namespace.
    assert_eq!(
        one(&d, "Role", "-operator-events").metadata.namespace.as_deref(),
        Some("default")
    );
    assert_eq!(
        one(&d, "Role", "-operator-leader").metadata.namespace.as_deref(),
        Some("ns")
    );
    // Leases: the operator reads the probes' heartbeats, each probe writes its own, both in the
    // release namespace.
    let rules = |role: &DynamicObject| -> Vec<(Value, Value)> {
        role.data["rules"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .map(|r| (r["resources"].clone(), r["verbs"].clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let leases = serde_json::json!(["leases"]);
    for (role, verbs) in [
        ("-operator-heartbeats", ["list", "watch"]),
        ("-node-probe-heartbeat", ["create", "patch"]),
    ] {
        let r = one(&d, "Role", role);
        assert_eq!(r.metadata.namespace.as_deref(), Some("ns"), "Role {role}");
        assert_eq!(
            rules(r),
            vec![(leases.clone(), serde_json::json!(verbs))],
            "Role {role}"
        );
        assert_eq!(
            one(&d, "RoleBinding", role).data["roleRef"]["name"],
            serde_json::json!(r.metadata.name)
        );
    }

    // The probe's cluster-wide rules, exactly: its report, its Node, and a read-only watch of
    // the policies its publish decision evaluates.
    assert_eq!(
        rules(one(&d, "ClusterRole", "-node-probe")),
        vec![
            (
                serde_json::json!(["gpunodereports"]),
                serde_json::json!(["create", "patch"])
            ),
            (
                serde_json::json!(["gpunodereports/status"]),
                serde_json::json!(["patch"])
            ),
            (serde_json::json!(["nodes"]), serde_json::json!(["get"])),
            (
                serde_json::json!(["gpunodepolicies"]),
                serde_json::json!(["get", "list", "watch"])
            ),
        ],
        "ClusterRole -node-probe"
    );

    let op = one(&d, "Deployment", "-operator");
    assert_eq!(op.data["spec"]["replicas"], 2);
    let a = args(op);
    for want in [
        "run",
        "--leader-elect=true",
        "--lease-namespace=$(POD_NAMESPACE)",
        "--metrics-addr=0.0.0.0:8080",
        "--apply-concurrency=32",
        "--fleet-max-unavailable=20%",
    ] {
        assert!(a.iter().any(|x| x == want), "operator args {a:?} lack {want}");
    }
    assert_eq!(
        env(op, "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    let sc = &container(op)["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(container(op)["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container(op)["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container(op)["image"], "gpunode/operator:0.1.0");
    assert_eq!(
        op.data["spec"]["template"]["spec"]["serviceAccountName"],
        "r-gpunode-operator"
    );
    assert_eq!(
        one(&d, "PodDisruptionBudget", "-operator").data["spec"]["minAvailable"],
        1
    );

    let ds = one(&d, "DaemonSet", "-node-probe");
    let pod = &ds.data["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(pod["runtimeClassName"], "nvidia");
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["nodeSelector"]["nvidia.com/gpu.present"], "true");
    assert_eq!(pod["tolerations"], serde_json::json!([{"operator": "Exists"}]));
    assert_eq!(pod["volumes"][0]["hostPath"]["path"], "/sys");
    assert_eq!(container(ds)["volumeMounts"][0]["readOnly"], true);
    // The XIDs of this boot: a host directory, writable, handed to the probe's user by an init
    // container; the probe is told to keep them there.
    assert_eq!(
        pod["volumes"][1],
        serde_json::json!({"name": "xid-state",
                           "hostPath": {"path": "/var/lib/gpunode", "type": "DirectoryOrCreate"}})
    );
    assert_eq!(
        container(ds)["volumeMounts"][1],
        serde_json::json!({"name": "xid-state", "mountPath": "/var/lib/gpunode"})
    );
    let init = &pod["initContainers"][0];
    assert_eq!(init["name"], "xid-state-dir");
    assert_eq!(init["image"], container(ds)["image"]);
    assert_eq!(
        init["args"],
        serde_json::json!(["--state-dir=/var/lib/gpunode", "--chown-state-dir=65532:65532"])
    );
    assert_eq!(
        init["volumeMounts"],
        serde_json::json!([{"name": "xid-state", "mountPath": "/var/lib/gpunode"}])
    );
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["securityContext"]["runAsGroup"], 65532);
    for want in [
        "--state-dir=/var/lib/gpunode",
        "--sysfs-root=/host/sys",
        "--heartbeat=60s",
        "--report-refresh=10m",
        "--lease-namespace=$(POD_NAMESPACE)",
    ] {
        assert!(
            args(ds).iter().any(|a| a == want),
            "probe args {:?} lack {want}",
            args(ds)
        );
    }
    assert_eq!(
        env(ds, "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(
        env(ds, "NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(env(ds, "NVIDIA_VISIBLE_DEVICES")["value"], "all");
    assert_eq!(env(ds, "NVIDIA_DRIVER_CAPABILITIES")["value"], "utility");
    assert!(container(ds)["securityContext"].get("privileged").is_none());
    assert_eq!(container(ds)["securityContext"]["readOnlyRootFilesystem"], true);

    let vap = one(&d, "ValidatingAdmissionPolicy", "-own-report");
    assert_eq!(vap.data["spec"]["failurePolicy"], "Fail");
    let condition = vap.data["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap_or_default();
    assert!(
        condition.contains("'system:serviceaccount:ns:r-gpunode-node-probe'"),
        "{condition}"
    );
    let lease_vap = one(&d, "ValidatingAdmissionPolicy", "-own-lease");
    assert_eq!(lease_vap.data["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        lease_vap.data["spec"]["matchConditions"], vap.data["spec"]["matchConditions"],
        "both policies police the same probe account"
    );
    assert_eq!(
        lease_vap.data["spec"]["matchConstraints"]["resourceRules"][0]["resources"],
        leases
    );
    assert_eq!(
        one(&d, "ValidatingAdmissionPolicyBinding", "-own-lease").data["spec"]["policyName"],
        serde_json::json!(lease_vap.metadata.name)
    );

    // The leader fence: the operator's account, the release's Lease as the parameter.
    let fence = one(&d, "ValidatingAdmissionPolicy", "-leader-fence");
    assert_eq!(fence.data["spec"]["failurePolicy"], "Fail");
    assert_eq!(fence.data["spec"]["paramKind"]["kind"], "Lease");
    let condition = fence.data["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        condition.contains("'system:serviceaccount:ns:r-gpunode-operator'"),
        "{condition}"
    );
    let binding = one(&d, "ValidatingAdmissionPolicyBinding", "-leader-fence");
    assert_eq!(
        binding.data["spec"]["paramRef"],
        serde_json::json!({"name": "gpunode-operator", "namespace": "ns", "parameterNotFoundAction": "Allow"})
    );

    // Each toggle, and what it changes.
    let off = render(&admin, &["nodeProbe.admissionPolicy.enabled=false"]).await;
    assert_eq!(count(&off, "ValidatingAdmissionPolicy"), 1, "only the fence");
    assert_eq!(count(&off, "ValidatingAdmissionPolicyBinding"), 1);
    one(&off, "ValidatingAdmissionPolicy", "-leader-fence");
    for unfenced in [
        "operator.leaderElection.fence=false",
        "operator.leaderElection.enabled=false",
    ] {
        let objects = render(&admin, &[unfenced]).await;
        let fences = objects
            .iter()
            .filter(|o| {
                o.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with("-leader-fence"))
            })
            .count();
        assert_eq!(fences, 0, "with {unfenced}");
    }
    assert_eq!(count(&off, "DaemonSet"), 1);

    let no_probe = render(&admin, &["nodeProbe.enabled=false"]).await;
    assert_eq!(count(&no_probe, "DaemonSet"), 0);
    assert_eq!(
        count(&no_probe, "ValidatingAdmissionPolicy"),
        1,
        "only the operator's fence"
    );
    assert_eq!(count(&no_probe, "ServiceAccount"), 1);
    assert_eq!(count(&no_probe, "ClusterRole"), 1);
    assert!(
        !role_names(&no_probe).iter().any(|n| n.contains("-node-probe")),
        "{:?}",
        role_names(&no_probe)
    );
    assert_eq!(count(&no_probe, "Service"), 1);

    let memory_only = render(&admin, &["nodeProbe.xidState.enabled=false"]).await;
    let ds = one(&memory_only, "DaemonSet", "-node-probe");
    let pod = &ds.data["spec"]["template"]["spec"];
    assert!(pod.get("initContainers").is_none(), "{pod}");
    assert_eq!(pod["volumes"].as_array().map(Vec::len), Some(1));
    assert_eq!(container(ds)["volumeMounts"].as_array().map(Vec::len), Some(1));
    assert!(
        !args(ds).iter().any(|a| a.starts_with("--state-dir")),
        "{:?}",
        args(ds)
    );
    let elsewhere = render(&admin, &["nodeProbe.xidState.hostPath=/srv/gpunode"]).await;
    let ds = one(&elsewhere, "DaemonSet", "-node-probe");
    assert_eq!(
        ds.data["spec"]["template"]["spec"]["volumes"][1]["hostPath"]["path"],
        "/srv/gpunode"
    );
    assert!(args(ds).iter().any(|a| a == "--state-dir=/var/lib/gpunode"));

    // Off by default: the probe stays uid 65532 and mounts nothing of the kubelet's.
    assert!(
        !args(one(&d, "DaemonSet", "-node-probe"))
            .iter()
            .any(|a| a.starts_with("--pod-resources"))
    );
    // On (device-plugin clusters): the kubelet's pod-resources directory read-only, the socket and
    // GPU resources on the command line, uid 0 with every capability still dropped.
    let pod_resources = render(&admin, &["nodeProbe.podResources.enabled=true"]).await;
    let ds = one(&pod_resources, "DaemonSet", "-node-probe");
    let pod = &ds.data["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"][2],
        serde_json::json!({"name": "pod-resources",
                           "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}})
    );
    assert_eq!(
        container(ds)["volumeMounts"][2],
        serde_json::json!({"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": true})
    );
    for want in [
        "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
        "--gpu-resources=nvidia.com/gpu,nvidia.com/gpu.shared",
    ] {
        assert!(
            args(ds).iter().any(|a| a == want),
            "probe args {:?} lack {want}",
            args(ds)
        );
    }
    assert_eq!(pod["securityContext"]["runAsUser"], 0);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], false);
    assert_eq!(pod["initContainers"][0]["args"][1], "--chown-state-dir=0:0");
    let sc = &container(ds)["securityContext"];
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(sc["capabilities"].get("add").is_none(), "{sc}");
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);

    let privileged = render(&admin, &["nodeProbe.privileged=true"]).await;
    let ds = one(&privileged, "DaemonSet", "-node-probe");
    assert_eq!(container(ds)["securityContext"]["privileged"], true);

    let runc = render(
        &admin,
        &[
            "nodeProbe.runtimeClassName=",
            "nodeProbe.nvidia.driverCapabilities=utility\\,compute",
            "nodeProbe.interval=30s",
            "nodeProbe.reportRefresh=1h",
        ],
    )
    .await;
    let ds = one(&runc, "DaemonSet", "-node-probe");
    assert!(
        ds.data["spec"]["template"]["spec"]
            .get("runtimeClassName")
            .is_none()
    );
    assert_eq!(env(ds, "NVIDIA_DRIVER_CAPABILITIES")["value"], "utility,compute");
    assert!(args(ds).iter().any(|a| a == "--interval=30s"));
    assert!(args(ds).iter().any(|a| a == "--report-refresh=1h"));

    let single = render(
        &admin,
        &[
            "operator.leaderElection.enabled=false",
            "operator.replicas=1",
            "operator.podDisruptionBudget.enabled=false",
            "operator.applyConcurrency=8",
        ],
    )
    .await;
    let op = one(&single, "Deployment", "-operator");
    assert!(args(op).iter().any(|a| a == "--leader-elect=false"));
    assert!(args(op).iter().any(|a| a == "--apply-concurrency=8"));
    assert_eq!(op.data["spec"]["replicas"], 1);
    assert_eq!(count(&single, "PodDisruptionBudget"), 0);
    // No leader Role without leader election; the operator still reads the heartbeats.
    assert_eq!(
        role_names(&single),
        BTreeSet::from([
            "r-gpunode-node-probe-heartbeat".to_string(),
            "r-gpunode-operator-events".to_string(),
            "r-gpunode-operator-heartbeats".to_string(),
        ])
    );

    // operator.validation.namespaces: a Role and binding per namespace, Jobs only, nothing else.
    let validation = render(&admin, &["operator.validation.namespaces={gpu-validation,nccl}"]).await;
    for ns in ["gpu-validation", "nccl"] {
        let role = validation
            .iter()
            .find(|o| kind_of(o) == "Role" && o.metadata.namespace.as_deref() == Some(ns))
            .unwrap_or_else(|| panic!("no validation Role in {ns}"));
        assert_eq!(
            role.metadata.name.as_deref(),
            Some("r-gpunode-operator-validation")
        );
        assert_eq!(
            role.data["rules"],
            serde_json::json!([{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "create", "delete"]}])
        );
        let binding = validation
            .iter()
            .find(|o| kind_of(o) == "RoleBinding" && o.metadata.namespace.as_deref() == Some(ns))
            .unwrap_or_else(|| panic!("no validation RoleBinding in {ns}"));
        assert_eq!(binding.data["subjects"][0]["name"], "r-gpunode-operator");
        assert_eq!(binding.data["subjects"][0]["namespace"], "ns");
    }
    assert!(
        !single.iter().any(|o| o
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.ends_with("-validation"))),
        "no validation RBAC by default"
    );

    let no_rbac = render(&admin, &["rbac.create=false"]).await;
    for k in ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        assert_eq!(count(&no_rbac, k), 0, "{k} with rbac.create=false");
    }

    let named = render(
        &admin,
        &[
            "operator.serviceAccount.name=ops",
            "nodeProbe.serviceAccount.name=probes",
            "operator.image.tag=dev",
            "nodeProbe.image.repository=registry.example/probe",
            "nodeProbe.image.digest=sha256:0000000000000000000000000000000000000000000000000000000000000000",
        ],
    )
    .await;
    assert_eq!(
        one(&named, "ClusterRoleBinding", "-operator").data["subjects"][0]["name"],
        "ops"
    );
    assert_eq!(
        one(&named, "ClusterRoleBinding", "-node-probe").data["subjects"][0]["name"],
        "probes"
    );
    let expr = one(&named, "ValidatingAdmissionPolicy", "-own-report").data["spec"]["matchConditions"][0]
        ["expression"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(expr.contains("'system:serviceaccount:ns:probes'"), "{expr}");
    assert_eq!(
        container(one(&named, "Deployment", "-operator"))["image"],
        "gpunode/operator:dev"
    );
    assert_eq!(
        container(one(&named, "DaemonSet", "-node-probe"))["image"],
        "registry.example/probe@sha256:0000000000000000000000000000000000000000000000000000000000000000"
    );

    let no_svc = render(
        &admin,
        &[
            "metrics.service.enabled=false",
            "metrics.probeService.enabled=false",
        ],
    )
    .await;
    assert_eq!(count(&no_svc, "Service"), 0);

    let monitoring = render(
        &admin,
        &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "metrics.grafanaDashboard.enabled=true",
            "metrics.grafanaDashboard.namespace=grafana",
        ],
    )
    .await;
    assert_eq!(count(&monitoring, "ServiceMonitor"), 2);
    let rule = one(&monitoring, "PrometheusRule", "r-gpunode");
    let alerts: BTreeSet<String> = rule.data["spec"]["groups"][0]["rules"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .filter_map(|r| r["alert"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for a in [
        "GpuNodesDrifted",
        "GpuNodeCircuitOpen",
        "GpuNodeDrainStuck",
        "GpuNodeReportsStale",
    ] {
        assert!(alerts.contains(a), "alerts {alerts:?} lack {a}");
    }
    // The alerts use the operator's real metric names.
    let exprs = serde_json::to_string(&rule.data["spec"]).unwrap_or_default();
    for m in [
        "gpunode_nodes",
        "gpunode_actions_total",
        "gpunode_leader",
        "gpunode_publish_total",
    ] {
        assert!(exprs.contains(m), "no alert uses {m}");
    }
    let dash = one(&monitoring, "ConfigMap", "-dashboard");
    assert_eq!(dash.metadata.namespace.as_deref(), Some("grafana"));
    let json: Value = serde_json::from_str(dash.data["data"]["gpunode.json"].as_str().unwrap_or_default())
        .expect("the dashboard is not JSON");
    assert!(json["panels"].as_array().is_some_and(|p| !p.is_empty()));

    // A ServiceMonitor without the Service it selects is refused with the reason.
    let err = chart::template(
        &admin,
        "r",
        "ns",
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.service.enabled=false",
        ],
    )
    .await
    .expect_err("a ServiceMonitor without its Service was rendered");
    assert!(err.to_string().contains("needs metrics.service.enabled"), "{err}");

    // Kubernetes older than the chart supports: refused up front.
    let old = helm(strings(&[
        "template",
        "r",
        &chart_path(),
        "--kube-version",
        "1.29.0",
    ]))
    .await
    .expect_err("rendered for Kubernetes 1.29");
    assert!(old.to_string().contains("kubeVersion"), "{old}");
}

/// The pod spec of a DaemonSet or Deployment.
fn pod_spec(o: &DynamicObject) -> &Value {
    &o.data["spec"]["template"]["spec"]
}

/// Whether any container (init containers too) of the workload runs privileged.
fn privileged(o: &DynamicObject) -> bool {
    ["containers", "initContainers"].iter().any(|k| {
        pod_spec(o)[*k]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["securityContext"]["privileged"] == true))
    })
}

/// Least privilege (README "Least privilege"): the always-on probe is never privileged and is on
/// the host network only as `nodeProbe.hostNetwork` says; GPU resets run in a DaemonSet of their
/// own, the only privileged pod, only when enabled, on the nodes that opt in, under their own
/// account with GpuResetRequest rights only, policed by the reset admission policy; the operator
/// stays off GPU nodes unless `operator.affinity` says otherwise; the NetworkPolicies render
/// only when enabled.
#[tokio::test]
async fn least_privilege_the_reset_daemonset_host_network_operator_affinity_and_network_policy() {
    let admin = admin_client().await.unwrap();
    let defaults = render(&admin, &[]).await;
    let probe = one(&defaults, "DaemonSet", "-node-probe");
    assert_eq!(
        count(&defaults, "DaemonSet"),
        1,
        "no reset DaemonSet unless enabled"
    );
    assert!(!privileged(probe));
    assert_eq!(
        pod_spec(probe)["hostNetwork"],
        true,
        "RoCE reads need the host's netns by default"
    );
    assert!(
        !args(probe)
            .iter()
            .any(|a| a == "--no-network" || a == "--follow-resets")
    );
    assert_eq!(count(&defaults, "NetworkPolicy"), 0, "NetworkPolicies are opt-in");
    let sas: Vec<_> = defaults
        .iter()
        .filter(|o| kind_of(o) == "ServiceAccount")
        .collect();
    assert_eq!(sas.len(), 2, "the operator's and the probe's");

    // The operator: required off the probe's nodes (NotIn on each label of its nodeSelector).
    let op = one(&defaults, "Deployment", "-operator");
    let affinity = &pod_spec(op)["affinity"];
    assert_eq!(
        affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        serde_json::json!([{"matchExpressions": [
            {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}
        ]}])
    );
    assert!(affinity.get("podAntiAffinity").is_some(), "replicas still spread");
    let own = render(&admin, &["operator.affinity.podAffinity.x=y"]).await;
    let op = one(&own, "Deployment", "-operator");
    assert_eq!(
        pod_spec(op)["affinity"],
        serde_json::json!({"podAffinity": {"x": "y"}}),
        "operator.affinity replaces it"
    );

    // Resets enabled: the probe stays as it was (it follows read-only), the reset DaemonSet is
    // the one privileged pod, on the probe's nodes that also opt in.
    let reset = render(
        &admin,
        &[
            "nodeProbe.gpuReset.enabled=true",
            "nodeProbe.gpuReset.nodeSelector.gpunode\\.dev/gpu-reset=yes",
        ],
    )
    .await;
    let probe = one(&reset, "DaemonSet", "-node-probe");
    assert!(!privileged(probe), "the probe is never privileged for resets");
    assert_eq!(pod_spec(probe)["securityContext"]["runAsUser"], 65532);
    assert!(args(probe).iter().any(|a| a == "--follow-resets"));
    assert!(!args(probe).iter().any(|a| a == "--gpu-reset"));
    let rs = one(&reset, "DaemonSet", "-gpu-reset");
    assert!(privileged(rs));
    assert_eq!(args(rs), vec!["--gpu-reset-only".to_string()]);
    assert!(
        pod_spec(rs).get("hostNetwork").is_none(),
        "a reset needs no network"
    );
    assert!(container(rs).get("ports").is_none(), "it listens on nothing");
    assert_eq!(pod_spec(rs)["serviceAccountName"], "r-gpunode-gpu-reset");
    assert_eq!(
        pod_spec(rs)["nodeSelector"],
        serde_json::json!({"nvidia.com/gpu.present": "true", "gpunode.dev/gpu-reset": "yes"})
    );
    let rules = |o: &DynamicObject| o.data["rules"].clone();
    assert_eq!(
        rules(one(&reset, "ClusterRole", "-gpu-reset")),
        serde_json::json!([
            {"apiGroups": ["gpunode.dev"], "resources": ["gpuresetrequests"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["gpunode.dev"], "resources": ["gpuresetrequests/status"], "verbs": ["patch"]},
        ])
    );
    let probe_rules = rules(one(&reset, "ClusterRole", "-node-probe"));
    let reset_rules: Vec<_> = probe_rules
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["resources"].to_string().contains("gpuresetrequests"))
        .collect();
    assert_eq!(
        reset_rules,
        vec![
            &serde_json::json!({"apiGroups": ["gpunode.dev"], "resources": ["gpuresetrequests"], "verbs": ["get", "list", "watch"]})
        ],
        "the probe only reads requests"
    );
    let policy = one(&reset, "ValidatingAdmissionPolicy", "-gpu-reset-own-node");
    assert_eq!(
        policy.data["spec"]["matchConditions"][0]["expression"],
        "request.userInfo.username == 'system:serviceaccount:ns:r-gpunode-gpu-reset'"
    );

    // Off the host network: the probe skips the NICs; NetworkPolicies when asked for.
    let netpol = render(
        &admin,
        &[
            "nodeProbe.hostNetwork=false",
            "networkPolicy.enabled=true",
            "networkPolicy.from[0].namespaceSelector.matchLabels.team=monitoring",
            "nodeProbe.gpuReset.enabled=true",
        ],
    )
    .await;
    let probe = one(&netpol, "DaemonSet", "-node-probe");
    assert!(pod_spec(probe).get("hostNetwork").is_none());
    assert!(pod_spec(probe).get("dnsPolicy").is_none());
    assert!(args(probe).iter().any(|a| a == "--no-network"));
    for (suffix, port) in [("-operator", 8080), ("-node-probe", 21400)] {
        let np = one(&netpol, "NetworkPolicy", suffix);
        assert_eq!(
            np.data["spec"]["ingress"],
            serde_json::json!([{
                "from": [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}],
                "ports": [{"protocol": "TCP", "port": port}],
            }]),
            "{suffix}"
        );
    }
    let np = one(&netpol, "NetworkPolicy", "-gpu-reset");
    assert_eq!(np.data["spec"]["ingress"], serde_json::json!([]));
    let closed = render(&admin, &["networkPolicy.enabled=true"]).await;
    let np = one(&closed, "NetworkPolicy", "-operator");
    assert_eq!(
        np.data["spec"]["ingress"],
        serde_json::json!([]),
        "no scraper named: no one"
    );
}

#[tokio::test]
async fn every_rendered_manifest_is_accepted_by_the_api_server() {
    let admin = admin_client().await.unwrap();
    chart::install_monitoring_stand_ins(&admin).await.unwrap();
    let ns = Scratch::new(&admin, "chart-dry-run").await.unwrap();
    for sets in [
        &[][..],
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.grafanaDashboard.enabled=true",
            "--set",
            "nodeProbe.privileged=true",
        ][..],
        &[
            "--set",
            "operator.leaderElection.enabled=false",
            "--set",
            "nodeProbe.runtimeClassName=",
            "--set",
            "nodeProbe.podResources.enabled=true",
        ][..],
        &[
            "--set",
            "nodeProbe.gpuReset.enabled=true",
            "--set",
            "nodeProbe.hostNetwork=false",
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "networkPolicy.from[0].podSelector.matchLabels.app=prometheus",
        ][..],
    ] {
        let objects = chart::template(&admin, "dry", &ns.name, sets).await.unwrap();
        assert!(!objects.is_empty());
        chart::apply(&admin, &objects, &ns.name, true)
            .await
            .unwrap_or_else(|e| panic!("with {sets:?}: {e}"));
    }
    ns.delete().await.unwrap();
}

/// Kinds the chart can create, to look for a release's objects by its instance label.
const RELEASE_KINDS: [(&str, &str, &str); 16] = [
    ("", "v1", "ServiceAccount"),
    ("", "v1", "Service"),
    ("", "v1", "ConfigMap"),
    ("", "v1", "Pod"),
    ("apps", "v1", "Deployment"),
    ("apps", "v1", "DaemonSet"),
    ("apps", "v1", "ReplicaSet"),
    ("policy", "v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRole"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io", "v1", "Role"),
    ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
    ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy"),
    (
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
    ),
    ("monitoring.coreos.com", "v1", "ServiceMonitor"),
    ("monitoring.coreos.com", "v1", "PrometheusRule"),
];

/// Every object in the cluster labelled as part of `release`, as `Kind namespace/name`.
async fn release_objects(admin: &Client, release: &str) -> Result<BTreeSet<String>, gpunode_e2e::Error> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={release}"));
    let mut out = BTreeSet::new();
    for (group, version, kind) in RELEASE_KINDS {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, _) = discovery::pinned_kind(admin, &gvk).await?;
        let api: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
        for o in api.list(&lp).await?.items {
            out.insert(format!(
                "{kind} {}/{}",
                o.metadata.namespace.unwrap_or_default(),
                o.metadata.name.unwrap_or_default()
            ));
        }
    }
    Ok(out)
}

#[tokio::test]
async fn helm_install_upgrade_and_uninstall_leave_only_the_crds() {
    let admin = admin_client().await.unwrap();
    crds::install(&admin).await.unwrap();
    chart::install_monitoring_stand_ins(&admin).await.unwrap();
    let kubeconfig = tokio::task::spawn_blocking(cluster::cluster)
        .await
        .unwrap()
        .unwrap()
        .kubeconfig;
    let release = format!("chart-e2e-{:06x}", rand_suffix());
    let ns = format!("{release}-ns");
    let mut install = strings(&[
        "install",
        &release,
        &chart_path(),
        "--namespace",
        &ns,
        "--create-namespace",
    ]);
    install.extend(strings(&ALL_ON));
    let out = helm_env(install, Some(kubeconfig.clone())).await.unwrap();
    assert!(out.contains("STATUS: deployed"), "{out}");
    // NOTES.txt tells the user what to do next.
    assert!(out.contains("kubectl get gpunodepolicies"), "{out}");

    let installed = release_objects(&admin, &release).await.unwrap();
    for want in [
        format!("Deployment {ns}/{release}-gpunode-operator"),
        format!("DaemonSet {ns}/{release}-gpunode-node-probe"),
        format!("ClusterRole /{release}-gpunode-operator"),
        format!("ClusterRole /{release}-gpunode-node-probe"),
        format!("ValidatingAdmissionPolicy /{release}-gpunode-node-probe-own-report"),
        format!("ValidatingAdmissionPolicy /{release}-gpunode-node-probe-own-lease"),
        format!("Role {ns}/{release}-gpunode-node-probe-heartbeat"),
        format!("Role {ns}/{release}-gpunode-operator-heartbeats"),
        format!("RoleBinding default/{release}-gpunode-operator-events"),
        format!("ServiceMonitor {ns}/{release}-gpunode-operator"),
        format!("PrometheusRule {ns}/{release}-gpunode"),
        format!("ConfigMap {ns}/{release}-gpunode-dashboard"),
    ] {
        assert!(
            installed.contains(&want),
            "{want} missing after install: {installed:?}"
        );
    }

    // Upgrade with changed values: the change lands, and what was switched off goes away.
    let upgrade = strings(&[
        "upgrade",
        &release,
        &chart_path(),
        "--namespace",
        &ns,
        "--reuse-values",
        "--set",
        "operator.replicas=3",
        "--set",
        "nodeProbe.interval=30s",
        "--set",
        "metrics.grafanaDashboard.enabled=false",
    ]);
    let out = helm_env(upgrade, Some(kubeconfig.clone())).await.unwrap();
    assert!(out.contains("REVISION: 2"), "{out}");
    let d = Api::<Deployment>::namespaced(admin.clone(), &ns)
        .get(&format!("{release}-gpunode-operator"))
        .await
        .unwrap();
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(3));
    let ds_api: Api<DaemonSet> = Api::namespaced(admin.clone(), &ns);
    let ds = ds_api
        .get(&format!("{release}-gpunode-node-probe"))
        .await
        .unwrap();
    let ds_args = ds
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default();
    assert!(ds_args.iter().any(|a| a == "--interval=30s"), "{ds_args:?}");
    let upgraded = release_objects(&admin, &release).await.unwrap();
    assert!(
        !upgraded.contains(&format!("ConfigMap {ns}/{release}-gpunode-dashboard")),
        "the dashboard switched off by the upgrade is still there"
    );

    // Uninstall: nothing labelled with the release remains (pods and ReplicaSets go with
    // their owners, asynchronously), the CRDs do.
    let out = helm_env(
        strings(&[
            "uninstall",
            &release,
            "--namespace",
            &ns,
            "--wait",
            "--timeout",
            "60s",
        ]),
        Some(kubeconfig.clone()),
    )
    .await
    .unwrap();
    assert!(out.contains("uninstalled"), "{out}");
    let left = wait::until("the release's objects to be gone", DEADLINE, || async {
        let left = release_objects(&admin, &release).await?;
        if left.is_empty() {
            Ok(Some(left))
        } else {
            Err(gpunode_e2e::Error::Unexpected(format!("left: {left:?}")))
        }
    })
    .await
    .unwrap();
    assert!(left.is_empty());
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for name in [
        "gpunodepolicies.gpunode.dev",
        "gpunodereports.gpunode.dev",
        "gpuresetrequests.gpunode.dev",
    ] {
        assert!(
            crds.get_opt(name).await.unwrap().is_some(),
            "CRD {name} was removed by helm uninstall"
        );
    }
    let _ = Api::<Namespace>::all(admin.clone())
        .delete(&ns, &Default::default())
        .await;
}

/// The rendered manifests with `sets` (`key=json` pairs for `--set-json`).
async fn render_json(admin: &Client, sets: &[&str]) -> Vec<DynamicObject> {
    let mut extra = Vec::new();
    for s in sets {
        extra.push("--set-json");
        extra.push(*s);
    }
    chart::template(admin, "r", "ns", &extra).await.unwrap()
}

/// The operator's `--validation-namespaces`, as the operator reads it.
fn validation_bounds(objects: &[DynamicObject]) -> gpunode_operator::bounds::ValidationBounds {
    let deployment = one(objects, "Deployment", "-operator");
    let flag = args(deployment)
        .into_iter()
        .find_map(|a| a.strip_prefix("--validation-namespaces=").map(str::to_string))
        .expect("the operator gets --validation-namespaces");
    gpunode_operator::bounds::ValidationBounds::parse(&flag).unwrap()
}

/// A DCGM diagnostic's pod template (as the README's validation section shows it).
fn dcgm_diag(security: Value) -> k8s_openapi::api::core::v1::PodTemplateSpec {
    serde_json::from_value(serde_json::json!({"spec": {"containers": [{
        "name": "diag",
        "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
        "command": ["dcgmi", "diag", "-r", "2"],
        "resources": {"limits": {"nvidia.com/gpu": 8}},
        "securityContext": security,
    }]}}))
    .unwrap()
}

#[tokio::test]
async fn validation_namespaces_render_their_bounds_and_the_dcgm_values_allow_a_diag() {
    let admin = admin_client().await.unwrap();
    // Bare names, as earlier charts took them: the chart's ServiceAccount (no RBAC, no token) in
    // each, and no privileges.
    let bare = render(&admin, &["operator.validation.namespaces={gpu-validation,nccl}"]).await;
    for ns in ["gpu-validation", "nccl"] {
        let sa = bare
            .iter()
            .find(|o| kind_of(o) == "ServiceAccount" && o.metadata.namespace.as_deref() == Some(ns))
            .unwrap_or_else(|| panic!("no validation ServiceAccount in {ns}"));
        assert_eq!(sa.metadata.name.as_deref(), Some("r-gpunode-validation"));
        assert_eq!(sa.data["automountServiceAccountToken"], false);
    }
    assert!(
        !bare.iter().any(|o| kind_of(o).ends_with("Binding")
            && o.data["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["name"] == "r-gpunode-validation")),
        "no RBAC is bound to the validation ServiceAccount"
    );
    let bounds = validation_bounds(&bare);
    let admitted = bounds.admit("gpu-validation", dcgm_diag(serde_json::json!({})));
    assert_eq!(
        admitted
            .ok()
            .and_then(|t| t.spec)
            .and_then(|s| s.service_account_name)
            .as_deref(),
        Some("r-gpunode-validation"),
        "a template naming no ServiceAccount gets the chart's"
    );
    let refused = bounds
        .admit(
            "gpu-validation",
            dcgm_diag(serde_json::json!({"capabilities": {"add": ["SYS_ADMIN"]}})),
        )
        .err()
        .unwrap_or_default();
    assert!(refused.contains("allowedCapabilities"), "{refused}");
    assert!(
        bounds
            .admit("kube-system", dcgm_diag(serde_json::json!({})))
            .is_err(),
        "a namespace not granted"
    );
    // The values the README gives for DCGM's diagnostics: SYS_ADMIN in gpu-validation, nothing
    // more; the chart's ServiceAccount still made.
    let dcgm = render_json(
        &admin,
        &[r#"operator.validation.namespaces=[{"name":"gpu-validation","allowedCapabilities":["SYS_ADMIN"]}]"#],
    )
    .await;
    assert!(
        dcgm.iter()
            .any(|o| kind_of(o) == "ServiceAccount"
                && o.metadata.namespace.as_deref() == Some("gpu-validation")),
        "the validation ServiceAccount"
    );
    one(&dcgm, "Role", "-operator-validation");
    let bounds = validation_bounds(&dcgm);
    let diag = dcgm_diag(serde_json::json!({"capabilities": {"add": ["SYS_ADMIN"]}}));
    assert!(
        bounds.admit("gpu-validation", diag).is_ok(),
        "dcgmi diag with SYS_ADMIN"
    );
    for beyond in [
        serde_json::json!({"privileged": true}),
        serde_json::json!({"capabilities": {"add": ["SYS_ADMIN", "NET_ADMIN"]}}),
    ] {
        assert!(
            bounds.admit("gpu-validation", dcgm_diag(beyond.clone())).is_err(),
            "{beyond} is beyond the DCGM values"
        );
    }
    // A namespace whose entry names its own ServiceAccounts gets none from the chart.
    let own = render_json(
        &admin,
        &[r#"operator.validation.namespaces=[{"name":"nccl","serviceAccounts":["nccl-tests"],"allowHostNamespaces":true}]"#],
    )
    .await;
    assert!(
        !own.iter()
            .any(|o| kind_of(o) == "ServiceAccount" && o.metadata.namespace.as_deref() == Some("nccl"))
    );
    let host = serde_json::from_value(serde_json::json!({"spec": {"hostNetwork": true,
        "serviceAccountName": "nccl-tests", "containers": [{"name": "t", "image": "t"}]}}))
    .unwrap();
    assert!(validation_bounds(&own).admit("nccl", host).is_ok());
    // An entry without a name is refused by the schema, naming the key.
    let err = helm(strings(&[
        "template",
        "r",
        &chart_path(),
        "--set-json",
        r#"operator.validation.namespaces=[{"allowPrivileged":true}]"#,
    ]))
    .await
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("missing property 'name'"), "{err}");
}

#[tokio::test]
async fn remediators_limited_to_namespaces_get_a_role_there_only_and_the_operator_the_same_bounds() {
    let admin = admin_client().await.unwrap();
    let limited = render_json(
        &admin,
        &[
            r#"operator.remediators=[{"apiGroup":"self-node-remediation.medik8s.io","resources":["selfnoderemediations"],"templates":["selfnoderemediationtemplates"],"namespaces":["medik8s","ops"]}]"#,
        ],
    )
    .await;
    assert!(
        !limited.iter().any(|o| kind_of(o) == "ClusterRole"
            && o.metadata.name.as_deref() == Some("r-gpunode-operator-remediators")),
        "no cluster-wide grant for an entry limited to namespaces"
    );
    for ns in ["medik8s", "ops"] {
        for kind in ["Role", "RoleBinding"] {
            assert!(
                limited.iter().any(|o| kind_of(o) == kind
                    && o.metadata.namespace.as_deref() == Some(ns)
                    && o.metadata.name.as_deref() == Some("r-gpunode-operator-remediators-0")),
                "no remediator {kind} in {ns}"
            );
        }
    }
    let flag = args(one(&limited, "Deployment", "-operator"))
        .into_iter()
        .find_map(|a| a.strip_prefix("--remediators=").map(str::to_string))
        .expect("the operator gets --remediators");
    let bounds = gpunode_operator::bounds::RemediatorBounds::parse(&flag).unwrap();
    let group = "self-node-remediation.medik8s.io";
    assert_eq!(bounds.admit(group, "selfnoderemediations", Some("ops")), Ok(()));
    let refused = bounds
        .admit(group, "selfnoderemediations", Some("kube-system"))
        .err()
        .unwrap_or_default();
    assert!(
        refused.contains("spec.repair.steps[].remediator.namespace")
            && refused.contains("operator.remediators[].namespaces"),
        "{refused}"
    );
    // Without namespaces: any namespace, as before (a ClusterRole and its binding).
    let anywhere = render_json(
        &admin,
        &[
            r#"operator.remediators=[{"apiGroup":"self-node-remediation.medik8s.io","resources":["selfnoderemediations"],"templates":["selfnoderemediationtemplates"]}]"#,
        ],
    )
    .await;
    one(&anywhere, "ClusterRole", "-operator-remediators");
    one(&anywhere, "ClusterRoleBinding", "-operator-remediators");
    let flag = args(one(&anywhere, "Deployment", "-operator"))
        .into_iter()
        .find_map(|a| a.strip_prefix("--remediators=").map(str::to_string))
        .expect("the operator gets --remediators");
    let bounds = gpunode_operator::bounds::RemediatorBounds::parse(&flag).unwrap();
    assert_eq!(
        bounds.admit(group, "selfnoderemediations", Some("kube-system")),
        Ok(())
    );
    assert!(
        bounds.admit("other.example", "reboots", Some("ops")).is_err(),
        "a kind not listed"
    );
}

/// A write as admission names it: (API group, resource or resource/subresource, operation).
type Write = (String, String, String);

/// Every write `rules` (RBAC PolicyRules) grant, as admission operations: create is CREATE,
/// update and patch are UPDATE (an apply that creates is granted create as well), delete is
/// DELETE. The leader Lease is left out: the fence must never match it.
fn granted_writes(rules: &Value) -> BTreeSet<Write> {
    let mut out = BTreeSet::new();
    for rule in rules.as_array().into_iter().flatten() {
        let list = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        };
        for verb in list("verbs") {
            let op = match verb.as_str() {
                "create" => "CREATE",
                "update" | "patch" => "UPDATE",
                "delete" => "DELETE",
                _ => continue,
            };
            for group in list("apiGroups") {
                for resource in list("resources").into_iter().filter(|r| r != "leases") {
                    out.insert((group.clone(), resource, op.to_string()));
                }
            }
        }
    }
    out
}

/// Every write the fence's resourceRules match.
fn fenced_writes(fence: &DynamicObject) -> BTreeSet<Write> {
    let mut out = BTreeSet::new();
    let rules = &fence.data["spec"]["matchConstraints"]["resourceRules"];
    for rule in rules.as_array().into_iter().flatten() {
        let list = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        };
        assert_eq!(list("apiVersions"), ["*"], "{rule}");
        for op in list("operations") {
            for group in list("apiGroups") {
                for resource in list("resources") {
                    out.insert((group.clone(), resource, op.clone()));
                }
            }
        }
    }
    out
}

/// The RBAC rules bound to the operator's ServiceAccount (`r-gpunode-operator` in `ns`).
fn operator_rules(objects: &[DynamicObject]) -> Value {
    let bound: BTreeSet<(String, Option<String>)> = objects
        .iter()
        .filter(|o| matches!(kind_of(o), "RoleBinding" | "ClusterRoleBinding"))
        .filter(|o| {
            o.data["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["kind"] == "ServiceAccount" && s["name"] == "r-gpunode-operator")
        })
        .map(|o| {
            let role = o.data["roleRef"]["name"].as_str().unwrap_or_default().to_string();
            let ns = (kind_of(o) == "RoleBinding")
                .then(|| o.metadata.namespace.clone())
                .flatten();
            (role, ns)
        })
        .collect();
    let rules: Vec<Value> = objects
        .iter()
        .filter(|o| matches!(kind_of(o), "Role" | "ClusterRole"))
        .filter(|o| {
            let ns = (kind_of(o) == "Role")
                .then(|| o.metadata.namespace.clone())
                .flatten();
            bound.contains(&(o.metadata.name.clone().unwrap_or_default(), ns))
        })
        .flat_map(|o| o.data["rules"].as_array().cloned().unwrap_or_default())
        .collect();
    Value::Array(rules)
}

#[tokio::test]
async fn the_leader_fence_matches_exactly_the_writes_the_operator_is_granted() {
    // The API server resolves the fence's Lease for every request it matches, everyone's: the
    // fence matches what the operator may write and nothing more, whatever the values grant.
    let admin = admin_client().await.unwrap();
    let granting = [
        r#"operator.remediators=[{"apiGroup":"self-node-remediation.medik8s.io","resources":["selfnoderemediations"],"templates":["selfnoderemediationtemplates"]},{"apiGroup":"machine.example.com","resources":["reboots"],"templates":["reboottemplates"],"namespaces":["ops"]}]"#,
        r#"operator.validation.namespaces=["gpu-validation"]"#,
    ];
    for sets in [&[][..], &granting[..]] {
        let objects = render_json(&admin, sets).await;
        let granted = granted_writes(&operator_rules(&objects));
        let fenced = fenced_writes(one(&objects, "ValidatingAdmissionPolicy", "-leader-fence"));
        assert!(granted.len() >= 10, "{sets:?}: {granted:?}");
        assert_eq!(
            fenced, granted,
            "{sets:?}: the fence must match exactly what RBAC lets the operator write"
        );
    }
    let ignore = render(&admin, &["operator.leaderElection.fenceFailurePolicy=Ignore"]).await;
    let fence = one(&ignore, "ValidatingAdmissionPolicy", "-leader-fence");
    assert_eq!(fence.data["spec"]["failurePolicy"], "Ignore");
    let err = helm(strings(&[
        "template",
        "r",
        &chart_path(),
        "--set",
        "operator.leaderElection.fenceFailurePolicy=Open",
    ]))
    .await
    .expect_err("fenceFailurePolicy=Open was accepted");
    assert!(err.to_string().contains("fenceFailurePolicy"), "{err}");
}
