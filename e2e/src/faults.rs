//! Fault injection for the reliability suite (`e2e/tests/reliability_*.rs`, docs/reliability.md).
//!
//! One module per concern:
//! - [`cluster`]: [`cluster::FaultCluster`], a private control plane (`.cluster/rel-<run>`, never
//!   the shared `test` one), with an audit log of every write and list, and a short etcd
//!   compaction interval so resumed watches expire (410 Gone). Components are stopped, started,
//!   paused and resumed with `e2e/cluster/ctl.sh`, which keeps ports and data, so clients
//!   reconnect to the same address; a fault is held for its length with [`cluster::hold`].
//! - [`replica`]: [`replica::Operator`], `gpunode-operator run --leader-elect` as a real process
//!   (so SIGKILL and SIGSTOP are real), each replica with its own ServiceAccount, so the audit log
//!   says who wrote what.
//! - [`wave`]: [`wave::Wave`], fake GPU nodes with pods under one policy, a wave of fatal XIDs and
//!   the driver that heals drained nodes until the wave is through; [`crate::monitor::WaveMonitor`]
//!   watches the nodes and pods and checks the budget, a person's cordon, other controllers'
//!   markers and repeated evictions at every observed instant.
//! - [`marks`]: gpunode's taint, labels and annotations on a node, as the checks read them.
//! - [`checks`]: [`checks::Check`], one invariant and its evidence, and the audit log's eviction
//!   invariants.
//! - [`late`]: every kind of write the operator makes, issued late with a deposed replica's
//!   token, and what the audit log witnessed of them.
//! - [`clock`]: the environment that skews a process's wall clock (libfaketime).
//! - [`crash`]: a replica started with one of the operator's crash points armed, the check that
//!   it died there, its restart without it.
//! - [`strike`]: a leader interrupted at a crash point three ways: crashed, cut off by a
//!   partition (a fenced follower takes over), or left without its API server.
//! - [`proxy`]: [`proxy::Toxiproxy`], a TCP fault proxy between a replica and the API server
//!   (the API latency fault).
//! - [`record`]: [`record::Recorder`] writes each run's invariants and recovery time as JSON;
//!   [`record::summary`] turns every results file into the table of docs/reliability.md.

pub mod checks;
pub mod clock;
pub mod cluster;
pub mod crash;
pub mod labels;
pub mod late;
pub mod marks;
pub mod proxy;
pub mod record;
pub mod replica;
pub mod strike;
pub mod wave;

use crate::Error;

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::Unexpected(format!("{what}: {e}"))
}
