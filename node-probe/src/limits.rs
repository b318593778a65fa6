//! Keeps a report within the CRD schema's bounds (string lengths, list sizes), so garbage from
//! a driver or sysfs can never get the whole report rejected by the API server.

use gpunode_crds::report::{
    FieldError, GpuNodeReportStatus, MAX_GPUS, MAX_PODS_PER_GPU, MAX_XIDS_PER_GPU, RdmaDevice,
};

use crate::sysfs::shorten;

fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        *s = shorten(s, max);
    }
}

fn cut_opt(s: &mut Option<String>, max: usize) {
    if let Some(s) = s {
        cut(s, max);
    }
}

/// Caps an error list, replacing the overflow with one entry that says how many were dropped.
fn cap_errors(errors: &mut Vec<FieldError>, max: usize) {
    for e in errors.iter_mut() {
        cut(&mut e.field, 64);
        cut(&mut e.reason, 512);
    }
    if errors.len() > max {
        let dropped = errors.len() - (max - 1);
        errors.truncate(max - 1);
        errors.push(FieldError {
            field: "errors".to_owned(),
            reason: format!("{dropped} more errors not shown"),
        });
    }
}

fn fit_device(d: &mut RdmaDevice) {
    cut(&mut d.device, 64);
    cut_opt(&mut d.netdev, 32);
    cut_opt(&mut d.state, 32);
    cut_opt(&mut d.physical_state, 32);
    d.pfc_pause.truncate(8);
    if let Some(p) = d.pfc_priorities.as_mut() {
        p.retain(|p| *p <= 7);
        p.truncate(8);
    }
    if let Some(p) = d.ecn_priorities.as_mut() {
        p.retain(|p| *p <= 7);
        p.truncate(8);
    }
    cap_errors(&mut d.errors, 32);
}

/// Applies every bound of the GpuNodeReport status schema.
pub fn fit(report: &mut GpuNodeReportStatus) {
    cut_opt(&mut report.probe_version, 64);
    cut_opt(&mut report.boot_id, 64);
    cut_opt(&mut report.driver_version, 64);
    cut_opt(&mut report.cuda_version, 64);
    report.collectors.truncate(8);
    for c in &mut report.collectors {
        cut_opt(&mut c.error, 1024);
    }
    report.gpus.truncate(MAX_GPUS);
    for gpu in &mut report.gpus {
        cut_opt(&mut gpu.uuid, 96);
        cut_opt(&mut gpu.product, 96);
        cut_opt(&mut gpu.pci_bus_id, 32);
        gpu.throttle_reasons.truncate(16);
        if gpu.xids.len() > MAX_XIDS_PER_GPU {
            let excess = gpu.xids.len() - MAX_XIDS_PER_GPU;
            gpu.xids.drain(..excess);
        }
        if gpu.pods.as_ref().is_some_and(|p| p.len() > MAX_PODS_PER_GPU) {
            // A partial list would look complete: say "unknown" instead, so the operator does
            // not evict only some of the GPU's pods.
            gpu.pods = None;
            gpu.errors.push(FieldError {
                field: "pods".into(),
                reason: format!("more than {MAX_PODS_PER_GPU} pods hold this GPU"),
            });
        }
        cap_errors(&mut gpu.errors, 64);
    }
    if let Some(cooling) = report.cooling.as_mut() {
        cooling.sensors.truncate(256);
        for s in &mut cooling.sensors {
            cut(&mut s.chip, 64);
            cut(&mut s.label, 64);
        }
        cooling.fans.truncate(64);
        for f in &mut cooling.fans {
            cut(&mut f.name, 128);
        }
        cap_errors(&mut cooling.errors, 64);
    }
    if let Some(network) = report.network.as_mut() {
        network.rdma_devices.truncate(64);
        network.rdma_devices.iter_mut().for_each(fit_device);
    }
}

#[cfg(test)]
mod tests {
    use gpunode_crds::report::{CoolingStatus, GpuStatus, SensorReading};

    use super::*;

    #[test]
    fn cuts_oversized_strings_and_lists() {
        let mut report = GpuNodeReportStatus {
            driver_version: Some("9".repeat(500)),
            gpus: vec![
                GpuStatus {
                    product: Some("é".repeat(100)),
                    errors: (0..100)
                        .map(|i| FieldError {
                            field: format!("f{i}"),
                            reason: "x".repeat(2000)
                        })
                        .collect(),
                    ..GpuStatus::default()
                };
                70
            ],
            cooling: Some(CoolingStatus {
                sensors: vec![
                    SensorReading {
                        chip: "c".repeat(100),
                        label: "l".into(),
                        celsius: 1.0,
                        crit_celsius: None
                    };
                    300
                ],
                ..CoolingStatus::default()
            }),
            ..GpuNodeReportStatus::default()
        };
        fit(&mut report);
        assert_eq!(report.driver_version.as_deref().map(str::len), Some(64));
        assert_eq!(report.gpus.len(), MAX_GPUS);
        let gpu = &report.gpus[0];
        assert!(
            gpu.product
                .as_deref()
                .is_some_and(|p| p.len() <= 96 && p.chars().all(|c| c == 'é'))
        );
        assert_eq!(gpu.errors.len(), 64);
        assert_eq!(gpu.errors[63].reason, "37 more errors not shown");
        assert!(gpu.errors[0].reason.len() <= 512);
        let cooling = report
            .cooling
            .as_ref()
            .map(|c| (c.sensors.len(), c.sensors[0].chip.len()));
        assert_eq!(cooling, Some((256, 64)));
    }
}
