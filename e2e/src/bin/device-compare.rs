//! `device-compare PROBE_JSON NVIDIA_SMI_XML`: the probe's `--once -o json` report beside
//! `nvidia-smi -q -x`, field by field, as a Markdown table (e2e/device/check.sh runs it on a
//! machine with a real NVIDIA GPU). Exit status 0 when nothing differs, 1 when a field differs,
//! 2 when the inputs cannot be read.

use std::process::ExitCode;

use gpunode_crds::GpuNodeReport;
use gpunode_e2e::device::{Verdict, compare, table};

fn run(probe: &str, xml: &str) -> Result<bool, String> {
    let report = std::fs::read_to_string(probe).map_err(|e| format!("{probe}: {e}"))?;
    let report: GpuNodeReport = serde_json::from_str(&report).map_err(|e| format!("{probe}: {e}"))?;
    let xml_text = std::fs::read_to_string(xml).map_err(|e| format!("{xml}: {e}"))?;
    let rows = compare(&report.status.unwrap_or_default(), &xml_text).map_err(|e| format!("{xml}: {e}"))?;
    print!("{}", table(&rows));
    Ok(!rows.iter().any(|r| r.verdict == Verdict::Differ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [probe, xml] = args.as_slice() else {
        eprintln!("usage: device-compare PROBE_JSON NVIDIA_SMI_XML");
        return ExitCode::from(2);
    };
    match run(probe, xml) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("device-compare: {e}");
            ExitCode::from(2)
        }
    }
}
