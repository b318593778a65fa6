//! The objects of repair steps (`spec.repair`): remediation custom resources made from a
//! template the policy names (the NodeHealthCheck convention) and the GpuResetRequests of GPU
//! resets, read before planning and created or deleted by the applier. Their kinds are only known at run time, so they are
//! reached through discovery (cached per kind) as dynamic objects.
//!
//! It reads and describes; it never creates or deletes an object itself (the applier does).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError},
};

use gpunode_crds::{GpuResetRequestSpec, names, repair::RemediatorTemplate};
use jiff::Timestamp;
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams},
    discovery::{self, Scope},
};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::{
    markers::{POLICY_LABEL, StepObjectRef},
    plan::{EnsureObject, MadeFrom, StepObject, repair::fold},
};

/// Label naming the node a step's object repairs, through `names::label_value` (the probe finds
/// its GpuResetRequests by it).
pub use gpunode_crds::reset::NODE_LABEL;
/// Annotation naming the step that made an object.
pub const STEP_ANNOTATION: &str = "gpunode.dev/repair-step";
/// Annotation with when that step started: an object with another time is a leftover.
pub const STARTED_ANNOTATION: &str = "gpunode.dev/repair-started";
/// Field manager of the objects.
const FIELD_MANAGER: &str = gpunode_crds::names::OPERATOR_FIELD_MANAGER;

/// Why a step's object could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RemediatorError {
    /// The request failed; it is retried by the next pass.
    #[error("{what}: {source}")]
    Api {
        /// What was asked.
        what: String,
        /// The error.
        source: kube::Error,
    },
}

/// Reads and writes step objects, with discovery cached per kind.
#[derive(Clone)]
pub struct Remediators {
    client: Client,
    found: Arc<Mutex<HashMap<GroupVersionKind, (ApiResource, Scope)>>>,
}

/// A kind the API server does not serve.
struct NotServed(String);

impl Remediators {
    /// Remediators reached through `client`.
    pub fn new(client: Client) -> Self {
        Remediators {
            client,
            found: Arc::default(),
        }
    }

    /// Where `kind` of `api_version` is served; `Ok(Err(_))` when it is not.
    async fn resolve(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<Result<(ApiResource, Scope), NotServed>, kube::Error> {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        if let Some(hit) = self
            .found
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&gvk)
        {
            return Ok(Ok(hit.clone()));
        }
        match discovery::pinned_kind(&self.client, &gvk).await {
            Ok((ar, caps)) => {
                let hit = (ar, caps.scope);
                self.found
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(gvk, hit.clone());
                Ok(Ok(hit))
            }
            Err(kube::Error::Discovery(_)) => {
                Ok(Err(NotServed(format!("{kind} of {api_version} is not served"))))
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                Ok(Err(NotServed(format!("{api_version} is not served"))))
            }
            Err(e) => Err(e),
        }
    }

    fn api(&self, ar: &ApiResource, scope: &Scope, namespace: Option<&str>) -> Api<DynamicObject> {
        match (scope, namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, ar),
            // A namespaced kind without a namespace would be the default one: say so instead.
            _ => Api::all_with(self.client.clone(), ar),
        }
    }

    /// What the objects of a running step say now, together ([`fold`]).
    pub async fn look_all(&self, objects: &[EnsureObject]) -> Result<StepObject, RemediatorError> {
        let mut seen = Vec::with_capacity(objects.len());
        for e in objects {
            let o = self.look(e).await?;
            // One failure decides the step: the others need not be read.
            let failed = matches!(o, StepObject::Failed(_) | StepObject::Unavailable(_));
            seen.push(o);
            if failed {
                break;
            }
        }
        Ok(fold(seen))
    }

    /// What one object of a running step says now.
    async fn look(&self, e: &EnsureObject) -> Result<StepObject, RemediatorError> {
        let what = |w: &str| format!("{w} {}", e.object);
        let err = |w: &str| {
            let what = what(w);
            move |source| RemediatorError::Api { what, source }
        };
        let (ar, scope) = match self
            .resolve(&e.object.api_version, &e.object.kind)
            .await
            .map_err(err("discovering"))?
        {
            Ok(found) => found,
            Err(NotServed(why)) => return Ok(StepObject::Unavailable(why)),
        };
        if let Some(why) = scope_mismatch(&scope, &e.object) {
            return Ok(StepObject::Unavailable(why));
        }
        let api = self.api(&ar, &scope, e.object.namespace.as_deref());
        let Some(obj) = api.get_opt(&e.object.name).await.map_err(err("reading"))? else {
            // Absent: created next (or, once created, deleted by its remediator). A template
            // that is gone makes the step fail rather than wait for its timeout.
            return match &e.made_from {
                MadeFrom::Template(template) => match self.template(template).await? {
                    Ok(_) => Ok(StepObject::Absent),
                    Err(why) => Ok(StepObject::Unavailable(why)),
                },
                MadeFrom::GpuReset(_) => Ok(StepObject::Absent),
            };
        };
        if !made_at(&obj, e.started) {
            // A leftover of an earlier run: replaced when the step's object is made.
            return Ok(StepObject::Absent);
        }
        Ok(completion(&obj, e.completion_condition()))
    }

    /// The template's `spec.template.spec`, or why it cannot be used.
    async fn template(
        &self,
        template: &RemediatorTemplate,
    ) -> Result<Result<Value, String>, RemediatorError> {
        let named = format!(
            "{} {}{}",
            template.kind,
            template
                .namespace
                .as_deref()
                .map(|n| format!("{n}/"))
                .unwrap_or_default(),
            template.name
        );
        let err = |source| RemediatorError::Api {
            what: format!("reading {named}"),
            source,
        };
        let (ar, scope) = match self
            .resolve(&template.api_version, &template.kind)
            .await
            .map_err(err)?
        {
            Ok(found) => found,
            Err(NotServed(why)) => return Ok(Err(why)),
        };
        let api = self.api(&ar, &scope, template.namespace.as_deref());
        let Some(t) = api.get_opt(&template.name).await.map_err(err)? else {
            return Ok(Err(format!("the template {named} does not exist")));
        };
        match t.data.pointer("/spec/template/spec") {
            Some(spec) => Ok(Ok(spec.clone())),
            None => Ok(Err(format!("the template {named} has no spec.template.spec"))),
        }
    }

    /// Makes the step's object unless it exists; returns whether it exists now (made by this
    /// call or before). A leftover of an earlier run is deleted, to be made next pass.
    pub async fn ensure(&self, policy: &str, node: &str, e: &EnsureObject) -> Result<bool, RemediatorError> {
        let err = |w: &'static str| {
            let what = format!("{w} {}", e.object);
            move |source| RemediatorError::Api { what, source }
        };
        let Ok((ar, scope)) = self
            .resolve(&e.object.api_version, &e.object.kind)
            .await
            .map_err(err("discovering"))?
        else {
            // Not served: the next look says so and the step fails.
            return Ok(false);
        };
        let spec = match &e.made_from {
            MadeFrom::Template(template) => match self.template(template).await? {
                Ok(spec) => spec,
                Err(why) => {
                    warn!(node, step = %e.step, "{why}");
                    return Ok(false);
                }
            },
            MadeFrom::GpuReset(gpu) => serde_json::to_value(GpuResetRequestSpec {
                node_name: node.to_string(),
                index: gpu.index,
                uuid: gpu.uuid.clone(),
            })
            .unwrap_or_default(),
        };
        let api = self.api(&ar, &scope, e.object.namespace.as_deref());
        let mut obj = DynamicObject::new(&e.object.name, &ar).data(json!({ "spec": spec }));
        obj.metadata.namespace = e.object.namespace.clone();
        obj.metadata.labels = Some(BTreeMap::from([
            (NODE_LABEL.to_string(), names::label_value(node)),
            (POLICY_LABEL.to_string(), names::label_value(policy)),
            ("app.kubernetes.io/managed-by".to_string(), "gpunode".to_string()),
        ]));
        obj.metadata.annotations = Some(BTreeMap::from([
            (STEP_ANNOTATION.to_string(), e.step.clone()),
            (STARTED_ANNOTATION.to_string(), e.started.to_string()),
        ]));
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match api.create(&pp, &obj).await {
            Ok(_) => {
                info!(node, step = %e.step, object = %e.object, "repair step object created");
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get_opt(&e.object.name).await.map_err(err("reading"))?;
                match existing {
                    Some(o) if made_at(&o, e.started) => Ok(true),
                    Some(_) => {
                        warn!(node, object = %e.object, "deleting a leftover of an earlier repair");
                        api.delete(&e.object.name, &DeleteParams::default())
                            .await
                            .map_err(err("deleting"))?;
                        Ok(false)
                    }
                    None => Ok(false),
                }
            }
            Err(source) => Err(err("creating")(source)),
        }
    }

    /// Deletes an object a repair made (gone already is fine).
    pub async fn delete(&self, object: &StepObjectRef) -> Result<(), RemediatorError> {
        let err = |w: &'static str| {
            let what = format!("{w} {object}");
            move |source| RemediatorError::Api { what, source }
        };
        let Ok((ar, scope)) = self
            .resolve(&object.api_version, &object.kind)
            .await
            .map_err(err("discovering"))?
        else {
            return Ok(());
        };
        let api = self.api(&ar, &scope, object.namespace.as_deref());
        match api.delete(&object.name, &DeleteParams::background()).await {
            Ok(_) => {
                info!(object = %object, "repair step object deleted");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(err("deleting")(source)),
        }
    }
}

fn scope_mismatch(scope: &Scope, object: &StepObjectRef) -> Option<String> {
    match (scope, &object.namespace) {
        (Scope::Namespaced, None) => Some(format!(
            "{} is namespaced, but the template names no namespace",
            object.kind
        )),
        _ => None,
    }
}

/// Whether `obj` was made by the step that started at `started`.
fn made_at(obj: &DynamicObject, started: Timestamp) -> bool {
    obj.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STARTED_ANNOTATION))
        .and_then(|v| v.parse::<Timestamp>().ok())
        == Some(started)
}

/// The latest instant a condition time can stand for. The API server keeps
/// `lastTransitionTime` to the second, cut off: 08:00:05Z was written at some time in
/// [08:00:05, 08:00:06), so only a report observed from 08:00:06 on is surely after it.
fn end_of_second(t: Timestamp) -> Timestamp {
    if t.subsec_nanosecond() == 0 {
        t.checked_add(jiff::SignedDuration::from_secs(1)).unwrap_or(t)
    } else {
        t
    }
}

/// What the object's completion condition says.
pub fn completion(obj: &DynamicObject, condition: &str) -> StepObject {
    let found = obj
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(condition))
        });
    let field = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    match found {
        Some(c) if field(c, "status") == "True" => StepObject::Succeeded(
            field(c, "lastTransitionTime")
                .parse::<Timestamp>()
                .ok()
                .map(end_of_second),
        ),
        Some(c) if field(c, "status") == "False" => {
            let (reason, message) = (field(c, "reason"), field(c, "message"));
            StepObject::Failed(format!(
                "{} reports {condition}=False{}{}",
                obj.metadata.name.as_deref().unwrap_or_default(),
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({reason})")
                },
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                },
            ))
        }
        _ => StepObject::Running,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(status: serde_json::Value) -> DynamicObject {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("remediation.example.com", "v1", "Reboot"),
            "reboots",
        );
        DynamicObject::new("gpu-1", &ar).data(json!({"spec": {}, "status": status}))
    }

    #[test]
    fn the_completion_condition_says_how_a_remediation_went() {
        let done = object(json!({"conditions": [
            {"type": "Processing", "status": "False"},
            {"type": "Succeeded", "status": "True", "lastTransitionTime": "2026-12-02T05:00:00Z"},
        ]}));
        assert_eq!(
            completion(&done, "Succeeded"),
            StepObject::Succeeded("2026-12-02T05:00:01Z".parse().ok()),
            "the end of the second the API server cut it to"
        );
        let failed = object(json!({"conditions": [
            {"type": "Succeeded", "status": "False", "reason": "BmcUnreachable", "message": "no answer"},
        ]}));
        assert_eq!(
            completion(&failed, "Succeeded"),
            StepObject::Failed("gpu-1 reports Succeeded=False (BmcUnreachable): no answer".to_string())
        );
        for running in [
            object(json!({})),
            object(json!({"conditions": [{"type": "Succeeded", "status": "Unknown"}]})),
            object(json!({"conditions": [{"type": "Done", "status": "True"}]})),
        ] {
            assert_eq!(completion(&running, "Succeeded"), StepObject::Running);
        }
        assert_eq!(
            completion(&done, "Done"),
            StepObject::Running,
            "only the policy's condition type counts"
        );
    }

    #[test]
    fn an_object_belongs_to_the_run_that_made_it() {
        let started: Timestamp = "2026-12-02T05:00:00Z".parse().unwrap_or(Timestamp::UNIX_EPOCH);
        let mut o = object(json!({}));
        assert!(!made_at(&o, started), "no annotation: a leftover");
        o.metadata.annotations = Some(BTreeMap::from([(
            STARTED_ANNOTATION.to_string(),
            started.to_string(),
        )]));
        assert!(made_at(&o, started));
        assert!(!made_at(&o, started + jiff::SignedDuration::from_secs(1)));
    }
}
