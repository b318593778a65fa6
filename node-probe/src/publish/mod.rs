//! Publishing observations as the node's `GpuNodeReport`.
//!
//! The loop observes on an interval (and right after an XID arrives or the policies change)
//! and publishes the whole report at once when [`crate::change::decide`] finds a difference
//! from the last published observation (under the known policies, one in the operator's
//! verdict; see [`crate::change`] for the contract), and otherwise every `report_refresh`. In
//! between, every `heartbeat`, it only renews the node's heartbeat Lease
//! ([`gpunode_crds::heartbeat`]: a report write costs the API server six times a Lease
//! renewal). A failed write is retried with capped exponential backoff, always with the newest
//! observation (the latest replaces what was waiting; nothing queues up), and the first write
//! after a failure or a gap is the whole report. [`KubeSink`] writes with server-side apply:
//! the object (spec and an owner reference to the Node), its status, and the Lease.
//!
//! Submodules, each importing only those listed before it:
//! * [`config`]: the loop's timing, [`PublishConfig`].
//! * [`seams`]: where observations come from and go to ([`Observe`], [`ReportSink`]).
//! * [`backlog`]: what waits to be written and why, and when it may go out (pure).
//! * [`machine`]: the loop as a state machine, a pure `step(state, event) -> (state, action)`.
//! * [`driver`]: [`run_loop`], which carries out the machine's actions (sleeps, observations,
//!   writes, logs); it decides nothing.
//! * [`kube_sink`]: [`KubeSink`], the server-side-apply sink, and [`publish_once`].
//!
//! This module only declares and re-exports; it holds no code of its own.

pub mod backlog;
pub mod config;
pub mod driver;
pub mod kube_sink;
pub mod machine;
pub mod seams;

pub use config::{PublishConfig, refresh_seed};
pub use driver::{run_loop, run_loop_with_policies};
pub use kube_sink::{FIELD_MANAGER, KubeSink, publish_once};
pub use seams::{Beat, Observe, PublishError, ReportSink};
