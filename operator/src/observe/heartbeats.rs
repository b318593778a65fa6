//! The node-probes' heartbeat Leases ([`gpunode_crds::heartbeat`]), as the operator reads them:
//! when each node's probe was last heard from. A probe rewrites its report only on a material
//! change (and every `--report-refresh`), so a report counts as fresh from the later of its
//! `observedAt` and its Lease's last renewal, the renewal timed by the operator's clock when it
//! arrived ([`stamp`]): a probe's clock may be off by minutes.
//!
//! A renewal is a trigger only for a node some policy last found stale ([`renewed`]): a probe
//! whose clock runs behind writes reports the operator takes as stale, and only its heartbeat
//! brings its node back.
//!
//! It only reads Leases: each is its probe's, and the operator never writes one.

use gpunode_crds::heartbeat::{lease_name, lease_node};
use jiff::Timestamp;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::runtime::{
    reflector::{ObjectRef, Store},
    watcher,
};

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

/// Annotation on the cached copy of a heartbeat Lease: the `renewTime` its probe wrote, by the
/// probe's clock (the copy's `renewTime` is on the operator's, see [`stamp`]).
const WRITTEN: &str = "gpunode.dev/renew-time-written";

/// Puts each heartbeat on the operator's clock as the watch delivers it: a renewal (a
/// `renewTime` other than the one cached) counts as heard when it arrived, whatever time the
/// probe wrote, so a probe whose clock runs behind is not stale while it renews and one whose
/// clock runs ahead goes stale `staleAfter` after its last renewal arrived, not that much plus
/// its skew. A Lease first seen in the initial list (the operator just started) keeps the time
/// its probe wrote, never later than now: it may be a dead probe's. `cached`: the Leases as
/// cached so far.
pub fn stamp(event: watcher::Event<Lease>, cached: &Store<Lease>, now: Timestamp) -> watcher::Event<Lease> {
    match event {
        watcher::Event::Apply(l) => watcher::Event::Apply(stamp_one(l, cached, now, true)),
        watcher::Event::InitApply(l) => watcher::Event::InitApply(stamp_one(l, cached, now, false)),
        other => other,
    }
}

fn stamp_one(mut lease: Lease, cached: &Store<Lease>, now: Timestamp, live: bool) -> Lease {
    let Some(written) = lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0)
    else {
        return lease;
    };
    let previous = cached.get(&ObjectRef::from_obj(&lease));
    let seen = previous.as_ref().and_then(|p| {
        let w = p
            .metadata
            .annotations
            .as_ref()?
            .get(WRITTEN)?
            .parse::<Timestamp>()
            .ok()?;
        Some((w, p.spec.as_ref()?.renew_time.as_ref()?.0))
    });
    let stamped = match seen {
        Some((w, at)) if w == written => at,
        _ if live || previous.is_some() => now,
        _ => written.min(now),
    };
    lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(WRITTEN.to_string(), written.to_string());
    if let Some(spec) = lease.spec.as_mut() {
        spec.renew_time = Some(MicroTime(stamped));
    }
    lease
}

/// The node whose probe `event` (as [`stamp`] left it at `now`) says was heard from just now:
/// a renewal, not a relist of one already seen.
pub fn renewed(event: &watcher::Event<Lease>, now: Timestamp) -> Option<&str> {
    let (watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) = event else {
        return None;
    };
    let name = lease.metadata.name.as_deref()?;
    let spec = lease.spec.as_ref()?;
    (spec.renew_time.as_ref()?.0 == now)
        .then(|| lease_node(name, spec.holder_identity.as_deref()))
        .flatten()
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
    use kube::runtime::reflector;

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

    /// Delivers `lease` as `event` does (stamped, trimmed) into the cache, at `now`.
    fn deliver(
        writer: &mut reflector::store::Writer<Lease>,
        store: &Store<Lease>,
        lease: Lease,
        live: bool,
        now: &str,
    ) {
        let mut lease = lease;
        trim(&mut lease);
        let event = if live {
            watcher::Event::Apply(lease)
        } else {
            watcher::Event::InitApply(lease)
        };
        writer.apply_watcher_event(&stamp(event, store, now.parse().unwrap()));
    }

    #[test]
    fn a_renewal_is_heard_when_it_arrives_whatever_the_probe_clock_says() {
        let (store, mut writer) = reflector::store::<Lease>();
        let h = Heartbeats::new(store.clone(), "gpunode-system");
        let at = |t: &str| t.parse::<Timestamp>().ok();
        // The initial list: the probe's own time, never ahead of the operator's.
        writer.apply_watcher_event(&watcher::Event::Init);
        deliver(
            &mut writer,
            &store,
            lease("gpunode-probe-a", "a", "2026-11-30T09:50:00Z"),
            false,
            "2026-11-30T10:00:00Z",
        );
        deliver(
            &mut writer,
            &store,
            lease("gpunode-probe-b", "b", "2026-11-30T10:10:00Z"),
            false,
            "2026-11-30T10:00:00Z",
        );
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(h.heard("a"), at("2026-11-30T09:50:00Z"));
        assert_eq!(h.heard("b"), at("2026-11-30T10:00:00Z"), "ahead: clamped to now");
        // Renewals by a probe 10 minutes behind and one 10 minutes ahead: heard on arrival.
        deliver(
            &mut writer,
            &store,
            lease("gpunode-probe-a", "a", "2026-11-30T09:51:00Z"),
            true,
            "2026-11-30T10:01:00Z",
        );
        deliver(
            &mut writer,
            &store,
            lease("gpunode-probe-b", "b", "2026-11-30T10:11:00Z"),
            true,
            "2026-11-30T10:01:00Z",
        );
        assert_eq!(h.heard("a"), at("2026-11-30T10:01:00Z"));
        assert_eq!(h.heard("b"), at("2026-11-30T10:01:00Z"));
        // The same renewal delivered again (a relist, another field changed) is no renewal.
        deliver(
            &mut writer,
            &store,
            lease("gpunode-probe-a", "a", "2026-11-30T09:51:00Z"),
            false,
            "2026-11-30T10:05:00Z",
        );
        deliver(
            &mut writer,
            &store,
            lease("gpunode-probe-b", "b", "2026-11-30T10:11:00Z"),
            true,
            "2026-11-30T10:05:00Z",
        );
        assert_eq!(h.heard("a"), at("2026-11-30T10:01:00Z"));
        assert_eq!(h.heard("b"), at("2026-11-30T10:01:00Z"));
    }

    #[test]
    fn only_a_renewal_names_its_node() {
        let (store, mut writer) = reflector::store::<Lease>();
        let now: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let behind = || lease("gpunode-probe-a", "a", "2026-11-30T09:50:00Z");
        let first = stamp(watcher::Event::Apply(behind()), &store, now);
        assert_eq!(renewed(&first, now), Some("a"), "first heard: a renewal");
        writer.apply_watcher_event(&first);
        let later: Timestamp = "2026-11-30T10:00:05Z".parse().unwrap();
        let again = stamp(watcher::Event::InitApply(behind()), &store, later);
        assert_eq!(renewed(&again, later), None, "the same renewal relisted");
        let stolen = stamp(
            watcher::Event::Apply(lease("gpunode-probe-a", "b", "2026-11-30T09:51:00Z")),
            &store,
            later,
        );
        assert_eq!(renewed(&stolen, later), None, "held by another node");
        assert_eq!(renewed(&watcher::Event::Delete(behind()), now), None);
    }
}
