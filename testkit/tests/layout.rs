//! The README's "Layout" table matches the tree: every path it names exists, every directory
//! of the repository and every crate has a row, and the rows for `operator/src/` and
//! `node-probe/src/` name each of their modules.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// (path, what) of each row of the table under `## Layout`.
fn layout_rows(readme: &str) -> Vec<(String, String)> {
    let section = readme
        .split("\n## Layout\n")
        .nth(1)
        .expect("README has a ## Layout section");
    let section = section.split("\n## ").next().unwrap();
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| {
            let (path, rest) = l.split_once('`').unwrap();
            let what = rest.trim_start_matches(" |").trim_end_matches('|').trim();
            (path.to_string(), what.to_string())
        })
        .collect()
}

fn tracked(root: &Path) -> Vec<String> {
    let out = Command::new("git")
        .arg("ls-files")
        .current_dir(root)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git ls-files: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The modules directly under `src` (files and folders with a `mod.rs` or a sibling file),
/// the crate roots left out.
fn top_modules(src: &Path) -> BTreeSet<String> {
    fs::read_dir(src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let stem = p.file_stem()?.to_string_lossy().into_owned();
            let module = p.is_dir() || p.extension() == Some("rs".as_ref());
            (module && !["lib", "main", "bin"].contains(&stem.as_str())).then_some(stem)
        })
        .collect()
}

#[test]
fn the_readme_layout_names_every_directory_crate_and_module_and_nothing_that_is_not_there() {
    let root = repo_root();
    let rows = layout_rows(&fs::read_to_string(root.join("README.md")).unwrap());
    let paths: BTreeSet<&str> = rows.iter().map(|(p, _)| p.as_str()).collect();
    let mut wrong = Vec::new();
    for p in &paths {
        if !root.join(p).exists() {
            wrong.push(format!("the table names `{p}`, which does not exist"));
        }
    }
    let files = tracked(&root);
    let dirs: BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.split_once('/'))
        .map(|(d, _)| format!("{d}/"))
        .collect();
    let crates = files
        .iter()
        .filter_map(|f| f.strip_suffix("/Cargo.toml"))
        .map(|d| format!("{d}/"));
    // A top-level directory may be described by the rows of what it holds (`charts/gpunode/`).
    for d in dirs {
        if !paths.iter().any(|p| p.starts_with(&d)) && d != ".cargo/" {
            wrong.push(format!("`{d}` has no row"));
        }
    }
    for d in crates {
        if !paths.contains(d.as_str()) {
            wrong.push(format!("the crate `{d}` has no row"));
        }
    }
    for src in ["operator/src/", "node-probe/src/"] {
        let what = rows
            .iter()
            .find(|(p, _)| p == src)
            .map_or("", |(_, w)| w.as_str());
        for m in top_modules(&root.join(src)) {
            if !what.contains(&format!("`{m}`")) {
                wrong.push(format!("the row of `{src}` does not name its module `{m}`"));
            }
        }
    }
    assert!(wrong.is_empty(), "README Layout:\n  {}", wrong.join("\n  "));
}
