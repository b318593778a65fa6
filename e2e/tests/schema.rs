//! Examples and invalid-policy fixtures checked against the generated CRD schema, without an API
//! server: OpenAPI constraints with a JSON-schema validator, CEL rules with kube's CEL engine.
//! The same fixtures go to a real API server in the control-plane smoke tests.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpunode_crds::{GpuNodePolicy, generate};
use gpunode_e2e::fixtures;
use gpunode_operator::check::dotted;
use serde_json::Value;

/// The openAPIV3Schema of the GpuNodePolicy CRD as generated.
fn policy_schema() -> Value {
    let crds = generate::crds();
    let crd = crds
        .iter()
        .map(|(_, crd)| crd)
        .find(|crd| crd.spec.names.kind == "GpuNodePolicy")
        .expect("no GpuNodePolicy CRD generated");
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("GpuNodePolicy CRD has no schema");
    serde_json::to_value(schema).expect("schema to JSON")
}

/// One rejection: the path it names (dotted, as the API server prints it) and the message.
#[derive(Debug)]
struct Rejection {
    path: String,
    message: String,
    cel: bool,
}

fn rejections(schema: &Value, object: &Value) -> Vec<Rejection> {
    let validator = jsonschema::validator_for(schema).expect("schema does not compile");
    let mut out: Vec<Rejection> = validator
        .iter_errors(object)
        .map(|e| Rejection {
            path: dotted(e.instance_path().as_str()),
            message: e.to_string(),
            cel: false,
        })
        .collect();
    if let Err(errors) = kube::core::cel::Validator::new().validate(schema, object, None) {
        out.extend(errors.iter().map(|e| Rejection {
            path: e.field_path.clone(),
            message: e.message.clone(),
            cel: true,
        }));
    }
    out
}

#[test]
fn examples_are_valid_policies() {
    let schema = policy_schema();
    let examples = fixtures::examples().unwrap();
    assert!(
        examples.len() >= 3,
        "examples/ should hold at least three policies"
    );
    for example in examples {
        let policy: GpuNodePolicy = serde_json::from_value(example.value.clone())
            .unwrap_or_else(|e| panic!("{}: does not deserialize: {e}", example.path.display()));
        assert_eq!(policy.metadata.name.as_deref().map(str::is_empty), Some(false));
        let found = rejections(&schema, &example.value);
        assert!(
            found.is_empty(),
            "{} is rejected by the schema: {found:#?}",
            example.path.display()
        );
    }
}

#[test]
fn valid_twins_are_accepted() {
    let schema = policy_schema();
    let twins = fixtures::valid_policies().unwrap();
    assert!(!twins.is_empty(), "e2e/fixtures/valid-policies is empty");
    for twin in twins {
        let found = rejections(&schema, &twin.value);
        assert!(
            found.is_empty(),
            "{} is rejected: {found:#?}",
            twin.path.display()
        );
        let policy: GpuNodePolicy = serde_json::from_value(twin.value.clone())
            .unwrap_or_else(|e| panic!("{}: does not deserialize: {e}", twin.path.display()));
        // What the API server accepts, the operator can use.
        let node = gpunode_crds::selector::parse_nodes("spec.nodeSelector", &policy.spec.node_selector);
        assert!(node.is_ok(), "{}: {node:?}", twin.path.display());
        if let Some(pods) = &policy.spec.disruption.drain.pod_selector {
            let pods = gpunode_crds::selector::parse("spec.disruption.drain.podSelector", pods);
            assert!(pods.is_ok(), "{}: {pods:?}", twin.path.display());
        }
    }
}

/// What the API server refuses in a selector, the operator refuses too, at the same field.
#[test]
fn invalid_selectors_are_refused_by_the_operator_at_the_same_field() {
    let mut seen = 0;
    for f in fixtures::invalid_policies().unwrap() {
        let Ok(policy) = serde_json::from_value::<GpuNodePolicy>(f.manifest.value.clone()) else {
            continue;
        };
        let (field, selector) = if f.field.starts_with("spec.nodeSelector") {
            ("spec.nodeSelector", &policy.spec.node_selector)
        } else if f.field.starts_with("spec.disruption.drain.podSelector") {
            match &policy.spec.disruption.drain.pod_selector {
                Some(s) => ("spec.disruption.drain.podSelector", s),
                None => continue,
            }
        } else {
            continue;
        };
        seen += 1;
        let parsed = if field == "spec.nodeSelector" {
            gpunode_crds::selector::parse_nodes(field, selector)
        } else {
            gpunode_crds::selector::parse(field, selector)
        };
        match parsed {
            Ok(_) => panic!("{}: the operator would use this selector", f.manifest.name),
            Err(e) => assert!(
                f.field.starts_with(&e.field),
                "{}: refused at {}, the API server at {}",
                f.manifest.name,
                e.field,
                f.field
            ),
        }
    }
    assert!(seen >= 9, "expected the selector fixtures, saw {seen}");
}

#[test]
fn invalid_policies_are_rejected_at_the_named_field() {
    let schema = policy_schema();
    let fixtures = fixtures::invalid_policies().unwrap();
    assert!(
        fixtures.len() >= 10,
        "expected the invalid-policy fixtures, found {}",
        fixtures.len()
    );
    for f in fixtures {
        let found = rejections(&schema, &f.manifest.value);
        let at_field: Vec<&Rejection> = found
            .iter()
            .filter(|r| r.path == f.field || f.field.starts_with(&r.path) || r.path.starts_with(&f.field))
            .filter(|r| !r.path.is_empty())
            .collect();
        assert!(
            !at_field.is_empty(),
            "{} ({}) should be rejected at {}, got {found:#?}",
            f.manifest.name,
            f.rule,
            f.field
        );
        // CEL messages are ours, word for word what the API server will print.
        if at_field.iter().any(|r| r.cel) {
            assert!(
                at_field.iter().any(|r| r.cel && r.message.contains(&f.expect)),
                "{}: CEL message should contain {:?}, got {at_field:#?}",
                f.manifest.name,
                f.expect
            );
        }
        // The operator can never be handed such a policy: typed deserialization refuses it too,
        // except for rules only CEL can see (cross-field and minimum-duration checks).
    }
}

#[test]
fn defaults_make_a_spec_with_only_a_node_selector_valid() {
    let schema = policy_schema();
    let minimal = serde_json::json!({
        "apiVersion": "gpunode.dev/v1alpha1",
        "kind": "GpuNodePolicy",
        "metadata": {"name": "minimal"},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "a"}}}
    });
    let found = rejections(&schema, &minimal);
    assert!(found.is_empty(), "{found:#?}");
    let policy: GpuNodePolicy = serde_json::from_value(minimal).unwrap();
    assert_eq!(policy.spec.stale_after.to_string(), "3m");
    assert_eq!(policy.spec.recovery.healthy_for.to_string(), "5m");
    assert_eq!(policy.spec.disruption.max_unavailable.to_string(), "1");
}

/// No selector, or an empty one, would select every node: refused at `spec.nodeSelector`, with
/// the way to select every GPU node on purpose.
#[test]
fn an_empty_or_missing_node_selector_is_refused() {
    let schema = policy_schema();
    for spec in [
        serde_json::json!({}),
        serde_json::json!({"nodeSelector": {}}),
        serde_json::json!({"nodeSelector": {"matchLabels": {}, "matchExpressions": []}}),
    ] {
        let policy = serde_json::json!({
            "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodePolicy",
            "metadata": {"name": "everything"}, "spec": spec,
        });
        let found = rejections(&schema, &policy);
        assert!(
            found.iter().any(|r| r.cel
                && r.path == "spec.nodeSelector"
                && r.message.contains("nvidia.com/gpu.present")),
            "{spec}: {found:#?}"
        );
    }
}
