//! gpunode API types (`gpunode.dev/v1alpha1`): [`GpuNodePolicy`], [`GpuNodeReport`] and [`GpuResetRequest`], the
//! value types they use, and the generation of their CustomResourceDefinitions.
//!
//! This crate does no I/O; the operator and the node-probe depend on it.
#![warn(missing_docs)]

pub mod budget;
pub mod duration;
pub mod error_counter;
pub mod generate;
pub mod heartbeat;
pub mod maintenance;
pub mod names;
pub mod nvlink;
pub mod policy;
pub mod power;
pub mod recovery;
pub mod repair;
pub mod report;
pub mod reset;
pub mod rules;
pub mod selector;
pub mod types;
pub mod validation;
pub mod version;
pub mod xid_catalog;
pub mod xid_resolution;

pub use budget::MaxUnavailable;
pub use duration::Duration;
pub use error_counter::ErrorCounter;
pub use nvlink::{FabricState, NvlinkCounter};
pub use policy::{GpuNodePolicy, GpuNodePolicySpec, GpuNodePolicyStatus};
pub use recovery::GpuRecoveryAction;
pub use report::{GpuNodeReport, GpuNodeReportSpec, GpuNodeReportStatus};
pub use reset::{GpuResetRequest, GpuResetRequestSpec, GpuResetRequestStatus};
pub use types::{DriftClass, EnabledState, ObservedTrust, PortState, ThrottleReason, TrustMode};
pub use version::{Version, VersionRange};
pub use xid_resolution::XidResolution;

/// The API group of every gpunode kind.
pub const GROUP: &str = "gpunode.dev";
