//! The name of every check, as used in [`Drift::check`](crate::verdict::Drift::check) and
//! [`Unknown::check`](crate::verdict::Unknown::check): the policy field it checks.

/// No fresh report (missing, no status, no observedAt, older than staleAfter).
pub use crate::verdict::REPORT_CHECK as REPORT;

/// The nvml collector hung: an NVML call did not return within the probe's deadline (unknown
/// only, node). Listed beside the GPU checks it leaves unknown, so that the node's condition can
/// say the driver hung rather than that a check is unknown.
pub const NVML_HUNG: &str = "collectors.nvml";
/// Number of GPUs NVML sees (Inventory, node).
pub const GPU_COUNT: &str = "gpu.count";
/// Product name contains one of the accepted models (Inventory, per GPU).
pub const GPU_PRODUCTS: &str = "gpu.products";
/// Framebuffer memory (Inventory, per GPU).
pub const GPU_MIN_MEMORY_MIB: &str = "gpu.minMemoryMiB";
/// Driver version range (Driver, node).
pub const GPU_DRIVER_VERSION: &str = "gpu.driverVersion";
/// CUDA driver API version range (Driver, node).
pub const GPU_CUDA_VERSION: &str = "gpu.cudaVersion";
/// ECC mode (Config, per GPU).
pub const GPU_ECC_MODE: &str = "gpu.eccMode";
/// Persistence mode (Config, per GPU).
pub const GPU_PERSISTENCE_MODE: &str = "gpu.persistenceMode";
/// MIG mode (Config, per GPU).
pub const GPU_MIG_MODE: &str = "gpu.migMode";
/// PCIe link generation (Pcie, per GPU).
pub const GPU_PCIE_MIN_GENERATION: &str = "gpu.pcie.minGeneration";
/// PCIe link width (Pcie, per GPU).
pub const GPU_PCIE_MIN_WIDTH: &str = "gpu.pcie.minWidth";
/// Active NVLinks (Nvlink, per GPU).
pub const GPU_NVLINK_MIN_ACTIVE_LINKS: &str = "gpu.nvlink.minActiveLinks";
/// NVLink data-link replays per link and hour (Nvlink, per GPU).
pub const GPU_NVLINK_MAX_REPLAY_ERRORS: &str = "gpu.nvlink.maxReplayErrorsPerHour";
/// NVLink data-link recoveries per link and hour (Nvlink, per GPU).
pub const GPU_NVLINK_MAX_RECOVERY_ERRORS: &str = "gpu.nvlink.maxRecoveryErrorsPerHour";
/// NVLink flits with a CRC error per link and hour, flow-control and data each (Nvlink, per GPU).
pub const GPU_NVLINK_MAX_CRC_ERRORS: &str = "gpu.nvlink.maxCrcErrorsPerHour";
/// NVSwitch fabric registration completed with success (Nvlink, per GPU).
pub const GPU_NVLINK_REQUIRE_FABRIC_REGISTRATION: &str = "gpu.nvlink.requireFabricRegistration";
/// Volatile uncorrectable ECC errors (Memory, per GPU).
pub const GPU_MAX_VOLATILE_UNCORRECTED_ECC: &str = "gpu.maxVolatileUncorrectedEcc";
/// Retired pages and pending retirement (Memory, per GPU).
pub const GPU_MAX_RETIRED_PAGES: &str = "gpu.maxRetiredPages";
/// Row-remap failure or pending remap (Memory, per GPU).
pub const GPU_ALLOW_ROW_REMAP_FAILURE: &str = "gpu.allowRowRemapFailure";
/// Fatal XIDs within the window (Xid, per GPU).
pub const GPU_FATAL_XIDS: &str = "gpu.fatalXids";
/// XIDs whose catalogue resolution is listed in `driftOn`, within the window (Xid, per GPU).
pub const GPU_XID_RESOLUTION: &str = "gpu.xidResolution";
/// PCIe replays over the last hour (Pcie, per GPU).
pub const GPU_PCIE_MAX_REPLAYS_PER_HOUR: &str = "gpu.pcie.maxReplaysPerHour";
/// Enforced power limit as a share of the default limit (Config, per GPU).
pub const GPU_POWER_MIN_LIMIT_PERCENT: &str = "gpu.power.minLimitPercentOfDefault";
/// Enforced power limit, lowest (Config, per GPU).
pub const GPU_POWER_MIN_LIMIT_WATTS: &str = "gpu.power.minLimitWatts";
/// Enforced power limit, highest (Config, per GPU).
pub const GPU_POWER_MAX_LIMIT_WATTS: &str = "gpu.power.maxLimitWatts";
/// How long the hardware power brake held the clocks down (Throttle, per GPU).
pub const GPU_POWER_MAX_POWER_BRAKE: &str = "gpu.power.maxPowerBrake";
/// NVML's recovery action asks for one the policy drifts on (Xid, per GPU).
pub const GPU_RECOVERY_ACTION: &str = "gpu.recoveryAction";

/// GPU core temperature (Thermal, per GPU).
pub const COOLING_MAX_GPU_CELSIUS: &str = "cooling.maxGpuCelsius";
/// Distance to the slowdown threshold (Thermal, per GPU).
pub const COOLING_MIN_SLOWDOWN_MARGIN_CELSIUS: &str = "cooling.minSlowdownMarginCelsius";
/// HBM temperature (Thermal, per GPU).
pub const COOLING_MAX_MEMORY_CELSIUS: &str = "cooling.maxMemoryCelsius";
/// Forbidden clock-throttle reasons (Throttle, per GPU).
pub const COOLING_FORBIDDEN_THROTTLE_REASONS: &str = "cooling.forbiddenThrottleReasons";
/// Chassis sensor limits (Cooling, per sensor).
pub const COOLING_SENSORS: &str = "cooling.sensors";
/// Fan speed (Cooling, per fan).
pub const COOLING_MIN_FAN_RPM: &str = "cooling.minFanRpm";

/// Number of matching RDMA devices (Network, node).
pub const NETWORK_RDMA_MIN_DEVICES: &str = "network.rdma.minDevices";
/// RoCE v2 GID present (Network, per device).
pub const NETWORK_ROCE_V2: &str = "network.roceV2";
/// Exact set of PFC-enabled priorities (Network, per device).
pub const NETWORK_PFC_PRIORITIES: &str = "network.pfcPriorities";
/// QoS trust mode (Network, per device).
pub const NETWORK_TRUST: &str = "network.trust";
/// ECN enabled on the priorities (Network, per device).
pub const NETWORK_ECN_PRIORITIES: &str = "network.ecnPriorities";
/// MTU of the netdev (Network, per device).
pub const NETWORK_MIN_MTU: &str = "network.minMtu";
/// Negotiated rate (Network, per device).
pub const NETWORK_MIN_RATE_GBPS: &str = "network.minRateGbps";
/// Port state (Network, per device).
pub const NETWORK_PORT_STATE: &str = "network.portState";
/// Link flaps per hour (Network, per device).
pub const NETWORK_IB_MAX_LINK_DOWNED: &str = "network.infiniband.maxLinkDownedPerHour";
/// Symbol errors per hour (Network, per device).
pub const NETWORK_IB_MAX_SYMBOL_ERRORS: &str = "network.infiniband.maxSymbolErrorsPerHour";
/// Link error recoveries per hour (Network, per device).
pub const NETWORK_IB_MAX_LINK_ERROR_RECOVERY: &str = "network.infiniband.maxLinkErrorRecoveryPerHour";
/// Receive errors per hour (Network, per device).
pub const NETWORK_IB_MAX_RCV_ERRORS: &str = "network.infiniband.maxRcvErrorsPerHour";
/// Transmit discards per hour (Network, per device).
pub const NETWORK_IB_MAX_XMIT_DISCARDS: &str = "network.infiniband.maxXmitDiscardsPerHour";
/// Receive buffer overruns per hour (Network, per device).
pub const NETWORK_IB_MAX_BUFFER_OVERRUNS: &str = "network.infiniband.maxBufferOverrunsPerHour";
/// Local link integrity errors per hour (Network, per device).
pub const NETWORK_IB_MAX_LINK_INTEGRITY_ERRORS: &str = "network.infiniband.maxLinkIntegrityErrorsPerHour";
/// PFC pause storms stopped by the NIC's watchdog per hour (Network, per device).
pub const NETWORK_MAX_PAUSE_STORM_EVENTS: &str = "network.maxPauseStormEventsPerHour";
/// Packets a RoCE NIC dropped per hour, per discard counter (Network, per device).
pub const NETWORK_MAX_DISCARDS: &str = "network.maxDiscardsPerHour";
