//! Waiting on conditions with deadlines: tests never sleep for a fixed time.

use std::{future::Future, time::Duration};

use crate::Error;

/// Polls `check` until it returns `Some`, or fails after `timeout` naming `what` and the last
/// observation `check` reported through `Err`.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, Error>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut interval = Duration::from_millis(50);
    loop {
        let last = match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => "condition not met".to_string(),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                after: timeout,
                last,
            });
        }
        // Poll interval of a condition wait, growing to 500 ms.
        tokio::time::sleep(interval).await;
        interval = (interval * 2).min(Duration::from_millis(500));
    }
}
