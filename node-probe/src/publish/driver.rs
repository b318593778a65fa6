//! The publish loop's driver: [`run_loop`] and [`run_loop_with_policies`] feed the
//! [`super::machine`] events and carry out its actions (sleep and listen, observe, write, stop),
//! with the logs, metrics and the `publish` tracing span those effects have.
//!
//! It may not decide: no timing or publish rule lives here, every "when" and "what" comes from
//! [`step`]. Within [`crate::publish`] it imports the machine and the seams, never
//! [`super::kube_sink`] (any [`ReportSink`] will do).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use gpunode_crds::report::GpuNodeReportStatus;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::config::PublishConfig;
use super::machine::{Action, Event, Machine, Observation, Source, Trigger, Write, step};
use super::seams::{Beat, Observe, ReportSink};
use crate::policies::Known;
use crate::state::ProbeState;

/// The publish loop; returns when `shutdown` completes. `xids` wakes it when an XID arrives.
/// Without policies: see [`run_loop_with_policies`].
pub async fn run_loop<O: Observe, S: ReportSink>(
    config: &PublishConfig,
    observer: Arc<O>,
    sink: &mut S,
    xids: Option<watch::Receiver<u64>>,
    state: Arc<ProbeState>,
    shutdown: impl Future<Output = ()>,
) {
    run_loop_with_policies(config, observer, sink, xids, None, state, shutdown).await;
}

/// [`run_loop`], deciding by the operator's checks under the policies `policies` holds (see
/// [`crate::policies`]; while it holds `None`, or without it, by temperature bands). A change of
/// the policies triggers an observation, since the last published report may judge differently
/// under the new ones.
pub async fn run_loop_with_policies<O: Observe, S: ReportSink>(
    config: &PublishConfig,
    observer: Arc<O>,
    sink: &mut S,
    xids: Option<watch::Receiver<u64>>,
    policies: Option<watch::Receiver<Known>>,
    state: Arc<ProbeState>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let (mut machine, mut action) =
        Machine::start(config, Instant::now(), xids.is_some(), policies.is_some());
    let mut xids = xids;
    let xids_seen = xids.as_mut().map(|rx| *rx.borrow_and_update());
    let mut effects = Effects {
        observer,
        sink,
        xids,
        xids_seen,
        policies,
        state,
    };
    loop {
        let event = match action {
            Action::Wait {
                until,
                xids,
                policies,
            } => effects.wait(until, xids, policies, shutdown.as_mut()).await,
            Action::Observe(trigger) => effects.observe(trigger).await,
            Action::Write {
                status,
                write,
                reason,
            } => effects.write(&status, write, &reason, machine.retry_in()).await,
            Action::Stop => break,
        };
        (machine, action) = step(config, machine, event);
    }
    tracing::info!("publish loop stopped");
}

/// What the loop acts on: the observer, the sink, the notification channels and the state it
/// shares with `/metrics`.
struct Effects<'a, O, S> {
    observer: Arc<O>,
    sink: &'a mut S,
    xids: Option<watch::Receiver<u64>>,
    /// The XID count last seen: a notification that leaves it as it was asks for a report.
    xids_seen: Option<u64>,
    policies: Option<watch::Receiver<Known>>,
    state: Arc<ProbeState>,
}

/// The next change on `rx`: `true` for a new value, `false` once it closed; never without one.
async fn changed<T>(rx: Option<&mut watch::Receiver<T>>) -> bool {
    match rx {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

impl<O: Observe, S: ReportSink> Effects<'_, O, S> {
    /// Sleeps until `until`, a notification from a source it listens to, or shutdown.
    async fn wait<F: Future<Output = ()>>(
        &mut self,
        until: Instant,
        listen_xids: bool,
        listen_policies: bool,
        shutdown: Pin<&mut F>,
    ) -> Event {
        let xid_changed = changed(self.xids.as_mut().filter(|_| listen_xids));
        let policies_changed = changed(self.policies.as_mut().filter(|_| listen_policies));
        let notice = |source, alive| {
            if alive {
                Event::Notified(source)
            } else {
                Event::Closed(source)
            }
        };
        tokio::select! {
            () = shutdown => Event::Shutdown,
            () = tokio::time::sleep_until(until) => Event::Woke { now: Instant::now() },
            alive = xid_changed => {
                let source = self.xid_source();
                notice(source, alive)
            }
            alive = policies_changed => notice(Source::Policies, alive),
        }
    }

    /// What a notification on the XID channel was: new XIDs, or (the count unchanged) a report
    /// asked for.
    fn xid_source(&mut self) -> Source {
        let total = self.xids.as_mut().map(|rx| *rx.borrow_and_update());
        let seen = std::mem::replace(&mut self.xids_seen, total);
        if total.is_some() && total == seen {
            Source::ReportAsked
        } else {
            Source::Xids
        }
    }

    /// Observes off the async threads and shares the observation with `/metrics`.
    async fn observe(&self, trigger: Trigger) -> Event {
        let observer = self.observer.clone();
        let obs = match tokio::task::spawn_blocking(move || observer.observe()).await {
            Ok(obs) => obs,
            Err(e) => {
                tracing::error!(error = %e, "observation panicked");
                return Event::ObserveFailed;
            }
        };
        let reason = trigger.as_str();
        tracing::debug!(reason, "observed");
        self.state.set_latest(obs.clone());
        let known = self.policies.as_ref().and_then(|rx| rx.borrow().clone());
        Event::Observed(Observation {
            status: Arc::new(obs),
            known,
            wall: jiff::Timestamp::now(),
            now: Instant::now(),
        })
    }

    /// Writes `status` (the whole report, or a heartbeat) in a `publish` span.
    async fn write(
        &mut self,
        status: &GpuNodeReportStatus,
        write: Write,
        reason: &str,
        retry_in: std::time::Duration,
    ) -> Event {
        let span = tracing::info_span!("publish", reason, gpus = status.gpus.len());
        let result = match write {
            Write::Heartbeat => self.sink.heartbeat(status).instrument(span).await,
            Write::Report => self
                .sink
                .publish(status)
                .instrument(span)
                .await
                .map(|()| Beat::Report),
        };
        match result {
            Ok(beat) => {
                self.state.record_publish(true);
                match beat {
                    Beat::Report => tracing::info!(reason, "published"),
                    Beat::Lease => tracing::debug!("heartbeat Lease renewed"),
                }
                Event::Wrote(beat)
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?retry_in, "publish failed");
                self.state.record_publish(false);
                Event::WriteFailed
            }
        }
    }
}
