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
//!   the breaker is open. It opens when more than `maxDriftedPercent` of the nodes (and more than
//!   one) began drifting within `window` (drifts that began before it last closed not counted),
//!   and then latches: it stays open, whatever the window, until a person closes that trip
//!   (`gpunode.dev/close-breaker` set to its `openedAt`) or, with `reset: Automatic`, until no
//!   more than the threshold of nodes are drifted. Where it stood comes in as an input
//!   ([`BreakerState`], from the policy status) and goes out as [`Admission::breaker`].
//! - **Windows** hold a disruptive action, a repair step and a periodic validation outside the
//!   maintenance windows, unless the node drifts in an urgent class. A validation before an
//!   undo is not held by them: it ends a disruption.
//! - **Budget.** A node that holds no slot (nothing disruptive of gpunode's is in effect on it,
//!   no validation runs on it) takes one only while fewer than `maxUnavailable` of the policy's
//!   nodes hold one. A repair step runs on a drained node, which holds its slot already.
//! - **Validations.** At most `maxConcurrent` run at once; periodic ones start at most
//!   `maxPerHour` an hour.
//! - **Fleet cap.** Where the operator caps disruption fleet-wide ([`Fleet`]), a node that is
//!   available now takes a disruptive step or a validation only while fewer than the cap of
//!   the GPU nodes (every policy's) are unavailable, counting those this pass took. A node that
//!   is unavailable already (cordoned by a person, NotReady) adds nothing and is not held.
//!
//! Pure. It may import the layers below it (view, output, hysteresis, windows), never a feature
//! planner, the node plan or the pass: they ask it.

use std::{cell::Cell, collections::BTreeSet};

use gpunode_crds::{
    GpuNodePolicySpec,
    policy::{APPROVE_ANNOTATION, BreakerClosedBy, BreakerReset, CLOSE_BREAKER_ANNOTATION},
};
use jiff::{SignedDuration, Timestamp};

use super::{
    hysteresis::{elapsed, signed},
    output::Action,
    view::{BreakerState, Fleet, NodeView, PassInputs},
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
    /// The circuit breaker is open: it stays open until closed.
    CircuitOpen {
        /// How it closes: the command a person runs (and, with `reset: Automatic`, when).
        close: String,
    },
    /// `maxUnavailable` nodes are already disrupted.
    Budget,
    /// The operator's fleet-wide cap: `allowed` GPU nodes (every policy's) are unavailable.
    FleetCap {
        /// GPU nodes unavailable now, with those taken by passes not yet written.
        unavailable: u32,
        /// The cap.
        allowed: u32,
    },
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
            Block::CircuitOpen { close } => format!("circuit breaker open; {close}"),
            Block::Budget => "disruption budget exhausted".to_string(),
            Block::FleetCap { unavailable, allowed } => format!(
                "fleet-wide disruption cap reached: {unavailable} GPU nodes unavailable, at most {allowed} (operator --fleet-max-unavailable)"
            ),
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
    pub(super) fn validating(&self) -> bool {
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
    FleetCap,
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
    breaker_reset: BreakerReset,
    /// Where the breaker stood before the pass.
    breaker_before: BreakerState,
    /// A person closes the open trip in this pass.
    closing: bool,
    /// Drifts that began at or before it are not counted (the breaker closed then).
    counted_after: Option<Timestamp>,
    /// The policy's name, for the command that closes the breaker.
    name: String,
    /// How the breaker closes (set by [`Admission::settle`]).
    close_command: String,
    fleet: Option<Fleet>,
    /// Nodes this pass took that were available: they count against the fleet cap.
    fleet_taken: Vec<String>,
    max_validations: u32,
    max_per_hour: u32,
    now: Timestamp,
    hour_ago: Timestamp,
    /// Nodes holding a slot of the budget.
    in_use: u32,
    /// Nodes that began drifting within the breaker's window (and after it last closed).
    recently_drifted: u32,
    /// When each of those began.
    recent_starts: Vec<Timestamp>,
    /// Nodes drifting now.
    drifting: u32,
    /// Validations running (counted against `maxConcurrent`).
    validations: u32,
    /// Periodic validations started within the last hour.
    started_last_hour: u32,
    /// A step asked since [`Admission::take_consulted`] read the counts that other nodes change
    /// (the budget, the fleet cap, the validations), or started something that changes them: its
    /// answer may differ when another node's does (the incremental pass asks it again).
    consulted: Cell<bool>,
}

/// The counts of a policy's nodes that admission holds steps against, as
/// [`Admission::count`] would make them: the incremental pass keeps them up to date as nodes
/// change instead of counting every node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Nodes holding a slot of the budget (something disruptive in effect, or validating).
    pub in_use: u32,
    /// Validations running.
    pub validations: u32,
    /// Periodic validations started within the last hour.
    pub started_last_hour: u32,
    /// Nodes drifting now.
    pub drifting: u32,
    /// When each node that counts against the breaker began drifting (within its window, after
    /// it last closed).
    pub recent_starts: Vec<Timestamp>,
}

impl Admission {
    /// The facts of `policy` over its `matched` nodes at `now`, with no input besides; no node
    /// is counted yet ([`Admission::count`] each).
    pub fn new(policy: &GpuNodePolicySpec, matched: usize, now: Timestamp) -> Admission {
        Admission::with_inputs("", policy, matched, &PassInputs::default(), now)
    }

    /// The facts of policy `name` (`policy`) over its `matched` nodes at `now`, with where its
    /// breaker stood and the fleet cap (`inputs`); no node is counted yet.
    pub fn with_inputs(
        name: &str,
        policy: &GpuNodePolicySpec,
        matched: usize,
        inputs: &PassInputs,
        now: Timestamp,
    ) -> Admission {
        let matched = u32::try_from(matched).unwrap_or(u32::MAX);
        let validation = policy.validation.as_ref();
        let breaker = &policy.disruption.circuit_breaker;
        let before = inputs.breaker.clone();
        let closing = before.open
            && before.opened_at.is_some()
            && inputs.close_breaker.map(seconds) == before.opened_at.map(seconds);
        let counted_after = if closing { Some(now) } else { before.closed_at };
        Admission {
            breaker_reset: breaker.reset,
            name: name.to_string(),
            close_command: close_command(name, breaker.reset, before.opened_at),
            breaker_before: before,
            closing,
            counted_after,
            fleet: inputs.fleet.clone(),
            fleet_taken: Vec::new(),
            recent_starts: Vec::new(),
            drifting: 0,
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
            consulted: Cell::new(false),
        }
    }

    /// Takes the counts of every node at once, instead of [`Admission::count`] each (the
    /// incremental pass, which keeps them).
    pub fn set_counts(&mut self, counts: Counts) {
        self.in_use = counts.in_use;
        self.validations = counts.validations;
        self.started_last_hour = counts.started_last_hour;
        self.drifting = counts.drifting;
        self.recently_drifted = u32::try_from(counts.recent_starts.len()).unwrap_or(u32::MAX);
        self.recent_starts = counts.recent_starts;
    }

    /// A drift that began at `since` counts against the breaker now: within its window and
    /// after it last closed.
    pub fn counts_as_recent(&self, since: Timestamp) -> bool {
        let after_close = self.counted_after.is_none_or(|c| since > c);
        after_close && elapsed(self.now, since) <= self.breaker_window
    }

    /// A periodic validation started at `started` counts against `maxPerHour` now.
    pub fn counts_this_hour(&self, started: Timestamp) -> bool {
        started > self.hour_ago
    }

    /// Whether a step asked since the last call read or changed the counts other nodes change
    /// (the budget, the fleet cap, the validations); clears it.
    pub fn take_consulted(&self) -> bool {
        self.consulted.replace(false)
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
        if track.is_some_and(|t| t.periodic && self.counts_this_hour(t.started)) {
            self.started_last_hour = self.started_last_hour.saturating_add(1);
        }
        let Some(since) = node.since else { return };
        self.drifting = self.drifting.saturating_add(1);
        if self.counts_as_recent(since) {
            self.recently_drifted = self.recently_drifted.saturating_add(1);
            self.recent_starts.push(since);
        }
    }

    /// Once every node is counted: fixes how the breaker closes (naming its trip).
    pub fn settle(&mut self) {
        let opened_at = self.breaker().opened_at;
        self.close_command = close_command(&self.name, self.breaker_reset, opened_at);
    }

    /// May `node` start `step` now? `None`: it may; otherwise what holds it back, the first of
    /// the step's gates (in this order) that does.
    pub fn may(&self, node: &Candidate<'_>, step: Step<'_>) -> Option<Block> {
        use Gate::*;
        let gates: &[Gate] = match step {
            Step::Undo => &[Skip, Paused, DryRun],
            Step::Rungs(_) => &[Approval],
            Step::Action(a) if !a.is_disruptive() => &[Skip, Paused, DryRun],
            Step::Action(_) => &[Skip, Paused, DryRun, Conflict, Breaker, Window, Budget, FleetCap],
            Step::Repair { .. } => &[Skip, Paused, DryRun, Conflict, Breaker, Window, Approval],
            Step::Validation => &[
                Skip,
                Paused,
                DryRun,
                Conflict,
                Breaker,
                Budget,
                FleetCap,
                Validations,
            ],
            Step::PeriodicValidation => &[
                Skip,
                Paused,
                DryRun,
                Conflict,
                Breaker,
                Budget,
                FleetCap,
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
        if matches!(step, Step::Validation | Step::PeriodicValidation)
            || matches!(step, Step::Action(a) if a.is_disruptive()) && !node.holds_slot
        {
            self.consulted.set(true);
        }
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
            if let Some(f) = &self.fleet
                && !f.unavailable.contains(&node.view.name)
            {
                self.fleet_taken.push(node.view.name.clone());
            }
        }
    }

    /// GPU nodes unavailable fleet-wide with what this pass took, if the fleet is capped.
    fn fleet_unavailable(&self) -> Option<(u32, u32)> {
        let f = self.fleet.as_ref()?;
        let n = f.unavailable.len().saturating_add(self.fleet_taken.len());
        Some((u32::try_from(n).unwrap_or(u32::MAX), f.allowed))
    }

    /// The fleet cap holds a node that holds no slot and is available now.
    fn fleet_cap(&self, node: &Candidate<'_>) -> Option<Block> {
        let f = self.fleet.as_ref()?;
        if node.holds_slot || f.unavailable.contains(&node.view.name) {
            return None;
        }
        let (unavailable, allowed) = self.fleet_unavailable()?;
        (unavailable >= allowed).then_some(Block::FleetCap { unavailable, allowed })
    }

    /// Whether `gate` holds `step` of `node`, and why.
    fn gate(&self, gate: Gate, node: &Candidate<'_>, step: Step<'_>) -> Option<Block> {
        let view = node.view;
        // A node holding a slot is never held by the budget or the fleet cap, whatever they
        // count.
        let counts = match gate {
            Gate::Budget | Gate::FleetCap => !node.holds_slot,
            Gate::Validations | Gate::ValidationsThisHour => true,
            _ => false,
        };
        if counts {
            self.consulted.set(true);
        }
        match gate {
            Gate::Skip => view.skip.then_some(Block::Skip),
            Gate::Paused => self.paused.then_some(Block::Paused),
            Gate::DryRun => self.dry_run.then_some(Block::DryRun),
            Gate::Approval => approval(view, step),
            Gate::Conflict => (!view.conflicts.is_empty()).then(|| Block::Conflict(view.conflicts.clone())),
            Gate::Breaker => self.circuit_open().then(|| Block::CircuitOpen {
                close: self.close_command.clone(),
            }),
            Gate::Window if node.urgent => None,
            Gate::Window => match &self.window {
                WindowState::Open => None,
                WindowState::Closed { opens } => Some(Block::OutsideWindow { opens: *opens }),
                WindowState::Invalid(why) => Some(Block::InvalidWindow(why.clone())),
            },
            Gate::Budget => (!node.holds_slot && self.in_use >= self.budget_allowed).then_some(Block::Budget),
            Gate::FleetCap => self.fleet_cap(node),
            Gate::Validations => {
                (self.validations >= self.max_validations).then_some(Block::Validations(self.max_validations))
            }
            Gate::ValidationsThisHour => (self.started_last_hour >= self.max_per_hour)
                .then_some(Block::ValidationsThisHour(self.max_per_hour)),
        }
    }

    /// Most drifting nodes the breaker allows: `maxDriftedPercent` of the nodes, at least 1 (a
    /// single drifting node is a node fault, never a systemic one).
    pub fn breaker_threshold(&self) -> u32 {
        let t = (u64::from(self.breaker_percent) * u64::from(self.matched) / 100).max(1);
        u32::try_from(t).unwrap_or(u32::MAX)
    }

    /// The breaker trips now: more than the threshold of the nodes began drifting within its
    /// window (and after it last closed).
    fn trips(&self) -> bool {
        self.breaker_percent < 100 && self.recently_drifted > self.breaker_threshold()
    }

    /// The circuit breaker is open: it trips now, or it was open and nobody closed it (nor,
    /// with `reset: Automatic`, did the drifted nodes fall back to the threshold). 100% turns
    /// the breaker off, an open one included.
    pub fn circuit_open(&self) -> bool {
        if self.breaker_percent >= 100 {
            return false;
        }
        if self.trips() {
            return true;
        }
        let before = &self.breaker_before;
        let recovered =
            self.breaker_reset == BreakerReset::Automatic && self.drifting <= self.breaker_threshold();
        before.open && !self.closing && !recovered
    }

    /// Where the breaker stands after this pass, for the policy status: an open trip keeps when
    /// it opened; a new one opened when the drift that crossed the threshold began (so every
    /// pass of one trip names the same time, whatever the status it read).
    pub fn breaker(&self) -> BreakerState {
        let before = &self.breaker_before;
        match (before.open, self.circuit_open()) {
            (true, true) => before.clone(),
            (false, true) => {
                let mut starts = self.recent_starts.clone();
                starts.sort_unstable();
                let index = usize::try_from(self.breaker_threshold()).unwrap_or(usize::MAX);
                let crossed = starts.get(index).copied().unwrap_or(self.now);
                BreakerState {
                    open: true,
                    opened_at: Some(seconds(crossed)),
                    drifted: self.recently_drifted,
                    of: self.matched,
                    ..before.clone()
                }
            }
            (true, false) => BreakerState {
                open: false,
                closed_at: Some(seconds(self.now)),
                closed_by: Some(if self.closing {
                    BreakerClosedBy::Person
                } else {
                    BreakerClosedBy::Recovered
                }),
                ..before.clone()
            },
            (false, false) => before.clone(),
        }
    }

    /// Nodes of the policy that are drifting now.
    pub fn drifting(&self) -> u32 {
        self.drifting
    }

    /// How the breaker closes, in words.
    pub fn close_command(&self) -> &str {
        &self.close_command
    }

    /// The nodes this pass took that were available: another pass must count them until they
    /// are written.
    pub fn fleet_taken(&self) -> &[String] {
        &self.fleet_taken
    }

    /// GPU nodes unavailable fleet-wide with what this pass took, and the cap, if there is one.
    pub fn fleet(&self) -> Option<(u32, u32)> {
        self.fleet_unavailable()
    }

    /// Nodes that may be disrupted at once.
    pub fn budget_allowed(&self) -> u32 {
        self.budget_allowed
    }

    /// Nodes holding a slot of the budget, with what this pass admitted.
    pub fn budget_in_use(&self) -> u32 {
        self.in_use
    }

    /// Nodes that began drifting within the breaker's window (and after it last closed).
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

/// A timestamp to the second: the precision the policy status keeps.
fn seconds(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// How a person closes the breaker of policy `name` opened at `opened_at` (and, with
/// `reset: Automatic`, when it closes by itself).
pub fn close_command(name: &str, reset: BreakerReset, opened_at: Option<Timestamp>) -> String {
    let person = match opened_at {
        Some(at) => format!(
            "close it with: kubectl gpunode close-breaker {name} (or kubectl annotate --overwrite gpunodepolicy {name} {CLOSE_BREAKER_ANNOTATION}={})",
            seconds(at)
        ),
        None => format!("close it with: kubectl gpunode close-breaker {name}"),
    };
    match reset {
        BreakerReset::Manual => format!("it stays open until a person closes it; {person}"),
        BreakerReset::Automatic => {
            format!("it closes once no more than maxDriftedPercent of the nodes are drifted, or {person}")
        }
    }
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

    use std::sync::Arc;

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
        assert!(matches!(
            two.may(&Candidate::new(&views[2]), drain),
            Some(Block::CircuitOpen { .. })
        ));
    }

    fn open_since(at: Timestamp) -> BreakerState {
        BreakerState {
            open: true,
            opened_at: Some(at),
            drifted: 2,
            of: 3,
            ..BreakerState::default()
        }
    }

    /// A breaker that opened an hour ago, with no drift left in its window.
    fn latched(reset: &str, close: Option<Timestamp>) -> Admission {
        let spec =
            policy(json!({"disruption": {"circuitBreaker": {"maxDriftedPercent": 10, "reset": reset}}}));
        let opened: Timestamp = "2026-12-02T11:00:00Z".parse().unwrap();
        let inputs = PassInputs {
            breaker: open_since(opened),
            close_breaker: close,
            fleet: None,
            validation_bounds: None,
        };
        Admission::with_inputs("pool", &spec, 3, &inputs, now())
    }

    #[test]
    fn an_open_breaker_latches_past_its_window_until_a_person_closes_that_trip() {
        let v = view("n0");
        let old = Candidate {
            since: Some("2026-12-02T10:59:00Z".parse().unwrap()),
            ..Candidate::new(&v)
        };
        let mut held = latched("Manual", None);
        held.count(&old);
        held.settle();
        assert!(held.circuit_open(), "no drift within the window, still open");
        let Some(Block::CircuitOpen { close }) = held.may(&Candidate::new(&v), Step::Action(&Action::Drain))
        else {
            panic!("the breaker holds a drain")
        };
        assert!(
            close.contains("kubectl gpunode close-breaker pool")
                && close.contains("gpunode.dev/close-breaker=2026-12-02T11:00:00Z"),
            "{close}"
        );
        assert_eq!(
            held.breaker(),
            open_since("2026-12-02T11:00:00Z".parse().unwrap())
        );

        let stale = latched("Manual", Some("2026-12-01T08:00:00Z".parse().unwrap()));
        assert!(
            stale.circuit_open(),
            "an annotation naming another trip closes nothing"
        );

        let mut closed = latched("Manual", Some("2026-12-02T11:00:00Z".parse().unwrap()));
        closed.count(&old);
        assert!(!closed.circuit_open());
        let after = closed.breaker();
        assert_eq!(
            (after.open, after.closed_at, after.closed_by),
            (false, Some(now()), Some(BreakerClosedBy::Person))
        );
    }

    #[test]
    fn a_closed_breaker_counts_only_drifts_that_began_after_it_closed() {
        let spec = policy(json!({"disruption": {"circuitBreaker": {"maxDriftedPercent": 10}}}));
        let closed_at: Timestamp = "2026-12-02T11:59:00Z".parse().unwrap();
        let inputs = PassInputs {
            breaker: BreakerState {
                closed_at: Some(closed_at),
                ..BreakerState::default()
            },
            ..PassInputs::default()
        };
        let views: Vec<NodeView> = (0..3).map(|i| view(&format!("n{i}"))).collect();
        let mut a = Admission::with_inputs("pool", &spec, 3, &inputs, now());
        for v in &views[..2] {
            a.count(&Candidate {
                since: Some("2026-12-02T11:58:00Z".parse().unwrap()),
                ..Candidate::new(v)
            });
        }
        assert!(!a.circuit_open(), "both began before the close");
        a.count(&Candidate {
            since: Some("2026-12-02T11:59:30Z".parse().unwrap()),
            ..Candidate::new(&views[2])
        });
        assert_eq!(a.recently_drifted(), 1);
    }

    #[test]
    fn an_automatic_breaker_closes_only_once_the_drifted_nodes_fall_to_the_threshold() {
        let views: Vec<NodeView> = (0..2).map(|i| view(&format!("n{i}"))).collect();
        let drifting = |v| Candidate {
            since: Some("2026-12-02T10:00:00Z".parse().unwrap()),
            ..Candidate::new(v)
        };
        let mut manual = latched("Manual", None);
        manual.count(&drifting(&views[0]));
        assert!(manual.circuit_open(), "Manual waits for a person");

        let mut auto = latched("Automatic", None);
        auto.count(&drifting(&views[0]));
        auto.count(&drifting(&views[1]));
        assert!(
            auto.circuit_open(),
            "two of three drift: above the threshold of one"
        );
        let mut auto = latched("Automatic", None);
        auto.count(&drifting(&views[0]));
        assert!(!auto.circuit_open(), "one drifting node is within the threshold");
        assert_eq!(auto.breaker().closed_by, Some(BreakerClosedBy::Recovered));
    }

    #[test]
    fn a_new_trip_opens_when_the_drift_that_crossed_the_threshold_began() {
        let spec = policy(json!({"disruption": {"circuitBreaker": {"maxDriftedPercent": 10}}}));
        let views: Vec<NodeView> = (0..3).map(|i| view(&format!("n{i}"))).collect();
        let mut a = Admission::new(&spec, 3, now());
        for (v, at) in views.iter().zip(["11:55:00.5", "11:57:10.9", "11:58:00"]) {
            a.count(&Candidate {
                since: Some(format!("2026-12-02T{at}Z").parse().unwrap()),
                ..Candidate::new(v)
            });
        }
        let b = a.breaker();
        assert!(b.open);
        assert_eq!(
            b.opened_at,
            Some("2026-12-02T11:57:10Z".parse().unwrap()),
            "the second drift, to the second"
        );
        assert_eq!((b.drifted, b.of), (3, 3));
    }

    fn capped(allowed: u32, unavailable: &[&str]) -> Admission {
        let spec = policy(json!({"disruption": {"maxUnavailable": "100%"}}));
        let inputs = PassInputs {
            fleet: Some(Fleet {
                allowed,
                unavailable: Arc::new(unavailable.iter().map(|s| s.to_string()).collect()),
            }),
            ..PassInputs::default()
        };
        Admission::with_inputs("pool", &spec, 10, &inputs, now())
    }

    #[test]
    fn the_fleet_cap_counts_every_unavailable_node_and_what_the_pass_took() {
        let (a, b, c) = (view("a"), view("b"), view("c"));
        let drain = Step::Action(&Action::Drain);
        // "x" and "y" are another policy's nodes: NotReady, cordoned by a person.
        let mut fleet = capped(3, &["x", "y"]);
        let mut first = Candidate::new(&a);
        assert_eq!(fleet.may(&first, drain), None);
        fleet.started(&mut first, drain);
        assert_eq!(fleet.fleet_taken(), ["a".to_string()]);
        assert_eq!(
            fleet.may(&Candidate::new(&b), drain),
            Some(Block::FleetCap {
                unavailable: 3,
                allowed: 3
            })
        );
        assert_eq!(
            fleet.may(&Candidate::new(&b), Step::Validation),
            Some(Block::FleetCap {
                unavailable: 3,
                allowed: 3
            }),
            "a validation makes a node unavailable too"
        );
        assert_eq!(
            fleet.may(&first, Step::Action(&Action::Cordon)),
            None,
            "a holds its slot"
        );
        let hint = Step::Action(&taint(TaintEffect::PreferNoSchedule));
        assert_eq!(fleet.may(&Candidate::new(&b), hint), None, "a hint takes nothing");

        // A node that is unavailable already (cordoned by someone) adds nothing: not held.
        let fleet = capped(2, &["x", "c"]);
        assert_eq!(fleet.may(&Candidate::new(&c), drain), None);
        assert!(matches!(
            fleet.may(&Candidate::new(&b), drain),
            Some(Block::FleetCap { .. })
        ));
        assert!(
            Block::FleetCap {
                unavailable: 2,
                allowed: 2
            }
            .describe()
            .contains("--fleet-max-unavailable")
        );
    }
}
