//! The node writer (`apply::Applier`) at the level of its HTTP requests: each test scripts the
//! API server's side of the conversation, asserts every request the writer sends (method, path,
//! query, content type, JSON body) and answers it, and fails on a request it did not expect or
//! one that never came. The expected requests are written out by hand from the Kubernetes API,
//! not derived from the writer's code.
//!
//! No sleeps: the scripted server is driven by the requests; every test is bounded by a timeout
//! so a hang fails fast.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, future::Future, time::Duration};

use gpunode_crds::{
    DriftClass, GpuNodePolicySpec,
    policy::{DrainPolicy, TaintEffect},
};
use gpunode_operator::{
    apply::{Applier, ApplyError, NodeOutcome},
    leader::Leadership,
    markers::{ClassTrack, DriftTaint},
    plan::{self, DrainStep, NodeCondition, NodePlan, NodeView},
    reasons::Reason,
    verdict::{Drift, NodeState, Verdict},
};
use http::{Method, Request, Response};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{Client, client::Body};
use serde_json::{Value, json};

/// When the fixtures' existing taints, drift and drain began.
const EARLIER: &str = "2026-11-29T09:00:00Z";
/// The `now` of every write.
const NOW: &str = "2026-11-29T12:00:00Z";
/// How long one test may take before it counts as hung.
const LIMIT: Duration = Duration::from_secs(20);

const MERGE_PATCH: &str = "application/merge-patch+json";
const APPLY_PATCH: &str = "application/apply-patch+yaml";
const STRATEGIC_PATCH: &str = "application/strategic-merge-patch+json";
const JSON: &str = "application/json";

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

// --- the scripted API server -------------------------------------------------------------

/// What the body of an expected request must be.
enum BodyIs {
    /// No body (a GET).
    Empty,
    /// Exactly this JSON.
    Exactly(Value),
    /// At least these values at these JSON pointers.
    Has(Vec<(&'static str, Value)>),
}

/// One request the writer must send, and the answer it gets.
struct Exchange {
    method: Method,
    path: String,
    /// The decoded query pairs, in any order.
    query: Vec<(&'static str, String)>,
    content_type: Option<&'static str>,
    body: BodyIs,
    status: u16,
    reply: Value,
}

impl Exchange {
    fn new(method: Method, path: impl Into<String>) -> Self {
        Exchange {
            method,
            path: path.into(),
            query: Vec::new(),
            content_type: None,
            body: BodyIs::Empty,
            status: 200,
            reply: json!({}),
        }
    }

    fn get(path: impl Into<String>) -> Self {
        Exchange::new(Method::GET, path)
    }

    fn patch(path: impl Into<String>, content_type: &'static str, body: Value) -> Self {
        Exchange {
            content_type: Some(content_type),
            body: BodyIs::Exactly(body),
            ..Exchange::new(Method::PATCH, path)
        }
    }

    fn query(mut self, key: &'static str, value: &str) -> Self {
        self.query.push((key, value.to_string()));
        self
    }

    /// The server-side apply of gpunode's field manager.
    fn applied(self) -> Self {
        self.query("fieldManager", "gpunode-operator")
            .query("force", "true")
    }

    fn answer(mut self, status: u16, reply: Value) -> Self {
        self.status = status;
        self.reply = reply;
        self
    }

    fn what(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// An API `Status` error answer.
fn failure(code: u16, reason: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": format!("scripted {reason}"), "reason": reason, "code": code,
    })
}

/// Percent-decodes a query component (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = query
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect();
    pairs.sort();
    pairs
}

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Answers the script in order, asserting each request; then asserts that no other request
/// comes before the client is dropped.
async fn serve(mut handle: Handle, script: Vec<Exchange>) {
    for (i, ex) in script.into_iter().enumerate() {
        let Some((request, respond)) = handle.next_request().await else {
            panic!("request {i} ({}) was never sent", ex.what());
        };
        let (parts, body) = request.into_parts();
        let at = format!("request {i} ({} {})", parts.method, parts.uri);
        assert_eq!(parts.method, ex.method, "{at}: method");
        assert_eq!(parts.uri.path(), ex.path, "{at}: path");
        let mut want: Vec<(String, String)> =
            ex.query.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        want.sort();
        assert_eq!(query_pairs(parts.uri.query()), want, "{at}: query");
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(content_type.as_deref(), ex.content_type, "{at}: content-type");
        let bytes = body.collect_bytes().await.unwrap();
        match &ex.body {
            BodyIs::Empty => assert!(bytes.is_empty(), "{at}: body {bytes:?}"),
            BodyIs::Exactly(want) => {
                let got: Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(&got, want, "{at}: body");
            }
            BodyIs::Has(fields) => {
                let got: Value = serde_json::from_slice(&bytes).unwrap();
                for (pointer, want) in fields {
                    assert_eq!(got.pointer(pointer), Some(want), "{at}: body at {pointer}: {got}");
                }
            }
        }
        respond.send_response(
            Response::builder()
                .status(ex.status)
                .header(http::header::CONTENT_TYPE, JSON)
                .body(Body::from(serde_json::to_vec(&ex.reply).unwrap()))
                .unwrap(),
        );
    }
    if let Some((request, _)) = handle.next_request().await {
        panic!("unexpected request {} {}", request.method(), request.uri());
    }
}

/// Runs `writer` against a client whose every request must follow `script`. The writer's
/// future owns the client, so the server sees the end of the conversation when it completes.
async fn scripted<F, Fut, T>(script: Vec<Exchange>, writer: F) -> T
where
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = T>,
{
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(serve(handle, script));
    let out = tokio::time::timeout(LIMIT, writer(Client::new(service, "default")))
        .await
        .expect("the writer hung");
    match tokio::time::timeout(LIMIT, server).await {
        Ok(Ok(())) => out,
        // The server's assertion is the real failure (the writer then only saw a dropped
        // connection).
        Ok(Err(e)) => std::panic::resume_unwind(e.into_panic()),
        Err(_) => panic!("the scripted server hung: the client was kept alive"),
    }
}

// --- fixtures ----------------------------------------------------------------------------

const NODE: &str = "/api/v1/nodes/gpu-1";
const NODE_STATUS: &str = "/api/v1/nodes/gpu-1/status";

fn thermal_taint() -> DriftTaint {
    DriftTaint {
        effect: TaintEffect::NoSchedule,
        value: "thermal".to_string(),
    }
}

/// Policy `p`, thermal drift since EARLIER: the thermal NoSchedule taint, no cordon, no drain.
/// Planned by the real planner, with a fixed condition message and no Events (the writer does
/// not publish them).
fn tainted_plan() -> NodePlan {
    let spec: GpuNodePolicySpec = serde_json::from_value(json!({
        "remediation": [{"classes": ["Thermal"], "action": "Taint", "effect": "NoSchedule"}],
    }))
    .unwrap();
    let verdict = Verdict::new(
        vec![Drift {
            class: DriftClass::Thermal,
            check: "gpu.maxTemperatureC".into(),
            expected: "<= 85".into(),
            actual: "91".into(),
            gpu: Some(0),
            device: None,
        }],
        Vec::new(),
    );
    let mut observed = Node::default();
    observed.metadata.name = Some("gpu-1".to_string());
    let mut view = NodeView::observe(&observed, verdict, Vec::new()).0;
    view.markers.classes = [(
        DriftClass::Thermal,
        ClassTrack {
            since: ts(EARLIER),
            cleared_at: None,
        },
    )]
    .into();
    let mut plan = plan::plan("p", &spec, &[view], ts(NOW)).nodes.remove(0);
    assert_eq!(plan.taints, BTreeSet::from([thermal_taint()]), "{plan:?}");
    assert_eq!((plan.state, plan.cordon), (NodeState::Drifted, None));
    plan.condition.message = "thermal drift".to_string();
    plan.events.clear();
    plan
}

/// `tainted_plan`, then cordoned by gpunode and draining since EARLIER.
fn draining_plan() -> NodePlan {
    let mut plan = tainted_plan();
    plan.markers.cordoned_by_us = true;
    plan.markers.drain_started = Some(ts(EARLIER));
    plan.cordon = Some(true);
    plan.drain = DrainStep::Run {
        started: ts(EARLIER),
        stuck: false,
    };
    plan.condition = NodeCondition {
        status: "False",
        reason: Reason::Draining,
        message: "thermal drift".to_string(),
    };
    plan
}

const CLASSES: &str = r#"{"Thermal":{"since":"2026-11-29T09:00:00Z"}}"#;

fn foreign_taint() -> Value {
    json!({"key": "example.com/maintenance", "effect": "NoExecute", "timeAdded": EARLIER})
}

fn our_taint(added: &str) -> Value {
    json!({"key": "gpunode.dev/drift", "value": "thermal", "effect": "NoSchedule", "timeAdded": added})
}

/// The labels gpunode writes for `tainted_plan` / `draining_plan`.
fn our_labels() -> Value {
    json!({"gpunode.dev/policy": "p", "gpunode.dev/state": "drifted", "gpunode.dev/drift.thermal": "true"})
}

/// Node gpu-1 at resourceVersion 7 with only other owners' label and annotation, and these
/// taints, cordon and conditions.
fn others_node(taints: Value, unschedulable: bool, conditions: Value) -> Value {
    node_json(
        "7",
        json!({"kubernetes.io/hostname": "gpu-1"}),
        json!({"example.com/owner": "team-a"}),
        taints,
        unschedulable,
        conditions,
    )
}

/// Node gpu-1 at resourceVersion `rv` with these labels, annotations, taints, cordon and
/// conditions, as the API server returns it.
fn node_json(
    rv: &str,
    labels: Value,
    annotations: Value,
    taints: Value,
    unschedulable: bool,
    conditions: Value,
) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-1", "resourceVersion": rv, "labels": labels, "annotations": annotations},
        "spec": {"taints": taints, "unschedulable": unschedulable},
        "status": {"conditions": conditions},
    })
}

fn node(v: Value) -> Node {
    serde_json::from_value(v).unwrap()
}

fn condition(status: &str, reason: &str) -> Value {
    json!({"type": "GpuPolicyCompliant", "status": status, "reason": reason, "message": "thermal drift",
           "lastTransitionTime": EARLIER, "lastHeartbeatTime": EARLIER})
}

fn ready() -> Value {
    json!({"type": "Ready", "status": "True"})
}

/// Labels, annotations and condition already as `tainted_plan` wants them; the taint missing.
fn untainted_node(rv: &str, taints: Value) -> Value {
    let mut labels = our_labels();
    labels["kubernetes.io/hostname"] = json!("gpu-1");
    node_json(
        rv,
        labels,
        json!({"gpunode.dev/classes": CLASSES}),
        taints,
        false,
        json!([ready(), condition("False", "Drifted")]),
    )
}

/// Everything already as `draining_plan` wants it: only the drain is left to do.
fn draining_node() -> Value {
    node_json(
        "7",
        our_labels(),
        json!({"gpunode.dev/classes": CLASSES, "gpunode.dev/cordoned": "true", "gpunode.dev/drain-started": EARLIER}),
        json!([foreign_taint(), our_taint(EARLIER)]),
        true,
        json!([ready(), condition("False", "Draining")]),
    )
}

async fn apply(
    client: Client,
    plan: &NodePlan,
    observed: Value,
    drain: &DrainPolicy,
) -> Result<NodeOutcome, ApplyError> {
    Applier::new(client)
        .apply("p", plan, &node(observed), drain, ts(NOW))
        .await
}

fn rv(n: &Option<Box<Node>>) -> Option<&str> {
    n.as_ref().and_then(|n| n.metadata.resource_version.as_deref())
}

// --- taints and cordon -------------------------------------------------------------------

/// The taint write to gpu-1 at `rv` with these taints (merge patch, resourceVersion
/// precondition, the complete list since `spec.taints` is atomic).
fn taint_write(rv: &str, taints: Value) -> Exchange {
    Exchange::patch(
        NODE,
        MERGE_PATCH,
        json!({"metadata": {"resourceVersion": rv}, "spec": {"taints": taints, "unschedulable": false}}),
    )
}

#[tokio::test]
async fn a_taint_write_that_conflicts_is_retried_on_the_node_read_again() {
    let someone_elses = json!({"key": "example.com/new", "effect": "NoSchedule"});
    let script = vec![
        taint_write("7", json!([foreign_taint(), our_taint(NOW)])).answer(409, failure(409, "Conflict")),
        // Re-read: meanwhile someone else added a taint; it must survive the retry.
        Exchange::get(NODE).answer(200, untainted_node("8", json!([foreign_taint(), someone_elses]))),
        taint_write("8", json!([foreign_taint(), someone_elses, our_taint(NOW)])).answer(
            200,
            untainted_node("9", json!([foreign_taint(), someone_elses, our_taint(NOW)])),
        ),
    ];
    let observed = untainted_node("7", json!([foreign_taint()]));
    let out = scripted(script, |c| async move {
        apply(c, &tainted_plan(), observed, &DrainPolicy::default()).await
    })
    .await
    .unwrap();
    assert!(out.wrote_spec);
    assert!(!out.wrote_metadata && !out.wrote_condition, "{out:?}");
    assert_eq!(rv(&out.written), Some("9"), "the node as last written");
}

#[tokio::test]
async fn a_taint_write_that_always_conflicts_gives_up_after_five_tries() {
    let mut script = Vec::new();
    for try_ in 0..5 {
        let (sent, fresh) = ((7 + try_).to_string(), (8 + try_).to_string());
        script.push(
            taint_write(&sent, json!([foreign_taint(), our_taint(NOW)]))
                .answer(409, failure(409, "Conflict")),
        );
        script.push(Exchange::get(NODE).answer(200, untainted_node(&fresh, json!([foreign_taint()]))));
    }
    let observed = untainted_node("7", json!([foreign_taint()]));
    let err = scripted(script, |c| async move {
        apply(c, &tainted_plan(), observed, &DrainPolicy::default()).await
    })
    .await
    .expect_err("every try conflicted");
    assert!(matches!(&err, ApplyError::Conflict(n) if n == "gpu-1"), "{err:?}");
}

#[tokio::test]
async fn a_taint_write_refused_otherwise_is_an_error_without_retry() {
    let script =
        vec![taint_write("7", json!([foreign_taint(), our_taint(NOW)])).answer(422, failure(422, "Invalid"))];
    let observed = untainted_node("7", json!([foreign_taint()]));
    let err = scripted(script, |c| async move {
        apply(c, &tainted_plan(), observed, &DrainPolicy::default()).await
    })
    .await
    .expect_err("refused");
    assert!(
        matches!(&err, ApplyError::Api { source: kube::Error::Api(s), .. } if s.code == 422),
        "{err:?}"
    );
}

// --- labels, annotations and the condition -----------------------------------------------

/// The apply of `tainted_plan`'s labels, annotations and condition, the condition new.
fn drifted_record() -> Value {
    record_body(json!({"gpunode.dev/classes": CLASSES}), "Drifted", NOW)
}

/// The apply of our labels, these annotations and the condition with this reason and
/// transition time (heartbeat at NOW).
fn record_body(annotations: Value, reason: &str, since: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-1", "labels": our_labels(), "annotations": annotations},
        "status": {"conditions": [{
            "type": "GpuPolicyCompliant", "status": "False", "reason": reason, "message": "thermal drift",
            "lastTransitionTime": since, "lastHeartbeatTime": NOW,
        }]},
    })
}

/// The one server-side apply through nodes/status, with this body.
fn record_apply(body: Value) -> Exchange {
    Exchange::patch(NODE_STATUS, APPLY_PATCH, body).applied()
}

#[tokio::test]
async fn labels_annotations_and_the_condition_are_one_apply_to_the_status() {
    // The taint is in place; labels and annotations are not, and the condition has an older
    // reason with the same status (its lastTransitionTime stays).
    let observed = others_node(
        json!([our_taint(EARLIER)]),
        false,
        json!([ready(), condition("False", "RemediationWaiting")]),
    );
    let written = untainted_node("8", json!([our_taint(EARLIER)]));
    let script = vec![
        record_apply(record_body(
            json!({"gpunode.dev/classes": CLASSES}),
            "Drifted",
            EARLIER,
        ))
        .answer(200, written),
    ];
    let out = scripted(script, |c| async move {
        apply(c, &tainted_plan(), observed, &DrainPolicy::default()).await
    })
    .await
    .unwrap();
    assert!(
        out.wrote_metadata && out.wrote_condition && !out.wrote_spec,
        "{out:?}"
    );
    assert_eq!(rv(&out.written), Some("8"));
}

#[tokio::test]
async fn a_flipped_condition_moves_its_transition_time_and_the_cordon_marker_is_not_applied() {
    // Cordoned by gpunode: the marker is written with the cordon (by the taint write), never
    // by the apply, so the apply leaves it out.
    let mut plan = tainted_plan();
    plan.markers.cordoned_by_us = true;
    let observed = node_json(
        "7",
        json!({}),
        json!({"gpunode.dev/cordoned": "true"}),
        json!([our_taint(EARLIER)]),
        true,
        json!([condition("True", "Compliant")]),
    );
    let script =
        vec![record_apply(drifted_record()).answer(200, untainted_node("8", json!([our_taint(EARLIER)])))];
    let out = scripted(script, |c| async move {
        apply(c, &plan, observed, &DrainPolicy::default()).await
    })
    .await
    .unwrap();
    assert!(out.wrote_metadata && out.wrote_condition, "{out:?}");
}

#[tokio::test]
async fn an_older_gpunodes_apply_to_the_main_resource_is_released() {
    let observed = node_json(
        "7",
        json!({}),
        json!({}),
        json!([our_taint(EARLIER)]),
        false,
        json!([]),
    );
    // The apply's answer shows gpunode's field manager also owning metadata through the main
    // resource (how an older gpunode applied labels): an empty apply there releases it.
    let mut written = untainted_node("8", json!([our_taint(EARLIER)]));
    written["metadata"]["managedFields"] = json!([
        {"manager": "gpunode-operator", "operation": "Apply", "apiVersion": "v1",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:gpunode.dev/policy": {}}}}},
        {"manager": "gpunode-operator", "operation": "Apply", "apiVersion": "v1", "subresource": "status",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:gpunode.dev/state": {}}}}},
    ]);
    let script = vec![
        record_apply(drifted_record()).answer(200, written),
        Exchange::patch(
            NODE,
            APPLY_PATCH,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}),
        )
        .applied()
        .answer(200, untainted_node("9", json!([our_taint(EARLIER)]))),
    ];
    let out = scripted(script, |c| async move {
        apply(c, &tainted_plan(), observed, &DrainPolicy::default()).await
    })
    .await
    .unwrap();
    assert!(out.wrote_metadata, "{out:?}");
}

// --- release -----------------------------------------------------------------------------

#[tokio::test]
async fn release_removes_gpunodes_taints_cordon_labels_and_condition() {
    let observed = node_json(
        "7",
        json!({"kubernetes.io/hostname": "gpu-1", "gpunode.dev/policy": "p", "gpunode.dev/state": "drifted",
               "gpunode.dev/drift.thermal": "true"}),
        json!({"example.com/owner": "team-a", "gpunode.dev/classes": CLASSES, "gpunode.dev/cordoned": "true"}),
        json!([our_taint(EARLIER), foreign_taint()]),
        true,
        json!([ready(), condition("False", "Cordoned")]),
    );
    let clean = node_json(
        "8",
        json!({}),
        json!({}),
        json!([foreign_taint()]),
        false,
        json!([ready()]),
    );
    let script = vec![
        // Taints and cordon with the marker, in one precondition'd write.
        Exchange::patch(
            NODE,
            MERGE_PATCH,
            json!({
                "metadata": {"resourceVersion": "7", "annotations": {"gpunode.dev/cordoned": null}},
                "spec": {"taints": [foreign_taint()], "unschedulable": false},
            }),
        )
        .answer(200, clean.clone()),
        // Applying nothing under gpunode's field manager drops every label and annotation it owns.
        Exchange::patch(
            NODE_STATUS,
            APPLY_PATCH,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1"}}),
        )
        .applied()
        .answer(200, clean.clone()),
        // The condition is co-owned by other writers of the list: deleted by its merge key.
        Exchange::patch(
            NODE_STATUS,
            STRATEGIC_PATCH,
            json!({"status": {"conditions": [{"type": "GpuPolicyCompliant", "$patch": "delete"}]}}),
        )
        .answer(200, clean),
    ];
    let wrote = scripted(script, |c| async move {
        Applier::new(c).release(&node(observed), ts(NOW)).await
    })
    .await
    .unwrap();
    assert!(wrote);
}

#[tokio::test]
async fn release_of_a_clean_node_sends_nothing() {
    // Someone else's taint and cordon, no gpunode label, annotation or condition.
    let observed = others_node(json!([foreign_taint()]), true, json!([ready()]));
    let wrote = scripted(Vec::new(), |c| async move {
        Applier::new(c).release(&node(observed), ts(NOW)).await
    })
    .await
    .unwrap();
    assert!(!wrote);
}

// --- drain -------------------------------------------------------------------------------

fn pod(ns: &str, name: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": name}, "spec": {"nodeName": "gpu-1", "containers": [{"name": "c"}]},
           "status": {"phase": "Running"}})
}

fn daemon_pod() -> Value {
    let mut p = pod("default", "agent-x1");
    p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                                               "uid": "u1", "controller": true}]);
    p
}

fn pod_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "50"}, "items": items})
}

fn list_pods(items: Vec<Value>) -> Exchange {
    Exchange::get("/api/v1/pods")
        .query("fieldSelector", "spec.nodeName=gpu-1")
        .answer(200, pod_list(items))
}

fn evict(ns: &str, name: &str) -> Exchange {
    Exchange {
        content_type: Some(JSON),
        body: BodyIs::Has(vec![("/metadata/name", json!(name))]),
        ..Exchange::new(
            Method::POST,
            format!("/api/v1/namespaces/{ns}/pods/{name}/eviction"),
        )
    }
}

fn evicted() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

#[tokio::test]
async fn a_drain_pass_evicts_each_evictable_pod_and_counts_the_outcomes() {
    let script = vec![
        list_pods(vec![
            pod("default", "evicted"),
            daemon_pod(),
            pod("kube-system", "dns"),
            pod("team-a", "refused"),
            pod("team-a", "gone"),
            pod("team-b", "failing"),
        ]),
        evict("default", "evicted").answer(201, evicted()),
        evict("team-a", "refused").answer(429, failure(429, "TooManyRequests")),
        evict("team-a", "gone").answer(404, failure(404, "NotFound")),
        evict("team-b", "failing").answer(500, failure(500, "InternalError")),
    ];
    let out = scripted(script, |c| async move {
        apply(c, &draining_plan(), draining_node(), &DrainPolicy::default()).await
    })
    .await
    .unwrap();
    assert_eq!(
        (out.evicted, out.remaining, out.refused),
        (1, 2, 1),
        "201 evicted; 429 refused and remaining; 404 neither; 500 remaining"
    );
    assert!(
        !out.wrote_metadata && out.written.is_none(),
        "not drained yet: {out:?}"
    );
}

#[tokio::test]
async fn a_drain_with_nothing_left_to_evict_is_recorded_as_drained() {
    let mut finished = pod("default", "job-x");
    finished["status"]["phase"] = json!("Succeeded");
    let script = vec![
        list_pods(vec![daemon_pod(), finished]),
        record_apply(record_body(
            json!({"gpunode.dev/classes": CLASSES, "gpunode.dev/drain-started": EARLIER, "gpunode.dev/drained": NOW}),
            "Draining",
            EARLIER,
        ))
        .answer(200, draining_node()),
    ];
    let out = scripted(script, |c| async move {
        apply(c, &draining_plan(), draining_node(), &DrainPolicy::default()).await
    })
    .await
    .unwrap();
    assert_eq!((out.evicted, out.remaining, out.refused), (0, 0, 0));
    assert!(out.wrote_metadata && out.written.is_some(), "{out:?}");
}

#[tokio::test]
async fn a_pod_list_that_fails_is_an_error() {
    let script = vec![
        Exchange::get("/api/v1/pods")
            .query("fieldSelector", "spec.nodeName=gpu-1")
            .answer(403, failure(403, "Forbidden")),
    ];
    let err = scripted(script, |c| async move {
        apply(c, &draining_plan(), draining_node(), &DrainPolicy::default()).await
    })
    .await
    .expect_err("forbidden");
    assert!(
        matches!(&err, ApplyError::Api { source: kube::Error::Api(s), .. } if s.code == 403),
        "{err:?}"
    );
}

/// The policy's grace period reaches the API server as the Eviction's
/// `deleteOptions.gracePeriodSeconds` (kube 5.0.0's `EvictParams` sends `delete_options`, which
/// the API server drops, so the writer sends its own body).
#[tokio::test]
async fn the_grace_period_reaches_the_eviction() {
    let drain = DrainPolicy {
        grace_period_seconds: Some(30),
        ..DrainPolicy::default()
    };
    let script = vec![
        list_pods(vec![pod("default", "web")]),
        Exchange {
            body: BodyIs::Has(vec![("/deleteOptions/gracePeriodSeconds", json!(30))]),
            ..evict("default", "web")
        }
        .answer(201, evicted()),
    ];
    scripted(script, |c| async move {
        apply(c, &draining_plan(), draining_node(), &drain).await
    })
    .await
    .unwrap();
}

// --- the leadership gate -----------------------------------------------------------------

#[tokio::test]
async fn a_writer_that_does_not_lead_writes_nothing() {
    let observed = untainted_node("7", json!([foreign_taint()]));
    let err = scripted(Vec::new(), |c| async move {
        Applier::new(c)
            .with_gate(Leadership::fixed(false))
            .apply(
                "p",
                &tainted_plan(),
                &node(observed),
                &DrainPolicy::default(),
                ts(NOW),
            )
            .await
    })
    .await
    .expect_err("not the leader");
    assert!(
        matches!(&err, ApplyError::NotLeader(n) if n == "gpu-1"),
        "{err:?}"
    );

    let observed = draining_node();
    let err = scripted(Vec::new(), |c| async move {
        Applier::new(c)
            .with_gate(Leadership::fixed(false))
            .release(&node(observed), ts(NOW))
            .await
    })
    .await
    .expect_err("not the leader");
    assert!(matches!(&err, ApplyError::NotLeader(_)), "{err:?}");
}

/// One drain pass of `draining_plan` by a writer gated on a fixed leadership.
async fn gated_drain(script: Vec<Exchange>, leading: bool) -> Result<NodeOutcome, ApplyError> {
    scripted(script, |c| async move {
        Applier::new(c)
            .with_gate(Leadership::fixed(leading))
            .apply(
                "p",
                &draining_plan(),
                &node(draining_node()),
                &DrainPolicy::default(),
                ts(NOW),
            )
            .await
    })
    .await
}

#[tokio::test]
async fn a_writer_that_does_not_lead_lists_pods_but_evicts_none() {
    // Reads are not gated, only writes: the pod list goes out, no eviction does.
    let script = vec![list_pods(vec![pod("default", "web")])];
    let err = gated_drain(script, false).await.expect_err("not the leader");
    assert!(matches!(&err, ApplyError::NotLeader(_)), "{err:?}");
}

#[tokio::test]
async fn a_leading_writer_writes() {
    // The gated writer of the test above, leading: the same plan goes through.
    let script = vec![
        list_pods(vec![pod("default", "web")]),
        evict("default", "web").answer(201, evicted()),
    ];
    let out = gated_drain(script, true).await.unwrap();
    assert_eq!(out.evicted, 1);
}
