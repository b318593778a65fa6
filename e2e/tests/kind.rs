//! gpunode on real kubelets: the kind cluster of `e2e/kind/` with the chart installed from the
//! images built on this machine (`e2e/kind/test.sh`, run by `make test`). What KWOK nodes cannot
//! show: the images start, the kubelet enforces the pods' security context, probes read the fake
//! NVML library and fixture sysfs mounted into their containers, real pods are evicted and
//! terminated by their kubelet within their grace period, the DaemonSet and the Deployment replace
//! deleted pods, and the RBAC and admission policies hold under tokens the kubelet minted.
//!
//! The tests share one cluster and one release: run them one at a time (`--test-threads=1`, as
//! test.sh does). Each leaves the nodes as it found them.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use gpunode_e2e::{
    audit, chart, crds,
    kind::{Kind, is_ready},
    scratch::Scratch,
    wait,
};
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    coordination::v1::Lease,
    core::v1::{Node, Pod, Secret, Service},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(120);

async fn kind() -> Kind {
    Kind::connect().await.unwrap()
}

#[tokio::test]
async fn the_chart_runs_on_real_pods_as_its_security_context_says() {
    let k = kind().await;
    let workers = k.workers().await.unwrap();

    // Both operator replicas Ready (the follower too: it must be able to take over).
    let deployments: Api<Deployment> = Api::namespaced(k.client.clone(), chart::NAMESPACE);
    wait::until("both operator replicas available", DEADLINE, || async {
        let d = deployments.get("gpunode-operator").await?;
        let s = d.status.unwrap_or_default();
        Ok((s.available_replicas == Some(2) && s.ready_replicas == Some(2)).then_some(()))
    })
    .await
    .unwrap();

    // One Ready probe per GPU worker, and none elsewhere.
    let daemonsets: Api<DaemonSet> = Api::namespaced(k.client.clone(), chart::NAMESPACE);
    let n = i32::try_from(workers.len()).unwrap_or(i32::MAX);
    wait::until("one Ready probe per GPU worker", DEADLINE, || async {
        let s = daemonsets
            .get("gpunode-node-probe")
            .await?
            .status
            .unwrap_or_default();
        Ok((s.desired_number_scheduled == n && s.number_ready == n).then_some(()))
    })
    .await
    .unwrap();
    let probes = k.chart_pods("node-probe").await.unwrap();
    let mut on: Vec<String> = probes
        .iter()
        .filter(|p| is_ready(p))
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    on.sort();
    assert_eq!(on, workers, "one probe on each GPU worker");

    // The probes share their node's network namespace (RoCE settings live there), and the init
    // container handed the XID state directory on the node to the probe's user.
    let nodes: Api<Node> = Api::all(k.client.clone());
    for p in &probes {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let n = nodes.get(&node).await.unwrap();
        let internal = n
            .status
            .and_then(|s| s.addresses)
            .unwrap_or_default()
            .into_iter()
            .find(|a| a.type_ == "InternalIP")
            .map(|a| a.address);
        assert_eq!(
            p.status.as_ref().and_then(|s| s.pod_ip.clone()),
            internal,
            "probe on {node} is on the host network"
        );
        let owner = k
            .exec(&node, &["stat", "-c", "%u:%g", "/var/lib/gpunode"])
            .unwrap();
        assert_eq!(owner.trim(), "65532:65532", "the XID state directory on {node}");
    }

    // What the kubelet enforced, read from the processes themselves on the nodes: uid 65532 and a
    // read-only root filesystem for the operator and the probe.
    for (node, binary) in [(&workers[0], "gpunode-probe"), (&workers[1], "gpunode-probe")] {
        check_process(&k, node, binary);
    }
    let operators = k.chart_pods("operator").await.unwrap();
    for p in &operators {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        check_process(&k, &node, "gpunode-operator");
    }
}

/// The process of `binary` on `node` runs as 65532:65532 with its root mounted read-only.
fn check_process(k: &Kind, node: &str, binary: &str) {
    let pids = k
        .exec(node, &["pgrep", "-f", &format!("^/usr/local/bin/{binary}")])
        .unwrap_or_else(|e| panic!("{binary} is not running on {node}: {e}"));
    for pid in pids.split_whitespace() {
        let status = k.exec(node, &["cat", &format!("/proc/{pid}/status")]).unwrap();
        let ids = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert!(
            ids("Uid:").iter().all(|u| *u == "65532") && ids("Gid:").iter().all(|g| *g == "65532"),
            "{binary} on {node} (pid {pid}) runs as {:?}/{:?}, not 65532",
            ids("Uid:"),
            ids("Gid:")
        );
        assert!(
            status
                .lines()
                .any(|l| l.starts_with("CapEff:") && l.ends_with("0000000000000000")),
            "{binary} on {node} (pid {pid}) holds capabilities: {status}"
        );
        let mounts = k.exec(node, &["cat", &format!("/proc/{pid}/mounts")]).unwrap();
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(1) == Some(&"/"))
            .unwrap_or_else(|| panic!("{binary} on {node}: no root mount in {mounts}"));
        let options = root.get(3).copied().unwrap_or_default();
        assert!(
            options.split(',').any(|o| o == "ro"),
            "{binary} on {node} (pid {pid}): root filesystem mounted {options}, not read-only"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Shared steps

const TAINT_KEY: &str = "gpunode.dev/drift";
const STATE_LABEL: &str = "gpunode.dev/state";

fn label(n: &Node, key: &str) -> Option<String> {
    n.metadata.labels.as_ref().and_then(|l| l.get(key).cloned())
}

fn drift_taint(n: &Node) -> Option<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|ts| ts.iter().find(|t| t.key == TAINT_KEY))
        .map(|t| format!("{}={}:{}", t.key, t.value.clone().unwrap_or_default(), t.effect))
}

fn unschedulable(n: &Node) -> bool {
    n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
}

async fn node_until<T>(k: &Kind, node: &str, what: &str, f: impl Fn(&Node) -> Option<T>) -> T {
    let nodes: Api<Node> = Api::all(k.client.clone());
    wait::until(&format!("{node}: {what}"), DEADLINE, || async {
        Ok(f(&nodes.get(node).await?))
    })
    .await
    .unwrap()
}

/// A policy selecting `node` alone; waits until the operator labelled it compliant.
async fn policy_for(k: &Kind, name: &str, node: &str, spec: serde_json::Value) {
    crds::create_policy(&k.client, name, spec).await.unwrap();
    node_until(k, node, "labelled compliant", |n| {
        (label(n, STATE_LABEL).as_deref() == Some("compliant")).then_some(())
    })
    .await;
}

/// What a test that failed half-way may have left: its policies (the operator then undoes their
/// marks) and changed fixtures. Every test that acts on nodes starts from here.
async fn reset(k: &Kind) {
    let policies: Api<GpuNodePolicy> = Api::all(k.client.clone());
    let left = policies.list(&ListParams::default()).await.unwrap();
    for p in left.items {
        let name = p.metadata.name.unwrap_or_default();
        if name.starts_with("kind-") {
            policies.delete(&name, &DeleteParams::default()).await.unwrap();
        }
    }
    wait::until("no kind- policy left", DEADLINE, || async {
        let list = policies.list(&ListParams::default()).await?;
        Ok((!list
            .items
            .iter()
            .any(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with("kind-"))))
        .then_some(()))
    })
    .await
    .unwrap();
    for node in k.workers().await.unwrap() {
        k.heal_fixture(&node).unwrap();
        node_until(k, &node, "free of gpunode's marks", |n| {
            let clean = label(n, STATE_LABEL).is_none() && drift_taint(n).is_none() && !unschedulable(n);
            clean.then_some(())
        })
        .await;
    }
}

/// Deletes the policy and waits until the operator undid everything on `node`.
async fn remove_policy(k: &Kind, name: &str, node: &str) {
    let policies: Api<GpuNodePolicy> = Api::all(k.client.clone());
    policies.delete(name, &DeleteParams::default()).await.unwrap();
    node_until(k, node, "released by the deleted policy", |n| {
        let clean = label(n, STATE_LABEL).is_none() && drift_taint(n).is_none() && !unschedulable(n);
        clean.then_some(())
    })
    .await;
    wait::until(&format!("policy {name} gone"), DEADLINE, || async {
        Ok(policies.get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
}

fn json_to<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// A pod of the test workload (e2e/kind/progs/workload), preloaded in the node image.
fn workload_pod(name: &str, node: &str, args: &[&str], labels: serde_json::Value) -> Pod {
    json_to(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "gpunode.local/workload:1",
                            "imagePullPolicy": "Never", "args": args}],
        }
    }))
}

async fn pod_until<T>(pods: &Api<Pod>, name: &str, what: &str, f: impl Fn(&Pod) -> Option<T>) -> T {
    wait::until(&format!("pod {name}: {what}"), DEADLINE, || async {
        Ok(pods.get_opt(name).await?.as_ref().and_then(&f))
    })
    .await
    .unwrap()
}

fn phase(p: &Pod) -> Option<String> {
    p.status.as_ref().and_then(|s| s.phase.clone())
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn pods_reach_each_other_across_nodes_through_a_service_and_cluster_dns() {
    let k = kind().await;
    let workers = k.workers().await.unwrap();
    let ns = Scratch::new(&k.client, "kind-net").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(k.client.clone(), &ns.name);
    let mut web = workload_pod("web", &workers[1], &["-serve", ":8080"], json!({"app": "web"}));
    if let Some(spec) = web.spec.as_mut() {
        spec.restart_policy = Some("Always".into());
    }
    pods.create(&PostParams::default(), &web).await.unwrap();
    let web = pod_until(&pods, "web", "Running", |p| {
        (phase(p).as_deref() == Some("Running")).then(|| p.clone())
    })
    .await;
    let ip = web.status.and_then(|s| s.pod_ip).expect("web has no pod IP");
    let services: Api<Service> = Api::namespaced(k.client.clone(), &ns.name);
    services
        .create(
            &PostParams::default(),
            &json_to(json!({
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
            })),
        )
        .await
        .unwrap();

    // From the other worker: the pod directly (cross-node routing), then by the Service's DNS name
    // (CoreDNS, kube-proxy). Each client exits 0 only on a 200 and prints what it got.
    let urls = [
        ("direct", format!("http://{ip}:8080/")),
        ("service", format!("http://web.{}.svc.cluster.local/", ns.name)),
    ];
    for (name, url) in &urls {
        pods.create(
            &PostParams::default(),
            &workload_pod(name, &workers[0], &["-get", url], json!({"app": "client"})),
        )
        .await
        .unwrap();
    }
    for (name, url) in &urls {
        let done = pod_until(&pods, name, "finished", |p| {
            matches!(phase(p).as_deref(), Some("Succeeded" | "Failed")).then(|| phase(p))
        })
        .await;
        let log = pods.logs(name, &LogParams::default()).await.unwrap();
        assert_eq!(
            done.as_deref(),
            Some("Succeeded"),
            "{name}: GET {url} from {} failed: {log}",
            workers[0]
        );
        // The last line is the answer; retries while kube-proxy catches up are logged before it.
        let answer = log
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default();
        assert_eq!(
            answer.trim(),
            "web",
            "{name}: GET {url} answered by the web pod:\n{log}"
        );
    }
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn a_throttled_gpu_taints_its_node_after_the_delay_and_recovery_removes_the_taint() {
    let k = kind().await;
    let workers = k.workers().await.unwrap();
    let node = workers[0].clone();
    reset(&k).await;
    k.forget_xids(&node, DEADLINE).await.unwrap();
    let (after, healthy_for) = (Duration::from_secs(3), Duration::from_secs(6));
    policy_for(
        &k,
        "kind-throttle",
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {},
            "cooling": {"forbiddenThrottleReasons": ["HwThermalSlowdown"]},
            "remediation": [{"classes": ["Throttle"], "action": "Taint", "effect": "NoSchedule",
                             "after": format!("{}s", after.as_secs())}],
            "recovery": {"healthyFor": format!("{}s", healthy_for.as_secs())},
            "staleAfter": "1m",
        }),
    )
    .await;

    // GPU 2 starts throttling on heat (GpuIdle | HwThermalSlowdown), as the probe pod reads it.
    let start = Instant::now();
    k.edit_fixture(&node, |f| f["devices"][2]["throttle_reasons"] = json!(0x41))
        .unwrap();
    node_until(&k, &node, "labelled drifted", |n| {
        (label(n, STATE_LABEL).as_deref() == Some("drifted")).then_some(())
    })
    .await;
    let taint = node_until(&k, &node, "tainted", drift_taint).await;
    let tainted_after = start.elapsed();
    assert_eq!(taint, "gpunode.dev/drift=throttle:NoSchedule");
    assert!(
        tainted_after >= after,
        "tainted {tainted_after:?} after the throttle began, before its `after` of {after:?}"
    );

    // What a user reads while it is tainted.
    let describe = k.kubectl(&["describe", "node", &node]).unwrap();
    for want in [
        "gpunode.dev/drift=throttle:NoSchedule",
        "GpuPolicyCompliant",
        "HwThermalSlowdown",
    ] {
        assert!(
            describe.contains(want),
            "kubectl describe node {node} lacks {want:?}:\n{describe}"
        );
    }
    let events = k
        .kubectl(&[
            "get",
            "events",
            "-A",
            "--field-selector",
            &format!("involvedObject.name={node}"),
        ])
        .unwrap();
    for want in ["Drifted", "Tainted"] {
        assert!(events.contains(want), "no {want} event on {node}:\n{events}");
    }
    let leader = k.leader().await.unwrap().expect("no leader");
    let logs = k.kubectl(&["-n", chart::NAMESPACE, "logs", &leader]).unwrap();
    assert!(
        logs.contains(&node),
        "the leader's log never names {node}:\n{logs}"
    );
    // /metrics through the chart's Service (the API server's service proxy), as a user or a
    // plain Prometheus job reaches it: either replica answers. The node gauges are the leader's:
    // read through its pod.
    let metrics_of = |path: String| k.kubectl(&["get", "--raw", &path]).unwrap();
    let via_service = metrics_of(format!(
        "/api/v1/namespaces/{}/services/gpunode-operator-metrics:metrics/proxy/metrics",
        chart::NAMESPACE
    ));
    assert!(
        via_service.contains("# TYPE gpunode_leader gauge"),
        "/metrics through the Service:\n{via_service}"
    );
    let via_leader = metrics_of(format!(
        "/api/v1/namespaces/{}/pods/{leader}:8080/proxy/metrics",
        chart::NAMESPACE
    ));
    for want in [
        "gpunode_leader 1",
        "gpunode_nodes{policy=\"kind-throttle\",state=\"drifted\"} 1",
    ] {
        assert!(via_leader.contains(want), "the leader's /metrics lacks {want:?}");
    }

    // Recovery: the taint goes only once the GPU has been healthy for healthyFor.
    let healed = Instant::now();
    k.heal_fixture(&node).unwrap();
    node_until(&k, &node, "taint removed", |n| {
        drift_taint(n).is_none().then_some(())
    })
    .await;
    let removed_after = healed.elapsed();
    assert!(
        removed_after >= healthy_for,
        "taint removed {removed_after:?} after recovery, before healthyFor {healthy_for:?}"
    );
    node_until(&k, &node, "labelled compliant again", |n| {
        (label(n, STATE_LABEL).as_deref() == Some("compliant")).then_some(())
    })
    .await;
    remove_policy(&k, "kind-throttle", &node).await;
}

/// The validation gate on real kubelets: a throttled node is cordoned; once it recovered, a
/// validation Job from the policy's template (the test workload fetching the operator's /metrics
/// through the Service and cluster DNS) is scheduled by the real scheduler onto the cordoned node
/// (its affinity and tolerations) and run by its kubelet, with the chart's RBAC for the Job's
/// namespace; the node is uncordoned only after the Job completed. A template whose pod exits 1
/// keeps the node cordoned, drifting in class Validation.
#[tokio::test]
async fn a_recovered_node_is_uncordoned_only_after_its_validation_job_ran_on_it() {
    let k = kind().await;
    let workers = k.workers().await.unwrap();
    let node = workers[0].clone();
    reset(&k).await;
    k.forget_xids(&node, DEADLINE).await.unwrap();
    let metrics = format!("http://gpunode-operator-metrics.{}.svc:8080", chart::NAMESPACE);
    let spec = |path: &str| {
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {},
            "cooling": {"forbiddenThrottleReasons": ["HwThermalSlowdown"]},
            "remediation": [{"classes": ["Throttle", "Validation"], "action": "Cordon"}],
            "recovery": {"healthyFor": "3s"},
            "staleAfter": "1m",
            "validation": {
                "namespace": "gpunode-validation",
                "timeout": "90s",
                "template": {"spec": {"containers": [{
                    "name": "diag", "image": "gpunode.local/workload:1", "imagePullPolicy": "Never",
                    "args": ["-get", format!("{metrics}{path}")],
                }]}},
            },
        })
    };
    policy_for(&k, "kind-validation", &node, spec("/metrics")).await;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(k.client.clone(), "gpunode-validation");
    let pods: Api<Pod> = Api::namespaced(k.client.clone(), "gpunode-validation");
    let throttle = |k: &Kind| {
        k.edit_fixture(&node, |f| f["devices"][2]["throttle_reasons"] = json!(0x41))
            .unwrap()
    };
    let job_of = |node: String| {
        let jobs = jobs.clone();
        async move {
            wait::until(&format!("the validation Job of {node}"), DEADLINE, || async {
                let label = format!("gpunode.dev/validation-node={node}");
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
    };

    // Passes: the pod runs on the cordoned node, then the node returns.
    throttle(&k);
    node_until(&k, &node, "cordoned", |n| unschedulable(n).then_some(())).await;
    k.heal_fixture(&node).unwrap();
    let job = job_of(node.clone()).await;
    let name = job.metadata.name.clone().unwrap();
    let pod = wait::until("the validation pod succeeded", DEADLINE, || async {
        let label = format!("job-name={name}");
        Ok(pods
            .list(&ListParams::default().labels(&label))
            .await?
            .items
            .into_iter()
            .find(|p| phase(p).as_deref() == Some("Succeeded")))
    })
    .await
    .unwrap();
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.as_str()),
        "the validation ran on the node it validates"
    );
    node_until(&k, &node, "uncordoned after the validation passed", |n| {
        (!unschedulable(n) && label(n, "gpunode.dev/validation").is_none()).then_some(())
    })
    .await;
    let events = k
        .kubectl(&[
            "get",
            "events",
            "-A",
            "--field-selector",
            &format!("involvedObject.name={node}"),
        ])
        .unwrap();
    assert!(
        events.contains("ValidationPassed") && events.contains(&name),
        "{events}"
    );

    // Passes with the README's values for DCGM diagnostics: its namespace entry grants the
    // SYS_ADMIN capability a DCGM container adds, and the pod runs with it (the workload image
    // stands in for NVIDIA's, which no registry here serves).
    let documented = dcgm_values_in_readme();
    let kind_values = kind_validation_namespaces();
    assert!(
        kind_values.contains(&documented),
        "values-kind.yaml has the README's DCGM entry {documented:?}: {kind_values:?}"
    );
    let dcgm = |spec: &mut serde_json::Value| {
        spec["validation"]["namespace"] = documented["name"].clone();
        spec["validation"]["template"]["spec"]["containers"][0]["securityContext"] =
            json!({"capabilities": {"add": ["SYS_ADMIN"]}});
    };
    let mut dcgm_spec = spec("/metrics");
    dcgm(&mut dcgm_spec);
    Api::<GpuNodePolicy>::all(k.client.clone())
        .patch(
            "kind-validation",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": dcgm_spec})),
        )
        .await
        .unwrap();
    throttle(&k);
    node_until(&k, &node, "cordoned", |n| unschedulable(n).then_some(())).await;
    k.heal_fixture(&node).unwrap();
    let dcgm_pods: Api<Pod> = Api::namespaced(k.client.clone(), "gpu-validation");
    let pod = wait::until("the DCGM-style validation pod succeeded", DEADLINE, || async {
        let label = format!("gpunode.dev/validation-node={node}");
        Ok(dcgm_pods
            .list(&ListParams::default().labels(&label))
            .await?
            .items
            .into_iter()
            .find(|p| phase(p).as_deref() == Some("Succeeded")))
    })
    .await
    .unwrap();
    let added = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.security_context.as_ref())
        .and_then(|c| c.capabilities.as_ref())
        .and_then(|c| c.add.clone());
    assert_eq!(added, Some(vec!["SYS_ADMIN".to_string()]));
    node_until(
        &k,
        &node,
        "uncordoned after the DCGM-style validation passed",
        |n| (!unschedulable(n) && label(n, "gpunode.dev/validation").is_none()).then_some(()),
    )
    .await;

    // Fails (the pod exits 1 on a 404): the node stays cordoned, drifting in Validation.
    let policies: Api<GpuNodePolicy> = Api::all(k.client.clone());
    policies
        .patch(
            "kind-validation",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec("/no-such-path")})),
        )
        .await
        .unwrap();
    throttle(&k);
    node_until(&k, &node, "cordoned", |n| unschedulable(n).then_some(())).await;
    k.heal_fixture(&node).unwrap();
    node_until(&k, &node, "drifting in Validation", |n| {
        (label(n, "gpunode.dev/drift.validation").as_deref() == Some("true")
            && label(n, "gpunode.dev/validation").as_deref() == Some("failed"))
        .then_some(())
    })
    .await;
    let n = Api::<Node>::all(k.client.clone()).get(&node).await.unwrap();
    assert!(unschedulable(&n), "a failed validation keeps the node cordoned");
    remove_policy(&k, "kind-validation", &node).await;
}

/// The `operator.validation.namespaces` entry the README documents for DCGM diagnostics (the
/// first YAML block after "**DCGM diagnostics.**").
fn dcgm_values_in_readme() -> serde_json::Value {
    let readme = std::fs::read_to_string(gpunode_e2e::fixtures::repo_root().join("README.md")).unwrap();
    let (_, after) = readme.split_once("**DCGM diagnostics.**").unwrap();
    let (_, block) = after.split_once("```yaml").unwrap();
    let (block, _) = block.split_once("```").unwrap();
    let values: serde_json::Value = serde_yaml::from_str(block).unwrap();
    values["operator"]["validation"]["namespaces"][0].clone()
}

/// `operator.validation.namespaces` of the kind suite's values.
fn kind_validation_namespaces() -> Vec<serde_json::Value> {
    let path = gpunode_e2e::fixtures::repo_root().join("e2e/kind/values-kind.yaml");
    let values: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    values["operator"]["validation"]["namespaces"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Pod deletions seen by a watch: when each pod was first seen terminating and when it was gone,
/// with the grace period it was deleted with; and the fewest Ready pods of the app seen at once
/// (from the first complete list on, after every change).
#[derive(Default, Clone)]
struct Terminations {
    started: BTreeMap<String, (Instant, Option<i64>, String)>,
    gone: BTreeMap<String, Instant>,
    min_ready: Option<usize>,
}

fn watch_terminations(
    pods: Api<Pod>,
    selector: &str,
) -> (Arc<Mutex<Terminations>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Terminations::default()));
    let sink = seen.clone();
    let config = watcher::Config::default().labels(selector);
    let task = tokio::spawn(async move {
        let (store, writer) = reflector::store::<Pod>();
        let mut events = watcher(pods, config).reflect(writer).boxed();
        let mut listed = false;
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let now = Instant::now();
            let Ok(mut t) = sink.lock() else { return };
            let terminating = |t: &mut Terminations, p: &Pod| {
                let name = p.metadata.name.clone().unwrap_or_default();
                if p.metadata.deletion_timestamp.is_some() && !t.started.contains_key(&name) {
                    let node = p
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default();
                    t.started
                        .insert(name, (now, p.metadata.deletion_grace_period_seconds, node));
                }
            };
            match &event {
                watcher::Event::Apply(p) => terminating(&mut t, p),
                watcher::Event::Delete(p) => {
                    terminating(&mut t, p);
                    let name = p.metadata.name.clone().unwrap_or_default();
                    t.gone.entry(name).or_insert(now);
                }
                watcher::Event::InitDone => listed = true,
                watcher::Event::Init | watcher::Event::InitApply(_) => continue,
            }
            if !listed {
                continue;
            }
            let state = store.state();
            for p in &state {
                terminating(&mut t, p);
            }
            // A pod deleted while the watch was re-listing has no Delete event: it is just absent.
            let listed_names: Vec<&str> = state.iter().filter_map(|p| p.metadata.name.as_deref()).collect();
            let vanished: Vec<String> = t
                .started
                .keys()
                .filter(|n| !listed_names.contains(&n.as_str()) && !t.gone.contains_key(*n))
                .cloned()
                .collect();
            for n in vanished {
                t.gone.insert(n, now);
            }
            let ready = state
                .iter()
                .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
                .count();
            t.min_ready = Some(t.min_ready.map_or(ready, |m| m.min(ready)));
        }
    });
    (seen, task)
}

#[tokio::test]
async fn xid_79_drains_real_pods_within_their_pdb_and_grace_and_a_force_deleted_leader_hands_over() {
    let k = kind().await;
    let workers = k.workers().await.unwrap();
    let (bad, spare) = (workers[0].clone(), workers[1].clone());
    reset(&k).await;
    k.forget_xids(&bad, DEADLINE).await.unwrap();
    let ns = Scratch::new(&k.client, "kind-drain").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(k.client.clone(), &ns.name);
    let grace = 15;
    // Four replicas, two per worker; a replacement is Ready only 20 s after it starts, which
    // holds the second eviction behind the PodDisruptionBudget long enough to kill the leader.
    let deployments: Api<Deployment> = Api::namespaced(k.client.clone(), &ns.name);
    deployments
        .create(
            &PostParams::default(),
            &json_to(json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train"},
                "spec": {
                    "replicas": 4,
                    "selector": {"matchLabels": {"app": "train"}},
                    "template": {
                        "metadata": {"labels": {"app": "train"}},
                        "spec": {
                            "terminationGracePeriodSeconds": grace,
                            "nodeSelector": {"nvidia.com/gpu.present": "true"},
                            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "train"}},
                                // The cordoned node leaves the spread: replacements go to the spare.
                                "nodeTaintsPolicy": "Honor"}],
                            "containers": [{"name": "main", "image": "gpunode.local/workload:1",
                                "imagePullPolicy": "Never", "args": ["-drain", "3s", "-serve", ":8080"],
                                "readinessProbe": {"httpGet": {"path": "/", "port": 8080},
                                                   "initialDelaySeconds": 20, "periodSeconds": 1}}],
                        }
                    }
                }
            })),
        )
        .await
        .unwrap();
    Api::<PodDisruptionBudget>::namespaced(k.client.clone(), &ns.name)
        .create(
            &PostParams::default(),
            &json_to(json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "train"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "train"}}}
            })),
        )
        .await
        .unwrap();
    wait::until("4 replicas available, 2 per worker", DEADLINE, || async {
        let d = deployments.get("train").await?;
        let list = pods.list(&ListParams::default().labels("app=train")).await?;
        let on_bad = list
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(bad.as_str()))
            .count();
        Ok((d.status.and_then(|s| s.available_replicas) == Some(4) && on_bad == 2).then_some(()))
    })
    .await
    .unwrap();
    let victims: Vec<String> = pods
        .list(&ListParams::default().labels("app=train"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(bad.as_str()))
        .filter_map(|p| p.metadata.name)
        .collect();

    policy_for(
        &k,
        "kind-drain",
        &bad,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": bad}},
            "gpu": {},
            "remediation": [{"classes": ["Xid"], "action": "Drain"}],
            "recovery": {"healthyFor": "5s"},
            "staleAfter": "1m",
        }),
    )
    .await;
    let (seen, observer) = watch_terminations(pods.clone(), "app=train");
    let log = k.audit();

    // GPU 1 falls off the bus.
    k.inject_xid(&bad, 1, 79, DEADLINE).await.unwrap();
    node_until(&k, &bad, "cordoned", |n| unschedulable(n).then_some(())).await;

    // The budget lets one pod go; the second eviction is refused (429) until a replacement is
    // Ready on the spare worker. Then the leader's pod is force-deleted.
    wait::until(
        "one eviction admitted and one refused by the budget",
        DEADLINE,
        || async {
            let events = log.events()?;
            let ev: Vec<_> = events.iter().filter(|e| e.is_eviction_in(&ns.name)).collect();
            let ok = ev.iter().filter(|e| e.succeeded()).count();
            let refused = ev.iter().filter(|e| e.code == 429).count();
            Ok((ok == 1 && refused >= 1).then_some(()))
        },
    )
    .await
    .unwrap();
    // Between two terms (a Lease released or handed over) no replica is named: wait for one.
    let old_leader = wait::until("a replica leads", DEADLINE, || async { k.leader().await })
        .await
        .unwrap();
    let operator_pods: Api<Pod> = Api::namespaced(k.client.clone(), chart::NAMESPACE);
    operator_pods
        .delete(
            &old_leader,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let killed_at = jiff::Timestamp::now();
    let new_leader = wait::until("another replica leads", DEADLINE, || async {
        Ok(k.leader().await?.filter(|l| *l != old_leader))
    })
    .await
    .unwrap();

    // The new leader finishes the drain: both pods gone from the bad node, four Ready on the spare.
    wait::until(
        "the drain finished: 4 replicas available on the spare worker",
        Duration::from_secs(180),
        || async {
            let d = deployments.get("train").await?;
            let list = pods.list(&ListParams::default().labels("app=train")).await?;
            let left_on_bad = list
                .items
                .iter()
                .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(bad.as_str()));
            Ok((!left_on_bad && d.status.and_then(|s| s.available_replicas) == Some(4)).then_some(()))
        },
    )
    .await
    .unwrap();
    observer.abort();
    let replicas = pods
        .list(&ListParams::default().labels("app=train"))
        .await
        .unwrap();
    assert!(
        replicas
            .items
            .iter()
            .all(
                |p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(spare.as_str())
                    && is_ready(p)
            ),
        "the replacements run on {spare}"
    );

    // No pod evicted twice; exactly the two on the bad node; the second one after the hand-over.
    let events = log.events().unwrap();
    let per_pod = audit::evictions(&events, &ns.name);
    let mut evicted: Vec<String> = per_pod.keys().cloned().collect();
    evicted.sort();
    let mut expected = victims.clone();
    expected.sort();
    assert_eq!(evicted, expected, "the pods evicted are the two on {bad}");
    assert!(
        per_pod.values().all(|n| *n == 1),
        "a pod was evicted twice: {per_pod:?}"
    );
    let last = events
        .iter()
        .filter(|e| e.is_eviction_in(&ns.name) && e.succeeded())
        .map(|e| e.at)
        .max()
        .expect("no eviction");
    assert!(
        last > killed_at,
        "the second eviction came before the leader {old_leader} was killed"
    );

    // Each evicted pod was terminated by its kubelet with the pod's own grace period: the
    // workload finished its 3 s of work after SIGTERM before it went away.
    let t = seen.lock().map(|g| g.clone()).unwrap();
    for v in &victims {
        let (started, grace_seen, node) = t
            .started
            .get(v)
            .cloned()
            .unwrap_or_else(|| panic!("{v} never seen terminating"));
        assert_eq!(node, bad);
        assert_eq!(
            grace_seen,
            Some(grace),
            "{v} deleted with grace {grace_seen:?}, not its {grace} s"
        );
        let gone = t
            .gone
            .get(v)
            .copied()
            .unwrap_or_else(|| panic!("{v} never went away"));
        let took = gone.duration_since(started);
        assert!(
            took >= Duration::from_millis(2500)
                && took < Duration::from_secs(u64::try_from(grace).unwrap_or(15)),
            "{v} took {took:?} to terminate: not the workload's 3 s within its {grace} s grace"
        );
    }
    // The budget allows one unavailable of four: never fewer than three Ready.
    assert!(
        t.min_ready.is_some_and(|m| m >= 3),
        "Ready replicas fell to {:?}",
        t.min_ready
    );
    eprintln!("drain finished by {new_leader} after {old_leader} was force-deleted");

    remove_policy(&k, "kind-drain", &bad).await;
    k.forget_xids(&bad, DEADLINE).await.unwrap();
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn a_deleted_probe_pod_comes_back_and_its_node_stays_drifted() {
    let k = kind().await;
    let workers = k.workers().await.unwrap();
    let node = workers[1].clone();
    reset(&k).await;
    k.forget_xids(&node, DEADLINE).await.unwrap();
    policy_for(
        &k,
        "kind-xid-state",
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {},
            "remediation": [{"classes": ["Xid"], "action": "Taint", "effect": "NoSchedule"}],
            "recovery": {"healthyFor": "5s"},
            "staleAfter": "1m",
        }),
    )
    .await;
    k.inject_xid(&node, 4, 79, DEADLINE).await.unwrap();
    node_until(&k, &node, "drifted and tainted", |n| {
        (label(n, STATE_LABEL).as_deref() == Some("drifted") && drift_taint(n).is_some()).then_some(())
    })
    .await;

    // The XID event is not in NVML any more after a restart (it reached only the event set of
    // the probe that saw it happen): only the probe's XID state keeps the node drifted.
    let old = k.probe_pod(&node, DEADLINE).await.unwrap();
    let old_name = old.metadata.name.clone().unwrap_or_default();
    let probe_pods: Api<Pod> = Api::namespaced(k.client.clone(), chart::NAMESPACE);
    probe_pods
        .delete(&old_name, &DeleteParams::default())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(k.client.clone());
    let fresh = wait::until("the DaemonSet's new probe pod Ready", DEADLINE, || async {
        let n = nodes.get(&node).await?;
        // The node must never look healthy in the meantime.
        if label(&n, STATE_LABEL).as_deref() != Some("drifted") {
            return Err(gpunode_e2e::Error::Unexpected(format!(
                "{node} left drifted: {:?}",
                label(&n, STATE_LABEL)
            )));
        }
        let p = k.probe_pod(&node, Duration::from_secs(1)).await.ok();
        Ok(p.filter(|p| p.metadata.name.as_deref() != Some(old_name.as_str())))
    })
    .await
    .unwrap();
    let fresh_name = fresh.metadata.name.clone().unwrap_or_default();
    let fresh_start = fresh
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .map(|t| t.0)
        .expect("the new probe pod has no start time");
    // Its first report, written after it started, still carries XID 79 on GPU 4.
    let reports: Api<GpuNodeReport> = Api::all(k.client.clone());
    wait::until(
        "a report from the new probe pod with XID 79 on GPU 4",
        DEADLINE,
        || async {
            let r = reports.get(&node).await?;
            let v = serde_json::to_value(&r)?;
            let observed: Option<jiff::Timestamp> = v
                .pointer("/status/observedAt")
                .and_then(|t| t.as_str())
                .and_then(|t| t.parse().ok());
            let fresh_enough = observed.is_some_and(|o| o.as_second() >= fresh_start.as_second());
            let xid = v
                .pointer("/status/gpus/4/xids")
                .and_then(|x| x.as_array())
                .is_some_and(|xs| xs.iter().any(|x| x["xid"] == 79));
            let n = nodes.get(&node).await?;
            if label(&n, STATE_LABEL).as_deref() != Some("drifted") {
                return Err(gpunode_e2e::Error::Unexpected(format!("{node} left drifted")));
            }
            Ok((fresh_enough && xid).then_some(()))
        },
    )
    .await
    .unwrap();
    let metrics = k
        .kubectl(&[
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/{}/pods/{fresh_name}:21400/proxy/metrics",
                chart::NAMESPACE
            ),
        ])
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gpunode_probe_xid_state_restored") && !l.ends_with(" 0")),
        "the new probe restored no XID:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("xid_state"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    remove_policy(&k, "kind-xid-state", &node).await;
    k.forget_xids(&node, DEADLINE).await.unwrap();
}

/// A client for the kind cluster authenticating with `token`.
async fn client_with_token(k: &Kind, token: &str) -> Client {
    let kc = Kubeconfig::read_from(&k.kubeconfig).unwrap();
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    Client::try_from(config).unwrap()
}

fn denied_with(r: Result<impl std::fmt::Debug, kube::Error>, what: &str, message: &str) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(message) => {}
        other => panic!("{what}: expected 403 naming {message:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_probe_writes_only_its_own_nodes_report_and_lease_with_the_token_its_kubelet_minted() {
    let k = kind().await;
    let workers = k.workers().await.unwrap();
    let (own, other) = (workers[0].clone(), workers[1].clone());
    let pod = k.probe_pod(&own, DEADLINE).await.unwrap();
    let uid = pod.metadata.uid.clone().expect("probe pod without uid");
    // The projected token the kubelet wrote into the pod's volume, as the probe reads it.
    let token = k
        .exec(
            &own,
            &[
                "sh",
                "-c",
                &format!("cat /var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~projected/*/token"),
            ],
        )
        .unwrap();
    let probe = client_with_token(&k, token.trim()).await;
    let dry = PatchParams::apply("gpunode-e2e-kind").dry_run().force();

    let reports: Api<GpuNodeReport> = Api::all(probe.clone());
    // Server-side apply bodies name their object, as the probe's own do.
    let status = |node: &str| {
        json!({"apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport", "metadata": {"name": node},
               "status": {"observedAt": jiff::Timestamp::now().to_string(), "gpuCount": 8}})
    };
    reports
        .patch_status(&own, &dry, &Patch::Apply(&status(&own)))
        .await
        .expect("its own node's report");
    denied_with(
        reports
            .patch_status(&other, &dry, &Patch::Apply(&status(&other)))
            .await,
        "another node's report",
        chart::OTHER_NODE_MESSAGE,
    );

    let leases: Api<Lease> = Api::namespaced(probe.clone(), chart::NAMESPACE);
    let lease = |node: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": format!("gpunode-probe-{node}"), "namespace": chart::NAMESPACE},
               "spec": {"holderIdentity": node, "leaseDurationSeconds": 60}})
    };
    leases
        .patch(&format!("gpunode-probe-{own}"), &dry, &Patch::Apply(&lease(&own)))
        .await
        .expect("its own heartbeat Lease");
    denied_with(
        leases
            .patch(
                &format!("gpunode-probe-{other}"),
                &dry,
                &Patch::Apply(&lease(&other)),
            )
            .await,
        "another node's heartbeat Lease",
        chart::LEASE_OTHER_NODE_MESSAGE,
    );
    // RBAC: nothing beyond what it needs.
    let secrets: Api<Secret> = Api::namespaced(probe.clone(), chart::NAMESPACE);
    match secrets.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("the probe listed Secrets: {other:?}"),
    }
    let nodes: Api<Node> = Api::all(probe);
    match nodes
        .patch(
            &other,
            &dry,
            &Patch::Apply(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"labels": {"x": "y"}}})),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("the probe labelled a node: {other:?}"),
    }
}
