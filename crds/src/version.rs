//! Dotted versions and version ranges for NVIDIA driver and CUDA versions.
//!
//! A range is a comma-separated list of clauses that must all hold:
//! `">=550.54.15, <560"`, `"12.4"`, `"~=535"`. Components compare numerically, so
//! `550.100 > 550.54.15`, and missing trailing components count as zero (`12.4 == 12.4.0`).

use std::{cmp::Ordering, fmt, str::FromStr};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::rules;

/// Longest accepted range string; the API server enforces the same bound.
pub const MAX_RANGE_LEN: usize = 128;
/// Most components a version may have (`550.54.15` has three).
pub const MAX_COMPONENTS: usize = 4;
/// Most digits in one component, so that every accepted component fits in 32 bits.
pub const MAX_COMPONENT_DIGITS: usize = 9;

/// Why a version or range did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Nothing but whitespace.
    #[error("is empty")]
    Empty,
    /// A component is not a decimal number (`550.x`).
    #[error("{0:?} is not a dotted version: components must be decimal numbers such as 550.54.15")]
    NotNumeric(String),
    /// A component has more than [`MAX_COMPONENT_DIGITS`] digits.
    #[error("{0:?} has a component longer than {MAX_COMPONENT_DIGITS} digits")]
    TooLarge(String),
    /// More than [`MAX_COMPONENTS`] components.
    #[error("{0:?} has more than {MAX_COMPONENTS} components")]
    TooManyComponents(String),
    /// A clause between commas is empty (`">=550,,<560"`).
    #[error("clause {0} is empty (clauses are separated by single commas)")]
    EmptyClause(usize),
    /// The whole range is longer than [`MAX_RANGE_LEN`].
    #[error("is longer than {MAX_RANGE_LEN} characters")]
    TooLong,
}

/// A dotted numeric version such as `550.54.15` or `12.4`.
#[derive(Debug, Clone)]
pub struct Version {
    parts: Vec<u32>,
}

impl Version {
    /// The components as written.
    pub fn parts(&self) -> &[u32] {
        &self.parts
    }

    /// Components without trailing zeros, the form equality and ordering use.
    fn significant(&self) -> &[u32] {
        let end = self.parts.iter().rposition(|p| *p != 0).map_or(0, |i| i + 1);
        &self.parts[..end]
    }

    /// True when `self` starts with every component of `prefix` (`550.54.15` starts with `550`).
    pub fn starts_with(&self, prefix: &Version) -> bool {
        prefix
            .parts
            .iter()
            .enumerate()
            .all(|(i, p)| self.parts.get(i).copied().unwrap_or(0) == *p)
    }
}

impl FromStr for Version {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim_matches(' ');
        if s.is_empty() {
            return Err(VersionError::Empty);
        }
        let mut parts = Vec::new();
        for part in s.split('.') {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(VersionError::NotNumeric(s.to_string()));
            }
            if part.len() > MAX_COMPONENT_DIGITS {
                return Err(VersionError::TooLarge(s.to_string()));
            }
            let n = part
                .parse::<u32>()
                .map_err(|_| VersionError::TooLarge(s.to_string()))?;
            parts.push(n);
        }
        if parts.len() > MAX_COMPONENTS {
            return Err(VersionError::TooManyComponents(s.to_string()));
        }
        Ok(Version { parts })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.significant() == other.significant()
    }
}
impl Eq for Version {}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.parts.len().max(other.parts.len());
        (0..n)
            .map(|i| {
                let a = self.parts.get(i).copied().unwrap_or(0);
                let b = other.parts.get(i).copied().unwrap_or(0);
                a.cmp(&b)
            })
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl std::hash::Hash for Version {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.significant().hash(state);
    }
}

/// How a clause compares a version with its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `==V`, `=V` or a bare `V`: equal (missing components are zero).
    Eq,
    /// `!=V`
    Ne,
    /// `>V`
    Gt,
    /// `>=V`
    Ge,
    /// `<V`
    Lt,
    /// `<=V`
    Le,
    /// `~=V`: V or a later release of the same line, i.e. starting with every component of V
    /// (`~=535` is the 535 driver branch, `~=12.4` any 12.4.x).
    Compatible,
}

impl Op {
    /// The operator as printed; `Eq` prints as a bare version.
    pub fn symbol(self) -> &'static str {
        match self {
            Op::Eq => "",
            Op::Ne => "!=",
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Compatible => "~=",
        }
    }
}

/// One clause of a range: an operator and a bound.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Clause {
    /// The comparison.
    pub op: Op,
    /// The bound it compares with.
    pub version: Version,
}

impl Clause {
    /// True when `v` satisfies this clause.
    pub fn matches(&self, v: &Version) -> bool {
        match self.op {
            Op::Eq => v == &self.version,
            Op::Ne => v != &self.version,
            Op::Gt => v > &self.version,
            Op::Ge => v >= &self.version,
            Op::Lt => v < &self.version,
            Op::Le => v <= &self.version,
            Op::Compatible => v >= &self.version && v.starts_with(&self.version),
        }
    }
}

impl fmt::Display for Clause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.op.symbol(), self.version)
    }
}

impl FromStr for Clause {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim_matches(' ');
        // Longest operators first so ">=" is not read as ">" followed by "=550".
        const OPS: [(&str, Op); 8] = [
            (">=", Op::Ge),
            ("<=", Op::Le),
            ("==", Op::Eq),
            ("!=", Op::Ne),
            ("~=", Op::Compatible),
            (">", Op::Gt),
            ("<", Op::Lt),
            ("=", Op::Eq),
        ];
        let (op, rest) = OPS
            .iter()
            .find_map(|(sym, op)| s.strip_prefix(sym).map(|rest| (*op, rest)))
            .unwrap_or((Op::Eq, s));
        Ok(Clause {
            op,
            version: rest.parse()?,
        })
    }
}

/// A set of acceptable versions: every clause must hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VersionRange {
    clauses: Vec<Clause>,
}

impl VersionRange {
    /// The clauses, all of which must hold.
    pub fn clauses(&self) -> &[Clause] {
        &self.clauses
    }

    /// True when `v` satisfies every clause.
    pub fn matches(&self, v: &Version) -> bool {
        self.clauses.iter().all(|c| c.matches(v))
    }

    /// Parses `v` and checks it; an unparsable observed version never matches.
    pub fn matches_str(&self, v: &str) -> Result<bool, VersionError> {
        Ok(self.matches(&v.parse()?))
    }
}

impl FromStr for VersionRange {
    type Err = VersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() > MAX_RANGE_LEN {
            return Err(VersionError::TooLong);
        }
        if s.trim_matches(' ').is_empty() {
            return Err(VersionError::Empty);
        }
        let clauses = s
            .split(',')
            .enumerate()
            .map(|(i, c)| {
                if c.trim_matches(' ').is_empty() {
                    Err(VersionError::EmptyClause(i + 1))
                } else {
                    c.parse()
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(VersionRange { clauses })
    }
}

impl fmt::Display for VersionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.clauses.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl VersionRange {
    /// The canonical clauses joined by `,` alone: never longer than the text the range was
    /// parsed from (a canonical clause is never longer than its source), so it always parses
    /// back, where the display form's `, ` may pass [`MAX_RANGE_LEN`].
    pub fn to_compact(&self) -> String {
        self.clauses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Serialize for VersionRange {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The display form when it fits, so stored and printed ranges read alike; else the
        // compact one (found by libFuzzer: a 128-character range displayed in 133 and failed to
        // deserialize from its own serialization).
        let shown = self.to_string();
        if shown.len() <= MAX_RANGE_LEN {
            s.serialize_str(&shown)
        } else {
            s.serialize_str(&self.to_compact())
        }
    }
}

impl<'de> Deserialize<'de> for VersionRange {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|e| {
            serde::de::Error::custom(format!("version range {s:?} {e}; {}", rules::VERSION_RANGE_HINT))
        })
    }
}

impl JsonSchema for VersionRange {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "VersionRange".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "maxLength": MAX_RANGE_LEN,
            "x-kubernetes-validations": [{
                "rule": format!("self.matches('{}')", rules::VERSION_RANGE_RE),
                "message": format!("must be a version range: {}", rules::VERSION_RANGE_HINT),
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_range_at_the_length_limit_survives_its_own_serialization() {
        // 127 characters whose display form (", " between clauses) is longer than the limit.
        let text = format!("{}1", ">1,".repeat(42));
        assert!(text.len() <= MAX_RANGE_LEN);
        let range: VersionRange = text.parse().unwrap();
        assert!(range.to_string().len() > MAX_RANGE_LEN);
        let json = serde_json::to_string(&range).unwrap();
        let back: VersionRange = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
        assert_eq!(back.to_string(), range.to_string());
        // Ordinary ranges serialize as they display.
        let usual: VersionRange = ">=550.54.15,<560".parse().unwrap();
        assert_eq!(
            serde_json::to_string(&usual).unwrap_or_default(),
            "\">=550.54.15, <560\""
        );
    }

    use super::*;
    use proptest::prelude::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }
    fn r(s: &str) -> VersionRange {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn components_compare_numerically() {
        assert!(v("550.100") > v("550.54.15"));
        assert!(v("550.54.15") < v("550.54.16"));
        assert!(v("12.10") > v("12.9"));
        assert_eq!(v("12.4"), v("12.4.0"));
        assert!(v("535") < v("535.0.1"));
    }

    #[test]
    fn ranges_match_as_documented() {
        let range = r(">=550.54.15, <560");
        assert!(range.matches(&v("550.54.15")));
        assert!(range.matches(&v("550.100")));
        assert!(range.matches(&v("555.42.6")));
        assert!(!range.matches(&v("550.54.14")));
        assert!(!range.matches(&v("560")));
        assert!(!range.matches(&v("560.28.3")));

        assert!(r("12.4").matches(&v("12.4.0")));
        assert!(!r("12.4").matches(&v("12.4.1")));

        let branch = r("~=535");
        assert!(branch.matches(&v("535.183.01")));
        assert!(!branch.matches(&v("536.1")));
        assert!(!branch.matches(&v("534.99")));
        assert!(r("~=12.4").matches(&v("12.4.131")));
        assert!(!r("~=12.4").matches(&v("12.5")));
        assert!(!r("~=550.54.15").matches(&v("550.54.14")));

        assert!(r("!=550.54.14").matches(&v("550.54.15")));
        assert!(r("==550.54.15").matches(&v("550.54.15")));
        assert!(r("=550.54.15").matches(&v("550.54.15")));
        assert!(r("<=550").matches(&v("550.0.0")));
        assert!(r(">550").matches(&v("550.0.1")));
    }

    #[test]
    fn malformed_ranges_name_the_problem() {
        assert_eq!("".parse::<VersionRange>(), Err(VersionError::Empty));
        assert_eq!(
            ">=550,,<560".parse::<VersionRange>(),
            Err(VersionError::EmptyClause(2))
        );
        assert!(matches!(
            ">=550.x".parse::<VersionRange>(),
            Err(VersionError::NotNumeric(_))
        ));
        assert!(matches!(
            "=>550".parse::<VersionRange>(),
            Err(VersionError::NotNumeric(_))
        ));
        assert!(matches!(
            "1.2.3.4.5".parse::<VersionRange>(),
            Err(VersionError::TooManyComponents(_))
        ));
        assert!(matches!(
            "99999999999".parse::<VersionRange>(),
            Err(VersionError::TooLarge(_))
        ));
        assert!(matches!(
            "550.".parse::<VersionRange>(),
            Err(VersionError::NotNumeric(_))
        ));
        assert_eq!(
            "1,".repeat(100).parse::<VersionRange>(),
            Err(VersionError::TooLong)
        );
    }

    #[test]
    fn serde_uses_the_string_form() {
        let range: VersionRange = serde_json::from_str("\">= 550.54.15 ,<560\"").unwrap();
        assert_eq!(
            serde_json::to_string(&range).ok(),
            Some("\">=550.54.15, <560\"".to_string())
        );
        let err = serde_json::from_str::<VersionRange>("\"latest\"")
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("\"latest\"") && e.contains("~=535")));
    }

    fn version() -> impl Strategy<Value = Version> {
        prop::collection::vec(0u32..1000, 1..=MAX_COMPONENTS).prop_map(|parts| Version { parts })
    }

    fn op() -> impl Strategy<Value = Op> {
        prop::sample::select(vec![
            Op::Eq,
            Op::Ne,
            Op::Gt,
            Op::Ge,
            Op::Lt,
            Op::Le,
            Op::Compatible,
        ])
    }

    fn range() -> impl Strategy<Value = VersionRange> {
        prop::collection::vec((op(), version()), 1..4).prop_map(|cs| VersionRange {
            clauses: cs
                .into_iter()
                .map(|(op, version)| Clause { op, version })
                .collect(),
        })
    }

    proptest! {
        #[test]
        fn ordering_is_total_and_consistent(a in version(), b in version(), c in version()) {
            // Exactly one of <, ==, > holds, and it agrees with Eq.
            let ab = a.cmp(&b);
            prop_assert_eq!(ab, b.cmp(&a).reverse());
            prop_assert_eq!(ab == Ordering::Equal, a == b);
            // Transitivity.
            if a <= b && b <= c {
                prop_assert!(a <= c);
            }
            // Equal versions hash alike (HashSet/HashMap rely on it).
            if a == b {
                use std::hash::{BuildHasher, RandomState};
                let s = RandomState::new();
                prop_assert_eq!(s.hash_one(&a), s.hash_one(&b));
            }
        }

        #[test]
        fn versions_round_trip(a in version()) {
            let printed = a.to_string();
            let parsed: Version = printed.parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(parsed.parts(), a.parts());
        }

        #[test]
        fn ranges_round_trip(range in range()) {
            let printed = range.to_string();
            let parsed: VersionRange = printed.parse().map_err(|e| TestCaseError::fail(format!("{printed}: {e}")))?;
            prop_assert_eq!(&parsed, &range);
            prop_assert_eq!(parsed.to_string(), printed);
        }

        #[test]
        fn matching_agrees_with_ordering(a in version(), b in version()) {
            let ge: VersionRange = format!(">={b}").parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(ge.matches(&a), a >= b);
            let lt: VersionRange = format!("<{b}").parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(lt.matches(&a), a < b);
            let eq: VersionRange = b.to_string().parse().map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(eq.matches(&a), a == b);
        }

        /// The API server's CEL rule and this parser accept the same strings.
        #[test]
        fn cel_pattern_agrees_with_parser(s in r"[ 0-9.,<>=!~a]{0,24}") {
            let re = regex_lite::Regex::new(rules::VERSION_RANGE_RE).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(re.is_match(&s), s.parse::<VersionRange>().is_ok(), "{:?}", s);
        }
    }
}
