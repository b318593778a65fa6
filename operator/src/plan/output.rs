//! What the planner says, in its own words: the actions of the ladder ([`Action`], a GPU's
//! [`GpuTaint`]), the drain ([`DrainStep`]), what is in effect on a node ([`InEffect`]), when a
//! plan changes with time alone ([`NextChange`]), and the node's condition and Events
//! ([`NodeCondition`], [`PlannedEvent`]).
//!
//! Plain data with its descriptions, no decision. It may import the bookkeeping (`markers`) and
//! the reasons, and nothing of the planner: the views below it are not needed to say anything,
//! and every layer above (admission, the feature planners, the pass) speaks in these words. Why
//! a step waits ([`super::Block`]) is said by admission, the only layer that decides it.

use std::collections::BTreeSet;

use gpunode_crds::{DriftClass, policy::RemediationAction};
use jiff::Timestamp;

use crate::{
    markers::{self, DriftTaint},
    reasons::Reason,
};

/// An action of the ladder as it applies to one node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// Add a gpunode taint.
    Taint(DriftTaint),
    /// Mark the node unschedulable.
    Cordon,
    /// Evict the node's pods.
    Drain,
    /// Quarantine one GPU.
    TaintDevice(GpuTaint),
}

impl Action {
    /// Takes capacity away (counts against `maxUnavailable`).
    pub fn is_disruptive(&self) -> bool {
        match self {
            Action::Taint(t) => t.effect.is_disruptive(),
            Action::TaintDevice(t) => t.effect.is_disruptive(),
            Action::Cordon | Action::Drain => true,
        }
    }

    /// A node-wide action (a taint, the cordon, the drain), which a validation gates the undo of.
    pub fn is_node_level(&self) -> bool {
        !matches!(self, Action::TaintDevice(_))
    }

    /// For status and events: `Taint NoSchedule (thermal)`, `Cordon`, `Drain`,
    /// `TaintDevice NoExecute (gpu 5, GPU-…)`.
    pub fn describe(&self) -> String {
        match self {
            Action::Taint(t) => format!("Taint {} ({})", t.effect.as_str(), t.value),
            Action::Cordon => "Cordon".to_string(),
            Action::Drain => "Drain".to_string(),
            Action::TaintDevice(t) => format!("TaintDevice {} ({})", t.effect.as_str(), t.subject()),
        }
    }
}

/// A GPU quarantine: which GPU and with what effect.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuTaint {
    /// The GPU's key (its UUID, or `index-<i>`).
    pub gpu: String,
    /// Its index.
    pub index: u32,
    /// The effect.
    pub effect: gpunode_crds::policy::TaintEffect,
}

impl GpuTaint {
    /// `gpu 5 (GPU-…)`.
    pub fn subject(&self) -> String {
        if self.gpu.starts_with("index-") {
            format!("gpu {}", self.index)
        } else {
            format!("gpu {} ({})", self.index, self.gpu)
        }
    }
}

/// Whether any of `actions` takes capacity away.
pub fn is_disrupted(actions: &BTreeSet<Action>) -> bool {
    actions.iter().any(Action::is_disruptive)
}

/// The state of a drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainStep {
    /// No drain.
    None,
    /// Evict pods; the drain began at `started` and is stuck once its timeout has passed.
    Run {
        /// When it began.
        started: Timestamp,
        /// It has run longer than `disruption.drain.timeout`.
        stuck: bool,
    },
    /// The drain found nothing left to evict: the node stays cordoned, no more eviction passes
    /// (and no pod listings) run until the node recovers.
    Done {
        /// When it began.
        started: Timestamp,
        /// When it found nothing left to evict.
        finished: Timestamp,
    },
}

/// Where a node's repair stands, as its bookkeeping records it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairInEffect {
    /// The step running, if any.
    pub running: Option<String>,
    /// The repair stopped and needs a person.
    pub needs_human: bool,
}

impl RepairInEffect {
    /// What `track` records.
    pub fn of(track: &markers::RepairTrack) -> RepairInEffect {
        RepairInEffect {
            running: track
                .step
                .as_ref()
                .filter(|s| s.ended.is_none())
                .map(|s| s.name.clone()),
            needs_human: track.needs_human.is_some(),
        }
    }
}

/// What gpunode has in effect on a node: its taints, cordon and drain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InEffect {
    /// The actions in effect, in order.
    pub actions: Vec<Action>,
    /// A gpunode taint is on the node.
    pub tainted: bool,
    /// gpunode's cordon is on the node.
    pub cordoned: bool,
    /// The drain.
    pub drain: DrainStep,
    /// The repair.
    pub repair: RepairInEffect,
    /// A validation Job runs on the node.
    pub validating: bool,
}

/// Whether the bookkeeping records a validation running.
pub fn validating(track: Option<&markers::ValidationTrack>) -> bool {
    track.is_some_and(|t| t.ended.is_none())
}

/// When a plan changes with time alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextChange {
    /// When.
    pub at: Timestamp,
    /// Why.
    pub cause: ChangeCause,
}

impl NextChange {
    /// `next`, or the change at `at` for `cause` if that comes first.
    pub fn earliest(
        next: Option<NextChange>,
        at: Option<Timestamp>,
        cause: ChangeCause,
    ) -> Option<NextChange> {
        match at {
            Some(at) if next.is_none_or(|c| at < c.at) => Some(NextChange { at, cause }),
            _ => next,
        }
    }
}

/// What changes a plan when its time comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeCause {
    /// A remediation rule's `after` passes for a class.
    RuleAfter {
        /// The class.
        class: DriftClass,
        /// The rule's action.
        action: RemediationAction,
    },
    /// A class has been clear for `recovery.healthyFor`: what it caused is undone.
    HealthyFor(DriftClass),
    /// The report goes stale (`staleAfter` since the probe was last heard from).
    Stale,
    /// The drain reaches its timeout.
    DrainTimeout,
    /// A `TaintDevice` rule's `after` passes for a class of one GPU.
    GpuRuleAfter {
        /// The GPU's index.
        gpu: u32,
        /// The class.
        class: DriftClass,
    },
    /// A class of one GPU has been clear for `recovery.healthyFor`.
    GpuHealthyFor {
        /// The GPU's index.
        gpu: u32,
        /// The class.
        class: DriftClass,
    },
    /// The verdict changes with time alone: a fatal XID leaves `xidWindow`, a power brake
    /// outlasts `maxPowerBrake`.
    Verdict,
    /// A repair step (or the wait for a report after it) reaches its timeout.
    RepairTimeout,
    /// A validation Job reaches its timeout.
    ValidationTimeout,
    /// A maintenance window opens, and what waits for it may start.
    WindowOpens,
}

impl std::fmt::Display for NextChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cause {
            ChangeCause::RuleAfter { class, action } => write!(
                f,
                "{}: the {action:?} rule's `after` passes for {}",
                self.at,
                class.as_str()
            ),
            ChangeCause::HealthyFor(class) => write!(
                f,
                "{}: {} has been clear for `recovery.healthyFor`",
                self.at,
                class.as_str()
            ),
            ChangeCause::Stale => write!(f, "{}: the report goes stale (`staleAfter`)", self.at),
            ChangeCause::DrainTimeout => write!(f, "{}: the drain reaches its timeout", self.at),
            ChangeCause::GpuRuleAfter { gpu, class } => write!(
                f,
                "{}: the TaintDevice rule's `after` passes for {} on gpu {gpu}",
                self.at,
                class.as_str()
            ),
            ChangeCause::GpuHealthyFor { gpu, class } => write!(
                f,
                "{}: {} of gpu {gpu} has been clear for `recovery.healthyFor`",
                self.at,
                class.as_str()
            ),
            ChangeCause::Verdict => write!(
                f,
                "{}: the verdict changes (an XID leaves `xidWindow` or a power brake outlasts `maxPowerBrake`)",
                self.at
            ),
            ChangeCause::RepairTimeout => write!(f, "{}: the repair step reaches its timeout", self.at),
            ChangeCause::ValidationTimeout => {
                write!(f, "{}: the validation Job reaches its timeout", self.at)
            }
            ChangeCause::WindowOpens => write!(f, "{}: a maintenance window opens", self.at),
        }
    }
}

/// The `GpuPolicyCompliant` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCondition {
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// Why.
    pub reason: Reason,
    /// One line.
    pub message: String,
}

/// An Event to publish on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    /// A Warning (drift, stuck drain) rather than Normal.
    pub warning: bool,
    /// Why.
    pub reason: Reason,
    /// One line.
    pub note: String,
}
