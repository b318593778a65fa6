//! The `crds` subcommand: print the CRDs, or write them where the chart keeps them.
//!
//! It writes only to stdout or the chart's crds folder, never to a cluster.

use std::path::{Path, PathBuf};

use gpunode_crds::generate;

/// Where the chart keeps the generated CRDs, relative to the repository root.
pub const CHART_CRDS_DIR: &str = "charts/gpunode/crds";

/// Why the CRDs could not be produced or written.
#[derive(Debug, thiserror::Error)]
pub enum CrdGenError {
    /// Serialization failed (a bug in the types).
    #[error("rendering the CRDs as YAML: {0}")]
    Render(#[from] serde_yaml::Error),
    /// The target directory could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Every CRD as one YAML stream.
pub fn render_all() -> Result<String, CrdGenError> {
    Ok(generate::all_yaml()?)
}

/// Writes one file per CRD into `dir` and returns their paths.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>, CrdGenError> {
    std::fs::create_dir_all(dir).map_err(|source| CrdGenError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    generate::crds()
        .iter()
        .map(|(name, crd)| {
            let path = dir.join(name);
            let yaml = generate::to_yaml(crd)?;
            std::fs::write(&path, yaml).map_err(|source| CrdGenError::Write {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        })
        .collect()
}
