//! The node-probes' heartbeat Leases ([`gpunode_crds::heartbeat`]), as the operator reads them:
//! when each node's probe was last heard from. A probe rewrites its report only on a material
//! change (and every `--report-refresh`), so a report counts as fresh from the later of its
//! `observedAt` and its Lease's `renewTime`.
//!
//! It only reads Leases: each is its probe's, and the operator never writes one.

use gpunode_crds::heartbeat::{lease_name, lease_node};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::runtime::reflector::{ObjectRef, Store};

/// The heartbeat Leases of one namespace (the release namespace).
#[derive(Clone)]
pub struct Heartbeats {
    leases: Option<(Store<Lease>, String)>,
}

impl Heartbeats {
    /// The Leases in `store`, all in `namespace`.
    pub fn new(store: Store<Lease>, namespace: &str) -> Self {
        Heartbeats {
            leases: Some((store, namespace.to_string())),
        }
    }

    /// No heartbeats: reports are fresh from their `observedAt` alone (benchmarks, tests).
    pub fn none() -> Self {
        Heartbeats { leases: None }
    }

    /// When `node`'s probe last renewed its Lease, if it has one held by that node.
    pub fn heard(&self, node: &str) -> Option<Timestamp> {
        let (store, namespace) = self.leases.as_ref()?;
        let name = lease_name(node)?;
        let lease = store.get(&ObjectRef::new(&name).within(namespace))?;
        let spec = lease.spec.as_ref()?;
        lease_node(&name, spec.holder_identity.as_deref())?;
        spec.renew_time.as_ref().map(|t| t.0)
    }
}

/// Keeps of a Lease what [`Heartbeats::heard`] reads: its name, holder and renewal.
pub fn trim(lease: &mut Lease) {
    let meta = &mut lease.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.labels = None;
    meta.annotations = None;
    lease.spec = lease.spec.take().map(|s| LeaseSpec {
        holder_identity: s.holder_identity,
        renew_time: s.renew_time,
        ..LeaseSpec::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::runtime::{reflector, watcher};

    fn lease(name: &str, holder: &str, renewed: &str) -> Lease {
        let renewed = MicroTime(renewed.parse().unwrap());
        let mut l = gpunode_crds::heartbeat::lease(name, holder, None, 180, renewed);
        l.metadata.namespace = Some("gpunode-system".to_string());
        l
    }

    #[test]
    fn a_node_is_heard_from_through_its_own_lease_only() {
        let (store, mut writer) = reflector::store::<Lease>();
        for mut l in [
            lease("gpunode-probe-a", "a", "2026-11-30T10:00:00Z"),
            lease("gpunode-probe-b", "a", "2026-11-30T10:00:00Z"),
            lease("gpunode-operator", "operator-0", "2026-11-30T10:00:00Z"),
        ] {
            trim(&mut l);
            writer.apply_watcher_event(&watcher::Event::Apply(l));
        }
        let h = Heartbeats::new(store, "gpunode-system");
        assert_eq!(h.heard("a"), "2026-11-30T10:00:00Z".parse().ok());
        assert_eq!(h.heard("b"), None, "held by another node");
        assert_eq!(h.heard("c"), None, "no Lease");
        assert_eq!(Heartbeats::none().heard("a"), None);
    }
}
