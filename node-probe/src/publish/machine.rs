//! The publish loop as an explicit state machine, after kube-runtime's `watcher`: a [`State`],
//! the [`Event`]s that move it (a timer, a notification, the outcome of an observation or of a
//! write, shutdown), and a pure [`step`] that returns the next state and the [`Action`] the
//! driver ([`super::driver`]) carries out next.
//!
//! | State | Event | Next state | Action |
//! |---|---|---|---|
//! | `Waiting` | `Woke`, an observation due (tick, or a notification past its `min_gap`) | `Observing` | `Observe` |
//! | `Waiting` | `Woke`, no observation due, a pending write ready | `Writing` | `Write` |
//! | `Waiting` | `Woke`, nothing due | `Waiting` | `Wait` |
//! | `Waiting` | `Notified` (XID, policies) | `Waiting` | `Wait`, earlier, not listening to that source |
//! | `Waiting` | `Notified` (a report asked for) | `Waiting`, the report asked for | `Wait`, as for an XID |
//! | `Waiting` | `Closed` (XID, policies channel) | `Waiting` | `Wait`, never listening to it again |
//! | `Waiting` | `Shutdown` | `Stopped` | `Stop` |
//! | `Observing` | `Observed`, a write due and ready | `Writing` | `Write` |
//! | `Observing` | `Observed`, nothing ready | `Waiting` | `Wait` |
//! | `Observing` | `ObserveFailed` (the observer panicked) | `Waiting`, next tick one interval on | `Wait` |
//! | `Writing` | `Wrote` | `Waiting(Clear)`, backoff reset | `Wait` |
//! | `Writing` | `WriteFailed` | `Waiting(Failed)`, backoff doubled up to its cap | `Wait` |
//! | `Stopped` | any | `Stopped` | `Stop` |
//! | any other | an event that does not belong to it (the driver sends none) | unchanged | repeated |
//!
//! What an observation makes due ([`Due`]): the first one creates the report ("first
//! observation"); a material change ([`crate::change::decide`]) writes the whole report at once
//! (a recovery only `recovery_gap` after the last report write); with no change, the whole
//! report a jittered half to all of `report_refresh` after the last
//! ([`PublishConfig::refresh_after`]), or when one was asked for ([`Source::ReportAsked`]: after a
//! GPU reset, whose outcome the operator judges by the first report written after it) until an
//! observation made after the ask is written, and otherwise a heartbeat every `heartbeat`. A heartbeat renews
//! the Lease ([`Write::Heartbeat`]) unless a write failed since the last success or the last
//! write is two heartbeats old, when it writes the whole report. Report writes are at least
//! `min_gap` apart; a failed write waits out the backoff ([`Backlog::Failed`]).
//!
//! The machine does not tell API errors apart: every failed write is retried after the
//! backoff. What an answer means is the sink's business ([`super::kube_sink`]: a report deleted
//! under it is recreated at once, a Lease it may not write turns heartbeats into report
//! writes); server-side apply with `force` has no conflicts, and the policy watch's relists
//! (410) are kube-runtime's watcher's ([`crate::policies`]).
//!
//! Pure: [`step`] reads no clock (every instant comes in an event or was stored by one), sleeps
//! on nothing, calls no API, logs nothing and touches no shared state; the driver does all of
//! that. Within [`crate::publish`] it may import only [`super::backlog`], [`super::config`] and
//! [`super::seams`].

use std::sync::Arc;
use std::time::Duration;

use gpunode_crds::report::GpuNodeReportStatus;
use tokio::time::Instant;

use super::backlog::{Backlog, Due, Pending, ready_at};
use super::config::PublishConfig;
use super::seams::Beat;
use crate::change::decide;
use crate::policies::Known;

/// A source of notifications that wake the loop early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// New XIDs were logged.
    Xids,
    /// The known policies changed.
    Policies,
    /// A whole report was asked for on the XID channel, without a new XID (the probe's GPU
    /// reset: [`crate::nvml::xid::XidLog::wake`]).
    ReportAsked,
}

/// Why an observation is made (the `reason` of the "observed" log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// An XID notification.
    Xid,
    /// A policy change.
    Policies,
    /// The periodic tick.
    Interval,
}

impl Trigger {
    /// The text logged.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Xid => "xid",
            Trigger::Policies => "policies",
            Trigger::Interval => "interval",
        }
    }
}

/// What a write writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// The whole report ([`super::ReportSink::publish`]).
    Report,
    /// Only a heartbeat ([`super::ReportSink::heartbeat`]: the Lease where the sink has one).
    Heartbeat,
}

/// Where the loop is.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// Waiting for the next observation or write to fall due, a notification, or shutdown.
    Waiting(Backlog),
    /// An observation started at `at` is under way.
    Observing {
        /// When it started.
        at: Instant,
        /// Why it was made.
        trigger: Trigger,
        /// What waited to be written when it started.
        backlog: Backlog,
    },
    /// A write started at `at` is under way.
    Writing {
        /// When it started.
        at: Instant,
        /// What it writes and why.
        pending: Pending,
        /// The whole report or a heartbeat.
        write: Write,
        /// The reason logged and put on the publish span.
        reason: String,
    },
    /// Shut down: the loop has returned.
    Stopped,
}

/// A finished observation.
#[derive(Debug, Clone)]
pub struct Observation {
    /// When it finished.
    pub now: Instant,
    /// What was observed.
    pub status: Arc<GpuNodeReportStatus>,
    /// The policies known when it finished.
    pub known: Known,
    /// The wall-clock time the material-change decision judges both reports at.
    pub wall: jiff::Timestamp,
}

/// What happened: the input of [`step`].
#[derive(Debug, Clone)]
pub enum Event {
    /// The wait's deadline passed (at `now`).
    Woke {
        /// When the driver woke.
        now: Instant,
    },
    /// A notification arrived.
    Notified(Source),
    /// A notification channel closed: no more notifications from it.
    Closed(Source),
    /// Shutdown was requested.
    Shutdown,
    /// The observation succeeded.
    Observed(Observation),
    /// The observation failed (the observer panicked).
    ObserveFailed,
    /// The write succeeded and wrote this.
    Wrote(Beat),
    /// The write failed.
    WriteFailed,
}

/// What the driver does next: the output of [`step`].
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Sleep until `until`, or a notification from a source marked here, or shutdown.
    Wait {
        /// The deadline.
        until: Instant,
        /// Whether an XID notification ends the wait.
        xids: bool,
        /// Whether a policy change ends the wait.
        policies: bool,
    },
    /// Observe (off the async threads).
    Observe(Trigger),
    /// Write `status`.
    Write {
        /// The observation to write.
        status: Arc<GpuNodeReportStatus>,
        /// The whole report or a heartbeat.
        write: Write,
        /// The reason logged and put on the publish span.
        reason: String,
    },
    /// Return.
    Stop,
}

/// Where a notification source stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notice {
    /// Waiting for the next notification.
    Listening,
    /// A notification arrived; not listening until the observation it asks for is made.
    Noticed,
    /// No channel, or it closed.
    Closed,
}

/// A notification source: whether it is heard, and its last observation.
#[derive(Debug, Clone, PartialEq)]
struct Channel {
    notice: Notice,
    /// The last observation this source triggered: each storm bound counts from its own kind
    /// alone. Counting from any observation made a notification that came just after a
    /// periodic (or the other kind's) observation wait for `min_gap` behind a timer that had
    /// nothing to do with it.
    last_observe: Option<Instant>,
}

impl Channel {
    fn new(open: bool) -> Self {
        Channel {
            notice: if open { Notice::Listening } else { Notice::Closed },
            last_observe: None,
        }
    }
}

/// Where a report asked for ([`Source::ReportAsked`]) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// None asked for.
    None,
    /// Asked for; no observation made since.
    Asked,
    /// An observation made since the ask waits to be written whole (the backlog keeps only
    /// the newest observation, so whatever is written next was made after the ask).
    Observed,
}

/// What the loop remembers whatever its state.
#[derive(Debug, Clone, PartialEq)]
struct Memory {
    start: Instant,
    next_tick: Instant,
    xids: Channel,
    policies: Channel,
    /// The last report written.
    published: Option<Arc<GpuNodeReportStatus>>,
    /// Last write of the whole report.
    last_report_at: Option<Instant>,
    /// Whole reports written so far (draws each refresh's jitter).
    reports: u64,
    /// Last write of anything (report or Lease).
    last_write_at: Option<Instant>,
    /// No write before this: the backoff, or `min_gap` after a report write.
    next_attempt: Instant,
    /// The delay after the next failure.
    backoff: Duration,
    /// A whole report asked for, until one observed after the ask is written.
    ask: Ask,
}

/// The publish loop's state and memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    state: State,
    memory: Memory,
}

impl Machine {
    /// A loop starting at `now`, with or without XID and policy notifications, and its first
    /// action (a wait that ends at once: the first observation is due at the start).
    pub fn start(config: &PublishConfig, now: Instant, xids: bool, policies: bool) -> (Machine, Action) {
        let memory = Memory {
            start: now,
            next_tick: now,
            xids: Channel::new(xids),
            policies: Channel::new(policies),
            published: None,
            last_report_at: None,
            reports: 0,
            last_write_at: None,
            next_attempt: now,
            backoff: config.backoff_initial,
            ask: Ask::None,
        };
        let state = State::Waiting(Backlog::Clear);
        let action = memory.action(config, &state);
        (Machine { state, memory }, action)
    }

    /// Where the loop is.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// How long the loop waits if the write under way fails.
    pub fn retry_in(&self) -> Duration {
        self.memory.backoff
    }
}

/// The transition: the state after `event`, and what to do next. An event that does not belong
/// to the state (the driver sends none) leaves it as it is and repeats its action.
pub fn step(config: &PublishConfig, machine: Machine, event: Event) -> (Machine, Action) {
    let Machine { state, mut memory } = machine;
    let state = match (state, event) {
        (State::Waiting(_), Event::Shutdown) => State::Stopped,
        (State::Waiting(backlog), Event::Notified(source)) => {
            if source == Source::ReportAsked {
                memory.ask = Ask::Asked;
            }
            let channel = memory.channel(source);
            if channel.notice == Notice::Listening {
                channel.notice = Notice::Noticed;
            }
            State::Waiting(backlog)
        }
        (State::Waiting(backlog), Event::Closed(source)) => {
            memory.channel(source).notice = Notice::Closed;
            State::Waiting(backlog)
        }
        (State::Waiting(backlog), Event::Woke { now }) => memory.woke(config, backlog, now),
        (State::Observing { at, backlog, .. }, Event::Observed(observation)) => {
            memory.observed(config, at, backlog, observation)
        }
        (State::Observing { at, backlog, .. }, Event::ObserveFailed) => {
            memory.next_tick = at + config.interval;
            State::Waiting(backlog)
        }
        (State::Writing { at, pending, .. }, Event::Wrote(beat)) => memory.wrote(config, at, pending, beat),
        (State::Writing { at, pending, .. }, Event::WriteFailed) => memory.write_failed(config, at, pending),
        (state, _) => state,
    };
    let action = memory.action(config, &state);
    (Machine { state, memory }, action)
}

impl Memory {
    fn channel(&mut self, source: Source) -> &mut Channel {
        match source {
            Source::Xids | Source::ReportAsked => &mut self.xids,
            Source::Policies => &mut self.policies,
        }
    }

    /// When the next observation is due: the tick, or earlier for a notification, `min_gap`
    /// after the last observation of its own kind.
    fn observe_at(&self, config: &PublishConfig) -> Instant {
        let allowed = |last: Option<Instant>| last.map_or(self.start, |t| t + config.min_gap);
        [&self.xids, &self.policies]
            .into_iter()
            .filter(|c| c.notice == Notice::Noticed)
            .fold(self.next_tick, |at, c| at.min(allowed(c.last_observe)))
    }

    /// When the wait ends: the next observation, or earlier when what waits may be written.
    fn wake(&self, config: &PublishConfig, backlog: &Backlog) -> Instant {
        let observe_at = self.observe_at(config);
        match backlog.pending() {
            Some(p) => observe_at.min(ready_at(&p.due, self.next_attempt, self.last_report_at, config)),
            None => observe_at,
        }
    }

    fn action(&self, config: &PublishConfig, state: &State) -> Action {
        match state {
            State::Waiting(backlog) => Action::Wait {
                until: self.wake(config, backlog),
                xids: self.xids.notice == Notice::Listening,
                policies: self.policies.notice == Notice::Listening,
            },
            State::Observing { trigger, .. } => Action::Observe(*trigger),
            State::Writing {
                pending,
                write,
                reason,
                ..
            } => Action::Write {
                status: pending.status.clone(),
                write: *write,
                reason: reason.clone(),
            },
            State::Stopped => Action::Stop,
        }
    }

    /// The wait ended at `now`: observe if due, else write if ready, else wait again.
    fn woke(&mut self, config: &PublishConfig, backlog: Backlog, now: Instant) -> State {
        if now < self.observe_at(config) {
            return self.write_or_wait(config, backlog, now);
        }
        let trigger = if self.xids.notice == Notice::Noticed {
            Trigger::Xid
        } else if self.policies.notice == Notice::Noticed {
            Trigger::Policies
        } else {
            Trigger::Interval
        };
        State::Observing {
            at: now,
            trigger,
            backlog,
        }
    }

    /// The observation started at `at` finished: book it, decide what it makes due, and write
    /// if that is ready.
    fn observed(&mut self, config: &PublishConfig, at: Instant, backlog: Backlog, obs: Observation) -> State {
        for channel in [&mut self.xids, &mut self.policies] {
            if channel.notice == Notice::Noticed {
                channel.last_observe = Some(at);
                channel.notice = Notice::Listening;
            }
        }
        // A zero interval (refused by the command line) would never move the tick.
        if !config.interval.is_zero() {
            while self.next_tick <= at {
                self.next_tick += config.interval;
            }
        }
        if self.ask == Ask::Asked {
            self.ask = Ask::Observed;
        }
        let due = self.due(config, &obs, at);
        let backlog = backlog.after_observation(obs.status, due);
        self.write_or_wait(config, backlog, obs.now)
    }

    /// What the observation `obs`, started at `at`, makes due, if anything.
    fn due(&self, config: &PublishConfig, obs: &Observation, at: Instant) -> Option<Due> {
        let Some(published) = &self.published else {
            return Some(Due::first());
        };
        // A closed policy channel knows nothing any more.
        let known = match self.policies.notice {
            Notice::Closed => None,
            Notice::Listening | Notice::Noticed => obs.known.clone(),
        };
        let policies = known.as_deref().map(Vec::as_slice);
        let changes = decide(published, &obs.status, policies, &config.change, obs.wall);
        let since = |last: Option<Instant>, gap: Duration| last.is_none_or(|t| at.duration_since(t) >= gap);
        if !changes.is_empty() {
            Some(Due::changed(&changes))
        } else if self.ask == Ask::Observed || since(self.last_report_at, config.refresh_after(self.reports))
        {
            Some(Due::Refresh)
        } else if since(self.last_write_at, config.heartbeat) {
            Some(Due::Heartbeat)
        } else {
            None
        }
    }

    /// Writes what waits if it may go out at `now`, else waits. A heartbeat after a failure,
    /// or long after the last write (the loop stalled, the node was suspended), writes the
    /// whole report.
    fn write_or_wait(&self, config: &PublishConfig, backlog: Backlog, now: Instant) -> State {
        let ready = |p: &Pending| now >= ready_at(&p.due, self.next_attempt, self.last_report_at, config);
        let (pending, failed) = match backlog {
            Backlog::Held(p) if ready(&p) => (p, false),
            Backlog::Failed(p) if ready(&p) => (p, true),
            backlog => return State::Waiting(backlog),
        };
        let lapsed = self
            .last_write_at
            .is_none_or(|t| now.duration_since(t) >= config.heartbeat * 2);
        let lease_only = pending.due == Due::Heartbeat && !failed && !lapsed;
        let (write, reason) = match &pending.due {
            Due::Change { why, .. } => (Write::Report, why.clone()),
            Due::Refresh => (Write::Report, "refresh".to_owned()),
            Due::Heartbeat if lease_only => (Write::Heartbeat, "heartbeat".to_owned()),
            Due::Heartbeat => (Write::Report, "heartbeat after a failure or a gap".to_owned()),
        };
        State::Writing {
            at: now,
            pending,
            write,
            reason,
        }
    }

    /// The write started at `at` succeeded.
    fn wrote(&mut self, config: &PublishConfig, at: Instant, pending: Pending, beat: Beat) -> State {
        if beat == Beat::Report {
            self.published = Some(pending.status);
            self.last_report_at = Some(at);
            self.reports = self.reports.wrapping_add(1);
            if self.ask == Ask::Observed {
                self.ask = Ask::None;
            }
        }
        self.last_write_at = Some(at);
        self.backoff = config.backoff_initial;
        // `min_gap` bounds how often the report is rewritten; a Lease renewal (once a minute)
        // does not hold back the report change that follows it.
        self.next_attempt = match beat {
            Beat::Report => at + config.min_gap,
            Beat::Lease => at,
        };
        State::Waiting(Backlog::Clear)
    }

    /// The write started at `at` failed: retry after the backoff, which doubles up to its cap.
    fn write_failed(&mut self, config: &PublishConfig, at: Instant, pending: Pending) -> State {
        self.next_attempt = at + self.backoff;
        self.backoff = (self.backoff * 2).min(config.backoff_max);
        State::Waiting(Backlog::Failed(pending))
    }
}

#[cfg(test)]
mod tests;
