//! `kubectl gpunode why NODE`: the live `gpunode-operator check`. The node, its report and
//! heartbeat, the policy that governs it and the policy's other nodes are read from the cluster,
//! and the operator's planner decides, budget and circuit breaker included; `check`'s own
//! wording (`gpunode_operator::check`) describes GPUs, windows and validation.

use std::fmt::Write as _;

use gpunode_operator::{
    check,
    markers::{CONDITION_TYPE, STATE_LABEL},
    verdict::{Drift, NodeState, Unknown},
};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde::Serialize;

use crate::{
    decision::Decision,
    error::Error,
    live::{Governed, Snapshot},
    render::{
        list,
        style::{Style, Tone},
        table::{Cell, Table},
        time,
    },
};

/// What gpunode decided about one node, and why.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Why {
    /// The node.
    pub node: String,
    /// The policy that governs it.
    pub policy: String,
    /// The verdict now: compliant, drifted or unknown.
    pub state: NodeState,
    /// Its drift classes.
    pub classes: Vec<String>,
    /// The `gpunode.dev/state` label the operator wrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labelled: Option<String>,
    /// The node's `GpuPolicyCompliant` condition as the operator wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<ConditionLine>,
    /// Each failed check: class, check, GPU or device, expected, actual.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drifts: Vec<Drift>,
    /// Each check that could not be made.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unknowns: Vec<Unknown>,
    /// What is done, due, waiting and why, repair, next change.
    #[serde(flatten)]
    pub decision: Decision,
    /// The policy's disruption budget: `2 of 2 in use`.
    pub budget: String,
    /// The per-GPU plan: each GPU that drifts or is quarantined.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// Where the policy's maintenance windows stand (with `spec.maintenance`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<String>,
    /// The validation gate (with `spec.validation`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation: Option<String>,
    /// When the probe was last heard from (its report or heartbeat Lease).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_heard: Option<String>,
    /// What could not be read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// A condition: `status`, `reason`, `message`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConditionLine {
    /// True, False or Unknown.
    pub status: String,
    /// Its reason.
    pub reason: String,
    /// Its message.
    pub message: String,
}

/// Why `node` is as it is, from `snapshot` (read with the governing policy's selector).
pub fn why(snapshot: &Snapshot, node: &Node) -> Result<Why, Error> {
    let policy = snapshot.governing(node)?;
    let governed = snapshot.govern(policy);
    explain(snapshot, &governed, node)
}

fn explain(snapshot: &Snapshot, g: &Governed, node: &Node) -> Result<Why, Error> {
    let name = node.name_any();
    let policy = g.policy.name_any();
    let (p, view, _) = g.node(&name).ok_or_else(|| {
        Error::NotFound(format!(
            "node {name} is not selected by GpuNodePolicy {policy} (its labels changed meanwhile?)"
        ))
    })?;
    let spec = &g.policy.spec;
    let mut notes = snapshot.notes.clone();
    if snapshot.report(&name).is_none() {
        notes.push(format!(
            "node {name} has no readable GpuNodeReport: its probe has not published one"
        ));
    }
    Ok(Why {
        node: name.clone(),
        policy,
        state: p.state,
        classes: p.drifting.iter().map(|c| c.as_str().to_string()).collect(),
        labelled: node.labels().get(STATE_LABEL).cloned(),
        condition: condition(node),
        drifts: view.verdict.drifts.clone(),
        unknowns: view.verdict.unknowns.clone(),
        decision: Decision::of(p),
        budget: format!(
            "{} of {} in use (maxUnavailable {})",
            g.plan.budget_in_use, g.plan.budget_allowed, spec.disruption.max_unavailable
        ),
        gpus: check::gpu_lines(p),
        maintenance: spec
            .maintenance
            .as_ref()
            .map(|_| check::window_line(&g.plan.window)),
        validation: spec
            .validation
            .as_ref()
            .map(|v| check::validation_line(v, &p.validation.state)),
        last_heard: view.last_heard.map(time),
        notes,
    })
}

fn condition(node: &Node) -> Option<ConditionLine> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_TYPE)?;
    Some(ConditionLine {
        status: c.status.clone(),
        reason: c.reason.clone().unwrap_or_default(),
        message: c.message.clone().unwrap_or_default(),
    })
}

impl Why {
    /// Whether the node is compliant.
    pub fn compliant(&self) -> bool {
        self.state == NodeState::Compliant
    }

    /// The text screen.
    pub fn text(&self, style: Style) -> String {
        let tone = match self.state {
            NodeState::Compliant => Tone::Good,
            NodeState::Drifted => Tone::Bad,
            NodeState::Unknown => Tone::Warn,
        };
        let mut out = format!(
            "node {} under policy {}: {}",
            style.paint(Tone::Strong, &self.node),
            self.policy,
            style.paint(tone, self.state.as_str())
        );
        if !self.classes.is_empty() {
            let _ = write!(out, " ({})", self.classes.join(", "));
        }
        out.push('\n');
        if let Some(c) = &self.condition {
            let _ = writeln!(
                out,
                "condition:  GpuPolicyCompliant={} ({}): {}",
                c.status, c.reason, c.message
            );
        }
        out.push_str(&self.findings(style));
        for (key, value) in self.lines() {
            let _ = writeln!(out, "{key:<11} {value}");
        }
        for n in &self.notes {
            let _ = writeln!(out, "note:       {n}");
        }
        out
    }

    fn findings(&self, style: Style) -> String {
        if self.drifts.is_empty() && self.unknowns.is_empty() {
            return String::new();
        }
        let mut t = Table::new(&["CLASS", "CHECK", "ON", "EXPECTED", "ACTUAL"]).indent(2);
        for d in &self.drifts {
            t.row(vec![
                Cell::toned(d.class.as_str(), Tone::Bad),
                d.check.as_str().into(),
                on(d.gpu, d.device.as_deref()).into(),
                d.expected.as_str().into(),
                d.actual.as_str().into(),
            ]);
        }
        for u in &self.unknowns {
            t.row(vec![
                Cell::toned("Unknown", Tone::Warn),
                u.check.as_str().into(),
                on(u.gpu, None).into(),
                "-".into(),
                u.reason.as_str().into(),
            ]);
        }
        format!("findings:\n{}", t.render(style))
    }

    fn lines(&self) -> Vec<(&'static str, String)> {
        let d = &self.decision;
        let mut lines = vec![("done:", list(&d.done, ", "))];
        if !d.due.is_empty() {
            lines.push((
                "due now:",
                format!("{} (the operator's next pass)", d.due.join(", ")),
            ));
        }
        lines.push(("waiting:", d.waiting_line()));
        if let Some(a) = &d.approval {
            lines.push((
                "approve:",
                format!("kubectl gpunode approve {} {}", self.node, a.rungs.join(" ")),
            ));
        }
        lines.push(("budget:", self.budget.clone()));
        lines.extend(d.drain.iter().map(|s| ("drain:", s.clone())));
        if let Some(r) = &d.repair {
            let step = r
                .step
                .as_deref()
                .map(|s| format!("step {s} "))
                .unwrap_or_default();
            lines.push(("repair:", format!("{step}{}: {}", r.state, r.detail)));
        }
        lines.extend(self.maintenance.iter().map(|m| ("windows:", m.clone())));
        lines.extend(self.validation.iter().map(|v| ("validation:", v.clone())));
        lines.extend(self.gpus.iter().map(|g| ("gpus:", g.clone())));
        lines.extend(
            self.last_heard
                .iter()
                .map(|h| ("heard:", format!("the probe, at {h}"))),
        );
        let next = match &d.next_change {
            Some(c) => format!("{}: {}", c.at, c.why),
            None => "only when the node, its report or the policy changes".to_string(),
        };
        lines.push(("changes:", next));
        lines
    }
}

/// `gpu 5`, `mlx5_3`, `gpu 2 mlx5_0`, or `-`.
fn on(gpu: Option<u32>, device: Option<&str>) -> String {
    match (gpu, device) {
        (Some(g), Some(d)) => format!("gpu {g} {d}"),
        (Some(g), None) => format!("gpu {g}"),
        (None, Some(d)) => d.to_string(),
        (None, None) => "-".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunode_crds::DriftClass;

    fn fixture() -> Why {
        Why {
            node: "gpu-7".into(),
            policy: "h100-training".into(),
            state: NodeState::Drifted,
            classes: vec!["Driver".into()],
            labelled: Some("drifted".into()),
            condition: Some(ConditionLine {
                status: "False".into(),
                reason: "AwaitingApproval".into(),
                message: "drifted (Driver): ...".into(),
            }),
            drifts: vec![Drift {
                class: DriftClass::Driver,
                check: "gpu.driverVersion".into(),
                expected: ">=550".into(),
                actual: "535.129.03".into(),
                gpu: None,
                device: None,
            }],
            unknowns: vec![Unknown {
                check: "gpu.eccMode".into(),
                reason: "NVML: NotSupported".into(),
                gpu: Some(3),
            }],
            decision: Decision {
                done: Vec::new(),
                due: vec!["Taint NoSchedule (driver)".into()],
                pending: vec!["Drain".into()],
                waiting_for: Some("waiting for approval of Drain: kubectl annotate ...".into()),
                approval: Some(crate::decision::Approval {
                    rungs: vec!["Drain".into()],
                    command: "kubectl annotate ...".into(),
                }),
                drain: None,
                repair: None,
                next_change: None,
            },
            budget: "0 of 1 in use (maxUnavailable 1)".into(),
            gpus: Vec::new(),
            maintenance: None,
            validation: None,
            last_heard: Some("2026-11-29T12:00:00Z".into()),
            notes: Vec::new(),
        }
    }

    #[test]
    fn findings_in_a_table_then_what_is_done_waiting_and_when_it_changes() {
        let want = "\
node gpu-7 under policy h100-training: drifted (Driver)
condition:  GpuPolicyCompliant=False (AwaitingApproval): drifted (Driver): ...
findings:
  CLASS     CHECK               ON      EXPECTED   ACTUAL
  Driver    gpu.driverVersion   -       >=550      535.129.03
  Unknown   gpu.eccMode         gpu 3   -          NVML: NotSupported
done:       -
due now:    Taint NoSchedule (driver) (the operator's next pass)
waiting:    Drain: waiting for approval of Drain: kubectl annotate ...
approve:    kubectl gpunode approve gpu-7 Drain
budget:     0 of 1 in use (maxUnavailable 1)
heard:      the probe, at 2026-11-29T12:00:00Z
changes:    only when the node, its report or the policy changes
";
        assert_eq!(fixture().text(Style::plain()), want);
        assert!(!fixture().compliant());
    }

    #[test]
    fn colour_marks_the_state_only_when_asked() {
        let colored = fixture().text(Style::colored());
        assert!(colored.contains("\x1b[31mdrifted\x1b[0m"), "{colored}");
        assert!(!fixture().text(Style::plain()).contains('\x1b'));
    }
}
