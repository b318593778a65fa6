//! Which pods hold each DRA device: a ResourceClaim's allocation names its devices (driver,
//! pool, device) and its `reservedFor` the pods using them. On a DRA node this is what the
//! `gpus` PODS column shows (a device-plugin node's come from its report instead). Pure: the
//! claims are read by [`crate::fetch`].

use std::collections::BTreeMap;

use kube::{ResourceExt, api::DynamicObject};
use serde::Deserialize;

/// A device as a claim's allocation and a ResourceSlice name it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceKey {
    /// The DRA driver (`gpu.nvidia.com`).
    pub driver: String,
    /// The slice's pool.
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
}

/// The pods (`namespace/name`) each allocated device is reserved for.
pub type Holders = BTreeMap<DeviceKey, Vec<String>>;

/// The part of a ResourceClaim's status read here (the same at v1, v1beta2, v1beta1).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimStatus {
    #[serde(default)]
    allocation: Option<Allocation>,
    #[serde(default)]
    reserved_for: Vec<Consumer>,
}

#[derive(Debug, Deserialize)]
struct Allocation {
    #[serde(default)]
    devices: Option<AllocatedDevices>,
}

#[derive(Debug, Deserialize)]
struct AllocatedDevices {
    #[serde(default)]
    results: Vec<DeviceResult>,
}

#[derive(Debug, Deserialize)]
struct DeviceResult {
    driver: String,
    pool: String,
    device: String,
}

#[derive(Debug, Deserialize)]
struct Consumer {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    name: String,
}

/// The holders of every device the `claims` allocate. A claim without an allocation holds
/// nothing; one whose status cannot be read is left out (counted in the second value).
pub fn holders(claims: &[DynamicObject]) -> (Holders, usize) {
    let mut out = Holders::new();
    let mut unreadable = 0;
    for claim in claims {
        let status = match claim.data.get("status") {
            None => ClaimStatus::default(),
            Some(s) => match ClaimStatus::deserialize(s) {
                Ok(s) => s,
                Err(_) => {
                    unreadable += 1;
                    continue;
                }
            },
        };
        let namespace = claim.namespace().unwrap_or_default();
        let pods: Vec<String> = status
            .reserved_for
            .iter()
            .filter(|c| c.resource == "pods" && !c.name.is_empty())
            .map(|c| format!("{namespace}/{}", c.name))
            .collect();
        let results = status.allocation.and_then(|a| a.devices).map(|d| d.results);
        for r in results.unwrap_or_default() {
            let key = DeviceKey {
                driver: r.driver,
                pool: r.pool,
                device: r.device,
            };
            let held = out.entry(key).or_default();
            held.extend(pods.iter().cloned());
            held.sort();
            held.dedup();
        }
    }
    (out, unreadable)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(namespace: &str, status: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": namespace},
            "spec": {}, "status": status,
        }))
        .unwrap()
    }

    fn key(device: &str) -> DeviceKey {
        DeviceKey {
            driver: "gpu.nvidia.com".into(),
            pool: "h100-nvl".into(),
            device: device.into(),
        }
    }

    #[test]
    fn an_allocated_claim_gives_its_devices_to_the_pods_it_is_reserved_for() {
        let claims = [
            claim(
                "inference",
                json!({
                    "allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h100-nvl", "device": "gpu-0"}]}},
                    "reservedFor": [{"resource": "pods", "name": "infer-a", "uid": "1"}],
                }),
            ),
            claim(
                "inference",
                json!({
                    "allocation": {"devices": {"results": [
                        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "h100-nvl", "device": "gpu-1"}]}},
                }),
            ),
            claim("inference", json!({})),
            claim("x", json!({"reservedFor": "not a list"})),
        ];
        let (holders, unreadable) = holders(&claims);
        assert_eq!(
            holders.get(&key("gpu-0")),
            Some(&vec!["inference/infer-a".to_string()])
        );
        assert_eq!(
            holders.get(&key("gpu-1")),
            Some(&Vec::new()),
            "allocated, no pod yet"
        );
        assert_eq!(holders.len(), 2, "an unallocated claim holds nothing");
        assert_eq!(unreadable, 1);
    }
}
