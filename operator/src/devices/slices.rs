//! ResourceSlices: the devices a DRA driver publishes for a node, trimmed to what a quarantine
//! needs (node, driver, pool, device name, UUID), and how they make a node's devices for the
//! planner, with the devices gpunode's rules hold while the slices are gone. Pure; it may not
//! import observe or apply.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::rules::{self, DEVICE_TAINT_KEY, DeviceTaintRule};
use crate::plan::{DeviceRef, GpuPods, NodeDevices};

/// A ResourceSlice, as gpunode reads it.
pub type ResourceSlice = kube::core::Object<SliceSpec, kube::core::NotUsed>;

/// The parts of a ResourceSlice's spec gpunode reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
pub struct SliceSpec {
    /// The driver that publishes it.
    #[serde(default)]
    pub driver: String,
    /// The node its devices are on (slices of network-attached devices have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Its pool.
    #[serde(default)]
    pub pool: SlicePool,
    /// Its devices.
    #[serde(default)]
    pub devices: Vec<SliceDevice>,
}

/// A ResourceSlice's pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SlicePool {
    /// The pool's name.
    #[serde(default)]
    pub name: String,
}

/// One device of a ResourceSlice.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct SliceDevice {
    /// Its name in the pool.
    #[serde(default)]
    pub name: String,
    /// Its attributes (v1, v1beta2).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, Attribute>,
    /// Its attributes under `basic` (v1beta1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<BasicDevice>,
}

/// v1beta1's `basic` device.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct BasicDevice {
    /// Its attributes.
    #[serde(default)]
    pub attributes: BTreeMap<String, Attribute>,
}

/// A device attribute; only string values matter here.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Attribute {
    /// A string value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
}

impl SliceDevice {
    /// The device's UUID attribute: `uuid`, or qualified by the driver's name (`gpu.nvidia.com/uuid`).
    pub fn uuid(&self, driver: &str) -> Option<&str> {
        let qualified = format!("{driver}/uuid");
        let attrs = [Some(&self.attributes), self.basic.as_ref().map(|b| &b.attributes)];
        attrs.into_iter().flatten().find_map(|a| {
            a.get("uuid")
                .or_else(|| a.get(&qualified))
                .and_then(|v| v.string.as_deref())
        })
    }
}

/// Keeps only what a quarantine needs: the devices' names and UUIDs.
pub fn trim_slice(slice: &mut ResourceSlice) {
    slice.metadata.managed_fields = None;
    slice.metadata.annotations = None;
    let driver = slice.spec.driver.clone();
    for d in &mut slice.spec.devices {
        let uuid = d.uuid(&driver).map(str::to_string);
        d.basic = None;
        d.attributes = uuid
            .map(|u| BTreeMap::from([("uuid".to_string(), Attribute { string: Some(u) })]))
            .unwrap_or_default();
    }
}

/// The devices `driver` publishes for `node` in `slices`, by UUID; `None` when no slice of that
/// driver names the node (a device-plugin node).
pub fn node_devices<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
    node: &str,
    driver: &str,
) -> Option<BTreeMap<String, DeviceRef>> {
    let mut found = false;
    let mut out = BTreeMap::new();
    for s in slices {
        if s.spec.driver != driver || s.spec.node_name.as_deref() != Some(node) {
            continue;
        }
        found = true;
        for d in &s.spec.devices {
            if let Some(uuid) = d.uuid(driver) {
                out.insert(
                    uuid.to_string(),
                    DeviceRef {
                        driver: driver.to_string(),
                        pool: s.spec.pool.name.clone(),
                        device: d.name.clone(),
                    },
                );
            }
        }
    }
    found.then_some(out)
}

/// The devices of `node` that `policy` may quarantine on: those `driver` publishes in its
/// `slices` ([`node_devices`]) and, for each GPU the policy holds quarantined by one of gpunode's
/// rules of the node (`rules`) that the slices do not list, the device that rule names. A DRA
/// driver that restarts withdraws and republishes its slices; a quarantine in effect stays
/// through that gap instead of escalating to the node's rules (its drain). `None` when neither
/// names a device of the node (a device-plugin node).
pub fn held_node_devices<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
    rules: impl IntoIterator<Item = &'a DeviceTaintRule>,
    node: &str,
    driver: &str,
    policy: &str,
) -> Option<BTreeMap<String, DeviceRef>> {
    let mut out = node_devices(slices, node, driver);
    for rule in rules {
        let selector = &rule.spec.device_selector;
        let (Some(gpu), Some(pool), Some(device)) = (
            rules::gpu_of(rule),
            selector.pool.as_ref(),
            selector.device.as_ref(),
        ) else {
            continue;
        };
        let policy_of = rule.spec.taint.value.as_deref();
        if selector.driver.as_deref() != Some(driver)
            || rule.spec.taint.key != DEVICE_TAINT_KEY
            || policy_of != Some(policy)
            || rule.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        out.get_or_insert_with(BTreeMap::new)
            .entry(gpu.to_string())
            .or_insert_with(|| DeviceRef {
                driver: driver.to_string(),
                pool: pool.clone(),
                device: device.clone(),
            });
    }
    out
}

/// How a node's GPUs reach pods: its DRA devices when `driver` publishes any for it, otherwise
/// the device plugin, with the pods the node's report says hold each GPU.
pub fn devices_of(dra: Option<BTreeMap<String, DeviceRef>>, pods: Option<GpuPods>) -> NodeDevices {
    match dra {
        Some(devices) => NodeDevices::Dra(devices),
        None => NodeDevices::DevicePlugin(pods),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn slice(node: &str, driver: &str, devices: serde_json::Value) -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-{driver}")},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn devices_are_found_by_uuid_whatever_their_names_and_versions() {
        let v1 = slice(
            "n1",
            "gpu.nvidia.com",
            serde_json::json!([
                {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}, "index": {"int": 0}}},
                {"name": "weird-name", "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-b"}}},
                {"name": "no-uuid", "attributes": {"index": {"int": 2}}},
            ]),
        );
        let beta1 = slice(
            "n2",
            "gpu.nvidia.com",
            serde_json::json!([{"name": "gpu-0", "basic": {"attributes": {"uuid": {"string": "GPU-c"}}}}]),
        );
        let other = slice("n3", "other.example.com", serde_json::json!([]));
        let mut trimmed = v1.clone();
        trim_slice(&mut trimmed);
        let all = [trimmed, beta1, other];
        let n1 = node_devices(&all, "n1", "gpu.nvidia.com").unwrap_or_default();
        assert_eq!(n1.len(), 2, "{n1:?}");
        assert_eq!(n1["GPU-a"].device, "gpu-0");
        assert_eq!(
            n1["GPU-b"].device, "weird-name",
            "matched on the UUID, not the name"
        );
        assert_eq!(n1["GPU-a"].pool, "n1");
        assert_eq!(
            node_devices(&all, "n2", "gpu.nvidia.com").map(|d| d.len()),
            Some(1)
        );
        assert_eq!(
            node_devices(&all, "n3", "gpu.nvidia.com"),
            None,
            "another driver's slice: a device-plugin node"
        );
        assert_eq!(node_devices(&all, "n9", "gpu.nvidia.com"), None);
    }

    fn rule(gpu: &str, driver: &str, pool: &str, device: &str, policy: &str) -> DeviceTaintRule {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": format!("gpunode-n1-{}", gpu.to_ascii_lowercase()),
                         "labels": {"app.kubernetes.io/managed-by": "gpunode", "gpunode.dev/node": "n1", "gpunode.dev/gpu": gpu}},
            "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": device},
                     "taint": {"key": DEVICE_TAINT_KEY, "value": policy, "effect": "NoExecute"}},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A DRA driver restarting withdraws its slices: the quarantines in effect keep their
    /// devices (and so their rules) instead of escalating to the node's drain; a GPU nobody
    /// quarantined is not invented, and the slices win when they are back.
    #[test]
    fn a_quarantined_gpu_keeps_its_device_while_the_slices_are_gone() {
        let held = rule("GPU-e", "gpu.nvidia.com", "n1", "gpu-5", "p");
        let other_policy = rule("GPU-f", "gpu.nvidia.com", "n1", "gpu-6", "q");
        let other_driver = rule("GPU-g", "other.example.com", "n1", "gpu-7", "p");
        let rules = [held.clone(), other_policy, other_driver];
        let none: [ResourceSlice; 0] = [];
        let gone = held_node_devices(&none, &rules, "n1", "gpu.nvidia.com", "p").unwrap_or_default();
        assert_eq!(gone.len(), 1, "{gone:?}");
        assert_eq!(gone["GPU-e"].device, "gpu-5");
        assert_eq!(gone["GPU-e"].pool, "n1");
        assert_eq!(
            held_node_devices(&none, &[], "n1", "gpu.nvidia.com", "p"),
            None,
            "no slice and no rule: a device-plugin node"
        );
        let back = slice(
            "n1",
            "gpu.nvidia.com",
            serde_json::json!([
                {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}}},
                {"name": "renamed-5", "attributes": {"uuid": {"string": "GPU-e"}}},
            ]),
        );
        let both = held_node_devices([&back], &rules, "n1", "gpu.nvidia.com", "p").unwrap_or_default();
        assert_eq!(both.len(), 2, "{both:?}");
        assert_eq!(both["GPU-e"].device, "renamed-5", "the slices win");
        let mut deleting = held;
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(
            held_node_devices(&none, [&deleting], "n1", "gpu.nvidia.com", "p"),
            None,
            "a rule being deleted holds nothing"
        );
    }
}
