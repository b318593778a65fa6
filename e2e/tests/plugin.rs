//! `kubectl gpunode` (the built `kubectl-gpunode` binary, run with a kubeconfig as kubectl would
//! run it) against real objects on the API server, with the operator running in-process so the
//! nodes' markers and the policy's status are real:
//! - the demo's end state (20 H100 nodes: 17 healthy, `h100-hot` throttled and tainted,
//!   `h100-roce` with PFC on the wrong priority waiting for the budget, `h100-xid` drained
//!   after ECC errors and XID 79): `status`, `why` and `gpus` compared with golden files
//!   (`e2e/tests/golden/plugin/`, timestamps masked; `UPDATE_GOLDEN=1` rewrites them);
//! - approvals: `approve` refuses a rung the node does not wait for, naming those it does,
//!   keeps what is approved already, and the operator acts on it; `unapprove`;
//! - bad input: an unknown node, a node no policy governs, a bad selector, a missing
//!   kubeconfig, a ServiceAccount with no rights: one line and the documented exit code.
//!
//! (A separate test binary: one operator per process. Fixed node names: the golden files name
//! them, so the setup first removes what an earlier run left.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    accounts, chart, cluster, crds, fixtures::repo_root, nodes, operator::InProcess, probe, reports,
    scratch::rand_suffix, wait,
};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(120);
const POLICY: &str = "h100-training";
const SUITE_LABEL: &str = "e2e.gpunode.dev/suite";
const HOT: &str = "h100-hot";
const ROCE: &str = "h100-roce";
const XID: &str = "h100-xid";

/// What one run of the plugin printed and how it exited.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `kubectl-gpunode ARGS` with `kubeconfig`, as kubectl runs a plugin.
async fn plugin(kubeconfig: &Path, args: &[&str]) -> Run {
    let bin = probe::built("kubectl-gpunode").unwrap();
    let kubeconfig = kubeconfig.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin)
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("NO_COLOR")
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Asserts the exit code and that stderr is the one line `error: <message>` containing `what`.
fn assert_error(run: &Run, code: i32, what: &str) {
    assert_eq!(run.code, code, "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    let line = run.stderr.strip_suffix('\n').unwrap_or(&run.stderr);
    assert!(!line.contains('\n'), "more than one line: {run:?}");
    assert!(line.starts_with("error: "), "{run:?}");
    assert!(line.contains(what), "expected {what:?} in {line:?}");
    assert!(
        !line.contains("Error {") && !line.contains("Status {"),
        "a Debug dump: {line}"
    );
}

/// Every timestamp (`2026-11-29T12:00:00Z`, with or without fractions) as
/// `YYYY-MM-DDTHH:MM:SSZ`, so a golden file holds across runs.
fn normalise(text: &str) -> String {
    let shape = b"dddd-dd-ddTdd:dd:dd";
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let fits = bytes.len() - i > shape.len()
            && shape.iter().zip(&bytes[i..]).all(|(s, b)| match s {
                b'd' => b.is_ascii_digit(),
                other => other == b,
            });
        if fits {
            let mut end = i + shape.len();
            if bytes[end] == b'.' {
                end += 1;
                while end < bytes.len() && bytes[end].is_ascii_digit() {
                    end += 1;
                }
            }
            if end < bytes.len() && bytes[end] == b'Z' {
                out.push_str("YYYY-MM-DDTHH:MM:SSZ");
                i = end + 1;
                continue;
            }
        }
        let c = text[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

fn golden_dir() -> PathBuf {
    repo_root().join("e2e/tests/golden/plugin")
}

/// Compares `actual` (normalised) with the golden file `name`, or rewrites it with
/// `UPDATE_GOLDEN=1`.
fn golden(name: &str, command: &str, actual: &str) {
    let text = format!("$ {command}\n{}", normalise(actual));
    let path = golden_dir().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(
        text,
        want,
        "{} differs (UPDATE_GOLDEN=1 rewrites it)",
        path.display()
    );
}

/// The healthy 8x H100 report of the operator's fixtures, as observed now, with UUIDs of its
/// own for node number `n`.
fn healthy_report(n: usize) -> Value {
    let path = repo_root().join("operator/tests/fixtures/evaluate/healthy-h100-report.yaml");
    let report: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut status = report["status"].clone();
    status["observedAt"] = json!(now());
    for gpu in status["gpus"].as_array_mut().unwrap() {
        let index = gpu["index"].as_u64().unwrap();
        gpu["uuid"] = json!(format!("GPU-{n:08x}-0b7d-4e2f-8a6c-{index:012x}"));
    }
    status
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap()
        .to_string()
}

/// `h100-hot`: GPU 2 hot and thermally throttled; the probe reads PodResources (one pod on GPU 2).
fn hot_report(n: usize) -> Value {
    let mut s = healthy_report(n);
    let gpus = s["gpus"].as_array_mut().unwrap();
    for g in gpus.iter_mut() {
        g["pods"] = json!([]);
    }
    gpus[2]["temperatureCelsius"] = json!(88);
    gpus[2]["throttleReasons"] = json!(["HwThermalSlowdown", "SwThermalSlowdown"]);
    gpus[2]["pods"] = json!([{"namespace": "training", "name": "trainer-0"}]);
    s["throttledGpus"] = json!(1);
    s
}

/// `h100-roce`: PFC on priority 4 of mlx5_3 instead of 3.
fn roce_report(n: usize) -> Value {
    let mut s = healthy_report(n);
    for d in s["network"]["rdmaDevices"].as_array_mut().unwrap() {
        if d["device"] == "mlx5_3" {
            d["pfcPriorities"] = json!([4]);
        }
    }
    s
}

/// `h100-xid`: GPU 5 with uncorrectable ECC errors, a pending row remap and XID 79.
fn xid_report(n: usize) -> Value {
    let mut s = healthy_report(n);
    let g = &mut s["gpus"][5];
    g["ecc"]["volatileUncorrected"] = json!(2);
    g["remappedRows"] = json!({"correctable": 0, "uncorrectable": 1, "pending": true, "failure": false});
    g["xids"] = json!([{"xid": 79, "at": now()}]);
    s
}

/// examples/h100-training.yaml as the demo applies it, selecting this suite's nodes only, with
/// the Throttle and Network `after`s shortened from 30s and 2m to 2s (the test waits for them).
fn policy_spec() -> Value {
    json!({
        "nodeSelector": {"matchLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", SUITE_LABEL: "plugin"}},
        "gpu": {
            "count": 8, "products": ["H100"], "minMemoryMiB": 81000,
            "driverVersion": ">=550.54.15, <560", "cudaVersion": ">=12.4",
            "eccMode": "Enabled", "persistenceMode": "Enabled", "migMode": "Disabled",
            "pcie": {"minGeneration": 5, "minWidth": 16}, "nvlink": {"minActiveLinks": 18},
            "maxVolatileUncorrectedEcc": 0, "maxRetiredPages": 60,
            "fatalXids": [48, 64, 74, 79, 94, 95, 119, 120, 140],
        },
        "cooling": {
            "maxGpuCelsius": 85, "minSlowdownMarginCelsius": 5, "maxMemoryCelsius": 95,
            "forbiddenThrottleReasons": ["HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"],
            "sensors": [{"match": "*/Inlet*", "maxCelsius": 35}, {"match": "nvme*/*", "maxCelsius": 70}],
        },
        "network": {
            "rdma": {"devicePattern": "mlx5_*", "minDevices": 8}, "roceV2": true, "pfcPriorities": [3],
            "trust": "dscp", "ecnPriorities": [3], "minMtu": 9000, "minRateGbps": 400, "portState": "Active",
        },
        "remediation": [
            {"classes": ["Throttle", "Thermal"], "action": "Taint", "effect": "NoSchedule", "after": "2s"},
            {"classes": ["Network", "Pcie", "Nvlink", "Cooling"], "action": "Taint", "effect": "NoSchedule", "after": "2s"},
            {"classes": ["Driver", "Config", "Inventory"], "action": "Cordon", "after": "1m"},
            {"classes": ["Memory", "Xid"], "action": "Drain", "after": "0s"},
        ],
        "disruption": {
            "maxUnavailable": "10%",
            "circuitBreaker": {"maxDriftedPercent": 30, "window": "10m"},
            "drain": {"timeout": "15m", "gracePeriodSeconds": 120, "protectedNamespaces": ["kube-system", "gpu-operator", "monitoring"]},
        },
        "recovery": {"healthyFor": "5m"},
        "staleAfter": "3m",
    })
}

fn demo_nodes() -> Vec<String> {
    let mut names: Vec<String> = (0..17).map(|i| format!("h100-{i:03}")).collect();
    names.extend([HOT, ROCE, XID].map(String::from));
    names
}

/// Deletes `name` and waits until it is gone (the operator releases a policy's nodes first).
async fn delete_policy(client: &Client, name: &str) {
    let api: Api<GpuNodePolicy> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
    wait::until(&format!("policy {name} deleted"), DEADLINE, || async {
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
}

async fn node(client: &Client, name: &str) -> Node {
    Api::<Node>::all(client.clone()).get(name).await.unwrap()
}

fn tainted(n: &Node, value: &str) -> bool {
    n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
        ts.iter()
            .any(|t| t.key == "gpunode.dev/drift" && t.value.as_deref() == Some(value))
    })
}

/// The demo's nodes, reports and policy, and the operator's work on them: returns once h100-hot
/// is tainted, h100-xid drained and h100-roce's taint waits for the budget.
async fn demo_state(client: &Client) {
    delete_policy(client, POLICY).await;
    let names = demo_nodes();
    nodes::create(client, &names, &nodes::GpuNodeShape::default())
        .await
        .unwrap();
    let api: Api<Node> = Api::all(client.clone());
    for (n, name) in names.iter().enumerate() {
        let patch = json!({"metadata": {"labels": {SUITE_LABEL: "plugin"}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let status = match name.as_str() {
            HOT => hot_report(n),
            XID => xid_report(n),
            _ => healthy_report(n),
        };
        reports::publish(client, name, status).await.unwrap();
    }
    crds::create_policy(client, POLICY, policy_spec()).await.unwrap();
    wait::until("h100-hot tainted and h100-xid drained", DEADLINE, || async {
        let (hot, xid) = (api.get(HOT).await?, api.get(XID).await?);
        Ok((tainted(&hot, "thermal") && nodes::compliance(&xid).0 == "Drained").then_some(()))
    })
    .await
    .unwrap();
    reports::publish(client, ROCE, roce_report(18)).await.unwrap();
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    wait::until("h100-roce's taint waiting for the budget", DEADLINE, || async {
        let p = policies.get(POLICY).await?;
        let waiting = p.status.iter().flat_map(|s| &s.drifted_nodes).any(|d| {
            d.node == ROCE
                && d.pending_actions
                    .iter()
                    .any(|a| a.starts_with("Taint NoSchedule (network)"))
        });
        let counted = p
            .status
            .as_ref()
            .is_some_and(|s| s.compliant == 17 && s.drifted == 3);
        Ok((waiting && counted).then_some(()))
    })
    .await
    .unwrap();
}

/// The demo's end state through `status`, `why` and `gpus`, against the golden files.
async fn screens(kubeconfig: &Path) {
    let status = plugin(kubeconfig, &["status", POLICY]).await;
    assert_eq!(status.code, 1, "drifted nodes: exit 1: {status:?}");
    golden(
        "status.txt",
        "kubectl gpunode status h100-training",
        &status.stdout,
    );
    for node in [ROCE, XID, HOT] {
        let why = plugin(kubeconfig, &["why", node]).await;
        assert_eq!(why.code, 1, "{why:?}");
        golden(
            &format!("why-{node}.txt"),
            &format!("kubectl gpunode why {node}"),
            &why.stdout,
        );
    }
    for node in [XID, HOT] {
        let gpus = plugin(kubeconfig, &["gpus", node]).await;
        assert_eq!(gpus.code, 1, "{gpus:?}");
        golden(
            &format!("gpus-{node}.txt"),
            &format!("kubectl gpunode gpus {node}"),
            &gpus.stdout,
        );
    }
    let healthy = plugin(kubeconfig, &["why", "h100-000"]).await;
    assert_eq!(healthy.code, 0, "{healthy:?}");
    assert!(
        healthy
            .stdout
            .starts_with("node h100-000 under policy h100-training: compliant\n"),
        "{healthy:?}"
    );
    let all = plugin(kubeconfig, &["gpus", "-l", &format!("{SUITE_LABEL}=plugin")]).await;
    assert_eq!(all.stdout.lines().count(), 1 + 20 * 8, "{all:?}");
}

/// The same data as JSON and YAML, with the field names scripts rely on.
async fn machine_output(kubeconfig: &Path) {
    let status = plugin(kubeconfig, &["status", POLICY, "-o", "json"]).await;
    assert_eq!(status.code, 1, "{status:?}");
    let v: Value = serde_json::from_str(&status.stdout).unwrap();
    let p = &v["policies"][0];
    assert_eq!(p["name"], POLICY);
    assert_eq!(
        (
            p["matched"].as_u64(),
            p["compliant"].as_u64(),
            p["drifted"].as_u64()
        ),
        (Some(20), Some(17), Some(3))
    );
    assert_eq!(
        p["budget"],
        json!({"inUse": 2, "allowed": 2, "maxUnavailable": "10%", "waiting": 1})
    );
    assert_eq!(p["circuitBreaker"]["open"], false);
    let roce = p["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == ROCE)
        .unwrap();
    assert_eq!(roce["pending"], json!(["Taint NoSchedule (network)"]));
    assert_eq!(roce["waitingFor"], "disruption budget exhausted");

    let why = plugin(kubeconfig, &["why", XID, "-o", "yaml"]).await;
    let v: Value = serde_yaml::from_str(&why.stdout).unwrap();
    assert_eq!(v["state"], "drifted");
    assert_eq!(v["done"], json!(["Cordon", "Drain"]));
    let checks: Vec<&str> = v["drifts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["check"].as_str().unwrap())
        .collect();
    assert!(checks.contains(&"gpu.fatalXids"), "{checks:?}");

    let gpus = plugin(kubeconfig, &["gpus", HOT, "-o", "json"]).await;
    let v: Value = serde_json::from_str(&gpus.stdout).unwrap();
    let gpu2 = &v["gpus"][2];
    assert_eq!(
        (gpu2["index"].as_u64(), gpu2["state"].as_str()),
        (Some(2), Some("drifted"))
    );
    assert_eq!(gpu2["pods"], json!(["training/trainer-0"]));
}

async fn cleanup_demo(client: &Client) {
    delete_policy(client, POLICY).await;
    let api: Api<Node> = Api::all(client.clone());
    for name in demo_nodes() {
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
}

/// A drain that requires approval: `approve` refuses other rungs naming Drain, keeps what is
/// approved already, and the operator drains once it is approved; `unapprove` withdraws.
async fn approvals(client: &Client, kubeconfig: &Path) {
    let node = format!("plugin-approve-{:06x}", rand_suffix());
    nodes::create(
        client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    reports::publish(client, &node, reports::one_gpu("550.54.15", "boot-1", json!([])))
        .await
        .unwrap();
    crds::create_policy(
        client,
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {"driverVersion": ">=550"},
            "remediation": [{"classes": ["Driver"], "action": "Drain", "requireApproval": true}],
            "disruption": {"maxUnavailable": 1, "circuitBreaker": {"maxDriftedPercent": 100}},
            "staleAfter": "5m",
        }),
    )
    .await
    .unwrap();
    nodes::until_labelled(client, &node, &[("gpunode.dev/state", "compliant")], DEADLINE)
        .await
        .unwrap();
    let early = plugin(kubeconfig, &["approve", &node, "Drain"]).await;
    assert_error(
        &early,
        2,
        &format!("node {node} does not wait for approval of Drain"),
    );
    assert!(early.stderr.contains("it waits for no approval"), "{early:?}");

    reports::publish(client, &node, reports::one_gpu("535.129.03", "boot-1", json!([])))
        .await
        .unwrap();
    let api: Api<Node> = Api::all(client.clone());
    wait::until("the node to await approval", DEADLINE, || async {
        Ok((nodes::compliance(&api.get(&node).await?).0 == "AwaitingApproval").then_some(()))
    })
    .await
    .unwrap();
    let why = plugin(kubeconfig, &["why", &node]).await;
    assert_eq!(why.code, 1, "{why:?}");
    assert!(
        why.stdout
            .contains(&format!("approve:    kubectl gpunode approve {node} Drain")),
        "{}",
        why.stdout
    );
    let status = plugin(kubeconfig, &["status", &node]).await;
    assert!(
        status.stdout.contains(&format!("{node} waits for Drain")),
        "{}",
        status.stdout
    );

    // Someone approved another rung already: it is kept.
    let patch = json!({"metadata": {"annotations": {"gpunode.dev/approve": "reboot"}}});
    api.patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let wrong = plugin(kubeconfig, &["approve", &node, "Cordon"]).await;
    assert_error(&wrong, 2, "does not wait for approval of Cordon");
    assert!(wrong.stderr.contains("it waits for: Drain"), "{wrong:?}");
    let approved = plugin(kubeconfig, &["approve", &node, "Drain"]).await;
    assert_eq!(approved.code, 0, "{approved:?}");
    assert_eq!(
        approved.stdout,
        format!("node/{node}: approved Drain (gpunode.dev/approve=Drain,reboot)\n")
    );
    wait::until("the approved node cordoned and drained", DEADLINE, || async {
        let n = api.get(&node).await?;
        Ok((nodes::cordoned(&n) && nodes::compliance(&n).0 == "Drained").then_some(()))
    })
    .await
    .unwrap();
    let withdrawn = plugin(kubeconfig, &["unapprove", &node, "reboot"]).await;
    assert_eq!(withdrawn.code, 0, "{withdrawn:?}");
    let annotation = |n: &Node| {
        n.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("gpunode.dev/approve").cloned())
    };
    assert_eq!(
        annotation(&node_now(client, &node).await),
        Some("Drain".to_string())
    );
    let again = plugin(kubeconfig, &["unapprove", &node, "reboot"]).await;
    assert_error(
        &again,
        2,
        &format!("node {node} has no approval of reboot; approved: Drain"),
    );
    delete_policy(client, &node).await;
    let _ = api.delete(&node, &DeleteParams::default()).await;
}

/// A GPU quarantined on a device-plugin node (the annotation gpunode.dev/unhealthy-gpus) shows in
/// `gpus` with its effect.
async fn quarantine(client: &Client, kubeconfig: &Path) {
    let node = format!("plugin-quarantine-{:06x}", rand_suffix());
    nodes::create(
        client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let mut status = reports::one_gpu("550.54.15", "boot-1", json!([{"xid": 79, "at": now()}]));
    status["gpus"][0]["uuid"] = json!("GPU-plugin-0");
    reports::publish(client, &node, status).await.unwrap();
    crds::create_policy(
        client,
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {"fatalXids": [79]},
            "remediation": [{"classes": ["Xid"], "action": "TaintDevice", "effect": "NoSchedule"}],
            "disruption": {"maxUnavailable": 1, "circuitBreaker": {"maxDriftedPercent": 100}},
            "staleAfter": "5m",
        }),
    )
    .await
    .unwrap();
    let api: Api<Node> = Api::all(client.clone());
    wait::until("the GPU quarantined by annotation", DEADLINE, || async {
        let n = api.get(&node).await?;
        let a = n.metadata.annotations.unwrap_or_default();
        Ok((a.get("gpunode.dev/unhealthy-gpus").map(String::as_str) == Some("GPU-plugin-0")).then_some(()))
    })
    .await
    .unwrap();
    let gpus = plugin(kubeconfig, &["gpus", &node, "-o", "json"]).await;
    assert_eq!(gpus.code, 1, "{gpus:?}");
    let v: Value = serde_json::from_str(&gpus.stdout).unwrap();
    assert_eq!(
        v["gpus"][0]["quarantine"],
        json!({"by": "annotation", "effect": "NoSchedule"}),
        "{v}"
    );
    assert_eq!(v["gpus"][0]["drifts"], json!(["Xid gpu.fatalXids"]));
    let text = plugin(kubeconfig, &["gpus", &node]).await;
    assert!(
        text.stdout.contains("drifted   Xid      annotation NoSchedule"),
        "{}",
        text.stdout
    );
    let why = plugin(kubeconfig, &["why", &node]).await;
    assert!(
        why.stdout
            .contains("done:       TaintDevice NoSchedule (gpu 0 (GPU-plugin-0))"),
        "{}",
        why.stdout
    );
    delete_policy(client, &node).await;
    let _ = api.delete(&node, &DeleteParams::default()).await;
}

async fn node_now(client: &Client, name: &str) -> Node {
    node(client, name).await
}

#[tokio::test]
async fn the_demo_state_through_status_why_gpus_and_approvals() {
    let client = cluster::admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let kubeconfig = cluster::admin_kubeconfig().await.unwrap();
    let operator = InProcess::start(&chart::operator_client(&client).await.unwrap(), "e2e-plugin");
    demo_state(&client).await;
    screens(&kubeconfig).await;
    machine_output(&kubeconfig).await;
    approvals(&client, &kubeconfig).await;
    quarantine(&client, &kubeconfig).await;
    cleanup_demo(&client).await;
    operator.stop().await.unwrap();
}

/// A kubeconfig for a ServiceAccount that may do nothing.
async fn nobody_kubeconfig(client: &Client) -> PathBuf {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "plugin-nobody"}})).unwrap();
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating the ServiceAccount: {e}"),
    }
    let token = accounts::token(client, "default", "plugin-nobody", None)
        .await
        .unwrap();
    let path = std::env::temp_dir().join(format!("plugin-nobody-{:06x}.kubeconfig", rand_suffix()));
    chart::write_kubeconfig(&token, &path).await.unwrap();
    path
}

#[tokio::test]
async fn bad_input_gets_one_line_naming_what_is_wrong_and_its_exit_code() {
    let client = cluster::admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let kubeconfig = cluster::admin_kubeconfig().await.unwrap();
    let missing = format!("plugin-missing-{:06x}", rand_suffix());
    for args in [
        vec!["why", missing.as_str()],
        vec!["gpus", missing.as_str()],
        vec!["approve", missing.as_str(), "Drain"],
    ] {
        let run = plugin(&kubeconfig, &args).await;
        assert_error(&run, 3, &format!("node {missing} not found"));
    }

    // A node no policy selects (a product no policy of this suite names).
    let lone = format!("plugin-lone-{:06x}", rand_suffix());
    let shape = nodes::GpuNodeShape {
        product: "NVIDIA-PLUGIN-TEST".to_string(),
        ..nodes::GpuNodeShape::default()
    };
    nodes::create(&client, std::slice::from_ref(&lone), &shape)
        .await
        .unwrap();
    let run = plugin(&kubeconfig, &["why", &lone]).await;
    assert_error(&run, 3, &format!("node {lone} is governed by no GpuNodePolicy"));
    let run = plugin(&kubeconfig, &["approve", &lone, "Drain"]).await;
    assert_error(&run, 3, "governed by no GpuNodePolicy");
    let run = plugin(&kubeconfig, &["gpus", &lone]).await;
    assert_error(&run, 3, &format!("node {lone} has no readable GpuNodeReport"));
    let _ = Api::<Node>::all(client.clone())
        .delete(&lone, &DeleteParams::default())
        .await;

    let run = plugin(&kubeconfig, &["status", "plugin-no-such-policy"]).await;
    assert_error(&run, 3, "GpuNodePolicy plugin-no-such-policy not found");
    let run = plugin(&kubeconfig, &["gpus", "-l", "a in ("]).await;
    assert_error(&run, 2, "bad label selector");
    let run = plugin(&kubeconfig, &["status", "-o", "xml"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let run = plugin(&kubeconfig, &["approve", "n"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let run = plugin(Path::new("/nonexistent/kubeconfig"), &["status"]).await;
    assert_error(&run, 4, "kubeconfig");
    let run = plugin(
        &kubeconfig,
        &["status", "--kubeconfig", "/nonexistent/kubeconfig"],
    )
    .await;
    assert_error(&run, 4, "kubeconfig: /nonexistent/kubeconfig");
    let run = plugin(&kubeconfig, &["status", "--context", "no-such-context"]).await;
    assert_error(&run, 4, "no-such-context");

    // RBAC: a ServiceAccount with no rights.
    let nobody = nobody_kubeconfig(&client).await;
    for (args, what) in [
        (vec!["status"], "forbidden: cannot list gpunodepolicies"),
        (vec!["why", "h100-000"], "forbidden: cannot get node h100-000"),
        (vec!["gpus"], "forbidden: cannot list gpunodepolicies"),
        (
            vec!["approve", "h100-000", "Drain"],
            "forbidden: cannot get node h100-000",
        ),
    ] {
        let run = plugin(&nobody, &args).await;
        assert_error(&run, 4, what);
        assert!(
            run.stderr.contains("system:serviceaccount:default:plugin-nobody"),
            "{run:?}"
        );
    }
    let _ = std::fs::remove_file(&nobody);
}

#[test]
fn timestamps_are_masked_and_nothing_else() {
    assert_eq!(
        normalise("at 2026-11-29T12:00:00Z and 2026-11-29T12:00:00.123Z, not 12:00 or 2026-11-29"),
        "at YYYY-MM-DDTHH:MM:SSZ and YYYY-MM-DDTHH:MM:SSZ, not 12:00 or 2026-11-29"
    );
}
