//! The reliability suite's own control plane ([`FaultCluster`]: `.cluster/rel-<run>`, never the
//! shared `test` one, with an audit log of every write and list and a short etcd compaction
//! interval so resumed watches expire), its components stopped, started, paused and resumed with
//! `e2e/cluster/ctl.sh` (ports and data kept, so clients reconnect to the same address),
//! [`Restore`] to undo such a fault when a test fails first, and [`hold`] to keep a fault in place.

use std::{path::PathBuf, process::Command, time::Duration};

use gpunode_crds::GpuNodePolicy;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, ListParams},
    config::{KubeConfigOptions, Kubeconfig},
};

use super::{
    io,
    labels::{FILLER_LABEL, RUN_LABEL},
};
use crate::{
    Error,
    audit::{AuditEvent, AuditLog},
    crds,
    fixtures::repo_root,
    wait,
};

/// Environment variable naming the reliability cluster (default `rel-<GPUNODE_CLUSTER_NAME>`).
pub const CLUSTER_ENV: &str = "GPUNODE_REL_CLUSTER";

/// The reliability suite's own control plane.
#[derive(Debug, Clone)]
pub struct FaultCluster {
    /// `.cluster/<name>`.
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The apiserver's audit log.
    pub audit_log: PathBuf,
    log: AuditLog,
}

/// The read timeout of [`FaultCluster::config`]'s clients.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// A watch for a client of [`FaultCluster::config`]: the server ends it after 15 s, within the
/// client's 20 s read timeout, so a quiet watch resumes from its resourceVersion instead of
/// failing on that timeout into the watcher's backoff (up to 30 s, during which its states and
/// deletions are missed; seen: a wave monitor that saw no eviction of a whole wave).
pub fn watch_config() -> kube::runtime::watcher::Config {
    const SERVER_TIMEOUT_SECS: u32 = 15;
    const _: () = assert!((SERVER_TIMEOUT_SECS as u64) < READ_TIMEOUT.as_secs());
    kube::runtime::watcher::Config::default().timeout(SERVER_TIMEOUT_SECS)
}

impl FaultCluster {
    /// The cluster name: `GPUNODE_REL_CLUSTER`, else `rel-<GPUNODE_CLUSTER_NAME or test>`, so
    /// `make test` (cluster `test`) uses `rel-test` and stops it afterwards.
    pub fn name() -> String {
        std::env::var(CLUSTER_ENV)
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| {
                let base = std::env::var(crate::cluster::CLUSTER_NAME_ENV).unwrap_or_else(|_| "test".into());
                format!("rel-{base}")
            })
    }

    /// Starts (or reuses, when started with the same options) the cluster and installs the CRDs.
    pub async fn up() -> Result<(FaultCluster, Client), Error> {
        let fc = tokio::task::spawn_blocking(FaultCluster::start_blocking)
            .await
            .map_err(|e| Error::ClusterStart(format!("up.sh panicked: {e}")))??;
        let client = fc.client().await?;
        crate::cluster::use_admin_kubeconfig(fc.kubeconfig.clone());
        crds::install(&client).await?;
        // Once per test binary: its tests may run side by side, and each calls `up`.
        static CLEARED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        CLEARED.get_or_try_init(|| fc.clear(&client)).await?;
        Ok((fc, client))
    }

    /// Deletes what an earlier test binary left behind when it failed before its cleanup
    /// (policies, the waves' nodes and namespaces), so its drains do not run on in this one's
    /// operator. Cargo runs test binaries one after another, never side by side.
    async fn clear(&self, client: &Client) -> Result<(), Error> {
        self.stop_stray_operators();
        let policies: Api<GpuNodePolicy> = Api::all(client.clone());
        // Just after the CRDs are installed on a fresh cluster their storage may still be
        // initializing (429 "storage is (re)initializing"): wait until they are served.
        let listed = wait::until("the policy API to be served", Duration::from_secs(60), || async {
            match policies.list(&ListParams::default()).await {
                Ok(l) => Ok(Some(l)),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
        let reports: Api<gpunode_crds::GpuNodeReport> = Api::all(client.clone());
        wait::until("the report API to be served", Duration::from_secs(60), || async {
            match reports.list(&ListParams::default().limit(1)).await {
                Ok(_) => Ok(Some(())),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
        for p in listed.items {
            if let Some(name) = p.metadata.name {
                let _ = policies.delete(&name, &DeleteParams::default()).await;
            }
        }
        let nodes: Api<Node> = Api::all(client.clone());
        for selector in [RUN_LABEL, FILLER_LABEL] {
            for n in nodes.list(&ListParams::default().labels(selector)).await?.items {
                if let Some(name) = n.metadata.name {
                    let _ = nodes.delete(&name, &DeleteParams::background()).await;
                }
            }
        }
        // Every policy is gone: a node still carrying gpunode's labels is another test's
        // leftover (the fence test's node keeps labels its late writes left under no field
        // manager, which no release removes), and a replica here would release it on every
        // pass, reaching a release crash point for a node no run of this binary made.
        for n in nodes.list(&ListParams::default()).await?.items {
            let ours = n
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.keys().any(|k| k.starts_with("gpunode.dev/")));
            if let Some(name) = n.metadata.name.filter(|_| ours) {
                let _ = nodes.delete(&name, &DeleteParams::background()).await;
            }
        }
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let label = format!("{}=true", crate::scratch::E2E_LABEL);
        for ns in namespaces
            .list(&ListParams::default().labels(&label))
            .await?
            .items
        {
            if let Some(name) = ns.metadata.name.filter(|n| n.starts_with("rel-")) {
                let _ = namespaces.delete(&name, &DeleteParams::background()).await;
            }
        }
        Ok(())
    }

    /// SIGKILLs every operator process a killed earlier run left on this cluster (its
    /// kubeconfig in the cluster's directory): a test binary killed from outside drops none of
    /// its [`crate::operator::Process`]es, and a replica left running under an identity the next
    /// run reuses would hold the same Lease and write beside it (seen: a pod evicted twice).
    fn stop_stray_operators(&self) {
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        let ours = format!("KUBECONFIG={}/", self.dir.display());
        for p in procs.flatten() {
            let path = p.path();
            let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
            let environ = std::fs::read(path.join("environ")).unwrap_or_default();
            let operator = cmdline
                .split(|b| *b == 0)
                .next()
                .is_some_and(|argv0| argv0.ends_with(b"gpunode-operator"));
            let here = environ
                .split(|b| *b == 0)
                .any(|kv| kv.starts_with(ours.as_bytes()));
            if operator && here {
                let pid = p.file_name().to_string_lossy().into_owned();
                eprintln!(
                    "stopping operator {pid} left running by an earlier run on {}",
                    self.name
                );
                let _ = std::process::Command::new("kill").args(["-KILL", &pid]).status();
            }
        }
    }

    fn start_blocking() -> Result<FaultCluster, Error> {
        let name = FaultCluster::name();
        let root = repo_root();
        let dir = root.join(".cluster").join(&name);
        let audit_log = dir.join("logs/audit.log");
        // The same flags on every start, so later test binaries reuse the running cluster.
        let api_args = format!(
            "--audit-policy-file={} --audit-log-path={} --audit-log-maxsize=50 --audit-log-maxbackup=0 \
             --etcd-compaction-interval=20s",
            root.join("e2e/cluster/audit-policy.yaml").display(),
            audit_log.display()
        );
        let out = Command::new(root.join("e2e/cluster/up.sh"))
            .arg(&name)
            .env_remove("GPUNODE_CLUSTER_DIR")
            .env("GPUNODE_APISERVER_ARGS", api_args)
            .output()
            .map_err(io("running up.sh"))?;
        if !out.status.success() {
            return Err(Error::ClusterStart(format!(
                "up.sh {name} failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let kubeconfig = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        Ok(FaultCluster {
            name,
            dir,
            kubeconfig,
            log: AuditLog::new(audit_log.clone()),
            audit_log,
        })
    }

    /// Client configuration from the admin kubeconfig, without kube's hidden retries.
    pub async fn config(&self) -> Result<Config, Error> {
        let kc = Kubeconfig::read_from(&self.kubeconfig).map_err(|e| Error::Kubeconfig(e.to_string()))?;
        let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Kubeconfig(e.to_string()))?;
        config.default_retry = false;
        // An outage must not leave a test's request hanging for minutes. A watch on this
        // client must end sooner at the server's hand: [`watch_config`].
        config.read_timeout = Some(READ_TIMEOUT);
        config.connect_timeout = Some(Duration::from_secs(5));
        Ok(config)
    }

    /// An admin client.
    pub async fn client(&self) -> Result<Client, Error> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// `ctl.sh ACTION COMPONENT` on this cluster (stop, start, pause, resume).
    pub async fn ctl(&self, action: &str, component: &str) -> Result<(), Error> {
        let script = repo_root().join("e2e/cluster/ctl.sh");
        let (action, component, name) = (action.to_string(), component.to_string(), self.name.clone());
        let out = tokio::task::spawn_blocking(move || {
            Command::new(script)
                .args([&action, &component])
                .env("GPUNODE_CLUSTER_NAME", &name)
                .env_remove("GPUNODE_CLUSTER_DIR")
                .output()
        })
        .await
        .map_err(|e| Error::Unexpected(format!("ctl.sh panicked: {e}")))?
        .map_err(io("running ctl.sh"))?;
        if !out.status.success() {
            return Err(Error::Unexpected(format!(
                "ctl.sh failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    /// Waits until the API server answers again after an outage, then restarts kwok, the fake
    /// kubelets. Their client-go reflectors back off after failed watches, up to a minute when
    /// the outages repeat: they then run and delete pods late, and forget deleted nodes, for
    /// the rest of this test and into the next test binary on this cluster (seen: a pod not
    /// Running 90 s after it was made, right after the 410 storm). That is the harness's
    /// slowness, not the operator's; the operator's own recovery is what the tests time.
    pub async fn wait_api(&self, client: &Client, timeout: Duration) -> Result<(), Error> {
        wait::until("the API server to answer", timeout, || async {
            Ok(client.apiserver_version().await.is_ok().then_some(()))
        })
        .await?;
        self.ctl("stop", "kwok").await?;
        self.ctl("start", "kwok").await
    }

    /// Every audit event so far, from the active file and every rotated one.
    pub fn audit(&self) -> Result<Vec<AuditEvent>, Error> {
        self.log.events()
    }
}

/// Undoes a pause or stop of a component if the test fails before it does.
pub struct Restore {
    cluster: FaultCluster,
    component: &'static str,
    action: &'static str,
    armed: bool,
}

impl Restore {
    /// `action` (`resume` or `start`) runs on drop unless [`Restore::done`] was called.
    pub fn new(cluster: &FaultCluster, component: &'static str, action: &'static str) -> Self {
        Restore {
            cluster: cluster.clone(),
            component,
            action,
            armed: true,
        }
    }

    /// The fault was undone by the test itself.
    pub fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        if self.armed {
            let _ = Command::new(repo_root().join("e2e/cluster/ctl.sh"))
                .args([self.action, self.component])
                .env("GPUNODE_CLUSTER_NAME", &self.cluster.name)
                .env_remove("GPUNODE_CLUSTER_DIR")
                .output();
        }
    }
}

/// Keeps a fault in place for `length`. This is a fault *parameter* (an outage of that length),
/// not a wait for something to happen: a deadline-based hold on the wall clock.
pub async fn hold(what: &str, length: Duration) -> Result<(), Error> {
    let end = tokio::time::Instant::now() + length;
    wait::until(what, length + Duration::from_secs(5), || async {
        Ok((tokio::time::Instant::now() >= end).then_some(()))
    })
    .await
}

/// The API server's address from the admin kubeconfig (`127.0.0.1:<port>`).
pub fn apiserver_addr(fc: &FaultCluster) -> Result<std::net::SocketAddr, Error> {
    let yaml = std::fs::read_to_string(&fc.kubeconfig).map_err(io(fc.kubeconfig.display()))?;
    let kc: serde_json::Value = serde_yaml::from_str(&yaml)?;
    let server = kc
        .pointer("/clusters/0/cluster/server")
        .and_then(|s| s.as_str())
        .ok_or_else(|| Error::Kubeconfig("admin kubeconfig has no server".into()))?;
    server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .parse()
        .map_err(|e| Error::Kubeconfig(format!("server {server}: {e}")))
}
