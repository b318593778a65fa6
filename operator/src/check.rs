//! `gpunode-operator check`: what the operator would decide about one node, offline, from a
//! policy, a report and optionally the Node as YAML files.
//!
//! The policy is validated exactly as the API server would (the generated CRD schema, CEL rules
//! included), so a policy that `check` accepts is one `kubectl apply` accepts.
//!
//! It never contacts a cluster.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport, generate};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

use crate::{
    evaluate::evaluate,
    observe::{gpu_pods, gpu_views},
    plan::{self, Action, NodeDevices, NodeView},
    verdict::{NodeState, Verdict},
};

/// Exit code of `check` for each outcome.
pub mod exit {
    /// Every check passed.
    pub const COMPLIANT: u8 = 0;
    /// At least one check failed.
    pub const DRIFTED: u8 = 1;
    /// Nothing failed, but something could not be checked.
    pub const UNKNOWN: u8 = 2;
    /// A file could not be read or is not a valid object.
    pub const BAD_INPUT: u8 = 3;
}

/// A bad input file, naming the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not YAML, or a field has the wrong type or value.
    #[error("{path}: {field}: {reason}")]
    Field {
        /// The file.
        path: String,
        /// The field, e.g. `spec.remediation[0].effect` (`.` for the document itself).
        field: String,
        /// Why it is wrong.
        reason: String,
    },
}

fn read(path: &Path) -> Result<String, InputError> {
    std::fs::read_to_string(path).map_err(|source| InputError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Parses a YAML document into `T`, naming the offending field on failure.
pub fn parse<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, InputError> {
    let de = serde_yaml::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        InputError::Field {
            path: path.display().to_string(),
            field: if field.is_empty() { ".".to_string() } else { field },
            reason: e.into_inner().to_string(),
        }
    })
}

/// Checks a policy document against the generated CRD schema's CEL rules, as the API server
/// would; type and range errors are already caught by [`parse`].
pub fn validate_policy(path: &Path, text: &str) -> Result<(), InputError> {
    let value: serde_json::Value = parse(path, text)?;
    let crd = generate::crds()
        .into_iter()
        .map(|(_, crd)| crd)
        .find(|crd| crd.spec.names.kind == "GpuNodePolicy");
    let schema = crd
        .and_then(|crd| crd.spec.versions.into_iter().next())
        .and_then(|v| v.schema)
        .and_then(|s| s.open_api_v3_schema)
        .and_then(|s| serde_json::to_value(s).ok());
    let Some(schema) = schema else {
        return Ok(());
    };
    // OpenAPI constraints (types, ranges, enums, sizes), then the CEL rules.
    if let Ok(validator) = jsonschema::validator_for(&schema)
        && let Some(e) = validator.iter_errors(&value).next()
    {
        return Err(InputError::Field {
            path: path.display().to_string(),
            field: dotted(e.instance_path().as_str()),
            reason: e.to_string(),
        });
    }
    match kube::core::cel::Validator::new().validate(&schema, &value, None) {
        Ok(()) => Ok(()),
        Err(errors) => {
            let first = errors.iter().next();
            Err(InputError::Field {
                path: path.display().to_string(),
                field: first.map(|e| e.field_path.clone()).unwrap_or_default(),
                reason: first.map(|e| e.message.clone()).unwrap_or_default(),
            })
        }
    }
}

/// `/spec/remediation/0/effect` → `spec.remediation[0].effect`: a JSON pointer as the API
/// server prints field paths.
pub fn dotted(pointer: &str) -> String {
    let mut out = String::new();
    for seg in pointer.split('/').filter(|s| !s.is_empty()) {
        if seg.bytes().all(|b| b.is_ascii_digit()) {
            let _ = write!(out, "[{seg}]");
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(seg);
        }
    }
    out
}

/// The inputs of one check.
pub struct Inputs {
    /// The policy.
    pub policy: GpuNodePolicy,
    /// The report.
    pub report: GpuNodeReport,
    /// The node, when given.
    pub node: Option<Node>,
}

/// Reads and validates the files.
pub fn load(policy: &Path, report: &Path, node: Option<&Path>) -> Result<Inputs, InputError> {
    let policy_text = read(policy)?;
    let parsed: GpuNodePolicy = parse(policy, &policy_text)?;
    validate_policy(policy, &policy_text)?;
    // The template is kept as written by the API server; the operator reads it as a
    // PodTemplateSpec, and so does check.
    if let Some(v) = &parsed.spec.validation
        && let Err(why) = v.pod_template()
    {
        let (field, reason) = why.split_once(": ").unwrap_or(("spec.validation.template", &why));
        return Err(InputError::Field {
            path: policy.display().to_string(),
            field: field.to_string(),
            reason: reason.to_string(),
        });
    }
    let report: GpuNodeReport = parse(report, &read(report)?)?;
    let node = node
        .map(|p| read(p).and_then(|t| parse::<Node>(p, &t)))
        .transpose()?;
    Ok(Inputs {
        policy: parsed,
        report,
        node,
    })
}

/// What `check` found: the verdict, what the operator would do now, and what it would do if the
/// drift lasts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The node's name.
    pub node: String,
    /// The policy's name.
    pub policy: String,
    /// The verdict.
    pub verdict: Verdict,
    /// Labels the node would carry.
    pub labels: BTreeMap<String, String>,
    /// The `GpuPolicyCompliant` condition: status, reason, message.
    pub condition: [String; 3],
    /// Actions in effect now.
    pub actions_now: Vec<String>,
    /// Actions added once every remediation rule's `after` has passed, if the drift lasts
    /// (those in effect now are not repeated).
    pub actions_if_it_lasts: Vec<String>,
    /// Why actions would wait. The disruption budget and the circuit breaker depend on the
    /// policy's other nodes and are not applied offline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
    /// When the plan next changes with time alone if nothing else changes, and why (a rule's
    /// `after`, `healthyFor`, the report going stale, a drain's timeout).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes_at: Option<String>,
    /// The per-GPU plan: each GPU that drifts or is quarantined now, and whether the node's own
    /// rules take over (escalation).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// Where the policy's maintenance windows stand (only with `spec.maintenance`): open,
    /// closed until the next opens, or unreadable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<String>,
    /// The validation gate (only with `spec.validation`): what it requires, and where the
    /// node's validation stands.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation: Option<String>,
}

impl Outcome {
    /// The exit code for this verdict.
    pub fn exit_code(&self) -> u8 {
        match self.verdict.state {
            NodeState::Compliant => exit::COMPLIANT,
            NodeState::Drifted => exit::DRIFTED,
            NodeState::Unknown => exit::UNKNOWN,
        }
    }

    /// Human-readable form: one line per finding.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let classes: Vec<&str> = self.verdict.classes().into_iter().map(|c| c.as_str()).collect();
        let _ = write!(
            s,
            "node {} under policy {}: {}",
            self.node, self.policy, self.verdict.state
        );
        if !classes.is_empty() {
            let _ = write!(s, " ({})", classes.join(", "));
        }
        s.push('\n');
        for d in &self.verdict.drifts {
            let _ = writeln!(s, "  drift    {:<9} {}", d.class.as_str(), d.message());
        }
        for u in &self.verdict.unknowns {
            let _ = writeln!(s, "  unknown  {:<9} {}", "Stale", u.message());
        }
        let labels: Vec<String> = self.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(s, "labels:     {}", labels.join(" "));
        let _ = writeln!(
            s,
            "condition:  GpuPolicyCompliant={} ({}): {}",
            self.condition[0], self.condition[1], self.condition[2]
        );
        let none = |v: &Vec<String>| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        let _ = writeln!(s, "actions:    now: {}", none(&self.actions_now));
        let _ = writeln!(s, "            if it lasts: {}", none(&self.actions_if_it_lasts));
        let _ = writeln!(
            s,
            "            (before the disruption budget and circuit breaker, which depend on other nodes)"
        );
        if let Some(b) = &self.blocked {
            let _ = writeln!(s, "waiting:    {b}");
        }
        if let Some(m) = &self.maintenance {
            let _ = writeln!(s, "windows:    {m}");
        }
        if let Some(v) = &self.validation {
            let _ = writeln!(s, "validation: {v}");
        }
        for g in &self.gpus {
            let _ = writeln!(s, "gpus:       {g}");
        }
        if let Some(c) = &self.changes_at {
            let _ = writeln!(s, "changes:    again at {c}");
        }
        s
    }
}

fn view(inputs: &Inputs, verdict: Verdict, last_heard: Option<Timestamp>) -> NodeView {
    // Offline, DRA devices are not known; the pods holding each GPU are, where the report lists
    // them (a device-plugin node whose probe reads PodResources).
    let devices =
        gpu_pods(Some(&inputs.report)).map_or(NodeDevices::Unknown, |p| NodeDevices::DevicePlugin(Some(p)));
    match &inputs.node {
        Some(node) => NodeView::observe(node, verdict, Vec::new())
            .0
            .heard_at(last_heard)
            .with_gpus(gpu_views(Some(&inputs.report)), devices),
        None => NodeView::new(&inputs.report.metadata.name.clone().unwrap_or_default(), verdict)
            .heard_at(last_heard)
            .with_gpus(gpu_views(Some(&inputs.report)), devices),
    }
}

fn describe(actions: &[Action]) -> Vec<String> {
    actions.iter().map(Action::describe).collect()
}

/// Evaluates and plans one node at `now`. `None` only if the planner returned no plan for the
/// node, which it never does for a node it is given.
pub fn check(inputs: &Inputs, now: Timestamp) -> Option<Outcome> {
    // Budget and breaker are decided over all of a policy's nodes; offline there is one node,
    // so they are left out and the output says so.
    let mut spec = inputs.policy.spec.clone();
    spec.disruption.max_unavailable = gpunode_crds::MaxUnavailable::Percent(100);
    spec.disruption.circuit_breaker.max_drifted_percent = 100;
    let spec = &spec;
    let verdict = evaluate(spec, Some(&inputs.report), now);
    // Offline there is no heartbeat: the report is as fresh as its `observedAt`.
    let observed_at = inputs
        .report
        .status
        .as_ref()
        .and_then(|s| s.observed_at.as_ref())
        .map(|t| t.0);
    let mut node = view(inputs, verdict.clone(), observed_at);
    let policy = inputs.policy.metadata.name.clone().unwrap_or_default();
    let first = plan::plan(&policy, spec, std::slice::from_ref(&node), now);
    let maintenance = spec.maintenance.as_ref().map(|_| window_line(&first.window));
    let p = first.nodes.into_iter().next()?;
    let validation = spec
        .validation
        .as_ref()
        .map(|v| validation_line(v, &p.validation.state));
    // Replay the plan as if applied, then look again once the longest `after` has passed.
    node.markers = p.markers.clone();
    node.taints = p.taints.clone();
    if let Some(c) = p.cordon {
        node.unschedulable = c;
    }
    let longest = spec
        .remediation
        .iter()
        .map(|r| SignedDuration::try_from(r.after.get()).unwrap_or(SignedDuration::MAX))
        .max()
        .unwrap_or(SignedDuration::ZERO);
    let later = now.checked_add(longest).unwrap_or(now);
    let lasting = plan::plan(&policy, spec, std::slice::from_ref(&node), later);
    let lasting_actions = lasting
        .nodes
        .first()
        .map(|n| {
            let mut all = n.actions.clone();
            all.extend(n.pending.iter().cloned());
            describe(&all)
        })
        .unwrap_or_default();
    // Only what is added later: an action in effect now is not listed twice.
    let now_actions = describe(&p.actions);
    let lasting_actions: Vec<String> = lasting_actions
        .into_iter()
        .filter(|a| !now_actions.contains(a))
        .collect();
    Some(Outcome {
        node: p.node.clone(),
        labels: crate::apply::desired_labels(&policy, &p),
        policy,
        condition: [
            p.condition.status.to_string(),
            p.condition.reason.to_string(),
            p.condition.message.clone(),
        ],
        actions_now: now_actions,
        actions_if_it_lasts: lasting_actions,
        blocked: p.blocked.as_ref().map(|b| b.describe()),
        changes_at: p.next_change.map(|c| c.to_string()),
        gpus: gpu_lines(&p),
        maintenance,
        validation,
        verdict,
    })
}

/// Where a policy's maintenance windows stand, in one line (for `check` and `kubectl gpunode
/// why`).
pub fn window_line(window: &plan::windows::WindowState) -> String {
    match window {
        plan::windows::WindowState::Open => "a window is open: disruptive actions may start".to_string(),
        plan::windows::WindowState::Closed { opens } => {
            format!("outside the windows: disruptive actions wait until {opens}, unless urgent")
        }
        plan::windows::WindowState::Invalid(why) => format!("every window stays closed: {why}"),
    }
}

/// The validation gate `v` and where a node's validation stands (`state`), in one line.
pub fn validation_line(
    v: &gpunode_crds::validation::ValidationPolicy,
    state: &plan::ValidationState,
) -> String {
    let mut gate = format!(
        "before gpunode undoes its cordon and taints, a Job in namespace {} must pass (timeout {})",
        v.namespace, v.timeout
    );
    if let Some(p) = &v.periodic {
        gate = format!(
            "{gate}; idle nodes are validated every {}, at most {} an hour",
            p.every, p.max_per_hour
        );
    }
    match state {
        plan::ValidationState::Idle => gate,
        plan::ValidationState::Running { job, since } => format!("{gate}; Job {job} runs since {since}"),
        plan::ValidationState::Passed { job } => format!("{gate}; Job {job} passed"),
        plan::ValidationState::Failed {
            job,
            outcome,
            message,
        } => {
            format!("{gate}; Job {job} {}: {message}", outcome.as_str())
        }
        plan::ValidationState::Waiting(w) => format!("{gate}; waiting: {}", w.describe()),
    }
}

/// One line per tracked GPU (`gpu 5 (GPU-…): Xid since …; quarantined NoExecute`), then the
/// escalation, if any.
pub fn gpu_lines(p: &plan::NodePlan) -> Vec<String> {
    let mut out: Vec<String> = p
        .markers
        .gpus
        .iter()
        .map(|(key, g)| {
            let subject = plan::GpuTaint {
                gpu: key.clone(),
                index: g.index,
                effect: gpunode_crds::policy::TaintEffect::None,
            }
            .subject();
            let classes: Vec<String> = g
                .classes
                .iter()
                .map(|(c, t)| match t.cleared_at {
                    None => format!("{} since {}", c.as_str(), t.since),
                    Some(cleared) => format!("{} cleared at {cleared}", c.as_str()),
                })
                .collect();
            let evicts = plan::quarantine_of(&p.quarantines, key).filter(|q| !q.evicts().is_empty());
            let state = match (g.quarantined, evicts) {
                (Some(e), Some(q)) => format!("quarantined {}, evicting {}", e.as_str(), q.evicted_names()),
                (Some(e), None) => format!("quarantined {}", e.as_str()),
                (None, _) => "not quarantined".to_string(),
            };
            format!("{subject}: {}; {state}", classes.join(", "))
        })
        .collect();
    if let Some(e) = &p.escalation {
        out.push(format!("escalated: {}", e.describe()));
    }
    out
}
