//! NVML's recovery action for a GPU: what the driver says a GPU needs before it can be trusted
//! again, as a report publishes it and as a policy acts on it.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the driver asks for before a GPU can be used again (NVML field
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[schemars(transform = crate::types::without_description)]
pub enum GpuRecoveryAction {
    /// Nothing to do.
    None,
    /// Reset the GPU.
    GpuReset,
    /// Reboot the node.
    NodeReboot,
    /// Stop peer-to-peer traffic through the GPU.
    #[serde(rename = "DrainP2P")]
    DrainP2p,
    /// Drain the GPU's work, then reset it.
    DrainAndReset,
}

impl GpuRecoveryAction {
    /// The action NVML encodes as `value` (`nvmlDeviceGpuRecoveryAction_t`); `None` for a value
    /// this API does not know.
    pub fn from_nvml(value: u64) -> Option<Self> {
        match value {
            0 => Some(GpuRecoveryAction::None),
            1 => Some(GpuRecoveryAction::GpuReset),
            2 => Some(GpuRecoveryAction::NodeReboot),
            3 => Some(GpuRecoveryAction::DrainP2p),
            4 => Some(GpuRecoveryAction::DrainAndReset),
            _ => None,
        }
    }

    /// The action as written in the API (`NodeReboot`).
    pub fn as_str(self) -> &'static str {
        match self {
            GpuRecoveryAction::None => "None",
            GpuRecoveryAction::GpuReset => "GpuReset",
            GpuRecoveryAction::NodeReboot => "NodeReboot",
            GpuRecoveryAction::DrainP2p => "DrainP2P",
            GpuRecoveryAction::DrainAndReset => "DrainAndReset",
        }
    }
}

impl std::fmt::Display for GpuRecoveryAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which recovery actions NVML may ask for before a GPU drifts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!('None' in self.driftOn)")
    .message("driftOn cannot list None: a GPU that needs nothing never drifts")
    .field_path(".driftOn"))]
#[x_kube(validation = Rule::new("self.driftOn.all(a, self.driftOn.exists_one(b, b == a))")
    .message("driftOn lists an action twice")
    .field_path(".driftOn"))]
pub struct RecoveryActionRequirements {
    /// The recovery actions that make a GPU drift (class Xid) while NVML asks for one of them:
    /// GpuReset, NodeReboot, DrainP2P, DrainAndReset. The drift ends when the action is done
    /// (a GPU reset, a reboot) and NVML reports None again. A GPU whose driver cannot report
    /// the action is Unknown for this check. Defaults to [GpuReset, NodeReboot, DrainAndReset].
    #[serde(default = "default_drift_on")]
    #[schemars(length(min = 1, max = 4))]
    pub drift_on: Vec<GpuRecoveryAction>,
}

impl Default for RecoveryActionRequirements {
    fn default() -> Self {
        RecoveryActionRequirements {
            drift_on: default_drift_on(),
        }
    }
}

/// The actions that take the GPU out of service: a reset, a reboot, a drain and reset.
pub fn default_drift_on() -> Vec<GpuRecoveryAction> {
    vec![
        GpuRecoveryAction::GpuReset,
        GpuRecoveryAction::NodeReboot,
        GpuRecoveryAction::DrainAndReset,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_nvml_values_and_refuses_unknown_ones() {
        assert_eq!(GpuRecoveryAction::from_nvml(0), Some(GpuRecoveryAction::None));
        assert_eq!(
            GpuRecoveryAction::from_nvml(2),
            Some(GpuRecoveryAction::NodeReboot)
        );
        assert_eq!(
            GpuRecoveryAction::from_nvml(4),
            Some(GpuRecoveryAction::DrainAndReset)
        );
        assert_eq!(GpuRecoveryAction::from_nvml(5), None);
    }

    #[test]
    fn serializes_as_the_api_spells_it() {
        let json = serde_json::to_string(&GpuRecoveryAction::DrainP2p).unwrap();
        assert_eq!(json, "\"DrainP2P\"");
        let parsed: RecoveryActionRequirements = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed.drift_on, default_drift_on());
    }
}
