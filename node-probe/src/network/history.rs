//! A short history of cumulative error counters, turning them into counts over the last hour:
//! each RDMA port's counters (`errorRates` in the report) and each NVLink's
//! ([`crate::nvml::nvlink`]).
//!
//! Per key (a port, a GPU's link) and counter it keeps samples at least [`SLOT_SECS`] apart
//! from the last [`WINDOW_SECS`] (13 at most), so it stays small enough to save on every new
//! slot. The count of a counter is its current value minus its oldest sample in the window:
//! never extrapolated, so a burst right after the probe started reads as what it is, not as a
//! rate. A counter that went backwards (driver reload, GPU reset, counters cleared with
//! `perfquery -x`) or a sample from the future (the clock stepped back) starts the counter's
//! history again: nothing before it counts. Pure: the caller passes the time and keeps the
//! history where it likes ([`super::history_store`]).

use std::collections::{BTreeMap, VecDeque};

use gpunode_crds::report::PortErrorRates;
use serde::{Deserialize, Serialize};

use super::counters::{ErrorCounter, RawCounters};

/// How far back the counts reach.
pub const WINDOW_SECS: i64 = 3600;
/// Shortest time between two kept samples of a counter.
pub const SLOT_SECS: i64 = 300;
/// Most keys tracked; more than any node has (the report lists at most 64 ports, and 64 GPUs
/// of 18 links would be 1,152: the NVLink history caps itself below that).
const MAX_KEYS: usize = 2048;

/// Samples of one counter: (unix seconds, value), oldest first.
pub(crate) type Series = VecDeque<(i64, u64)>;

/// Every tracked key's counter samples, for counters of type `K` (the fabric's by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(serialize = "K: Serialize", deserialize = "K: Deserialize<'de> + Ord"))]
pub struct History<K = ErrorCounter> {
    /// `<device>/<port>` (or `<gpu>/<link>`) → counter → samples. The field keeps its name so
    /// that a fabric history saved by an older probe still loads.
    ports: BTreeMap<String, BTreeMap<K, Series>>,
}

impl<K> Default for History<K> {
    fn default() -> Self {
        History {
            ports: BTreeMap::new(),
        }
    }
}

/// The counts of one key's counters over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts<K> {
    /// Each counter's increase over the window.
    pub counts: BTreeMap<K, u64>,
    /// Minutes of history the counts cover (the shortest of the key's counters).
    pub window_minutes: u32,
}

/// What one observation of a key gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed<T> {
    /// The counts over the window; None when the key has no counter at all.
    pub rates: Option<T>,
    /// The history changed in a way worth saving (a sample kept, a counter restarted).
    pub changed: bool,
}

impl<K: Ord + Copy> History<K> {
    /// Adds the key's current values at `now` (unix seconds) and returns its counts.
    pub fn observe_counts(&mut self, key: &str, raw: &BTreeMap<K, u64>, now: i64) -> Observed<Counts<K>> {
        let unchanged = Observed {
            rates: None,
            changed: false,
        };
        if raw.is_empty() || (!self.ports.contains_key(key) && self.ports.len() >= MAX_KEYS) {
            return unchanged;
        }
        let series = self.ports.entry(key.to_owned()).or_default();
        let mut counts = Counts {
            counts: BTreeMap::new(),
            window_minutes: minutes(WINDOW_SECS),
        };
        let mut changed = false;
        for (kind, value) in raw {
            let (count, covered, stored) = observe_one(series.entry(*kind).or_default(), *value, now);
            changed |= stored;
            counts.window_minutes = counts.window_minutes.min(minutes(covered));
            counts.counts.insert(*kind, count);
        }
        Observed {
            rates: Some(counts),
            changed,
        }
    }

    /// Drops keys not observed within the window (gone, renamed): the history stays bounded.
    /// Returns whether any was dropped.
    pub fn forget_stale(&mut self, now: i64) -> bool {
        let before = self.ports.len();
        self.ports.retain(|_, counters| {
            counters
                .values()
                .filter_map(|s| s.back())
                .any(|(t, _)| *t >= now - WINDOW_SECS)
        });
        self.ports.len() != before
    }

    /// Samples kept, over all keys and counters (for tests and logs).
    pub fn samples(&self) -> usize {
        self.ports
            .values()
            .flat_map(|c| c.values())
            .map(VecDeque::len)
            .sum()
    }
}

impl History<ErrorCounter> {
    /// Adds the port's current values at `now` (unix seconds) and returns its counts.
    pub fn observe(&mut self, port: &str, raw: &RawCounters, now: i64) -> Observed<PortErrorRates> {
        let observed = self.observe_counts(port, raw, now);
        Observed {
            rates: observed.rates.map(|c| port_rates(&c)),
            changed: observed.changed,
        }
    }
}

/// A port's counts as the report publishes them.
pub fn port_rates(counts: &Counts<ErrorCounter>) -> PortErrorRates {
    let mut rates = PortErrorRates {
        window_minutes: counts.window_minutes,
        ..PortErrorRates::default()
    };
    for (kind, count) in &counts.counts {
        rates.set(*kind, Some(*count));
    }
    rates
}

/// Adds `value` at `now` to one counter's samples; returns the increase over the window, the
/// seconds it covers, and whether the samples changed.
pub(crate) fn observe_one(series: &mut Series, value: u64, now: i64) -> (u64, i64, bool) {
    let mut changed = false;
    if series.back().is_some_and(|(t, v)| *v > value || *t > now) {
        series.clear();
        changed = true;
    }
    while series.front().is_some_and(|(t, _)| *t < now - WINDOW_SECS) {
        series.pop_front();
        changed = true;
    }
    if series.back().is_none_or(|(t, _)| now - t >= SLOT_SECS) {
        series.push_back((now, value));
        changed = true;
    }
    let (since, oldest) = series.front().copied().unwrap_or((now, value));
    (value.saturating_sub(oldest), now - since, changed)
}

pub(crate) fn minutes(secs: i64) -> u32 {
    u32::try_from(secs.clamp(0, WINDOW_SECS) / 60).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000;

    fn raw(pairs: &[(ErrorCounter, u64)]) -> RawCounters {
        pairs.iter().copied().collect()
    }

    fn downed(h: &mut History, value: u64, at: i64) -> PortErrorRates {
        h.observe("mlx5_0/1", &raw(&[(ErrorCounter::LinkDowned, value)]), at)
            .rates
            .unwrap()
    }

    #[test]
    fn counts_the_increase_over_the_last_hour_without_extrapolating() {
        let mut h = History::<ErrorCounter>::default();
        // Counted since before the probe started: not in the window.
        let first = downed(&mut h, 40, T0);
        assert_eq!((first.link_downed, first.window_minutes), (Some(0), 0));
        let later = downed(&mut h, 43, T0 + 600);
        assert_eq!((later.link_downed, later.window_minutes), (Some(3), 10));
        // An hour after the flaps they leave the window (the sample at +600 is the oldest kept).
        let quiet = downed(&mut h, 43, T0 + 600 + WINDOW_SECS);
        assert_eq!((quiet.link_downed, quiet.window_minutes), (Some(0), 60));
    }

    #[test]
    fn samples_are_kept_one_per_slot_and_at_most_an_hour() {
        let mut h = History::<ErrorCounter>::default();
        for i in 0..1000 {
            downed(&mut h, i, T0 + i as i64 * 10);
        }
        let per_hour = (WINDOW_SECS / SLOT_SECS + 1) as usize;
        assert!(h.samples() <= per_hour, "{}", h.samples());
        // 10s observations, one error each: 360 per hour, counted from the oldest kept sample.
        let r = downed(&mut h, 1000, T0 + 10_000);
        assert!((330..=360).contains(&r.link_downed.unwrap()), "{r:?}");
    }

    #[test]
    fn a_counter_going_backwards_restarts_its_history() {
        let mut h = History::<ErrorCounter>::default();
        downed(&mut h, 100, T0);
        assert_eq!(downed(&mut h, 105, T0 + 300).link_downed, Some(5));
        // Counters cleared: nothing before counts, and the values after count from the reset.
        let observed = h.observe("mlx5_0/1", &raw(&[(ErrorCounter::LinkDowned, 2)]), T0 + 400);
        assert!(observed.changed);
        assert_eq!(observed.rates.unwrap().link_downed, Some(0));
        assert_eq!(downed(&mut h, 4, T0 + 800).link_downed, Some(2));
    }

    #[test]
    fn a_clock_stepping_back_restarts_the_history() {
        let mut h = History::<ErrorCounter>::default();
        downed(&mut h, 1, T0);
        assert_eq!(downed(&mut h, 9, T0 - 1000).link_downed, Some(0));
    }

    #[test]
    fn a_port_without_counters_has_no_rates_and_ports_are_bounded() {
        let mut h = History::<ErrorCounter>::default();
        assert_eq!(h.observe("mlx5_0/1", &RawCounters::new(), T0).rates, None);
        for i in 0..MAX_KEYS + 5 {
            h.observe(
                &format!("mlx5_{i}/1"),
                &raw(&[(ErrorCounter::SymbolErrors, 1)]),
                T0,
            );
        }
        assert_eq!(h.ports.len(), MAX_KEYS);
        assert!(h.forget_stale(T0 + WINDOW_SECS + 1));
        assert_eq!(h.ports.len(), 0);
    }

    #[test]
    fn each_counter_keeps_its_own_window() {
        let mut h = History::<ErrorCounter>::default();
        let port = "mlx5_0/1";
        h.observe(port, &raw(&[(ErrorCounter::SymbolErrors, 10)]), T0);
        let r = h
            .observe(
                port,
                &raw(&[
                    (ErrorCounter::SymbolErrors, 30),
                    (ErrorCounter::PauseStormErrors, 1),
                ]),
                T0 + 1200,
            )
            .rates
            .unwrap();
        assert_eq!(r.symbol_errors, Some(20));
        assert_eq!(r.pause_storm_errors, Some(0));
        // The newest counter has the shortest history, and the port reports that.
        assert_eq!(r.window_minutes, 0);
        assert_eq!(r.link_downed, None);
    }
}
