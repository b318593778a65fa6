//! The apply-back loop the planner's tests share: plan, then write each plan onto the nodes the
//! way the operator's apply step does, so the next plan sees what the last one did.

use gpunode_crds::{DriftClass, GpuNodePolicySpec};
use gpunode_operator::{
    plan::{NodePlan, NodeView, PolicyPlan, plan},
    verdict::{Drift, Verdict},
};
use jiff::Timestamp;

/// Applies a plan to the nodes as the apply step would.
pub fn apply(nodes: &mut [NodeView], plan: &PolicyPlan) {
    for p in &plan.nodes {
        let Some(n) = nodes.iter_mut().find(|n| n.name == p.node) else {
            panic!("plan for unknown node {}", p.node)
        };
        if !p.write {
            continue;
        }
        n.taints = p.taints.clone();
        n.markers = p.markers.clone();
        if let Some(c) = p.cordon {
            n.unschedulable = c;
        }
        n.current_state = Some(p.state);
        n.current_reason = Some(p.condition.reason);
    }
}

/// Plans (as the policy named "first") and applies once.
pub fn step(policy: &GpuNodePolicySpec, nodes: &mut [NodeView], now: Timestamp) -> PolicyPlan {
    let p = plan("first", policy, nodes, now);
    apply(nodes, &p);
    p
}

/// The plan of node `name`.
pub fn of<'a>(p: &'a PolicyPlan, name: &str) -> &'a NodePlan {
    p.nodes
        .iter()
        .find(|n| n.node == name)
        .unwrap_or_else(|| panic!("no plan for {name}"))
}

/// A node-wide drift in `class` (its check reads as a driver mismatch; only the class matters to
/// the planner).
// Each test binary compiles this module; not all of them use every helper.
#[allow(dead_code)]
pub fn node_drift(class: DriftClass) -> Verdict {
    Verdict::new(
        vec![Drift {
            class,
            check: "gpu.driverVersion".to_string(),
            expected: ">=550".to_string(),
            actual: "535.129.03".to_string(),
            gpu: None,
            device: None,
        }],
        Vec::new(),
    )
}
