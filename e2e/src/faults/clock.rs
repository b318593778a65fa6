//! A skewed wall clock for a process the suite starts (an operator replica, a probe): libfaketime
//! preloaded, wall clock only (`FAKETIME_DONT_FAKE_MONOTONIC`), as NTP skew is. The library comes
//! from Debian's `faketime` package (`e2e/cluster/host-tools.sh`, run by `make cluster-build`).

use crate::Error;

const FAKETIME_LIBS: [&str; 2] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
];

/// The environment that runs a process with its wall clock `secs` ahead (negative: behind).
pub fn skewed(secs: i64) -> Result<Vec<(String, String)>, Error> {
    let lib = FAKETIME_LIBS
        .iter()
        .find(|l| std::path::Path::new(l).exists())
        .ok_or_else(|| {
            Error::Unexpected(format!(
                "libfaketime is missing ({FAKETIME_LIBS:?}): run e2e/cluster/host-tools.sh (make cluster-build does)"
            ))
        })?;
    Ok(vec![
        ("LD_PRELOAD".into(), (*lib).into()),
        ("FAKETIME".into(), format!("{secs:+}s")),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ])
}
