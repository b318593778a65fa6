//! Every transition of the publish loop's machine, without a cluster, a runtime or a clock:
//! instants are offsets from a fixed origin, observations are built by hand.

use std::sync::LazyLock;

use gpunode_crds::ThrottleReason;
use gpunode_crds::report::GpuStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::change::{ChangeConfig, KnownPolicy};

static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

/// `s` seconds after the loop started.
fn at(s: u64) -> Instant {
    *ORIGIN + Duration::from_secs(s)
}

/// `ms` milliseconds after the loop started.
fn at_ms(ms: u64) -> Instant {
    *ORIGIN + Duration::from_millis(ms)
}

fn wall() -> jiff::Timestamp {
    jiff::Timestamp::from_second(1_800_000_000).unwrap()
}

fn cfg() -> PublishConfig {
    PublishConfig::default()
}

/// One GPU at `celsius` (slowdown 97), throttled or not.
fn gpu(tag: &str, celsius: i32, throttled: bool) -> Arc<GpuNodeReportStatus> {
    Arc::new(GpuNodeReportStatus {
        probe_version: Some(tag.into()),
        observed_at: Some(Time(wall())),
        gpus: vec![GpuStatus {
            index: 0,
            temperature_celsius: Some(celsius),
            slowdown_celsius: Some(97),
            throttle_reasons: if throttled {
                vec![ThrottleReason::HwSlowdown]
            } else {
                vec![]
            },
            ..GpuStatus::default()
        }],
        ..GpuNodeReportStatus::default()
    })
}

fn quiet(tag: &str) -> Arc<GpuNodeReportStatus> {
    gpu(tag, 84, false)
}

fn throttled(tag: &str) -> Arc<GpuNodeReportStatus> {
    gpu(tag, 84, true)
}

fn policies() -> Known {
    let spec = serde_json::from_value(serde_json::json!({ "cooling": { "maxGpuCelsius": 85 } })).unwrap();
    Some(Arc::new(vec![KnownPolicy {
        name: "hot".into(),
        spec,
    }]))
}

fn observed_with(now: Instant, status: Arc<GpuNodeReportStatus>, known: Known) -> Event {
    Event::Observed(Observation {
        now,
        status,
        known,
        wall: wall(),
    })
}

fn observed(now: Instant, status: Arc<GpuNodeReportStatus>) -> Event {
    observed_with(now, status, None)
}

/// The due of a write from `from` to `to` under `known`.
fn change(from: &GpuNodeReportStatus, to: &GpuNodeReportStatus, known: &Known) -> Due {
    let changes = decide(
        from,
        to,
        known.as_deref().map(Vec::as_slice),
        &ChangeConfig::default(),
        wall(),
    );
    assert!(!changes.is_empty(), "no change");
    Due::changed(&changes)
}

fn throttling() -> Due {
    change(&quiet("a"), &throttled("b"), &None)
}

fn why(due: &Due) -> String {
    match due {
        Due::Change { why, .. } => why.clone(),
        other => panic!("not a change: {other:?}"),
    }
}

fn pending(status: Arc<GpuNodeReportStatus>, due: Due) -> Pending {
    Pending { status, due }
}

/// A wait until `until`, listening to both sources.
fn wait(until: Instant) -> Action {
    Action::Wait {
        until,
        xids: true,
        policies: true,
    }
}

fn writing(at: Instant, pending: Pending, write: Write, reason: &str) -> (State, Action) {
    let action = Action::Write {
        status: pending.status.clone(),
        write,
        reason: reason.into(),
    };
    let state = State::Writing {
        at,
        pending,
        write,
        reason: reason.into(),
    };
    (state, action)
}

/// `events` fed in order.
fn drive(machine: Machine, events: impl IntoIterator<Item = Event>) -> Machine {
    events
        .into_iter()
        .fold(machine, |m, event| step(&cfg(), m, event).0)
}

/// The loop as it starts, both notification channels open.
fn fresh() -> Machine {
    Machine::start(&cfg(), at(0), true, true).0
}

/// After the first observation `quiet("a")` at 0 s, while its write is under way.
fn writing_first() -> Machine {
    drive(fresh(), [Event::Woke { now: at(0) }, observed(at(0), quiet("a"))])
}

/// After the first report `quiet("a")` was written at 0 s; the next tick is at 10 s.
fn published() -> Machine {
    drive(writing_first(), [Event::Wrote(Beat::Report)])
}

/// [`published`], but the report is `gpu("hot", 86)` under [`policies`].
fn published_hot() -> Machine {
    drive(
        fresh(),
        [
            Event::Woke { now: at(0) },
            observed_with(at(0), gpu("hot", 86, false), policies()),
            Event::Wrote(Beat::Report),
        ],
    )
}

/// `machine` woken at `s` seconds, observing.
fn observing(machine: Machine, s: u64) -> Machine {
    drive(machine, [Event::Woke { now: at(s) }])
}

/// [`published`], renewing the heartbeat Lease at 60 s.
fn renewing() -> Machine {
    drive(observing(published(), 60), [observed(at(60), quiet("b"))])
}

/// [`published`], an XID observed at 500 ms found throttling, held by `min_gap` until 1 s.
fn held() -> Machine {
    drive(
        published(),
        [
            Event::Notified(Source::Xids),
            Event::Woke { now: at_ms(500) },
            observed(at_ms(500), throttled("b")),
        ],
    )
}

/// [`published`], the write of throttling at 10 s failed (retry at 11 s).
fn failed_change() -> Machine {
    drive(
        observing(published(), 10),
        [observed(at(10), throttled("b")), Event::WriteFailed],
    )
}

struct Row {
    name: &'static str,
    machine: Machine,
    event: Event,
    state: State,
    action: Action,
}

fn row(name: &'static str, machine: Machine, event: Event, (state, action): (State, Action)) -> Row {
    Row {
        name,
        machine,
        event,
        state,
        action,
    }
}

fn waiting(backlog: Backlog, action: Action) -> (State, Action) {
    (State::Waiting(backlog), action)
}

fn observing_state(s: u64, trigger: Trigger, backlog: Backlog) -> (State, Action) {
    let state = State::Observing {
        at: at(s),
        trigger,
        backlog,
    };
    (state, Action::Observe(trigger))
}

/// A wait until `until` that an XID does not end.
fn wait_without_xids(until: Instant) -> Action {
    Action::Wait {
        until,
        xids: false,
        policies: true,
    }
}

/// Starting: the first observation creates the report; then the ticks.
fn start_rows() -> Vec<Row> {
    vec![
        row(
            "first tick: observe",
            fresh(),
            Event::Woke { now: at(0) },
            observing_state(0, Trigger::Interval, Backlog::Clear),
        ),
        row(
            "the first observation creates the report",
            observing(fresh(), 0),
            observed(at(0), quiet("a")),
            writing(
                at(0),
                pending(quiet("a"), Due::first()),
                Write::Report,
                "first observation",
            ),
        ),
        row(
            "report written: wait for the next tick",
            writing_first(),
            Event::Wrote(Beat::Report),
            waiting(Backlog::Clear, wait(at(10))),
        ),
        row(
            "woken early: nothing to do, wait again",
            published(),
            Event::Woke { now: at(5) },
            waiting(Backlog::Clear, wait(at(10))),
        ),
        row(
            "the tick: observe",
            published(),
            Event::Woke { now: at(10) },
            observing_state(10, Trigger::Interval, Backlog::Clear),
        ),
        row(
            "the observer panicked: next tick one interval on",
            observing(published(), 13),
            Event::ObserveFailed,
            waiting(Backlog::Clear, wait(at(23))),
        ),
    ]
}

/// What an observation makes due: nothing, a change, a heartbeat, a refresh.
fn change_rows() -> Vec<Row> {
    vec![
        row(
            "no change, nothing due: wait for the next tick",
            observing(published(), 10),
            observed(at(10), quiet("b")),
            waiting(Backlog::Clear, wait(at(20))),
        ),
        row(
            "a material change is written at once",
            observing(published(), 10),
            observed(at(10), throttled("b")),
            writing(
                at(10),
                pending(throttled("b"), throttling()),
                Write::Report,
                &why(&throttling()),
            ),
        ),
        row(
            "a heartbeat later: renew the Lease",
            observing(published(), 60),
            observed(at(60), quiet("b")),
            writing(
                at(60),
                pending(quiet("b"), Due::Heartbeat),
                Write::Heartbeat,
                "heartbeat",
            ),
        ),
        row(
            "two heartbeats without a write: the whole report",
            observing(published(), 120),
            observed(at(120), quiet("b")),
            writing(
                at(120),
                pending(quiet("b"), Due::Heartbeat),
                Write::Report,
                "heartbeat after a failure or a gap",
            ),
        ),
        row(
            "report_refresh passed: the whole report",
            observing(published(), 600),
            observed(at(600), quiet("b")),
            writing(
                at(600),
                pending(quiet("b"), Due::Refresh),
                Write::Report,
                "refresh",
            ),
        ),
    ]
}

/// A heartbeat written: the Lease, or the report where the sink has no Lease.
fn heartbeat_rows() -> Vec<Row> {
    vec![
        row(
            "Lease renewed: wait for the next tick",
            renewing(),
            Event::Wrote(Beat::Lease),
            waiting(Backlog::Clear, wait(at(70))),
        ),
        row(
            "the sink had no Lease: it wrote the report",
            renewing(),
            Event::Wrote(Beat::Report),
            waiting(Backlog::Clear, wait(at(70))),
        ),
    ]
}

/// Notifications: an observation at once, each kind `min_gap` after its own last one.
fn notification_rows() -> Vec<Row> {
    let xid_noticed = || drive(published(), [Event::Notified(Source::Xids)]);
    let xid_observed = || {
        drive(
            xid_noticed(),
            [Event::Woke { now: at(2) }, observed(at(2), quiet("b"))],
        )
    };
    let policy_observed = || {
        drive(
            published(),
            [
                Event::Notified(Source::Policies),
                Event::Woke { now: at(4) },
                observed(at(4), quiet("b")),
            ],
        )
    };
    vec![
        row(
            "an XID: wake at once (no XID observed yet), stop listening",
            published(),
            Event::Notified(Source::Xids),
            waiting(Backlog::Clear, wait_without_xids(at(0))),
        ),
        row(
            "woken for an XID: observe",
            xid_noticed(),
            Event::Woke { now: at(2) },
            observing_state(2, Trigger::Xid, Backlog::Clear),
        ),
        row(
            "observed for the XID: listen again",
            observing(xid_noticed(), 2),
            observed(at(2), quiet("b")),
            waiting(Backlog::Clear, wait(at(10))),
        ),
        row(
            "a second XID waits min_gap after the first's observation",
            xid_observed(),
            Event::Notified(Source::Xids),
            waiting(Backlog::Clear, wait_without_xids(at(3))),
        ),
        row(
            "woken for a policy change: observe",
            drive(published(), [Event::Notified(Source::Policies)]),
            Event::Woke { now: at(4) },
            observing_state(4, Trigger::Policies, Backlog::Clear),
        ),
        row(
            "an XID just after a policy observation is not held back",
            policy_observed(),
            Event::Notified(Source::Xids),
            waiting(Backlog::Clear, wait_without_xids(at(0))),
        ),
    ]
}

/// Channels closing, shutdown, and events that do not belong to the state.
fn lifecycle_rows() -> Vec<Row> {
    vec![
        row(
            "the policy channel closed: never listened to again",
            published(),
            Event::Closed(Source::Policies),
            waiting(
                Backlog::Clear,
                Action::Wait {
                    until: at(10),
                    xids: true,
                    policies: false,
                },
            ),
        ),
        row(
            "the XID channel closed: never listened to again",
            published(),
            Event::Closed(Source::Xids),
            waiting(Backlog::Clear, wait_without_xids(at(10))),
        ),
        row(
            "shutdown while waiting: stop",
            published(),
            Event::Shutdown,
            (State::Stopped, Action::Stop),
        ),
        row(
            "stopped stays stopped",
            drive(published(), [Event::Shutdown]),
            Event::Woke { now: at(10) },
            (State::Stopped, Action::Stop),
        ),
        row(
            "an event that does not belong to the state changes nothing",
            published(),
            Event::Wrote(Beat::Report),
            waiting(Backlog::Clear, wait(at(10))),
        ),
    ]
}

/// Writes held back: by `min_gap` after a report write, a recovery by `recovery_gap`.
fn held_rows() -> Vec<Row> {
    let hot_to_cool = || change(&gpu("hot", 86, false), &gpu("cool", 84, false), &policies());
    let recovery = || pending(gpu("cool", 84, false), hot_to_cool());
    vec![
        row(
            "a change within min_gap of the last report is held",
            drive(
                published(),
                [Event::Notified(Source::Xids), Event::Woke { now: at_ms(500) }],
            ),
            observed(at_ms(500), throttled("b")),
            waiting(Backlog::Held(pending(throttled("b"), throttling())), wait(at(1))),
        ),
        row(
            "held until min_gap passed: write",
            held(),
            Event::Woke { now: at(1) },
            writing(
                at(1),
                pending(throttled("b"), throttling()),
                Write::Report,
                &why(&throttling()),
            ),
        ),
        row(
            "what was held reverted: nothing to write",
            drive(
                held(),
                [Event::Notified(Source::Policies), Event::Woke { now: at_ms(700) }],
            ),
            observed(at_ms(700), quiet("c")),
            waiting(Backlog::Clear, wait(at(10))),
        ),
        row(
            "a recovery waits recovery_gap after the last report",
            observing(published_hot(), 10),
            observed_with(at(10), gpu("cool", 84, false), policies()),
            waiting(Backlog::Held(recovery()), wait(at(20))),
        ),
        row(
            "a recovery recovery_gap after the last report: write",
            observing(published_hot(), 120),
            observed_with(at(120), gpu("cool", 84, false), policies()),
            writing(at(120), recovery(), Write::Report, &why(&hot_to_cool())),
        ),
    ]
}

/// Failed writes: the backoff, what waits meanwhile, and the whole report on retry.
fn failure_rows() -> Vec<Row> {
    let failed_heartbeat = || drive(renewing(), [Event::WriteFailed]);
    vec![
        row(
            "the first write failed: retry after the initial backoff",
            writing_first(),
            Event::WriteFailed,
            waiting(Backlog::Failed(pending(quiet("a"), Due::first())), wait(at(1))),
        ),
        row(
            "after a failure the older, stronger reason stays with the newest observation",
            drive(
                failed_change(),
                [Event::Notified(Source::Xids), Event::Woke { now: at_ms(10_500) }],
            ),
            observed(at_ms(10_500), quiet("c")),
            waiting(
                Backlog::Failed(pending(quiet("c"), throttling())),
                Action::Wait {
                    until: at(11),
                    xids: true,
                    policies: true,
                },
            ),
        ),
        row(
            "after a failure a stronger new reason wins",
            drive(
                failed_heartbeat(),
                [Event::Notified(Source::Xids), Event::Woke { now: at_ms(60_500) }],
            ),
            observed(at_ms(60_500), throttled("c")),
            waiting(
                Backlog::Failed(pending(throttled("c"), throttling())),
                wait(at(61)),
            ),
        ),
        row(
            "the backoff passed: retry",
            failed_change(),
            Event::Woke { now: at(11) },
            writing(
                at(11),
                pending(throttled("b"), throttling()),
                Write::Report,
                &why(&throttling()),
            ),
        ),
        row(
            "a heartbeat retried after a failure writes the whole report",
            failed_heartbeat(),
            Event::Woke { now: at(61) },
            writing(
                at(61),
                pending(quiet("b"), Due::Heartbeat),
                Write::Report,
                "heartbeat after a failure or a gap",
            ),
        ),
        row(
            "failed again: the backoff doubles",
            drive(failed_change(), [Event::Woke { now: at(11) }]),
            Event::WriteFailed,
            waiting(
                Backlog::Failed(pending(throttled("b"), throttling())),
                wait(at(13)),
            ),
        ),
        row(
            "the retry succeeded: clear, min_gap to the next report",
            drive(failed_change(), [Event::Woke { now: at(11) }]),
            Event::Wrote(Beat::Report),
            waiting(Backlog::Clear, wait(at(20))),
        ),
    ]
}

#[test]
fn every_transition() {
    let rows = [
        start_rows(),
        change_rows(),
        heartbeat_rows(),
        notification_rows(),
        lifecycle_rows(),
        held_rows(),
        failure_rows(),
    ]
    .into_iter()
    .flatten();
    for Row {
        name,
        machine,
        event,
        state,
        action,
    } in rows
    {
        let (next, got) = step(&cfg(), machine, event);
        assert_eq!(next.state(), &state, "{name}: state");
        assert_eq!(got, action, "{name}: action");
    }
}

#[test]
fn the_loop_starts_waiting_for_an_observation_due_at_once() {
    let (machine, action) = Machine::start(&cfg(), at(0), true, true);
    assert_eq!(machine.state(), &State::Waiting(Backlog::Clear));
    assert_eq!(action, wait(at(0)));
    let (_, action) = Machine::start(&cfg(), at(0), false, false);
    assert_eq!(
        action,
        Action::Wait {
            until: at(0),
            xids: false,
            policies: false
        },
        "without channels nothing is listened to"
    );
}

#[test]
fn a_written_report_is_what_the_next_observation_is_compared_with() {
    let m = published();
    assert_eq!(m.memory.published, Some(quiet("a")));
    assert_eq!(m.memory.last_report_at, Some(at(0)));
    assert_eq!(m.memory.last_write_at, Some(at(0)));
    assert_eq!(m.memory.next_attempt, at(1), "min_gap after a report write");
    // A Lease renewal moves neither the report nor its time, and holds nothing back.
    let m = drive(renewing(), [Event::Wrote(Beat::Lease)]);
    assert_eq!(m.memory.published, Some(quiet("a")));
    assert_eq!(m.memory.last_report_at, Some(at(0)));
    assert_eq!(m.memory.last_write_at, Some(at(60)));
    assert_eq!(m.memory.next_attempt, at(60));
    // A failed write publishes nothing.
    let m = failed_change();
    assert_eq!(m.memory.published, Some(quiet("a")));
    assert_eq!(m.memory.last_write_at, Some(at(0)));
}

#[test]
fn a_change_right_after_a_lease_renewal_is_written_at_once() {
    let m = drive(
        renewing(),
        [Event::Wrote(Beat::Lease), Event::Notified(Source::Xids)],
    );
    let (m, _) = step(&cfg(), m, Event::Woke { now: at_ms(60_100) });
    let (m, action) = step(&cfg(), m, observed(at_ms(60_100), throttled("c")));
    assert!(
        matches!(m.state(), State::Writing { at, write: Write::Report, .. } if *at == at_ms(60_100)),
        "{action:?}"
    );
}

#[test]
fn retries_back_off_exponentially_up_to_the_cap_and_reset_on_success() {
    let config = PublishConfig {
        backoff_max: Duration::from_secs(5),
        ..cfg()
    };
    // The tick is far away: every wake is a retry.
    let (mut m, _) = Machine::start(&config, at(0), false, false);
    m.memory.next_tick = at(10_000);
    m.state = State::Writing {
        at: at(0),
        pending: pending(quiet("a"), Due::first()),
        write: Write::Report,
        reason: "first observation".into(),
    };
    let mut gaps = Vec::new();
    let mut now = at(0);
    for _ in 0..6 {
        assert_eq!(m.retry_in(), Duration::from_secs([1, 2, 4, 5, 5, 5][gaps.len()]));
        let (next, action) = step(&config, m, Event::WriteFailed);
        let Action::Wait { until, .. } = action else {
            panic!("{action:?}")
        };
        gaps.push(until.duration_since(now).as_secs());
        now = until;
        let (next, action) = step(&config, next, Event::Woke { now });
        assert!(matches!(action, Action::Write { .. }), "{action:?}");
        m = next;
    }
    assert_eq!(gaps, vec![1, 2, 4, 5, 5, 5]);
    let (m, _) = step(&config, m, Event::Wrote(Beat::Report));
    assert_eq!(
        m.retry_in(),
        Duration::from_secs(1),
        "a success resets the backoff"
    );
}

#[test]
fn a_closed_policy_channel_knows_no_policies_any_more() {
    // 86 C was published; 86 -> 84 C clears a drift under maxGpuCelsius 85 but crosses no band.
    let cool = || observed_with(at(10), gpu("cool", 84, false), policies());
    let (open, _) = step(&cfg(), observing(published_hot(), 10), cool());
    assert!(
        matches!(
            open.state(),
            State::Waiting(Backlog::Held(Pending {
                due: Due::Change { recovery: true, .. },
                ..
            }))
        ),
        "open: a recovery is held, {:?}",
        open.state()
    );
    let closed = drive(published_hot(), [Event::Closed(Source::Policies)]);
    let (m, action) = step(&cfg(), observing(closed, 10), cool());
    assert_eq!(m.state(), &State::Waiting(Backlog::Clear), "closed: {action:?}");
}

#[test]
fn a_zero_interval_does_not_hang_the_step() {
    let config = PublishConfig {
        interval: Duration::ZERO,
        ..cfg()
    };
    let (m, _) = Machine::start(&config, at(0), false, false);
    let (m, _) = step(&config, m, Event::Woke { now: at(0) });
    let (_, action) = step(&config, m, observed(at(0), quiet("a")));
    assert!(matches!(action, Action::Write { .. }));
}

#[test]
fn a_report_asked_for_is_written_whole_from_an_observation_made_after_the_ask() {
    // The reset's effect was published at 10 s by the tick; the probe then asks for a report
    // (the reset's outcome is written): an observation made after the ask is written whole
    // even though nothing changed since 10 s, once `min_gap` allows (11 s).
    let m = drive(
        observing(published(), 10),
        [observed(at(10), throttled("b")), Event::Wrote(Beat::Report)],
    );
    let m = drive(
        m,
        [
            Event::Notified(Source::ReportAsked),
            Event::Woke { now: at_ms(10_200) },
            observed(at_ms(10_200), throttled("c")),
        ],
    );
    assert!(
        matches!(m.state(), State::Waiting(Backlog::Held(p)) if p.due == Due::Refresh),
        "{:?}",
        m.state()
    );
    assert_eq!(m.memory.ask, Ask::Observed);
    // A later observation with nothing new keeps it due, with the newer observation.
    let m = drive(m, [Event::Woke { now: at(11) }]);
    assert!(
        matches!(m.state(), State::Writing { write: Write::Report, pending, .. } if pending.status == throttled("c")),
        "{:?}",
        m.state()
    );
    let m = drive(m, [Event::Wrote(Beat::Report)]);
    assert_eq!(m.memory.ask, Ask::None, "answered");
    // Answered: the next quiet observation is no report.
    let m = drive(m, [Event::Woke { now: at(20) }, observed(at(20), throttled("d"))]);
    assert!(
        matches!(m.state(), State::Waiting(Backlog::Clear)),
        "{:?}",
        m.state()
    );
}

#[test]
fn a_report_asked_for_is_not_answered_by_a_write_of_an_earlier_observation() {
    // A change observed at 10.5 s waits for `min_gap` (11 s); the ask comes at 10.6 s, before
    // any observation after it: writing the earlier one does not answer it.
    let m = drive(
        held(),
        [Event::Notified(Source::ReportAsked), Event::Woke { now: at(1) }],
    );
    assert!(
        matches!(m.state(), State::Observing { .. } | State::Writing { .. }),
        "{:?}",
        m.state()
    );
    assert_ne!(m.memory.ask, Ask::None);
}
