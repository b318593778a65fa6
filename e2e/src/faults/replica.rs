//! The operator as the reliability suite runs it: [`Operator`], one replica of
//! `gpunode-operator run --leader-elect` as a real process (so SIGKILL and SIGSTOP are real),
//! each replica with its own ServiceAccount, so the audit log says who wrote what; [`Launch`]
//! for a replica in a network namespace, with a skewed clock or through a proxy; [`lease`], who
//! holds the Lease.

use std::{
    io::{Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Namespace, ServiceAccount},
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{cluster::FaultCluster, io};
use crate::{Error, accounts, wait};

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
