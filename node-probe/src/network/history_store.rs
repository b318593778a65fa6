//! The fabric counter history of the current boot, kept in the state directory beside the
//! XIDs (`<dir>/fabric-counters.json`, a [`BootFile`]) so that a restarted probe still counts the
//! link flaps and errors of the last hour.
//!
//! Same rules as the XID state: a file of another boot or node, or a missing, corrupt, too
//! large or unreadable one, is ignored with a warning and the history starts empty (the
//! counters restarted with the boot anyway). A failed save is logged once per failure streak
//! and retried on the next change; the probe carries on with the history in memory.

use std::sync::Mutex;

use gpunode_crds::report::PortErrorRates;

use super::counters::RawCounters;
use super::history::History;
use crate::boot_state::{BootFile, Ignored};

/// The state file's name in the state directory.
pub const FILE_NAME: &str = "fabric-counters.json";
/// Version of the file format.
pub const FORMAT: u32 = 1;
/// Largest file read: 64 ports × 11 counters × 13 samples take about 250 KiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The history, in memory and, with a file, saved whenever a sample is kept.
#[derive(Debug, Default)]
pub struct HistoryStore {
    inner: Mutex<Inner>,
    file: Option<BootFile>,
}

#[derive(Debug, Default)]
struct Inner {
    history: History,
    dirty: bool,
    failing: bool,
}

impl HistoryStore {
    /// A history kept in `file`, starting from what it holds for this boot and node.
    pub fn persistent(file: BootFile) -> HistoryStore {
        let mut inner = Inner::default();
        match file.load::<History>() {
            Ok(history) => {
                tracing::info!(path = %file.path().display(), "restored the fabric counter history of this boot");
                inner.history = history;
            }
            Err((why, detail)) => {
                if why != Ignored::Missing {
                    tracing::warn!(
                        reason = why.label(),
                        detail,
                        "ignoring the fabric counter history file"
                    );
                }
                // The next save replaces a file that does not belong to this boot.
                inner.dirty = why != Ignored::Missing;
            }
        }
        HistoryStore {
            inner: Mutex::new(inner),
            file: Some(file),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds one observation of every port (`<device>/<port>` → raw counters) at `now` (unix
    /// seconds) and returns each port's counts, in the same order; saves when the history changed.
    pub fn observe(&self, ports: &[(String, RawCounters)], now: i64) -> Vec<Option<PortErrorRates>> {
        let mut inner = self.lock();
        let mut dirty = inner.history.forget_stale(now);
        let rates = ports
            .iter()
            .map(|(port, raw)| {
                let observed = inner.history.observe(port, raw, now);
                dirty |= observed.changed;
                observed.rates
            })
            .collect();
        inner.dirty |= dirty;
        self.save(&mut inner);
        rates
    }

    fn save(&self, inner: &mut Inner) {
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
                    tracing::warn!(error = %e, "saving the fabric counter history failed: a restarted probe forgets it");
                }
                inner.failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::super::counters::ErrorCounter;
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
