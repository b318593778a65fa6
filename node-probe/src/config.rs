//! Command line and environment of the probe binary.
//!
//! It parses and validates flags; it reads no device, file or cluster.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::change::ChangeConfig;
use crate::nvml::DEFAULT_LIB;
use crate::publish::PublishConfig;

/// Default port of /metrics and /healthz, on the host network. Not dcgm-exporter's 9400, which
/// often runs on the same node, nor any port of the other common GPU-node agents (node-exporter,
/// the GPU Operator's components, kubelet, kube-proxy, CNI agents, NFD); outside the range
/// Prometheus allocates to exporters (9100-9999, all taken), below the NodePort range and the
/// ephemeral ports, and outside the ranges GPU workloads bind (Ray's workers 10002-19999,
/// torchrun's 29400 and 29500). README "With the GPU Operator and dcgm-exporter" has the list.
pub const DEFAULT_METRICS_PORT: u16 = 21400;

/// Output format of `--once`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// YAML, as `kubectl get -o yaml` would show it.
    Yaml,
    /// JSON.
    Json,
}

/// Log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: gpunode_crds::Duration = s.parse().map_err(|e| format!("{e}"))?;
    if d.get().is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d.get())
}

fn parse_owner(s: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = s.split_once(':').ok_or("expected UID:GID")?;
    let id = |v: &str| v.parse::<u32>().map_err(|e| format!("{v:?}: {e}"));
    Ok((id(uid)?, id(gid)?))
}

/// gpunode node-probe: observes this GPU node (NVML, cooling sensors, RoCE lossless settings)
/// and publishes its GpuNodeReport.
#[derive(Debug, Clone, Parser)]
#[command(name = "gpunode-probe", version)]
pub struct Config {
    /// Observe once, print the GpuNodeReport and exit (no cluster needed).
    #[arg(long)]
    pub once: bool,

    /// Output format of --once.
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: Output,

    /// Name of this node (the report's name). Defaults to the host name with --once.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// Where sysfs is mounted (a fixture tree in tests).
    #[arg(long, env = "GPUNODE_SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,

    /// Where procfs is mounted (for the boot id).
    #[arg(long, env = "GPUNODE_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// Path or name of the NVML library.
    #[arg(long, env = "GPUNODE_NVML_LIB", default_value = DEFAULT_LIB)]
    pub nvml_lib: OsString,

    /// How long one NVML collection may take before the report says the nvml collector hung
    /// (a driver call that does not return); until that call returns, later collections say so
    /// at once.
    #[arg(long, env = "GPUNODE_NVML_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub nvml_timeout: Duration,

    /// Read DCB and ethtool answers from DIR/dcb/<if>.json and DIR/ethtool/<if>.json instead of
    /// netlink and ioctl (fixture trees, demos).
    #[arg(long, env = "GPUNODE_NET_FIXTURES", value_name = "DIR")]
    pub net_fixtures: Option<PathBuf>,

    /// Do not listen for XID events.
    #[arg(long)]
    pub no_xid_events: bool,

    /// The kubelet's PodResources socket (/var/lib/kubelet/pod-resources/kubelet.sock, mounted
    /// read-only): the probe reports which pods hold each GPU, so that a per-GPU quarantine on a
    /// device-plugin node evicts only those pods. Unset: not read, and such a quarantine with
    /// NoExecute escalates to the node's rules.
    #[arg(long, env = "GPUNODE_POD_RESOURCES_SOCKET", value_name = "PATH")]
    pub pod_resources_socket: Option<PathBuf>,

    /// The extended resources whose devices are GPUs in the PodResources answer.
    #[arg(
        long,
        env = "GPUNODE_GPU_RESOURCES",
        value_delimiter = ',',
        default_value = crate::pods::DEFAULT_GPU_RESOURCES
    )]
    pub gpu_resources: Vec<String>,

    /// Keep the XIDs of the current boot in DIR/xids.json and the last hour of fabric and NVLink
    /// error counters and PCIe replays in DIR/fabric-counters.json, DIR/nvlink-counters.json and
    /// DIR/pcie-replays.json, so a restarted probe still reports them (the chart
    /// mounts the host's /var/lib/gpunode). Unset: in memory only, and a restarted probe
    /// forgets them (a warning says so).
    #[arg(long, env = "GPUNODE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Create --state-dir, hand it to UID:GID and exit: the chart's init container, which runs
    /// as root with only CAP_CHOWN, so that the non-root probe can write it.
    #[arg(long, value_name = "UID:GID", value_parser = parse_owner, requires = "state_dir")]
    pub chown_state_dir: Option<(u32, u32)>,

    /// How often to observe, e.g. 10s.
    #[arg(long, env = "GPUNODE_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub interval: Duration,

    /// How often to renew the node's heartbeat Lease while nothing changes, e.g. 60s (the
    /// operator's `staleAfter` counts from the latest renewal or report).
    #[arg(long, env = "GPUNODE_HEARTBEAT", default_value = "60s", value_parser = parse_duration)]
    pub heartbeat: Duration,

    /// Longest time between two writes of the whole report while nothing material changes,
    /// e.g. 10m. Material changes are written at once.
    #[arg(long, env = "GPUNODE_REPORT_REFRESH", default_value = "10m", value_parser = parse_duration)]
    pub report_refresh: Duration,

    /// Shortest time from a report write to one that only clears findings (a drift or unknown
    /// that went away, nothing new), e.g. 2m: a value on a threshold does not write every flip.
    #[arg(long, env = "GPUNODE_RECOVERY_GAP", default_value = "2m", value_parser = parse_duration)]
    pub recovery_gap: Duration,

    /// Do not watch GpuNodePolicies; decide what to publish at once by temperature bands only.
    #[arg(long)]
    pub no_policy_watch: bool,

    /// Answer this node's GpuResetRequests: reset the GPU a request names through NVML (only if
    /// its UUID matches and no process uses it) and write the outcome to the request's status.
    /// Needs the NVML privileges of a GPU reset (root, a writable /sys: the chart's
    /// nodeProbe.gpuReset.enabled grants them).
    #[arg(long, env = "GPUNODE_GPU_RESET")]
    pub gpu_reset: bool,

    /// Answer this node's GpuResetRequests as --gpu-reset does, and do nothing else: no
    /// observation, no report, no heartbeat, no XID events, no HTTP endpoints. The chart's
    /// privileged reset DaemonSet (nodeProbe.gpuReset.enabled), beside an unprivileged probe
    /// that runs with --follow-resets.
    #[arg(long, env = "GPUNODE_GPU_RESET_ONLY", conflicts_with_all = ["once", "gpu_reset", "follow_resets"])]
    pub gpu_reset_only: bool,

    /// Follow this node's GpuResetRequests, which another process answers (--gpu-reset-only),
    /// read-only: after a reset succeeded, forget the GPU's XIDs and publish a fresh report at
    /// once. Needs get, list and watch on gpuresetrequests.
    #[arg(long, env = "GPUNODE_FOLLOW_RESETS", conflicts_with = "gpu_reset")]
    pub follow_resets: bool,

    /// Do not read the RoCE NICs (netdevs, DCB, ethtool): the report carries none. For a probe
    /// outside the host's network namespace (the chart's nodeProbe.hostNetwork false), where
    /// the host's NICs cannot be asked over netlink.
    #[arg(long, env = "GPUNODE_NO_NETWORK")]
    pub no_network: bool,

    /// Namespace of the heartbeat Lease `gpunode-probe-<node>` (the release namespace).
    #[arg(long, env = "GPUNODE_LEASE_NAMESPACE", default_value = "gpunode-system")]
    pub lease_namespace: String,

    /// Longest retry delay after failed publishes.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub max_backoff: Duration,

    /// Edges (°C of margin to the GPU slowdown threshold) whose crossing is published at once.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,3,5,10,15",
        allow_hyphen_values = true
    )]
    pub margin_bands: Vec<i32>,

    /// Address of /metrics and /healthz.
    #[arg(long, env = "GPUNODE_METRICS_ADDR", default_value_t = SocketAddr::from(([0, 0, 0, 0], DEFAULT_METRICS_PORT)))]
    pub metrics_addr: SocketAddr,

    /// Log format.
    #[arg(long, env = "GPUNODE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

impl Config {
    /// Timing and change detection of the publish loop.
    pub fn publish(&self) -> PublishConfig {
        PublishConfig {
            interval: self.interval,
            heartbeat: self.heartbeat,
            report_refresh: self.report_refresh,
            refresh_seed: crate::publish::refresh_seed(self.node_name.as_deref().unwrap_or_default()),
            backoff_max: self.max_backoff,
            recovery_gap: self.recovery_gap,
            change: ChangeConfig {
                margin_edges: self.margin_bands.clone(),
                ..ChangeConfig::default()
            },
            ..PublishConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = Config::try_parse_from(["gpunode-probe"]).unwrap();
        assert_eq!(c.interval, Duration::from_secs(10));
        assert_eq!(c.heartbeat, Duration::from_secs(60));
        assert_eq!(c.report_refresh, Duration::from_secs(600));
        assert_eq!(c.lease_namespace, "gpunode-system");
        assert_eq!(c.recovery_gap, Duration::from_secs(120));
        assert!(!c.no_policy_watch);
        assert!(!c.gpu_reset, "GPU resets are off unless asked for");
        assert!(!c.gpu_reset_only && !c.follow_resets && !c.no_network);
        assert_eq!(c.metrics_addr, "0.0.0.0:21400".parse().unwrap());
        assert_eq!(c.margin_bands, vec![0, 3, 5, 10, 15]);
        let c = Config::try_parse_from([
            "gpunode-probe",
            "--once",
            "-o",
            "json",
            "--interval",
            "2s",
            "--recovery-gap",
            "30s",
            "--margin-bands",
            "-2,5",
            "--nvml-lib",
            "/x.so",
        ])
        .unwrap();
        assert!(c.once);
        assert_eq!(c.output, Output::Json);
        assert_eq!(c.interval, Duration::from_secs(2));
        assert_eq!(c.publish().change.margin_edges, vec![-2, 5]);
        assert_eq!(c.publish().recovery_gap, Duration::from_secs(30));
        assert_eq!(c.state_dir, None);
        let c = Config::try_parse_from([
            "gpunode-probe",
            "--state-dir",
            "/var/lib/gpunode",
            "--chown-state-dir",
            "65532:65532",
        ])
        .unwrap();
        assert_eq!(c.state_dir, Some(PathBuf::from("/var/lib/gpunode")));
        assert_eq!(c.chown_state_dir, Some((65532, 65532)));
        assert!(Config::try_parse_from(["gpunode-probe", "--chown-state-dir", "1:1"]).is_err());
        assert!(
            Config::try_parse_from(["gpunode-probe", "--state-dir", "/x", "--chown-state-dir", "65532"])
                .is_err()
        );
        assert!(Config::try_parse_from(["gpunode-probe", "--interval", "0s"]).is_err());
        assert!(Config::try_parse_from(["gpunode-probe", "--interval", "soon"]).is_err());
    }

    /// The reset runs in one process or the other, never both: a reset-only process answers,
    /// the probe beside it follows.
    #[test]
    fn a_reset_only_process_neither_observes_nor_follows() {
        let c = Config::try_parse_from(["gpunode-probe", "--gpu-reset-only"]).unwrap();
        assert!(c.gpu_reset_only && !c.gpu_reset);
        for other in ["--once", "--gpu-reset", "--follow-resets"] {
            assert!(
                Config::try_parse_from(["gpunode-probe", "--gpu-reset-only", other]).is_err(),
                "{other}"
            );
        }
        assert!(Config::try_parse_from(["gpunode-probe", "--follow-resets", "--gpu-reset"]).is_err());
        let c = Config::try_parse_from(["gpunode-probe", "--follow-resets", "--no-network"]).unwrap();
        assert!(c.follow_resets && c.no_network);
    }
}
