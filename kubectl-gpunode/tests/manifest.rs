//! The krew manifest (plugin.yaml) installs this crate's binary at this crate's version.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

#[test]
fn the_krew_manifest_names_this_binary_and_version() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/plugin.yaml")).unwrap();
    let m: Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(m["apiVersion"], "krew.googlecontainertools.github.com/v1alpha2");
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(m["metadata"]["name"], "gpunode", "installs as `kubectl gpunode`");
    let version = format!("v{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(m["spec"]["version"], version.as_str());
    let platforms = m["spec"]["platforms"].as_array().unwrap();
    assert!(!platforms.is_empty());
    for p in platforms {
        assert_eq!(p["bin"], "kubectl-gpunode");
        let uri = p["uri"].as_str().unwrap();
        assert!(uri.contains(&format!("/{version}/")), "{uri}");
        let sha = p["sha256"].as_str().unwrap();
        assert!(
            sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
            "{sha}"
        );
        assert!(p["selector"]["matchLabels"]["os"].is_string());
    }
}
