//! Per-GPU signals that need more than one observation: how long the hardware power brake has
//! held the clocks down, and the PCIe replays over the last hour (the same windowed counts as
//! the fabric counters, [`crate::network::history`], so a counter moving at a healthy rate
//! changes nothing a policy reads and the report is not rewritten on every tick).
//!
//! Kept in memory, keyed by GPU UUID (an index can name another board after a reset): a
//! restarted probe starts both again, which only delays a drift (a brake looks newer, a window
//! shorter), never invents one.

use std::collections::BTreeMap;

use gpunode_crds::{ThrottleReason, report::GpuStatus};
use jiff::Timestamp;

use crate::network::history::{self, Series};

/// Most GPUs tracked (the report lists at most 64); older entries are dropped past it.
const MAX_GPUS: usize = 256;

#[derive(Debug, Default)]
struct Tracked {
    brake_since: Option<Timestamp>,
    replays: Series,
    last_seen: i64,
}

/// Every GPU's multi-observation state.
#[derive(Debug, Default)]
pub struct Signals {
    gpus: BTreeMap<String, Tracked>,
}

impl Signals {
    /// Fills `gpu.powerBrakeSince` and `gpu.pcie.replaysLastHour` from this observation at `now`.
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
        let replay_read = !gpu.errors.iter().any(|e| e.field == "pcie.replayCounter");
        if let Some(pcie) = gpu.pcie.as_mut().filter(|_| replay_read) {
            let (count, covered, _) = history::observe_one(&mut tracked.replays, pcie.replay_counter, secs);
            pcie.replays_last_hour = Some(count);
            pcie.replay_window_minutes = Some(history::minutes(covered));
        }
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
        let mut s = Signals::default();
        let mut g = gpu(1_000, false);
        s.apply(&mut g, at(0));
        assert_eq!(g.pcie.as_ref().and_then(|p| p.replays_last_hour), Some(0));
        // Steady replays: 5 every 5 minutes; the count stays bounded by the window.
        for step in 1..=24 {
            let mut g = gpu(1_000 + 5 * step, false);
            s.apply(&mut g, at(300 * step as i64));
            let count = g.pcie.as_ref().and_then(|p| p.replays_last_hour);
            assert!(count.is_some_and(|c| c <= 60), "step {step}: {count:?}");
        }
    }
}
