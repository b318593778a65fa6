//! Smoke tests of the local control plane itself, on the real API server: gpunode's CRDs install,
//! the examples are accepted and every invalid-policy fixture is rejected with its message; fake
//! GPU nodes become Ready, DaemonSets and pods run on them, pod-bound tokens carry the node name,
//! and the Eviction API honours PodDisruptionBudgets.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, time::Duration};

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    accounts,
    cluster::{self, admin_client},
    crds, fixtures, nodes, pods,
    scratch::{Scratch, rand_suffix},
    wait,
};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    authentication::v1::SelfSubjectReview,
    core::v1::{Node, Pod, ServiceAccount},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, EvictParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

async fn setup() -> Client {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    client
}

/// Creates fake GPU nodes unique to this test and waits until they are Ready.
async fn ready_nodes(client: &Client, prefix: &str, n: usize) -> Vec<String> {
    let suffix = rand_suffix();
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{suffix:06x}-{i}")).collect();
    nodes::create(client, &names, &nodes::GpuNodeShape::default())
        .await
        .unwrap();
    let api: Api<Node> = Api::all(client.clone());
    for name in &names {
        wait::until(&format!("node {name} Ready"), DEADLINE, || async {
            Ok(api.get(name).await.ok().filter(nodes::is_ready))
        })
        .await
        .unwrap();
    }
    names
}

fn pod(name: &str, node: &str, labels: serde_json::Value) -> Pod {
    pods::on_node(name, node, labels).unwrap()
}

async fn running(api: &Api<Pod>, name: &str) -> Pod {
    pods::running(api, name, DEADLINE).await.unwrap()
}

#[tokio::test]
async fn apiserver_reports_its_real_version() {
    let client = admin_client().await.unwrap();
    let version = client.apiserver_version().await.unwrap();
    let local = tokio::task::spawn_blocking(cluster::cluster)
        .await
        .unwrap()
        .unwrap()
        .local;
    assert!(version.git_version.starts_with("v1."), "{version:?}");
    if local {
        let expected = std::env::var("K8S_VERSION").unwrap_or_else(|_| "v1.37.2".to_string());
        assert_eq!(version.git_version, expected);
    }
}

#[tokio::test]
async fn examples_are_accepted_by_the_api_server() {
    let client = setup().await;
    let api: Api<GpuNodePolicy> = Api::all(client);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for example in fixtures::examples().unwrap() {
        let policy: GpuNodePolicy = serde_json::from_value(example.value.clone()).unwrap();
        let stored = api
            .create(&dry_run, &policy)
            .await
            .unwrap_or_else(|e| panic!("{} rejected: {e}", example.path.display()));
        // Defaults are applied by the API server and survive a round trip through the types.
        assert!(stored.spec.disruption.drain.timeout.get() > Duration::ZERO);
    }
}

#[tokio::test]
async fn valid_twins_are_accepted_by_the_api_server() {
    let client = setup().await;
    let api: Api<DynamicObject> = Api::all_with(client, &ApiResource::erase::<GpuNodePolicy>(&()));
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for twin in fixtures::valid_policies().unwrap() {
        let object: DynamicObject = serde_json::from_value(twin.value.clone()).unwrap();
        if let Err(e) = api.create(&dry_run, &object).await {
            panic!("{} rejected: {e}", twin.path.display());
        }
    }
}

#[tokio::test]
async fn invalid_policies_are_rejected_with_their_message() {
    let client = setup().await;
    let api: Api<DynamicObject> = Api::all_with(client, &ApiResource::erase::<GpuNodePolicy>(&()));
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let fixtures = fixtures::invalid_policies().unwrap();
    let mut failures = Vec::new();
    for f in &fixtures {
        let object: DynamicObject = serde_json::from_value(f.manifest.value.clone()).unwrap();
        match api.create(&dry_run, &object).await {
            Ok(_) => failures.push(format!(
                "{}: accepted, but should be rejected ({})",
                f.manifest.name, f.rule
            )),
            Err(kube::Error::Api(status)) => {
                let msg = status.message.clone();
                if status.code != 422 || !msg.contains(&f.field) || !msg.contains(&f.expect) {
                    failures.push(format!(
                        "{}: expected 422 naming {:?} with {:?}, got {}: {msg}",
                        f.manifest.name, f.field, f.expect, status.code
                    ));
                }
            }
            Err(e) => failures.push(format!("{}: {e}", f.manifest.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn gpu_nodes_run_daemonset_pods() {
    let client = setup().await;
    let names = ready_nodes(&client, "smoke-ds", 3).await;
    let ns = Scratch::new(&client, "daemonset").await.unwrap();
    // Select only this test's nodes through a label set on them.
    let nodes_api: Api<Node> = Api::all(client.clone());
    for name in &names {
        let patch = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"gpunode.dev/e2e-set": ns.name}}});
        nodes_api
            .patch(
                name,
                &PatchParams::apply("gpunode-e2e-set"),
                &Patch::Apply(&patch),
            )
            .await
            .unwrap();
    }
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "probe-like"},
        "spec": {
            "selector": {"matchLabels": {"app": "probe-like"}},
            "template": {
                "metadata": {"labels": {"app": "probe-like"}},
                "spec": {
                    "nodeSelector": {"gpunode.dev/e2e-set": ns.name},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "probe", "image": "registry.invalid/probe:1"}],
                }
            }
        }
    }))
    .unwrap();
    Api::<DaemonSet>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &ds)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let want: BTreeSet<String> = names.iter().cloned().collect();
    wait::until("a Running DaemonSet pod on each fake node", DEADLINE, || async {
        let list = pods.list(&ListParams::default().labels("app=probe-like")).await?;
        let on: BTreeSet<String> = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
            .collect();
        Ok((on == want).then_some(()))
    })
    .await
    .unwrap();
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn pod_bound_tokens_carry_the_node_name() {
    let client = setup().await;
    let node = ready_nodes(&client, "smoke-token", 1).await.remove(0);
    let ns = Scratch::new(&client, "token").await.unwrap();
    let sa: ServiceAccount = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "probe"}}),
    )
    .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut p = pod("probe", &node, json!({"app": "probe"}));
    if let Some(spec) = p.spec.as_mut() {
        spec.service_account_name = Some("probe".to_string());
    }
    pods.create(&PostParams::default(), &p).await.unwrap();
    let p = running(&pods, "probe").await;

    let sa_client = accounts::client_for(&client, &ns.name, "probe", Some(&p))
        .await
        .unwrap();
    let review: SelfSubjectReview = serde_json::from_value(
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
    )
    .unwrap();
    let me = Api::<SelfSubjectReview>::all(sa_client)
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let user = me.status.and_then(|s| s.user_info).unwrap_or_default();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{}:probe", ns.name).as_str())
    );
    let claim = user
        .extra
        .as_ref()
        .and_then(|e| e.get("authentication.kubernetes.io/node-name"))
        .cloned();
    assert_eq!(claim, Some(vec![node.clone()]), "extra: {:?}", user.extra);
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn eviction_honours_pod_disruption_budgets() {
    let client = setup().await;
    let node = ready_nodes(&client, "smoke-pdb", 1).await.remove(0);
    let ns = Scratch::new(&client, "pdb").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &ns.name);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "train"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}}
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    pods.create(
        &PostParams::default(),
        &pod("train-0", &node, json!({"app": "train"})),
    )
    .await
    .unwrap();
    running(&pods, "train-0").await;

    let allowed = |n: i32| {
        let pdbs = pdbs.clone();
        async move {
            wait::until(&format!("PDB to allow {n} disruption(s)"), DEADLINE, || async {
                let p = pdbs.get("train").await?;
                let s = p.status.unwrap_or_default();
                Ok(
                    (s.observed_generation.is_some() && s.disruptions_allowed == n && s.current_healthy >= 1)
                        .then_some(()),
                )
            })
            .await
            .unwrap()
        }
    };

    // One healthy pod, minAvailable 1: the eviction is refused with 429.
    allowed(0).await;
    match pods.evict("train-0", &EvictParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 429, "{s:?}"),
        other => panic!("eviction should be refused while the budget is exhausted, got {other:?}"),
    }
    assert!(pods.get_opt("train-0").await.unwrap().is_some());

    // A second healthy pod frees one disruption: now the eviction goes through.
    pods.create(
        &PostParams::default(),
        &pod("train-1", &node, json!({"app": "train"})),
    )
    .await
    .unwrap();
    running(&pods, "train-1").await;
    allowed(1).await;
    pods.evict("train-0", &EvictParams::default())
        .await
        .expect("eviction should be allowed now");
    ns.delete().await.unwrap();
}
