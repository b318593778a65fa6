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

/// The eviction invariants: no pod evicted twice, and, where the run expected evictions, every
/// pod in `expected` evicted. A run that expects none gets no such row: with nothing to evict
/// it could not fail.
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
    let mut checks = vec![Check::new(
        "no pod evicted twice (audit log)",
        twice.is_empty(),
        format!(
            "{} evictions, repeated: {twice:?}",
            counts.values().sum::<usize>()
        ),
    )];
    if !expected.is_empty() {
        checks.push(Check::new(
            "every pod of a drained node evicted",
            missing.is_empty(),
            format!("{} expected, missing: {missing:?}", expected.len()),
        ));
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eviction(pod: &str, code: u16) -> AuditEvent {
        AuditEvent {
            verb: "create".into(),
            user: "op".into(),
            resource: "pods".into(),
            subresource: "eviction".into(),
            namespace: "ns".into(),
            name: pod.into(),
            pod: String::new(),
            dry_run: false,
            code,
            at: jiff::Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn nothing_to_evict_makes_no_every_pod_evicted_row() {
        let checks = eviction_checks(&[], "ns", &[]);
        assert_eq!(checks.len(), 1, "{checks:?}");
        assert!(checks[0].ok);
    }

    #[test]
    fn a_pod_not_evicted_or_evicted_twice_fails() {
        let expected = ["a".to_string(), "b".to_string()];
        let checks = eviction_checks(&[eviction("a", 201)], "ns", &expected);
        assert_eq!(checks.iter().map(|c| c.ok).collect::<Vec<_>>(), [true, false]);
        let twice = [eviction("a", 201), eviction("a", 201), eviction("b", 201)];
        let checks = eviction_checks(&twice, "ns", &expected);
        assert_eq!(checks.iter().map(|c| c.ok).collect::<Vec<_>>(), [false, true]);
        // An unknown outcome (5xx) of a pod that is gone counts as evicted.
        let unknown = [eviction("a", 201), eviction("b", 504)];
        assert!(eviction_checks(&unknown, "ns", &expected).iter().all(|c| c.ok));
    }
}
