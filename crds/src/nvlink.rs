//! NVLink error counters and the NVSwitch fabric state of a GPU, as a report publishes them:
//! one typed name per NVLink error counter, shared by the probe that counts them and the checks
//! that judge them, and the GPU's fabric registration (`nvmlDeviceGetGpuFabricInfoV`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most NVLinks a GPU has (`NVML_NVLINK_MAX_LINKS`).
pub const MAX_NVLINKS: usize = 18;

/// One NVLink data-link error counter (`nvmlNvLinkErrorCounter_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NvlinkCounter {
    /// `NVML_NVLINK_ERROR_DL_REPLAY`: flits the link sent again after a receive error.
    Replay,
    /// `NVML_NVLINK_ERROR_DL_RECOVERY`: times the link retrained to recover.
    Recovery,
    /// `NVML_NVLINK_ERROR_DL_CRC_FLIT`: flow-control flits received with a CRC error.
    CrcFlit,
    /// `NVML_NVLINK_ERROR_DL_CRC_DATA`: data flits received with a CRC error.
    CrcData,
}

impl NvlinkCounter {
    /// Every counter, in the report's order.
    pub const ALL: [NvlinkCounter; 4] = [
        NvlinkCounter::Replay,
        NvlinkCounter::Recovery,
        NvlinkCounter::CrcFlit,
        NvlinkCounter::CrcData,
    ];

    /// The report field, as a GPU's `errors` name it (`nvlink.errorRates.replayErrors`).
    pub fn field(self) -> &'static str {
        match self {
            NvlinkCounter::Replay => "nvlink.errorRates.replayErrors",
            NvlinkCounter::Recovery => "nvlink.errorRates.recoveryErrors",
            NvlinkCounter::CrcFlit => "nvlink.errorRates.crcFlitErrors",
            NvlinkCounter::CrcData => "nvlink.errorRates.crcDataErrors",
        }
    }

    /// NVML's name of the counter, which the person on call looks up (`nvidia-smi nvlink -e`
    /// prints the same counters).
    pub fn nvml_name(self) -> &'static str {
        match self {
            NvlinkCounter::Replay => "NVML_NVLINK_ERROR_DL_REPLAY",
            NvlinkCounter::Recovery => "NVML_NVLINK_ERROR_DL_RECOVERY",
            NvlinkCounter::CrcFlit => "NVML_NVLINK_ERROR_DL_CRC_FLIT",
            NvlinkCounter::CrcData => "NVML_NVLINK_ERROR_DL_CRC_DATA",
        }
    }
}

/// How often one NVLink's error counters rose over the last hour. Each value is the increase of
/// one NVML counter over the window, so it reads as events per hour; it is never extrapolated
/// from a shorter history, so right after a reboot, a GPU reset (which clears the counters) or
/// the link coming up it counts only what happened since (see `windowMinutes`). A value is
/// absent when NVML does not report that counter for the link: it is then not judged.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NvlinkErrorRates {
    /// The link's number (0-17).
    #[schemars(range(min = 0, max = 17))]
    pub link: u32,
    /// Minutes of history the counts cover: 60 once the probe has watched the link for an
    /// hour of this boot, less before.
    #[schemars(range(min = 0, max = 60))]
    pub window_minutes: u32,
    /// Data-link replays (`NVML_NVLINK_ERROR_DL_REPLAY`): flits sent again after the other end
    /// received them damaged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_errors: Option<u64>,
    /// Data-link recoveries (`NVML_NVLINK_ERROR_DL_RECOVERY`): the link retrained to recover,
    /// stalling its traffic meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_errors: Option<u64>,
    /// Flow-control flits received with a CRC error (`NVML_NVLINK_ERROR_DL_CRC_FLIT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc_flit_errors: Option<u64>,
    /// Data flits received with a CRC error (`NVML_NVLINK_ERROR_DL_CRC_DATA`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc_data_errors: Option<u64>,
}

impl NvlinkErrorRates {
    /// The count of `counter`, when reported.
    pub fn get(&self, counter: NvlinkCounter) -> Option<u64> {
        match counter {
            NvlinkCounter::Replay => self.replay_errors,
            NvlinkCounter::Recovery => self.recovery_errors,
            NvlinkCounter::CrcFlit => self.crc_flit_errors,
            NvlinkCounter::CrcData => self.crc_data_errors,
        }
    }

    /// Sets the count of `counter`.
    pub fn set(&mut self, counter: NvlinkCounter, count: Option<u64>) {
        let slot = match counter {
            NvlinkCounter::Replay => &mut self.replay_errors,
            NvlinkCounter::Recovery => &mut self.recovery_errors,
            NvlinkCounter::CrcFlit => &mut self.crc_flit_errors,
            NvlinkCounter::CrcData => &mut self.crc_data_errors,
        };
        *slot = count;
    }
}

/// Where the GPU's registration with the NVSwitch fabric stands (`nvmlGpuFabricState_t`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[schemars(transform = crate::types::without_description)]
pub enum FabricState {
    /// The GPU is not part of an NVSwitch fabric (PCIe boards, GPUs before Hopper, drivers
    /// without fabric support).
    NotSupported,
    /// Registration has not started: the Fabric Manager is not running or has not reached
    /// the GPU yet.
    NotStarted,
    /// Registration is under way.
    InProgress,
    /// Registration finished; `status` says whether it succeeded.
    Completed,
}

impl FabricState {
    /// The state NVML encodes as `value` (`NVML_GPU_FABRIC_STATE_*`); `None` for a value this
    /// API does not know.
    pub fn from_nvml(value: u8) -> Option<Self> {
        match value {
            0 => Some(FabricState::NotSupported),
            1 => Some(FabricState::NotStarted),
            2 => Some(FabricState::InProgress),
            3 => Some(FabricState::Completed),
            _ => None,
        }
    }

    /// The state as written in the API (`NotStarted`).
    pub fn as_str(self) -> &'static str {
        match self {
            FabricState::NotSupported => "NotSupported",
            FabricState::NotStarted => "NotStarted",
            FabricState::InProgress => "InProgress",
            FabricState::Completed => "Completed",
        }
    }
}

impl std::fmt::Display for FabricState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The GPU's NVSwitch fabric, as NVML reports it (`nvmlDeviceGetGpuFabricInfoV`). On HGX boards
/// a GPU whose registration did not complete (Fabric Manager down or of another version than
/// the driver) fails every CUDA job that uses NVLink while the rest of NVML looks healthy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuFabricStatus {
    /// Where the registration stands: NotSupported, NotStarted, InProgress or Completed.
    pub state: FabricState,
    /// The registration's result once Completed, as NVML names it: "Success", or why it
    /// failed (for example "NotSupported" or "Unknown"). Absent before it completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub status: Option<String>,
    /// The fabric clique (NVLink domain partition) the GPU belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clique_id: Option<u32>,
    /// The UUID of the fabric cluster the GPU belongs to; absent while it is all zeros.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 36))]
    pub cluster_uuid: Option<String>,
    /// Whether the fabric reports the GPU's NVLink bandwidth as degraded (health mask); absent
    /// where the driver does not report it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_degraded: Option<bool>,
    /// NVML's raw fabric health mask (`NVML_GPU_FABRIC_HEALTH_MASK_*`), for the bits this API
    /// does not name yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_mask: Option<u32>,
}

impl GpuFabricStatus {
    /// The registration completed and succeeded.
    pub fn registered(&self) -> bool {
        self.state == FabricState::Completed && self.status.as_deref() == Some(FABRIC_SUCCESS)
    }
}

/// The `status` of a registration that succeeded.
pub const FABRIC_SUCCESS: &str = "Success";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_counter_has_its_own_field_in_the_report() {
        let mut rates = NvlinkErrorRates::default();
        for (i, counter) in NvlinkCounter::ALL.into_iter().enumerate() {
            rates.set(counter, Some(i as u64 + 1));
        }
        let json = serde_json::to_value(&rates).unwrap_or_default();
        for (i, counter) in NvlinkCounter::ALL.into_iter().enumerate() {
            assert_eq!(rates.get(counter), Some(i as u64 + 1), "{counter:?}");
            let key = counter.field().trim_start_matches("nvlink.errorRates.");
            assert!(json.get(key).is_some(), "{key} is not a field of errorRates");
        }
    }

    #[test]
    fn decodes_fabric_states_and_refuses_unknown_ones() {
        assert_eq!(FabricState::from_nvml(3), Some(FabricState::Completed));
        assert_eq!(FabricState::from_nvml(1), Some(FabricState::NotStarted));
        assert_eq!(FabricState::from_nvml(4), None);
        let completed = |status: &str| GpuFabricStatus {
            state: FabricState::Completed,
            status: Some(status.to_owned()),
            clique_id: None,
            cluster_uuid: None,
            bandwidth_degraded: None,
            health_mask: None,
        };
        assert!(completed("Success").registered());
        assert!(!completed("NotSupported").registered());
    }
}
