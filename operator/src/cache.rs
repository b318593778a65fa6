//! Verdicts remembered between reconciles, so that the steady state is cheap:
//!
//! - a reconcile re-evaluates only the nodes whose report changed (by resourceVersion), whose
//!   policy changed (by uid and generation), or whose verdict may have changed with time
//!   ([`unchanged_until`](crate::evaluate::unchanged_until): a report going stale, a fatal XID leaving its window);
//! - a report event whose verdict is the one the last reconcile acted on, on the same GPUs (a
//!   heartbeat: only `observedAt`, temperatures or counters moved) triggers no reconcile at all
//!   ([`VerdictCache::report_is_material`]).
//!
//! Pure bookkeeping: evaluation stays [`evaluate`](crate::evaluate::evaluate), nothing here reads the cluster.

use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    sync::{Arc, Mutex, PoisonError},
};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport, recovery::GpuRecoveryAction};
use jiff::Timestamp;
use kube::{Resource, ResourceExt, core::DeserializeGuard};

use crate::{
    evaluate::{evaluate_heard, unchanged_until_heard},
    observe::compact::CachedReport,
    verdict::{REPORT_CHECK, Unknown, Verdict},
};

/// A report as the watch delivers it: readable or not.
pub type GuardedReport = DeserializeGuard<GpuNodeReport>;

/// The verdict on a report that may not have deserialized, its probe last heard from at
/// `heard`, and until when it holds ([`unchanged_until_heard`]; `None`: recompute every time).
pub fn evaluate_guarded(
    policy: &GpuNodePolicy,
    report: Option<&GuardedReport>,
    heard: Option<Timestamp>,
    now: Timestamp,
) -> (Verdict, Option<Timestamp>) {
    // The same reason as a cached unreadable report gives.
    let report = report.map(|g| {
        g.0.as_ref()
            .map_err(|e| crate::observe::compact::Error::Unreadable(e.error.clone()).to_string())
    });
    evaluate_readable(policy, report, heard, now)
}

/// [`evaluate_guarded`] on a report as the cache keeps it (decoded for this evaluation only).
pub fn evaluate_cached(
    policy: &GpuNodePolicy,
    report: Option<&CachedReport>,
    heard: Option<Timestamp>,
    now: Timestamp,
) -> (Verdict, Option<Timestamp>) {
    let decoded = report.map(CachedReport::report);
    let report = decoded.as_ref().map(|r| r.as_ref().map_err(ToString::to_string));
    evaluate_readable(policy, report, heard, now)
}

/// The verdict on a report (`Err`: why it cannot be read).
fn evaluate_readable(
    policy: &GpuNodePolicy,
    report: Option<Result<&GpuNodeReport, String>>,
    heard: Option<Timestamp>,
    now: Timestamp,
) -> (Verdict, Option<Timestamp>) {
    match report {
        None => (
            evaluate_heard(&policy.spec, None, heard, now),
            Some(Timestamp::MAX),
        ),
        Some(Ok(r)) => (
            evaluate_heard(&policy.spec, Some(r), heard, now),
            unchanged_until_heard(&policy.spec, Some(r), heard, now),
        ),
        Some(Err(reason)) => (
            Verdict::new(
                Vec::new(),
                vec![Unknown {
                    check: REPORT_CHECK.to_string(),
                    reason,
                    gpu: None,
                }],
            ),
            Some(Timestamp::MAX),
        ),
    }
}

#[derive(Debug)]
struct Entry {
    /// resourceVersion of the report the verdict is about (`None`: there was no report).
    report: Option<String>,
    verdict: Verdict,
    /// [`gpus_fingerprint`] of that report: the plan reads its GPUs (the `healthy-gpus` label,
    /// quarantines by UUID, repairs by recovery action) besides the verdict.
    gpus: u64,
    /// The verdict holds from `computed` through `until`.
    computed: Timestamp,
    until: Timestamp,
    /// The reconcile pass that last used it, to drop nodes that left the policy.
    pass: u64,
}

impl Entry {
    fn holds(&self, report: Option<&str>, now: Timestamp) -> bool {
        self.report.as_deref() == report && self.computed <= now && now <= self.until
    }
}

/// The verdicts of one policy's nodes.
#[derive(Debug, Default)]
pub struct PolicyVerdicts {
    /// uid and generation of the policy the verdicts are about.
    policy: Option<(String, Option<i64>)>,
    nodes: HashMap<String, Entry>,
    pass: u64,
    hits: u64,
    misses: u64,
}

/// A fingerprint of the GPUs a report lists, as the plan reads them: (index, UUID, recovery
/// action) of each, in order. Hashed in place: a report event builds nothing for it.
fn gpus_fingerprint<'a>(
    gpus: impl Iterator<Item = (u32, &'a Option<String>, &'a Option<GpuRecoveryAction>)>,
) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    gpus.for_each(|g| g.hash(&mut h));
    h.finish()
}

/// [`gpus_fingerprint`] of a report as the cache keeps it.
fn cached_gpus(report: Option<&CachedReport>) -> u64 {
    let gpus = report.map_or(&[][..], |r| &r.gpus()[..]);
    gpus_fingerprint(gpus.iter().map(|g| (g.index, &g.uuid, &g.recovery_action)))
}

/// [`gpus_fingerprint`] of a report as the watch delivers it.
fn guarded_gpus(report: Option<&GuardedReport>) -> u64 {
    let status = report
        .and_then(|g| g.0.as_ref().ok())
        .and_then(|r| r.status.as_ref());
    let gpus = status.map_or(&[][..], |s| &s.gpus[..]);
    gpus_fingerprint(gpus.iter().map(|g| (g.index, &g.uuid, &g.recovery_action)))
}

fn report_version<K: Resource>(report: Option<&K>) -> Option<&str> {
    report.and_then(|r| r.meta().resource_version.as_deref())
}

fn policy_key(policy: &GpuNodePolicy) -> (String, Option<i64>) {
    (policy.uid().unwrap_or_default(), policy.metadata.generation)
}

impl PolicyVerdicts {
    /// Forgets everything when the policy is not the one the verdicts are about.
    fn bind(&mut self, policy: &GpuNodePolicy) {
        let key = policy_key(policy);
        if self.policy.as_ref() != Some(&key) {
            self.nodes.clear();
            self.policy = Some(key);
        }
    }

    /// Starts a reconcile pass over the policy's nodes.
    pub fn begin(&mut self, policy: &GpuNodePolicy) {
        self.bind(policy);
        self.pass += 1;
        self.hits = 0;
        self.misses = 0;
    }

    /// The verdict on `node`: remembered if it still holds, else evaluated and remembered.
    /// `heard`: the probe's last heartbeat; a later one only extends how long a verdict holds,
    /// which the next evaluation after `until` picks up.
    pub fn verdict(
        &mut self,
        policy: &GpuNodePolicy,
        node: &str,
        report: Option<&CachedReport>,
        heard: Option<Timestamp>,
        now: Timestamp,
    ) -> Verdict {
        let version = report_version(report);
        if let Some(e) = self.nodes.get_mut(node)
            && e.holds(version, now)
        {
            e.pass = self.pass;
            self.hits += 1;
            return e.verdict.clone();
        }
        self.misses += 1;
        let (verdict, until) = evaluate_cached(policy, report, heard, now);
        let entry = Entry {
            report: version.map(str::to_string),
            verdict: verdict.clone(),
            gpus: cached_gpus(report),
            computed: now,
            // A verdict that may change any moment is kept (for the event filter) but never
            // reused by a reconcile.
            until: until.unwrap_or(now),
            pass: self.pass,
        };
        self.nodes.insert(node.to_string(), entry);
        verdict
    }

    /// Ends a pass: nodes the pass did not visit left the policy.
    pub fn end(&mut self) {
        let pass = self.pass;
        self.nodes.retain(|_, e| e.pass == pass);
    }

    /// (remembered, evaluated) in the current pass.
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }
}

/// Verdicts per policy (by name). Cheap to share: clone the `Arc`.
#[derive(Debug, Default)]
pub struct VerdictCache {
    policies: Mutex<HashMap<String, Arc<Mutex<PolicyVerdicts>>>>,
}

impl VerdictCache {
    /// An empty cache.
    pub fn new() -> Self {
        VerdictCache::default()
    }

    /// The verdicts of one policy, created empty on first use.
    pub fn policy(&self, name: &str) -> Arc<Mutex<PolicyVerdicts>> {
        let mut all = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        all.entry(name.to_string()).or_default().clone()
    }

    /// Whether some policy's last verdict on `node` found its report stale (a verdict that holds
    /// for no time at all): a heartbeat may make it fresh again.
    pub fn stale_somewhere(&self, node: &str) -> bool {
        let policies: Vec<_> = self
            .policies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        policies.iter().any(|p| {
            p.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .nodes
                .get(node)
                .is_some_and(|e| e.until <= e.computed)
        })
    }

    /// Drops a deleted policy's verdicts.
    pub fn forget(&self, name: &str) {
        self.policies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    /// Whether a new version of `node`'s report (`None`: it was deleted) could change what
    /// `policy` decides: true unless the last reconcile acted on exactly the verdict it gives
    /// now. When it gives the same verdict, the remembered one is moved to this report, so the
    /// next reconcile does not evaluate it again.
    pub fn report_is_material(
        &self,
        policy: &GpuNodePolicy,
        node: &str,
        report: Option<&GuardedReport>,
        heard: Option<Timestamp>,
        now: Timestamp,
    ) -> bool {
        let verdicts = self.policy(&policy.name_any());
        let mut v = verdicts.lock().unwrap_or_else(PoisonError::into_inner);
        if v.policy.as_ref() != Some(&policy_key(policy)) {
            return true;
        }
        let Some(entry) = v.nodes.get_mut(node) else {
            return true;
        };
        let (verdict, until) = evaluate_guarded(policy, report, heard, now);
        let until = until.unwrap_or(now);
        // A report that goes stale sooner than the remembered one (observedAt moved back: a
        // restarted probe with a skewed clock, a replayed report) needs a reconcile to move the
        // wake-up forward; otherwise the node turns Unknown only at the old time.
        let gpus = guarded_gpus(report);
        if verdict != entry.verdict || until < entry.until || gpus != entry.gpus {
            return true;
        }
        entry.report = report_version(report).map(str::to_string);
        entry.computed = now;
        entry.until = until;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunode_crds::report::GpuNodeReportStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn policy(generation: i64) -> GpuNodePolicy {
        let mut p: GpuNodePolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodePolicy",
            "metadata": {"name": "p", "uid": "u1"},
            "spec": {"gpu": {"count": 1}, "staleAfter": "3m"},
        }))
        .unwrap();
        p.metadata.generation = Some(generation);
        p
    }

    fn c(r: &GuardedReport) -> CachedReport {
        CachedReport::new(r)
    }

    /// A reconcile pass of policy `p` over `n1` with `report`: its verdict is remembered.
    fn act_on(
        cache: &VerdictCache,
        p: &GpuNodePolicy,
        report: &GuardedReport,
        heard: Option<Timestamp>,
        now: Timestamp,
    ) {
        let pv = cache.policy("p");
        let mut pv = pv.lock().unwrap_or_else(PoisonError::into_inner);
        pv.begin(p);
        let _ = pv.verdict(p, "n1", Some(&c(report)), heard, now);
        pv.end();
    }

    fn report(rv: &str, observed: &str, count: u32) -> GuardedReport {
        let mut r = GpuNodeReport::new("n1", Default::default());
        r.metadata.resource_version = Some(rv.to_string());
        r.status = Some(GpuNodeReportStatus {
            observed_at: Some(Time(ts(observed))),
            gpu_count: Some(count),
            ..Default::default()
        });
        DeserializeGuard(Ok(r))
    }

    #[test]
    fn a_verdict_is_reused_until_the_report_the_policy_or_the_time_says_otherwise() {
        let (p, now) = (policy(1), ts("2026-11-29T12:00:30Z"));
        let r1 = report("1", "2026-11-29T12:00:00Z", 1);
        let mut v = PolicyVerdicts::default();
        v.begin(&p);
        let first = v.verdict(&p, "n1", Some(&c(&r1)), None, now);
        assert_eq!(v.stats(), (0, 1));
        v.begin(&p);
        assert_eq!(v.verdict(&p, "n1", Some(&c(&r1)), None, now), first);
        assert_eq!(v.stats(), (1, 0), "same report, same policy, still fresh");
        v.begin(&p);
        let _ = v.verdict(
            &p,
            "n1",
            Some(&c(&report("2", "2026-11-29T12:00:20Z", 1))),
            None,
            now,
        );
        assert_eq!(v.stats(), (0, 1), "a new report version is evaluated");
        v.begin(&policy(2));
        let _ = v.verdict(
            &policy(2),
            "n1",
            Some(&c(&report("2", "2026-11-29T12:00:20Z", 1))),
            None,
            now,
        );
        assert_eq!(v.stats(), (0, 1), "a new policy generation is evaluated");
        v.begin(&policy(2));
        let stale = v.verdict(
            &policy(2),
            "n1",
            Some(&c(&report("2", "2026-11-29T12:00:20Z", 1))),
            None,
            ts("2026-11-29T12:03:21Z"),
        );
        assert_eq!(
            v.stats(),
            (0, 1),
            "past staleAfter the verdict is evaluated again"
        );
        assert_eq!(stale.state, crate::verdict::NodeState::Unknown);
    }

    #[test]
    fn a_heartbeat_keeps_an_unchanged_report_fresh_and_the_verdict_is_held_until_it_lapses() {
        let p = policy(1);
        let r = report("1", "2026-11-29T12:00:00Z", 1);
        let heard = Some(ts("2026-11-29T12:09:00Z"));
        let mut v = PolicyVerdicts::default();
        v.begin(&p);
        let at = |s: &str| ts(s);
        // What the report says while its own observedAt is fresh.
        let (content, _) = evaluate_guarded(&p, Some(&r), None, at("2026-11-29T12:00:30Z"));
        assert!(
            content.unknowns.iter().all(|u| u.check != REPORT_CHECK),
            "{content:?}"
        );
        let fresh = v.verdict(&p, "n1", Some(&c(&r)), heard, at("2026-11-29T12:10:00Z"));
        assert_eq!(fresh, content, "ten minutes old, heard from a minute ago");
        v.begin(&p);
        let _ = v.verdict(&p, "n1", Some(&c(&r)), heard, at("2026-11-29T12:12:00Z"));
        assert_eq!(v.stats(), (1, 0), "held until the heartbeat is staleAfter old");
        v.begin(&p);
        let stale = v.verdict(&p, "n1", Some(&c(&r)), heard, at("2026-11-29T12:12:01Z"));
        assert_eq!(v.stats(), (0, 1));
        assert_eq!(stale.unknowns.len(), 1);
        assert_eq!(stale.unknowns[0].check, REPORT_CHECK);
        assert!(
            stale.unknowns[0]
                .reason
                .starts_with("the probe's last heartbeat is 3m1s old"),
            "{stale:?}"
        );
        let renewed = v.verdict(
            &p,
            "n1",
            Some(&c(&r)),
            Some(at("2026-11-29T12:12:00Z")),
            at("2026-11-29T12:12:02Z"),
        );
        assert_eq!(renewed, content, "a renewal makes it fresh again");
    }

    #[test]
    fn nodes_not_visited_by_a_pass_are_forgotten() {
        let (p, now) = (policy(1), ts("2026-11-29T12:00:30Z"));
        let r1 = report("1", "2026-11-29T12:00:00Z", 1);
        let mut v = PolicyVerdicts::default();
        v.begin(&p);
        let _ = v.verdict(&p, "n1", Some(&c(&r1)), None, now);
        v.end();
        v.begin(&p);
        v.end();
        v.begin(&p);
        let _ = v.verdict(&p, "n1", Some(&c(&r1)), None, now);
        assert_eq!(v.stats(), (0, 1));
    }

    #[test]
    fn a_node_is_stale_somewhere_while_a_policy_last_found_its_report_stale() {
        let p = policy(1);
        let cache = VerdictCache::new();
        let r = report("1", "2026-11-29T12:00:00Z", 1);
        let judge = |at: &str, heard: Option<Timestamp>| act_on(&cache, &p, &r, heard, ts(at));
        assert!(!cache.stale_somewhere("n1"), "never judged");
        judge("2026-11-29T12:01:00Z", None);
        assert!(!cache.stale_somewhere("n1"), "fresh for 3m");
        // Observed 10 minutes before the operator's clock (a probe behind): stale at once.
        judge("2026-11-29T12:10:00Z", None);
        assert!(cache.stale_somewhere("n1"));
        assert!(!cache.stale_somewhere("n2"));
        // Its heartbeat, heard now, makes it fresh again.
        judge("2026-11-29T12:10:01Z", Some(ts("2026-11-29T12:10:01Z")));
        assert!(!cache.stale_somewhere("n1"));
    }

    #[test]
    fn a_report_with_the_same_verdict_on_other_gpus_is_material() {
        let (p, now) = (policy(1), ts("2026-11-29T12:00:30Z"));
        let cache = VerdictCache::new();
        let with_gpu = |rv: &str, uuid: &str| {
            let mut r = report(rv, "2026-11-29T12:00:00Z", 1);
            if let Ok(r) = r.0.as_mut()
                && let Some(s) = r.status.as_mut()
            {
                s.gpus.push(gpunode_crds::report::GpuStatus {
                    index: 0,
                    uuid: Some(uuid.to_string()),
                    ..Default::default()
                });
            }
            r
        };
        let (a, b) = (with_gpu("1", "GPU-a"), with_gpu("2", "GPU-b"));
        assert_eq!(
            evaluate_guarded(&p, Some(&a), None, now),
            evaluate_guarded(&p, Some(&b), None, now),
            "the same verdict"
        );
        act_on(&cache, &p, &a, None, now);
        assert!(!cache.report_is_material(&p, "n1", Some(&with_gpu("3", "GPU-a")), None, now));
        assert!(
            cache.report_is_material(&p, "n1", Some(&b), None, now),
            "the plan reads the GPUs too (healthy-gpus, quarantines by UUID)"
        );
    }

    #[test]
    fn only_a_report_that_changes_the_verdict_is_material() {
        let (p, now) = (policy(1), ts("2026-11-29T12:00:30Z"));
        let cache = VerdictCache::new();
        let r1 = report("1", "2026-11-29T12:00:00Z", 1);
        assert!(
            cache.report_is_material(&p, "n1", Some(&r1), None, now),
            "nothing acted on yet"
        );
        act_on(&cache, &p, &r1, None, now);
        let heartbeat = report("2", "2026-11-29T12:00:29Z", 1);
        assert!(!cache.report_is_material(&p, "n1", Some(&heartbeat), None, now));
        // The heartbeat's version is now the remembered one: a reconcile reuses it.
        {
            let pv = cache.policy("p");
            let mut pv = pv.lock().unwrap_or_else(PoisonError::into_inner);
            pv.begin(&p);
            let _ = pv.verdict(&p, "n1", Some(&c(&heartbeat)), None, now);
            assert_eq!(pv.stats(), (1, 0));
        }
        let older = report("4", "2026-11-29T11:58:00Z", 1);
        assert!(
            cache.report_is_material(&p, "n1", Some(&older), None, now),
            "a report that goes stale sooner moves the wake-up"
        );
        let drifted = report("3", "2026-11-29T12:00:29Z", 2);
        assert!(cache.report_is_material(&p, "n1", Some(&drifted), None, now));
        assert!(
            cache.report_is_material(&p, "n1", None, None, now),
            "a deleted report"
        );
        assert!(
            cache.report_is_material(&policy(2), "n1", Some(&heartbeat), None, now),
            "a changed policy"
        );
    }
}
