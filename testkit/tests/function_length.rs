//! Functions short enough to read at once: none in `operator/src` or `node-probe/src` is longer
//! than 80 lines, from `fn` to its closing brace (doc comments and attributes not counted).
//! Read with `syn`, lines from its spans; test modules (`#[cfg(test)]`, and
//! `tests.rs` files) are left out. Run with
//! `--nocapture` to see the five longest.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

const CRATES: &[&str] = &["operator/src", "node-probe/src"];
const MAX_LINES: usize = 80;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension() == Some("rs".as_ref()) && path.file_stem() != Some("tests".as_ref()) {
            out.push(path);
        }
    }
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// (lines, name) of every function of a file, nested ones included.
#[derive(Default)]
struct Lengths {
    found: Vec<(usize, String)>,
}

impl Lengths {
    fn add(&mut self, sig: &syn::Signature, block: &syn::Block) {
        let start = sig.fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        self.found.push((end + 1 - start, sig.ident.to_string()));
    }
}

impl<'ast> Visit<'ast> for Lengths {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_cfg_test(&f.attrs) {
            self.add(&f.sig, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            self.add(&f.sig, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.add(&f.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// (lines, `file: name`) of every function under `src`, longest first.
fn lengths(root: &Path, src: &str) -> Vec<(usize, String)> {
    let mut files = Vec::new();
    rust_files(&root.join(src), &mut files);
    let mut all = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut l = Lengths::default();
        l.visit_file(&ast);
        let rel = file.strip_prefix(root).unwrap().display().to_string();
        all.extend(l.found.into_iter().map(|(n, f)| (n, format!("{rel}: {f}"))));
    }
    all.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    all
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let root = repo_root();
    let mut long = Vec::new();
    for src in CRATES {
        let all = lengths(&root, src);
        println!("{src}: {} functions; the five longest:", all.len());
        for (n, f) in all.iter().take(5) {
            println!("  {n:>3}  {f}");
        }
        long.extend(all.into_iter().filter(|(n, _)| *n > MAX_LINES));
    }
    let listed: Vec<String> = long.iter().map(|(n, f)| format!("  {n:>3}  {f}")).collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_LINES} lines:\n{}",
        listed.join("\n")
    );
}

/// The count is from `fn` to the closing brace: a 3-line function with a doc line is 3.
#[test]
fn a_function_is_counted_from_fn_to_its_closing_brace() {
    let ast = syn::parse_file("/// doc\n#[inline]\nfn f() {\n    g();\n}\nmod m { fn h() {} }\n").unwrap();
    let mut l = Lengths::default();
    l.visit_file(&ast);
    assert_eq!(l.found, [(3, "f".to_string()), (1, "h".to_string())]);
}
