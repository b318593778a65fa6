//! The stage of a disruption storm on the local control plane: two policies that do not overlap,
//! each over its own pool of fake GPU nodes, a node a person cordoned, the in-process operator
//! under a fleet-wide cap, and an independent watch of every node.
//!
//! The watch judges a node from the Node alone, the way the fleet cap counts it (cordoned,
//! tainted NoSchedule/NoExecute by anyone, not Ready), never from gpunode's own markers, and
//! keeps the most nodes it saw unavailable at once over every event the API server sent.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use futures::{StreamExt, future::join_all};
use gpunode_crds::{GpuNodePolicy, MaxUnavailable};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    core::{Selector, SelectorExt},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};

use crate::{Error, chart, crds, nodes, operator::InProcess, reports, scratch::rand_suffix, wait};

/// The label every storm node carries (its value: the run), so leftovers can be found.
pub const RUN_LABEL: &str = "fleet-e2e-run";
/// The label naming a storm node's pool (one pool per policy).
pub const POOL_LABEL: &str = "fleet-e2e-pool";
const DEADLINE: Duration = Duration::from_secs(60);

/// Unavailable as the fleet cap counts it, read from the Node alone.
pub fn unavailable(node: &Node) -> bool {
    nodes::cordoned(node) || nodes::tainted_off(node, |_| true) || !nodes::is_ready(node)
}

/// A healthy one-GPU report (driver 550, 70 °C, rows remapped fine) whose GPU names the
/// throttle reasons `throttle`.
pub fn throttled(throttle: &[&str]) -> Value {
    json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "driverVersion": "550.90.07",
        "gpuCount": 1,
        "gpus": [{"index": 0, "product": "NVIDIA H100 80GB HBM3", "temperatureCelsius": 70,
                  "slowdownCelsius": 87, "throttleReasons": throttle,
                  "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false}}],
    })
}

/// What the independent watch saw.
#[derive(Default, Debug)]
pub struct Seen {
    /// Each GPU node (one some policy selects): whether it is unavailable now.
    pub now: BTreeMap<String, bool>,
    /// The most GPU nodes unavailable at once.
    pub max: usize,
    /// Every node seen cordoned at some instant.
    pub ever_cordoned: BTreeSet<String>,
}

impl Seen {
    /// GPU nodes unavailable now.
    pub fn unavailable(&self) -> usize {
        self.now.values().filter(|u| **u).count()
    }
}

/// A watch of every node, counting at every event the unavailable ones that some policy selects.
pub struct Watch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// Starts watching; `selectors` are every policy's (so what other tests hold counts too).
    pub fn start(client: &Client, selectors: Vec<Selector>) -> Watch {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let api: Api<Node> = Api::all(client.clone());
        let s = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(node)) = events.next().await {
                let mut seen = s.lock().unwrap_or_else(PoisonError::into_inner);
                if !selectors.iter().any(|sel| sel.matches(node.labels())) {
                    seen.now.remove(&node.name_any());
                    continue;
                }
                if nodes::cordoned(&node) {
                    seen.ever_cordoned.insert(node.name_any());
                }
                seen.now.insert(node.name_any(), unavailable(&node));
                seen.max = seen.max.max(seen.unavailable());
            }
        });
        Watch { seen, task }
    }

    /// What it saw so far.
    pub fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every policy's node selector.
pub async fn selectors(client: &Client) -> Result<Vec<Selector>, Error> {
    let api: Api<GpuNodePolicy> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default())
        .await?
        .iter()
        .filter_map(|p| gpunode_operator::observe::selector_of(p).ok())
        .collect())
}

/// Deletes the nodes an earlier storm left (one that failed before its cleanup): their policies
/// would count them against the fleet cap.
pub async fn remove_leftovers(client: &Client) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default().labels(RUN_LABEL);
    for n in api.list(&lp).await? {
        let _ = api.delete(&n.name_any(), &DeleteParams::default()).await;
    }
    wait::until("leftover nodes gone", DEADLINE, || async {
        Ok(api.list(&lp).await?.items.is_empty().then_some(()))
    })
    .await
}

/// Creates fake GPU nodes `names` in `pool` of run `run`.
pub async fn make_nodes(client: &Client, run: &str, pool: &str, names: &[String]) -> Result<(), Error> {
    nodes::create(client, names, &nodes::GpuNodeShape::default()).await?;
    let api: Api<Node> = Api::all(client.clone());
    let labels = json!({"metadata": {"labels": {RUN_LABEL: run, POOL_LABEL: pool}}});
    for n in names {
        api.patch(n, &PatchParams::default(), &Patch::Merge(&labels))
            .await?;
    }
    Ok(())
}

/// The selector of `pool` in run `run`, as a policy's `nodeSelector`.
pub fn pool_selector(run: &str, pool: &str) -> Value {
    json!({"matchLabels": {RUN_LABEL: run, POOL_LABEL: pool}})
}

/// How a storm's stage is set.
pub struct Setting<'a> {
    /// Nodes per policy (two policies).
    pub per_policy: usize,
    /// Nodes the cap lets gpunode take out of service, over what is unavailable already (other
    /// tests' nodes and the person's cordon).
    pub free: u32,
    /// The operator's instance name.
    pub instance: &'a str,
    /// Each policy's spec, given its `nodeSelector`.
    pub policy: &'a dyn Fn(Value) -> Value,
}

/// A storm's stage, set: every node Ready, reporting healthy and labelled compliant.
pub struct Stage {
    client: Client,
    /// The run's random id (in every name).
    pub run: String,
    /// The nodes of each policy.
    pub pools: [Vec<String>; 2],
    /// A node of the first pool a person cordoned before the operator started.
    pub person: String,
    /// The two policies.
    pub policies: [String; 2],
    /// The fleet cap the operator runs under.
    pub cap: u32,
    /// The independent watch.
    pub watch: Watch,
    operator: Option<InProcess>,
}

impl Stage {
    /// Sets the stage (see [`Setting`]).
    pub async fn set(client: &Client, setting: &Setting<'_>) -> Result<Stage, Error> {
        crds::install(client).await?;
        remove_leftovers(client).await?;
        let run = format!("{:06x}", rand_suffix());
        let pool = |p: &str| -> Vec<String> {
            (0..setting.per_policy)
                .map(|i| format!("fleet-{run}-{p}{i:02}"))
                .collect()
        };
        let pools = [pool("a"), pool("b")];
        let person = format!("fleet-{run}-a-person");
        make_nodes(client, &run, "a", &pools[0]).await?;
        make_nodes(client, &run, "b", &pools[1]).await?;
        make_nodes(client, &run, "a", std::slice::from_ref(&person)).await?;
        let all: Vec<String> = pools.iter().flatten().chain([&person]).cloned().collect();
        every_node_available(client, &all).await?;
        // A person's cordon: it holds one of the cap's slots for the whole run.
        let node_api: Api<Node> = Api::all(client.clone());
        let cordon = json!({"spec": {"unschedulable": true}});
        node_api
            .patch(&person, &PatchParams::default(), &Patch::Merge(&cordon))
            .await?;
        join_all(all.iter().map(|n| reports::publish(client, n, throttled(&[]))))
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let policies = [format!("fleet-{run}-a"), format!("fleet-{run}-b")];
        for (name, pool) in policies.iter().zip(["a", "b"]) {
            crds::create_policy(client, name, (setting.policy)(pool_selector(&run, pool))).await?;
        }
        let watch = Watch::start(client, selectors(client).await?);
        let held = wait::until("the watch synced", DEADLINE, || async {
            let seen = watch.seen();
            let synced = all.iter().all(|n| seen.now.contains_key(n));
            Ok(synced.then(|| seen.unavailable()))
        })
        .await?;
        let cap = u32::try_from(held)
            .unwrap_or(u32::MAX)
            .saturating_add(setting.free);
        let operator_client = chart::operator_client(client).await?;
        let operator =
            InProcess::start_capped(&operator_client, setting.instance, MaxUnavailable::Count(cap));
        let stage = Stage {
            client: client.clone(),
            run,
            pools,
            person,
            policies,
            cap,
            watch,
            operator: Some(operator),
        };
        stage.until_compliant().await?;
        Ok(stage)
    }

    /// Every node of both policies, pool `a` first.
    pub fn drifting(&self) -> Vec<String> {
        self.pools.iter().flatten().cloned().collect()
    }

    /// The nodes of both policies interleaved: a0, b0, a1, b1, …
    pub fn interleaved(&self) -> Vec<String> {
        let [a, b] = &self.pools;
        a.iter()
            .zip(b)
            .flat_map(|(x, y)| [x.clone(), y.clone()])
            .collect()
    }

    async fn until_compliant(&self) -> Result<(), Error> {
        let node_api: Api<Node> = Api::all(self.client.clone());
        let all: Vec<String> = self
            .pools
            .iter()
            .flatten()
            .chain([&self.person])
            .cloned()
            .collect();
        wait::until("every node labelled compliant", DEADLINE, || async {
            let nodes = join_all(all.iter().map(|n| node_api.get(n))).await;
            let nodes: Result<Vec<Node>, _> = nodes.into_iter().collect();
            Ok(nodes?
                .iter()
                .all(|n| nodes::label(n, "gpunode.dev/state").as_deref() == Some("compliant"))
                .then_some(()))
        })
        .await
    }

    /// The policies go while the operator runs (it removes their finalizers), then the operator
    /// and the nodes.
    pub async fn tear_down(mut self) -> Result<(), Error> {
        let policies: Api<GpuNodePolicy> = Api::all(self.client.clone());
        for p in &self.policies {
            let _ = policies.delete(p, &DeleteParams::default()).await;
        }
        wait::until("both policies gone", DEADLINE, || async {
            for p in &self.policies {
                if policies.get_opt(p).await?.is_some() {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        })
        .await?;
        if let Some(operator) = self.operator.take() {
            operator.stop().await?;
        }
        let node_api: Api<Node> = Api::all(self.client.clone());
        for n in self.pools.iter().flatten().chain([&self.person]) {
            let _ = node_api.delete(n, &DeleteParams::default()).await;
        }
        Ok(())
    }
}

/// Waits until every node of `names` is Ready and untainted (a new node is tainted not-ready
/// until kwok says Ready).
async fn every_node_available(client: &Client, names: &[String]) -> Result<(), Error> {
    let node_api: Api<Node> = Api::all(client.clone());
    wait::until("every node Ready and untainted", DEADLINE, || async {
        let nodes = join_all(names.iter().map(|n| node_api.get(n))).await;
        let nodes: Result<Vec<Node>, _> = nodes.into_iter().collect();
        Ok(nodes?.iter().all(|n| !unavailable(n)).then_some(()))
    })
    .await
}
