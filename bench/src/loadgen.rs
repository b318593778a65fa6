//! The load generator: one node-probe publish loop per fake node, with the probe's own code
//! (`gpunode_probe::publish::run_loop` and `KubeSink`) and default timing (observe every 10 s,
//! material changes at once, the heartbeat Lease renewed every 60 s, the whole report refreshed
//! a jittered 5 to 10 minutes after the last, seeded by the node). Only the observation is synthetic: a
//! healthy 8x H100 report, optionally with GPU 0 thermally throttled.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use gpunode_crds::{ThrottleReason, report::GpuNodeReportStatus};
use gpunode_probe::{
    publish::{Beat, KubeSink, Observe, PublishConfig, PublishError, ReportSink, refresh_seed, run_loop},
    state::ProbeState,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use tokio::{sync::watch, task::JoinHandle};

use crate::error::Error;

/// The reason a changed report carries.
pub const THROTTLE: ThrottleReason = ThrottleReason::HwThermalSlowdown;

/// One fake node: what its probe observes, and when its report was last written.
pub struct FakeNode {
    /// Node name.
    pub name: String,
    template: Arc<GpuNodeReportStatus>,
    throttled: AtomicBool,
    wake: watch::Sender<u64>,
    /// First successful publish of a throttled / a clear observation since the last reset.
    pubs: Mutex<(Option<Instant>, Option<Instant>)>,
}

impl FakeNode {
    /// Makes the next observations throttled (or not) and wakes the publish loop, as an XID
    /// would; the loop publishes at once because the change is material.
    pub fn set_throttled(&self, throttled: bool) {
        *self.pubs.lock().unwrap_or_else(|p| p.into_inner()) = (None, None);
        self.throttled.store(throttled, Ordering::SeqCst);
        self.wake.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// When the first throttled (`true`) or clear report since the last change was written.
    pub fn published(&self, throttled: bool) -> Option<Instant> {
        let p = self.pubs.lock().unwrap_or_else(|p| p.into_inner());
        if throttled { p.0 } else { p.1 }
    }

    fn record(&self, throttled: bool, at: Instant) {
        let mut p = self.pubs.lock().unwrap_or_else(|p| p.into_inner());
        let slot = if throttled { &mut p.0 } else { &mut p.1 };
        slot.get_or_insert(at);
    }
}

fn is_throttled(status: &GpuNodeReportStatus) -> bool {
    status
        .gpus
        .first()
        .is_some_and(|g| g.throttle_reasons.contains(&THROTTLE))
}

impl Observe for FakeNode {
    fn observe(&self) -> GpuNodeReportStatus {
        let mut s = (*self.template).clone();
        s.observed_at = Some(Time(jiff::Timestamp::now()));
        if self.throttled.load(Ordering::SeqCst) {
            if let Some(g) = s.gpus.first_mut() {
                g.throttle_reasons.push(THROTTLE);
            }
            s.throttled_gpus = Some(1);
        }
        s
    }
}

/// Publish counters of the whole generator.
#[derive(Default)]
pub struct Stats {
    /// Successful publishes of the whole report.
    pub ok: AtomicU64,
    /// Heartbeat Lease renewals.
    pub beats: AtomicU64,
    /// Failed publishes (retried by the loop).
    pub failed: AtomicU64,
    /// Nodes whose report has been written at least once.
    pub nodes_published: AtomicUsize,
}

/// The probe's sink, timing each successful write.
struct TimedSink {
    inner: KubeSink,
    node: Arc<FakeNode>,
    stats: Arc<Stats>,
    tick: Arc<watch::Sender<u64>>,
    first: bool,
}

impl TimedSink {
    fn published(&mut self, status: &GpuNodeReportStatus) {
        self.node.record(is_throttled(status), Instant::now());
        self.stats.ok.fetch_add(1, Ordering::Relaxed);
        if self.first {
            self.first = false;
            self.stats.nodes_published.fetch_add(1, Ordering::Relaxed);
        }
        self.tick.send_modify(|v| *v = v.wrapping_add(1));
    }
}

impl ReportSink for TimedSink {
    async fn heartbeat(&mut self, status: &GpuNodeReportStatus) -> Result<Beat, PublishError> {
        let r = self.inner.heartbeat(status).await;
        match &r {
            Ok(Beat::Report) => self.published(status),
            Ok(Beat::Lease) => {
                self.stats.beats.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }

    async fn publish(&mut self, status: &GpuNodeReportStatus) -> Result<(), PublishError> {
        let r = self.inner.publish(status).await;
        match &r {
            Ok(()) => self.published(status),
            Err(_) => {
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }
}

/// The running generator.
pub struct LoadGen {
    /// The fake nodes, in node order.
    pub nodes: Vec<Arc<FakeNode>>,
    /// Counters.
    pub stats: Arc<Stats>,
    tick: Arc<watch::Sender<u64>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl LoadGen {
    /// Starts one publish loop per node; loop `i` starts after `i * stagger / n`, so heartbeats
    /// spread over the minute as those of probes started at different times do.
    pub fn start(
        client: &Client,
        names: &[String],
        template: GpuNodeReportStatus,
        stagger: Duration,
    ) -> LoadGen {
        let template = Arc::new(template);
        let stats = Arc::new(Stats::default());
        let tick = Arc::new(watch::channel(0).0);
        let (stop, _) = watch::channel(false);
        let mut nodes = Vec::new();
        let mut tasks = Vec::new();
        let n = names.len().max(1) as u32;
        for (i, name) in names.iter().enumerate() {
            let (wake, wake_rx) = watch::channel(0u64);
            let node = Arc::new(FakeNode {
                name: name.clone(),
                template: template.clone(),
                throttled: AtomicBool::new(false),
                wake,
                pubs: Mutex::new((None, None)),
            });
            nodes.push(node.clone());
            let delay = stagger * i as u32 / n;
            let mut sink = TimedSink {
                inner: KubeSink::new(client.clone(), name).with_heartbeat_lease(
                    crate::identity::OPERATOR_NAMESPACE,
                    PublishConfig::default().heartbeat,
                ),
                node: node.clone(),
                stats: stats.clone(),
                tick: tick.clone(),
                first: true,
            };
            let mut stop_rx = stop.subscribe();
            tasks.push(tokio::spawn(async move {
                let stopped = async move {
                    let _ = stop_rx.wait_for(|s| *s).await;
                };
                tokio::pin!(stopped);
                tokio::select! {
                    () = &mut stopped => return,
                    () = tokio::time::sleep(delay) => {}
                }
                let state = Arc::new(ProbeState::new(&node.name, Duration::from_secs(300), None));
                // The probe's own jitter, seeded by the node as the probe seeds it.
                let config = PublishConfig {
                    refresh_seed: refresh_seed(&node.name),
                    ..PublishConfig::default()
                };
                run_loop(&config, node.clone(), &mut sink, Some(wake_rx), state, stopped).await;
            }));
        }
        LoadGen {
            nodes,
            stats,
            tick,
            stop,
            tasks,
        }
    }

    /// Waits until every node's report has been written once.
    pub async fn wait_all_published(&self, timeout: Duration) -> Result<(), Error> {
        self.wait_for("every node's first report", timeout, || {
            (self.stats.nodes_published.load(Ordering::Relaxed) >= self.nodes.len()).then_some(())
        })
        .await
    }

    /// Waits until `f` returns a value, re-checking after every successful publish.
    pub async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut() -> Option<T>,
    ) -> Result<T, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.tick.subscribe();
        loop {
            rx.borrow_and_update();
            if let Some(v) = f() {
                return Ok(v);
            }
            if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    after: timeout,
                });
            }
        }
    }

    /// Successful publishes so far.
    pub fn published(&self) -> u64 {
        self.stats.ok.load(Ordering::Relaxed)
    }

    /// Stops every loop and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}
