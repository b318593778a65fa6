//! [`Check`]: one invariant checked after a run, with its evidence; [`eviction_checks`], the two
//! invariants the audit log answers (no pod evicted twice, every expected pod evicted).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::audit::{AuditEvent, evictions};

/// One invariant checked after a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub invariant: String,
    /// It held.
    pub ok: bool,
    /// The evidence (counts).
    pub detail: String,
}

impl Check {
    /// A check.
    pub fn new(invariant: &str, ok: bool, detail: impl Into<String>) -> Check {
        Check {
            invariant: invariant.to_string(),
            ok,
            detail: detail.into(),
        }
    }
}

/// The two eviction invariants: no pod evicted twice, every pod in `expected` evicted.
pub fn eviction_checks(events: &[AuditEvent], namespace: &str, expected: &[String]) -> Vec<Check> {
    let counts = evictions(events, namespace);
    let twice: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(p, n)| format!("{p}×{n}"))
        .collect();
    // A 5xx answer (a 504 on a loaded API server) leaves the outcome unknown to the client: the
    // eviction may have been committed, and then the operator correctly does not evict again.
    // Such a pod counts as evicted when it is gone, which the wave's own wait has already seen.
    let unknown_outcome: BTreeSet<String> = events
        .iter()
        .filter(|e| {
            e.resource == "pods"
                && e.subresource == "eviction"
                && e.verb == "create"
                && e.namespace == namespace
                && e.code >= 500
        })
        .map(|e| e.name.clone())
        .collect();
    let missing: Vec<&String> = expected
        .iter()
        .filter(|p| !counts.contains_key(*p) && !unknown_outcome.contains(*p))
        .collect();
    vec![
        Check::new(
            "no pod evicted twice (audit log)",
            twice.is_empty(),
            format!(
                "{} evictions, repeated: {twice:?}",
                counts.values().sum::<usize>()
            ),
        ),
        Check::new(
            "every pod of a drained node evicted",
            missing.is_empty(),
            format!("missing: {missing:?}"),
        ),
    ]
}
