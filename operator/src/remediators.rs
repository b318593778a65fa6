//! The objects of repair steps (`spec.repair`): remediation custom resources made from a
//! template the policy names (the NodeHealthCheck convention) and the GpuResetRequests of GPU
//! resets, read before planning and created or deleted by the applier. Their kinds are only known at run time, so they are
//! reached through discovery (cached per kind) as dynamic objects.
//!
//! It reads and describes, and creates or deletes only when the applier asks. It never deletes
//! what gpunode did not make: an object must carry gpunode's labels for the node (and the uid
//! gpunode recorded when it made it, as the delete's precondition), or it is left alone.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError},
};

use gpunode_crds::{GpuResetRequestSpec, names, repair::RemediatorTemplate};
use jiff::Timestamp;
use kube::{
    Api, Client, Resource,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams, Preconditions},
    discovery::{self, Scope},
};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::{
    bounds::RemediatorBounds,
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
/// The label gpunode puts on every object it makes, with value [`MANAGED_BY`].
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`] on gpunode's objects.
pub const MANAGED_BY: &str = "gpunode";
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
    /// The kinds and namespaces the chart grants remediation objects.
    bounds: Arc<RemediatorBounds>,
}

/// A kind the API server does not serve.
struct NotServed(String);

impl Remediators {
    /// Remediators reached through `client`.
    pub fn new(client: Client) -> Self {
        Remediators {
            client,
            found: Arc::default(),
            bounds: Arc::default(),
        }
    }

    /// Makes remediation objects only of the kinds, and in the namespaces, `bounds` grant.
    pub fn with_bounds(mut self, bounds: RemediatorBounds) -> Self {
        self.bounds = Arc::new(bounds);
        self
    }

    /// Why the chart's bounds refuse `e`'s object, if they do (a GpuResetRequest is gpunode's
    /// own kind: always allowed).
    fn refused(&self, ar: &ApiResource, e: &EnsureObject) -> Option<String> {
        match &e.made_from {
            MadeFrom::Template(_) => self
                .bounds
                .admit(&ar.group, &ar.plural, e.object.namespace.as_deref())
                .err(),
            MadeFrom::GpuReset(_) => None,
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
        if let Some(why) = scope_mismatch(&scope, &e.object).or_else(|| self.refused(&ar, e)) {
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

    /// Makes the step's object unless it exists; returns its uid when it exists now (made by
    /// this call or before), `None` when it does not yet. A leftover of an earlier run is
    /// deleted (only gpunode's, [`owned_by`]), to be made next pass; an object of the same name
    /// that is not gpunode's is left alone, and the step waits (and times out).
    pub async fn ensure(
        &self,
        policy: &str,
        node: &str,
        e: &EnsureObject,
    ) -> Result<Option<String>, RemediatorError> {
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
            return Ok(None);
        };
        if let Some(why) = self.refused(&ar, e) {
            // The next look says so and the step fails.
            warn!(node, step = %e.step, object = %e.object, "not creating {}: {why}", e.object);
            return Ok(None);
        }
        let Some(spec) = self.spec_of(node, e).await? else {
            return Ok(None);
        };
        let api = self.api(&ar, &scope, e.object.namespace.as_deref());
        let obj = made_object(policy, node, e, &ar, spec);
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match api.create(&pp, &obj).await {
            Ok(made) => {
                info!(node, step = %e.step, object = %e.object, "repair step object created");
                Ok(made.metadata.uid)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get_opt(&e.object.name).await.map_err(err("reading"))?;
                match existing {
                    Some(o) if owned_by(&o, node).is_ok() && made_at(&o, e.started) => Ok(o.metadata.uid),
                    Some(o) => {
                        warn!(node, object = %e.object, "deleting a leftover of an earlier repair");
                        let leftover = StepObjectRef {
                            uid: o.metadata.uid.clone(),
                            ..e.object.clone()
                        };
                        self.delete_checked(&api, &leftover, node, &o).await?;
                        Ok(None)
                    }
                    None => Ok(None),
                }
            }
            Err(source) => Err(err("creating")(source)),
        }
    }

    /// The spec of the step's object, or `None` (logged) when its template cannot be used.
    async fn spec_of(&self, node: &str, e: &EnsureObject) -> Result<Option<Value>, RemediatorError> {
        match &e.made_from {
            MadeFrom::Template(template) => match self.template(template).await? {
                Ok(spec) => Ok(Some(spec)),
                Err(why) => {
                    warn!(node, step = %e.step, "{why}");
                    Ok(None)
                }
            },
            MadeFrom::GpuReset(gpu) => Ok(Some(
                serde_json::to_value(GpuResetRequestSpec {
                    node_name: node.to_string(),
                    index: gpu.index,
                    uuid: gpu.uuid.clone(),
                })
                .unwrap_or_default(),
            )),
        }
    }

    /// Deletes an object a repair of `node` made, and only that: it must carry gpunode's labels
    /// for `node` and, when its uid was recorded, that uid; the delete has the uid as a
    /// precondition, so an object replaced in between is not deleted either. Anything else is
    /// left alone (logged, and [`Deletion::Refused`] says why). Gone already is fine.
    pub async fn delete(&self, object: &StepObjectRef, node: &str) -> Result<Deletion, RemediatorError> {
        let err = |w: &'static str| {
            let what = format!("{w} {object}");
            move |source| RemediatorError::Api { what, source }
        };
        let Ok((ar, scope)) = self
            .resolve(&object.api_version, &object.kind)
            .await
            .map_err(err("discovering"))?
        else {
            return Ok(Deletion::Gone);
        };
        let api = self.api(&ar, &scope, object.namespace.as_deref());
        let Some(found) = api.get_opt(&object.name).await.map_err(err("reading"))? else {
            return Ok(Deletion::Gone);
        };
        self.delete_checked(&api, object, node, &found).await
    }

    /// Deletes `found` (what `object` names, as read) if it is gpunode's for `node`.
    async fn delete_checked(
        &self,
        api: &Api<DynamicObject>,
        object: &StepObjectRef,
        node: &str,
        found: &DynamicObject,
    ) -> Result<Deletion, RemediatorError> {
        let refused = |why: String| {
            warn!(object = %object, node, "not deleting {object}: {why}");
            Ok(Deletion::Refused(why))
        };
        if let Err(why) = owned_by(found, node) {
            return refused(why);
        }
        let uid = match (&object.uid, &found.metadata.uid) {
            (Some(recorded), Some(now)) if recorded != now => {
                return refused(format!(
                    "its uid {now} is not the uid {recorded} gpunode recorded when it made it"
                ));
            }
            (_, now) => now.clone(),
        };
        match api.delete(&object.name, &uid_precondition(uid)).await {
            Ok(_) => {
                info!(object = %object, "repair step object deleted");
                Ok(Deletion::Deleted)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Deletion::Gone),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                refused("it was replaced by another object of the same name before the delete".to_string())
            }
            Err(source) => Err(RemediatorError::Api {
                what: format!("deleting {object}"),
                source,
            }),
        }
    }
}

/// What became of an object gpunode was asked to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// Deleted.
    Deleted,
    /// Not there (or its kind not served): nothing to delete.
    Gone,
    /// Not gpunode's (why): left alone.
    Refused(String),
}

/// Background deletion of the object with `uid` only (none: whatever has the name).
pub fn uid_precondition(uid: Option<String>) -> DeleteParams {
    DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::background()
    }
}

/// Whether an object carries the labels gpunode puts on what it makes for `node`
/// (`app.kubernetes.io/managed-by: gpunode` and the node's label); why not, if not.
pub fn owned_by(obj: &impl Resource, node: &str) -> Result<(), String> {
    owned_by_labels(obj.meta().labels.as_ref(), NODE_LABEL, node)
}

/// Whether `labels` are gpunode's (`app.kubernetes.io/managed-by: gpunode`) for `node` under
/// `node_label`; why not, if not.
pub fn owned_by_labels(
    labels: Option<&BTreeMap<String, String>>,
    node_label: &str,
    node: &str,
) -> Result<(), String> {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    if labels.get(MANAGED_BY_LABEL).map(String::as_str) != Some(MANAGED_BY) {
        return Err(format!(
            "it does not carry gpunode's label {MANAGED_BY_LABEL}={MANAGED_BY}"
        ));
    }
    let want = names::label_value(node);
    match labels.get(node_label) {
        Some(v) if *v == want => Ok(()),
        Some(v) => Err(format!(
            "its label {node_label}={v} names another node than {node}"
        )),
        None => Err(format!("it has no label {node_label} naming node {node}")),
    }
}

/// The object a step makes on `node`, with gpunode's labels and the step's annotations.
fn made_object(policy: &str, node: &str, e: &EnsureObject, ar: &ApiResource, spec: Value) -> DynamicObject {
    let mut obj = DynamicObject::new(&e.object.name, ar).data(json!({ "spec": spec }));
    obj.metadata.namespace = e.object.namespace.clone();
    obj.metadata.labels = Some(BTreeMap::from([
        (NODE_LABEL.to_string(), names::label_value(node)),
        (POLICY_LABEL.to_string(), names::label_value(policy)),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ]));
    obj.metadata.annotations = Some(BTreeMap::from([
        (STEP_ANNOTATION.to_string(), e.step.clone()),
        (STARTED_ANNOTATION.to_string(), e.started.to_string()),
    ]));
    obj
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
    fn only_an_object_with_gpunodes_labels_for_the_node_is_gpunodes() {
        let labelled = |labels: &[(&str, &str)]| {
            let mut o = object(json!({}));
            o.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            o
        };
        let ours = labelled(&[(MANAGED_BY_LABEL, MANAGED_BY), (NODE_LABEL, "gpu-1")]);
        assert_eq!(owned_by(&ours, "gpu-1"), Ok(()));
        assert_eq!(
            owned_by(&ours, "gpu-2"),
            Err("its label gpunode.dev/node=gpu-1 names another node than gpu-2".to_string())
        );
        assert_eq!(
            owned_by(&object(json!({})), "gpu-1"),
            Err("it does not carry gpunode's label app.kubernetes.io/managed-by=gpunode".to_string()),
            "another team's object, no labels at all"
        );
        assert_eq!(
            owned_by(&labelled(&[(NODE_LABEL, "gpu-1"), ("team", "storage")]), "gpu-1"),
            Err("it does not carry gpunode's label app.kubernetes.io/managed-by=gpunode".to_string()),
            "the node's label alone is not enough"
        );
        assert_eq!(
            owned_by(&labelled(&[(MANAGED_BY_LABEL, MANAGED_BY)]), "gpu-1"),
            Err("it has no label gpunode.dev/node naming node gpu-1".to_string())
        );
        let long = "n".repeat(70);
        let hashed = names::label_value(&long);
        assert_eq!(
            owned_by(
                &labelled(&[(MANAGED_BY_LABEL, MANAGED_BY), (NODE_LABEL, &hashed)]),
                &long
            ),
            Ok(()),
            "a long node name is labelled through names::label_value"
        );
    }

    #[test]
    fn a_delete_has_the_uid_as_its_precondition() {
        let p = uid_precondition(Some("u-1".to_string()));
        assert_eq!(p.preconditions.and_then(|p| p.uid).as_deref(), Some("u-1"));
        assert!(uid_precondition(None).preconditions.is_none());
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
