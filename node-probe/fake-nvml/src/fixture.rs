//! The JSON fixture that describes the fake GPUs.
//!
//! Every key has a default that describes a healthy H100 SXM, so a fixture only spells out what a
//! test cares about. Numbers are read as signed 64-bit and handed to the caller truncated to the
//! C type, the way a misbehaving driver would: a fixture can therefore say `"temperature": -5` and
//! the probe sees the unsigned value NVML would have produced.

use std::collections::HashMap;

use serde::Deserialize;

/// The whole fake machine.
#[derive(Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Fixture {
    /// Free-form note for humans reading the fixture.
    pub comment: Option<String>,
    /// `nvmlInit_v2` returns this code when set (9 = driver not loaded).
    pub init_error: Option<u32>,
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: String,
    /// `nvmlSystemGetCudaDriverVersion_v2`, e.g. 12040 for CUDA 12.4.
    pub cuda_driver_version: i64,
    /// Return codes for calls that take no device (symbol name → code).
    pub errors: HashMap<String, u32>,
    /// C symbols of per-device calls that do not return (a hung driver) while the fixture lists
    /// them: each such call blocks until a rewritten fixture drops its name.
    pub hang: Vec<String>,
    /// Whether the caller runs as root: NVML's setters that need it
    /// (`nvmlDeviceSetPowerManagementLimit`) answer NoPermission otherwise, as for `nvidia-smi
    /// -pl` run by a user. Persistence mode and the reset calls do not check it (the fixtures of
    /// the reset tests describe the root probe and the reset DaemonSet).
    pub privileged: bool,
    /// The GPUs, in NVML index order.
    pub devices: Vec<Device>,
}

impl Default for Fixture {
    fn default() -> Self {
        Fixture {
            comment: None,
            init_error: None,
            driver_version: "550.90.07".to_owned(),
            cuda_driver_version: 12040,
            errors: HashMap::new(),
            hang: Vec::new(),
            privileged: false,
            devices: Vec::new(),
        }
    }
}

/// One GPU.
#[derive(Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Device {
    pub uuid: String,
    pub name: String,
    pub serial: String,
    /// `nvmlBrandType_t` (14 = NVIDIA).
    pub brand: i64,
    /// `nvmlDeviceArchitecture_t` (9 = Hopper). Below 7 (pre-Ampere) remapped rows are NotSupported.
    pub arch: i64,
    pub pci: Pci,
    pub memory: Memory,
    pub ecc: Ecc,
    pub retired_pages: RetiredPages,
    pub remapped_rows: RemappedRows,
    /// Core temperature, °C.
    pub temperature: i64,
    /// HBM temperature (field 82), °C; absent → that field sample is NotSupported.
    pub memory_temperature: Option<i64>,
    pub thresholds: Thresholds,
    /// NVML's recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and
    /// reset); absent → that field sample is NotSupported (drivers before it existed). A GPU
    /// reset clears 1 and 4; only a reboot (a new fixture, the hardware file gone) clears 2
    /// and 3.
    pub recovery_action: Option<i64>,
    /// Fan speeds in percent; absent → `nvmlDeviceGetNumFans` is NotSupported (SXM boards).
    pub fans: Option<Vec<i64>>,
    pub power_mw: i64,
    /// The power management limit (`nvmlDeviceGetPowerManagementLimit`), mW: the default unless
    /// someone set another. `nvmlDeviceSetPowerManagementLimit` sets it over the fixture's until
    /// the machine reboots (the hardware file gone); a GPU reset keeps it.
    pub power_limit_mw: i64,
    /// The limit the driver enforces (`nvmlDeviceGetEnforcedPowerLimit`), mW: the management
    /// limit, or lower where something else caps the board (then a set limit enforces the lower
    /// of the two).
    pub enforced_limit_mw: i64,
    /// The board's default power limit (nvmlDeviceGetPowerManagementDefaultLimit), mW.
    pub default_limit_mw: i64,
    /// The lowest limit `nvmlDeviceSetPowerManagementLimit` accepts
    /// (`nvmlDeviceGetPowerManagementLimitConstraints`), mW.
    pub min_limit_mw: i64,
    /// The highest limit it accepts, mW.
    pub max_limit_mw: i64,
    /// `nvmlClocksThrottleReasons` bitmask.
    pub throttle_reasons: u64,
    pub pcie: Pcie,
    /// One `nvmlEnableState_t` per NVLink; links past the end are InvalidArg.
    pub nvlink: Vec<i64>,
    /// Cumulative NVLink error counters per link (`nvmlDeviceGetNvLinkErrorCounter`), in link
    /// order; links not listed count 0. Like the driver's, they are volatile: a GPU reset clears
    /// them, and a link that is down has none (NotSupported).
    pub nvlink_errors: Vec<NvlinkErrors>,
    /// The NVSwitch fabric registration (`nvmlDeviceGetGpuFabricInfoV`); absent → the call is
    /// NotSupported, as on GPUs outside an NVSwitch fabric before Hopper.
    pub fabric: Option<Fabric>,
    pub persistence: i64,
    pub mig: Mig,
    /// `nvmlDeviceGetSupportedEventTypes` bitmask.
    pub supported_events: u64,
    /// Events to deliver through event sets registered on this device (see [`Event`]).
    pub events: Vec<Event>,
    /// Processes with a context on the GPU: `nvmlDeviceGetComputeRunningProcesses_v3` lists the
    /// compute ones, `nvmlDeviceGetGraphicsRunningProcesses_v3` the graphics ones. A GPU with any
    /// is in use: `nvmlDeviceRemoveGpu_v2` refuses it.
    pub processes: Vec<Process>,
    /// Return codes by C symbol name, checked before anything else. `"*"` applies to every
    /// call on the device except getting its handle (a GPU that fell off the bus: `{"*": 15}`); `"field:<id>"` fails one
    /// field-value sample.
    pub errors: HashMap<String, u32>,
}

impl Default for Device {
    fn default() -> Self {
        Device {
            uuid: "GPU-00000000-0000-0000-0000-000000000000".to_owned(),
            name: "NVIDIA H100 80GB HBM3".to_owned(),
            serial: "1650923012345".to_owned(),
            brand: 14,
            arch: 9,
            pci: Pci::default(),
            memory: Memory::default(),
            ecc: Ecc::default(),
            retired_pages: RetiredPages::default(),
            remapped_rows: RemappedRows::default(),
            temperature: 41,
            memory_temperature: Some(44),
            thresholds: Thresholds::default(),
            recovery_action: None,
            fans: None,
            power_mw: 71_000,
            power_limit_mw: 700_000,
            enforced_limit_mw: 700_000,
            default_limit_mw: 700_000,
            // H100 SXM5: 200-700 W.
            min_limit_mw: 200_000,
            max_limit_mw: 700_000,
            throttle_reasons: 0x1,
            pcie: Pcie::default(),
            nvlink: vec![1; 18],
            nvlink_errors: Vec::new(),
            fabric: None,
            persistence: 1,
            mig: Mig::default(),
            supported_events: 0x1 | 0x2 | 0x8 | 0x10 | 0x100,
            events: Vec::new(),
            processes: Vec::new(),
            errors: HashMap::new(),
        }
    }
}

/// A process using a GPU.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Process {
    pub pid: u32,
    /// Bytes of GPU memory it uses.
    pub used_memory: u64,
    /// A graphics context rather than a compute one.
    pub graphics: bool,
}

/// PCI identity.
#[derive(Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Pci {
    pub bus_id: String,
    pub domain: i64,
    pub bus: i64,
    pub device: i64,
    /// device << 16 | vendor; H100 SXM is 0x233010DE.
    pub pci_device_id: i64,
    pub pci_subsystem_id: i64,
}

impl Default for Pci {
    fn default() -> Self {
        Pci {
            bus_id: "00000000:18:00.0".to_owned(),
            domain: 0,
            bus: 0x18,
            device: 0,
            pci_device_id: 0x2330_10DE,
            pci_subsystem_id: 0x16C1_10DE,
        }
    }
}

/// Framebuffer, bytes.
#[derive(Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Memory {
    pub total: i64,
    pub reserved: i64,
    pub free: i64,
    pub used: i64,
}

impl Default for Memory {
    fn default() -> Self {
        Memory {
            total: 85_520_809_984,
            reserved: 563_347_456,
            free: 84_950_000_000,
            used: 570_000_000,
        }
    }
}

/// ECC mode and counters.
#[derive(Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Ecc {
    pub current: i64,
    pub pending: i64,
    pub vol: EccCounts,
    pub agg: EccCounts,
}

impl Default for Ecc {
    fn default() -> Self {
        Ecc {
            current: 1,
            pending: 1,
            vol: EccCounts::default(),
            agg: EccCounts::default(),
        }
    }
}

/// Corrected and uncorrected totals.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct EccCounts {
    pub corr: i64,
    pub unc: i64,
}

/// Retired page addresses by cause.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct RetiredPages {
    pub sbe: Vec<u64>,
    pub dbe: Vec<u64>,
    pub pending: i64,
}

/// `nvmlDeviceGetRemappedRows` outputs.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct RemappedRows {
    pub corr: i64,
    pub unc: i64,
    pub pending: i64,
    pub failure: i64,
}

/// Temperature thresholds, °C.
#[derive(Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Thresholds {
    pub shutdown: i64,
    pub slowdown: i64,
    pub mem_max: i64,
    pub gpu_max: i64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            shutdown: 92,
            slowdown: 89,
            mem_max: 95,
            gpu_max: 87,
        }
    }
}

/// PCIe link.
#[derive(Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Pcie {
    #[serde(rename = "gen")]
    pub generation: i64,
    pub max_gen: i64,
    pub width: i64,
    pub max_width: i64,
    pub replay: i64,
}

impl Default for Pcie {
    fn default() -> Self {
        Pcie {
            generation: 5,
            max_gen: 5,
            width: 16,
            max_width: 16,
            replay: 0,
        }
    }
}

/// MIG mode.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Mig {
    pub current: i64,
    pub pending: i64,
}

/// An event of this device.
///
/// Identified by `id` (default: its 1-based position in the list). It happens when a re-read of
/// the fixture first lists its id, and is then delivered `repeat` times to the event sets that
/// had registered its type on this device at that moment (as the real library delivers only
/// events that happen after registration). Events listed when the library is initialised are
/// never delivered; rewriting the list with the same ids delivers nothing new.
#[derive(Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Event {
    pub id: Option<u64>,
    /// Event type bit; 8 = critical XID error.
    #[serde(rename = "type")]
    pub event_type: u64,
    /// XID code (`eventData`).
    pub xid: u64,
    /// Delivered this many times (floods).
    pub repeat: u64,
}

impl Default for Event {
    fn default() -> Self {
        Event {
            id: None,
            event_type: 8,
            xid: 0,
            repeat: 1,
        }
    }
}

/// The error counters of one NVLink (`nvmlNvLinkErrorCounter_t`).
#[derive(Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NvlinkErrors {
    /// `NVML_NVLINK_ERROR_DL_REPLAY` (0).
    pub replay: u64,
    /// `NVML_NVLINK_ERROR_DL_RECOVERY` (1).
    pub recovery: u64,
    /// `NVML_NVLINK_ERROR_DL_CRC_FLIT` (2).
    pub crc_flit: u64,
    /// `NVML_NVLINK_ERROR_DL_CRC_DATA` (3).
    pub crc_data: u64,
    /// `NVML_NVLINK_ERROR_DL_ECC_DATA` (4).
    pub ecc_data: u64,
}

impl NvlinkErrors {
    /// The counter NVML numbers `counter`; None past the last one (InvalidArg).
    pub fn get(&self, counter: u32) -> Option<u64> {
        match counter {
            0 => Some(self.replay),
            1 => Some(self.recovery),
            2 => Some(self.crc_flit),
            3 => Some(self.crc_data),
            4 => Some(self.ecc_data),
            _ => None,
        }
    }

    /// These counters less `base` (what a reset cleared), when none is below it.
    pub fn since(&self, base: &NvlinkErrors) -> Option<NvlinkErrors> {
        Some(NvlinkErrors {
            replay: self.replay.checked_sub(base.replay)?,
            recovery: self.recovery.checked_sub(base.recovery)?,
            crc_flit: self.crc_flit.checked_sub(base.crc_flit)?,
            crc_data: self.crc_data.checked_sub(base.crc_data)?,
            ecc_data: self.ecc_data.checked_sub(base.ecc_data)?,
        })
    }
}

/// A GPU's NVSwitch fabric registration (`nvmlGpuFabricInfo_v2_t`/`_v3_t`).
#[derive(Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Fabric {
    /// `nvmlGpuFabricState_t`: 0 not supported, 1 not started, 2 in progress, 3 completed.
    pub state: i64,
    /// The registration's `nvmlReturn_t` (0 success), meaningful once completed.
    pub status: u32,
    pub clique_id: u32,
    /// The cluster UUID, as 32 hex digits (dashes allowed); empty → all zeros.
    pub cluster_uuid: String,
    /// `NVML_GPU_FABRIC_HEALTH_MASK_*` (2: bandwidth not degraded).
    pub health_mask: u32,
    /// v3's health summary.
    pub health_summary: u8,
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric {
            state: 3,
            status: 0,
            clique_id: 1,
            cluster_uuid: "6f1d0e54-9a1e-4c37-9b0e-1f5e6a7b8c9d".to_owned(),
            health_mask: 2,
            health_summary: 1,
        }
    }
}

impl Fabric {
    /// The cluster UUID's 16 bytes (zeros where the text is not hex).
    pub fn uuid_bytes(&self) -> [u8; 16] {
        let hex: Vec<u8> = self.cluster_uuid.bytes().filter(|b| *b != b'-').collect();
        let mut out = [0u8; 16];
        for (i, pair) in hex.chunks(2).take(16).enumerate() {
            let text = std::str::from_utf8(pair).unwrap_or("00");
            out[i] = u8::from_str_radix(text, 16).unwrap_or(0);
        }
        out
    }
}
