//! `GpuNodePolicy`: the state a platform team declares for a set of GPU nodes, and what gpunode
//! may do to a node that drifts from it.
//!
//! Field docs are the text `kubectl explain gpunodepolicy.spec...` prints: they are user docs.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    budget::MaxUnavailable,
    duration::Duration,
    maintenance::MaintenancePolicy,
    power::PowerRequirements,
    recovery::RecoveryActionRequirements,
    repair::RepairPolicy,
    rules,
    types::{DriftClass, EnabledState, PortState, ThrottleReason, TrustMode},
    validation::ValidationPolicy,
    version::VersionRange,
    xid_resolution::XidResolutionRequirements,
};

/// GpuNodePolicy declares the state a set of GPU nodes must be in (GPUs, cooling, RoCE network)
/// and the remediation gpunode applies to a node that drifts from it: labels, taints, cordon or
/// drain, within a disruption budget, undone once the node has recovered.
// Each printcolumn(...) repeats the same keys, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpunode.dev",
    version = "v1alpha1",
    kind = "GpuNodePolicy",
    plural = "gpunodepolicies",
    shortname = "gnp",
    category = "gpunode",
    status = "GpuNodePolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "GpuNodePolicy declares the state a set of GPU nodes must be in and what gpunode does to a node that drifts from it.",
    printcolumn(
        name = "Matched",
        type_ = "integer",
        json_path = ".status.matched",
        description = "Nodes selected by this policy"
    ),
    printcolumn(
        name = "Compliant",
        type_ = "integer",
        json_path = ".status.compliant",
        description = "Selected nodes that match the policy"
    ),
    printcolumn(
        name = "Drifted",
        type_ = "integer",
        json_path = ".status.drifted",
        description = "Selected nodes that drifted from the policy"
    ),
    printcolumn(
        name = "Unknown",
        type_ = "integer",
        json_path = ".status.unknown",
        description = "Selected nodes without a fresh, complete report",
        priority = 1
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the operator is reconciling this policy",
        priority = 1
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(format!(
    "!has(self.staleAfter) || !self.staleAfter.matches('{}') || duration(self.staleAfter) >= duration('{}')",
    rules::DURATION_RE, rules::MIN_STALE_AFTER
)).message(format!(
    "staleAfter must be at least {}: the node-probe renews its heartbeat once a minute, so a shorter value would mark healthy nodes Unknown",
    rules::MIN_STALE_AFTER
).as_str()).field_path(".staleAfter"))]
#[x_kube(validation = Rule::new(crate::selector::NODE_SELECTOR_RULE)
    .message(crate::selector::EMPTY_NODE_SELECTOR)
    .field_path(".nodeSelector"))]
pub struct GpuNodePolicySpec {
    /// Which Nodes this policy governs, by their labels (for example
    /// `nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3`). Required and never empty: an empty
    /// selector is refused, since it would select every node of the cluster; to govern every
    /// GPU node on purpose, select a label they all carry (`matchExpressions: [{key:
    /// nvidia.com/gpu.present, operator: Exists}]`).
    /// A node selected by two policies gets a Conflict condition and no disruptive action until
    /// the overlap is resolved. Keys, values and operators are validated as Kubernetes validates
    /// its own selectors; a selector the operator cannot use selects no node (condition
    /// Degraded, reason InvalidSelector).
    #[serde(default)]
    #[schemars(schema_with = "crate::selector::schema")]
    pub node_selector: LabelSelector,

    /// What the GPUs of a node must look like: inventory, driver and CUDA versions, ECC,
    /// memory health, PCIe and NVLink, fatal XIDs. Omit to skip every GPU check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuRequirements>,

    /// Temperature, throttling and chassis cooling limits. Omit to skip every cooling check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooling: Option<CoolingRequirements>,

    /// RDMA / RoCE lossless network settings of the node's NICs. Omit to skip every network check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkRequirements>,

    /// The remediation ladder: what gpunode does to a drifted node. Each rule applies once one of
    /// its drift classes has lasted `after`. A node always gets the gpunode.dev/state and
    /// gpunode.dev/drift.<class> labels and the GpuPolicyCompliant condition; rules add taints,
    /// cordon and drain. An empty list means labels and conditions only.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub remediation: Vec<RemediationRule>,

    /// How GPUs are quarantined one at a time (`TaintDevice` rules), and when a node's GPU
    /// faults are handed to the node's own rules instead.
    #[serde(default)]
    pub quarantine: QuarantinePolicy,

    /// Limits on how many nodes gpunode may disrupt (taint NoSchedule/NoExecute, cordon, drain)
    /// at once, the circuit breaker, and how drains behave.
    #[serde(default)]
    pub disruption: DisruptionPolicy,

    /// When gpunode undoes what it did to a node that became compliant again.
    #[serde(default)]
    pub recovery: RecoveryPolicy,

    /// What gpunode does to a drained node that is still drifted: steps with timeouts (hand-off
    /// to a remediator that reboots or replaces the node), and how many it may start per node
    /// within a window. Omit to leave drained nodes cordoned until they recover on their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<RepairPolicy>,

    /// When disruptive actions may start: weekly windows in a time zone, and the drift classes
    /// that act at once regardless. Omit to act as soon as a rule fires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<MaintenancePolicy>,

    /// A validation Job gpunode runs on a node that recovered, before it undoes its cordon and
    /// taints (and so after a repair step too), and optionally on idle healthy nodes now and
    /// then: passed, the node returns (or stays in service); failed or timed out, the node
    /// drifts in class Validation, which rules and repair steps may list, until a repair step
    /// succeeds. While it runs the node carries the label `gpunode.dev/validation=running`.
    /// Omit to undo as soon as the node is healthy for `recovery.healthyFor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<ValidationPolicy>,

    /// A report older than this makes its node Unknown (drift class Stale). At least 60s, since
    /// the probe sends a heartbeat once a minute. Defaults to 3m.
    #[serde(default = "default_stale_after")]
    pub stale_after: Duration,

    /// Evaluate and report only: status lists the actions gpunode would take, and nothing is
    /// written to nodes except the state labels and the GpuPolicyCompliant condition.
    #[serde(default)]
    pub dry_run: bool,

    /// Stop taking new actions and stop undoing old ones; nodes keep their current labels,
    /// taints and cordons until the policy is resumed. Status keeps being updated.
    #[serde(default)]
    pub paused: bool,
}

impl Default for GpuNodePolicySpec {
    /// The spec of `spec: {}`: every default applied.
    fn default() -> Self {
        GpuNodePolicySpec {
            node_selector: LabelSelector::default(),
            gpu: None,
            cooling: None,
            network: None,
            remediation: Vec::new(),
            quarantine: QuarantinePolicy::default(),
            disruption: DisruptionPolicy::default(),
            recovery: RecoveryPolicy::default(),
            repair: None,
            maintenance: None,
            validation: None,
            stale_after: default_stale_after(),
            dry_run: false,
            paused: false,
        }
    }
}

fn default_stale_after() -> Duration {
    Duration::from_secs(180)
}

/// Requirements on every GPU of a node, as NVML reports them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuRequirements {
    /// Exact number of GPUs NVML must see (drift class Inventory). A GPU that fell off the bus
    /// lowers the count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 64))]
    pub count: Option<u32>,

    /// Accepted GPU models. Each entry is compared with NVML's product name, case-insensitively,
    /// as a substring: "H100" matches "NVIDIA H100 80GB HBM3". Empty accepts any model
    /// (drift class Inventory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 128)))]
    pub products: Vec<String>,

    /// Minimum framebuffer memory per GPU in MiB, as NVML reports it (an H100 80GB reports
    /// 81559) (drift class Inventory).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "minMemoryMiB")]
    #[schemars(range(min = 0))]
    pub min_memory_mib: Option<u64>,

    /// Accepted NVIDIA driver versions, for example ">=550.54.15, <560" or "~=535" (the 535
    /// branch) (drift class Driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<VersionRange>,

    /// Accepted CUDA driver API versions, for example ">=12.4" or "12.4" (drift class Driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<VersionRange>,

    /// Required ECC mode of every GPU (drift class Config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_mode: Option<EnabledState>,

    /// Required persistence mode of every GPU (drift class Config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence_mode: Option<EnabledState>,

    /// Required MIG mode of every GPU (drift class Config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<EnabledState>,

    /// Minimum PCIe link each GPU must have trained to (drift class Pcie).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<PcieRequirements>,

    /// The enforced power limit each GPU must run under (drift class Config), and how long the
    /// hardware power brake may hold its clocks down (drift class Throttle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerRequirements>,

    /// NVLink and NVSwitch fabric health of each GPU: active links, error budgets per link
    /// and hour, a completed fabric registration (drift class Nvlink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<NvlinkRequirements>,

    /// Most volatile (since driver load) uncorrectable ECC errors a GPU may have (drift class
    /// Memory). 0 means any uncorrectable error is drift.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_volatile_uncorrected_ecc: Option<u64>,

    /// Most retired memory pages (single- plus double-bit) a GPU may have (drift class
    /// Memory). A page pending retirement is always drift. NVIDIA's RMA threshold is 60+.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_retired_pages: Option<u64>,

    /// Accept GPUs whose row remapping failed (Ampere and later). False (the default) makes a
    /// remap failure or a pending remap drift (class Memory).
    #[serde(default)]
    pub allow_row_remap_failure: bool,

    /// XID error codes that make the node drift (class Xid) when seen within `xidWindow`,
    /// whatever NVIDIA's catalogue says of them (see `xidResolution` to act by the catalogue's
    /// resolution instead). Defaults to DCGM's fatal set plus 64: 48, 64, 74, 79, 95, 119, 120,
    /// 140. The drift names each XID's catalogue resolution.
    #[serde(default = "default_fatal_xids")]
    #[schemars(length(max = 256), inner(range(min = 1, max = 65535)))]
    pub fatal_xids: Vec<u32>,

    /// How long a fatal XID counts as drift after the probe received it. Unset: until the node
    /// reboots. The probe keeps the XIDs of the current boot (the newest 32 per GPU) in its state
    /// directory (the chart mounts the host's /var/lib/gpunode), so they survive its own restarts
    /// on the same boot; a new boot id forgets them. Without that directory, or if its file is
    /// lost, corrupt or unreadable, a restarted probe starts without them (a warning, and the
    /// metric gpunode_probe_xid_state_ignored_total). XIDs that happen while no probe runs are
    /// never seen: NVML delivers events only to a process listening at the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_window: Option<Duration>,

    /// Drift (class Xid) while NVML's recovery action for a GPU is one of `driftOn`: the
    /// driver's own verdict after a fault, usually an XID, so the steps that repair XIDs repair
    /// it. Unset: not checked. A repair's GpuReset step skips a GPU that asks for NodeReboot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_action: Option<RecoveryActionRequirements>,

    /// Drift (class Xid) when a GPU reports, within `xidWindow`, an XID whose resolution in
    /// NVIDIA's XID catalogue (built in, edition R610) is one of `driftOn`, for example every
    /// XID after which NVIDIA says to reset the GPU. Adds to `fatalXids`, which still drift by
    /// number. Unset: XIDs drift by number only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid_resolution: Option<XidResolutionRequirements>,
}

/// DCGM's fatal XIDs (48, 74, 79, 95, 119, 120, 140) plus 64 (row-remapper failure).
pub fn default_fatal_xids() -> Vec<u32> {
    vec![48, 64, 74, 79, 95, 119, 120, 140]
}

/// Minimum PCIe link of each GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PcieRequirements {
    /// Minimum PCIe generation the link is currently running at (H100 SXM: 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 7))]
    pub min_generation: Option<u32>,

    /// Minimum number of PCIe lanes the link is currently running with (H100 SXM: 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 32))]
    pub min_width: Option<u32>,

    /// Most PCIe replays (link-level retransmissions, NVML's replay counter) a GPU may have
    /// over the last hour (drift class Pcie). A healthy link replays rarely; DCGM warns above
    /// about 1.92 per lane and minute at Gen5 (BER 1e-12), so 0 is too strict for most fleets.
    /// A probe that has watched for less than an hour counts over the time it has watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_replays_per_hour: Option<u64>,
}

/// NVLink connectivity, error budgets and NVSwitch fabric registration of each GPU (drift
/// class Nvlink). The error budgets judge each active link's NVML error counters as the probe
/// publishes them: the increase of each counter over the last hour (`nvidia-smi nvlink -e`
/// shows the same counters). Right after a reboot or a GPU reset, which clear the counters, it
/// counts only what happened since, never extrapolating. A counter NVML does not report for a
/// link is not judged. An unset field is not checked.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NvlinkRequirements {
    /// Minimum number of active NVLinks per GPU (H100 SXM has 18). 0 (the default) skips the
    /// check.
    #[serde(default)]
    #[schemars(range(min = 0, max = 18))]
    pub min_active_links: u32,

    /// Most data-link replays per link and hour (`NVML_NVLINK_ERROR_DL_REPLAY`): flits sent
    /// again because the other end received them damaged. A few are normal on a healthy link;
    /// a steady stream costs bandwidth and usually comes with CRC errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_replay_errors_per_hour: Option<u32>,

    /// Most data-link recoveries per link and hour (`NVML_NVLINK_ERROR_DL_RECOVERY`): the link
    /// retrained, stalling its traffic meanwhile. DCGM fails a GPU on any recovery; 0 does the
    /// same here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub max_recovery_errors_per_hour: Option<u32>,

    /// Most flits received with a CRC error per link and hour, judged for flow-control flits
    /// (`NVML_NVLINK_ERROR_DL_CRC_FLIT`) and data flits (`NVML_NVLINK_ERROR_DL_CRC_DATA`) each
    /// on its own: a marginal link, cable or connector. DCGM's own limit is 100 per second
    /// (360000 per hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_crc_errors_per_hour: Option<u32>,

    /// Require every GPU's registration with the NVSwitch fabric to have completed and
    /// succeeded (NVML fabric state Completed, status Success). On HGX boards a GPU whose
    /// registration did not complete (Fabric Manager down, or of another version than the
    /// driver) fails every CUDA job that uses NVLink while the rest of NVML looks healthy. A GPU
    /// outside an NVSwitch fabric (state NotSupported) drifts too: set it only on policies that
    /// select NVSwitch systems. False (the default) skips the check.
    #[serde(default)]
    pub require_fabric_registration: bool,
}

/// Thermal and cooling limits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoolingRequirements {
    /// Highest GPU core temperature in degrees Celsius (drift class Thermal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 150))]
    pub max_gpu_celsius: Option<i32>,

    /// Smallest distance in degrees Celsius between a GPU's temperature and its slowdown
    /// threshold (drift class Thermal). 5 means a GPU at 83 C with slowdown at 87 C drifted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub min_slowdown_margin_celsius: Option<i32>,

    /// Highest HBM memory temperature in degrees Celsius (drift class Thermal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 150))]
    pub max_memory_celsius: Option<i32>,

    /// Clock-throttle reasons that make a GPU drift (class Throttle). Defaults to the four that
    /// cost performance: HwSlowdown, SwThermalSlowdown, HwThermalSlowdown, HwPowerBrakeSlowdown.
    /// SwPowerCap and GpuIdle are normal operation and usually left out.
    #[serde(default = "default_forbidden_throttle_reasons")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub forbidden_throttle_reasons: Vec<ThrottleReason>,

    /// Limits for chassis sensors (hwmon and thermal zones) (drift class Cooling).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub sensors: Vec<SensorLimit>,

    /// Lowest speed any fan may run at, in RPM; a stopped fan is drift (class Cooling). Nodes
    /// whose fans are not visible to the OS (most SXM systems) report no fans and pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub min_fan_rpm: Option<u32>,
}

impl Default for CoolingRequirements {
    fn default() -> Self {
        CoolingRequirements {
            max_gpu_celsius: None,
            min_slowdown_margin_celsius: None,
            max_memory_celsius: None,
            forbidden_throttle_reasons: default_forbidden_throttle_reasons(),
            sensors: Vec::new(),
            min_fan_rpm: None,
        }
    }
}

/// The throttle reasons that cost performance.
pub fn default_forbidden_throttle_reasons() -> Vec<ThrottleReason> {
    vec![
        ThrottleReason::HwSlowdown,
        ThrottleReason::SwThermalSlowdown,
        ThrottleReason::HwThermalSlowdown,
        ThrottleReason::HwPowerBrakeSlowdown,
    ]
}

/// A temperature limit for the chassis sensors whose name matches a pattern.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SensorLimit {
    /// Pattern matched against "<chip>/<label>" of each sensor, for example "nvme*/*",
    /// "*/Inlet Temp" or "acpitz/*"; `*` matches any run of characters, `?` any one character.
    #[serde(rename = "match")]
    #[schemars(length(min = 1, max = 128))]
    pub pattern: String,

    /// Highest temperature in degrees Celsius the matching sensors may read.
    #[schemars(range(min = -50, max = 200))]
    pub max_celsius: i32,
}

/// RDMA / RoCE settings every matching NIC port must have.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkRequirements {
    /// Which RDMA devices are checked, and how many there must be.
    #[serde(default)]
    pub rdma: RdmaSelection,

    /// Require a RoCE v2 GID on every checked port (drift class Network).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "roceV2")]
    pub roce_v2: Option<bool>,

    /// Priorities that must have PFC (priority flow control) enabled, and no others, for a
    /// lossless RoCE fabric; usually [3]. Each is 0-7. Empty skips the check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(range(min = 0, max = 7)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub pfc_priorities: Vec<u8>,

    /// Required QoS trust mode of the NIC: "dscp" (L3, the usual RoCE setting) or "pcp" (L2
    /// VLAN priority). Omit to skip the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<TrustMode>,

    /// Priorities that must have ECN (DCQCN congestion control) enabled, usually [3]. Each is
    /// 0-7. Nodes without the NVIDIA OFED ECN settings report ECN as unknown, which makes the
    /// node Unknown, not drifted. Empty skips the check.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(range(min = 0, max = 7)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub ecn_priorities: Vec<u8>,

    /// Smallest MTU of the network interface behind each RDMA port, in bytes (9000 for jumbo
    /// frames; RoCE uses up to 4096 of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 68, max = 65536))]
    pub min_mtu: Option<u32>,

    /// Slowest link rate each port may have negotiated, in Gb/s (400 for NDR / 400GbE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3200))]
    pub min_rate_gbps: Option<u32>,

    /// State every checked port must be in. Defaults to Active.
    #[serde(default = "default_port_state")]
    pub port_state: PortState,

    /// Error budgets for the InfiniBand port counters of each checked port (link flaps,
    /// symbol errors, ...), per hour (drift class Network). They apply to InfiniBand ports and
    /// to RoCE ports whose driver exposes the same counters. Omit to skip these checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infiniband: Option<PortErrorBudgets>,

    /// Most PFC pause storms the NIC's watchdog may stop on a port in an hour (ethtool
    /// `tx_pause_storm_error_events`, drift class Network). A storm means a host stopped
    /// draining its receive queue and flooded the fabric with pause frames; 0 makes any storm
    /// drift. The watchdog's warnings are reported, not judged. Ports whose NIC has no such
    /// counter are not judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub max_pause_storm_events_per_hour: Option<u32>,

    /// Most packets a RoCE NIC may drop per hour on a port, for lack of port buffer (ethtool
    /// `rx_discards_phy`) and for lack of posted receive buffers (`rx_out_of_buffer`), each
    /// judged on its own (drift class Network). A lossless fabric drops nothing, so small
    /// values are usual. Ports whose NIC has no such counter are not judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_discards_per_hour: Option<u32>,
}

/// Error budgets for the InfiniBand port counters (`/sys/class/infiniband/<device>/ports/<n>/
/// counters/`), each the most events a port may count in the last hour. The probe publishes the
/// increase of each counter over the last hour; right after a reboot or a counter reset it
/// counts only what happened since, never extrapolating. A counter the kernel does not expose
/// is not judged. An unset field is not checked.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortErrorBudgets {
    /// Most times a port's link may go down in an hour (`link_downed`): link flaps. 0 makes
    /// any flap drift; 1 or 2 tolerate a switch reboot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub max_link_downed_per_hour: Option<u32>,

    /// Most physical-layer symbol errors per hour (`symbol_error`): a marginal cable,
    /// transceiver or port. A healthy NDR link counts a few at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_symbol_errors_per_hour: Option<u32>,

    /// Most link error recoveries (retraining without going down) per hour
    /// (`link_error_recovery`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub max_link_error_recovery_per_hour: Option<u32>,

    /// Most received packets with errors per hour (`port_rcv_errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_rcv_errors_per_hour: Option<u32>,

    /// Most outbound packets discarded per hour (`port_xmit_discards`): the port was down or
    /// congested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_xmit_discards_per_hour: Option<u32>,

    /// Most receive buffer overruns per hour (`excessive_buffer_overrun_errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_buffer_overruns_per_hour: Option<u32>,

    /// Most local link integrity errors per hour (`local_link_integrity_errors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000000))]
    pub max_link_integrity_errors_per_hour: Option<u32>,
}

impl Default for NetworkRequirements {
    fn default() -> Self {
        NetworkRequirements {
            rdma: RdmaSelection::default(),
            roce_v2: None,
            pfc_priorities: Vec::new(),
            trust: None,
            ecn_priorities: Vec::new(),
            min_mtu: None,
            min_rate_gbps: None,
            port_state: default_port_state(),
            infiniband: None,
            max_pause_storm_events_per_hour: None,
            max_discards_per_hour: None,
        }
    }
}

fn default_port_state() -> PortState {
    PortState::Active
}

/// Which RDMA devices a policy checks.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(rules::GLOB_NOT_REGEX_RULE.replace("{field}", "self.devicePattern"))
    .message(rules::GLOB_NOT_REGEX_HINT)
    .field_path(".devicePattern"))]
pub struct RdmaSelection {
    /// Glob for RDMA device names under /sys/class/infiniband: `*` matches any run of
    /// characters, `?` any one character. Defaults to "mlx5_*" (NVIDIA ConnectX). Regular
    /// expression syntax (`mlx5_.*`, `^mlx5`, `(a|b)`) is refused, since it would match nothing.
    #[serde(default = "default_device_pattern")]
    #[schemars(length(min = 1, max = 64))]
    pub device_pattern: String,

    /// How many matching devices the node must have (drift class Network). 0 accepts nodes
    /// without any.
    #[serde(default)]
    #[schemars(range(min = 0, max = 64))]
    pub min_devices: u32,
}

impl Default for RdmaSelection {
    fn default() -> Self {
        RdmaSelection {
            device_pattern: default_device_pattern(),
            min_devices: 0,
        }
    }
}

fn default_device_pattern() -> String {
    "mlx5_*".to_string()
}

/// What gpunode does to a node once any of `classes` has drifted for `after`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.action != 'Taint' || (has(self.effect) && self.effect != 'None')")
    .message("effect is required when action is Taint: NoSchedule, PreferNoSchedule or NoExecute")
    .field_path(".effect"))]
#[x_kube(validation = Rule::new("self.action != 'TaintDevice' || (has(self.effect) && self.effect != 'PreferNoSchedule')")
    .message("effect is required when action is TaintDevice: None, NoSchedule or NoExecute (the effects of a DRA device taint)")
    .field_path(".effect"))]
#[x_kube(validation = Rule::new("self.action in ['Taint', 'TaintDevice'] || !has(self.effect)")
    .message("effect is only allowed when action is Taint or TaintDevice")
    .field_path(".effect"))]
#[x_kube(validation = Rule::new(format!(
    "self.action != 'TaintDevice' || self.classes.all(c, c in [{}])",
    gpu_scoped_list()
)).message(format!(
    "TaintDevice acts on one GPU, so its classes must be GPU-scoped: {}",
    gpu_scoped_names()
).as_str()).field_path(".classes"))]
#[x_kube(validation = Rule::new("!has(self.requireApproval) || !self.requireApproval || self.action in ['Taint', 'Cordon', 'Drain']")
    .message("requireApproval is for Taint, Cordon and Drain rules: a Label rule disrupts nothing, and a TaintDevice quarantine cannot wait for a person")
    .field_path(".requireApproval"))]
pub struct RemediationRule {
    /// Drift classes this rule acts on (at least one): Inventory, Driver, Config, Memory, Xid,
    /// Pcie, Nvlink, Thermal, Throttle, Cooling, Network, Stale, Validation. Listing Stale is the
    /// only way an Unknown node (no fresh report, failed collector) is ever acted on; Validation
    /// is a validation Job that failed on the node (`spec.validation`).
    #[schemars(length(min = 1, max = 13))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub classes: Vec<DriftClass>,

    /// What to do: Label (the drift labels only, never disruptive), Taint (add the taint
    /// gpunode.dev/drift=<class> with `effect`), Cordon (mark unschedulable), Drain (cordon,
    /// then evict pods through the Eviction API, honouring PodDisruptionBudgets), or TaintDevice
    /// (quarantine only the drifted GPU: on a node whose GPUs are published by a DRA driver, a
    /// DeviceTaintRule on that GPU's device with `effect`; on a device-plugin node, the
    /// gpunode.dev/unhealthy-gpus annotation for a scheduler extension, and with NoExecute the
    /// eviction of exactly the pods the node's report lists on that GPU (the probe reads the
    /// kubelet's PodResources API), or escalation where the report does not list them). A class
    /// listed by a TaintDevice rule is handled per GPU: the node's other rules act on it only
    /// once the node is escalated (see `quarantine.maxGpusPerNode`).
    pub action: RemediationAction,

    /// Required with Taint (NoSchedule, PreferNoSchedule or NoExecute) and with TaintDevice
    /// (None: marked only; NoSchedule: no new claims on the device; NoExecute: the pods using
    /// it are evicted too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,

    /// How long the drift must last before the action is taken, for example "30s" or "5m".
    /// Defaults to 0s (immediately).
    #[serde(default)]
    pub after: Duration,

    /// Take the action only once a person approved it on the node: the annotation
    /// gpunode.dev/approve lists the rule's action (Taint, Cordon or Drain), for example
    /// `kubectl annotate --overwrite node NODE gpunode.dev/approve=Drain`. Until then the action
    /// is pending (the node's condition, an AwaitingApproval event and the policy status print
    /// that command). Labels and the condition never wait. Defaults to false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_approval: bool,
}

/// The node annotation through which a person approves rungs that require it: a
/// comma-separated list of rule actions (Taint, Cordon, Drain) and repair step names.
pub const APPROVE_ANNOTATION: &str = "gpunode.dev/approve";

/// Where the drain's pod selector is, in errors and conditions.
pub const POD_SELECTOR_FIELD: &str = "spec.disruption.drain.podSelector";

impl RemediationRule {
    /// The classes as a set.
    pub fn class_set(&self) -> BTreeSet<DriftClass> {
        self.classes.iter().copied().collect()
    }
}

/// An action of the remediation ladder, from least to most disruptive.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[schemars(transform = crate::types::without_description)]
pub enum RemediationAction {
    /// Drift labels only.
    Label,
    /// Add a gpunode.dev/drift taint.
    Taint,
    /// Mark the node unschedulable.
    Cordon,
    /// Cordon and evict the node's pods.
    Drain,
    /// Quarantine one GPU.
    TaintDevice,
}

fn gpu_scoped_list() -> String {
    DriftClass::gpu_scoped()
        .map(|c| format!("'{}'", c.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn gpu_scoped_names() -> String {
    DriftClass::gpu_scoped()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A Kubernetes taint effect (of a node taint), or of a DRA device taint.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[schemars(transform = crate::types::without_description)]
pub enum TaintEffect {
    /// A device taint that only marks the device (no node taint has it).
    None,
    /// New pods that do not tolerate the taint are not scheduled; running pods stay.
    NoSchedule,
    /// The scheduler avoids the node when it can.
    PreferNoSchedule,
    /// Running pods that do not tolerate the taint are evicted by Kubernetes.
    NoExecute,
}

impl TaintEffect {
    /// The effect as Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::None => "None",
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }

    /// NoSchedule and NoExecute take capacity away and count against the budget.
    pub fn is_disruptive(self) -> bool {
        matches!(self, TaintEffect::NoSchedule | TaintEffect::NoExecute)
    }
}

/// Per-GPU quarantine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuarantinePolicy {
    /// Most GPUs of one node quarantined on their own. When more of a node's GPUs are due for
    /// quarantine than this, or a GPU cannot be quarantined on its own (the probe reports no
    /// UUID for it, or the node's ResourceSlices have no device with its UUID), the node is
    /// escalated: the node's other rules (Taint, Cordon, Drain) act on the GPU classes too.
    /// Defaults to 2.
    #[serde(default = "default_max_gpus_per_node")]
    #[schemars(range(min = 0, max = 64))]
    pub max_gpus_per_node: u32,

    /// The DRA driver whose ResourceSlices publish the node's GPUs, one device per GPU with its
    /// UUID as the attribute `uuid`. A node without a ResourceSlice of this driver is treated as
    /// a device-plugin node. Defaults to gpu.nvidia.com (the NVIDIA DRA driver).
    #[serde(default = "default_dra_driver")]
    #[schemars(length(min = 1, max = 63))]
    pub dra_driver: String,
}

impl Default for QuarantinePolicy {
    fn default() -> Self {
        QuarantinePolicy {
            max_gpus_per_node: default_max_gpus_per_node(),
            dra_driver: default_dra_driver(),
        }
    }
}

fn default_max_gpus_per_node() -> u32 {
    2
}

fn default_dra_driver() -> String {
    "gpu.nvidia.com".to_string()
}

/// Limits on disruption.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionPolicy {
    /// Most of this policy's nodes that may be disrupted at once (tainted NoSchedule or
    /// NoExecute, cordoned or draining by gpunode, or with a GPU quarantined NoSchedule or
    /// NoExecute): a number such as 1, or a percentage of the selected nodes such as "10%"
    /// (rounded down, but at least 1 when above 0%). A node counts once however many of its GPUs
    /// are quarantined and whatever else is done to it. Further disruptive actions wait until a
    /// node recovers. Labels and conditions are never limited. Defaults to 1.
    #[serde(default = "default_max_unavailable")]
    pub max_unavailable: MaxUnavailable,

    /// Stops every new disruptive action when too many nodes drift at once, which points to a
    /// systemic cause (a bad driver rollout, a fabric outage) rather than broken nodes.
    #[serde(default)]
    pub circuit_breaker: CircuitBreaker,

    /// How nodes are drained.
    #[serde(default)]
    pub drain: DrainPolicy,
}

impl Default for DisruptionPolicy {
    fn default() -> Self {
        DisruptionPolicy {
            max_unavailable: default_max_unavailable(),
            circuit_breaker: CircuitBreaker::default(),
            drain: DrainPolicy::default(),
        }
    }
}

fn default_max_unavailable() -> MaxUnavailable {
    MaxUnavailable::Count(1)
}

/// The circuit breaker.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreaker {
    /// Percentage of the selected nodes that may become drifted within `window` before the
    /// breaker opens (condition CircuitOpen) and new disruptive actions stop; a single drifting
    /// node never opens it. 100 disables the breaker. Defaults to 30.
    #[serde(default = "default_max_drifted_percent")]
    #[schemars(range(min = 0, max = 100))]
    pub max_drifted_percent: u32,

    /// The sliding window over which newly drifted nodes are counted. Defaults to 10m.
    #[serde(default = "default_breaker_window")]
    pub window: Duration,

    /// How an open breaker closes. It latches: once open it stays open (recorded in
    /// `status.circuitBreaker`, so a restart or a new leader keeps it open) until it closes.
    /// Manual (the default): only a person closes it, with `kubectl gpunode close-breaker
    /// POLICY`, which sets the annotation gpunode.dev/close-breaker to the trip's
    /// `status.circuitBreaker.openedAt`. Automatic: it also closes by itself once no more than
    /// `maxDriftedPercent` of the selected nodes (and one node) are drifted.
    #[serde(default)]
    pub reset: BreakerReset,
}

impl Default for CircuitBreaker {
    fn default() -> Self {
        CircuitBreaker {
            max_drifted_percent: default_max_drifted_percent(),
            window: default_breaker_window(),
            reset: BreakerReset::default(),
        }
    }
}

/// How an open circuit breaker closes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(transform = crate::types::without_description)]
pub enum BreakerReset {
    /// Only a person closes it (the annotation gpunode.dev/close-breaker).
    #[default]
    Manual,
    /// A person, or the drifted fraction falling back under the threshold.
    Automatic,
}

/// The policy annotation through which a person closes an open circuit breaker: its value is
/// the trip's `status.circuitBreaker.openedAt` (RFC 3339). Naming the trip means an annotation
/// left behind cannot close a later trip, which opens at another time; `kubectl gpunode
/// close-breaker POLICY` sets it.
pub const CLOSE_BREAKER_ANNOTATION: &str = "gpunode.dev/close-breaker";

/// Where the circuit breaker stands, kept in the policy status so that it latches across
/// operator restarts and leader changes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CircuitBreakerStatus {
    /// The breaker is open: no new disruption is taken on the policy's nodes.
    #[serde(default)]
    pub open: bool,
    /// When the open (or last) trip began: when the drift that crossed the threshold began.
    /// `kubectl gpunode close-breaker` closes the trip with this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_at: Option<Time>,
    /// Nodes that had begun drifting within the window when it opened.
    #[serde(default)]
    pub drifted: u32,
    /// Nodes the policy selected when it opened.
    #[serde(default)]
    pub of: u32,
    /// When it last closed. Drifts that began before it do not open it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_at: Option<Time>,
    /// Who closed it last: Person (the annotation) or Recovered (`reset: Automatic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by: Option<BreakerClosedBy>,
}

/// Who closed the circuit breaker.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[schemars(transform = crate::types::without_description)]
pub enum BreakerClosedBy {
    /// A person, with the annotation gpunode.dev/close-breaker.
    Person,
    /// The drifted fraction fell back under the threshold (`reset: Automatic`).
    Recovered,
}

fn default_max_drifted_percent() -> u32 {
    30
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn default_breaker_window() -> Duration {
    Duration::from_secs(600)
}

/// How a drain evicts pods.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainPolicy {
    /// How long a drain may take before it is reported as stuck (condition reason DrainStuck).
    /// A stuck drain keeps the node cordoned and keeps retrying; it is never forced.
    /// Defaults to 10m.
    #[serde(default = "default_drain_timeout")]
    pub timeout: Duration,

    /// Grace period given to each evicted pod, in seconds. Unset uses each pod's own
    /// terminationGracePeriodSeconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub grace_period_seconds: Option<i64>,

    /// Also evict pods that use emptyDir volumes (their data is lost). False leaves such pods
    /// running and the drain incomplete.
    #[serde(default)]
    pub delete_empty_dir_data: bool,

    /// Only pods matching this selector are evicted; by default every pod except DaemonSet
    /// pods, mirror (static) pods and pods in protected namespaces. Validated as Kubernetes
    /// validates its own selectors; a selector the operator cannot use evicts nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::selector::optional_schema")]
    pub pod_selector: Option<LabelSelector>,

    /// Namespaces whose pods are never evicted. Defaults to ["kube-system"].
    #[serde(default = "default_protected_namespaces")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub protected_namespaces: Vec<String>,
}

impl Default for DrainPolicy {
    fn default() -> Self {
        DrainPolicy {
            timeout: default_drain_timeout(),
            grace_period_seconds: None,
            delete_empty_dir_data: false,
            pod_selector: None,
            protected_namespaces: default_protected_namespaces(),
        }
    }
}

fn default_drain_timeout() -> Duration {
    Duration::from_secs(600)
}

fn default_protected_namespaces() -> Vec<String> {
    vec!["kube-system".to_string()]
}

/// When gpunode undoes its own actions.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryPolicy {
    /// How long a node must stay compliant before gpunode removes the taints and the cordon it
    /// added. It never removes what someone else added. Defaults to 5m.
    #[serde(default = "default_healthy_for")]
    pub healthy_for: Duration,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        RecoveryPolicy {
            healthy_for: default_healthy_for(),
        }
    }
}

fn default_healthy_for() -> Duration {
    Duration::from_secs(300)
}

/// What the operator observed and did for this policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodePolicyStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Ready, Degraded, BudgetExhausted, CircuitOpen, Conflict and Paused. Each changes its
    /// lastTransitionTime only when its status flips.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Nodes selected by this policy.
    #[serde(default)]
    pub matched: u32,
    /// Selected nodes that match the policy.
    #[serde(default)]
    pub compliant: u32,
    /// Selected nodes that drifted from the policy.
    #[serde(default)]
    pub drifted: u32,
    /// Selected nodes whose state is unknown (no fresh report, a failed collector).
    #[serde(default)]
    pub unknown: u32,
    /// Selected nodes carrying a gpunode taint.
    #[serde(default)]
    pub tainted: u32,
    /// Selected nodes cordoned by gpunode.
    #[serde(default)]
    pub cordoned: u32,
    /// Selected nodes gpunode is draining.
    #[serde(default)]
    pub draining: u32,
    /// GPUs of the selected nodes that gpunode quarantines on their own (TaintDevice).
    #[serde(default)]
    pub quarantined_gpus: u32,
    /// Selected nodes with a repair step running (`spec.repair`).
    #[serde(default)]
    pub repairing: u32,
    /// Selected nodes whose repair stopped and that need a person (condition reason
    /// NeedsHuman): every step was tried, or the node used its attempts within the window.
    #[serde(default)]
    pub needs_human: u32,
    /// Selected nodes with a validation Job running (`spec.validation`).
    #[serde(default)]
    pub validating: u32,

    /// Where the circuit breaker stands; it stays open until it is closed (see
    /// `spec.disruption.circuitBreaker.reset`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<CircuitBreakerStatus>,

    /// Nodes of this policy waiting for the operator's fleet-wide disruption cap
    /// (`--fleet-max-unavailable`, counted over every policy's nodes).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fleet_queued: u32,

    /// The drifted and unknown nodes, at most 50, oldest drift first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub drifted_nodes: Vec<DriftedNode>,

    /// True when drifted and unknown nodes beyond the 50 listed were left out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drifted_nodes_truncated: bool,
}

/// One drifted or unknown node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftedNode {
    /// Node name.
    pub node: String,
    /// Active drift classes.
    pub classes: Vec<DriftClass>,
    /// When the oldest active drift began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// What gpunode has done to the node (for example "Taint NoSchedule", "Cordon", "Drain").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<String>,
    /// In dry run, or while waiting on the budget or the breaker: what gpunode would do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_actions: Vec<String>,
    /// One line on the first drift, for example "gpu 3: HwThermalSlowdown is forbidden".
    pub message: String,
}
