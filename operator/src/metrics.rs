//! The operator's Prometheus metrics, prefixed `gpunode_`.
//!
//! Every label is bounded: error kinds, actions and results are enums, node states the three
//! verdicts, and policies are few. Node names are never labels (one series per node and policy
//! would grow with the fleet; per-node detail belongs in events and status).
//!
//! | Metric | Type | Labels |
//! |---|---|---|
//! | `gpunode_reconciles_total` | counter | |
//! | `gpunode_reconcile_errors_total` | counter | `kind` ([`ErrorKind`]) |
//! | `gpunode_actions_total` | counter | `action` ([`ActionKind`]), `result` ([`ActionResult`]) |
//! | `gpunode_nodes` | gauge | `policy`, `state` (`compliant`, `drifted`, `unknown`) |
//! | `gpunode_quarantined_gpus` | gauge (GPUs quarantined on their own) | `policy` |
//! | `gpunode_repair_steps_total` | counter (repair steps that ended) | `step` (the policy's step name), `outcome` (`Succeeded`, `Failed`, `TimedOut`) |
//! | `gpunode_repair_step_duration_seconds` | histogram (start to end of a repair step) | `outcome` |
//! | `gpunode_validations_total` | counter (validation Jobs that ended) | `kind` (`undo`: before an undo, `periodic`), `outcome` (`passed`, `failed`, `timed_out`) |
//! | `gpunode_reconcile_duration_seconds` | histogram | |
//! | `gpunode_reaction_seconds` | histogram (report observed → action applied) | |
//! | `gpunode_leader` | gauge (1 while this replica leads) | |
//! | `gpunode_node_writes_total` | counter (requests that changed a Node) | `part` (`metadata`, `spec`, `condition`) |
//! | `gpunode_watch_events_total` | counter (node and report changes) | `source` (`node`, `report`), `outcome` (`reconcile`, `skipped`: not material) |
//! | `gpunode_verdicts_total` | counter (per node and reconcile) | `result` (`evaluated`, `reused`) |
//! | `gpunode_node_plans_total` | counter (node plans made by reconciles) | `policy`, `pass` (`whole`: every node of the policy; `partial`: incremental planning's changed nodes) |

use std::{fmt::Write as _, time::Duration};

use jiff::Timestamp;
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};
use tokio::{sync::watch, time::Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::{
    reasons::{PolicyCondition, Reason},
    verdict::NodeState,
};

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Histogram buckets of both latency histograms: 10 ms to 60 s.
pub const LATENCY_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Why a reconcile failed, by pipeline step (the `kind` label of
/// `gpunode_reconcile_errors_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Reading from the cluster failed (a get or list), or a cache was not ready.
    Read,
    /// Writing a node's labels or annotations failed.
    Labels,
    /// Writing a node's taints or cordon failed.
    Taints,
    /// Writing a node's condition failed.
    Condition,
    /// Listing or evicting pods failed.
    Drain,
    /// Writing a policy's status failed.
    Status,
    /// Publishing an event failed.
    Event,
    /// An object kept changing under every retry (409 Conflict).
    Conflict,
    /// An object could not be decoded or is invalid.
    InvalidObject,
    /// Making or deleting a repair step's object failed.
    Repair,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Every kind, for exhaustive tests and dashboards.
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::Read,
        ErrorKind::Labels,
        ErrorKind::Taints,
        ErrorKind::Condition,
        ErrorKind::Drain,
        ErrorKind::Status,
        ErrorKind::Event,
        ErrorKind::Conflict,
        ErrorKind::InvalidObject,
        ErrorKind::Repair,
        ErrorKind::Other,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Read => "read",
            ErrorKind::Labels => "labels",
            ErrorKind::Taints => "taints",
            ErrorKind::Condition => "condition",
            ErrorKind::Drain => "drain",
            ErrorKind::Status => "status",
            ErrorKind::Event => "event",
            ErrorKind::Conflict => "conflict",
            ErrorKind::InvalidObject => "invalid_object",
            ErrorKind::Repair => "repair",
            ErrorKind::Other => "other",
        }
    }
}

/// What was done to a node (the `action` label of `gpunode_actions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActionKind {
    /// Labels or annotations written.
    Label,
    /// A gpunode taint added.
    Taint,
    /// A gpunode taint removed.
    Untaint,
    /// The node marked unschedulable.
    Cordon,
    /// The node made schedulable again.
    Uncordon,
    /// One pod evicted.
    Evict,
    /// A drain began.
    DrainStart,
    /// A drain ran past its timeout.
    DrainStuck,
    /// Everything gpunode did to a node undone because no policy governs it any more (its
    /// policy was deleted, it left the selector, or gpunode's markers were left behind).
    Release,
    /// One GPU quarantined (or its effect changed).
    Quarantine,
    /// A GPU's quarantine lifted.
    Unquarantine,
    /// A repair step started on a drained node.
    RepairStart,
    /// A node's repair stopped and needs a person.
    NeedsHuman,
    /// An object a node's bookkeeping names as gpunode's deleted (a repair step's object, a
    /// GpuResetRequest, a validation Job, a DeviceTaintRule); result `refused` when it was not
    /// gpunode's (no gpunode labels for the node, or not the uid gpunode recorded) and was left
    /// alone.
    Delete,
}

impl ActionKind {
    /// The action an Event with this reason records in `gpunode_actions_total`, if any.
    pub const fn of_event(reason: Reason) -> Option<ActionKind> {
        match reason {
            Reason::Tainted => Some(ActionKind::Taint),
            Reason::TaintRemoved => Some(ActionKind::Untaint),
            Reason::Cordoned => Some(ActionKind::Cordon),
            Reason::Uncordoned => Some(ActionKind::Uncordon),
            Reason::DrainStarted => Some(ActionKind::DrainStart),
            Reason::DrainStuck => Some(ActionKind::DrainStuck),
            Reason::Drifted | Reason::Compliant | Reason::Unknown => Some(ActionKind::Label),
            Reason::Released => Some(ActionKind::Release),
            Reason::GpuQuarantined => Some(ActionKind::Quarantine),
            Reason::GpuReleased => Some(ActionKind::Unquarantine),
            Reason::RepairStarted => Some(ActionKind::RepairStart),
            Reason::NeedsHuman => Some(ActionKind::NeedsHuman),
            Reason::Escalated
            | Reason::NvmlHung
            | Reason::Repairing
            | Reason::RepairSucceeded
            | Reason::RepairFailed
            | Reason::RepairTimedOut
            | Reason::Draining
            | Reason::Drained
            | Reason::RemediationWaiting
            | Reason::AwaitingApproval
            | Reason::Validating
            | Reason::ValidationPassed
            | Reason::ValidationFailed
            | Reason::DrainCancelled
            | Reason::DrainEnded => None,
        }
    }

    /// Every action.
    pub const ALL: [ActionKind; 14] = [
        ActionKind::Label,
        ActionKind::Taint,
        ActionKind::Untaint,
        ActionKind::Cordon,
        ActionKind::Uncordon,
        ActionKind::Evict,
        ActionKind::DrainStart,
        ActionKind::DrainStuck,
        ActionKind::Release,
        ActionKind::Quarantine,
        ActionKind::Unquarantine,
        ActionKind::RepairStart,
        ActionKind::NeedsHuman,
        ActionKind::Delete,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Label => "label",
            ActionKind::Taint => "taint",
            ActionKind::Untaint => "untaint",
            ActionKind::Cordon => "cordon",
            ActionKind::Uncordon => "uncordon",
            ActionKind::Evict => "evict",
            ActionKind::DrainStart => "drain_start",
            ActionKind::DrainStuck => "drain_stuck",
            ActionKind::Release => "release",
            ActionKind::Quarantine => "quarantine",
            ActionKind::Unquarantine => "unquarantine",
            ActionKind::RepairStart => "repair_start",
            ActionKind::NeedsHuman => "needs_human",
            ActionKind::Delete => "delete",
        }
    }
}

/// How an action went (the `result` label of `gpunode_actions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActionResult {
    /// Done.
    Ok,
    /// The write failed.
    Error,
    /// Wanted but held back (budget, breaker, dry run, pause, skip, conflict, a
    /// PodDisruptionBudget refusing an eviction).
    Blocked,
    /// Not done because the object is not gpunode's (a delete of an object gpunode did not
    /// make, or that was replaced since): left alone.
    Refused,
}

impl ActionResult {
    /// Every result.
    pub const ALL: [ActionResult; 4] = [
        ActionResult::Ok,
        ActionResult::Error,
        ActionResult::Blocked,
        ActionResult::Refused,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionResult::Ok => "ok",
            ActionResult::Error => "error",
            ActionResult::Blocked => "blocked",
            ActionResult::Refused => "refused",
        }
    }
}

macro_rules! label_value {
    ($($t:ty),*) => {$(
        impl EncodeLabelValue for $t {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                encoder.write_str(self.as_str())
            }
        }
    )*};
}

label_value!(ErrorKind, ActionKind, ActionResult);

/// A node state as a label value: [`NodeState`] lives in gpunode-checks, which does not depend
/// on prometheus-client.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct StateLabel(NodeState);

impl EncodeLabelValue for StateLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: ErrorKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: ActionKind,
    result: ActionResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartLabels {
    part: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    source: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    result: &'static str,
}

/// A part of a Node gpunode writes (the `part` label of `gpunode_node_writes_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WritePart {
    /// Labels and annotations.
    Metadata,
    /// Taints and the cordon.
    Spec,
    /// The `GpuPolicyCompliant` condition.
    Condition,
}

impl WritePart {
    /// Every part.
    pub const ALL: [WritePart; 3] = [WritePart::Metadata, WritePart::Spec, WritePart::Condition];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            WritePart::Metadata => "metadata",
            WritePart::Spec => "spec",
            WritePart::Condition => "condition",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    policy: String,
    state: StateLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    policy: String,
    condition: String,
}

const NODE_STATES: [NodeState; 3] = [NodeState::Compliant, NodeState::Drifted, NodeState::Unknown];

/// The registry and its metrics. Share it as `Arc<Metrics>`; every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Counter,
    reconcile_errors: Family<ErrorLabels, Counter>,
    actions: Family<ActionLabels, Counter>,
    nodes: Family<NodeLabels, Gauge>,
    reconcile_duration: Histogram,
    reaction: Histogram,
    leader: Gauge,
    node_writes: Family<PartLabels, Counter>,
    watch_events: Family<WatchLabels, Counter>,
    verdicts: Family<VerdictLabels, Counter>,
    node_plans: Family<PassLabels, Counter>,
    policy_conditions: Family<ConditionLabels, Gauge>,
    quarantined_gpus: Family<PolicyLabels, Gauge>,
    repair_steps: Family<StepLabels, Counter>,
    repair_duration: Family<OutcomeLabels, Histogram>,
    validations: Family<ValidationLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassLabels {
    policy: String,
    pass: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ValidationLabels {
    kind: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// Buckets of the repair step histogram: 10 s to 4 h (reboots, replacements).
pub const REPAIR_BUCKETS: [f64; 10] = [
    10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 14400.0,
];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry with prefix `gpunode` and every metric registered.
    pub fn new() -> Self {
        let reconciles = Counter::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let actions = Family::<ActionLabels, Counter>::default();
        let nodes = Family::<NodeLabels, Gauge>::default();
        let reconcile_duration = Histogram::new(LATENCY_BUCKETS);
        let reaction = Histogram::new(LATENCY_BUCKETS);
        let leader = Gauge::default();
        let node_writes = Family::<PartLabels, Counter>::default();
        let watch_events = Family::<WatchLabels, Counter>::default();
        let verdicts = Family::<VerdictLabels, Counter>::default();
        let node_plans = Family::<PassLabels, Counter>::default();
        let policy_conditions = Family::<ConditionLabels, Gauge>::default();
        let quarantined_gpus = Family::<PolicyLabels, Gauge>::default();
        let repair_steps = Family::<StepLabels, Counter>::default();
        let validations = Family::<ValidationLabels, Counter>::default();
        let repair_duration =
            Family::<OutcomeLabels, Histogram>::new_with_constructor(|| Histogram::new(REPAIR_BUCKETS));
        let mut metrics = Metrics {
            quarantined_gpus,
            repair_steps,
            repair_duration,
            validations,
            node_writes,
            watch_events,
            verdicts,
            node_plans,
            policy_conditions,
            registry: Registry::with_prefix("gpunode"),
            reconciles,
            reconcile_errors,
            actions,
            nodes,
            reconcile_duration,
            reaction,
            leader,
        };
        metrics.start_at_zero();
        metrics.register_decisions();
        metrics.register_timings_and_writes();
        metrics
    }

    /// Every bounded series starts at zero, so rates and alerts work before the first error.
    fn start_at_zero(&self) {
        for part in WritePart::ALL {
            let _ = self
                .node_writes
                .get_or_create(&PartLabels { part: part.as_str() });
        }
        for source in ["node", "report"] {
            for outcome in ["reconcile", "skipped"] {
                let _ = self.watch_events.get_or_create(&WatchLabels { source, outcome });
            }
        }
        for result in ["evaluated", "reused"] {
            let _ = self.verdicts.get_or_create(&VerdictLabels { result });
        }
        for kind in ErrorKind::ALL {
            let _ = self.reconcile_errors.get_or_create(&ErrorLabels { kind });
        }
        for action in ActionKind::ALL {
            for result in ActionResult::ALL {
                let _ = self.actions.get_or_create(&ActionLabels { action, result });
            }
        }
    }

    /// Registers the metrics of what reconciles decide: reconciles and their errors, actions,
    /// nodes by verdict, quarantined GPUs, repair steps, validations.
    fn register_decisions(&mut self) {
        self.registry.register(
            "reconciles",
            "Reconciles of a GpuNodePolicy started",
            self.reconciles.clone(),
        );
        self.registry.register(
            "reconcile_errors",
            "Reconciles that failed, by the step that failed",
            self.reconcile_errors.clone(),
        );
        self.registry.register(
            "actions",
            "Actions on nodes, by action and result",
            self.actions.clone(),
        );
        self.registry.register(
            "nodes",
            "Nodes selected by each policy, by verdict",
            self.nodes.clone(),
        );
        self.registry.register(
            "quarantined_gpus",
            "GPUs of each policy's nodes quarantined on their own (TaintDevice)",
            self.quarantined_gpus.clone(),
        );
        self.registry.register(
            "repair_steps",
            "Repair steps (spec.repair) that ended, by step and outcome",
            self.repair_steps.clone(),
        );
        self.registry.register(
            "validations",
            "Validation Jobs (spec.validation) that ended, by kind (undo, periodic) and outcome",
            self.validations.clone(),
        );
    }

    /// Registers the timings (repair steps, reconciles, reactions), leadership, and what
    /// reaches the API server and the caches (node writes, watch events, verdicts, policy
    /// conditions).
    fn register_timings_and_writes(&mut self) {
        self.registry.register_with_unit(
            "repair_step_duration",
            "Time from a repair step's start to its end, by outcome",
            Unit::Seconds,
            self.repair_duration.clone(),
        );
        self.registry.register_with_unit(
            "reconcile_duration",
            "Time a reconcile of a GpuNodePolicy took",
            Unit::Seconds,
            self.reconcile_duration.clone(),
        );
        self.registry.register_with_unit(
            "reaction",
            "Time from a report's observation to the action taken on its node",
            Unit::Seconds,
            self.reaction.clone(),
        );
        self.registry.register(
            "leader",
            "1 while this replica holds the leader Lease (and may write), else 0",
            self.leader.clone(),
        );
        self.registry.register(
            "node_writes",
            "Requests that changed a Node, by part (zero on a follower and for heartbeats)",
            self.node_writes.clone(),
        );
        self.registry.register(
            "watch_events",
            "Node and report changes, by whether they could change a decision",
            self.watch_events.clone(),
        );
        self.registry.register(
            "verdicts",
            "Per-node verdicts of reconciles, evaluated or reused from the last reconcile",
            self.verdicts.clone(),
        );
        self.registry.register(
            "node_plans",
            "Node plans made by reconciles: of every node of a policy (whole passes) or of the nodes that changed (incremental planning)",
            self.node_plans.clone(),
        );
        self.registry.register(
            "policy_condition",
            "1 while the policy's status condition of this type (Ready, Degraded, BudgetExhausted, CircuitOpen, Conflict, Paused) is True, else 0",
            self.policy_conditions.clone(),
        );
    }

    /// Counts a reconcile now and observes its duration when the returned guard drops.
    pub fn start_reconcile(&self) -> ReconcileTimer<'_> {
        self.reconciles.inc();
        ReconcileTimer {
            metrics: self,
            start: Instant::now(),
        }
    }

    /// Counts a reconcile that took `duration` (for callers that time it themselves).
    pub fn reconciled(&self, duration: Duration) {
        self.reconciles.inc();
        self.reconcile_duration.observe(duration.as_secs_f64());
    }

    /// Counts a failed reconcile.
    pub fn reconcile_error(&self, kind: ErrorKind) {
        self.reconcile_errors.get_or_create(&ErrorLabels { kind }).inc();
    }

    /// Counts an action on a node.
    pub fn action(&self, action: ActionKind, result: ActionResult) {
        self.actions.get_or_create(&ActionLabels { action, result }).inc();
    }

    /// Counts a validation that ended.
    pub fn validation(&self, periodic: bool, outcome: crate::markers::ValidationOutcome) {
        use crate::markers::ValidationOutcome as O;
        let outcome = match outcome {
            O::Passed => "passed",
            O::Failed => "failed",
            O::TimedOut => "timed_out",
        };
        let kind = if periodic { "periodic" } else { "undo" };
        self.validations
            .get_or_create(&ValidationLabels { kind, outcome })
            .inc();
    }

    /// Counts a repair step that ended, with how long it ran.
    pub fn repair_step(&self, step: &str, outcome: &'static str, ran: Duration) {
        self.repair_steps
            .get_or_create(&StepLabels {
                step: step.to_string(),
                outcome,
            })
            .inc();
        self.repair_duration
            .get_or_create(&OutcomeLabels { outcome })
            .observe(ran.as_secs_f64());
    }

    /// Sets how many of `policy`'s nodes are in `state`.
    pub fn set_nodes(&self, policy: &str, state: NodeState, count: usize) {
        self.nodes
            .get_or_create(&NodeLabels {
                policy: policy.to_string(),
                state: StateLabel(state),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Sets all three states of `policy` at once, from its verdicts.
    pub fn set_policy_nodes(&self, policy: &str, states: impl IntoIterator<Item = NodeState>) {
        let mut counts = [0usize; 3];
        for state in states {
            counts[state_index(state)] += 1;
        }
        for state in NODE_STATES {
            self.set_nodes(policy, state, counts[state_index(state)]);
        }
    }

    /// Exports the policy's status conditions: 1 for each type that is True.
    pub fn set_policy_conditions(&self, policy: &str, conditions: &[Condition]) {
        for condition in PolicyCondition::ALL.map(PolicyCondition::as_str) {
            let on = conditions
                .iter()
                .any(|c| c.type_ == condition && c.status == "True");
            self.policy_conditions
                .get_or_create(&ConditionLabels {
                    policy: policy.to_string(),
                    condition: condition.to_string(),
                })
                .set(i64::from(on));
        }
    }

    /// Sets how many GPUs of `policy`'s nodes are quarantined (from its status).
    pub fn set_quarantined_gpus(&self, policy: &str, gpus: u32) {
        self.quarantined_gpus
            .get_or_create(&PolicyLabels {
                policy: policy.to_string(),
            })
            .set(i64::from(gpus));
    }

    /// Drops `policy`'s series (the policy was deleted).
    pub fn forget_policy(&self, policy: &str) {
        for pass in ["whole", "partial"] {
            self.node_plans.remove(&PassLabels {
                policy: policy.to_string(),
                pass,
            });
        }
        self.quarantined_gpus.remove(&PolicyLabels {
            policy: policy.to_string(),
        });
        for condition in PolicyCondition::ALL.map(PolicyCondition::as_str) {
            self.policy_conditions.remove(&ConditionLabels {
                policy: policy.to_string(),
                condition: condition.to_string(),
            });
        }
        for state in NODE_STATES {
            self.nodes.remove(&NodeLabels {
                policy: policy.to_string(),
                state: StateLabel(state),
            });
        }
    }

    /// Observes the latency from a report's observation to an action on its node.
    pub fn reaction(&self, latency: Duration) {
        self.reaction.observe(latency.as_secs_f64());
    }

    /// Observes the latency from `observed` (the report's `observedAt`) to `acted`; a negative
    /// span (clock skew between node and operator) counts as zero.
    pub fn reaction_between(&self, observed: Timestamp, acted: Timestamp) {
        let latency = Duration::try_from(acted.duration_since(observed)).unwrap_or_default();
        self.reaction(latency);
    }

    /// Counts a write to one part of a Node (`metadata`, `spec` or `condition`).
    pub fn node_write(&self, part: WritePart) {
        self.node_writes
            .get_or_create(&PartLabels { part: part.as_str() })
            .inc();
    }

    /// Writes to Nodes so far, all parts together.
    pub fn node_writes(&self) -> u64 {
        WritePart::ALL
            .iter()
            .map(|part| {
                self.node_writes
                    .get_or_create(&PartLabels { part: part.as_str() })
                    .get()
            })
            .sum()
    }

    /// Counts a node (`node`) or report (`report`) change that triggered a reconcile or was
    /// skipped as immaterial.
    pub fn watch_event(&self, source: &'static str, triggered: bool) {
        let outcome = if triggered { "reconcile" } else { "skipped" };
        self.watch_events
            .get_or_create(&WatchLabels { source, outcome })
            .inc();
    }

    /// Changes of `source` so far that triggered (`true`) or were skipped (`false`).
    pub fn watch_events(&self, source: &'static str, triggered: bool) -> u64 {
        let outcome = if triggered { "reconcile" } else { "skipped" };
        self.watch_events
            .get_or_create(&WatchLabels { source, outcome })
            .get()
    }

    /// Counts the verdicts of one reconcile: reused from the last, and evaluated.
    pub fn verdicts(&self, reused: u64, evaluated: u64) {
        self.verdicts
            .get_or_create(&VerdictLabels { result: "reused" })
            .inc_by(reused);
        self.verdicts
            .get_or_create(&VerdictLabels { result: "evaluated" })
            .inc_by(evaluated);
    }

    /// Counts the node plans of one pass of `policy`: `whole` (every node of the policy) or
    /// not.
    pub fn node_plans(&self, policy: &str, whole: bool, plans: usize) {
        let pass = if whole { "whole" } else { "partial" };
        let labels = PassLabels {
            policy: policy.to_string(),
            pass,
        };
        self.node_plans
            .get_or_create(&labels)
            .inc_by(u64::try_from(plans).unwrap_or(u64::MAX));
    }

    /// Node plans made so far for `policy`: (whole passes', partial passes').
    pub fn node_plans_of(&self, policy: &str) -> (u64, u64) {
        let get = |pass| {
            self.node_plans
                .get_or_create(&PassLabels {
                    policy: policy.to_string(),
                    pass,
                })
                .get()
        };
        (get("whole"), get("partial"))
    }

    /// Reconciles started so far.
    pub fn reconciles(&self) -> u64 {
        self.reconciles.get()
    }

    /// Sets the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Keeps the leader gauge equal to `leadership` until its sender is gone (spawn it:
    /// `tokio::spawn({ let m = metrics.clone(); async move { m.follow_leader(rx).await } })`).
    pub async fn follow_leader(&self, mut leadership: watch::Receiver<bool>) {
        loop {
            self.set_leader(*leadership.borrow_and_update());
            if leadership.changed().await.is_err() {
                return;
            }
        }
    }

    /// The registry in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = encode(&mut out, &self.registry) {
            // Writing into a String cannot fail; keep whatever was written.
            tracing::error!(error = %e, "encoding metrics");
        }
        out
    }
}

fn state_index(state: NodeState) -> usize {
    match state {
        NodeState::Compliant => 0,
        NodeState::Drifted => 1,
        NodeState::Unknown => 2,
    }
}

/// Observes a reconcile's duration when dropped (also on early return and `?`).
#[derive(Debug)]
#[must_use = "the duration is observed when the timer drops"]
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .reconcile_duration
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_changes_are_counted_as_label_writes() {
        for r in Reason::ALL {
            assert_eq!(
                r.is_state_change(),
                ActionKind::of_event(r) == Some(ActionKind::Label),
                "{r}"
            );
        }
    }

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| {
            let (name, v) = l.rsplit_once(' ')?;
            (name == series).then(|| v.parse().ok()).flatten()
        })
    }

    #[test]
    fn names_types_and_help_are_exposed() {
        let m = Metrics::new();
        m.set_nodes("h100", NodeState::Compliant, 1);
        m.node_plans("h100", false, 3);
        m.node_plans("h100", true, 50);
        let text = m.encode();
        for (name, kind) in [
            ("gpunode_reconciles", "counter"),
            ("gpunode_reconcile_errors", "counter"),
            ("gpunode_actions", "counter"),
            ("gpunode_nodes", "gauge"),
            ("gpunode_reconcile_duration_seconds", "histogram"),
            ("gpunode_reaction_seconds", "histogram"),
            ("gpunode_leader", "gauge"),
            ("gpunode_node_plans", "counter"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} {kind} missing from\n{text}"
            );
            assert!(line(&text, &format!("# HELP {name} ")).is_some(), "{name}");
        }
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(value(&text, "gpunode_reconciles_total"), Some(0.0));
        assert_eq!(value(&text, "gpunode_leader"), Some(0.0));
        let plans = |pass: &str| {
            value(
                &text,
                &format!(r#"gpunode_node_plans_total{{policy="h100",pass="{pass}"}}"#),
            )
        };
        assert_eq!(plans("partial"), Some(3.0));
        assert_eq!(plans("whole"), Some(50.0));
        // Bounded series are there from the start, at zero.
        assert_eq!(
            value(&text, r#"gpunode_reconcile_errors_total{kind="conflict"}"#),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                r#"gpunode_actions_total{action="drain_stuck",result="blocked"}"#
            ),
            Some(0.0)
        );
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with("gpunode_actions_total{"))
                .count(),
            ActionKind::ALL.len() * ActionResult::ALL.len()
        );
        assert!(
            !Metrics::new().encode().contains("gpunode_nodes"),
            "no policy, no nodes series"
        );
    }

    #[test]
    fn counters_carry_bounded_labels() {
        let m = Metrics::new();
        m.reconcile_error(ErrorKind::Taints);
        m.reconcile_error(ErrorKind::Taints);
        m.reconcile_error(ErrorKind::InvalidObject);
        m.action(ActionKind::DrainStart, ActionResult::Ok);
        m.action(ActionKind::Evict, ActionResult::Blocked);
        m.action(ActionKind::Evict, ActionResult::Blocked);
        m.action(ActionKind::Untaint, ActionResult::Error);
        let text = m.encode();
        assert_eq!(
            value(&text, r#"gpunode_reconcile_errors_total{kind="taints"}"#),
            Some(2.0)
        );
        assert_eq!(
            value(&text, r#"gpunode_reconcile_errors_total{kind="invalid_object"}"#),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                r#"gpunode_actions_total{action="drain_start",result="ok"}"#
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&text, r#"gpunode_actions_total{action="evict",result="blocked"}"#),
            Some(2.0)
        );
        assert_eq!(
            value(&text, r#"gpunode_actions_total{action="untaint",result="error"}"#),
            Some(1.0)
        );
    }

    #[test]
    fn label_values_are_snake_case_and_distinct() {
        let mut seen = std::collections::BTreeSet::new();
        for v in ErrorKind::ALL.map(ErrorKind::as_str) {
            assert!(v.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{v}");
            assert!(seen.insert(("kind", v)), "{v}");
        }
        for v in ActionKind::ALL.map(ActionKind::as_str) {
            assert!(v.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{v}");
            assert!(seen.insert(("action", v)), "{v}");
        }
    }

    #[test]
    fn nodes_by_policy_and_state() {
        let m = Metrics::new();
        m.set_policy_nodes(
            "h100",
            [NodeState::Compliant, NodeState::Drifted, NodeState::Compliant],
        );
        m.set_nodes("a100", NodeState::Unknown, 4);
        let text = m.encode();
        let series = |p: &str, s: &str| format!(r#"gpunode_nodes{{policy="{p}",state="{s}"}}"#);
        assert_eq!(value(&text, &series("h100", "compliant")), Some(2.0));
        assert_eq!(value(&text, &series("h100", "drifted")), Some(1.0));
        assert_eq!(value(&text, &series("h100", "unknown")), Some(0.0));
        assert_eq!(value(&text, &series("a100", "unknown")), Some(4.0));
        m.set_policy_nodes("h100", []);
        assert_eq!(value(&m.encode(), &series("h100", "compliant")), Some(0.0));
        m.forget_policy("h100");
        let text = m.encode();
        assert!(!text.contains(r#"policy="h100""#), "{text}");
        assert!(text.contains(r#"policy="a100""#), "{text}");
    }

    #[test]
    fn policy_conditions_are_one_while_true() {
        let m = Metrics::new();
        let cond = |t: &str, status: &str| Condition {
            type_: t.to_string(),
            status: status.to_string(),
            reason: "R".to_string(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        };
        m.set_policy_conditions(
            "h100",
            &[
                cond("Ready", "True"),
                cond("CircuitOpen", "True"),
                cond("Paused", "False"),
            ],
        );
        let text = m.encode();
        let series = |c: &str| format!(r#"gpunode_policy_condition{{policy="h100",condition="{c}"}}"#);
        assert_eq!(value(&text, &series("CircuitOpen")), Some(1.0));
        assert_eq!(value(&text, &series("Ready")), Some(1.0));
        assert_eq!(value(&text, &series("Paused")), Some(0.0));
        assert_eq!(
            value(&text, &series("BudgetExhausted")),
            Some(0.0),
            "absent means 0"
        );
        m.forget_policy("h100");
        assert!(!m.encode().contains("gpunode_policy_condition{"), "forgotten");
    }

    #[test]
    fn histograms_span_10ms_to_60s() {
        let m = Metrics::new();
        m.reconciled(Duration::from_millis(30));
        {
            let _timer = m.start_reconcile();
        }
        m.reaction(Duration::from_secs(3));
        m.reaction_between(Timestamp::UNIX_EPOCH, Timestamp::from_second(120).unwrap());
        // The node's clock ran ahead: counted as zero, not as a negative latency.
        m.reaction_between(Timestamp::from_second(5).unwrap(), Timestamp::UNIX_EPOCH);
        let text = m.encode();
        assert_eq!(value(&text, "gpunode_reconciles_total"), Some(2.0));
        assert_eq!(
            value(&text, "gpunode_reconcile_duration_seconds_count"),
            Some(2.0)
        );
        assert_eq!(
            value(&text, r#"gpunode_reconcile_duration_seconds_bucket{le="0.01"}"#),
            Some(1.0)
        );
        assert_eq!(
            value(&text, r#"gpunode_reconcile_duration_seconds_bucket{le="0.05"}"#),
            Some(2.0)
        );
        assert_eq!(value(&text, "gpunode_reaction_seconds_count"), Some(3.0));
        assert_eq!(
            value(&text, r#"gpunode_reaction_seconds_bucket{le="0.01"}"#),
            Some(1.0)
        );
        assert_eq!(
            value(&text, r#"gpunode_reaction_seconds_bucket{le="5.0"}"#),
            Some(2.0)
        );
        assert_eq!(
            value(&text, r#"gpunode_reaction_seconds_bucket{le="60.0"}"#),
            Some(2.0)
        );
        assert_eq!(
            value(&text, r#"gpunode_reaction_seconds_bucket{le="+Inf"}"#),
            Some(3.0)
        );
    }

    #[tokio::test]
    async fn the_leader_gauge_follows_leadership() {
        let m = std::sync::Arc::new(Metrics::new());
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn({
            let m = m.clone();
            async move { m.follow_leader(rx).await }
        });
        let gauge = || value(&m.encode(), "gpunode_leader");
        let reaches = |want: f64| {
            tokio::time::timeout(Duration::from_secs(5), async move {
                while gauge() != Some(want) {
                    tokio::task::yield_now().await;
                }
            })
        };
        tx.send_replace(true);
        reaches(1.0)
            .await
            .unwrap_or_else(|_| panic!("gauge never became 1"));
        tx.send_replace(false);
        reaches(0.0)
            .await
            .unwrap_or_else(|_| panic!("gauge never became 0"));
        drop(tx);
        task.await.unwrap();
    }
}
