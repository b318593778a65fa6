//! Admission: the one place that answers "may this node start this step now, and if not, why".
//!
//! One [`Admission`] is built per pass from the policy-level facts: pause and dry run, the
//! maintenance windows, the disruption budget (`maxUnavailable`, and the nodes that hold a slot
//! of it), the circuit breaker, and the validations running and started within the hour. Every
//! step the planner may start is asked through [`Admission::may`]: an action of the ladder (a
//! taint, the cordon, the drain, a GPU's quarantine), a rung that requires a person's approval,
//! a repair step, a validation, and the undo of what gpunode did. The answer is `None` (it may
//! start) or the [`Block`] that holds it back. Which gates hold which step, and in which order,
//! is the table in [`Admission::may`]; each gate is one arm of `Admission::gate`.
//!
//! - **Skip, pause, dry run** hold every step, undo included: nothing is written.
//! - **Approval.** A rung of the ladder whose rule has `requireApproval` waits for a person
//!   before anything else is asked of its action (it takes no slot meanwhile); a repair step
//!   with `requireApproval` is asked for its approval after what holds disruption on the node.
//! - **Conflict, circuit breaker** hold every disruptive step: another policy selects the node;
//!   more than `maxDriftedPercent` of the nodes (and more than one) began drifting within
//!   `window`.
//! - **Windows** hold a disruptive action, a repair step and a periodic validation outside the
//!   maintenance windows, unless the node drifts in an urgent class. A validation before an
//!   undo is not held by them: it ends a disruption.
//! - **Budget.** A node that holds no slot (nothing disruptive of gpunode's is in effect on it,
//!   no validation runs on it) takes one only while fewer than `maxUnavailable` of the policy's
//!   nodes hold one. A repair step runs on a drained node, which holds its slot already.
//! - **Validations.** At most `maxConcurrent` run at once; periodic ones start at most
//!   `maxPerHour` an hour.
//!
//! Pure. It may import the layers below it (view, output, hysteresis, windows), never a feature
//! planner, the node plan or the pass: they ask it.

use std::collections::BTreeSet;

use gpunode_crds::{GpuNodePolicySpec, policy::APPROVE_ANNOTATION};
use jiff::{SignedDuration, Timestamp};

use super::{
    hysteresis::{elapsed, signed},
    output::Action,
    view::NodeView,
    windows::{self, WindowState},
};

/// Why a step may not start now.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Block {
    /// The policy is in dry run.
    DryRun,
    /// The policy is paused.
    Paused,
    /// The node is labelled `gpunode.dev/skip=true`.
    Skip,
    /// Another policy selects the node too.
    Conflict(Vec<String>),
    /// The circuit breaker is open.
    CircuitOpen,
    /// `maxUnavailable` nodes are already disrupted.
    Budget,
    /// Outside the policy's maintenance windows (`spec.maintenance`).
    OutsideWindow {
        /// When the next window opens.
        opens: Timestamp,
    },
    /// A maintenance window cannot be read: every window stays closed.
    InvalidWindow(String),
    /// A rung requires a person's approval (`requireApproval`).
    Approval {
        /// The rungs awaiting it.
        rungs: Vec<String>,
        /// The command that approves them.
        command: String,
    },
    /// `maxConcurrent` of the policy's nodes are validating (a validation's wait says so).
    Validations(u32),
    /// `maxPerHour` periodic validations started within the last hour.
    ValidationsThisHour(u32),
}

impl Block {
    /// A short reason for status and events.
    pub fn describe(&self) -> String {
        match self {
            Block::DryRun => "dry run".to_string(),
            Block::Paused => "policy paused".to_string(),
            Block::Skip => "node labelled gpunode.dev/skip=true".to_string(),
            Block::Conflict(others) => format!("node also selected by {}", others.join(", ")),
            Block::CircuitOpen => "circuit breaker open".to_string(),
            Block::Budget => "disruption budget exhausted".to_string(),
            Block::OutsideWindow { opens } => {
                format!("outside the maintenance windows; the next opens at {opens}")
            }
            Block::InvalidWindow(why) => format!("no maintenance window can open: {why}"),
            Block::Approval { rungs, command } => {
                format!("waiting for approval of {}: {command}", rungs.join(", "))
            }
            Block::Validations(n) => {
                format!("{n} of the policy's nodes are validating already (maxConcurrent)")
            }
            Block::ValidationsThisHour(n) => {
                format!("{n} periodic validations started within the last hour (maxPerHour)")
            }
        }
    }
}

/// A step of the plan that admission is asked about.
#[derive(Clone, Copy, Debug)]
pub enum Step<'a> {
    /// Undo what gpunode has in effect on the node (a taint, the cordon, the drain, a GPU's
    /// quarantine) once the ladder no longer wants it: never limited, but nothing is written
    /// where nothing may be.
    Undo,
    /// Take rungs of the ladder whose rules require a person's approval (`requireApproval`).
    /// Asked before anything else of their actions, and of no count: an action waiting for a
    /// person is not wanted yet.
    Rungs(&'a [String]),
    /// Add one of the ladder's actions: a taint, the cordon, the drain, a GPU's quarantine.
    Action(&'a Action),
    /// Start a repair step (on a drained node, or of quarantined GPUs).
    Repair {
        /// The step's name (the rung a person approves it by).
        step: &'a str,
        /// It requires a person's approval (`requireApproval`); false to ask only what holds
        /// disruption on the node (a step listed as waiting behind a held drain).
        approval: bool,
    },
    /// Start a validation before an undo (`spec.validation`).
    Validation,
    /// Start a periodic validation of an idle node (`spec.validation.periodic`).
    PeriodicValidation,
}

/// What admission knows of one node: its view, and what the pass learned of it.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    /// The node's view: its skip label, conflicts, approvals and validation record.
    pub view: &'a NodeView,
    /// It holds a slot of the budget: something disruptive of gpunode's is in effect on it now
    /// or was admitted in this pass.
    pub holds_slot: bool,
    /// It drifts in a class the policy calls urgent: the windows do not hold it.
    pub urgent: bool,
    /// A validation before an undo is due on it.
    pub due: bool,
    /// When its oldest active drift began.
    pub since: Option<Timestamp>,
}

impl<'a> Candidate<'a> {
    /// A node of which nothing is known yet but its view.
    pub fn new(view: &'a NodeView) -> Candidate<'a> {
        Candidate {
            view,
            holds_slot: false,
            urgent: false,
            due: false,
            since: None,
        }
    }

    /// A validation runs on the node and counts against the budget and `maxConcurrent`: one
    /// before an undo that is still due, or a periodic one.
    fn validating(&self) -> bool {
        let track = self.view.markers.validation.as_ref();
        track.is_some_and(|t| t.ended.is_none() && (self.due || t.periodic))
    }
}

/// The gates, each answered by one arm of `Admission::gate`.
#[derive(Clone, Copy, Debug)]
enum Gate {
    Skip,
    Paused,
    DryRun,
    Approval,
    Conflict,
    Breaker,
    Window,
    Budget,
    Validations,
    ValidationsThisHour,
}

/// The pass's admission: the policy-level facts, and what the pass has admitted so far.
#[derive(Clone, Debug)]
pub struct Admission {
    paused: bool,
    dry_run: bool,
    window: WindowState,
    matched: u32,
    budget_allowed: u32,
    breaker_percent: u32,
    breaker_window: SignedDuration,
    max_validations: u32,
    max_per_hour: u32,
    now: Timestamp,
    hour_ago: Timestamp,
    /// Nodes holding a slot of the budget.
    in_use: u32,
    /// Nodes that began drifting within the breaker's window.
    recently_drifted: u32,
    /// Validations running (counted against `maxConcurrent`).
    validations: u32,
    /// Periodic validations started within the last hour.
    started_last_hour: u32,
}

impl Admission {
    /// The facts of `policy` over its `matched` nodes at `now`; no node is counted yet
    /// ([`Admission::count`] each).
    pub fn new(policy: &GpuNodePolicySpec, matched: usize, now: Timestamp) -> Admission {
        let matched = u32::try_from(matched).unwrap_or(u32::MAX);
        let validation = policy.validation.as_ref();
        Admission {
            paused: policy.paused,
            dry_run: policy.dry_run,
            window: windows::state(policy.maintenance.as_ref(), now),
            matched,
            budget_allowed: policy.disruption.max_unavailable.resolve(matched),
            breaker_percent: policy.disruption.circuit_breaker.max_drifted_percent,
            breaker_window: signed(policy.disruption.circuit_breaker.window),
            max_validations: validation.map_or(0, |v| v.max_concurrent),
            max_per_hour: validation
                .and_then(|v| v.periodic.as_ref())
                .map_or(0, |p| p.max_per_hour),
            now,
            hour_ago: now.checked_sub(SignedDuration::from_hours(1)).unwrap_or(now),
            in_use: 0,
            recently_drifted: 0,
            validations: 0,
            started_last_hour: 0,
        }
    }

    /// Counts one node of the policy, as it stands before the pass admits anything: whether it
    /// holds a slot of the budget, began drifting recently, and is validating. Each node once,
    /// before any step but [`Step::Rungs`] is asked.
    pub fn count(&mut self, node: &Candidate<'_>) {
        let validating = node.validating();
        if node.holds_slot || validating {
            self.in_use = self.in_use.saturating_add(1);
        }
        if validating {
            self.validations = self.validations.saturating_add(1);
        }
        let track = node.view.markers.validation.as_ref();
        if track.is_some_and(|t| t.periodic && t.started > self.hour_ago) {
            self.started_last_hour = self.started_last_hour.saturating_add(1);
        }
        if node
            .since
            .is_some_and(|s| elapsed(self.now, s) <= self.breaker_window)
        {
            self.recently_drifted = self.recently_drifted.saturating_add(1);
        }
    }

    /// May `node` start `step` now? `None`: it may; otherwise what holds it back, the first of
    /// the step's gates (in this order) that does.
    pub fn may(&self, node: &Candidate<'_>, step: Step<'_>) -> Option<Block> {
        use Gate::*;
        let gates: &[Gate] = match step {
            Step::Undo => &[Skip, Paused, DryRun],
            Step::Rungs(_) => &[Approval],
            Step::Action(a) if !a.is_disruptive() => &[Skip, Paused, DryRun],
            Step::Action(_) => &[Skip, Paused, DryRun, Conflict, Breaker, Window, Budget],
            Step::Repair { .. } => &[Skip, Paused, DryRun, Conflict, Breaker, Window, Approval],
            Step::Validation => &[Skip, Paused, DryRun, Conflict, Breaker, Budget, Validations],
            Step::PeriodicValidation => &[
                Skip,
                Paused,
                DryRun,
                Conflict,
                Breaker,
                Budget,
                Window,
                Validations,
                ValidationsThisHour,
            ],
        };
        gates.iter().find_map(|g| self.gate(*g, node, step))
    }

    /// Records that `node` started `step`: a disruptive action or a validation takes a slot of
    /// the budget if the node holds none; a validation counts against `maxConcurrent`, a
    /// periodic one against `maxPerHour` too.
    pub fn started(&mut self, node: &mut Candidate<'_>, step: Step<'_>) {
        match step {
            Step::Action(a) if a.is_disruptive() => self.take_slot(node),
            Step::Validation => {
                self.validations = self.validations.saturating_add(1);
                self.take_slot(node);
            }
            Step::PeriodicValidation => {
                self.validations = self.validations.saturating_add(1);
                self.started_last_hour = self.started_last_hour.saturating_add(1);
                self.take_slot(node);
            }
            _ => {}
        }
    }

    fn take_slot(&mut self, node: &mut Candidate<'_>) {
        if !node.holds_slot {
            self.in_use = self.in_use.saturating_add(1);
            node.holds_slot = true;
        }
    }

    /// Whether `gate` holds `step` of `node`, and why.
    fn gate(&self, gate: Gate, node: &Candidate<'_>, step: Step<'_>) -> Option<Block> {
        let view = node.view;
        match gate {
            Gate::Skip => view.skip.then_some(Block::Skip),
            Gate::Paused => self.paused.then_some(Block::Paused),
            Gate::DryRun => self.dry_run.then_some(Block::DryRun),
            Gate::Approval => approval(view, step),
            Gate::Conflict => (!view.conflicts.is_empty()).then(|| Block::Conflict(view.conflicts.clone())),
            Gate::Breaker => self.circuit_open().then_some(Block::CircuitOpen),
            Gate::Window if node.urgent => None,
            Gate::Window => match &self.window {
                WindowState::Open => None,
                WindowState::Closed { opens } => Some(Block::OutsideWindow { opens: *opens }),
                WindowState::Invalid(why) => Some(Block::InvalidWindow(why.clone())),
            },
            Gate::Budget => (!node.holds_slot && self.in_use >= self.budget_allowed).then_some(Block::Budget),
            Gate::Validations => {
                (self.validations >= self.max_validations).then_some(Block::Validations(self.max_validations))
            }
            Gate::ValidationsThisHour => (self.started_last_hour >= self.max_per_hour)
                .then_some(Block::ValidationsThisHour(self.max_per_hour)),
        }
    }

    /// The circuit breaker is open: more than `maxDriftedPercent` of the nodes began drifting
    /// within its window. A single drifting node is a node fault, never a systemic one: the
    /// threshold is at least 1.
    pub fn circuit_open(&self) -> bool {
        let threshold = (u64::from(self.breaker_percent) * u64::from(self.matched) / 100).max(1);
        self.breaker_percent < 100 && u64::from(self.recently_drifted) > threshold
    }

    /// Nodes that may be disrupted at once.
    pub fn budget_allowed(&self) -> u32 {
        self.budget_allowed
    }

    /// Nodes holding a slot of the budget, with what this pass admitted.
    pub fn budget_in_use(&self) -> u32 {
        self.in_use
    }

    /// Nodes that began drifting within the breaker's window.
    pub fn recently_drifted(&self) -> u32 {
        self.recently_drifted
    }

    /// Where the maintenance windows stand.
    pub fn window(&self) -> &WindowState {
        &self.window
    }
}

/// The rungs of `step` that `node` has no approval for, with the command that approves them.
fn approval(node: &NodeView, step: Step<'_>) -> Option<Block> {
    let asked: BTreeSet<&str> = match step {
        Step::Rungs(rungs) => rungs.iter().map(String::as_str).collect(),
        Step::Repair { step, approval: true } => BTreeSet::from([step]),
        _ => BTreeSet::new(),
    };
    let rungs: Vec<String> = asked
        .into_iter()
        .filter(|r| !node.approved.contains(*r))
        .map(str::to_string)
        .collect();
    if rungs.is_empty() {
        return None;
    }
    let command = approve_command(&node.name, &node.approved, &rungs);
    Some(Block::Approval { rungs, command })
}

/// The command that approves `rungs` on `node`, keeping what is approved already.
pub fn approve_command(node: &str, approved: &BTreeSet<String>, rungs: &[String]) -> String {
    let all: BTreeSet<&str> = approved
        .iter()
        .map(String::as_str)
        .chain(rungs.iter().map(String::as_str))
        .collect();
    format!(
        "kubectl annotate --overwrite node {node} {APPROVE_ANNOTATION}={}",
        all.into_iter().collect::<Vec<_>>().join(",")
    )
}

#[cfg(test)]
mod tests {
    use gpunode_crds::policy::TaintEffect;
    use serde_json::json;

    use super::*;
    use crate::{markers::DriftTaint, verdict::Verdict};

    fn now() -> Timestamp {
        "2026-12-02T12:00:00Z".parse().unwrap()
    }

    fn policy(spec: serde_json::Value) -> GpuNodePolicySpec {
        serde_json::from_value(spec).unwrap()
    }

    fn view(name: &str) -> NodeView {
        NodeView::new(name, Verdict::new(Vec::new(), Vec::new()))
    }

    fn taint(effect: TaintEffect) -> Action {
        Action::Taint(DriftTaint {
            effect,
            value: "thermal".to_string(),
        })
    }

    #[test]
    fn skip_pause_and_dry_run_hold_every_step_but_a_rung_awaiting_approval() {
        let mut skipped = view("a");
        skipped.skip = true;
        let node = Candidate::new(&skipped);
        let admission = Admission::new(&policy(json!({})), 1, now());
        let rungs = ["Drain".to_string()];
        for step in [
            Step::Undo,
            Step::Action(&taint(TaintEffect::PreferNoSchedule)),
            Step::Action(&Action::Drain),
            Step::Repair {
                step: "reboot",
                approval: true,
            },
            Step::Validation,
            Step::PeriodicValidation,
        ] {
            assert_eq!(admission.may(&node, step), Some(Block::Skip), "{step:?}");
        }
        assert!(matches!(
            admission.may(&node, Step::Rungs(&rungs)),
            Some(Block::Approval { .. })
        ));

        let paused = Admission::new(&policy(json!({"paused": true, "dryRun": true})), 1, now());
        let free = view("b");
        assert_eq!(
            paused.may(&Candidate::new(&free), Step::Undo),
            Some(Block::Paused)
        );
    }

    #[test]
    fn a_full_budget_holds_disruption_of_a_node_without_a_slot_only() {
        let spec = policy(json!({"disruption": {"maxUnavailable": 1}}));
        let mut admission = Admission::new(&spec, 2, now());
        let (a, b) = (view("a"), view("b"));
        let mut first = Candidate::new(&a);
        let second = Candidate::new(&b);
        let drain = Step::Action(&Action::Drain);
        assert_eq!(admission.may(&first, drain), None);
        admission.started(&mut first, drain);
        assert_eq!(admission.budget_in_use(), 1);
        assert_eq!(admission.may(&second, drain), Some(Block::Budget));
        assert_eq!(
            admission.may(&first, Step::Action(&Action::Cordon)),
            None,
            "holds its slot"
        );
        let hint = Step::Action(&taint(TaintEffect::PreferNoSchedule));
        assert_eq!(admission.may(&second, hint), None, "a hint takes no capacity");
        let repair = Step::Repair {
            step: "reboot",
            approval: false,
        };
        assert_eq!(
            admission.may(&second, repair),
            None,
            "a drained node holds its slot"
        );
    }

    #[test]
    fn a_repair_step_waits_for_the_window_before_its_approval_and_on_an_urgent_node_for_its_approval_only() {
        let spec = policy(json!({"maintenance": {
            "windows": [{"days": ["Sat"], "start": "22:00", "end": "23:00", "timeZone": "UTC"}],
            "urgentClasses": ["Xid"],
        }}));
        let admission = Admission::new(&spec, 1, now());
        let v = view("a");
        let mut node = Candidate::new(&v);
        let repair = Step::Repair {
            step: "replace",
            approval: true,
        };
        let opens: Timestamp = "2026-12-05T22:00:00Z".parse().unwrap();
        assert_eq!(admission.may(&node, repair), Some(Block::OutsideWindow { opens }));
        assert_eq!(
            admission.may(&node, Step::Validation),
            Some(Block::Validations(0))
        );
        node.urgent = true;
        let Some(Block::Approval { rungs, command }) = admission.may(&node, repair) else {
            panic!("an urgent node's step still waits for its approval");
        };
        assert_eq!(rungs, vec!["replace".to_string()]);
        assert!(command.ends_with("gpunode.dev/approve=replace"), "{command}");
    }

    #[test]
    fn validations_count_against_max_concurrent_and_periodic_ones_against_max_per_hour() {
        let spec = policy(json!({
            "disruption": {"maxUnavailable": 5},
            "validation": {"namespace": "v", "maxConcurrent": 2, "template": {},
                           "periodic": {"every": "1h", "maxPerHour": 1}},
        }));
        let mut admission = Admission::new(&spec, 3, now());
        let (a, b, c) = (view("a"), view("b"), view("c"));
        let (mut a, mut b, c) = (Candidate::new(&a), Candidate::new(&b), Candidate::new(&c));
        assert_eq!(admission.may(&a, Step::PeriodicValidation), None);
        admission.started(&mut a, Step::PeriodicValidation);
        assert_eq!(
            admission.may(&b, Step::PeriodicValidation),
            Some(Block::ValidationsThisHour(1))
        );
        assert_eq!(admission.may(&b, Step::Validation), None);
        admission.started(&mut b, Step::Validation);
        assert_eq!(admission.may(&c, Step::Validation), Some(Block::Validations(2)));
        assert_eq!(admission.budget_in_use(), 2, "each validating node holds a slot");
    }

    #[test]
    fn the_breaker_opens_past_its_percentage_and_never_for_one_node() {
        let spec = policy(json!({"disruption": {"circuitBreaker": {"maxDriftedPercent": 10}}}));
        let views: Vec<NodeView> = (0..3).map(|i| view(&format!("n{i}"))).collect();
        let drifting = |v| Candidate {
            since: Some(now()),
            ..Candidate::new(v)
        };
        let mut one = Admission::new(&spec, 3, now());
        one.count(&drifting(&views[0]));
        assert!(!one.circuit_open(), "one drifting node is a node fault");
        let mut two = one.clone();
        two.count(&drifting(&views[1]));
        assert!(two.circuit_open());
        let drain = Step::Action(&Action::Drain);
        assert_eq!(
            two.may(&Candidate::new(&views[2]), drain),
            Some(Block::CircuitOpen)
        );
    }
}
