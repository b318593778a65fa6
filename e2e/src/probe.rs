//! The real node-probe binary as a process, on one test node: the fake NVML library with a JSON
//! fixture, the repo's fixture sysfs, a proc root per boot (its `boot_id`), the XID state
//! directory, and a kubeconfig for the chart's probe ServiceAccount with a token bound to a pod
//! on the node (the DaemonSet pod's projected token, in effect).

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::Client;
use serde_json::json;

use crate::{Error, chart, fixtures::repo_root, wait};

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Unexpected(format!("{what}: {e}"))
}

/// `target/<profile>/<name>`, from the running program's own path: a test's
/// (`target/<profile>/deps/…`) or a binary's beside it (`target/<profile>/…`, the benchmark).
pub fn built(name: &str) -> Result<PathBuf, Error> {
    let exe = std::env::current_exe().map_err(io("current_exe"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| Error::Unexpected("the running program has no directory".into()))?;
    let beside = dir.join(name);
    if dir.file_name().is_some_and(|d| d != "deps") && beside.exists() {
        return Ok(beside);
    }
    let p = dir
        .parent()
        .map(|d| d.join(name))
        .ok_or_else(|| Error::Unexpected("test binary has no target directory".into()))?;
    if p.exists() {
        Ok(p)
    } else {
        Err(Error::Unexpected(format!(
            "{} is missing: build the workspace first (`cargo build --workspace`, as `make test` does)",
            p.display()
        )))
    }
}

/// A running probe and the lines of its log; killed (SIGKILL) when dropped.
pub struct Probe {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Probe {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Every line it logged so far.
    pub fn lines(&self) -> Vec<String> {
        self.log.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Waits for a log line containing `needle`.
    pub async fn logged(&self, needle: &str, timeout: Duration) -> Result<String, Error> {
        wait::until(&format!("the probe to log {needle:?}"), timeout, || async {
            Ok(self.lines().into_iter().find(|l| l.contains(needle)))
        })
        .await
    }

    /// Waits until it exits by itself, with its status.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus, Error> {
        let child = &mut self.child;
        wait::until("the probe to exit", timeout, || {
            let r = child.try_wait().map_err(|e| Error::Unexpected(e.to_string()));
            async move { r }
        })
        .await
    }

    /// SIGKILL, as an OOM kill or a crash would end it: nothing is flushed or saved on the way
    /// out. Returns whether it was still running (a killed process is reaped at once).
    pub fn kill(mut self) -> Result<bool, Error> {
        let running = matches!(self.child.try_wait(), Ok(None));
        self.child.kill().map_err(io("kill the probe"))?;
        let status = self.child.wait().map_err(io("reap the probe"))?;
        Ok(running && !status.success())
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One test node's files: the NVML fixture, a proc root per boot, the state directory.
pub struct Host {
    /// Where its files live.
    pub dir: PathBuf,
    /// The node.
    pub node: String,
    kubeconfig: PathBuf,
    /// The stand-in pod its token is bound to.
    pod: String,
    /// The reset DaemonSet's stand-in pod and kubeconfig ([`Host::prepare_for_resets`]).
    reset: Option<(String, PathBuf)>,
    /// The fixture tree its probe reads (`<tree>/sys`, `<tree>/dcb`, `<tree>/ethtool`).
    tree: PathBuf,
}

impl Host {
    /// Prepares `node`'s files under the temp dir, a healthy 8×H100 fixture, and the probe's
    /// account and pod-bound token.
    pub async fn prepare(admin: &Client, node: &str) -> Result<Host, Error> {
        chart::install_accounts(admin).await?;
        Host::prepare_as(admin, node, chart::PROBE_SA, &chart::probe_pod_name(node)).await
    }

    /// [`Host::prepare`] with the accounts of the chart's GPU resets
    /// ([`chart::install_reset_accounts`]): the probe's, for a probe started with
    /// `--follow-resets`, and the reset DaemonSet's, for [`Host::start_reset_only`].
    pub async fn prepare_for_resets(admin: &Client, node: &str) -> Result<Host, Error> {
        chart::install_reset_accounts(admin).await?;
        let pod = format!("node-probe-reset-{node}");
        let mut host = Host::prepare_as(admin, node, chart::RESET_PROBE_SA, &pod).await?;
        let reset_pod = format!("gpu-reset-{node}");
        let bound = chart::probe_pod_as(admin, node, chart::RESET_SA, &reset_pod).await?;
        let kubeconfig = host.dir.join("reset.kubeconfig");
        chart::write_kubeconfig_as(admin, chart::RESET_SA, &bound, &kubeconfig).await?;
        host.reset = Some((reset_pod, kubeconfig));
        Ok(host)
    }

    /// The node's reset process, as the chart's reset DaemonSet runs it (`--gpu-reset-only`,
    /// under its own account), on the same fake GPUs as the node's probe.
    pub fn start_reset_only(&self) -> Result<Probe, Error> {
        self.start_reset_only_env(&[])
    }

    /// [`Host::start_reset_only`] with more environment (e.g. a crash point to arm).
    pub fn start_reset_only_env(&self, env: &[(&str, &str)]) -> Result<Probe, Error> {
        let Some((_, kubeconfig)) = &self.reset else {
            return Err(Error::Unexpected(format!(
                "{} was not prepared for resets (Host::prepare_for_resets)",
                self.node
            )));
        };
        let mut child = Command::new(built("gpunode-probe")?)
            .args(["--gpu-reset-only", "--node-name", &self.node])
            .arg("--nvml-lib")
            .arg(built("libfake_nvml.so")?)
            .env("FAKE_NVML_FIXTURE", self.fixture())
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("start gpunode-probe --gpu-reset-only"))?;
        Ok(Probe {
            log: echo_log(child.stderr.take(), format!("reset {}", self.node), true),
            child,
        })
    }

    async fn prepare_as(admin: &Client, node: &str, sa: &str, pod_name: &str) -> Result<Host, Error> {
        let dir = std::env::temp_dir().join(format!("gpunode-e2e-{node}"));
        std::fs::create_dir_all(&dir).map_err(io(dir.display()))?;
        let pod = chart::probe_pod_as(admin, node, sa, pod_name).await?;
        let kubeconfig = dir.join("probe.kubeconfig");
        chart::write_kubeconfig_as(admin, sa, &pod, &kubeconfig).await?;
        let host = Host {
            dir,
            node: node.to_string(),
            kubeconfig,
            pod: pod_name.to_string(),
            reset: None,
            tree: repo_root().join("node-probe/tests/fixtures/sysfs/lossless-8port"),
        };
        std::fs::copy(
            repo_root().join("node-probe/fake-nvml/fixtures/healthy-8xh100.json"),
            host.fixture(),
        )
        .map_err(io("copy the NVML fixture"))?;
        Ok(host)
    }

    /// The same host reading a copy of the fixture tree `name` (`ib-ndr-healthy`) that the test
    /// may change under a running probe ([`Host::tree`]), instead of the repo's lossless-8port.
    pub fn with_tree_copy(mut self, name: &str) -> Result<Host, Error> {
        let copy = self.dir.join("tree");
        let _ = std::fs::remove_dir_all(&copy);
        copy_tree(
            &repo_root().join("node-probe/tests/fixtures/sysfs").join(name),
            &copy,
        )?;
        self.tree = copy;
        Ok(self)
    }

    /// The fixture tree the probe reads.
    pub fn tree(&self) -> &Path {
        &self.tree
    }

    /// The NVML fixture the probe's fake library reads.
    pub fn fixture(&self) -> PathBuf {
        self.dir.join("nvml.json")
    }

    /// A proc root whose `sys/kernel/random/boot_id` is `boot`.
    pub fn proc_root(&self, boot: &str) -> Result<PathBuf, Error> {
        let root = self.dir.join(format!("proc-{boot}"));
        let random = root.join("sys/kernel/random");
        std::fs::create_dir_all(&random).map_err(io(random.display()))?;
        std::fs::write(random.join("boot_id"), format!("{boot}\n")).map_err(io("boot_id"))?;
        Ok(root)
    }

    /// Starts the probe during boot `boot`, keeping XIDs in the state directory; its log lines
    /// go to the test's stderr too, prefixed with the node.
    pub fn start_probe(&self, boot: &str) -> Result<Probe, Error> {
        self.start_probe_with(boot, &[])
    }

    /// [`Host::start_probe`] with more arguments (e.g. `--pod-resources-socket`).
    pub fn start_probe_with(&self, boot: &str, extra: &[&std::ffi::OsStr]) -> Result<Probe, Error> {
        self.start_probe_env(boot, extra, &[])
    }

    /// [`Host::start_probe_with`] with more environment (e.g. a crash point to arm).
    pub fn start_probe_env(
        &self,
        boot: &str,
        extra: &[&std::ffi::OsStr],
        env: &[(&str, &str)],
    ) -> Result<Probe, Error> {
        let timing = ["--interval", "500ms", "--heartbeat", "1s"].map(std::ffi::OsStr::new);
        self.spawn_probe(boot, &timing, extra, "info", true, env)
    }

    /// The probe at its default timing (10-s observations, a Lease renewal a minute), with
    /// `extra` arguments and `rust_log` as its log filter: the benchmark's real probes. Its log is
    /// kept ([`Probe::lines`]) but not echoed, so the benchmark's own output stays readable.
    pub fn start_probe_at_defaults(
        &self,
        boot: &str,
        extra: &[&std::ffi::OsStr],
        rust_log: &str,
    ) -> Result<Probe, Error> {
        self.spawn_probe(boot, &[], extra, rust_log, false, &[])
    }

    fn spawn_probe(
        &self,
        boot: &str,
        timing: &[&std::ffi::OsStr],
        extra: &[&std::ffi::OsStr],
        rust_log: &str,
        echo: bool,
        env: &[(&str, &str)],
    ) -> Result<Probe, Error> {
        let tree = &self.tree;
        let mut child = Command::new(built("gpunode-probe")?)
            .arg("--node-name")
            .arg(&self.node)
            .arg("--nvml-lib")
            .arg(built("libfake_nvml.so")?)
            .arg("--sysfs-root")
            .arg(tree.join("sys"))
            .arg("--net-fixtures")
            .arg(tree)
            .arg("--proc-root")
            .arg(self.proc_root(boot)?)
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .args(timing)
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(extra)
            .env("FAKE_NVML_FIXTURE", self.fixture())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", rust_log)
            .envs(env.iter().copied())
            .env_remove("GPUNODE_STATE_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("start gpunode-probe"))?;
        let log = echo_log(child.stderr.take(), format!("probe {}", self.node), echo);
        Ok(Probe { child, log })
    }

    /// An XID happens on GPU `gpu`: written into the fixture of a running probe (atomically).
    pub fn inject_xid(&self, gpu: usize, xid: u32) -> Result<(), Error> {
        self.edit_fixture(|f| f["devices"][gpu]["events"] = json!([{"id": 1, "type": 8, "xid": xid}]))
    }

    /// Changes the NVML fixture of a running probe (atomically): the fake library reads it on
    /// every call.
    pub fn edit_fixture(&self, edit: impl FnOnce(&mut serde_json::Value)) -> Result<(), Error> {
        let path = self.fixture();
        let text = std::fs::read_to_string(&path).map_err(io(path.display()))?;
        let mut fixture: serde_json::Value = serde_json::from_str(&text)?;
        edit(&mut fixture);
        let tmp = self.dir.join("nvml.json.tmp");
        std::fs::write(&tmp, fixture.to_string()).map_err(io(tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(io(path.display()))
    }

    /// A reboot under the probe started during boot `running`: the boot id in its proc root
    /// becomes `boot` (what a reboot changes in its report), and the GPUs come back healthy (a
    /// reboot applies pending remaps and clears volatile state).
    pub fn reboot(&self, running: &str, boot: &str) -> Result<(), Error> {
        let random = self.dir.join(format!("proc-{running}")).join("sys/kernel/random");
        std::fs::write(random.join("boot_id"), format!("{boot}\n")).map_err(io("boot_id"))?;
        let _ = std::fs::remove_file(self.dir.join("nvml.json.hardware"));
        std::fs::copy(
            repo_root().join("node-probe/fake-nvml/fixtures/healthy-8xh100.json"),
            self.dir.join("nvml.json.tmp"),
        )
        .map_err(io("copy the NVML fixture"))?;
        std::fs::rename(self.dir.join("nvml.json.tmp"), self.fixture())
            .map_err(io("replace the NVML fixture"))
    }

    /// Removes its files and the probe's pod (best effort).
    pub async fn cleanup(&self, admin: &Client) {
        let _ = chart::delete_pod(admin, &self.pod).await;
        if let Some((pod, _)) = &self.reset {
            let _ = chart::delete_pod(admin, pod).await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Copies the directory `from` to `to`, recursively (the fixture trees hold only directories
/// and files).
fn copy_tree(from: &Path, to: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(to).map_err(io(to.display()))?;
    for entry in std::fs::read_dir(from).map_err(io(from.display()))? {
        let entry = entry.map_err(io(from.display()))?;
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).map_err(io(target.display()))?;
        }
    }
    Ok(())
}

/// Keeps a process's stderr lines (and echoes them to the test's, prefixed, when `echo`).
fn echo_log(
    stderr: Option<std::process::ChildStderr>,
    prefix: String,
    echo: bool,
) -> Arc<Mutex<Vec<String>>> {
    let log = Arc::new(Mutex::new(Vec::new()));
    if let Some(stderr) = stderr {
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("{prefix}: {line}");
                }
                if let Ok(mut v) = sink.lock() {
                    v.push(line);
                }
            }
        });
    }
    log
}
