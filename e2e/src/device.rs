//! The probe against `nvidia-smi`, field by field: what `e2e/device/check.sh` prints on a
//! machine with a real NVIDIA GPU (the probe's `--once` report beside `nvidia-smi -q -x`), and
//! what its test here compares for the fake NVML and a recorded XML.
//!
//! Values read at different moments (temperatures, power draw, clock-event reasons, the PCIe
//! link an idle GPU trains down) agree within a tolerance; everything else must be equal. A field
//! one side does not report (`N/A`, an older driver, a probe error) is listed, not judged.

use gpunode_crds::report::{GpuNodeReportStatus, GpuStatus};
use roxmltree::{Document, Node};

/// How a field compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Equal.
    Agree,
    /// Not equal, within the tolerance of a value read at another moment (the tolerance).
    Within(String),
    /// Different.
    Differ,
    /// One side does not report it.
    Absent,
}

/// One compared field.
#[derive(Debug, Clone)]
pub struct Row {
    /// The report's field name.
    pub field: &'static str,
    /// The GPU's index in the report; none for node-wide fields.
    pub gpu: Option<u32>,
    /// What the probe reported.
    pub probe: String,
    /// What nvidia-smi reported.
    pub smi: String,
    /// How they compare.
    pub verdict: Verdict,
}

/// Why the outputs could not be compared.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The XML is not well formed.
    #[error("nvidia-smi's XML: {0}")]
    Xml(#[from] roxmltree::Error),
    /// The XML is not `nvidia-smi -q -x` output.
    #[error("nvidia-smi's XML has no nvidia_smi_log root (got {0})")]
    NotNvidiaSmi(String),
}

/// The text of the element at `path` (child names separated by `/`) below `node`, trimmed.
fn text(node: Node<'_, '_>, path: &str) -> Option<String> {
    let mut at = node;
    for name in path.split('/') {
        at = at.children().find(|c| c.has_tag_name(name))?;
    }
    let t = at.text()?.trim();
    (!t.is_empty() && t != "N/A" && !t.starts_with("[N/A")).then(|| t.to_string())
}

/// The leading number of `s` ("38 C", "700.00 W", "16x", "81559 MiB").
fn number(s: &str) -> Option<f64> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(s.len());
    s[..end].parse().ok()
}

fn row(field: &'static str, gpu: Option<u32>, probe: Option<String>, smi: Option<String>) -> Row {
    let verdict = match (&probe, &smi) {
        (Some(p), Some(s)) if p.eq_ignore_ascii_case(s) => Verdict::Agree,
        (Some(_), Some(_)) => Verdict::Differ,
        _ => Verdict::Absent,
    };
    Row {
        field,
        gpu,
        probe: probe.unwrap_or_else(|| "-".into()),
        smi: smi.unwrap_or_else(|| "-".into()),
        verdict,
    }
}

/// A number read at another moment: agrees within `tolerance` (absolute).
fn moving(field: &'static str, gpu: u32, probe: Option<f64>, smi: Option<f64>, tolerance: f64) -> Row {
    let mut r = row(
        field,
        Some(gpu),
        probe.map(|v| v.to_string()),
        smi.map(|v| v.to_string()),
    );
    if let (Some(p), Some(s), Verdict::Differ) = (probe, smi, &r.verdict)
        && (p - s).abs() <= tolerance
    {
        r.verdict = Verdict::Within(format!("±{tolerance}"));
    }
    r
}

/// A number both report the same way: equal once rounded to a whole.
fn whole(field: &'static str, gpu: Option<u32>, probe: Option<f64>, smi: Option<String>) -> Row {
    let smi = smi.as_deref().and_then(number).map(|v| v.round().to_string());
    row(field, gpu, probe.map(|v| v.round().to_string()), smi)
}

/// "Yes"/"No" as nvidia-smi writes a flag.
fn flag(smi: Option<String>) -> Option<String> {
    smi.map(|s| (s.eq_ignore_ascii_case("yes")).to_string())
}

/// Compares the probe's report with `nvidia-smi -q -x` output, GPU by GPU (matched by UUID).
pub fn compare(report: &GpuNodeReportStatus, xml: &str) -> Result<Vec<Row>, DeviceError> {
    // nvidia-smi's XML names its DTD (nvsmi_device_vN.dtd); nothing is loaded from it.
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = Document::parse_with_options(xml, options)?;
    let root = doc.root_element();
    if !root.has_tag_name("nvidia_smi_log") {
        return Err(DeviceError::NotNvidiaSmi(root.tag_name().name().to_string()));
    }
    let mut rows = vec![
        row(
            "driverVersion",
            None,
            report.driver_version.clone(),
            text(root, "driver_version"),
        ),
        row(
            "cudaVersion",
            None,
            report.cuda_version.clone(),
            text(root, "cuda_version"),
        ),
        row(
            "gpuCount",
            None,
            report.gpu_count.map(|c| c.to_string()),
            text(root, "attached_gpus"),
        ),
    ];
    for gpu in root.children().filter(|c| c.has_tag_name("gpu")) {
        let uuid = text(gpu, "uuid");
        match report.gpus.iter().find(|g| g.uuid.is_some() && g.uuid == uuid) {
            Some(g) => rows.extend(gpu_rows(g, gpu)),
            None => rows.push(row("uuid", None, None, uuid)),
        }
    }
    Ok(rows)
}

fn gpu_rows(g: &GpuStatus, x: Node<'_, '_>) -> Vec<Row> {
    let i = Some(g.index);
    let mut rows = vec![
        row("uuid", i, g.uuid.clone(), text(x, "uuid")),
        row("product", i, g.product.clone(), text(x, "product_name")),
        row("pciBusId", i, g.pci_bus_id.clone(), text(x, "pci/pci_bus_id")),
        whole(
            "memoryMiB",
            i,
            g.memory_mib.map(|v| v as f64),
            text(x, "fb_memory_usage/total"),
        ),
        row(
            "eccMode",
            i,
            g.ecc_mode.map(|m| format!("{m:?}")),
            text(x, "ecc_mode/current_ecc"),
        ),
        row(
            "persistenceMode",
            i,
            g.persistence_mode.map(|m| format!("{m:?}")),
            text(x, "persistence_mode"),
        ),
        row(
            "migMode",
            i,
            g.mig_mode.map(|m| format!("{m:?}")),
            text(x, "mig_mode/current_mig"),
        ),
    ];
    rows.extend(thermal_rows(g, x));
    rows.extend(power_rows(g, x));
    rows.extend(pcie_rows(g, x));
    rows.extend(memory_rows(g, x));
    rows.push(fabric_row(g, x));
    rows.push(throttle_row(g, x));
    rows
}

fn thermal_rows(g: &GpuStatus, x: Node<'_, '_>) -> Vec<Row> {
    let t = |path| text(x, path).as_deref().and_then(number);
    vec![
        moving(
            "temperatureCelsius",
            g.index,
            g.temperature_celsius.map(f64::from),
            t("temperature/gpu_temp"),
            5.0,
        ),
        moving(
            "memoryTemperatureCelsius",
            g.index,
            g.memory_temperature_celsius.map(f64::from),
            t("temperature/memory_temp"),
            5.0,
        ),
        whole(
            "slowdownCelsius",
            Some(g.index),
            g.slowdown_celsius.map(f64::from),
            text(x, "temperature/gpu_temp_slow_threshold"),
        ),
        whole(
            "shutdownCelsius",
            Some(g.index),
            g.shutdown_celsius.map(f64::from),
            text(x, "temperature/gpu_temp_max_threshold"),
        ),
    ]
}

fn power_rows(g: &GpuStatus, x: Node<'_, '_>) -> Vec<Row> {
    let w = |path| text(x, path).as_deref().and_then(number);
    let draw = g.power_watts.map(f64::from);
    let tolerance = draw.map_or(25.0, |d| (d * 0.25).max(25.0));
    let i = Some(g.index);
    vec![
        moving(
            "powerWatts",
            g.index,
            draw,
            w("gpu_power_readings/power_draw"),
            tolerance,
        ),
        whole(
            "powerLimitWatts",
            i,
            g.power_limit_watts.map(f64::from),
            text(x, "gpu_power_readings/current_power_limit"),
        ),
        whole(
            "defaultPowerLimitWatts",
            i,
            g.default_power_limit_watts.map(f64::from),
            text(x, "gpu_power_readings/default_power_limit"),
        ),
    ]
}

fn pcie_rows(g: &GpuStatus, x: Node<'_, '_>) -> Vec<Row> {
    let p = g.pcie.as_ref();
    let link = "pci/pci_gpu_link_info";
    let i = Some(g.index);
    let n = |v: Option<u32>| v.map(f64::from);
    vec![
        whole(
            "pcie.maxGeneration",
            i,
            n(p.map(|p| p.max_generation)),
            text(x, &format!("{link}/pcie_gen/max_link_gen")),
        ),
        whole(
            "pcie.maxWidth",
            i,
            n(p.map(|p| p.max_width)),
            text(x, &format!("{link}/link_widths/max_link_width")),
        ),
        // An idle GPU trains its link down to save power: read at another moment, it may differ.
        moving(
            "pcie.currentGeneration",
            g.index,
            n(p.map(|p| p.current_generation)),
            text(x, &format!("{link}/pcie_gen/current_link_gen"))
                .as_deref()
                .and_then(number),
            4.0,
        ),
        whole(
            "pcie.currentWidth",
            i,
            n(p.map(|p| p.current_width)),
            text(x, &format!("{link}/link_widths/current_link_width")),
        ),
        whole(
            "pcie.replayCounter",
            i,
            p.map(|p| p.replay_counter as f64),
            text(x, "pci/replay_counter"),
        ),
    ]
}

fn memory_rows(g: &GpuStatus, x: Node<'_, '_>) -> Vec<Row> {
    let r = g.remapped_rows.as_ref();
    let i = Some(g.index);
    vec![
        whole(
            "ecc.volatileUncorrected",
            i,
            g.ecc.as_ref().map(|e| e.volatile_uncorrected as f64),
            text(x, "ecc_errors/volatile/dram_uncorrectable"),
        ),
        whole(
            "remappedRows.correctable",
            i,
            r.map(|r| r.correctable as f64),
            text(x, "remapped_rows/remapped_row_corr"),
        ),
        whole(
            "remappedRows.uncorrectable",
            i,
            r.map(|r| r.uncorrectable as f64),
            text(x, "remapped_rows/remapped_row_unc"),
        ),
        row(
            "remappedRows.pending",
            i,
            r.map(|r| r.pending.to_string()),
            flag(text(x, "remapped_rows/remapped_row_pending")),
        ),
        row(
            "remappedRows.failure",
            i,
            r.map(|r| r.failure.to_string()),
            flag(text(x, "remapped_rows/remapped_row_failure")),
        ),
    ]
}

/// nvidia-smi writes N/A where NVML answers NotSupported.
fn fabric_row(g: &GpuStatus, x: Node<'_, '_>) -> Row {
    let probe = g.fabric.as_ref().map(|f| f.state.as_str().to_string());
    let smi = x
        .children()
        .find(|c| c.has_tag_name("fabric"))
        .map(|_| text(x, "fabric/state").unwrap_or_else(|| "NotSupported".into()));
    row(
        "fabric.state",
        Some(g.index),
        probe,
        smi.map(|s| s.replace(' ', "")),
    )
}

/// nvidia-smi's clock-event reasons that are Active, named as the report names them.
fn throttle_row(g: &GpuStatus, x: Node<'_, '_>) -> Row {
    let mut probe: Vec<String> = g.throttle_reasons.iter().map(|r| format!("{r:?}")).collect();
    probe.sort();
    let smi = x
        .children()
        .find(|c| c.has_tag_name("clocks_event_reasons"))
        .map(|reasons| {
            let mut active: Vec<String> = reasons
                .children()
                .filter(|c| c.is_element() && c.text().is_some_and(|t| t.trim() == "Active"))
                .filter_map(|c| reason_name(c.tag_name().name()))
                .collect();
            active.sort();
            active.join(",")
        });
    let mut r = row("throttleReasons", Some(g.index), Some(probe.join(",")), smi);
    if r.verdict == Verdict::Differ {
        r.verdict = Verdict::Within("sampled at another moment".into());
    }
    r
}

fn reason_name(tag: &str) -> Option<String> {
    let name = match tag.strip_prefix("clocks_event_reason_")? {
        "gpu_idle" => "GpuIdle",
        "applications_clocks_setting" => "ApplicationsClocksSetting",
        "sw_power_cap" => "SwPowerCap",
        "hw_slowdown" => "HwSlowdown",
        "hw_thermal_slowdown" => "HwThermalSlowdown",
        "hw_power_brake_slowdown" => "HwPowerBrakeSlowdown",
        "sync_boost" => "SyncBoost",
        "sw_thermal_slowdown" => "SwThermalSlowdown",
        "display_clocks_setting" => "DisplayClockSetting",
        _ => return None,
    };
    Some(name.to_string())
}

/// The rows as a Markdown table, and a last line counting each verdict.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from("| field | gpu | probe | nvidia-smi | verdict |\n|---|---:|---|---|---|\n");
    for r in rows {
        let verdict = match &r.verdict {
            Verdict::Agree => "agree".to_string(),
            Verdict::Within(why) => format!("agree within {why}"),
            Verdict::Differ => "DIFFER".to_string(),
            Verdict::Absent => "not compared (one side does not report it)".to_string(),
        };
        let gpu = r.gpu.map(|g| g.to_string()).unwrap_or_default();
        out.push_str(&format!(
            "| {} | {gpu} | {} | {} | {verdict} |\n",
            r.field, r.probe, r.smi
        ));
    }
    let count = |f: fn(&Verdict) -> bool| rows.iter().filter(|r| f(&r.verdict)).count();
    out.push_str(&format!(
        "\n{} fields: {} agree, {} within tolerance, {} differ, {} not compared\n",
        rows.len(),
        count(|v| *v == Verdict::Agree),
        count(|v| matches!(v, Verdict::Within(_))),
        count(|v| *v == Verdict::Differ),
        count(|v| *v == Verdict::Absent),
    ));
    out
}
