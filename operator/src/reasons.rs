//! The words gpunode writes for people and alerts, typed once: the reasons of node Events and of
//! the node's `GpuPolicyCompliant` condition, and the policy status condition types and reasons.
//! Code compares these values, never the strings they are written as.

use std::fmt;

/// The reason of a node Event or of the node's `GpuPolicyCompliant` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// The node meets the policy (state change; condition).
    Compliant,
    /// The node drifts from the policy (state change; condition).
    Drifted,
    /// Some check cannot be told (state change; condition).
    Unknown,
    /// Unknown because the probe's NVML calls hang (a stuck driver), while the probe itself
    /// still reports: not a dead probe (condition).
    NvmlHung,
    /// A drain is evicting pods (condition).
    Draining,
    /// A drain has run past its timeout (event; condition).
    DrainStuck,
    /// A drain found nothing left to evict (event; condition).
    Drained,
    /// A disruptive action waits for the budget, the breaker or a conflict (event).
    RemediationWaiting,
    /// A gpunode taint was added (event).
    Tainted,
    /// A gpunode taint was removed (event).
    TaintRemoved,
    /// gpunode cordoned the node (event).
    Cordoned,
    /// gpunode lifted its cordon (event).
    Uncordoned,
    /// A drain began (event).
    DrainStarted,
    /// A person uncordoned a node gpunode was draining (event).
    DrainCancelled,
    /// A drain is no longer needed (event).
    DrainEnded,
    /// gpunode undid everything it did to a node no policy governs (event).
    Released,
    /// One GPU was quarantined, or its quarantine's effect changed (event).
    GpuQuarantined,
    /// A GPU's quarantine was lifted (event).
    GpuReleased,
    /// The node's GPU faults went to the node's own rules (event).
    Escalated,
    /// A repair step runs on the drained node (condition).
    Repairing,
    /// A repair step started (event).
    RepairStarted,
    /// A repair step finished (event).
    RepairSucceeded,
    /// A repair step reported failure (event).
    RepairFailed,
    /// A repair step ran past its timeout (event).
    RepairTimedOut,
    /// The repair stopped: every step was tried or the attempts are used (event; condition).
    NeedsHuman,
    /// A rung that requires a person's approval waits for it (condition; event printing the
    /// command that approves it).
    AwaitingApproval,
    /// A validation Job runs on the recovered node before gpunode undoes what it did
    /// (condition; event when it starts).
    Validating,
    /// The validation Job passed: gpunode undoes what it did (event).
    ValidationPassed,
    /// The validation Job failed or timed out: the node stays as it is (event; condition).
    ValidationFailed,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 29] = [
        Reason::Compliant,
        Reason::Drifted,
        Reason::Unknown,
        Reason::NvmlHung,
        Reason::Draining,
        Reason::DrainStuck,
        Reason::Drained,
        Reason::RemediationWaiting,
        Reason::Tainted,
        Reason::TaintRemoved,
        Reason::Cordoned,
        Reason::Uncordoned,
        Reason::DrainStarted,
        Reason::DrainCancelled,
        Reason::DrainEnded,
        Reason::Released,
        Reason::GpuQuarantined,
        Reason::GpuReleased,
        Reason::Escalated,
        Reason::Repairing,
        Reason::RepairStarted,
        Reason::RepairSucceeded,
        Reason::RepairFailed,
        Reason::RepairTimedOut,
        Reason::NeedsHuman,
        Reason::AwaitingApproval,
        Reason::Validating,
        Reason::ValidationPassed,
        Reason::ValidationFailed,
    ];

    /// As written (CamelCase).
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Compliant => "Compliant",
            Reason::Drifted => "Drifted",
            Reason::Unknown => "Unknown",
            Reason::NvmlHung => "NvmlHung",
            Reason::Draining => "Draining",
            Reason::DrainStuck => "DrainStuck",
            Reason::Drained => "Drained",
            Reason::RemediationWaiting => "RemediationWaiting",
            Reason::Tainted => "Tainted",
            Reason::TaintRemoved => "TaintRemoved",
            Reason::Cordoned => "Cordoned",
            Reason::Uncordoned => "Uncordoned",
            Reason::DrainStarted => "DrainStarted",
            Reason::DrainCancelled => "DrainCancelled",
            Reason::DrainEnded => "DrainEnded",
            Reason::Released => "Released",
            Reason::GpuQuarantined => "GpuQuarantined",
            Reason::GpuReleased => "GpuReleased",
            Reason::Escalated => "Escalated",
            Reason::Repairing => "Repairing",
            Reason::RepairStarted => "RepairStarted",
            Reason::RepairSucceeded => "RepairSucceeded",
            Reason::RepairFailed => "RepairFailed",
            Reason::RepairTimedOut => "RepairTimedOut",
            Reason::NeedsHuman => "NeedsHuman",
            Reason::AwaitingApproval => "AwaitingApproval",
            Reason::Validating => "Validating",
            Reason::ValidationPassed => "ValidationPassed",
            Reason::ValidationFailed => "ValidationFailed",
        }
    }

    /// The reason written as `s`, if gpunode writes it (a node condition read back).
    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// The node's state changed (the state label moves with it).
    pub const fn is_state_change(self) -> bool {
        matches!(self, Reason::Compliant | Reason::Drifted | Reason::Unknown)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A condition type of a policy's status (exported as `gpunode_policy_condition`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyCondition {
    /// The policy was reconciled.
    Ready,
    /// Something needs a person (a stuck drain, an unusable selector).
    Degraded,
    /// Nodes wait for the disruption budget.
    BudgetExhausted,
    /// The circuit breaker holds every new disruption.
    CircuitOpen,
    /// Nodes are selected by another policy too.
    Conflict,
    /// `spec.paused` is set.
    Paused,
}

impl PolicyCondition {
    /// Every condition type, in the order the status lists them.
    pub const ALL: [PolicyCondition; 6] = [
        PolicyCondition::Ready,
        PolicyCondition::Degraded,
        PolicyCondition::BudgetExhausted,
        PolicyCondition::CircuitOpen,
        PolicyCondition::Conflict,
        PolicyCondition::Paused,
    ];

    /// As written.
    pub const fn as_str(self) -> &'static str {
        match self {
            PolicyCondition::Ready => "Ready",
            PolicyCondition::Degraded => "Degraded",
            PolicyCondition::BudgetExhausted => "BudgetExhausted",
            PolicyCondition::CircuitOpen => "CircuitOpen",
            PolicyCondition::Conflict => "Conflict",
            PolicyCondition::Paused => "Paused",
        }
    }
}

impl fmt::Display for PolicyCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reason of a policy status condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PolicyReason {
    /// Ready: the policy was reconciled.
    Reconciled,
    /// Ready and Degraded: a selector cannot be used, so the policy selects no node.
    InvalidSelector,
    /// Degraded: drains have run past their timeout.
    DrainStuck,
    /// Degraded: a maintenance window cannot be read, so every window stays closed.
    InvalidMaintenanceWindow,
    /// Degraded: the validation template cannot be read, so recovered nodes stay as they are.
    InvalidValidation,
    /// Degraded: nothing needs a person.
    AsExpected,
    /// BudgetExhausted: nodes wait.
    NodesQueued,
    /// BudgetExhausted: nodes wait for the operator's fleet-wide cap.
    FleetCapReached,
    /// BudgetExhausted: no node waits.
    WithinBudget,
    /// CircuitOpen: too many nodes began drifting within the window.
    TooManyDrifting,
    /// CircuitOpen: the breaker opened and stays open until it is closed.
    Latched,
    /// CircuitOpen: the breaker is closed.
    Closed,
    /// Conflict: nodes are selected by another policy too.
    OverlappingPolicies,
    /// Conflict: no overlap.
    NoOverlap,
    /// Paused: `spec.paused` is true.
    Paused,
    /// Paused: acting on drift.
    Active,
}

impl PolicyReason {
    /// As written.
    pub const fn as_str(self) -> &'static str {
        match self {
            PolicyReason::Reconciled => "Reconciled",
            PolicyReason::InvalidSelector => "InvalidSelector",
            PolicyReason::DrainStuck => "DrainStuck",
            PolicyReason::InvalidMaintenanceWindow => "InvalidMaintenanceWindow",
            PolicyReason::InvalidValidation => "InvalidValidation",
            PolicyReason::AsExpected => "AsExpected",
            PolicyReason::NodesQueued => "NodesQueued",
            PolicyReason::FleetCapReached => "FleetCapReached",
            PolicyReason::WithinBudget => "WithinBudget",
            PolicyReason::TooManyDrifting => "TooManyDrifting",
            PolicyReason::Latched => "Latched",
            PolicyReason::Closed => "Closed",
            PolicyReason::OverlappingPolicies => "OverlappingPolicies",
            PolicyReason::NoOverlap => "NoOverlap",
            PolicyReason::Paused => "Paused",
            PolicyReason::Active => "Active",
        }
    }
}

impl fmt::Display for PolicyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_as_itself_and_nothing_else_does() {
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
        }
        assert_eq!(Reason::parse("compliant"), None, "case matters");
        assert_eq!(Reason::parse("KubeletReady"), None);
        let mut written: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        written.sort_unstable();
        written.dedup();
        assert_eq!(written.len(), Reason::ALL.len(), "no two reasons share a word");
    }
}
