//! The incremental pass: a policy's plan kept up to date as its nodes change, planning again
//! only the nodes a change can affect, with the policy-level counts admission needs (slots of
//! the budget, validations, drifting nodes, the breaker's recent drifts) kept as nodes come,
//! change and go instead of counted over every node.
//!
//! A node is planned again at a pass when:
//! - its view changed ([`Incremental::upsert`]), it is new, or the policy changed;
//! - its last plan said it changes with time by now (`NodePlan::next_change`);
//! - its last plan writes bookkeeping the view does not show yet (a plan that starts something
//!   stamps the time of its pass), or looks at an object with no watch (a drain, a repair
//!   step's object, a validation Job);
//! - its last plan read or changed the counts other nodes change (the budget, the fleet cap,
//!   the validations: [`Admission::take_consulted`]), so its answer may differ when theirs do;
//! - anything every node reads changed: the breaker opened or closed, how it closes, the
//!   maintenance windows, the validation template (then every node is).
//!
//! Any other node's plan is what a full pass would make again: its own inputs are the same, the
//! time has not reached its next change, and every gate it asked reads only those and what all
//! nodes read. Nodes planned again are planned in the full pass's order (oldest drift first),
//! so the ones that compete for the budget meet it in the same order. `to_policy_plan` equals
//! [`super::plan_with`] over the same views after every pass: a property test checks it over
//! random sequences of changes (operator/tests/incremental.rs).
//!
//! Pure, as the full pass: the caller says which nodes changed and when it is.

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use gpunode_crds::GpuNodePolicySpec;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::PodTemplateSpec;

use super::{
    NodePlan, PassInputs, PolicyPlan,
    admission::{Admission, Block, Candidate, Counts},
    gpus,
    node::Work,
    output::DrainStep,
    validation,
    view::NodeView,
    windows::WindowState,
    work::{decide, template, want},
};

/// Where a node stands in the admission order: no drift last, then oldest drift first, then
/// by name.
type Key = (bool, Option<Timestamp>, String);

/// What one node adds to the policy's counts, as [`Admission::count`] counts it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Share {
    /// It holds a slot of the budget (or validates).
    slot: bool,
    /// A validation runs on it.
    validating: bool,
    /// When its oldest active drift began.
    since: Option<Timestamp>,
    /// When its periodic validation started, if its record is one.
    periodic: Option<Timestamp>,
}

impl Share {
    fn of(node: &Candidate<'_>) -> Share {
        let validating = node.validating();
        let periodic = node
            .view
            .markers
            .validation
            .as_ref()
            .filter(|t| t.periodic)
            .map(|t| t.started);
        Share {
            slot: node.holds_slot || validating,
            validating,
            since: node.since,
            periodic,
        }
    }
}

/// What every node's plan reads of the policy besides its own node: when it changes, every
/// node is planned again.
#[derive(Clone, Debug, PartialEq)]
struct Shared {
    circuit_open: bool,
    close_command: String,
    window: WindowState,
    template: Result<PodTemplateSpec, String>,
}

/// The policy-level counts of the nodes' shares.
#[derive(Clone, Debug, Default)]
struct Tally {
    in_use: u32,
    validations: u32,
    drifting: u32,
    /// The drifting nodes' drift starts.
    since: BTreeSet<(Timestamp, String)>,
    /// The periodic validations' starts.
    periodic: BTreeSet<(Timestamp, String)>,
}

impl Tally {
    fn add(&mut self, name: &str, s: &Share) {
        self.in_use = self.in_use.saturating_add(u32::from(s.slot));
        self.validations = self.validations.saturating_add(u32::from(s.validating));
        if let Some(since) = s.since {
            self.drifting = self.drifting.saturating_add(1);
            self.since.insert((since, name.to_string()));
        }
        if let Some(at) = s.periodic {
            self.periodic.insert((at, name.to_string()));
        }
    }

    fn remove(&mut self, name: &str, s: &Share) {
        self.in_use = self.in_use.saturating_sub(u32::from(s.slot));
        self.validations = self.validations.saturating_sub(u32::from(s.validating));
        if let Some(since) = s.since {
            self.drifting = self.drifting.saturating_sub(1);
            self.since.remove(&(since, name.to_string()));
        }
        if let Some(at) = s.periodic {
            self.periodic.remove(&(at, name.to_string()));
        }
    }

    /// The counts admission holds steps against at `now`: only the drifts and periodic
    /// validations recent enough are looked at (those a fleet-wide storm adds, at most).
    fn counts(&self, admission: &Admission, window: SignedDuration, now: Timestamp) -> Counts {
        let recent_starts = since_at_most(&self.since, window, now)
            .filter(|t| admission.counts_as_recent(*t))
            .collect();
        let hour = SignedDuration::from_hours(1);
        let started_last_hour = since_at_most(&self.periodic, hour, now)
            .filter(|t| admission.counts_this_hour(*t))
            .count();
        Counts {
            in_use: self.in_use,
            validations: self.validations,
            started_last_hour: u32::try_from(started_last_hour).unwrap_or(u32::MAX),
            drifting: self.drifting,
            recent_starts,
        }
    }
}

/// The times of `set` no longer than `d` (and a second) before `now`, or all of them where
/// that is not a time.
fn since_at_most(
    set: &BTreeSet<(Timestamp, String)>,
    d: SignedDuration,
    now: Timestamp,
) -> impl Iterator<Item = Timestamp> + '_ {
    let from = d
        .checked_add(SignedDuration::from_secs(1))
        .and_then(|d| now.checked_sub(d).ok())
        .unwrap_or(Timestamp::MIN);
    set.range((from, String::new())..).map(|(t, _)| *t)
}

/// One node's entry: its view and its last plan.
struct Entry {
    view: NodeView,
    plan: Option<NodePlan>,
}

/// A policy's plan, kept up to date incrementally (see the module's documentation).
pub struct Incremental {
    name: String,
    policy: Arc<GpuNodePolicySpec>,
    nodes: BTreeMap<String, Entry>,
    /// What each node adds to the counts and where it stands in the order, as last planned.
    shares: BTreeMap<String, (Share, Key)>,
    order: BTreeSet<Key>,
    tally: Tally,
    /// Nodes planned again at the next pass whatever else: changed, new, or the policy did.
    dirty: BTreeSet<String>,
    /// Nodes whose last plan read or changed the counts other nodes change.
    contenders: BTreeSet<String>,
    /// Nodes whose last plan writes bookkeeping not read back yet, or polls an object.
    busy: BTreeSet<String>,
    /// Nodes whose last plan polls an object with no watch (a drain, a repair step's object, a
    /// validation Job).
    polling: BTreeSet<String>,
    /// When each node's last plan changes with time alone.
    due: BTreeSet<(Timestamp, String)>,
    /// Last plans held back by the budget and by the fleet cap.
    budget_queued: u32,
    fleet_queued: u32,
    shared: Option<Shared>,
    /// The policy-level decisions of the last pass (no node, nobody queued).
    decided: PolicyPlan,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// The nodes planned again, in the order they were planned: only their plans may differ
    /// from the last pass's.
    pub planned: Vec<String>,
    /// Every node was planned again (the first pass, a policy change, or something every node
    /// reads changed).
    pub whole: bool,
}

impl Incremental {
    /// Policy `name` (`policy`) with no node yet.
    pub fn new(name: &str, policy: GpuNodePolicySpec) -> Incremental {
        Incremental {
            name: name.to_string(),
            policy: Arc::new(policy),
            nodes: BTreeMap::new(),
            shares: BTreeMap::new(),
            order: BTreeSet::new(),
            tally: Tally::default(),
            dirty: BTreeSet::new(),
            contenders: BTreeSet::new(),
            busy: BTreeSet::new(),
            polling: BTreeSet::new(),
            due: BTreeSet::new(),
            budget_queued: 0,
            fleet_queued: 0,
            shared: None,
            decided: PolicyPlan::default(),
        }
    }

    /// The policy changed: every node is planned again at the next pass. The same spec changes
    /// nothing.
    pub fn set_policy(&mut self, policy: GpuNodePolicySpec) {
        if *self.policy != policy {
            self.policy = Arc::new(policy);
            self.shared = None;
        }
    }

    /// A node the policy selects, new or changed: it is planned again at the next pass.
    pub fn upsert(&mut self, view: NodeView) {
        let name = view.name.clone();
        match self.nodes.get_mut(&name) {
            Some(e) => e.view = view,
            None => {
                self.nodes.insert(name.clone(), Entry { view, plan: None });
            }
        }
        self.dirty.insert(name);
    }

    /// A node the policy no longer selects (or that is gone): its plan and counts go with it.
    pub fn remove(&mut self, name: &str) {
        let Some(e) = self.nodes.remove(name) else {
            return;
        };
        if let Some((share, key)) = self.shares.remove(name) {
            self.tally.remove(name, &share);
            self.order.remove(&key);
        }
        if let Some(p) = &e.plan {
            self.forget_plan(name, p);
        }
        self.dirty.remove(name);
    }

    /// The nodes the policy selects.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// No node is selected.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The last plan of node `name`.
    pub fn plan(&self, name: &str) -> Option<&NodePlan> {
        self.nodes.get(name).and_then(|e| e.plan.as_ref())
    }

    /// Plans again what may have changed by `now` (see the module's documentation).
    pub fn pass(&mut self, inputs: &PassInputs, now: Timestamp) -> Pass {
        let policy = Arc::clone(&self.policy);
        let name = self.name.clone();
        let mut admission = Admission::with_inputs(&name, &policy, self.nodes.len(), inputs, now);
        let template = template(&policy, inputs);
        let window = super::hysteresis::signed(policy.disruption.circuit_breaker.window);
        let gpu_handled = gpus::handled(&policy);
        let mut whole = self.shared.is_none();
        let first: Vec<String> = if whole {
            self.nodes.keys().cloned().collect()
        } else {
            self.due_now(now)
        };
        // The views are borrowed for the whole pass; the counts, the order and the shares are
        // kept beside them and updated as each node is looked at.
        let nodes = &self.nodes;
        let vp = policy.validation.as_ref();
        let views: Vec<Cow<'_, NodeView>> = first
            .iter()
            .filter_map(|n| nodes.get(n))
            .map(|e| validation::with_failure(vp, &e.view, now))
            .collect();
        let mut works: Vec<Work<'_>> = views
            .iter()
            .map(|v| want(&policy, &admission, v, &gpu_handled, now))
            .collect();
        for w in &works {
            keep_share(&mut self.tally, &mut self.order, &mut self.shares, w);
        }
        admission.set_counts(self.tally.counts(&admission, window, now));
        admission.settle();
        // What every node reads changed: every node is planned.
        let rest: Vec<Cow<'_, NodeView>>;
        if !whole && self.shared.as_ref() != Some(&shared_of(&admission, &template)) {
            whole = true;
            let looked: BTreeSet<&str> = first.iter().map(String::as_str).collect();
            rest = nodes
                .iter()
                .filter(|(n, _)| !looked.contains(n.as_str()))
                .map(|(_, e)| validation::with_failure(vp, &e.view, now))
                .collect();
            let more: Vec<Work<'_>> = rest
                .iter()
                .map(|v| want(&policy, &admission, v, &gpu_handled, now))
                .collect();
            for w in &more {
                keep_share(&mut self.tally, &mut self.order, &mut self.shares, w);
            }
            works.extend(more);
            admission.set_counts(self.tally.counts(&admission, window, now));
            admission.settle();
        }
        // The full pass's order, restricted to the nodes planned.
        let mut order: Vec<(Key, usize)> = works.iter().enumerate().map(|(i, w)| (key_of(w), i)).collect();
        order.sort_unstable();
        let template_ref = template.as_ref().map_err(String::as_str);
        let mut planned = Vec::with_capacity(order.len());
        for (_, i) in order {
            let Some(w) = works.get_mut(i) else { continue };
            admission.take_consulted();
            let plan = decide(&name, &policy, &mut admission, template_ref, w, now);
            planned.push((plan, admission.take_consulted()));
        }
        drop(works);
        drop(views);
        self.decided = PolicyPlan::decided(&admission, template.as_ref().err().map(String::as_str));
        self.shared = Some(shared_of(&admission, &template));
        self.dirty.clear();
        let mut out = Pass {
            planned: Vec::with_capacity(planned.len()),
            whole,
        };
        for (plan, consulted) in planned {
            let node = plan.node.clone();
            self.keep_plan(&node, plan, consulted);
            out.planned.push(node);
        }
        out
    }

    /// The whole plan, as [`super::plan_with`] makes it: every node's last plan in the
    /// admission order, with the policy-level results of the last pass.
    pub fn to_policy_plan(&self) -> PolicyPlan {
        let mut p = self.summary_plan();
        p.nodes = self.plans().cloned().collect();
        p
    }

    /// The nodes the next pass at `now` plans again besides those that changed: their plan
    /// changes with time by then, writes bookkeeping not read back, polls an object, or competes
    /// for the counts. Their views should be looked at afresh (a verdict may change with time).
    pub fn wanted(&self, now: Timestamp) -> Vec<String> {
        self.due_now(now)
    }

    /// The names of the nodes held.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// Every node's last plan, in the admission order.
    pub fn plans(&self) -> impl Iterator<Item = &NodePlan> {
        self.order
            .iter()
            .filter_map(|(.., n)| self.nodes.get(n).and_then(|e| e.plan.as_ref()))
    }

    /// The first time any node's last plan changes with time alone.
    pub fn next_change(&self) -> Option<super::NextChange> {
        let (_, name) = self.due.first()?;
        self.plan(name).and_then(|p| p.next_change)
    }

    /// Some node's last plan polls an object with no watch.
    pub fn polls(&self) -> bool {
        !self.polling.is_empty()
    }

    /// The last pass's plan of only the nodes it planned (`pass`), in the order planned, with
    /// the policy-level results: what is to be applied.
    pub fn partial(&self, pass: &Pass) -> PolicyPlan {
        let mut p = self.summary_plan();
        p.nodes = pass
            .planned
            .iter()
            .filter_map(|n| self.plan(n).cloned())
            .collect();
        p
    }

    /// The policy-level results of the last pass, with no node.
    fn summary_plan(&self) -> PolicyPlan {
        PolicyPlan {
            budget_queued: self.budget_queued,
            fleet_queued: self.fleet_queued,
            ..self.decided.clone()
        }
    }

    /// The nodes planned again whatever else: dirty, due by `now`, busy, contending.
    fn due_now(&self, now: Timestamp) -> Vec<String> {
        let mut names: BTreeSet<String> = self.dirty.clone();
        names.extend(self.busy.iter().cloned());
        names.extend(self.contenders.iter().cloned());
        names.extend(
            self.due
                .iter()
                .take_while(|(at, _)| *at <= now)
                .map(|(_, n)| n.clone()),
        );
        names.into_iter().collect()
    }

    fn keep_plan(&mut self, name: &str, plan: NodePlan, consulted: bool) {
        let old = self.nodes.get_mut(name).and_then(|e| e.plan.take());
        if let Some(old) = &old {
            self.forget_plan(name, old);
        }
        let Some(e) = self.nodes.get_mut(name) else {
            return;
        };
        if consulted {
            self.contenders.insert(name.to_string());
        }
        if polls(&plan) {
            self.polling.insert(name.to_string());
            self.busy.insert(name.to_string());
        }
        if plan.markers != e.view.markers {
            self.busy.insert(name.to_string());
        }
        if let Some(c) = plan.next_change {
            self.due.insert((c.at, name.to_string()));
        }
        match plan.blocked {
            Some(Block::Budget) => self.budget_queued = self.budget_queued.saturating_add(1),
            Some(Block::FleetCap { .. }) => self.fleet_queued = self.fleet_queued.saturating_add(1),
            _ => {}
        }
        e.plan = Some(plan);
    }

    /// Takes `plan`, node `name`'s last, out of what is kept of the plans.
    fn forget_plan(&mut self, name: &str, plan: &NodePlan) {
        self.contenders.remove(name);
        self.busy.remove(name);
        self.polling.remove(name);
        if let Some(c) = plan.next_change {
            self.due.remove(&(c.at, name.to_string()));
        }
        match plan.blocked {
            Some(Block::Budget) => self.budget_queued = self.budget_queued.saturating_sub(1),
            Some(Block::FleetCap { .. }) => self.fleet_queued = self.fleet_queued.saturating_sub(1),
            _ => {}
        }
    }
}

/// A plan that looks at an object with no watch: it is planned again at each pass.
fn polls(p: &NodePlan) -> bool {
    matches!(p.drain, DrainStep::Run { .. })
        || p.evicts_gpu_holders()
        || p.repair.polls()
        || p.validation.polls()
}

fn key_of(w: &Work<'_>) -> Key {
    let n = &w.node;
    (n.since.is_none(), n.since, n.view.name.clone())
}

/// Keeps what node `w` adds to the counts and where it stands in the order, in place of its
/// last.
fn keep_share(
    tally: &mut Tally,
    order: &mut BTreeSet<Key>,
    shares: &mut BTreeMap<String, (Share, Key)>,
    w: &Work<'_>,
) {
    let name = &w.node.view.name;
    let share = Share::of(&w.node);
    let key = key_of(w);
    if let Some((old, old_key)) = shares.get(name) {
        if *old == share && *old_key == key {
            return;
        }
        tally.remove(name, old);
        order.remove(old_key);
    }
    tally.add(name, &share);
    order.insert(key.clone());
    shares.insert(name.clone(), (share, key));
}

fn shared_of(admission: &Admission, template: &Result<PodTemplateSpec, String>) -> Shared {
    Shared {
        circuit_open: admission.circuit_open(),
        close_command: admission.close_command().to_string(),
        window: admission.window().clone(),
        template: template.clone(),
    }
}
