//! What the operator's plan says about one node, in words: what is done, what is due, what
//! waits and why, its repair, and when the plan changes next. Shared by `status` and `why`.

use gpunode_operator::{
    plan::{Action, Block, DrainStep, NodePlan, RepairState},
    verdict::NodeState,
};
use serde::Serialize;

use crate::render::time;

/// One node's decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// gpunode's actions in effect on the node now (taints, cordon, drain, GPU quarantines).
    pub done: Vec<String>,
    /// Actions the plan takes now that are not in effect yet: the operator's next pass takes them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub due: Vec<String>,
    /// Actions wanted but held back.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
    /// Why they are held back: the budget, the breaker, a window, an approval, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// The rungs awaiting a person's approval, and the command that approves them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// The drain: `running since ...`, `stuck since ...`, `done at ...`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<String>,
    /// The repair: a step running or waiting, or why it stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<Repair>,
    /// When the plan next changes with time alone, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_change: Option<NextChange>,
}

/// Rungs awaiting approval.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Approval {
    /// The rungs.
    pub rungs: Vec<String>,
    /// The command the operator prints.
    pub command: String,
}

/// Where a node's repair stands.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Repair {
    /// `Running`, `AwaitingReport`, `Waiting` or `NeedsHuman`.
    pub state: String,
    /// The step, if one is running or waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// Since when it runs, why it waits or why it stopped.
    pub detail: String,
}

/// When the plan changes with time alone.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NextChange {
    /// When (to the second).
    pub at: String,
    /// Why, e.g. `the Taint rule's after passes for Network`.
    pub why: String,
}

fn describe(actions: &[Action]) -> Vec<String> {
    actions.iter().map(Action::describe).collect()
}

impl Decision {
    /// The decision the plan `p` holds.
    pub fn of(p: &NodePlan) -> Decision {
        let done = describe(&p.before.actions);
        let due = p
            .actions
            .iter()
            .filter(|a| !p.before.actions.contains(a))
            .map(Action::describe)
            .collect();
        Decision {
            done,
            due,
            pending: describe(&p.pending),
            waiting_for: p
                .blocked
                .as_ref()
                .filter(|_| !p.pending.is_empty())
                .map(Block::describe),
            approval: approval(p),
            drain: drain(p.before.drain),
            repair: repair(&p.repair.state),
            next_change: p.next_change.map(|c| {
                let text = c.to_string();
                let why = text.split_once(": ").map_or(text.clone(), |(_, w)| w.to_string());
                NextChange { at: time(c.at), why }
            }),
        }
    }

    /// `Taint NoSchedule (network): disruption budget exhausted`, or `-`.
    pub fn waiting_line(&self) -> String {
        match (&self.pending[..], &self.waiting_for) {
            ([], _) => "-".to_string(),
            (p, Some(why)) => format!("{}: {why}", p.join(", ")),
            (p, None) => p.join(", "),
        }
    }
}

fn approval(p: &NodePlan) -> Option<Approval> {
    let from_rules = match &p.blocked {
        Some(Block::Approval { rungs, command }) => Some((rungs, command)),
        _ => None,
    };
    let from_repair = match &p.repair.state {
        RepairState::Waiting {
            block: Block::Approval { rungs, command },
            ..
        } => Some((rungs, command)),
        _ => None,
    };
    from_rules.or(from_repair).map(|(rungs, command)| Approval {
        rungs: rungs.clone(),
        command: command.clone(),
    })
}

fn drain(step: DrainStep) -> Option<String> {
    match step {
        DrainStep::None => None,
        DrainStep::Run {
            started,
            stuck: false,
        } => Some(format!("evicting since {}", time(started))),
        DrainStep::Run { started, stuck: true } => Some(format!(
            "stuck: evicting since {}, past its timeout",
            time(started)
        )),
        DrainStep::Done { finished, .. } => Some(format!("drained at {}", time(finished))),
    }
}

fn repair(state: &RepairState) -> Option<Repair> {
    let (state, step, detail) = match state {
        RepairState::Idle => return None,
        RepairState::Running { step, since } => ("Running", Some(step), format!("since {}", time(*since))),
        RepairState::AwaitingReport { step } => (
            "AwaitingReport",
            Some(step),
            "the step ended; the probe's next report decides".to_string(),
        ),
        RepairState::Waiting { step, block } => ("Waiting", Some(step), block.describe()),
        RepairState::NeedsHuman(why) => ("NeedsHuman", None, why.clone()),
    };
    Some(Repair {
        state: state.to_string(),
        step: step.cloned(),
        detail,
    })
}

/// Whether the node needs anyone's attention: not compliant, or something of gpunode's on it.
pub fn notable(p: &NodePlan) -> bool {
    p.state != NodeState::Compliant
        || !p.before.actions.is_empty()
        || !p.actions.is_empty()
        || !p.pending.is_empty()
        || p.repair.state != RepairState::Idle
}
