//! `unchanged_until(policy, report, now)`: the verdict of `evaluate` stays exactly the same from
//! `now` through that time, which is what lets a reconcile reuse it; and the bound is tight
//! where time matters (the report going stale, a fatal XID leaving `xidWindow`).

// clippy.toml allows unwrap and expect in #[test] fns only; this test crate's helper fns fail
// the same way (a panic naming what broke), so the allow covers the whole crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use gpunode_operator::evaluate::{evaluate, evaluate_heard, unchanged_until, unchanged_until_heard};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;

fn load<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/evaluate/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn base() -> Timestamp {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

fn at(secs: i64) -> Timestamp {
    base().checked_add(SignedDuration::from_secs(secs)).unwrap()
}

/// The strict policy with `xidWindow` (seconds, if any) over the healthy report observed at
/// `observed` with these (GPU, XID, seconds) events.
fn inputs(window: Option<u64>, observed: i64, xids: &[(usize, u32, i64)]) -> (GpuNodePolicy, GpuNodeReport) {
    let mut policy: GpuNodePolicy = load("strict-policy.yaml");
    if let Some(gpu) = policy.spec.gpu.as_mut() {
        gpu.xid_window = window.map(gpunode_crds::Duration::from_secs);
    }
    let mut report: GpuNodeReport = load("healthy-h100-report.yaml");
    if let Some(s) = report.status.as_mut() {
        s.observed_at = Some(Time(at(observed)));
        for (gpu, xid, when) in xids {
            let event: gpunode_crds::report::XidEvent =
                serde_json::from_value(serde_json::json!({"xid": xid, "at": at(*when).to_string()})).unwrap();
            s.gpus[*gpu % 8].xids.push(event);
        }
    }
    (policy, report)
}

#[test]
fn a_fresh_report_holds_until_it_goes_stale() {
    let (policy, report) = inputs(None, 0, &[]);
    let until = unchanged_until(&policy.spec, Some(&report), at(30));
    assert_eq!(until, Some(at(180)), "observedAt + staleAfter (3m)");
    let v = evaluate(&policy.spec, Some(&report), at(30));
    assert_eq!(evaluate(&policy.spec, Some(&report), at(180)), v);
    assert_ne!(evaluate(&policy.spec, Some(&report), at(181)), v);
}

#[test]
fn a_heartbeat_keeps_an_unchanged_report_fresh_until_the_heartbeat_is_stale() {
    let (policy, report) = inputs(None, 0, &[]);
    let fresh = evaluate(&policy.spec, Some(&report), at(30));
    let heard = Some(at(600));
    assert_eq!(evaluate_heard(&policy.spec, Some(&report), heard, at(700)), fresh);
    assert_eq!(
        unchanged_until_heard(&policy.spec, Some(&report), heard, at(700)),
        Some(at(780)),
        "heartbeat + staleAfter"
    );
    assert_eq!(evaluate_heard(&policy.spec, Some(&report), heard, at(780)), fresh);
    let stale = evaluate_heard(&policy.spec, Some(&report), heard, at(781));
    assert_eq!(
        stale.unknowns.first().map(|u| u.reason.as_str()),
        Some("the probe's last heartbeat is 3m1s old (staleAfter 3m)")
    );
    // A heartbeat older than the report changes nothing; no report is never made fresh.
    assert_eq!(
        evaluate_heard(&policy.spec, Some(&report), Some(at(-600)), at(30)),
        fresh
    );
    assert_eq!(
        evaluate_heard(&policy.spec, None, heard, at(700)),
        evaluate(&policy.spec, None, at(700))
    );
}

#[test]
fn a_stale_report_is_never_reused_and_a_missing_one_always() {
    let (policy, report) = inputs(None, 0, &[]);
    assert_eq!(unchanged_until(&policy.spec, Some(&report), at(181)), None);
    assert_eq!(unchanged_until(&policy.spec, None, at(181)), Some(Timestamp::MAX));
}

#[test]
fn a_fatal_xid_within_the_window_holds_until_it_leaves() {
    let (policy, report) = inputs(Some(60), 0, &[(3, 79, 10)]);
    assert_eq!(unchanged_until(&policy.spec, Some(&report), at(30)), Some(at(70)));
    let v = evaluate(&policy.spec, Some(&report), at(30));
    assert_eq!(evaluate(&policy.spec, Some(&report), at(70)), v);
    assert_ne!(evaluate(&policy.spec, Some(&report), at(71)), v);
}

proptest! {
    #[test]
    fn the_verdict_does_not_change_before_unchanged_until(
        window in proptest::option::of(1u64..600),
        observed in -400i64..60,
        xids in proptest::collection::vec((0usize..8, prop_oneof![Just(79u32), Just(48), Just(13)], -900i64..120), 0..4),
        now in 0i64..300,
        fraction in 0.0f64..=1.0,
    ) {
        let (policy, report) = inputs(window, observed, &xids);
        let now = at(now);
        let v = evaluate(&policy.spec, Some(&report), now);
        if let Some(until) = unchanged_until(&policy.spec, Some(&report), now) {
            prop_assert!(until >= now);
            let span = until.duration_since(now).as_secs().min(100_000);
            let later = now
                .checked_add(SignedDuration::from_secs((span as f64 * fraction) as i64))
                .unwrap();
            prop_assert_eq!(&evaluate(&policy.spec, Some(&report), later), &v, "at {}", later);
            if span < 100_000 {
                prop_assert_eq!(&evaluate(&policy.spec, Some(&report), until), &v, "at {}", until);
            }
        }
    }
}
