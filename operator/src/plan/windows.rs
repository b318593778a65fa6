//! Maintenance windows (`spec.maintenance`): whether a disruptive action may start now, and if
//! not, when the next window opens. Pure: time zones come from jiff's copy of the IANA time
//! zone database (bundled into the binary, so a container without /usr/share/zoneinfo knows
//! them too), and `now` is passed in.

use gpunode_crds::{
    DriftClass,
    maintenance::{MaintenancePolicy, MaintenanceWindow, Weekday},
};
use jiff::{
    Timestamp, ToSpan,
    civil::{self, Date},
    tz::TimeZone,
};

/// How many days ahead a window's opening is looked for: a weekly window opens within 7 days,
/// and one that opened yesterday may still be open (it ends the next day).
const DAYS_AROUND: i32 = 8;

/// Whether disruptive actions may start now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum WindowState {
    /// Inside a window (or no windows configured).
    #[default]
    Open,
    /// Outside every window: the next one opens then.
    Closed {
        /// When the next window opens.
        opens: Timestamp,
    },
    /// A window cannot be read (a time zone the operator does not know): every window stays
    /// closed. The message names the field.
    Invalid(String),
}

/// Where the policy's windows stand at `now`.
pub fn state(policy: Option<&MaintenancePolicy>, now: Timestamp) -> WindowState {
    let Some(policy) = policy else {
        return WindowState::Open;
    };
    let mut opens: Option<Timestamp> = None;
    for (i, w) in policy.windows.iter().enumerate() {
        match window(w, now) {
            Ok(Next::Open) => return WindowState::Open,
            Ok(Next::Opens(at)) => opens = Some(opens.map_or(at, |o| o.min(at))),
            Err(why) => return WindowState::Invalid(format!("spec.maintenance.windows[{i}]: {why}")),
        }
    }
    match opens {
        Some(opens) => WindowState::Closed { opens },
        None => WindowState::Invalid("spec.maintenance.windows: no window opens within a week".to_string()),
    }
}

/// Whether any of `classes` is urgent under the policy (acts at once, outside the windows).
pub fn urgent<'a>(
    policy: Option<&MaintenancePolicy>,
    mut classes: impl Iterator<Item = &'a DriftClass>,
) -> bool {
    policy.is_some_and(|p| classes.any(|c| p.urgent_classes.contains(c)))
}

enum Next {
    Open,
    Opens(Timestamp),
}

fn weekday(d: Weekday) -> civil::Weekday {
    match d {
        Weekday::Mon => civil::Weekday::Monday,
        Weekday::Tue => civil::Weekday::Tuesday,
        Weekday::Wed => civil::Weekday::Wednesday,
        Weekday::Thu => civil::Weekday::Thursday,
        Weekday::Fri => civil::Weekday::Friday,
        Weekday::Sat => civil::Weekday::Saturday,
        Weekday::Sun => civil::Weekday::Sunday,
    }
}

/// Where one window stands at `now`: open, or when it next opens.
fn window(w: &MaintenanceWindow, now: Timestamp) -> Result<Next, String> {
    let tz = TimeZone::get(&w.time_zone).map_err(|e| format!("timeZone {:?}: {e}", w.time_zone))?;
    let ((sh, sm), (eh, em)) = w
        .times()
        .ok_or_else(|| format!("start {:?} or end {:?} is not HH:MM", w.start, w.end))?;
    let today = now.to_zoned(tz.clone()).date();
    let days: Vec<civil::Weekday> = w.days.iter().copied().map(weekday).collect();
    let mut next: Option<Timestamp> = None;
    for offset in -1..DAYS_AROUND {
        let Ok(day) = today.checked_add(offset.days()) else {
            continue;
        };
        if !days.contains(&day.weekday()) {
            continue;
        }
        let overnight = (eh, em) <= (sh, sm);
        let end_day = if overnight {
            match day.checked_add(1.day()) {
                Ok(d) => d,
                Err(_) => continue,
            }
        } else {
            day
        };
        let (Some(start), Some(end)) = (instant(day, sh, sm, &tz), instant(end_day, eh, em, &tz)) else {
            continue;
        };
        if start <= now && now < end {
            return Ok(Next::Open);
        }
        if start > now {
            next = Some(next.map_or(start, |n| n.min(start)));
        }
    }
    next.map(Next::Opens)
        .ok_or_else(|| "no opening within a week".to_string())
}

/// `hh:mm` on `day` in `tz`: a time a daylight-saving change skips is read as the same time
/// after the change; a repeated one, as its first occurrence (jiff's "compatible" rule, the one
/// RFC 5545 and Temporal use).
fn instant(day: Date, h: i8, m: i8, tz: &TimeZone) -> Option<Timestamp> {
    let dt = day.at(h, m, 0, 0);
    tz.to_ambiguous_zoned(dt).compatible().ok().map(|z| z.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(days: &[Weekday], start: &str, end: &str, tz: &str) -> MaintenancePolicy {
        MaintenancePolicy {
            windows: vec![MaintenanceWindow {
                days: days.to_vec(),
                start: start.to_string(),
                end: end.to_string(),
                time_zone: tz.to_string(),
            }],
            urgent_classes: vec![DriftClass::Xid],
        }
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn a_weekend_night_window_is_open_on_saturday_night_and_closed_on_a_weekday() {
        // 2026-12-05 is a Saturday. 22:00–06:00 Europe/Berlin (CET, UTC+1).
        let p = policy(&[Weekday::Sat, Weekday::Sun], "22:00", "06:00", "Europe/Berlin");
        assert_eq!(state(Some(&p), ts("2026-12-05T21:30:00Z")), WindowState::Open);
        assert_eq!(
            state(Some(&p), ts("2026-12-06T04:59:59Z")),
            WindowState::Open,
            "Sunday 05:59 in Berlin: Saturday's night still runs"
        );
        assert_eq!(
            state(Some(&p), ts("2026-12-07T05:00:00Z")),
            WindowState::Closed {
                opens: ts("2026-12-12T21:00:00Z")
            },
            "Monday 06:00: Sunday's night just closed; next Saturday 22:00"
        );
        assert_eq!(
            state(Some(&p), ts("2026-12-02T12:00:00Z")),
            WindowState::Closed {
                opens: ts("2026-12-05T21:00:00Z")
            }
        );
        assert_eq!(state(None, ts("2026-12-02T12:00:00Z")), WindowState::Open);
    }

    #[test]
    fn the_next_of_several_windows_opens_first() {
        let mut p = policy(&[Weekday::Sat], "02:00", "04:00", "UTC");
        p.windows.push(MaintenanceWindow {
            days: vec![Weekday::Thu],
            start: "13:00".to_string(),
            end: "13:30".to_string(),
            time_zone: "America/New_York".to_string(),
        });
        // Wednesday 2026-12-02 12:00 UTC: Thursday 13:00 in New York (EST, UTC-5) is 18:00 UTC.
        assert_eq!(
            state(Some(&p), ts("2026-12-02T12:00:00Z")),
            WindowState::Closed {
                opens: ts("2026-12-03T18:00:00Z")
            }
        );
        assert_eq!(state(Some(&p), ts("2026-12-03T18:29:59Z")), WindowState::Open);
    }

    #[test]
    fn a_window_over_a_spring_forward_night_is_an_hour_shorter_and_one_over_a_fall_back_night_longer() {
        // Europe/Berlin: 2027-03-28 02:00 CET jumps to 03:00 CEST; 2027-10-31 03:00 CEST goes
        // back to 02:00 CET. Both are Sundays.
        let p = policy(&[Weekday::Sun], "01:00", "03:00", "Europe/Berlin");
        // Spring: 01:00 CET = 00:00 UTC to 03:00 CEST = 01:00 UTC, one hour.
        assert_eq!(
            state(Some(&p), ts("2027-03-27T23:59:59Z")),
            WindowState::Closed {
                opens: ts("2027-03-28T00:00:00Z")
            }
        );
        assert_eq!(state(Some(&p), ts("2027-03-28T00:59:59Z")), WindowState::Open);
        assert!(matches!(
            state(Some(&p), ts("2027-03-28T01:00:00Z")),
            WindowState::Closed { .. }
        ));
        // Autumn: 01:00 CEST = 23:00 UTC (Saturday) to 03:00 CET = 02:00 UTC, three hours.
        assert_eq!(state(Some(&p), ts("2027-10-30T23:00:00Z")), WindowState::Open);
        assert_eq!(state(Some(&p), ts("2027-10-31T01:59:59Z")), WindowState::Open);
        assert!(matches!(
            state(Some(&p), ts("2027-10-31T02:00:00Z")),
            WindowState::Closed { .. }
        ));
    }

    #[test]
    fn a_start_time_the_clock_skips_opens_after_the_change() {
        // 02:30 does not exist in Berlin on 2027-03-28: read as 03:30 CEST (01:30 UTC).
        let p = policy(&[Weekday::Sun], "02:30", "05:00", "Europe/Berlin");
        assert_eq!(
            state(Some(&p), ts("2027-03-28T00:00:00Z")),
            WindowState::Closed {
                opens: ts("2027-03-28T01:30:00Z")
            }
        );
    }

    #[test]
    fn an_unknown_time_zone_keeps_every_window_closed_and_names_the_field() {
        let p = policy(&[Weekday::Sat], "22:00", "06:00", "Mars/Olympus_Mons");
        let WindowState::Invalid(why) = state(Some(&p), ts("2026-12-05T22:30:00Z")) else {
            panic!("an unknown zone must not open the window");
        };
        assert!(
            why.starts_with("spec.maintenance.windows[0]: timeZone \"Mars/Olympus_Mons\""),
            "{why}"
        );
    }

    #[test]
    fn a_whole_day_window_runs_from_midnight_to_midnight() {
        let p = policy(&[Weekday::Sat], "00:00", "00:00", "UTC");
        assert_eq!(state(Some(&p), ts("2026-12-05T00:00:00Z")), WindowState::Open);
        assert_eq!(state(Some(&p), ts("2026-12-05T23:59:59Z")), WindowState::Open);
        assert_eq!(
            state(Some(&p), ts("2026-12-06T00:00:00Z")),
            WindowState::Closed {
                opens: ts("2026-12-12T00:00:00Z")
            }
        );
    }

    #[test]
    fn urgent_classes_are_named_by_the_policy() {
        let p = policy(&[Weekday::Sat], "22:00", "06:00", "UTC");
        assert!(urgent(Some(&p), [DriftClass::Driver, DriftClass::Xid].iter()));
        assert!(!urgent(Some(&p), [DriftClass::Driver].iter()));
        assert!(!urgent(None, [DriftClass::Xid].iter()));
    }
}
