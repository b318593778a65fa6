//! The fleet-wide disruption cap (`--fleet-max-unavailable`): its ledger of reservations, so that
//! policies reconciled at once cannot together pass it.
//!
//! "GPU nodes" are the nodes some policy selects; one is unavailable when its Ready condition is
//! not True, it is cordoned or tainted NoSchedule or NoExecute by anyone, or gpunode validates it
//! ([`crate::observe::unavailable`]). A taint whose key is ignored (`--fleet-ignore-taint`,
//! `nvidia.com/gpu` by default) does not count: a dedicated GPU pool taints every node NoSchedule
//! for good, which would otherwise fill the cap before anything drifted. The gate itself is the planner's (`Block::FleetCap` in
//! `plan::admission`); this module only feeds it and holds what passes took.
//!
//! The race: policies are reconciled concurrently (the controller runs one pass per policy at a
//! time, but many policies at once), so two passes could each count the last free slot from
//! the node cache and both take it. The ledger closes it with one process-wide lock: a pass
//! takes it ([`FleetLedger::lock`]), reads the count of unavailable GPU nodes the cache keeps
//! ([`crate::observe::FleetCount`]: kept as nodes change, not counted by every pass) and adds
//! the nodes other passes reserved and have not written yet ([`Ledger::fleet`]), plans (pure,
//! no await under the lock), reserves the available nodes its plan disrupts
//! ([`Ledger::reserve`]), and lets the lock go. The [`Reservation`] lives until the pass's
//! writes are done (by then the node cache reads gpunode's own writes back) and is dropped
//! whatever ends the pass: an error, a timeout, lost leadership. Only the leader reconciles, so
//! one process holds every reservation; a new leader starts with none and counts what its cache
//! shows.
//!
//! It writes nothing and decides nothing.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use gpunode_crds::MaxUnavailable;

use crate::{
    observe::{Caches, index::SelectorIndex},
    plan::Fleet,
};

/// The default cap: a fifth of the GPU nodes (at least one). Not a tenth: every policy's budget
/// allows at least one node, so three pools at 10% each (the demo's) may rightly disrupt 4 of 28.
pub const DEFAULT_FLEET_MAX_UNAVAILABLE: &str = "20%";

/// Why a cap cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("fleet max unavailable {value:?}: a number of nodes (3) or a percentage (\"10%\"): {why}")]
pub struct InvalidCap {
    value: String,
    why: String,
}

/// The taint keys the fleet cap ignores by default: the GPU pool taint that managed Kubernetes
/// services (and NVIDIA's documentation) put on every GPU node.
pub const DEFAULT_FLEET_IGNORE_TAINTS: &str = "nvidia.com/gpu";

/// Why a taint key cannot be ignored.
#[derive(Debug, thiserror::Error)]
#[error(
    "fleet ignore taint {0:?}: a taint key ([prefix/]name, name at most 63 characters of [A-Za-z0-9._-] beginning and ending with a letter or digit)"
)]
pub struct InvalidTaintKey(String);

/// Reads one taint key of `--fleet-ignore-taint`; an empty one stands for none (the chart's
/// empty list).
pub fn parse_taint_key(value: &str) -> Result<String, InvalidTaintKey> {
    let key = value.trim();
    let name = key.rsplit_once('/').map_or(key, |(_, name)| name);
    let prefix_ok = key
        .rsplit_once('/')
        .is_none_or(|(p, _)| gpunode_crds::names::is_object_name(p));
    if key.is_empty() || (prefix_ok && !name.is_empty() && gpunode_crds::names::is_label_value(name)) {
        Ok(key.to_string())
    } else {
        Err(InvalidTaintKey(value.to_string()))
    }
}

/// Reads a cap: a number of nodes or a percentage of the GPU nodes.
pub fn parse_cap(value: &str) -> Result<MaxUnavailable, InvalidCap> {
    let json = match value.trim().parse::<u64>() {
        Ok(n) => serde_json::Value::from(n),
        Err(_) => serde_json::Value::from(value.trim()),
    };
    serde_json::from_value(json).map_err(|e| InvalidCap {
        value: value.to_string(),
        why: e.to_string(),
    })
}

/// The cap and the nodes each policy's pass reserved.
#[derive(Debug)]
pub struct FleetLedger {
    cap: MaxUnavailable,
    ignored_taints: Vec<String>,
    reserved: Mutex<HashMap<String, Vec<String>>>,
}

impl FleetLedger {
    /// A ledger for `cap`, not counting taints with the keys `ignored_taints`, with nothing
    /// reserved.
    pub fn new(cap: MaxUnavailable, ignored_taints: Vec<String>) -> Arc<FleetLedger> {
        Arc::new(FleetLedger {
            cap,
            ignored_taints,
            reserved: Mutex::default(),
        })
    }

    /// Takes the lock for one pass's count, plan and reservation. Held only while nothing awaits.
    pub fn lock(self: &Arc<Self>) -> Ledger<'_> {
        Ledger {
            ledger: self,
            reserved: self.reserved.lock().unwrap_or_else(PoisonError::into_inner),
        }
    }

    fn release(&self, policy: &str) {
        self.reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(policy);
    }
}

/// The ledger, locked for one pass.
pub struct Ledger<'a> {
    ledger: &'a Arc<FleetLedger>,
    reserved: MutexGuard<'a, HashMap<String, Vec<String>>>,
}

impl Ledger<'_> {
    /// The fleet as the pass of `policy` sees it: the unavailable GPU nodes of the cache and
    /// the nodes other passes reserved; the cap resolved over the GPU nodes.
    pub fn fleet(&self, policy: &str, caches: &Caches, index: &SelectorIndex) -> Fleet {
        let counted = caches.fleet_count(index, &self.ledger.ignored_taints);
        self.fleet_of(policy, counted.unavailable, counted.gpu_nodes)
    }

    fn fleet_of(&self, policy: &str, mut unavailable: Arc<BTreeSet<String>>, gpu_nodes: u32) -> Fleet {
        for (other, nodes) in self.reserved.iter() {
            if other != policy && nodes.iter().any(|n| !unavailable.contains(n)) {
                Arc::make_mut(&mut unavailable).extend(nodes.iter().cloned());
            }
        }
        Fleet {
            allowed: self.ledger.cap.resolve(gpu_nodes),
            unavailable,
        }
    }

    /// Reserves the available nodes the plan of `policy` disrupts, until the returned
    /// reservation is dropped; releases the lock.
    pub fn reserve(mut self, policy: &str, nodes: &[String]) -> Reservation {
        if nodes.is_empty() {
            self.reserved.remove(policy);
        } else {
            self.reserved.insert(policy.to_string(), nodes.to_vec());
        }
        Reservation {
            ledger: self.ledger.clone(),
            policy: policy.to_string(),
        }
    }
}

/// What one pass reserved: released when dropped.
#[derive(Debug)]
pub struct Reservation {
    ledger: Arc<FleetLedger>,
    policy: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.ledger.release(&self.policy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_is_a_number_or_a_percentage() {
        assert_eq!(parse_cap("3").unwrap(), MaxUnavailable::Count(3));
        assert_eq!(parse_cap("10%").unwrap().resolve(29), 2);
        assert!(parse_cap("ten").is_err());
    }

    #[test]
    fn a_taint_key_to_ignore_is_validated() {
        assert_eq!(parse_taint_key("nvidia.com/gpu").unwrap(), "nvidia.com/gpu");
        assert_eq!(parse_taint_key("dedicated").unwrap(), "dedicated");
        assert_eq!(parse_taint_key("").unwrap(), "");
        for bad in ["nvidia.com/", "/gpu", "a b", "Bad_Prefix!/x"] {
            assert!(parse_taint_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_reservation_counts_for_other_passes_until_dropped() {
        let ledger = FleetLedger::new(MaxUnavailable::Count(2), Vec::new());
        let seen = Arc::new(BTreeSet::from(["x".to_string()]));
        let lock = ledger.lock();
        let fleet = lock.fleet_of("a", seen.clone(), 20);
        assert_eq!((fleet.allowed, fleet.unavailable.len()), (2, 1));
        let held = lock.reserve("a", &["n1".to_string()]);
        let other = ledger.lock();
        assert_eq!(other.fleet_of("b", seen.clone(), 20).unavailable.len(), 2);
        assert_eq!(
            other.fleet_of("a", seen.clone(), 20).unavailable.len(),
            1,
            "a pass does not count its own last reservation"
        );
        drop(other);
        drop(held);
        assert_eq!(ledger.lock().fleet_of("b", seen, 20).unavailable.len(), 1);
    }
}
