//! Every module of every crate opens with a `//!` doc that says what it holds, and nothing in
//! the repository points at a design document that is not in it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn tracked(root: &Path) -> Vec<String> {
    let out = Command::new("git")
        .arg("ls-files")
        .current_dir(root)
        .output()
        .expect("git ls-files runs");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// The module doc at the top of a file: its leading `//!` lines, joined.
fn module_doc(text: &str) -> String {
    text.lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn every_module_of_every_crate_opens_with_a_doc_of_what_it_holds() {
    let root = repo_root();
    let sources: Vec<String> = tracked(&root)
        .into_iter()
        .filter(|p| p.ends_with(".rs") && p.contains("/src/"))
        .collect();
    assert!(sources.len() > 100, "found only {} sources", sources.len());
    let undocumented: Vec<&String> = sources
        .iter()
        .filter(|p| {
            let text = fs::read_to_string(root.join(p)).unwrap();
            // One sentence at least: a lone title says nothing of what the module holds.
            module_doc(&text).split_whitespace().count() < 6
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "modules without a `//!` doc of what they hold: {undocumented:?}"
    );
}

#[test]
fn nothing_refers_to_a_design_document_outside_the_repository() {
    let root = repo_root();
    // Spelled in pieces so that this file does not name them itself.
    let needles = [["DESIGN", ".md"].concat(), ["../", "shared/"].concat()];
    let mut found = Vec::new();
    for path in tracked(&root) {
        let Ok(text) = fs::read_to_string(root.join(&path)) else {
            continue; // binary fixtures
        };
        for (n, line) in text.lines().enumerate() {
            if needles.iter().any(|n| line.contains(n.as_str())) {
                found.push(format!("{path}:{}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "references to documents outside the repository: {found:?}"
    );
}

#[test]
fn module_doc_reads_only_the_leading_doc_lines() {
    let text = "//! Holds the things.\n//! More of them.\nuse x;\n//! not this\n";
    assert_eq!(module_doc(text), "Holds the things. More of them.");
    assert_eq!(module_doc("use x;\n//! late\n"), "");
}
