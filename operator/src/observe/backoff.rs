//! How long the operator's watches wait after an error before they try again.
//!
//! kube's default is client-go's reflector backoff (0.8 s doubling to 30 s, plus up to as much
//! again of jitter), made so that thousands of clients spare a struggling API server. The
//! operator is one client with a handful of watches, and while they are down it decides on a
//! stale cache. With the default, a 30 s API server outage had grown the sleeps to 25–50 s by
//! the time the server came back, and the 410 Gone that a restarted server answers to a resumed
//! watch bought another sleep of up to a minute: the operator acted on a cache 40–60 s old
//! (reliability_control_plane). Here the wait doubles from 0.2 s to 2.5 s (plus up to as much
//! again of jitter) and any event resets it: at most one request per watch every few seconds.
//! The probes keep kube's default: there are thousands of them.
//!
//! A 410 Gone is not a failure to wait out: the watcher has already dropped its resourceVersion
//! and lists again on the next poll ([`relist_at_once`]). Both together: the node and report
//! watches listed again 4-6 s after the API server's start command (about 1 s of it the
//! server starting, then its caches initialising: 429), where kube's default took 46 s.
//!
//! It only times retries; it never decides what a watch lists.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::{
    utils::Backoff,
    watcher::{self, ExponentialBackoff},
};
use tracing::info;

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

/// A watch of `api` as every operator watch runs: [`relist_at_once`], then [`watch`]'s backoff.
/// `name` names it in the log.
pub fn watcher<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    name: &'static str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    use kube::runtime::WatchStreamExt;
    relist_at_once(watcher::watcher(api, config), name).backoff(watch())
}

/// Lets a watch's 410 Gone by without a wait, so that it lists again at once, unless a 410 came
/// already since the watch last finished a list or saw a change: a server that answered every
/// list with 410 would otherwise be asked in a loop, so that one goes through the backoff.
pub fn relist_at_once<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    watch: &'static str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Send + 'static,
{
    let mut expired_since_progress = false;
    events.filter_map(move |item| {
        let pass = match &item {
            Err(watcher::Error::WatchError(status)) if status.code == 410 && !expired_since_progress => {
                expired_since_progress = true;
                info!(watch, reason = %status.message, "watch expired (410 Gone); listing again at once");
                None
            }
            Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                expired_since_progress = false;
                Some(item)
            }
            _ => Some(item),
        };
        futures::future::ready(pass)
    })
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn gone() -> Result<watcher::Event<u32>, watcher::Error> {
        let mut s = Status::failure("too old resource version: 1 (2)", "Expired");
        s.code = 410;
        Err(watcher::Error::WatchError(Box::new(s)))
    }

    fn shape(items: &[Result<watcher::Event<u32>, watcher::Error>]) -> Vec<String> {
        items
            .iter()
            .map(|i| match i {
                Ok(watcher::Event::Apply(n)) => format!("apply {n}"),
                Ok(watcher::Event::Init) => "init".into(),
                Ok(watcher::Event::InitApply(n)) => format!("init-apply {n}"),
                Ok(watcher::Event::InitDone) => "init-done".into(),
                Ok(watcher::Event::Delete(n)) => format!("delete {n}"),
                Err(watcher::Error::WatchError(s)) => format!("error {}", s.code),
                Err(e) => format!("error {e}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn the_first_410_since_progress_relists_at_once_a_second_one_waits() {
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Apply(1)),
            gone(),
            Ok(watcher::Event::Init),
            gone(),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(1)),
            Ok(watcher::Event::InitDone),
            gone(),
        ]);
        let out: Vec<_> = relist_at_once(events, "test").collect().await;
        assert_eq!(
            shape(&out),
            [
                "apply 1",
                "init",
                "error 410",
                "init",
                "init-apply 1",
                "init-done"
            ],
            "the first 410 is dropped (no backoff), the second before a finished list reaches the \
             backoff, and a 410 after the list is dropped again"
        );
    }

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
