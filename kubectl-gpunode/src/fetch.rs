//! Reading the cluster: the client from the user's kubeconfig, and each request with its
//! failure turned into an [`Error`] that names what was asked.

use std::{path::Path, time::Duration};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport, heartbeat};
use gpunode_operator::{devices, observe::Guarded};
use jiff::Timestamp;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client, Config,
    api::{ApiResource, DynamicObject, ListParams},
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::error::{Error, one_line};

/// How long to wait for the API server to accept a connection and to answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A client from `--kubeconfig` (else `$KUBECONFIG`, `~/.kube/config`, in-cluster) and
/// `--context`, as kubectl resolves them.
pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, Error> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let mut config = match (kubeconfig, context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| Error::Kubeconfig(format!("{}: {}", path.display(), one_line(&e))))?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| Error::Kubeconfig(format!("{}: {}", path.display(), one_line(&e))))?
        }
        (None, Some(name)) => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::Kubeconfig(format!("context {name}: {}", one_line(&e))))?,
        (None, None) => Config::infer()
            .await
            .map_err(|e| Error::Kubeconfig(one_line(&e)))?,
    };
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    Client::try_from(config).map_err(|e| Error::Kubeconfig(one_line(&e)))
}

/// The node `name`.
pub async fn node(client: &Client, name: &str) -> Result<Node, Error> {
    Api::<Node>::all(client.clone()).get(name).await.map_err(|e| {
        Error::from_kube(
            &format!("get node {name}"),
            || format!("node {name} not found"),
            e,
        )
    })
}

/// The nodes matching the label selector `labels` (every node when empty).
pub async fn nodes(client: &Client, labels: &str) -> Result<Vec<Node>, Error> {
    let lp = ListParams::default().labels(labels);
    Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .map(|l| l.items)
        .map_err(|e| match e {
            // The API server parses the selector: a 400 names what is wrong with it.
            kube::Error::Api(s) if s.code == 400 && !labels.is_empty() => {
                Error::Usage(format!("bad label selector {labels:?}: {}", s.message))
            }
            e => {
                let what = if labels.is_empty() {
                    "list nodes".to_string()
                } else {
                    format!("list nodes -l {labels}")
                };
                Error::from_kube(&what, || "the Node API is not served".to_string(), e)
            }
        })
}

/// Every GpuNodePolicy, readable or not.
pub async fn policies(client: &Client) -> Result<Vec<Guarded<GpuNodePolicy>>, Error> {
    Api::<Guarded<GpuNodePolicy>>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| Error::from_kube("list gpunodepolicies", no_crd, e))
}

/// Every GpuNodeReport, readable or not.
pub async fn reports(client: &Client) -> Result<Vec<Guarded<GpuNodeReport>>, Error> {
    Api::<Guarded<GpuNodeReport>>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| Error::from_kube("list gpunodereports", no_crd, e))
}

fn no_crd() -> String {
    "gpunode's CRDs are not installed on this cluster (gpunodepolicies.gpunode.dev)".to_string()
}

/// When each node's probe last renewed its heartbeat Lease, by node: Leases across namespaces,
/// else in `namespace`. `Err` says why they could not be read (then reports count as fresh from
/// their `observedAt` alone, and the output says so).
pub async fn heartbeats(
    client: &Client,
    namespace: &str,
) -> Result<std::collections::BTreeMap<String, Timestamp>, String> {
    let lp = ListParams::default().labels(heartbeat::LEASE_SELECTOR);
    let leases = match Api::<Lease>::all(client.clone()).list(&lp).await {
        Ok(l) => l.items,
        Err(_) => {
            Api::<Lease>::namespaced(client.clone(), namespace)
                .list(&lp)
                .await
                .map_err(|e| {
                    Error::from_kube(&format!("list leases in {namespace}"), String::new, e).to_string()
                })?
                .items
        }
    };
    Ok(leases
        .into_iter()
        .filter_map(|l| {
            let name = l.metadata.name?;
            let spec = l.spec?;
            let node = heartbeat::lease_node(&name, spec.holder_identity.as_deref())?.to_string();
            Some((node, spec.renew_time?.0))
        })
        .collect())
}

/// The DRA objects the plugin reads.
pub struct DraObjects {
    /// Every ResourceSlice.
    pub slices: Vec<devices::ResourceSlice>,
    /// gpunode's DeviceTaintRules.
    pub rules: Vec<devices::DeviceTaintRule>,
    /// Every ResourceClaim, or why they could not be listed (the pods on DRA devices are then
    /// not shown; nothing else depends on them).
    pub claims: Result<Vec<DynamicObject>, String>,
}

/// The cluster's DRA ResourceSlices, gpunode's DeviceTaintRules and the ResourceClaims, where
/// DRA is served. `Ok(None)`: not served; `Err`: slices or rules served but not readable.
pub async fn dra(client: &Client) -> Result<Option<DraObjects>, String> {
    let Some(dra) = devices::discover(client).await else {
        return Ok(None);
    };
    let slices = Api::<devices::ResourceSlice>::all_with(client.clone(), &dra.slices)
        .list(&ListParams::default())
        .await
        .map_err(|e| Error::from_kube("list resourceslices", String::new, e).to_string())?;
    let lp = ListParams::default().labels(devices::rules::RULE_SELECTOR);
    let rules = Api::<devices::DeviceTaintRule>::all_with(client.clone(), &dra.rules)
        .list(&lp)
        .await
        .map_err(|e| Error::from_kube("list devicetaintrules", String::new, e).to_string())?;
    // Claims are served at the version of the slices, in the same group.
    let claims = ApiResource {
        kind: "ResourceClaim".to_string(),
        plural: "resourceclaims".to_string(),
        ..dra.slices.clone()
    };
    let claims = Api::<DynamicObject>::all_with(client.clone(), &claims)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| Error::from_kube("list resourceclaims", String::new, e).to_string());
    Ok(Some(DraObjects {
        slices: slices.items,
        rules: rules.items,
        claims,
    }))
}
