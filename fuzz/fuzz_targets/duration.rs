//! The policy duration parser (crds, "30s", "1h30m") on arbitrary text. Beyond not panicking:
//! what it accepts prints in a form that parses back to the same duration; only the grammar's
//! characters are accepted, never a sign; and an input made only of whole `<digits><unit>`
//! terms equals the sum a reference written here computes.
#![no_main]

use gpunode_crds::Duration;
use libfuzzer_sys::fuzz_target;

/// Nanoseconds of `s` when it is one or more whole `<digits><ns|us|ms|s|m|h>` terms (or "0");
/// None otherwise or past u128.
fn whole_terms(s: &str) -> Option<u128> {
    if s == "0" {
        return Some(0);
    }
    let mut rest = s;
    let mut total: u128 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 30 {
            return None;
        }
        let value: u128 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let (unit, len) = [
            ("ns", 1u128),
            ("us", 1_000),
            ("ms", 1_000_000),
            ("s", 1_000_000_000),
            ("m", 60_000_000_000),
            ("h", 3_600_000_000_000),
        ]
        .into_iter()
        .find(|(u, _)| rest.starts_with(u))
        .map(|(u, f)| (f, u.len()))?;
        rest = &rest[len..];
        total = total.checked_add(value.checked_mul(unit)?)?;
    }
    Some(total)
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match s.parse::<Duration>() {
        Ok(d) => {
            assert!(
                s.bytes().all(|b| b.is_ascii_digit() || b"nsumh.".contains(&b)),
                "{s:?} accepted with a character outside the grammar"
            );
            let printed = d.to_string();
            let back: Duration = printed
                .parse()
                .unwrap_or_else(|e| panic!("{printed:?} (from {s:?}) does not parse back: {e}"));
            assert_eq!(back, d, "{s:?} printed as {printed:?}");
            if let Some(nanos) = whole_terms(s) {
                assert_eq!(d.get().as_nanos(), nanos, "{s:?}");
            }
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            // Whole terms within Go's range (i64 nanoseconds) are valid durations.
            if let Some(nanos) = whole_terms(s) {
                assert!(nanos > i64::MAX as u128, "{s:?} ({nanos} ns) refused: {e}");
            }
        }
    }
});
