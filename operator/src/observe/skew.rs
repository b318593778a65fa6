//! A probe's clock may be off by minutes (no NTP, a wrong RTC after a board swap). A report's
//! `observedAt` is the probe's time; the operator judges freshness by its own. A time ahead of
//! the operator's clock is taken as now when the report arrives, so a probe whose clock runs
//! ahead goes stale `staleAfter` after its last report arrived (with its heartbeats, see
//! [`super::heartbeats::stamp`]) rather than that much plus its skew; one behind is kept fresh by
//! its heartbeats.

use gpunode_crds::GpuNodeReport;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Moves the report's `observedAt` back to `now` when it is later (the cache's copy only).
pub fn observed_not_ahead(report: &mut GpuNodeReport, now: Timestamp) {
    if let Some(at) = report.status.as_mut().and_then(|s| s.observed_at.as_mut())
        && at.0 > now
    {
        *at = Time(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunode_crds::GpuNodeReportStatus;

    fn observed(at: &str) -> GpuNodeReport {
        let mut r = GpuNodeReport::new("n", Default::default());
        r.status = Some(GpuNodeReportStatus {
            observed_at: Some(Time(at.parse().unwrap())),
            ..GpuNodeReportStatus::default()
        });
        r
    }

    fn at(r: &GpuNodeReport) -> Option<Timestamp> {
        r.status.as_ref()?.observed_at.as_ref().map(|t| t.0)
    }

    #[test]
    fn a_report_from_the_future_is_observed_now_and_others_are_left_alone() {
        let now: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let mut ahead = observed("2026-11-30T10:10:00Z");
        observed_not_ahead(&mut ahead, now);
        assert_eq!(at(&ahead), Some(now));
        let mut behind = observed("2026-11-30T09:50:00Z");
        observed_not_ahead(&mut behind, now);
        assert_eq!(at(&behind), "2026-11-30T09:50:00Z".parse().ok());
        let mut none = GpuNodeReport::new("n", Default::default());
        observed_not_ahead(&mut none, now);
        assert!(none.status.is_none());
    }
}
