//! The peer: NFD's nfd-master labelling the same nodes from NodeFeature objects (no nfd-worker
//! runs on fake nodes, so the benchmark writes one NodeFeature per node, as the worker would)
//! with a NodeFeatureRule that checks what the gpunode policy's GPU section checks.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    config::Kubeconfig,
    runtime::wait::{await_condition, conditions::is_crd_established},
};
use serde::Deserialize;
use serde_json::json;
use tracing::info;

use crate::{
    error::Error,
    identity::token_kubeconfig,
    procs::Measured,
    results::{Nfd, Tuning},
    tracker::Tracker,
};

/// nfd-master's namespace.
pub const NAMESPACE: &str = "node-feature-discovery";
/// Its ServiceAccount.
pub const SA: &str = "nfd-master";
/// Its user name in the audit log.
pub const USER: &str = "system:serviceaccount:node-feature-discovery:nfd-master";
const MANAGER: &str = "gpunode-bench";

/// Takes NFD's label (and its record of the labels it owns) off every node and deletes the rule,
/// so that the next run labels every node again.
async fn reset(client: &Client, names: &[String]) -> Result<(), Error> {
    let rules: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource("NodeFeatureRule", "nodefeaturerules"));
    match rules.delete("gpunode-bench", &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let patch = json!({"metadata": {
        "labels": {crate::tracker::NFD_LABEL: null},
        "annotations": {"nfd.node.kubernetes.io/feature-labels": null},
    }});
    let errors: Vec<kube::Error> = futures::stream::iter(names.iter().cloned())
        .map(|node| {
            let (nodes, patch) = (nodes.clone(), &patch);
            async move {
                nodes
                    .patch(&node, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .err()
            }
        })
        .buffer_unordered(64)
        .filter_map(|e| async move { e })
        .collect()
        .await;
    match errors.into_iter().next() {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nfd.k8s-sigs.io", "v1alpha1", kind),
        plural,
    )
}

/// Applies NFD's CRDs (from its module source) and waits until they are established.
async fn install_crds(client: &Client, path: &Path) -> Result<(), Error> {
    let text = std::fs::read_to_string(path).map_err(Error::io(format!("reading {}", path.display())))?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(MANAGER).force();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        let crd: CustomResourceDefinition = serde_json::from_value(value)?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(&crd)).await?;
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(api.clone(), &name, is_crd_established()),
        )
        .await
        .map_err(|_| Error::Timeout {
            what: format!("CRD {name} established"),
            after: Duration::from_secs(60),
        })?
        .map_err(|e| Error::Other(format!("watching CRD {name}: {e}")))?;
    }
    Ok(())
}

/// The namespace, nfd-master's ServiceAccount and a cluster-admin binding (NFD's own RBAC is
/// a kustomize base; its permissions do not change what it requests).
async fn install_account(client: &Client) -> Result<(), Error> {
    let pp = PatchParams::apply(MANAGER).force();
    let apply = |ar: ApiResource, ns: Option<&str>, obj: serde_json::Value| {
        let client = client.clone();
        let pp = pp.clone();
        let ns = ns.map(str::to_string);
        async move {
            let obj: DynamicObject = serde_json::from_value(obj)?;
            let name = obj.metadata.name.clone().unwrap_or_default();
            let api: Api<DynamicObject> = match ns {
                Some(ns) => Api::namespaced_with(client, &ns, &ar),
                None => Api::all_with(client, &ar),
            };
            api.patch(&name, &pp, &Patch::Apply(&obj)).await?;
            Ok::<(), Error>(())
        }
    };
    apply(
        ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Namespace")),
        None,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
    )
    .await?;
    apply(
        ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ServiceAccount")),
        Some(NAMESPACE),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": NAMESPACE}}),
    )
    .await?;
    apply(
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
        )),
        None,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "nfd-master-bench"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": NAMESPACE}],
        }),
    )
    .await
}

/// What an nfd-worker with a GPU feature source would publish for one healthy 8x H100 node:
/// node-level GPU attributes and one instance per GPU.
fn node_feature(node: &str) -> serde_json::Value {
    let gpus: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            json!({"attributes": {
                "index": i.to_string(), "product": "NVIDIA H100 80GB HBM3", "memoryMiB": "81559",
                "eccMode": "Enabled", "persistenceMode": "Enabled", "migMode": "Disabled",
                "pcieGeneration": "5", "pcieWidth": "16", "nvlinkActive": "18",
                "eccVolatileUncorrected": "0", "retiredPages": "0", "temperatureCelsius": "41",
            }})
        })
        .collect();
    json!({
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
        "metadata": {"name": node, "namespace": NAMESPACE,
                     "labels": {"nfd.node.kubernetes.io/node-name": node}},
        "spec": {
            "features": {
                "flags": {},
                "attributes": {"nvidia.gpu": {"elements": {
                    "count": "8", "driverVersion": "550.90.07", "cudaVersion": "12.4",
                }}},
                "instances": {"nvidia.gpu.device": {"elements": gpus}},
            },
            "labels": {},
        },
    })
}

/// The rule: the node-level and per-GPU checks of the gpunode policy that NFD can express.
fn rule() -> serde_json::Value {
    json!({
        "apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeatureRule",
        "metadata": {"name": "gpunode-bench"},
        "spec": {"rules": [{
            "name": "gpunode-bench-compliant",
            "labels": {"gpunode-bench-compliant": "true"},
            "matchFeatures": [
                {"feature": "nvidia.gpu", "matchExpressions": {
                    "count": {"op": "Gt", "value": ["7"]},
                    "driverVersion": {"op": "InRegexp", "value": ["^55[0-9]\\."]},
                    "cudaVersion": {"op": "InRegexp", "value": ["^12\\.([4-9]|[1-9][0-9])"]},
                }},
                {"feature": "nvidia.gpu.device", "matchExpressions": {
                    "product": {"op": "InRegexp", "value": ["H100"]},
                    "memoryMiB": {"op": "Gt", "value": ["80999"]},
                    "eccMode": {"op": "In", "value": ["Enabled"]},
                    "persistenceMode": {"op": "In", "value": ["Enabled"]},
                    "migMode": {"op": "In", "value": ["Disabled"]},
                    "pcieGeneration": {"op": "Gt", "value": ["4"]},
                    "pcieWidth": {"op": "Gt", "value": ["15"]},
                    "nvlinkActive": {"op": "Gt", "value": ["17"]},
                    "eccVolatileUncorrected": {"op": "Lt", "value": ["1"]},
                    "temperatureCelsius": {"op": "Lt", "value": ["86"]},
                }},
            ],
        }]},
    })
}

/// nfd-master's counter of node updates begun (`nfd_master_node_update_requests_total`).
async fn updates_begun(port: u16) -> Option<f64> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let r = gpunode_e2e::http::get(addr, "/metrics").await.ok()?;
    gpunode_e2e::http::series(&r.body, "nfd_master_node_update_requests_total")
}

/// Waits until nfd-master's caches are synced (its `/healthz` answers only after) and its
/// start-up pass over every node is done: the counter of node updates begun has reached `n`
/// and stood still for one poll (the last updates in flight are one GET each: no rule yet).
async fn started(master: &mut Measured, port: u16, n: usize) -> Result<(), Error> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let timeout = Duration::from_secs(300);
    let deadline = Instant::now() + timeout;
    let mut last = None;
    loop {
        master.now()?;
        let healthy = matches!(gpunode_e2e::http::get(addr, "/healthz").await, Ok(r) if r.status == 200);
        let begun = if healthy { updates_begun(port).await } else { None };
        if begun.is_some_and(|b| b >= n as f64) && begun == last {
            return Ok(());
        }
        last = begun;
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("nfd-master's start-up pass over {n} nodes (updates begun: {last:?})"),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await; // poll interval
    }
}

/// Runs NFD at N nodes configured by `tuning`, after taking an earlier run's label and rule off
/// the nodes: (result, start and end of its convergence window).
pub async fn run(
    client: &Client,
    kc: &Kubeconfig,
    names: &[String],
    (bin, crds): (&Path, &Path),
    out: &Path,
    deadline: Duration,
    (tuning, rep): (Tuning, usize),
) -> Result<(Nfd, Timestamp, Timestamp), Error> {
    let n = names.len();
    install_crds(client, crds).await?;
    reset(client, names).await?;
    install_account(client).await?;
    let features: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &resource("NodeFeature", "nodefeatures"),
    );
    let errors: Vec<Error> = futures::stream::iter(names.iter().cloned())
        .map(|node| {
            let features = features.clone();
            async move {
                let obj: DynamicObject = serde_json::from_value(node_feature(&node))?;
                match features.create(&PostParams::default(), &obj).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
                    Err(e) => Err(Error::from(e)),
                }
            }
        })
        .buffer_unordered(32)
        .filter_map(|r| async move { r.err() })
        .collect()
        .await;
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    info!(n, "NodeFeature objects created");

    let token = gpunode_e2e::accounts::token(client, NAMESPACE, SA, None).await?;
    let nfd_kc = out.join(format!("nfd-{n}.kubeconfig"));
    token_kubeconfig(kc, &token, &nfd_kc)?;
    let port = gpunode_e2e::http::free_addr()?.port();
    let tracker = Tracker::start(client.clone());
    tracker
        .wait(
            "the node watch to list every node",
            Duration::from_secs(120),
            |s| (s.synced && s.nodes.len() >= n).then_some(()),
        )
        .await?;
    let mut flags = vec![
        "-kubeconfig".into(),
        nfd_kc.display().to_string(),
        "-port".into(),
        port.to_string(),
        "-config".into(),
        "/dev/null".into(),
    ];
    // nfd-master annotates the node it runs on (NODE_NAME, from the downward API in its
    // Deployment); the first benchmark node stands in for it.
    let mut env = vec![
        ("KUBERNETES_NAMESPACE", NAMESPACE.to_string()),
        ("NODE_NAME", names.first().cloned().unwrap_or_default()),
    ];
    flags.extend(["-nfd-api-parallelism".into(), tuning.parallelism.to_string()]);
    if !tuning.client_limited {
        env.extend([
            ("GPUNODE_BENCH_NFD_QPS", Tuning::UNLIMITED_QPS.to_string()),
            ("GPUNODE_BENCH_NFD_BURST", Tuning::UNLIMITED_QPS.to_string()),
        ]);
    }
    let log = out.join(format!("nfd-master-{n}-{}-rep{rep}.log", tuning.slug()));
    let mut master = Measured::spawn("nfd-master", bin, &flags, &env, &log)?;
    // Its start-up is left out, as gpunode's is (its caches sync before its policy exists).
    started(&mut master, port, n).await?;
    let rules: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource("NodeFeatureRule", "nodefeaturerules"));
    let obj: DynamicObject = serde_json::from_value(rule())?;
    let from = Timestamp::now();
    let t0 = Instant::now();
    rules.create(&PostParams::default(), &obj).await?;
    let waited = tokio::select! {
        w = tracker.wait("NFD labelling every node", deadline, |s| (s.nfd_labelled >= n).then_some(())) => w,
        status = master.exited() => Err(Error::Other(format!(
            "nfd-master exited ({status}); see {}",
            log.display()
        ))),
    };
    let to = Timestamp::now();
    let elapsed = t0.elapsed().as_secs_f64();
    let sample = master.now()?;
    let last = master.stop().await;
    let (labelled, last_at) = tracker.with(|s| {
        let last = s
            .nodes
            .values()
            .filter_map(|e| e.nfd_at)
            .max()
            .map(|t| t.saturating_duration_since(t0).as_secs_f64());
        (s.nfd_labelled, last)
    });
    let mut r = Nfd {
        tuning: tuning.describe(),
        setting: Some(tuning),
        rep,
        labelled,
        waited_s: elapsed,
        rss_peak_mib: last.hwm_mib.max(sample.hwm_mib),
        cpu_s: sample.cpu_s,
        ..Nfd::default()
    };
    match waited {
        Ok(()) => r.convergence_s = last_at.unwrap_or(elapsed),
        Err(Error::Timeout { .. }) if labelled > 0 => {
            r.projected = true;
            r.convergence_s = elapsed * n as f64 / labelled as f64;
        }
        Err(e) => return Err(e),
    }
    info!(
        seconds = r.convergence_s,
        projected = r.projected,
        labelled,
        ?tuning,
        "NFD measured"
    );
    Ok((r, from, to))
}
