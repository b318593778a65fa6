//! How long the operator's watches wait after an error before they try again.
//!
//! kube's default is client-go's reflector backoff (0.8 s doubling to 30 s, plus up to as much
//! again of jitter), made so that thousands of clients spare a struggling API server. The
//! operator is one client with a handful of watches, and while they are down it decides on a
//! stale cache. With the default, a 30 s API server outage had grown the sleeps to 25–50 s by
//! the time the server came back, and the 410 Gone that a restarted server answers to a resumed
//! watch bought another sleep of up to a minute: the operator acted on a cache 40–60 s old
//! (reliability_control_plane). Here the wait doubles from 0.2 s to 2.5 s (plus up to as much
//! again of jitter) and any event resets it: at most one request per watch every few seconds,
//! and a relist within about 10 s of the server's return. The probes keep kube's default: there
//! are thousands of them.

use std::time::Duration;

use kube::runtime::{utils::Backoff, watcher::ExponentialBackoff};

/// The first wait after an error.
pub const FIRST: Duration = Duration::from_millis(200);
/// The longest wait before jitter, which adds up to as much again.
pub const LONGEST: Duration = Duration::from_millis(2500);

/// The backoff of every operator watch, the policy watch included.
pub fn watch() -> impl Backoff + 'static {
    ExponentialBackoff::from(
        backon::ExponentialBuilder::default()
            .with_min_delay(FIRST)
            .with_max_delay(LONGEST)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_grows_to_a_few_seconds_and_starts_again_after_an_event() {
        let mut b = watch();
        let waits: Vec<Duration> = (0..20).map(|_| b.next().unwrap_or(Duration::MAX)).collect();
        assert!(waits[0] >= FIRST && waits[0] < FIRST * 2, "{waits:?}");
        // kube's default would be waiting 30-60 s by now.
        assert!(waits.iter().all(|w| *w < LONGEST * 2), "{waits:?}");
        assert!(waits[10..].iter().all(|w| *w >= LONGEST), "{waits:?}");
        b.reset();
        let again = b.next().unwrap_or(Duration::MAX);
        assert!(again >= FIRST && again < FIRST * 2, "{again:?}");
    }
}
