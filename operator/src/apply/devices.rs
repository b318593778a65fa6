//! The DeviceTaintRules of a node's GPU quarantines on a DRA node: one per quarantined device,
//! named after the node and the GPU's UUID so that any replica, before or after a restart or a
//! leader change, writes the same object (server-side apply: created once, never duplicated).
//! gpunode's rules carry its labels and an owner reference to the policy; rules without the
//! labels are never read, changed or deleted.

use std::{
    collections::{BTreeMap, HashMap},
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};

use gpunode_crds::GpuNodePolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    core::{ObjectMeta, TypeMeta},
    runtime::reflector::{ObjectRef, Store},
};
use tracing::info;

use super::FIELD_MANAGER;
use crate::{
    markers::POLICY_LABEL,
    observe::{
        Guarded,
        devices::{DeviceTaintRule, Dra, RuleSelector, RuleSpec, RuleTaint},
    },
    plan::{NodePlan, Quarantine, QuarantineTarget},
};

/// Label naming the node a rule quarantines a GPU of.
pub const NODE_LABEL: &str = "gpunode.dev/node";
/// Label naming the GPU (its UUID).
pub const GPU_LABEL: &str = "gpunode.dev/gpu";
/// `app.kubernetes.io/managed-by` on every rule gpunode writes.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "gpunode");
/// The selector of gpunode's rules.
pub const RULE_SELECTOR: &str = "app.kubernetes.io/managed-by=gpunode";
/// The taint key of gpunode's device taints; the value is the policy's name.
pub const DEVICE_TAINT_KEY: &str = "gpunode.dev/quarantine";

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

/// The rule's name: `gpunode-<node>-<uuid>` in lower case, or a hash of it when that would not
/// be a valid object name (longer than 253 characters).
pub fn rule_name(node: &str, gpu: &str) -> String {
    let name = format!("gpunode-{node}-{}", gpu.to_ascii_lowercase());
    let valid = name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if valid {
        return name;
    }
    let mut h = DefaultHasher::new();
    (node, gpu).hash(&mut h);
    format!("gpunode-{:016x}", h.finish())
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
            let name = rule_name(node, &q.taint.gpu);
            let labels = BTreeMap::from([
                (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
                (NODE_LABEL.to_string(), label_value(node)),
                (GPU_LABEL.to_string(), label_value(&q.taint.gpu)),
                (POLICY_LABEL.to_string(), label_value(&owner.name)),
            ]);
            let rule = DeviceTaintRule {
                types: Some(TypeMeta {
                    api_version: dra.rules.api_version.clone(),
                    kind: dra.rules.kind.clone(),
                }),
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(labels),
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
            };
            (name, rule)
        })
        .collect()
}

/// Label values are at most 63 characters: node names and UUIDs longer than that are cut (the
/// rule's name, not its labels, identifies it).
fn label_value(s: &str) -> String {
    let cut: String = s.chars().take(63).collect();
    cut.trim_end_matches(['-', '_', '.']).to_string()
}

/// What to write so that exactly `desired` of gpunode's rules exist for a node, given the ones
/// that do (`existing`, gpunode's own rules of the node): rules to apply (new, or whose device
/// or effect changed) and rules to delete.
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

/// The node label of a rule that is gpunode's (its managed-by label): the one reading of the
/// labels [`desired`] writes, for the writer and for observe.
fn node_label_of(rule: &DeviceTaintRule) -> Option<&String> {
    let labels = rule.labels();
    labels
        .get(MANAGED_BY.0)
        .is_some_and(|v| v == MANAGED_BY.1)
        .then(|| labels.get(NODE_LABEL))
        .flatten()
}

/// gpunode's rules grouped by the node they are for.
pub struct RulesByNode(HashMap<String, Vec<Arc<DeviceTaintRule>>>);

impl RulesByNode {
    /// Groups `rules`; rules without gpunode's labels are left out.
    pub fn new(rules: impl IntoIterator<Item = Arc<DeviceTaintRule>>) -> RulesByNode {
        let mut out: HashMap<String, Vec<Arc<DeviceTaintRule>>> = HashMap::new();
        for r in rules {
            if let Some(node) = node_label_of(&r).cloned() {
                out.entry(node).or_default().push(r);
            }
        }
        RulesByNode(out)
    }

    /// gpunode's rules for `node`.
    pub fn of(&self, node: &str) -> &[Arc<DeviceTaintRule>] {
        self.0.get(&label_value(node)).map_or(&[], Vec::as_slice)
    }
}

/// Why the rules of a node could not be brought to its plan.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A request failed.
    #[error(transparent)]
    Api(kube::Error),
    /// The policy is not in the cache (yet): its rules would have no owner.
    #[error("GpuNodePolicy {0} is not in the cache yet; its DeviceTaintRules wait")]
    UnknownPolicy(String),
}

/// Writes gpunode's DeviceTaintRules on a cluster that serves them.
#[derive(Clone)]
pub struct DeviceWriter {
    dra: Dra,
    api: Api<DeviceTaintRule>,
    /// gpunode's rules, as the watch sees them.
    rules: Store<DeviceTaintRule>,
    /// The policies, for the owner references.
    policies: Store<Guarded<GpuNodePolicy>>,
}

impl DeviceWriter {
    /// A writer through `client`, reading gpunode's rules from `rules` and the policies'
    /// uids from `policies`.
    pub fn new(
        client: Client,
        dra: Dra,
        rules: Store<DeviceTaintRule>,
        policies: Store<Guarded<GpuNodePolicy>>,
    ) -> DeviceWriter {
        DeviceWriter {
            api: Api::all_with(client, &dra.rules),
            dra,
            rules,
            policies,
        }
    }

    fn owner(&self, policy: &str) -> Option<Owner> {
        let g = self.policies.get(&ObjectRef::new(policy))?;
        let p = g.0.as_ref().ok()?;
        Some(Owner {
            name: policy.to_string(),
            uid: p.metadata.uid.clone()?,
            api_version: GpuNodePolicy::api_version(&()).to_string(),
            kind: GpuNodePolicy::kind(&()).to_string(),
        })
    }

    fn existing(&self, node: &str) -> Vec<Arc<DeviceTaintRule>> {
        let label = label_value(node);
        self.rules
            .state()
            .into_iter()
            .filter(|r| node_label_of(r) == Some(&label))
            .collect()
    }

    /// What would be written for `plan`'s node: rules to apply and to delete. `None` when the
    /// policy is not in the cache (its uid is needed for the owner reference).
    fn changes(&self, policy: &str, plan: &NodePlan) -> Option<(Vec<DeviceTaintRule>, Vec<String>)> {
        let owner = self.owner(policy)?;
        let want = desired(&self.dra, &plan.node, &owner, &plan.quarantines);
        let have = self.existing(&plan.node);
        let refs: Vec<&DeviceTaintRule> = have.iter().map(AsRef::as_ref).collect();
        let (apply, delete) = diff(&want, &refs);
        Some((apply.into_iter().cloned().collect(), delete))
    }

    /// Whether `plan`'s node has rules to write (or the policy cannot be told, which
    /// [`DeviceWriter::sync`] reports).
    pub fn differs(&self, policy: &str, plan: &NodePlan) -> bool {
        self.changes(policy, plan)
            .is_none_or(|(apply, delete)| !apply.is_empty() || !delete.is_empty())
    }

    /// Brings gpunode's rules for `plan`'s node to what the plan's quarantines call for.
    /// Returns how many rules were written and deleted. Fails while the policy is not in the
    /// cache, so the bookkeeping never records a quarantine without its rule.
    pub async fn sync(&self, policy: &str, plan: &NodePlan) -> Result<(u32, u32), SyncError> {
        let Some((apply, delete)) = self.changes(policy, plan) else {
            return Err(SyncError::UnknownPolicy(policy.to_string()));
        };
        let mut written = 0;
        for rule in &apply {
            let name = rule.name_any();
            self.api
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(rule),
                )
                .await
                .map_err(SyncError::Api)?;
            info!(rule = %name, effect = %rule.spec.taint.effect, "DeviceTaintRule applied");
            written += 1;
        }
        let deleted = self.delete(&delete).await.map_err(SyncError::Api)?;
        Ok((written, deleted))
    }

    /// Deletes every rule of gpunode's for `node` (the node is released).
    pub async fn release(&self, node: &str) -> Result<u32, kube::Error> {
        let names: Vec<String> = self.existing(node).iter().map(|r| r.name_any()).collect();
        self.delete(&names).await
    }

    async fn delete(&self, names: &[String]) -> Result<u32, kube::Error> {
        let mut deleted = 0;
        for name in names {
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                // Already gone: what was wanted.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
            info!(rule = %name, "DeviceTaintRule deleted");
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{DeviceRef, GpuTaint};
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
            rule_name(&"n".repeat(250), "GPU-1").len(),
            "gpunode-".len() + 16,
            "too long for a name: hashed"
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
