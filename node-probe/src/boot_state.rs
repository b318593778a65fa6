//! A small state file that belongs to one node and one boot, so that what the probe learned
//! outlives the probe process but never the kernel.
//!
//! Used for the XIDs of the current boot ([`crate::xid_state`]) and the history of the fabric
//! error counters ([`crate::network::history`]). Each file is a JSON object holding a format
//! version, the node name and the boot id (`<proc>/sys/kernel/random/boot_id`) beside the
//! caller's own fields. It is replaced atomically (temporary file + rename) and never fsynced:
//! a power loss is a reboot, which forgets the state anyway. A file from another boot or node,
//! or one that is missing, too large or unreadable, is ignored with a reason, never fatal.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Why a state file could not be used or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The boot id could not be read, so the state cannot be tied to a boot.
    #[error("reading the boot id: {0}")]
    BootId(#[from] crate::sysfs::SysfsError),
    /// The state directory or file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The state could not be encoded as a JSON object.
    #[error("encoding the state: {0}")]
    Encode(#[from] serde_json::Error),
    /// The state is not a JSON object, so it cannot carry the node and boot id.
    #[error("encoding the state: not a JSON object")]
    NotAnObject,
}

/// Why a state file was not restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// There is none (first start since the directory was created, or it was lost).
    Missing,
    /// It could not be read.
    Unreadable,
    /// It is larger than any state the probe writes.
    TooLarge,
    /// It does not parse as a state file.
    Corrupt,
    /// It was written during another boot: the node rebooted.
    OtherBoot,
    /// It was written by the probe of another node.
    OtherNode,
}

impl Ignored {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Ignored::Missing => "missing",
            Ignored::Unreadable => "unreadable",
            Ignored::TooLarge => "too_large",
            Ignored::Corrupt => "corrupt",
            Ignored::OtherBoot => "other_boot",
            Ignored::OtherNode => "other_node",
        }
    }
}

/// The fields every state file carries beside the caller's.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    version: u32,
    node: String,
    boot_id: String,
}

/// One state file: where, its format version and size cap, and for which node and boot.
#[derive(Debug, Clone)]
pub struct BootFile {
    dir: PathBuf,
    name: &'static str,
    version: u32,
    max_bytes: u64,
    node: String,
    boot_id: String,
    writable: bool,
    /// The XID state's file: its saves pass the crash point `state::xids_before_rename`.
    xids_crash_point: bool,
}

impl BootFile {
    /// The file `dir/name` (format `version`, at most `max_bytes`) of `node`, during the boot
    /// `proc_root` names.
    pub fn open(
        dir: &Path,
        name: &'static str,
        version: u32,
        max_bytes: u64,
        node: &str,
        proc_root: &Path,
    ) -> Result<BootFile, StateError> {
        let boot_id = crate::sysfs::read_text(&proc_root.join("sys/kernel/random/boot_id"))?;
        Ok(BootFile {
            dir: dir.to_owned(),
            name,
            version,
            max_bytes,
            node: node.to_owned(),
            boot_id,
            writable: true,
            xids_crash_point: false,
        })
    }

    /// Removes the temporary files an earlier process left beside the file when it died in the
    /// middle of a save (between writing the new content and renaming it over the file), and
    /// returns how many. Only for the process that owns the file, before its first save: a
    /// save in flight has a temporary file of the same kind.
    pub fn remove_leftovers(&self) -> usize {
        let prefix = format!(".{}-", self.name);
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with(&prefix) && std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(dir = %self.dir.display(), file = self.name, removed, "removed the temporary files of an interrupted save");
        }
        removed
    }

    /// The same file, its saves passing the XID state's crash point (crate::crash).
    pub fn with_xids_crash_point(mut self) -> BootFile {
        self.xids_crash_point = true;
        self
    }

    /// The same file, never written (`--once`, next to a running probe that owns the file).
    pub fn read_only(mut self) -> BootFile {
        self.writable = false;
        self
    }

    /// The state file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(self.name)
    }

    /// The boot this file keeps state for.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// The state saved during this boot on this node; or why there is none, with a detail for
    /// the log.
    pub fn load<T: DeserializeOwned>(&self) -> Result<T, (Ignored, String)> {
        let path = self.path();
        let bytes = self.read_capped(&path)?;
        let corrupt = |e: serde_json::Error| (Ignored::Corrupt, format!("{}: {e}", path.display()));
        let header: Header = serde_json::from_slice(&bytes).map_err(corrupt)?;
        if header.version != self.version {
            return Err((
                Ignored::Corrupt,
                format!("{}: format version {}", path.display(), header.version),
            ));
        }
        if header.node != self.node {
            return Err((
                Ignored::OtherNode,
                format!("{} was written on node {:?}", path.display(), header.node),
            ));
        }
        if header.boot_id != self.boot_id {
            return Err((
                Ignored::OtherBoot,
                format!(
                    "{} is of boot {}, this is boot {}",
                    path.display(),
                    header.boot_id,
                    self.boot_id
                ),
            ));
        }
        serde_json::from_slice(&bytes).map_err(corrupt)
    }

    fn read_capped(&self, path: &Path) -> Result<Vec<u8>, (Ignored, String)> {
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err((Ignored::Missing, format!("{} does not exist", path.display())));
            }
            Err(e) => return Err((Ignored::Unreadable, format!("{}: {e}", path.display()))),
        };
        let mut bytes = Vec::new();
        if let Err(e) = file.take(self.max_bytes + 1).read_to_end(&mut bytes) {
            return Err((Ignored::Unreadable, format!("{}: {e}", path.display())));
        }
        if bytes.len() as u64 > self.max_bytes {
            return Err((
                Ignored::TooLarge,
                format!("{} is over {} bytes", path.display(), self.max_bytes),
            ));
        }
        Ok(bytes)
    }

    /// Replaces the file with `state` (a struct: its fields sit beside the header's),
    /// atomically, creating the directory if needed. A read-only file writes nothing.
    pub fn save<T: Serialize>(&self, state: &T) -> Result<(), StateError> {
        if !self.writable {
            return Ok(());
        }
        let serde_json::Value::Object(mut fields) = serde_json::to_value(state)? else {
            return Err(StateError::NotAnObject);
        };
        let header = serde_json::to_value(Header {
            version: self.version,
            node: self.node.clone(),
            boot_id: self.boot_id.clone(),
        })?;
        if let serde_json::Value::Object(header) = header {
            fields.extend(header);
        }
        let bytes = serde_json::to_vec(&fields)?;
        self.replace(&bytes)
    }

    fn replace(&self, bytes: &[u8]) -> Result<(), StateError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| StateError::Io { path, source }
        };
        // Created here, not only by the chart's init container: a local run names any path.
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{}-", self.name))
            .tempfile_in(&self.dir)
            .map_err(io(&self.dir))?;
        tmp.write_all(bytes).map_err(io(tmp.path()))?;
        if self.xids_crash_point {
            gpunode_crashpoints::crash_point!("state::xids_before_rename");
        }
        let path = self.path();
        tmp.persist(&path).map_err(|e| StateError::Io {
            path,
            source: e.error,
        })?;
        Ok(())
    }
}
