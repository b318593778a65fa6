//! `kubectl gpunode status [POLICY]`: every policy on one screen.

use std::fmt::Write as _;

use gpunode_operator::{plan::windows::WindowState, verdict::NodeState};
use kube::ResourceExt;
use serde::Serialize;

use crate::{
    decision::{self, Decision},
    live::{Governed, Snapshot},
    render::{
        list,
        style::{Style, Tone},
        table::{Cell, Table},
        time,
    },
};

/// Most nodes listed per policy in the text output (JSON and YAML list them all).
const MAX_ROWS: usize = 20;

/// The status of the policies shown.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// One per policy, by name.
    pub policies: Vec<PolicyStatus>,
    /// What could not be read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One policy.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// Its name.
    pub name: String,
    /// `paused`, `dry run`, or absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Nodes it selects.
    pub matched: u32,
    /// Of those, compliant.
    pub compliant: u32,
    /// Drifted.
    pub drifted: u32,
    /// Unknown.
    pub unknown: u32,
    /// The disruption budget.
    pub budget: Budget,
    /// The circuit breaker.
    pub circuit_breaker: Breaker,
    /// The maintenance windows (absent without `spec.maintenance`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<Windows>,
    /// The policy's conditions that say something is wrong (Ready False, Degraded, Conflict).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Nodes waiting for a person's approval.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<NodeApproval>,
    /// Nodes with a repair step running or waiting.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repairs: Vec<NodeRepair>,
    /// Nodes whose repair stopped: they need a person.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub needs_human: Vec<NodeRepair>,
    /// Nodes not compliant, or with something of gpunode's on them, oldest drift first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeRow>,
}

/// The disruption budget.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// Nodes disrupted by gpunode now.
    pub in_use: u32,
    /// Nodes that may be at once.
    pub allowed: u32,
    /// `spec.disruption.maxUnavailable` as written.
    pub max_unavailable: String,
    /// Nodes waiting for a slot.
    pub waiting: u32,
}

/// The circuit breaker.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Breaker {
    /// No new disruption anywhere while open.
    pub open: bool,
    /// Nodes that began drifting within the window.
    pub recently_drifted: u32,
    /// It opens when more than this many do (absent: disabled, maxDriftedPercent 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_above: Option<u64>,
    /// The window.
    pub window: String,
}

/// Where the maintenance windows stand.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Windows {
    /// A window is open now.
    pub open: bool,
    /// When the next opens, while closed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<String>,
    /// Why no window can open (a time zone the operator does not know).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<String>,
}

/// A node awaiting approval.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeApproval {
    /// The node.
    pub node: String,
    /// The rungs.
    pub rungs: Vec<String>,
    /// The command that approves them (or `kubectl gpunode approve NODE RUNG...`).
    pub command: String,
}

/// A node's repair.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRepair {
    /// The node.
    pub node: String,
    /// The repair.
    #[serde(flatten)]
    pub repair: decision::Repair,
}

/// One notable node.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    /// The node.
    pub node: String,
    /// compliant, drifted, unknown.
    pub state: NodeState,
    /// Its drift classes.
    pub classes: Vec<String>,
    /// The decision.
    #[serde(flatten)]
    pub decision: Decision,
}

/// The status of `policy` (every readable policy when `None`).
pub fn status(snapshot: &Snapshot, policy: Option<&str>) -> Result<Status, crate::error::Error> {
    let policies = match policy {
        Some(name) => vec![snapshot.policy(name)?],
        None => snapshot.readable_policies(),
    };
    let mut notes = snapshot.notes.clone();
    if policy.is_none() {
        for p in snapshot
            .policies
            .iter()
            .filter_map(|p| p.0.as_ref().err().map(|e| (p, e)))
        {
            notes.push(format!(
                "GpuNodePolicy {} cannot be read: {}",
                p.0.name_any(),
                p.1.error
            ));
        }
    }
    Ok(Status {
        policies: policies
            .into_iter()
            .map(|p| policy_status(&snapshot.govern(p)))
            .collect(),
        notes,
    })
}

fn policy_status(g: &Governed) -> PolicyStatus {
    let spec = &g.policy.spec;
    let count = |s: NodeState| {
        u32::try_from(g.plan.nodes.iter().filter(|n| n.state == s).count()).unwrap_or(u32::MAX)
    };
    let matched = u32::try_from(g.plan.nodes.len()).unwrap_or(u32::MAX);
    let pct = spec.disruption.circuit_breaker.max_drifted_percent;
    let mut rows: Vec<NodeRow> = Vec::new();
    let mut approvals = Vec::new();
    let (mut repairs, mut needs_human) = (Vec::new(), Vec::new());
    for p in g.plan.nodes.iter().filter(|p| decision::notable(p)) {
        let d = Decision::of(p);
        if let Some(a) = &d.approval {
            approvals.push(NodeApproval {
                node: p.node.clone(),
                rungs: a.rungs.clone(),
                command: a.command.clone(),
            });
        }
        if let Some(r) = &d.repair {
            let entry = NodeRepair {
                node: p.node.clone(),
                repair: r.clone(),
            };
            if r.state == "NeedsHuman" {
                needs_human.push(entry);
            } else {
                repairs.push(entry);
            }
        }
        rows.push(NodeRow {
            node: p.node.clone(),
            state: p.state,
            classes: p.drifting.iter().map(|c| c.as_str().to_string()).collect(),
            decision: d,
        });
    }
    PolicyStatus {
        name: g.policy.name_any(),
        mode: (spec.paused.then_some("paused"))
            .or(spec.dry_run.then_some("dry run"))
            .map(str::to_string),
        matched,
        compliant: count(NodeState::Compliant),
        drifted: count(NodeState::Drifted),
        unknown: count(NodeState::Unknown),
        budget: Budget {
            in_use: g.plan.budget_in_use,
            allowed: g.plan.budget_allowed,
            max_unavailable: spec.disruption.max_unavailable.to_string(),
            waiting: g.plan.budget_queued,
        },
        circuit_breaker: Breaker {
            open: g.plan.circuit_open,
            recently_drifted: g.plan.recently_drifted,
            opens_above: (pct < 100).then(|| (u64::from(pct) * u64::from(matched) / 100).max(1)),
            window: spec.disruption.circuit_breaker.window.to_string(),
        },
        maintenance: spec.maintenance.as_ref().map(|_| windows(&g.plan.window)),
        problems: problems(&g.policy),
        approvals,
        repairs,
        needs_human,
        nodes: rows,
    }
}

fn windows(state: &WindowState) -> Windows {
    match state {
        WindowState::Open => Windows {
            open: true,
            opens_at: None,
            invalid: None,
        },
        WindowState::Closed { opens } => Windows {
            open: false,
            opens_at: Some(time(*opens)),
            invalid: None,
        },
        WindowState::Invalid(why) => Windows {
            open: false,
            opens_at: None,
            invalid: Some(why.clone()),
        },
    }
}

/// The policy's conditions that say something is wrong, as `Type=Status (Reason): message`.
fn problems(policy: &gpunode_crds::GpuNodePolicy) -> Vec<String> {
    let conditions = policy
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    conditions
        .iter()
        .filter(|c| match c.type_.as_str() {
            "Ready" => c.status == "False",
            "Degraded" | "Conflict" => c.status == "True",
            _ => false,
        })
        .map(|c| format!("{}={} ({}): {}", c.type_, c.status, c.reason, c.message))
        .collect()
}

impl Status {
    /// Whether every node shown is compliant.
    pub fn all_compliant(&self) -> bool {
        self.policies.iter().all(|p| p.drifted == 0 && p.unknown == 0)
    }

    /// The text screen.
    pub fn text(&self, style: Style) -> String {
        if self.policies.is_empty() {
            let mut out = "no GpuNodePolicy on this cluster\n".to_string();
            for n in &self.notes {
                let _ = writeln!(out, "note: {n}");
            }
            return out;
        }
        let mut t = Table::new(&[
            "POLICY",
            "NODES",
            "COMPLIANT",
            "DRIFTED",
            "UNKNOWN",
            "BUDGET",
            "BREAKER",
            "WINDOW",
        ]);
        for p in &self.policies {
            t.row(summary_row(p));
        }
        let mut out = t.render(style);
        for p in self
            .policies
            .iter()
            .filter(|p| p.matched > 0 || !p.problems.is_empty())
        {
            out.push('\n');
            out.push_str(&p.text(style));
        }
        for n in &self.notes {
            let _ = writeln!(out, "\nnote: {n}");
        }
        out
    }
}

fn summary_row(p: &PolicyStatus) -> Vec<Cell> {
    let tone = |n: u32, bad: Tone| if n == 0 { Tone::Good } else { bad };
    let budget_tone = if p.budget.in_use >= p.budget.allowed && p.budget.waiting > 0 {
        Tone::Warn
    } else {
        Tone::Good
    };
    vec![
        p.name.as_str().into(),
        p.matched.to_string().into(),
        p.compliant.to_string().into(),
        Cell::toned(p.drifted.to_string(), tone(p.drifted, Tone::Bad)),
        Cell::toned(p.unknown.to_string(), tone(p.unknown, Tone::Warn)),
        Cell::toned(format!("{}/{}", p.budget.in_use, p.budget.allowed), budget_tone),
        if p.circuit_breaker.open {
            Cell::toned("open", Tone::Bad)
        } else {
            "closed".into()
        },
        match &p.maintenance {
            None => "-".into(),
            Some(w) if w.open => Cell::toned("open", Tone::Good),
            Some(w) if w.invalid.is_some() => Cell::toned("invalid", Tone::Bad),
            Some(_) => Cell::toned("closed", Tone::Warn),
        },
    ]
}

impl PolicyStatus {
    /// The policy's section of the screen.
    fn text(&self, style: Style) -> String {
        let mut out = style.paint(Tone::Strong, &self.name);
        if let Some(m) = &self.mode {
            let _ = write!(out, " ({})", style.paint(Tone::Warn, m));
        }
        out.push('\n');
        for (key, value) in self.lines() {
            let _ = writeln!(out, "  {key:<12} {value}");
        }
        if !self.nodes.is_empty() {
            out.push_str(&self.node_table(style));
        }
        out
    }

    fn lines(&self) -> Vec<(&'static str, String)> {
        let b = &self.budget;
        let mut budget = format!(
            "{} of {} in use (maxUnavailable {})",
            b.in_use, b.allowed, b.max_unavailable
        );
        if b.waiting > 0 {
            let _ = write!(budget, ", {} node{} waiting", b.waiting, plural(b.waiting));
        }
        let c = &self.circuit_breaker;
        let breaker = match c.opens_above {
            None => "disabled (maxDriftedPercent 100)".to_string(),
            Some(above) => format!(
                "{}: {} of {} node{} began drifting within {} (opens above {above})",
                if c.open {
                    "OPEN, no new disruption"
                } else {
                    "closed"
                },
                c.recently_drifted,
                self.matched,
                plural(self.matched),
                c.window
            ),
        };
        let windows = match &self.maintenance {
            None => "none: disruptive actions start at once".to_string(),
            Some(w) if w.open => "a window is open: disruptive actions may start".to_string(),
            Some(Windows {
                invalid: Some(why), ..
            }) => format!("every window stays closed: {why}"),
            Some(w) => format!(
                "closed: disruptive actions wait until {}",
                w.opens_at.as_deref().unwrap_or("-")
            ),
        };
        let mut lines = vec![("budget", budget), ("breaker", breaker), ("windows", windows)];
        lines.extend(self.problems.iter().map(|p| ("problem", p.clone())));
        lines.push(("approvals", approvals_line(&self.approvals)));
        lines.push(("repairs", repairs_line(&self.repairs, "none running")));
        lines.push(("needs human", repairs_line(&self.needs_human, "none")));
        lines
    }

    fn node_table(&self, style: Style) -> String {
        let mut t = Table::new(&["NODE", "STATE", "CLASSES", "DONE", "WAITING"]).indent(2);
        for n in self.nodes.iter().take(MAX_ROWS) {
            let tone = match n.state {
                NodeState::Compliant => Tone::Good,
                NodeState::Drifted => Tone::Bad,
                NodeState::Unknown => Tone::Warn,
            };
            t.row(vec![
                n.node.as_str().into(),
                Cell::toned(n.state.as_str(), tone),
                list(&n.classes, ",").into(),
                list(&n.decision.done, ", ").into(),
                n.decision.waiting_line().into(),
            ]);
        }
        let mut out = t.render(style);
        if self.nodes.len() > MAX_ROWS {
            let _ = writeln!(
                out,
                "  ... and {} more (-o yaml lists them all)",
                self.nodes.len() - MAX_ROWS
            );
        }
        out
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn approvals_line(approvals: &[NodeApproval]) -> String {
    if approvals.is_empty() {
        return "none pending".to_string();
    }
    approvals
        .iter()
        .map(|a| {
            format!(
                "{} waits for {} (kubectl gpunode approve {} {})",
                a.node,
                a.rungs.join(", "),
                a.node,
                a.rungs.join(" ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn repairs_line(repairs: &[NodeRepair], none: &str) -> String {
    if repairs.is_empty() {
        return none.to_string();
    }
    repairs
        .iter()
        .map(|r| match &r.repair.step {
            Some(step) => format!("{}: step {step} {} ({})", r.node, r.repair.state, r.repair.detail),
            None => format!("{}: {}", r.node, r.repair.detail),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(done: &[&str], pending: &[&str], waiting_for: Option<&str>) -> Decision {
        Decision {
            done: done.iter().map(|s| s.to_string()).collect(),
            due: Vec::new(),
            pending: pending.iter().map(|s| s.to_string()).collect(),
            waiting_for: waiting_for.map(str::to_string),
            approval: None,
            drain: None,
            repair: None,
            next_change: None,
        }
    }

    fn fixture() -> Status {
        Status {
            policies: vec![PolicyStatus {
                name: "h200-training".into(),
                mode: Some("dry run".into()),
                matched: 4,
                compliant: 1,
                drifted: 3,
                unknown: 0,
                budget: Budget {
                    in_use: 1,
                    allowed: 1,
                    max_unavailable: "1".into(),
                    waiting: 1,
                },
                circuit_breaker: Breaker {
                    open: false,
                    recently_drifted: 1,
                    opens_above: Some(1),
                    window: "10m".into(),
                },
                maintenance: Some(Windows {
                    open: false,
                    opens_at: Some("2026-12-05T21:00:00Z".into()),
                    invalid: None,
                }),
                problems: vec!["Degraded=True (DrainStuck): drain of gpu-2 past its timeout".into()],
                approvals: vec![NodeApproval {
                    node: "gpu-1".into(),
                    rungs: vec!["Drain".into()],
                    command: "kubectl annotate --overwrite node gpu-1 gpunode.dev/approve=Drain".into(),
                }],
                repairs: vec![NodeRepair {
                    node: "gpu-2".into(),
                    repair: decision::Repair {
                        state: "Running".into(),
                        step: Some("reboot".into()),
                        detail: "since 2026-11-29T12:00:00Z".into(),
                    },
                }],
                needs_human: vec![NodeRepair {
                    node: "gpu-3".into(),
                    repair: decision::Repair {
                        state: "NeedsHuman".into(),
                        step: None,
                        detail: "every repair step for Xid was tried".into(),
                    },
                }],
                nodes: vec![
                    NodeRow {
                        node: "gpu-1".into(),
                        state: NodeState::Drifted,
                        classes: vec!["Driver".into()],
                        decision: decision(&[], &["Drain"], Some("waiting for approval of Drain")),
                    },
                    NodeRow {
                        node: "gpu-2".into(),
                        state: NodeState::Drifted,
                        classes: vec!["Xid".into()],
                        decision: decision(&["Cordon", "Drain"], &[], None),
                    },
                ],
            }],
            notes: vec!["heartbeat Leases not readable (forbidden)".into()],
        }
    }

    #[test]
    fn one_screen_per_policy_with_budget_breaker_windows_approvals_repairs_and_people() {
        let text = fixture().text(Style::plain());
        let want = "\
POLICY          NODES   COMPLIANT   DRIFTED   UNKNOWN   BUDGET   BREAKER   WINDOW
h200-training   4       1           3         0         1/1      closed    closed

h200-training (dry run)
  budget       1 of 1 in use (maxUnavailable 1), 1 node waiting
  breaker      closed: 1 of 4 nodes began drifting within 10m (opens above 1)
  windows      closed: disruptive actions wait until 2026-12-05T21:00:00Z
  problem      Degraded=True (DrainStuck): drain of gpu-2 past its timeout
  approvals    gpu-1 waits for Drain (kubectl gpunode approve gpu-1 Drain)
  repairs      gpu-2: step reboot Running (since 2026-11-29T12:00:00Z)
  needs human  gpu-3: every repair step for Xid was tried
  NODE    STATE     CLASSES   DONE            WAITING
  gpu-1   drifted   Driver    -               Drain: waiting for approval of Drain
  gpu-2   drifted   Xid       Cordon, Drain   -

note: heartbeat Leases not readable (forbidden)
";
        assert_eq!(text, want);
        assert!(!fixture().all_compliant());
    }

    #[test]
    fn json_uses_the_documented_field_names() {
        let v = serde_json::to_value(fixture()).unwrap_or_default();
        let p = &v["policies"][0];
        for key in [
            "name",
            "matched",
            "compliant",
            "drifted",
            "unknown",
            "budget",
            "circuitBreaker",
            "maintenance",
            "approvals",
            "repairs",
            "needsHuman",
            "nodes",
        ] {
            assert!(p.get(key).is_some(), "{key} missing in {p}");
        }
        assert_eq!(p["budget"]["inUse"], 1);
        assert_eq!(p["nodes"][0]["waitingFor"], "waiting for approval of Drain");
        assert_eq!(p["needsHuman"][0]["state"], "NeedsHuman");
    }

    #[test]
    fn a_closed_breaker_above_100_percent_is_disabled_and_an_open_one_says_so() {
        let mut s = fixture();
        s.policies[0].circuit_breaker.opens_above = None;
        assert!(
            s.text(Style::plain())
                .contains("breaker      disabled (maxDriftedPercent 100)")
        );
        s.policies[0].circuit_breaker = Breaker {
            open: true,
            recently_drifted: 3,
            opens_above: Some(1),
            window: "10m".into(),
        };
        let text = s.text(Style::plain());
        assert!(
            text.contains("breaker      OPEN, no new disruption: 3 of 4 nodes"),
            "{text}"
        );
        assert!(
            text.lines().nth(1).is_some_and(|l| l.contains("   open   ")),
            "{text}"
        );
    }
}
