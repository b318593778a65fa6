//! `gpunode-bench`: the scale benchmark (`make bench` drives it through bench/run.sh).
//!
//! * `run`: one run at N nodes on a running control plane → `<out>/n<N>.json`.
//! * `machine`: describes the machine and the binaries → JSON on stdout.
//! * `floor`: the minimal controller gpunode's reaction is compared with (`run` starts it).
//! * `report`: merges the runs into docs/benchmarks/results.{json,md}.
//! * `sim`: the operator alone at 10,000 to 100,000 nodes against a synthetic API (`make bench-sim`).

mod audit;
mod error;
mod floor;
mod identity;
mod loadgen;
mod model;
mod nfd;
mod peer;
mod procs;
mod reaction;
mod reaction_report;
mod reaction_results;
mod realprobes;
mod reference;
mod report;
mod results;
mod run;
mod sim;
mod stats;
mod tracker;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "gpunode-bench", about = "gpunode scale benchmark")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One run at N nodes (the nodes exist and are Ready; the cluster is fresh).
    Run {
        /// Number of nodes.
        #[arg(long)]
        nodes: usize,
        /// Admin kubeconfig of the cluster.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// The API server's audit log (bench/audit-policy.yaml).
        #[arg(long)]
        audit_log: PathBuf,
        /// The release gpunode-operator binary.
        #[arg(long)]
        operator: PathBuf,
        /// nfd-master binary (omit to skip the peer).
        #[arg(long, requires = "nfd_crds")]
        nfd_master: Option<PathBuf>,
        /// NFD's CRD manifest (deployment/base/nfd-crds/nfd-api-crds.yaml of its module).
        #[arg(long)]
        nfd_crds: Option<PathBuf>,
        /// Directory for the result, logs and samples.
        #[arg(long)]
        out: PathBuf,
        /// Single faults per repetition of the reaction phases (one at a time, each followed
        /// by its recovery).
        #[arg(long, default_value_t = 200)]
        changes: usize,
        /// Bursts per repetition.
        #[arg(long, default_value_t = 3)]
        bursts: usize,
        /// Nodes faulted at once in a burst (at most half the load generator's nodes).
        #[arg(long, default_value_t = 256)]
        burst_size: usize,
        /// Open-loop rates, faults per second, ascending (comma-separated); the phase stops
        /// after the first rate not sustained.
        #[arg(long, value_delimiter = ',', default_value = "5,10,20,50,100,200")]
        rates: Vec<f64>,
        /// Seconds of injection at each open-loop rate.
        #[arg(long, default_value_t = 10.0)]
        rate_secs: f64,
        /// Repetitions of the reaction phases, gpunode's and the floor's alternating.
        #[arg(long, default_value_t = 3)]
        reaction_reps: usize,
        /// Steady-state window, seconds.
        #[arg(long, default_value_t = 120)]
        steady_s: u64,
        /// Spread of the probes' start-up, seconds (60: heartbeats spread over the minute).
        #[arg(long, default_value_t = 60)]
        stagger_s: u64,
        /// Repetitions of the comparison with NFD (gpunode's convergence and NFD's settings,
        /// which goes first alternating).
        #[arg(long, default_value_t = 3)]
        peer_reps: usize,
        /// NFD's parallelisms (`-nfd-api-parallelism`) swept with no client-side limit, besides
        /// its defaults (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "10,32,128,512")]
        nfd_parallelism: Vec<usize>,
        /// How long NFD may take before its convergence is projected from its rate, seconds.
        #[arg(long, default_value_t = 300)]
        nfd_deadline_s: u64,
        /// Concurrencies the reference write rate is swept over (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "8,16,32,64,128,256,512")]
        concurrency: Vec<usize>,
        /// Repetitions of the reference rate's sweep and of gpunode's convergence, interleaved.
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Nodes published by real gpunode-probe processes instead of the load generator
        /// (end-to-end reaction, probe cost); 0 for none.
        #[arg(long, default_value_t = 16)]
        real_probes: usize,
        /// XIDs injected per real probe.
        #[arg(long, default_value_t = 16)]
        real_rounds: usize,
        /// Record a perf profile of the operator during the reaction and steady phases.
        #[arg(long)]
        perf: bool,
    },
    /// Describe the machine and the binaries (JSON on stdout).
    Machine {
        /// name=path of a binary and its version flag, e.g. kube-apiserver=/x/kube-apiserver:--version
        #[arg(long = "binary", value_name = "NAME=PATH:FLAG")]
        binaries: Vec<String>,
    },
    /// The operator alone against a synthetic API server at each N, `reps` times.
    Sim {
        /// Numbers of nodes (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "10000,50000,100000")]
        nodes: Vec<usize>,
        /// Runs at each N.
        #[arg(long, default_value_t = 3)]
        reps: usize,
        /// The gpunode-operator binary.
        #[arg(long)]
        operator: PathBuf,
        /// Report changes that turn a node drifting, each followed by its recovery.
        #[arg(long, default_value_t = 200)]
        changes: usize,
        /// `--planning` of the operator.
        #[arg(long, default_value = "incremental")]
        planning: String,
        /// Directory for the results and logs.
        #[arg(long)]
        out: PathBuf,
        /// Longest a phase may take, seconds.
        #[arg(long, default_value_t = 900)]
        deadline_s: u64,
        /// The quiet window the idle CPU is measured over, seconds.
        #[arg(long, default_value_t = 5)]
        idle_s: u64,
    },
    /// The empirical floor: a minimal controller that taints a node while its report shows a
    /// throttled GPU (the benchmark starts it; runs until killed).
    Floor {
        /// Kubeconfig (the operator's ServiceAccount).
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Address answering `GET /readyz` once the caches are listed.
        #[arg(long)]
        ready: std::net::SocketAddr,
    },
    /// Merge the runs of a results directory into results.json and results.md.
    Report {
        /// Directory with machine.json and n<N>.json files.
        #[arg(long)]
        results: PathBuf,
        /// Where results.json and results.md go.
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn,gpunode_probe=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Machine { binaries } => {
            let parsed: Vec<(String, PathBuf, Vec<String>)> = binaries
                .iter()
                .filter_map(|b| {
                    let (name, rest) = b.split_once('=')?;
                    let (path, flag) = rest.rsplit_once(':').unwrap_or((rest, "--version"));
                    Some((
                        name.to_string(),
                        PathBuf::from(path),
                        flag.split(' ').map(str::to_string).collect(),
                    ))
                })
                .collect();
            match serde_json::to_string_pretty(&procs::machine(&parsed)) {
                Ok(json) => {
                    println!("{json}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gpunode-bench machine: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Floor { kubeconfig, ready } => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("gpunode-bench floor: starting the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(floor::run(&kubeconfig, ready)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("gpunode-bench floor: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Report { results, out } => match report::write(&results, &out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpunode-bench report: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Sim {
            nodes,
            reps,
            operator,
            changes,
            planning,
            out,
            deadline_s,
            idle_s,
        } => {
            if nodes.contains(&0) || changes == 0 {
                eprintln!("gpunode-bench sim: --nodes and --changes must be at least 1");
                return ExitCode::from(2);
            }
            let base = sim::SimArgs {
                n: 0,
                operator,
                changes,
                planning,
                out,
                rep: 0,
                deadline: Duration::from_secs(deadline_s),
                idle: Duration::from_secs(idle_s),
            };
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("gpunode-bench sim: starting the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(sim::run_all(&base, &nodes, reps)) {
                Ok(all) => {
                    print!("{}", sim::markdown(&all));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gpunode-bench sim: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run {
            nodes,
            kubeconfig,
            audit_log,
            operator,
            nfd_master,
            nfd_crds,
            out,
            changes,
            bursts,
            burst_size,
            rates,
            rate_secs,
            reaction_reps,
            steady_s,
            stagger_s,
            nfd_deadline_s,
            peer_reps,
            nfd_parallelism,
            concurrency,
            reps,
            real_probes,
            real_rounds,
            perf,
        } => {
            if nodes == 0 {
                eprintln!("gpunode-bench run: --nodes must be at least 1");
                return ExitCode::from(2);
            }
            if rates.iter().any(|r| !r.is_finite() || *r <= 0.0)
                || !rates.is_sorted()
                || !rate_secs.is_finite()
                || rate_secs <= 0.0
            {
                eprintln!("gpunode-bench run: --rates must be positive and ascending, --rate-secs positive");
                return ExitCode::from(2);
            }
            let args = run::Args {
                n: nodes,
                kubeconfig,
                audit_log,
                operator,
                nfd: nfd_master.zip(nfd_crds),
                out,
                reaction: reaction::Plan {
                    changes,
                    bursts,
                    burst_size,
                    rates,
                    rate_secs,
                },
                reaction_reps: reaction_reps.max(1),
                floor: match std::env::current_exe() {
                    Ok(p) => p,
                    Err(e) => {
                        eprintln!("gpunode-bench run: where this binary is: {e}");
                        return ExitCode::FAILURE;
                    }
                },
                steady: Duration::from_secs(steady_s),
                stagger: Duration::from_secs(stagger_s),
                nfd_deadline: Duration::from_secs(nfd_deadline_s),
                concurrency,
                reps,
                peer_reps: peer_reps.max(1),
                nfd_parallelism,
                real_probes,
                real_rounds,
                perf,
            };
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("gpunode-bench run: starting the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let result = runtime.block_on(run::run(&args));
            match result.and_then(|r| {
                let path = args.out.join(format!("n{}.json", args.n));
                std::fs::write(&path, serde_json::to_string_pretty(&r)?)
                    .map_err(error::Error::io(format!("writing {}", path.display())))?;
                Ok(path)
            }) {
                Ok(path) => {
                    println!("{}", path.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gpunode-bench run: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
