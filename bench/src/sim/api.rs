//! The synthetic API server's HTTP side: the requests gpunode-operator makes of a real one, on
//! the [`Store`]. Lists (paged by `limit` and `continue`), watches (newline-delimited events from
//! a resourceVersion, 410 when it is too old, ended after `timeoutSeconds`), get, create,
//! replace, delete, and the patch types the operator sends: JSON merge patch (with the
//! resourceVersion precondition it carries), JSON patch (kube's finalizer helper), server-side apply (one field manager: what it
//! applied last and no longer applies is removed; conditions merge by type) and the strategic
//! merge patch that deletes a condition by type. Discovery says there is no DRA API. Watches
//! stream their lists (`sendInitialEvents`, the WatchList feature a large cluster's API server
//! serves), as the operator asks when the server supports it.
//!
//! It is as much of an API server as the operator needs and no more: no admission, no
//! authentication, field selectors ignored, label selectors only as `key=value` terms.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Request, State},
    http::{Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use serde_json::{Value, json};

use super::store::{Start, Store, Written};

/// Called after every write of an object with its collection, name and new content.
pub type Observer = Arc<dyn Fn(&str, &str, &Value) + Send + Sync>;

/// Requests served, by what they were.
#[derive(Default, Debug)]
pub struct Counts {
    /// Lists (each page).
    pub lists: AtomicU64,
    /// Watches started.
    pub watches: AtomicU64,
    /// Gets of one object.
    pub gets: AtomicU64,
    /// Patches.
    pub patches: AtomicU64,
    /// Creates (Events included).
    pub creates: AtomicU64,
    /// Replaces and deletes.
    pub others: AtomicU64,
    /// Requests for something this server does not serve.
    pub unknown: AtomicU64,
}

/// What the handlers share.
#[derive(Clone)]
pub struct Api {
    /// The objects.
    pub store: Arc<Store>,
    /// Request counts.
    pub counts: Arc<Counts>,
    observer: Observer,
}

impl Api {
    /// The API over `store`, telling `observer` of every write.
    pub fn new(store: Arc<Store>, observer: Observer) -> Api {
        Api {
            store,
            counts: Arc::default(),
            observer,
        }
    }

    /// The router: every path goes to one handler, which reads it as the API server would.
    pub fn router(self) -> Router {
        Router::new().fallback(handle).with_state(self)
    }
}

/// A request's path: a collection and, maybe, an object. A subresource (`/status`) is the
/// object itself here: nothing reads the difference.
#[derive(Debug, PartialEq)]
struct Target {
    collection: String,
    name: Option<String>,
}

/// Reads `/api/v1/nodes/n1/status`, `/apis/g/v/namespaces/ns/leases/l` and the like.
fn target(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    // The group-version prefix: `api/v1` or `apis/<group>/<version>`.
    let prefix = match segs.first() {
        Some(&"api") => 2,
        Some(&"apis") => 3,
        _ => return None,
    };
    let rest = segs.get(prefix..)?;
    let resource_at = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        2
    } else {
        0
    };
    let resource = rest.get(resource_at)?;
    let collection = format!("/{}/{}", segs[..prefix + resource_at].join("/"), resource);
    let name = rest.get(resource_at + 1).map(|s| (*s).to_string());
    Some(Target { collection, name })
}

/// A query parameter, decoded.
fn param(query: &str, key: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        })
}

/// A label selector's `key=value` (or `key==value`) terms; other terms select everything here.
fn equalities(selector: Option<&str>) -> Vec<(String, String)> {
    selector
        .into_iter()
        .flat_map(|s| s.split(','))
        .filter(|term| !term.contains("!="))
        .filter_map(|term| term.split_once("==").or_else(|| term.split_once('=')))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Whether the object `json` has every label of `terms`. Its text is searched first, so a
/// selector that matches nothing (the WatchList probe's) costs no parse.
fn labelled(json: &str, terms: &[(String, String)]) -> bool {
    if terms.is_empty() {
        return true;
    }
    if !terms
        .iter()
        .all(|(k, v)| json.contains(&format!("\"{k}\":\"{v}\"")))
    {
        return false;
    }
    serde_json::from_str::<Value>(json).is_ok_and(|o| {
        terms
            .iter()
            .all(|(k, v)| o["metadata"]["labels"][k].as_str() == Some(v.as_str()))
    })
}

/// The kind and apiVersion of a collection's objects, for its bookmarks.
fn kind_of(collection: &str) -> (&'static str, &'static str) {
    match collection.rsplit('/').next() {
        Some("nodes") => ("Node", "v1"),
        Some("gpunodereports") => ("GpuNodeReport", "gpunode.dev/v1alpha1"),
        Some("gpunodepolicies") => ("GpuNodePolicy", "gpunode.dev/v1alpha1"),
        Some("leases") => ("Lease", "coordination.k8s.io/v1"),
        _ => ("Unknown", "v1"),
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()});
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn object(code: StatusCode, json: &str) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        json.to_string(),
    )
        .into_response()
}

fn written(w: Written, ok: StatusCode) -> Response {
    match w {
        Written::Ok(json) => object(ok, &json),
        Written::NotFound => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
        Written::Exists => status(StatusCode::CONFLICT, "AlreadyExists", "already exists"),
        Written::Conflict => status(
            StatusCode::CONFLICT,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        ),
    }
}

async fn handle(State(api): State<Api>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    match path.as_str() {
        "/api" => return object(StatusCode::OK, r#"{"kind":"APIVersions","versions":["v1"]}"#),
        "/apis" => {
            return object(
                StatusCode::OK,
                r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#,
            );
        }
        _ => {}
    }
    let Some(t) = target(&path) else {
        api.counts.unknown.fetch_add(1, Ordering::Relaxed);
        return status(StatusCode::NOT_FOUND, "NotFound", &format!("no such path {path}"));
    };
    let method = req.method().clone();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = match axum::body::to_bytes(req.into_body(), 64 << 20).await {
        Ok(b) => b,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e.to_string()),
    };
    match (method, t.name.as_deref()) {
        (Method::GET, None) if matches!(param(&query, "watch").as_deref(), Some("1" | "true")) => {
            watch(&api, &t, &query)
        }
        (Method::GET, None) => list(&api, &t, &query),
        (Method::GET, Some(name)) => {
            api.counts.gets.fetch_add(1, Ordering::Relaxed);
            match api.store.get(&t.collection, name) {
                Some(s) => object(StatusCode::OK, &s.json),
                None => status(StatusCode::NOT_FOUND, "NotFound", "not found"),
            }
        }
        (Method::POST, None) => create(&api, &t, &body),
        (Method::PATCH, Some(name)) => patch(&api, &t, name, &content_type, &body),
        (Method::PUT, Some(name)) => replace(&api, &t, name, &body),
        (Method::DELETE, Some(name)) => {
            api.counts.others.fetch_add(1, Ordering::Relaxed);
            written(api.store.delete(&t.collection, name), StatusCode::OK)
        }
        (m, _) => {
            api.counts.unknown.fetch_add(1, Ordering::Relaxed);
            status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                &format!("{m} {path}"),
            )
        }
    }
}

fn list(api: &Api, t: &Target, query: &str) -> Response {
    api.counts.lists.fetch_add(1, Ordering::Relaxed);
    let limit = param(query, "limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let page = api
        .store
        .list(&t.collection, param(query, "continue").as_deref(), limit);
    let mut out = String::with_capacity(page.items.iter().map(|i| i.len() + 1).sum::<usize>() + 128);
    out.push_str(r#"{"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":""#);
    out.push_str(&page.rv.to_string());
    out.push('"');
    if let Some(next) = &page.next {
        out.push_str(r#","continue":""#);
        out.push_str(next);
        out.push('"');
    }
    out.push_str(r#"},"items":["#);
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item);
    }
    out.push_str("]}");
    object(StatusCode::OK, &out)
}

fn watch(api: &Api, t: &Target, query: &str) -> Response {
    api.counts.watches.fetch_add(1, Ordering::Relaxed);
    let timeout = param(query, "timeoutSeconds")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(300);
    let terms = equalities(param(query, "labelSelector").as_deref());
    if param(query, "sendInitialEvents").as_deref() == Some("true") {
        return streamed_list(api, t, terms, timeout);
    }
    let from = param(query, "resourceVersion")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let (behind, rx) = match api.store.watch(&t.collection, from) {
        Start::From(behind, rx) => (behind, rx),
        Start::Gone => {
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                "status": "Failure", "reason": "Expired", "code": 410,
                "message": format!("too old resource version: {from}")}});
            return object(StatusCode::OK, &format!("{gone}\n"));
        }
    };
    let last = behind.last().map_or(from, |c| c.rv);
    let backlog = futures::stream::iter(behind.into_iter().map(|c| Ok::<Bytes, std::io::Error>(c.line)));
    stream_response(backlog.chain(live(rx, last)), timeout)
}

/// The changes `rx` receives after resourceVersion `last`, as watch lines, until it falls
/// behind (the client then watches again).
fn live(
    rx: tokio::sync::broadcast::Receiver<super::store::Change>,
    last: u64,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold((rx, last), |(mut rx, last)| async move {
        loop {
            match rx.recv().await {
                Ok(c) if c.rv <= last => continue,
                Ok(c) => {
                    let rv = c.rv;
                    return Some((Ok(c.line), (rx, rv)));
                }
                Err(_) => return None,
            }
        }
    })
}

/// A streamed list (`sendInitialEvents=true`, as the WatchList feature sends): every object
/// selected as an ADDED event, a bookmark marking the end of them, then the changes after.
fn streamed_list(api: &Api, t: &Target, terms: Vec<(String, String)>, timeout: u64) -> Response {
    let (all, rv, rx) = api.store.snapshot(&t.collection);
    let (kind, api_version) = kind_of(&t.collection);
    let end = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
        "metadata": {"resourceVersion": rv.to_string(),
                     "annotations": {"k8s.io/initial-events-end": "true"}}}});
    let initial = futures::stream::iter(all)
        .filter(move |json| std::future::ready(labelled(json, &terms)))
        .map(|json| {
            Ok::<Bytes, std::io::Error>(Bytes::from(format!("{{\"type\":\"ADDED\",\"object\":{json}}}\n")))
        });
    let end = futures::stream::once(std::future::ready(Ok(Bytes::from(format!("{end}\n")))));
    stream_response(initial.chain(end).chain(live(rx, rv)), timeout)
}

/// A watch response of `lines`, ended after `timeout` seconds.
fn stream_response(
    lines: impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    timeout: u64,
) -> Response {
    let deadline = tokio::time::sleep(Duration::from_secs(timeout));
    let stream = lines.take_until(deadline);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", &e.to_string()))
}

fn create(api: &Api, t: &Target, body: &[u8]) -> Response {
    api.counts.creates.fetch_add(1, Ordering::Relaxed);
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON");
    };
    if !obj.is_object() {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not an object");
    }
    if t.collection.ends_with("/events") {
        // Events are answered, not kept: nothing reads them here.
        obj["metadata"]["resourceVersion"] = Value::from("1");
        return object(StatusCode::CREATED, &obj.to_string());
    }
    if obj["metadata"]["name"].as_str().is_none()
        && let Some(prefix) = obj["metadata"]["generateName"].as_str()
    {
        obj["metadata"]["name"] =
            Value::from(format!("{prefix}{}", api.counts.creates.load(Ordering::Relaxed)));
    }
    written(api.store.create(&t.collection, obj), StatusCode::CREATED)
}

fn replace(api: &Api, t: &Target, name: &str, body: &[u8]) -> Response {
    api.counts.others.fetch_add(1, Ordering::Relaxed);
    let Ok(new) = serde_json::from_slice::<Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON");
    };
    if !new.is_object() {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not an object");
    }
    let observer = api.observer.clone();
    let w = api.store.update(&t.collection, name, |obj, _| {
        let expected = new["metadata"]["resourceVersion"].as_str();
        if expected.is_some() && expected != obj["metadata"]["resourceVersion"].as_str() {
            return false;
        }
        *obj = new.clone();
        observer(&t.collection, name, obj);
        true
    });
    written(w, StatusCode::OK)
}

fn patch(api: &Api, t: &Target, name: &str, content_type: &str, body: &[u8]) -> Response {
    api.counts.patches.fetch_add(1, Ordering::Relaxed);
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON");
    };
    let observer = api.observer.clone();
    let kind = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let w = api.store.update(&t.collection, name, |obj, applied| {
        match kind.as_str() {
            "application/apply-patch+yaml" => {
                apply(obj, applied.as_deref(), &patch);
                *applied = Some(Arc::new(patch.clone()));
            }
            "application/strategic-merge-patch+json" => strategic(obj, &patch),
            // kube's finalizer helper: a test of the finalizers, then their change.
            "application/json-patch+json" => {
                // As the API server's JSON patch does: a missing path tests equal to null.
                let ops: Vec<Value> = patch
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|op| {
                        !(op["op"] == "test"
                            && op["value"].is_null()
                            && op["path"].as_str().is_some_and(|p| obj.pointer(p).is_none()))
                    })
                    .cloned()
                    .collect();
                let Ok(ops) = serde_json::from_value::<json_patch::Patch>(Value::Array(ops)) else {
                    return false;
                };
                if json_patch::patch(obj, &ops).is_err() {
                    return false;
                }
            }
            _ => {
                let expected = patch["metadata"]["resourceVersion"].as_str();
                if expected.is_some() && expected != obj["metadata"]["resourceVersion"].as_str() {
                    return false;
                }
                json_patch::merge(obj, &patch);
            }
        }
        if !obj.is_object() {
            return false;
        }
        observer(&t.collection, name, obj);
        true
    });
    written(w, StatusCode::OK)
}

/// Server-side apply by one manager: what `last` applied and `patch` does not is removed
/// (labels, annotations, conditions by type), then `patch` is merged in, conditions by type.
fn apply(obj: &mut Value, last: Option<&Value>, patch: &Value) {
    if let Some(last) = last {
        for field in ["labels", "annotations"] {
            let kept = &patch["metadata"][field];
            if let (Some(before), Some(map)) = (
                last["metadata"][field].as_object(),
                obj["metadata"][field].as_object_mut(),
            ) {
                for key in before.keys() {
                    if kept.get(key).is_none() {
                        map.remove(key);
                    }
                }
            }
        }
        let types = |v: &Value| -> Vec<String> {
            v["status"]["conditions"]
                .as_array()
                .map(|cs| {
                    cs.iter()
                        .filter_map(|c| c["type"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let now = types(patch);
        for gone in types(last).into_iter().filter(|t| !now.contains(t)) {
            remove_condition(obj, &gone);
        }
    }
    let mut rest = patch.clone();
    let conditions = rest
        .get_mut("status")
        .and_then(|s| s.as_object_mut())
        .and_then(|s| s.remove("conditions"));
    json_patch::merge(obj, &rest);
    for c in conditions.iter().filter_map(Value::as_array).flatten() {
        if let Some(t) = c["type"].as_str() {
            remove_condition(obj, t);
            if let Some(cs) = obj["status"]["conditions"].as_array_mut() {
                cs.push(c.clone());
            } else {
                obj["status"]["conditions"] = json!([c]);
            }
        }
    }
}

fn remove_condition(obj: &mut Value, type_: &str) {
    if let Some(cs) = obj["status"]["conditions"].as_array_mut() {
        cs.retain(|c| c["type"].as_str() != Some(type_));
    }
}

/// The strategic merge patch the operator sends: conditions deleted by type; anything else
/// merged.
fn strategic(obj: &mut Value, patch: &Value) {
    let mut rest = patch.clone();
    let conditions = rest
        .get_mut("status")
        .and_then(|s| s.as_object_mut())
        .and_then(|s| s.remove("conditions"));
    for c in conditions.iter().filter_map(Value::as_array).flatten() {
        if c["$patch"].as_str() == Some("delete")
            && let Some(t) = c["type"].as_str()
        {
            remove_condition(obj, t);
        }
    }
    json_patch::merge(obj, &rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_read_as_the_api_server_reads_them() {
        let t = target("/api/v1/nodes/n1/status").unwrap();
        assert_eq!(
            t,
            Target {
                collection: "/api/v1/nodes".into(),
                name: Some("n1".into()),
            }
        );
        let t = target("/apis/coordination.k8s.io/v1/namespaces/ns/leases").unwrap();
        assert_eq!(
            (t.collection.as_str(), t.name),
            ("/apis/coordination.k8s.io/v1/namespaces/ns/leases", None)
        );
        let t = target("/apis/gpunode.dev/v1alpha1/gpunodereports/n2").unwrap();
        assert_eq!(
            (t.collection.as_str(), t.name.as_deref()),
            ("/apis/gpunode.dev/v1alpha1/gpunodereports", Some("n2"))
        );
        assert!(target("/healthz").is_none());
    }

    #[test]
    fn a_label_selector_selects_by_its_equalities() {
        let terms = equalities(Some("gpunode.dev/heartbeat=node-probe,x!=y"));
        assert_eq!(
            terms,
            [("gpunode.dev/heartbeat".to_string(), "node-probe".to_string())]
        );
        let lease = r#"{"metadata":{"labels":{"gpunode.dev/heartbeat":"node-probe"}}}"#;
        assert!(labelled(lease, &terms));
        assert!(!labelled(
            lease,
            &equalities(Some("gpunode.dev/watch-list-probe=none"))
        ));
        assert!(labelled(lease, &[]));
    }

    #[test]
    fn an_apply_removes_what_its_manager_no_longer_applies_and_merges_conditions_by_type() {
        let mut node = json!({"metadata": {"labels": {"a": "1", "kubelet": "x"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let first = json!({"metadata": {"labels": {"a": "1", "b": "2"}},
            "status": {"conditions": [{"type": "GpuHealthy", "status": "True"}]}});
        apply(&mut node, None, &first);
        let second = json!({"metadata": {"labels": {"b": "3"}},
            "status": {"conditions": [{"type": "GpuHealthy", "status": "False"}]}});
        apply(&mut node, Some(&first), &second);
        assert_eq!(node["metadata"]["labels"], json!({"kubelet": "x", "b": "3"}));
        assert_eq!(
            node["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "GpuHealthy", "status": "False"}])
        );
        strategic(
            &mut node,
            &json!({"status": {"conditions": [{"type": "GpuHealthy", "$patch": "delete"}]}}),
        );
        assert_eq!(
            node["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}])
        );
    }
}
