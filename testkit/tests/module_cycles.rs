//! No two modules of a crate import each other, directly or around a longer loop: each crate's
//! `src/` is read with `syn` (the parser the Rust ecosystem uses), every path that names a module
//! of the same crate (`use` trees, and the paths of types, expressions and patterns) is an edge
//! from the file that writes it to the module file it names, and `petgraph`'s Tarjan finds every
//! strongly connected set. `mod` declarations are not edges (a parent holds its children); test
//! modules (`#[cfg(test)]`) are left out. Paths inside macro calls are tokens, not paths, and are
//! not seen.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use petgraph::algo::tarjan_scc;
use petgraph::graphmap::DiGraphMap;
use syn::visit::Visit;

/// The library crates whose modules are checked, relative to the repository root.
const CRATES: &[&str] = &[
    "operator/src",
    "node-probe/src",
    "crds/src",
    "checks/src",
    "kubectl-gpunode/src",
    "e2e/src",
    "bench/src",
];

type ModPath = Vec<String>;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every file module under `src` (the crate root, `lib.rs` or a lone `main.rs`, is `[]`; a
/// `main.rs` beside a `lib.rs`, and `src/bin/`, are other crates), by module path.
fn file_modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name() != Some("bin".as_ref()) || dir != src {
                    dirs.push(path);
                }
                continue;
            }
            if path.extension() != Some("rs".as_ref()) {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut segs: ModPath = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            match segs.last().map(String::as_str) {
                // A binary beside a library is another crate; a binary alone is the root.
                Some("main") if segs.len() == 1 && src.join("lib.rs").exists() => continue,
                Some("main") if segs.len() == 1 => segs.clear(),
                Some("lib") if segs.len() == 1 => segs.clear(),
                Some("mod") => {
                    segs.pop();
                }
                _ => {}
            }
            out.insert(segs, path);
        }
    }
    out
}

/// One path a file writes, as segments, with the module it is written in (inline modules
/// included, so `super` resolves from the right place).
struct Written {
    at: ModPath,
    segs: Vec<String>,
}

#[derive(Default)]
struct Collector {
    /// The module the visitor is in: the file's path, then any inline `mod` it entered.
    at: ModPath,
    written: Vec<Written>,
    /// File modules declared under `#[cfg(test)]`.
    test_only: Vec<ModPath>,
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

fn flatten(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push([prefix.clone(), vec![n.ident.to_string()]].concat()),
        syn::UseTree::Rename(r) => out.push([prefix.clone(), vec![r.ident.to_string()]].concat()),
        syn::UseTree::Glob(_) => out.push([prefix.clone(), vec!["*".into()]].concat()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| flatten(t, prefix, out)),
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_cfg_test(&m.attrs) {
            if m.content.is_none() {
                self.test_only
                    .push([self.at.clone(), vec![m.ident.to_string()]].concat());
            }
            return;
        }
        self.at.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.at.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        flatten(&u.tree, &mut Vec::new(), &mut paths);
        for segs in paths {
            self.written.push(Written {
                at: self.at.clone(),
                segs,
            });
        }
    }

    // `pub(super)` and `pub(in crate::x)` say who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segs = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.written.push(Written {
            at: self.at.clone(),
            segs,
        });
        syn::visit::visit_path(self, p);
    }
}

/// The absolute module path a written path starts from, if it names something of this crate.
fn absolute(w: &Written, known: &BTreeSet<ModPath>) -> Option<ModPath> {
    let mut segs = w.segs.iter().map(String::as_str).peekable();
    let base: ModPath = match *segs.peek()? {
        "crate" => {
            segs.next();
            Vec::new()
        }
        "self" => {
            segs.next();
            w.at.clone()
        }
        "super" => {
            let mut base = w.at.clone();
            while segs.next_if_eq(&"super").is_some() {
                base.pop()?;
            }
            base
        }
        // A child module of where it is written (2018 paths are relative to the module).
        first if known.contains(&[w.at.clone(), vec![first.to_string()]].concat()) => w.at.clone(),
        _ => return None,
    };
    Some(base.into_iter().chain(segs.map(str::to_string)).collect())
}

/// The longest known module that `path` starts with.
fn target(path: &[String], files: &BTreeMap<ModPath, PathBuf>) -> Option<ModPath> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| files.contains_key(p))
}

/// `from -> to` edges between file modules, each with one example of a path that makes it.
fn edges(src: &Path) -> (BTreeMap<ModPath, PathBuf>, BTreeMap<(ModPath, ModPath), String>) {
    let files = file_modules(src);
    let mut collected = Vec::new();
    let mut test_only = BTreeSet::new();
    for (module, file) in &files {
        let text = fs::read_to_string(file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut c = Collector {
            at: module.clone(),
            ..Collector::default()
        };
        c.visit_file(&ast);
        test_only.extend(c.test_only);
        collected.push((module.clone(), c.written));
    }
    // Inline modules resolve like files: any prefix of a file module's inner path is known.
    let known: BTreeSet<ModPath> = files.keys().cloned().collect();
    let is_test = |m: &ModPath| test_only.iter().any(|t| m.starts_with(t));
    let mut out = BTreeMap::new();
    for (from, written) in collected {
        if is_test(&from) {
            continue;
        }
        for w in written {
            let Some(to) = absolute(&w, &known).and_then(|p| target(&p, &files)) else {
                continue;
            };
            if to != from && !is_test(&to) {
                out.entry((from.clone(), to)).or_insert_with(|| w.segs.join("::"));
            }
        }
    }
    (files, out)
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

#[test]
fn no_module_imports_a_module_that_imports_it_back() {
    let root = repo_root();
    let mut cycles = Vec::new();
    for krate in CRATES {
        let (files, edges) = edges(&root.join(krate));
        let mut graph = DiGraphMap::<usize, ()>::new();
        let index: Vec<&ModPath> = files.keys().collect();
        let at = |m: &ModPath| index.iter().position(|k| *k == m).unwrap();
        for (from, to) in edges.keys() {
            graph.add_edge(at(from), at(to), ());
        }
        let sccs: Vec<Vec<usize>> = tarjan_scc(&graph).into_iter().filter(|s| s.len() > 1).collect();
        println!(
            "{krate}: {} modules, {} import edges, {} cycles",
            files.len(),
            edges.len(),
            sccs.len()
        );
        for scc in sccs {
            let members: BTreeSet<&ModPath> = scc.iter().map(|&i| index[i]).collect();
            let mut lines = vec![format!("{krate}: these modules import each other:")];
            for ((from, to), example) in &edges {
                if members.contains(from) && members.contains(to) {
                    lines.push(format!("  {} -> {}   (writes `{example}`)", name(from), name(to)));
                }
            }
            cycles.push(lines.join("\n"));
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles between modules:\n{}",
        cycles.join("\n")
    );
}

/// The check finds a cycle when there is one: two modules of a scratch crate that use each other.
#[test]
fn two_modules_that_use_each_other_are_a_cycle() {
    let dir = std::env::temp_dir().join(format!("gpunode-cycles-{}", std::process::id()));
    fs::create_dir_all(dir.join("a")).unwrap();
    fs::write(dir.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    fs::write(
        dir.join("a/mod.rs"),
        "pub mod inner;\npub fn f() { crate::b::g() }\n",
    )
    .unwrap();
    fs::write(dir.join("a/inner.rs"), "use super::f;\n").unwrap();
    fs::write(
        dir.join("b.rs"),
        "pub fn g() {}\npub struct S(super::a::inner::T);\n",
    )
    .unwrap();
    let (_, edges) = edges(&dir);
    fs::remove_dir_all(&dir).unwrap();
    let got: Vec<String> = edges
        .keys()
        .map(|(f, t)| format!("{} -> {}", name(f), name(t)))
        .collect();
    assert_eq!(got, ["a -> b", "a::inner -> a", "b -> a::inner"]);
}
