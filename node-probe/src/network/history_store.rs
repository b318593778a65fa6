//! A counter history of the current boot ([`History`]), kept in the state directory beside the
//! XIDs (a [`BootFile`]: `fabric-counters.json` for the fabric, `nvlink-counters.json` for
//! NVLink, `pcie-replays.json` for the PCIe replays) so that a restarted probe still counts the link flaps and errors of the last hour.
//!
//! Same rules as the XID state: a file of another boot or node, or a missing, corrupt, too
//! large or unreadable one, is ignored with a warning and the history starts empty (the
//! counters restarted with the boot anyway). A failed save is logged once per failure streak
//! and retried on the next change; the probe carries on with the history in memory.

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpunode_crds::report::PortErrorRates;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::counters::{ErrorCounter, RawCounters};
use super::history::{Counts, History, port_rates};
use crate::boot_state::{BootFile, Ignored};

/// The state file's name in the state directory.
pub const FILE_NAME: &str = "fabric-counters.json";
/// Version of the file format.
pub const FORMAT: u32 = 1;
/// Largest file read: 64 ports × 11 counters × 13 samples take about 250 KiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The history, in memory and, with a file, saved whenever a sample is kept.
#[derive(Debug)]
pub struct HistoryStore<K = ErrorCounter> {
    inner: Mutex<Inner<K>>,
    file: Option<BootFile>,
    /// What the history counts, for the log ("fabric counter").
    what: &'static str,
}

#[derive(Debug)]
struct Inner<K> {
    history: History<K>,
    dirty: bool,
    failing: bool,
}

impl<K> Default for Inner<K> {
    fn default() -> Self {
        Inner {
            history: History::default(),
            dirty: false,
            failing: false,
        }
    }
}

impl Default for HistoryStore<ErrorCounter> {
    fn default() -> Self {
        HistoryStore::in_memory("fabric counter")
    }
}

impl HistoryStore<ErrorCounter> {
    /// The fabric counter history kept in `file`, starting from what it holds for this boot and
    /// node.
    pub fn persistent(file: BootFile) -> Self {
        HistoryStore::persistent_as(file, "fabric counter")
    }

    /// Adds one observation of every port (`<device>/<port>` → raw counters) at `now` (unix
    /// seconds) and returns each port's counts, in the same order; saves when the history changed.
    pub fn observe(&self, ports: &[(String, RawCounters)], now: i64) -> Vec<Option<PortErrorRates>> {
        self.observe_counts(ports, now)
            .into_iter()
            .map(|c| c.as_ref().map(port_rates))
            .collect()
    }
}

impl<K: Ord + Copy + Serialize + DeserializeOwned> HistoryStore<K> {
    /// A history of `what` ("NVLink counter") kept in memory only.
    pub fn in_memory(what: &'static str) -> Self {
        HistoryStore {
            inner: Mutex::new(Inner::default()),
            file: None,
            what,
        }
    }

    /// A history of `what` kept in `file`, starting from what it holds for this boot and node.
    pub fn persistent_as(file: BootFile, what: &'static str) -> Self {
        let mut inner = Inner::default();
        match file.load::<History<K>>() {
            Ok(history) => {
                tracing::info!(path = %file.path().display(), "restored the {what} history of this boot");
                inner.history = history;
            }
            Err((why, detail)) => {
                if why != Ignored::Missing {
                    tracing::warn!(reason = why.label(), detail, "ignoring the {what} history file");
                }
                // The next save replaces a file that does not belong to this boot.
                inner.dirty = why != Ignored::Missing;
            }
        }
        HistoryStore {
            inner: Mutex::new(inner),
            file: Some(file),
            what,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds one observation of every key (→ raw counters) at `now` (unix seconds) and returns
    /// each key's counts, in the same order; saves when the history changed.
    pub fn observe_counts(&self, keys: &[(String, BTreeMap<K, u64>)], now: i64) -> Vec<Option<Counts<K>>> {
        let mut inner = self.lock();
        let mut dirty = inner.history.forget_stale(now);
        let counts = keys
            .iter()
            .map(|(key, raw)| {
                let observed = inner.history.observe_counts(key, raw, now);
                dirty |= observed.changed;
                observed.rates
            })
            .collect();
        inner.dirty |= dirty;
        self.save(&mut inner);
        counts
    }

    fn save(&self, inner: &mut Inner<K>) {
        let Some(file) = &self.file else { return };
        if !inner.dirty {
            return;
        }
        match file.save(&inner.history) {
            Ok(()) => {
                inner.dirty = false;
                inner.failing = false;
            }
            Err(e) => {
                if !inner.failing {
                    tracing::warn!(error = %e, "saving the {} history failed: a restarted probe forgets it", self.what);
                }
                inner.failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::super::history::SLOT_SECS;
    use super::*;

    const T0: i64 = 1_800_000_000;

    fn proc_root(dir: &Path, boot: &str) -> PathBuf {
        let root = dir.join(format!("proc-{boot}"));
        let random = root.join("sys/kernel/random");
        std::fs::create_dir_all(&random).unwrap();
        std::fs::write(random.join("boot_id"), format!("{boot}\n")).unwrap();
        root
    }

    fn store(dir: &Path, boot: &str) -> HistoryStore {
        let file = BootFile::open(
            dir,
            FILE_NAME,
            FORMAT,
            MAX_FILE_BYTES,
            "n1",
            &proc_root(dir, boot),
        )
        .unwrap();
        HistoryStore::persistent(file)
    }

    fn flaps(store: &HistoryStore, value: u64, at: i64) -> Option<u64> {
        let ports = [(
            "mlx5_0/1".to_owned(),
            RawCounters::from([(ErrorCounter::LinkDowned, value)]),
        )];
        store.observe(&ports, at)[0].as_ref().and_then(|r| r.link_downed)
    }

    #[test]
    fn a_restart_on_the_same_boot_keeps_the_history() {
        let dir = tempfile::tempdir().unwrap();
        let before = store(dir.path(), "boot-a");
        flaps(&before, 10, T0);
        assert_eq!(flaps(&before, 12, T0 + SLOT_SECS), Some(2));
        drop(before);
        let after = store(dir.path(), "boot-a");
        // The flaps while the probe was away count too: 10 → 15 over the window.
        assert_eq!(flaps(&after, 15, T0 + SLOT_SECS + 30), Some(5));
    }

    #[test]
    fn a_new_boot_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let before = store(dir.path(), "boot-a");
        flaps(&before, 10, T0);
        flaps(&before, 12, T0 + SLOT_SECS);
        let rebooted = store(dir.path(), "boot-b");
        assert_eq!(flaps(&rebooted, 1, T0 + 2 * SLOT_SECS), Some(0));
        // And its first save replaced the old boot's file.
        assert_eq!(
            flaps(&store(dir.path(), "boot-b"), 3, T0 + 3 * SLOT_SECS),
            Some(2)
        );
    }

    #[test]
    fn a_counter_reset_between_restarts_restarts_its_history() {
        let dir = tempfile::tempdir().unwrap();
        let before = store(dir.path(), "boot-a");
        flaps(&before, 10, T0);
        flaps(&before, 12, T0 + SLOT_SECS);
        let after = store(dir.path(), "boot-a");
        assert_eq!(flaps(&after, 1, T0 + 2 * SLOT_SECS), Some(0));
    }

    #[test]
    fn a_corrupt_or_unwritable_file_never_stops_counting() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), "{\"version\": 1, \"ports\": [").unwrap();
        let s = store(dir.path(), "boot-a");
        flaps(&s, 10, T0);
        assert_eq!(flaps(&s, 11, T0 + 10), Some(1));
        // A directory in place of the file: saving fails, counting goes on in memory.
        std::fs::remove_file(dir.path().join(FILE_NAME)).unwrap();
        std::fs::create_dir(dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(flaps(&s, 13, T0 + SLOT_SECS), Some(3));
        assert_eq!(flaps(&HistoryStore::default(), 13, T0), Some(0));
    }
}
