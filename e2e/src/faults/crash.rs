//! Crash points (operator/src/crash.rs): the check that a replica armed with one
//! ([`super::strike::Interrupted`] starts it) really died there, and its restart without it (a
//! container restarted in its pod: the same identity, so it takes its Lease back at once and the
//! next leader is the restarted process).

use std::time::{Duration, Instant};

use super::{checks::Check, record, replica::Operator};
use crate::Error;

/// Waits until the armed replica exits, and checks that it died at `point`: killed by a signal
/// (abort), with the point's line in its log. A replica that exits otherwise, or not at all
/// within `timeout`, fails the check (the fault did not apply).
pub async fn crashed_at(op: &mut Operator, point: &str, timeout: Duration) -> Check {
    let status = op.wait_exit(timeout).await;
    let line = format!("gpunode crash point {point} reached");
    // The log holds every process of the identity: only the armed incarnation's lines count.
    let log = op.log_text();
    let own = log.rfind("crash point armed").map_or("", |at| &log[at..]);
    let logged = own.contains(&line);
    let signalled = status
        .as_ref()
        .is_ok_and(|s| std::os::unix::process::ExitStatusExt::signal(s).is_some());
    Check::new(
        &format!("the leader crashed at {point}"),
        logged && signalled,
        format!("exit {status:?}; the log has \"{line}\": {logged}"),
    )
}

/// Restarts the replica without the crash point and waits until it leads; returns the time from
/// the restart to leading, in ms.
pub async fn restart_unarmed(op: &mut Operator, timeout: Duration) -> Result<u64, Error> {
    op.spec.env.retain(|(k, _)| k != gpunode_operator::crash::ENV);
    op.spawn()?;
    let restarted = Instant::now();
    op.wait_leading(timeout).await?;
    Ok(record::elapsed_ms(restarted))
}

/// Waits until a probe process started with `point` armed exits, and checks that it died there
/// (a signal ended it, and its log has the point's line).
pub async fn probe_crashed_at(probe: &mut crate::probe::Probe, point: &str, timeout: Duration) -> Check {
    let status = probe.wait_exit(timeout).await;
    let line = format!("gpunode crash point {point} reached");
    let logged = probe.lines().iter().any(|l| l.contains(&line));
    let signalled = status
        .as_ref()
        .is_ok_and(|s| std::os::unix::process::ExitStatusExt::signal(s).is_some());
    Check::new(
        &format!("the probe crashed at {point}"),
        logged && signalled,
        format!("exit {status:?}; the log has \"{line}\": {logged}"),
    )
}
