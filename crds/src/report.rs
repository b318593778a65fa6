//! `GpuNodeReport`: what a node-probe observed on its node. One per node, named after it,
//! written only by that node's probe.
//!
//! An absent field means "not observed" (unknown), never "healthy": the operator turns missing
//! data into an Unknown verdict.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::nvlink::{GpuFabricStatus, NvlinkErrorRates};
use crate::recovery::GpuRecoveryAction;
use crate::types::{EnabledState, ObservedTrust, ThrottleReason};

/// Most GPUs a report may list.
pub const MAX_GPUS: usize = 64;
/// Most XIDs kept per GPU (the newest).
pub const MAX_XIDS_PER_GPU: usize = 32;
/// Most pods listed as holding one GPU (time-sliced GPUs are shared by several).
pub const MAX_PODS_PER_GPU: usize = 64;

/// GpuNodeReport is the observed state of one GPU node, published by the gpunode node-probe
/// running on it. Its name is the node's name.
// Each printcolumn(...) repeats the same keys, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "gpunode.dev",
    version = "v1alpha1",
    kind = "GpuNodeReport",
    plural = "gpunodereports",
    shortname = "gnr",
    category = "gpunode",
    status = "GpuNodeReportStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "GpuNodeReport is the observed state of one GPU node, published by the gpunode node-probe on that node.",
    validation = Rule::new("self.spec.nodeName == self.metadata.name")
        .message("a GpuNodeReport must be named after its node: metadata.name and spec.nodeName differ"),
    printcolumn(name = "GPUs", type_ = "integer", json_path = ".status.gpuCount", description = "GPUs NVML sees"),
    printcolumn(name = "Driver", type_ = "string", json_path = ".status.driverVersion", description = "NVIDIA driver version"),
    printcolumn(name = "Throttled", type_ = "integer", json_path = ".status.throttledGpus", description = "GPUs with a performance-limiting throttle reason"),
    printcolumn(name = "Observed", type_ = "date", json_path = ".status.observedAt", description = "When the probe last observed the node"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp", priority = 1)
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("nodeName is immutable"))]
pub struct GpuNodeReportSpec {
    /// The node this report describes; equal to metadata.name.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
}

/// One observation of a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeReportStatus {
    /// When the probe made this observation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<Time>,

    /// Version of the node-probe that wrote this report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub probe_version: Option<String>,

    /// The node's boot id (/proc/sys/kernel/random/boot_id); a new value means the node rebooted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub boot_id: Option<String>,

    /// Outcome of each collector. A failed collector makes its section unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub collectors: Vec<CollectorStatus>,

    /// NVIDIA driver version, for example "550.54.15".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub driver_version: Option<String>,

    /// CUDA driver API version, for example "12.4".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub cuda_version: Option<String>,

    /// Number of GPUs NVML sees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_count: Option<u32>,

    /// Number of GPUs with a performance-limiting throttle reason (HwSlowdown,
    /// SwThermalSlowdown, HwThermalSlowdown or HwPowerBrakeSlowdown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled_gpus: Option<u32>,

    /// Each GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub gpus: Vec<GpuStatus>,

    /// Chassis sensors and fans; absent when the cooling collector did not run or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooling: Option<CoolingStatus>,

    /// RDMA devices; absent when the network collector did not run or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStatus>,
}

/// A probe collector's outcome.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CollectorStatus {
    /// The collector.
    pub name: CollectorName,
    /// Whether it completed. Individual fields it could not read are listed under `errors` of
    /// the GPU or device they belong to.
    pub ok: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub error: Option<String>,
    /// How it failed, when it did: Failed (it returned an error) or Hung (a call into the
    /// driver did not return within the probe's deadline, `--nvml-timeout`: the driver is
    /// stuck, while the probe itself still reports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<CollectorErrorKind>,
    /// How long it took, in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
}

/// How a collector failed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = crate::types::without_description)]
pub enum CollectorErrorKind {
    /// It returned an error (no library, no driver, a call failed).
    Failed,
    /// It did not finish within its deadline: a driver call has not returned.
    Hung,
}

/// The probe's collectors.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
#[schemars(transform = crate::types::without_description)]
#[serde(rename_all = "lowercase")]
pub enum CollectorName {
    /// GPUs through NVML.
    Nvml,
    /// hwmon sensors, fans and thermal zones.
    Cooling,
    /// RDMA devices, DCB (PFC, trust) and ECN settings.
    Network,
    /// Which pods hold which GPU, from the kubelet's PodResources API (device-plugin nodes).
    #[serde(rename = "podResources")]
    PodResources,
}

/// A field a collector could not read, and why.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FieldError {
    /// The report field that is unknown, for example "remappedRows".
    #[schemars(length(max = 64))]
    pub field: String,
    /// Why, for example "NVML: NotSupported".
    #[schemars(length(max = 512))]
    pub reason: String,
}

/// One GPU as NVML reports it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuStatus {
    /// NVML device index.
    pub index: u32,
    /// GPU UUID, for example "GPU-5c3f...".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 96))]
    pub uuid: Option<String>,
    /// Product name, for example "NVIDIA H100 80GB HBM3".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 96))]
    pub product: Option<String>,
    /// PCI bus id, for example "00000000:18:00.0".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub pci_bus_id: Option<String>,
    /// Framebuffer memory in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "memoryMiB")]
    pub memory_mib: Option<u64>,

    /// Current ECC mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_mode: Option<EnabledState>,
    /// ECC error counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc: Option<EccCounters>,
    /// Retired memory pages (pre-Ampere page retirement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_pages: Option<RetiredPages>,
    /// Remapped memory rows (Ampere and later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remapped_rows: Option<RemappedRows>,

    /// Core temperature in degrees Celsius.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_celsius: Option<i32>,
    /// HBM memory temperature in degrees Celsius.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_temperature_celsius: Option<i32>,
    /// Temperature at which the GPU starts slowing its clocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowdown_celsius: Option<i32>,
    /// Temperature at which the GPU shuts down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_celsius: Option<i32>,

    /// Power draw in watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_watts: Option<u32>,
    /// Enforced power limit in watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_watts: Option<u32>,
    /// The board's default power limit in watts (what the enforced limit is without a cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_power_limit_watts: Option<u32>,
    /// Since when the hardware power brake (HwPowerBrakeSlowdown) has held the clocks down
    /// without a break, as far as this probe has seen; absent while it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_brake_since: Option<Time>,

    /// Why clocks are currently reduced, by name. Empty when running at full clocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub throttle_reasons: Vec<ThrottleReason>,

    /// PCIe link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<PcieStatus>,
    /// NVLink connectivity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<NvlinkStatus>,
    /// The GPU's NVSwitch fabric registration and health. State NotSupported on GPUs outside
    /// an NVSwitch fabric; absent when it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<GpuFabricStatus>,

    /// Persistence mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence_mode: Option<EnabledState>,
    /// Current MIG mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<EnabledState>,

    /// What the driver asks for before the GPU can be used again (NVML's recovery action).
    /// Absent when the driver cannot report it (older drivers) or it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_action: Option<GpuRecoveryAction>,

    /// XID errors seen since the probe started on this boot, newest last (at most 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub xids: Vec<XidEvent>,

    /// Fields NVML could not read for this GPU, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub errors: Vec<FieldError>,

    /// The pods the device plugin allocated this GPU to, as the kubelet's PodResources API lists
    /// them (empty: none). Absent when the probe does not read PodResources or could not (see
    /// collectors[]): then gpunode cannot evict only this GPU's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub pods: Option<Vec<PodName>>,
}

/// A pod, by namespace and name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodName {
    /// The pod's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The pod's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// ECC error counts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EccCounters {
    /// Corrected errors since the driver loaded.
    pub volatile_corrected: u64,
    /// Uncorrected errors since the driver loaded.
    pub volatile_uncorrected: u64,
    /// Corrected errors over the GPU's lifetime.
    pub aggregate_corrected: u64,
    /// Uncorrected errors over the GPU's lifetime.
    pub aggregate_uncorrected: u64,
}

/// Retired pages.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetiredPages {
    /// Pages retired for multiple single-bit errors.
    pub single_bit: u64,
    /// Pages retired for a double-bit error.
    pub double_bit: u64,
    /// A retirement waits for the next driver reload.
    pub pending: bool,
}

/// Remapped rows.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: u64,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u64,
    /// A remap waits for a GPU reset.
    pub pending: bool,
    /// A remap failed: the GPU needs service.
    pub failure: bool,
}

/// PCIe link state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PcieStatus {
    /// Generation the link is running at now.
    pub current_generation: u32,
    /// Highest generation the GPU and slot support.
    pub max_generation: u32,
    /// Lanes in use now.
    pub current_width: u32,
    /// Most lanes the GPU and slot support.
    pub max_width: u32,
    /// PCIe replay counter (link-level retransmissions).
    #[serde(default)]
    pub replay_counter: u64,
    /// Replays over the last `replayWindowMinutes` (60 once the probe has watched an hour): the
    /// count a policy's `pcie.maxReplaysPerHour` is held to. Absent when the counter is unread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replays_last_hour: Option<u64>,
    /// The minutes `replaysLastHour` covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_window_minutes: Option<u32>,
}

/// NVLink connectivity.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NvlinkStatus {
    /// Links that are up.
    pub active: u32,
    /// Links the GPU has.
    pub total: u32,
    /// Error counts over the last hour of each active link that counted any error; a link
    /// whose counters all stayed at 0 is left out, so a healthy GPU lists none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 18))]
    pub error_rates: Vec<NvlinkErrorRates>,
}

/// One XID error.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct XidEvent {
    /// The XID code, for example 79 (GPU fell off the bus).
    pub xid: u32,
    /// When the probe received it.
    pub at: Time,
}

/// Chassis cooling.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoolingStatus {
    /// Temperature sensors from hwmon and thermal zones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub sensors: Vec<SensorReading>,
    /// Fans visible to the OS.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub fans: Vec<FanReading>,
    /// Sensors or fans that could not be read, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub errors: Vec<FieldError>,
}

/// One temperature sensor.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SensorReading {
    /// hwmon chip name or thermal zone type, for example "nvme" or "acpitz".
    #[schemars(length(max = 64))]
    pub chip: String,
    /// Sensor label, for example "Composite" or "temp1".
    #[schemars(length(max = 64))]
    pub label: String,
    /// Reading in degrees Celsius.
    pub celsius: f64,
    /// The sensor's own critical threshold, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crit_celsius: Option<f64>,
}

/// One fan.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FanReading {
    /// "<chip>/<label>", for example "nct6775/fan1".
    #[schemars(length(max = 128))]
    pub name: String,
    /// Speed in revolutions per minute.
    pub rpm: u32,
}

/// RDMA network state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    /// One entry per RDMA device port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub rdma_devices: Vec<RdmaDevice>,
}

/// One RDMA device port and the Ethernet settings of its network interface.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RdmaDevice {
    /// RDMA device name, for example "mlx5_0".
    #[schemars(length(max = 64))]
    pub device: String,
    /// Port number, usually 1.
    pub port: u32,
    /// The network interface behind the port, for example "ens1f0np0" (or a bond).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub netdev: Option<String>,
    /// Port state: Active, Armed, Init or Down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub state: Option<String>,
    /// Physical state, for example "LinkUp" or "Disabled".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub physical_state: Option<String>,
    /// Negotiated rate in Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_gbps: Option<u32>,
    /// Whether the port has a RoCE v2 GID.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "roceV2Gid")]
    pub roce_v2_gid: Option<bool>,
    /// MTU of the network interface in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Priorities with PFC enabled; absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8), inner(range(min = 0, max = 7)))]
    pub pfc_priorities: Option<Vec<u8>>,
    /// QoS trust mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<ObservedTrust>,
    /// Priorities with ECN enabled; absent when unknown (no NVIDIA OFED ECN settings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8), inner(range(min = 0, max = 7)))]
    pub ecn_priorities: Option<Vec<u8>>,
    /// PFC pause frame counters per priority.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub pfc_pause: Vec<PauseCounters>,
    /// Link flaps and error counts of the port over the last hour; absent when the probe reads
    /// none of its error counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_rates: Option<PortErrorRates>,
    /// Fields that could not be read, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub errors: Vec<FieldError>,
}

/// Pause frames for one priority.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseCounters {
    /// The priority (0-7).
    #[schemars(range(min = 0, max = 7))]
    pub priority: u8,
    /// Pause frames received.
    pub rx: u64,
    /// Pause frames sent.
    pub tx: u64,
}

/// How often a port's error counters rose over the last hour. Each value is the increase of
/// one kernel counter over the window, so it reads as events per hour; it is never extrapolated
/// from a shorter history, so right after a reboot, a counter reset or the port appearing it
/// counts only what happened since (see `windowMinutes`). A value is absent when the kernel or
/// driver does not expose that counter for the port: it is then not judged.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortErrorRates {
    /// Minutes of history the counts cover: 60 once the probe has watched the port for an
    /// hour of this boot, less before.
    #[schemars(range(min = 0, max = 60))]
    pub window_minutes: u32,
    /// Times the link went down (`counters/link_downed`): link flaps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_downed: Option<u64>,
    /// Physical-layer symbol errors (`counters/symbol_error`): a marginal cable, transceiver or
    /// port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol_errors: Option<u64>,
    /// Link error recoveries (`counters/link_error_recovery`): the link retrained without going
    /// down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_error_recovery: Option<u64>,
    /// Received packets with errors (`counters/port_rcv_errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rcv_errors: Option<u64>,
    /// Outbound packets discarded because the port was down or congested
    /// (`counters/port_xmit_discards`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xmit_discards: Option<u64>,
    /// Receive buffer overruns (`counters/excessive_buffer_overrun_errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_overruns: Option<u64>,
    /// Local link integrity errors (`counters/local_link_integrity_errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_integrity_errors: Option<u64>,
    /// Packets the NIC dropped for lack of port buffer (ethtool `rx_discards_phy`, RoCE NICs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_discards: Option<u64>,
    /// Packets dropped because the host had posted no receive buffer (ethtool
    /// `rx_out_of_buffer`, else `hw_counters/out_of_buffer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_of_buffer: Option<u64>,
    /// PFC pause-storm warnings of the NIC's watchdog (ethtool
    /// `tx_pause_storm_warning_events`): the port sent pause frames for too long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_storm_warnings: Option<u64>,
    /// PFC pause storms the NIC's watchdog stopped (ethtool `tx_pause_storm_error_events`): the
    /// port stopped honouring its own pause requests, so lossless traffic can drop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_storm_errors: Option<u64>,
}
