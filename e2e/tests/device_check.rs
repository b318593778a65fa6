//! `e2e/device/check.sh`, the real-GPU check, run here on the fake NVML (fixture
//! `healthy-8xh100`) and the `nvidia-smi -q -x` written for that fixture
//! (`e2e/fixtures/device/healthy-8xh100-nvidia-smi.xml`): every field agrees, and the script
//! saves both outputs and the table. Changed in the XML (as a real GPU would differ: another
//! product, a power cap), those fields and only those are reported DIFFER, exit status 1.
//!
//! Needs the binaries built (`make test` builds them first): `gpunode-probe` and
//! `libfake_nvml.so`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, process::Command};

use gpunode_e2e::{fixtures::repo_root, probe::built};

/// check.sh with the debug probe on the fake NVML, `xml` as nvidia-smi's output, into `out`.
fn check(xml: &PathBuf, out: &PathBuf) -> (i32, String) {
    let root = repo_root();
    let _ = std::fs::remove_dir_all(out);
    let run = Command::new(root.join("e2e/device/check.sh"))
        .arg(out)
        .env("PROBE", built("gpunode-probe").unwrap())
        .env("COMPARE", env!("CARGO_BIN_EXE_device-compare"))
        .env("NVML_LIB", built("libfake_nvml.so").unwrap())
        .env(
            "FAKE_NVML_FIXTURE",
            root.join("node-probe/fake-nvml/fixtures/healthy-8xh100.json"),
        )
        .env("NVSMI_XML", xml)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    (run.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpunode-device-{name}-{}", std::process::id()))
}

#[test]
fn the_probe_on_the_fake_nvml_agrees_with_its_nvidia_smi_field_by_field() {
    let xml = repo_root().join("e2e/fixtures/device/healthy-8xh100-nvidia-smi.xml");
    let out = scratch("agree");
    let (status, output) = check(&xml, &out);
    assert_eq!(status, 0, "{output}");
    assert!(
        output.contains("211 fields: 211 agree, 0 within tolerance, 0 differ, 0 not compared"),
        "{output}"
    );
    for saved in ["probe.json", "nvidia-smi.xml", "compare.md"] {
        assert!(out.join(saved).exists(), "{saved} not saved in {}", out.display());
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_field_that_differs_is_named_and_fails_the_check() {
    let recorded = repo_root().join("e2e/fixtures/device/healthy-8xh100-nvidia-smi.xml");
    let text = std::fs::read_to_string(&recorded).unwrap();
    // The fourth GPU: another product and a 400 W cap.
    let gpu3 = text.match_indices("<gpu id=").nth(3).map(|(i, _)| i).unwrap();
    let (head, tail) = text.split_at(gpu3);
    let tail = tail
        .replacen("NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL", 1)
        .replacen(
            "<current_power_limit>700.00 W",
            "<current_power_limit>400.00 W",
            1,
        );
    let xml = scratch("differ-input.xml");
    std::fs::write(&xml, format!("{head}{tail}")).unwrap();
    let out = scratch("differ");
    let (status, output) = check(&xml, &out);
    assert_eq!(status, 1, "{output}");
    let differ: Vec<&str> = output.lines().filter(|l| l.contains("DIFFER")).collect();
    assert_eq!(
        differ,
        [
            "| product | 3 | NVIDIA H100 80GB HBM3 | NVIDIA H100 NVL | DIFFER |",
            "| powerLimitWatts | 3 | 700 | 400 | DIFFER |",
        ],
        "{output}"
    );
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_file(&xml);
}
