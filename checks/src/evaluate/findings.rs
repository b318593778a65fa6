//! What the section checks (gpu, cooling, network) share: the [`Context`] they read (the fresh
//! report, the time) and the [`Findings`] they write, and how a missing field's reason is found.
//! It knows no check of its own.

use gpunode_crds::report::{CollectorErrorKind, CollectorName, FieldError, GpuNodeReportStatus, GpuStatus};
use jiff::Timestamp;

use crate::verdict::{Drift, Unknown, Verdict};

/// What every section check reads: the fresh report and the time.
pub(crate) struct Context<'a> {
    pub(crate) status: &'a GpuNodeReportStatus,
    pub(crate) now: Timestamp,
}

impl Context<'_> {
    /// Why the collector failed, when it did.
    pub(crate) fn collector_failure(&self, name: CollectorName) -> Option<String> {
        self.status
            .collectors
            .iter()
            .find(|c| c.name == name && !c.ok)
            .map(|c| {
                let how = match c.error_kind {
                    Some(CollectorErrorKind::Hung) => "hung",
                    Some(CollectorErrorKind::Failed) | None => "failed",
                };
                match c.error.as_deref() {
                    Some(e) if !e.trim().is_empty() => format!("{} collector {how}: {e}", collector(name)),
                    _ => format!("{} collector {how}", collector(name)),
                }
            })
    }

    /// Whether the collector hung (a driver call that did not return in time).
    pub(crate) fn collector_hung(&self, name: CollectorName) -> bool {
        self.status
            .collectors
            .iter()
            .any(|c| c.name == name && !c.ok && c.error_kind == Some(CollectorErrorKind::Hung))
    }

    /// Runs `body` on every GPU when any of the per-GPU `checks` is asked for. GPUs the report
    /// does not list (none at all, or fewer than `gpuCount`) make those checks Unknown.
    pub(crate) fn for_each_gpu(
        &self,
        checks: &[&str],
        findings: &mut Findings,
        mut body: impl FnMut(&GpuStatus, &mut Findings),
    ) {
        if checks.is_empty() {
            return;
        }
        let listed = self.status.gpus.len();
        let missing = match self.status.gpu_count {
            None if listed == 0 => Some("no GPUs reported".to_string()),
            Some(n) if usize::try_from(n).is_ok_and(|n| n > listed) => {
                Some(format!("report lists {listed} of the {n} GPUs NVML sees"))
            }
            _ => None,
        };
        if let Some(reason) = missing {
            for check in checks {
                findings.unknown(check, None, reason.clone());
            }
        }
        for gpu in &self.status.gpus {
            body(gpu, findings);
        }
    }
}

fn collector(name: CollectorName) -> &'static str {
    match name {
        CollectorName::Nvml => "nvml",
        CollectorName::Cooling => "cooling",
        CollectorName::Network => "network",
        CollectorName::PodResources => "podResources",
    }
}

/// Drifts and unknowns as the section checks find them; [`Verdict::new`] sorts them.
#[derive(Default)]
pub(crate) struct Findings {
    drifts: Vec<Drift>,
    unknowns: Vec<Unknown>,
}

impl Findings {
    /// The verdict these findings make.
    pub(crate) fn verdict(self) -> Verdict {
        Verdict::new(self.drifts, self.unknowns)
    }

    pub(crate) fn drift(
        &mut self,
        class: gpunode_crds::DriftClass,
        check: &str,
        gpu: Option<u32>,
        device: Option<&str>,
        expected: String,
        actual: String,
    ) {
        self.drifts.push(Drift {
            class,
            check: check.to_string(),
            expected,
            actual,
            gpu,
            device: device.map(str::to_string),
        });
    }

    pub(crate) fn unknown(&mut self, check: &str, gpu: Option<u32>, reason: String) {
        self.unknowns.push(Unknown {
            check: check.to_string(),
            reason,
            gpu,
        });
    }

    /// Every check Unknown for one reason (a failed collector, a missing section).
    pub(crate) fn all_unknown(&mut self, checks: &[&str], reason: &str) {
        for check in checks {
            self.unknown(check, None, reason.to_string());
        }
    }
}

/// Error fields that make a whole GPU or RDMA port unknown: the probe lists a GPU whose NVML
/// handle it could not get with a `device` error, and a device whose ports it could not list
/// with a `ports` error.
const WHOLE_ENTRY_FIELDS: [&str; 2] = ["device", "ports"];

/// Why `field` is missing: the reason of the first error that names it (or one of its
/// sub-fields, `pcie.currentWidth` for `pcie`, or the whole GPU or port), else "not reported".
pub(crate) fn missing_reason(errors: &[FieldError], field: &str) -> String {
    field_error(errors, field).map_or_else(|| "not reported".to_string(), |e| e.reason.clone())
}

/// The error that names `field`, one of its sub-fields, or the whole GPU or port, if any.
pub(crate) fn field_error<'a>(errors: &'a [FieldError], field: &str) -> Option<&'a FieldError> {
    errors.iter().find(|e| names_field(&e.field, field)).or_else(|| {
        errors
            .iter()
            .find(|e| WHOLE_ENTRY_FIELDS.contains(&e.field.as_str()))
    })
}

fn names_field(error_field: &str, field: &str) -> bool {
    error_field == field
        || error_field
            .strip_prefix(field)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// `[a, b, c]`.
pub(crate) fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(field: &str, reason: &str) -> FieldError {
        FieldError {
            field: field.to_string(),
            reason: reason.to_string(),
        }
    }

    #[test]
    fn missing_reason_uses_the_error_naming_the_field_or_a_sub_field() {
        let errors = [
            err("remappedRows", "NVML: NotSupported"),
            err("pcie.currentWidth", "NVML: Unknown"),
        ];
        assert_eq!(missing_reason(&errors, "remappedRows"), "NVML: NotSupported");
        assert_eq!(missing_reason(&errors, "pcie"), "NVML: Unknown");
        assert_eq!(missing_reason(&errors, "pci"), "not reported");
        assert_eq!(missing_reason(&errors, "ecc"), "not reported");
    }

    #[test]
    fn an_error_on_the_whole_gpu_or_port_explains_every_missing_field() {
        let errors = [err("device", "NVML: GpuIsLost"), err("ecc", "NVML: NotSupported")];
        assert_eq!(missing_reason(&errors, "ecc"), "NVML: NotSupported");
        assert_eq!(missing_reason(&errors, "temperatureCelsius"), "NVML: GpuIsLost");
        assert_eq!(missing_reason(&[err("ports", "EACCES")], "mtu"), "EACCES");
    }

    #[test]
    fn lists_print_in_brackets() {
        assert_eq!(list([3u8, 4]), "[3, 4]");
        assert_eq!(list(Vec::<u8>::new()), "[]");
    }
}
