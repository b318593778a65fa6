//! A maintenance window for the tests that watch one open: it opens at the next whole minute
//! (UTC) at least `lead` away and lasts ten minutes, in the policy's `maintenance.windows` form.

use jiff::{RoundMode, Timestamp, TimestampRound, ToSpan, Unit, tz::TimeZone};

use crate::Error;

/// The window (`days`, `start`, `end`, `timeZone`) and when it opens.
pub fn next_minute(lead: std::time::Duration) -> Result<(serde_json::Value, Timestamp), Error> {
    let bad = |e: jiff::Error| Error::Unexpected(format!("computing the next window: {e}"));
    let now = Timestamp::now();
    let minute = TimestampRound::new()
        .smallest(Unit::Minute)
        .mode(RoundMode::Trunc);
    let mut opens = now
        .round(minute)
        .map_err(bad)?
        .checked_add(1.minute())
        .map_err(bad)?;
    if opens.duration_since(now).as_secs() < i64::try_from(lead.as_secs()).unwrap_or(i64::MAX) {
        opens = opens.checked_add(1.minute()).map_err(bad)?;
    }
    let civil = opens.to_zoned(TimeZone::UTC);
    let closes = civil.checked_add(10.minutes()).map_err(bad)?;
    let day = format!("{:?}", civil.weekday())[..3].to_string();
    let window = serde_json::json!({
        "days": [day],
        "start": format!("{:02}:{:02}", civil.hour(), civil.minute()),
        "end": format!("{:02}:{:02}", closes.hour(), closes.minute()),
        "timeZone": "UTC",
    });
    Ok((window, opens))
}
