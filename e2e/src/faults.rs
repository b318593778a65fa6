//! Fault injection for the reliability suite (`e2e/tests/reliability_*.rs`, docs/reliability.md).
//!
//! - [`FaultCluster`]: a private control plane (`.cluster/rel-<run>`, never the shared `test` one),
//!   with an audit log of every write and list, and a short etcd compaction interval so resumed
//!   watches expire (410 Gone). Components are stopped, started, paused and resumed with
//!   `e2e/cluster/ctl.sh`, which keeps ports and data, so clients reconnect to the same address.
//! - [`Operator`]: `gpunode-operator run --leader-elect` as a real process (so SIGKILL and SIGSTOP
//!   are real), each replica with its own ServiceAccount, so the audit log says who wrote what.
//! - [`Wave`]: fake GPU nodes with pods under one policy, a wave of fatal XIDs and the driver that
//!   heals drained nodes until the wave is through; [`WaveMonitor`] (crate::monitor) watches the
//!   nodes and pods and checks the budget, a person's cordon, other controllers' markers and
//!   repeated evictions at every observed instant.
//! - [`Recorder`] writes each run's invariants and recovery time as JSON; [`summary`] turns every
//!   results file into the table of docs/reliability.md.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use gpunode_crds::GpuNodePolicy;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Namespace, Node, Pod, ServiceAccount, Taint},
    policy::v1::PodDisruptionBudget,
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub use crate::audit::{AuditEvent, evictions};
pub use crate::monitor::WaveMonitor;
use crate::{
    Error, accounts, audit::AuditLog, crds, fixtures::repo_root, nodes, pods, reports, scratch::rand_suffix,
    wait,
};

/// Label that ties a test's nodes to its policy (not `gpunode.dev/`: that prefix is gpunode's).
pub const RUN_LABEL: &str = "rel.gpunode.test/run";
/// gpunode's taint key, state label and cordon marker (DESIGN §3), as a user sees them.
pub const TAINT_KEY: &str = "gpunode.dev/drift";
/// The verdict label.
pub const STATE_LABEL: &str = "gpunode.dev/state";
/// Set with gpunode's own cordon.
pub const CORDONED_ANNOTATION: &str = "gpunode.dev/cordoned";
/// Written when gpunode starts a drain.
pub const DRAIN_STARTED_ANNOTATION: &str = "gpunode.dev/drain-started";
/// Another controller's label on every wave node: gpunode must never remove it.
pub const FOREIGN_LABEL: (&str, &str) = ("team.example.com/owner", "ml-platform");
/// Another controller's taint (key, value, effect) on every wave node: gpunode must never remove it.
pub const FOREIGN_TAINT: (&str, &str, &str) = ("example.com/maintenance", "planned", "PreferNoSchedule");
/// Marks nodes a test creates only to fill the operator's cache.
pub const FILLER_LABEL: &str = "rel.gpunode.test/filler";
/// Marks a wave's bystander: a node of the policy that a person cordoned, which stays healthy.
pub const BYSTANDER_LABEL: &str = "rel.gpunode.test/bystander";
/// Environment variable naming the reliability cluster (default `rel-<GPUNODE_CLUSTER_NAME>`).
pub const CLUSTER_ENV: &str = "GPUNODE_REL_CLUSTER";

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Unexpected(format!("{what}: {e}"))
}

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
        // An outage must not leave a test's request hanging for minutes.
        config.read_timeout = Some(Duration::from_secs(20));
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

    /// Waits until the API server answers again after an outage.
    pub async fn wait_api(&self, client: &Client, timeout: Duration) -> Result<(), Error> {
        wait::until("the API server to answer", timeout, || async {
            Ok(client.apiserver_version().await.is_ok().then_some(()))
        })
        .await
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

/// The two eviction invariants: no pod evicted twice, every pod in `expected` evicted.
pub fn eviction_checks(events: &[AuditEvent], namespace: &str, expected: &[String]) -> Vec<Check> {
    let counts = evictions(events, namespace);
    let twice: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(p, n)| format!("{p}×{n}"))
        .collect();
    // A 5xx answer (a 504 on a loaded API server) leaves the outcome unknown to the client: the
    // eviction may have been committed, and then the operator correctly does not evict again.
    // Such a pod counts as evicted when it is gone, which the wave's own wait has already seen.
    let unknown_outcome: BTreeSet<String> = events
        .iter()
        .filter(|e| {
            e.resource == "pods"
                && e.subresource == "eviction"
                && e.verb == "create"
                && e.namespace == namespace
                && e.code >= 500
        })
        .map(|e| e.name.clone())
        .collect();
    let missing: Vec<&String> = expected
        .iter()
        .filter(|p| !counts.contains_key(*p) && !unknown_outcome.contains(*p))
        .collect();
    vec![
        Check::new(
            "no pod evicted twice (audit log)",
            twice.is_empty(),
            format!(
                "{} evictions, repeated: {twice:?}",
                counts.values().sum::<usize>()
            ),
        ),
        Check::new(
            "every pod of a drained node evicted",
            missing.is_empty(),
            format!("missing: {missing:?}"),
        ),
    ]
}

/// Whether gpunode's taints or its cordon take the node out of service.
pub fn disrupted(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
        ts.iter()
            .any(|t| t.key == TAINT_KEY && matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
    });
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false)
        && annotation(node, CORDONED_ANNOTATION).as_deref() == Some("true");
    tainted || cordoned
}

/// A node's annotation.
pub fn annotation(node: &Node, key: &str) -> Option<String> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key).cloned())
}

/// A node's label.
pub fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref().and_then(|a| a.get(key).cloned())
}

/// gpunode's taints on a node, as `value:effect`.
pub fn gpunode_taints(node: &Node) -> BTreeSet<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.key == TAINT_KEY)
        .map(|t| format!("{}:{}", t.value.as_deref().unwrap_or_default(), t.effect))
        .collect()
}

/// The operator binary (built by `cargo build --workspace`, as `make test` does first).
pub fn operator_bin() -> Result<PathBuf, Error> {
    let exe = std::env::current_exe().map_err(io("current_exe"))?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("gpunode-operator"))
        .ok_or_else(|| Error::Unexpected("test binary has no target directory".into()))?;
    if bin.exists() {
        Ok(bin)
    } else {
        Err(Error::Unexpected(format!(
            "{} is missing: build the workspace first (`cargo build --workspace`, as `make test` does)",
            bin.display()
        )))
    }
}

fn free_port() -> Result<u16, Error> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("binding a port"))?;
    Ok(l.local_addr().map_err(io("local_addr"))?.port())
}

/// One replica of `gpunode-operator run --leader-elect`, as a process.
pub struct Operator {
    /// Holder identity and ServiceAccount name.
    pub identity: String,
    /// Namespace of the Lease and the ServiceAccount.
    pub namespace: String,
    /// stdout+stderr of every incarnation.
    pub log: PathBuf,
    /// /metrics port.
    pub metrics_port: u16,
    kubeconfig: PathBuf,
    bin: PathBuf,
    launch: Launch,
    child: Option<Child>,
}

/// How a replica's process is started, beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Command the operator runs under, e.g. `ip netns exec NS` (a network namespace).
    pub prefix: Vec<String>,
    /// Extra environment, e.g. libfaketime's (a skewed clock).
    pub env: Vec<(String, String)>,
    /// The API server address the replica uses instead of the admin kubeconfig's, with the name
    /// its certificate is checked against (`tls-server-name`).
    pub server: Option<(String, String)>,
    /// Address /metrics listens on (default 127.0.0.1), e.g. the namespace's end of a veth link.
    pub metrics_ip: Option<String>,
}

impl Operator {
    /// Creates ServiceAccount `identity` in `namespace` (cluster-admin: RBAC is tested elsewhere,
    /// here each replica only needs its own name in the audit log) and starts the replica.
    pub async fn start(
        fc: &FaultCluster,
        admin: &Client,
        identity: &str,
        namespace: &str,
    ) -> Result<Operator, Error> {
        Operator::start_with(fc, admin, identity, namespace, Launch::default()).await
    }

    /// [`Operator::start`], started as `launch` says.
    pub async fn start_with(
        fc: &FaultCluster,
        admin: &Client,
        identity: &str,
        namespace: &str,
        launch: Launch,
    ) -> Result<Operator, Error> {
        let pp = PatchParams::apply("gpunode-rel").force();
        Api::<Namespace>::all(admin.clone())
            .patch(
                namespace,
                &pp,
                &Patch::Apply(
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
                ),
            )
            .await?;
        Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
            .patch(
                identity,
                &pp,
                &Patch::Apply(
                    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": identity}}),
                ),
            )
            .await?;
        let binding = format!("rel-{namespace}-{identity}");
        Api::<ClusterRoleBinding>::all(admin.clone())
            .patch(
                &binding,
                &pp,
                &Patch::Apply(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": binding},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": identity, "namespace": namespace}],
                })),
            )
            .await?;
        let token = accounts::token(admin, namespace, identity, None).await?;
        let admin_yaml = std::fs::read_to_string(&fc.kubeconfig).map_err(io(fc.kubeconfig.display()))?;
        let admin_kc: serde_json::Value = serde_yaml::from_str(&admin_yaml)?;
        let mut cluster = admin_kc
            .pointer("/clusters/0/cluster")
            .cloned()
            .ok_or_else(|| Error::Kubeconfig("admin kubeconfig has no cluster".into()))?;
        if let Some((server, tls_name)) = &launch.server {
            cluster["server"] = json!(server);
            cluster["tls-server-name"] = json!(tls_name);
        }
        let kc = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "rel", "cluster": cluster}],
            "users": [{"name": identity, "user": {"token": token}}],
            "contexts": [{"name": "rel", "context": {"cluster": "rel", "user": identity}}],
            "current-context": "rel",
        });
        let kubeconfig = fc.dir.join(format!("op-{namespace}-{identity}.kubeconfig"));
        std::fs::write(&kubeconfig, serde_yaml::to_string(&kc)?).map_err(io(kubeconfig.display()))?;
        let mut op = Operator {
            identity: identity.to_string(),
            namespace: namespace.to_string(),
            log: fc.dir.join(format!("logs/op-{namespace}-{identity}.log")),
            metrics_port: free_port()?,
            kubeconfig,
            bin: operator_bin()?,
            launch,
            child: None,
        };
        op.spawn()?;
        Ok(op)
    }

    /// The audit log's name for this replica.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.identity)
    }

    /// Starts the process (again, with the same identity: a container restarted in its pod).
    pub fn spawn(&mut self) -> Result<(), Error> {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io(self.log.display()))?;
        let err = log.try_clone().map_err(io("log file"))?;
        let mut cmd = match self.launch.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        let child = cmd
            .envs(self.launch.env.iter().map(|(k, v)| (k, v)))
            .args([
                "run",
                "--instance",
                &self.identity,
                "--leader-elect",
                "true",
                "--lease-namespace",
                &self.namespace,
                "--metrics-addr",
                &format!("{}:{}", self.metrics_ip(), self.metrics_port),
            ])
            .env("KUBECONFIG", &self.kubeconfig)
            // The watcher's debug lines name a 410 Gone when a resumed watch expired.
            .env("RUST_LOG", "info,kube=warn,kube_runtime::watcher=debug")
            .env_remove("POD_NAME")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(io(self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn metrics_ip(&self) -> String {
        self.launch
            .metrics_ip
            .clone()
            .unwrap_or_else(|| "127.0.0.1".into())
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL (no graceful shutdown, the Lease is not released) and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) -> Result<(), Error> {
        let pid = self
            .child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| Error::Unexpected(format!("operator {} is not running", self.identity)))?;
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .map_err(io("kill"))?
            .success();
        if ok {
            Ok(())
        } else {
            Err(Error::Unexpected(format!("kill {sig} {pid} failed")))
        }
    }

    /// SIGSTOP: the process keeps its connections but does nothing (a partition from its view).
    pub fn pause(&self) -> Result<(), Error> {
        self.signal("-STOP")
    }

    /// SIGCONT.
    pub fn resume(&self) -> Result<(), Error> {
        self.signal("-CONT")
    }

    /// SIGTERM: a graceful shutdown (the Lease is released).
    pub fn terminate(&self) -> Result<(), Error> {
        self.signal("-TERM")
    }

    /// The exit status once the process has exited, without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// The process has not exited.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Everything the replica logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A counter or gauge from /metrics (summed over its label sets).
    pub async fn metric(&self, name: &str) -> Result<f64, Error> {
        let (ip, port) = (self.metrics_ip(), self.metrics_port);
        let body = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect((ip.as_str(), port))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })
        .await
        .map_err(|e| Error::Unexpected(format!("metrics: {e}")))?
        .map_err(io("GET /metrics"))?;
        Ok(body
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// Waits until the Lease of its namespace names this replica (needs no access to its /metrics).
    pub async fn wait_holding(&self, admin: &Client, timeout: Duration) -> Result<jiff::Timestamp, Error> {
        wait::until(
            &format!("{} to hold the Lease", self.identity),
            timeout,
            || async {
                Ok(lease(admin, &self.namespace)
                    .await
                    .filter(|(h, _)| *h == self.identity)
                    .map(|(_, at)| at))
            },
        )
        .await
    }

    /// Waits until /metrics says this replica leads.
    pub async fn wait_leading(&self, timeout: Duration) -> Result<(), Error> {
        wait::until(&format!("{} to lead", self.identity), timeout, || async {
            Ok((self.metric("gpunode_leader").await.unwrap_or(0.0) >= 1.0).then_some(()))
        })
        .await
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_ref() {
            // A paused process cannot die of SIGKILL until continued on some kernels' accounting;
            // continue it first.
            let _ = Command::new("kill").args(["-CONT", &c.id().to_string()]).status();
        }
        self.kill();
    }
}

/// The holder of the operator's Lease in `namespace` and when it acquired it.
pub async fn lease(client: &Client, namespace: &str) -> Option<(String, jiff::Timestamp)> {
    let l = Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(gpunode_operator::leader::DEFAULT_LEASE_NAME)
        .await
        .ok()??;
    let spec = l.spec?;
    Some((spec.holder_identity?, spec.acquire_time?.0))
}

/// splitmix64: a deterministic sequence per seed, no dependency.
pub fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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

/// A policy's fake nodes, their workload, and the wave of drifts the tests run through.
pub struct Wave {
    /// Unique id (the value of [`RUN_LABEL`] on the nodes).
    pub id: String,
    /// Node names.
    pub nodes: Vec<String>,
    /// Namespace of the pods.
    pub namespace: String,
    /// Policy name.
    pub policy: String,
    /// Pod names by node.
    pub pods: BTreeMap<String, Vec<String>>,
    /// Whether a PodDisruptionBudget (maxUnavailable 0) holds evictions until released.
    pub pdb: bool,
    /// The node of the policy that a person cordoned (healthy, no pods), when the spec asks for one.
    pub bystander: Option<String>,
    client: Client,
}

/// Options of a [`Wave`].
#[derive(Debug, Clone)]
pub struct WaveSpec {
    /// Short tag in names.
    pub tag: String,
    /// Nodes.
    pub nodes: usize,
    /// Pods per node.
    pub pods_per_node: usize,
    /// Hold evictions with a PDB until [`Wave::release_pdb`].
    pub pdb: bool,
    /// The PDB spares each node's first pod (`slot=0`): a drain evicts it, then waits on the rest.
    pub pdb_spares_first: bool,
    /// Add a node of the policy that a person cordoned (see [`BYSTANDER_LABEL`]).
    pub bystander: bool,
    /// The policy's `spec` (the node selector is added).
    pub policy_spec: serde_json::Value,
}

impl WaveSpec {
    /// XIDs drain one node at a time, recovery after 1 s healthy, breaker off; every node
    /// carries another controller's label and taint, and a person cordoned one more node of the
    /// policy (the bystander).
    pub fn drain(tag: &str, nodes: usize, pods_per_node: usize) -> WaveSpec {
        WaveSpec {
            tag: tag.to_string(),
            nodes,
            pods_per_node,
            pdb: false,
            pdb_spares_first: false,
            bystander: true,
            policy_spec: json!({
                "gpu": {},
                "remediation": [{"classes": ["Xid"], "action": "Drain"}],
                "disruption": {"maxUnavailable": 1, "circuitBreaker": {"maxDriftedPercent": 100}},
                "recovery": {"healthyFor": "1s"},
            }),
        }
    }
}

/// A report status as a probe writes it: one GPU, with a fatal XID 79 when `xid`.
pub fn report_status(xid: bool, boot_id: &str) -> serde_json::Value {
    let xids = if xid {
        json!([{"xid": 79, "at": jiff::Timestamp::now().to_string()}])
    } else {
        json!([])
    };
    json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "bootId": boot_id,
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "gpuCount": 1,
        "gpus": [{"index": 0, "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
                  "xids": xids}],
    })
}

impl Wave {
    /// Creates the nodes (healthy reports), the namespace, the pods (Running) and the policy.
    pub async fn setup(client: &Client, spec: &WaveSpec) -> Result<Wave, Error> {
        let id = format!("{}-{:06x}", spec.tag, rand_suffix());
        let nodes: Vec<String> = (0..spec.nodes).map(|i| format!("{id}-{i}")).collect();
        let bystander = spec.bystander.then(|| format!("{id}-cordoned"));
        let api: Api<Node> = Api::all(client.clone());
        let pp = PatchParams::apply("gpunode-e2e").force();
        for n in nodes.iter().chain(&bystander) {
            let mut node = nodes::render(n, &nodes::GpuNodeShape::default())?;
            let labels = node.metadata.labels.get_or_insert_with(Default::default);
            labels.insert(RUN_LABEL.to_string(), id.clone());
            labels.insert(FOREIGN_LABEL.0.to_string(), FOREIGN_LABEL.1.to_string());
            let node_spec = node.spec.get_or_insert_with(Default::default);
            node_spec.taints.get_or_insert_with(Vec::new).push(Taint {
                key: FOREIGN_TAINT.0.into(),
                value: Some(FOREIGN_TAINT.1.into()),
                effect: FOREIGN_TAINT.2.into(),
                time_added: None,
            });
            if Some(n) == bystander.as_ref() {
                labels.insert(BYSTANDER_LABEL.to_string(), "true".into());
                node_spec.unschedulable = Some(true);
            }
            api.patch(n, &pp, &Patch::Apply(&node)).await?;
            reports::publish(client, n, report_status(false, "boot-1")).await?;
        }
        let namespace = format!("rel-{id}");
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": {crate::scratch::E2E_LABEL: "true"}}}))?,
            )
            .await?;
        // Pods are refused until the controller-manager has made the namespace's default
        // ServiceAccount (a fresh namespace, a loaded machine).
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
        wait::until(
            "the namespace's default ServiceAccount",
            Duration::from_secs(60),
            || async { Ok(accounts.get_opt("default").await?.map(|_| ())) },
        )
        .await?;
        if spec.pdb {
            let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "hold"},
            "spec": {"maxUnavailable": 0, "selector": {
                "matchLabels": {"app": "wave"},
                "matchExpressions": if spec.pdb_spares_first {
                    json!([{"key": "slot", "operator": "NotIn", "values": ["0"]}])
                } else {
                    json!([])
                }}}}))?;
            Api::<PodDisruptionBudget>::namespaced(client.clone(), &namespace)
                .create(&PostParams::default(), &pdb)
                .await?;
        }
        let pod_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let mut pods = BTreeMap::new();
        for (i, n) in nodes.iter().enumerate() {
            let mut names = Vec::new();
            for j in 0..spec.pods_per_node {
                let name = format!("p{i}-{j}");
                pod_api
                    .create(
                        &PostParams::default(),
                        &pods::on_node(&name, n, json!({"app": "wave", "slot": j.to_string()}))?,
                    )
                    .await?;
                names.push(name);
            }
            pods.insert(n.clone(), names);
        }
        for name in pods.values().flatten() {
            pods::running(&pod_api, name, Duration::from_secs(90)).await?;
        }
        let mut policy_spec = spec.policy_spec.clone();
        policy_spec["nodeSelector"] = json!({"matchLabels": {RUN_LABEL: id}});
        crate::crds::create_policy(client, &id, policy_spec).await?;
        Ok(Wave {
            policy: id.clone(),
            id,
            nodes,
            namespace,
            pods,
            pdb: spec.pdb,
            bystander,
            client: client.clone(),
        })
    }

    /// The label selector of the wave's nodes (not the bystander).
    pub fn selector(&self) -> String {
        format!("{RUN_LABEL}={},!{BYSTANDER_LABEL}", self.id)
    }

    /// The label selector of every node of the wave's policy, the bystander included.
    pub fn policy_selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.id)
    }

    /// Starts the watches that check the wave at every instant (see [`WaveMonitor`]).
    pub fn monitor(&self) -> WaveMonitor {
        WaveMonitor::start(
            &self.client,
            &self.policy_selector(),
            &self.namespace,
            self.bystander.is_some(),
        )
    }

    /// Every pod name.
    pub fn all_pods(&self) -> Vec<String> {
        self.pods.values().flatten().cloned().collect()
    }

    /// The wave's nodes as the API server has them now.
    pub async fn nodes_now(&self) -> Result<Vec<Node>, Error> {
        Ok(Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().labels(&self.selector()))
            .await?
            .items)
    }

    /// Pods of the namespace not terminating, by node.
    pub async fn alive_pods(&self) -> Result<BTreeMap<String, usize>, Error> {
        let list = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default())
            .await?;
        let mut out: BTreeMap<String, usize> = self.nodes.iter().map(|n| (n.clone(), 0)).collect();
        for p in list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                *out.entry(n).or_insert(0) += 1;
            }
        }
        Ok(out)
    }

    /// Waits until every node carries `state`.
    pub async fn wait_all(&self, state: &str, timeout: Duration) -> Result<(), Error> {
        wait::until(&format!("every node of {} {state}", self.id), timeout, || async {
            let nodes = self.nodes_now().await?;
            Ok((nodes.len() == self.nodes.len()
                && nodes
                    .iter()
                    .all(|n| label(n, STATE_LABEL).as_deref() == Some(state)))
            .then_some(()))
        })
        .await
    }

    /// Waits until a node of the wave other than `except` has a drain started, and names it.
    pub async fn drain_started(&self, except: &[&str], timeout: Duration) -> Result<String, Error> {
        wait::until(&format!("a drain to start in {}", self.id), timeout, || async {
            let ns = self.nodes_now().await?;
            Ok(ns
                .iter()
                .filter(|n| !except.contains(&n.metadata.name.as_deref().unwrap_or_default()))
                .find(|n| annotation(n, DRAIN_STARTED_ANNOTATION).is_some())
                .and_then(|n| n.metadata.name.clone()))
        })
        .await
    }

    /// A fatal XID on every node at once.
    pub async fn drift_all(&self) -> Result<(), Error> {
        for n in &self.nodes {
            reports::publish(&self.client, n, report_status(true, "boot-1")).await?;
        }
        Ok(())
    }

    /// Deletes the PodDisruptionBudget: evictions go through from now on.
    pub async fn release_pdb(&self) -> Result<(), Error> {
        if self.pdb {
            Api::<PodDisruptionBudget>::namespaced(self.client.clone(), &self.namespace)
                .delete("hold", &DeleteParams::default())
                .await?;
        }
        Ok(())
    }

    /// Plays the node's repair: once a drifted node has been drained (no pods left), its probe
    /// reports it healthy again; returns when every node is compliant, uncordoned, untainted
    /// and empty. API errors (an outage) are retried until `timeout`.
    pub async fn drive(&self, timeout: Duration) -> Result<(), Error> {
        let healed = tokio::sync::Mutex::new(BTreeSet::new());
        wait::until(&format!("wave {} to complete", self.id), timeout, || async {
            let mut healed = healed.lock().await;
            match self.drive_step(&mut healed).await? {
                true => Ok(Some(())),
                false => Err(Error::Unexpected(format!("healed {:?}", *healed))),
            }
        })
        .await
    }

    async fn drive_step(&self, healed: &mut BTreeSet<String>) -> Result<bool, Error> {
        let alive = self.alive_pods().await?;
        let nodes = self.nodes_now().await?;
        let mut done = 0;
        for n in &nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let empty = alive.get(&name).copied().unwrap_or(0) == 0;
            let drained = empty && (self.pods.get(&name).is_some_and(|p| !p.is_empty()) || disrupted(n));
            if drained && !healed.contains(&name) {
                reports::publish(&self.client, &name, report_status(false, "boot-1")).await?;
                healed.insert(name.clone());
            }
            let clean = label(n, STATE_LABEL).as_deref() == Some("compliant")
                && !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
                && gpunode_taints(n).is_empty();
            if healed.contains(&name) && empty && clean {
                done += 1;
            }
        }
        Ok(done == self.nodes.len())
    }

    /// After the wave: gpunode's markers are exactly what the policy implies for healthy nodes
    /// (compliant, no drift labels, no taints, no cordon of its own), the node's own labels and
    /// other controllers' label and taint are intact, and the bystander is still cordoned.
    pub async fn final_checks(&self) -> Result<Vec<Check>, Error> {
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default().labels(&self.policy_selector()))
            .await?
            .items;
        let mut wrong = Vec::new();
        for n in &nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let labels = n.metadata.labels.clone().unwrap_or_default();
            let drift_labels: Vec<&String> = labels
                .keys()
                .filter(|k| k.starts_with("gpunode.dev/drift."))
                .collect();
            let person_cordoned = self.bystander.as_ref() == Some(&name);
            let foreign_taint = n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key == FOREIGN_TAINT.0 && t.effect == FOREIGN_TAINT.2)
            });
            let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
            let problems: Vec<String> = [
                (
                    labels.get("gpunode.dev/policy") != Some(&self.policy),
                    "policy label".to_string(),
                ),
                (
                    labels.get(STATE_LABEL).map(String::as_str) != Some("compliant"),
                    format!("state {:?}", labels.get(STATE_LABEL)),
                ),
                (!drift_labels.is_empty(), format!("drift labels {drift_labels:?}")),
                (
                    !gpunode_taints(n).is_empty(),
                    format!("taints {:?}", gpunode_taints(n)),
                ),
                (
                    unschedulable != person_cordoned,
                    format!("unschedulable {unschedulable}"),
                ),
                (
                    annotation(n, CORDONED_ANNOTATION).is_some(),
                    "gpunode's cordon annotation".to_string(),
                ),
                (
                    !labels.contains_key("nvidia.com/gpu.product"),
                    "own labels".to_string(),
                ),
                (
                    labels.get(FOREIGN_LABEL.0).map(String::as_str) != Some(FOREIGN_LABEL.1)
                        || !foreign_taint,
                    "another controller's label or taint".to_string(),
                ),
                (labels.get(RUN_LABEL) != Some(&self.id), "run label".to_string()),
            ]
            .into_iter()
            .filter_map(|(bad, what)| bad.then_some(what))
            .collect();
            if !problems.is_empty() {
                wrong.push(format!("{name}: {}", problems.join(", ")));
            }
        }
        let expected = self.nodes.len() + usize::from(self.bystander.is_some());
        Ok(vec![Check::new(
            "no gpunode taint, label or cordon lost or orphaned",
            wrong.is_empty() && nodes.len() == expected,
            format!("{} of {expected} nodes, wrong: {wrong:?}", nodes.len()),
        )])
    }

    /// Every invariant of the wave after a run: the watches' (budget of `allowed` held at every
    /// instant, a person's cordon, other controllers' markers, no eviction after a commit), the
    /// audit log's (no pod evicted twice, each pod of `evicted` evicted) and the final state's.
    pub async fn run_checks(
        &self,
        fc: &FaultCluster,
        monitor: &WaveMonitor,
        allowed: usize,
        evicted: &[String],
    ) -> Result<Vec<Check>, Error> {
        let audit = fc.audit()?;
        let mut checks = monitor.checks(allowed, &audit, &self.namespace);
        checks.extend(eviction_checks(&audit, &self.namespace, evicted));
        checks.extend(self.final_checks().await?);
        Ok(checks)
    }

    /// Deletes the policy, nodes and namespace (best effort, without waiting).
    pub async fn cleanup(&self) {
        let _ = Api::<GpuNodePolicy>::all(self.client.clone())
            .delete(&self.policy, &DeleteParams::default())
            .await;
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.namespace, &DeleteParams::background())
            .await;
        for n in self.nodes.iter().chain(&self.bystander) {
            let _ = Api::<Node>::all(self.client.clone())
                .delete(n, &DeleteParams::background())
                .await;
        }
    }
}

/// One invariant checked after a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub invariant: String,
    /// It held.
    pub ok: bool,
    /// The evidence (counts).
    pub detail: String,
}

impl Check {
    /// A check.
    pub fn new(invariant: &str, ok: bool, detail: impl Into<String>) -> Check {
        Check {
            invariant: invariant.to_string(),
            ok,
            detail: detail.into(),
        }
    }
}

/// One fault injected and what was checked after it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// Fault class (issue 7's list): control plane, operator, probe, bad input, concurrency.
    pub class: String,
    /// The fault.
    pub fault: String,
    /// Seed of a seeded run.
    pub seed: Option<u64>,
    /// Invariants checked.
    pub checks: Vec<Check>,
    /// From the end of the fault to the state the run waits for, when measured.
    pub recovery_ms: Option<u64>,
}

impl Run {
    /// Invariants that did not hold.
    pub fn violations(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }
}

/// Collects a test binary's runs and writes them to `<dir>/<file>.json`.
pub struct Recorder {
    path: PathBuf,
    runs: Vec<Run>,
}

/// Where results go: `GPUNODE_RELIABILITY_DIR`, else `<target tmp>/reliability`.
pub fn results_dir(target_tmp: &str) -> PathBuf {
    std::env::var_os("GPUNODE_RELIABILITY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(target_tmp).join("reliability"))
}

impl Recorder {
    /// A recorder writing `<dir>/<file>.json` (pass `env!("CARGO_TARGET_TMPDIR")` as `target_tmp`).
    pub fn new(target_tmp: &str, file: &str) -> Recorder {
        Recorder {
            path: results_dir(target_tmp).join(format!("{file}.json")),
            runs: Vec::new(),
        }
    }

    /// Adds a run and rewrites the file (so a later failure keeps what was measured).
    pub fn push(&mut self, run: Run) -> Result<(), Error> {
        for c in run.violations() {
            eprintln!(
                "VIOLATION [{} / {}]: {}: {}",
                run.class, run.fault, c.invariant, c.detail
            );
        }
        self.runs.push(run);
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir.display()))?;
        }
        std::fs::write(&self.path, serde_json::to_string_pretty(&self.runs)?).map_err(io(self.path.display()))
    }

    /// Fails with every violation recorded so far.
    pub fn assert_clean(&self) {
        let bad: Vec<String> = self
            .runs
            .iter()
            .flat_map(|r| {
                r.violations()
                    .into_iter()
                    .map(move |c| format!("{} / {}: {}: {}", r.class, r.fault, c.invariant, c.detail))
            })
            .collect();
        assert!(bad.is_empty(), "invariants violated:\n{}", bad.join("\n"));
        assert!(!self.runs.is_empty(), "no run recorded");
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since `start`.
pub fn elapsed_ms(start: Instant) -> u64 {
    millis(start.elapsed())
}

/// The aggregated results.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Markdown: one row per fault class and fault, then one per invariant.
    pub table: String,
    /// Runs in all.
    pub runs: usize,
    /// Invariants that did not hold, in all.
    pub violations: usize,
}

/// The tables of every results file in `dir`.
pub fn summary(dir: &Path) -> Result<Summary, Error> {
    let mut runs: Vec<Run> = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(io(f.display()))?;
        let mut some: Vec<Run> = serde_json::from_str(&text)?;
        runs.append(&mut some);
    }
    let mut rows: BTreeMap<(String, String), Vec<&Run>> = BTreeMap::new();
    for r in &runs {
        rows.entry((r.class.clone(), r.fault.clone()))
            .or_default()
            .push(r);
    }
    let mut out = String::from(
        "| Fault class | Fault injected | Runs | Invariants checked | Violations | Recovery median | Recovery max |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    let fmt = |ms: Option<u64>| ms.map_or("–".to_string(), |m| format!("{:.1} s", m as f64 / 1000.0));
    let (mut total_runs, mut total_checks, mut total_bad) = (0, 0, 0);
    for ((class, fault), rs) in &rows {
        let checks: usize = rs.iter().map(|r| r.checks.len()).sum();
        let bad: usize = rs.iter().map(|r| r.violations().len()).sum();
        let mut rec: Vec<u64> = rs.iter().filter_map(|r| r.recovery_ms).collect();
        rec.sort_unstable();
        let median = (!rec.is_empty()).then(|| rec[rec.len() / 2]);
        out.push_str(&format!(
            "| {class} | {fault} | {} | {checks} | {bad} | {} | {} |\n",
            rs.len(),
            fmt(median),
            fmt(rec.last().copied())
        ));
        total_runs += rs.len();
        total_checks += checks;
        total_bad += bad;
    }
    out.push_str(&format!(
        "| **all** | | **{total_runs}** | **{total_checks}** | **{total_bad}** | | |\n"
    ));
    let mut invariants: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for c in runs.iter().flat_map(|r| &r.checks) {
        let e = invariants.entry(c.invariant.as_str()).or_default();
        e.0 += 1;
        e.1 += usize::from(!c.ok);
    }
    out.push_str("\n| Invariant | Times checked | Violations |\n|---|---:|---:|\n");
    for (inv, (n, bad)) in invariants {
        out.push_str(&format!("| {inv} | {n} | {bad} |\n"));
    }
    Ok(Summary {
        table: out,
        runs: total_runs,
        violations: total_bad,
    })
}
