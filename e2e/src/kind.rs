//! The kind cluster of `e2e/kind/` (`make kind-up`, or `e2e/kind/test.sh` in `make test`): real
//! kubelets running the chart's own images, ServiceAccounts, RBAC and admission policies, with the
//! fake NVML library and a fixture sysfs tree per GPU worker. The tests reach it through the
//! environment `e2e/kind/test.sh` sets: its admin kubeconfig and its state directory, where each
//! worker's fixtures live (`nodes/<node>/nvml.json`, read by that node's probe pod) and the API
//! server's audit log is written.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node, core::v1::Pod};
use kube::{
    Api, Client, Config,
    api::{ListParams, LogParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::Value;

use crate::{Error, audit::AuditLog, chart, fixtures::repo_root, tools, wait};

/// The admin kubeconfig of the kind cluster.
pub const KUBECONFIG_ENV: &str = "GPUNODE_KIND_KUBECONFIG";
/// Its state directory (`.cluster/kind-<name>`).
pub const STATE_ENV: &str = "GPUNODE_KIND_STATE";
/// The label GPU workers carry (GPU Feature Discovery's), which the probe DaemonSet selects.
pub const GPU_LABEL: &str = "nvidia.com/gpu.present";

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Unexpected(format!("{what}: {e}"))
}

/// The running kind cluster.
#[derive(Clone)]
pub struct Kind {
    /// Admin client.
    pub client: Client,
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// State directory.
    pub state: PathBuf,
}

impl Kind {
    /// Connects to the cluster named by the environment; a clear error when it is not set (run
    /// the suite through `e2e/kind/test.sh`, or after `make kind-up`).
    pub async fn connect() -> Result<Kind, Error> {
        let var = |name: &str| {
            std::env::var_os(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                Error::ClusterStart(format!(
                    "{name} is not set: the kind suite runs on the cluster of e2e/kind \
                     (`make kind-test`, or `make kind-up` and then {KUBECONFIG_ENV}=.cluster/kind-gpunode-kind/kubeconfig \
                     {STATE_ENV}=.cluster/kind-gpunode-kind cargo test -p gpunode-e2e --features kind --test kind)"
                ))
            })
        };
        // Relative paths are the repository's (cargo runs tests in the crate's directory).
        let kubeconfig = repo_root().join(var(KUBECONFIG_ENV)?);
        let state = repo_root().join(var(STATE_ENV)?);
        let kc = Kubeconfig::read_from(&kubeconfig).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        let client = Client::try_from(config)?;
        Ok(Kind {
            client,
            kubeconfig,
            state,
        })
    }

    /// The GPU workers, by name.
    pub async fn workers(&self) -> Result<Vec<String>, Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let list = nodes
            .list(&ListParams::default().labels(&format!("{GPU_LABEL}=true")))
            .await?;
        let mut names: Vec<String> = list.items.into_iter().filter_map(|n| n.metadata.name).collect();
        names.sort();
        if names.len() < 2 {
            return Err(Error::Unexpected(format!(
                "the kind cluster has {} GPU workers, the suite needs 2",
                names.len()
            )));
        }
        Ok(names)
    }

    /// The fixture directory of `node` (mounted read-only into its probe pod at /fixtures).
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.state.join("nodes").join(node)
    }

    /// Rewrites `node`'s NVML fixture through `edit`, atomically (the probe pod sees the old file
    /// or the new one, never half of one).
    pub fn edit_fixture(&self, node: &str, edit: impl FnOnce(&mut Value)) -> Result<(), Error> {
        let path = self.node_dir(node).join("nvml.json");
        let text = std::fs::read_to_string(&path).map_err(io(path.display()))?;
        let mut fixture: Value = serde_json::from_str(&text)?;
        edit(&mut fixture);
        write_readable(&path, &fixture.to_string())
    }

    /// Puts the healthy 8xH100 fixture back on `node`.
    pub fn heal_fixture(&self, node: &str) -> Result<(), Error> {
        let healthy = repo_root().join("node-probe/fake-nvml/fixtures/healthy-8xh100.json");
        let text = std::fs::read_to_string(&healthy).map_err(io(healthy.display()))?;
        write_readable(&self.node_dir(node).join("nvml.json"), &text)
    }

    /// An XID happens on GPU `gpu` of `node`, once its probe pod listens for XID events: like
    /// real NVML, the fake one delivers an event only to event sets registered before it.
    pub async fn inject_xid(&self, node: &str, gpu: usize, xid: u32, timeout: Duration) -> Result<(), Error> {
        let pod = self.probe_pod(node, timeout).await?;
        let name = pod.metadata.name.unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), chart::NAMESPACE);
        let params = LogParams {
            container: Some("node-probe".into()),
            ..LogParams::default()
        };
        wait::until(
            &format!("probe {name} listening for XID events"),
            timeout,
            || async {
                Ok(pods
                    .logs(&name, &params)
                    .await?
                    .contains("listening for XID events")
                    .then_some(()))
            },
        )
        .await?;
        self.edit_fixture(node, |f| {
            f["devices"][gpu]["events"] = serde_json::json!([{"id": 1, "type": 8, "xid": xid}]);
        })
    }

    /// `docker exec <node> <args…>`: a command inside the kind node's container.
    pub fn exec(&self, node: &str, args: &[&str]) -> Result<String, Error> {
        let mut all = vec!["exec", node];
        all.extend_from_slice(args);
        docker(&all)
    }

    /// `kubectl <args…>` as admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, Error> {
        let kubectl = tools::built("GPUNODE_KUBECTL")?;
        let mut cmd = Command::new(&kubectl);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        tools::stdout_of(&mut cmd, &format!("kubectl {}", args.join(" ")))
    }

    /// The API server's audit log (`e2e/cluster/audit-policy.yaml`).
    pub fn audit(&self) -> AuditLog {
        AuditLog::new(self.state.join("audit/audit.log"))
    }

    /// The operator replica holding the leader Lease.
    pub async fn leader(&self) -> Result<Option<String>, Error> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), chart::NAMESPACE);
        Ok(leases
            .get_opt("gpunode-operator")
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// The chart's pods of `component` (operator, node-probe).
    pub async fn chart_pods(&self, component: &str) -> Result<Vec<Pod>, Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), chart::NAMESPACE);
        let selector = format!(
            "app.kubernetes.io/instance={},app.kubernetes.io/component={component}",
            chart::RELEASE
        );
        Ok(pods.list(&ListParams::default().labels(&selector)).await?.items)
    }

    /// The probe pod on `node` that is Running and Ready and not being deleted.
    pub async fn probe_pod(&self, node: &str, timeout: Duration) -> Result<Pod, Error> {
        wait::until(&format!("a Ready probe pod on {node}"), timeout, || async {
            Ok(self.chart_pods("node-probe").await?.into_iter().find(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                    && p.metadata.deletion_timestamp.is_none()
                    && is_ready(p)
            }))
        })
        .await
    }

    /// Forgets the XIDs `node`'s probe kept for this boot (as a reboot would) and restarts the
    /// probe, so a test starts from a healthy node whatever ran before it.
    pub async fn forget_xids(&self, node: &str, timeout: Duration) -> Result<(), Error> {
        self.heal_fixture(node)?;
        self.exec(node, &["rm", "-f", "/var/lib/gpunode/xids.json"])?;
        let old = self.probe_pod(node, timeout).await?;
        let name = old.metadata.name.clone().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), chart::NAMESPACE);
        pods.delete(&name, &Default::default()).await?;
        wait::until(&format!("probe pod {name} replaced"), timeout, || async {
            let fresh = self.probe_pod(node, Duration::from_secs(1)).await.ok();
            Ok(fresh
                .filter(|p| p.metadata.name.as_deref() != Some(name.as_str()))
                .map(|_| ()))
        })
        .await
    }
}

/// Running and Ready.
pub fn is_ready(p: &Pod) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Running")
            && s.conditions
                .as_ref()
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    })
}

/// `docker <args…>` against the project's own engine (DOCKER_HOST from e2e/kind/lib.sh).
pub fn docker(args: &[&str]) -> Result<String, Error> {
    tools::stdout_of(
        Command::new("/usr/bin/docker").args(args),
        &format!("docker {}", args.join(" ")),
    )
}

/// Writes `text` to `path` by renaming a sibling into place, readable by the probe's uid 65532.
fn write_readable(path: &Path, text: &str) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(io(tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).map_err(io(tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(io(path.display()))
}
