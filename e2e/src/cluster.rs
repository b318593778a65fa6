//! The cluster the tests run against: an existing one named by `GPUNODE_KUBECONFIG` (kind, a
//! real cluster), or the local control plane of `e2e/cluster/`, started once per test run and
//! reused by every test binary of that run (`up.sh` is idempotent). `make test` stops it at the
//! end; `GPUNODE_CLUSTER_NAME` picks its directory under `.cluster/` (default `test`).

use std::{path::PathBuf, process::Command, sync::OnceLock};

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::{Error, fixtures::repo_root};

/// Names the kubeconfig of an existing cluster to test instead of starting one.
pub const KUBECONFIG_ENV: &str = "GPUNODE_KUBECONFIG";

/// Which local cluster directory the tests use.
pub const CLUSTER_NAME_ENV: &str = "GPUNODE_CLUSTER_NAME";

/// A cluster to test against.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// True when the harness started it (the local control plane), false for `GPUNODE_KUBECONFIG`.
    pub local: bool,
}

/// The cluster of this test run, started on first use. Blocking: call it from
/// `tokio::task::spawn_blocking` or before entering a runtime; [`admin_client`] does that.
pub fn cluster() -> Result<Cluster, Error> {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            start().map_err(|e| match e {
                Error::ClusterStart(m) => m,
                other => other.to_string(),
            })
        })
        .clone()
        .map_err(Error::ClusterStart)
}

fn start() -> Result<Cluster, Error> {
    if let Some(path) = std::env::var_os(KUBECONFIG_ENV).filter(|p| !p.is_empty()) {
        return Ok(Cluster {
            kubeconfig: PathBuf::from(path),
            local: false,
        });
    }
    let name = std::env::var(CLUSTER_NAME_ENV).unwrap_or_else(|_| "test".to_string());
    let script = repo_root().join("e2e/cluster/up.sh");
    let out = Command::new(&script)
        .arg(&name)
        .env_remove("GPUNODE_CLUSTER_DIR")
        .output()
        .map_err(|e| Error::ClusterStart(format!("running {}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(Error::ClusterStart(format!(
            "{} {name} failed ({}):\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default().trim();
    if last.is_empty() {
        return Err(Error::ClusterStart(format!(
            "{} printed no kubeconfig path",
            script.display()
        )));
    }
    Ok(Cluster {
        kubeconfig: PathBuf::from(last),
        local: true,
    })
}

/// The admin kubeconfig of this process's cluster when it is not the shared one (the reliability
/// suite's own control plane, set by `faults::cluster::FaultCluster::up`).
static ADMIN_KUBECONFIG: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Makes every helper of this process that builds its own clients (ServiceAccount clients, the
/// chart's accounts) use `kubeconfig`'s cluster. Only the first call counts.
pub fn use_admin_kubeconfig(kubeconfig: std::path::PathBuf) {
    let _ = ADMIN_KUBECONFIG.set(kubeconfig);
}

/// The path of this process's admin kubeconfig (starting the shared cluster if needed).
pub async fn admin_kubeconfig() -> Result<std::path::PathBuf, Error> {
    Ok(match ADMIN_KUBECONFIG.get() {
        Some(p) => p.clone(),
        None => {
            tokio::task::spawn_blocking(cluster)
                .await
                .map_err(|e| Error::ClusterStart(format!("starting the cluster panicked: {e}")))??
                .kubeconfig
        }
    })
}

/// A client configuration from the cluster's admin kubeconfig. kube's built-in retry of 429/503
/// is off: tests observe the API server's answers as they are (an eviction refused by a
/// PodDisruptionBudget is a 429 the test must see, not minutes of hidden retries).
pub async fn admin_config() -> Result<Config, Error> {
    let path = admin_kubeconfig().await?;
    let kubeconfig = Kubeconfig::read_from(&path).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    config.default_retry = false;
    Ok(config)
}

/// An admin client (system:masters) for the test cluster.
pub async fn admin_client() -> Result<Client, Error> {
    Ok(Client::try_from(admin_config().await?)?)
}
