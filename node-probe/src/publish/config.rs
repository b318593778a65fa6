//! The timing of the publish loop ([`PublishConfig`]).
//!
//! Plain data with its defaults; it may not import anything else from [`crate::publish`], so
//! every other publish module can depend on it.

use std::time::Duration;

use crate::change::ChangeConfig;

/// Timing of the publish loop.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    /// How often to observe.
    pub interval: Duration,
    /// Longest time without a write while nothing changes: the heartbeat (a Lease renewal where
    /// the sink has one).
    pub heartbeat: Duration,
    /// Longest time without writing the whole report while nothing material changes (temperatures
    /// within their band, power, counters no check reads).
    pub report_refresh: Duration,
    /// Shortest time between two observations triggered by notifications (XIDs, policy
    /// changes), and between two report writes: bounds the work an XID storm causes. A
    /// periodic observation or a Lease renewal does not hold back the next notification.
    pub min_gap: Duration,
    /// First retry delay after a failed publish.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Shortest time from a report write to a write that only clears findings (a drift or an
    /// unknown that went away, nothing new): a value sitting on a threshold publishes its drift at
    /// once but not every flip back.
    pub recovery_gap: Duration,
    /// What counts as a material change when no policy is known.
    pub change: ChangeConfig,
}

impl Default for PublishConfig {
    fn default() -> Self {
        PublishConfig {
            interval: Duration::from_secs(10),
            heartbeat: Duration::from_secs(60),
            report_refresh: Duration::from_secs(600),
            min_gap: Duration::from_secs(1),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            recovery_gap: Duration::from_secs(120),
            change: ChangeConfig::default(),
        }
    }
}
