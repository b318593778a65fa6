//! `/metrics` and `/healthz`.
//!
//! GPU metrics carry the DCGM field names and dcgm-exporter's labels (`gpu`, `UUID`,
//! `pci_bus_id`, `modelName`, `Hostname`), so existing dashboards and alerts keep working; values
//! DCGM has no field for use a `gpunode_` prefix. The exposition is rendered from the latest
//! observation on each scrape, so a GPU or port that disappears leaves no stale series.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use gpunode_crds::report::{GpuNodeReportStatus, GpuStatus, RdmaDevice};
use gpunode_crds::{EnabledState, ThrottleReason};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::state::ProbeState;

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// A gauge family being filled.
struct GaugeFamily {
    name: &'static str,
    help: &'static str,
    family: Family<Labels, FloatGauge>,
    used: bool,
}

impl GaugeFamily {
    fn new(name: &'static str, help: &'static str) -> Self {
        GaugeFamily {
            name,
            help,
            family: Family::default(),
            used: false,
        }
    }

    fn set(&mut self, labels: Labels, value: f64) {
        self.family.get_or_create(&labels).set(value);
        self.used = true;
    }

    fn register(self, registry: &mut Registry) {
        if self.used {
            registry.register(self.name, self.help, self.family);
        }
    }
}

fn gpu_labels(gpu: &GpuStatus, host: &str) -> Labels {
    vec![
        ("gpu".into(), gpu.index.to_string()),
        ("UUID".into(), gpu.uuid.clone().unwrap_or_default()),
        ("pci_bus_id".into(), gpu.pci_bus_id.clone().unwrap_or_default()),
        ("modelName".into(), gpu.product.clone().unwrap_or_default()),
        ("Hostname".into(), host.to_owned()),
    ]
}

fn with(mut labels: Labels, key: &str, value: impl ToString) -> Labels {
    labels.push((key.to_owned(), value.to_string()));
    labels
}

fn enabled(state: Option<EnabledState>) -> Option<f64> {
    state.map(|s| if s == EnabledState::Enabled { 1.0 } else { 0.0 })
}

fn bool_f(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// Per-GPU gauges: (DCGM name, help, value).
type GpuMetric = (&'static str, &'static str, fn(&GpuStatus) -> Option<f64>);

const GPU_METRICS: &[GpuMetric] = &[
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", |g| {
        g.temperature_celsius.map(f64::from)
    }),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", |g| {
        g.memory_temperature_celsius.map(f64::from)
    }),
    (
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        "Slowdown temperature threshold (in C).",
        |g| g.slowdown_celsius.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_SHUTDOWN_TEMP",
        "Shutdown temperature threshold (in C).",
        |g| g.shutdown_celsius.map(f64::from),
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP_LIMIT",
        "Margin to the slowdown threshold (in C).",
        |g| Some(f64::from(g.slowdown_celsius? - g.temperature_celsius?)),
    ),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", |g| {
        g.power_watts.map(f64::from)
    }),
    (
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "Enforced power limit (in W).",
        |g| g.power_limit_watts.map(f64::from),
    ),
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory (in MiB).", |g| {
        g.memory_mib.map(|m| m as f64)
    }),
    ("DCGM_FI_DEV_ECC_CURRENT", "ECC mode (1 = enabled).", |g| {
        enabled(g.ecc_mode)
    }),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Volatile corrected ECC errors.",
        |g| g.ecc.as_ref().map(|e| e.volatile_corrected as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Volatile uncorrected ECC errors.",
        |g| g.ecc.as_ref().map(|e| e.volatile_uncorrected as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Aggregate corrected ECC errors.",
        |g| g.ecc.as_ref().map(|e| e.aggregate_corrected as f64),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Aggregate uncorrected ECC errors.",
        |g| g.ecc.as_ref().map(|e| e.aggregate_uncorrected as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_SBE",
        "Pages retired for single-bit errors.",
        |g| g.retired_pages.as_ref().map(|r| r.single_bit as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_DBE",
        "Pages retired for double-bit errors.",
        |g| g.retired_pages.as_ref().map(|r| r.double_bit as f64),
    ),
    (
        "DCGM_FI_DEV_RETIRED_PENDING",
        "Page retirement pending (1 = yes).",
        |g| g.retired_pages.as_ref().map(|r| bool_f(r.pending)),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for correctable errors.",
        |g| g.remapped_rows.as_ref().map(|r| r.correctable as f64),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Rows remapped for uncorrectable errors.",
        |g| g.remapped_rows.as_ref().map(|r| r.uncorrectable as f64),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "Row remap pending (1 = yes).",
        |g| g.remapped_rows.as_ref().map(|r| bool_f(r.pending)),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Row remap failed (1 = yes).",
        |g| g.remapped_rows.as_ref().map(|r| bool_f(r.failure)),
    ),
    (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "Clock throttle reasons (NVML bitmask).",
        |g| {
            let mask = ThrottleReason::BITS
                .iter()
                .filter(|(r, _)| g.throttle_reasons.contains(r))
                .map(|(_, b)| b);
            Some(mask.fold(0u64, |acc, b| acc | b) as f64)
        },
    ),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "PCIe link generation.", |g| {
        g.pcie.as_ref().map(|p| f64::from(p.current_generation))
    }),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "PCIe link width (lanes).", |g| {
        g.pcie.as_ref().map(|p| f64::from(p.current_width))
    }),
    (
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "Maximum PCIe link generation.",
        |g| g.pcie.as_ref().map(|p| f64::from(p.max_generation)),
    ),
    (
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "Maximum PCIe link width (lanes).",
        |g| g.pcie.as_ref().map(|p| f64::from(p.max_width)),
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe replays.", |g| {
        g.pcie.as_ref().map(|p| p.replay_counter as f64)
    }),
    (
        "DCGM_FI_DEV_PERSISTENCE_MODE",
        "Persistence mode (1 = enabled).",
        |g| enabled(g.persistence_mode),
    ),
    ("DCGM_FI_DEV_MIG_MODE", "MIG mode (1 = enabled).", |g| {
        enabled(g.mig_mode)
    }),
    ("DCGM_FI_DEV_XID_ERRORS", "Last XID seen on the GPU.", |g| {
        g.xids.last().map(|x| f64::from(x.xid))
    }),
    ("gpunode_gpu_nvlink_active", "NVLinks up.", |g| {
        g.nvlink.as_ref().map(|n| f64::from(n.active))
    }),
    ("gpunode_gpu_nvlink_total", "NVLinks the GPU has.", |g| {
        g.nvlink.as_ref().map(|n| f64::from(n.total))
    }),
    (
        "gpunode_gpu_field_errors",
        "GPU fields NVML could not read.",
        |g| Some(g.errors.len() as f64),
    ),
];

/// Per-port gauges: (name, help, value).
type PortMetric = (&'static str, &'static str, fn(&RdmaDevice) -> Option<f64>);

const PORT_METRICS: &[PortMetric] = &[
    (
        "gpunode_rdma_port_active",
        "RDMA port state is Active (1) or not (0).",
        |d| d.state.as_ref().map(|s| bool_f(s == "Active")),
    ),
    ("gpunode_rdma_port_rate_gbps", "RDMA port rate (Gb/s).", |d| {
        d.rate_gbps.map(f64::from)
    }),
    (
        "gpunode_rdma_port_mtu_bytes",
        "MTU of the port's network interface.",
        |d| d.mtu.map(f64::from),
    ),
    (
        "gpunode_rdma_port_rocev2_gid",
        "The port has a RoCE v2 GID.",
        |d| d.roce_v2_gid.map(bool_f),
    ),
    (
        "gpunode_rdma_port_field_errors",
        "Port fields that could not be read.",
        |d| Some(d.errors.len() as f64),
    ),
];

fn port_labels(d: &RdmaDevice, host: &str) -> Labels {
    vec![
        ("device".into(), d.device.clone()),
        ("port".into(), d.port.to_string()),
        ("netdev".into(), d.netdev.clone().unwrap_or_default()),
        ("Hostname".into(), host.to_owned()),
    ]
}

fn node_metrics(registry: &mut Registry, report: &GpuNodeReportStatus, host: &str) {
    let node = || vec![("Hostname".to_owned(), host.to_owned())];
    let mut count = GaugeFamily::new("gpunode_gpu_count", "GPUs NVML sees.");
    let mut throttled = GaugeFamily::new(
        "gpunode_throttled_gpus",
        "GPUs with a performance-limiting throttle reason.",
    );
    if let Some(n) = report.gpu_count {
        count.set(node(), f64::from(n));
    }
    if let Some(n) = report.throttled_gpus {
        throttled.set(node(), f64::from(n));
    }
    count.register(registry);
    throttled.register(registry);

    let mut up = GaugeFamily::new(
        "gpunode_collector_up",
        "Whether the collector completed (1) or failed (0).",
    );
    let mut duration = GaugeFamily::new(
        "gpunode_collector_duration_seconds",
        "How long the collector took.",
    );
    for c in &report.collectors {
        let name = format!("{:?}", c.name).to_lowercase();
        up.set(with(node(), "collector", &name), bool_f(c.ok));
        duration.set(with(node(), "collector", &name), c.duration_ms as f64 / 1000.0);
    }
    up.register(registry);
    duration.register(registry);
}

fn gpu_metrics(registry: &mut Registry, report: &GpuNodeReportStatus, host: &str) {
    for (name, help, value) in GPU_METRICS {
        let mut family = GaugeFamily::new(name, help);
        for gpu in &report.gpus {
            if let Some(v) = value(gpu) {
                family.set(gpu_labels(gpu, host), v);
            }
        }
        family.register(registry);
    }
    let mut reasons = GaugeFamily::new(
        "gpunode_gpu_throttle_reason",
        "Active clock throttle reasons (1 = active).",
    );
    for gpu in &report.gpus {
        for reason in &gpu.throttle_reasons {
            reasons.set(with(gpu_labels(gpu, host), "reason", format!("{reason:?}")), 1.0);
        }
    }
    reasons.register(registry);
}

fn cooling_metrics(registry: &mut Registry, report: &GpuNodeReportStatus, host: &str) {
    let Some(cooling) = &report.cooling else { return };
    let mut temp = GaugeFamily::new(
        "gpunode_sensor_celsius",
        "hwmon and thermal zone temperatures (in C).",
    );
    let mut crit = GaugeFamily::new(
        "gpunode_sensor_crit_celsius",
        "Sensor critical thresholds (in C).",
    );
    for s in &cooling.sensors {
        let labels = vec![
            ("chip".to_owned(), s.chip.clone()),
            ("label".to_owned(), s.label.clone()),
            ("Hostname".to_owned(), host.to_owned()),
        ];
        if let Some(c) = s.crit_celsius {
            crit.set(labels.clone(), c);
        }
        temp.set(labels, s.celsius);
    }
    temp.register(registry);
    crit.register(registry);
    let mut fans = GaugeFamily::new("gpunode_fan_rpm", "Fan speeds (RPM).");
    for f in &cooling.fans {
        fans.set(
            vec![
                ("fan".into(), f.name.clone()),
                ("Hostname".into(), host.to_owned()),
            ],
            f64::from(f.rpm),
        );
    }
    fans.register(registry);
}

fn network_metrics(registry: &mut Registry, report: &GpuNodeReportStatus, host: &str) {
    let Some(network) = &report.network else { return };
    for (name, help, value) in PORT_METRICS {
        let mut family = GaugeFamily::new(name, help);
        for d in &network.rdma_devices {
            if let Some(v) = value(d) {
                family.set(port_labels(d, host), v);
            }
        }
        family.register(registry);
    }
    let mut pfc = GaugeFamily::new("gpunode_rdma_pfc_enabled", "PFC enabled on the priority (1).");
    let mut ecn = GaugeFamily::new(
        "gpunode_rdma_ecn_enabled",
        "ECN enabled on the priority (1); absent when unknown.",
    );
    let mut pause = GaugeFamily::new(
        "gpunode_rdma_pfc_pause_frames",
        "PFC pause frames per priority and direction.",
    );
    for d in &network.rdma_devices {
        for p in 0..8u8 {
            if let Some(list) = &d.pfc_priorities {
                pfc.set(
                    with(port_labels(d, host), "priority", p),
                    bool_f(list.contains(&p)),
                );
            }
            if let Some(list) = &d.ecn_priorities {
                ecn.set(
                    with(port_labels(d, host), "priority", p),
                    bool_f(list.contains(&p)),
                );
            }
        }
        for c in &d.pfc_pause {
            let labels = with(port_labels(d, host), "priority", c.priority);
            pause.set(with(labels.clone(), "direction", "rx"), c.rx as f64);
            pause.set(with(labels, "direction", "tx"), c.tx as f64);
        }
    }
    pfc.register(registry);
    ecn.register(registry);
    pause.register(registry);
}

/// Whether the XIDs of this boot survive a probe restart, and what became of the state file.
fn xid_state_metrics(registry: &mut Registry, p: &crate::nvml::Persistence, host: &str) {
    let node = || vec![("Hostname".to_owned(), host.to_owned())];
    let mut enabled = GaugeFamily::new(
        "gpunode_probe_xid_state_enabled",
        "XIDs of this boot are kept in the state directory across probe restarts (1) or in memory only (0).",
    );
    enabled.set(node(), bool_f(p.enabled));
    enabled.register(registry);
    if !p.enabled {
        return;
    }
    let mut restored = GaugeFamily::new(
        "gpunode_probe_xid_state_restored",
        "XIDs of this boot restored from the state file at start.",
    );
    restored.set(node(), p.restored as f64);
    restored.register(registry);
    let ignored = Family::<Labels, Counter>::default();
    if let Some(reason) = p.ignored {
        ignored.get_or_create(&with(node(), "reason", reason)).inc();
    }
    registry.register(
        "gpunode_probe_xid_state_ignored",
        "State files not restored at start, by reason (missing, unreadable, too_large, corrupt, other_boot, other_node).",
        ignored,
    );
    let failures = Family::<Labels, Counter>::default();
    failures.get_or_create(&node()).inc_by(p.save_failures);
    registry.register(
        "gpunode_probe_xid_state_save_failures",
        "Failed writes of the XID state file.",
        failures,
    );
}

/// The Prometheus text exposition of the probe's state.
pub fn render(state: &ProbeState) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let host = state.node();
    if let Some(report) = state.latest() {
        node_metrics(&mut registry, &report, host);
        gpu_metrics(&mut registry, &report, host);
        cooling_metrics(&mut registry, &report, host);
        network_metrics(&mut registry, &report, host);
        if let Some(xids) = state.xids() {
            let mut family = GaugeFamily::new(
                "DCGM_EXP_XID_ERRORS_COUNT",
                "XIDs received since the probe started.",
            );
            for ((index, xid), count) in xids.counts() {
                let labels = report.gpus.iter().find(|g| g.index == index).map_or_else(
                    || vec![("gpu".into(), index.to_string())],
                    |g| gpu_labels(g, host),
                );
                family.set(with(labels, "xid", xid), count as f64);
            }
            family.register(&mut registry);
        }
    }
    if let Some(xids) = state.xids() {
        xid_state_metrics(&mut registry, &xids.persistence(), host);
    }
    let (ok, failed) = state.publishes();
    let publishes = Family::<Labels, Counter>::default();
    publishes
        .get_or_create(&vec![("result".into(), "ok".into())])
        .inc_by(ok);
    publishes
        .get_or_create(&vec![("result".into(), "error".into())])
        .inc_by(failed);
    registry.register("gpunode_publish", "Report publishes by result.", publishes);
    let synced = Gauge::<i64>::default();
    let policies = Gauge::<i64>::default();
    match state.policies() {
        Some(n) => {
            synced.set(1);
            policies.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        None => {
            synced.set(0);
        }
    }
    registry.register(
        "gpunode_probe_policy_watch_synced",
        "1 while the probe knows the GpuNodePolicies and publishes by the operator's checks; 0 while it falls back to temperature bands (watch not listed yet, failed, or forbidden by RBAC).",
        synced,
    );
    registry.register(
        "gpunode_probe_policies",
        "GpuNodePolicies the publish decision evaluates (while synced).",
        policies,
    );
    let errors = Counter::<u64>::default();
    errors.inc_by(state.policy_watch_errors());
    registry.register(
        "gpunode_probe_policy_watch_errors",
        "Failed lists and watches of GpuNodePolicies.",
        errors,
    );
    let mut out = String::new();
    encode(&mut out, &registry)?;
    Ok(out)
}

async fn metrics(State(state): State<Arc<ProbeState>>) -> impl IntoResponse {
    match render(&state) {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn healthz(State(state): State<Arc<ProbeState>>) -> impl IntoResponse {
    if state.healthy() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no recent observation\n")
    }
}

/// Binds `addr` and serves `/metrics` and `/healthz` until `shutdown` completes. Returns the
/// bound address (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    state: Arc<ProbeState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(state);
    let task = tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(shutdown).await });
    Ok((bound, task))
}
