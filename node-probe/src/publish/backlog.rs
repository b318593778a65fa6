//! What waits to be written and why: [`Due`] (the reason for the next write), [`Pending`] (the
//! observation it writes) and [`Backlog`] (nothing, held back, or failed), with the rules that
//! combine them: which reason wins ([`Due::merge`]), what a new observation does to what waits
//! ([`Backlog::after_observation`]) and when a write may go out ([`ready_at`]).
//!
//! Pure data and rules: no clock (instants come in as arguments), no I/O, no logging. Within
//! [`crate::publish`] it may import only [`super::config`].

use std::sync::Arc;

use gpunode_crds::report::GpuNodeReportStatus;
use tokio::time::Instant;

use super::config::PublishConfig;
use crate::change::Change;

/// Why the next write happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// A material change: the whole report, now (a recovery: after `recovery_gap`).
    Change {
        /// What changed.
        why: String,
        /// Only findings cleared (see [`crate::change::Change::is_recovery`]).
        recovery: bool,
    },
    /// `report_refresh` passed: the whole report.
    Refresh,
    /// `heartbeat` passed: the Lease (see [`super::ReportSink::heartbeat`]).
    Heartbeat,
}

impl Due {
    /// The first observation: nothing was published yet, so the report is created.
    pub fn first() -> Due {
        Due::Change {
            why: "first observation".into(),
            recovery: false,
        }
    }

    /// A write for `changes` (not empty): their texts joined, a recovery when all of them are.
    pub fn changed(changes: &[Change]) -> Due {
        let text: Vec<String> = changes.iter().map(ToString::to_string).collect();
        Due::Change {
            why: text.join("; "),
            recovery: changes.iter().all(Change::is_recovery),
        }
    }

    /// Of two reasons, the one that writes more wins (the earlier change keeps its text).
    pub fn merge(old: Due, new: Due) -> Due {
        let rank = |d: &Due| match d {
            Due::Change { recovery: false, .. } => 3,
            Due::Change { recovery: true, .. } => 2,
            Due::Refresh => 1,
            Due::Heartbeat => 0,
        };
        if rank(&old) >= rank(&new) { old } else { new }
    }
}

/// An observation waiting to be written, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The newest observation (an older one waiting is replaced, never queued).
    pub status: Arc<GpuNodeReportStatus>,
    /// Why it is to be written.
    pub due: Due,
}

/// What waits to be written.
#[derive(Debug, Clone, PartialEq)]
pub enum Backlog {
    /// Nothing: the last write succeeded (or none was due yet).
    Clear,
    /// A write held back by `min_gap` after the last report write or, for a recovery, by
    /// `recovery_gap`.
    Held(Pending),
    /// A write failed since the last success: retried after the backoff, and the next write is
    /// the whole report, so that an operator that saw this node go stale sees it back (a Lease
    /// renewal alone is no report event) whatever it missed meanwhile.
    Failed(Pending),
}

impl Backlog {
    /// What waits after a new observation `status`, for which `due` says what (if anything) to
    /// write. Only the newest observation is kept. After a failed write the reason that writes
    /// most stays (what failed must still be written); otherwise what waits was decided against
    /// the same published report as `due`, which replaces it (a recovery that reverted before
    /// its gap passed is not written).
    pub fn after_observation(self, status: Arc<GpuNodeReportStatus>, due: Option<Due>) -> Backlog {
        match (self, due) {
            (Backlog::Clear | Backlog::Held(_), None) => Backlog::Clear,
            (Backlog::Clear | Backlog::Held(_), Some(due)) => Backlog::Held(Pending { status, due }),
            (Backlog::Failed(old), None) => Backlog::Failed(Pending { status, due: old.due }),
            (Backlog::Failed(old), Some(new)) => Backlog::Failed(Pending {
                status,
                due: Due::merge(old.due, new),
            }),
        }
    }

    /// The write that waits, if any.
    pub fn pending(&self) -> Option<&Pending> {
        match self {
            Backlog::Clear => None,
            Backlog::Held(pending) | Backlog::Failed(pending) => Some(pending),
        }
    }
}

/// When a write for `due` may happen: after the backoff or `min_gap` (`next_attempt`), and a
/// recovery only `recovery_gap` after the last report write.
pub fn ready_at(
    due: &Due,
    next_attempt: Instant,
    last_report_at: Option<Instant>,
    config: &PublishConfig,
) -> Instant {
    match (due, last_report_at) {
        (Due::Change { recovery: true, .. }, Some(last)) => next_attempt.max(last + config.recovery_gap),
        _ => next_attempt,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn change(recovery: bool) -> Due {
        Due::Change {
            why: if recovery { "cleared" } else { "worse" }.into(),
            recovery,
        }
    }

    fn status(tag: &str) -> Arc<GpuNodeReportStatus> {
        Arc::new(GpuNodeReportStatus {
            probe_version: Some(tag.into()),
            ..GpuNodeReportStatus::default()
        })
    }

    fn pending(tag: &str, due: Due) -> Pending {
        Pending {
            status: status(tag),
            due,
        }
    }

    #[test]
    fn the_reason_that_writes_more_wins_and_a_tie_keeps_the_older() {
        let worse = change(false);
        let cleared = change(true);
        let rows = [
            (Due::Heartbeat, Due::Refresh, Due::Refresh),
            (Due::Refresh, Due::Heartbeat, Due::Refresh),
            (Due::Refresh, cleared.clone(), cleared.clone()),
            (cleared.clone(), worse.clone(), worse.clone()),
            (worse.clone(), cleared.clone(), worse.clone()),
            (worse.clone(), Due::Heartbeat, worse.clone()),
            (
                worse.clone(),
                Due::Change {
                    why: "newer".into(),
                    recovery: false,
                },
                worse.clone(),
            ),
        ];
        for (old, new, expected) in rows {
            assert_eq!(
                Due::merge(old.clone(), new.clone()),
                expected,
                "{old:?} + {new:?}"
            );
        }
    }

    #[test]
    fn an_observation_replaces_what_waits_unless_a_write_failed() {
        let rows = [
            ("nothing, nothing due", Backlog::Clear, None, Backlog::Clear),
            (
                "nothing, due",
                Backlog::Clear,
                Some(Due::Refresh),
                Backlog::Held(pending("new", Due::Refresh)),
            ),
            (
                "held, nothing due any more (a reverted recovery)",
                Backlog::Held(pending("old", change(true))),
                None,
                Backlog::Clear,
            ),
            (
                "held, a new reason replaces the old",
                Backlog::Held(pending("old", change(false))),
                Some(Due::Heartbeat),
                Backlog::Held(pending("new", Due::Heartbeat)),
            ),
            (
                "failed, nothing new due: the failed reason stays",
                Backlog::Failed(pending("old", change(false))),
                None,
                Backlog::Failed(pending("new", change(false))),
            ),
            (
                "failed, a weaker reason: the failed one stays",
                Backlog::Failed(pending("old", Due::Refresh)),
                Some(Due::Heartbeat),
                Backlog::Failed(pending("new", Due::Refresh)),
            ),
            (
                "failed, a stronger reason wins",
                Backlog::Failed(pending("old", Due::Heartbeat)),
                Some(change(false)),
                Backlog::Failed(pending("new", change(false))),
            ),
        ];
        for (name, backlog, due, expected) in rows {
            assert_eq!(backlog.after_observation(status("new"), due), expected, "{name}");
        }
    }

    #[test]
    fn only_a_recovery_waits_for_recovery_gap() {
        let config = PublishConfig::default();
        let t0 = Instant::now();
        let next_attempt = t0 + Duration::from_secs(1);
        let last = Some(t0);
        let gap = t0 + config.recovery_gap;
        assert_eq!(ready_at(&change(true), next_attempt, last, &config), gap);
        assert_eq!(ready_at(&change(true), next_attempt, None, &config), next_attempt);
        let late = t0 + Duration::from_secs(500);
        assert_eq!(
            ready_at(&change(true), late, last, &config),
            late,
            "the backoff is longer"
        );
        for due in [change(false), Due::Refresh, Due::Heartbeat] {
            assert_eq!(
                ready_at(&due, next_attempt, last, &config),
                next_attempt,
                "{due:?}"
            );
        }
    }
}
