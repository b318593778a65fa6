//! The node-probe process on the real API server, with the fake NVML library and a fixture
//! sysfs tree: its report round-trips through the API server unchanged, and flipping the NVML
//! fixture to a throttled GPU shows up in the stored report.
//!
//! Needs the binaries built (`make test` builds them first): `gpunode-probe` and
//! `libfake_nvml.so` next to this test's target directory.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use gpunode_crds::GpuNodeReport;
use gpunode_e2e::{cluster, crds, fixtures::repo_root, nodes, scratch::rand_suffix, wait};
use kube::Api;

const DEADLINE: Duration = Duration::from_secs(60);

fn fail(e: impl std::fmt::Display) -> ! {
    panic!("{e}")
}

/// `target/debug`, from this test's own path (`target/debug/deps/probe-…`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(e));
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| fail("test binary has no target directory"))
}

fn built(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace first (`cargo build --workspace`, as `make test` does)",
        p.display()
    );
    p
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
        "--metrics-addr".to_string(),
        "127.0.0.1:0".to_string(),
    ];
    let env = vec![("FAKE_NVML_FIXTURE", fixture.display().to_string())];
    (args, env)
}

#[tokio::test]
async fn the_probe_publishes_its_report_and_a_throttled_gpu_shows_up() {
    let client = cluster::admin_client().await.unwrap_or_else(|e| fail(e));
    crds::install(&client).await.unwrap_or_else(|e| fail(e));
    let c = tokio::task::spawn_blocking(cluster::cluster)
        .await
        .unwrap_or_else(|e| fail(e))
        .unwrap_or_else(|e| fail(e));
    let node = format!("probe-{:06x}", rand_suffix());
    nodes::create(
        &client,
        std::slice::from_ref(&node),
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap_or_else(|e| fail(e));

    let dir = std::env::temp_dir().join(format!("gpunode-e2e-{node}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(e));
    let fixture = dir.join("nvml.json");
    let nvml_fixtures = repo_root().join("node-probe/fake-nvml/fixtures");
    std::fs::copy(nvml_fixtures.join("healthy-8xh100.json"), &fixture).unwrap_or_else(|e| fail(e));

    let (args, env) = probe_args(&node, &fixture);
    let probe = built("gpunode-probe");
    let mut cmd = Command::new(&probe);
    cmd.args(&args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("KUBECONFIG", &c.kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let running = Probe(cmd.spawn().unwrap_or_else(|e| fail(e)));

    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    let stored = wait::until("the probe's first report", DEADLINE, || async {
        Ok(reports.get_opt(&node).await?.filter(|r| r.status.is_some()))
    })
    .await
    .unwrap_or_else(|e| fail(e));
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
        .unwrap_or_else(|e| fail(e));
    assert!(once.status.success(), "{}", String::from_utf8_lossy(&once.stderr));
    let offline: GpuNodeReport = serde_json::from_slice(&once.stdout).unwrap_or_else(|e| fail(e));
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

    // Flip the fake GPU to throttled; the probe publishes the change without waiting for a heartbeat.
    std::fs::copy(nvml_fixtures.join("throttled.json"), &fixture).unwrap_or_else(|e| fail(e));
    let flipped = Instant::now();
    wait::until("the throttled GPU in the stored report", DEADLINE, || async {
        let r = reports.get(&node).await?;
        Ok(r.status.filter(|s| s.throttled_gpus == Some(1)).map(|_| ()))
    })
    .await
    .unwrap_or_else(|e| fail(e));
    eprintln!(
        "throttle visible in the stored report {:?} after the fixture flipped",
        flipped.elapsed()
    );

    // SIGTERM: a clean exit.
    let pid = running.0.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap_or_else(|e| fail(e));
    assert!(killed.success());
    let exit = tokio::task::spawn_blocking(move || {
        let mut running = running;
        running.0.wait()
    })
    .await
    .unwrap_or_else(|e| fail(e))
    .unwrap_or_else(|e| fail(e));
    assert!(exit.success(), "probe exited with {exit}");
    let _ = std::fs::remove_dir_all(&dir);
}
