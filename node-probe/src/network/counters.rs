//! The error counters of one RDMA port, as raw cumulative values: the InfiniBand port counters
//! in sysfs (`ports/<n>/counters/`, `ports/<n>/hw_counters/out_of_buffer`) and the discard and
//! pause-storm counters of a RoCE NIC's driver statistics (what `ethtool -S` prints on mlx5).
//!
//! A counter the kernel does not expose is simply absent (older kernels and drivers lack some);
//! one that exists but cannot be read or parsed is absent with an error naming its report field.
//! The values are cumulative since the driver loaded: [`super::history`] turns them into counts
//! over the last hour. The InfiniBand error counters are narrow (4 to 16 bits) and saturate
//! rather than wrap: a saturated counter stops rising, so it counts nothing until someone
//! clears it (`perfquery -x`), which the history sees as a reset.

use std::collections::BTreeMap;
use std::path::Path;

pub use gpunode_crds::ErrorCounter;

use crate::sysfs;

/// The InfiniBand port counters under `ports/<n>/counters/`.
const SYSFS_COUNTERS: [(&str, ErrorCounter); 7] = [
    ("link_downed", ErrorCounter::LinkDowned),
    ("symbol_error", ErrorCounter::SymbolErrors),
    ("link_error_recovery", ErrorCounter::LinkErrorRecovery),
    ("port_rcv_errors", ErrorCounter::RcvErrors),
    ("port_xmit_discards", ErrorCounter::XmitDiscards),
    ("excessive_buffer_overrun_errors", ErrorCounter::BufferOverruns),
    ("local_link_integrity_errors", ErrorCounter::LinkIntegrityErrors),
];

/// The mlx5 driver statistics read for a RoCE port.
const ETHTOOL_COUNTERS: [(&str, ErrorCounter); 4] = [
    ("rx_discards_phy", ErrorCounter::RxDiscards),
    ("rx_out_of_buffer", ErrorCounter::OutOfBuffer),
    ("tx_pause_storm_warning_events", ErrorCounter::PauseStormWarnings),
    ("tx_pause_storm_error_events", ErrorCounter::PauseStormErrors),
];

/// Raw cumulative values of one port's counters.
pub type RawCounters = BTreeMap<ErrorCounter, u64>;

/// A counter that exists but could not be read: its report field and why.
pub type CounterError = (&'static str, String);

/// The counters of the port in `port_dir`, with `stats` the driver statistics of its
/// interface (None: none, or they could not be read, which the PFC pause field already reports).
pub fn read(port_dir: &Path, stats: Option<&BTreeMap<String, u64>>) -> (RawCounters, Vec<CounterError>) {
    let mut raw = RawCounters::new();
    let mut errors = Vec::new();
    for (name, kind) in SYSFS_COUNTERS {
        read_file(&port_dir.join("counters").join(name), kind, &mut raw, &mut errors);
    }
    if let Some(stats) = stats {
        for (name, kind) in ETHTOOL_COUNTERS {
            if let Some(value) = stats.get(name) {
                raw.insert(kind, *value);
            }
        }
    }
    if !raw.contains_key(&ErrorCounter::OutOfBuffer) {
        let path = port_dir.join("hw_counters/out_of_buffer");
        read_file(&path, ErrorCounter::OutOfBuffer, &mut raw, &mut errors);
    }
    (raw, errors)
}

/// One counter file: absent is not an error, unreadable or garbage is.
fn read_file(path: &Path, kind: ErrorCounter, raw: &mut RawCounters, errors: &mut Vec<CounterError>) {
    let text = match sysfs::read_optional(path) {
        Ok(Some(text)) => text,
        Ok(None) => return,
        Err(e) => return errors.push((kind.field(), e.to_string())),
    };
    match text.parse::<u64>() {
        Ok(value) => {
            raw.insert(kind, value);
        }
        Err(e) => errors.push((kind.field(), sysfs::SysfsError::parse(path, &text, e).to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, value) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, format!("{value}\n")).unwrap();
        }
        dir
    }

    #[test]
    fn reads_the_sysfs_counters_that_exist() {
        let dir = port_dir(&[
            ("counters/link_downed", "3"),
            ("counters/symbol_error", "65535"),
            ("hw_counters/out_of_buffer", "17"),
        ]);
        let (raw, errors) = read(dir.path(), None);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            raw,
            RawCounters::from([
                (ErrorCounter::LinkDowned, 3),
                (ErrorCounter::SymbolErrors, 65535),
                (ErrorCounter::OutOfBuffer, 17),
            ])
        );
    }

    #[test]
    fn ethtool_statistics_add_the_roce_counters_and_win_for_out_of_buffer() {
        let dir = port_dir(&[("hw_counters/out_of_buffer", "17")]);
        let stats: BTreeMap<String, u64> = [
            ("rx_discards_phy", 5),
            ("rx_out_of_buffer", 9),
            ("tx_pause_storm_warning_events", 2),
            ("tx_pause_storm_error_events", 1),
            ("rx_prio3_pause", 1000),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let (raw, _) = read(dir.path(), Some(&stats));
        assert_eq!(
            raw,
            RawCounters::from([
                (ErrorCounter::RxDiscards, 5),
                (ErrorCounter::OutOfBuffer, 9),
                (ErrorCounter::PauseStormWarnings, 2),
                (ErrorCounter::PauseStormErrors, 1),
            ])
        );
    }

    #[test]
    fn garbage_or_unreadable_counters_are_errors_naming_the_field() {
        let dir = port_dir(&[("counters/link_downed", "many")]);
        std::fs::create_dir_all(dir.path().join("counters/symbol_error")).unwrap();
        let (raw, errors) = read(dir.path(), None);
        assert!(raw.is_empty());
        let fields: Vec<&str> = errors.iter().map(|e| e.0).collect();
        assert_eq!(fields, vec!["errorRates.linkDowned", "errorRates.symbolErrors"]);
    }

    #[test]
    fn no_counters_at_all_is_no_error() {
        let dir = port_dir(&[]);
        assert_eq!(read(dir.path(), None), (RawCounters::new(), Vec::new()));
    }
}
