//! The publish loop with a scripted observer and a recording sink, on tokio's paused clock (time
//! advances only when every task waits, so the timings below are exact and nothing sleeps).

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpunode_crds::ThrottleReason;
use gpunode_crds::report::{GpuNodeReportStatus, GpuStatus};
use gpunode_probe::change::KnownPolicy;
use gpunode_probe::policies::Known;
use gpunode_probe::publish::{
    Beat, Observe, PublishConfig, PublishError, ReportSink, run_loop, run_loop_with_policies,
};
use gpunode_probe::state::ProbeState;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

/// Observations whose content the test changes through `throttled` and `temperature`.
#[derive(Default)]
struct Scripted {
    count: AtomicU64,
    throttled: Mutex<bool>,
    temperature: Mutex<i32>,
    /// Slowdown threshold; 89 when unset.
    slowdown: Mutex<Option<i32>>,
    /// When each observation was made.
    observed: Mutex<Vec<Instant>>,
}

impl Scripted {
    fn set_temperature(&self, celsius: i32) {
        *self.temperature.lock().unwrap_or_else(|e| e.into_inner()) = celsius - 40;
    }

    fn last_observed(&self) -> Option<Instant> {
        self.observed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last()
            .copied()
    }
}

impl Observe for Scripted {
    fn observe(&self) -> GpuNodeReportStatus {
        let n = self.count.fetch_add(1, Ordering::SeqCst);
        let throttled = *self.throttled.lock().unwrap_or_else(|e| e.into_inner());
        let temperature = *self.temperature.lock().unwrap_or_else(|e| e.into_inner());
        let slowdown = self
            .slowdown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(89);
        self.observed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instant::now());
        GpuNodeReportStatus {
            probe_version: Some(format!("obs-{n}")),
            observed_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::now(),
            )),
            gpus: vec![GpuStatus {
                index: 0,
                temperature_celsius: Some(40 + temperature),
                slowdown_celsius: Some(slowdown),
                throttle_reasons: if throttled {
                    vec![ThrottleReason::HwSlowdown]
                } else {
                    vec![]
                },
                ..GpuStatus::default()
            }],
            ..GpuNodeReportStatus::default()
        }
    }
}

#[derive(Clone, Default)]
struct Recorder {
    published: Arc<Mutex<Vec<(Instant, String)>>>,
    attempts: Arc<Mutex<Vec<Instant>>>,
    failures_left: Arc<AtomicU64>,
    /// Heartbeats renew a Lease (recorded in `beats`) instead of publishing.
    lease: Arc<AtomicBool>,
    beats: Arc<Mutex<Vec<Instant>>>,
}

impl Recorder {
    fn published(&self) -> Vec<(Instant, String)> {
        self.published.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn beats(&self) -> Vec<Instant> {
        self.beats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records an attempt; fails it while `failures_left` says so.
    fn attempt(&self) -> Result<(), PublishError> {
        self.attempts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instant::now());
        if self.failures_left.load(Ordering::SeqCst) > 0 {
            self.failures_left.fetch_sub(1, Ordering::SeqCst);
            return Err(PublishError::Encode(serde_json::Error::io(
                std::io::Error::other("apiserver down"),
            )));
        }
        Ok(())
    }
}

impl ReportSink for Recorder {
    async fn publish(&mut self, status: &GpuNodeReportStatus) -> Result<(), PublishError> {
        self.attempt()?;
        let tag = status.probe_version.clone().unwrap_or_default();
        self.published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Instant::now(), tag));
        Ok(())
    }

    async fn heartbeat(&mut self, status: &GpuNodeReportStatus) -> Result<Beat, PublishError> {
        if !self.lease.load(Ordering::SeqCst) {
            return self.publish(status).await.map(|()| Beat::Report);
        }
        self.attempt()?;
        self.beats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Instant::now());
        Ok(Beat::Lease)
    }
}

struct Harness {
    observer: Arc<Scripted>,
    sink: Recorder,
    xid_tx: watch::Sender<u64>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    start: Instant,
}

fn start(config: PublishConfig) -> Harness {
    start_with(config, Arc::new(Scripted::default()), None)
}

/// [`start`] with a given observer and, when `policies` is given, deciding by them.
fn start_with(
    config: PublishConfig,
    observer: Arc<Scripted>,
    policies: Option<watch::Receiver<Known>>,
) -> Harness {
    let sink = Recorder::default();
    let (xid_tx, xid_rx) = watch::channel(0);
    let (stop, stopped) = oneshot::channel::<()>();
    let state = Arc::new(ProbeState::new("node-a", Duration::from_secs(60), None));
    let task = {
        let (observer, mut sink) = (observer.clone(), sink.clone());
        tokio::spawn(async move {
            let stopped = async {
                let _ = stopped.await;
            };
            match policies {
                Some(p) => {
                    run_loop_with_policies(
                        &config,
                        observer,
                        &mut sink,
                        Some(xid_rx),
                        Some(p),
                        state,
                        stopped,
                    )
                    .await
                }
                None => run_loop(&config, observer, &mut sink, Some(xid_rx), state, stopped).await,
            }
        })
    };
    Harness {
        observer,
        sink,
        xid_tx,
        stop: Some(stop),
        task,
        start: Instant::now(),
    }
}

impl Harness {
    /// Advances the paused clock in small steps until `cond` holds or `limit` passed.
    async fn wait_for(&self, limit: Duration, cond: impl Fn(&Self) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while !cond(self) {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await; // poll interval on the paused clock
        }
        true
    }

    async fn run_for(&self, d: Duration) {
        tokio::time::sleep(d).await; // advances the paused clock by this interval
    }

    fn since_start(&self, t: Instant) -> Duration {
        t.duration_since(self.start)
    }

    async fn stop(mut self) -> Recorder {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("loop did not stop")
            .expect("loop panicked");
        self.sink
    }
}

#[tokio::test(start_paused = true)]
async fn unchanged_observations_publish_only_at_the_heartbeat() {
    let h = start(PublishConfig::default());
    h.run_for(Duration::from_secs(125)).await;
    assert!(
        h.observer.count.load(Ordering::SeqCst) >= 12,
        "observes every 10 s"
    );
    let sink = h.stop().await;
    let times: Vec<u64> = sink
        .published()
        .iter()
        .map(|(t, _)| t.elapsed().as_secs())
        .collect();
    assert_eq!(times.len(), 3, "first + heartbeats at 60 s and 120 s: {times:?}");
}

#[tokio::test(start_paused = true)]
async fn a_material_change_publishes_at_once_and_noise_does_not() {
    let h = start(PublishConfig::default());
    first_report(&h).await;
    // Noise: a few degrees inside the same margin band.
    *h.observer.temperature.lock().unwrap_or_else(|e| e.into_inner()) = 3;
    h.run_for(Duration::from_secs(21)).await;
    assert_eq!(h.sink.published().len(), 1, "temperature noise is not a change");
    // Throttling starts: the next observation (≤ 10 s) is published within 2 s of it.
    *h.observer.throttled.lock().unwrap_or_else(|e| e.into_inner()) = true;
    let flipped = Instant::now();
    assert!(
        h.wait_for(Duration::from_secs(12), |h| h.sink.published().len() == 2)
            .await
    );
    let (at, _) = h.sink.published()[1];
    assert!(at.duration_since(flipped) <= Duration::from_secs(10) + Duration::from_secs(2));
    let observed_before = h.observer.count.load(Ordering::SeqCst);
    assert!(observed_before >= 4);
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_xid_notification_observes_and_publishes_immediately() {
    let h = start(PublishConfig::default());
    first_report(&h).await;
    h.run_for(Duration::from_secs(3)).await;
    *h.observer.throttled.lock().unwrap_or_else(|e| e.into_inner()) = true; // stands in for the XID's effect
    let sent = Instant::now();
    h.xid_tx.send_replace(1);
    assert!(
        h.wait_for(Duration::from_secs(2), |h| h.sink.published().len() == 2)
            .await
    );
    let (at, _) = h.sink.published()[1];
    assert!(
        at.duration_since(sent) < Duration::from_secs(2),
        "{:?}",
        at.duration_since(sent)
    );
    assert!(
        h.since_start(at) < Duration::from_secs(10),
        "did not wait for the interval"
    );
    h.stop().await;
}

/// Waits (on the paused clock, up to 2 s) for the loop's first report.
async fn first_report(h: &Harness) {
    assert!(
        h.wait_for(Duration::from_secs(2), |h| h.sink.published().len() == 1)
            .await,
        "no first report"
    );
}

/// GPU 0 starts throttling and an XID notification arrives: how long until the report that
/// shows it was published (panics if none within 3 s).
async fn throttled_by_an_xid(h: &Harness) -> Duration {
    *h.observer.throttled.lock().unwrap_or_else(|e| e.into_inner()) = true;
    let published = h.sink.published().len();
    let sent = Instant::now();
    h.xid_tx.send_replace(1);
    assert!(
        h.wait_for(Duration::from_secs(3), |h| h.sink.published().len() > published)
            .await,
        "the change was not published"
    );
    let (at, _) = h.sink.published()[published];
    at.duration_since(sent)
}

#[tokio::test(start_paused = true)]
async fn a_notification_just_after_a_periodic_observation_is_not_held_back() {
    let h = start(PublishConfig::default());
    first_report(&h).await;
    // The periodic observation at 10 s changed nothing; 200 ms later an XID arrives.
    h.run_for(Duration::from_millis(10_200)).await;
    let periodic = h.observer.last_observed().unwrap();
    let at = h.since_start(periodic);
    assert!(
        at >= Duration::from_secs(10) && at < Duration::from_millis(10_200),
        "{at:?}"
    );
    // Not 1 s after the periodic observation (min_gap counts from notified observations only).
    let waited = throttled_by_an_xid(&h).await;
    assert!(
        waited < Duration::from_millis(100),
        "published {waited:?} after the XID"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_xid_just_after_a_policy_change_is_not_held_back() {
    let (policies, rx) = watch::channel(known(vec![max_gpu_celsius(90)]));
    let h = start_with(PublishConfig::default(), Arc::new(Scripted::default()), Some(rx));
    first_report(&h).await;
    h.run_for(Duration::from_secs(3)).await;
    let before = h.observer.count.load(Ordering::SeqCst);
    policies.send_replace(known(vec![max_gpu_celsius(95)]));
    assert!(
        h.wait_for(Duration::from_secs(2), |h| h
            .observer
            .count
            .load(Ordering::SeqCst)
            > before)
            .await,
        "a policy change is observed"
    );
    h.run_for(Duration::from_millis(200)).await;
    let waited = throttled_by_an_xid(&h).await;
    assert!(
        waited < Duration::from_millis(100),
        "published {waited:?} after the XID"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_change_right_after_a_lease_renewal_is_written_at_once() {
    let h = start(PublishConfig::default());
    h.sink.lease.store(true, Ordering::SeqCst);
    first_report(&h).await;
    assert!(
        h.wait_for(Duration::from_secs(61), |h| h.sink.beats().len() == 1)
            .await
    );
    let beat = h.sink.beats()[0];
    let since_beat = Instant::now().duration_since(beat);
    let after = since_beat + throttled_by_an_xid(&h).await;
    assert!(
        after < Duration::from_millis(200),
        "the report was written {after:?} after the Lease renewal"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_xid_storm_is_rate_limited() {
    let h = start(PublishConfig::default());
    first_report(&h).await;
    for i in 0..200u64 {
        h.xid_tx.send_replace(i + 1);
        tokio::time::sleep(Duration::from_millis(10)).await; // storm interval, paused clock
    }
    // 2 s of storm: at most one observation per min_gap (1 s) on top of the interval.
    let observed = h.observer.count.load(Ordering::SeqCst);
    assert!(observed <= 4, "observed {observed} times during a 2 s storm");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn failed_publishes_back_off_and_keep_only_the_newest_observation() {
    let config = PublishConfig {
        interval: Duration::from_secs(1),
        ..PublishConfig::default()
    };
    let h = start(config);
    h.sink.failures_left.store(5, Ordering::SeqCst);
    assert!(
        h.wait_for(Duration::from_secs(60), |h| !h.sink.published().is_empty())
            .await
    );
    let attempts = h.sink.attempts.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let gaps: Vec<u64> = attempts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs())
        .collect();
    assert_eq!(gaps, vec![1, 2, 4, 8, 16], "exponential backoff");
    let published = h.sink.published();
    let (at, tag) = &published[0];
    // What finally went out is the observation made just before, not the first one.
    let n: u64 = tag.trim_start_matches("obs-").parse().unwrap_or(0);
    assert!(n >= 25, "published {tag} at {:?}", h.since_start(*at));
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn backoff_is_capped() {
    let config = PublishConfig {
        interval: Duration::from_secs(1),
        backoff_max: Duration::from_secs(5),
        ..PublishConfig::default()
    };
    let h = start(config);
    h.sink.failures_left.store(8, Ordering::SeqCst);
    assert!(
        h.wait_for(Duration::from_secs(120), |h| !h.sink.published().is_empty())
            .await
    );
    let attempts = h.sink.attempts.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let gaps: Vec<u64> = attempts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_secs())
        .collect();
    assert_eq!(gaps, vec![1, 2, 4, 5, 5, 5, 5, 5]);
    h.stop().await;
}

fn seconds(h: &Harness, times: impl IntoIterator<Item = Instant>) -> Vec<u64> {
    times.into_iter().map(|t| h.since_start(t).as_secs()).collect()
}

#[tokio::test(start_paused = true)]
async fn heartbeats_renew_the_lease_and_the_whole_report_is_refreshed_rarely() {
    let config = PublishConfig {
        report_refresh: Duration::from_secs(300),
        refresh_seed: 42,
        ..PublishConfig::default()
    };
    let h = start(config.clone());
    h.sink.lease.store(true, Ordering::SeqCst);
    h.run_for(Duration::from_secs(605)).await;
    let reports = seconds(&h, h.sink.published().into_iter().map(|(t, _)| t));
    let beats = seconds(&h, h.sink.beats());
    // First, then each refresh at the first observation (every 10 s) at least its jittered
    // part of report_refresh (half to all of it) after the last.
    let mut expected = vec![0u64];
    for n in 1.. {
        let after = config.refresh_after(n).as_secs_f64();
        let at = ((expected[expected.len() - 1] as f64 + after) / 10.0).ceil() as u64 * 10;
        if at > 605 {
            break;
        }
        expected.push(at);
    }
    assert_eq!(reports, expected, "first, then every jittered report_refresh");
    assert!(expected.len() >= 3, "two refreshes in 605 s: {expected:?}");
    // A Lease renewal a heartbeat after every write, report or renewal, and only then.
    let mut writes: Vec<(u64, bool)> = reports.iter().map(|t| (*t, false)).collect();
    writes.extend(beats.iter().map(|t| (*t, true)));
    writes.sort_unstable();
    for w in writes.windows(2) {
        let gap = w[1].0 - w[0].0;
        assert!(gap <= 60, "{gap} s without a write: {writes:?}");
        if w[1].1 {
            assert_eq!(gap, 60, "a renewal a heartbeat after the last write: {writes:?}");
        }
    }
    assert!(beats.len() >= 5, "{beats:?}");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn after_a_failed_heartbeat_the_whole_report_is_written() {
    let h = start(PublishConfig::default());
    h.sink.lease.store(true, Ordering::SeqCst);
    first_report(&h).await;
    h.sink.failures_left.store(1, Ordering::SeqCst);
    h.run_for(Duration::from_secs(135)).await;
    let reports = seconds(&h, h.sink.published().into_iter().map(|(t, _)| t));
    let beats = seconds(&h, h.sink.beats());
    // 60 s: the Lease renewal fails; 61 s: the retry writes the report (an operator that saw
    // the node go stale meanwhile gets a report event); then Lease renewals again, at the first
    // observation a heartbeat after that (every 10 s).
    assert_eq!(reports, vec![0, 61]);
    assert_eq!(beats, vec![130]);
    h.stop().await;
}

/// A policy with only `cooling.maxGpuCelsius`.
fn max_gpu_celsius(limit: i32) -> KnownPolicy {
    let spec =
        serde_json::from_value(serde_json::json!({ "cooling": { "maxGpuCelsius": limit } })).expect("policy");
    KnownPolicy {
        name: "hot".into(),
        spec,
    }
}

fn known(policies: Vec<KnownPolicy>) -> Known {
    Some(Arc::new(policies))
}

/// A GPU at 84 C, slowdown 97 (margin 13: far from every fallback band edge on the way to 86 C),
/// heartbeats on the Lease, so that only material changes and refreshes write the report.
fn at_84(policies: Option<watch::Receiver<Known>>) -> Harness {
    let observer = Arc::new(Scripted::default());
    *observer.slowdown.lock().unwrap_or_else(|e| e.into_inner()) = Some(97);
    observer.set_temperature(84);
    let h = start_with(PublishConfig::default(), observer, policies);
    h.sink.lease.store(true, Ordering::SeqCst);
    h
}

#[tokio::test(start_paused = true)]
async fn crossing_a_policy_threshold_publishes_at_once() {
    let (_tx, rx) = watch::channel(known(vec![max_gpu_celsius(85)]));
    let h = at_84(Some(rx));
    first_report(&h).await;
    h.run_for(Duration::from_secs(25)).await;
    assert_eq!(h.sink.published().len(), 1);
    h.observer.set_temperature(86);
    let flipped = Instant::now();
    assert!(
        h.wait_for(Duration::from_secs(12), |h| h.sink.published().len() == 2)
            .await,
        "86 C under maxGpuCelsius 85 was not published at once"
    );
    let (at, _) = h.sink.published()[1];
    let observed = h.observer.last_observed().expect("no observation");
    assert!(
        at.duration_since(observed) < Duration::from_secs(2),
        "published {:?} after the observation",
        at.duration_since(observed)
    );
    assert!(at.duration_since(flipped) <= Duration::from_secs(10) + Duration::from_secs(2));
    // Noise while drifted changes only the drift's text ("got 87 C"): nothing to publish.
    for t in [87, 86, 88, 87, 86, 88] {
        h.observer.set_temperature(t);
        h.run_for(Duration::from_secs(10)).await;
    }
    assert_eq!(h.sink.published().len(), 2, "noise while drifted was published");
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_policies_the_same_crossing_waits_for_the_refresh() {
    // The fallback (watch not synced, or forbidden): 84 -> 86 C crosses no margin band.
    let (_tx, rx) = watch::channel(None);
    let h = at_84(Some(rx));
    first_report(&h).await;
    h.observer.set_temperature(86);
    h.run_for(Duration::from_secs(120)).await;
    assert_eq!(
        h.sink.published().len(),
        1,
        "the band fallback published 84 -> 86 C"
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_new_policy_publishes_what_it_judges_differently_at_once() {
    let (tx, rx) = watch::channel(known(vec![]));
    let h = at_84(Some(rx));
    first_report(&h).await;
    // No policy checks the temperature: 86 C waits.
    h.observer.set_temperature(86);
    h.run_for(Duration::from_secs(25)).await;
    assert_eq!(h.sink.published().len(), 1);
    // A policy appears under which the published 84 C and the observed 86 C differ: the probe
    // observes and publishes without waiting for the interval.
    h.run_for(Duration::from_secs(2)).await;
    let sent = Instant::now();
    tx.send_replace(known(vec![max_gpu_celsius(85)]));
    assert!(
        h.wait_for(Duration::from_secs(3), |h| h.sink.published().len() == 2)
            .await
    );
    let (at, _) = h.sink.published()[1];
    assert!(
        at.duration_since(sent) < Duration::from_secs(2),
        "{:?}",
        at.duration_since(sent)
    );
    h.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_value_flapping_on_a_threshold_publishes_drifts_at_once_and_recoveries_after_the_gap() {
    let (_tx, rx) = watch::channel(known(vec![max_gpu_celsius(85)]));
    let h = at_84(Some(rx));
    first_report(&h).await;
    // 84, 86, 84, 86 ... every observation for an hour.
    for i in 0..360 {
        h.observer.set_temperature(if i % 2 == 0 { 86 } else { 84 });
        h.run_for(Duration::from_secs(10)).await;
    }
    let published = h.sink.published();
    // Each recovery waits 2 minutes after the previous write, each drift then follows at once:
    // at most two writes per 2 minutes instead of one per flip.
    assert!(
        (20..=61).contains(&published.len()),
        "{} writes in an hour of flapping",
        published.len()
    );
    h.stop().await;
}

/// After a GPU reset the probe wakes the loop without an XID (`XidLog::wake`: the watch is
/// notified, its value unchanged). The operator judges the reset by the first report written
/// after the outcome, so that wake writes the whole report even when the observation shows
/// nothing new: a regular observation may already have published what the reset changed, just
/// before the outcome was written (seen in the demo: the repair then waited for a report that
/// came only with the refresh, past the step's timeout).
#[tokio::test(start_paused = true)]
async fn a_wake_without_an_xid_writes_the_whole_report_even_when_nothing_changed() {
    // Lease renewals are not reports: only the wake can write one within the test.
    let h = start(PublishConfig {
        heartbeat: Duration::from_secs(3600),
        ..PublishConfig::default()
    });
    h.sink.lease.store(true, Ordering::SeqCst);
    first_report(&h).await;
    h.run_for(Duration::from_secs(15)).await;
    assert_eq!(h.sink.published().len(), 1, "nothing changed: no report");
    let woken = Instant::now();
    h.xid_tx.send_modify(|_| {});
    assert!(
        h.wait_for(Duration::from_secs(3), |h| h.sink.published().len() == 2)
            .await,
        "the wake wrote no report: {:?}",
        h.sink.published()
    );
    let (at, _) = h.sink.published()[1];
    assert!(
        at.duration_since(woken) < Duration::from_secs(2),
        "{:?}",
        at.duration_since(woken)
    );
    h.stop().await;
}
