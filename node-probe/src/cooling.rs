//! The `cooling` collector: hwmon temperatures and fans, and thermal zones, under a configurable
//! sysfs root.
//!
//! A sensor that cannot be read or holds garbage is listed in `cooling.errors` and skipped; only
//! an unreadable class directory fails the collector.

use std::path::{Path, PathBuf};

use gpunode_crds::report::{
    CollectorName, CoolingStatus, FanReading, FieldError, GpuNodeReportStatus, SensorReading,
};

use crate::collect::{CollectError, Collector, Outcome};
use crate::sysfs::{self, SysfsError};

/// Readings outside this range (°C) are sensor faults.
const PLAUSIBLE_CELSIUS: std::ops::RangeInclusive<f64> = -60.0..=250.0;

/// Why the cooling collector failed.
#[derive(Debug, thiserror::Error)]
pub enum CoolingError {
    /// A class directory exists but cannot be listed.
    #[error("cooling: {0}")]
    Sysfs(#[from] SysfsError),
}

impl From<CoolingError> for CollectError {
    fn from(e: CoolingError) -> Self {
        CollectError::new(e)
    }
}

/// The cooling collector.
pub struct CoolingCollector {
    sys_root: PathBuf,
}

impl CoolingCollector {
    /// Reads `<sys_root>/class/hwmon` and `<sys_root>/class/thermal`.
    pub fn new(sys_root: impl Into<PathBuf>) -> Self {
        CoolingCollector {
            sys_root: sys_root.into(),
        }
    }

    /// Reads every sensor and fan.
    pub fn read(&self) -> Result<CoolingStatus, CoolingError> {
        let mut status = CoolingStatus::default();
        for (n, dir) in sysfs::numbered_entries(&self.sys_root.join("class/hwmon"), "hwmon")? {
            read_hwmon(&dir, &format!("hwmon{n}"), &mut status);
        }
        for (n, dir) in sysfs::numbered_entries(&self.sys_root.join("class/thermal"), "thermal_zone")? {
            read_zone(&dir, &format!("thermal_zone{n}"), &mut status);
        }
        Ok(status)
    }
}

impl Collector for CoolingCollector {
    fn name(&self) -> CollectorName {
        CollectorName::Cooling
    }

    fn collect(&self, report: &mut GpuNodeReportStatus) -> Result<Outcome, CollectError> {
        report.cooling = Some(self.read()?);
        Ok(Outcome::default())
    }
}

fn error(status: &mut CoolingStatus, field: String, e: impl std::fmt::Display) {
    status.errors.push(FieldError {
        field,
        reason: e.to_string(),
    });
}

/// Millidegrees in a file → °C, rejecting implausible values.
fn read_millicelsius(path: &Path) -> Result<f64, SysfsError> {
    let milli: i64 = sysfs::read_num(path)?;
    let celsius = milli as f64 / 1000.0;
    if !PLAUSIBLE_CELSIUS.contains(&celsius) {
        return Err(SysfsError::parse(
            path,
            &milli.to_string(),
            "implausible temperature",
        ));
    }
    Ok(celsius)
}

/// Indexes N of files named `<prefix>N<suffix>` in `dir`, sorted.
fn indexed(names: &[String], prefix: &str, suffix: &str) -> Vec<u32> {
    let mut out: Vec<u32> = names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix)?.strip_suffix(suffix)?.parse().ok())
        .collect();
    out.sort_unstable();
    out
}

fn read_hwmon(dir: &Path, id: &str, status: &mut CoolingStatus) {
    let chip = match sysfs::read_text(&dir.join("name")) {
        Ok(name) => name,
        Err(e) => {
            error(status, format!("{id}/name"), &e);
            id.to_owned()
        }
    };
    let names = match sysfs::dir_names(dir) {
        Ok(names) => names,
        Err(e) => return error(status, id.to_owned(), e),
    };
    for n in indexed(&names, "temp", "_input") {
        let label = match sysfs::read_optional(&dir.join(format!("temp{n}_label"))) {
            Ok(Some(label)) => label,
            Ok(None) => format!("temp{n}"),
            Err(e) => {
                error(status, format!("{id}/temp{n}_label"), e);
                format!("temp{n}")
            }
        };
        let celsius = match read_millicelsius(&dir.join(format!("temp{n}_input"))) {
            Ok(c) => c,
            Err(e) => {
                // Named as policies name sensors (`<chip>/<label>`), so a sensor limit whose
                // pattern matches an unreadable sensor makes the node Unknown; the file is in
                // the reason.
                error(
                    status,
                    format!("{chip}/{label}"),
                    format!("{id}/temp{n}_input: {e}"),
                );
                continue;
            }
        };
        let crit_path = dir.join(format!("temp{n}_crit"));
        let crit_celsius = match read_millicelsius(&crit_path) {
            Ok(c) => Some(c),
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                error(status, format!("{id}/temp{n}_crit"), e);
                None
            }
        };
        status.sensors.push(SensorReading {
            chip: chip.clone(),
            label,
            celsius,
            crit_celsius,
        });
    }
    for n in indexed(&names, "fan", "_input") {
        let rpm = match sysfs::read_num::<u32>(&dir.join(format!("fan{n}_input"))) {
            Ok(rpm) => rpm,
            Err(e) => {
                error(status, format!("{id}/fan{n}_input"), e);
                continue;
            }
        };
        let label = sysfs::read_optional(&dir.join(format!("fan{n}_label")))
            .ok()
            .flatten();
        let label = label.unwrap_or_else(|| format!("fan{n}"));
        status.fans.push(FanReading {
            name: format!("{chip}/{label}"),
            rpm,
        });
    }
}

fn read_zone(dir: &Path, id: &str, status: &mut CoolingStatus) {
    let chip = match sysfs::read_text(&dir.join("type")) {
        Ok(kind) => kind,
        Err(e) => {
            error(status, format!("{id}/type"), &e);
            id.to_owned()
        }
    };
    let celsius = match read_millicelsius(&dir.join("temp")) {
        Ok(c) => c,
        // `<type>/<zone>`, as the reading would have been named.
        Err(e) => return error(status, format!("{chip}/{id}"), format!("{id}/temp: {e}")),
    };
    let names = sysfs::dir_names(dir).unwrap_or_default();
    let crit_celsius = indexed(&names, "trip_point_", "_type").into_iter().find_map(|k| {
        let kind = sysfs::read_text(&dir.join(format!("trip_point_{k}_type"))).ok()?;
        (kind == "critical").then(|| read_millicelsius(&dir.join(format!("trip_point_{k}_temp"))).ok())?
    });
    status.sensors.push(SensorReading {
        chip,
        label: id.to_owned(),
        celsius,
        crit_celsius,
    });
}
