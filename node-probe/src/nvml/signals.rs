//! Per-GPU signals that need more than one observation: how long the hardware power brake has
//! held the clocks down, and the PCIe replays over the last hour (the same windowed counts as
//! the fabric counters, [`crate::network::history`], so a counter moving at a healthy rate
//! changes nothing a policy reads and the report is not rewritten on every tick).
//!
//! Keyed by GPU UUID (an index can name another board after a reset). The replay history is
//! kept across probe restarts on the same boot in `<state-dir>/pcie-replays.json`, like the
//! fabric and NVLink counters: a restarted probe still counts the replays of the last hour, a
//! rebooted node (whose counters restarted with the driver) starts again. The brake's start is
//! kept in memory: a restarted probe starts it again, which only delays a drift (a brake looks
//! newer), never invents one.

use std::collections::BTreeMap;

use gpunode_crds::{ThrottleReason, report::GpuStatus};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::network::history_store::HistoryStore;

/// Most GPUs tracked (the report lists at most 64); older entries are dropped past it.
const MAX_GPUS: usize = 256;

/// The replay history's file name in the state directory.
pub const FILE_NAME: &str = "pcie-replays.json";
/// Version of the file format.
pub const FORMAT: u32 = 1;
/// Largest file read: 64 GPUs × 13 samples take about 8 KiB.
pub const MAX_FILE_BYTES: u64 = 256 << 10;

/// The PCIe counters kept in the history: NVML's replay counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PcieCounter {
    /// `nvmlDeviceGetPcieReplayCounter`: link-level retransmissions since the driver loaded.
    Replay,
}

/// The PCIe replay history of the probe.
pub type ReplayHistory = HistoryStore<PcieCounter>;

#[derive(Debug, Default)]
struct Tracked {
    brake_since: Option<Timestamp>,
    last_seen: i64,
}

/// Every GPU's power brake state.
#[derive(Debug, Default)]
pub struct Signals {
    gpus: BTreeMap<String, Tracked>,
}

impl Signals {
    /// Fills `gpu.powerBrakeSince` from this observation at `now`.
    pub fn apply(&mut self, gpu: &mut GpuStatus, now: Timestamp) {
        let Some(uuid) = gpu.uuid.clone() else { return };
        let secs = now.as_second();
        if !self.gpus.contains_key(&uuid) && self.gpus.len() >= MAX_GPUS {
            self.forget_oldest();
        }
        let tracked = self.gpus.entry(uuid).or_default();
        tracked.last_seen = secs;
        let braking = gpu
            .throttle_reasons
            .contains(&ThrottleReason::HwPowerBrakeSlowdown);
        let reasons_read = !gpu.errors.iter().any(|e| e.field == "throttleReasons");
        // Unread reasons say nothing: keep the start, but publish none.
        tracked.brake_since = match (reasons_read, braking) {
            (true, true) => Some(tracked.brake_since.unwrap_or(now)),
            (true, false) => None,
            (false, _) => tracked.brake_since,
        };
        gpu.power_brake_since = tracked.brake_since.filter(|_| reasons_read).map(Into::into);
    }

    fn forget_oldest(&mut self) {
        if let Some(oldest) = self
            .gpus
            .iter()
            .min_by_key(|(_, t)| t.last_seen)
            .map(|(k, _)| k.clone())
        {
            self.gpus.remove(&oldest);
        }
    }
}

/// The key of a GPU in the replay history: its UUID (stable across index changes), else its
/// index.
fn history_key(gpu: &GpuStatus) -> String {
    match &gpu.uuid {
        Some(uuid) => uuid.clone(),
        None => format!("gpu{}", gpu.index),
    }
}

/// Turns every GPU's cumulative replay counter into the replays over the last hour, in one
/// history update at `now` (unix seconds), and puts them in `pcie.replaysLastHour` and
/// `pcie.replayWindowMinutes`. A GPU whose counter could not be read gets neither (the check
/// is unknown, with the field error).
pub fn add_replays(history: &ReplayHistory, gpus: &mut [GpuStatus], now: i64) {
    let read: Vec<usize> = gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| g.pcie.is_some() && !g.errors.iter().any(|e| e.field == "pcie.replayCounter"))
        .map(|(i, _)| i)
        .collect();
    let keys: Vec<(String, BTreeMap<PcieCounter, u64>)> = read
        .iter()
        .filter_map(|i| {
            let gpu = gpus.get(*i)?;
            let value = gpu.pcie.as_ref()?.replay_counter;
            Some((history_key(gpu), BTreeMap::from([(PcieCounter::Replay, value)])))
        })
        .collect();
    let counts = history.observe_counts(&keys, now);
    for (i, counts) in read.into_iter().zip(counts) {
        let (Some(pcie), Some(counts)) = (gpus.get_mut(i).and_then(|g| g.pcie.as_mut()), counts) else {
            continue;
        };
        pcie.replays_last_hour = counts.counts.get(&PcieCounter::Replay).copied();
        pcie.replay_window_minutes = Some(counts.window_minutes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunode_crds::report::PcieStatus;

    fn gpu(replays: u64, braking: bool) -> GpuStatus {
        GpuStatus {
            uuid: Some("GPU-1".into()),
            pcie: Some(PcieStatus {
                replay_counter: replays,
                ..PcieStatus::default()
            }),
            throttle_reasons: if braking {
                vec![ThrottleReason::HwPowerBrakeSlowdown]
            } else {
                vec![]
            },
            ..GpuStatus::default()
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn a_power_brake_keeps_its_start_until_it_stops() {
        let mut s = Signals::default();
        let mut g = gpu(0, true);
        s.apply(&mut g, at(0));
        s.apply(&mut g, at(30));
        assert_eq!(g.power_brake_since.map(|t| t.0), Some(at(0)));
        let mut g = gpu(0, false);
        s.apply(&mut g, at(60));
        assert_eq!(g.power_brake_since, None);
        let mut g = gpu(0, true);
        s.apply(&mut g, at(90));
        assert_eq!(g.power_brake_since.map(|t| t.0), Some(at(90)));
    }

    #[test]
    fn replays_count_over_the_window_not_since_boot() {
        let h = ReplayHistory::in_memory("PCIe replay");
        let mut g = [gpu(1_000, false)];
        add_replays(&h, &mut g, at(0).as_second());
        assert_eq!(g[0].pcie.as_ref().and_then(|p| p.replays_last_hour), Some(0));
        // Steady replays: 5 every 5 minutes; the count stays bounded by the window.
        for step in 1..=24 {
            let mut g = [gpu(1_000 + 5 * step, false)];
            add_replays(&h, &mut g, at(300 * step as i64).as_second());
            let count = g[0].pcie.as_ref().and_then(|p| p.replays_last_hour);
            assert!(count.is_some_and(|c| c <= 60), "step {step}: {count:?}");
        }
    }

    #[test]
    fn an_unread_counter_counts_nothing() {
        let h = ReplayHistory::in_memory("PCIe replay");
        let mut g = [gpu(7, false)];
        g[0].errors.push(gpunode_crds::report::FieldError {
            field: "pcie.replayCounter".into(),
            reason: "Unknown".into(),
        });
        add_replays(&h, &mut g, at(0).as_second());
        let pcie = g[0].pcie.as_ref().unwrap();
        assert_eq!((pcie.replays_last_hour, pcie.replay_window_minutes), (None, None));
    }
}
