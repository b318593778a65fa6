//! The reference write rate: how fast this API server takes the request gpunode converges a
//! node with, sent by a plain concurrent client (a reference to compare gpunode's convergence
//! with, not a bound: a first apply, as a convergence makes, costs more). The request: a server-side apply to
//! `nodes/status` by the field manager `gpunode-operator`, under the operator's own
//! ServiceAccount (so the same API Priority and Fairness flow schema and priority level), with
//! the body gpunode itself wrote to that node (its labels, annotations and `GpuPolicyCompliant`
//! condition, read back from the node's managed fields), only `lastHeartbeatTime` new — as
//! gpunode's own writes carry. Every write therefore changes the stored node (a new
//! resourceVersion, an etcd write, a watch event to every node watcher), like a convergence
//! write; it does not add the labels for the first time, which a convergence write does.
//!
//! The sweep runs each concurrency `reps` times, interleaved with gpunode's own convergence
//! runs by the caller, and keeps every sample, so the result is a median with its spread.

use std::collections::BTreeMap;
use std::time::Instant;

use futures::StreamExt;
use gpunode_operator::apply::FIELD_MANAGER;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Map, Value, json};
use tracing::info;

use crate::error::Error;
use crate::tracker::{CONDITION, NODE_SELECTOR};

/// One node's apply body, as gpunode last wrote it.
#[derive(Debug, Clone)]
pub struct Body {
    name: String,
    labels: Map<String, Value>,
    annotations: Map<String, Value>,
    condition: Value,
}

impl Body {
    /// The body with a fresh heartbeat, as gpunode sends it.
    fn at(&self, now: &str) -> Value {
        let mut condition = self.condition.clone();
        condition["lastHeartbeatTime"] = Value::String(now.to_string());
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": self.labels, "annotations": self.annotations},
            "status": {"conditions": [condition]},
        })
    }

    /// An apply of the name alone by the same field manager: it takes off everything the body
    /// set, leaving the node as a released one is, for a first apply again.
    fn bare(&self) -> Value {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name}})
    }

    /// Size of the body on the wire, bytes.
    pub fn size(&self) -> usize {
        serde_json::to_vec(&self.at("2026-01-01T00:00:00Z")).map_or(0, |v| v.len())
    }
}

/// The keys under `f:<field>` of `fields` (managed fields JSON), without the `f:` prefix.
fn owned_keys(fields: &Value, field: &str) -> Vec<String> {
    fields
        .get("f:metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_object)
        .map(|o| {
            o.keys()
                .filter_map(|k| k.strip_prefix("f:"))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// What gpunode's field manager owns on `node` through `nodes/status`, as an apply body; `None`
/// when gpunode has not written the node.
pub fn body_of(node: &Node) -> Option<Body> {
    let entry = node.managed_fields().iter().find(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER) && m.subresource.as_deref() == Some("status")
    })?;
    let fields = serde_json::to_value(entry.fields_v1.as_ref()?).ok()?;
    let pick = |map: &BTreeMap<String, String>, keys: Vec<String>| -> Map<String, Value> {
        keys.into_iter()
            .filter_map(|k| map.get(&k).map(|v| (k, Value::String(v.clone()))))
            .collect()
    };
    let labels = pick(node.labels(), owned_keys(&fields, "f:labels"));
    let annotations = pick(node.annotations(), owned_keys(&fields, "f:annotations"));
    let condition = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)?;
    Some(Body {
        name: node.name_any(),
        labels,
        annotations,
        condition: serde_json::to_value(condition).ok()?,
    })
}

/// Every benchmark node's body; an error when gpunode has not written one of them.
pub async fn capture(api: &Api<Node>) -> Result<Vec<Body>, Error> {
    let nodes = api
        .list(&ListParams::default().labels(NODE_SELECTOR))
        .await?
        .items;
    let total = nodes.len();
    let bodies: Vec<Body> = nodes.iter().filter_map(body_of).collect();
    if bodies.len() != total {
        return Err(Error::Other(format!(
            "gpunode's apply body found on {} of {total} nodes (the reference replays what gpunode wrote)",
            bodies.len()
        )));
    }
    Ok(bodies)
}

/// One pass of the sweep at one concurrency.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// Requests in flight.
    pub concurrency: usize,
    /// Writes made.
    pub writes: usize,
    /// Failed writes.
    pub errors: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Successful writes per second.
    pub rate: f64,
}

/// Takes gpunode's fields off every node (`Body::bare`), `concurrency` at a time; the writes
/// that failed.
pub async fn strip(api: &Api<Node>, bodies: &[Body], concurrency: usize) -> u64 {
    apply_each(api, bodies.iter(), concurrency, Body::bare).await
}

/// Applies `value(body)` to each body's node with gpunode's field manager (forced) through
/// `nodes/status`, `concurrency` in flight; the writes that failed.
async fn apply_each<'a>(
    api: &Api<Node>,
    bodies: impl Iterator<Item = &'a Body>,
    concurrency: usize,
    value: impl Fn(&Body) -> Value,
) -> u64 {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    futures::stream::iter(bodies)
        .map(|body| {
            let (params, value) = (&params, &value);
            async move {
                u64::from(
                    api.patch_status(&body.name, params, &Patch::Apply(&value(body)))
                        .await
                        .is_err(),
                )
            }
        })
        .buffer_unordered(concurrency.max(1))
        .fold(0u64, |acc, e| async move { acc + e })
        .await
}

/// `writes` applies of the nodes' bodies, going round the nodes, `concurrency` in flight, with
/// `api` (the operator's identity). Fewer writes than nodes touch the first nodes only: the
/// same request whichever node it names.
pub async fn pass(api: &Api<Node>, bodies: &[Body], concurrency: usize, writes: usize) -> Sample {
    let start = Instant::now();
    let each = bodies
        .iter()
        .cycle()
        .take(if bodies.is_empty() { 0 } else { writes });
    // Each write's heartbeat is the time it is sent, as gpunode's writes carry.
    let errors = apply_each(api, each, concurrency, |body| {
        body.at(&jiff::Timestamp::now().to_string())
    })
    .await;
    let seconds = start.elapsed().as_secs_f64();
    let sample = Sample {
        concurrency,
        writes,
        errors,
        seconds,
        rate: (writes as u64).saturating_sub(errors) as f64 / seconds.max(f64::MIN_POSITIVE),
    };
    info!(
        concurrency,
        writes,
        errors,
        seconds,
        rate = sample.rate,
        "reference rate pass"
    );
    sample
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_what_gpunodes_field_manager_owns_through_the_status_subresource() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": "n1",
                "labels": {"gpunode.dev/state": "compliant", "gpunode.dev/policy": "bench", "kubernetes.io/hostname": "n1"},
                "annotations": {"gpunode.dev/x": "1", "other": "2"},
                "managedFields": [
                    {"manager": "kwok", "operation": "Apply", "subresource": "status", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": {"f:kubernetes.io/hostname": {}}}}},
                    {"manager": FIELD_MANAGER, "operation": "Apply", "subresource": "status", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": {"f:gpunode.dev/state": {}, "f:gpunode.dev/policy": {}},
                                                 "f:annotations": {"f:gpunode.dev/x": {}}},
                                  "f:status": {"f:conditions": {}}}},
                ],
            },
            "status": {"conditions": [
                {"type": "Ready", "status": "True"},
                {"type": CONDITION, "status": "True", "reason": "Compliant", "message": "ok",
                 "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
            ]},
        }))
        .unwrap();
        let body = body_of(&node).unwrap().at("2026-02-02T00:00:00Z");
        assert_eq!(
            body["metadata"]["labels"],
            json!({"gpunode.dev/state": "compliant", "gpunode.dev/policy": "bench"})
        );
        assert_eq!(body["metadata"]["annotations"], json!({"gpunode.dev/x": "1"}));
        let c = &body["status"]["conditions"][0];
        assert_eq!(
            (c["type"].as_str(), c["lastHeartbeatTime"].as_str()),
            (Some(CONDITION), Some("2026-02-02T00:00:00Z"))
        );
        assert_eq!(c["lastTransitionTime"], "2026-01-01T00:00:00Z");
    }

    #[test]
    fn a_node_gpunode_never_wrote_has_no_body() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
        assert!(body_of(&node).is_none());
    }
}
