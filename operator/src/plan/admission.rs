//! Admission: why a step of the plan waits ([`Block`]) and how a person approves a rung.
//!
//! It may import the layers below it (view, output, hysteresis, windows), never a feature
//! planner or the pass.

use std::collections::BTreeSet;

use gpunode_crds::policy::APPROVE_ANNOTATION;
use jiff::Timestamp;

/// Why wanted actions are not taken.
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
