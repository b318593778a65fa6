//! Example policies (`examples/`) and invalid-policy fixtures (`e2e/fixtures/invalid-policies/`).
//!
//! An invalid-policy fixture is a manifest whose first comment lines say what it breaks:
//! ```yaml
//! # rule: an unknown drift class
//! # field: spec.remediation[0].classes[0]
//! # expect: Unsupported value: "Overheat"
//! ```
//! `field` is the path the API server names and `expect` part of its message.

use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// Why fixtures could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// A file or directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// What was read.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A fixture lacks one of its header lines.
    #[error("{path}: missing the `# {key}:` header line")]
    MissingHeader {
        /// The fixture.
        path: PathBuf,
        /// The missing key.
        key: &'static str,
    },
    /// A manifest is not YAML.
    #[error("{path}: not YAML: {source}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_yaml::Error,
    },
}

/// A manifest file: its path, raw text, and its content as JSON.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// Where it lives.
    pub path: PathBuf,
    /// File name without extension.
    pub name: String,
    /// The raw YAML.
    pub yaml: String,
    /// The parsed document.
    pub value: serde_json::Value,
}

/// An invalid policy and what the API server must say about it.
#[derive(Debug, Clone)]
pub struct InvalidPolicy {
    /// The manifest.
    pub manifest: Manifest,
    /// The rule it breaks, in words.
    pub rule: String,
    /// The field path the rejection names, e.g. `spec.network.trust`.
    pub field: String,
    /// Part of the rejection message.
    pub expect: String,
}

fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, FixtureError> {
    let read = |source| FixtureError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = std::fs::read_dir(dir)
        .map_err(read)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    Ok(files)
}

fn load_manifest(path: PathBuf) -> Result<Manifest, FixtureError> {
    let yaml = std::fs::read_to_string(&path).map_err(|source| FixtureError::Read {
        path: path.clone(),
        source,
    })?;
    let value = serde_yaml::from_str(&yaml).map_err(|source| FixtureError::Yaml {
        path: path.clone(),
        source,
    })?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Manifest {
        path,
        name,
        yaml,
        value,
    })
}

/// Every policy in `examples/`.
pub fn examples() -> Result<Vec<Manifest>, FixtureError> {
    yaml_files(&repo_root().join("examples"))?
        .into_iter()
        .map(load_manifest)
        .collect()
}

/// Every fixture in `e2e/fixtures/valid-policies/`: the valid twins of invalid fixtures.
pub fn valid_policies() -> Result<Vec<Manifest>, FixtureError> {
    yaml_files(&repo_root().join("e2e/fixtures/valid-policies"))?
        .into_iter()
        .map(load_manifest)
        .collect()
}

/// Every fixture in `e2e/fixtures/invalid-policies/`.
pub fn invalid_policies() -> Result<Vec<InvalidPolicy>, FixtureError> {
    yaml_files(&repo_root().join("e2e/fixtures/invalid-policies"))?
        .into_iter()
        .map(|path| {
            let manifest = load_manifest(path)?;
            let header = |key: &'static str| {
                let prefix = format!("# {key}:");
                manifest
                    .yaml
                    .lines()
                    .find_map(|l| l.strip_prefix(&prefix).map(|v| v.trim().to_string()))
                    .ok_or_else(|| FixtureError::MissingHeader {
                        path: manifest.path.clone(),
                        key,
                    })
            };
            Ok(InvalidPolicy {
                rule: header("rule")?,
                field: header("field")?,
                expect: header("expect")?,
                manifest: manifest.clone(),
            })
        })
        .collect()
}
