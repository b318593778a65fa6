//! `maxUnavailable`: a node count or a percentage of the policy's nodes.

use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::rules;

/// A number of nodes, or a percentage of the policy's nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaxUnavailable {
    /// An absolute number of nodes.
    Count(u32),
    /// A percentage (0-100) of the selected nodes.
    Percent(u8),
}

impl MaxUnavailable {
    /// How many of `total` nodes may be disrupted: percentages round down, but a percentage
    /// above 0% always allows at least one node (otherwise a small pool could never be healed).
    pub fn resolve(self, total: u32) -> u32 {
        match self {
            MaxUnavailable::Count(n) => n,
            MaxUnavailable::Percent(0) => 0,
            MaxUnavailable::Percent(p) => ((u64::from(total) * u64::from(p)) / 100).max(1) as u32,
        }
    }
}

impl fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxUnavailable::Count(n) => write!(f, "{n}"),
            MaxUnavailable::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl Serialize for MaxUnavailable {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MaxUnavailable::Count(n) => s.serialize_u32(*n),
            MaxUnavailable::Percent(_) => s.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for MaxUnavailable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = MaxUnavailable;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(rules::MAX_UNAVAILABLE_HINT)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                u32::try_from(v)
                    .map(MaxUnavailable::Count)
                    .map_err(|_| E::custom(format!("maxUnavailable {v} is too large")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "maxUnavailable {v} {}",
                        rules::MAX_UNAVAILABLE_HINT
                    ))),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let bad = || E::custom(format!("maxUnavailable {v:?} {}", rules::MAX_UNAVAILABLE_HINT));
                if !v.is_empty() && v.len() <= 9 && v.bytes().all(|b| b.is_ascii_digit()) {
                    return v.parse().map(MaxUnavailable::Count).map_err(|_| bad());
                }
                let digits = v.strip_suffix('%').ok_or_else(bad)?;
                if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                match digits.parse::<u8>() {
                    Ok(p) if p <= 100 && (digits == "0" || !digits.starts_with('0')) => {
                        Ok(MaxUnavailable::Percent(p))
                    }
                    _ => Err(bad()),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl JsonSchema for MaxUnavailable {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MaxUnavailable".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "x-kubernetes-int-or-string": true,
            "nullable": false,
            "x-kubernetes-validations": [{
                "rule": format!("string(self).matches('{}')", rules::MAX_UNAVAILABLE_RE),
                "message": rules::MAX_UNAVAILABLE_HINT,
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> Option<MaxUnavailable> {
        serde_json::from_value(v).ok()
    }

    #[test]
    fn parses_counts_and_percentages() {
        assert_eq!(parse(serde_json::json!(3)), Some(MaxUnavailable::Count(3)));
        assert_eq!(parse(serde_json::json!("10%")), Some(MaxUnavailable::Percent(10)));
        assert_eq!(
            parse(serde_json::json!("100%")),
            Some(MaxUnavailable::Percent(100))
        );
        assert_eq!(parse(serde_json::json!("0%")), Some(MaxUnavailable::Percent(0)));
        assert_eq!(parse(serde_json::json!("10")), Some(MaxUnavailable::Count(10)));
        for bad in [
            serde_json::json!(-1),
            serde_json::json!("101%"),
            serde_json::json!("%"),
            serde_json::json!("010%"),
            serde_json::json!("-5%"),
            serde_json::json!(1.5),
        ] {
            assert_eq!(parse(bad.clone()), None, "{bad} should be rejected");
        }
    }

    #[test]
    fn resolves_against_the_pool() {
        assert_eq!(MaxUnavailable::Percent(10).resolve(30), 3);
        assert_eq!(MaxUnavailable::Percent(10).resolve(5), 1);
        assert_eq!(MaxUnavailable::Percent(0).resolve(50), 0);
        assert_eq!(MaxUnavailable::Percent(100).resolve(7), 7);
        assert_eq!(MaxUnavailable::Count(2).resolve(1), 2);
    }

    #[test]
    fn pattern_matches_parser() {
        let re = regex_lite::Regex::new(rules::MAX_UNAVAILABLE_RE).ok();
        for p in 0..=1000u32 {
            for s in [
                format!("{p}%"),
                format!("0{p}%"),
                format!("{p}"),
                format!("-{p}"),
                format!("{p}x"),
            ] {
                let parsed = parse(serde_json::json!(s)).is_some();
                assert_eq!(re.as_ref().map(|r| r.is_match(&s)), Some(parsed), "{s}");
            }
        }
    }
}
