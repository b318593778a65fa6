//! The resolution NVIDIA's XID catalogue gives each XID, and which of them make a GPU drift.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What NVIDIA's XID catalogue says to do right away about an XID (its "Resolution Bucket
/// (Immediate Action)"), spelled as the catalogue spells it. See [`crate::xid_catalog`].
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[schemars(transform = crate::types::without_description)]
pub enum XidResolution {
    /// Restart the application; the GPU itself is fine.
    #[serde(rename = "RESTART_APP")]
    RestartApp,
    /// Reset the GPU.
    #[serde(rename = "RESET_GPU")]
    ResetGpu,
    /// Reboot the bare-metal node.
    #[serde(rename = "RESTART_BM")]
    RestartBm,
    /// Restart the virtual machine.
    #[serde(rename = "RESTART_VM")]
    RestartVm,
    /// Contact NVIDIA support (also every XID the catalogue marks unused on current GPUs).
    #[serde(rename = "CONTACT_SUPPORT")]
    ContactSupport,
    /// Check cooling and power delivery.
    #[serde(rename = "CHECK_MECHANICALS")]
    CheckMechanicals,
    /// Update software or firmware.
    #[serde(rename = "UPDATE_SWFW")]
    UpdateSwfw,
    /// Nothing to do.
    #[serde(rename = "IGNORE")]
    Ignore,
    /// Check whether UVM was in use (XID 159).
    #[serde(rename = "CHECK_UVM")]
    CheckUvm,
    /// XID 45's workflow: follow the XID it accompanies.
    #[serde(rename = "WORKFLOW_XID_45")]
    WorkflowXid45,
    /// XID 48's workflow (double-bit ECC error): reset the GPU, then look at its memory.
    #[serde(rename = "WORKFLOW_XID_48")]
    WorkflowXid48,
    /// XID 74's workflow (NVLink error): decode the error registers.
    #[serde(rename = "WORKFLOW_NVLINK_ERR")]
    WorkflowNvlinkErr,
    /// XIDs 144-150's workflow (NVLink 5 errors): decode the error status.
    #[serde(rename = "WORKFLOW_NVLINK5_ERR")]
    WorkflowNvlink5Err,
    /// XID 154: the driver's recovery action changed; act on it (`gpu.recoveryAction`).
    #[serde(rename = "XID_154")]
    Xid154,
}

impl XidResolution {
    /// The resolution as NVIDIA spells it (`RESET_GPU`).
    pub fn as_str(self) -> &'static str {
        match self {
            XidResolution::RestartApp => "RESTART_APP",
            XidResolution::ResetGpu => "RESET_GPU",
            XidResolution::RestartBm => "RESTART_BM",
            XidResolution::RestartVm => "RESTART_VM",
            XidResolution::ContactSupport => "CONTACT_SUPPORT",
            XidResolution::CheckMechanicals => "CHECK_MECHANICALS",
            XidResolution::UpdateSwfw => "UPDATE_SWFW",
            XidResolution::Ignore => "IGNORE",
            XidResolution::CheckUvm => "CHECK_UVM",
            XidResolution::WorkflowXid45 => "WORKFLOW_XID_45",
            XidResolution::WorkflowXid48 => "WORKFLOW_XID_48",
            XidResolution::WorkflowNvlinkErr => "WORKFLOW_NVLINK_ERR",
            XidResolution::WorkflowNvlink5Err => "WORKFLOW_NVLINK5_ERR",
            XidResolution::Xid154 => "XID_154",
        }
    }
}

impl std::fmt::Display for XidResolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which catalogue resolutions make a GPU drift when one of its XIDs has them.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!('IGNORE' in self.driftOn)")
    .message("driftOn cannot list IGNORE: list such an XID in fatalXids by number to act on it")
    .field_path(".driftOn"))]
#[x_kube(validation = Rule::new("self.driftOn.all(r, self.driftOn.exists_one(s, s == r))")
    .message("driftOn lists a resolution twice")
    .field_path(".driftOn"))]
pub struct XidResolutionRequirements {
    /// The resolutions of NVIDIA's XID catalogue that make a GPU drift (class Xid) when it
    /// reports an XID with one of them, within `xidWindow`: RESTART_APP, RESET_GPU, RESTART_BM,
    /// RESTART_VM, CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW, CHECK_UVM, WORKFLOW_XID_45,
    /// WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR, XID_154. An XID the
    /// catalogue does not list never drifts by resolution (list it in fatalXids). XIDs in
    /// fatalXids drift by number whatever their resolution. Defaults to [RESET_GPU, RESTART_BM,
    /// WORKFLOW_XID_48]: the XIDs after which NVIDIA says the GPU or node must be reset, not
    /// those that end one application (RESTART_APP, such as XID 94, a contained ECC error).
    #[serde(default = "default_drift_on")]
    #[schemars(length(min = 1, max = 13))]
    pub drift_on: Vec<XidResolution>,
}

impl Default for XidResolutionRequirements {
    fn default() -> Self {
        XidResolutionRequirements {
            drift_on: default_drift_on(),
        }
    }
}

/// The resolutions that take the GPU or the node out of service: a reset, a reboot, and XID 48's
/// workflow, which starts with a reset.
pub fn default_drift_on() -> Vec<XidResolution> {
    vec![
        XidResolution::ResetGpu,
        XidResolution::RestartBm,
        XidResolution::WorkflowXid48,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_nvidia_spells_it() {
        let json = serde_json::to_string(&XidResolution::RestartBm).unwrap();
        assert_eq!(json, "\"RESTART_BM\"");
        let parsed: XidResolution = serde_json::from_str("\"WORKFLOW_NVLINK5_ERR\"").unwrap();
        assert_eq!(parsed, XidResolution::WorkflowNvlink5Err);
        assert_eq!(parsed.to_string(), "WORKFLOW_NVLINK5_ERR");
        let parsed: XidResolutionRequirements = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed.drift_on, default_drift_on());
    }

    #[test]
    fn as_str_matches_serde_for_every_resolution() {
        for r in crate::xid_catalog::CATALOG.iter().map(|e| e.resolution) {
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{r}\""));
        }
    }
}
