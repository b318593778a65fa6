//! gpunode operator: reconciles GpuNodePolicies against GpuNodeReports and acts on nodes.
//!
//! One reconcile of one policy ([`controller`]) is a pipeline, each step in its own module:
//!
//! | step | module | what it holds |
//! | --- | --- | --- |
//! | observe | [`observe`] | watches, trimmed caches, triggers, own writes, heartbeats, the selector index; a policy's snapshot and its nodes' views |
//! | evaluate | [`evaluate`], [`verdict`] (pure, shared with the probe) | a node's report against a policy: drifts and unknowns |
//! | | [`cache`] | verdicts remembered while a node's inputs are unchanged |
//! | plan | [`plan`] (pure, in layers) | every decision: ladder, hysteresis, GPUs, repair, validation, when the plan next changes; whether a step may start (pause, dry run, skip, conflicts, breaker, budget, windows, approvals, validation slots, the fleet cap) only in [`plan::admission`] |
//! | apply | [`apply`] (the only writer of nodes) | a plan's writes, evictions and releases; what each node's writes did |
//! | status | [`status`] (pure) | the policy status from what was applied |
//!
//! Around it: [`controller`] (the driver: the reconcile, releases, the sweep, the watches wired
//! to the kube-runtime controller), [`markers`] (gpunode's labels, annotations, taint and
//! condition on a node), [`devices`] (DRA ResourceSlices and gpunode's DeviceTaintRules: their
//! types, names, labels and which node's they are; read by observe, written by apply),
//! [`reasons`] (Event and condition reasons, policy condition types),
//! [`remediators`] (the objects of repair steps, read before planning and written by apply),
//! [`events`] (Events, published off the reconcile path), [`sweep`] (nodes no policy governs),
//! [`fleet`] (the fleet-wide disruption cap's count and its reservations across policies),
//! [`leader`] (leader election and the write fence), [`metrics`] and [`server`] (`/metrics`,
//! probes), [`check`] (`gpunode-operator check`: one node offline), [`crdgen`] (the CRDs), [`crash`] (the reliability suite's crash points, in test builds
//! only).

pub mod apply;
pub mod bounds;
pub mod cache;
pub mod check;
pub mod client;
pub mod controller;
pub mod crash;
pub mod crdgen;
pub mod devices;
pub mod events;
pub mod fleet;
pub mod leader;
pub mod markers;
pub mod metrics;
pub mod observe;
pub mod plan;
pub mod policy_state;
pub mod reasons;
pub mod remediators;
pub mod server;
pub mod status;
pub mod sweep;

// The pure evaluator lives in gpunode-checks, which the node-probe shares; these keep the
// operator's paths (`crate::evaluate`, `crate::verdict`).
pub use gpunode_checks::{evaluate, verdict};
