//! Small enumerations shared by policies and reports.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Drops an enum type's own description from the schema. kube's Option<enum> rewrite copies the
/// type's description over the field's, and the field's is the one `kubectl explain` should show.
pub(crate) fn without_description(schema: &mut schemars::Schema) {
    if let Some(obj) = schema.as_object_mut() {
        obj.remove("description");
    }
}

/// What kind of drift a check detects; remediation rules and node labels are keyed by class.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[schemars(transform = without_description)]
pub enum DriftClass {
    /// GPU count, model or memory size.
    Inventory,
    /// Driver or CUDA version.
    Driver,
    /// ECC, persistence or MIG mode.
    Config,
    /// ECC errors, retired pages, row remapping.
    Memory,
    /// Fatal XID errors.
    Xid,
    /// PCIe link generation or width.
    Pcie,
    /// NVLink connectivity.
    Nvlink,
    /// GPU or memory temperature, margin to slowdown.
    Thermal,
    /// Forbidden clock-throttle reasons.
    Throttle,
    /// Chassis sensors and fans.
    Cooling,
    /// RDMA / RoCE settings.
    Network,
    /// No fresh report, or a collector failed: the node is Unknown.
    Stale,
    /// A validation Job (`spec.validation`) failed or timed out on the node.
    Validation,
}

impl DriftClass {
    /// Every class, in ladder order.
    pub const ALL: [DriftClass; 13] = [
        DriftClass::Inventory,
        DriftClass::Driver,
        DriftClass::Config,
        DriftClass::Memory,
        DriftClass::Xid,
        DriftClass::Pcie,
        DriftClass::Nvlink,
        DriftClass::Thermal,
        DriftClass::Throttle,
        DriftClass::Cooling,
        DriftClass::Network,
        DriftClass::Stale,
        DriftClass::Validation,
    ];

    /// The class as written in the API (`Thermal`).
    pub fn as_str(self) -> &'static str {
        match self {
            DriftClass::Inventory => "Inventory",
            DriftClass::Driver => "Driver",
            DriftClass::Config => "Config",
            DriftClass::Memory => "Memory",
            DriftClass::Xid => "Xid",
            DriftClass::Pcie => "Pcie",
            DriftClass::Nvlink => "Nvlink",
            DriftClass::Thermal => "Thermal",
            DriftClass::Throttle => "Throttle",
            DriftClass::Cooling => "Cooling",
            DriftClass::Network => "Network",
            DriftClass::Stale => "Stale",
            DriftClass::Validation => "Validation",
        }
    }

    /// Whether a drift of this class is a fault of one GPU (Memory, Xid, Pcie, Nvlink, Thermal,
    /// Throttle) rather than of the node.
    pub fn is_gpu_scoped(self) -> bool {
        matches!(
            self,
            DriftClass::Memory
                | DriftClass::Xid
                | DriftClass::Pcie
                | DriftClass::Nvlink
                | DriftClass::Thermal
                | DriftClass::Throttle
        )
    }

    /// The GPU-scoped classes, in ladder order.
    pub fn gpu_scoped() -> impl Iterator<Item = DriftClass> {
        DriftClass::ALL.into_iter().filter(|c| c.is_gpu_scoped())
    }

    /// The class as used in label keys and taint values (`thermal`).
    pub fn label(self) -> String {
        self.as_str().to_ascii_lowercase()
    }
}

impl std::fmt::Display for DriftClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A clock-throttle reason as NVML reports it (`nvmlClocksEventReasons`), by name.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[schemars(transform = without_description)]
pub enum ThrottleReason {
    /// Nothing is running; clocks are idle.
    GpuIdle,
    /// Clocks are limited by an applications-clocks setting.
    ApplicationsClocksSetting,
    /// The software power cap is limiting clocks.
    SwPowerCap,
    /// Hardware slowdown (temperature, power brake or power supply) is reducing clocks by half or more.
    HwSlowdown,
    /// Clocks are held back to stay in sync with other GPUs (sync boost).
    SyncBoost,
    /// The driver is slowing clocks to keep the GPU under its thermal limit.
    SwThermalSlowdown,
    /// The hardware is slowing clocks because the GPU is too hot.
    HwThermalSlowdown,
    /// An external power brake (power supply or chassis) is slowing clocks.
    HwPowerBrakeSlowdown,
    /// Clocks are limited by the display clock setting.
    DisplayClockSetting,
}

impl ThrottleReason {
    /// Every reason with its NVML bit, in bit order.
    pub const BITS: [(ThrottleReason, u64); 9] = [
        (ThrottleReason::GpuIdle, 0x1),
        (ThrottleReason::ApplicationsClocksSetting, 0x2),
        (ThrottleReason::SwPowerCap, 0x4),
        (ThrottleReason::HwSlowdown, 0x8),
        (ThrottleReason::SyncBoost, 0x10),
        (ThrottleReason::SwThermalSlowdown, 0x20),
        (ThrottleReason::HwThermalSlowdown, 0x40),
        (ThrottleReason::HwPowerBrakeSlowdown, 0x80),
        (ThrottleReason::DisplayClockSetting, 0x100),
    ];

    /// The reasons set in an NVML bitmask; unknown bits are ignored.
    pub fn from_bits(mask: u64) -> Vec<ThrottleReason> {
        Self::BITS
            .iter()
            .filter(|(_, b)| mask & b != 0)
            .map(|(r, _)| *r)
            .collect()
    }
}

/// Enabled or Disabled, for NVML modes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = without_description)]
pub enum EnabledState {
    /// The mode is on.
    Enabled,
    /// The mode is off.
    Disabled,
}

/// QoS trust mode a policy requires.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = without_description)]
#[serde(rename_all = "lowercase")]
pub enum TrustMode {
    /// Classify by the DSCP field of the IP header (L3).
    Dscp,
    /// Classify by the VLAN PCP bits (L2).
    Pcp,
}

/// QoS trust mode a probe observed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = without_description)]
#[serde(rename_all = "lowercase")]
pub enum ObservedTrust {
    /// DSCP (L3).
    Dscp,
    /// PCP (L2).
    Pcp,
    /// Could not be read.
    Unknown,
}

/// State of an RDMA port (`/sys/class/infiniband/<dev>/ports/<n>/state`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[schemars(transform = without_description)]
pub enum PortState {
    /// Port is up and passing traffic (4: ACTIVE).
    Active,
    /// Link is up but not configured yet (3: ARMED).
    Armed,
    /// Link is up, waiting for the subnet manager (2: INIT).
    Init,
    /// No link (1: DOWN).
    Down,
}
