//! The writes the probe makes, checked against a minimal in-process stand-in for the API server
//! (not a cluster: the e2e suite covers the real one), plus `/metrics` and `/healthz`.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use common::{FakeNvml, sysfs_tree};
use gpunode_crds::report::GpuNodeReportStatus;
use gpunode_probe::app;
use gpunode_probe::config::Config;
use gpunode_probe::publish::publish_once;
use gpunode_probe::state::ProbeState;
use serde_json::{Value, json};

#[derive(Clone, Default)]
struct Api {
    requests: Arc<Mutex<Vec<(Method, String, Value)>>>,
    /// Answer report PATCHes with this status instead (e.g. 500).
    fail_with: Arc<Mutex<Option<StatusCode>>>,
}

impl Api {
    fn requests(&self) -> Vec<(Method, String, Value)> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn node(State(api): State<Api>, method: Method, uri: Uri, Path(name): Path<String>) -> Response {
    api.requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((method, uri.to_string(), Value::Null));
    json_response(
        StatusCode::OK,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": "uid-1234"}}),
    )
}

async fn report(State(api): State<Api>, method: Method, uri: Uri, body: String) -> Response {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    api.requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((method, uri.to_string(), body.clone()));
    if let Some(code) = *api.fail_with.lock().unwrap_or_else(|e| e.into_inner()) {
        return json_response(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "injected", "code": code.as_u16()}),
        );
    }
    // Like the API server, answer with the whole object.
    let mut object = body;
    object["metadata"]["uid"] = "report-uid".into();
    if object.get("spec").is_none() {
        object["spec"] = json!({"nodeName": "node-a"});
    }
    json_response(StatusCode::OK, object)
}

async fn fake_api_server() -> (Api, SocketAddr) {
    let api = Api::default();
    let app = Router::new()
        .route("/api/v1/nodes/{name}", get(node))
        .route(
            "/apis/gpunode.dev/v1alpha1/gpunodereports/{name}",
            axum::routing::patch(report),
        )
        .route(
            "/apis/gpunode.dev/v1alpha1/gpunodereports/{name}/status",
            axum::routing::patch(report),
        )
        .with_state(api.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (api, addr)
}

fn client(addr: SocketAddr) -> kube::Client {
    let url = format!("http://{addr}").parse().unwrap();
    let mut config = kube::Config::new(url);
    config.read_timeout = Some(Duration::from_secs(5));
    kube::Client::try_from(config).expect("client")
}

fn sample_status() -> GpuNodeReportStatus {
    GpuNodeReportStatus {
        driver_version: Some("550.90.07".into()),
        gpu_count: Some(8),
        ..GpuNodeReportStatus::default()
    }
}

#[tokio::test]
async fn publish_once_applies_the_object_then_its_status() {
    let (api, addr) = fake_api_server().await;
    publish_once(&client(addr), "node-a", &sample_status())
        .await
        .expect("publish");
    let requests = api.requests();
    assert_eq!(requests.len(), 3, "{requests:#?}");

    let (method, uri, _) = &requests[0];
    assert_eq!((method, uri.as_str()), (&Method::GET, "/api/v1/nodes/node-a"));

    let (method, uri, body) = &requests[1];
    assert_eq!(method, Method::PATCH);
    assert!(
        uri.starts_with("/apis/gpunode.dev/v1alpha1/gpunodereports/node-a?"),
        "{uri}"
    );
    assert!(
        uri.contains("fieldManager=gpunode-node-probe") && uri.contains("force=true"),
        "{uri}"
    );
    assert_eq!(body["apiVersion"], "gpunode.dev/v1alpha1");
    assert_eq!(body["kind"], "GpuNodeReport");
    assert_eq!(body["spec"]["nodeName"], "node-a");
    let owner = &body["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Node");
    assert_eq!(owner["uid"], "uid-1234");
    assert_eq!(owner["blockOwnerDeletion"], false);
    assert!(body.get("status").is_none());

    let (method, uri, body) = &requests[2];
    assert_eq!(method, Method::PATCH);
    assert!(
        uri.starts_with("/apis/gpunode.dev/v1alpha1/gpunodereports/node-a/status?"),
        "{uri}"
    );
    assert!(uri.contains("fieldManager=gpunode-node-probe"), "{uri}");
    assert_eq!(body["apiVersion"], "gpunode.dev/v1alpha1");
    assert_eq!(body["kind"], "GpuNodeReport");
    assert_eq!(body["status"]["driverVersion"], "550.90.07");
    assert_eq!(body["status"]["gpuCount"], 8);
    assert!(body.get("spec").is_none());
}

#[tokio::test]
async fn api_errors_are_returned() {
    let (api, addr) = fake_api_server().await;
    *api.fail_with.lock().unwrap_or_else(|e| e.into_inner()) = Some(StatusCode::FORBIDDEN);
    let err = publish_once(&client(addr), "node-a", &sample_status())
        .await
        .err()
        .map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("kubernetes API")));
}

/// `run` end to end: collects from the fake NVML and a fixture tree, publishes, serves metrics,
/// stops on the shutdown signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_publishes_and_stops_on_shutdown() {
    let (api, addr) = fake_api_server().await;
    let fake = FakeNvml::new("healthy-8xh100");
    let tree = sysfs_tree("lossless-8port");
    let mut args = vec!["gpunode-probe".to_owned(), "--node-name".into(), "node-a".into()];
    args.extend([
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
        "--interval".into(),
        "1s".into(),
    ]);
    args.extend(["--nvml-lib".into(), fake.lib.display().to_string()]);
    args.extend(["--sysfs-root".into(), tree.join("sys").display().to_string()]);
    args.extend(["--net-fixtures".into(), tree.display().to_string()]);
    let config = <Config as clap::Parser>::try_parse_from(args).unwrap();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(app::run(config, client(addr), async {
        let _ = stopped.await;
    }));
    let published = |api: &Api| api.requests().iter().any(|(_, uri, _)| uri.contains("/status?"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !published(&api) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no status publish: {:#?}",
            api.requests()
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // poll interval
    }
    let status = api
        .requests()
        .into_iter()
        .find(|(_, uri, _)| uri.contains("/status?"))
        .map(|(_, _, b)| b);
    let status = status.unwrap_or_default();
    assert_eq!(status["status"]["gpuCount"], 8);
    assert_eq!(
        status["status"]["network"]["rdmaDevices"]
            .as_array()
            .map(Vec::len),
        Some(8)
    );
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("run did not stop")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn gpu_metrics_have_gpunode_names_and_dcgm_exporter_labels_and_healthz_follows_observations() {
    let fake = FakeNvml::new("throttled");
    let tree = sysfs_tree("lossless-8port");
    let args = [
        "gpunode-probe".to_owned(),
        "--nvml-lib".into(),
        fake.lib.display().to_string(),
        "--sysfs-root".into(),
        tree.join("sys").display().to_string(),
        "--net-fixtures".into(),
        tree.display().to_string(),
        "--no-xid-events".into(),
    ];
    let config = <Config as clap::Parser>::try_parse_from(args).unwrap();
    let (probe, _nvml) = app::build(&config, "n");
    let state = Arc::new(ProbeState::new("node-a", Duration::from_secs(60), None));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr, server) =
        gpunode_probe::metrics::serve("127.0.0.1:0".parse().unwrap(), state.clone(), async {
            let _ = stopped.await;
        })
        .await
        .expect("serve");

    let get = |path: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    };
    assert!(
        get("/healthz").await.starts_with("HTTP/1.1 503"),
        "unhealthy before the first observation"
    );
    let status = tokio::task::spawn_blocking(move || probe.observe())
        .await
        .unwrap();
    state.set_latest(status);
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    let metrics = get("/metrics").await;
    assert!(metrics.starts_with("HTTP/1.1 200"));
    let line = metrics
        .lines()
        .find(|l| l.starts_with("gpunode_probe_gpu_temperature_celsius{") && l.contains("gpu=\"2\""))
        .unwrap_or_else(|| panic!("no GPU 2 temperature:\n{metrics}"));
    for label in [
        "UUID=\"GPU-",
        "pci_bus_id=\"00000000:3A:00.0\"",
        "modelName=\"NVIDIA H100 80GB HBM3\"",
        "Hostname=\"node-a\"",
    ] {
        assert!(line.contains(label), "{label} missing in {line}");
    }
    assert!(line.ends_with(" 87.0"), "{line}");
    assert!(
        metrics.contains("gpunode_probe_gpu_throttle_reason{")
            && metrics.contains("reason=\"HwThermalSlowdown\"")
    );
    assert!(metrics.contains("gpunode_throttled_gpus{Hostname=\"node-a\"} 1"));
    assert!(metrics.contains("gpunode_probe_gpu_clocks_event_reasons{"));
    // dcgm-exporter's namespace stays its own: a dashboard summing its series must not add ours.
    assert!(
        !metrics.lines().any(|l| l.starts_with("DCGM_")),
        "a series in dcgm-exporter's namespace:\n{metrics}"
    );
    assert!(metrics.contains("gpunode_rdma_pfc_pause_frames{"));
    assert!(metrics.contains("gpunode_sensor_celsius{chip=\"nvme\",label=\"Composite\""));
    assert!(metrics.contains("gpunode_publish_total{result=\"ok\"} 0"));
    let _ = stop.send(());
    let _ = server.await;
}
