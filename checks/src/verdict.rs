//! What [`evaluate`](crate::evaluate::evaluate) decides about one node: its state, the drifts
//! that prove it, and the checks that could not be made.
//!
//! A [`Drift`] is a certain fact from a fresh report (a GPU at 91 C under a limit of 85 C). An
//! [`Unknown`] is a check the policy asks for that could not be made (no fresh report, a failed
//! collector, a field the probe could not read). Unknown is never drift: only a remediation rule
//! that lists the class `Stale` acts on it.

use std::{collections::BTreeSet, fmt};

use gpunode_crds::DriftClass;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The verdict on a node, as used in the `gpunode.dev/state` label.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Every check the policy asks for was made and passed.
    Compliant,
    /// At least one check failed (whatever else is unknown).
    Drifted,
    /// Nothing failed, but at least one check could not be made.
    Unknown,
}

impl NodeState {
    /// The state as a label value: `compliant`, `drifted` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Compliant => "compliant",
            NodeState::Drifted => "drifted",
            NodeState::Unknown => "unknown",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One failed check.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "camelCase")]
pub struct Drift {
    /// The drift class remediation rules and labels are keyed by.
    pub class: DriftClass,
    /// The policy field that failed, for example `gpu.driverVersion` or `network.pfcPriorities`.
    pub check: String,
    /// What the policy asks for, for example `>=550.54.15, <560`.
    pub expected: String,
    /// What the report shows, for example `535.129.03`.
    pub actual: String,
    /// The GPU index, for per-GPU checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// The RDMA device, chassis sensor or fan, for checks about one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

impl Drift {
    /// One line, for example `gpu 3: cooling.forbiddenThrottleReasons: expected none of
    /// [HwThermalSlowdown], got [HwThermalSlowdown, SwThermalSlowdown]`.
    pub fn message(&self) -> String {
        format!(
            "{}{}: expected {}, got {}",
            subject(self.gpu, self.device.as_deref()),
            self.check,
            self.expected,
            self.actual
        )
    }
}

/// One check the policy asks for that could not be made. Its class is always
/// [`DriftClass::Stale`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "camelCase")]
pub struct Unknown {
    /// The policy field that could not be checked (`gpu.eccMode`), or `report` when there is no
    /// fresh report at all.
    pub check: String,
    /// Why, for example `not reported`, `NVML: NotSupported`, `nvml collector failed: ...` or
    /// `report is 5m12s old (staleAfter 3m)`. Checks about one RDMA device or sensor name it
    /// first (`mlx5_0: not reported`).
    pub reason: String,
    /// The GPU index, for per-GPU checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
}

/// The check name of the unknowns that say there is no fresh report to evaluate.
pub const REPORT_CHECK: &str = "report";

impl Unknown {
    /// One line, for example `gpu 2: gpu.maxRetiredPages: NVML: NotSupported`, or just the
    /// reason for the `report` check (`report is 5m12s old (staleAfter 3m)`).
    pub fn message(&self) -> String {
        if self.check == REPORT_CHECK {
            return format!("{}{}", subject(self.gpu, None), self.reason);
        }
        format!("{}{}: {}", subject(self.gpu, None), self.check, self.reason)
    }

    /// Always [`DriftClass::Stale`].
    pub fn class(&self) -> DriftClass {
        DriftClass::Stale
    }
}

/// What a policy says about one node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// Drifted if any drift, else Unknown if any unknown, else Compliant.
    pub state: NodeState,
    /// Failed checks, sorted by check, then GPU, then device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drifts: Vec<Drift>,
    /// Checks that could not be made, sorted by check, then GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknowns: Vec<Unknown>,
    /// When this verdict changes with time alone, the report unchanged: a fatal XID leaves
    /// `xidWindow`, a power brake outlasts `maxPowerBrake` (not the report going stale: the
    /// planner counts that from the latest heartbeat). The operator looks again then.
    #[serde(skip)]
    pub changes_at: Option<Timestamp>,
}

impl Verdict {
    /// A verdict whose state follows from its drifts and unknowns, both sorted and deduplicated.
    pub fn new(mut drifts: Vec<Drift>, mut unknowns: Vec<Unknown>) -> Verdict {
        drifts.sort_by(|a, b| {
            (&a.check, a.gpu, &a.device, &a.expected, &a.actual, a.class).cmp(&(
                &b.check,
                b.gpu,
                &b.device,
                &b.expected,
                &b.actual,
                b.class,
            ))
        });
        drifts.dedup();
        unknowns.sort_by(|a, b| (&a.check, a.gpu, &a.reason).cmp(&(&b.check, b.gpu, &b.reason)));
        unknowns.dedup();
        let state = if !drifts.is_empty() {
            NodeState::Drifted
        } else if !unknowns.is_empty() {
            NodeState::Unknown
        } else {
            NodeState::Compliant
        };
        Verdict {
            state,
            drifts,
            unknowns,
            changes_at: None,
        }
    }

    /// The same verdict, changing with time alone at `at`.
    pub fn changing_at(mut self, at: Option<Timestamp>) -> Verdict {
        self.changes_at = at;
        self
    }

    /// The drift classes, plus `Stale` when some check is unknown.
    pub fn classes(&self) -> BTreeSet<DriftClass> {
        let mut classes: BTreeSet<DriftClass> = self.drifts.iter().map(|d| d.class).collect();
        if !self.unknowns.is_empty() {
            classes.insert(DriftClass::Stale);
        }
        classes
    }

    /// One line for conditions and events: the state, the classes and the first finding, for
    /// example `drifted (Thermal, Throttle): gpu 3: cooling.maxGpuCelsius: expected <= 85 C,
    /// got 91 C; 2 more drifts, 1 check unknown`.
    pub fn summary(&self) -> String {
        match self.state {
            NodeState::Compliant => "compliant: every check of the policy passed".to_string(),
            NodeState::Drifted => {
                let classes: Vec<&str> = self
                    .drifts
                    .iter()
                    .map(|d| d.class)
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .map(DriftClass::as_str)
                    .collect();
                let first = self.drifts.first().map(Drift::message).unwrap_or_default();
                let mut more = Vec::new();
                if self.drifts.len() > 1 {
                    more.push(count(self.drifts.len() - 1, "more drift", "more drifts"));
                }
                if !self.unknowns.is_empty() {
                    more.push(count(self.unknowns.len(), "check unknown", "checks unknown"));
                }
                let tail = if more.is_empty() {
                    String::new()
                } else {
                    format!("; {}", more.join(", "))
                };
                format!("drifted ({}): {first}{tail}", classes.join(", "))
            }
            NodeState::Unknown => {
                let first = self.unknowns.first().map(Unknown::message).unwrap_or_default();
                let tail = if self.unknowns.len() > 1 {
                    format!(
                        "; {}",
                        count(
                            self.unknowns.len() - 1,
                            "more check unknown",
                            "more checks unknown"
                        )
                    )
                } else {
                    String::new()
                };
                format!("unknown: {first}{tail}")
            }
        }
    }
}

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `gpu 3: `, `mlx5_0: ` or nothing.
fn subject(gpu: Option<u32>, device: Option<&str>) -> String {
    match (gpu, device) {
        (Some(g), Some(d)) => format!("gpu {g} {d}: "),
        (Some(g), None) => format!("gpu {g}: "),
        (None, Some(d)) => format!("{d}: "),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle_drift() -> Drift {
        Drift {
            class: DriftClass::Throttle,
            check: "cooling.forbiddenThrottleReasons".to_string(),
            expected: "none of [HwThermalSlowdown]".to_string(),
            actual: "[HwThermalSlowdown, SwThermalSlowdown]".to_string(),
            gpu: Some(3),
            device: None,
        }
    }

    fn unknown(check: &str, reason: &str, gpu: Option<u32>) -> Unknown {
        Unknown {
            check: check.to_string(),
            reason: reason.to_string(),
            gpu,
        }
    }

    #[test]
    fn states_print_as_label_values() {
        assert_eq!(NodeState::Compliant.to_string(), "compliant");
        assert_eq!(NodeState::Drifted.to_string(), "drifted");
        assert_eq!(NodeState::Unknown.to_string(), "unknown");
    }

    #[test]
    fn a_drift_message_names_the_gpu_the_check_and_both_values() {
        assert_eq!(
            throttle_drift().message(),
            "gpu 3: cooling.forbiddenThrottleReasons: expected none of [HwThermalSlowdown], got [HwThermalSlowdown, SwThermalSlowdown]"
        );
    }

    #[test]
    fn a_device_drift_message_names_the_device() {
        let d = Drift {
            class: DriftClass::Network,
            check: "network.minMtu".to_string(),
            expected: ">= 9000".to_string(),
            actual: "1500".to_string(),
            gpu: None,
            device: Some("mlx5_0".to_string()),
        };
        assert_eq!(d.message(), "mlx5_0: network.minMtu: expected >= 9000, got 1500");
    }

    #[test]
    fn an_unknown_message_names_the_check_except_for_the_report_itself() {
        assert_eq!(
            unknown("gpu.maxRetiredPages", "NVML: NotSupported", Some(2)).message(),
            "gpu 2: gpu.maxRetiredPages: NVML: NotSupported"
        );
        assert_eq!(
            unknown(REPORT_CHECK, "report is 5m12s old (staleAfter 3m)", None).message(),
            "report is 5m12s old (staleAfter 3m)"
        );
    }

    #[test]
    fn state_follows_drifts_then_unknowns() {
        assert_eq!(Verdict::new(vec![], vec![]).state, NodeState::Compliant);
        assert_eq!(
            Verdict::new(vec![], vec![unknown("gpu.count", "not reported", None)]).state,
            NodeState::Unknown
        );
        assert_eq!(
            Verdict::new(
                vec![throttle_drift()],
                vec![unknown("gpu.count", "not reported", None)]
            )
            .state,
            NodeState::Drifted
        );
    }

    #[test]
    fn classes_add_stale_for_unknowns() {
        let v = Verdict::new(
            vec![throttle_drift()],
            vec![unknown("gpu.count", "not reported", None)],
        );
        assert_eq!(
            v.classes(),
            BTreeSet::from([DriftClass::Throttle, DriftClass::Stale])
        );
        assert_eq!(Verdict::new(vec![], vec![]).classes(), BTreeSet::new());
    }

    #[test]
    fn summaries_are_one_line_with_the_first_finding_and_counts() {
        assert_eq!(
            Verdict::new(vec![], vec![]).summary(),
            "compliant: every check of the policy passed"
        );
        let mut other = throttle_drift();
        other.gpu = Some(5);
        let v = Verdict::new(
            vec![other, throttle_drift()],
            vec![unknown("gpu.count", "not reported", None)],
        );
        assert_eq!(
            v.summary(),
            "drifted (Throttle): gpu 3: cooling.forbiddenThrottleReasons: expected none of [HwThermalSlowdown], got [HwThermalSlowdown, SwThermalSlowdown]; 1 more drift, 1 check unknown"
        );
        let v = Verdict::new(
            vec![],
            vec![
                unknown(REPORT_CHECK, "report has no status", None),
                unknown("x", "y", None),
                unknown("z", "y", None),
            ],
        );
        assert_eq!(
            v.summary(),
            "unknown: report has no status; 2 more checks unknown"
        );
    }

    #[test]
    fn new_sorts_and_deduplicates() {
        let mut d5 = throttle_drift();
        d5.gpu = Some(5);
        let v = Verdict::new(
            vec![d5.clone(), throttle_drift(), d5.clone()],
            vec![
                unknown("b", "r", None),
                unknown("a", "r", Some(1)),
                unknown("a", "r", Some(1)),
            ],
        );
        assert_eq!(v.drifts, vec![throttle_drift(), d5]);
        assert_eq!(
            v.unknowns,
            vec![unknown("a", "r", Some(1)), unknown("b", "r", None)]
        );
    }
}
