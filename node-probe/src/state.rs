//! What the publish loop shares with the HTTP endpoints: the latest observation, when it was
//! made, and publish outcomes.
//!
//! It holds values; it observes and publishes nothing itself.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpunode_crds::report::GpuNodeReportStatus;

use crate::nvml::XidLog;

/// Shared probe state.
#[derive(Debug)]
pub struct ProbeState {
    node: String,
    /// Observations older than this make `/healthz` fail.
    stale_after: Duration,
    latest: Mutex<Option<(GpuNodeReportStatus, Instant)>>,
    publish_ok: AtomicU64,
    publish_failed: AtomicU64,
    xids: Option<Arc<XidLog>>,
    /// Policies the publish decision knows, or -1 while it falls back to temperature bands.
    policies: AtomicI64,
    policy_watch_errors: AtomicU64,
}

impl ProbeState {
    /// State for `node`; healthy while observations are newer than `stale_after`.
    pub fn new(node: &str, stale_after: Duration, xids: Option<Arc<XidLog>>) -> Self {
        ProbeState {
            node: node.to_owned(),
            stale_after,
            latest: Mutex::new(None),
            publish_ok: AtomicU64::new(0),
            publish_failed: AtomicU64::new(0),
            xids,
            policies: AtomicI64::new(-1),
            policy_watch_errors: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(GpuNodeReportStatus, Instant)>> {
        self.latest
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores the newest observation.
    pub fn set_latest(&self, status: GpuNodeReportStatus) {
        *self.lock() = Some((status, Instant::now()));
    }

    /// The newest observation.
    pub fn latest(&self) -> Option<GpuNodeReportStatus> {
        self.lock().as_ref().map(|(s, _)| s.clone())
    }

    /// Counts a publish.
    pub fn record_publish(&self, ok: bool) {
        let counter = if ok {
            &self.publish_ok
        } else {
            &self.publish_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// (successful, failed) publishes so far.
    pub fn publishes(&self) -> (u64, u64) {
        (
            self.publish_ok.load(Ordering::Relaxed),
            self.publish_failed.load(Ordering::Relaxed),
        )
    }

    /// How many policies the publish decision knows (`None`: the watch has not listed, failed
    /// or is forbidden, and the probe falls back to temperature bands).
    pub fn set_policies(&self, known: Option<usize>) {
        let n = known.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
        self.policies.store(n, Ordering::Relaxed);
    }

    /// See [`ProbeState::set_policies`].
    pub fn policies(&self) -> Option<usize> {
        usize::try_from(self.policies.load(Ordering::Relaxed)).ok()
    }

    /// Counts a failed policy list or watch.
    pub fn record_policy_watch_error(&self) {
        self.policy_watch_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Failed policy lists and watches so far.
    pub fn policy_watch_errors(&self) -> u64 {
        self.policy_watch_errors.load(Ordering::Relaxed)
    }

    /// The node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The XID log, when NVML is in use.
    pub fn xids(&self) -> Option<&XidLog> {
        self.xids.as_deref()
    }

    /// Healthy: an observation was made recently.
    pub fn healthy(&self) -> bool {
        self.lock()
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() <= self.stale_after)
    }
}
