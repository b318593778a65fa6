//! Late writes: every kind of write the operator makes (node labels and annotations, node
//! status, an eviction, a DeviceTaintRule, a GpuResetRequest, a remediation object, a Job, an
//! Event, a policy's status), issued with a given client against given objects, and what the
//! API server's audit log recorded of them.
//!
//! The fence tests issue them with a deposed replica's own token after the new leader acquired
//! the Lease: the requests a paused or partitioned leader still had to send. The audit log is
//! the witness of each attempt and of what was stored.

use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, Patch, PatchParams,
        PostParams,
    },
};
use serde_json::json;

use super::{checks::Check, cluster::FaultCluster};
use crate::{Error, audit::AuditEvent, remediator, wait};

/// Part of the leader fence's message for a replica that does not hold the Lease.
pub const NOT_HOLDER: &str = "does not hold the leader Lease";

/// Each kind of write [`every_write`] makes, in its order, as the audit log names it: (what,
/// verb, resource, subresource).
pub const KINDS: [(&str, &str, &str, &str); 9] = [
    ("node labels and annotations", "patch", "nodes", ""),
    ("node status", "patch", "nodes", "status"),
    ("eviction", "create", "pods", "eviction"),
    ("DeviceTaintRule", "create", "devicetaintrules", ""),
    ("GpuResetRequest", "create", "gpuresetrequests", ""),
    ("remediation object", "create", "fakereboots", ""),
    ("Job", "create", "jobs", ""),
    ("Event", "create", "events", ""),
    ("policy status", "patch", "gpunodepolicies", "status"),
];

/// What the writes are aimed at. The objects they create are named `<prefix>-…`.
#[derive(Debug, Clone)]
pub struct Targets {
    /// The node whose labels, annotations and status are patched.
    pub node: String,
    /// The namespace of the pod evicted, the remediation object and the Job.
    pub namespace: String,
    /// The namespace of the Event (gpunode writes its Events about nodes to `default`).
    pub events: String,
    /// The pod evicted.
    pub pod: String,
    /// The policy whose status is patched.
    pub policy: String,
    /// Prefix of the names of the objects created.
    pub prefix: String,
}

/// Outcomes of [`every_write`]: (what, the API server's answer), in the order of [`KINDS`].
pub type Outcomes = Vec<(&'static str, Result<(), kube::Error>)>;

/// The dynamic API of `plural` (`group/version`, kind `kind`), namespaced when `ns` is given.
pub fn api(client: &Client, gvk: (&str, &str, &str), plural: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let (group, version, kind) = gvk;
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn post(dry_run: bool) -> PostParams {
    PostParams {
        dry_run,
        ..PostParams::default()
    }
}

fn patch(dry_run: bool) -> PatchParams {
    PatchParams {
        dry_run,
        ..PatchParams::default()
    }
}

fn object(value: serde_json::Value) -> Result<DynamicObject, Error> {
    Ok(serde_json::from_value(value)?)
}

/// The objects [`every_write`] creates, each as (its API, its name).
pub fn created(client: &Client, t: &Targets) -> Vec<(Api<DynamicObject>, String)> {
    let ns = Some(t.namespace.as_str());
    vec![
        (
            api(
                client,
                ("resource.k8s.io", "v1", "DeviceTaintRule"),
                "devicetaintrules",
                None,
            ),
            format!("{}-gpu-0", t.prefix),
        ),
        (
            api(
                client,
                ("gpunode.dev", "v1alpha1", "GpuResetRequest"),
                "gpuresetrequests",
                None,
            ),
            format!("{}-gpu-0", t.prefix),
        ),
        (
            Api::namespaced_with(client.clone(), &t.namespace, &remediator::reboot_resource()),
            t.prefix.clone(),
        ),
        (
            api(client, ("batch", "v1", "Job"), "jobs", ns),
            format!("{}-validate", t.prefix),
        ),
        (
            api(
                client,
                ("events.k8s.io", "v1", "Event"),
                "events",
                Some(&t.events),
            ),
            format!("{}-event", t.prefix),
        ),
    ]
}

/// Every kind of write the operator makes, as `client`, at `t` (dry runs when `dry`).
pub async fn every_write(client: &Client, t: &Targets, dry: bool) -> Result<Outcomes, Error> {
    let mut out = node_writes(client, t, dry).await;
    let evict = EvictParams {
        delete_options: Some(DeleteParams {
            dry_run: dry,
            ..DeleteParams::default()
        }),
        post_options: post(dry),
    };
    let eviction = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &t.namespace)
        .evict(&t.pod, &evict)
        .await;
    out.push(("eviction", eviction.map(|_| ())));
    let [rule, reset, reboot, job, event] = creations(t)?;
    let apis = created(client, t);
    for ((what, ..), (api, body)) in KINDS[3..8]
        .iter()
        .zip(apis.iter().map(|(a, _)| a).zip([rule, reset, reboot, job, event]))
    {
        out.push((*what, api.create(&post(dry), &body).await.map(|_| ())));
    }
    let policies = api(
        client,
        ("gpunode.dev", "v1alpha1", "GpuNodePolicy"),
        "gpunodepolicies",
        None,
    );
    let status = json!({"status": {"matched": 1}});
    let r = policies
        .patch_status(&t.policy, &patch(dry), &Patch::Merge(&status))
        .await;
    out.push(("policy status", r.map(|_| ())));
    Ok(out)
}

/// The node's labels and annotations, then its status.
async fn node_writes(client: &Client, t: &Targets, dry: bool) -> Outcomes {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let label = json!({"metadata": {"labels": {"gpunode.dev/state": "drifted"},
        "annotations": {"gpunode.dev/actions": "cordon"}}});
    let status = json!({"status": {"conditions": [{"type": "GpuPolicyCompliant", "status": "False",
        "reason": "Drifted", "message": "a late write", "lastHeartbeatTime": null,
        "lastTransitionTime": jiff::Timestamp::now().to_string()}]}});
    let labels = nodes.patch(&t.node, &patch(dry), &Patch::Merge(&label)).await;
    let status = nodes
        .patch_status(&t.node, &patch(dry), &Patch::Merge(&status))
        .await;
    vec![
        ("node labels and annotations", labels.map(|_| ())),
        ("node status", status.map(|_| ())),
    ]
}

/// The bodies of the objects created, in the order of [`created`].
fn creations(t: &Targets) -> Result<[DynamicObject; 5], Error> {
    let (node, ns, p) = (&t.node, &t.namespace, &t.prefix);
    Ok([
        object(
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": format!("{p}-gpu-0")},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"},
                "taint": {"key": "gpunode.dev/drift", "value": t.policy, "effect": "NoSchedule"}}}),
        )?,
        object(
            json!({"apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuResetRequest",
            "metadata": {"name": format!("{p}-gpu-0")},
            "spec": {"nodeName": node, "index": 0, "uuid": "GPU-0000"}}),
        )?,
        object(
            json!({"apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
            "kind": "FakeReboot", "metadata": {"name": p, "namespace": ns},
            "spec": {"behavior": "Succeed"}}),
        )?,
        object(json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": format!("{p}-validate"), "namespace": ns},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "check", "image": "busybox"}]}}}}))?,
        object(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": format!("{p}-event"), "namespace": t.events},
            "eventTime": "2026-12-06T00:00:00.000000Z", "reportingController": "gpunode.dev/operator",
            "reportingInstance": p, "action": "Cordon", "reason": "Cordoned", "type": "Normal",
            "regarding": {"kind": "Node", "name": node, "apiVersion": "v1"}}))?,
    ])
}

/// Whether `r` is the fence's refusal: 403 with `message` in it.
pub fn refused_with(r: &Result<(), kube::Error>, message: &str) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(message))
}

/// The writes whose outcome is not the expected one: admitted (`refused` None), or refused by
/// the fence with the message `refused`.
pub fn unexpected(outcomes: &[(&str, Result<(), kube::Error>)], refused: Option<&str>) -> Vec<String> {
    outcomes
        .iter()
        .filter(|(_, r)| match refused {
            Some(m) => !refused_with(r, m),
            None => r.is_err(),
        })
        .map(|(what, r)| format!("{what}: {r:?}"))
        .collect()
}

/// What the audit log recorded of the real writes (not dry runs) of each kind since `since` by
/// the requests `by` selects: (what, attempted, stored).
pub fn witnessed(
    events: &[AuditEvent],
    by: impl Fn(&AuditEvent) -> bool,
    since: jiff::Timestamp,
) -> Vec<(&'static str, usize, usize)> {
    KINDS
        .iter()
        .map(|(what, verb, resource, sub)| {
            let of_kind: Vec<&AuditEvent> = events
                .iter()
                .filter(|e| by(e) && e.at >= since && !e.dry_run)
                .filter(|e| e.verb == *verb && e.resource == *resource && e.subresource == *sub)
                .collect();
            (
                *what,
                of_kind.len(),
                of_kind.iter().filter(|e| e.committed()).count(),
            )
        })
        .collect()
}

/// A deposed replica's late requests: every kind of write, issued with its own token
/// (`client`, audit-log user `user`) at `t` after the new leader `acquired` the Lease. Checks
/// that the audit log recorded an attempt of each kind after the acquisition, that the fence
/// refused each, and that none was stored; removes anything stored all the same.
pub async fn deposed_writes(
    fc: &FaultCluster,
    client: &Client,
    user: &str,
    t: &Targets,
    acquired: jiff::Timestamp,
) -> Result<Vec<Check>, Error> {
    let outcomes = every_write(client, t, false).await?;
    let not_refused = unexpected(&outcomes, Some(NOT_HOLDER));
    let seen = wait::until(
        "the audit log to record every late write",
        std::time::Duration::from_secs(60),
        || async {
            let w = witnessed(&fc.audit()?, |e| e.user == user, acquired);
            Ok(w.iter().all(|(_, attempted, _)| *attempted > 0).then_some(w))
        },
    )
    .await;
    let w = match &seen {
        Ok(w) => w.clone(),
        Err(_) => witnessed(&fc.audit()?, |e| e.user == user, acquired),
    };
    let kinds = w.iter().filter(|(_, n, _)| *n > 0).count();
    let stored: Vec<&str> = w.iter().filter(|(_, _, s)| *s > 0).map(|(k, ..)| *k).collect();
    if !stored.is_empty() {
        for (api, name) in created(client, t) {
            let _ = api.delete(&name, &DeleteParams::background()).await;
        }
    }
    Ok(vec![
        Check::new(
            "every write kind attempted late by the deposed replica (audit log)",
            seen.is_ok(),
            format!(
                "{kinds} of {} kinds attempted after the new leader acquired: {w:?}",
                KINDS.len()
            ),
        ),
        Check::new(
            "each late write refused by the leader fence",
            not_refused.is_empty(),
            format!("not refused by the fence: {not_refused:?}"),
        ),
        Check::new(
            "no late write stored (audit log)",
            stored.is_empty(),
            format!("stored: {stored:?}"),
        ),
    ])
}

impl Targets {
    /// Targets in `wave`: its first node, its last pod, its namespace and policy; created
    /// objects named after `prefix`.
    pub fn in_wave(wave: &super::wave::Wave, prefix: &str) -> Targets {
        Targets {
            node: wave.nodes.first().cloned().unwrap_or_default(),
            namespace: wave.namespace.clone(),
            events: "default".to_string(),
            pod: wave.all_pods().last().cloned().unwrap_or_default(),
            policy: wave.policy.clone(),
            prefix: prefix.to_string(),
        }
    }
}
