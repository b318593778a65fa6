//! `gpunode-operator check`: exit codes and output for each outcome, from files.

use std::process::{Command, Output};

const NOW: &str = "2026-11-29T12:00:30Z";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/evaluate");
const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
const INVALID: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../e2e/fixtures/invalid-policies");

fn check(policy: &str, report: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpunode-operator"))
        .args(["check", "--policy", policy, "--report", report])
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("run gpunode-operator check: {e}"))
}

/// The healthy H100 report with its GPUs as H200s (141 GB), written to a temporary file.
fn h200_report() -> String {
    let path = format!("{FIXTURES}/healthy-h100-report.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let h200 = text
        .replace("NVIDIA H100 80GB HBM3", "NVIDIA H200")
        .replace("memoryMiB: 81559", "memoryMiB: 143771");
    assert_ne!(h200, text, "the fixture's product or memory moved");
    let file = std::env::temp_dir().join(format!("gpunode-check-h200-{}.yaml", std::process::id()));
    std::fs::write(&file, h200).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    file.to_string_lossy().into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_healthy_node_is_compliant_with_exit_0() {
    let o = check(
        &format!("{EXAMPLES}/h100-training.yaml"),
        &format!("{FIXTURES}/healthy-h100-report.yaml"),
        &["--now", NOW],
    );
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout(&o).contains("under policy h100-training: compliant"));
}

#[test]
fn a_broken_node_is_drifted_with_exit_1_and_one_line_per_drift() {
    let o = check(
        &format!("{EXAMPLES}/h100-training.yaml"),
        &format!("{FIXTURES}/broken-h100-report.yaml"),
        &["--now", NOW],
    );
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(out.contains("drift    Xid"), "{out}");
    assert!(
        out.contains("gpu.driverVersion: expected >=550.54.15, <560, got 535.183.01"),
        "{out}"
    );
    assert!(out.contains("now: Cordon, Drain"), "{out}");
    // What is done now is not repeated under what happens later.
    let later = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("if it lasts:"))
        .unwrap_or_else(|| panic!("no 'if it lasts' line in {out}"));
    assert!(
        !later.contains("Cordon") && !later.contains("Drain"),
        "repeated: {later}"
    );
}

#[test]
fn a_stale_report_is_unknown_with_exit_2() {
    let o = check(
        &format!("{EXAMPLES}/h100-training.yaml"),
        &format!("{FIXTURES}/healthy-h100-report.yaml"),
        &["--now", "2026-11-29T13:00:00Z", "-o", "json"],
    );
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("json: {e}"));
    assert_eq!(v["verdict"]["state"], "unknown");
    assert_eq!(v["labels"]["gpunode.dev/state"], "unknown");
}

#[test]
fn every_invalid_policy_is_bad_input_naming_the_field() {
    let dir = std::fs::read_dir(INVALID).unwrap_or_else(|e| panic!("{INVALID}: {e}"));
    let mut n = 0;
    for entry in dir.flatten() {
        let path = entry.path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let field = text
            .lines()
            .find_map(|l| l.strip_prefix("# field: "))
            .unwrap_or_else(|| panic!("{}: no field header", path.display()));
        let o = check(
            &path.to_string_lossy(),
            &format!("{FIXTURES}/healthy-h100-report.yaml"),
            &[],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{}: {err}", path.display());
        // The field, or its parent for errors found while parsing a list element.
        let parent = field.rsplit_once(['.', '[']).map_or(field, |(p, _)| p);
        assert!(
            err.contains(field) || err.contains(parent),
            "{}: {err}",
            path.display()
        );
        n += 1;
    }
    assert!(n >= 10);
}

#[test]
fn a_missing_file_is_bad_input() {
    let o = check(
        "/nonexistent/policy.yaml",
        &format!("{FIXTURES}/healthy-h100-report.yaml"),
        &[],
    );
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/policy.yaml"));
}

#[test]
fn the_per_gpu_plan_names_the_pods_a_quarantine_evicts_on_a_device_plugin_node() {
    // The healthy H100 report, with XID 79 on GPU 5 and the pods the kubelet says hold each GPU.
    let text = std::fs::read_to_string(format!("{FIXTURES}/healthy-h100-report.yaml")).unwrap();
    let mut report: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let gpus = report["status"]["gpus"].as_sequence_mut().unwrap();
    for (i, gpu) in gpus.iter_mut().enumerate() {
        let pods: serde_yaml::Value = if i == 5 {
            serde_yaml::from_str("[{namespace: ml, name: trainer-0}]").unwrap()
        } else {
            serde_yaml::from_str("[]").unwrap()
        };
        gpu["pods"] = pods;
    }
    gpus[5]["xids"] = serde_yaml::from_str("[{xid: 79, at: '2026-11-29T12:00:05Z'}]").unwrap();
    let file = std::env::temp_dir().join(format!("gpunode-check-pods-{}.yaml", std::process::id()));
    std::fs::write(&file, serde_yaml::to_string(&report).unwrap()).unwrap();
    let o = check(
        &format!("{EXAMPLES}/h100-nvl-per-gpu.yaml"),
        file.to_str().unwrap(),
        &["--now", NOW],
    );
    let _ = std::fs::remove_file(&file);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    let gpu_line = out
        .lines()
        .find(|l| l.starts_with("gpus:"))
        .unwrap_or_else(|| panic!("no gpus line in {out}"));
    assert!(
        gpu_line.contains("gpu 5 (GPU-") && gpu_line.contains("quarantined NoExecute, evicting ml/trainer-0"),
        "{out}"
    );
    assert!(!out.contains("escalated"), "{out}");
}

#[test]
fn the_validation_gate_is_listed_and_a_template_the_operator_cannot_read_is_bad_input() {
    // The healthy H100 node's report, as an H200 node's (the example selects H200 nodes).
    let h200 = h200_report();
    let o = check(&format!("{EXAMPLES}/h200-training.yaml"), &h200, &["--now", NOW]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout(&o).contains(
            "validation: before gpunode undoes its cordon and taints, a Job in namespace gpu-validation must pass (timeout 20m)"
        ),
        "{}",
        stdout(&o)
    );

    // The API server keeps the template as written past its basics; check reads it as the
    // operator does, and names the field it cannot read.
    let text = std::fs::read_to_string(format!("{EXAMPLES}/h200-training.yaml")).unwrap();
    let bad = text.replace("command: [dcgmi, diag, -r, \"2\"]", "command: dcgmi diag -r 2");
    assert_ne!(bad, text, "the example's command line moved");
    let file = std::env::temp_dir().join(format!("gpunode-check-validation-{}.yaml", std::process::id()));
    std::fs::write(&file, bad).unwrap();
    let o = check(file.to_str().unwrap(), &h200, &["--now", NOW]);
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(&h200);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("spec.validation.template.spec.containers[0].command"),
        "{err}"
    );
    assert!(err.contains("invalid type"), "{err}");
}

#[test]
fn run_refuses_a_zero_write_concurrency_naming_the_flag() {
    // Refused while parsing, before any Kubernetes configuration is looked for.
    let out = Command::new(env!("CARGO_BIN_EXE_gpunode-operator"))
        .args(["run", "--apply-concurrency", "0"])
        .env_remove("GPUNODE_APPLY_CONCURRENCY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--apply-concurrency"), "{err}");
}
