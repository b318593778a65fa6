//! Wiring: collectors from the configuration, `--once`, and the long-running [`run`].
//!
//! Wiring only: it judges no report and writes nothing to the cluster itself (the publish loop
//! does).

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpunode_crds::report::GpuNodeReportStatus;
use gpunode_crds::{GpuNodeReport, GpuNodeReportSpec};
use kube::Client;
use tokio::sync::watch;

use crate::collect::{Collector, Probe};
use crate::config::{Config, Output};
use crate::cooling::CoolingCollector;
use crate::metrics;
use crate::network::NetworkCollector;
use crate::network::history_store::{self, HistoryStore};
use crate::nvml::{NvmlCollector, NvmlConfig};
use crate::pods::PodResourcesCollector;
use crate::policies::watch_policies;
use crate::publish::{KubeSink, run_loop_with_policies};
use crate::state::ProbeState;
use crate::xid_state::XidStore;

/// How long `--once` waits for the XID thread to drain already-queued events.
const ONCE_XID_WAIT: Duration = Duration::from_secs(2);
/// The longest a PodResources call may take (the kubelet answers from memory in milliseconds).
const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the probe could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No node name was given.
    #[error("the node name is required (--node-name or NODE_NAME)")]
    NoNodeName,
    /// The metrics address could not be bound.
    #[error("serving metrics on {addr}: {source}")]
    Serve {
        /// The address.
        addr: std::net::SocketAddr,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The report could not be encoded.
    #[error("encoding the report: {0}")]
    Encode(String),
    /// `--chown-state-dir` failed.
    #[error("preparing the state directory: {0}")]
    StateDir(crate::xid_state::StateError),
}

/// Where node `node` keeps the XIDs of this boot, from `--state-dir` (warnings say why not).
/// `--once` only reads it: the running probe owns the file.
fn xid_store(config: &Config, node: &str) -> Option<XidStore> {
    let Some(dir) = &config.state_dir else {
        if !config.once && !config.no_xid_events {
            tracing::warn!(
                "no --state-dir: XIDs are kept in memory only, so a restarted probe forgets the XIDs of this boot"
            );
        }
        return None;
    };
    match XidStore::open(dir, node, &config.proc_root) {
        Ok(store) if config.once => Some(store.read_only()),
        Ok(store) => {
            store.remove_leftovers();
            Some(store)
        }
        Err(e) => {
            tracing::warn!(error = %e, "XIDs are kept in memory only: a restarted probe forgets them");
            None
        }
    }
}

/// Where node `node` keeps the fabric counter history of this boot: beside the XIDs in
/// `--state-dir` (read-only with `--once`), else in memory only.
fn fabric_history(config: &Config, node: &str) -> HistoryStore {
    let Some(dir) = &config.state_dir else {
        return HistoryStore::default();
    };
    let file = crate::boot_state::BootFile::open(
        dir,
        history_store::FILE_NAME,
        history_store::FORMAT,
        history_store::MAX_FILE_BYTES,
        node,
        &config.proc_root,
    );
    match file {
        Ok(file) if config.once => HistoryStore::persistent(file.read_only()),
        Ok(file) => {
            file.remove_leftovers();
            HistoryStore::persistent(file)
        }
        Err(e) => {
            tracing::warn!(error = %e, "the fabric counter history is kept in memory only: a restarted probe forgets it");
            HistoryStore::default()
        }
    }
}

/// Where node `node` keeps the NVLink error counter history of this boot: beside the XIDs in
/// `--state-dir` (read-only with `--once`), else in memory only (None).
fn nvlink_state(config: &Config, node: &str) -> Option<crate::boot_state::BootFile> {
    use crate::nvml::nvlink;
    boot_file(
        config,
        node,
        (nvlink::FILE_NAME, nvlink::FORMAT, nvlink::MAX_FILE_BYTES),
        "NVLink counter",
    )
}

/// Where node `node` keeps the PCIe replay history of this boot: beside the XIDs in
/// `--state-dir` (read-only with `--once`), else in memory only (None).
fn pcie_state(config: &Config, node: &str) -> Option<crate::boot_state::BootFile> {
    use crate::nvml::signals;
    boot_file(
        config,
        node,
        (signals::FILE_NAME, signals::FORMAT, signals::MAX_FILE_BYTES),
        "PCIe replay",
    )
}

/// The state file (name, format, size cap) of node `node` in `--state-dir` for the history of
/// `what`; None (with a warning when it cannot be opened) keeps that history in memory only.
fn boot_file(
    config: &Config,
    node: &str,
    (name, format, max_bytes): (&'static str, u32, u64),
    what: &str,
) -> Option<crate::boot_state::BootFile> {
    let dir = config.state_dir.as_ref()?;
    match crate::boot_state::BootFile::open(dir, name, format, max_bytes, node, &config.proc_root) {
        Ok(file) if config.once => Some(file.read_only()),
        Ok(file) => {
            file.remove_leftovers();
            Some(file)
        }
        Err(e) => {
            tracing::warn!(error = %e, "the {what} history is kept in memory only: a restarted probe forgets it");
            None
        }
    }
}

/// The probe of node `node` with all collectors, and the NVML collector on its own for its XID log.
pub fn build(config: &Config, node: &str) -> (Arc<Probe>, Arc<NvmlCollector>) {
    let nvml = Arc::new(NvmlCollector::new(NvmlConfig {
        lib_path: config.nvml_lib.clone(),
        timeout: config.nvml_timeout,
        watch_xids: !config.no_xid_events,
        xid_store: xid_store(config, node),
        nvlink_state: nvlink_state(config, node),
        pcie_state: pcie_state(config, node),
        ..NvmlConfig::default()
    }));
    let network = match &config.net_fixtures {
        Some(dir) => NetworkCollector::with_fixtures(&config.sysfs_root, dir),
        None => NetworkCollector::real(&config.sysfs_root),
    }
    .with_history(fabric_history(config, node));
    let mut collectors: Vec<Arc<dyn Collector>> =
        vec![nvml.clone(), Arc::new(CoolingCollector::new(&config.sysfs_root))];
    if !config.no_network {
        collectors.push(Arc::new(network));
    }
    // After NVML: pods are attributed to the GPUs it listed.
    if let Some(socket) = &config.pod_resources_socket {
        collectors.push(Arc::new(PodResourcesCollector::new(
            socket.clone(),
            config.gpu_resources.clone(),
            POD_RESOURCES_TIMEOUT,
        )));
    }
    (Arc::new(Probe::new(collectors, config.proc_root.clone())), nvml)
}

/// The host name, for `--once` without a node name.
fn host_name(proc_root: &Path) -> String {
    crate::sysfs::read_text(&proc_root.join("sys/kernel/hostname")).unwrap_or_else(|_| "localhost".to_owned())
}

/// A full GpuNodeReport object around an observation.
pub fn report_object(node: &str, status: GpuNodeReportStatus) -> GpuNodeReport {
    let mut report = GpuNodeReport::new(
        node,
        GpuNodeReportSpec {
            node_name: node.to_owned(),
        },
    );
    report.status = Some(status);
    report
}

/// `--chown-state-dir`: prepares the state directory for the probe's user (the chart's init container).
pub fn prepare_state_dir(config: &Config) -> Result<(), RunError> {
    let (Some(dir), Some((uid, gid))) = (&config.state_dir, config.chown_state_dir) else {
        return Ok(());
    };
    crate::xid_state::prepare_dir(dir, uid, gid).map_err(RunError::StateDir)
}

/// `--once`: one observation, printed as a GpuNodeReport.
pub fn once(config: &Config) -> Result<String, RunError> {
    let node = config
        .node_name
        .clone()
        .unwrap_or_else(|| host_name(&config.proc_root));
    let (probe, nvml) = build(config, &node);
    if !config.no_xid_events {
        // XIDs already queued by the driver are part of this observation.
        nvml.prepare(ONCE_XID_WAIT);
    }
    let status = probe.observe();
    nvml.shutdown();
    let report = report_object(&node, status);
    match config.output {
        Output::Yaml => serde_yaml::to_string(&report).map_err(|e| RunError::Encode(e.to_string())),
        Output::Json => serde_json::to_string_pretty(&report)
            .map(|s| s + "\n")
            .map_err(|e| RunError::Encode(e.to_string())),
    }
}

/// `--gpu-reset-only`: answers node `node`'s GpuResetRequests until `shutdown` completes, and
/// nothing else (no XID events: the probe beside it listens for them), then unloads NVML.
async fn reset_only(
    config: &Config,
    client: Client,
    node: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let nvml = Arc::new(NvmlCollector::new(NvmlConfig {
        lib_path: config.nvml_lib.clone(),
        timeout: config.nvml_timeout,
        watch_xids: false,
        xid_store: None,
        ..NvmlConfig::default()
    }));
    tracing::info!(node = %node, "reset only: no observation, report or heartbeat");
    crate::resets::answer_resets(client, node, nvml.clone(), shutdown).await;
    let _ = tokio::task::spawn_blocking(move || nvml.shutdown()).await;
    tracing::info!("stopped");
}

/// Runs the probe until `shutdown` completes: observes, publishes to the cluster, serves
/// `/metrics` and `/healthz`, then stops the XID thread and unloads NVML.
pub async fn run(
    config: Config,
    client: Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let node = config.node_name.clone().ok_or(RunError::NoNodeName)?;
    if config.gpu_reset_only {
        reset_only(&config, client, node, shutdown).await;
        return Ok(());
    }
    let (probe, nvml) = build(&config, &node);
    let xids = nvml.xids();
    let stale_after = config.interval * 3 + Duration::from_secs(30);
    let state = Arc::new(ProbeState::new(&node, stale_after, Some(xids.clone())));

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });

    let addr = config.metrics_addr;
    let (bound, server) = metrics::serve(addr, state.clone(), stopped(stop_rx.clone()))
        .await
        .map_err(|source| RunError::Serve { addr, source })?;
    tracing::info!(%bound, node = %node, "serving /metrics and /healthz");

    let policies = (!config.no_policy_watch)
        .then(|| watch_policies(client.clone(), state.clone(), stopped(stop_rx.clone())));
    if config.gpu_reset {
        crate::resets::watch_resets(
            client.clone(),
            node.clone(),
            nvml.clone(),
            stopped(stop_rx.clone()),
        );
    } else if config.follow_resets {
        crate::resets::follow_resets(
            client.clone(),
            node.clone(),
            nvml.clone(),
            stopped(stop_rx.clone()),
        );
    }
    let mut sink =
        KubeSink::new(client, &node).with_heartbeat_lease(&config.lease_namespace, config.heartbeat);
    run_loop_with_policies(
        &config.publish(),
        probe,
        &mut sink,
        Some(xids.subscribe()),
        policies,
        state,
        stopped(stop_rx),
    )
    .await;

    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "metrics server failed"),
        Err(e) => tracing::warn!(error = %e, "metrics server task failed"),
    }
    let _ = tokio::task::spawn_blocking(move || nvml.shutdown()).await;
    tracing::info!("stopped");
    Ok(())
}
