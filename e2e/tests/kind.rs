//! gpunode on real kubelets: the kind cluster of `e2e/kind/` with the chart installed from the
//! images built on this machine (`e2e/kind/test.sh`, run by `make test`). What KWOK nodes cannot
//! show: the images start, the kubelet enforces the pods' security context, probes read the fake
//! NVML library and fixture sysfs mounted into their containers, real pods are evicted and
//! terminated by their kubelet within their grace period, the DaemonSet and the Deployment replace
//! deleted pods, and the RBAC and admission policies hold under tokens the kubelet minted.
//!
//! The tests share one cluster and one release: run them one at a time (`--test-threads=1`, as
//! test.sh does). Each leaves the nodes as it found them.

use std::time::Duration;

use gpunode_e2e::{
    chart,
    kind::{Kind, is_ready},
    wait,
};
use k8s_openapi::api::{apps::v1::DaemonSet, apps::v1::Deployment};
use kube::Api;

const DEADLINE: Duration = Duration::from_secs(120);

fn fail(e: impl std::fmt::Display) -> ! {
    panic!("{e}")
}

async fn kind() -> Kind {
    Kind::connect().await.unwrap_or_else(|e| fail(e))
}

#[tokio::test]
async fn the_chart_runs_on_real_pods_as_its_security_context_says() {
    let k = kind().await;
    let workers = k.workers().await.unwrap_or_else(|e| fail(e));

    // Both operator replicas Ready (the follower too: it must be able to take over).
    let deployments: Api<Deployment> = Api::namespaced(k.client.clone(), chart::NAMESPACE);
    wait::until("both operator replicas available", DEADLINE, || async {
        let d = deployments.get("gpunode-operator").await?;
        let s = d.status.unwrap_or_default();
        Ok((s.available_replicas == Some(2) && s.ready_replicas == Some(2)).then_some(()))
    })
    .await
    .unwrap_or_else(|e| fail(e));

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
    .unwrap_or_else(|e| fail(e));
    let probes = k.chart_pods("node-probe").await.unwrap_or_else(|e| fail(e));
    let mut on: Vec<String> = probes
        .iter()
        .filter(|p| is_ready(p))
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    on.sort();
    assert_eq!(on, workers, "one probe on each GPU worker");

    // What the kubelet enforced, read from the processes themselves on the nodes: uid 65532 and a
    // read-only root filesystem for the operator and the probe.
    for (node, binary) in [(&workers[0], "gpunode-probe"), (&workers[1], "gpunode-probe")] {
        check_process(&k, node, binary);
    }
    let operators = k.chart_pods("operator").await.unwrap_or_else(|e| fail(e));
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
        .unwrap_or_else(|e| fail(format!("{binary} is not running on {node}: {e}")));
    for pid in pids.split_whitespace() {
        let status = k
            .exec(node, &["cat", &format!("/proc/{pid}/status")])
            .unwrap_or_else(|e| fail(e));
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
        let mounts = k
            .exec(node, &["cat", &format!("/proc/{pid}/mounts")])
            .unwrap_or_else(|e| fail(e));
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(1) == Some(&"/"))
            .unwrap_or_else(|| fail(format!("{binary} on {node}: no root mount in {mounts}")));
        let options = root.get(3).copied().unwrap_or_default();
        assert!(
            options.split(',').any(|o| o == "ro"),
            "{binary} on {node} (pid {pid}): root filesystem mounted {options}, not read-only"
        );
    }
}
