//! `spec.maintenance`: when gpunode may start a disruptive action (a NoSchedule or NoExecute
//! taint, a cordon, a drain, a GPU quarantine, a repair step), and which drift classes are
//! urgent enough to act at once regardless.
//!
//! Field docs are the text `kubectl explain gpunodepolicy.spec.maintenance...` prints.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::types::DriftClass;

/// A time of day, `HH:MM` on a 24-hour clock.
pub const TIME_OF_DAY_RE: &str = "^([01][0-9]|2[0-3]):[0-5][0-9]$";

/// When disruptive actions may start.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenancePolicy {
    /// The windows in which gpunode may start disruptive actions (NoSchedule and NoExecute
    /// taints, cordons, drains, GPU quarantines, repair steps). Outside every window such an
    /// action waits, and the node's condition says when the next window opens. Labels, the
    /// condition and undoing what gpunode did never wait. A disruptive action that started
    /// within a window is not undone when the window closes.
    #[schemars(length(min = 1, max = 16))]
    pub windows: Vec<MaintenanceWindow>,

    /// Drift classes that act at once, inside a window or not (for example Xid: a GPU that fell
    /// off the bus is lost capacity already). A node drifting in one of them takes its
    /// disruptive actions at once, for all its classes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 13))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub urgent_classes: Vec<DriftClass>,
}

/// One weekly window.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// The days of the week on which the window opens, in its time zone.
    #[schemars(length(min = 1, max = 7))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub days: Vec<Weekday>,

    /// When it opens, HH:MM (24-hour clock) in `timeZone`. A time a daylight-saving change
    /// skips is read as the same time after the change (02:30 on a spring-forward night is
    /// 03:30); a time it repeats, as its first occurrence.
    #[schemars(length(min = 5, max = 5), regex(pattern = TIME_OF_DAY_RE))]
    pub start: String,

    /// When it closes, HH:MM (24-hour clock) in `timeZone`. At or before `start`, the window
    /// closes on the next day (22:00 to 06:00 is a night; 00:00 to 00:00 a whole day).
    #[schemars(length(min = 5, max = 5), regex(pattern = TIME_OF_DAY_RE))]
    pub end: String,

    /// An IANA time zone (for example Europe/Berlin or America/Los_Angeles). Defaults to UTC. A
    /// zone the operator does not know keeps every window of the policy closed (fail closed)
    /// and says so in the policy's status.
    #[serde(default = "default_time_zone")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,
}

fn default_time_zone() -> String {
    "UTC".to_string()
}

/// A day of the week.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, schemars::JsonSchema,
)]
#[schemars(transform = crate::types::without_description)]
pub enum Weekday {
    /// Monday.
    Mon,
    /// Tuesday.
    Tue,
    /// Wednesday.
    Wed,
    /// Thursday.
    Thu,
    /// Friday.
    Fri,
    /// Saturday.
    Sat,
    /// Sunday.
    Sun,
}

impl MaintenanceWindow {
    /// `start` and `end` as (hour, minute); `None` for a value the schema would refuse.
    pub fn times(&self) -> Option<((i8, i8), (i8, i8))> {
        Some((hh_mm(&self.start)?, hh_mm(&self.end)?))
    }
}

fn hh_mm(s: &str) -> Option<(i8, i8)> {
    let (h, m) = s.split_once(':')?;
    let (h, m) = (h.parse::<i8>().ok()?, m.parse::<i8>().ok()?);
    ((0..24).contains(&h) && (0..60).contains(&m)).then_some((h, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_of_day_parse_as_the_schema_allows() {
        let w = |start: &str, end: &str| MaintenanceWindow {
            days: vec![Weekday::Sat],
            start: start.to_string(),
            end: end.to_string(),
            time_zone: default_time_zone(),
        };
        assert_eq!(w("22:00", "06:30").times(), Some(((22, 0), (6, 30))));
        assert_eq!(w("24:00", "06:30").times(), None);
        assert_eq!(w("22:60", "06:30").times(), None);
        assert_eq!(w("22", "06:30").times(), None);
    }
}
