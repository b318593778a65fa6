//! The operator on the real API server: a throttled report leads to the taint once `after` has
//! passed, recovery removes it after `healthyFor`, and a taint someone else added survives.
//! The operator runs in-process against the local control plane.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, reports, scratch::rand_suffix, wait,
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

/// The controller reconciles every policy in the cluster, so two in-process operators would both
/// act on each test's node: the tests of this file take turns.
static ONE_OPERATOR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn report_status(throttle: &[&str]) -> serde_json::Value {
    json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "driverVersion": "550.90.07",
        "gpuCount": 1,
        "gpus": [{"index": 0, "product": "NVIDIA H100 80GB HBM3", "temperatureCelsius": 70,
                  "slowdownCelsius": 87, "throttleReasons": throttle}],
    })
}

async fn publish_report(client: &Client, node: &str, throttle: &[&str]) {
    reports::publish(client, node, report_status(throttle))
        .await
        .unwrap();
}

fn taints(node: &Node) -> Vec<(String, Option<String>, String)> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| (t.key, t.value, t.effect))
        .collect()
}

fn condition(node: &Node) -> Option<k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuPolicyCompliant").cloned())
}

fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref().and_then(|l| l.get(key).cloned())
}

/// A policy selecting only `node` by host name, checking cooling, with this `staleAfter`.
async fn host_policy(client: &Client, node: &str, stale_after: &str) {
    crds::create_policy(
        client,
        node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "cooling": {},
            "staleAfter": stale_after,
        }),
    )
    .await
    .unwrap();
}

/// Waits until `node` carries `gpunode.dev/state=<state>`; returns it.
async fn wait_state(node_api: &Api<Node>, node: &str, state: &str, what: &str) -> Node {
    wait::until(what, DEADLINE, || async {
        let n = node_api.get(node).await?;
        Ok((label(&n, "gpunode.dev/state").as_deref() == Some(state)).then_some(n))
    })
    .await
    .unwrap()
}

/// Installs the CRDs and creates one fake GPU node named `<prefix>-<random>`.
async fn one_node(prefix: &str) -> (Client, String, Api<Node>) {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let name = format!("{prefix}-{:06x}", rand_suffix());
    nodes::create(
        &client,
        std::slice::from_ref(&name),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let node_api: Api<Node> = Api::all(client.clone());
    (client, name, node_api)
}

#[tokio::test]
async fn a_throttled_node_is_tainted_after_after_and_untainted_after_healthy_for() {
    let _turn = ONE_OPERATOR.lock().await;
    // RUST_LOG=gpunode_operator=debug shows the operator's decisions.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (client, name, node_api) = one_node("op-throttle").await;
    // Someone else's taint, which gpunode must never touch.
    let human = json!({"spec": {"taints": [{"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}]}});
    node_api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&human))
        .await
        .unwrap();
    publish_report(&client, &name, &[]).await;

    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    crds::create_policy(&client, &name, json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": name}},
            "cooling": {},
            "remediation": [{"classes": ["Throttle"], "action": "Taint", "effect": "NoSchedule", "after": "2s"}],
            "recovery": {"healthyFor": "3s"},
            "staleAfter": "5m",
        }))
        .await
        .unwrap();

    // The operator runs with the chart's ServiceAccount: its RBAC is what this test exercises.
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e");

    wait_state(&node_api, &name, "compliant", "node labelled compliant").await;

    let throttled_at = Instant::now();
    publish_report(&client, &name, &["HwThermalSlowdown", "SwThermalSlowdown"]).await;
    wait::until("node labelled drifted", DEADLINE, || async {
        let n = node_api.get(&name).await?;
        Ok((label(&n, "gpunode.dev/drift.throttle").as_deref() == Some("true")).then_some(()))
    })
    .await
    .unwrap();
    let tainted = wait::until("gpunode taint", DEADLINE, || async {
        let n = node_api.get(&name).await?;
        Ok(taints(&n)
            .iter()
            .any(|t| t.0 == "gpunode.dev/drift" && t.1.as_deref() == Some("throttle") && t.2 == "NoSchedule")
            .then_some(n))
    })
    .await
    .unwrap();
    assert!(
        throttled_at.elapsed() >= Duration::from_secs(2),
        "tainted before `after`"
    );
    assert!(taints(&tainted).iter().any(|t| t.0 == "example.com/maintenance"));
    wait::until("condition GpuPolicyCompliant=False", DEADLINE, || async {
        let n = node_api.get(&name).await?;
        Ok(condition(&n).filter(|c| c.status == "False").map(|_| ()))
    })
    .await
    .unwrap();

    let recovered_at = Instant::now();
    publish_report(&client, &name, &[]).await;
    let untainted = wait::until("gpunode taint removed", DEADLINE, || async {
        let n = node_api.get(&name).await?;
        Ok((!taints(&n).iter().any(|t| t.0 == "gpunode.dev/drift")).then_some(n))
    })
    .await
    .unwrap();
    assert!(
        recovered_at.elapsed() >= Duration::from_secs(3),
        "untainted before healthyFor"
    );
    assert_eq!(
        taints(&untainted),
        vec![(
            "example.com/maintenance".to_string(),
            Some("planned".to_string()),
            "NoSchedule".to_string()
        )],
        "the other owner's taint is exactly as it was"
    );
    assert_eq!(
        label(&untainted, "gpunode.dev/state").as_deref(),
        Some("compliant")
    );

    // A count beyond 32 bits, which the operator could not read, is refused by the API server:
    // the schema carries each integer's range, not a format it ignores.
    let mut bad = report_status(&[]);
    bad["gpuCount"] = json!(5_000_000_000u64);
    match reports::publish(&client, &name, bad).await {
        Err(gpunode_e2e::Error::Kube(kube::Error::Api(s))) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("gpuCount"), "{}", s.message);
        }
        other => panic!("a 5,000,000,000 GPU count should be refused, got {other:?}"),
    }
    wait_state(&node_api, &name, "compliant", "node still compliant").await;

    let status = wait::until("policy status counts", DEADLINE, || async {
        let p = policies.get(&name).await?;
        Ok(p.status.filter(|s| s.matched == 1 && s.compliant == 1))
    })
    .await
    .unwrap();
    assert_eq!(status.drifted, 0);

    // A deleted policy's metric series go with it (an alert on them would fire for ever).
    let series = format!("policy=\"{name}\"");
    assert!(
        operator.metrics.encode().contains(&series),
        "no series for the live policy"
    );
    policies.delete(&name, &Default::default()).await.unwrap();
    wait::until("the deleted policy's metric series to go", DEADLINE, || async {
        Ok::<_, gpunode_e2e::Error>((!operator.metrics.encode().contains(&series)).then_some(()))
    })
    .await
    .unwrap();
    operator.stop().await.unwrap();
}

#[tokio::test]
async fn labels_an_older_gpunode_applied_are_taken_over_and_removed_when_stale() {
    let _turn = ONE_OPERATOR.lock().await;
    let (client, name, node_api) = one_node("op-legacy").await;
    // What an older gpunode left: its labels applied to the main resource under its field
    // manager, including a drift label the current verdict no longer has.
    let old = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "gpunode.dev/policy": name, "gpunode.dev/state": "drifted", "gpunode.dev/drift.throttle": "true",
    }}});
    node_api
        .patch(
            &name,
            &PatchParams::apply("gpunode-operator").force(),
            &Patch::Apply(&old),
        )
        .await
        .unwrap();
    publish_report(&client, &name, &[]).await;
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    host_policy(&client, &name, "5m").await;
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e");

    let n = wait::until(
        "node compliant, without the stale drift label",
        DEADLINE,
        || async {
            let n = node_api.get(&name).await?;
            let done = label(&n, "gpunode.dev/state").as_deref() == Some("compliant")
                && label(&n, "gpunode.dev/drift.throttle").is_none();
            Ok(done.then_some(n))
        },
    )
    .await
    .unwrap();
    assert!(
        !gpunode_operator::apply::has_legacy_metadata_owner(&n),
        "the main-resource ownership was released"
    );
    assert_eq!(condition(&n).map(|c| c.status).as_deref(), Some("True"));

    // Deleting the policy releases the node: gpunode's labels and condition are gone.
    policies.delete(&name, &Default::default()).await.unwrap();
    wait::until("node released", DEADLINE, || async {
        let n = node_api.get(&name).await?;
        let ours = n
            .metadata
            .labels
            .iter()
            .flatten()
            .any(|(k, _)| k.starts_with("gpunode.dev/"));
        Ok((!ours && condition(&n).is_none()).then_some(()))
    })
    .await
    .unwrap();
    operator.stop().await.unwrap();
}

#[tokio::test]
async fn watches_stream_their_initial_lists_where_the_api_server_can() {
    use kube::runtime::watcher::InitialListStrategy;
    let client = admin_client().await.unwrap();
    // Asked as the operator asks, with the chart's ServiceAccount.
    let operator_client = chart::operator_client(&client).await.unwrap();
    let listing = gpunode_operator::observe::list_strategy(&operator_client).await;
    assert_eq!(
        listing.initial_list_strategy,
        InitialListStrategy::StreamingList,
        "the local control plane (Kubernetes 1.37) streams lists"
    );
}

#[tokio::test]
async fn a_report_older_than_stale_after_stays_fresh_while_its_probe_heartbeats() {
    let _turn = ONE_OPERATOR.lock().await;
    let (client, name, node_api) = one_node("op-heartbeat").await;
    // What a probe leaves between material changes: a report observed long ago (its content
    // still holds) and a heartbeat Lease renewed recently (45 s ago, so that with the shortest
    // staleAfter, 60 s, it lapses 15 s from now).
    let mut status = report_status(&[]);
    status["observedAt"] = json!((jiff::Timestamp::now() - jiff::SignedDuration::from_mins(10)).to_string());
    reports::publish(&client, &name, status).await.unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let lease_name = gpunode_crds::heartbeat::lease_name(&name).expect("lease name");
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), chart::NAMESPACE);
    let lease = gpunode_crds::heartbeat::lease(
        &lease_name,
        &name,
        None,
        180,
        k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            jiff::Timestamp::now() - jiff::SignedDuration::from_secs(45),
        ),
    );
    leases
        .patch(
            &lease_name,
            &PatchParams::apply("gpunode-e2e").force(),
            &Patch::Apply(&lease),
        )
        .await
        .unwrap();
    host_policy(&client, &name, "60s").await;
    let operator = InProcess::start(&operator_client, "e2e");

    wait_state(
        &node_api,
        &name,
        "compliant",
        "node compliant on a 10-minute-old report",
    )
    .await;
    // The probe goes silent: no renewal, no report. The operator's own timer, counting from the
    // heartbeat, makes the node Unknown once the heartbeat is staleAfter old.
    let unknown = wait_state(
        &node_api,
        &name,
        "unknown",
        "node unknown once the heartbeat lapsed",
    )
    .await;
    let message = condition(&unknown).and_then(|c| c.message).unwrap_or_default();
    assert!(
        message.contains("the probe's last heartbeat is"),
        "the condition says why: {message}"
    );
    operator.stop().await.unwrap();
    Api::<GpuNodePolicy>::all(client.clone())
        .delete(&name, &Default::default())
        .await
        .unwrap();
}
