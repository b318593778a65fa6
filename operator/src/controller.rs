//! The controller: watches policies, reports and nodes (one watch each, shared by the caches and
//! the triggers), and reconciles a policy whenever one of its nodes or their reports changes.
//! A reconcile is observe → evaluate → plan → apply → status; only [`crate::apply`] writes to
//! nodes, and only while this replica leads.

use std::{
    collections::HashMap,
    sync::{
        Arc, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, StreamExt};
use gpunode_crds::{
    GpuNodePolicy, GpuNodePolicyStatus, GpuNodeReport, policy::CLOSE_BREAKER_ANNOTATION,
    selector::InvalidSelector,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller,
        controller::{self, Action},
        events::Reporter,
        finalizer::{Event as FinalizerEvent, finalizer},
        reflector::ObjectRef,
        watcher,
    },
};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::{
    apply::{Applied, Applier, FIELD_MANAGER, NodeResult},
    cache::VerdictCache,
    fleet::{FleetLedger, Reservation},
    leader::Leadership,
    metrics::{ActionKind, ActionResult, ErrorKind, Metrics},
    observe::{self, Caches, Guarded, Watches, changed::ChangedNodes, selector_of, triggers},
    plan,
    policy_state::{Look, Planning, PolicyState, PolicyStates},
    reasons::Reason,
    server::Readiness,
    status,
};

/// Finalizer that lets a deleted policy undo what it did before it goes.
pub const FINALIZER: &str = "gpunode.dev/cleanup";

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
    /// What the watches observed, and gpunode's own writes.
    pub caches: Caches,
    /// Events, published in the background (a Recorder per Event, so none folds into another).
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
    /// Wakes the search for nodes no policy governs ([`crate::sweep`]).
    pub sweep: Arc<tokio::sync::Notify>,
    /// The fleet-wide disruption cap and what passes reserved of it ([`crate::fleet`]).
    pub fleet: Arc<FleetLedger>,
    /// What the chart grants validation Jobs ([`crate::bounds`]).
    pub validation_bounds: crate::bounds::ValidationBounds,
    /// How policies are planned: every node each pass, or only what changed.
    pub planning: Planning,
    /// The nodes that changed since each policy's last pass (incremental planning).
    pub changed: Arc<ChangedNodes>,
    /// Each policy's incremental state between passes.
    pub states: PolicyStates,
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
    let adds_finalizer =
        policy.metadata.deletion_timestamp.is_none() && !policy.finalizers().iter().any(|f| f == FINALIZER);
    let pass = async {
        let action = finalized(&api, policy.clone(), &ctx).await?;
        if !adds_finalizer {
            return Ok(action);
        }
        // The finalizer is stored now (the helper's patch tests the list it saw): pass over
        // the nodes at once, not after the patch's watch event and another debounce, which on
        // every new policy cost a watch round trip before the first node was written.
        let mut with = (*policy).clone();
        with.metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(FINALIZER.to_string());
        finalized(&api, Arc::new(with), &ctx).await
    };
    // A request can go unanswered for good (sent as the API server went away; kube has no read
    // timeout by default, since watches idle): bound the pass, so it fails and is retried
    // instead of holding this policy, and every drain of it, until the connection dies.
    match tokio::time::timeout(RECONCILE_TIMEOUT, pass).await {
        Ok(r) => r.map_err(Error::from_finalizer),
        Err(_) => Err(Error::Timeout(RECONCILE_TIMEOUT)),
    }
}

/// One pass through kube's finalizer helper: adds the finalizer to a policy without it (and
/// returns), reconciles one with it, releases the nodes of one being deleted.
async fn finalized(
    api: &Api<GpuNodePolicy>,
    policy: Arc<GpuNodePolicy>,
    ctx: &Arc<Context>,
) -> Result<Action, kube::runtime::finalizer::Error<Error>> {
    finalizer(api, FINALIZER, policy, |event| async {
        match event {
            FinalizerEvent::Apply(p) if ctx.planning == Planning::Incremental => {
                reconcile_incremental(p, ctx.clone()).await
            }
            FinalizerEvent::Apply(p) => reconcile_policy(p, ctx.clone()).await,
            FinalizerEvent::Cleanup(p) => release_policy(&p, ctx).await,
        }
    })
    .await
}

/// Longest a reconcile pass may take (a drain pass of a large node included) before it is
/// abandoned and retried.
pub const RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);

/// Releases the nodes, at most the applier's concurrency at once. Fails, rather than stopping
/// quietly, when this replica stops leading part-way: a deleted policy must keep its finalizer
/// until every node is released.
async fn release_nodes(nodes: Vec<Arc<Node>>, ctx: &Context, why: &str) -> Result<(), Error> {
    let now = Timestamp::now();
    release_each(
        nodes,
        ctx.applier.concurrency(),
        || ctx.leadership.is_leader(),
        |n| async move {
            let wrote = ctx.applier.release(&n, now).await?;
            if wrote {
                ctx.metrics.action(ActionKind::Release, ActionResult::Ok);
                let event = plan::PlannedEvent {
                    warning: false,
                    reason: Reason::Released,
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

/// Releases nodes, `concurrency` at once, while `leading()` holds. Losing leadership part-way
/// is an error naming a node left, never a quiet success: a deleted policy's finalizer must
/// stay until every node is released, by this replica or the next leader. After the first
/// failure no further release starts; those under way finish.
async fn release_each<F, Fut>(
    nodes: Vec<Arc<Node>>,
    concurrency: std::num::NonZeroUsize,
    leading: impl Fn() -> bool,
    release: F,
) -> Result<(), crate::apply::ApplyError>
where
    F: Fn(Arc<Node>) -> Fut,
    Fut: std::future::Future<Output = Result<(), crate::apply::ApplyError>>,
{
    let stopped = AtomicBool::new(false);
    let (stopped, leading, release) = (&stopped, &leading, &release);
    let mut results = futures::stream::iter(nodes)
        .map(|n| async move {
            if stopped.load(Ordering::Relaxed) {
                return Ok(());
            }
            let result = if leading() {
                release(n).await
            } else {
                Err(crate::apply::ApplyError::NotLeader(n.name_any()))
            };
            if result.is_err() {
                stopped.store(true, Ordering::Relaxed);
            }
            result
        })
        .buffer_unordered(concurrency.get());
    let mut first = None;
    while let Some(result) = results.next().await {
        if let Err(e) = result {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
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
            || ctx.caches.policies.wait_until_ready().now_or_never().is_none()
        {
            continue;
        }
        let Some(nodes) = crate::sweep::unowned(&ctx.caches.nodes.state(), &ctx.caches.index()) else {
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
    let nodes = ctx.caches.orphans(&policy.name_any(), &ctx.caches.index());
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
    ctx.changed.forget(policy);
    ctx.states.forget(policy);
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

/// One pass over a policy: observe → plan → apply → status → next look. Every decision is the
/// planner's; this only moves data between the steps.
async fn reconcile_policy(policy: Arc<GpuNodePolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = policy.name_any();
    let selector = match selector_of(&policy) {
        Ok(s) => s,
        Err(e) => return invalid_policy(&policy, &ctx, &e).await,
    };
    // Observe: nodes the policy labelled that no policy selects any more are released first.
    let index = ctx.caches.index();
    let why = format!("it left the selector of GpuNodePolicy {name}");
    release_nodes(ctx.caches.orphans(&name, &index), &ctx, &why).await?;
    let now = Timestamp::now();
    let snapshot = ctx.caches.snapshot(&selector, index);
    // The running repair steps' objects (no watch: their kinds are the policy's to name).
    let repair_objects = observe::repair_objects(ctx.applier.remediators(), &policy, &snapshot.nodes).await;
    // The running validations' Jobs (no watch: looked at while one runs).
    let validation_jobs = observe::validation_jobs(ctx.applier.client(), &policy, &snapshot.nodes).await;
    // Plan (the views are dropped with this block: each write job keeps only its own node).
    // The reservation of the fleet cap is held until the writes are done.
    let (plan, _reservation) = {
        let verdicts = ctx.verdicts.policy(&name);
        let mut verdicts = verdicts.lock().unwrap_or_else(PoisonError::into_inner);
        let mut inputs = ctx.caches.inputs(&snapshot.index);
        inputs.repair_objects = repair_objects;
        inputs.validation_jobs = validation_jobs;
        let views = observe::views(&policy, &snapshot.nodes, &inputs, &mut verdicts, now);
        let (reused, evaluated) = verdicts.stats();
        ctx.metrics.verdicts(reused, evaluated);
        plan_pass(&ctx, &policy, &snapshot.index, |inputs| {
            let plan = plan::plan_with(&name, &policy.spec, &views, inputs, now);
            ctx.metrics.node_plans(&name, true, plan.nodes.len());
            plan
        })
    };
    // Apply.
    let drain = &policy.spec.disruption.drain;
    let applied = ctx
        .applier
        .apply_policy(&name, &plan, snapshot.nodes, drain, now, |np, node, result| {
            node_done(&ctx, np, node, result);
        })
        .await;
    record_applied(&ctx, &applied);
    ctx.metrics
        .set_policy_nodes(&name, plan.nodes.iter().map(|n| n.state));
    debug!(
        nodes = plan.nodes.len(),
        written = applied.written(),
        "node plans applied"
    );
    // Status, from what was applied.
    let (generation, paused) = (policy.metadata.generation, policy.spec.paused);
    let new_status = status::status(&plan, &applied, generation, paused, policy.status.as_ref(), now);
    ctx.metrics.set_policy_conditions(&name, &new_status.conditions);
    ctx.metrics
        .set_quarantined_gpus(&name, new_status.quarantined_gpus);
    // A replica paused mid-reconcile (SIGSTOP, a stall) may resume after another took over:
    // it writes no status from its stale plan.
    if !ctx.leadership.is_leader() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let status_later = pace_status(&ctx, &name, policy.status.as_ref(), &new_status).await?;
    if let Some((failed, first)) = applied.into_failure() {
        return Err(Error::Nodes { failed, first });
    }
    // Next look: when the plan changes with time alone, or when the status may be written.
    let wake = plan::requeue_after(&plan, now).min(status_later.unwrap_or(Duration::MAX));
    debug!(requeue_after = ?wake, "reconciled");
    Ok(Action::requeue(wake))
}

/// One incremental pass over a policy (`--planning incremental`): the nodes that changed since
/// its last pass, those the planner wants again and those whose write failed are observed and
/// planned; only their plans are applied; the status is made from every node's last plan when it
/// may be written. Whole when [`PolicyState::look`] says so.
async fn reconcile_incremental(policy: Arc<GpuNodePolicy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = policy.name_any();
    let selector = match selector_of(&policy) {
        Ok(s) => s,
        Err(e) => {
            ctx.states.forget(&name);
            return invalid_policy(&policy, &ctx, &e).await;
        }
    };
    let index = ctx.caches.index();
    let now = Timestamp::now();
    let changes = ctx.changed.take(&name);
    let mut state = ctx
        .states
        .take(&name)
        .unwrap_or_else(|| PolicyState::new(&policy, index.clone(), now));
    let look = state.look(&policy, &index, changes, now);
    let (nodes, gone, whole) = looked_at(&ctx, &name, &selector, &index, look).await?;
    let repair_objects = observe::repair_objects(ctx.applier.remediators(), &policy, &nodes).await;
    let validation_jobs = observe::validation_jobs(ctx.applier.client(), &policy, &nodes).await;
    let (plan, _reservation) = {
        let verdicts = ctx.verdicts.policy(&name);
        let mut verdicts = verdicts.lock().unwrap_or_else(PoisonError::into_inner);
        let mut inputs = ctx.caches.inputs(&index);
        inputs.repair_objects = repair_objects;
        inputs.validation_jobs = validation_jobs;
        let views = if whole {
            observe::views(&policy, &nodes, &inputs, &mut verdicts, now)
        } else {
            observe::some_views(&policy, &nodes, &inputs, &mut verdicts, now)
        };
        let (reused, evaluated) = verdicts.stats();
        ctx.metrics.verdicts(reused, evaluated);
        state.update(views, &gone, whole);
        plan_pass(&ctx, &policy, &index, |inputs| {
            incremental_plan(&ctx, &name, &mut state, inputs, now)
        })
    };
    let nodes = with_planned(&ctx, &selector, &plan, nodes);
    let drain = &policy.spec.disruption.drain;
    let applied = ctx
        .applier
        .apply_policy(&name, &plan, nodes, drain, now, |np, node, result| {
            node_done(&ctx, np, node, result);
        })
        .await;
    record_applied(&ctx, &applied);
    state.applied(&plan, &applied);
    debug!(
        nodes = plan.nodes.len(),
        whole,
        written = applied.written(),
        "node plans applied"
    );
    let failure = applied.into_failure();
    // Status, from every node's last plan and what is in effect on it, when it may be written.
    let status_later = if ctx.leadership.is_leader() {
        incremental_status(&ctx, &policy, &mut state, now).await?
    } else {
        None
    };
    let next_change = state.planner().next_change();
    let polls = state.planner().polls();
    let resync = std::time::Duration::try_from(state.resync_at().duration_since(now)).unwrap_or_default();
    ctx.states.put(&name, state);
    if !ctx.leadership.is_leader() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    if let Some((failed, first)) = failure {
        return Err(Error::Nodes { failed, first });
    }
    let wake = plan::requeue_at(next_change, polls, plan.fleet_queued, now)
        .min(resync)
        .min(status_later.unwrap_or(Duration::MAX));
    debug!(requeue_after = ?wake, "reconciled");
    Ok(Action::requeue(wake))
}

/// The nodes an incremental pass of policy `name` looks at (`look`), as the cache holds them
/// with gpunode's own writes read back; the names of those gone or no longer selected; whether
/// it is whole. Nodes labelled by the policy among them that no policy selects any more are
/// released first.
async fn looked_at(
    ctx: &Context,
    name: &str,
    selector: &kube::core::Selector,
    index: &Arc<observe::index::SelectorIndex>,
    look: Look,
) -> Result<(Vec<Arc<Node>>, Vec<String>, bool), Error> {
    let why = format!("it left the selector of GpuNodePolicy {name}");
    match look {
        Look::Whole => {
            release_nodes(ctx.caches.orphans(name, index), ctx, &why).await?;
            let nodes = ctx.caches.snapshot(selector, index.clone()).nodes;
            Ok((nodes, Vec::new(), true))
        }
        Look::Some(names) => {
            release_nodes(ctx.caches.orphans_named(name, index, &names), ctx, &why).await?;
            let (nodes, gone) = ctx.caches.named(selector, &names);
            Ok((nodes, gone, false))
        }
    }
}

/// `nodes` with the Node of every node `plan` has and they lack: when something every node
/// reads changed (the breaker, the windows), every node was planned, not only those looked at.
fn with_planned(
    ctx: &Context,
    selector: &kube::core::Selector,
    plan: &plan::PolicyPlan,
    mut nodes: Vec<Arc<Node>>,
) -> Vec<Arc<Node>> {
    let have: std::collections::BTreeSet<String> = nodes.iter().map(|n| n.name_any()).collect();
    let missing: Vec<String> = plan
        .nodes
        .iter()
        .map(|np| np.node.clone())
        .filter(|n| !have.contains(n))
        .collect();
    if !missing.is_empty() {
        nodes.extend(ctx.caches.named(selector, &missing).0);
    }
    nodes
}

/// The status of `policy` from every node's last plan, written if it changed and may be
/// written now; else how long until it may (the pass that runs then writes it). It is made at
/// most once per [`STATUS_MIN_INTERVAL`]: it reads every node, a pass need not.
async fn incremental_status(
    ctx: &Context,
    policy: &GpuNodePolicy,
    state: &mut PolicyState,
    now: Timestamp,
) -> Result<Option<Duration>, Error> {
    if let Some(later) = state.status_due(now, STATUS_MIN_INTERVAL) {
        return Ok(Some(later));
    }
    let name = policy.name_any();
    let (generation, paused) = (policy.metadata.generation, policy.spec.paused);
    let nodes = state.in_effect();
    ctx.metrics
        .set_policy_nodes(&name, nodes.iter().map(|(n, _)| n.state));
    let summary = state.summary();
    let new_status = status::status_of(&summary, nodes, generation, paused, policy.status.as_ref(), now);
    ctx.metrics.set_policy_conditions(&name, &new_status.conditions);
    ctx.metrics
        .set_quarantined_gpus(&name, new_status.quarantined_gpus);
    pace_status(ctx, &name, policy.status.as_ref(), &new_status).await
}

/// The plan `pass` makes of `policy` (a full or an incremental pass), given where its breaker
/// stood (its status, and a person's close) and the fleet cap: the fleet is counted, the plan
/// made and what it takes of the cap reserved under the ledger's one lock, so that no two
/// passes take the last slot.
fn plan_pass(
    ctx: &Context,
    policy: &GpuNodePolicy,
    index: &observe::index::SelectorIndex,
    pass: impl FnOnce(&plan::PassInputs) -> plan::PolicyPlan,
) -> (plan::PolicyPlan, Reservation) {
    let name = policy.name_any();
    let close_breaker = policy
        .annotations()
        .get(CLOSE_BREAKER_ANNOTATION)
        .and_then(|v| v.trim().parse::<Timestamp>().ok());
    let ledger = ctx.fleet.lock();
    let inputs = plan::PassInputs {
        breaker: status::breaker_memory(policy.status.as_ref()),
        close_breaker,
        fleet: Some(ledger.fleet(&name, &ctx.caches, index)),
        validation_bounds: Some(ctx.validation_bounds.clone()),
    };
    let plan = pass(&inputs);
    let reservation = ledger.reserve(&name, &plan.fleet_taken);
    (plan, reservation)
}

/// The incremental pass of `state`'s planner with `inputs`: the plan of the nodes it planned.
fn incremental_plan(
    ctx: &Context,
    name: &str,
    state: &mut PolicyState,
    inputs: &plan::PassInputs,
    now: Timestamp,
) -> plan::PolicyPlan {
    let planner = state.planner();
    let pass = planner.pass(inputs, now);
    ctx.metrics.node_plans(name, pass.whole, pass.planned.len());
    debug!(
        whole = pass.whole,
        planned = pass.planned.len(),
        "incremental pass"
    );
    planner.partial(&pass)
}

/// Writes the policy status if it changed, at most once per [`STATUS_MIN_INTERVAL`]; returns
/// how long until a held-back write may go (the pass that runs then writes it).
async fn pace_status(
    ctx: &Context,
    name: &str,
    old: Option<&GpuNodePolicyStatus>,
    new: &GpuNodePolicyStatus,
) -> Result<Option<Duration>, Error> {
    if old.is_some_and(|old| status::same_ignoring_time(old, new)) {
        return Ok(None);
    }
    if let Some(later) = ctx.status_slot(name) {
        return Ok(Some(later));
    }
    write_status(ctx, name, new).await?;
    Ok(None)
}

/// What follows one node's apply as soon as it completes: its written version is read back by
/// the next pass, its writes are counted, and (only from the leader) its actions and Events.
fn node_done(ctx: &Context, np: &plan::NodePlan, node: &Node, result: &mut NodeResult) {
    let NodeResult::Applied(outcome) = result else {
        return;
    };
    if let Some(n) = outcome.written.take() {
        ctx.caches.wrote(*n);
    }
    for part in outcome.parts_written() {
        ctx.metrics.node_write(part);
    }
    if let Some(e) = &outcome.repair_failed {
        warn!(node = %np.node, error = %e, "making a repair step's object failed; retrying");
        ctx.metrics.reconcile_error(ErrorKind::Repair);
    }
    if let Some(e) = &outcome.validation_failed {
        warn!(node = %np.node, error = %e, "a validation Job could not be written; retrying until its timeout");
        ctx.metrics.reconcile_error(ErrorKind::Repair);
        if np.write && ctx.leadership.is_leader() {
            ctx.events.publish(
                node,
                &[crate::plan::PlannedEvent {
                    warning: true,
                    reason: crate::reasons::Reason::ValidationFailed,
                    note: e.clone(),
                }],
            );
        }
    }
    // Events are writes too: none from a replica whose term passed during the apply.
    if np.write && ctx.leadership.is_leader() {
        record_actions(ctx, np, node);
        ctx.events.publish(node, &np.events);
    }
}

/// Counts a policy's evictions and failed node writes.
fn record_applied(ctx: &Context, applied: &Applied) {
    let (evicted, refused) = applied.evictions();
    for _ in 0..evicted {
        ctx.metrics.action(ActionKind::Evict, ActionResult::Ok);
    }
    // Refused by a PodDisruptionBudget (429): retried on the next pass.
    for _ in 0..refused {
        ctx.metrics.action(ActionKind::Evict, ActionResult::Blocked);
    }
    for e in applied.failures() {
        warn!(error = %e, "applying a node plan failed");
        if !matches!(e, crate::apply::ApplyError::NotLeader(_)) {
            ctx.metrics.reconcile_error(e.kind());
        }
    }
}

/// Counts the actions a written plan took, and the report-to-action latency of state changes.
fn record_actions(ctx: &Context, np: &plan::NodePlan, node: &Node) {
    for kind in np.events.iter().filter_map(|e| ActionKind::of_event(e.reason)) {
        ctx.metrics.action(kind, ActionResult::Ok);
    }
    for _ in &np.pending {
        ctx.metrics.action(ActionKind::Label, ActionResult::Blocked);
    }
    if let Some((step, outcome, ran)) = &np.repair.ended {
        let ran = Duration::try_from(*ran).unwrap_or_default();
        ctx.metrics.repair_step(step, outcome.as_str(), ran);
    }
    if let Some((periodic, outcome)) = np.validation.ended {
        ctx.metrics.validation(periodic, outcome);
    }
    let changed_state = np.events.iter().any(|e| e.reason.is_state_change());
    if changed_state
        && let Some(observed) = observe::observed_at(ctx.caches.report(&node.name_any()).as_deref())
    {
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
    /// How many nodes of one policy are written, or released, at once.
    pub apply_concurrency: std::num::NonZeroUsize,
    /// Most GPU nodes unavailable at once across every policy (`--fleet-max-unavailable`).
    pub fleet_max_unavailable: gpunode_crds::MaxUnavailable,
    /// Taint keys that do not make a node unavailable to the fleet cap (`--fleet-ignore-taint`).
    pub fleet_ignore_taints: Vec<String>,
    /// What the chart grants validation Jobs (`--validation-namespaces`).
    pub validation_bounds: crate::bounds::ValidationBounds,
    /// The remediation kinds and namespaces the chart grants repair steps (`--remediators`).
    pub remediator_bounds: crate::bounds::RemediatorBounds,
    /// How policies are planned (`--planning`).
    pub planning: Planning,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(
    client: Client,
    options: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let controller = Controller::new(
        Api::<Guarded<GpuNodePolicy>>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .with_config(controller::Config::default().debounce(Duration::from_millis(20)))
    .trigger_backoff(crate::observe::backoff::watch());
    let verdicts = Arc::new(VerdictCache::new());
    let watches = Watches::start(
        &client,
        &options.heartbeat_namespace,
        controller.store(),
        verdicts.clone(),
        options.metrics.clone(),
    )
    .await;
    let synced = Arc::new(AtomicBool::new(false));
    let sweep = Arc::new(tokio::sync::Notify::new());
    announce_synced(&watches, synced.clone(), &options.readiness, sweep.clone());
    let lease_task = watches.lease_task();
    let Watches {
        caches,
        node_changes,
        report_changes,
        named_changes,
        ..
    } = watches;
    let changed = Arc::new(ChangedNodes::new());
    let ctx = context(
        &client,
        &options,
        caches.clone(),
        synced,
        verdicts,
        sweep.clone(),
        changed.clone(),
    );
    let sweep_task = tokio::spawn(sweeper(ctx.clone(), sweep.clone()));
    let (by_node, by_report, by_name) = (caches.clone(), caches.clone(), caches);
    let (on_node, on_report, on_name, on_leader) =
        (changed.clone(), changed.clone(), changed.clone(), changed);
    controller
        // A new leader looks at every policy at once, and whole, instead of waiting for the
        // next event.
        .reconcile_all_on(became_leader(&options.leadership).inspect(move |()| on_leader.everything()))
        .watches_stream(node_changes, move |node: Node| {
            node_changed(&by_node, &on_node, &node)
        })
        .watches_stream(report_changes, move |report: Guarded<GpuNodeReport>| {
            on_report.node(&report.name_any());
            policies_of_node(&by_report, &report.name_any())
        })
        .watches_stream(named_changes, move |named: Node| {
            // A ResourceSlice or a DeviceTaintRule of gpunode's changed, or the probe of a node
            // some policy found stale renewed its Lease: the policies of that node.
            on_name.node(&named.name_any());
            policies_of_node(&by_name, &named.name_any())
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|res| reconciled(ctx.clone(), res))
        .await;
    // The controller drives its own watches; these would outlive it.
    lease_task.abort();
    sweep_task.abort();
}

/// The policies a node change concerns, once the change is recorded for the incremental passes
/// and the fleet cap's count.
fn node_changed(
    caches: &Caches,
    changed: &ChangedNodes,
    node: &Node,
) -> Vec<ObjectRef<Guarded<GpuNodePolicy>>> {
    changed.node(&node.name_any());
    caches.fleet.changed(&node.name_any());
    if triggers::is_stand_in(&node.metadata) {
        changed.everything();
        caches.fleet.everything();
        // A node that vanished unseen: any policy may have selected it.
        return caches
            .policies
            .state()
            .iter()
            .map(|g| ObjectRef::from_obj(g.as_ref()))
            .collect();
    }
    caches.policies_for(node.labels())
}

/// Once the caches are synced: the controller may act, the replica is ready, and a sweep looks
/// for anything gpunode left on nodes that no policy governs.
fn announce_synced(
    watches: &Watches,
    synced: Arc<AtomicBool>,
    readiness: &Readiness,
    sweep: Arc<tokio::sync::Notify>,
) {
    let (ready, readiness) = (watches.synced(), readiness.clone());
    tokio::spawn(async move {
        if ready.await {
            synced.store(true, Ordering::Release);
            readiness.set_ready();
            info!(
                "caches synced (nodes, reports, heartbeats and, on a DRA cluster, ResourceSlices and DeviceTaintRules)"
            );
            // Start-up: anything gpunode left on nodes that no policy governs.
            sweep.notify_one();
        }
    });
}

/// The reconcile's context: the writer (with the DRA device writer on a DRA cluster), the
/// caches, the Event publisher and the rest.
fn context(
    client: &Client,
    options: &Options,
    caches: Caches,
    synced: Arc<AtomicBool>,
    verdicts: Arc<VerdictCache>,
    sweep: Arc<tokio::sync::Notify>,
    changed: Arc<ChangedNodes>,
) -> Arc<Context> {
    let mut applier = Applier::new(client.clone())
        .with_gate(options.leadership.clone())
        .with_concurrency(options.apply_concurrency);
    if let Some(dra) = &caches.dra {
        applier = applier.with_devices(crate::apply::devices::DeviceWriter::new(
            client.clone(),
            dra.api.clone(),
            dra.rules.clone(),
            caches.policies.clone(),
        ));
    }
    let applier = applier
        .with_metrics(options.metrics.clone())
        .with_remediator_bounds(options.remediator_bounds.clone());
    let reporter = Reporter {
        controller: "gpunode-operator".into(),
        instance: Some(options.instance.clone()),
    };
    Arc::new(Context {
        client: client.clone(),
        applier,
        caches,
        events: crate::events::Publisher::start(
            client.clone(),
            reporter,
            options.leadership.clone(),
            options.metrics.clone(),
        ),
        leadership: options.leadership.clone(),
        metrics: options.metrics.clone(),
        synced,
        verdicts,
        status_written: std::sync::Mutex::default(),
        sweep,
        fleet: FleetLedger::new(options.fleet_max_unavailable, options.fleet_ignore_taints.clone()),
        validation_bounds: options.validation_bounds.clone(),
        planning: options.planning,
        changed,
        states: PolicyStates::default(),
    })
}

/// Yields each time this replica becomes the leader.
fn became_leader(leadership: &Leadership) -> impl futures::Stream<Item = ()> + use<> {
    futures::stream::unfold(leadership.subscribe(), |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

/// The policies that select the node named `name`, as the node cache holds it.
fn policies_of_node(caches: &Caches, name: &str) -> Vec<ObjectRef<Guarded<GpuNodePolicy>>> {
    let labels = caches
        .nodes
        .get(&ObjectRef::new(name))
        .map(|n| n.labels().clone())
        .unwrap_or_default();
    caches.policies_for(&labels)
}

/// What the controller yields after each reconcile (`E`: its queue's error).
type Reconciled<E> = Result<(ObjectRef<Guarded<GpuNodePolicy>>, Action), controller::Error<Error, E>>;

/// After a reconcile: a policy that went away without its cleanup (its finalizer removed by
/// hand) is forgotten and the nodes it left are looked for; other errors are logged.
async fn reconciled<E: std::fmt::Display>(ctx: Arc<Context>, res: Reconciled<E>) {
    match res {
        Err(controller::Error::ObjectNotFound(policy)) => {
            info!(policy = %policy.name, "GpuNodePolicy is gone");
            forget(&ctx, &policy.name);
            ctx.sweep.notify_one();
        }
        Err(e) => warn!(error = %e, "controller"),
        Ok(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::{ApplyError, Step};
    use kube::runtime::finalizer::Error as Finalizer;
    use std::num::NonZeroUsize;

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
        // Leading for the first node only (one at a time: the order is the nodes').
        let result = release_each(
            nodes,
            NonZeroUsize::MIN,
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
        assert!(
            release_each(all, NonZeroUsize::MIN, || true, |_| async { Ok(()) })
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn releases_run_together_up_to_the_concurrency() {
        let nodes: Vec<Arc<Node>> = (0..20).map(|i| named(&format!("n{i}"))).collect();
        let (now, most) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let released = std::cell::RefCell::new(Vec::new());
        let result = release_each(
            nodes,
            NonZeroUsize::new(4).unwrap(),
            || true,
            |n| {
                let (now, most, released) = (&now, &most, &released);
                async move {
                    now.set(now.get() + 1);
                    most.set(most.get().max(now.get()));
                    tokio::task::yield_now().await;
                    now.set(now.get() - 1);
                    released.borrow_mut().push(n.name_any());
                    Ok(())
                }
            },
        )
        .await;
        assert!(result.is_ok());
        assert_eq!(most.get(), 4, "four releases at once, never more");
        assert_eq!(released.borrow().len(), 20, "every node released");
    }

    #[tokio::test]
    async fn after_a_failed_release_no_other_starts_and_the_pass_fails() {
        let nodes: Vec<Arc<Node>> = (0..20).map(|i| named(&format!("n{i}"))).collect();
        let started = std::cell::RefCell::new(Vec::new());
        let result = release_each(
            nodes,
            NonZeroUsize::new(4).unwrap(),
            || true,
            |n| {
                started.borrow_mut().push(n.name_any());
                async move {
                    tokio::task::yield_now().await;
                    if n.name_any() == "n1" {
                        Err(ApplyError::Conflict(n.name_any()))
                    } else {
                        Ok(())
                    }
                }
            },
        )
        .await;
        match result {
            Err(ApplyError::Conflict(node)) => assert_eq!(node, "n1"),
            other => panic!("a failed release must fail the pass, got {other:?}"),
        }
        // Those under way when n1 failed (four, and at most one that replaced a finished one)
        // finished; none of the fifteen left started.
        let started = started.into_inner();
        assert!(started.contains(&"n1".to_string()));
        assert!(
            started.len() <= 5,
            "releases started after the failure: {started:?}"
        );
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
