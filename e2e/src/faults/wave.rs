//! [`Wave`]: a policy's fake GPU nodes with pods, a wave of fatal XIDs, and the driver that
//! heals drained nodes until the wave is through; the labels and taint that mark a wave's nodes
//! (and another controller's, which gpunode must keep); [`report_status`], a probe's report;
//! [`mix`], the seeded sequence the seeded runs draw from.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use gpunode_crds::GpuNodePolicy;
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, ServiceAccount, Taint},
    policy::v1::PodDisruptionBudget,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use super::{
    checks::{Check, eviction_checks},
    cluster::FaultCluster,
    marks::{
        CORDONED_ANNOTATION, DRAIN_STARTED_ANNOTATION, STATE_LABEL, annotation, disrupted, gpunode_taints,
        label,
    },
};
use crate::{Error, monitor::WaveMonitor, nodes, pods, reports, scratch::rand_suffix, wait};

pub use super::labels::{BYSTANDER_LABEL, FILLER_LABEL, FOREIGN_LABEL, FOREIGN_TAINT, RUN_LABEL};

/// splitmix64: a deterministic sequence per seed, no dependency.
pub fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A policy's fake nodes, their workload, and the wave of drifts the tests run through.
pub struct Wave {
    /// Unique id (the value of [`RUN_LABEL`] on the nodes).
    pub id: String,
    /// Node names.
    pub nodes: Vec<String>,
    /// Namespace of the pods.
    pub namespace: String,
    /// Policy name.
    pub policy: String,
    /// Pod names by node.
    pub pods: BTreeMap<String, Vec<String>>,
    /// Whether a PodDisruptionBudget (maxUnavailable 0) holds evictions until released.
    pub pdb: bool,
    /// The node of the policy that a person cordoned (healthy, no pods), when the spec asks for one.
    pub bystander: Option<String>,
    client: Client,
}

/// Options of a [`Wave`].
#[derive(Debug, Clone)]
pub struct WaveSpec {
    /// Short tag in names.
    pub tag: String,
    /// Nodes.
    pub nodes: usize,
    /// Pods per node.
    pub pods_per_node: usize,
    /// Hold evictions with a PDB until [`Wave::release_pdb`].
    pub pdb: bool,
    /// The PDB spares each node's first pod (`slot=0`): a drain evicts it, then waits on the rest.
    pub pdb_spares_first: bool,
    /// Add a node of the policy that a person cordoned (see [`BYSTANDER_LABEL`]).
    pub bystander: bool,
    /// The policy's `spec` (the node selector is added).
    pub policy_spec: serde_json::Value,
}

impl WaveSpec {
    /// XIDs drain one node at a time, recovery after 1 s healthy, breaker off; every node
    /// carries another controller's label and taint, and a person cordoned one more node of the
    /// policy (the bystander).
    pub fn drain(tag: &str, nodes: usize, pods_per_node: usize) -> WaveSpec {
        WaveSpec {
            tag: tag.to_string(),
            nodes,
            pods_per_node,
            pdb: false,
            pdb_spares_first: false,
            bystander: true,
            policy_spec: json!({
                "gpu": {},
                "remediation": [{"classes": ["Xid"], "action": "Drain"}],
                "disruption": {"maxUnavailable": 1, "circuitBreaker": {"maxDriftedPercent": 100}},
                "recovery": {"healthyFor": "1s"},
            }),
        }
    }
}

/// A report status as a probe writes it: one GPU, with a fatal XID 79 when `xid`.
pub fn report_status(xid: bool, boot_id: &str) -> serde_json::Value {
    let xids = if xid {
        json!([{"xid": 79, "at": jiff::Timestamp::now().to_string()}])
    } else {
        json!([])
    };
    json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "bootId": boot_id,
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "gpuCount": 1,
        "gpus": [{"index": 0, "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
                  "xids": xids}],
    })
}

impl Wave {
    /// Creates the nodes (healthy reports), the namespace, the pods (Running) and the policy.
    pub async fn setup(client: &Client, spec: &WaveSpec) -> Result<Wave, Error> {
        let id = format!("{}-{:06x}", spec.tag, rand_suffix());
        let nodes: Vec<String> = (0..spec.nodes).map(|i| format!("{id}-{i}")).collect();
        let bystander = spec.bystander.then(|| format!("{id}-cordoned"));
        let api: Api<Node> = Api::all(client.clone());
        let pp = PatchParams::apply("gpunode-e2e").force();
        for n in nodes.iter().chain(&bystander) {
            let mut node = nodes::render(n, &nodes::GpuNodeShape::default())?;
            let labels = node.metadata.labels.get_or_insert_with(Default::default);
            labels.insert(RUN_LABEL.to_string(), id.clone());
            labels.insert(FOREIGN_LABEL.0.to_string(), FOREIGN_LABEL.1.to_string());
            let node_spec = node.spec.get_or_insert_with(Default::default);
            node_spec.taints.get_or_insert_with(Vec::new).push(Taint {
                key: FOREIGN_TAINT.0.into(),
                value: Some(FOREIGN_TAINT.1.into()),
                effect: FOREIGN_TAINT.2.into(),
                time_added: None,
            });
            if Some(n) == bystander.as_ref() {
                labels.insert(BYSTANDER_LABEL.to_string(), "true".into());
                node_spec.unschedulable = Some(true);
            }
            api.patch(n, &pp, &Patch::Apply(&node)).await?;
            reports::publish(client, n, report_status(false, "boot-1")).await?;
        }
        let namespace = format!("rel-{id}");
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": {crate::scratch::E2E_LABEL: "true"}}}))?,
            )
            .await?;
        // Pods are refused until the controller-manager has made the namespace's default
        // ServiceAccount (a fresh namespace, a loaded machine).
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
        wait::until(
            "the namespace's default ServiceAccount",
            Duration::from_secs(60),
            || async { Ok(accounts.get_opt("default").await?.map(|_| ())) },
        )
        .await?;
        if spec.pdb {
            let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "hold"},
            "spec": {"maxUnavailable": 0, "selector": {
                "matchLabels": {"app": "wave"},
                "matchExpressions": if spec.pdb_spares_first {
                    json!([{"key": "slot", "operator": "NotIn", "values": ["0"]}])
                } else {
                    json!([])
                }}}}))?;
            Api::<PodDisruptionBudget>::namespaced(client.clone(), &namespace)
                .create(&PostParams::default(), &pdb)
                .await?;
        }
        let pod_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let mut pods = BTreeMap::new();
        for (i, n) in nodes.iter().enumerate() {
            let mut names = Vec::new();
            for j in 0..spec.pods_per_node {
                let name = format!("p{i}-{j}");
                pod_api
                    .create(
                        &PostParams::default(),
                        &pods::on_node(&name, n, json!({"app": "wave", "slot": j.to_string()}))?,
                    )
                    .await?;
                names.push(name);
            }
            pods.insert(n.clone(), names);
        }
        for name in pods.values().flatten() {
            pods::running(&pod_api, name, Duration::from_secs(90)).await?;
        }
        let mut policy_spec = spec.policy_spec.clone();
        policy_spec["nodeSelector"] = json!({"matchLabels": {RUN_LABEL: id}});
        crate::crds::create_policy(client, &id, policy_spec).await?;
        Ok(Wave {
            policy: id.clone(),
            id,
            nodes,
            namespace,
            pods,
            pdb: spec.pdb,
            bystander,
            client: client.clone(),
        })
    }

    /// The label selector of the wave's nodes (not the bystander).
    pub fn selector(&self) -> String {
        format!("{RUN_LABEL}={},!{BYSTANDER_LABEL}", self.id)
    }

    /// The label selector of every node of the wave's policy, the bystander included.
    pub fn policy_selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.id)
    }

    /// Starts the watches that check the wave at every instant (see [`WaveMonitor`]).
    pub fn monitor(&self) -> WaveMonitor {
        WaveMonitor::start(
            &self.client,
            &self.policy_selector(),
            &self.namespace,
            self.bystander.is_some(),
        )
    }

    /// Every pod name.
    pub fn all_pods(&self) -> Vec<String> {
        self.pods.values().flatten().cloned().collect()
    }

    /// The wave's nodes as the API server has them now.
    pub async fn nodes_now(&self) -> Result<Vec<Node>, Error> {
        Ok(Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().labels(&self.selector()))
            .await?
            .items)
    }

    /// Pods of the namespace not terminating, by node.
    pub async fn alive_pods(&self) -> Result<BTreeMap<String, usize>, Error> {
        let list = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default())
            .await?;
        let mut out: BTreeMap<String, usize> = self.nodes.iter().map(|n| (n.clone(), 0)).collect();
        for p in list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                *out.entry(n).or_insert(0) += 1;
            }
        }
        Ok(out)
    }

    /// Waits until every node carries `state`.
    pub async fn wait_all(&self, state: &str, timeout: Duration) -> Result<(), Error> {
        wait::until(&format!("every node of {} {state}", self.id), timeout, || async {
            let nodes = self.nodes_now().await?;
            Ok((nodes.len() == self.nodes.len()
                && nodes
                    .iter()
                    .all(|n| label(n, STATE_LABEL).as_deref() == Some(state)))
            .then_some(()))
        })
        .await
    }

    /// Waits until a node of the wave other than `except` has a drain started, and names it.
    pub async fn drain_started(&self, except: &[&str], timeout: Duration) -> Result<String, Error> {
        wait::until(&format!("a drain to start in {}", self.id), timeout, || async {
            let ns = self.nodes_now().await?;
            Ok(ns
                .iter()
                .filter(|n| !except.contains(&n.metadata.name.as_deref().unwrap_or_default()))
                .find(|n| annotation(n, DRAIN_STARTED_ANNOTATION).is_some())
                .and_then(|n| n.metadata.name.clone()))
        })
        .await
    }

    /// A fatal XID on every node at once.
    pub async fn drift_all(&self) -> Result<(), Error> {
        for n in &self.nodes {
            reports::publish(&self.client, n, report_status(true, "boot-1")).await?;
        }
        Ok(())
    }

    /// Deletes the PodDisruptionBudget: evictions go through from now on.
    pub async fn release_pdb(&self) -> Result<(), Error> {
        if self.pdb {
            Api::<PodDisruptionBudget>::namespaced(self.client.clone(), &self.namespace)
                .delete("hold", &DeleteParams::default())
                .await?;
        }
        Ok(())
    }

    /// Plays the node's repair: once a drifted node has been drained (no pods left), its probe
    /// reports it healthy again; returns when every node is compliant, uncordoned, untainted
    /// and empty. API errors (an outage) are retried until `timeout`.
    pub async fn drive(&self, timeout: Duration) -> Result<(), Error> {
        let healed = tokio::sync::Mutex::new(BTreeSet::new());
        wait::until(&format!("wave {} to complete", self.id), timeout, || async {
            let mut healed = healed.lock().await;
            match self.drive_step(&mut healed).await? {
                true => Ok(Some(())),
                false => Err(Error::Unexpected(format!("healed {:?}", *healed))),
            }
        })
        .await
    }

    async fn drive_step(&self, healed: &mut BTreeSet<String>) -> Result<bool, Error> {
        let alive = self.alive_pods().await?;
        let nodes = self.nodes_now().await?;
        let mut done = 0;
        for n in &nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let empty = alive.get(&name).copied().unwrap_or(0) == 0;
            let drained = empty && (self.pods.get(&name).is_some_and(|p| !p.is_empty()) || disrupted(n));
            if drained && !healed.contains(&name) {
                reports::publish(&self.client, &name, report_status(false, "boot-1")).await?;
                healed.insert(name.clone());
            }
            let clean = label(n, STATE_LABEL).as_deref() == Some("compliant")
                && !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
                && gpunode_taints(n).is_empty();
            if healed.contains(&name) && empty && clean {
                done += 1;
            }
        }
        Ok(done == self.nodes.len())
    }

    /// After the wave: gpunode's markers are exactly what the policy implies for healthy nodes
    /// (compliant, no drift labels, no taints, no cordon of its own), the node's own labels and
    /// other controllers' label and taint are intact, and the bystander is still cordoned.
    pub async fn final_checks(&self) -> Result<Vec<Check>, Error> {
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().labels(&self.policy_selector()))
            .await?
            .items;
        let mut wrong = Vec::new();
        for n in &nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let labels = n.metadata.labels.clone().unwrap_or_default();
            let drift_labels: Vec<&String> = labels
                .keys()
                .filter(|k| k.starts_with("gpunode.dev/drift."))
                .collect();
            let person_cordoned = self.bystander.as_ref() == Some(&name);
            let foreign_taint = n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key == FOREIGN_TAINT.0 && t.effect == FOREIGN_TAINT.2)
            });
            let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
            let problems: Vec<String> = [
                (
                    labels.get("gpunode.dev/policy") != Some(&self.policy),
                    "policy label".to_string(),
                ),
                (
                    labels.get(STATE_LABEL).map(String::as_str) != Some("compliant"),
                    format!("state {:?}", labels.get(STATE_LABEL)),
                ),
                (!drift_labels.is_empty(), format!("drift labels {drift_labels:?}")),
                (
                    !gpunode_taints(n).is_empty(),
                    format!("taints {:?}", gpunode_taints(n)),
                ),
                (
                    unschedulable != person_cordoned,
                    format!("unschedulable {unschedulable}"),
                ),
                (
                    annotation(n, CORDONED_ANNOTATION).is_some(),
                    "gpunode's cordon annotation".to_string(),
                ),
                (
                    !labels.contains_key("nvidia.com/gpu.product"),
                    "own labels".to_string(),
                ),
                (
                    labels.get(FOREIGN_LABEL.0).map(String::as_str) != Some(FOREIGN_LABEL.1)
                        || !foreign_taint,
                    "another controller's label or taint".to_string(),
                ),
                (labels.get(RUN_LABEL) != Some(&self.id), "run label".to_string()),
            ]
            .into_iter()
            .filter_map(|(bad, what)| bad.then_some(what))
            .collect();
            if !problems.is_empty() {
                wrong.push(format!("{name}: {}", problems.join(", ")));
            }
        }
        let expected = self.nodes.len() + usize::from(self.bystander.is_some());
        Ok(vec![Check::new(
            "no gpunode taint, label or cordon lost or orphaned",
            wrong.is_empty() && nodes.len() == expected,
            format!("{} of {expected} nodes, wrong: {wrong:?}", nodes.len()),
        )])
    }

    /// Every invariant of the wave after a run: the watches' (budget of `allowed` held at every
    /// instant, a person's cordon, other controllers' markers, no eviction after a commit), the
    /// audit log's (no pod evicted twice, each pod of `evicted` evicted) and the final state's.
    pub async fn run_checks(
        &self,
        fc: &FaultCluster,
        monitor: &WaveMonitor,
        allowed: usize,
        evicted: &[String],
    ) -> Result<Vec<Check>, Error> {
        let audit = fc.audit()?;
        let mut checks = monitor.checks(allowed, &audit, &self.namespace).await;
        checks.extend(eviction_checks(&audit, &self.namespace, evicted));
        checks.extend(self.final_checks().await?);
        Ok(checks)
    }

    /// Deletes the policy, nodes and namespace (best effort, without waiting).
    pub async fn cleanup(&self) {
        let _ = Api::<GpuNodePolicy>::all(self.client.clone())
            .delete(&self.policy, &DeleteParams::default())
            .await;
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.namespace, &DeleteParams::background())
            .await;
        for n in self.nodes.iter().chain(&self.bystander) {
            let _ = Api::<Node>::all(self.client.clone())
                .delete(n, &DeleteParams::background())
                .await;
        }
    }
}
