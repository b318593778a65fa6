//! The labels and the taint the fault tests put on their nodes: which test a node belongs to,
//! and what gpunode must leave alone (another controller's label and taint, a bystander a person
//! cordoned, the filler nodes of a large cache).

/// Label that ties a test's nodes to its policy (not `gpunode.dev/`: that prefix is gpunode's).
pub const RUN_LABEL: &str = "rel.gpunode.test/run";
/// Another controller's label on every wave node: gpunode must never remove it.
pub const FOREIGN_LABEL: (&str, &str) = ("team.example.com/owner", "ml-platform");
/// Another controller's taint (key, value, effect) on every wave node: gpunode must never remove it.
pub const FOREIGN_TAINT: (&str, &str, &str) = ("example.com/maintenance", "planned", "PreferNoSchedule");
/// Marks nodes a test creates only to fill the operator's cache.
pub const FILLER_LABEL: &str = "rel.gpunode.test/filler";
/// Marks a wave's bystander: a node of the policy that a person cordoned, which stays healthy.
pub const BYSTANDER_LABEL: &str = "rel.gpunode.test/bystander";
