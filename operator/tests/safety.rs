//! Fail-closed rules, from fixtures and without a client: an unusable pod selector evicts
//! nothing, a policy with an unusable selector says so in its status, and only nodes that no
//! policy governs are released as unowned.

// clippy.toml allows unwrap and expect in #[test] fns only; this test crate's helper fns fail
// the same way (a panic naming what broke), so the allow covers the whole crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::Arc};

use gpunode_crds::{GpuNodePolicy, GpuNodePolicyStatus, policy::DrainPolicy, selector};
use gpunode_operator::{
    apply::{PodSelection, to_evict},
    observe::{Guarded, SelectorIndex},
    status, sweep,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::core::DeserializeGuard;

fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("fixture: {e}"))
}

fn pod(name: &str, labels: &[(&str, &str)]) -> Pod {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    yaml(&format!(
        "metadata: {{name: {name}, namespace: training, labels: {}}}\nspec: {{containers: []}}",
        serde_json::to_string(&labels).unwrap_or_default()
    ))
}

fn names(pods: &[&Pod]) -> Vec<String> {
    pods.iter().filter_map(|p| p.metadata.name.clone()).collect()
}

fn pods() -> Vec<Pod> {
    vec![
        pod("trainer", &[("app", "trainer")]),
        pod("notebook", &[("app", "notebook")]),
        pod("unlabelled", &[]),
    ]
}

#[test]
fn an_unparsable_pod_selector_evicts_nothing() {
    let pods = pods();
    for bad in [
        "podSelector: {matchExpressions: [{key: app, operator: Bogus, values: [x]}]}",
        "podSelector: {matchExpressions: [{key: app, operator: In}]}",
        "podSelector: {matchExpressions: [{key: app, operator: In, values: []}]}",
        "podSelector: {matchExpressions: [{key: app, operator: Exists, values: [x]}]}",
        "podSelector: {matchLabels: {'bad key': x}}",
    ] {
        let policy: DrainPolicy = yaml(bad);
        let err = to_evict(&pods, &policy).err();
        let field = err.map(|e| e.field).unwrap_or_default();
        assert!(
            field.starts_with("spec.disruption.drain.podSelector."),
            "{bad}: should evict nothing and name the field, got {field:?}"
        );
        assert!(PodSelection::of(&policy).is_err(), "{bad}");
    }
}

#[test]
fn a_valid_pod_selector_evicts_only_its_pods_and_none_evicts_all() {
    let pods = pods();
    let only: DrainPolicy =
        yaml("podSelector: {matchExpressions: [{key: app, operator: In, values: [trainer]}]}");
    let evicted = to_evict(&pods, &only).unwrap();
    assert_eq!(names(&evicted), ["trainer"]);
    let all = DrainPolicy::default();
    let evicted = to_evict(&pods, &all).unwrap();
    assert_eq!(names(&evicted), ["trainer", "notebook", "unlabelled"]);
}

#[test]
fn an_invalid_selector_makes_the_policy_degraded_naming_the_field() {
    let error = selector::InvalidSelector {
        field: "spec.nodeSelector.matchExpressions[0].operator".into(),
        reason: "operator \"Bogus\" is not one of In, NotIn, Exists, DoesNotExist".into(),
    };
    let old: GpuNodePolicyStatus = yaml(
        "matched: 3\ncompliant: 3\nconditions:\n- {type: Paused, status: 'False', reason: Active, message: m, lastTransitionTime: '2026-01-01T00:00:00Z'}",
    );
    let now = Timestamp::now();
    let s = status::invalid(&error, Some(4), Some(&old), now);
    assert_eq!((s.matched, s.compliant, s.drifted), (0, 0, 0));
    let get = |t: &str| {
        s.conditions
            .iter()
            .find(|c| c.type_ == t)
            .cloned()
            .unwrap_or_else(|| panic!("no {t} condition in {s:?}"))
    };
    let degraded = get("Degraded");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "InvalidSelector")
    );
    assert!(
        degraded
            .message
            .starts_with("spec.nodeSelector.matchExpressions[0].operator: operator \"Bogus\""),
        "{}",
        degraded.message
    );
    assert_eq!(get("Ready").status, "False");
    assert_eq!(get("Paused").reason, "Active", "other conditions are kept");
    assert_eq!(s.observed_generation, Some(4));
    // A second pass with the same error changes nothing, so no status is written again.
    let again = status::invalid(&error, Some(4), Some(&s), Timestamp::now());
    assert!(status::same_ignoring_time(&s, &again));
    assert_eq!(again.conditions, s.conditions, "transition times kept");
}

fn node(name: &str, extra: &str) -> Arc<Node> {
    Arc::new(yaml(&format!(
        "metadata: {{name: {name}, labels: {{pool: h100}}}}\n{extra}"
    )))
}

fn policy(name: &str, selector: &str) -> Arc<Guarded<GpuNodePolicy>> {
    let p: GpuNodePolicy = yaml(&format!(
        "apiVersion: gpunode.dev/v1alpha1\nkind: GpuNodePolicy\nmetadata: {{name: {name}}}\nspec: {{nodeSelector: {selector}}}"
    ));
    Arc::new(DeserializeGuard(Ok(p)))
}

fn unowned(nodes: &[Arc<Node>], policies: &[Arc<Guarded<GpuNodePolicy>>]) -> Option<Vec<String>> {
    sweep::unowned(nodes, &SelectorIndex::new(policies))
        .map(|ns| ns.iter().filter_map(|n| n.metadata.name.clone()).collect())
}

#[test]
fn only_marked_nodes_that_no_policy_governs_are_unowned() {
    let nodes = vec![
        node("clean", ""),
        node(
            "gone-policy",
            "metadata: {name: gone-policy, labels: {gpunode.dev/policy: gone, pool: h100}}",
        ),
        node(
            "taint-only",
            "spec: {taints: [{key: gpunode.dev/drift, value: xid, effect: NoSchedule}]}",
        ),
        node(
            "condition-only",
            "status: {conditions: [{type: GpuPolicyCompliant, status: 'False'}]}",
        ),
        node(
            "annotation-only",
            "metadata: {name: annotation-only, labels: {pool: h100}, annotations: {gpunode.dev/cordoned: 'true'}}",
        ),
        node(
            "live-policy",
            "metadata: {name: live-policy, labels: {gpunode.dev/policy: live, pool: h100}}",
        ),
    ];
    // `live` exists but selects none of these nodes (its own reconcile releases its nodes).
    let live = policy("live", "{matchLabels: {pool: a100}}");
    assert_eq!(
        unowned(&nodes, std::slice::from_ref(&live)),
        Some(
            ["gone-policy", "taint-only", "condition-only", "annotation-only"]
                .map(String::from)
                .to_vec()
        )
    );
    // A policy that selects them governs them: nothing is unowned.
    let all = policy("other", "{matchLabels: {pool: h100}}");
    assert_eq!(unowned(&nodes, &[live.clone(), all]), Some(vec![]));
    // A policy whose selector cannot be used selects nothing.
    let broken = policy("broken", "{matchExpressions: [{key: pool, operator: Bogus}]}");
    assert_eq!(unowned(&nodes, &[live.clone(), broken]).map(|v| v.len()), Some(4));
    // A policy that cannot be read might select any node: nothing is released.
    let unreadable: Arc<Guarded<GpuNodePolicy>> = Arc::new(yaml(
        "apiVersion: gpunode.dev/v1alpha1\nkind: GpuNodePolicy\nmetadata: {name: skewed}\nspec: {staleAfter: 12}",
    ));
    assert!(unreadable.0.is_err(), "fixture should not deserialize");
    assert_eq!(unowned(&nodes, &[live, unreadable]), None);
}
