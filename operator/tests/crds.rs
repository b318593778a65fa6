//! The CRDs committed under charts/gpunode/crds must be exactly what the Rust types generate.

use std::{path::Path, process::Command};

use gpunode_crds::generate;
use gpunode_operator::crdgen::CHART_CRDS_DIR;
use serde::Deserialize;

fn chart_crds_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(CHART_CRDS_DIR)
}

#[test]
fn committed_crds_match_the_types() {
    let dir = chart_crds_dir();
    let generated = generate::crds();
    for (name, crd) in &generated {
        let want = generate::to_yaml(crd).unwrap_or_else(|e| panic!("render {name}: {e}"));
        let path = dir.join(name);
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is stale or missing: the types in crds/ generate something else. Run `make crds` and commit the result.",
            path.display()
        );
    }
    let mut extra: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|f| !generated.iter().any(|(name, _)| name == f))
        .collect();
    extra.sort();
    assert!(
        extra.is_empty(),
        "{} holds files no type generates: {extra:?}",
        dir.display()
    );
}

#[test]
fn crds_subcommand_prints_every_crd() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpunode-operator"))
        .arg("crds")
        .output()
        .unwrap_or_else(|e| panic!("run gpunode-operator crds: {e}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let kinds: Vec<String> = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let v = serde_yaml::Value::deserialize(doc).unwrap_or_else(|e| panic!("not YAML: {e}"));
            assert_eq!(v["kind"].as_str(), Some("CustomResourceDefinition"));
            v["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(kinds, ["GpuNodePolicy", "GpuNodeReport", "GpuResetRequest"]);
}
