//! Non-negative Kubernetes-style durations ("30s", "5m", "1h30m") for policy fields.

use std::{fmt, str::FromStr, time};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::rules;

/// A duration written the Kubernetes way (`metav1.Duration`), never negative.
/// The default is zero.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(time::Duration);

/// Why a duration did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} {}", rules::DURATION_HINT)]
pub struct DurationError {
    value: String,
}

impl Duration {
    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Duration(time::Duration::from_secs(secs))
    }

    /// The standard library duration.
    pub const fn get(self) -> time::Duration {
        self.0
    }
}

impl From<time::Duration> for Duration {
    fn from(d: time::Duration) -> Self {
        Duration(d)
    }
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || DurationError { value: s.to_string() };
        if !follows_grammar(s) {
            return Err(err());
        }
        // Integer arithmetic, not kube's parser: it multiplies in f64 and panics on a value
        // past the f64 -> Duration range (`2545027477574775807807s`, found by fuzz/duration).
        let nanos = nanos(s).ok_or_else(err)?;
        Ok(Duration(time::Duration::from_nanos(nanos)))
    }
}

/// The nanoseconds of a string that follows the grammar, as Go's `time.ParseDuration` reads it
/// (fractions truncated to the nanosecond); None past Go's range (i64 nanoseconds).
fn nanos(s: &str) -> Option<u64> {
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() && rest != "0" {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int: u128 = rest[..int_len].parse().ok()?;
        rest = &rest[int_len..];
        let mut frac: (u128, u32) = (0, 0);
        if let Some(f) = rest.strip_prefix('.') {
            let n = f.bytes().take_while(u8::is_ascii_digit).count();
            // Digits past the 18th cannot change the result at nanosecond precision.
            let kept = &f[..n.min(18)];
            frac = (kept.parse().ok()?, kept.len() as u32);
            rest = &f[n..];
        }
        let (unit, len): (u128, usize) = [
            ("ns", 1),
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
        let term = int
            .checked_mul(unit)?
            .checked_add(frac.0 * unit / 10u128.pow(frac.1))?;
        total = total.checked_add(term)?;
    }
    u64::try_from(total).ok().filter(|n| *n <= i64::MAX as u64)
}

/// The grammar the API server enforces (`rules::DURATION_RE`), checked by hand to keep a regex
/// engine out of this crate: `0`, or one or more `digits[.digits]unit` with no sign.
fn follows_grammar(s: &str) -> bool {
    if s == "0" {
        return true;
    }
    let mut rest = s.as_bytes();
    if rest.is_empty() {
        return false;
    }
    let digits = |r: &[u8]| r.iter().take_while(|b| b.is_ascii_digit()).count();
    while !rest.is_empty() {
        let n = digits(rest);
        if n == 0 {
            return false;
        }
        rest = &rest[n..];
        if let Some(frac) = rest.strip_prefix(b".") {
            let n = digits(frac);
            if n == 0 {
                return false;
            }
            rest = &frac[n..];
        }
        let unit = [&b"ns"[..], b"us", b"ms", b"s", b"m", b"h"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

impl fmt::Display for Duration {
    /// Prints the shortest Go-style form: `90s` as `1m30s`, `0` as `0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.0;
        if total.is_zero() {
            return f.write_str("0s");
        }
        let secs = total.as_secs();
        let nanos = total.subsec_nanos();
        if secs == 0 {
            return if nanos.is_multiple_of(1_000_000) {
                write!(f, "{}ms", nanos / 1_000_000)
            } else if nanos.is_multiple_of(1_000) {
                write!(f, "{}us", nanos / 1_000)
            } else {
                write!(f, "{nanos}ns")
            };
        }
        let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
        if h > 0 {
            write!(f, "{h}h")?;
        }
        if m > 0 {
            write!(f, "{m}m")?;
        }
        if s > 0 || nanos > 0 {
            if nanos > 0 {
                let frac = format!("{:09}", nanos);
                write!(f, "{s}.{}s", frac.trim_end_matches('0'))?;
            } else {
                write!(f, "{s}s")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "maxLength": 32,
            "x-kubernetes-validations": [{
                "rule": format!("self.matches('{}')", rules::DURATION_RE),
                "message": rules::DURATION_HINT,
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_kubernetes_durations() {
        let secs = |s: &str| s.parse::<Duration>().map(|d| d.get().as_secs_f64());
        assert_eq!(secs("30s"), Ok(30.0));
        assert_eq!(secs("5m"), Ok(300.0));
        assert_eq!(secs("1h30m"), Ok(5400.0));
        assert_eq!(secs("1.5h"), Ok(5400.0));
        assert_eq!(secs("250ms"), Ok(0.25));
        assert_eq!(secs("0"), Ok(0.0));
        for bad in ["", "-30s", "30", "5 m", "soon", "+5m", "1d"] {
            assert!(bad.parse::<Duration>().is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn huge_values_are_refused_not_a_panic() {
        // Regression (fuzz/duration): kube's parser panicked in f64 -> Duration here.
        assert!("2545027477574775807807s".parse::<Duration>().is_err());
        assert!(
            "9999999999999999999999999999999999999999h"
                .parse::<Duration>()
                .is_err()
        );
        // Go's range ends at i64::MAX nanoseconds.
        assert!("9223372036854775807ns".parse::<Duration>().is_ok());
        assert!("9223372036854775808ns".parse::<Duration>().is_err());
        assert!("2562047h47m16.854775807s".parse::<Duration>().is_ok());
        assert!("2562047h47m16.854775808s".parse::<Duration>().is_err());
        assert_eq!(
            "1.000000000000000000001s".parse::<Duration>().map(|d| d.get()),
            Ok(time::Duration::from_secs(1))
        );
    }

    #[test]
    fn prints_like_go() {
        assert_eq!(Duration::from_secs(90).to_string(), "1m30s");
        assert_eq!(Duration::from_secs(0).to_string(), "0s");
        assert_eq!(Duration::from_secs(3600).to_string(), "1h");
        assert_eq!(
            Duration::from(time::Duration::from_millis(1500)).to_string(),
            "1.5s"
        );
        assert_eq!(
            Duration::from(time::Duration::from_millis(250)).to_string(),
            "250ms"
        );
    }

    proptest! {
        #[test]
        fn round_trips(nanos in 0u64..(48 * 3600 * 1_000_000_000)) {
            let d = Duration::from(time::Duration::from_nanos(nanos));
            let back: Duration = d.to_string().parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(back, d);
        }

        /// The API server's pattern and this parser agree.
        #[test]
        fn cel_pattern_agrees_with_parser(s in "[0-9.smhun -]{0,8}") {
            let re = regex_lite::Regex::new(rules::DURATION_RE).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(re.is_match(&s), s.parse::<Duration>().is_ok(), "{:?}", s);
        }
    }
}
