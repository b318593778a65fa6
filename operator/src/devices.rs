//! DRA devices: the GPUs a DRA driver publishes in ResourceSlices ([`slices`]) and gpunode's own
//! DeviceTaintRules ([`rules`]). The one place that knows these kinds: their types, where they are
//! served, and for the rules their labels, annotations, names, selector, which node and GPU a
//! rule is for, and what rules a node's quarantines call for.
//!
//! observe reads slices and rules into its caches and the planner's views through this module;
//! apply writes the rules it computes. This module may import only below itself (the planner's
//! types in [`crate::plan`], [`crate::markers`] and `gpunode_crds`), never observe or apply, and
//! makes no request but [`discover`]'s.
//!
//! The API group `resource.k8s.io` has served these kinds under several versions (v1alpha3,
//! v1beta1, v1beta2, v1); the fields gpunode reads and writes have the same names in each, except
//! that v1beta1 nests a device's attributes under `basic`. The version is discovered once at
//! start; a cluster that serves neither kind has no DRA and every node is a device-plugin node.

pub mod discovery;
pub mod rules;
pub mod slices;

pub use discovery::{Dra, discover};
pub use rules::{DeviceTaintRule, RuleSelector, RuleSpec, RuleTaint};
pub use slices::{ResourceSlice, devices_of, held_node_devices, node_devices, trim_slice};
