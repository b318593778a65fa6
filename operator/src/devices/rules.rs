//! gpunode's DeviceTaintRules: one per quarantined GPU of a DRA node. This module holds what a
//! rule looks like ([`desired`]: its name, labels, annotations, owner and taint), which node and
//! GPU a rule is for ([`is_for`], [`gpu_of`]), and what to write so that a node has exactly the
//! rules its quarantines call for ([`changes`]). Pure: the writer (`apply::devices`) sends what
//! it computes and the caches (`observe`) read rules through it; it may import neither.
//!
//! A rule is named by `gpunode_crds::names::device_rule_name`, so any replica, before or after a
//! restart or a leader change, writes the same object (server-side apply: created once, never
//! duplicated). Existing rules are found by their labels and annotations, never by recomputing
//! their names: gpunode's `managed-by` label, and the node and GPU in full in the
//! `gpunode.dev/node` and `gpunode.dev/gpu` annotations (the labels of the same keys carry them
//! through `names::label_value`, which hashes a value too long for a label). Rules without the
//! `managed-by` label are never read, changed or deleted.
//!
//! Rules written before the names module ([`legacy`]) have no annotations and their node label
//! is the node's name cut to 63 characters, which two nodes can share: such a rule is taken as a
//! node's only when its name says so too. A node adopts its legacy rule of a GPU instead of
//! writing a second one, and brings its labels and annotations up to date.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
};

use gpunode_crds::names;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::{
    ResourceExt,
    core::{ObjectMeta, TypeMeta},
};
use serde::{Deserialize, Serialize};

use super::discovery::Dra;
use crate::{
    markers::POLICY_LABEL,
    plan::{DeviceRef, Quarantine, QuarantineTarget},
};

/// Label naming the node a rule quarantines a GPU of (through `names::label_value`).
pub const NODE_LABEL: &str = "gpunode.dev/node";
/// Label naming the GPU (its UUID, through `names::label_value`).
pub const GPU_LABEL: &str = "gpunode.dev/gpu";
/// Annotation with the node's whole name.
pub const NODE_ANNOTATION: &str = "gpunode.dev/node";
/// Annotation with the GPU's whole UUID.
pub const GPU_ANNOTATION: &str = "gpunode.dev/gpu";
/// `app.kubernetes.io/managed-by` on every rule gpunode writes.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "gpunode");
/// The selector of gpunode's rules.
pub const RULE_SELECTOR: &str = "app.kubernetes.io/managed-by=gpunode";
/// The taint key of gpunode's device taints; the value is the policy's name.
pub const DEVICE_TAINT_KEY: &str = "gpunode.dev/quarantine";

/// A DeviceTaintRule, as gpunode writes it.
pub type DeviceTaintRule = kube::core::Object<RuleSpec, serde_json::Value>;

/// A DeviceTaintRule's spec.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuleSpec {
    /// Which device.
    pub device_selector: RuleSelector,
    /// The taint.
    pub taint: RuleTaint,
}

/// The device a rule selects.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct RuleSelector {
    /// The driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// A device taint.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuleTaint {
    /// The key.
    pub key: String,
    /// The value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `None`, `NoSchedule` or `NoExecute`.
    pub effect: String,
    /// When it was added (set by the API server when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<Time>,
}

/// The policy a rule belongs to.
#[derive(Clone, Debug)]
pub struct Owner {
    /// Its name.
    pub name: String,
    /// Its uid (for the owner reference).
    pub uid: String,
    /// Its apiVersion.
    pub api_version: String,
    /// Its kind.
    pub kind: String,
}

/// Whether `rule` is gpunode's (its `managed-by` label).
pub fn is_ours(rule: &DeviceTaintRule) -> bool {
    rule.labels().get(MANAGED_BY.0).is_some_and(|v| v == MANAGED_BY.1)
}

/// The node a rule of gpunode's names: its node annotation, or for a [`legacy`] rule its node
/// label (which may be a longer name cut short). To tell whether a rule is a given node's, use
/// [`is_for`].
pub fn node_of(rule: &DeviceTaintRule) -> Option<&str> {
    if !is_ours(rule) {
        return None;
    }
    rule.annotations()
        .get(NODE_ANNOTATION)
        .or_else(|| rule.labels().get(NODE_LABEL))
        .map(String::as_str)
}

/// The GPU (UUID) a rule quarantines: its GPU annotation, or for a [`legacy`] rule its GPU label.
pub fn gpu_of(rule: &DeviceTaintRule) -> Option<&str> {
    rule.annotations()
        .get(GPU_ANNOTATION)
        .or_else(|| rule.labels().get(GPU_LABEL))
        .map(String::as_str)
}

/// Whether `rule` is one of gpunode's rules for `node`.
pub fn is_for(rule: &DeviceTaintRule, node: &str) -> bool {
    if !is_ours(rule) {
        return false;
    }
    match rule.annotations().get(NODE_ANNOTATION) {
        Some(n) => n == node,
        None => legacy::is_for(rule, node),
    }
}

/// gpunode's rules for `node` among `rules`.
pub fn for_node<'a>(
    rules: impl IntoIterator<Item = &'a DeviceTaintRule>,
    node: &str,
) -> Vec<&'a DeviceTaintRule> {
    rules.into_iter().filter(|r| is_for(r, node)).collect()
}

/// gpunode's rules grouped by the node they name ([`node_of`]).
pub struct RulesByNode(HashMap<String, Vec<Arc<DeviceTaintRule>>>);

impl RulesByNode {
    /// Groups `rules`; rules without gpunode's labels are left out.
    pub fn new(rules: impl IntoIterator<Item = Arc<DeviceTaintRule>>) -> RulesByNode {
        let mut out: HashMap<String, Vec<Arc<DeviceTaintRule>>> = HashMap::new();
        for r in rules {
            if let Some(node) = node_of(&r).map(str::to_string) {
                out.entry(node).or_default().push(r);
            }
        }
        RulesByNode(out)
    }

    /// gpunode's rules for `node` ([`is_for`]).
    pub fn of(&self, node: &str) -> Vec<&DeviceTaintRule> {
        let cut = legacy::label_value(node);
        let keys = if cut == node {
            vec![node]
        } else {
            vec![node, cut.as_str()]
        };
        keys.into_iter()
            .filter_map(|k| self.0.get(k))
            .flatten()
            .map(AsRef::as_ref)
            .filter(|r| is_for(r, node))
            .collect()
    }
}

/// The rules a node's quarantines call for (only those on DRA devices), by name.
pub fn desired(
    dra: &Dra,
    node: &str,
    owner: &Owner,
    quarantines: &[Quarantine],
) -> BTreeMap<String, DeviceTaintRule> {
    quarantines
        .iter()
        .filter_map(|q| match &q.target {
            QuarantineTarget::Dra(device) => Some((q, device)),
            QuarantineTarget::DevicePlugin { .. } => None,
        })
        .map(|(q, device)| {
            let rule = rule(dra, node, owner, q, device);
            (rule.name_any(), rule)
        })
        .collect()
}

/// The rule that quarantines `device` of `node` as `q` says.
fn rule(dra: &Dra, node: &str, owner: &Owner, q: &Quarantine, device: &DeviceRef) -> DeviceTaintRule {
    let gpu = q.taint.gpu.as_str();
    let labels = BTreeMap::from([
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
        (NODE_LABEL.to_string(), names::label_value(node)),
        (GPU_LABEL.to_string(), names::label_value(gpu)),
        (POLICY_LABEL.to_string(), names::label_value(&owner.name)),
    ]);
    let annotations = BTreeMap::from([
        (NODE_ANNOTATION.to_string(), node.to_string()),
        (GPU_ANNOTATION.to_string(), gpu.to_string()),
    ]);
    DeviceTaintRule {
        types: Some(TypeMeta {
            api_version: dra.rules.api_version.clone(),
            kind: dra.rules.kind.clone(),
        }),
        metadata: ObjectMeta {
            name: Some(names::device_rule_name(node, gpu)),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: owner.api_version.clone(),
                kind: owner.kind.clone(),
                name: owner.name.clone(),
                uid: owner.uid.clone(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: RuleSpec {
            device_selector: RuleSelector {
                driver: Some(device.driver.clone()),
                pool: Some(device.pool.clone()),
                device: Some(device.device.clone()),
            },
            taint: RuleTaint {
                key: DEVICE_TAINT_KEY.to_string(),
                value: Some(owner.name.clone()),
                effect: q.taint.effect.as_str().to_string(),
                time_added: None,
            },
        },
        status: None,
    }
}

/// `want` with each rule that has no namesake in `have` renamed after a rule of `have` that
/// quarantines the same GPU and is not being deleted, if there is one: a rule an earlier release
/// named otherwise is kept and brought up to date instead of being written twice.
pub fn adopt(
    want: BTreeMap<String, DeviceTaintRule>,
    have: &[&DeviceTaintRule],
) -> BTreeMap<String, DeviceTaintRule> {
    let existing: BTreeSet<&str> = have.iter().filter_map(|r| r.metadata.name.as_deref()).collect();
    let mut out = BTreeMap::new();
    for (name, mut rule) in want {
        let adoptee = (!existing.contains(name.as_str()))
            .then(|| {
                have.iter().find(|old| {
                    old.metadata.deletion_timestamp.is_none()
                        && gpu_of(old).is_some()
                        && gpu_of(old) == gpu_of(&rule)
                        && old.metadata.name.as_ref().is_some_and(|n| !out.contains_key(n))
                })
            })
            .flatten()
            .and_then(|old| old.metadata.name.clone());
        let name = match adoptee {
            Some(old) => {
                rule.metadata.name = Some(old.clone());
                old
            }
            None => name,
        };
        out.insert(name, rule);
    }
    out
}

/// What to write so that exactly `desired` of gpunode's rules exist for a node, given the ones
/// that do (`existing`, gpunode's own rules of the node): rules to apply (new, or whose device,
/// taint, labels or annotations changed) and rules to delete.
pub fn diff<'a>(
    desired: &'a BTreeMap<String, DeviceTaintRule>,
    existing: &[&DeviceTaintRule],
) -> (Vec<&'a DeviceTaintRule>, Vec<String>) {
    let by_name: BTreeMap<String, &DeviceTaintRule> = existing.iter().map(|r| (r.name_any(), *r)).collect();
    let apply = desired
        .iter()
        .filter(|(name, want)| {
            by_name.get(*name).is_none_or(|have| {
                have.spec.device_selector != want.spec.device_selector
                    || have.spec.taint.key != want.spec.taint.key
                    || have.spec.taint.value != want.spec.taint.value
                    || have.spec.taint.effect != want.spec.taint.effect
                    || have.metadata.deletion_timestamp.is_some()
                    || lacks(&have.metadata.labels, &want.metadata.labels)
                    || lacks(&have.metadata.annotations, &want.metadata.annotations)
            })
        })
        .map(|(_, r)| r)
        .collect();
    let delete = by_name
        .into_iter()
        .filter(|(name, r)| !desired.contains_key(name) && r.metadata.deletion_timestamp.is_none())
        .map(|(name, _)| name)
        .collect();
    (apply, delete)
}

/// Whether `have` lacks an entry of `want` (or has another value for it).
fn lacks(have: &Option<BTreeMap<String, String>>, want: &Option<BTreeMap<String, String>>) -> bool {
    want.iter()
        .flatten()
        .any(|(k, v)| have.as_ref().and_then(|h| h.get(k)) != Some(v))
}

/// What to write for `node`'s quarantines: rules to apply and names of rules to delete, given
/// gpunode's rules that are for the node (`have`, from [`for_node`] or [`RulesByNode::of`]).
pub fn changes(
    dra: &Dra,
    node: &str,
    owner: &Owner,
    quarantines: &[Quarantine],
    have: &[&DeviceTaintRule],
) -> (Vec<DeviceTaintRule>, Vec<String>) {
    let want = adopt(desired(dra, node, owner, quarantines), have);
    let (apply, delete) = diff(&want, have);
    (apply.into_iter().cloned().collect(), delete)
}

/// Rules written before `gpunode_crds::names` derived names and label values: no annotations; the
/// node and GPU labels the name or UUID cut to 63 characters (and stripped of `-`, `_` and `.` at
/// the end); the name `gpunode-<node>-<uuid in lower case>`, or `gpunode-` and 16 hexadecimal
/// digits of Rust's `DefaultHasher` when that was not a valid name.
pub mod legacy {
    use kube::ResourceExt;

    use super::{DeviceTaintRule, GPU_LABEL, NODE_LABEL};

    /// A label value as it was: cut to 63 characters, then stripped of `-`, `_` and `.` at the end.
    pub fn label_value(s: &str) -> String {
        let cut: String = s.chars().take(63).collect();
        cut.trim_end_matches(['-', '_', '.']).to_string()
    }

    /// Whether a rule without annotations is `node`'s: its node label is `node` cut as it was,
    /// and its name is `node`'s readable name for the GPU its label names. A hashed name cannot
    /// be told apart that way: such a rule is `node`'s when its label is the whole name (only a
    /// node whose name is the cut of a much longer one's could mistake that one's rule for its
    /// own; a node whose name was cut never claims one, and its rule goes with its policy).
    pub fn is_for(rule: &DeviceTaintRule, node: &str) -> bool {
        let labels = rule.labels();
        let (Some(label), Some(gpu)) = (labels.get(NODE_LABEL), labels.get(GPU_LABEL)) else {
            return false;
        };
        if *label != label_value(node) {
            return false;
        }
        let name = rule.name_any();
        name == format!("gpunode-{node}-{}", gpu.to_ascii_lowercase()) || (label == node && is_hashed(&name))
    }

    /// Whether `name` is a hashed name as it was: `gpunode-` and 16 hexadecimal digits.
    fn is_hashed(name: &str) -> bool {
        name.strip_prefix("gpunode-")
            .is_some_and(|h| h.len() == 16 && h.chars().all(|c| c.is_ascii_hexdigit()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::GpuTaint;
    use gpunode_crds::policy::TaintEffect;
    use kube::core::ApiResource;

    fn dra() -> Dra {
        let resource = |kind: &str, plural: &str| ApiResource {
            group: "resource.k8s.io".into(),
            version: "v1".into(),
            api_version: "resource.k8s.io/v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        Dra {
            slices: resource("ResourceSlice", "resourceslices"),
            rules: resource("DeviceTaintRule", "devicetaintrules"),
        }
    }

    fn owner() -> Owner {
        Owner {
            name: "h100".into(),
            uid: "u-1".into(),
            api_version: "gpunode.dev/v1alpha1".into(),
            kind: "GpuNodePolicy".into(),
        }
    }

    fn quarantine(index: u32, effect: TaintEffect) -> Quarantine {
        Quarantine {
            taint: GpuTaint {
                gpu: format!("GPU-ABC-{index}"),
                index,
                effect,
            },
            target: QuarantineTarget::Dra(DeviceRef {
                driver: "gpu.nvidia.com".into(),
                pool: "n1".into(),
                device: format!("gpu-{index}"),
            }),
        }
    }

    /// A rule as releases before `gpunode_crds::names` wrote it: no annotations, the node and
    /// GPU labels cut to 63 characters, named `name`.
    fn legacy_rule(node: &str, index: u32, name: &str) -> DeviceTaintRule {
        let q = quarantine(index, TaintEffect::NoExecute);
        let device = DeviceRef {
            driver: "gpu.nvidia.com".into(),
            pool: node.into(),
            device: format!("gpu-{index}"),
        };
        let mut rule = rule(&dra(), node, &owner(), &q, &device);
        rule.metadata.annotations = None;
        rule.metadata.name = Some(name.to_string());
        let labels = rule.labels_mut();
        labels.insert(NODE_LABEL.into(), legacy::label_value(node));
        labels.insert(GPU_LABEL.into(), legacy::label_value(&format!("GPU-ABC-{index}")));
        rule
    }

    /// The names of the rules to apply, and those to delete.
    fn named<R: std::borrow::Borrow<DeviceTaintRule>>(
        (apply, delete): (Vec<R>, Vec<String>),
    ) -> (Vec<String>, Vec<String>) {
        (apply.iter().map(|r| r.borrow().name_any()).collect(), delete)
    }

    const NOTHING: (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());

    /// Two nodes whose names share their first 63 characters: syncing one must not delete the
    /// other's rules (before the names module both had the same node label, and did).
    #[test]
    fn two_nodes_sharing_a_63_character_prefix_keep_separate_rules() {
        let prefix = "a".repeat(63);
        let (a, b) = (format!("{prefix}-1"), format!("{prefix}-2"));
        let want_a = desired(&dra(), &a, &owner(), &[quarantine(1, TaintEffect::NoExecute)]);
        let want_b = desired(&dra(), &b, &owner(), &[quarantine(2, TaintEffect::NoExecute)]);
        let all: Vec<DeviceTaintRule> = want_a.values().chain(want_b.values()).cloned().collect();
        assert_ne!(all[0].labels()[NODE_LABEL], all[1].labels()[NODE_LABEL]);
        let by_node = RulesByNode::new(all.iter().cloned().map(Arc::new));
        for (node, want) in [(&a, &want_a), (&b, &want_b)] {
            let have = by_node.of(node);
            assert_eq!(have.len(), 1, "{node}: {have:?}");
            assert_eq!(named(diff(want, &have)), NOTHING, "{node}: nothing to write");
            let have = for_node(&all, node);
            let quarantines = [quarantine(if node == &a { 1 } else { 2 }, TaintEffect::NoExecute)];
            assert_eq!(
                named(changes(&dra(), node, &owner(), &quarantines, &have)),
                NOTHING
            );
        }
        // a's quarantine ends: only a's rule goes.
        let (apply, delete) = changes(&dra(), &a, &owner(), &[], &for_node(&all, &a));
        assert!(apply.is_empty());
        assert_eq!(delete, want_a.keys().cloned().collect::<Vec<_>>());
        // a released: still only a's.
        assert_eq!(for_node(&all, &a).len(), 1);
    }

    /// A rule keeps the node and GPU in full in its annotations; its labels carry them through
    /// `names::label_value`, hashed when too long for a label.
    #[test]
    fn rules_name_their_node_and_gpu_in_full() {
        let node = format!("{}.example.com", "n".repeat(70));
        let mut q = quarantine(3, TaintEffect::NoSchedule);
        q.taint.gpu = format!("MIG-GPU-{}/1/0", "f".repeat(36));
        let want = desired(&dra(), &node, &owner(), &[q.clone()]);
        let rule = want.values().next().unwrap_or_else(|| panic!("no rule"));
        assert_eq!(node_of(rule), Some(node.as_str()));
        assert_eq!(gpu_of(rule), Some(q.taint.gpu.as_str()));
        assert!(is_for(rule, &node));
        assert!(!is_for(rule, &node[..63]));
        for key in [NODE_LABEL, GPU_LABEL] {
            let v = &rule.labels()[key];
            assert!(names::is_label_value(v), "{key}={v}");
        }
        assert!(names::is_object_name(&rule.name_any()), "{}", rule.name_any());
    }

    /// Rules written before the names module are found by their labels and adopted: the
    /// quarantine keeps its rule (brought up to date, under its old name) instead of getting a
    /// second one, and a legacy rule no longer wanted is deleted.
    #[test]
    fn rules_of_an_earlier_release_are_adopted_not_duplicated() {
        // A short node: its legacy label is its name. One rule kept by name (readable), one with
        // a hashed name, one for a GPU no longer quarantined.
        let kept = legacy_rule("n1", 5, "gpunode-n1-gpu-abc-5");
        let hashed = legacy_rule("n1", 6, "gpunode-0123456789abcdef");
        let stale = legacy_rule("n1", 7, "gpunode-n1-gpu-abc-7");
        let all = [kept, hashed, stale];
        let have = for_node(&all, "n1");
        assert_eq!(have.len(), 3, "found by their labels");
        let quarantines = [
            quarantine(5, TaintEffect::NoExecute),
            quarantine(6, TaintEffect::NoExecute),
        ];
        let (apply, delete) = changes(&dra(), "n1", &owner(), &quarantines, &have);
        let applied: Vec<String> = apply.iter().map(|r| r.name_any()).collect();
        assert_eq!(
            applied,
            ["gpunode-0123456789abcdef", "gpunode-n1-gpu-abc-5"],
            "adopted under their old names, to add the annotations"
        );
        assert!(apply.iter().all(|r| r.annotations()[NODE_ANNOTATION] == "n1"));
        assert_eq!(delete, ["gpunode-n1-gpu-abc-7"]);
        // Once brought up to date, nothing more to write.
        let adopted: Vec<DeviceTaintRule> = apply;
        let have: Vec<&DeviceTaintRule> = adopted.iter().collect();
        assert_eq!(
            named(changes(&dra(), "n1", &owner(), &quarantines, &have)),
            NOTHING
        );
    }

    /// Two long nodes that share their first 63 characters, each with a rule of an earlier
    /// release under the same (cut) node label: each node's name tells its own apart.
    #[test]
    fn legacy_rules_of_two_nodes_sharing_a_prefix_stay_apart() {
        let prefix = "a".repeat(63);
        let (a, b) = (format!("{prefix}-1"), format!("{prefix}-2"));
        let rule_a = legacy_rule(&a, 1, &format!("gpunode-{a}-gpu-abc-1"));
        let rule_b = legacy_rule(&b, 2, &format!("gpunode-{b}-gpu-abc-2"));
        assert_eq!(rule_a.labels()[NODE_LABEL], rule_b.labels()[NODE_LABEL]);
        let all = [rule_a, rule_b];
        let by_node = RulesByNode::new(all.iter().cloned().map(Arc::new));
        assert_eq!(by_node.of(&a).len(), 1);
        assert_eq!(
            by_node.of(&prefix).len(),
            0,
            "the node named like the cut label claims neither"
        );
        let have = for_node(&all, &a);
        assert_eq!(have.len(), 1);
        let (apply, delete) = changes(
            &dra(),
            &a,
            &owner(),
            &[quarantine(1, TaintEffect::NoExecute)],
            &have,
        );
        assert_eq!(apply.len(), 1, "a's legacy rule adopted");
        assert_eq!(apply[0].name_any(), format!("gpunode-{a}-gpu-abc-1"));
        assert!(delete.is_empty(), "b's rule untouched: {delete:?}");
        let (_, delete) = changes(&dra(), &a, &owner(), &[], &have);
        assert_eq!(delete, [format!("gpunode-{a}-gpu-abc-1")], "released: only a's");
    }

    #[test]
    fn one_rule_per_device_named_after_node_and_uuid() {
        let want = desired(&dra(), "n1", &owner(), &[quarantine(5, TaintEffect::NoExecute)]);
        let rule = &want["gpunode-n1-gpu-abc-5"];
        assert_eq!(rule.spec.device_selector.device.as_deref(), Some("gpu-5"));
        assert_eq!(rule.spec.taint.effect, "NoExecute");
        assert_eq!(rule.spec.taint.key, DEVICE_TAINT_KEY);
        assert_eq!(rule.labels()[NODE_LABEL], "n1");
        assert_eq!(rule.owner_references()[0].uid, "u-1");
        let mut foreign = rule.clone();
        foreign.labels_mut().remove(MANAGED_BY.0);
        let by_node = RulesByNode::new([Arc::new(rule.clone()), Arc::new(foreign)]);
        assert_eq!(by_node.of("n1").len(), 1, "only gpunode's own rule");
        assert!(by_node.of("n2").is_empty());
        assert_eq!(
            names::device_rule_name(&"n".repeat(250), "GPU-1").len(),
            names::MAX_NAME,
            "too long for a name: its beginning and a digest"
        );
    }

    #[test]
    fn the_diff_writes_only_what_changed_and_deletes_only_its_own_leftovers() {
        let want = desired(
            &dra(),
            "n1",
            &owner(),
            &[
                quarantine(5, TaintEffect::NoExecute),
                quarantine(6, TaintEffect::NoSchedule),
            ],
        );
        let mut same = want["gpunode-n1-gpu-abc-5"].clone();
        same.metadata.resource_version = Some("7".into());
        let mut weaker = want["gpunode-n1-gpu-abc-6"].clone();
        weaker.spec.taint.effect = "None".into();
        let stale = desired(&dra(), "n1", &owner(), &[quarantine(2, TaintEffect::NoExecute)])
            .into_values()
            .next()
            .unwrap();
        let (apply, delete) = diff(&want, &[&same, &weaker, &stale]);
        let applied: Vec<String> = apply.iter().map(|r| r.name_any()).collect();
        assert_eq!(applied, ["gpunode-n1-gpu-abc-6"], "only the changed effect");
        assert_eq!(delete, ["gpunode-n1-gpu-abc-2"]);
    }
}
