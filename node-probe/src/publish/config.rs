//! The timing of the publish loop ([`PublishConfig`]).
//!
//! Plain data with its defaults; it may not import anything else from [`crate::publish`], so
//! every other publish module can depend on it.

use std::time::Duration;

use crate::change::ChangeConfig;

/// Timing of the publish loop.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    /// How often to observe.
    pub interval: Duration,
    /// Longest time without a write while nothing changes: the heartbeat (a Lease renewal where
    /// the sink has one).
    pub heartbeat: Duration,
    /// Longest time without writing the whole report while nothing material changes (temperatures
    /// within their band, power, counters no check reads). Each refresh comes after a jittered
    /// part of it, between half and all of it ([`PublishConfig::refresh_after`]).
    pub report_refresh: Duration,
    /// Seeds the refresh jitter: a hash of the node's name, so that probes started together
    /// (a rollout) do not refresh together ever after.
    pub refresh_seed: u64,
    /// Shortest time between two observations triggered by notifications (XIDs, policy
    /// changes), and between two report writes: bounds the work an XID storm causes. A
    /// periodic observation or a Lease renewal does not hold back the next notification.
    pub min_gap: Duration,
    /// First retry delay after a failed publish.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Shortest time from a report write to a write that only clears findings (a drift or an
    /// unknown that went away, nothing new): a value sitting on a threshold publishes its drift at
    /// once but not every flip back.
    pub recovery_gap: Duration,
    /// What counts as a material change when no policy is known.
    pub change: ChangeConfig,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            interval: Duration::from_secs(10),
            heartbeat: Duration::from_secs(60),
            report_refresh: Duration::from_secs(600),
            refresh_seed: 0,
            min_gap: Duration::from_secs(1),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            recovery_gap: Duration::from_secs(120),
            change: ChangeConfig::default(),
        }
    }
}

impl PublishConfig {
    /// How long after the `n`th report write the unchanged report is rewritten: between half of
    /// `report_refresh` and all of it, drawn from the node's seed and `n`. Drawn afresh after
    /// each write, so that a fleet whose reports were all written at once (a rollout, a policy
    /// change every probe publishes) spreads its refreshes over half the interval within one
    /// cycle, and never locks back into phase. Never longer than `report_refresh`: that stays the
    /// longest time between two writes.
    pub fn refresh_after(&self, n: u64) -> Duration {
        // 1,024 steps of the half interval: 0.3 s apart at the default 10 minutes.
        let step = mix(self.refresh_seed ^ mix(n)) % 1024;
        let half = self.report_refresh / 2;
        self.report_refresh - half.mul_f64(step as f64 / 1024.0)
    }
}

/// The refresh jitter's seed for node `node`: the first 64 bits of its name's SHA-256.
pub fn refresh_seed(node: &str) -> u64 {
    u64::from_str_radix(&gpunode_crds::names::digest(&[node], 16), 16).unwrap_or(0)
}

/// SplitMix64's finalizer: a well-spread 64-bit hash of `x` (not for security).
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(seed: u64) -> PublishConfig {
        PublishConfig {
            refresh_seed: seed,
            ..PublishConfig::default()
        }
    }

    #[test]
    fn a_refresh_comes_between_half_and_all_of_the_interval() {
        for seed in 0..50 {
            for n in 0..50 {
                let after = config(seed).refresh_after(n);
                assert!(
                    after >= Duration::from_secs(300) && after <= Duration::from_secs(600),
                    "{after:?}"
                );
            }
        }
    }

    #[test]
    fn nodes_that_wrote_together_refresh_spread_over_half_the_interval() {
        // 1,000 probes whose reports were written at the same instant: their next refreshes.
        let mut at: Vec<u64> = (0..1000u64)
            .map(|node| config(mix(node)).refresh_after(0).as_secs())
            .collect();
        at.sort_unstable();
        // Spread over [300 s, 600 s]: no 30-second bucket holds more than twice its share.
        let mut buckets = [0usize; 10];
        for t in &at {
            buckets[usize::try_from((t.saturating_sub(300) / 30).min(9)).unwrap_or(9)] += 1;
        }
        let most = buckets.iter().copied().max().unwrap_or(0);
        assert!(at[0] >= 300 && at[999] <= 600, "{} .. {}", at[0], at[999]);
        assert!(at[999] - at[0] >= 270, "{} .. {}", at[0], at[999]);
        assert!(most <= 200, "{most} of 1000 refreshes in one 30 s bucket");
        // And a node's own refreshes vary from one write to the next.
        let own: std::collections::BTreeSet<u64> = (0..10)
            .map(|n| config(7).refresh_after(n).as_millis() as u64)
            .collect();
        assert!(own.len() >= 9, "{own:?}");
    }
}
