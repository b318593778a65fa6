//! Driver statistics of a network interface (what `ethtool -S` prints), for the per-priority
//! PFC pause counters (`rx_prio{p}_pause`, `tx_prio{p}_pause` on mlx5).
//!
//! The real source uses the `SIOCETHTOOL` ioctl (GSSET_INFO, GSTRINGS, GSTATS) through the
//! below-ethtool crate, so this crate stays free of unsafe code.
//!
//! It only reads; it never changes an interface's settings.

use std::collections::BTreeMap;
use std::path::PathBuf;

use below_ethtool::EthtoolReadable;

use gpunode_crds::report::PauseCounters;

/// Why statistics could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EthtoolError {
    /// The ioctl failed (no such interface, driver without statistics, ...).
    #[error("ethtool: {0}")]
    Ioctl(String),
    /// The fixture file is missing or invalid.
    #[error("ethtool fixture {path}: {reason}")]
    Fixture {
        /// The fixture file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Where interface statistics come from.
pub trait EthtoolSource: Send + Sync {
    /// All named statistics of `ifname`.
    fn stats(&self, ifname: &str) -> Result<BTreeMap<String, u64>, EthtoolError>;
}

/// Reads statistics with the ethtool ioctl.
#[derive(Debug, Default)]
pub struct IoctlEthtool;

impl EthtoolSource for IoctlEthtool {
    fn stats(&self, ifname: &str) -> Result<BTreeMap<String, u64>, EthtoolError> {
        let ethtool = below_ethtool::Ethtool::new(ifname).map_err(|e| EthtoolError::Ioctl(e.to_string()))?;
        let stats = ethtool.stats().map_err(|e| EthtoolError::Ioctl(e.to_string()))?;
        Ok(stats.into_iter().collect())
    }
}

/// Reads `<dir>/ethtool/<ifname>.json`: a map of statistic name to value, or
/// `{"error": "..."}` to simulate a failing ioctl.
#[derive(Debug, Clone)]
pub struct FixtureEthtool {
    dir: PathBuf,
}

impl FixtureEthtool {
    /// A source reading `<dir>/ethtool/`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FixtureEthtool { dir: dir.into() }
    }
}

impl EthtoolSource for FixtureEthtool {
    fn stats(&self, ifname: &str) -> Result<BTreeMap<String, u64>, EthtoolError> {
        let path = self.dir.join("ethtool").join(format!("{ifname}.json"));
        let fixture_error = |reason: String| EthtoolError::Fixture {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| fixture_error(e.to_string()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| fixture_error(e.to_string()))?;
        if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
            return Err(EthtoolError::Ioctl(error.to_owned()));
        }
        serde_json::from_value(value).map_err(|e| fixture_error(e.to_string()))
    }
}

/// Per-priority pause counters from mlx5 statistic names; a priority is listed when the driver
/// exposes either counter for it (mlx5 does only while PFC is on for that priority).
pub fn pause_counters(stats: &BTreeMap<String, u64>) -> Vec<PauseCounters> {
    (0..8u8)
        .filter_map(|p| {
            let rx = stats.get(&format!("rx_prio{p}_pause")).copied();
            let tx = stats.get(&format!("tx_prio{p}_pause")).copied();
            (rx.is_some() || tx.is_some()).then(|| PauseCounters {
                priority: p,
                rx: rx.unwrap_or(0),
                tx: tx.unwrap_or(0),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_per_priority_pause_counters() {
        let stats: BTreeMap<String, u64> = [
            ("rx_prio3_pause", 120),
            ("tx_prio3_pause", 5),
            ("rx_prio3_pause_duration", 8000),
            ("tx_prio6_pause", 1),
            ("rx_global_pause", 9),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(
            pause_counters(&stats),
            vec![
                PauseCounters {
                    priority: 3,
                    rx: 120,
                    tx: 5
                },
                PauseCounters {
                    priority: 6,
                    rx: 0,
                    tx: 1
                }
            ]
        );
    }

    #[test]
    fn the_ioctl_fails_cleanly_for_a_missing_interface() {
        let err = IoctlEthtool
            .stats("gpunode-none0")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with("ethtool:"), "{err}");
    }
}
