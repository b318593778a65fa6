//! `gpu.fatalXids` and `gpu.xidResolution`: the XIDs a GPU reported within the window, by number
//! and by the resolution NVIDIA's catalogue gives them. Each drift names the resolution of the
//! XIDs it lists, so that a person reading a condition knows what NVIDIA says to do.

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{DriftClass, XidResolution, policy::GpuRequirements, report::GpuStatus, xid_catalog};
use jiff::Timestamp;

use super::{
    check,
    findings::{Findings, field_error, list},
};

/// Which check, if any, an XID makes drift: by number first (an XID in both lists is reported
/// once, by `gpu.fatalXids`), then by the catalogue's resolution.
pub(crate) fn drifting_check(req: &GpuRequirements, xid: u32) -> Option<&'static str> {
    if req.fatal_xids.contains(&xid) {
        return Some(check::GPU_FATAL_XIDS);
    }
    let wanted = req.xid_resolution.as_ref()?;
    xid_catalog::resolution(xid)
        // IGNORE never drifts by resolution (the API refuses it in driftOn anyway).
        .filter(|r| *r != XidResolution::Ignore && wanted.drift_on.contains(r))
        .map(|_| check::GPU_XID_RESOLUTION)
}

/// The XID checks of one GPU.
pub(super) fn check(req: &GpuRequirements, now: Timestamp, gpu: &GpuStatus, f: &mut Findings) {
    let seen = within_window(req, now, gpu);
    let since = req
        .xid_window
        .map_or_else(|| "since boot".to_string(), |w| format!("within {w}"));
    let asked = [
        (!req.fatal_xids.is_empty(), check::GPU_FATAL_XIDS),
        (req.xid_resolution.is_some(), check::GPU_XID_RESOLUTION),
    ];
    for (_, name) in asked.into_iter().filter(|(asked, _)| *asked) {
        let mine: BTreeMap<u32, Timestamp> = seen
            .iter()
            .filter(|(_, (c, _))| *c == name)
            .map(|(xid, (_, at))| (*xid, *at))
            .collect();
        if !mine.is_empty() {
            f.drift(
                DriftClass::Xid,
                name,
                Some(gpu.index),
                None,
                format!("{} {since}", expected(req, name)),
                described(&mine),
            );
        } else if let Some(err) = field_error(&gpu.errors, "xids") {
            // No such XID seen, but the probe could not listen for them.
            f.unknown(name, Some(gpu.index), err.reason.clone());
        }
    }
}

/// The latest time each drifting XID was seen within the window, with the check it drifts.
/// A GPU keeps at most 32 XIDs: a scan is cheaper than building sets per GPU.
fn within_window(
    req: &GpuRequirements,
    now: Timestamp,
    gpu: &GpuStatus,
) -> BTreeMap<u32, (&'static str, Timestamp)> {
    let window = req.xid_window.map(|w| w.get());
    let mut seen = BTreeMap::new();
    for event in &gpu.xids {
        let Some(name) = drifting_check(req, event.xid) else {
            continue;
        };
        let age = now.duration_since(event.at.0);
        // An XID stamped in the future (clock skew) is recent.
        if window.is_none_or(|w| age.is_negative() || age.unsigned_abs() <= w) {
            let latest = seen.entry(event.xid).or_insert((name, event.at.0));
            latest.1 = latest.1.max(event.at.0);
        }
    }
    seen
}

/// What the check expects: none of the listed XIDs, or none resolved by the listed resolutions.
fn expected(req: &GpuRequirements, name: &str) -> String {
    if name == check::GPU_FATAL_XIDS {
        let fatal: BTreeSet<u32> = req.fatal_xids.iter().copied().collect();
        return format!("none of {}", list(&fatal));
    }
    let drift_on = req
        .xid_resolution
        .as_ref()
        .map(|r| r.drift_on.as_slice())
        .unwrap_or_default();
    format!("no XID resolved by {}", list(drift_on))
}

/// `XID 79 (RESTART_BM) at 2026-11-29T11:58:00Z, XID 140 (RESET_GPU) at ...`; an XID the
/// catalogue does not list is named without a resolution.
fn described(seen: &BTreeMap<u32, Timestamp>) -> String {
    seen.iter()
        .map(|(xid, at)| match xid_catalog::resolution(*xid) {
            Some(r) => format!("XID {xid} ({r}) at {at}"),
            None => format!("XID {xid} at {at}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
