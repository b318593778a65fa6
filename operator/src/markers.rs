//! What gpunode writes on a Node, and the bookkeeping it reads back so that a restarted or newly
//! elected operator resumes exactly where the last one stopped.
//!
//! | marker | meaning |
//! |---|---|
//! | label `gpunode.dev/policy` | the policy governing the node (its name through `gpunode_crds::names::label_value`) |
//! | label `gpunode.dev/state` | `compliant`, `drifted` or `unknown` |
//! | label `gpunode.dev/drift.<class>` | `true` per active drift class |
//! | taint `gpunode.dev/drift=<class>:<effect>` | from the remediation ladder; any taint with this key is gpunode's |
//! | annotation `gpunode.dev/classes` | per class: when its drift began and when it cleared (JSON) |
//! | annotation `gpunode.dev/cordoned` | `true` when gpunode set `spec.unschedulable` |
//! | annotation `gpunode.dev/drain-started` | when the current drain began |
//! | annotation `gpunode.dev/uncordoned-by-user` | a person uncordoned the node during gpunode's cordon or drain: no cordon or drain until it recovers |
//! | annotation `gpunode.dev/gpus` | per GPU (by UUID): its index, when each of its drift classes began and cleared, and the quarantine in effect (JSON) |
//! | annotation `gpunode.dev/escalated` | when the node's GPU faults were handed to the node's own rules |
//! | annotation `gpunode.dev/unhealthy-gpus` | the UUIDs of the GPUs gpunode quarantines, comma-separated (for a scheduler extension or Kueue) |
//! | label `gpunode.dev/healthy-gpus` | how many of the node's GPUs neither drift nor are quarantined |
//! | DeviceTaintRule annotated `gpunode.dev/node=<node>` | the quarantine of one GPU on a DRA node ([`crate::devices::rules`]) |
//! | annotation `gpunode.dev/validation` | the validation of a recovered node: its Job, when it started, how it ended (JSON) |
//! | label `gpunode.dev/validation` | `running` while a validation Job runs on the node, `failed` while a failed one holds it |
//! | annotation `gpunode.dev/repair` | the repair of a drained node: the step running or last run, the objects it created, the step starts within the window, and whether it needs a person (JSON) |
//!
//! It reads and formats these values; it sends no request (apply does).

use std::collections::BTreeMap;

use gpunode_crds::{DriftClass, policy::TaintEffect};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Label naming the governing policy (`gpunode_crds::names::label_value` of its name).
pub const POLICY_LABEL: &str = "gpunode.dev/policy";
/// Label with the node's state.
pub const STATE_LABEL: &str = "gpunode.dev/state";
/// The prefix of every label, annotation and taint key gpunode reads or writes on a Node (its
/// bookkeeping, repair and validation records, and people's approvals).
pub const PREFIX: &str = "gpunode.dev/";
/// Prefix of the per-class drift labels (`gpunode.dev/drift.thermal=true`).
pub const DRIFT_LABEL_PREFIX: &str = "gpunode.dev/drift.";
/// A node labelled `gpunode.dev/skip=true` is evaluated and reported, never acted on.
pub const SKIP_LABEL: &str = "gpunode.dev/skip";
/// Key of every taint gpunode adds.
pub const TAINT_KEY: &str = "gpunode.dev/drift";
/// The Node condition gpunode maintains.
pub const CONDITION_TYPE: &str = "GpuPolicyCompliant";
/// Per-class drift bookkeeping (JSON).
pub const CLASSES_ANNOTATION: &str = "gpunode.dev/classes";
/// gpunode cordoned the node.
pub const CORDONED_ANNOTATION: &str = "gpunode.dev/cordoned";
/// When the current drain began (RFC 3339).
pub const DRAIN_STARTED_ANNOTATION: &str = "gpunode.dev/drain-started";
/// When the current drain found nothing left to evict (RFC 3339).
pub const DRAINED_ANNOTATION: &str = "gpunode.dev/drained";
/// When a person uncordoned the node under gpunode's cordon or drain (RFC 3339).
pub const USER_UNCORDONED_ANNOTATION: &str = "gpunode.dev/uncordoned-by-user";

/// Per-GPU bookkeeping (JSON).
pub const GPUS_ANNOTATION: &str = "gpunode.dev/gpus";
/// When the node was escalated (RFC 3339).
pub const ESCALATED_ANNOTATION: &str = "gpunode.dev/escalated";
/// The UUIDs of the quarantined GPUs.
pub const UNHEALTHY_GPUS_ANNOTATION: &str = "gpunode.dev/unhealthy-gpus";
/// How many GPUs neither drift nor are quarantined.
pub const HEALTHY_GPUS_LABEL: &str = "gpunode.dev/healthy-gpus";
/// The repair of a drained node (JSON). Removing it (`kubectl annotate node <n>
/// gpunode.dev/repair-`) forgets the attempts and lets the ladder start again.
pub const REPAIR_ANNOTATION: &str = "gpunode.dev/repair";
/// The validation of a recovered node (JSON). Removing it (`kubectl annotate node <n>
/// gpunode.dev/validation-`) runs the validation again.
pub const VALIDATION_ANNOTATION: &str = "gpunode.dev/validation";
/// `running` while a validation Job runs on the node, `failed` while a failed one holds it:
/// other schedulers keep off.
pub const VALIDATION_LABEL: &str = "gpunode.dev/validation";

/// The drift label key of a class.
pub fn drift_label(class: DriftClass) -> String {
    format!("{DRIFT_LABEL_PREFIX}{}", class.label())
}

/// The life of one drift class on one node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClassTrack {
    /// When the drift began (kept through short recoveries, see [`crate::plan`]).
    pub since: Timestamp,
    /// When it was last seen cleared; `None` while it is drifting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_at: Option<Timestamp>,
}

/// The life of one GPU's drifts, and its quarantine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GpuTrack {
    /// The GPU's index as the probe reports it.
    pub index: u32,
    /// Per GPU-scoped drift class of this GPU: since when, and whether it cleared.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub classes: BTreeMap<DriftClass, ClassTrack>,
    /// The quarantine in effect (its effect), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<TaintEffect>,
}

/// The repair of one drained node (`spec.repair`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RepairTrack {
    /// When each step was started, within the policy's window (the attempts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Timestamp>,
    /// The step running, or the last one run in this repair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepRun>,
    /// The objects the steps of this repair created, deleted once the node recovers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<StepObjectRef>,
    /// The repair stopped and needs a person: when, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_human: Option<NeedsHuman>,
}

/// The validation of a recovered node (`spec.validation`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ValidationTrack {
    /// The Job's name (in the policy's validation namespace).
    pub job: String,
    /// When it started (the Job carries it, so a leftover of an earlier run is told apart).
    pub started: Timestamp,
    /// A periodic validation of an idle node (not one before an undo).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub periodic: bool,
    /// How it ended, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<ValidationEnd>,
}

/// How a validation ended.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ValidationEnd {
    /// When.
    pub at: Timestamp,
    /// How.
    pub outcome: ValidationOutcome,
    /// Why, in one line (the Job's condition message).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// The outcome of a validation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ValidationOutcome {
    /// The Job completed.
    Passed,
    /// The Job failed.
    Failed,
    /// The Job ran past the timeout.
    TimedOut,
}

impl ValidationOutcome {
    /// As events spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ValidationOutcome::Passed => "passed",
            ValidationOutcome::Failed => "failed",
            ValidationOutcome::TimedOut => "timed out",
        }
    }
}

/// Why a repair stopped.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NeedsHuman {
    /// When it stopped.
    pub at: Timestamp,
    /// Why, in one line.
    pub why: String,
}

impl RepairTrack {
    /// Nothing worth storing.
    pub fn is_empty(&self) -> bool {
        self == &RepairTrack::default()
    }
}

/// One run of one step.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StepRun {
    /// The step's name.
    pub name: String,
    /// When it started.
    pub started: Timestamp,
    /// Its object exists (its creation was seen); until then a missing object is created, after
    /// it a missing object was deleted by its remediator, which means finished.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub created: bool,
    /// How it ended, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<StepEnd>,
    /// The GPUs a GpuReset step resets, chosen when it started (what drifted then).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<ResetGpu>,
}

/// A GPU a GpuReset step resets.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "camelCase")]
pub struct ResetGpu {
    /// NVML's index.
    pub index: u32,
    /// NVML's UUID.
    pub uuid: String,
}

/// How a step ended.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StepEnd {
    /// When.
    pub at: Timestamp,
    /// How.
    pub outcome: StepOutcome,
}

/// The outcome of a step.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StepOutcome {
    /// It finished; the probe's next report says whether the node is repaired.
    Succeeded,
    /// It reported failure.
    Failed,
    /// It ran past its timeout.
    TimedOut,
}

impl StepOutcome {
    /// As metrics and events spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            StepOutcome::Succeeded => "Succeeded",
            StepOutcome::Failed => "Failed",
            StepOutcome::TimedOut => "TimedOut",
        }
    }
}

/// An object a repair step created.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "camelCase")]
pub struct StepObjectRef {
    /// Its apiVersion.
    pub api_version: String,
    /// Its kind.
    pub kind: String,
    /// Its namespace, if namespaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The uid it got when gpunode made it, recorded once its making was seen: only the object
    /// with this uid (and gpunode's labels for the node) is ever deleted. None until then, and
    /// in records an older gpunode wrote: the object is read first and must carry gpunode's
    /// labels for the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl StepObjectRef {
    /// Whether `other` names the same object (whatever uid either recorded).
    pub fn same_object(&self, other: &StepObjectRef) -> bool {
        self.api_version == other.api_version
            && self.kind == other.kind
            && self.namespace == other.namespace
            && self.name == other.name
    }
}

impl std::fmt::Display for StepObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// A GPU's key in the bookkeeping: its UUID, or `index-<i>` for a GPU reported without one.
pub fn gpu_key(index: u32, uuid: Option<&str>) -> String {
    match uuid {
        Some(u) => u.to_string(),
        None => format!("index-{index}"),
    }
}

/// gpunode's bookkeeping on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Markers {
    /// Per drift class: since when, and whether it cleared.
    pub classes: BTreeMap<DriftClass, ClassTrack>,
    /// gpunode set `spec.unschedulable`.
    pub cordoned_by_us: bool,
    /// The drain in progress began then.
    pub drain_started: Option<Timestamp>,
    /// The drain in progress found nothing left to evict then; no more eviction passes run.
    pub drained: Option<Timestamp>,
    /// A person uncordoned the node under gpunode's cordon or drain then.
    pub user_uncordoned: Option<Timestamp>,
    /// Per GPU, by [`gpu_key`].
    pub gpus: BTreeMap<String, GpuTrack>,
    /// The node's GPU faults went to its node rules then.
    pub escalated: Option<Timestamp>,
    /// The repair of the drained node.
    pub repair: RepairTrack,
    /// The validation of the recovered node.
    pub validation: Option<ValidationTrack>,
}

/// A marker gpunode could not read back (hand-edited or corrupted); it is ignored and
/// rewritten.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {key}={value:?} is not valid: {reason}")]
pub struct MarkerError {
    /// The annotation.
    pub key: &'static str,
    /// Its value.
    pub value: String,
    /// Why it was ignored.
    pub reason: String,
}

impl Markers {
    /// Reads the markers from a node's annotations. Unreadable ones are returned as errors and
    /// treated as absent, so one bad annotation never stops the node from being reconciled.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> (Markers, Vec<MarkerError>) {
        let mut errors = Vec::new();
        let mut markers = Markers::default();
        if let Some(v) = annotations.get(CLASSES_ANNOTATION) {
            match serde_json::from_str(v) {
                Ok(classes) => markers.classes = classes,
                Err(e) => errors.push(MarkerError {
                    key: CLASSES_ANNOTATION,
                    value: v.clone(),
                    reason: e.to_string(),
                }),
            }
        }
        if let Some(v) = annotations.get(REPAIR_ANNOTATION) {
            match serde_json::from_str(v) {
                Ok(repair) => markers.repair = repair,
                Err(e) => errors.push(MarkerError {
                    key: REPAIR_ANNOTATION,
                    value: v.clone(),
                    reason: e.to_string(),
                }),
            }
        }
        if let Some(v) = annotations.get(VALIDATION_ANNOTATION) {
            match serde_json::from_str(v) {
                Ok(validation) => markers.validation = Some(validation),
                Err(e) => errors.push(MarkerError {
                    key: VALIDATION_ANNOTATION,
                    value: v.clone(),
                    reason: e.to_string(),
                }),
            }
        }
        if let Some(v) = annotations.get(GPUS_ANNOTATION) {
            match serde_json::from_str(v) {
                Ok(gpus) => markers.gpus = gpus,
                Err(e) => errors.push(MarkerError {
                    key: GPUS_ANNOTATION,
                    value: v.clone(),
                    reason: e.to_string(),
                }),
            }
        }
        markers.cordoned_by_us = annotations.get(CORDONED_ANNOTATION).is_some_and(|v| v == "true");
        let mut time = |key: &'static str| {
            annotations.get(key).and_then(|v| match v.parse::<Timestamp>() {
                Ok(t) => Some(t),
                Err(e) => {
                    errors.push(MarkerError {
                        key,
                        value: v.clone(),
                        reason: e.to_string(),
                    });
                    None
                }
            })
        };
        markers.drain_started = time(DRAIN_STARTED_ANNOTATION);
        markers.drained = time(DRAINED_ANNOTATION);
        markers.user_uncordoned = time(USER_UNCORDONED_ANNOTATION);
        markers.escalated = time(ESCALATED_ANNOTATION);
        (markers, errors)
    }

    /// The annotations that represent these markers: the complete set gpunode owns, so a
    /// server-side apply of it also removes the ones no longer needed.
    pub fn to_annotations(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if !self.classes.is_empty() {
            // Serializing a map of plain structs cannot fail.
            if let Ok(json) = serde_json::to_string(&self.classes) {
                out.insert(CLASSES_ANNOTATION.to_string(), json);
            }
        }
        if self.cordoned_by_us {
            out.insert(CORDONED_ANNOTATION.to_string(), "true".to_string());
        }
        if let Some(t) = self.drain_started {
            out.insert(DRAIN_STARTED_ANNOTATION.to_string(), t.to_string());
        }
        if let Some(t) = self.drained {
            out.insert(DRAINED_ANNOTATION.to_string(), t.to_string());
        }
        if let Some(t) = self.user_uncordoned {
            out.insert(USER_UNCORDONED_ANNOTATION.to_string(), t.to_string());
        }
        if !self.gpus.is_empty()
            && let Ok(json) = serde_json::to_string(&self.gpus)
        {
            out.insert(GPUS_ANNOTATION.to_string(), json);
        }
        if let Some(t) = self.escalated {
            out.insert(ESCALATED_ANNOTATION.to_string(), t.to_string());
        }
        if !self.repair.is_empty()
            && let Ok(json) = serde_json::to_string(&self.repair)
        {
            out.insert(REPAIR_ANNOTATION.to_string(), json);
        }
        if let Some(v) = &self.validation
            && let Ok(json) = serde_json::to_string(v)
        {
            out.insert(VALIDATION_ANNOTATION.to_string(), json);
        }
        let unhealthy: Vec<&str> = self
            .gpus
            .iter()
            .filter(|(_, g)| g.quarantined.is_some())
            .map(|(k, _)| k.as_str())
            .collect();
        if !unhealthy.is_empty() {
            out.insert(UNHEALTHY_GPUS_ANNOTATION.to_string(), unhealthy.join(","));
        }
        out
    }

    /// The quarantines in effect: GPU key, index and effect.
    pub fn quarantines(&self) -> impl Iterator<Item = (&str, u32, TaintEffect)> {
        self.gpus
            .iter()
            .filter_map(|(k, g)| g.quarantined.map(|e| (k.as_str(), g.index, e)))
    }
}

/// One gpunode taint: `gpunode.dev/drift=<class>:<effect>`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriftTaint {
    /// The effect; gpunode has at most one taint per effect.
    pub effect: TaintEffect,
    /// The first class (in ladder order) that asks for it, lower case.
    pub value: String,
}

impl DriftTaint {
    /// `gpunode.dev/drift=thermal:NoSchedule`.
    pub fn display(&self) -> String {
        format!("{TAINT_KEY}={}:{}", self.value, self.effect.as_str())
    }
}

/// gpunode's taint among a node's taints (key `gpunode.dev/drift`), if this is one.
pub fn drift_taint(t: &k8s_openapi::api::core::v1::Taint) -> Option<DriftTaint> {
    if t.key != TAINT_KEY {
        return None;
    }
    let effect = match t.effect.as_str() {
        "NoSchedule" => TaintEffect::NoSchedule,
        "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
        "NoExecute" => TaintEffect::NoExecute,
        _ => return None,
    };
    Some(DriftTaint {
        effect,
        value: t.value.clone().unwrap_or_default(),
    })
}

/// gpunode's taints on a node.
pub fn drift_taints(node: &k8s_openapi::api::core::v1::Node) -> std::collections::BTreeSet<DriftTaint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| ts.iter().filter_map(drift_taint).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    /// Bookkeeping with every marker set.
    fn every_marker() -> Markers {
        Markers {
            classes: BTreeMap::from([
                (
                    DriftClass::Thermal,
                    ClassTrack {
                        since: ts("2026-11-29T10:00:00Z"),
                        cleared_at: None,
                    },
                ),
                (
                    DriftClass::Xid,
                    ClassTrack {
                        since: ts("2026-11-29T09:00:00Z"),
                        cleared_at: Some(ts("2026-11-29T09:30:00Z")),
                    },
                ),
            ]),
            cordoned_by_us: true,
            drain_started: Some(ts("2026-11-29T10:01:00Z")),
            drained: Some(ts("2026-11-29T10:03:00Z")),
            user_uncordoned: None,
            gpus: BTreeMap::from([(
                "GPU-5".to_string(),
                GpuTrack {
                    index: 5,
                    classes: BTreeMap::from([(
                        DriftClass::Xid,
                        ClassTrack {
                            since: ts("2026-11-29T09:00:00Z"),
                            cleared_at: None,
                        },
                    )]),
                    quarantined: Some(TaintEffect::NoExecute),
                },
            )]),
            escalated: Some(ts("2026-11-29T10:02:00Z")),
            repair: RepairTrack {
                attempts: vec![ts("2026-11-29T10:04:00Z")],
                step: Some(StepRun {
                    name: "reboot".to_string(),
                    started: ts("2026-11-29T10:04:00Z"),
                    created: true,
                    ended: Some(StepEnd {
                        at: ts("2026-11-29T10:09:00Z"),
                        outcome: StepOutcome::TimedOut,
                    }),
                    gpus: vec![ResetGpu {
                        index: 5,
                        uuid: "GPU-5".to_string(),
                    }],
                }),
                objects: vec![StepObjectRef {
                    api_version: "remediation.example.com/v1".to_string(),
                    kind: "Reboot".to_string(),
                    namespace: Some("ops".to_string()),
                    name: "node-1".to_string(),
                    uid: Some("0b7f6a4e-5f64-4d2c-9a43-1c2d3e4f5a6b".to_string()),
                }],
                needs_human: Some(NeedsHuman {
                    at: ts("2026-11-29T10:09:00Z"),
                    why: "every step was tried".to_string(),
                }),
            },
            validation: Some(ValidationTrack {
                job: "gpunode-validation-node-1-mz5k0g".to_string(),
                started: ts("2026-11-29T10:20:00Z"),
                periodic: false,
                ended: Some(ValidationEnd {
                    at: ts("2026-11-29T10:25:00Z"),
                    outcome: ValidationOutcome::Failed,
                    message: "BackoffLimitExceeded".to_string(),
                }),
            }),
        }
    }

    #[test]
    fn markers_round_trip_through_annotations() {
        let markers = every_marker();
        let annotations = markers.to_annotations();
        assert_eq!(
            annotations.get(GPUS_ANNOTATION).map(String::as_str),
            Some(
                r#"{"GPU-5":{"index":5,"classes":{"Xid":{"since":"2026-11-29T09:00:00Z"}},"quarantined":"NoExecute"}}"#
            )
        );
        assert_eq!(
            annotations.get(UNHEALTHY_GPUS_ANNOTATION).map(String::as_str),
            Some("GPU-5")
        );
        assert_eq!(
            annotations.get(CLASSES_ANNOTATION).map(String::as_str),
            Some(
                r#"{"Xid":{"since":"2026-11-29T09:00:00Z","clearedAt":"2026-11-29T09:30:00Z"},"Thermal":{"since":"2026-11-29T10:00:00Z"}}"#
            )
        );
        assert_eq!(
            annotations.get(VALIDATION_ANNOTATION).map(String::as_str),
            Some(
                r#"{"job":"gpunode-validation-node-1-mz5k0g","started":"2026-11-29T10:20:00Z","ended":{"at":"2026-11-29T10:25:00Z","outcome":"Failed","message":"BackoffLimitExceeded"}}"#
            )
        );
        assert_eq!(
            annotations.get(REPAIR_ANNOTATION).map(String::as_str),
            Some(
                r#"{"attempts":["2026-11-29T10:04:00Z"],"step":{"name":"reboot","started":"2026-11-29T10:04:00Z","created":true,"ended":{"at":"2026-11-29T10:09:00Z","outcome":"TimedOut"},"gpus":[{"index":5,"uuid":"GPU-5"}]},"objects":[{"apiVersion":"remediation.example.com/v1","kind":"Reboot","namespace":"ops","name":"node-1","uid":"0b7f6a4e-5f64-4d2c-9a43-1c2d3e4f5a6b"}],"needsHuman":{"at":"2026-11-29T10:09:00Z","why":"every step was tried"}}"#
            )
        );
        let (back, errors) = Markers::from_annotations(&annotations);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(back, markers);
    }

    #[test]
    fn a_repair_record_without_uids_still_reads() {
        let old = BTreeMap::from([(
            REPAIR_ANNOTATION.to_string(),
            r#"{"objects":[{"apiVersion":"gpunode.dev/v1alpha1","kind":"GpuResetRequest","name":"n-gpu-0"}]}"#
                .to_string(),
        )]);
        let (m, errors) = Markers::from_annotations(&old);
        assert!(errors.is_empty(), "{errors:?}");
        let o = &m.repair.objects[0];
        assert_eq!((o.name.as_str(), o.uid.as_deref()), ("n-gpu-0", None));
        let with_uid = StepObjectRef {
            uid: Some("u-1".to_string()),
            ..o.clone()
        };
        assert!(
            with_uid.same_object(o),
            "the same object, whatever uid either recorded"
        );
        let other = StepObjectRef {
            name: "n-gpu-1".to_string(),
            ..o.clone()
        };
        assert!(!other.same_object(o));
    }

    #[test]
    fn unreadable_markers_are_reported_and_ignored() {
        let annotations = BTreeMap::from([
            (CLASSES_ANNOTATION.to_string(), "{not json".to_string()),
            (DRAIN_STARTED_ANNOTATION.to_string(), "yesterday".to_string()),
            (CORDONED_ANNOTATION.to_string(), "true".to_string()),
        ]);
        let (markers, errors) = Markers::from_annotations(&annotations);
        assert_eq!(errors.len(), 2);
        assert!(markers.classes.is_empty());
        assert_eq!(markers.drain_started, None);
        assert!(markers.cordoned_by_us);
    }

    #[test]
    fn taints_display_like_kubectl() {
        let t = DriftTaint {
            effect: TaintEffect::NoSchedule,
            value: "thermal".to_string(),
        };
        assert_eq!(t.display(), "gpunode.dev/drift=thermal:NoSchedule");
        assert_eq!(drift_label(DriftClass::Nvlink), "gpunode.dev/drift.nvlink");
    }
}
