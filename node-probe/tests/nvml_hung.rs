//! A hung NVML (a driver call that never returns), through the real nvml-wrapper calls against
//! the fake library: the collection reports the nvml collector as hung within its deadline,
//! later ones say so at once without piling up threads, and it recovers when the call returns.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{FakeNvml, wait_until};
use gpunode_crds::report::{CollectorErrorKind, CollectorName, GpuNodeReportStatus};
use gpunode_probe::collect::{Collector, Probe};
use gpunode_probe::nvml::{NvmlCollector, NvmlConfig};

const TIMEOUT: Duration = Duration::from_millis(300);

fn collector(fake: &FakeNvml) -> NvmlCollector {
    NvmlCollector::new(NvmlConfig {
        lib_path: fake.lib.clone().into(),
        watch_xids: false,
        timeout: TIMEOUT,
        ..NvmlConfig::default()
    })
}

#[test]
fn a_call_that_does_not_return_is_reported_as_hung_and_recovers() {
    let fake = FakeNvml::new("healthy-8xh100");
    let c = collector(&fake);
    let mut report = GpuNodeReportStatus::default();
    c.collect(&mut report).expect("healthy first");

    fake.edit(|f| f["hang"] = serde_json::json!(["nvmlDeviceGetTemperature"]));
    let started = Instant::now();
    let mut report = GpuNodeReportStatus::default();
    let err = c.collect(&mut report).expect_err("hung");
    assert!(started.elapsed() < TIMEOUT * 10, "the deadline holds");
    assert_eq!(err.kind(), CollectorErrorKind::Hung);
    assert!(err.to_string().contains("has not returned"), "{err}");
    assert!(report.gpus.is_empty(), "nothing half-read is published");

    // While the call hangs, the next collection says so at once.
    let again = Instant::now();
    let err = c
        .collect(&mut GpuNodeReportStatus::default())
        .expect_err("still hung");
    assert_eq!(err.kind(), CollectorErrorKind::Hung);
    assert!(again.elapsed() < TIMEOUT, "no new wait on the hung driver");

    // The driver answers again: so does the collector.
    fake.edit(|f| f["hang"] = serde_json::json!([]));
    assert!(wait_until(Duration::from_secs(20), || {
        let mut report = GpuNodeReportStatus::default();
        c.collect(&mut report).is_ok() && report.gpus.len() == 8
    }));
}

#[test]
fn the_probe_reports_the_nvml_collector_hung_not_failed() {
    let fake = FakeNvml::new("healthy-8xh100");
    fake.edit(|f| f["hang"] = serde_json::json!(["nvmlDeviceGetPowerUsage"]));
    let probe = Probe::new(
        vec![std::sync::Arc::new(collector(&fake))],
        std::path::PathBuf::from("/nonexistent"),
    );
    let report = probe.observe();
    let nvml = report
        .collectors
        .iter()
        .find(|c| c.name == CollectorName::Nvml)
        .expect("nvml collector status");
    assert!(!nvml.ok);
    assert_eq!(nvml.error_kind, Some(CollectorErrorKind::Hung));
    fake.edit(|f| f["hang"] = serde_json::json!([]));
}
