//! The XIDs of the current boot, kept in a small file so that they outlive the probe process
//! (a [`BootFile`]).
//!
//! NVML delivers an XID once, to the event sets registered when it happened: a probe that
//! restarts (rollout, OOM kill, crash) on the same boot would otherwise forget that a GPU fell
//! off the bus, and the node would look healthy again. The file `<dir>/xids.json` holds the node
//! name, the boot id (`<proc>/sys/kernel/random/boot_id`) and the newest XIDs per GPU (the same
//! cap as the report). It is replaced atomically (temporary file + rename) and only has to
//! outlive the process, not the kernel: a power loss is a reboot, which forgets the XIDs anyway,
//! so it is never fsynced. A file from another boot or node, or one that is missing, too large
//! or unreadable, is ignored with a warning (and counted in the metrics), never fatal.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use gpunode_crds::report::{MAX_GPUS, MAX_XIDS_PER_GPU, XidEvent};
use serde::{Deserialize, Serialize};

use crate::boot_state::BootFile;
pub use crate::boot_state::{Ignored, StateError};

/// The state file's name in the state directory.
pub const FILE_NAME: &str = "xids.json";
/// Largest state file read: 64 GPUs × 32 XIDs take about 100 KiB.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// Version of the file format.
const FORMAT: u32 = 1;

/// XIDs per GPU index, oldest first.
pub type XidsByGpu = BTreeMap<u32, Vec<XidEvent>>;

/// The file's own fields, beside the node and boot id.
#[derive(Serialize, Deserialize)]
struct StateFile {
    /// GPU index (as a string: JSON keys) → XIDs, oldest first.
    gpus: BTreeMap<u32, Vec<XidEvent>>,
}

/// Where and for which node and boot the XID state is kept.
#[derive(Debug, Clone)]
pub struct XidStore {
    file: BootFile,
}

impl XidStore {
    /// The store in `dir` for `node`, during the boot `proc_root` names.
    pub fn open(dir: &Path, node: &str, proc_root: &Path) -> Result<XidStore, StateError> {
        let file =
            BootFile::open(dir, FILE_NAME, FORMAT, MAX_FILE_BYTES, node, proc_root)?.with_xids_crash_point();
        Ok(XidStore { file })
    }

    /// Removes what an interrupted save of an earlier process left (see
    /// [`BootFile::remove_leftovers`]).
    pub fn remove_leftovers(&self) -> usize {
        self.file.remove_leftovers()
    }

    /// The same store, never written (`--once`, next to a running probe that owns the file).
    pub fn read_only(self) -> XidStore {
        XidStore {
            file: self.file.read_only(),
        }
    }

    /// The state file.
    pub fn path(&self) -> PathBuf {
        self.file.path()
    }

    /// The boot this store keeps XIDs for.
    pub fn boot_id(&self) -> &str {
        self.file.boot_id()
    }

    /// The XIDs saved during this boot on this node, capped like the report; or why there are none,
    /// with a detail for the log.
    pub fn load(&self) -> Result<XidsByGpu, (Ignored, String)> {
        let state: StateFile = self.file.load()?;
        Ok(state
            .gpus
            .into_iter()
            .filter(|(index, _)| (*index as usize) < MAX_GPUS)
            .map(|(index, mut xids)| {
                // The newest are kept, as in the report.
                let excess = xids.len().saturating_sub(MAX_XIDS_PER_GPU);
                xids.drain(..excess);
                (index, xids)
            })
            .filter(|(_, xids)| !xids.is_empty())
            .collect())
    }

    /// Replaces the state file with these XIDs (atomically: a reader sees the old or the new
    /// file, never half of one), creating the directory if needed. A read-only store writes
    /// nothing.
    pub fn save(&self, gpus: &BTreeMap<u32, VecDeque<XidEvent>>) -> Result<(), StateError> {
        let state = StateFile {
            gpus: gpus
                .iter()
                .map(|(index, xids)| (*index, xids.iter().cloned().collect()))
                .collect(),
        };
        self.file.save(&state)
    }
}

/// Creates `dir` if needed and hands it to `uid:gid`, for the chart's init container: the kubelet
/// creates a hostPath directory owned by root, and the probe runs as non-root. Needs CAP_CHOWN
/// only when the owner has to change.
pub fn prepare_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), StateError> {
    use std::os::unix::fs::MetadataExt;
    let io = |source| StateError::Io {
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let meta = std::fs::metadata(dir).map_err(io)?;
    if (meta.uid(), meta.gid()) != (uid, gid) {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// A proc root whose boot id is `boot`.
    fn proc_root(dir: &Path, boot: &str) -> PathBuf {
        let root = dir.join(format!("proc-{boot}"));
        let random = root.join("sys/kernel/random");
        std::fs::create_dir_all(&random).unwrap();
        std::fs::write(random.join("boot_id"), format!("{boot}\n")).unwrap();
        root
    }

    fn xid(code: u32, second: i64) -> XidEvent {
        XidEvent {
            xid: code,
            at: Time(jiff::Timestamp::from_second(1_700_000_000 + second).unwrap()),
        }
    }

    fn gpus(entries: &[(u32, &[XidEvent])]) -> BTreeMap<u32, VecDeque<XidEvent>> {
        entries
            .iter()
            .map(|(i, x)| (*i, x.iter().cloned().collect()))
            .collect()
    }

    #[test]
    fn round_trip_within_one_boot() {
        let dir = tempfile::tempdir().unwrap();
        let proc = proc_root(dir.path(), "boot-a");
        let store = XidStore::open(dir.path(), "n1", &proc).unwrap();
        assert_eq!(store.boot_id(), "boot-a");
        assert_eq!(store.load().err().map(|e| e.0), Some(Ignored::Missing));
        store
            .save(&gpus(&[(5, &[xid(79, 0), xid(48, 1)]), (0, &[xid(13, 2)])]))
            .unwrap();
        let again = XidStore::open(dir.path(), "n1", &proc).unwrap();
        let loaded = again.load().unwrap();
        assert_eq!(loaded.get(&5), Some(&vec![xid(79, 0), xid(48, 1)]));
        assert_eq!(loaded.get(&0), Some(&vec![xid(13, 2)]));
        assert_eq!(loaded.len(), 2);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("proc-"))
            .collect();
        assert_eq!(names, vec![FILE_NAME.to_owned()]);
    }

    #[test]
    fn saving_creates_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("not/yet");
        let store = XidStore::open(&state, "n1", &proc_root(dir.path(), "boot-a")).unwrap();
        store.save(&gpus(&[(0, &[xid(79, 0)])])).unwrap();
        assert_eq!(store.load().map(|g| g.len()), Ok(1));
    }

    #[test]
    fn a_new_boot_or_another_node_forgets() {
        let dir = tempfile::tempdir().unwrap();
        let before = XidStore::open(dir.path(), "n1", &proc_root(dir.path(), "boot-a")).unwrap();
        before.save(&gpus(&[(1, &[xid(79, 0)])])).unwrap();
        let rebooted = XidStore::open(dir.path(), "n1", &proc_root(dir.path(), "boot-b")).unwrap();
        let (why, detail) = rebooted.load().expect_err("restored across a reboot");
        assert_eq!(why, Ignored::OtherBoot);
        assert!(detail.contains("boot-a") && detail.contains("boot-b"), "{detail}");
        let other = XidStore::open(dir.path(), "n2", &proc_root(dir.path(), "boot-a")).unwrap();
        assert_eq!(other.load().err().map(|e| e.0), Some(Ignored::OtherNode));
        // The new boot's first write replaces the old boot's file.
        rebooted.save(&BTreeMap::new()).unwrap();
        assert_eq!(rebooted.load().map(|g| g.len()), Ok(0));
        assert_eq!(before.load().err().map(|e| e.0), Some(Ignored::OtherBoot));
    }

    #[test]
    fn corrupt_oversized_and_unreadable_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let store = XidStore::open(dir.path(), "n1", &proc_root(dir.path(), "boot-a")).unwrap();
        let path = store.path();
        for (text, want) in [
            ("{\"version\": 1, \"node\": \"n1\"", Ignored::Corrupt),
            ("not json", Ignored::Corrupt),
            (
                r#"{"version": 9, "node": "n1", "bootId": "boot-a", "gpus": {}}"#,
                Ignored::Corrupt,
            ),
            (
                r#"{"version": 1, "node": "n1", "bootId": "boot-a", "gpus": {"0": [{"xid": "x"}]}}"#,
                Ignored::Corrupt,
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            assert_eq!(store.load().err().map(|e| e.0), Some(want), "{text}");
        }
        std::fs::write(&path, vec![b' '; MAX_FILE_BYTES as usize + 1]).unwrap();
        assert_eq!(store.load().err().map(|e| e.0), Some(Ignored::TooLarge));
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert_eq!(store.load().err().map(|e| e.0), Some(Ignored::Unreadable));
        // And a directory in the way makes saving fail with an error, not a panic.
        assert!(store.save(&gpus(&[(0, &[xid(79, 0)])])).is_err());
    }

    #[test]
    fn a_loaded_file_is_capped_like_the_report() {
        let dir = tempfile::tempdir().unwrap();
        let store = XidStore::open(dir.path(), "n1", &proc_root(dir.path(), "boot-a")).unwrap();
        let many: Vec<XidEvent> = (0..100).map(|i| xid(13, i)).collect();
        store
            .save(&gpus(&[(0, &many), (MAX_GPUS as u32, &many[..1]), (3, &[])]))
            .unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.keys().copied().collect::<Vec<_>>(), vec![0]);
        let kept = loaded.get(&0).cloned().unwrap_or_default();
        assert_eq!(kept.len(), MAX_XIDS_PER_GPU);
        assert_eq!(kept.first(), Some(&xid(13, 100 - MAX_XIDS_PER_GPU as i64)));
    }

    #[test]
    fn a_read_only_store_writes_nothing_and_no_boot_id_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = XidStore::open(dir.path(), "n1", &proc_root(dir.path(), "boot-a"))
            .unwrap()
            .read_only();
        store.save(&gpus(&[(0, &[xid(79, 0)])])).unwrap();
        assert!(!store.path().exists());
        assert!(XidStore::open(dir.path(), "n1", &dir.path().join("no-proc")).is_err());
    }

    #[test]
    fn prepare_dir_creates_and_keeps_an_owned_directory() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("var/lib/gpunode");
        let meta = std::fs::metadata(dir.path()).unwrap();
        // Already ours: no chown needed (so no privilege either).
        prepare_dir(&state, meta.uid(), meta.gid()).unwrap();
        assert!(state.is_dir());
    }

    #[test]
    fn the_temporary_file_of_an_interrupted_save_is_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let store = XidStore::open(dir.path(), "n1", &proc_root(dir.path(), "boot-a")).unwrap();
        store.save(&gpus(&[(0, &[xid(79, 0)])])).unwrap();
        // What a probe killed between writing and renaming leaves; and another file's.
        std::fs::write(dir.path().join(format!(".{FILE_NAME}-Ab12Cd")), "{").unwrap();
        std::fs::write(dir.path().join(".fabric.json-Xy34Zw"), "{").unwrap();
        assert_eq!(store.remove_leftovers(), 1);
        assert!(!dir.path().join(format!(".{FILE_NAME}-Ab12Cd")).exists());
        assert!(dir.path().join(".fabric.json-Xy34Zw").exists());
        assert_eq!(store.load().unwrap().get(&0), Some(&vec![xid(79, 0)]));
    }
}
