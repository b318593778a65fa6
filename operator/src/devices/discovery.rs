//! Whether the API server serves DRA: the ResourceSlice and DeviceTaintRule resources of
//! `resource.k8s.io`, at the newest version that has both. Read once at start-up; nothing here
//! reads or writes a slice or a rule.

use kube::{Client, core::ApiResource};
use tracing::info;

/// Where the DRA kinds are served.
#[derive(Clone, Debug)]
pub struct Dra {
    /// ResourceSlices.
    pub slices: ApiResource,
    /// DeviceTaintRules.
    pub rules: ApiResource,
}

/// The versions gpunode understands, newest first.
const VERSIONS: [&str; 4] = ["v1", "v1beta2", "v1beta1", "v1alpha3"];

/// Where this cluster serves ResourceSlices and DeviceTaintRules (the newest version that serves
/// both); `None` when it does not.
pub async fn discover(client: &Client) -> Option<Dra> {
    let group = match kube::discovery::group(client, "resource.k8s.io").await {
        Ok(g) => g,
        Err(e) => {
            info!(reason = %e, "no DRA API (resource.k8s.io): every node is a device-plugin node");
            return None;
        }
    };
    for version in VERSIONS {
        let resources = group.versioned_resources(version);
        let find = |plural: &str| {
            resources
                .iter()
                .find(|(r, _)| r.plural == plural)
                .map(|(r, _)| r.clone())
        };
        if let (Some(slices), Some(rules)) = (find("resourceslices"), find("devicetaintrules")) {
            info!(version, "DRA: ResourceSlices and DeviceTaintRules served");
            return Some(Dra { slices, rules });
        }
    }
    info!("resource.k8s.io serves no DeviceTaintRules: every node is a device-plugin node");
    None
}
