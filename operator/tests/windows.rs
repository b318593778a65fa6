//! Maintenance windows (`spec.maintenance`) in the planner, with time injected: a disruptive
//! action outside every window waits and says until when, acts when the window opens; an urgent
//! class acts at once; labels, the condition and undoing are never held back; a time zone the
//! operator does not know keeps every window closed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use gpunode_operator::{
    plan::{Action, Block, ChangeCause, NodeView, plan, windows::WindowState},
    verdict::{NodeState, Verdict},
};
use jiff::Timestamp;

mod support;
use support::{node_drift as drifted, of, step};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// Saturday and Sunday nights 22:00–06:00 in Berlin; Xid is urgent. Driver and Xid drain.
fn policy(time_zone: &str) -> GpuNodePolicySpec {
    serde_yaml::from_str(&format!(
        r#"
remediation:
  - {{classes: [Driver, Xid], action: Drain}}
disruption:
  maxUnavailable: 1
  circuitBreaker: {{maxDriftedPercent: 100}}
recovery: {{healthyFor: 60s}}
maintenance:
  windows:
    - {{days: [Sat, Sun], start: "22:00", end: "06:00", timeZone: {time_zone}}}
  urgentClasses: [Xid]
"#
    ))
    .unwrap()
}

/// Wednesday 2026-12-02 12:00 UTC; the next window opens Saturday 2026-12-05 22:00 CET.
const WEDNESDAY: &str = "2026-12-02T12:00:00Z";
const OPENS: &str = "2026-12-05T21:00:00Z";

#[test]
fn a_drift_outside_the_window_waits_says_until_when_and_acts_when_it_opens() {
    let policy = policy("Europe/Berlin");
    let mut nodes = vec![NodeView::new("gpu-1", drifted(DriftClass::Driver))];
    let p = step(&policy, &mut nodes, ts(WEDNESDAY));
    let np = of(&p, "gpu-1");
    assert_eq!(np.state, NodeState::Drifted, "the verdict and labels never wait");
    assert!(np.write);
    assert_eq!(np.cordon, None, "not cordoned outside the window");
    assert_eq!(np.pending, [Action::Cordon, Action::Drain]);
    assert_eq!(np.blocked, Some(Block::OutsideWindow { opens: ts(OPENS) }));
    assert!(
        np.condition.message.ends_with(
            "waiting for the maintenance window that opens at 2026-12-05T21:00:00Z: Cordon, Drain"
        ),
        "{}",
        np.condition.message
    );
    assert_eq!(
        np.next_change.map(|c| (c.at, c.cause)),
        Some((ts(OPENS), ChangeCause::WindowOpens)),
        "planned again when the window opens"
    );
    assert_eq!(p.window, WindowState::Closed { opens: ts(OPENS) });

    // The window opens: the node is cordoned and drained.
    let p = step(&policy, &mut nodes, ts(OPENS));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, Some(true));
    assert!(np.pending.is_empty());
    assert_eq!(np.blocked, None);
    assert_eq!(p.window, WindowState::Open);
}

#[test]
fn an_urgent_class_acts_at_once_outside_the_window() {
    let policy = policy("Europe/Berlin");
    let mut nodes = vec![NodeView::new("gpu-1", drifted(DriftClass::Xid))];
    let p = step(&policy, &mut nodes, ts(WEDNESDAY));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, Some(true));
    assert_eq!(np.blocked, None);
}

#[test]
fn undoing_never_waits_for_a_window() {
    let policy = policy("Europe/Berlin");
    let mut nodes = vec![NodeView::new("gpu-1", drifted(DriftClass::Driver))];
    // Cordoned within Saturday night's window.
    step(&policy, &mut nodes, ts(OPENS));
    assert!(nodes[0].unschedulable);
    // Recovered on Monday, outside any window: uncordoned after healthyFor all the same.
    nodes[0].verdict = Verdict::new(Vec::new(), Vec::new());
    step(&policy, &mut nodes, ts("2026-12-07T10:00:00Z"));
    let p = step(&policy, &mut nodes, ts("2026-12-07T10:01:01Z"));
    assert_eq!(of(&p, "gpu-1").cordon, Some(false));
}

#[test]
fn a_disruption_taken_in_a_window_is_kept_when_it_closes() {
    let policy = policy("Europe/Berlin");
    let mut nodes = vec![NodeView::new("gpu-1", drifted(DriftClass::Driver))];
    step(&policy, &mut nodes, ts(OPENS));
    let p = step(&policy, &mut nodes, ts("2026-12-07T10:00:00Z"));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, None, "still cordoned, nothing to write");
    assert!(nodes[0].unschedulable);
    assert!(np.actions.contains(&Action::Drain));
}

#[test]
fn an_unknown_time_zone_keeps_every_window_closed() {
    let policy = policy("Europe/Atlantis");
    let nodes = vec![NodeView::new("gpu-1", drifted(DriftClass::Driver))];
    // Saturday 23:00 in Berlin: inside the window had the zone been known.
    let p = plan("p", &policy, &nodes, ts("2026-12-05T22:00:00Z"));
    let np = of(&p, "gpu-1");
    assert_eq!(np.cordon, None);
    assert!(
        matches!(&np.blocked, Some(Block::InvalidWindow(why)) if why.contains("spec.maintenance.windows[0]: timeZone \"Europe/Atlantis\"")),
        "{:?}",
        np.blocked
    );
    assert!(matches!(p.window, WindowState::Invalid(_)));
}

#[test]
fn a_node_with_nothing_waiting_is_not_planned_again_for_a_window() {
    let policy = policy("Europe/Berlin");
    let nodes = vec![NodeView::new("gpu-1", Verdict::new(Vec::new(), Vec::new()))];
    let p = plan("p", &policy, &nodes, ts(WEDNESDAY));
    assert_eq!(of(&p, "gpu-1").next_change, None);
}
