//! The node-probe process on the real API server, with the fake NVML library and a fixture
//! sysfs tree: its report round-trips through the API server unchanged, and flipping the NVML
//! fixture to a throttled GPU shows up in the stored report. The probe runs with the chart's
//! ServiceAccount and a token bound to a pod on its node, as in the DaemonSet: it may write its
//! own node's report and only that.
//!
//! Needs the binaries built (`make test` builds them first): `gpunode-probe` and
//! `libfake_nvml.so` next to this test's target directory.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gpunode_crds::GpuNodeReport;
use gpunode_e2e::{chart, cluster, crds, fixtures::repo_root, nodes, scratch::rand_suffix, wait};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

const DEADLINE: Duration = Duration::from_secs(60);

fn built(name: &str) -> PathBuf {
    gpunode_e2e::probe::built(name).unwrap()
}

/// Kills the probe if the test fails before stopping it.
struct Probe(Child);

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn probe_args(node: &str, fixture: &Path) -> (Vec<String>, Vec<(&'static str, String)>) {
    let tree = repo_root().join("node-probe/tests/fixtures/sysfs/lossless-8port");
    let args = vec![
        "--node-name".to_string(),
        node.to_string(),
        "--nvml-lib".to_string(),
        built("libfake_nvml.so").display().to_string(),
        "--sysfs-root".to_string(),
        tree.join("sys").display().to_string(),
        "--net-fixtures".to_string(),
        tree.display().to_string(),
        "--interval".to_string(),
        "500ms".to_string(),
        "--heartbeat".to_string(),
        "1s".to_string(),
        "--metrics-addr".to_string(),
        "127.0.0.1:0".to_string(),
    ];
    let env = vec![("FAKE_NVML_FIXTURE", fixture.display().to_string())];
    (args, env)
}

/// A kubeconfig in `dir` for the chart's probe ServiceAccount, with a token bound to a pod of
/// that account on `token_node` (the DaemonSet pod's projected token, in effect).
async fn probe_kubeconfig(admin: &Client, token_node: &str, dir: &Path) -> PathBuf {
    chart::install_accounts(admin).await.unwrap();
    let pod = chart::probe_pod(admin, token_node).await.unwrap();
    let path = dir.join("probe.kubeconfig");
    chart::write_probe_kubeconfig(admin, &pod, &path).await.unwrap();
    path
}

#[tokio::test]
async fn the_probe_publishes_its_report_and_a_throttled_gpu_shows_up() {
    let client = cluster::admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let node = format!("probe-{:06x}", rand_suffix());
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();

    let dir = std::env::temp_dir().join(format!("gpunode-e2e-{node}"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = probe_kubeconfig(&client, &node, &dir).await;
    let fixture = dir.join("nvml.json");
    let nvml_fixtures = repo_root().join("node-probe/fake-nvml/fixtures");
    std::fs::copy(nvml_fixtures.join("healthy-8xh100.json"), &fixture).unwrap();

    let (args, env) = probe_args(&node, &fixture);
    let probe = built("gpunode-probe");
    let mut cmd = Command::new(&probe);
    cmd.args(&args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("KUBECONFIG", &kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let running = Probe(cmd.spawn().unwrap());

    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    let stored = wait::until("the probe's first report", DEADLINE, || async {
        Ok(reports.get_opt(&node).await?.filter(|r| r.status.is_some()))
    })
    .await
    .unwrap();
    assert_eq!(stored.spec.node_name, node);
    let owner = stored.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owner.iter().any(|o| o.kind == "Node" && o.name == node),
        "owner: {owner:?}"
    );
    let status = stored.status.clone().unwrap_or_default();
    assert_eq!(status.gpu_count, Some(8));
    assert_eq!(status.throttled_gpus, Some(0));

    // Round trip: what the probe observes offline equals what the API server stored, apart
    // from when it was observed and how long collecting took.
    let once = Command::new(&probe)
        .args(&args)
        .args(["--once", "-o", "json"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(once.status.success(), "{}", String::from_utf8_lossy(&once.stderr));
    let offline: GpuNodeReport = serde_json::from_slice(&once.stdout).unwrap();
    let normalize = |mut s: gpunode_crds::GpuNodeReportStatus| {
        s.observed_at = None;
        for c in &mut s.collectors {
            c.duration_ms = 0;
        }
        for g in &mut s.gpus {
            g.xids.clear();
        }
        s
    };
    assert_eq!(
        normalize(status),
        normalize(offline.status.unwrap_or_default()),
        "the stored report differs from the probe's own observation"
    );

    // Heartbeats renew the node's Lease (through the chart's RBAC and admission policy) and
    // leave the report alone while nothing material changes.
    let leases: Api<Lease> = Api::namespaced(client.clone(), chart::NAMESPACE);
    let lease_name = gpunode_crds::heartbeat::lease_name(&node).expect("lease name");
    let renewed = |lease: Option<Lease>| {
        lease
            .and_then(|l| l.spec)
            .filter(|s| s.holder_identity.as_deref() == Some(node.as_str()))
            .and_then(|s| s.renew_time)
    };
    let first = wait::until("the probe's heartbeat Lease", DEADLINE, || async {
        Ok(renewed(leases.get_opt(&lease_name).await?))
    })
    .await
    .unwrap();
    let version = reports.get(&node).await.unwrap().metadata.resource_version;
    wait::until("a second renewal", DEADLINE, || async {
        Ok(renewed(leases.get_opt(&lease_name).await?).filter(|t| t.0 > first.0))
    })
    .await
    .unwrap();
    assert_eq!(
        reports.get(&node).await.unwrap().metadata.resource_version,
        version,
        "a heartbeat rewrote the report"
    );

    // Flip the fake GPU to throttled; the probe publishes the change without waiting for a heartbeat.
    std::fs::copy(nvml_fixtures.join("throttled.json"), &fixture).unwrap();
    let flipped = Instant::now();
    wait::until("the throttled GPU in the stored report", DEADLINE, || async {
        let r = reports.get(&node).await?;
        Ok(r.status.filter(|s| s.throttled_gpus == Some(1)).map(|_| ()))
    })
    .await
    .unwrap();
    eprintln!(
        "throttle visible in the stored report {:?} after the fixture flipped",
        flipped.elapsed()
    );

    // SIGTERM: a clean exit.
    let pid = running.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let exit = tokio::task::spawn_blocking(move || {
        let mut running = running;
        running.0.wait()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(exit.success(), "probe exited with {exit}");
    chart::delete_probe_pod(&client, &node).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Collects a child's stderr lines (and passes them on to the test's stderr).
fn capture_stderr(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    if let Some(stderr) = child.stderr.take() {
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("probe: {line}");
                if let Ok(mut v) = sink.lock() {
                    v.push(line);
                }
            }
        });
    }
    lines
}

#[tokio::test]
async fn a_probe_whose_token_is_bound_to_another_node_cannot_publish() {
    let client = cluster::admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let id = rand_suffix();
    let (home, other) = (format!("probe-home-{id:06x}"), format!("probe-other-{id:06x}"));
    nodes::create(
        &client,
        &[home.clone(), other.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(format!("gpunode-e2e-{other}"));
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = dir.join("nvml.json");
    std::fs::copy(
        repo_root().join("node-probe/fake-nvml/fixtures/healthy-8xh100.json"),
        &fixture,
    )
    .unwrap();
    // The token says "home"; the probe claims to be "other".
    let kubeconfig = probe_kubeconfig(&client, &home, &dir).await;
    let (args, env) = probe_args(&other, &fixture);
    let mut child = Command::new(built("gpunode-probe"))
        .args(&args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("KUBECONFIG", &kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = capture_stderr(&mut child);
    let _running = Probe(child);

    let refusal = wait::until(
        "the probe to report the admission policy's refusal",
        DEADLINE,
        || async {
            let lines = lines.lock().map(|v| v.clone()).unwrap_or_default();
            Ok(lines
                .into_iter()
                .find(|l| l.contains("publish failed") && l.contains(chart::OTHER_NODE_MESSAGE)))
        },
    )
    .await
    .unwrap();
    assert!(
        refusal.contains(&home) && refusal.contains(&other),
        "the refusal names both nodes: {refusal}"
    );
    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    assert!(
        reports.get_opt(&other).await.unwrap().is_none(),
        "a report for {other} was written with {home}'s token"
    );
    chart::delete_probe_pod(&client, &home).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes the fake NVML fixture atomically (a new file renamed over the old one), so the probe
/// never reads half of it.
fn write_fixture(path: &Path, fixture: &serde_json::Value) {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(fixture).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn a_policy_threshold_crossing_reaches_the_report_at_once() {
    // The example: slowdown 97 C, one GPU from 84 to 86 C under maxGpuCelsius 85. The
    // margin (13 -> 11 C) crosses no temperature band, so without the policy watch the probe
    // would write it only at its report refresh (10m, past this test's deadline).
    let client = cluster::admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let id = rand_suffix();
    let node = format!("probe-hot-{id:06x}");
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    // Selects no node (no operator runs here): the probe decides by every policy it can see.
    let policy = format!("probe-hot-{id:06x}");
    crds::create_policy(
        &client,
        &policy,
        serde_json::json!({
            "nodeSelector": {"matchLabels": {"gpunode-e2e/none": policy}},
            "cooling": {"maxGpuCelsius": 85},
        }),
    )
    .await
    .unwrap();

    let dir = std::env::temp_dir().join(format!("gpunode-e2e-{node}"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = probe_kubeconfig(&client, &node, &dir).await;
    let fixture = dir.join("nvml.json");
    let text = std::fs::read_to_string(repo_root().join("node-probe/fake-nvml/fixtures/healthy-8xh100.json"))
        .unwrap();
    let mut nvml: serde_json::Value = serde_json::from_str(&text).unwrap();
    let devices = nvml["devices"].as_array_mut().expect("fixture has no devices");
    for d in devices.iter_mut() {
        d["thresholds"]["slowdown"] = 97.into();
    }
    devices[3]["temperature"] = 84.into();
    write_fixture(&fixture, &nvml);

    let (args, env) = probe_args(&node, &fixture);
    let mut child = Command::new(built("gpunode-probe"))
        .args(&args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("KUBECONFIG", &kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = capture_stderr(&mut child);
    let _running = Probe(child);

    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    let gpu3 = |r: Option<GpuNodeReport>| {
        r.and_then(|r| r.status).and_then(|s| {
            s.gpus
                .iter()
                .find(|g| g.index == 3)
                .and_then(|g| g.temperature_celsius)
        })
    };
    wait::until("the first report at 84 C", DEADLINE, || async {
        Ok(gpu3(reports.get_opt(&node).await?).filter(|t| *t == 84))
    })
    .await
    .unwrap();
    wait::until("the probe's policy watch to sync", DEADLINE, || async {
        let lines = lines.lock().map(|v| v.clone()).unwrap_or_default();
        Ok(lines.into_iter().find(|l| l.contains("policy watch synced")))
    })
    .await
    .unwrap();

    nvml["devices"][3]["temperature"] = 86.into();
    write_fixture(&fixture, &nvml);
    let flipped = Instant::now();
    wait::until("86 C in the stored report", DEADLINE, || async {
        Ok(gpu3(reports.get_opt(&node).await?).filter(|t| *t == 86))
    })
    .await
    .unwrap();
    // Timing for the closing note; the probe observes every 500 ms here.
    eprintln!(
        "thermal: 86 C visible in the stored report {:?} after the fixture changed",
        flipped.elapsed()
    );

    Api::<gpunode_crds::GpuNodePolicy>::all(client.clone())
        .delete(&policy, &Default::default())
        .await
        .unwrap();
    chart::delete_probe_pod(&client, &node).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
