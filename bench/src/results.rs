//! What one run at N nodes measured (written as JSON, read back by `report`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::reference::Sample;
pub use crate::stats::{Latency, Spread, percentile};

/// Requests of one client in one phase.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Requests {
    /// Phase length, seconds.
    pub seconds: f64,
    /// Total.
    pub total: u64,
    /// Requests per second.
    pub per_second: f64,
    /// By `verb resource`.
    pub by_verb: BTreeMap<String, u64>,
}

/// gpunode's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Gpunode {
    /// Policy applied → last node with the state label and condition, seconds: the median of
    /// `convergence_runs_s`.
    pub convergence_s: f64,
    /// Every convergence run (the first on a fresh operator, the others after releasing every
    /// node), seconds.
    #[serde(default)]
    pub convergence_runs_s: Vec<f64>,
    /// Median and spread of `convergence_runs_s`.
    #[serde(default)]
    pub convergence_spread: Spread,
    /// Per run, as `convergence_runs_s`: the time by which 99 % of the nodes had converged. Near
    /// the run's last node, the whole fleet was slow; far below it, a few nodes were late.
    #[serde(default)]
    pub convergence_runs_p99_s: Vec<f64>,
    /// Policy applied → first node, seconds.
    pub first_node_s: f64,
    /// Policy applied → half of the nodes, seconds.
    pub half_nodes_s: f64,
    /// Nodes labelled compliant at the end of convergence.
    pub compliant: usize,
    /// Report written → taint visible (the reaction), over the single faults of every
    /// repetition (`RunResult::reactions` has them by repetition, with the floor's).
    pub reaction: Latency,
    /// Observation changed in the probe → taint visible (adds the probe's own publish).
    pub reaction_from_change: Latency,
    /// Recovered report written → taint removed (healthyFor 0s).
    pub recovery: Latency,
    /// End to end with real probe processes (see `realprobes.rs`); absent when none ran.
    #[serde(default)]
    pub real_probes: Option<Measured>,
    /// Changes that timed out.
    pub reaction_failures: usize,
    /// Peak RSS of the operator processes stopped during the reaction phases (gpunode is
    /// stopped while the floor answers), MiB.
    #[serde(default)]
    pub reaction_rss_peak_mib: f64,
    /// CPU seconds gpunode spent in its reaction phases, all repetitions.
    #[serde(default)]
    pub reaction_cpu_s: f64,
    /// Peak RSS (VmHWM) over the whole run, MiB.
    pub rss_peak_mib: f64,
    /// RSS when the caches had synced (before the policy), MiB.
    pub rss_synced_mib: f64,
    /// RSS at the end of the steady phase, MiB.
    pub rss_end_mib: f64,
    /// CPU seconds by phase (startup, convergence, reaction, real_probes, steady) and in total.
    pub cpu_s: BTreeMap<String, f64>,
    /// Requests by phase.
    pub requests: BTreeMap<String, Requests>,
    /// Steady state: requests per node per minute.
    pub steady_requests_per_node_min: f64,
    /// JSON size of the objects its reflectors hold (managedFields stripped), MiB.
    pub cached_nodes_mib: f64,
    /// Same, reports.
    pub cached_reports_mib: f64,
    /// Reconciles counted by the operator's own metrics, and their mean duration.
    pub reconciles: f64,
    /// Mean reconcile duration, milliseconds.
    pub reconcile_mean_ms: f64,
    /// The operator's own report-to-action histogram count (state changes).
    pub operator_reaction_count: f64,
}

/// The reference write rate for gpunode's own request (see `reference.rs`), swept over concurrency,
/// each concurrency `reps` times, interleaved with gpunode's convergence runs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReferenceRate {
    /// The request, in words.
    #[serde(default)]
    pub request: String,
    /// Size of one request body, bytes (the largest over the nodes).
    #[serde(default)]
    pub body_bytes: usize,
    /// Every pass, in the order run.
    #[serde(default)]
    pub samples: Vec<Sample>,
    /// Writes per second by concurrency: median and spread over the passes.
    #[serde(default)]
    pub spread: BTreeMap<String, Spread>,
    /// Median writes per second by concurrency.
    pub by_concurrency: BTreeMap<String, f64>,
    /// The best median rate, writes per second: the reference rate.
    pub best_rate: f64,
    /// Its concurrency.
    pub best_concurrency: usize,
    /// N divided by the best rate, seconds.
    pub n_over_rate_s: f64,
    /// Failed writes.
    pub errors: u64,
    /// Passes of N writes (each node once, as a convergence writes them) at the best
    /// concurrency, each from a client built just before it: the pass opens its connections,
    /// as a freshly started operator opens its own during its first convergence.
    #[serde(default)]
    pub cold: Vec<Sample>,
    /// Seconds of those passes, median and spread: the reference for N writes from a cold client.
    #[serde(default)]
    pub cold_seconds: Spread,
    /// The first-apply variant: passes of N writes at the best concurrency onto nodes whose
    /// gpunode fields were just taken off (`reference::strip`), so that each write adds the
    /// labels, annotations and condition as a convergence write does.
    #[serde(default)]
    pub first_apply: Vec<Sample>,
    /// Seconds of those passes, median and spread.
    #[serde(default)]
    pub first_apply_seconds: Spread,
}

/// How nfd-master is configured: its updaters in flight (`-nfd-api-parallelism`) and whether
/// each updater's client keeps client-go's default token bucket (5 QPS, burst 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Tuning {
    /// `-nfd-api-parallelism`.
    pub parallelism: usize,
    /// The client rate limit kept (upstream's default); lifted otherwise, through
    /// bench/nfd-build.sh's wrapper, as gpunode's client has none.
    pub client_limited: bool,
}

impl Tuning {
    /// Upstream's defaults.
    pub const DEFAULTS: Tuning = Tuning {
        parallelism: 10,
        client_limited: true,
    };
    /// Client QPS and burst when lifted: high enough that the limiter never waits.
    pub const UNLIMITED_QPS: u32 = 1_000_000;

    /// Tuned: `parallelism` updaters, no client-side limit.
    pub fn tuned(parallelism: usize) -> Tuning {
        Tuning {
            parallelism,
            client_limited: false,
        }
    }

    /// In words, for the table.
    pub fn describe(self) -> String {
        if self.client_limited {
            format!(
                "-nfd-api-parallelism {}, client 5 QPS / burst 10 per updater",
                self.parallelism
            )
        } else {
            format!("-nfd-api-parallelism {}, no client-side limit", self.parallelism)
        }
    }

    /// A short name, for file names.
    pub fn slug(self) -> String {
        format!(
            "p{}{}",
            self.parallelism,
            if self.client_limited { "-limited" } else { "" }
        )
    }
}

/// NFD's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Nfd {
    /// How nfd-master was configured, in words.
    #[serde(default)]
    pub tuning: String,
    /// The same, as set.
    #[serde(default)]
    pub setting: Option<Tuning>,
    /// The repetition of the comparison (`peer.rs`) it ran in.
    #[serde(default)]
    pub rep: usize,
    /// Rule created → last node labelled, seconds (projected when `projected`).
    pub convergence_s: f64,
    /// True when NFD did not finish within the deadline: convergence_s is then elapsed ×
    /// N / labelled (its rate so far held constant).
    pub projected: bool,
    /// Nodes labelled within the deadline.
    pub labelled: usize,
    /// Seconds waited.
    pub waited_s: f64,
    /// Peak RSS, MiB.
    pub rss_peak_mib: f64,
    /// CPU seconds from start to the end of the wait.
    pub cpu_s: f64,
    /// Requests while converging.
    pub requests: Requests,
}

/// One run at N nodes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// Nodes.
    pub n: usize,
    /// When it started.
    pub started: String,
    /// Git commit of the code measured ("-dirty" when the work tree differed).
    #[serde(default)]
    pub commit: String,
    /// 1-minute load average at the start, before gpunode, and at the end.
    pub load_avg: BTreeMap<String, f64>,
    /// Load generator: successful and failed publishes, and its publish rate in the steady
    /// phase (per second).
    pub loadgen: BTreeMap<String, f64>,
    /// gpunode.
    pub gpunode: Gpunode,
    /// The reference write rate: gpunode's own convergence write, replayed by a plain client
    /// (`reference.rs`; called "the limit" in results before issue 45).
    #[serde(alias = "limit")]
    pub reference: ReferenceRate,
    /// gpunode's median convergence over N / the best median reference rate.
    #[serde(alias = "convergence_vs_limit")]
    pub convergence_vs_reference: f64,
    /// Each convergence run over N / the best median reference rate: the ratio's spread.
    #[serde(default, alias = "convergence_vs_limit_spread")]
    pub convergence_vs_reference_spread: Spread,
    /// Every NFD run of the comparison (`peer.rs`), in order.
    #[serde(default)]
    pub nfd_runs: Vec<Nfd>,
    /// gpunode's convergence in each repetition of the comparison, seconds.
    #[serde(default)]
    pub peer_gpunode_s: Vec<f64>,
    /// NFD at its defaults: its median run (absent when not run).
    pub nfd: Option<Nfd>,
    /// NFD's convergence at its defaults over gpunode's: the median of the repetitions'
    /// ratios.
    pub nfd_vs_gpunode: Option<f64>,
    /// NFD at its best (the parallelism with the lowest median convergence): its median run
    /// (absent when not run).
    #[serde(default)]
    pub nfd_best: Option<Nfd>,
    /// NFD's convergence at its best over gpunode's, the median of the repetitions' ratios: the
    /// headline comparison.
    #[serde(default)]
    pub nfd_best_vs_gpunode: Option<f64>,
    /// The reaction phases, gpunode's and the floor's, repetition by repetition, with their raw
    /// samples.
    #[serde(default)]
    pub reactions: Vec<crate::reaction_results::Run>,
    /// Each phase with its wall-clock start and end (RFC 3339): startup, convergence, reaction,
    /// real_probes, steady, reference, peer (the reaction phases' own are in `reactions`).
    #[serde(default)]
    pub phases: Vec<(String, String, String)>,
    /// Notes about this run (timeouts, projections).
    pub notes: Vec<String>,
}

/// What the real probes measured.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Measured {
    /// Real probe processes.
    pub probes: usize,
    /// The probe's observation of the XID → taint visible.
    pub observation_to_taint: Latency,
    /// The probe's share: its observation → its report written (`published`, logged when the
    /// API server answered).
    #[serde(default)]
    pub observation_to_publish: Latency,
    /// The operator's share: the report written → taint visible (the watch to the operator, its
    /// pass, the taint write, the watch back to the benchmark).
    #[serde(default)]
    pub publish_to_taint: Latency,
    /// XID injected into the fixture → taint visible (adds the fake library's 100-ms poll of
    /// its fixture, which a real driver does not have, and the probe's wake-up).
    pub injection_to_taint: Latency,
    /// Injections that did not end in a taint within the deadline, or whose observation was not
    /// found in the probe's log.
    pub failures: usize,
    /// Per probe at default intervals over the steady phase: CPU as % of one core.
    pub cpu_percent: Vec<f64>,
    /// Per probe: peak RSS (VmHWM), MiB.
    pub rss_peak_mib: Vec<f64>,
}
