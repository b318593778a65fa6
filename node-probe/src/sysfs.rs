//! Reading one-value sysfs files defensively: bounded reads, trimmed text, parse errors that name
//! the file and the value.
//!
//! It only reads; it never writes to sysfs.

use std::fmt::Display;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Longest sysfs file we read; real attributes are one short line, anything longer is garbage.
const MAX_ATTR_BYTES: u64 = 4096;

/// Why a sysfs attribute could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("{path}: empty")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The content did not parse.
    #[error("{path}: cannot parse {value:?}: {why}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The trimmed content (shortened).
        value: String,
        /// The parser's complaint.
        why: String,
    },
}

impl SysfsError {
    /// Whether the file simply does not exist (an optional attribute).
    pub fn is_not_found(&self) -> bool {
        matches!(self, SysfsError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// A parse error for `path`.
    pub fn parse(path: &Path, value: &str, why: impl Display) -> Self {
        SysfsError::Parse {
            path: path.to_owned(),
            value: shorten(value, 64),
            why: why.to_string(),
        }
    }
}

/// Reads a sysfs attribute: at most 4 KiB, lossy UTF-8, surrounding whitespace removed.
pub fn read_text(path: &Path) -> Result<String, SysfsError> {
    let io = |source| SysfsError::Io {
        path: path.to_owned(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_ATTR_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    let text = String::from_utf8_lossy(&bytes).trim().to_owned();
    if text.is_empty() {
        return Err(SysfsError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(text)
}

/// Reads an optional attribute: `Ok(None)` when the file does not exist.
pub fn read_optional(path: &Path) -> Result<Option<String>, SysfsError> {
    match read_text(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads and parses a numeric attribute.
pub fn read_num<T>(path: &Path) -> Result<T, SysfsError>
where
    T: FromStr,
    T::Err: Display,
{
    let text = read_text(path)?;
    text.parse().map_err(|e| SysfsError::parse(path, &text, e))
}

/// Entries of a directory whose name starts with `prefix` followed by a number, sorted by that
/// number (`hwmon2` before `hwmon10`). A missing directory has no entries.
pub fn numbered_entries(dir: &Path, prefix: &str) -> Result<Vec<(u32, PathBuf)>, SysfsError> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(SysfsError::Io {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut out = Vec::new();
    for entry in read.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.parse::<u32>().ok())
        {
            out.push((n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Names in a directory, sorted; a missing directory has none.
pub fn dir_names(dir: &Path) -> Result<Vec<String>, SysfsError> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(SysfsError::Io {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut names: Vec<String> = read
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect();
    names.sort();
    Ok(names)
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}
