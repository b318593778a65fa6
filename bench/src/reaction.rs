//! The reaction phases, run against one controller at a time (gpunode or the floor, `floor.rs`),
//! on the load generator's nodes: a fault is GPU 0 of a node thermally throttled, written by the
//! node's publish loop; the controller's answer is the taint on the node, seen by the tracker's
//! watch. Three shapes, measured apart (issue 45):
//!
//! * single faults, one at a time: report written → taint, and the recovery;
//! * bursts: `size` nodes faulted at once; the last report written → every node tainted;
//! * open loop: faults injected at a fixed rate whatever the answers, rate after rate, until one
//!   is not sustained (a fault not tainted within the deadline, or the p99 over a second): the
//!   saturation point is the last rate sustained.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream::FuturesUnordered};

use crate::{
    loadgen::{FakeNode, LoadGen},
    reaction_results::{Burst, Controller, OpenLoop, Run, SUSTAINED_P99_MS, Single},
    stats::Latency,
    tracker::Tracker,
};

/// How long one fault may take to be answered before it counts as failed.
const DEADLINE: Duration = Duration::from_secs(30);

/// What the benchmark reads of the controller's process around a phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reading {
    /// CPU seconds so far.
    pub cpu_s: f64,
    /// Its passes so far, where it counts them.
    pub passes: Option<f64>,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Single faults.
    pub changes: usize,
    /// Bursts, and their size.
    pub bursts: usize,
    /// Nodes per burst (at most half the load generator's nodes).
    pub burst_size: usize,
    /// Open-loop rates, faults per second, ascending.
    pub rates: Vec<f64>,
    /// Seconds of injection at each rate.
    pub rate_secs: f64,
}

/// Waits for `node`'s taint to be `on` (changed after `since`); the moment it was seen.
async fn answered(tracker: &Tracker, node: &str, on: bool, since: Instant) -> Option<Instant> {
    tracker
        .wait("a taint change", DEADLINE, |s| {
            s.nodes
                .get(node)
                .filter(|e| e.tainted == on && e.taint_changed_at > since)
                .map(|e| e.taint_changed_at)
        })
        .await
        .ok()
}

/// Waits for `node`'s report with the fault `on` written; the moment it was.
async fn written(load: &LoadGen, node: &FakeNode, on: bool) -> Option<Instant> {
    load.wait_for("a report written", DEADLINE, || node.published(on))
        .await
        .ok()
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// Faults `node` (`on`) or clears it, and measures report written → taint changed, and
/// observation changed → taint changed; None when either timed out.
async fn flip(load: &LoadGen, tracker: &Tracker, node: &FakeNode, on: bool) -> Option<(f64, f64)> {
    let at = Instant::now();
    node.set_throttled(on);
    let (seen, wrote) = tokio::join!(answered(tracker, &node.name, on, at), written(load, node, on));
    Some((ms(wrote?, seen?), ms(at, seen?)))
}

/// Single faults, one at a time, on successive nodes of `pool`.
pub async fn single(load: &LoadGen, tracker: &Tracker, pool: &[Arc<FakeNode>], changes: usize) -> Single {
    let mut out = Single::default();
    for k in 0..changes {
        let Some(node) = pool.get(k % pool.len().max(1)) else {
            break;
        };
        // Something is broken rather than slow: stop instead of waiting out every change.
        if out.failures >= 5 {
            break;
        }
        match flip(load, tracker, node, true).await {
            Some((w, c)) => {
                out.written_to_taint_ms.push(w);
                out.change_to_taint_ms.push(c);
            }
            None => out.failures += 1,
        }
        match flip(load, tracker, node, false).await {
            Some((w, _)) => out.recovery_ms.push(w),
            None => out.failures += 1,
        }
    }
    out
}

/// One burst on `nodes`: all faulted at once, then all cleared (the clearing is not measured).
pub async fn burst(load: &LoadGen, tracker: &Tracker, nodes: &[Arc<FakeNode>]) -> Burst {
    let at = Instant::now();
    for n in nodes {
        n.set_throttled(true);
    }
    let answers = futures::future::join_all(nodes.iter().map(|n| async move {
        let (seen, wrote) = tokio::join!(answered(tracker, &n.name, true, at), written(load, n, true));
        (seen, wrote)
    }))
    .await;
    let mut out = Burst {
        size: nodes.len(),
        ..Burst::default()
    };
    let (mut last_seen, mut last_written) = (at, at);
    for (seen, wrote) in answers {
        match (seen, wrote) {
            (Some(s), Some(w)) => {
                out.written_to_taint_ms.push(ms(w, s));
                last_seen = last_seen.max(s);
                last_written = last_written.max(w);
            }
            _ => out.failures += 1,
        }
    }
    out.last_written_to_all_ms = ms(last_written, last_seen);
    out.injected_to_all_ms = ms(at, last_seen);
    out.injected_to_last_written_ms = ms(at, last_written);
    let cleared = Instant::now();
    for n in nodes {
        n.set_throttled(false);
    }
    futures::future::join_all(nodes.iter().map(|n| answered(tracker, &n.name, false, cleared))).await;
    out
}

/// One rate of the open loop on `pool`: a fault every 1/`rate` s for `secs`, each on a node not
/// faulted at the moment, cleared once answered. The faults in flight are polled while the
/// schedule waits, so each is injected on time whatever the others do.
pub async fn open_loop(
    load: &LoadGen,
    tracker: &Tracker,
    pool: &[Arc<FakeNode>],
    rate: f64,
    secs: f64,
) -> OpenLoop {
    let offered = ((rate * secs).ceil() as usize).max(1);
    let mut out = OpenLoop {
        rate,
        offered,
        ..OpenLoop::default()
    };
    let mut busy = std::collections::HashSet::new();
    let mut running = FuturesUnordered::new();
    let mut record = |(i, answer): (usize, Option<f64>), busy: &mut std::collections::HashSet<usize>| {
        busy.remove(&i);
        match answer {
            Some(w) => out.written_to_taint_ms.push(w),
            None => out.failures += 1,
        }
    };
    let start = tokio::time::Instant::now();
    let mut next = 0usize;
    for k in 0..offered {
        let due = start + Duration::from_secs_f64(k as f64 / rate);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(due) => break,
                Some(done) = running.next(), if !running.is_empty() => record(done, &mut busy),
            }
        }
        let Some(i) = (0..pool.len())
            .map(|j| (next + j) % pool.len())
            .find(|j| !busy.contains(j))
        else {
            record((usize::MAX, None), &mut busy);
            continue;
        };
        next = i + 1;
        busy.insert(i);
        let node = pool[i].clone();
        running.push(async move {
            let answer = flip(load, tracker, &node, true).await;
            flip(load, tracker, &node, false).await;
            (i, answer.map(|(w, _)| w))
        });
    }
    while let Some(done) = running.next().await {
        record(done, &mut busy);
    }
    let p99 = Latency::of(&out.written_to_taint_ms).p99_ms;
    out.sustained = out.failures == 0 && p99 <= SUSTAINED_P99_MS;
    out
}

/// Every phase of `plan` on `pool` (the load generator's nodes; the bursts take theirs from the
/// end, the single faults and the open loop from the start), with `read` reading the
/// controller's process.
pub async fn run(
    load: &LoadGen,
    tracker: &Tracker,
    pool: &[Arc<FakeNode>],
    plan: &Plan,
    (controller, rep): (Controller, usize),
    mut read: impl AsyncFnMut() -> Reading,
) -> Run {
    let mut phases = Vec::new();
    let mut phase = |name: &str, from: jiff::Timestamp| {
        phases.push((
            name.to_string(),
            from.to_string(),
            jiff::Timestamp::now().to_string(),
        ));
    };
    let (t, before) = (jiff::Timestamp::now(), read().await);
    let mut single = single(load, tracker, pool, plan.changes).await;
    let after = read().await;
    let changes = (single.written_to_taint_ms.len() + single.recovery_ms.len()).max(1) as f64;
    single.cpu_ms_per_change = (after.cpu_s - before.cpu_s) * 1000.0 / changes;
    single.passes_per_change = after.passes.zip(before.passes).map(|(a, b)| (a - b) / changes);
    phase("single", t);
    let size = plan.burst_size.min(pool.len() / 2);
    let mut bursts = Vec::new();
    // A pool too small for a burst (a tiny N) runs none.
    let count = if size == 0 { 0 } else { plan.bursts };
    for _ in 0..count {
        let t = jiff::Timestamp::now();
        bursts.push(burst(load, tracker, &pool[pool.len() - size..]).await);
        phase("burst", t);
    }
    let mut open = Vec::new();
    let mut saturation_rate = 0.0;
    for &rate in &plan.rates {
        let t = jiff::Timestamp::now();
        let r = open_loop(load, tracker, pool, rate, plan.rate_secs).await;
        phase(&format!("open loop {rate}/s"), t);
        let sustained = r.sustained;
        open.push(r);
        if !sustained {
            break;
        }
        saturation_rate = rate;
    }
    Run {
        controller,
        rep,
        phases,
        single,
        bursts,
        open_loop: open,
        saturation_rate,
    }
}
