//! The writer of gpunode's DeviceTaintRules on a DRA node: it sends what
//! [`crate::devices::rules`] computes for a node's quarantines (server-side apply of the rules to
//! write, deletes of the rules to drop) and reads the rules that exist from the watch's cache.
//! What a rule looks like, and which rules are a node's, is decided there, not here; this module
//! imports [`crate::devices`], the plan, the metrics and the remediators' delete precondition,
//! never observe. It deletes only rules the watch sees with gpunode's labels for the node, each
//! with its uid as the delete's precondition.

use std::sync::Arc;

use gpunode_crds::GpuNodePolicy;
use gpunode_crds::names::OPERATOR_FIELD_MANAGER as FIELD_MANAGER;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::DeserializeGuard,
    runtime::reflector::{ObjectRef, Store},
};
use tracing::{info, warn};

use crate::{
    devices::{
        DeviceTaintRule, Dra,
        rules::{self, Owner},
    },
    metrics::{ActionKind, ActionResult, Metrics},
    plan::NodePlan,
};

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
    policies: Store<DeserializeGuard<GpuNodePolicy>>,
    /// Where deletes refused (the rule was replaced since it was read) are counted.
    metrics: Option<Arc<Metrics>>,
}

impl DeviceWriter {
    /// A writer through `client`, reading gpunode's rules from `rules` and the policies'
    /// uids from `policies`.
    pub fn new(
        client: Client,
        dra: Dra,
        rules: Store<DeviceTaintRule>,
        policies: Store<DeserializeGuard<GpuNodePolicy>>,
    ) -> DeviceWriter {
        DeviceWriter {
            api: Api::all_with(client, &dra.rules),
            dra,
            rules,
            policies,
            metrics: None,
        }
    }

    /// Counts deletes in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> DeviceWriter {
        self.metrics = Some(metrics);
        self
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
        self.rules
            .state()
            .into_iter()
            .filter(|r| rules::is_for(r, node))
            .collect()
    }

    /// What would be written for `plan`'s node: rules to apply and to delete. `None` when the
    /// policy is not in the cache (its uid is needed for the owner reference).
    fn changes(&self, policy: &str, plan: &NodePlan) -> Option<(Vec<DeviceTaintRule>, Vec<String>)> {
        let owner = self.owner(policy)?;
        let have = self.existing(&plan.node);
        let refs: Vec<&DeviceTaintRule> = have.iter().map(AsRef::as_ref).collect();
        Some(rules::changes(
            &self.dra,
            &plan.node,
            &owner,
            &plan.quarantines,
            &refs,
        ))
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
            gpunode_crashpoints::crash_point!("devices::after_rule");
        }
        let deleted = self.delete(&plan.node, &delete).await.map_err(SyncError::Api)?;
        Ok((written, deleted))
    }

    /// Deletes every rule of gpunode's for `node` (the node is released).
    pub async fn release(&self, node: &str) -> Result<u32, kube::Error> {
        let names: Vec<String> = self.existing(node).iter().map(|r| r.name_any()).collect();
        self.delete(node, &names).await
    }

    /// Deletes `node`'s rules among `names`: only a rule the watch sees with gpunode's labels
    /// for the node, and only that rule (its uid is the delete's precondition). A rule replaced
    /// in between is left alone, logged and counted.
    async fn delete(&self, node: &str, names: &[String]) -> Result<u32, kube::Error> {
        let have = self.existing(node);
        let mut deleted = 0;
        for name in names {
            let Some(rule) = have.iter().find(|r| r.name_any() == *name) else {
                continue;
            };
            let params = crate::remediators::uid_precondition(rule.metadata.uid.clone());
            let result = match self.api.delete(name, &params).await {
                Ok(_) => {
                    info!(rule = %name, "DeviceTaintRule deleted");
                    deleted += 1;
                    ActionResult::Ok
                }
                // Already gone: what was wanted.
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    warn!(rule = %name, node, "not deleting DeviceTaintRule {name}: it was replaced by another rule of the same name since gpunode read it");
                    ActionResult::Refused
                }
                Err(e) => return Err(e),
            };
            if let Some(m) = &self.metrics {
                m.action(ActionKind::Delete, result);
            }
        }
        Ok(deleted)
    }
}
