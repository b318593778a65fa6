//! Summaries of samples: latency percentiles (nearest rank) and a median with its range.

use serde::{Deserialize, Serialize};

/// A figure for a table: three significant digits or so (no decimals from 100, one from 10).
pub fn figure(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Latency percentiles, milliseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

/// The `q` quantile (0–1) of `sorted` (ascending), by nearest rank; 0 when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl Latency {
    /// Percentiles of `ms` (nearest rank).
    pub fn of(ms: &[f64]) -> Latency {
        let mut v = ms.to_vec();
        v.sort_by(f64::total_cmp);
        let p = |q: f64| percentile(&v, q);
        Latency {
            count: v.len(),
            p50_ms: p(0.5),
            p90_ms: p(0.9),
            p99_ms: p(0.99),
            max_ms: v.last().copied().unwrap_or(0.0),
        }
    }
}

/// Median and spread of values.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Spread {
    /// Samples.
    pub count: usize,
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// Of `values` (the lower median when the count is even).
    pub fn of(values: &[f64]) -> Spread {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        Spread {
            count: v.len(),
            median: v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0),
            min: v.first().copied().unwrap_or(0.0),
            max: v.last().copied().unwrap_or(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_the_median_and_the_range() {
        let s = Spread::of(&[5.0, 1.0, 3.0, 4.0, 2.0]);
        assert_eq!((s.count, s.median, s.min, s.max), (5, 3.0, 1.0, 5.0));
        assert_eq!(Spread::of(&[2.0, 1.0]).median, 1.0);
        assert_eq!(Spread::of(&[]).count, 0);
    }
}
