//! observe: everything a reconcile reads, and nothing it writes. The watches of nodes, reports
//! and heartbeat Leases fill caches of trimmed objects ([`trim`]); only changes that could change
//! a decision trigger a reconcile ([`triggers`]); gpunode's own writes are read back before the
//! watch delivers them ([`own_writes`]); a probe counts as heard from at its report or its Lease,
//! whichever is later ([`heartbeats`]); and one parsed [`index`] of every policy's selectors says
//! which policies select which node. A reconcile takes a [`Snapshot`] of one policy's nodes from
//! the [`Caches`] and turns it into the planner's [`NodeView`]s (a Node's part of one is read
//! by `NodeView::observe`, here: the planner's view layer only holds the type).

pub mod backoff;
pub mod changed;
pub mod compact;
pub mod fleet_count;
pub mod gpus;
pub mod heartbeats;
pub mod index;
pub mod own_writes;
pub mod skew;
pub mod triggers;
pub mod trim;

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, TryStreamExt, stream::BoxStream};
use gpunode_crds::{GpuNodePolicy, GpuNodeReport, policy::APPROVE_ANNOTATION};
use jiff::Timestamp;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client, ResourceExt,
    api::WatchParams,
    core::{DeserializeGuard, Selector, SelectorExt},
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use tracing::{info, warn};

use crate::{
    cache::{PolicyVerdicts, VerdictCache},
    devices::{self, rules::RulesByNode},
    markers,
    metrics::Metrics,
    plan::{NodeView, StepObject, approvals},
    reasons::Reason,
    remediators::Remediators,
    verdict::{NodeState, Verdict},
};

pub use compact::CachedReport;
pub use fleet_count::{FleetCount, unavailable};
pub use gpus::{gpu_pods, gpu_views};
pub use heartbeats::Heartbeats;
pub use index::{IndexCache, POD_SELECTOR_FIELD, SelectorIndex, selector_of};
pub use own_writes::OwnWrites;

/// A watched object that may not have deserialized: one malformed policy or report is logged
/// and skipped instead of stalling the watch.
pub type Guarded<K> = DeserializeGuard<K>;

impl NodeView {
    /// What gpunode has in effect on `node`: skip label, cordon, its taints, its bookkeeping,
    /// its state label and condition reason. Unreadable bookkeeping is returned to be logged.
    pub fn observe(
        node: &Node,
        verdict: Verdict,
        conflicts: Vec<String>,
    ) -> (NodeView, Vec<markers::MarkerError>) {
        let empty = BTreeMap::new();
        let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
        let (markers, errors) =
            markers::Markers::from_annotations(node.metadata.annotations.as_ref().unwrap_or(&empty));
        let spec = node.spec.as_ref();
        let reason = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == markers::CONDITION_TYPE))
            .and_then(|c| c.reason.as_deref())
            .and_then(Reason::parse);
        let view = NodeView {
            skip: labels.get(markers::SKIP_LABEL).is_some_and(|v| v == "true"),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            taints: markers::drift_taints(node),
            markers,
            current_state: labels.get(markers::STATE_LABEL).and_then(|v| match v.as_str() {
                "compliant" => Some(NodeState::Compliant),
                "drifted" => Some(NodeState::Drifted),
                "unknown" => Some(NodeState::Unknown),
                _ => None,
            }),
            current_reason: reason,
            conflicts,
            approved: node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(APPROVE_ANNOTATION))
                .map(|v| approvals(v))
                .unwrap_or_default(),
            ..NodeView::new(node.metadata.name.as_deref().unwrap_or_default(), verdict)
        };
        (view, errors)
    }
}

/// The caches a reconcile reads.
#[derive(Clone)]
pub struct Caches {
    /// Nodes (managed fields stripped).
    pub nodes: Store<Node>,
    /// Reports, compacted ([`compact`]).
    pub reports: Store<CachedReport>,
    /// The probes' heartbeat Leases.
    pub heartbeats: Heartbeats,
    /// Policies.
    pub policies: Store<Guarded<GpuNodePolicy>>,
    /// Nodes as gpunode's own writes returned them, until the watch delivers those versions.
    pub written: Arc<OwnWrites>,
    /// The policies' selectors, parsed once per change of the policies.
    pub selectors: IndexCache,
    /// The fleet cap's count, kept as nodes change.
    pub fleet: Arc<FleetCount>,
    /// On a cluster that serves DRA: the ResourceSlices (trimmed) and gpunode's DeviceTaintRules.
    pub dra: Option<DraCaches>,
}

/// What the DRA watches hold.
#[derive(Clone)]
pub struct DraCaches {
    /// Where the kinds are served.
    pub api: devices::Dra,
    /// Every ResourceSlice, trimmed to its devices' names and UUIDs.
    pub slices: Store<devices::ResourceSlice>,
    /// gpunode's DeviceTaintRules.
    pub rules: Store<devices::DeviceTaintRule>,
    /// Events the two watches delivered (each after its store took it in).
    pub events: Arc<AtomicU64>,
    /// The last grouping by node, with the count of events it was made after.
    grouped: Arc<Mutex<Option<Grouped>>>,
}

/// A grouping by node, with the count of events it was made after.
type Grouped = (u64, Arc<DraByNode>);

/// The DRA caches grouped by node, built once per change of the caches (a lookup per node would
/// be quadratic, and grouping on every pass would make each pass read every slice).
pub struct DraByNode {
    /// The ResourceSlices by their node name.
    pub slices: HashMap<String, Vec<Arc<devices::ResourceSlice>>>,
    /// gpunode's DeviceTaintRules by node.
    pub rules: RulesByNode,
}

impl DraCaches {
    /// Caches over these stores, nothing grouped yet.
    pub fn new(
        api: devices::Dra,
        slices: Store<devices::ResourceSlice>,
        rules: Store<devices::DeviceTaintRule>,
    ) -> DraCaches {
        DraCaches {
            api,
            slices,
            rules,
            events: Arc::default(),
            grouped: Arc::default(),
        }
    }

    /// The slices and gpunode's rules, by node: grouped again only when a watch delivered
    /// something since the last grouping.
    pub fn by_node(&self) -> Arc<DraByNode> {
        let events = self.events.load(Ordering::Acquire);
        let mut grouped = self.grouped.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, by_node)) = grouped.as_ref()
            && *at == events
        {
            return by_node.clone();
        }
        let mut slices: HashMap<String, Vec<Arc<devices::ResourceSlice>>> = HashMap::new();
        for s in self.slices.state() {
            if let Some(node) = s.spec.node_name.clone() {
                slices.entry(node).or_default().push(s);
            }
        }
        let by_node = Arc::new(DraByNode {
            slices,
            rules: RulesByNode::new(self.rules.state()),
        });
        *grouped = Some((events, by_node.clone()));
        by_node
    }
}

/// What one reconcile of one policy sees.
pub struct Snapshot {
    /// The nodes the policy selects, each as the later of the cache's version and gpunode's own
    /// last write.
    pub nodes: Vec<Arc<Node>>,
    /// Every policy's selectors, for conflicts.
    pub index: Arc<SelectorIndex>,
}

impl Caches {
    /// Every policy's selectors, as the policy store holds them now.
    pub fn index(&self) -> Arc<SelectorIndex> {
        self.selectors.get()
    }

    /// Of the nodes named `names`, those labelled by `policy` that no policy selects any more
    /// ([`Caches::orphans`], for an incremental pass: the nodes that changed).
    pub fn orphans_named<'n>(
        &self,
        policy: &str,
        index: &SelectorIndex,
        names: impl IntoIterator<Item = &'n String>,
    ) -> Vec<Arc<Node>> {
        let label = gpunode_crds::names::label_value(policy);
        names
            .into_iter()
            .filter_map(|n| self.nodes.get(&ObjectRef::new(n)))
            .filter(|n| n.labels().get(markers::POLICY_LABEL).is_some_and(|p| *p == label))
            .filter(|n| !index.selects_any(n.labels()))
            .collect()
    }

    /// Nodes labelled by `policy` that no policy selects any more: everything gpunode did to
    /// them is to be undone. (A node another policy selects is left to that policy's plan.)
    pub fn orphans(&self, policy: &str, index: &SelectorIndex) -> Vec<Arc<Node>> {
        let label = gpunode_crds::names::label_value(policy);
        self.nodes
            .state()
            .into_iter()
            .filter(|n| n.labels().get(markers::POLICY_LABEL).is_some_and(|p| *p == label))
            .filter(|n| !index.selects_any(n.labels()))
            .collect()
    }

    /// The nodes `selector` selects, with gpunode's own writes read back.
    pub fn snapshot(&self, selector: &Selector, index: Arc<SelectorIndex>) -> Snapshot {
        let nodes = self
            .written
            .overlay(self.nodes.state())
            .into_iter()
            .filter(|n| selector.matches(n.labels()))
            .collect();
        Snapshot { nodes, index }
    }

    /// The nodes named `names` that `selector` selects, with gpunode's own writes read back,
    /// and the names of those it does not (gone, or no longer selected): what an incremental
    /// pass looks at.
    pub fn named<'n>(
        &self,
        selector: &Selector,
        names: impl IntoIterator<Item = &'n String>,
    ) -> (Vec<Arc<Node>>, Vec<String>) {
        let mut gone = Vec::new();
        let mut cached = Vec::new();
        for name in names {
            match self.nodes.get(&ObjectRef::new(name)) {
                Some(n) => cached.push(n),
                None => gone.push(name.clone()),
            }
        }
        let (selected, left): (Vec<_>, Vec<_>) = self
            .written
            .overlay_some(cached)
            .into_iter()
            .partition(|n| selector.matches(n.labels()));
        gone.extend(left.iter().map(|n| n.name_any()));
        (selected, gone)
    }

    /// The GPU nodes (those some policy selects) unavailable now, with gpunode's own writes
    /// read back, and how many GPU nodes there are: the fleet cap's count ([`unavailable`]),
    /// kept as nodes change ([`FleetCount`]).
    pub fn fleet_count(&self, index: &SelectorIndex, ignored_taints: &[String]) -> fleet_count::Counted {
        self.fleet
            .count(&self.nodes, &self.written, index, ignored_taints)
    }

    /// Remembers node `node` as gpunode's write returned it, for passes to read before the
    /// watch delivers it, and counts it again.
    pub fn wrote(&self, node: Node) {
        let name = node.name_any();
        self.written.wrote(node, &self.nodes);
        self.fleet.changed(&name);
    }

    /// The node's report as the cache holds it (readable or not).
    pub fn report(&self, node: &str) -> Option<Arc<CachedReport>> {
        self.reports.get(&ObjectRef::new(node))
    }

    /// The policies that select a node with these labels.
    pub fn policies_for(&self, labels: &BTreeMap<String, String>) -> Vec<ObjectRef<Guarded<GpuNodePolicy>>> {
        self.index()
            .selecting(labels)
            .map(|g| ObjectRef::from_obj(g.as_ref()))
            .collect()
    }

    /// The inputs of [`views`] besides the nodes.
    pub fn inputs<'a>(&'a self, index: &'a SelectorIndex) -> Inputs<'a> {
        Inputs {
            reports: &self.reports,
            heartbeats: &self.heartbeats,
            index,
            dra: self.dra.as_ref().map(DraCaches::by_node),
            repair_objects: HashMap::new(),
            validation_jobs: HashMap::new(),
        }
    }
}

/// When the report was observed, if it is readable and says.
pub fn observed_at(report: Option<&CachedReport>) -> Option<Timestamp> {
    report.and_then(CachedReport::observed_at)
}

/// The objects of the repair steps running on `nodes` under `policy`, by node: one request
/// per object (their kinds have no watch), only for nodes whose bookkeeping shows a step running. A
/// node whose object could not be read is left out, and its step waits for the next look.
pub async fn repair_objects(
    remediators: &Remediators,
    policy: &GpuNodePolicy,
    nodes: &[Arc<Node>],
) -> HashMap<String, StepObject> {
    let Some(repair) = policy.spec.repair.as_ref() else {
        return HashMap::new();
    };
    let running: Vec<(String, Vec<crate::plan::EnsureObject>)> = nodes
        .iter()
        .filter_map(|n| {
            let raw = n.annotations().get(markers::REPAIR_ANNOTATION)?;
            let track: markers::RepairTrack = serde_json::from_str(raw).ok()?;
            let step = track.step.filter(|s| s.ended.is_none())?;
            let (_, spec) = repair.step(&step.name)?;
            let node = n.name_any();
            let objects = crate::plan::repair::step_objects(spec, &node, &step);
            Some((node, objects))
        })
        .collect();
    futures::stream::iter(running)
        .map(|(node, objects)| async move {
            let seen = remediators.look_all(&objects).await;
            (node, seen)
        })
        .buffer_unordered(16)
        .filter_map(|(node, seen)| async move {
            match seen {
                Ok(o) => Some((node, o)),
                Err(e) => {
                    warn!(node = %node, error = %e, "reading a repair step's object");
                    None
                }
            }
        })
        .collect()
        .await
}

/// The Jobs of the validations running on `nodes` under `policy`, by node: one request per
/// Job, only for nodes whose bookkeeping shows a validation running. A node whose Job could not
/// be read is left out, and its validation waits for the next look.
pub async fn validation_jobs(
    client: &kube::Client,
    policy: &GpuNodePolicy,
    nodes: &[Arc<Node>],
) -> HashMap<String, crate::plan::JobState> {
    let Some(validation) = policy.spec.validation.as_ref() else {
        return HashMap::new();
    };
    let jobs: kube::Api<k8s_openapi::api::batch::v1::Job> =
        kube::Api::namespaced(client.clone(), &validation.namespace);
    let running: Vec<(String, markers::ValidationTrack)> = nodes
        .iter()
        .filter_map(|n| {
            let raw = n.annotations().get(markers::VALIDATION_ANNOTATION)?;
            let track: markers::ValidationTrack = serde_json::from_str(raw).ok()?;
            track.ended.is_none().then(|| (n.name_any(), track))
        })
        .collect();
    futures::stream::iter(running)
        .map(|(node, track)| {
            let jobs = jobs.clone();
            async move {
                let seen = jobs.get_opt(&track.job).await;
                (
                    node,
                    seen.map(|j| crate::plan::validation::job_state(j.as_ref(), track.started)),
                )
            }
        })
        .buffer_unordered(16)
        .filter_map(|(node, seen)| async move {
            match seen {
                Ok(state) => Some((node, state)),
                Err(e) => {
                    warn!(node = %node, error = %e, "reading a validation Job");
                    None
                }
            }
        })
        .collect()
        .await
}

/// What the views of a policy's nodes are made from besides the nodes themselves.
pub struct Inputs<'a> {
    /// Reports.
    pub reports: &'a Store<CachedReport>,
    /// The probes' heartbeats.
    pub heartbeats: &'a Heartbeats,
    /// Every policy's selectors, for conflicts.
    pub index: &'a SelectorIndex,
    /// On a DRA cluster, its ResourceSlices and gpunode's DeviceTaintRules by node.
    pub dra: Option<Arc<DraByNode>>,
    /// The running repair steps' objects, by node ([`repair_objects`]).
    pub repair_objects: HashMap<String, StepObject>,
    /// The running validations' Jobs, by node ([`validation_jobs`]).
    pub validation_jobs: HashMap<String, crate::plan::JobState>,
}

/// Every node's view under `policy`: what gpunode has in effect on it, its verdict (reused from
/// `verdicts` while its report, the policy and the time allow), the other policies selecting it
/// and when its probe was last heard from. The verdicts of nodes not among `nodes` are
/// forgotten (they left the policy).
pub fn views(
    policy: &GpuNodePolicy,
    nodes: &[Arc<Node>],
    inputs: &Inputs<'_>,
    verdicts: &mut PolicyVerdicts,
    now: Timestamp,
) -> Vec<NodeView> {
    let views = some_views(policy, nodes, inputs, verdicts, now);
    verdicts.end();
    views
}

/// The views of some of the policy's nodes (those an incremental pass looks at), as [`views`]
/// makes them; the verdicts of the others are kept.
pub fn some_views(
    policy: &GpuNodePolicy,
    nodes: &[Arc<Node>],
    inputs: &Inputs<'_>,
    verdicts: &mut PolicyVerdicts,
    now: Timestamp,
) -> Vec<NodeView> {
    let policy_name = policy.name_any();
    let driver = policy.spec.quarantine.dra_driver.as_str();
    let no_slices = Vec::new();
    verdicts.begin(policy);
    nodes
        .iter()
        .map(|node| {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            let report = inputs.reports.get(&ObjectRef::new(name));
            let heard = inputs.heartbeats.heard(name);
            let verdict = verdicts.verdict(policy, name, report.as_deref(), heard, now);
            let conflicts = inputs.index.conflicts(&policy_name, node.labels());
            let (view, errors) = NodeView::observe(node, verdict, conflicts);
            for e in errors {
                warn!(node = %name, error = %e, "ignoring unreadable gpunode annotation");
            }
            let last_heard = observed_at(report.as_deref()).map(|o| crate::evaluate::last_heard(o, heard));
            let dra = inputs.dra.as_ref().and_then(|by_node| {
                let slices = by_node.slices.get(name).unwrap_or(&no_slices);
                devices::held_node_devices(
                    slices.iter().map(AsRef::as_ref),
                    by_node.rules.of(name),
                    name,
                    driver,
                    &policy_name,
                )
            });
            let pods = report.as_deref().and_then(CachedReport::pods).cloned();
            let gpus = report.as_deref().map(|r| r.gpus().clone()).unwrap_or_default();
            let devices = devices::devices_of(dra, pods);
            view.heard_at(last_heard)
                .with_gpus(gpus, devices)
                .with_repair(inputs.repair_objects.get(name).cloned())
                .with_validation(inputs.validation_jobs.get(name).cloned())
        })
        .collect()
}

/// The watches and the caches they fill.
pub struct Watches {
    /// The caches.
    pub caches: Caches,
    /// Node changes that may change a decision (and every deletion).
    pub node_changes: BoxStream<'static, Result<Node, watcher::Error>>,
    /// Report changes that change some policy's verdict (and every deletion).
    pub report_changes: BoxStream<'static, Result<Guarded<GpuNodeReport>, watcher::Error>>,
    /// Changes that concern one node, as a stand-in Node with only its name: its ResourceSlices
    /// and DeviceTaintRules, and its probe's heartbeat renewals where a policy last found it
    /// stale.
    pub named_changes: BoxStream<'static, Result<Node, watcher::Error>>,
    leases: Store<Lease>,
    lease_task: tokio::task::JoinHandle<()>,
}

impl Watches {
    /// Starts the watches of nodes, reports and (in `heartbeat_namespace`) heartbeat Leases.
    /// The node and report streams run as the controller polls them; the Lease watch only feeds
    /// its cache and runs in a task of its own. `policies` is the controller's policy store.
    pub async fn start(
        client: &Client,
        heartbeat_namespace: &str,
        policies: Store<Guarded<GpuNodePolicy>>,
        verdicts: Arc<VerdictCache>,
        metrics: Arc<Metrics>,
    ) -> Watches {
        let listing = list_strategy(client).await;
        let (nodes, node_writer) = reflector::store::<Node>();
        let node_stream = backoff::watcher(Api::<Node>::all(client.clone()), listing.clone(), "node")
            .modify(trim::node)
            .reflect(node_writer);
        let (reports, mut report_writer) = reflector::store::<CachedReport>();
        let report_stream = backoff::watcher(
            Api::<Guarded<GpuNodeReport>>::all(client.clone()),
            listing.clone(),
            "report",
        )
        .modify(|r: &mut Guarded<GpuNodeReport>| match &mut r.0 {
            Ok(report) => {
                trim::report(report);
                skew::observed_not_ahead(report, jiff::Timestamp::now());
            }
            Err(_) => r.managed_fields_mut().clear(),
        })
        // The cache keeps each report compacted; the stream goes on with the whole object, for
        // the trigger that evaluates it as it arrives.
        .inspect_ok(move |e| report_writer.apply_watcher_event(&compact::event(e)));
        let (leases, lease_task, renewals) =
            lease_watch(client, heartbeat_namespace, &listing, verdicts.clone());
        let heartbeats = Heartbeats::new(leases.clone(), heartbeat_namespace);
        let selectors = IndexCache::new(policies.clone());
        let (dra, device_changes) = match devices::discover(client).await {
            Some(api) => {
                let (caches, changes) = dra_watches(client, api, &listing);
                (Some(caches), changes)
            }
            None => (None, futures::stream::pending().boxed()),
        };
        // Kubelet heartbeats and report refreshes change nothing gpunode decides: only material
        // changes trigger a reconcile (a probe's Lease renewal, only for a stale node).
        let node_changes = triggers::material_changes(
            node_stream,
            "node",
            metrics.clone(),
            triggers::NodeFingerprints::default(),
            triggers::vanished_node,
        )
        .boxed();
        let report_changes = triggers::material_changes(
            report_stream,
            "report",
            metrics,
            triggers::ReportVerdicts {
                nodes: nodes.clone(),
                selectors: selectors.clone(),
                verdicts,
                heartbeats: heartbeats.clone(),
            },
            triggers::vanished_report,
        )
        .boxed();
        Watches {
            caches: Caches {
                nodes,
                reports,
                heartbeats,
                policies,
                written: Arc::default(),
                selectors,
                fleet: Arc::default(),
                dra,
            },
            node_changes,
            report_changes,
            named_changes: futures::stream::select(device_changes, renewals).boxed(),
            leases,
            lease_task,
        }
    }

    /// A future that completes once the node, report and Lease caches, and on a DRA cluster the
    /// ResourceSlice and DeviceTaintRule caches, hold a full list (never, if a watch's store is
    /// dropped first). Without the Leases every report not rewritten in `staleAfter` would look
    /// stale; without the ResourceSlices every DRA node would look like a device-plugin node,
    /// where a quarantined GPU cannot be held on its own: its node's rules would drain it.
    pub fn synced(&self) -> impl std::future::Future<Output = bool> + Send + 'static {
        all_synced(
            self.caches.nodes.clone(),
            self.caches.reports.clone(),
            self.leases.clone(),
            self.caches.dra.clone(),
        )
    }

    /// The Lease watch's task, to abort once the controller stops (the node and report watches
    /// stop with the controller that polls them).
    pub fn lease_task(&self) -> tokio::task::AbortHandle {
        self.lease_task.abort_handle()
    }
}

/// Whether every cache the planner reads holds a full list: see [`Watches::synced`].
async fn all_synced(
    nodes: Store<Node>,
    reports: Store<CachedReport>,
    leases: Store<Lease>,
    dra: Option<DraCaches>,
) -> bool {
    let dra_ready = match dra {
        Some(dra) => {
            dra.slices.wait_until_ready().await.is_ok() && dra.rules.wait_until_ready().await.is_ok()
        }
        None => true,
    };
    dra_ready
        && nodes.wait_until_ready().await.is_ok()
        && reports.wait_until_ready().await.is_ok()
        && leases.wait_until_ready().await.is_ok()
}

/// The watch of the probes' heartbeat Leases in `namespace`, feeding its cache in the
/// background. A renewal changes a decision only where a policy last found the node's report
/// stale (a probe whose clock runs behind the operator's: its reports look old as they arrive,
/// only its heartbeats keep it fresh); only those are triggers. A probe that comes back after a
/// gap otherwise writes its whole report, which triggers by itself. Returns the cache, the
/// watch's task and those renewals, as stand-in Nodes naming the node.
fn lease_watch(
    client: &Client,
    namespace: &str,
    listing: &watcher::Config,
    verdicts: Arc<VerdictCache>,
) -> (
    Store<Lease>,
    tokio::task::JoinHandle<()>,
    BoxStream<'static, Result<Node, watcher::Error>>,
) {
    let (leases, mut lease_writer) = reflector::store::<Lease>();
    let cached = leases.clone();
    let (renewals, heard) = futures::channel::mpsc::unbounded::<String>();
    let lease_stream = backoff::watcher(
        Api::<Lease>::namespaced(client.clone(), namespace),
        listing.clone().labels(gpunode_crds::heartbeat::LEASE_SELECTOR),
        "lease",
    )
    .modify(heartbeats::trim)
    .map_ok(move |event| {
        let now = jiff::Timestamp::now();
        let event = heartbeats::stamp(event, &cached, now);
        // Cached before the trigger goes out, so the reconcile it starts hears the renewal.
        lease_writer.apply_watcher_event(&event);
        if let Some(node) = heartbeats::renewed(&event, now)
            && verdicts.stale_somewhere(node)
        {
            let _ = renewals.unbounded_send(node.to_string());
        }
        event
    });
    let task = tokio::spawn(lease_stream.for_each(|event| async move {
        if let Err(e) = event {
            warn!(error = %e, "heartbeat Lease watch");
        }
    }));
    (leases, task, heard.map(|node| Ok(node_named(&node))).boxed())
}

/// The ResourceSlice and DeviceTaintRule watches: their caches, and their changes as stand-in
/// Nodes naming the node each concerns.
fn dra_watches(
    client: &Client,
    api: devices::Dra,
    listing: &watcher::Config,
) -> (DraCaches, BoxStream<'static, Result<Node, watcher::Error>>) {
    let slice_writer = reflector::store::Writer::new(api.slices.clone());
    let slices = slice_writer.as_reader();
    let rule_writer = reflector::store::Writer::new(api.rules.clone());
    let caches = DraCaches::new(api.clone(), slices, rule_writer.as_reader());
    let (slice_events, rule_events) = (caches.events.clone(), caches.events.clone());
    let slice_stream = backoff::watcher(
        Api::<devices::ResourceSlice>::all_with(client.clone(), &api.slices),
        listing.clone(),
        "resourceslice",
    )
    .modify(devices::trim_slice)
    .reflect(slice_writer)
    .inspect(move |_| {
        slice_events.fetch_add(1, Ordering::AcqRel);
    })
    .touched_objects()
    .map(|r| r.map(|s| node_named(s.spec.node_name.as_deref().unwrap_or_default())));
    let rule_stream = backoff::watcher(
        Api::<devices::DeviceTaintRule>::all_with(client.clone(), &api.rules),
        listing.clone().labels(devices::rules::RULE_SELECTOR),
        "devicetaintrule",
    )
    .modify(|r: &mut devices::DeviceTaintRule| r.metadata.managed_fields = None)
    .reflect(rule_writer)
    .inspect(move |_| {
        rule_events.fetch_add(1, Ordering::AcqRel);
    })
    .touched_objects()
    .map(|r| r.map(|rule| node_named(devices::rules::node_of(&rule).unwrap_or_default())));
    let changes = futures::stream::select(slice_stream, rule_stream)
        .filter(|r| {
            std::future::ready(
                r.as_ref()
                    .map_or(true, |n| n.metadata.name.as_deref() != Some("")),
            )
        })
        .boxed();
    (caches, changes)
}

/// A Node with only a name: which node a device change concerns.
fn node_named(name: &str) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.to_string());
    n
}

/// How the node and report watches list. Streamed from the API server's cache
/// (`sendInitialEvents`) where the server supports it: a list from the cache comes in one
/// response whatever the page size (9 MB of reports at 1,000 nodes, 45 MB at 5,000, buffered and
/// decoded at once, a peak the allocator keeps), and a consistent paginated list has to wait for
/// the cache to catch up with etcd, which an API server busy with 5,000 nodes' heartbeats did
/// not within its 60 s timeout. Kubernetes 1.33 ships the WatchList feature off and refuses such
/// watches (422), so the server is asked once, with a watch that selects nothing; anything but
/// a yes falls back to a plain list from the cache.
pub async fn list_strategy(client: &Client) -> watcher::Config {
    let probe = WatchParams::streaming_lists().labels("gpunode.dev/watch-list-probe=none");
    let asked = tokio::time::timeout(
        Duration::from_secs(10),
        Api::<Node>::all(client.clone()).watch(&probe, "0"),
    )
    .await;
    match asked {
        Ok(Ok(_stream)) => {
            info!("watches list as streams (WatchList)");
            watcher::Config::default().streaming_lists()
        }
        Ok(Err(e)) => {
            info!(reason = %e, "the API server does not stream lists; watches list from its cache");
            watcher::Config::default().any_semantic()
        }
        Err(_) => {
            warn!("no answer on whether the API server streams lists; watches list from its cache");
            watcher::Config::default().any_semantic()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use kube::{
        core::{ApiResource, GroupVersionKind},
        runtime::{reflector::store::Writer, watcher::Event},
    };

    use super::*;

    /// A store whose watch has listed everything (an empty list).
    fn listed<K>(writer: &mut Writer<K>)
    where
        K: kube::Resource + Clone + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone,
    {
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
    }

    fn resource(kind: &str, plural: &str) -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind), plural)
    }

    fn tainted(key: &str, effect: &str) -> Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n"},
            "spec": {"taints": [{"key": key, "effect": effect}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
        .unwrap()
    }

    #[test]
    fn a_gpu_pool_taint_does_not_make_a_node_unavailable_but_any_other_does() {
        let ignored = vec!["nvidia.com/gpu".to_string()];
        assert!(!unavailable(&tainted("nvidia.com/gpu", "NoSchedule"), &ignored));
        assert!(unavailable(&tainted("nvidia.com/gpu", "NoSchedule"), &[]));
        assert!(unavailable(&tainted("maintenance", "NoExecute"), &ignored));
        assert!(!unavailable(
            &tainted("maintenance", "PreferNoSchedule"),
            &ignored
        ));
    }

    /// Before the ResourceSlices are listed every DRA node looks like a device-plugin node,
    /// where a quarantined GPU is not held on its own: a restarted operator planning then
    /// escalated quarantines to its node's Drain.
    #[tokio::test]
    async fn planning_waits_for_the_resource_slices_and_device_taint_rules_too() {
        let (nodes, mut node_writer) = reflector::store::<Node>();
        let (reports, mut report_writer) = reflector::store::<CachedReport>();
        let (leases, mut lease_writer) = reflector::store::<Lease>();
        let api = devices::Dra {
            slices: resource("ResourceSlice", "resourceslices"),
            rules: resource("DeviceTaintRule", "devicetaintrules"),
        };
        let mut slice_writer = Writer::<devices::ResourceSlice>::new(api.slices.clone());
        let mut rule_writer = Writer::<devices::DeviceTaintRule>::new(api.rules.clone());
        let dra = DraCaches::new(api, slice_writer.as_reader(), rule_writer.as_reader());
        let synced = all_synced(nodes, reports, leases, Some(dra));
        tokio::pin!(synced);

        listed(&mut node_writer);
        listed(&mut report_writer);
        listed(&mut lease_writer);
        listed(&mut rule_writer);
        assert!(
            matches!(futures::poll!(synced.as_mut()), Poll::Pending),
            "synced before the ResourceSlices were listed"
        );
        listed(&mut slice_writer);
        assert!(
            matches!(futures::poll!(synced.as_mut()), Poll::Ready(true)),
            "not synced once every cache was listed"
        );
    }

    #[test]
    fn the_dra_caches_are_grouped_by_node_again_only_after_a_watch_event() {
        let api = devices::Dra {
            slices: resource("ResourceSlice", "resourceslices"),
            rules: resource("DeviceTaintRule", "devicetaintrules"),
        };
        let mut slice_writer = Writer::<devices::ResourceSlice>::new(api.slices.clone());
        let rule_writer = Writer::<devices::DeviceTaintRule>::new(api.rules.clone());
        let dra = DraCaches::new(api.clone(), slice_writer.as_reader(), rule_writer.as_reader());
        let first = dra.by_node();
        assert!(
            Arc::ptr_eq(&first, &dra.by_node()),
            "nothing delivered: the same grouping"
        );
        let mut slice = devices::ResourceSlice::new("n1-gpu", &api.slices, Default::default());
        slice.spec.node_name = Some("n1".to_string());
        slice_writer.apply_watcher_event(&Event::Apply(slice));
        assert!(
            dra.by_node().slices.is_empty(),
            "grouped again without an event counted"
        );
        dra.events.fetch_add(1, Ordering::AcqRel);
        assert_eq!(dra.by_node().slices.get("n1").map(Vec::len), Some(1));
    }

    #[tokio::test]
    async fn without_dra_the_node_report_and_lease_caches_are_enough() {
        let (nodes, mut node_writer) = reflector::store::<Node>();
        let (reports, mut report_writer) = reflector::store::<CachedReport>();
        let (leases, mut lease_writer) = reflector::store::<Lease>();
        let synced = all_synced(nodes, reports, leases, None);
        tokio::pin!(synced);
        listed(&mut node_writer);
        listed(&mut report_writer);
        assert!(matches!(futures::poll!(synced.as_mut()), Poll::Pending));
        listed(&mut lease_writer);
        assert!(matches!(futures::poll!(synced.as_mut()), Poll::Ready(true)));
    }
}
