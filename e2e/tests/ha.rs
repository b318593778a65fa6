//! Two operator replicas as real processes (`gpunode-operator run --leader-elect`) on the real
//! API server, with one drifting node:
//!
//! - only the Lease holder writes: the follower's `/metrics` shows no Node write while the
//!   leader's shows the taint it wrote, and the follower says it is not the leader;
//! - SIGKILL of the leader hands over within the lease duration (plus the retry period and
//!   some scheduling slack), measured and printed, and the new leader finishes the remediation
//!   ladder the old one started (the cordon that is due later), from the bookkeeping on the node;
//! - SIGTERM stops a replica cleanly (exit 0) and releases the Lease, so the other takes over at
//!   once instead of after the lease duration.
//!
//! Needs the binaries built (`make test` builds them first): `gpunode-operator` next to this
//! test's target directory.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::Path,
    process::ExitStatus,
    time::{Duration, Instant},
};

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    accounts, chart,
    cluster::admin_client,
    crds, http, nodes,
    operator::{self, Process, Spec},
    reports,
    scratch::rand_suffix,
    wait,
};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{Api, Client, api::ResourceExt};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);
/// The operator's lease duration and retry period (gpunode_operator::leader defaults).
const LEASE: Duration = gpunode_operator::leader::DEFAULT_LEASE_DURATION;
const RETRY: Duration = gpunode_operator::leader::DEFAULT_RETRY_PERIOD;
/// Process start-up, a watch round trip and two loaded CPUs.
const SLACK: Duration = Duration::from_secs(3);
/// The ladder's second rung: a cordon this long after the drift began.
const CORDON_AFTER: &str = "25s";

/// One operator replica as a process (killed if the test fails before stopping it), with the
/// chart's operator ServiceAccount and its Lease in `namespace`.
fn start(id: &str, namespace: &str, kubeconfig: &Path, logs: &Path) -> Process {
    let spec = Spec::leader_elect(operator::binary().unwrap(), id, kubeconfig, namespace).unwrap();
    Process::start(spec, logs.join(format!("{id}.log"))).unwrap()
}

/// One series of its `/metrics` (the sum over all label sets), or None while the server is not
/// up or has no such series.
async fn metric(replica: &Process, family: &str) -> Option<f64> {
    http::sum(&replica.scrape().await.ok()?, family)
}

/// SIGTERM, then wait for the exit.
async fn terminate(replica: &mut Process) -> ExitStatus {
    replica.terminate().unwrap();
    replica.wait_exit(Duration::from_secs(30)).await.unwrap()
}

async fn status_line(replica: &Process, path: &str) -> Option<u16> {
    http::get(replica.spec.metrics_addr, path)
        .await
        .ok()
        .map(|r| r.status)
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(gpunode_operator::leader::DEFAULT_LEASE_NAME)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

async fn wait_holder(leases: &Api<Lease>, want: &str, timeout: Duration) -> Duration {
    let start = Instant::now();
    wait::until(&format!("{want} to hold the Lease"), timeout, || async {
        Ok((holder(leases).await.as_deref() == Some(want)).then_some(()))
    })
    .await
    .unwrap();
    start.elapsed()
}

fn gpunode_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == "gpunode.dev/drift"))
}

fn cordoned_by_gpunode(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
        && node
            .annotations()
            .get("gpunode.dev/cordoned")
            .is_some_and(|v| v == "true")
}

async fn publish(client: &Client, node: &str, throttle: &[&str]) {
    let status = json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "gpuCount": 1,
        "gpus": [{"index": 0, "temperatureCelsius": 60, "slowdownCelsius": 87, "throttleReasons": throttle}],
    });
    reports::publish(client, node, status).await.unwrap();
}

#[tokio::test]
async fn only_the_leader_writes_and_a_killed_leader_is_replaced_within_the_lease_duration() {
    let client = admin_client().await.unwrap();
    // The replicas run as the chart's operator ServiceAccount, with its RBAC: the Lease lives
    // where the chart lets the operator hold it.
    chart::install_accounts(&client).await.unwrap();
    let node = format!("ha-{:06x}", rand_suffix());
    let logs = std::env::temp_dir().join(format!("gpunode-{node}"));
    std::fs::create_dir_all(&logs).unwrap();
    let token = accounts::token(&client, chart::NAMESPACE, chart::OPERATOR_SA, None)
        .await
        .unwrap();
    let kubeconfig = logs.join("operator.kubeconfig");
    chart::write_kubeconfig(&token, &kubeconfig).await.unwrap();
    let namespace = chart::NAMESPACE;
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    // A Lease left by an earlier run would delay the first replica by a lease duration.
    let _ = leases
        .delete(gpunode_operator::leader::DEFAULT_LEASE_NAME, &Default::default())
        .await;

    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    publish(&client, &node, &[]).await;
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    crds::create_policy(
        &client,
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "cooling": {"forbiddenThrottleReasons": ["HwThermalSlowdown"]},
            "remediation": [
                {"classes": ["Throttle"], "action": "Taint", "effect": "NoSchedule", "after": "0s"},
                {"classes": ["Throttle"], "action": "Cordon", "after": CORDON_AFTER},
            ],
            "staleAfter": "10m",
        }),
    )
    .await
    .unwrap();

    // Start one, let it take the Lease, then the second: a known leader and follower.
    let mut a = start("replica-a", namespace, &kubeconfig, &logs);
    wait_holder(&leases, &a.spec.instance, DEADLINE).await;
    let mut b = start("replica-b", namespace, &kubeconfig, &logs);
    wait::until("replica-b serving /readyz", DEADLINE, || async {
        Ok(status_line(&b, "/readyz").await.filter(|s| *s == 200).map(|_| ()))
    })
    .await
    .unwrap();
    let node_api: Api<Node> = Api::all(client.clone());
    wait::until("node labelled compliant", DEADLINE, || async {
        let n = node_api.get(&node).await?;
        Ok((n.labels().get("gpunode.dev/state").map(String::as_str) == Some("compliant")).then_some(()))
    })
    .await
    .unwrap();

    // Drift: the leader taints at once.
    publish(&client, &node, &["HwThermalSlowdown"]).await;
    wait::until("gpunode taint", DEADLINE, || async {
        Ok(gpunode_taint(&node_api.get(&node).await?).then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(holder(&leases).await.as_deref(), Some(a.spec.instance.as_str()));
    let leader_writes = metric(&a, "gpunode_node_writes_total").await.unwrap_or(0.0);
    assert!(leader_writes > 0.0, "the leader's /metrics shows no Node write");
    assert_eq!(
        metric(&b, "gpunode_node_writes_total").await,
        Some(0.0),
        "the follower wrote to a Node"
    );
    assert_eq!(metric(&b, "gpunode_leader").await, Some(0.0));
    assert_eq!(metric(&a, "gpunode_leader").await, Some(1.0));
    let n = node_api.get(&node).await.unwrap();
    assert!(!cordoned_by_gpunode(&n), "cordoned before {CORDON_AFTER}");

    // SIGKILL the leader: no release, the follower waits out the lease.
    a.kill();
    let handover = wait_holder(
        &leases,
        &b.spec.instance,
        LEASE + RETRY + SLACK + Duration::from_secs(10),
    )
    .await;
    println!(
        "handover after SIGKILL of the leader: {:.1} s (lease {} s, retry {} s)",
        handover.as_secs_f64(),
        LEASE.as_secs(),
        RETRY.as_secs()
    );
    assert!(
        handover <= LEASE + RETRY + SLACK,
        "handover took {handover:?}, more than the lease duration {LEASE:?} + retry {RETRY:?} + {SLACK:?}"
    );
    wait::until("gpunode_leader 1 on replica-b", DEADLINE, || async {
        Ok((metric(&b, "gpunode_leader").await == Some(1.0)).then_some(()))
    })
    .await
    .unwrap();

    // The new leader finishes the ladder from the old one's bookkeeping: the cordon, due
    // CORDON_AFTER after the drift began.
    wait::until("cordon by the new leader", DEADLINE, || async {
        Ok(cordoned_by_gpunode(&node_api.get(&node).await?).then_some(()))
    })
    .await
    .unwrap();
    assert!(
        metric(&b, "gpunode_node_writes_total").await.unwrap_or(0.0) > 0.0,
        "replica-b leads but its /metrics shows no Node write"
    );

    // A fresh follower, then a graceful stop of the leader: it releases the Lease, so the
    // follower takes over within a retry period instead of a lease duration.
    let mut c = start("replica-c", namespace, &kubeconfig, &logs);
    wait::until("replica-c serving /readyz", DEADLINE, || async {
        Ok(status_line(&c, "/readyz").await.filter(|s| *s == 200).map(|_| ()))
    })
    .await
    .unwrap();
    assert_eq!(metric(&c, "gpunode_node_writes_total").await, Some(0.0));
    let stopped = Instant::now();
    let status = terminate(&mut b).await;
    assert!(
        status.success(),
        "replica-b exited with {status} (log: {})",
        b.log.display()
    );
    wait_holder(&leases, &c.spec.instance, LEASE).await;
    let graceful = stopped.elapsed();
    println!(
        "handover after SIGTERM of the leader (its shutdown included): {:.1} s",
        graceful.as_secs_f64()
    );
    assert!(
        graceful < LEASE,
        "graceful handover took {graceful:?}: the Lease was not released"
    );

    // The policy goes while a replica still runs its cleanup finalizer.
    policies.delete(&node, &Default::default()).await.unwrap();
    wait::until(
        "policy gone (finalizer removed by replica-c)",
        DEADLINE,
        || async { Ok(policies.get_opt(&node).await?.is_none().then_some(())) },
    )
    .await
    .unwrap();
    let status = terminate(&mut c).await;
    assert!(
        status.success(),
        "replica-c exited with {status} (log: {})",
        c.log.display()
    );
    assert_eq!(
        holder(&leases).await,
        None,
        "the last replica left the Lease held"
    );
    let _ = node_api.delete(&node, &Default::default()).await;
}
