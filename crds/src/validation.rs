//! `spec.validation`: a Job gpunode runs on a recovered node before it undoes its cordon and
//! taints (a DCGM diagnostic, an NCCL test), and what a failure does.
//!
//! Field docs are the text `kubectl explain gpunodepolicy.spec.validation...` prints.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::duration::Duration;

/// A validation before a node returns to service.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValidationPolicy {
    /// The namespace the validation Jobs are created in. The operator must be allowed to
    /// create, get and delete Jobs there: the chart's `operator.validation.namespaces` grants
    /// exactly that.
    #[schemars(length(min = 1, max = 63), regex(pattern = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: String,

    /// The pod template of the Job (a PodTemplateSpec: metadata and spec), for example a
    /// container running `dcgmi diag -r 2` that requests the node's GPUs. gpunode pins the pod
    /// to the node (a required node affinity on its name), adds tolerations for gpunode's own
    /// taint and the cordon, and sets restartPolicy Never; the Job gets no retries
    /// (backoffLimit 0) and `timeout` as its activeDeadlineSeconds. A template the operator
    /// cannot read, or one beyond what the chart's `operator.validation.namespaces` grants its
    /// namespace (a ServiceAccount not listed, privileged containers, added capabilities, host
    /// namespaces, hostPath volumes), keeps the node as it is (fail closed) and marks the
    /// policy Degraded (reason InvalidValidation), naming the field. A template that names no
    /// ServiceAccount runs as the first one the chart grants.
    #[schemars(schema_with = "template_schema")]
    pub template: Value,

    /// How long a validation may run, from the Job's creation. A validation still running
    /// then has failed (timed out). Defaults to 30m.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,

    /// Most nodes of this policy validated at once. A recovered node beyond it waits, cordoned,
    /// for a validation to finish. Defaults to 1.
    #[serde(default = "default_max_concurrent")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_concurrent: u32,

    /// Also validate idle healthy nodes now and then, not only recovered ones. Off when
    /// omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub periodic: Option<PeriodicValidation>,
}

/// Validation of idle nodes, bounded.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(format!(
    "!has(self.every) || !self.every.matches('{}') || duration(self.every) >= duration('1h')",
    crate::rules::DURATION_RE
)).message("every must be at least 1h: a node is not validated more often").field_path(".every"))]
pub struct PeriodicValidation {
    /// How often each node is validated at most (from the start of its last periodic
    /// validation). At least 1h. Defaults to 168h (a week).
    #[serde(default = "default_every")]
    pub every: Duration,

    /// Most periodic validations started per hour across the policy's nodes. Defaults to 1.
    #[serde(default = "default_max_per_hour")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_per_hour: u32,
}

fn default_every() -> Duration {
    Duration::from_secs(168 * 3600)
}

fn default_max_per_hour() -> u32 {
    1
}

fn default_timeout() -> Duration {
    Duration::from_secs(30 * 60)
}

fn default_max_concurrent() -> u32 {
    1
}

/// A PodTemplateSpec, kept as written for the operator to read (the full pod schema would make
/// the CRD several times larger): the API server checks what a template cannot do without, a
/// spec with named containers with images, and no `nodeName` (gpunode pins the pod itself).
fn template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let open = |extra: Value| {
        let mut o = serde_json::json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true});
        if let (Some(o), Value::Object(extra)) = (o.as_object_mut(), extra) {
            o.extend(extra);
        }
        o
    };
    let container = open(serde_json::json!({
        "required": ["name", "image"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "image": {"type": "string", "minLength": 1},
        },
    }));
    let spec = open(serde_json::json!({
        "required": ["containers"],
        "properties": {
            "containers": {"type": "array", "minItems": 1, "items": container},
            "nodeName": {"type": "string"},
        },
        "x-kubernetes-validations": [{
            "rule": "!has(self.nodeName)",
            "message": "must be unset: gpunode pins the validation pod to the node it validates",
            "fieldPath": ".nodeName",
        }],
    }));
    let template = open(serde_json::json!({
        "description": "A PodTemplateSpec (metadata and spec) of the validation Job's pod.",
        "required": ["spec"],
        "properties": {
            "metadata": open(serde_json::json!({})),
            "spec": spec,
        },
    }));
    schemars::Schema::try_from(template).unwrap_or_default()
}

impl ValidationPolicy {
    /// The template as a PodTemplateSpec, or why it is not one (the field path and the reason).
    pub fn pod_template(&self) -> Result<PodTemplateSpec, String> {
        let template: PodTemplateSpec = serde_path_to_error::deserialize(&self.template)
            .map_err(|e| format!("spec.validation.template.{}: {}", e.path(), e.inner()))?;
        let spec = template
            .spec
            .as_ref()
            .ok_or("spec.validation.template.spec: required (the pod's spec)")?;
        if spec.containers.is_empty() {
            return Err(
                "spec.validation.template.spec.containers: at least one container is required".into(),
            );
        }
        if spec.node_name.is_some() {
            return Err(
                "spec.validation.template.spec.nodeName: must be unset, gpunode pins the pod to the node"
                    .into(),
            );
        }
        Ok(template)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn policy(template: Value) -> ValidationPolicy {
        ValidationPolicy {
            namespace: "gpu-validation".into(),
            template,
            timeout: default_timeout(),
            max_concurrent: 1,
            periodic: None,
        }
    }

    #[test]
    fn a_pod_template_reads() {
        let t = policy(json!({"spec": {"containers": [{"name": "diag", "image": "dcgm:4"}]}}))
            .pod_template()
            .unwrap();
        assert_eq!(t.spec.unwrap().containers[0].name, "diag");
    }

    #[test]
    fn a_bad_template_names_the_field_and_the_reason() {
        let e = policy(json!({"spec": {"containers": [{"name": 7}]}}))
            .pod_template()
            .unwrap_err();
        assert!(
            e.starts_with("spec.validation.template.spec.containers[0].name: invalid type"),
            "{e}"
        );
        let e = policy(json!({"metadata": {}})).pod_template().unwrap_err();
        assert!(e.starts_with("spec.validation.template.spec: required"), "{e}");
        let e = policy(json!({"spec": {"containers": []}}))
            .pod_template()
            .unwrap_err();
        assert!(e.contains("at least one container"), "{e}");
        let e = policy(json!({"spec": {"nodeName": "n", "containers": [{"name": "a"}]}}))
            .pod_template()
            .unwrap_err();
        assert!(e.starts_with("spec.validation.template.spec.nodeName"), "{e}");
    }
}
