//! The cluster as the operator sees it, read once: nodes, reports, heartbeats, policies and
//! DRA objects; and, per policy, the operator's own views and plan of its nodes
//! (`gpunode_operator::plan::plan`, the code a reconcile runs), so what the plugin says is what
//! the operator decides, budget and circuit breaker included.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use gpunode_operator::{
    cache::evaluate_guarded,
    devices::{self, rules},
    evaluate::last_heard,
    markers,
    observe::{Guarded, SelectorIndex, gpu_pods, gpu_views, selector_of},
    plan::{self, NodeView, PolicyPlan},
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{Client, ResourceExt, core::SelectorExt};

use crate::{claims, error::Error, fetch};

/// What was read, and when.
pub struct Snapshot {
    /// When it was read: the time the plans are made at.
    pub now: Timestamp,
    /// Every policy, readable or not.
    pub policies: Vec<Arc<Guarded<GpuNodePolicy>>>,
    /// Which policies select which node.
    pub index: SelectorIndex,
    /// The nodes read (all, or those of one selector).
    pub nodes: Vec<Node>,
    /// Reports by node, readable or not.
    pub reports: BTreeMap<String, Guarded<GpuNodeReport>>,
    /// When each node's probe last renewed its heartbeat Lease.
    pub heard: BTreeMap<String, Timestamp>,
    /// ResourceSlices and gpunode's DeviceTaintRules, where DRA is served.
    pub dra: Option<Dra>,
    /// What could not be read and what that means for the output.
    pub notes: Vec<String>,
}

/// The DRA objects.
pub struct Dra {
    /// Every ResourceSlice.
    pub slices: Vec<devices::ResourceSlice>,
    /// gpunode's DeviceTaintRules.
    pub rules: Vec<devices::DeviceTaintRule>,
    /// The pods each allocated device is reserved for; `None` when the claims were not read.
    pub holders: Option<claims::Holders>,
}

/// One policy's nodes, the operator's views of them and its plan.
pub struct Governed {
    /// The policy.
    pub policy: GpuNodePolicy,
    /// Its nodes, in the order of `views`.
    pub nodes: Vec<Node>,
    /// The planner's view of each.
    pub views: Vec<NodeView>,
    /// The plan, as a reconcile now would make it.
    pub plan: PolicyPlan,
}

impl Snapshot {
    /// Reads the policies, the nodes matching `labels` (all when empty), every report, the
    /// heartbeats and the DRA objects. Heartbeats and DRA objects the user may not read are
    /// left out with a note.
    pub async fn read(client: &Client, labels: &str, lease_namespace: &str) -> Result<Snapshot, Error> {
        let policies = policies(client).await?;
        let nodes = fetch::nodes(client, labels).await?;
        Snapshot::read_with(client, policies, nodes, lease_namespace).await
    }

    /// [`Snapshot::read`] for one node: the nodes of the policy that governs `node` (they share
    /// its budget), or `node` alone when no policy does.
    pub async fn read_for(client: &Client, node: &Node, lease_namespace: &str) -> Result<Snapshot, Error> {
        let policies = policies(client).await?;
        let index = SelectorIndex::new(&policies);
        let policy = governing_name(&index, node)
            .and_then(|name| policies.iter().find(|p| p.name_any() == name))
            .and_then(|p| p.0.as_ref().ok());
        let nodes = match policy.map(selector_of) {
            Some(Ok(selector)) => fetch::nodes(client, &selector.to_string()).await?,
            _ => vec![node.clone()],
        };
        Snapshot::read_with(client, policies, nodes, lease_namespace).await
    }

    async fn read_with(
        client: &Client,
        policies: Vec<Arc<Guarded<GpuNodePolicy>>>,
        nodes: Vec<Node>,
        lease_namespace: &str,
    ) -> Result<Snapshot, Error> {
        let reports = fetch::reports(client)
            .await?
            .into_iter()
            .map(|r| (r.name_any(), r))
            .collect();
        let mut notes = Vec::new();
        let heard = fetch::heartbeats(client, lease_namespace)
            .await
            .unwrap_or_else(|why| {
                notes.push(format!(
                    "heartbeat Leases not readable ({why}): reports count as fresh from their observedAt alone"
                ));
                BTreeMap::new()
            });
        let dra = match fetch::dra(client).await {
            Ok(d) => d.map(|d| Dra::new(d, &mut notes)),
            Err(why) => {
                notes.push(format!(
                    "DRA objects not readable ({why}): quarantines by DeviceTaintRule not shown"
                ));
                None
            }
        };
        Ok(Snapshot {
            now: Timestamp::now(),
            index: SelectorIndex::new(&policies),
            policies,
            nodes,
            reports,
            heard,
            dra,
            notes,
        })
    }

    /// The readable policy `name`.
    pub fn policy(&self, name: &str) -> Result<&GpuNodePolicy, Error> {
        let guarded = self
            .policies
            .iter()
            .find(|p| p.name_any() == name)
            .ok_or_else(|| Error::NotFound(format!("GpuNodePolicy {name} not found")))?;
        guarded
            .0
            .as_ref()
            .map_err(|e| Error::Usage(format!("GpuNodePolicy {name} cannot be read: {}", e.error)))
    }

    /// Every readable policy, by name.
    pub fn readable_policies(&self) -> Vec<&GpuNodePolicy> {
        let mut out: Vec<&GpuNodePolicy> = self.policies.iter().filter_map(|p| p.0.as_ref().ok()).collect();
        out.sort_by_key(|p| p.name_any());
        out
    }

    /// The policy that governs `node`: the one its `gpunode.dev/policy` label names, else the
    /// first by name whose selector matches it (the one the operator lets write the node).
    pub fn governing(&self, node: &Node) -> Result<&GpuNodePolicy, Error> {
        let name = node.name_any();
        match governing_name(&self.index, node) {
            Some(p) => self.policy(&p).map_err(|e| match e {
                Error::NotFound(_) => Error::NotFound(format!(
                    "node {name} is labelled {}={p}, but GpuNodePolicy {p} does not exist",
                    markers::POLICY_LABEL
                )),
                other => other,
            }),
            None => Err(Error::NotFound(format!(
                "node {name} is governed by no GpuNodePolicy: no policy's nodeSelector matches its labels"
            ))),
        }
    }

    /// The policy's nodes among those read, its views of them and its plan.
    pub fn govern(&self, policy: &GpuNodePolicy) -> Governed {
        let nodes: Vec<Node> = match selector_of(policy) {
            Ok(selector) => self
                .nodes
                .iter()
                .filter(|n| selector.matches(n.labels()))
                .cloned()
                .collect(),
            // Fails closed, as the operator: a selector it cannot use selects nothing.
            Err(_) => Vec::new(),
        };
        let views: Vec<NodeView> = nodes.iter().map(|n| self.view(policy, n)).collect();
        // The breaker latches: where the status left it is the planner's input, as in the
        // operator (the fleet cap is the operator's alone and is not shown here).
        let inputs = plan::PassInputs {
            breaker: gpunode_operator::status::breaker_memory(policy.status.as_ref()),
            close_breaker: policy
                .annotations()
                .get(gpunode_crds::policy::CLOSE_BREAKER_ANNOTATION)
                .and_then(|v| v.trim().parse().ok()),
            fleet: None,
            // The chart's bounds are the operator's flags, unknown here: the plugin shows the
            // plan as if the template were allowed (the policy's Degraded condition says if not).
            validation_bounds: None,
        };
        let plan = plan::plan_with(&policy.name_any(), &policy.spec, &views, &inputs, self.now);
        Governed {
            policy: policy.clone(),
            nodes,
            views,
            plan,
        }
    }

    /// The planner's view of `node` under `policy`, built as the operator's `observe::views`.
    fn view(&self, policy: &GpuNodePolicy, node: &Node) -> NodeView {
        let name = node.name_any();
        let policy_name = policy.name_any();
        let report = self.reports.get(&name);
        let heard = self.heard.get(&name).copied();
        let (verdict, _) = evaluate_guarded(policy, report, heard, self.now);
        let conflicts = self.index.conflicts(&policy_name, node.labels());
        let (view, _unreadable) = NodeView::observe(node, verdict, conflicts);
        let readable = report.and_then(|r| r.0.as_ref().ok());
        let observed = readable
            .and_then(|r| r.status.as_ref())
            .and_then(|s| s.observed_at.as_ref())
            .map(|t| last_heard(t.0, heard));
        let dra = self.dra.as_ref().and_then(|d| {
            devices::held_node_devices(
                d.slices.iter(),
                rules::for_node(&d.rules, &name),
                &name,
                &policy.spec.quarantine.dra_driver,
                &policy_name,
            )
        });
        view.heard_at(observed)
            .with_gpus(gpu_views(readable), devices::devices_of(dra, gpu_pods(readable)))
    }

    /// The readable report of `node`.
    pub fn report(&self, node: &str) -> Option<&GpuNodeReport> {
        self.reports.get(node).and_then(|r| r.0.as_ref().ok())
    }

    /// gpunode's DeviceTaintRules of `node`, by GPU key (the UUID).
    pub fn rules_of(&self, node: &str) -> BTreeMap<String, &devices::DeviceTaintRule> {
        self.dra
            .iter()
            .flat_map(|d| d.rules.iter())
            .filter(|r| rules::is_for(r, node))
            .filter_map(|r| Some((rules::gpu_of(r)?.to_string(), r)))
            .collect()
    }
}

/// Every GpuNodePolicy, shared.
async fn policies(client: &Client) -> Result<Vec<Arc<Guarded<GpuNodePolicy>>>, Error> {
    Ok(fetch::policies(client).await?.into_iter().map(Arc::new).collect())
}

/// The name of the policy that governs `node`: its `gpunode.dev/policy` label while that policy
/// still selects it, else the first selecting policy by name, else the label's policy.
fn governing_name(index: &SelectorIndex, node: &Node) -> Option<String> {
    let labelled = node.labels().get(markers::POLICY_LABEL);
    let mut selecting: Vec<String> = index.selecting(node.labels()).map(|p| p.name_any()).collect();
    selecting.sort();
    labelled
        .and_then(|l| {
            selecting
                .iter()
                .find(|p| gpunode_crds::names::label_value(p) == *l)
        })
        .or_else(|| selecting.first())
        .or(labelled)
        .cloned()
}

impl Governed {
    /// The plan and view of `node`, if the policy governs it.
    pub fn node(&self, node: &str) -> Option<(&plan::NodePlan, &NodeView, &Node)> {
        let p = self.plan.nodes.iter().find(|p| p.node == node)?;
        let i = self.views.iter().position(|v| v.name == node)?;
        Some((p, &self.views[i], &self.nodes[i]))
    }

    /// The rungs `node` waits for a person's approval of, whatever else holds it (budget,
    /// breaker, windows, pause, dry run, conflicts) and whatever is approved already: planned
    /// again with those gates open and no approval given.
    pub fn awaited_rungs(&self, node: &str, now: Timestamp) -> BTreeSet<String> {
        let mut spec = self.policy.spec.clone();
        spec.disruption.max_unavailable = gpunode_crds::MaxUnavailable::Percent(100);
        spec.disruption.circuit_breaker.max_drifted_percent = 100;
        spec.maintenance = None;
        spec.paused = false;
        spec.dry_run = false;
        let Some(view) = self.views.iter().find(|v| v.name == node) else {
            return BTreeSet::new();
        };
        let mut view = view.clone();
        view.approved.clear();
        view.conflicts.clear();
        view.skip = false;
        let planned = plan::plan(&self.policy.name_any(), &spec, std::slice::from_ref(&view), now);
        let mut out = BTreeSet::new();
        for p in &planned.nodes {
            if let Some(plan::Block::Approval { rungs, .. }) = &p.blocked {
                out.extend(rungs.iter().cloned());
            }
            if let plan::RepairState::Waiting {
                block: plan::Block::Approval { rungs, .. },
                ..
            } = &p.repair.state
            {
                out.extend(rungs.iter().cloned());
            }
        }
        out
    }
}

/// The rungs a node's `gpunode.dev/approve` annotation lists.
pub fn approved(node: &Node) -> BTreeSet<String> {
    node.annotations()
        .get(gpunode_crds::policy::APPROVE_ANNOTATION)
        .map(|v| plan::approvals(v))
        .unwrap_or_default()
}

impl Dra {
    fn new(objects: fetch::DraObjects, notes: &mut Vec<String>) -> Dra {
        let holders = match objects.claims {
            Ok(c) => {
                let (holders, unreadable) = claims::holders(&c);
                if unreadable > 0 {
                    notes.push(format!(
                        "{unreadable} ResourceClaims have a status that cannot be read: the pods on their devices are not shown"
                    ));
                }
                Some(holders)
            }
            Err(why) => {
                notes.push(format!(
                    "ResourceClaims not readable ({why}): the pods on DRA devices are not shown"
                ));
                None
            }
        };
        Dra {
            slices: objects.slices,
            rules: objects.rules,
            holders,
        }
    }

    /// The pods on each DRA device of `node`, by the device's GPU UUID; `None` when the node
    /// publishes no devices or the claims were not read.
    pub fn pods_of(&self, node: &str) -> Option<BTreeMap<String, Vec<String>>> {
        let holders = self.holders.as_ref()?;
        let mut out = BTreeMap::new();
        for s in self
            .slices
            .iter()
            .filter(|s| s.spec.node_name.as_deref() == Some(node))
        {
            for d in &s.spec.devices {
                let Some(uuid) = d.uuid(&s.spec.driver) else {
                    continue;
                };
                let key = claims::DeviceKey {
                    driver: s.spec.driver.clone(),
                    pool: s.spec.pool.name.clone(),
                    device: d.name.clone(),
                };
                out.insert(uuid.to_string(), holders.get(&key).cloned().unwrap_or_default());
            }
        }
        (!out.is_empty()).then_some(out)
    }
}
