//! The shipped examples coexist: applied together (as `make demo` and the README's Helm install
//! do), no node that one of them is written for is selected by another. Two policies selecting a
//! node make both report a Conflict and act on it not at all: the demo once stopped showing
//! anything disruptive because two examples selected the same 20 nodes.

use std::collections::BTreeMap;

use gpunode_crds::{GpuNodePolicy, selector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::SelectorExt;

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");

fn examples() -> Vec<(String, GpuNodePolicy)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(EXAMPLES).unwrap_or_else(|e| panic!("{EXAMPLES}: {e}")) {
        let path = entry.unwrap_or_else(|e| panic!("{EXAMPLES}: {e}")).path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let policy: GpuNodePolicy =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        out.push((path.display().to_string(), policy));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The labels of a node the selector was written for: each `matchLabels` pair, the first value
/// of each `In`, a value for each `Exists` (`NotIn` and `DoesNotExist` need no label).
fn node_for(s: &LabelSelector) -> BTreeMap<String, String> {
    let mut labels = s.match_labels.clone().unwrap_or_default();
    for r in s.match_expressions.iter().flatten() {
        let first = r.values.iter().flatten().next().cloned();
        match (r.operator.as_str(), first) {
            ("In", Some(v)) => {
                labels.insert(r.key.clone(), v);
            }
            ("Exists", _) => {
                labels.insert(r.key.clone(), "true".into());
            }
            _ => {}
        }
    }
    labels
}

#[test]
fn no_example_selects_the_nodes_another_example_is_written_for() {
    let examples = examples();
    assert!(examples.len() >= 4, "examples/ holds {}", examples.len());
    for (file, policy) in &examples {
        let own = selector::parse_nodes("spec.nodeSelector", &policy.spec.node_selector)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let node = node_for(&policy.spec.node_selector);
        assert!(
            own.matches(&node),
            "{file}: its own node {node:?} is not selected"
        );
        for (other_file, other) in examples.iter().filter(|(f, _)| f != file) {
            let theirs = selector::parse_nodes("spec.nodeSelector", &other.spec.node_selector)
                .unwrap_or_else(|e| panic!("{other_file}: {e}"));
            assert!(
                !theirs.matches(&node),
                "{other_file} also selects the nodes {file} is written for ({node:?}): applied together, \
                 both would report a Conflict on them and act on none"
            );
        }
    }
}
