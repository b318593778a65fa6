//! The operator as the tests and the bench run it:
//! - [`InProcess`], as most e2e tests run it: the real controller (watches, reconciles, writes)
//!   with a client of the chart's operator ServiceAccount, leading from the start;
//! - [`Process`], `gpunode-operator run` as a real process (so SIGKILL, SIGSTOP and SIGTERM are
//!   real), started from a [`Spec`] — the one command line the reliability suite's replicas, the
//!   HA test and the scale bench share — with its output appended to a log file.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, ExitStatus, Stdio},
    sync::Arc,
    time::Duration,
};

use gpunode_operator::{controller, leader::Leadership, metrics::Metrics, server::Readiness};
use kube::Client;
use tokio::{sync::oneshot, task::JoinHandle};

use crate::Error;

/// A running in-process operator.
pub struct InProcess {
    handle: JoinHandle<()>,
    stop: oneshot::Sender<()>,
    /// Its Prometheus metrics.
    pub metrics: Arc<Metrics>,
}

impl InProcess {
    /// Starts the controller with `client` (normally [`crate::chart::operator_client`]);
    /// `instance` names it in Events.
    pub fn start(client: &Client, instance: &str) -> InProcess {
        // No fleet cap: a test of one policy's budget sees only that budget.
        InProcess::start_capped(client, instance, gpunode_crds::MaxUnavailable::Percent(100))
    }

    /// As [`InProcess::start`], with the fleet-wide disruption cap `fleet`
    /// (`--fleet-max-unavailable`).
    pub fn start_capped(client: &Client, instance: &str, fleet: gpunode_crds::MaxUnavailable) -> InProcess {
        // As the binary reads it (`GPUNODE_PLANNING`): a run of the suite may plan
        // incrementally.
        let planning = std::env::var("GPUNODE_PLANNING")
            .ok()
            .map(|p| p.parse().unwrap_or_else(|e| panic!("GPUNODE_PLANNING: {e}")))
            .unwrap_or_default();
        InProcess::start_with(client, instance, fleet, planning)
    }

    /// As [`InProcess::start_capped`], planning as `planning` says (`--planning`).
    pub fn start_with(
        client: &Client,
        instance: &str,
        fleet: gpunode_crds::MaxUnavailable,
        planning: gpunode_operator::policy_state::Planning,
    ) -> InProcess {
        let metrics = Arc::new(Metrics::new());
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(controller::run(
            client.clone(),
            controller::Options {
                instance: instance.to_string(),
                leadership: Leadership::fixed(true),
                metrics: metrics.clone(),
                readiness: Readiness::new(),
                heartbeat_namespace: crate::chart::NAMESPACE.to_string(),
                apply_concurrency: gpunode_operator::apply::DEFAULT_APPLY_CONCURRENCY,
                fleet_max_unavailable: fleet,
                fleet_ignore_taints: Vec::new(),
                // What the validation namespaces granted so far allow (none could not be read:
                // nothing granted, the operator fails closed).
                validation_bounds: crate::chart::validation_bounds().unwrap_or_default(),
                remediator_bounds: crate::chart::remediator_bounds().unwrap_or_default(),
                planning,
            },
            async move {
                let _ = stopped.await;
            },
        ));
        InProcess {
            handle,
            stop,
            metrics,
        }
    }

    /// Graceful shutdown: in-flight reconciles finish; fails if that takes longer than 10 s.
    pub async fn stop(self) -> Result<(), Error> {
        let _ = self.stop.send(());
        match tokio::time::timeout(Duration::from_secs(10), self.handle).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::Unexpected(format!("operator task: {e}"))),
            Err(_) => Err(Error::Unexpected("operator did not shut down within 10 s".into())),
        }
    }

    /// Kills it mid-work, as SIGKILL would: nothing in flight completes.
    pub async fn kill(self) {
        self.handle.abort();
        let _ = self.handle.await;
    }
}

/// The operator binary (built by `cargo build --workspace`, as `make test` does first), next to
/// the running test binary's target directory.
pub fn binary() -> Result<PathBuf, Error> {
    crate::probe::built("gpunode-operator")
}

/// How `gpunode-operator run` is started.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The binary ([`binary`] in tests; the bench takes it from its command line).
    pub bin: PathBuf,
    /// `--instance`: the holder identity and the name in Events.
    pub instance: String,
    /// `KUBECONFIG` of the process.
    pub kubeconfig: PathBuf,
    /// `--leader-elect true --lease-namespace NS`, or `--leader-elect false` when None.
    pub lease_namespace: Option<String>,
    /// `--metrics-addr` (/metrics, /readyz, /healthz).
    pub metrics_addr: SocketAddr,
    /// `RUST_LOG`; None keeps the caller's environment.
    pub rust_log: Option<String>,
    /// Command the operator runs under, e.g. `ip netns exec NS` (a network namespace).
    pub prefix: Vec<String>,
    /// Extra environment, e.g. libfaketime's (a skewed clock).
    pub env: Vec<(String, String)>,
}

impl Spec {
    /// A spec with leader election in `lease_namespace`, a free /metrics port on loopback and
    /// the tests' log filter.
    pub fn leader_elect(
        bin: PathBuf,
        instance: &str,
        kubeconfig: &Path,
        lease_namespace: &str,
    ) -> Result<Spec, Error> {
        Ok(Spec {
            bin,
            instance: instance.to_string(),
            kubeconfig: kubeconfig.to_path_buf(),
            lease_namespace: Some(lease_namespace.to_string()),
            metrics_addr: crate::http::free_addr()?,
            rust_log: Some("info,kube=warn".into()),
            prefix: Vec::new(),
            env: Vec::new(),
        })
    }

    /// The command line, stdio left to the caller. `POD_NAME` is removed: the operator would
    /// take it as its identity instead of `--instance`.
    pub fn command(&self) -> std::process::Command {
        let mut cmd = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = std::process::Command::new(first);
                c.args(rest).arg(&self.bin);
                c
            }
            None => std::process::Command::new(&self.bin),
        };
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(["run", "--instance", &self.instance]);
        match &self.lease_namespace {
            Some(ns) => cmd.args(["--leader-elect", "true", "--lease-namespace", ns]),
            None => cmd.args(["--leader-elect", "false"]),
        };
        // No fleet cap: the waves these replicas run are held to each policy's budget, which
        // their monitors check (the demo runs the binary with the default cap).
        cmd.args(["--metrics-addr", &self.metrics_addr.to_string()])
            .args(["--fleet-max-unavailable", "100%"])
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("POD_NAME");
        if let Some(filter) = &self.rust_log {
            cmd.env("RUST_LOG", filter);
        }
        cmd
    }
}

/// `gpunode-operator run` as a process; SIGKILLed when dropped.
pub struct Process {
    /// How it is started.
    pub spec: Spec,
    /// stdout and stderr of every incarnation.
    pub log: PathBuf,
    child: Option<Child>,
}

impl Process {
    /// Starts it, its output appended to `log`.
    pub fn start(spec: Spec, log: PathBuf) -> Result<Process, Error> {
        let mut p = Process {
            spec,
            log,
            child: None,
        };
        p.spawn()?;
        Ok(p)
    }

    /// Starts the process (again, with the same spec and log: a container restarted in its pod).
    pub fn spawn(&mut self) -> Result<(), Error> {
        self.kill();
        let io = |what: &Path| {
            let what = what.display().to_string();
            move |e: std::io::Error| Error::Unexpected(format!("{what}: {e}"))
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io(&self.log))?;
        let err = log.try_clone().map_err(io(&self.log))?;
        let child = self
            .spec
            .command()
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(io(&self.spec.bin))?;
        self.child = Some(child);
        Ok(())
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
            .pid()
            .ok_or_else(|| Error::Unexpected(format!("operator {} is not running", self.spec.instance)))?;
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .map_err(|e| Error::Unexpected(format!("kill: {e}")))?
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
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// The process has not exited.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits until the process has exited (after [`Process::terminate`]), with its status.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, Error> {
        let what = format!("{} to exit (log: {})", self.spec.instance, self.log.display());
        let child = self
            .child
            .as_mut()
            .ok_or_else(|| Error::Unexpected(format!("operator {} is not running", self.spec.instance)))?;
        crate::wait::until(&what, timeout, || {
            let r = child.try_wait().map_err(|e| Error::Unexpected(e.to_string()));
            async move { r }
        })
        .await
    }

    /// Everything the process logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its /metrics text ([`crate::http::scrape`]).
    pub async fn scrape(&self) -> Result<String, Error> {
        crate::http::scrape(self.spec.metrics_addr).await
    }

    /// A counter or gauge from /metrics: a family summed over its label sets (`name`), or one
    /// series named with its labels (`name{a="b"}`); 0 when it has no sample.
    pub async fn metric(&self, name: &str) -> Result<f64, Error> {
        let text = self.scrape().await?;
        let value = if name.contains('{') {
            crate::http::series(&text, name)
        } else {
            crate::http::sum(&text, name)
        };
        Ok(value.unwrap_or(0.0))
    }

    /// Waits until /metrics says this process leads.
    pub async fn wait_leading(&self, timeout: Duration) -> Result<(), Error> {
        crate::wait::until(&format!("{} to lead", self.spec.instance), timeout, || async {
            Ok((self.metric("gpunode_leader").await.unwrap_or(0.0) >= 1.0).then_some(()))
        })
        .await
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(pid) = self.alive().then(|| self.pid()).flatten() {
            // A stopped (SIGSTOP) process is continued first, so the SIGKILL that follows is
            // handled at once. Only while it runs: a reaped pid may belong to another process.
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
        }
        self.kill();
    }
}
