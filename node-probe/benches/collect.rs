//! One full collection of a node with 8 GPUs (fake NVML, real nvml-wrapper path) and 8 RDMA
//! ports (fixture tree), repeated: prints the median and spread of the collection time and the
//! process's peak RSS (VmHWM).
//!
//! `cargo bench -p gpunode-probe --bench collect` (BENCH_RUNS=n to change the run count).

// clippy.toml allows unwrap and expect in #[test] fns only; this bench shares the tests' helpers
// (tests/common), which fail the same way (a panic naming what broke), so the allow covers it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpunode_probe::collect::{Collector, Probe};
use gpunode_probe::cooling::CoolingCollector;
use gpunode_probe::network::NetworkCollector;
use gpunode_probe::nvml::{NvmlCollector, NvmlConfig};

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
        .max(1);
    let fake = common::FakeNvml::new("healthy-8xh100");
    let tree = common::sysfs_tree("lossless-8port");
    let nvml = Arc::new(NvmlCollector::new(NvmlConfig {
        lib_path: fake.lib.clone().into(),
        watch_xids: true,
        ..NvmlConfig::default()
    }));
    let collectors: Vec<Arc<dyn Collector>> = vec![
        nvml.clone(),
        Arc::new(CoolingCollector::new(tree.join("sys"))),
        Arc::new(NetworkCollector::with_fixtures(tree.join("sys"), &tree)),
    ];
    let probe = Probe::new(collectors, "/proc".into());

    let started = Instant::now();
    let first = probe.observe();
    let first_time = started.elapsed();
    assert_eq!(
        first.gpus.len(),
        8,
        "fake NVML not loaded: {:?}",
        first.collectors
    );
    assert_eq!(first.network.as_ref().map(|n| n.rdma_devices.len()), Some(8));

    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let report = probe.observe();
        times.push(t.elapsed());
        std::hint::black_box(report);
    }
    times.sort();
    let per_collector = first
        .collectors
        .iter()
        .map(|c| format!("{:?} {} ms", c.name, c.duration_ms));
    println!("collect: 8 GPUs (fake NVML) + 8 RDMA ports + cooling, {runs} runs");
    println!(
        "  first (loads NVML):  {first_time:?} [{}]",
        per_collector.collect::<Vec<_>>().join(", ")
    );
    println!("  median:              {:?}", percentile(&times, 0.5));
    println!("  p90:                 {:?}", percentile(&times, 0.9));
    println!(
        "  min / max:           {:?} / {:?}",
        times[0],
        times[times.len() - 1]
    );
    match vm_hwm_kib() {
        Some(kib) => println!("  peak RSS (VmHWM):    {:.1} MiB", kib as f64 / 1024.0),
        None => println!("  peak RSS (VmHWM):    unavailable"),
    }
    nvml.shutdown();
}
