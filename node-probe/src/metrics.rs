//! `/metrics` and `/healthz`.
//!
//! GPU series are named `gpunode_probe_gpu_*`, never after DCGM fields: dcgm-exporter often runs
//! on the same node, and a dashboard summing a shared name would count each GPU twice (README
//! "Metrics and alerts" maps each series to its DCGM field). They keep dcgm-exporter's labels
//! (`gpu`, `UUID`, `pci_bus_id`, `modelName`, `Hostname`), so the two join on `UUID`. The
//! exposition is rendered from the latest observation on each scrape, so a GPU or port that
//! disappears leaves no stale series. [`exported_series`] lists every series name it can hold.

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

/// A counter family being filled: the report holds each counter's current value, so it is set
/// (once, on a fresh registry per scrape) rather than incremented.
struct CounterFamily {
    name: &'static str,
    help: &'static str,
    family: Family<Labels, Counter<f64, AtomicU64>>,
    used: bool,
}

impl CounterFamily {
    fn new(name: &'static str, help: &'static str) -> Self {
        CounterFamily {
            name,
            help,
            family: Family::default(),
            used: false,
        }
    }

    fn set(&mut self, labels: Labels, value: f64) {
        self.family.get_or_create(&labels).inc_by(value);
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

/// How a per-GPU value is exposed: a gauge, or a counter (exposed with `_total`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

/// A per-GPU series: name (without `_total` for counters), help, kind, value.
type GpuMetric = (&'static str, &'static str, Kind, fn(&GpuStatus) -> Option<f64>);

/// Bytes in a MiB: the report keeps memory in MiB, the metric in bytes (a base unit).
const MIB: f64 = 1024.0 * 1024.0;

// gpunode's own names, not the DCGM field names: on a node that also runs dcgm-exporter, series
// of the same name would be summed twice by every dashboard. README "Metrics and alerts" maps
// each to the DCGM field it corresponds to.
const GPU_METRICS: &[GpuMetric] = &[
    (
        "gpunode_probe_gpu_temperature_celsius",
        "GPU temperature (in C).",
        Kind::Gauge,
        |g| g.temperature_celsius.map(f64::from),
    ),
    (
        "gpunode_probe_gpu_memory_temperature_celsius",
        "Memory temperature (in C).",
        Kind::Gauge,
        |g| g.memory_temperature_celsius.map(f64::from),
    ),
    (
        "gpunode_probe_gpu_slowdown_temperature_celsius",
        "Slowdown temperature threshold (in C).",
        Kind::Gauge,
        |g| g.slowdown_celsius.map(f64::from),
    ),
    (
        "gpunode_probe_gpu_shutdown_temperature_celsius",
        "Shutdown temperature threshold (in C).",
        Kind::Gauge,
        |g| g.shutdown_celsius.map(f64::from),
    ),
    (
        "gpunode_probe_gpu_slowdown_margin_celsius",
        "Margin to the slowdown threshold (in C).",
        Kind::Gauge,
        |g| Some(f64::from(g.slowdown_celsius? - g.temperature_celsius?)),
    ),
    (
        "gpunode_probe_gpu_power_watts",
        "Power draw (in W).",
        Kind::Gauge,
        |g| g.power_watts.map(f64::from),
    ),
    (
        "gpunode_probe_gpu_power_limit_watts",
        "Enforced power limit (in W).",
        Kind::Gauge,
        |g| g.power_limit_watts.map(f64::from),
    ),
    (
        "gpunode_probe_gpu_memory_bytes",
        "Framebuffer memory (in bytes).",
        Kind::Gauge,
        |g| g.memory_mib.map(|m| m as f64 * MIB),
    ),
    (
        "gpunode_probe_gpu_ecc_enabled",
        "ECC mode (1 = enabled).",
        Kind::Gauge,
        |g| enabled(g.ecc_mode),
    ),
    (
        "gpunode_probe_gpu_ecc_volatile_corrected_errors",
        "Corrected ECC errors since the driver loaded.",
        Kind::Counter,
        |g| g.ecc.as_ref().map(|e| e.volatile_corrected as f64),
    ),
    (
        "gpunode_probe_gpu_ecc_volatile_uncorrected_errors",
        "Uncorrected ECC errors since the driver loaded.",
        Kind::Counter,
        |g| g.ecc.as_ref().map(|e| e.volatile_uncorrected as f64),
    ),
    (
        "gpunode_probe_gpu_ecc_aggregate_corrected_errors",
        "Corrected ECC errors over the GPU's life.",
        Kind::Counter,
        |g| g.ecc.as_ref().map(|e| e.aggregate_corrected as f64),
    ),
    (
        "gpunode_probe_gpu_ecc_aggregate_uncorrected_errors",
        "Uncorrected ECC errors over the GPU's life.",
        Kind::Counter,
        |g| g.ecc.as_ref().map(|e| e.aggregate_uncorrected as f64),
    ),
    (
        "gpunode_probe_gpu_retired_pages_single_bit",
        "Pages retired for single-bit errors.",
        Kind::Gauge,
        |g| g.retired_pages.as_ref().map(|r| r.single_bit as f64),
    ),
    (
        "gpunode_probe_gpu_retired_pages_double_bit",
        "Pages retired for double-bit errors.",
        Kind::Gauge,
        |g| g.retired_pages.as_ref().map(|r| r.double_bit as f64),
    ),
    (
        "gpunode_probe_gpu_retired_pages_pending",
        "Page retirement pending (1 = yes).",
        Kind::Gauge,
        |g| g.retired_pages.as_ref().map(|r| bool_f(r.pending)),
    ),
    (
        "gpunode_probe_gpu_remapped_rows_correctable",
        "Rows remapped for correctable errors.",
        Kind::Gauge,
        |g| g.remapped_rows.as_ref().map(|r| r.correctable as f64),
    ),
    (
        "gpunode_probe_gpu_remapped_rows_uncorrectable",
        "Rows remapped for uncorrectable errors.",
        Kind::Gauge,
        |g| g.remapped_rows.as_ref().map(|r| r.uncorrectable as f64),
    ),
    (
        "gpunode_probe_gpu_row_remap_pending",
        "Row remap pending (1 = yes).",
        Kind::Gauge,
        |g| g.remapped_rows.as_ref().map(|r| bool_f(r.pending)),
    ),
    (
        "gpunode_probe_gpu_row_remap_failed",
        "Row remap failed (1 = yes).",
        Kind::Gauge,
        |g| g.remapped_rows.as_ref().map(|r| bool_f(r.failure)),
    ),
    (
        "gpunode_probe_gpu_clocks_event_reasons",
        "Clock throttle reasons (NVML bitmask).",
        Kind::Gauge,
        |g| {
            let mask = ThrottleReason::BITS
                .iter()
                .filter(|(r, _)| g.throttle_reasons.contains(r))
                .map(|(_, b)| b);
            Some(mask.fold(0u64, |acc, b| acc | b) as f64)
        },
    ),
    (
        "gpunode_probe_gpu_pcie_link_generation",
        "PCIe link generation.",
        Kind::Gauge,
        |g| g.pcie.as_ref().map(|p| f64::from(p.current_generation)),
    ),
    (
        "gpunode_probe_gpu_pcie_link_width",
        "PCIe link width (lanes).",
        Kind::Gauge,
        |g| g.pcie.as_ref().map(|p| f64::from(p.current_width)),
    ),
    (
        "gpunode_probe_gpu_pcie_max_link_generation",
        "Maximum PCIe link generation.",
        Kind::Gauge,
        |g| g.pcie.as_ref().map(|p| f64::from(p.max_generation)),
    ),
    (
        "gpunode_probe_gpu_pcie_max_link_width",
        "Maximum PCIe link width (lanes).",
        Kind::Gauge,
        |g| g.pcie.as_ref().map(|p| f64::from(p.max_width)),
    ),
    (
        "gpunode_probe_gpu_pcie_replays",
        "PCIe replays.",
        Kind::Counter,
        |g| g.pcie.as_ref().map(|p| p.replay_counter as f64),
    ),
    (
        "gpunode_probe_gpu_persistence_mode_enabled",
        "Persistence mode (1 = enabled).",
        Kind::Gauge,
        |g| enabled(g.persistence_mode),
    ),
    (
        "gpunode_probe_gpu_mig_mode_enabled",
        "MIG mode (1 = enabled).",
        Kind::Gauge,
        |g| enabled(g.mig_mode),
    ),
    (
        "gpunode_probe_gpu_last_xid",
        "Last XID seen on the GPU.",
        Kind::Gauge,
        |g| g.xids.last().map(|x| f64::from(x.xid)),
    ),
    (
        "gpunode_probe_gpu_nvlinks_active",
        "NVLinks up.",
        Kind::Gauge,
        |g| g.nvlink.as_ref().map(|n| f64::from(n.active)),
    ),
    (
        "gpunode_probe_gpu_nvlinks",
        "NVLinks the GPU has.",
        Kind::Gauge,
        |g| g.nvlink.as_ref().map(|n| f64::from(n.total)),
    ),
    (
        "gpunode_probe_gpu_field_errors",
        "GPU fields NVML could not read.",
        Kind::Gauge,
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
    for &(name, help, kind, value) in GPU_METRICS {
        match kind {
            Kind::Gauge => {
                let mut family = GaugeFamily::new(name, help);
                for gpu in &report.gpus {
                    if let Some(v) = value(gpu) {
                        family.set(gpu_labels(gpu, host), v);
                    }
                }
                family.register(registry);
            }
            Kind::Counter => {
                let mut family = CounterFamily::new(name, help);
                for gpu in &report.gpus {
                    if let Some(v) = value(gpu) {
                        family.set(gpu_labels(gpu, host), v);
                    }
                }
                family.register(registry);
            }
        }
    }
    let mut reasons = GaugeFamily::new(
        "gpunode_probe_gpu_throttle_reason",
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
    let mut errors = GaugeFamily::new(
        "gpunode_rdma_port_errors_last_hour",
        "How much each port error counter rose over the last hour (the report's errorRates), by kernel counter name.",
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
        port_error_counts(&mut errors, d, host);
    }
    pfc.register(registry);
    ecn.register(registry);
    pause.register(registry);
    errors.register(registry);
}

/// One series per error counter the port reports (at most 11 per port: bounded).
fn port_error_counts(family: &mut GaugeFamily, d: &RdmaDevice, host: &str) {
    let Some(rates) = &d.error_rates else { return };
    for counter in gpunode_crds::ErrorCounter::ALL {
        if let Some(count) = rates.get(counter) {
            family.set(
                with(port_labels(d, host), "counter", counter.kernel_name()),
                count as f64,
            );
        }
    }
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

/// Series registered outside the GPU and port tables, as exposed (counters with `_total`).
const OTHER_SERIES: &[&str] = &[
    "gpunode_gpu_count",
    "gpunode_throttled_gpus",
    "gpunode_collector_up",
    "gpunode_collector_duration_seconds",
    "gpunode_probe_gpu_throttle_reason",
    "gpunode_probe_gpu_xid_errors_total",
    "gpunode_sensor_celsius",
    "gpunode_sensor_crit_celsius",
    "gpunode_fan_rpm",
    "gpunode_rdma_pfc_enabled",
    "gpunode_rdma_ecn_enabled",
    "gpunode_rdma_pfc_pause_frames",
    "gpunode_rdma_port_errors_last_hour",
    "gpunode_probe_xid_state_enabled",
    "gpunode_probe_xid_state_restored",
    "gpunode_probe_xid_state_ignored_total",
    "gpunode_probe_xid_state_save_failures_total",
    "gpunode_publish_total",
    "gpunode_probe_policy_watch_synced",
    "gpunode_probe_policies",
    "gpunode_probe_policy_watch_errors_total",
];

/// Every series name [`render`] can expose, as Prometheus stores it (counters with `_total`).
/// Kept equal to what a fully populated state renders by this module's tests, so other code
/// (the chart's coexistence test with dcgm-exporter) can rely on it.
pub fn exported_series() -> Vec<String> {
    let gpu = GPU_METRICS.iter().map(|&(name, _, kind, _)| match kind {
        Kind::Gauge => name.to_owned(),
        Kind::Counter => format!("{name}_total"),
    });
    let port = PORT_METRICS.iter().map(|&(name, _, _)| name.to_owned());
    gpu.chain(port)
        .chain(OTHER_SERIES.iter().map(|&n| n.to_owned()))
        .collect()
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
            let mut family = CounterFamily::new(
                "gpunode_probe_gpu_xid_errors",
                "XIDs received since the probe started, by GPU and XID.",
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use super::*;
    use crate::nvml::XidLog;
    use crate::xid_state::XidStore;

    /// A report in which every field the metrics read is set.
    fn full_report() -> GpuNodeReportStatus {
        serde_json::from_value(serde_json::json!({
            "gpuCount": 1,
            "throttledGpus": 1,
            "collectors": [{"name": "nvml", "ok": true, "durationMs": 12}],
            "gpus": [{
                "index": 0,
                "uuid": "GPU-0",
                "product": "NVIDIA H100 80GB HBM3",
                "pciBusId": "00000000:1B:00.0",
                "memoryMiB": 81559,
                "eccMode": "Enabled",
                "ecc": {"volatileCorrected": 1, "volatileUncorrected": 0,
                        "aggregateCorrected": 12, "aggregateUncorrected": 0},
                "retiredPages": {"singleBit": 1, "doubleBit": 0, "pending": false},
                "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
                "temperatureCelsius": 41,
                "memoryTemperatureCelsius": 45,
                "slowdownCelsius": 89,
                "shutdownCelsius": 92,
                "powerWatts": 71,
                "powerLimitWatts": 700,
                "throttleReasons": ["HwThermalSlowdown"],
                "pcie": {"currentGeneration": 5, "maxGeneration": 5, "currentWidth": 16,
                         "maxWidth": 16, "replayCounter": 3},
                "nvlink": {"active": 18, "total": 18},
                "persistenceMode": "Enabled",
                "migMode": "Disabled",
                "xids": [{"xid": 79, "at": "2025-01-01T00:00:00Z"}],
                "errors": [{"field": "fanSpeed", "reason": "NVML: NotSupported"}]
            }],
            "cooling": {
                "sensors": [{"chip": "nvme", "label": "Composite", "celsius": 40.0, "critCelsius": 85.0}],
                "fans": [{"name": "fan1", "rpm": 9000}]
            },
            "network": {"rdmaDevices": [{
                "device": "mlx5_0", "port": 1, "netdev": "eth0", "state": "Active",
                "rateGbps": 400, "mtu": 9000, "roceV2Gid": true,
                "pfcPriorities": [3], "ecnPriorities": [3],
                "pfcPause": [{"priority": 3, "rx": 1, "tx": 2}],
                "errorRates": {"windowMinutes": 60, "linkDowned": 1, "symbolErrors": 12},
                "errors": [{"field": "trust", "reason": "unreadable"}]
            }]}
        }))
        .unwrap()
    }

    /// The metric name of each sample line of an exposition.
    fn sample_names(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.split(['{', ' ']).next())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn exported_series_are_exactly_what_a_full_state_renders() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = dir.path().join("proc");
        std::fs::create_dir_all(proc_root.join("sys/kernel/random")).unwrap();
        std::fs::write(proc_root.join("sys/kernel/random/boot_id"), "b-1\n").unwrap();
        let store = XidStore::open(&dir.path().join("state"), "node-a", &proc_root).unwrap();
        let xids = Arc::new(XidLog::persistent(store));
        xids.record(0, 79, jiff::Timestamp::UNIX_EPOCH);
        let state = ProbeState::new("node-a", Duration::from_secs(60), Some(xids));
        state.set_latest(full_report());
        state.set_policies(Some(1));
        state.record_publish(true);

        let rendered = sample_names(&render(&state).unwrap());
        let listed: Vec<String> = exported_series();
        let listed_set: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(listed.len(), listed_set.len(), "a name listed twice: {listed:?}");
        assert_eq!(
            rendered.difference(&listed_set).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "rendered but not in exported_series()"
        );
        assert_eq!(
            listed_set.difference(&rendered).collect::<Vec<_>>(),
            Vec::<&String>::new(),
            "in exported_series() but not rendered by a full state"
        );
    }

    #[test]
    fn gpu_series_use_base_units_and_counters_end_in_total() {
        let state = ProbeState::new(
            "node-a",
            Duration::from_secs(60),
            Some(Arc::new(XidLog::default())),
        );
        state.set_latest(full_report());
        let text = render(&state).unwrap();
        let sample = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name}{{")))
                .unwrap_or_else(|| panic!("no {name} in:\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        // The report's MiB, exposed in bytes.
        assert_eq!(
            sample("gpunode_probe_gpu_memory_bytes"),
            81559.0 * 1024.0 * 1024.0
        );
        assert_eq!(sample("gpunode_probe_gpu_temperature_celsius"), 41.0);
        assert_eq!(sample("gpunode_probe_gpu_slowdown_margin_celsius"), 48.0);
        assert_eq!(sample("gpunode_probe_gpu_pcie_replays_total"), 3.0);
        assert_eq!(
            sample("gpunode_probe_gpu_ecc_aggregate_corrected_errors_total"),
            12.0
        );
        assert!(
            text.contains("# TYPE gpunode_probe_gpu_pcie_replays counter"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE gpunode_probe_gpu_temperature_celsius gauge"),
            "{text}"
        );
        // dcgm-exporter's labels stay, so the two join on UUID.
        assert!(text.contains("UUID=\"GPU-0\""), "{text}");
        for name in sample_names(&text) {
            assert!(
                name.starts_with("gpunode_"),
                "{name} is not one of gpunode's names"
            );
        }
    }
}
