//! Whether a new observation differs materially from the last published one: the pure decision
//! behind "publish now" versus "wait for the refresh" ([`decide`]).
//!
//! # The contract with the operator
//!
//! The probe learns every GpuNodePolicy (a read-only watch, [`crate::policies`]) and runs the
//! operator's own evaluator on them ([`gpunode_checks::evaluate`], the code the operator acts
//! on, not a copy). An observation is published at once when, for any known policy, the verdict
//! on it differs from the verdict on the last published report in anything the operator decides
//! on ([`Decides`]): the state, the set of drifts (class, check, GPU, device) and the set of
//! unknown checks (check, GPU). So every value a check reads, at every threshold a policy can
//! set, reaches the operator as soon as it is observed. Discrete changes of the report (the
//! list below without its temperature bands: throttle reasons, counters, links, collector
//! health...) are also written at once, as they always were, for the report's readers. What
//! waits for `--report-refresh` (10m): the free text of a drift ("got 86 C" becoming "got 87
//! C"), temperature and power noise that crosses no policy's threshold, timestamps. Both reports are judged fresh and at the same instant, so staleness and XID windows
//! (which the operator tracks itself) never cause a write.
//!
//! A write that only takes findings away (a drift or unknown clearing, nothing new) waits until
//! `--recovery-gap` (2m) has passed since the previous report write: a value sitting on a
//! threshold would otherwise write on every flip. A new drift or unknown is never delayed; the
//! operator holds a cleared class for `recovery.healthyFor` anyway.
//!
//! # Fallback
//!
//! Until the policy watch has listed once, after it fails, or when RBAC forbids it, the probe
//! does not know what the operator checks and falls back to [`material_changes`]: anything a
//! check could flip on — collector health, inventory, driver, modes, throttle reasons, XIDs,
//! ECC / retirement / remap counters, PCIe and NVLink state, NVSwitch fabric state, RDMA port
//! state and lossless settings, field errors appearing or clearing, temperatures crossing a
//! band (margin to slowdown for GPUs, absolute for HBM and chassis sensors) by more than the
//! hysteresis, and a port's or an NVLink's error counts over the last hour reaching another
//! order of magnitude ([`level_crossed`]). Not material there: temperature noise inside a band,
//! error counts moving within their order of magnitude, power draw, PCIe replay and pause
//! counters, timestamps. A threshold between two band edges can then wait for the refresh.
//! With the policies known, error counts matter only through the verdict (a port or a link
//! going over or back under a budget), so counters moving at healthy rates never write.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use gpunode_checks::evaluate::evaluate_heard;
use gpunode_checks::verdict::{NodeState, Verdict};
use gpunode_crds::nvlink::NvlinkErrorRates;
use gpunode_crds::report::{
    CoolingStatus, FieldError, GpuNodeReport, GpuNodeReportStatus, GpuStatus, NetworkStatus, NvlinkStatus,
    PcieStatus, RdmaDevice, SensorReading,
};
use gpunode_crds::{DriftClass, ErrorCounter, GpuNodePolicySpec, GpuNodeReportSpec, NvlinkCounter};
use jiff::Timestamp;

/// Temperature bands used to decide when a temperature change matters.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangeConfig {
    /// Edges (°C of margin to the slowdown threshold) between GPU temperature bands.
    pub margin_edges: Vec<i32>,
    /// Edges (°C) between HBM temperature bands.
    pub memory_edges: Vec<i32>,
    /// Width (°C) of chassis sensor bands.
    pub sensor_band: f64,
    /// How far (°C) past an edge a temperature must move before the move counts.
    pub hysteresis: f64,
}

impl Default for ChangeConfig {
    fn default() -> Self {
        ChangeConfig {
            margin_edges: vec![0, 3, 5, 10, 15],
            memory_edges: vec![80, 85, 90, 95],
            sensor_band: 5.0,
            hysteresis: 1.0,
        }
    }
}

/// One material difference, for logs and the publish span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Nothing was published yet.
    First,
    /// A node-level value (driver, CUDA, GPU count, boot id, collector health).
    Node(&'static str),
    /// A GPU appeared or disappeared.
    GpuSet,
    /// A GPU value.
    Gpu {
        /// NVML index.
        index: u32,
        /// Which value.
        what: &'static str,
    },
    /// Cooling sensors or fans.
    Cooling(&'static str),
    /// The operator's verdict under a policy differs from the one on the last published report.
    Verdict {
        /// The policy's name.
        policy: String,
        /// Findings the published report does not have (drifts, unknowns), or a worse state:
        /// published without delay.
        worse: bool,
        /// What differs, briefly.
        what: String,
    },
    /// An RDMA port.
    Port {
        /// `mlx5_0/1`.
        port: String,
        /// Which value.
        what: &'static str,
    },
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::First => f.write_str("first observation"),
            Change::Node(what) => write!(f, "{what} changed"),
            Change::GpuSet => f.write_str("GPU set changed"),
            Change::Gpu { index, what } => write!(f, "GPU {index}: {what} changed"),
            Change::Cooling(what) => write!(f, "cooling: {what} changed"),
            Change::Verdict { policy, what, .. } => write!(f, "policy {policy}: {what}"),
            Change::Port { port, what } => write!(f, "{port}: {what} changed"),
        }
    }
}

impl Change {
    /// A temperature moving across a band edge (GPU margin, HBM, chassis sensor band).
    pub fn is_temperature_band(&self) -> bool {
        matches!(
            self,
            Change::Gpu {
                what: "temperature band" | "memory temperature band",
                ..
            } | Change::Cooling("sensor temperature band")
        )
    }

    /// A port's or an NVLink's error counts moving to another order of magnitude
    /// ([`level_crossed`]).
    pub fn is_error_level(&self) -> bool {
        matches!(
            self,
            Change::Port {
                what: "error count level",
                ..
            } | Change::Gpu {
                what: "NVLink error count level",
                ..
            }
        )
    }

    /// Whether the change may wait for `--recovery-gap`: only a verdict that lost findings and
    /// gained none. Everything else, including every fallback change, is published at once.
    pub fn is_recovery(&self) -> bool {
        matches!(self, Change::Verdict { worse: false, .. })
    }
}

/// A policy the probe knows from its watch.
#[derive(Debug, Clone, PartialEq)]
pub struct KnownPolicy {
    /// `metadata.name`.
    pub name: String,
    /// The spec the operator evaluates.
    pub spec: GpuNodePolicySpec,
}

/// Everything in a [`Verdict`] that the operator's plan decides on: the state, which drifts (by
/// class, check, GPU and device) and which checks are unknown (by check and GPU). Not the free
/// text (`expected`, `actual`, an unknown's `reason`), which changes with every reading while a
/// value stays on the wrong side of a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decides {
    /// Compliant, Drifted or Unknown.
    pub state: NodeState,
    /// (class, check, GPU, device) of every drift.
    pub drifts: BTreeSet<(DriftClass, String, Option<u32>, Option<String>)>,
    /// (check, GPU) of every unknown check.
    pub unknowns: BTreeSet<(String, Option<u32>)>,
}

impl Decides {
    /// What the operator decides on from `verdict`.
    pub fn of(verdict: &Verdict) -> Decides {
        Decides {
            state: verdict.state,
            drifts: verdict
                .drifts
                .iter()
                .map(|d| (d.class, d.check.clone(), d.gpu, d.device.clone()))
                .collect(),
            unknowns: verdict
                .unknowns
                .iter()
                .map(|u| (u.check.clone(), u.gpu))
                .collect(),
        }
    }
}

/// The operator's verdict under `policy` on a report with `status`, judged fresh at `now`: the
/// probe is alive (it is the one asking), and staleness is the heartbeat's business.
pub fn verdict_at(policy: &GpuNodePolicySpec, status: &GpuNodeReportStatus, now: Timestamp) -> Verdict {
    let report = GpuNodeReport {
        metadata: Default::default(),
        spec: GpuNodeReportSpec::default(),
        status: Some(status.clone()),
    };
    evaluate_heard(policy, Some(&report), Some(now), now)
}

/// Every policy under which the operator would decide differently on `next` than on `prev`.
pub fn verdict_changes(
    prev: &GpuNodeReportStatus,
    next: &GpuNodeReportStatus,
    policies: &[KnownPolicy],
    now: Timestamp,
) -> Vec<Change> {
    let mut out = Vec::new();
    for policy in policies {
        let a = Decides::of(&verdict_at(&policy.spec, prev, now));
        let b = Decides::of(&verdict_at(&policy.spec, next, now));
        if a == b {
            continue;
        }
        let rank = |s: NodeState| match s {
            NodeState::Compliant => 0,
            NodeState::Unknown => 1,
            NodeState::Drifted => 2,
        };
        let new_drifts: Vec<_> = b.drifts.difference(&a.drifts).collect();
        let new_unknowns: Vec<_> = b.unknowns.difference(&a.unknowns).collect();
        let worse = !new_drifts.is_empty() || !new_unknowns.is_empty() || rank(b.state) > rank(a.state);
        let mut what = vec![format!("{} -> {}", a.state, b.state)];
        what.extend(
            new_drifts
                .iter()
                .map(|(_, check, gpu, device)| format!("+{check}{}", subject(*gpu, device.as_deref()))),
        );
        what.extend(
            new_unknowns
                .iter()
                .map(|(check, gpu)| format!("+{check}{} unknown", subject(*gpu, None))),
        );
        let gone = a.drifts.difference(&b.drifts).count() + a.unknowns.difference(&b.unknowns).count();
        if gone > 0 {
            what.push(format!("{gone} cleared"));
        }
        out.push(Change::Verdict {
            policy: policy.name.clone(),
            worse,
            what: what.join(", "),
        });
    }
    out
}

fn subject(gpu: Option<u32>, device: Option<&str>) -> String {
    match (gpu, device) {
        (Some(g), Some(d)) => format!(" (gpu {g} {d})"),
        (Some(g), None) => format!(" (gpu {g})"),
        (None, Some(d)) => format!(" ({d})"),
        (None, None) => String::new(),
    }
}

/// The probe's decision: what makes `next` worth publishing at once, given the last published
/// observation `prev` (empty: it waits for the refresh). With the policies known (`Some`, even
/// none), the [`verdict_changes`] plus the discrete [`material_changes`] (no temperature
/// bands); without (`None`: the watch has not listed, failed, or is forbidden), all of
/// [`material_changes`].
pub fn decide(
    prev: &GpuNodeReportStatus,
    next: &GpuNodeReportStatus,
    policies: Option<&[KnownPolicy]>,
    cfg: &ChangeConfig,
    now: Timestamp,
) -> Vec<Change> {
    let mut changes = material_changes(prev, next, cfg);
    if let Some(policies) = policies {
        // The policies say exactly which temperatures matter; bands would only add writes on
        // noise. Discrete changes (throttling, counters, links, ...) stay immediate for the
        // report's readers, as without policies.
        // The same for the fabric error counts: the policies' budgets say which counts matter.
        changes.retain(|c| !c.is_temperature_band() && !c.is_error_level());
        changes.extend(verdict_changes(prev, next, policies, now));
    }
    changes
}

/// Every material difference between the last published observation and the new one
/// (empty: only noise changed). The fallback of [`decide`] when no policy is known.
pub fn material_changes(
    prev: &GpuNodeReportStatus,
    next: &GpuNodeReportStatus,
    cfg: &ChangeConfig,
) -> Vec<Change> {
    let mut out = Vec::new();
    let collectors = |r: &GpuNodeReportStatus| {
        r.collectors
            .iter()
            .map(|c| (c.name, c.ok))
            .collect::<BTreeSet<_>>()
    };
    if collectors(prev) != collectors(next) {
        out.push(Change::Node("collector health"));
    }
    if prev.boot_id != next.boot_id {
        out.push(Change::Node("boot id"));
    }
    if prev.driver_version != next.driver_version || prev.cuda_version != next.cuda_version {
        out.push(Change::Node("driver version"));
    }
    if prev.gpu_count != next.gpu_count || prev.throttled_gpus != next.throttled_gpus {
        out.push(Change::Node("GPU counts"));
    }
    let indexes = |r: &GpuNodeReportStatus| r.gpus.iter().map(|g| g.index).collect::<Vec<_>>();
    if indexes(prev) != indexes(next) {
        out.push(Change::GpuSet);
    }
    for (a, b) in prev
        .gpus
        .iter()
        .zip(&next.gpus)
        .filter(|(a, b)| a.index == b.index)
    {
        gpu_changes(a, b, cfg, &mut out);
    }
    cooling_changes(prev.cooling.as_ref(), next.cooling.as_ref(), cfg, &mut out);
    network_changes(prev.network.as_ref(), next.network.as_ref(), &mut out);
    out
}

fn error_fields(errors: &[FieldError]) -> BTreeSet<&str> {
    errors.iter().map(|e| e.field.as_str()).collect()
}

/// Link state of a PCIe status, without the (cumulative) replay counter.
fn pcie_link(p: &Option<PcieStatus>) -> Option<(u32, u32, u32, u32)> {
    p.as_ref().map(|p| {
        (
            p.current_generation,
            p.max_generation,
            p.current_width,
            p.max_width,
        )
    })
}

fn gpu_changes(a: &GpuStatus, b: &GpuStatus, cfg: &ChangeConfig, out: &mut Vec<Change>) {
    let mut changed = |what: &'static str, differs: bool| {
        if differs {
            out.push(Change::Gpu { index: b.index, what });
        }
    };
    changed(
        "identity",
        a.uuid != b.uuid || a.product != b.product || a.pci_bus_id != b.pci_bus_id,
    );
    changed("memory size", a.memory_mib != b.memory_mib);
    changed("ECC mode", a.ecc_mode != b.ecc_mode);
    changed("ECC counters", a.ecc != b.ecc);
    changed("retired pages", a.retired_pages != b.retired_pages);
    changed("remapped rows", a.remapped_rows != b.remapped_rows);
    changed(
        "thresholds",
        a.slowdown_celsius != b.slowdown_celsius || a.shutdown_celsius != b.shutdown_celsius,
    );
    changed("power limit", a.power_limit_watts != b.power_limit_watts);
    changed("throttle reasons", a.throttle_reasons != b.throttle_reasons);
    changed("PCIe link", pcie_link(&a.pcie) != pcie_link(&b.pcie));
    changed("NVLink", nvlink_links(&a.nvlink) != nvlink_links(&b.nvlink));
    changed("NVLink error count level", nvlink_levels_crossed(a, b));
    changed("fabric", a.fabric != b.fabric);
    changed("persistence mode", a.persistence_mode != b.persistence_mode);
    changed("MIG mode", a.mig_mode != b.mig_mode);
    changed("XIDs", a.xids != b.xids);
    changed("pods", a.pods != b.pods);
    changed("field errors", error_fields(&a.errors) != error_fields(&b.errors));
    let margin = |g: &GpuStatus| Some(f64::from(g.slowdown_celsius? - g.temperature_celsius?));
    let edges: Vec<f64> = cfg.margin_edges.iter().map(|e| f64::from(*e)).collect();
    changed(
        "temperature band",
        crossed(margin(a), margin(b), &edges, cfg.hysteresis),
    );
    let memory = |g: &GpuStatus| g.memory_temperature_celsius.map(f64::from);
    let edges: Vec<f64> = cfg.memory_edges.iter().map(|e| f64::from(*e)).collect();
    changed(
        "memory temperature band",
        crossed(memory(a), memory(b), &edges, cfg.hysteresis),
    );
}

/// Whether a reading crossed an edge and got at least `hysteresis` past it: down from at or
/// above an edge to `edge - hysteresis` or below, or up from below it to `edge + hysteresis` or
/// above. Since the comparison is with the last *published* reading, a value flapping around an
/// edge publishes once, then stays quiet. A reading appearing or disappearing counts (that is
/// also a field error change).
pub fn crossed(prev: Option<f64>, next: Option<f64>, edges: &[f64], hysteresis: f64) -> bool {
    match (prev, next) {
        (Some(p), Some(n)) => edges
            .iter()
            .any(|&e| (p >= e && n <= e - hysteresis) || (p < e && n >= e + hysteresis)),
        (None, None) => false,
        _ => true,
    }
}

fn cooling_changes(
    a: Option<&CoolingStatus>,
    b: Option<&CoolingStatus>,
    cfg: &ChangeConfig,
    out: &mut Vec<Change>,
) {
    let (a, b) = match (a, b) {
        (None, None) => return,
        (Some(a), Some(b)) => (a, b),
        _ => return out.push(Change::Cooling("availability")),
    };
    fn sensors(c: &CoolingStatus) -> BTreeMap<(&str, &str), &SensorReading> {
        c.sensors
            .iter()
            .map(|s| ((s.chip.as_str(), s.label.as_str()), s))
            .collect()
    }
    let (sa, sb) = (sensors(a), sensors(b));
    if sa.keys().ne(sb.keys()) {
        out.push(Change::Cooling("sensor set"));
    }
    let band_edges = |center: f64| -> Vec<f64> {
        // Edges every `sensor_band` degrees around the readings.
        let width = cfg.sensor_band.max(0.5);
        let base = (center / width).floor() * width;
        (-3..=3).map(|k| base + f64::from(k) * width).collect()
    };
    let mut crossed_band = false;
    let mut crossed_crit = false;
    for (key, s) in &sa {
        let Some(t) = sb.get(key) else { continue };
        crossed_band |= crossed(
            Some(s.celsius),
            Some(t.celsius),
            &band_edges(s.celsius),
            cfg.hysteresis,
        );
        let over = |c: f64, crit: Option<f64>| crit.is_some_and(|crit| c >= crit);
        crossed_crit |= over(s.celsius, s.crit_celsius) != over(t.celsius, t.crit_celsius);
    }
    if crossed_band {
        out.push(Change::Cooling("sensor temperature band"));
    }
    if crossed_crit {
        out.push(Change::Cooling("critical threshold"));
    }
    let fans = |c: &CoolingStatus| {
        c.fans
            .iter()
            .map(|f| (f.name.clone(), f.rpm > 0))
            .collect::<BTreeMap<_, _>>()
    };
    if fans(a) != fans(b) {
        out.push(Change::Cooling("fans"));
    }
    if error_fields(&a.errors) != error_fields(&b.errors) {
        out.push(Change::Cooling("field errors"));
    }
}

fn network_changes(a: Option<&NetworkStatus>, b: Option<&NetworkStatus>, out: &mut Vec<Change>) {
    let (a, b) = match (a, b) {
        (None, None) => return,
        (Some(a), Some(b)) => (a, b),
        _ => {
            return out.push(Change::Port {
                port: "*".into(),
                what: "availability",
            });
        }
    };
    fn ports(n: &NetworkStatus) -> BTreeMap<String, &RdmaDevice> {
        n.rdma_devices
            .iter()
            .map(|d| (format!("{}/{}", d.device, d.port), d))
            .collect()
    }
    let (pa, pb) = (ports(a), ports(b));
    if pa.keys().ne(pb.keys()) {
        out.push(Change::Port {
            port: "*".into(),
            what: "port set",
        });
    }
    for (key, x) in &pa {
        let Some(y) = pb.get(key) else { continue };
        let mut changed = |what: &'static str, differs: bool| {
            if differs {
                out.push(Change::Port {
                    port: key.clone(),
                    what,
                });
            }
        };
        changed("netdev", x.netdev != y.netdev);
        changed(
            "state",
            x.state != y.state || x.physical_state != y.physical_state,
        );
        changed("rate", x.rate_gbps != y.rate_gbps);
        changed("RoCE v2 GID", x.roce_v2_gid != y.roce_v2_gid);
        changed("MTU", x.mtu != y.mtu);
        changed("PFC priorities", x.pfc_priorities != y.pfc_priorities);
        changed("trust", x.trust != y.trust);
        changed("ECN priorities", x.ecn_priorities != y.ecn_priorities);
        changed("field errors", port_errors(x) != port_errors(y));
        changed("error count level", error_levels_crossed(x, y));
    }
}

/// NVLink state without the (ever moving) error counts: active and total links.
fn nvlink_links(n: &Option<NvlinkStatus>) -> Option<(u32, u32)> {
    n.as_ref().map(|n| (n.active, n.total))
}

/// Whether any NVLink error count of the GPU moved to another order of magnitude.
fn nvlink_levels_crossed(a: &GpuStatus, b: &GpuStatus) -> bool {
    let rates = |g: &GpuStatus| -> BTreeMap<u32, NvlinkErrorRates> {
        g.nvlink
            .iter()
            .flat_map(|n| n.error_rates.iter().map(|r| (r.link, r.clone())))
            .collect()
    };
    let (ra, rb) = (rates(a), rates(b));
    let links: BTreeSet<u32> = ra.keys().chain(rb.keys()).copied().collect();
    links.into_iter().any(|link| {
        NvlinkCounter::ALL.into_iter().any(|c| {
            let count = |r: &BTreeMap<u32, NvlinkErrorRates>| r.get(&link).and_then(|r| r.get(c));
            level_crossed(count(&ra), count(&rb))
        })
    })
}

/// Whether any error count of the port moved to another order of magnitude.
fn error_levels_crossed(a: &RdmaDevice, b: &RdmaDevice) -> bool {
    let count = |d: &RdmaDevice, c: ErrorCounter| d.error_rates.as_ref().and_then(|r| r.get(c));
    ErrorCounter::ALL
        .into_iter()
        .any(|c| level_crossed(count(a, c), count(b, c)))
}

/// Order-of-magnitude edges of an error count over the window.
const ERROR_LEVEL_EDGES: [u64; 7] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000];

/// Whether an error count crossed a level edge since the last published one: up when it
/// reaches an edge from below, down only once it fell under half the edge. A count moving at a
/// steady rate stays on one side of an edge, and one wobbling across it publishes once: without
/// policies, healthy counters write nothing, and a port going from 0 to 1 error publishes.
pub fn level_crossed(prev: Option<u64>, next: Option<u64>) -> bool {
    match (prev, next) {
        (Some(p), Some(n)) => ERROR_LEVEL_EDGES
            .iter()
            .any(|&e| (p < e && n >= e) || (p >= e && n.saturating_mul(2) < e)),
        (None, None) => false,
        _ => true,
    }
}

fn port_errors(d: &RdmaDevice) -> BTreeSet<&str> {
    error_fields(&d.errors)
}

#[cfg(test)]
mod tests {
    use gpunode_crds::report::{
        CollectorName, CollectorStatus, EccCounters, FanReading, NvlinkStatus, PauseCounters, PortErrorRates,
        RemappedRows, SensorReading, XidEvent,
    };
    use gpunode_crds::{ObservedTrust, ThrottleReason};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    type Edit<T> = Box<dyn Fn(&mut T)>;

    fn gpu(index: u32) -> GpuStatus {
        GpuStatus {
            index,
            uuid: Some(format!("GPU-{index}")),
            temperature_celsius: Some(40),
            memory_temperature_celsius: Some(45),
            slowdown_celsius: Some(89),
            shutdown_celsius: Some(92),
            power_watts: Some(70),
            power_limit_watts: Some(700),
            throttle_reasons: vec![ThrottleReason::GpuIdle],
            pcie: Some(PcieStatus {
                current_generation: 5,
                max_generation: 5,
                current_width: 16,
                max_width: 16,
                replay_counter: 0,
                ..PcieStatus::default()
            }),
            nvlink: Some(NvlinkStatus {
                active: 18,
                total: 18,
                ..NvlinkStatus::default()
            }),
            ecc: Some(EccCounters::default()),
            remapped_rows: Some(RemappedRows::default()),
            ..GpuStatus::default()
        }
    }

    fn port(i: u32) -> RdmaDevice {
        RdmaDevice {
            device: format!("mlx5_{i}"),
            port: 1,
            netdev: Some(format!("ens{i}")),
            state: Some("Active".into()),
            physical_state: Some("LinkUp".into()),
            rate_gbps: Some(400),
            roce_v2_gid: Some(true),
            mtu: Some(9000),
            pfc_priorities: Some(vec![3]),
            trust: Some(ObservedTrust::Dscp),
            ecn_priorities: Some(vec![3]),
            pfc_pause: vec![PauseCounters {
                priority: 3,
                rx: 1,
                tx: 1,
            }],
            errors: vec![],
            error_rates: None,
        }
    }

    fn node() -> GpuNodeReportStatus {
        GpuNodeReportStatus {
            observed_at: Some(Time(jiff::Timestamp::UNIX_EPOCH)),
            collectors: vec![CollectorStatus {
                name: CollectorName::Nvml,
                ok: true,
                error: None,
                error_kind: None,
                duration_ms: 3,
            }],
            driver_version: Some("550.90.07".into()),
            gpu_count: Some(2),
            throttled_gpus: Some(0),
            gpus: vec![gpu(0), gpu(1)],
            cooling: Some(CoolingStatus {
                sensors: vec![SensorReading {
                    chip: "nvme".into(),
                    label: "Composite".into(),
                    celsius: 38.0,
                    crit_celsius: Some(84.0),
                }],
                fans: vec![FanReading {
                    name: "nct/fan1".into(),
                    rpm: 5400,
                }],
                errors: vec![],
            }),
            network: Some(NetworkStatus {
                rdma_devices: vec![port(0), port(1)],
            }),
            ..GpuNodeReportStatus::default()
        }
    }

    fn changes(f: impl FnOnce(&mut GpuNodeReportStatus)) -> Vec<String> {
        let prev = node();
        let mut next = node();
        f(&mut next);
        material_changes(&prev, &next, &ChangeConfig::default())
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn gpu0(r: &mut GpuNodeReportStatus) -> &mut GpuStatus {
        &mut r.gpus[0]
    }

    #[test]
    fn identical_observations_are_not_a_change() {
        assert!(changes(|_| {}).is_empty());
    }

    #[test]
    fn noise_is_not_a_change() {
        assert!(
            changes(|r| {
                r.observed_at = Some(Time(jiff::Timestamp::now()));
                r.collectors[0].duration_ms = 99;
                r.collectors[0].error = Some("note".into());
                let g = gpu0(r);
                g.temperature_celsius = Some(47); // margin 42: same band
                g.memory_temperature_celsius = Some(60);
                g.power_watts = Some(690);
                if let Some(p) = g.pcie.as_mut() {
                    p.replay_counter = 12;
                }
                if let Some(c) = r.cooling.as_mut() {
                    c.sensors[0].celsius = 39.5;
                    c.fans[0].rpm = 5100;
                }
                if let Some(n) = r.network.as_mut() {
                    n.rdma_devices[0].pfc_pause[0].rx = 1_000_000;
                }
            })
            .is_empty()
        );
    }

    #[test]
    fn gpu_health_changes_are_material() {
        let cases: Vec<(&str, Edit<GpuStatus>)> = vec![
            (
                "throttle reasons",
                Box::new(|g| g.throttle_reasons.push(ThrottleReason::HwSlowdown)),
            ),
            (
                "ECC counters",
                Box::new(|g| {
                    g.ecc = Some(EccCounters {
                        volatile_corrected: 1,
                        ..Default::default()
                    })
                }),
            ),
            (
                "remapped rows",
                Box::new(|g| {
                    g.remapped_rows = Some(RemappedRows {
                        pending: true,
                        ..Default::default()
                    })
                }),
            ),
            (
                "retired pages",
                Box::new(|g| g.retired_pages = Some(Default::default())),
            ),
            (
                "XIDs",
                Box::new(|g| {
                    g.xids.push(XidEvent {
                        xid: 79,
                        at: Time(jiff::Timestamp::UNIX_EPOCH),
                    })
                }),
            ),
            (
                "PCIe link",
                Box::new(|g| {
                    if let Some(p) = g.pcie.as_mut() {
                        p.current_width = 8;
                    }
                }),
            ),
            (
                "NVLink",
                Box::new(|g| {
                    g.nvlink = Some(NvlinkStatus {
                        active: 17,
                        total: 18,
                        ..NvlinkStatus::default()
                    })
                }),
            ),
            ("thresholds", Box::new(|g| g.slowdown_celsius = Some(87))),
            ("power limit", Box::new(|g| g.power_limit_watts = Some(500))),
            (
                "field errors",
                Box::new(|g| {
                    g.errors.push(FieldError {
                        field: "uuid".into(),
                        reason: "NVML: GpuLost".into(),
                    })
                }),
            ),
            ("identity", Box::new(|g| g.uuid = Some("GPU-other".into()))),
            (
                "MIG mode",
                Box::new(|g| g.mig_mode = Some(gpunode_crds::EnabledState::Enabled)),
            ),
        ];
        for (what, edit) in cases {
            let got = changes(|r| edit(gpu0(r)));
            assert!(got.contains(&format!("GPU 0: {what} changed")), "{what}: {got:?}");
        }
    }

    #[test]
    fn temperature_counts_only_when_crossing_a_margin_band() {
        // Slowdown 89; margin edges 0, 3, 5, 10, 15; hysteresis 1.
        let at = |prev: i32, next: i32| {
            let mut a = node();
            let mut b = node();
            a.gpus[0].temperature_celsius = Some(prev);
            b.gpus[0].temperature_celsius = Some(next);
            !material_changes(&a, &b, &ChangeConfig::default()).is_empty()
        };
        assert!(!at(40, 73), "margin 49 → 16: same band");
        assert!(at(40, 78), "margin 49 → 11: past edge 15");
        assert!(at(84, 85), "margin 5 → 4: one degree past edge 5");
        assert!(!at(85, 84), "margin 4 → 5: back at the edge, not past it");
        assert!(at(85, 83), "margin 4 → 6: one degree above edge 5");
        assert!(at(87, 90), "margin 2 → -1: past slowdown");
        // A reading flapping around an edge publishes once, then stays quiet.
        let mut published = 84;
        let mut publishes = 0;
        for t in [85, 84, 85, 84, 85, 84] {
            if at(published, t) {
                published = t;
                publishes += 1;
            }
        }
        assert_eq!(publishes, 1);
    }

    #[test]
    fn a_temperature_appearing_or_disappearing_counts() {
        assert!(crossed(Some(1.0), None, &[0.0], 1.0));
        assert!(crossed(None, Some(1.0), &[0.0], 1.0));
        assert!(!crossed(None, None, &[0.0], 1.0));
    }

    #[test]
    fn memory_temperature_bands() {
        assert!(
            changes(|r| gpu0(r).memory_temperature_celsius = Some(86))
                .contains(&"GPU 0: memory temperature band changed".to_owned())
        );
        assert!(changes(|r| gpu0(r).memory_temperature_celsius = Some(79)).is_empty());
    }

    #[test]
    fn node_level_changes_are_material() {
        assert_eq!(
            changes(|r| r.collectors[0].ok = false),
            vec!["collector health changed"]
        );
        assert_eq!(
            changes(|r| r.driver_version = Some("560.1".into())),
            vec!["driver version changed"]
        );
        assert_eq!(changes(|r| r.boot_id = Some("b".into())), vec!["boot id changed"]);
        let got = changes(|r| {
            r.gpus.pop();
            r.gpu_count = Some(1);
        });
        assert_eq!(got, vec!["GPU counts changed", "GPU set changed"]);
    }

    #[test]
    fn cooling_changes() {
        let got = changes(|r| {
            if let Some(c) = r.cooling.as_mut() {
                c.sensors[0].celsius = 84.5;
            }
        });
        assert!(
            got.contains(&"cooling: critical threshold changed".to_owned()),
            "{got:?}"
        );
        let got = changes(|r| {
            if let Some(c) = r.cooling.as_mut() {
                c.fans[0].rpm = 0;
            }
        });
        assert_eq!(got, vec!["cooling: fans changed"]);
        let got = changes(|r| {
            if let Some(c) = r.cooling.as_mut() {
                c.sensors[0].celsius = 47.0;
            }
        });
        assert_eq!(got, vec!["cooling: sensor temperature band changed"]);
        assert_eq!(
            changes(|r| r.cooling = None),
            vec!["cooling: availability changed"]
        );
    }

    #[test]
    fn error_counts_count_only_across_an_order_of_magnitude() {
        assert!(!level_crossed(Some(0), Some(0)));
        assert!(level_crossed(Some(0), Some(1)));
        assert!(!level_crossed(Some(3), Some(9)));
        assert!(level_crossed(Some(9), Some(10)));
        // Wobbling just under an edge is not a change; falling well under it is.
        assert!(!level_crossed(Some(10), Some(9)));
        assert!(!level_crossed(Some(10), Some(5)));
        assert!(level_crossed(Some(10), Some(4)));
        assert!(level_crossed(Some(1), Some(0)));
        assert!(level_crossed(Some(0), Some(u64::MAX)));
        assert!(level_crossed(None, Some(0)));
        assert!(!level_crossed(None, None));
    }

    #[test]
    fn network_setting_changes_are_material() {
        let cases: Vec<(&str, Edit<RdmaDevice>)> = vec![
            (
                "error count level",
                Box::new(|d| {
                    d.error_rates = Some(PortErrorRates {
                        window_minutes: 60,
                        link_downed: Some(3),
                        ..PortErrorRates::default()
                    })
                }),
            ),
            ("state", Box::new(|d| d.state = Some("Down".into()))),
            ("state", Box::new(|d| d.physical_state = Some("Polling".into()))),
            ("rate", Box::new(|d| d.rate_gbps = Some(200))),
            ("RoCE v2 GID", Box::new(|d| d.roce_v2_gid = Some(false))),
            ("MTU", Box::new(|d| d.mtu = Some(1500))),
            ("PFC priorities", Box::new(|d| d.pfc_priorities = Some(vec![4]))),
            ("trust", Box::new(|d| d.trust = Some(ObservedTrust::Pcp))),
            ("ECN priorities", Box::new(|d| d.ecn_priorities = None)),
            ("netdev", Box::new(|d| d.netdev = Some("bond0".into()))),
            (
                "field errors",
                Box::new(|d| {
                    d.errors.push(FieldError {
                        field: "mtu".into(),
                        reason: "x".into(),
                    })
                }),
            ),
        ];
        for (what, edit) in cases {
            let got = changes(|r| {
                if let Some(n) = r.network.as_mut() {
                    edit(&mut n.rdma_devices[1]);
                }
            });
            assert_eq!(got, vec![format!("mlx5_1/1: {what} changed")], "{what}");
        }
        let got = changes(|r| {
            if let Some(n) = r.network.as_mut() {
                n.rdma_devices.pop();
            }
        });
        assert_eq!(got, vec!["*: port set changed"]);
    }
}
