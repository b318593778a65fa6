//! `gpunode-operator`: run the operator, print its CRDs, or check a report offline.
//! Only the process's wiring (logging, the client, the metrics server, leader election, the
//! controller, shutdown) lives here; every decision is the library's.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};
use gpunode_operator::{check, crdgen};

/// jemalloc instead of the system allocator: the caches churn (every watched node and report is
/// replaced on each change) among short-lived reconcile data, and glibc's arenas kept that
/// fragmentation as resident memory (the scale benchmark's RSS). Freed pages go back to the
/// system at once (`.cargo/config.toml` builds jemalloc with no decay delay), so a reconcile
/// pass's plans do not stay resident after it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "gpunode-operator",
    version,
    about = "Keeps GPU nodes in the state their GpuNodePolicies declare"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator (in-cluster, or with the current kubeconfig).
    Run {
        /// Name of this replica in events and the leader lease (the pod name).
        #[arg(long, env = "POD_NAME")]
        instance: Option<String>,
        /// Log as JSON lines instead of text.
        #[arg(long, env = "GPUNODE_LOG_JSON")]
        log_json: bool,
        /// Address of /metrics, /healthz and /readyz.
        #[arg(long, env = "GPUNODE_METRICS_ADDR", default_value = gpunode_operator::server::DEFAULT_ADDR)]
        metrics_addr: std::net::SocketAddr,
        /// Elect one active replica through a Lease; without it this replica always writes.
        #[arg(long, env = "GPUNODE_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
        leader_elect: bool,
        /// Namespace of the leader Lease and of the probes' heartbeat Leases (the release
        /// namespace).
        #[arg(long, env = "POD_NAMESPACE", default_value = "gpunode-system")]
        lease_namespace: String,
        /// How many nodes of one policy are written (or released, when the policy goes) at once,
        /// at least 1. More is not faster once the API server's cores are busy; it only takes
        /// more of its in-flight budget.
        #[arg(long, env = "GPUNODE_APPLY_CONCURRENCY", default_value_t = gpunode_operator::apply::DEFAULT_APPLY_CONCURRENCY)]
        apply_concurrency: std::num::NonZeroUsize,
        /// Most GPU nodes (nodes some policy selects) unavailable at once, across every
        /// policy: a number (3) or a percentage of the GPU nodes ("10%", at least 1). A node
        /// counts whatever made it unavailable (NotReady, cordoned or tainted NoSchedule or
        /// NoExecute by anyone, validated or disrupted by gpunode); beyond the cap a node's
        /// next disruption waits (reason in its condition and the policy status).
        #[arg(long, env = "GPUNODE_FLEET_MAX_UNAVAILABLE", default_value = gpunode_operator::fleet::DEFAULT_FLEET_MAX_UNAVAILABLE, value_parser = gpunode_operator::fleet::parse_cap)]
        fleet_max_unavailable: gpunode_crds::MaxUnavailable,
        /// Taint keys that do not make a node unavailable to the fleet cap, comma-separated or
        /// repeated: the permanent taints of a dedicated GPU pool. A node with one still counts
        /// when it is NotReady, cordoned or tainted otherwise. An empty value ignores none.
        #[arg(long = "fleet-ignore-taint", env = "GPUNODE_FLEET_IGNORE_TAINTS", value_delimiter = ',', default_value = gpunode_operator::fleet::DEFAULT_FLEET_IGNORE_TAINTS, value_parser = gpunode_operator::fleet::parse_taint_key)]
        fleet_ignore_taints: Vec<String>,
        /// The namespaces validation Jobs may run in and what their pods may do there (the
        /// chart's `operator.validation.namespaces`, as the chart renders it: a JSON list of
        /// `{name, serviceAccounts, allowPrivileged, allowedCapabilities, allowHostNamespaces,
        /// allowHostPath}`). Unset: none, and no validation Job is made.
        #[arg(long, env = "GPUNODE_VALIDATION_NAMESPACES", default_value = "", value_parser = parse_bounds)]
        validation_namespaces: gpunode_operator::bounds::ValidationBounds,
        /// The remediation kinds repair steps may make, and where (the chart's
        /// `operator.remediators` as JSON: `{apiGroup, resources, templates, namespaces}`, no
        /// `namespaces`: any). Unset: none, and no repair step makes a remediation object.
        #[arg(long, env = "GPUNODE_REMEDIATORS", default_value = "", value_parser = parse_remediators)]
        remediators: gpunode_operator::bounds::RemediatorBounds,
        /// How a policy's reconcile plans: `full` (every node of the policy each pass) or
        /// `incremental` (only the nodes that changed since its last pass, and every node every
        /// five minutes). Incremental is being proven against full; full is the default.
        #[arg(long, env = "GPUNODE_PLANNING", default_value = "full")]
        planning: gpunode_operator::policy_state::Planning,
    },
    /// Offline: what the operator would decide about one node, and why. Exit code 0 compliant,
    /// 1 drifted, 2 unknown, 3 bad input (naming the file and field).
    Check {
        /// The GpuNodePolicy (YAML, as applied with kubectl).
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// The node's GpuNodeReport (`kubectl get gnr NODE -o yaml`).
        #[arg(long, value_name = "FILE")]
        report: PathBuf,
        /// The Node (`kubectl get node NODE -o yaml`): its taints, cordon, skip label and
        /// gpunode's bookkeeping are taken into account.
        #[arg(long, value_name = "FILE")]
        node: Option<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value = "text")]
        output: Output,
        /// Evaluate as of this time (RFC 3339) instead of now, e.g. for saved reports.
        #[arg(long, value_name = "TIME")]
        now: Option<jiff::Timestamp>,
    },
    /// Print the CustomResourceDefinitions as YAML (pipe into `kubectl apply -f -`).
    Crds {
        /// Also write one file per CRD into this directory (the chart keeps them in
        /// charts/gpunode/crds).
        #[arg(long, value_name = "DIR")]
        write: Option<PathBuf>,
    },
}

struct RunArgs {
    instance: Option<String>,
    log_json: bool,
    metrics_addr: std::net::SocketAddr,
    leader_elect: bool,
    lease_namespace: String,
    apply_concurrency: std::num::NonZeroUsize,
    fleet_max_unavailable: gpunode_crds::MaxUnavailable,
    fleet_ignore_taints: Vec<String>,
    validation_bounds: gpunode_operator::bounds::ValidationBounds,
    remediator_bounds: gpunode_operator::bounds::RemediatorBounds,
    planning: gpunode_operator::policy_state::Planning,
}

fn parse_remediators(text: &str) -> Result<gpunode_operator::bounds::RemediatorBounds, String> {
    gpunode_operator::bounds::RemediatorBounds::parse(text).map_err(|e| e.to_string())
}

fn parse_bounds(text: &str) -> Result<gpunode_operator::bounds::ValidationBounds, String> {
    gpunode_operator::bounds::ValidationBounds::parse(text).map_err(|e| e.to_string())
}

fn run(args: RunArgs) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    // Colour codes only on a terminal: a pod's log, or a file, gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    if args.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    match gpunode_operator::crash::arm_from_env() {
        Ok(Some(point)) => tracing::warn!(
            point,
            "crash point armed: the process aborts there (or holds the action, with GPUNODE_CRASH_ACTION=hold)"
        ),
        Ok(None) => {}
        Err(e) => {
            eprintln!("gpunode-operator run: {e}");
            return ExitCode::FAILURE;
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpunode-operator run: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(operate(args))
}

/// The operator until it is told to stop: the client, the metrics server, leader election and
/// the controller; then the controller stops, the Lease is released, the server stops.
async fn operate(args: RunArgs) -> ExitCode {
    use gpunode_operator::{controller, leader, metrics::Metrics, server};
    use std::sync::Arc;

    let Some(client) = client().await else {
        return ExitCode::FAILURE;
    };
    let instance = args
        .instance
        .clone()
        .or_else(leader::default_identity)
        .unwrap_or_else(|| "gpunode-operator".to_string());

    let metrics = Arc::new(Metrics::new());
    let readiness = server::Readiness::new();
    let server = match server::Server::bind(args.metrics_addr, metrics.clone(), readiness.clone()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "starting the metrics server");
            return ExitCode::FAILURE;
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let server_task = tokio::spawn(server.serve(stopped()));

    let leadership = if args.leader_elect {
        leader::Leadership::new()
    } else {
        leader::Leadership::fixed(true)
    };
    tokio::spawn({
        let m = metrics.clone();
        let rx = leadership.subscribe();
        async move { m.follow_leader(rx).await }
    });
    // The lease is released only after the controller has stopped writing.
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let leader_task = args.leader_elect.then(|| {
        let cfg = leader::LeaderConfig::new(
            args.lease_namespace.clone(),
            leader::DEFAULT_LEASE_NAME,
            instance.clone(),
        );
        elect(leadership.clone(), client.clone(), cfg, release_rx)
    });
    exit_after_shutdown_limit();
    let options = controller_options(args, instance, leadership, metrics, readiness.clone());
    controller::run(client, options, async {
        shutdown_signal().await;
        tracing::info!("shutting down");
    })
    .await;
    readiness.set_not_ready();
    let _ = release_tx.send(());
    if let Some(t) = leader_task
        && tokio::time::timeout(LEASE_RELEASE_LIMIT, t).await.is_err()
    {
        // The Lease then expires by itself, after its duration.
        tracing::warn!(limit = ?LEASE_RELEASE_LIMIT, "releasing the leader Lease got no answer in time");
    }
    let _ = stop_tx.send(true);
    let _ = server_task.await;
    ExitCode::SUCCESS
}

/// The controller's options: the command line's, with what [`operate`] set up.
fn controller_options(
    args: RunArgs,
    instance: String,
    leadership: gpunode_operator::leader::Leadership,
    metrics: std::sync::Arc<gpunode_operator::metrics::Metrics>,
    readiness: gpunode_operator::server::Readiness,
) -> gpunode_operator::controller::Options {
    gpunode_operator::controller::Options {
        instance,
        leadership,
        metrics,
        readiness,
        heartbeat_namespace: args.lease_namespace,
        apply_concurrency: args.apply_concurrency,
        fleet_max_unavailable: args.fleet_max_unavailable,
        fleet_ignore_taints: args.fleet_ignore_taints,
        validation_bounds: args.validation_bounds,
        remediator_bounds: args.remediator_bounds,
        planning: args.planning,
    }
}

/// The Kubernetes client (in-cluster or kubeconfig); what went wrong is logged.
async fn client() -> Option<kube::Client> {
    let mut config = match kube::Config::infer().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "no Kubernetes configuration (in-cluster or kubeconfig)");
            return None;
        }
    };
    // Refused evictions (429) are retried by the next reconcile, not hidden in the client.
    config.default_retry = false;
    match gpunode_operator::client::build(config) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::error!(error = %e, "building the Kubernetes client");
            None
        }
    }
}

/// Leader election, in the background until `release` fires (then the Lease is released).
fn elect(
    leadership: gpunode_operator::leader::Leadership,
    client: kube::Client,
    cfg: gpunode_operator::leader::LeaderConfig,
    release: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = leadership
            .run(client, cfg, async move {
                let _ = release.await;
            })
            .await
        {
            tracing::error!(error = %e, "leader election stopped");
        }
    })
}

/// Whatever the API server does (gone, partitioned, not answering), the process exits within
/// SHUTDOWN_LIMIT of the signal: a demo or a node drain never waits on it for good.
fn exit_after_shutdown_limit() {
    tokio::spawn(async {
        shutdown_signal().await;
        tokio::time::sleep(SHUTDOWN_LIMIT).await;
        tracing::error!(limit = ?SHUTDOWN_LIMIT, "shutdown did not finish in time; exiting");
        std::process::exit(1);
    });
}

/// Longest a shutdown takes from SIGTERM to exit, in-flight reconciles and the Lease release
/// included (the chart's terminationGracePeriodSeconds is 30).
const SHUTDOWN_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// Longest the Lease release may take once the controller has stopped.
const LEASE_RELEASE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `gpunode-operator check`: what the operator would decide about one node, and why.
fn check_command(
    policy: &std::path::Path,
    report: &std::path::Path,
    node: Option<&std::path::Path>,
    output: Output,
    now: Option<jiff::Timestamp>,
) -> ExitCode {
    let inputs = match check::load(policy, report, node) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("gpunode-operator check: bad input: {e}");
            return ExitCode::from(check::exit::BAD_INPUT);
        }
    };
    let Some(outcome) = check::check(&inputs, now.unwrap_or_else(jiff::Timestamp::now)) else {
        eprintln!("gpunode-operator check: the planner returned no plan for the node");
        return ExitCode::from(check::exit::BAD_INPUT);
    };
    match output {
        Output::Text => print!("{}", outcome.text()),
        Output::Json => match serde_json::to_string_pretty(&outcome) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("gpunode-operator check: {e}");
                return ExitCode::FAILURE;
            }
        },
    }
    ExitCode::from(outcome.exit_code())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run {
            instance,
            log_json,
            metrics_addr,
            leader_elect,
            lease_namespace,
            apply_concurrency,
            fleet_max_unavailable,
            fleet_ignore_taints,
            validation_namespaces,
            remediators,
            planning,
        } => run(RunArgs {
            instance,
            log_json,
            metrics_addr,
            leader_elect,
            lease_namespace,
            apply_concurrency,
            fleet_max_unavailable,
            // The chart's empty list renders as one empty key: none.
            fleet_ignore_taints: fleet_ignore_taints
                .into_iter()
                .filter(|k| !k.is_empty())
                .collect(),
            validation_bounds: validation_namespaces,
            remediator_bounds: remediators,
            planning,
        }),
        Command::Check {
            policy,
            report,
            node,
            output,
            now,
        } => check_command(&policy, &report, node.as_deref(), output, now),
        Command::Crds { write } => {
            let result = crdgen::render_all().and_then(|yaml| {
                if let Some(dir) = write {
                    crdgen::write_all(&dir)?;
                }
                Ok(yaml)
            });
            match result {
                Ok(yaml) => {
                    print!("{yaml}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gpunode-operator crds: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
