//! evaluate (pure): what a policy says about one node, given the node's report and the time.
//!
//! `evaluate(policy, report, now) → Verdict`. No I/O, no client, no clock: the same inputs give
//! the same verdict, with drifts and unknowns in a stable order.
//!
//! The rules, in order:
//! 1. No report, a report without status or `observedAt`, or one older than `staleAfter` makes
//!    the node Unknown, with that reason and no drift: old data is not evidence.
//! 2. Each section the policy has (`gpu`, `cooling`, `network`) is checked; an omitted section,
//!    an unset field and an empty list are not checked.
//! 3. A failed collector makes every check that reads its data Unknown with the collector's
//!    error: nvml → `gpu.*` and the cooling checks on GPU temperatures and throttling; cooling →
//!    `cooling.sensors` and `cooling.minFanRpm`; network → `network.*`.
//! 4. A field the probe did not report makes its check Unknown, with the reason from the GPU's,
//!    device's or chassis' `errors` entry that names the field, else `not reported`. The one
//!    exception is a port's error counters (`errorRates`): one the probe did not publish, with no
//!    error naming it, is not judged, since older kernels and drivers lack some counters.
//! 5. Drifted if anything drifted (a drift is a certain fact, whatever else is unknown), else
//!    Unknown if anything is unknown, else Compliant.
//!
//! Check names are the policy fields (`gpu.driverVersion`, `cooling.maxGpuCelsius`,
//! `network.pfcPriorities`); see [`check`] for the full list.

pub mod check;
mod cooling;
mod fabric;
mod findings;
mod glob;
mod gpu;
mod network;
mod nvlink;
mod power;
mod xid;

use gpunode_crds::{
    Duration, GpuNodePolicySpec,
    report::{GpuNodeReport, GpuNodeReportStatus},
};
use jiff::Timestamp;

pub use glob::glob_match;

use findings::{Context, Findings};

use crate::verdict::{REPORT_CHECK, Unknown, Verdict};

/// Evaluates `policy` against a node's `report` (None when the node has none) at `now`.
pub fn evaluate(policy: &GpuNodePolicySpec, report: Option<&GpuNodeReport>, now: Timestamp) -> Verdict {
    evaluate_heard(policy, report, None, now)
}

/// [`evaluate`], with the report fresh from the later of its `observedAt` and `heard`: when the
/// node's probe last renewed its heartbeat Lease ([`gpunode_crds::heartbeat`]). Between
/// material changes a probe renews only its Lease, so a report whose content still holds can
/// be older than `staleAfter` while its probe is alive.
pub fn evaluate_heard(
    policy: &GpuNodePolicySpec,
    report: Option<&GpuNodeReport>,
    heard: Option<Timestamp>,
    now: Timestamp,
) -> Verdict {
    let status = match fresh_status(policy, report, heard, now) {
        Ok(status) => status,
        Err(reason) => {
            return Verdict::new(
                Vec::new(),
                vec![Unknown {
                    check: REPORT_CHECK.to_string(),
                    reason,
                    gpu: None,
                }],
            );
        }
    };
    let ctx = Context { status, now };
    let mut findings = Findings::default();
    if let Some(req) = &policy.gpu {
        gpu::check(req, &ctx, &mut findings);
    }
    if let Some(req) = &policy.cooling {
        cooling::check(req, &ctx, &mut findings);
    }
    if let Some(req) = &policy.network {
        network::check(req, &ctx, &mut findings);
    }
    findings.verdict().changing_at(changes_at(policy, status, now))
}

/// Until when the verdict [`evaluate`] gives at `now` stays exactly the same while only time
/// passes (inclusive), so it can be reused: time matters only when the report goes stale and
/// when a fatal XID leaves `gpu.xidWindow`. `None` when it may change at any moment: a stale
/// report's reason says how old it is.
pub fn unchanged_until(
    policy: &GpuNodePolicySpec,
    report: Option<&GpuNodeReport>,
    now: Timestamp,
) -> Option<Timestamp> {
    unchanged_until_heard(policy, report, None, now)
}

/// [`unchanged_until`] for [`evaluate_heard`].
pub fn unchanged_until_heard(
    policy: &GpuNodePolicySpec,
    report: Option<&GpuNodeReport>,
    heard: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    let signed =
        |d: std::time::Duration| jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX);
    let Some(observed_at) = report
        .and_then(|r| r.status.as_ref())
        .and_then(|s| s.observed_at.as_ref())
    else {
        // No report, status or observedAt: the reason does not depend on the time.
        return Some(Timestamp::MAX);
    };
    let fresh_until = last_heard(observed_at.0, heard)
        .checked_add(signed(policy.stale_after.get()))
        .unwrap_or(Timestamp::MAX);
    if fresh_until < now {
        return None;
    }
    let holds = report
        .and_then(|r| r.status.as_ref())
        .and_then(|status| holds_through(policy, status, now));
    Some(holds.map_or(fresh_until, |h| h.min(fresh_until)))
}

/// The first moment the verdict on `status` may differ with time alone: a second past
/// [`holds_through`] (XID times and power-brake stamps have whole seconds).
fn changes_at(policy: &GpuNodePolicySpec, status: &GpuNodeReportStatus, now: Timestamp) -> Option<Timestamp> {
    let holds = holds_through(policy, status, now)?;
    holds.checked_add(jiff::SignedDuration::from_secs(1)).ok()
}

/// Through when the verdict on `status` holds with time alone, from `now`: a drifting XID
/// drifts through `at + xidWindow`, a power brake is within `maxPowerBrake` through
/// `since + maxPowerBrake` (the report going stale aside).
fn holds_through(
    policy: &GpuNodePolicySpec,
    status: &GpuNodeReportStatus,
    now: Timestamp,
) -> Option<Timestamp> {
    let gpu = policy.gpu.as_ref()?;
    let signed =
        |d: std::time::Duration| jiff::SignedDuration::try_from(d).unwrap_or(jiff::SignedDuration::MAX);
    // Each drifting XID still within the window drops out of it after `at + window`.
    let xids = gpu.xid_window.into_iter().flat_map(|window| {
        status
            .gpus
            .iter()
            .flat_map(|g| &g.xids)
            .filter(|x| xid::drifting_check(gpu, x.xid).is_some())
            .filter_map(move |x| x.at.0.checked_add(signed(window.get())).ok())
    });
    // A power brake drifts once it has lasted longer than maxPowerBrake.
    let brakes = status
        .gpus
        .iter()
        .filter_map(|g| power::brake_outlasts(gpu.power.as_ref(), g));
    xids.chain(brakes).filter(|t| *t >= now).min()
}

/// The later of a report's `observedAt` and its probe's last heartbeat.
pub fn last_heard(observed_at: Timestamp, heard: Option<Timestamp>) -> Timestamp {
    heard.map_or(observed_at, |h| h.max(observed_at))
}

/// The report's status when it is fresh enough to be evidence, else why not.
fn fresh_status<'a>(
    policy: &GpuNodePolicySpec,
    report: Option<&'a GpuNodeReport>,
    heard: Option<Timestamp>,
    now: Timestamp,
) -> Result<&'a GpuNodeReportStatus, String> {
    let report = report.ok_or("no GpuNodeReport for this node")?;
    let status = report.status.as_ref().ok_or("report has no status")?;
    let observed_at = status.observed_at.as_ref().ok_or("report has no observedAt")?;
    let last = last_heard(observed_at.0, heard);
    let age = now.duration_since(last);
    // A report from the future (clock skew between node and operator) counts as fresh.
    if !age.is_negative() && age.unsigned_abs() > policy.stale_after.get() {
        let secs = u64::try_from(age.as_secs()).unwrap_or(u64::MAX);
        let what = if last > observed_at.0 {
            "the probe's last heartbeat is"
        } else {
            "report is"
        };
        return Err(format!(
            "{what} {} old (staleAfter {})",
            Duration::from_secs(secs),
            policy.stale_after
        ));
    }
    Ok(status)
}
