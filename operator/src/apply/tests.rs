//! The writer's pure decisions: which pods a drain evicts, and what taints/cordon write a node
//! needs. Fixtures are the JSON the API server would return, kept to the fields that matter.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use gpunode_crds::policy::{DrainPolicy, TaintEffect};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::*;
use crate::{
    markers::{ClassTrack, Markers},
    plan::{InEffect, NodeCondition, NodePlan, RepairInEffect, RepairPlan},
    reasons::Reason,
    verdict::NodeState,
};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// When the fixtures' existing taints were added.
const EARLIER: &str = "2026-11-29T09:00:00Z";
/// The `now` of every write.
const NOW: &str = "2026-11-29T12:00:00Z";

fn pod(v: Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

fn node(v: Value) -> Node {
    serde_json::from_value(v).unwrap()
}

/// A running pod `ns/name` with these labels, no volumes, no owner.
fn running(ns: &str, name: &str) -> Value {
    json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"app": name}},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    })
}

/// `ns/name` of the pods a drain pass with `policy` evicts.
fn evicted(pods: &[Pod], policy: &DrainPolicy) -> Vec<String> {
    names(to_evict(pods, policy).unwrap())
}

/// A NoExecute quarantine of GPU `gpu` on a device-plugin node whose report, observed at
/// `seen`, lists `holders` (`ns/name`) on it.
fn holding(gpu: &str, holders: &[&str], seen: Option<&str>) -> crate::plan::Quarantine {
    use crate::plan::{GpuTaint, PodRef, Quarantine, QuarantineTarget};
    Quarantine {
        taint: GpuTaint {
            gpu: gpu.to_string(),
            index: 5,
            effect: TaintEffect::NoExecute,
        },
        target: QuarantineTarget::DevicePlugin {
            evict: holders
                .iter()
                .map(|h| {
                    let (ns, name) = h.split_once('/').unwrap();
                    PodRef {
                        namespace: ns.to_string(),
                        name: name.to_string(),
                    }
                })
                .collect(),
            observed_at: seen.map(ts),
        },
    }
}

/// `ns/name` of each pod.
fn names(pods: Vec<&Pod>) -> Vec<String> {
    pods.into_iter()
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap(),
                p.metadata.name.as_deref().unwrap()
            )
        })
        .collect()
}

#[test]
fn a_gpu_quarantine_evicts_only_the_pods_the_report_lists_on_that_gpu() {
    let pods = [
        pod(running("ml", "on-gpu-5")),
        pod(running("ml", "on-gpu-3")),
        pod(running("ml", "also-on-5")),
    ];
    let q = [holding(
        "GPU-5",
        &["ml/on-gpu-5", "ml/also-on-5", "ml/gone"],
        None,
    )];
    let got = gpu_holders_to_evict(&pods, &q, &DrainPolicy::default()).unwrap();
    assert_eq!(
        names(got),
        ["ml/on-gpu-5", "ml/also-on-5"],
        "never the pod on gpu 3"
    );
}

#[test]
fn a_pod_created_after_the_probe_looked_is_not_the_one_that_held_the_gpu() {
    let mut recreated = running("ml", "trainer-0");
    recreated["metadata"]["creationTimestamp"] = json!("2026-11-29T12:00:05Z");
    let mut old = running("ml", "trainer-1");
    old["metadata"]["creationTimestamp"] = json!("2026-11-29T11:00:00Z");
    let pods = [pod(recreated), pod(old)];
    let q = [holding(
        "GPU-5",
        &["ml/trainer-0", "ml/trainer-1"],
        Some("2026-11-29T12:00:00Z"),
    )];
    let got = gpu_holders_to_evict(&pods, &q, &DrainPolicy::default()).unwrap();
    assert_eq!(names(got), ["ml/trainer-1"]);
}

#[test]
fn a_gpu_quarantine_keeps_the_drains_rules() {
    let mut ds = running("ml", "exporter");
    ds["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "u", "controller": true}]);
    let pods = [
        pod(ds),
        pod(running("kube-system", "sys")),
        pod(running("ml", "job")),
    ];
    let policy = DrainPolicy {
        protected_namespaces: vec!["kube-system".to_string()],
        ..DrainPolicy::default()
    };
    let q = [holding(
        "GPU-5",
        &["ml/exporter", "kube-system/sys", "ml/job"],
        None,
    )];
    assert_eq!(
        names(gpu_holders_to_evict(&pods, &q, &policy).unwrap()),
        ["ml/job"]
    );
    // An unusable pod selector evicts nothing.
    let bad = selector(json!({"matchExpressions": [{"key": "app", "operator": "Bogus", "values": ["x"]}]}));
    assert!(gpu_holders_to_evict(&pods, &q, &bad).is_err());
}

fn selector(v: Value) -> DrainPolicy {
    DrainPolicy {
        pod_selector: Some(serde_json::from_value(v).unwrap()),
        ..DrainPolicy::default()
    }
}

#[test]
fn a_plain_running_pod_is_evicted() {
    let pods = [pod(running("default", "web"))];
    assert_eq!(evicted(&pods, &DrainPolicy::default()), ["default/web"]);
}

#[test]
fn daemonset_pods_are_skipped_only_when_the_daemonset_is_their_controller() {
    let mut controlled = running("default", "ds-controlled");
    controlled["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u1", "controller": true,
    }]);
    // A DaemonSet that merely owns the pod (not its controller) does not recreate it on the
    // node: the pod is evicted like any other.
    let mut owned = running("default", "ds-owned");
    owned["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u1",
    }]);
    let mut replica = running("default", "rs-controlled");
    replica["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u2", "controller": true,
    }]);
    let pods = [pod(controlled), pod(owned), pod(replica)];
    assert_eq!(
        evicted(&pods, &DrainPolicy::default()),
        ["default/ds-owned", "default/rs-controlled"]
    );
}

#[test]
fn mirror_pods_are_skipped() {
    let mut mirror = running("default", "static");
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    let pods = [pod(mirror), pod(running("default", "web"))];
    assert_eq!(evicted(&pods, &DrainPolicy::default()), ["default/web"]);
}

#[test]
fn terminating_and_finished_pods_are_skipped() {
    let mut terminating = running("default", "terminating");
    terminating["metadata"]["deletionTimestamp"] = json!(EARLIER);
    let mut succeeded = running("default", "succeeded");
    succeeded["status"]["phase"] = json!("Succeeded");
    let mut failed = running("default", "failed");
    failed["status"]["phase"] = json!("Failed");
    let mut pending = running("default", "pending");
    pending["status"]["phase"] = json!("Pending");
    let pods = [pod(terminating), pod(succeeded), pod(failed), pod(pending)];
    assert_eq!(evicted(&pods, &DrainPolicy::default()), ["default/pending"]);
}

#[test]
fn protected_namespaces_are_skipped() {
    let pods = [
        pod(running("kube-system", "dns")),
        pod(running("monitoring", "exporter")),
        pod(running("default", "web")),
    ];
    assert_eq!(
        evicted(&pods, &DrainPolicy::default()),
        ["monitoring/exporter", "default/web"],
        "kube-system is protected by default"
    );
    let policy = DrainPolicy {
        protected_namespaces: vec!["monitoring".to_string()],
        ..DrainPolicy::default()
    };
    assert_eq!(
        evicted(&pods, &policy),
        ["kube-system/dns", "default/web"],
        "the policy's list replaces the default"
    );
}

#[test]
fn empty_dir_pods_are_evicted_only_with_delete_empty_dir_data() {
    let mut scratch = running("default", "scratch");
    scratch["spec"]["volumes"] = json!([{"name": "tmp", "emptyDir": {}}]);
    let mut config = running("default", "config");
    config["spec"]["volumes"] = json!([{"name": "cfg", "configMap": {"name": "cfg"}}]);
    let pods = [pod(scratch), pod(config)];
    assert_eq!(evicted(&pods, &DrainPolicy::default()), ["default/config"]);
    let policy = DrainPolicy {
        delete_empty_dir_data: true,
        ..DrainPolicy::default()
    };
    assert_eq!(evicted(&pods, &policy), ["default/scratch", "default/config"]);
}

#[test]
fn a_pod_selector_limits_the_drain_to_matching_pods() {
    let pods = [
        pod(running("default", "train")),
        pod(running("default", "web")),
        pod(json!({"metadata": {"namespace": "default", "name": "unlabelled"}})),
    ];
    let policy = selector(json!({"matchLabels": {"app": "train"}}));
    assert_eq!(evicted(&pods, &policy), ["default/train"]);
    let policy =
        selector(json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["train"]}]}));
    assert_eq!(evicted(&pods, &policy), ["default/web", "default/unlabelled"]);
    let policy = selector(json!({"matchLabels": {"app": "nothing-like-this"}}));
    assert_eq!(evicted(&pods, &policy), Vec::<String>::new());
}

#[test]
fn an_unusable_pod_selector_evicts_nothing() {
    let pods = [pod(running("default", "web"))];
    let policy =
        selector(json!({"matchExpressions": [{"key": "app", "operator": "Bogus", "values": ["x"]}]}));
    let err = to_evict(&pods, &policy).expect_err("an unusable selector is an error");
    assert!(err.to_string().contains("Bogus"), "{err}");
    // Never "no selector, so everything".
    assert_eq!(PodSelection::of(&policy).ok(), None);
}

// --- taints and cordon -------------------------------------------------------------------

fn ours(effect: TaintEffect, value: &str) -> DriftTaint {
    DriftTaint {
        effect,
        value: value.to_string(),
    }
}

fn desired(taints: &[DriftTaint]) -> BTreeSet<DriftTaint> {
    taints.iter().cloned().collect()
}

/// A node with these taints (as JSON), `spec.unschedulable` and, if `marker`, gpunode's cordon
/// annotation.
fn tainted(taints: Value, unschedulable: bool, marker: bool) -> Node {
    let mut n = json!({
        "metadata": {"name": "gpu-1", "resourceVersion": "7"},
        "spec": {"taints": taints, "unschedulable": unschedulable},
    });
    if marker {
        n["metadata"]["annotations"] = json!({"gpunode.dev/cordoned": "true"});
    }
    node(n)
}

/// The taint list of a change, as JSON (what goes on the wire).
fn taints_of(c: &SpecChange) -> Value {
    serde_json::to_value(&c.taints).unwrap()
}

#[test]
fn other_owners_taints_are_kept_in_order_and_ours_are_replaced() {
    let node = tainted(
        json!([
            {"key": "example.com/maintenance", "effect": "NoExecute", "timeAdded": EARLIER},
            {"key": "gpunode.dev/drift", "value": "throttle", "effect": "PreferNoSchedule", "timeAdded": EARLIER},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "gpunode.dev/drift", "value": "thermal", "effect": "NoSchedule", "timeAdded": EARLIER},
        ]),
        false,
        false,
    );
    let want = desired(&[
        ours(TaintEffect::NoSchedule, "thermal"),
        ours(TaintEffect::NoExecute, "xid"),
    ]);
    let change = spec_change(&want, None, false, &node, ts(NOW)).expect("a change");
    assert_eq!(
        taints_of(&change),
        json!([
            {"key": "example.com/maintenance", "effect": "NoExecute", "timeAdded": EARLIER},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "gpunode.dev/drift", "value": "thermal", "effect": "NoSchedule", "timeAdded": EARLIER},
            {"key": "gpunode.dev/drift", "value": "xid", "effect": "NoExecute", "timeAdded": NOW},
        ]),
        "others untouched and in order; our unchanged taint keeps its timeAdded; \
         the one not desired is gone; the new one is added now"
    );
    assert!(!change.unschedulable);
    assert_eq!(change.marker, None);
}

#[test]
fn removing_all_our_taints_leaves_the_others() {
    let node = tainted(
        json!([
            {"key": "gpunode.dev/drift", "value": "thermal", "effect": "NoSchedule", "timeAdded": EARLIER},
            {"key": "example.com/maintenance", "effect": "NoExecute"},
        ]),
        false,
        false,
    );
    let change = spec_change(&BTreeSet::new(), None, false, &node, ts(NOW)).expect("a change");
    assert_eq!(
        taints_of(&change),
        json!([{"key": "example.com/maintenance", "effect": "NoExecute"}])
    );
}

#[test]
fn nothing_changes_when_the_node_is_as_planned() {
    let node = tainted(
        json!([
            {"key": "example.com/maintenance", "effect": "NoExecute"},
            {"key": "gpunode.dev/drift", "value": "thermal", "effect": "NoSchedule", "timeAdded": EARLIER},
        ]),
        true,
        true,
    );
    let want = desired(&[ours(TaintEffect::NoSchedule, "thermal")]);
    assert!(spec_change(&want, Some(true), true, &node, ts(NOW)).is_none());
    assert!(spec_change(&want, None, true, &node, ts(NOW)).is_none());
    let clean = tainted(json!([]), false, false);
    assert!(spec_change(&BTreeSet::new(), None, false, &clean, ts(NOW)).is_none());
    assert!(
        spec_change(&BTreeSet::new(), Some(false), false, &clean, ts(NOW)).is_none(),
        "uncordoning a schedulable node is nothing to do"
    );
}

#[test]
fn cordon_sets_unschedulable_and_the_marker_together() {
    let node = tainted(json!([]), false, false);
    let change = spec_change(&BTreeSet::new(), Some(true), false, &node, ts(NOW)).expect("a change");
    assert!(change.unschedulable);
    assert_eq!(change.marker, Some(true));
}

#[test]
fn someone_elses_cordon_is_not_claimed_nor_lifted() {
    let node = tainted(json!([]), true, false);
    assert!(
        spec_change(&BTreeSet::new(), Some(true), false, &node, ts(NOW)).is_none(),
        "a node cordoned by someone else is not marked as gpunode's"
    );
    assert!(
        spec_change(&BTreeSet::new(), Some(false), false, &node, ts(NOW)).is_none(),
        "gpunode never uncordons what it did not cordon"
    );
}

#[test]
fn uncordon_lifts_only_gpunodes_cordon_and_clears_the_marker() {
    let node = tainted(json!([]), true, true);
    let change = spec_change(&BTreeSet::new(), Some(false), true, &node, ts(NOW)).expect("a change");
    assert!(!change.unschedulable);
    assert_eq!(change.marker, Some(false));
}

#[test]
fn the_marker_is_cleared_when_a_person_lifted_gpunodes_cordon() {
    // The marker says gpunode cordoned, but the node is schedulable again: a person uncordoned
    // it. The marker goes; the node is not cordoned again by this write.
    let node = tainted(json!([]), false, true);
    let change = spec_change(&BTreeSet::new(), None, true, &node, ts(NOW)).expect("a change");
    assert!(!change.unschedulable);
    assert_eq!(change.marker, Some(false));
    assert_eq!(taints_of(&change), json!([]));
}

#[test]
fn the_marker_is_cleared_when_the_cordon_in_place_is_not_gpunodes() {
    // Unschedulable with the marker, but the planner says gpunode's cordon is not the one in
    // place (`ours: false`, e.g. a person uncordoned and cordoned again): the cordon stays, the
    // marker goes, so gpunode will never lift it.
    let node = tainted(json!([]), true, true);
    let change = spec_change(&BTreeSet::new(), None, false, &node, ts(NOW)).expect("a change");
    assert!(change.unschedulable);
    assert_eq!(change.marker, Some(false));
}

// --- needs_work --------------------------------------------------------------------------

/// A drifted plan: thermal taint, cordoned by gpunode, no drain, no events.
fn drifted_plan() -> NodePlan {
    NodePlan {
        node: "gpu-1".to_string(),
        write: true,
        defer_to: None,
        state: NodeState::Drifted,
        drifting: BTreeSet::from([gpunode_crds::DriftClass::Thermal]),
        markers: Markers {
            classes: BTreeMap::from([(
                gpunode_crds::DriftClass::Thermal,
                ClassTrack {
                    since: ts(EARLIER),
                    cleared_at: None,
                },
            )]),
            cordoned_by_us: true,
            ..Markers::default()
        },
        taints: desired(&[ours(TaintEffect::NoSchedule, "thermal")]),
        cordon: Some(true),
        drain: DrainStep::None,
        actions: Vec::new(),
        pending: Vec::new(),
        blocked: None,
        condition: NodeCondition {
            status: "False",
            reason: Reason::Drifted,
            message: "thermal drift".to_string(),
        },
        events: Vec::new(),
        since: Some(ts(EARLIER)),
        before: InEffect {
            actions: Vec::new(),
            tainted: true,
            cordoned: true,
            drain: DrainStep::None,
            repair: RepairInEffect::default(),
            validating: false,
        },
        next_change: None,
        quarantines: Vec::new(),
        forget_approval: false,
        escalation: None,
        healthy_gpus: None,
        repair: RepairPlan::default(),
        validation: Default::default(),
    }
}

/// The node exactly as `drifted_plan` wants it, written out by hand.
fn drifted_node() -> Value {
    json!({
        "metadata": {
            "name": "gpu-1",
            "resourceVersion": "7",
            "labels": {
                "kubernetes.io/hostname": "gpu-1",
                "gpunode.dev/policy": "p",
                "gpunode.dev/state": "drifted",
                "gpunode.dev/drift.thermal": "true",
            },
            "annotations": {
                "example.com/owner": "team-a",
                "gpunode.dev/classes": format!(r#"{{"Thermal":{{"since":"{EARLIER}"}}}}"#),
                "gpunode.dev/cordoned": "true",
            },
        },
        "spec": {
            "unschedulable": true,
            "taints": [
                {"key": "example.com/maintenance", "effect": "NoExecute"},
                {"key": "gpunode.dev/drift", "value": "thermal", "effect": "NoSchedule", "timeAdded": EARLIER},
            ],
        },
        "status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "GpuPolicyCompliant", "status": "False", "reason": "Drifted", "message": "thermal drift",
             "lastTransitionTime": EARLIER},
        ]},
    })
}

#[test]
fn a_node_already_as_planned_needs_no_work() {
    assert!(!Applier::needs_work("p", &drifted_plan(), &node(drifted_node())));
}

#[test]
fn any_difference_needs_work() {
    let plan = drifted_plan();
    let mut cases: Vec<(&str, Value)> = Vec::new();
    let mut n = drifted_node();
    n["metadata"]["labels"]["gpunode.dev/state"] = json!("compliant");
    cases.push(("state label", n));
    let mut n = drifted_node();
    n["metadata"]["labels"]["gpunode.dev/drift.xid"] = json!("true");
    cases.push(("a stale drift label", n));
    let mut n = drifted_node();
    n["metadata"]["annotations"]["gpunode.dev/drain-started"] = json!(EARLIER);
    cases.push(("a stale annotation", n));
    let mut n = drifted_node();
    n["spec"]["taints"][1]["value"] = json!("throttle");
    cases.push(("our taint", n));
    let mut n = drifted_node();
    n["spec"]["unschedulable"] = json!(false);
    cases.push(("the cordon", n));
    let mut n = drifted_node();
    n["status"]["conditions"][1]["message"] = json!("older message");
    cases.push(("the condition's message", n));
    let mut n = drifted_node();
    n["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    cases.push(("no condition", n));
    for (what, n) in cases {
        assert!(Applier::needs_work("p", &plan, &node(n)), "{what}");
    }
    assert!(
        Applier::needs_work("other-policy", &plan, &node(drifted_node())),
        "the policy label"
    );
    let mut drain = drifted_plan();
    drain.drain = DrainStep::Run {
        started: ts(EARLIER),
        stuck: false,
    };
    drain.markers.drain_started = Some(ts(EARLIER));
    let mut n = drifted_node();
    n["metadata"]["annotations"]["gpunode.dev/drain-started"] = json!(EARLIER);
    assert!(
        Applier::needs_work("p", &drain, &node(n)),
        "a running drain lists and evicts pods"
    );
    let mut event = drifted_plan();
    event.events.push(crate::plan::PlannedEvent {
        warning: false,
        reason: Reason::Cordoned,
        note: "cordoned".to_string(),
    });
    assert!(
        Applier::needs_work("p", &event, &node(drifted_node())),
        "an event"
    );
}

#[test]
fn a_plan_that_may_not_write_needs_no_work() {
    let mut plan = drifted_plan();
    plan.write = false;
    plan.drain = DrainStep::Run {
        started: ts(EARLIER),
        stuck: false,
    };
    let bare = node(json!({"metadata": {"name": "gpu-1"}}));
    assert!(
        Applier::needs_work("p", &drifted_plan(), &bare),
        "fixture: it would"
    );
    assert!(!Applier::needs_work("p", &plan, &bare));
}
