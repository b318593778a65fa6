//! The API server's audit log, the reliability suite's record of who wrote what.
//!
//! The API server rotates its log (`--audit-log-maxsize`): the active file is renamed to
//! `audit-<time>.log` and a new `audit.log` begins. [`AuditLog`] reads every file of the log, the
//! active one and each rotated one, and remembers how far it read each by inode, so a renamed file
//! is continued where it was left, a new one is read from its start, and nothing is read twice.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read, Seek, SeekFrom},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use crate::Error;

/// One line of the audit log (Metadata level).
#[derive(Debug, Clone)]
pub struct AuditEvent {
    /// create, update, patch, delete, list ...
    pub verb: String,
    /// The user's name.
    pub user: String,
    /// Resource, e.g. `pods`.
    pub resource: String,
    /// Subresource, e.g. `eviction`, `status`.
    pub subresource: String,
    /// Namespace of the object.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// The pod a bound ServiceAccount token names (empty for other users).
    pub pod: String,
    /// A dry run (`dryRun=All`): admission ran, nothing was stored.
    pub dry_run: bool,
    /// HTTP status of the response.
    pub code: u16,
    /// When the API server received the request.
    pub at: jiff::Timestamp,
}

impl AuditEvent {
    /// One JSON line; `None` for anything else (a torn or foreign line).
    pub fn parse(line: &str) -> Option<AuditEvent> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let s = |p: &str| {
            v.pointer(p)
                .and_then(|x| x.as_str())
                .unwrap_or_default()
                .to_string()
        };
        Some(AuditEvent {
            verb: s("/verb"),
            user: s("/user/username"),
            resource: s("/objectRef/resource"),
            subresource: s("/objectRef/subresource"),
            namespace: s("/objectRef/namespace"),
            name: s("/objectRef/name"),
            pod: s("/user/extra/authentication.kubernetes.io~1pod-name/0"),
            dry_run: s("/requestURI").contains("dryRun=All"),
            code: v
                .pointer("/responseStatus/code")
                .and_then(|c| c.as_u64())
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
            at: s("/requestReceivedTimestamp").parse().ok()?,
        })
    }

    /// A request that changes state.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// Answered with 2xx.
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// A write that was stored: answered 2xx and not a dry run.
    pub fn committed(&self) -> bool {
        self.is_write() && self.succeeded() && !self.dry_run
    }

    /// An eviction request for a pod of `namespace`, whatever it was answered.
    pub fn is_eviction_in(&self, namespace: &str) -> bool {
        self.resource == "pods"
            && self.subresource == "eviction"
            && self.verb == "create"
            && self.namespace == namespace
    }
}

#[derive(Debug, Default)]
struct Progress {
    /// Bytes consumed per file, by inode (a rotated file keeps its inode).
    offsets: BTreeMap<u64, u64>,
    events: Vec<AuditEvent>,
}

/// Every event of an audit log and its rotated files, read incrementally.
#[derive(Debug, Clone)]
pub struct AuditLog {
    active: PathBuf,
    progress: Arc<Mutex<Progress>>,
}

impl AuditLog {
    /// The log whose active file is `active` (e.g. `logs/audit.log`); rotated files are the
    /// `<stem>-*<ext>` beside it.
    pub fn new(active: PathBuf) -> AuditLog {
        AuditLog {
            active,
            progress: Arc::default(),
        }
    }

    /// The files of the log: rotated ones (oldest first, their names sort by time) and the active.
    fn files(&self) -> Result<Vec<PathBuf>, Error> {
        let dir = self.active.parent().unwrap_or(Path::new("."));
        let stem = self
            .active
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ext = self
            .active
            .extension()
            .map(|s| format!(".{}", s.to_string_lossy()))
            .unwrap_or_default();
        let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::Unexpected(format!("{}: {e}", dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with(&format!("{stem}-")) && n.ends_with(&ext)
                })
            })
            .collect();
        rotated.sort();
        rotated.push(self.active.clone());
        Ok(rotated)
    }

    /// Every event so far, in the order the files hold them (torn and foreign lines skipped).
    pub fn events(&self) -> Result<Vec<AuditEvent>, Error> {
        let mut progress = self
            .progress
            .lock()
            .map_err(|_| Error::Unexpected("audit reader poisoned".into()))?;
        let mut seen = BTreeSet::new();
        for path in self.files()? {
            // A file rotated away between listing and opening is read under its new name on the
            // next call; the active one may not exist before the first request.
            let Ok(mut file) = std::fs::File::open(&path) else {
                continue;
            };
            let meta = file
                .metadata()
                .map_err(|e| Error::Unexpected(format!("{}: {e}", path.display())))?;
            if !seen.insert(meta.ino()) {
                continue;
            }
            let offset = progress.offsets.get(&meta.ino()).copied().unwrap_or(0);
            if meta.len() <= offset {
                continue;
            }
            file.seek(SeekFrom::Start(offset))
                .map_err(|e| Error::Unexpected(format!("{}: {e}", path.display())))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)
                .map_err(|e| Error::Unexpected(format!("{}: {e}", path.display())))?;
            // Only whole lines: the API server may be writing the last one.
            let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else {
                continue;
            };
            let text = String::from_utf8_lossy(&bytes[..=end]);
            progress.events.extend(text.lines().filter_map(AuditEvent::parse));
            progress
                .offsets
                .insert(meta.ino(), offset + u64::try_from(end + 1).unwrap_or(0));
        }
        Ok(progress.events.clone())
    }
}

/// Successful evictions per pod of `namespace`.
pub fn evictions(events: &[AuditEvent], namespace: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.is_eviction_in(namespace) && e.succeeded())
    {
        *out.entry(e.name.clone()).or_insert(0) += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(name: &str, code: u16) -> String {
        serde_json::json!({
            "verb": "create", "user": {"username": "op"},
            "objectRef": {"resource": "pods", "subresource": "eviction", "namespace": "ns", "name": name},
            "responseStatus": {"code": code},
            "requestReceivedTimestamp": "2026-12-01T12:00:00.000000Z",
        })
        .to_string()
            + "\n"
    }

    fn names(log: &AuditLog) -> Vec<String> {
        log.events()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.name)
            .collect()
    }

    #[test]
    fn a_bound_token_names_its_pod_and_a_dry_run_is_not_committed() {
        let line = serde_json::json!({
            "verb": "create", "requestURI": "/apis/batch/v1/namespaces/j/jobs?dryRun=All",
            "user": {"username": "system:serviceaccount:ns:op",
                     "extra": {"authentication.kubernetes.io/pod-name": ["op-0"]}},
            "objectRef": {"resource": "jobs", "namespace": "j", "name": "v"},
            "responseStatus": {"code": 201},
            "requestReceivedTimestamp": "2026-12-01T12:00:00.000000Z",
        })
        .to_string();
        let dry = AuditEvent::parse(&line);
        assert_eq!(dry.as_ref().map(|e| e.pod.as_str()), Some("op-0"));
        assert_eq!(
            dry.as_ref().map(|e| (e.dry_run, e.committed())),
            Some((true, false))
        );
        let real = AuditEvent::parse(&line.replace("?dryRun=All", ""));
        assert_eq!(real.map(|e| (e.dry_run, e.committed())), Some((false, true)));
        let refused = AuditEvent::parse(&line.replace("?dryRun=All", "").replace("201", "403"));
        assert_eq!(refused.map(|e| e.committed()), Some(false));
    }

    #[test]
    fn rotation_loses_and_repeats_nothing() {
        let dir = std::env::temp_dir().join(format!("gpunode-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let active = dir.join("audit.log");
        let log = AuditLog::new(active.clone());
        let append = |p: &Path, s: &str| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap();
            f.write_all(s.as_bytes()).unwrap();
        };
        append(&active, &line("a", 201));
        // A torn last line is left for the next read.
        append(&active, &line("b", 201)[..20]);
        assert_eq!(names(&log), ["a"]);
        append(&active, &line("b", 201)[20..]);
        // Rotation: the active file is renamed with more lines in it, and a new one starts.
        append(&active, &line("c", 500));
        std::fs::rename(&active, dir.join("audit-2026-12-01T12-00-00.000.log")).unwrap_or_default();
        append(&active, &line("d", 201));
        assert_eq!(names(&log), ["a", "b", "c", "d"]);
        assert_eq!(names(&log), ["a", "b", "c", "d"], "a second read repeats nothing");
        let evs = log.events().unwrap_or_default();
        assert_eq!(evictions(&evs, "ns").len(), 3, "c was answered 500");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
