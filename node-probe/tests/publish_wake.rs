//! The publish loop on the real clock, in a multi-thread runtime like the probe's: an XID
//! notification must make the loop observe and publish without waiting for any other timer
//! (its own 10-s tick, a heartbeat, another task's timer). The paused clock of
//! `publish_loop.rs` cannot show this: there, time jumps straight to the next timer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpunode_crds::ThrottleReason;
use gpunode_crds::report::{GpuNodeReportStatus, GpuStatus};
use gpunode_probe::publish::{Beat, Observe, PublishConfig, PublishError, ReportSink, run_loop};
use gpunode_probe::state::ProbeState;
use tokio::sync::watch;

#[derive(Default)]
struct Flip {
    throttled: AtomicBool,
}

impl Observe for Flip {
    fn observe(&self) -> GpuNodeReportStatus {
        let throttled = self.throttled.load(Ordering::SeqCst);
        GpuNodeReportStatus {
            gpus: vec![GpuStatus {
                index: 0,
                throttle_reasons: if throttled {
                    vec![ThrottleReason::HwThermalSlowdown]
                } else {
                    vec![]
                },
                ..GpuStatus::default()
            }],
            ..GpuNodeReportStatus::default()
        }
    }
}

/// Sends, on every publish, whether the published GPU was throttled.
struct Told {
    tx: watch::Sender<Vec<(Instant, bool)>>,
}

impl ReportSink for Told {
    async fn publish(&mut self, status: &GpuNodeReportStatus) -> Result<(), PublishError> {
        let throttled = status
            .gpus
            .first()
            .is_some_and(|g| !g.throttle_reasons.is_empty());
        self.tx.send_modify(|v| v.push((Instant::now(), throttled)));
        Ok(())
    }

    async fn heartbeat(&mut self, _status: &GpuNodeReportStatus) -> Result<Beat, PublishError> {
        Ok(Beat::Lease)
    }
}

struct Node {
    observer: Arc<Flip>,
    xid: watch::Sender<u64>,
    published: watch::Receiver<Vec<(Instant, bool)>>,
}

fn start(config: &PublishConfig, stop: &watch::Sender<bool>) -> Node {
    let observer = Arc::new(Flip::default());
    let (xid, xid_rx) = watch::channel(0);
    let (tx, published) = watch::channel(Vec::new());
    let (config, o, mut stopped) = (config.clone(), observer.clone(), stop.subscribe());
    tokio::spawn(async move {
        let state = Arc::new(ProbeState::new("node-a", Duration::from_secs(60), None));
        let stopped = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        run_loop(&config, o, &mut Told { tx }, Some(xid_rx), state, stopped).await;
    });
    Node {
        observer,
        xid,
        published,
    }
}

/// Waits, without any timer of its own but the deadline, until the node published `n` reports.
async fn published(node: &mut Node, n: usize, within: Duration) -> Option<Instant> {
    tokio::time::timeout(within, node.published.wait_for(|v| v.len() >= n))
        .await
        .ok()?
        .ok()?
        .get(n - 1)
        .map(|(at, _)| *at)
}

// The deadline (3 s) is well inside the loop's 10-s interval and 60-s heartbeat: a publish
// within it was woken by the notification, not by the loop's own timers.
const WITHIN: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_change_is_published_without_waiting_for_another_timer() {
    // min_gap zero: the woken observation's deadline is already past when the loop computes it.
    let config = PublishConfig {
        min_gap: Duration::ZERO,
        recovery_gap: Duration::ZERO,
        ..PublishConfig::default()
    };
    let (stop, _) = watch::channel(false);
    let mut nodes: Vec<Node> = (0..8).map(|_| start(&config, &stop)).collect();
    for node in &mut nodes {
        assert!(published(node, 1, WITHIN).await.is_some(), "first report");
    }
    let mut count = 1;
    for round in 0..10 {
        for node in &mut nodes {
            node.observer.throttled.store(round % 2 == 0, Ordering::SeqCst);
            node.xid.send_modify(|v| *v += 1);
        }
        count += 1;
        for (i, node) in nodes.iter_mut().enumerate() {
            assert!(
                published(node, count, WITHIN).await.is_some(),
                "round {round}: node {i}'s change was not published within {WITHIN:?} of the notification"
            );
        }
    }
    stop.send_replace(true);
}
