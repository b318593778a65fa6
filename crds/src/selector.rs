//! Label selectors in a policy (`spec.nodeSelector`, `spec.disruption.drain.podSelector`): the
//! schema the API server validates them with (CEL rules for what Kubernetes itself rejects), and
//! the parser the operator uses, which accepts exactly the same selectors and fails closed.
//!
//! Kubernetes stores a CRD's `LabelSelector` field as an arbitrary object: an operator `Bogus`,
//! `In` without values or a key with spaces is accepted, and a client that turns what it cannot
//! parse into "no selector" selects everything. Here the API server refuses such a policy, and
//! the operator's [`parse`] refuses it too (a policy stored before these rules existed).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::core::{Expression, Selector};

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters
/// (alphanumerics, `-`, `_`, `.`, starting and ending with an alphanumeric). The prefix's length
/// (at most 253) is a separate rule. `[.]` instead of `\.` keeps the pattern free of CEL escapes.
pub const LABEL_KEY_RE: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?\
[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// A label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, starting and ending with an
/// alphanumeric.
pub const LABEL_VALUE_RE: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$";

/// Longest prefix of a label key.
pub const MAX_KEY_PREFIX: usize = 253;
/// Longest name part of a label key, and longest label value.
pub const MAX_NAME: usize = 63;
/// Most requirements in one selector, and most values in one requirement (bounds that keep the
/// CEL rules within the API server's cost budget; no real selector comes close).
pub const MAX_ITEMS: usize = 64;

/// What a user is told about a malformed key.
pub const KEY_HINT: &str = "must be a valid label key: an optional DNS subdomain prefix of at most 253 \
characters and '/', then a name of at most 63 characters (letters, digits, '-', '_' or '.', starting \
and ending with a letter or digit), for example \"nvidia.com/gpu.product\"";

/// What a user is told about a malformed value.
pub const VALUE_HINT: &str = "must be a valid label value: empty, or at most 63 characters (letters, \
digits, '-', '_' or '.', starting and ending with a letter or digit)";

/// The operators Kubernetes knows.
pub const OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

/// A selector the operator refuses to use: the field path (as the API server prints it) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidSelector {
    /// For example `spec.disruption.drain.podSelector.matchExpressions[0].operator`.
    pub field: String,
    /// For example `operator "Bogus" is not one of In, NotIn, Exists, DoesNotExist`.
    pub reason: String,
}

fn name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    let alnum = |c: &u8| c.is_ascii_alphanumeric();
    !b.is_empty()
        && b.len() <= MAX_NAME
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || matches!(c, b'-' | b'_' | b'.'))
}

fn dns_label_ok(label: &str) -> bool {
    let b = label.as_bytes();
    let lower = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.first().is_some_and(lower)
        && b.last().is_some_and(lower)
        && b.iter().all(|c| lower(c) || *c == b'-')
}

/// Whether `key` is a label key Kubernetes accepts.
pub fn key_ok(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= MAX_KEY_PREFIX
                && prefix.split('.').all(dns_label_ok)
                && name_ok(name)
        }
        None => name_ok(key),
    }
}

/// Whether `value` is a label value Kubernetes accepts.
pub fn value_ok(value: &str) -> bool {
    value.is_empty() || name_ok(value)
}

fn invalid(field: String, reason: impl Into<String>) -> InvalidSelector {
    InvalidSelector {
        field,
        reason: reason.into(),
    }
}

fn requirement(field: String, r: &LabelSelectorRequirement) -> Result<Expression, InvalidSelector> {
    if !key_ok(&r.key) {
        return Err(invalid(format!("{field}.key"), format!("{:?} {KEY_HINT}", r.key)));
    }
    let values = r.values.as_deref().unwrap_or_default();
    if values.len() > MAX_ITEMS {
        return Err(invalid(
            format!("{field}.values"),
            format!("at most {MAX_ITEMS} values"),
        ));
    }
    if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !value_ok(v)) {
        return Err(invalid(
            format!("{field}.values[{i}]"),
            format!("{v:?} {VALUE_HINT}"),
        ));
    }
    let set = || values.iter().cloned().collect();
    match r.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(invalid(
            format!("{field}.values"),
            "values must be non-empty when operator is In or NotIn",
        )),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(invalid(
            format!("{field}.values"),
            "values must be empty when operator is Exists or DoesNotExist",
        )),
        "In" => Ok(Expression::In(r.key.clone(), set())),
        "NotIn" => Ok(Expression::NotIn(r.key.clone(), set())),
        "Exists" => Ok(Expression::Exists(r.key.clone())),
        "DoesNotExist" => Ok(Expression::DoesNotExist(r.key.clone())),
        other => Err(invalid(
            format!("{field}.operator"),
            format!("operator {other:?} is not one of {}", OPERATORS.join(", ")),
        )),
    }
}

/// The CEL rule (on a policy's spec) that its node selector names at least one label or
/// requirement.
pub const NODE_SELECTOR_RULE: &str = "has(self.nodeSelector) && \
    ((has(self.nodeSelector.matchLabels) && size(self.nodeSelector.matchLabels) > 0) || \
    (has(self.nodeSelector.matchExpressions) && size(self.nodeSelector.matchExpressions) > 0))";

/// Why an empty node selector is refused, and how to select every GPU node on purpose.
pub const EMPTY_NODE_SELECTOR: &str = "nodeSelector must name the nodes the policy governs: an empty \
    selector would select every node of the cluster. To govern every GPU node on purpose, select a \
    label they all carry, e.g. matchExpressions: [{key: nvidia.com/gpu.present, operator: Exists}]";

/// Parses a policy's node selector at `field` as [`parse`] does, and refuses an empty one: it
/// would select every node ([`EMPTY_NODE_SELECTOR`]).
pub fn parse_nodes(field: &str, selector: &LabelSelector) -> Result<Selector, InvalidSelector> {
    let labels = selector.match_labels.as_ref().map_or(0, BTreeMap::len);
    let expressions = selector.match_expressions.as_ref().map_or(0, Vec::len);
    if labels == 0 && expressions == 0 {
        return Err(invalid(field.to_string(), EMPTY_NODE_SELECTOR));
    }
    parse(field, selector)
}

/// Parses a policy's selector at `field` (e.g. `spec.nodeSelector`) exactly as strictly as the
/// API server validates it. An error names the offending field; the caller must then select
/// nothing (never "no selector, so everything").
pub fn parse(field: &str, selector: &LabelSelector) -> Result<Selector, InvalidSelector> {
    let labels = selector
        .match_labels
        .as_ref()
        .map(BTreeMap::iter)
        .into_iter()
        .flatten();
    let mut out = Selector::default();
    if selector
        .match_labels
        .as_ref()
        .is_some_and(|m| m.len() > MAX_ITEMS)
    {
        return Err(invalid(
            format!("{field}.matchLabels"),
            format!("at most {MAX_ITEMS} labels"),
        ));
    }
    for (k, v) in labels {
        if !key_ok(k) {
            return Err(invalid(
                format!("{field}.matchLabels"),
                format!("key {k:?} {KEY_HINT}"),
            ));
        }
        if !value_ok(v) {
            return Err(invalid(
                format!("{field}.matchLabels"),
                format!("the value {v:?} of {k:?} {VALUE_HINT}"),
            ));
        }
        out.extend([Expression::Equal(k.clone(), v.clone())]);
    }
    let exprs = selector.match_expressions.as_deref().unwrap_or_default();
    if exprs.len() > MAX_ITEMS {
        return Err(invalid(
            format!("{field}.matchExpressions"),
            format!("at most {MAX_ITEMS} requirements"),
        ));
    }
    for (i, r) in exprs.iter().enumerate() {
        out.extend([requirement(format!("{field}.matchExpressions[{i}]"), r)?]);
    }
    Ok(out)
}

fn key_prefix_rule(var: &str) -> String {
    format!("!{var}.contains('/') || {var}.indexOf('/') <= {MAX_KEY_PREFIX}")
}

/// The schema of a `LabelSelector` field, with the CEL rules that make the API server refuse
/// what Kubernetes refuses for its own selectors (`schemars(schema_with = ...)`).
pub fn schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let key_rule = format!(
        "self.key.matches('{LABEL_KEY_RE}') && ({})",
        key_prefix_rule("self.key")
    );
    schemars::json_schema!({
        "type": "object",
        "description": "A label selector: matchLabels and matchExpressions are ANDed.",
        "properties": {
            "matchLabels": {
                "type": "object",
                "description": "Labels that must be present with these values.",
                "maxProperties": MAX_ITEMS,
                "additionalProperties": {
                    "type": "string",
                    "maxLength": MAX_NAME,
                    "x-kubernetes-validations": [{
                        "rule": format!("self.matches('{LABEL_VALUE_RE}')"),
                        "message": format!("every matchLabels value {VALUE_HINT}"),
                    }],
                },
                "x-kubernetes-validations": [{
                    "rule": format!("self.all(k, k.matches('{LABEL_KEY_RE}') && ({}))", key_prefix_rule("k")),
                    "message": format!("every matchLabels key {KEY_HINT}"),
                }],
            },
            "matchExpressions": {
                "type": "array",
                "description": "Requirements on labels, each a key, an operator (In, NotIn, Exists, DoesNotExist) and values (non-empty for In and NotIn, empty for Exists and DoesNotExist).",
                "maxItems": MAX_ITEMS,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {
                            "type": "string",
                            "description": "The label key the requirement applies to.",
                            "maxLength": MAX_KEY_PREFIX + 1 + MAX_NAME,
                        },
                        "operator": {
                            "type": "string",
                            "description": "In, NotIn, Exists or DoesNotExist.",
                            "maxLength": 16,
                        },
                        "values": {
                            "type": "array",
                            "description": "Label values: non-empty for In and NotIn, empty for Exists and DoesNotExist.",
                            "maxItems": MAX_ITEMS,
                            "items": {
                                "type": "string",
                                "maxLength": MAX_NAME,
                                "x-kubernetes-validations": [{
                                    "rule": format!("self.matches('{LABEL_VALUE_RE}')"),
                                    "message": VALUE_HINT,
                                }],
                            },
                        },
                    },
                    "x-kubernetes-validations": [
                        {
                            "rule": key_rule,
                            "message": KEY_HINT,
                            "fieldPath": ".key",
                        },
                        {
                            "rule": "self.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist']",
                            "message": "operator must be one of In, NotIn, Exists, DoesNotExist",
                            "fieldPath": ".operator",
                        },
                        {
                            "rule": "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
                            "message": "values must be non-empty when operator is In or NotIn",
                            "fieldPath": ".values",
                        },
                        {
                            "rule": "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
                            "message": "values must be empty when operator is Exists or DoesNotExist",
                            "fieldPath": ".values",
                        },
                    ],
                },
            },
        },
    })
}

/// [`schema`] for an optional selector.
pub fn optional_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = schema(generator);
    s.insert("nullable".into(), true.into());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_empty_node_selector_is_refused_and_a_pod_selector_may_be_empty() {
        let empty = LabelSelector::default();
        let e = parse_nodes("spec.nodeSelector", &empty).unwrap_err();
        assert_eq!(e.field, "spec.nodeSelector");
        assert!(e.reason.contains("would select every node"), "{e}");
        let none = LabelSelector {
            match_labels: Some(BTreeMap::new()),
            match_expressions: Some(Vec::new()),
        };
        assert!(parse_nodes("spec.nodeSelector", &none).is_err());
        assert!(parse("spec.disruption.drain.podSelector", &empty).is_ok());
        let pool = LabelSelector {
            match_labels: Some(BTreeMap::from([("pool".to_string(), "a".to_string())])),
            ..LabelSelector::default()
        };
        assert!(parse_nodes("spec.nodeSelector", &pool).is_ok());
    }

    fn req(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: values.map(|vs| vs.iter().map(|v| v.to_string()).collect()),
            }]),
            match_labels: None,
        }
    }

    fn field_of(s: &LabelSelector) -> Option<String> {
        parse("spec.nodeSelector", s).err().map(|e| e.field)
    }

    #[test]
    fn kubernetes_invalid_forms_are_refused_at_their_field() {
        let at = |f: &str| Some(format!("spec.nodeSelector.matchExpressions[0].{f}"));
        assert_eq!(field_of(&req("app", "Bogus", Some(&["x"]))), at("operator"));
        assert_eq!(field_of(&req("app", "In", None)), at("values"));
        assert_eq!(field_of(&req("app", "NotIn", Some(&[]))), at("values"));
        assert_eq!(field_of(&req("app", "Exists", Some(&["x"]))), at("values"));
        assert_eq!(field_of(&req("app", "DoesNotExist", Some(&["x"]))), at("values"));
        assert_eq!(field_of(&req("bad key", "Exists", None)), at("key"));
        assert_eq!(field_of(&req("app", "In", Some(&["has space"]))), at("values[0]"));
        let labels = LabelSelector {
            match_labels: Some(BTreeMap::from([("a/b/c".to_string(), "x".to_string())])),
            match_expressions: None,
        };
        assert_eq!(field_of(&labels), Some("spec.nodeSelector.matchLabels".into()));
    }

    #[test]
    fn valid_twins_parse() {
        for s in [
            req("app", "In", Some(&["x"])),
            req("app", "NotIn", Some(&["x", "y"])),
            req("nvidia.com/gpu.product", "Exists", None),
            req("app", "DoesNotExist", Some(&[])),
            LabelSelector::default(),
        ] {
            assert_eq!(field_of(&s), None, "{s:?}");
        }
    }

    #[test]
    fn the_message_names_the_operator() {
        let e = parse("spec.nodeSelector", &req("app", "Bogus", Some(&["x"]))).err();
        assert_eq!(
            e.map(|e| e.to_string()).as_deref(),
            Some(
                "spec.nodeSelector.matchExpressions[0].operator: operator \"Bogus\" is not one of In, NotIn, Exists, DoesNotExist"
            )
        );
    }

    fn key_regex_ok(key: &str) -> bool {
        let re = regex_lite::Regex::new(LABEL_KEY_RE).unwrap();
        re.is_match(key) && key.find('/').is_none_or(|i| i <= MAX_KEY_PREFIX)
    }

    proptest! {
        // The CEL rules (regexes) and the parser agree on every key and value.
        #[test]
        fn cel_patterns_and_parser_agree(
            key in "([a-z0-9.-]{0,6}/)?[A-Za-z0-9_./ -]{0,8}",
            value in "[A-Za-z0-9_. -]{0,8}",
        ) {
            let value_re = regex_lite::Regex::new(LABEL_VALUE_RE).unwrap();
            prop_assert_eq!(key_ok(&key), key_regex_ok(&key), "key {:?}", key);
            prop_assert_eq!(value_ok(&value), value_re.is_match(&value), "value {:?}", value);
        }
    }

    #[test]
    fn lengths_match_the_patterns() {
        let long = "a".repeat(MAX_NAME);
        assert!(key_ok(&long) && key_regex_ok(&long));
        let longer = "a".repeat(MAX_NAME + 1);
        assert!(!key_ok(&longer) && !key_regex_ok(&longer));
        let prefix = format!("{}/x", "a".repeat(MAX_KEY_PREFIX));
        assert!(key_ok(&prefix) && key_regex_ok(&prefix));
        let prefix = format!("{}/x", "a".repeat(MAX_KEY_PREFIX + 1));
        assert!(!key_ok(&prefix) && !key_regex_ok(&prefix));
    }
}
