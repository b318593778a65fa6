//! The controller: watches policies, reports and nodes (one watch each, shared by the caches and
//! the triggers), and reconciles a policy whenever one of its nodes or their reports changes.
//! A reconcile is observe → evaluate → plan → apply → status; only [`crate::apply`] writes to
//! nodes, and only while this replica leads.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::{
    leader::Leadership,
    metrics::{ActionKind, ActionResult, ErrorKind, Metrics},
    server::Readiness,
};

use futures::{FutureExt, StreamExt};
use gpunode_crds::{
    GpuNodePolicy, GpuNodePolicyStatus, GpuNodeReport,
    selector::{self, InvalidSelector},
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, WatchParams},
    core::DeserializeGuard,
    core::{Selector, SelectorExt},
    runtime::{
        Controller, WatchStreamExt,
        controller::{self, Action},
        events::{Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;
use tracing::{debug, info, warn};

/// Finalizer that lets a deleted policy undo what it did before it goes.
pub const FINALIZER: &str = "gpunode.dev/cleanup";

/// How many nodes one reconcile writes at once.
const APPLY_CONCURRENCY: usize = 128;

use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};

use crate::{
    apply::{Applier, FIELD_MANAGER},
    cache::{PolicyVerdicts, VerdictCache},
    heartbeats::Heartbeats,
    markers,
    own_writes::OwnWrites,
    plan::{self, NodeView, PolicyPlan},
    status, triggers,
};

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Writing some of a policy's nodes failed; each failure was counted under its own kind
    /// when it happened.
    #[error("{failed} node writes failed, the first: {first}")]
    Nodes {
        /// How many.
        failed: usize,
        /// The first failure.
        first: crate::apply::ApplyError,
    },
    /// Releasing a node failed (or this replica stopped leading part-way): the release is
    /// retried, and a deleted policy keeps its finalizer until every node is released.
    #[error(transparent)]
    Apply(#[from] crate::apply::ApplyError),
    /// Adding or removing the cleanup finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// The pass got no answer in time.
    #[error("reconcile pass took longer than {0:?}; retrying")]
    Timeout(Duration),
    /// Writing the policy status failed.
    #[error("policy {policy}: status: {source}")]
    Status {
        /// The policy.
        policy: String,
        /// The error.
        source: kube::Error,
    },
}

impl Error {
    /// The metric kind: what failed, not how it travelled.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Nodes { first, .. } => first.kind(),
            Error::Apply(e) => e.kind(),
            Error::Finalizer(_) | Error::Timeout(_) => ErrorKind::Other,
            Error::Status { .. } => ErrorKind::Status,
        }
    }

    /// Whether [`error_policy`] still has to count it (node failures are counted as they happen;
    /// a replica that stopped leading has nothing to report).
    fn counted(&self) -> bool {
        matches!(
            self,
            Error::Nodes { .. } | Error::Apply(crate::apply::ApplyError::NotLeader(_))
        )
    }

    /// The error the finalizer helper wrapped, so it is counted and handled as itself.
    fn from_finalizer(e: kube::runtime::finalizer::Error<Error>) -> Error {
        use kube::runtime::finalizer::Error as F;
        match e {
            F::ApplyFailed(e) | F::CleanupFailed(e) => e,
            other => Error::Finalizer(Box::new(other)),
        }
    }
}

/// Everything a reconcile needs.
pub struct Context {
    /// Client for policy status.
    pub client: Client,
    /// The node writer.
    pub applier: Applier,
    /// Nodes (managed fields stripped).
    pub nodes: Store<Node>,
    /// Reports.
    pub reports: Store<Guarded<GpuNodeReport>>,
    /// The probes' heartbeat Leases.
    pub heartbeats: Heartbeats,
    /// Policies.
    pub policies: Store<Guarded<GpuNodePolicy>>,
    /// Events, published in the background (one recorder, so repeats aggregate).
    pub events: crate::events::Publisher,
    /// Whether this replica may write.
    pub leadership: Leadership,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// True once the node and report caches hold a full list.
    pub synced: Arc<AtomicBool>,
    /// Verdicts of the last reconcile of each policy, reused while their inputs are unchanged.
    pub verdicts: Arc<VerdictCache>,
    /// When each policy's status was last written (see [`STATUS_MIN_INTERVAL`]).
    pub status_written: std::sync::Mutex<HashMap<String, std::time::Instant>>,
    /// Nodes as gpunode's own writes returned them, until the watch delivers those versions.
    pub written: OwnWrites,
    /// Wakes the search for nodes no policy governs ([`crate::sweep`]).
    pub sweep: Arc<tokio::sync::Notify>,
}

/// Least time between two status writes of one policy. Its counts change with every node that
/// changes, and a status write is one more request on the path of the next node's action: under a
/// stream of changes the status trails by at most this long instead.
pub const STATUS_MIN_INTERVAL: Duration = Duration::from_secs(1);

impl Context {
    /// `None` when the policy's status may be written now (and records that it is), else how
    /// long until it may.
    fn status_slot(&self, policy: &str) -> Option<Duration> {
        let mut written = self.status_written.lock().unwrap_or_else(PoisonError::into_inner);
        let now = std::time::Instant::now();
        match written.get(policy) {
            Some(last) if now.duration_since(*last) < STATUS_MIN_INTERVAL => {
                Some(STATUS_MIN_INTERVAL - now.duration_since(*last))
            }
            _ => {
                written.insert(policy.to_string(), now);
                None
            }
        }
    }
}

/// The policy's node selector, parsed as strictly as the API server validates it. Also checks
/// the drain's pod selector: a policy with any unusable selector selects no node at all.
pub(crate) fn selector_of(policy: &GpuNodePolicy) -> Result<Selector, InvalidSelector> {
    if let Some(pods) = &policy.spec.disruption.drain.pod_selector {
        selector::parse(POD_SELECTOR_FIELD, pods)?;
    }
    selector::parse("spec.nodeSelector", &policy.spec.node_selector)
}

/// Where the drain's pod selector is, in errors and conditions.
pub const POD_SELECTOR_FIELD: &str = "spec.disruption.drain.podSelector";

/// A watched object that may not have deserialized: one malformed policy or report is logged
/// and skipped instead of stalling the watch.
pub type Guarded<K> = DeserializeGuard<K>;

impl Context {
    /// The node's report as the cache holds it (readable or not).
    fn report(&self, node: &str) -> Option<Arc<Guarded<GpuNodeReport>>> {
        self.reports.get(&ObjectRef::new(node))
    }

    /// Name and parsed node selector of every readable policy not being deleted; parsed once
    /// per reconcile instead of once per node and policy.
    fn selectors(&self) -> Vec<(String, Selector)> {
        self.policies
            .state()
            .iter()
            .filter_map(|g| g.0.as_ref().ok())
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| selector_of(p).ok().map(|s| (p.name_any(), s)))
            .collect()
    }
}

fn selects(policy: &GpuNodePolicy, labels: &BTreeMap<String, String>) -> bool {
    policy.metadata.deletion_timestamp.is_none() && selector_of(policy).is_ok_and(|s| s.matches(labels))
}

/// When the report was observed, if it is readable and says.
fn observed_at(report: Option<&Guarded<GpuNodeReport>>) -> Option<Timestamp> {
    report
        .and_then(|g| g.0.as_ref().ok())
        .and_then(|r| r.status.as_ref())
        .and_then(|s| s.observed_at.as_ref())
        .map(|t| t.0)
}

/// The policies that select a node with these labels.
fn policies_for(
    store: &Store<Guarded<GpuNodePolicy>>,
    labels: &BTreeMap<String, String>,
) -> Vec<ObjectRef<Guarded<GpuNodePolicy>>> {
    store
        .state()
        .iter()
        .filter(|g| g.0.as_ref().is_ok_and(|p| selects(p, labels)))
        .map(|g| ObjectRef::from_obj(g.as_ref()))
        .collect()
}

/// What a reconcile reads about each node besides the Node itself.
pub struct Inputs<'a> {
    /// Reports.
    pub reports: &'a Store<Guarded<GpuNodeReport>>,
    /// The probes' heartbeats.
    pub heartbeats: &'a Heartbeats,
    /// Name and selector of every policy, for conflicts.
    pub selectors: &'a [(String, Selector)],
}

fn view(
    policy: &GpuNodePolicy,
    node: &Node,
    inputs: &Inputs<'_>,
    verdicts: &mut PolicyVerdicts,
    now: Timestamp,
) -> NodeView {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let report = inputs.reports.get(&ObjectRef::new(name));
    let heard = inputs.heartbeats.heard(name);
    let verdict = verdicts.verdict(policy, name, report.as_deref(), heard, now);
    let selectors = inputs.selectors;
    let policy_name = policy.metadata.name.as_deref().unwrap_or_default();
    let mut conflicts: Vec<String> = selectors
        .iter()
        .filter(|(other, s)| other != policy_name && s.matches(node.labels()))
        .map(|(other, _)| other.clone())
        .collect();
    conflicts.sort();
    let (view, errors) = NodeView::observe(node, verdict, conflicts);
    for e in errors {
        warn!(node = %name, error = %e, "ignoring unreadable gpunode annotation");
    }
    view
}

/// The pure middle of a reconcile: every node's view (its verdict reused from `verdicts` while
/// its report, the policy and the time allow) and the policy's plan.
pub fn decide(
    policy: &GpuNodePolicy,
    nodes: &[Arc<Node>],
    inputs: &Inputs<'_>,
    verdicts: &mut PolicyVerdicts,
    now: Timestamp,
) -> (Vec<NodeView>, PolicyPlan) {
    verdicts.begin(policy);
    let views: Vec<NodeView> = nodes
        .iter()
        .map(|n| view(policy, n, inputs, verdicts, now))
        .collect();
    verdicts.end();
    let plan = plan::plan(&policy.spec, &views, now);
    (views, plan)
}

/// When the plan next changes on its own (an `after`, a `healthyFor`, a report going stale, a
/// drain timing out), so the reconcile can requeue exactly then.
fn next_wakeup(policy: &GpuNodePolicy, plan: &PolicyPlan, ctx: &Context, now: Timestamp) -> Duration {
    let spec = &policy.spec;
    let d = |x: gpunode_crds::Duration| SignedDuration::try_from(x.get()).unwrap_or(SignedDuration::MAX);
    let mut times: Vec<Timestamp> = Vec::new();
    for n in &plan.nodes {
        for track in n.markers.classes.values() {
            times.extend(
                spec.remediation
                    .iter()
                    .filter_map(|r| track.since.checked_add(d(r.after)).ok()),
            );
            if let Some(c) = track.cleared_at {
                times.extend(c.checked_add(d(spec.recovery.healthy_for)).ok());
            }
        }
        if let plan::DrainStep::Run {
            started,
            stuck: false,
        } = n.drain
        {
            times.extend(started.checked_add(d(spec.disruption.drain.timeout)).ok());
        }
        let heard = ctx.heartbeats.heard(&n.node);
        if let Some(t) =
            observed_at(ctx.report(&n.node).as_deref()).map(|o| crate::evaluate::last_heard(o, heard))
        {
            times.extend(t.checked_add(d(spec.stale_after)).ok());
        }
    }
    let next = times.into_iter().filter(|t| *t > now).min();
    let wait = next.map_or(Duration::from_secs(300), |t| {
        Duration::try_from(t.duration_since(now)).unwrap_or(Duration::from_secs(300))
    });
    // Draining nodes are revisited often: evictions refused by a PDB are retried.
    let draining = plan
        .nodes
        .iter()
        .any(|n| matches!(n.drain, plan::DrainStep::Run { .. }));
    let cap = if draining {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(300)
    };
    (wait + Duration::from_millis(100)).min(cap)
}

/// Reconciles one policy over all of its nodes.
#[tracing::instrument(skip_all, fields(policy = %guarded.name_any()))]
pub async fn reconcile(guarded: Arc<Guarded<GpuNodePolicy>>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.start_reconcile();
    let policy = match &guarded.0 {
        Ok(p) => Arc::new(p.clone()),
        Err(e) => {
            // The API server validates policies, so this is version skew or a hand-made object:
            // say so and wait for it to change.
            warn!(error = %e.error, "skipping a GpuNodePolicy that cannot be read");
            ctx.metrics.reconcile_error(ErrorKind::InvalidObject);
            return Ok(Action::await_change());
        }
    };
    if !ctx.leadership.is_leader() {
        // Followers neither compute nor write; the leader covers everything.
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    if !ctx.synced.load(Ordering::Acquire) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let api = Api::<GpuNodePolicy>::all(ctx.client.clone());
    let pass = finalizer(&api, FINALIZER, policy, |event| async {
        match event {
            FinalizerEvent::Apply(p) => reconcile_policy(p, ctx.clone()).await,
            FinalizerEvent::Cleanup(p) => release_policy(&p, &ctx).await,
        }
    });
    // A request can go unanswered for good (sent as the API server went away; kube has no read
    // timeout by default, since watches idle): bound the pass, so it fails and is retried
    // instead of holding this policy, and every drain of it, until the connection dies.
    match tokio::time::timeout(RECONCILE_TIMEOUT, pass).await {
        Ok(r) => r.map_err(Error::from_finalizer),
        Err(_) => Err(Error::Timeout(RECONCILE_TIMEOUT)),
    }
}

/// Longest a reconcile pass may take (a drain pass of a large node included) before it is
/// abandoned and retried.
pub const RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);

/// Nodes this policy labelled that no policy selects any more: everything gpunode did to them
/// is undone. (A node another policy selects is left to that policy's plan.)
fn orphans(policy: &GpuNodePolicy, ctx: &Context, selectors: &[(String, Selector)]) -> Vec<Arc<Node>> {
    let name = policy.name_any();
    ctx.nodes
        .state()
        .into_iter()
        .filter(|n| n.labels().get(markers::POLICY_LABEL) == Some(&name))
        .filter(|n| !selectors.iter().any(|(_, s)| s.matches(n.labels())))
        .collect()
}

/// Releases each node in turn. Fails, rather than stopping quietly, when this replica stops
/// leading part-way: a deleted policy must keep its finalizer until every node is released.
async fn release_nodes(nodes: Vec<Arc<Node>>, ctx: &Context, why: &str) -> Result<(), Error> {
    let now = Timestamp::now();
    release_each(
        nodes,
        || ctx.leadership.is_leader(),
        |n| async move {
            let wrote = ctx.applier.release(&n, now).await?;
            if wrote {
                ctx.metrics.action(ActionKind::Release, ActionResult::Ok);
                let event = plan::PlannedEvent {
                    warning: false,
                    reason: "Released",
                    note: format!(
                        "gpunode removed its labels, annotations, taints, cordon and condition: {why}"
                    ),
                };
                ctx.events.publish(&n, &[event]);
            }
            Ok(())
        },
    )
    .await
    .map_err(Error::from)
}

/// Releases nodes in order while `leading()` holds. Losing leadership part-way is an error
/// naming the first node left, never a quiet success: a deleted policy's finalizer must stay
/// until every node is released, by this replica or the next leader.
async fn release_each<F, Fut>(
    nodes: Vec<Arc<Node>>,
    leading: impl Fn() -> bool,
    mut release: F,
) -> Result<(), crate::apply::ApplyError>
where
    F: FnMut(Arc<Node>) -> Fut,
    Fut: std::future::Future<Output = Result<(), crate::apply::ApplyError>>,
{
    for n in nodes {
        if !leading() {
            return Err(crate::apply::ApplyError::NotLeader(n.name_any()));
        }
        release(n).await?;
    }
    Ok(())
}

/// How often the leader looks for nodes no policy governs, besides at start-up and whenever a
/// policy goes away (a safety net: the search reads only the caches).
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Releases gpunode's markers on nodes no policy governs ([`crate::sweep`]) whenever `wake`
/// is notified or [`SWEEP_INTERVAL`] passes, while this replica leads and its caches are synced.
async fn sweeper(ctx: Arc<Context>, wake: Arc<tokio::sync::Notify>) {
    let mut leading = ctx.leadership.subscribe();
    loop {
        tokio::select! {
            () = wake.notified() => {}
            changed = leading.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(SWEEP_INTERVAL) => {}
        }
        if !ctx.leadership.is_leader()
            || !ctx.synced.load(Ordering::Acquire)
            || ctx.policies.wait_until_ready().now_or_never().is_none()
        {
            continue;
        }
        let Some(nodes) = crate::sweep::unowned(&ctx.nodes.state(), &ctx.policies.state()) else {
            debug!("a GpuNodePolicy cannot be read: no node is released as unowned");
            continue;
        };
        if nodes.is_empty() {
            continue;
        }
        info!(
            nodes = nodes.len(),
            "releasing nodes that carry gpunode's markers but no policy governs"
        );
        let pass = release_nodes(nodes, &ctx, "no GpuNodePolicy governs this node");
        match tokio::time::timeout(RECONCILE_TIMEOUT, pass).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                warn!(error = %e, "releasing unowned nodes");
                if !e.counted() {
                    ctx.metrics.reconcile_error(e.kind());
                }
                // Try again soon rather than at the next interval.
                wake.notify_one();
            }
            Err(_) => warn!("releasing unowned nodes took longer than {RECONCILE_TIMEOUT:?}"),
        }
    }
}

/// The policy is being deleted: undo what it did to every node no other policy selects.
async fn release_policy(policy: &GpuNodePolicy, ctx: &Context) -> Result<Action, Error> {
    let nodes = orphans(policy, ctx, &ctx.selectors());
    info!(policy = %policy.name_any(), nodes = nodes.len(), "policy deleted: releasing its nodes");
    release_nodes(
        nodes,
        ctx,
        &format!("GpuNodePolicy {} was deleted", policy.name_any()),
    )
    .await?;
    forget(ctx, &policy.name_any());
    // Whatever else the policy left (a node it labelled that another policy's release missed)
    // is found now rather than at the next interval.
    ctx.sweep.notify_one();
    Ok(Action::await_change())
}

/// Drops everything kept about a policy that is gone: cached verdicts, the status slot and its
/// metric series (an alert on a deleted policy's gauges would fire for ever).
fn forget(ctx: &Context, policy: &str) {
    ctx.verdicts.forget(policy);
    ctx.status_written
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(policy);
    ctx.metrics.forget_policy(policy);
}

/// A policy with a selector gpunode cannot use selects no node: nothing is acted on or undone,
/// the Degraded condition names the field, and the policy is looked at again when it changes.
async fn invalid_policy(
    policy: &GpuNodePolicy,
    ctx: &Context,
    source: &InvalidSelector,
) -> Result<Action, Error> {
    let name = policy.name_any();
    warn!(policy = %name, error = %source, "policy has an unusable selector: it selects no node");
    ctx.metrics.reconcile_error(ErrorKind::InvalidObject);
    ctx.metrics.set_policy_nodes(&name, []);
    let new_status = status::invalid(
        source,
        policy.metadata.generation,
        policy.status.as_ref(),
        Timestamp::now(),
    );
    ctx.metrics.set_policy_conditions(&name, &new_status.conditions);
    let changed = policy
        .status
        .as_ref()
        .is_none_or(|old| !status::same_ignoring_time(old, &new_status));
    if changed && ctx.leadership.is_leader() {
        write_status(ctx, &name, &new_status).await?;
    }
    Ok(Action::await_change())
}

async fn write_status(ctx: &Context, name: &str, new_status: &GpuNodePolicyStatus) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": "gpunode.dev/v1alpha1",
        "kind": "GpuNodePolicy",
        "status": new_status,
    });
    Api::<GpuNodePolicy>::all(ctx.client.clone())
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| Error::Status {
            policy: name.to_string(),
            source,
        })?;
    Ok(())
}

async fn reconcile_policy(policy: Arc<GpuNodePolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = policy.name_any();
    let selector = match selector_of(&policy) {
        Ok(s) => s,
        Err(e) => return invalid_policy(&policy, &ctx, &e).await,
    };
    let selectors = ctx.selectors();
    release_nodes(
        orphans(&policy, &ctx, &selectors),
        &ctx,
        &format!("it left the selector of GpuNodePolicy {name}"),
    )
    .await?;
    let now = Timestamp::now();
    let nodes: Vec<Arc<Node>> = ctx
        .written
        .overlay(ctx.nodes.state())
        .into_iter()
        .filter(|n| selector.matches(n.labels()))
        .collect();
    let (views, plan) = {
        let verdicts = ctx.verdicts.policy(&name);
        let mut verdicts = verdicts.lock().unwrap_or_else(PoisonError::into_inner);
        let inputs = Inputs {
            reports: &ctx.reports,
            heartbeats: &ctx.heartbeats,
            selectors: &selectors,
        };
        let decided = decide(&policy, &nodes, &inputs, &mut verdicts, now);
        let (reused, evaluated) = verdicts.stats();
        ctx.metrics.verdicts(reused, evaluated);
        decided
    };

    let by_name: HashMap<&str, &Arc<Node>> = nodes
        .iter()
        .map(|n| (n.metadata.name.as_deref().unwrap_or_default(), n))
        .collect();
    let conflicts: HashMap<&str, &[String]> = views
        .iter()
        .map(|v| (v.name.as_str(), v.conflicts.as_slice()))
        .collect();
    // Only nodes with something to write, drain or announce become jobs: a reconcile that
    // changes nothing clones nothing and sends nothing. Owned jobs, so the concurrent writes
    // borrow nothing from this frame.
    let jobs: Vec<(plan::NodePlan, Arc<Node>)> = plan
        .nodes
        .iter()
        .filter_map(|np| {
            let node = *by_name.get(np.node.as_str())?;
            // With overlapping policies, only the first by name labels the node, so the two do
            // not flip its labels back and forth.
            let defer = conflicts
                .get(np.node.as_str())
                .is_some_and(|others| others.iter().any(|c| c < &name));
            if defer || !Applier::needs_work(&name, np, node) {
                return None;
            }
            Some((np.clone(), node.clone()))
        })
        .collect();
    // The pass's copies of the nodes are not needed any more: each job holds its own, released
    // as it completes, while the cache moves on to the written versions (at 5,000 nodes, a
    // second copy of every node for the length of convergence).
    drop(by_name);
    drop(conflicts);
    drop(views);
    drop(nodes);
    let (mut first_error, mut failed) = (None, 0);
    let results: Vec<Result<(u32, u32), crate::apply::ApplyError>> = futures::stream::iter(jobs)
        .map(|(np, node)| {
            let ctx = ctx.clone();
            let policy = policy.clone();
            async move {
                // Only the leader writes; a replica that lost its lease mid-reconcile stops.
                if !ctx.leadership.is_leader() {
                    return Ok((0, 0));
                }
                let r = ctx
                    .applier
                    .apply(&policy.name_any(), &np, &node, &policy.spec.disruption.drain, now)
                    .await;
                let mut r = r;
                if let Ok(o) = &mut r {
                    if let Some(n) = o.written.take() {
                        ctx.written.wrote(n, &ctx.nodes);
                    }
                    for (part, wrote) in [
                        ("metadata", o.wrote_metadata),
                        ("spec", o.wrote_spec),
                        ("condition", o.wrote_condition),
                    ] {
                        if wrote {
                            ctx.metrics.node_write(part);
                        }
                    }
                }
                // Events are writes too: none from a replica whose term passed during the apply.
                if np.write && r.is_ok() && ctx.leadership.is_leader() {
                    record_actions(&ctx, &np, &node);
                    ctx.events.publish(&node, &np.events);
                }
                r.map(|o| (o.evicted, o.refused))
            }
        })
        // Nodes written concurrently: 8 made convergence ~3 sequential requests per 8 nodes
        // (the scale benchmark); a plain client reaches the API server's limit near 128.
        .buffer_unordered(APPLY_CONCURRENCY)
        .collect()
        .await;
    for r in results {
        match r {
            Ok((evicted, refused)) => {
                for _ in 0..evicted {
                    ctx.metrics.action(ActionKind::Evict, ActionResult::Ok);
                }
                // Refused by a PodDisruptionBudget (429): retried on the next pass.
                for _ in 0..refused {
                    ctx.metrics.action(ActionKind::Evict, ActionResult::Blocked);
                }
            }
            Err(e) => {
                warn!(error = %e, "applying a node plan failed");
                if !matches!(e, crate::apply::ApplyError::NotLeader(_)) {
                    ctx.metrics.reconcile_error(e.kind());
                }
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    ctx.metrics
        .set_policy_nodes(&name, plan.nodes.iter().map(|n| n.state));

    debug!(nodes = plan.nodes.len(), "node plans applied");
    let new_status = status::status(
        &plan,
        policy.metadata.generation,
        policy.spec.paused,
        policy.status.as_ref(),
        now,
    );
    ctx.metrics.set_policy_conditions(&name, &new_status.conditions);
    // A replica paused mid-reconcile (SIGSTOP, a stall) may resume after another took over:
    // it writes no status from its stale plan.
    if !ctx.leadership.is_leader() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let mut wake = next_wakeup(&policy, &plan, &ctx, now);
    let status_changed = policy
        .status
        .as_ref()
        .is_none_or(|old| !status::same_ignoring_time(old, &new_status));
    if status_changed && let Some(later) = ctx.status_slot(&name) {
        // Written by the pass that runs once the interval is over.
        wake = wake.min(later);
    } else if status_changed {
        write_status(&ctx, &name, &new_status).await?;
    }
    if let Some(first) = first_error {
        return Err(Error::Nodes { failed, first });
    }
    debug!(requeue_after = ?wake, "reconciled");
    Ok(Action::requeue(wake))
}

/// Counts the actions a written plan took, and the report-to-action latency of state changes.
fn record_actions(ctx: &Context, np: &plan::NodePlan, node: &Node) {
    for e in &np.events {
        let kind = match e.reason {
            "Tainted" => Some(ActionKind::Taint),
            "TaintRemoved" => Some(ActionKind::Untaint),
            "Cordoned" => Some(ActionKind::Cordon),
            "Uncordoned" => Some(ActionKind::Uncordon),
            "DrainStarted" => Some(ActionKind::DrainStart),
            "DrainStuck" => Some(ActionKind::DrainStuck),
            "Drifted" | "Compliant" | "Unknown" => Some(ActionKind::Label),
            _ => None,
        };
        if let Some(k) = kind {
            ctx.metrics.action(k, ActionResult::Ok);
        }
    }
    for _ in &np.pending {
        ctx.metrics.action(ActionKind::Label, ActionResult::Blocked);
    }
    let changed_state = np
        .events
        .iter()
        .any(|e| matches!(e.reason, "Drifted" | "Compliant" | "Unknown"));
    if changed_state && let Some(observed) = observed_at(ctx.report(&node.name_any()).as_deref()) {
        ctx.metrics.reaction_between(observed, Timestamp::now());
    }
}

fn error_policy(policy: Arc<Guarded<GpuNodePolicy>>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!(policy = %policy.name_any(), kind = error.kind().as_str(), %error, "reconcile failed");
    if !error.counted() {
        ctx.metrics.reconcile_error(error.kind());
    }
    // A policy with an unusable selector never gets here: it is reconciled to a Degraded
    // status and waits for a change (invalid_policy).
    Action::requeue(Duration::from_secs(2))
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

/// How the controller runs.
pub struct Options {
    /// Reporter instance for events (the pod name).
    pub instance: String,
    /// Whether this replica may write (leader election flips it).
    pub leadership: Leadership,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Set once the caches are synced, for /readyz.
    pub readiness: Readiness,
    /// Namespace of the probes' heartbeat Leases (the release namespace).
    pub heartbeat_namespace: String,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (nodes, node_writer) = reflector::store::<Node>();
    let listing = list_strategy(&client).await;
    let node_stream = watcher(Api::<Node>::all(client.clone()), listing.clone())
        .default_backoff()
        .modify(crate::trim::node)
        .reflect(node_writer);
    let (reports, report_writer) = reflector::store::<Guarded<GpuNodeReport>>();
    let report_stream = watcher(
        Api::<Guarded<GpuNodeReport>>::all(client.clone()),
        listing.clone(),
    )
    .default_backoff()
    .modify(|r: &mut Guarded<GpuNodeReport>| match &mut r.0 {
        Ok(report) => crate::trim::report(report),
        Err(_) => r.managed_fields_mut().clear(),
    })
    .reflect(report_writer);
    // Heartbeats change no decision by themselves (a probe that comes back after a gap writes
    // its whole report), so this watch only feeds the cache.
    let (leases, lease_writer) = reflector::store::<Lease>();
    let lease_stream = watcher(
        Api::<Lease>::namespaced(client.clone(), &options.heartbeat_namespace),
        listing.labels(gpunode_crds::heartbeat::LEASE_SELECTOR),
    )
    .default_backoff()
    .modify(crate::heartbeats::trim)
    .reflect(lease_writer);
    let lease_task = tokio::spawn(lease_stream.for_each(|event| async move {
        if let Err(e) = event {
            warn!(error = %e, "heartbeat Lease watch");
        }
    }));
    let heartbeats = Heartbeats::new(leases.clone(), &options.heartbeat_namespace);

    let controller = Controller::new(
        Api::<Guarded<GpuNodePolicy>>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .with_config(controller::Config::default().debounce(Duration::from_millis(20)));
    let policies = controller.store();

    let synced = Arc::new(AtomicBool::new(false));
    let sweep = Arc::new(tokio::sync::Notify::new());
    {
        let (nodes, reports, synced, sweep) = (nodes.clone(), reports.clone(), synced.clone(), sweep.clone());
        let readiness = options.readiness.clone();
        // Without the Leases every report not rewritten in `staleAfter` would look stale.
        tokio::spawn(async move {
            if nodes.wait_until_ready().await.is_ok()
                && reports.wait_until_ready().await.is_ok()
                && leases.wait_until_ready().await.is_ok()
            {
                synced.store(true, Ordering::Release);
                readiness.set_ready();
                info!("node, report and heartbeat caches synced");
                // Start-up: anything gpunode left on nodes that no policy governs.
                sweep.notify_one();
            }
        });
    }

    let verdicts = Arc::new(VerdictCache::new());
    let ctx = Arc::new(Context {
        client: client.clone(),
        applier: Applier::new(client.clone()).with_gate(options.leadership.clone()),
        nodes: nodes.clone(),
        reports,
        heartbeats: heartbeats.clone(),
        policies: policies.clone(),
        events: crate::events::Publisher::start(
            Recorder::new(
                client.clone(),
                Reporter {
                    controller: "gpunode-operator".into(),
                    instance: Some(options.instance),
                },
            ),
            options.leadership.clone(),
            options.metrics.clone(),
        ),
        leadership: options.leadership.clone(),
        metrics: options.metrics.clone(),
        synced,
        verdicts: verdicts.clone(),
        status_written: std::sync::Mutex::default(),
        written: OwnWrites::default(),
        sweep: sweep.clone(),
    });
    let sweep_task = tokio::spawn(sweeper(ctx.clone(), sweep.clone()));
    // Heartbeats of probes and kubelets change nothing gpunode decides: only material changes
    // trigger a reconcile (see crate::triggers).
    let node_stream = triggers::material_changes(
        node_stream,
        "node",
        options.metrics.clone(),
        triggers::NodeFingerprints::default(),
        triggers::vanished_node,
    );
    let report_stream = triggers::material_changes(
        report_stream,
        "report",
        options.metrics.clone(),
        triggers::ReportVerdicts {
            nodes: nodes.clone(),
            policies: policies.clone(),
            verdicts,
            heartbeats,
        },
        triggers::vanished_report,
    );

    let (p1, p2) = (policies.clone(), policies.clone());
    // A new leader looks at every policy at once instead of waiting for the next event.
    let became_leader = futures::stream::unfold(options.leadership.subscribe(), |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    });
    controller
        .reconcile_all_on(became_leader)
        .watches_stream(node_stream, move |node: Node| {
            if triggers::is_stand_in(&node.metadata) {
                // A node that vanished unseen: any policy may have selected it.
                return p1
                    .state()
                    .iter()
                    .map(|g| ObjectRef::from_obj(g.as_ref()))
                    .collect();
            }
            policies_for(&p1, node.labels())
        })
        .watches_stream(report_stream, move |report: Guarded<GpuNodeReport>| {
            let labels = nodes
                .get(&ObjectRef::new(&report.name_any()))
                .map(|n| n.labels().clone())
                .unwrap_or_default();
            policies_for(&p2, &labels)
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|res| {
            let ctx = ctx.clone();
            async move {
                match res {
                    // A policy that went away without its cleanup (its finalizer removed by
                    // hand): forget it and look for the nodes it left.
                    Err(controller::Error::ObjectNotFound(policy)) => {
                        info!(policy = %policy.name, "GpuNodePolicy is gone");
                        forget(&ctx, &policy.name);
                        ctx.sweep.notify_one();
                    }
                    Err(e) => warn!(error = %e, "controller"),
                    Ok(_) => {}
                }
            }
        })
        .await;
    // The controller drives its own watches; these would outlive it.
    lease_task.abort();
    sweep_task.abort();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::{ApplyError, Step};
    use kube::runtime::finalizer::Error as Finalizer;

    fn refused(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            message: "refused".into(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_wrapped_error_is_counted_under_its_own_kind() {
        // What the finalizer helper wraps comes out as itself, so error_policy sees its kind.
        let e = Error::from_finalizer(Finalizer::ApplyFailed(Error::Status {
            policy: "p".into(),
            source: refused(500),
        }));
        assert_eq!((e.kind(), e.counted()), (ErrorKind::Status, false));
        let e = Error::from_finalizer(Finalizer::CleanupFailed(Error::Apply(ApplyError::Api {
            step: Step::Taints,
            node: "n".into(),
            source: refused(403),
        })));
        assert_eq!((e.kind(), e.counted()), (ErrorKind::Taints, false));
        // The finalizer's own failures stay what they are.
        let e = Error::from_finalizer(Finalizer::RemoveFinalizer(refused(409)));
        assert!(matches!(e, Error::Finalizer(_)));
    }

    fn named(name: &str) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.to_string());
        Arc::new(n)
    }

    #[tokio::test]
    async fn a_release_cut_short_by_lost_leadership_fails() {
        let nodes: Vec<Arc<Node>> = ["a", "b", "c"].into_iter().map(named).collect();
        let checks = std::cell::Cell::new(0);
        let released = std::cell::RefCell::new(Vec::new());
        // Leading for the first node only.
        let result = release_each(
            nodes,
            || {
                checks.set(checks.get() + 1);
                checks.get() == 1
            },
            |n| {
                released.borrow_mut().push(n.name_any());
                async { Ok(()) }
            },
        )
        .await;
        assert_eq!(released.into_inner(), ["a"]);
        match result {
            Err(ApplyError::NotLeader(node)) => assert_eq!(node, "b"),
            other => panic!("a release cut short must fail, got {other:?}"),
        }
        // Leading throughout: every node, then success.
        let all: Vec<Arc<Node>> = ["a", "b"].into_iter().map(named).collect();
        assert!(release_each(all, || true, |_| async { Ok(()) }).await.is_ok());
    }

    #[test]
    fn node_failures_are_not_counted_a_second_time() {
        let e = Error::from_finalizer(Finalizer::ApplyFailed(Error::Nodes {
            failed: 3,
            first: ApplyError::Conflict("n".into()),
        }));
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert!(e.counted(), "each node failure was counted when it happened");
        let e = Error::Apply(ApplyError::NotLeader("n".into()));
        assert!(e.counted(), "a replica that stopped leading reports no error");
        assert!(e.to_string().contains("not the leader"));
    }
}
