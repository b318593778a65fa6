//! The node-probe's heartbeat: a `coordination.k8s.io` Lease per node, in the release namespace.
//!
//! A probe writes its whole `GpuNodeReport` when something material changes and refreshes it
//! rarely; in between it only renews its Lease. A report is some 10 KB of nested status, which
//! the API server decodes, validates and re-encodes on every write (about 25 ms of its CPU, six
//! times a Lease renewal): one report write per node per minute would cost a 5,000-node cluster
//! two API-server cores. The kubelet splits its own heartbeat from Node status the same way.
//!
//! The operator counts a report as fresh from the later of its `status.observedAt` and its
//! Lease's `spec.renewTime`. This module is the contract between the two: the Lease's name
//! (derived in [`crate::names`]), label and holder.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};

/// Label on every probe heartbeat Lease; the operator watches Leases with it.
pub const LEASE_LABEL: &str = "gpunode.dev/heartbeat";
/// Value of [`LEASE_LABEL`].
pub const LEASE_LABEL_VALUE: &str = "node-probe";
/// Label selector of the probe heartbeat Leases.
pub const LEASE_SELECTOR: &str = "gpunode.dev/heartbeat=node-probe";
/// Prefix of a probe heartbeat Lease's name; the rest is the node's name.
pub use crate::names::LEASE_PREFIX;
/// Name of the heartbeat Lease of `node` ([`crate::names::heartbeat_lease_name`]).
pub use crate::names::heartbeat_lease_name as lease_name;

/// The node a heartbeat Lease is about: its name without [`LEASE_PREFIX`], when its
/// `spec.holderIdentity` names the same node (the admission policy makes a probe write only its
/// own node's Lease, holding it as that node).
pub fn lease_node<'a>(name: &'a str, holder: Option<&str>) -> Option<&'a str> {
    let node = name.strip_prefix(LEASE_PREFIX)?;
    (!node.is_empty() && holder == Some(node)).then_some(node)
}

/// A heartbeat Lease as a probe applies it: `name` (normally [`lease_name`]), labelled
/// [`LEASE_LABEL`], held by `holder`, renewed at `renewed`, lapsing after `duration_seconds`,
/// and owned by the Node `(name, uid)` when known, so it goes with the Node.
pub fn lease(
    name: &str,
    holder: &str,
    owner: Option<(&str, &str)>,
    duration_seconds: i32,
    renewed: MicroTime,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some([(LEASE_LABEL.to_string(), LEASE_LABEL_VALUE.to_string())].into()),
            owner_references: owner.map(|(node, uid)| {
                vec![OwnerReference {
                    api_version: "v1".to_string(),
                    kind: "Node".to_string(),
                    name: node.to_string(),
                    uid: uid.to_string(),
                    block_owner_deletion: Some(false),
                    ..OwnerReference::default()
                }]
            }),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_string()),
            lease_duration_seconds: Some(duration_seconds),
            renew_time: Some(renewed),
            ..LeaseSpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::MAX_NAME;

    #[test]
    fn lease_names_round_trip_and_overlong_nodes_have_none() {
        let name = lease_name("gpu-node-07");
        assert_eq!(name.as_deref(), Some("gpunode-probe-gpu-node-07"));
        assert_eq!(
            lease_node("gpunode-probe-gpu-node-07", Some("gpu-node-07")),
            Some("gpu-node-07")
        );
        assert_eq!(
            lease_node("gpunode-probe-gpu-node-07", Some("gpu-node-08")),
            None,
            "holder must match"
        );
        assert_eq!(lease_node("gpunode-probe-gpu-node-07", None), None);
        assert_eq!(lease_node("gpunode-operator", Some("gpunode-operator")), None);
        assert_eq!(lease_node("gpunode-probe-", Some("")), None);
        assert_eq!(lease_name(""), None);
        let longest = "n".repeat(MAX_NAME - LEASE_PREFIX.len());
        assert!(lease_name(&longest).is_some());
        assert_eq!(lease_name(&format!("{longest}n")), None);
    }
}
