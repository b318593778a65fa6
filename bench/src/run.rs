//! One benchmark run at N nodes on a running control plane: the load generator, gpunode's
//! convergence, reaction (beside the floor) and steady state, the reference write rate of a plain
//! client, and NFD.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gpunode_crds::GpuNodeReport;
use gpunode_e2e::{http, operator};
use gpunode_operator::apply::FIELD_MANAGER;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, Config, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;
use tracing::info;

use crate::{
    audit,
    error::Error,
    loadgen::LoadGen,
    nfd, peer,
    procs::{self, Measured},
    reaction,
    reaction_results::{self, Controller},
    realprobes::RealProbes,
    reference,
    results::{Latency, ReferenceRate, Requests, RunResult, Spread, percentile},
    tracker::{NODE_SELECTOR, Tracker},
};

pub use crate::identity::{OPERATOR_NAMESPACE, OPERATOR_SA, token_kubeconfig};

/// The benchmark policy's name.
pub const POLICY: &str = "bench";
/// Writes per pass of the reference rate's sweep (at least 2 per request in flight).
const REFERENCE_WRITES: usize = 1000;

/// What to run.
#[derive(Debug, Clone)]
pub struct Args {
    /// Number of nodes (already created and Ready).
    pub n: usize,
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The API server's audit log.
    pub audit_log: PathBuf,
    /// The release gpunode-operator binary.
    pub operator: PathBuf,
    /// nfd-master and NFD's CRD file, when the peer is measured.
    pub nfd: Option<(PathBuf, PathBuf)>,
    /// Where logs and the result go.
    pub out: PathBuf,
    /// The reaction phases (single faults, bursts, open loop) each controller runs.
    pub reaction: reaction::Plan,
    /// Repetitions of the reaction phases, gpunode's and the floor's alternating which goes
    /// first.
    pub reaction_reps: usize,
    /// The floor's program (this benchmark's own binary: `gpunode-bench floor`).
    pub floor: PathBuf,
    /// Length of the steady-state window.
    pub steady: Duration,
    /// The probes' start-up spread.
    pub stagger: Duration,
    /// How long NFD may take before its time is projected.
    pub nfd_deadline: Duration,
    /// Concurrencies the reference write rate is swept over.
    pub concurrency: Vec<usize>,
    /// Repetitions of the sweep and of gpunode's convergence, interleaved.
    pub reps: usize,
    /// Repetitions of the comparison with NFD (`peer.rs`).
    pub peer_reps: usize,
    /// NFD's parallelisms swept (no client-side limit), besides its defaults.
    pub nfd_parallelism: Vec<usize>,
    /// Nodes published by real probe processes (the first ones, by name).
    pub real_probes: usize,
    /// XIDs injected per real probe.
    pub real_rounds: usize,
    /// Record a CPU profile of the operator with perf during the reaction and steady phases.
    pub perf: bool,
}

async fn admin(kubeconfig: &Path) -> Result<(Client, Kubeconfig), Error> {
    let (config, kc) = config(kubeconfig).await?;
    Ok((Client::try_from(config)?, kc))
}

pub(crate) async fn config(kubeconfig: &Path) -> Result<(Config, Kubeconfig), Error> {
    let kc = Kubeconfig::read_from(kubeconfig).map_err(|e| Error::Other(format!("kubeconfig: {e}")))?;
    let config = Config::from_custom_kubeconfig(kc.clone(), &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Other(format!("kubeconfig: {e}")))?;
    Ok((config, kc))
}

fn load_yaml(path: &Path) -> Result<serde_json::Value, Error> {
    let text = std::fs::read_to_string(path).map_err(Error::io(format!("reading {}", path.display())))?;
    Ok(serde_yaml::from_str(&text)?)
}

/// The benchmark policy: every check of the strict H100 policy (a realistic evaluation cost),
/// Throttle or a fatal XID → NoSchedule taint after 0s, recovery after 0s, and no budget or breaker, so the
/// reaction phase measures the reaction and not the budget.
pub fn policy() -> Result<serde_json::Value, Error> {
    let path = gpunode_e2e::fixtures::repo_root().join("operator/tests/fixtures/evaluate/strict-policy.yaml");
    let mut p = load_yaml(&path)?;
    p["metadata"] = json!({"name": POLICY});
    let (key, value) = NODE_SELECTOR
        .split_once('=')
        .ok_or_else(|| Error::Other("bad node selector".into()))?;
    p["spec"]["nodeSelector"] = json!({"matchLabels": {key: value}});
    p["spec"]["remediation"] =
        json!([{"classes": ["Throttle", "Xid"], "action": "Taint", "effect": "NoSchedule", "after": "0s"}]);
    p["spec"]["disruption"] = json!({"maxUnavailable": "100%", "circuitBreaker": {"maxDriftedPercent": 100}});
    p["spec"]["recovery"] = json!({"healthyFor": "0s"});
    Ok(p)
}

/// The healthy 8x H100 report every fake probe observes.
pub fn report_template() -> Result<gpunode_crds::GpuNodeReportStatus, Error> {
    let path =
        gpunode_e2e::fixtures::repo_root().join("operator/tests/fixtures/evaluate/healthy-h100-report.yaml");
    let report: GpuNodeReport = serde_json::from_value(load_yaml(&path)?)?;
    report
        .status
        .ok_or_else(|| Error::Other(format!("{}: no status", path.display())))
}

fn requests(all: &[audit::Request], user: &str, from: Timestamp, to: Timestamp) -> Requests {
    let by_verb = audit::count(all, user, from, to);
    let seconds = to.duration_since(from).as_secs_f64();
    let total = audit::total(&by_verb);
    Requests {
        seconds,
        total,
        per_second: if seconds > 0.0 {
            total as f64 / seconds
        } else {
            0.0
        },
        by_verb,
    }
}

/// Waits for `GET /readyz` on `addr` to answer 200.
async fn wait_ready(proc: &mut Measured, addr: SocketAddr, timeout: Duration) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    loop {
        proc.now()?;
        if let Ok(http::Response { status: 200, .. }) = http::get(addr, "/readyz").await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("{} /readyz", proc.name),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // poll interval
    }
}

/// JSON size of `objects` with managedFields stripped, MiB.
fn cached_mib<K: serde::Serialize + ResourceExt>(objects: Vec<K>) -> f64 {
    let bytes: usize = objects
        .into_iter()
        .map(|mut o| {
            o.managed_fields_mut().clear();
            serde_json::to_vec(&o).map_or(0, |v| v.len())
        })
        .sum();
    bytes as f64 / 1024.0 / 1024.0
}

/// Starts gpunode-operator as `spec` says, logging to `log`, and waits until its caches synced.
async fn start_operator(spec: &operator::Spec, log: &Path) -> Result<Measured, Error> {
    let mut op = Measured::spawn_command("gpunode-operator", spec.command(), log)?;
    wait_ready(&mut op, spec.metrics_addr, Duration::from_secs(300)).await?;
    Ok(op)
}

/// Starts the floor (`gpunode-bench floor`) with the operator's kubeconfig and waits until its
/// caches are listed.
async fn start_floor(args: &Args, op_kc: &Path, rep: usize) -> Result<Measured, Error> {
    let ready = http::free_addr()?;
    let mut cmd = std::process::Command::new(&args.floor);
    cmd.arg("floor")
        .arg("--kubeconfig")
        .arg(op_kc)
        .arg("--ready")
        .arg(ready.to_string())
        .env("RUST_LOG", "warn");
    let log = args.out.join(format!("floor-{}-rep{rep}.log", args.n));
    let mut floor = Measured::spawn_command("floor", cmd, &log)?;
    wait_ready(&mut floor, ready, Duration::from_secs(300)).await?;
    Ok(floor)
}

/// gpunode's passes so far (`gpunode_reconciles_total` on its metrics endpoint).
async fn passes(addr: SocketAddr) -> Option<f64> {
    let r = http::get(addr, "/metrics").await.ok()?;
    http::series(&r.body, "gpunode_reconciles_total")
}

/// Waits for a freshly started operator's first pass over the fleet, so that its start-up work
/// is not counted in the reaction measured next.
async fn first_pass(addr: SocketAddr) -> Result<(), Error> {
    let timeout = Duration::from_secs(120);
    let deadline = Instant::now() + timeout;
    while passes(addr).await.unwrap_or(0.0) < 1.0 {
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: "the restarted operator's first pass".into(),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // poll interval
    }
    Ok(())
}

/// gpunode's processes over the reaction phases: their peak RSS, and the CPU seconds they spent
/// on reaction.
#[derive(Debug, Default)]
struct Spent {
    hwm_mib: f64,
    reaction_cpu_s: f64,
}

/// The reaction phases `args.reaction_reps` times for gpunode and for the floor, which goes
/// first alternating by repetition. gpunode is stopped while the floor runs (both would answer
/// the same faults) and started again for its next turn; `op` is the running operator before
/// and after.
async fn reactions(
    args: &Args,
    (load, tracker): (&LoadGen, &Tracker),
    (spec, op_kc): (&operator::Spec, &Path),
    op: Measured,
) -> Result<(Measured, Vec<reaction_results::Run>, Spent), Error> {
    let pool = load.nodes.clone();
    let (mut op, mut runs, mut spent) = (Some(op), Vec::new(), Spent::default());
    let log = |rep: usize| args.out.join(format!("operator-{}-reaction{rep}.log", args.n));
    for rep in 0..args.reaction_reps {
        let order = if rep % 2 == 0 {
            [Controller::Gpunode, Controller::Floor]
        } else {
            [Controller::Floor, Controller::Gpunode]
        };
        for c in order {
            let mut proc = match (c, op.take()) {
                (Controller::Gpunode, Some(p)) => p,
                (Controller::Gpunode, None) => {
                    let op = start_operator(spec, &log(rep)).await?;
                    first_pass(spec.metrics_addr).await?;
                    op
                }
                (Controller::Floor, running) => {
                    if let Some(p) = running {
                        spent.hwm_mib = spent.hwm_mib.max(p.stop().await.hwm_mib);
                    }
                    start_floor(args, op_kc, rep).await?
                }
            };
            let cpu0 = proc.now()?.cpu_s;
            let metrics = (c == Controller::Gpunode).then_some(spec.metrics_addr);
            let read = async || reaction::Reading {
                cpu_s: proc.now().map_or(0.0, |s| s.cpu_s),
                passes: match metrics {
                    Some(addr) => passes(addr).await,
                    None => None,
                },
            };
            let r = reaction::run(load, tracker, &pool, &args.reaction, (c, rep), read).await;
            info!(controller = ?c, rep, single_p99 = Latency::of(&r.single.written_to_taint_ms).p99_ms, saturation = r.saturation_rate, "reaction measured");
            runs.push(r);
            match c {
                Controller::Gpunode => {
                    spent.reaction_cpu_s += proc.now()?.cpu_s - cpu0;
                    op = Some(proc);
                }
                Controller::Floor => {
                    proc.stop().await;
                }
            }
        }
    }
    let op = match op {
        Some(p) => p,
        None => {
            let op = start_operator(spec, &log(args.reaction_reps)).await?;
            first_pass(spec.metrics_addr).await?;
            op
        }
    };
    Ok((op, runs, spent))
}

/// Seconds from `t0` to each converged node, ascending.
fn convergence_times(tracker: &Tracker, t0: Instant) -> Vec<f64> {
    let mut times: Vec<f64> = tracker.with(|s| {
        s.nodes
            .values()
            .filter_map(|e| e.converged_at)
            .map(|t| t.saturating_duration_since(t0).as_secs_f64())
            .collect()
    });
    times.sort_by(f64::total_cmp);
    times
}

/// gpunode's convergence once more, on a fresh operator process: every node released (the policy
/// deleted and gone), then the policy created again. Seconds from the create to the last node
/// converged, and to 99 % of them.
async fn converge_again(
    args: &Args,
    spec: &operator::Spec,
    tracker: &Tracker,
    policies: &Api<DynamicObject>,
    policy: &DynamicObject,
    label: &str,
) -> Result<(f64, f64), Error> {
    let n = args.n;
    let timeout = Duration::from_secs(600) + Duration::from_millis(n as u64 * 200);
    let op = start_operator(spec, &args.out.join(format!("operator-{n}-{label}.log"))).await?;
    policies.delete(POLICY, &DeleteParams::default()).await?;
    tracker
        .wait("every node released", timeout, |s| {
            (s.converged == 0).then_some(())
        })
        .await?;
    let deadline = Instant::now() + timeout;
    while policies.get_opt(POLICY).await?.is_some() {
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: "the deleted policy to go".into(),
                after: timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await; // poll interval
    }
    let t0 = Instant::now();
    policies.create(&PostParams::default(), policy).await?;
    tracker
        .wait("every node converged again", timeout, |s| {
            (s.converged >= n).then_some(())
        })
        .await?;
    let times = convergence_times(tracker, t0);
    let (secs, p99) = (times.last().copied().unwrap_or(0.0), percentile(&times, 0.99));
    op.stop().await;
    info!(label, seconds = secs, p99, "converged again");
    Ok((secs, p99))
}

/// The reference write rate (`reference.rs`) swept over `args.concurrency`, `args.reps` times,
/// interleaved with gpunode's convergence: the first convergence is the main run's; each later
/// sweep follows one more convergence run. The concurrencies' order rotates by repetition.
/// Then `args.reps` passes of N writes at the best concurrency from a cold client.
async fn reference_and_convergence(
    args: &Args,
    op_kc: &Path,
    spec: &operator::Spec,
    tracker: &Tracker,
    policies: &Api<DynamicObject>,
    policy: &DynamicObject,
    result: &mut RunResult,
) -> Result<(), Error> {
    // Clients built as the operator builds its own: the same request, sent the same way.
    let (op_config, _) = config(op_kc).await?;
    let as_operator: Api<Node> = Api::all(gpunode_operator::client::build(op_config.clone())?);
    let bodies = reference::capture(&as_operator).await?;
    let mut out = ReferenceRate {
        request: format!(
            "server-side apply to nodes/status, field manager {FIELD_MANAGER}, force, as \
             system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}, the body gpunode wrote to \
             each node with a new lastHeartbeatTime"
        ),
        body_bytes: bodies.iter().map(reference::Body::size).max().unwrap_or(0),
        ..ReferenceRate::default()
    };
    let mut runs = vec![result.gpunode.convergence_s];
    let reps = args.reps.max(1);
    for rep in 0..reps {
        if rep > 0 {
            let (last, p99) =
                converge_again(args, spec, tracker, policies, policy, &format!("rep{rep}")).await?;
            runs.push(last);
            result.gpunode.convergence_runs_p99_s.push(p99);
        }
        let k = args.concurrency.len().max(1);
        for i in 0..args.concurrency.len() {
            let c = args.concurrency[(i + rep) % k];
            out.samples
                .push(reference::pass(&as_operator, &bodies, c, REFERENCE_WRITES.max(c * 2)).await);
        }
    }
    for &c in &args.concurrency {
        let rates: Vec<f64> = out
            .samples
            .iter()
            .filter(|s| s.concurrency == c)
            .map(|s| s.rate)
            .collect();
        let spread = Spread::of(&rates);
        out.by_concurrency.insert(c.to_string(), spread.median);
        out.spread.insert(c.to_string(), spread);
        if spread.median > out.best_rate {
            out.best_rate = spread.median;
            out.best_concurrency = c;
        }
    }
    // The same N writes from a cold client, at the best concurrency: each pass's client is new,
    // so the pass opens its connections (HTTP/1.1: one per write in flight), as a freshly
    // started operator does in its first convergence.
    for _ in 0..reps {
        let cold: Api<Node> = Api::all(gpunode_operator::client::build(op_config.clone())?);
        out.cold
            .push(reference::pass(&cold, &bodies, out.best_concurrency, args.n).await);
    }
    let cold_seconds: Vec<f64> = out.cold.iter().map(|s| s.seconds).collect();
    out.cold_seconds = Spread::of(&cold_seconds);
    // The first-apply variant: the same N writes onto nodes without gpunode's fields. The last
    // pass leaves every node as gpunode wrote it (the heartbeat aside), for the runs after.
    let mut strip_errors = 0;
    for _ in 0..reps {
        strip_errors += reference::strip(&as_operator, &bodies, out.best_concurrency).await;
        out.first_apply
            .push(reference::pass(&as_operator, &bodies, out.best_concurrency, args.n).await);
    }
    let first_seconds: Vec<f64> = out.first_apply.iter().map(|s| s.seconds).collect();
    out.first_apply_seconds = Spread::of(&first_seconds);
    out.errors = strip_errors
        + out
            .samples
            .iter()
            .chain(&out.cold)
            .chain(&out.first_apply)
            .map(|s| s.errors)
            .sum::<u64>();
    out.n_over_rate_s = args.n as f64 / out.best_rate.max(f64::MIN_POSITIVE);
    let g = &mut result.gpunode;
    g.convergence_spread = Spread::of(&runs);
    g.convergence_s = g.convergence_spread.median;
    result.convergence_vs_reference = g.convergence_s / out.n_over_rate_s;
    let ratios: Vec<f64> = runs.iter().map(|r| r / out.n_over_rate_s).collect();
    result.convergence_vs_reference_spread = Spread::of(&ratios);
    g.convergence_runs_s = runs;
    result.reference = out;
    Ok(())
}

/// Everything at N nodes.
pub async fn run(args: &Args) -> Result<RunResult, Error> {
    std::fs::create_dir_all(&args.out).map_err(Error::io(format!("creating {}", args.out.display())))?;
    let n = args.n;
    let mut result = RunResult {
        n,
        started: Timestamp::now().to_string(),
        commit: procs::commit(),
        ..RunResult::default()
    };
    result.load_avg.insert("start".into(), procs::load_avg());
    let (client, kc) = admin(&args.kubeconfig).await?;
    // The e2e helpers the real probes use (accounts, tokens, kubeconfigs) talk to this cluster.
    gpunode_e2e::cluster::use_admin_kubeconfig(args.kubeconfig.clone());

    let nodes: Api<Node> = Api::all(client.clone());
    let mut names: Vec<String> = nodes
        .list_metadata(&ListParams::default().labels(NODE_SELECTOR))
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    if names.len() != n {
        return Err(Error::Other(format!(
            "expected {n} nodes with {NODE_SELECTOR}, found {} (run nodes.sh first, on a fresh cluster)",
            names.len()
        )));
    }
    let tracker = Tracker::start(client.clone());
    tracker
        .wait(
            "the node watch to list every node",
            Duration::from_secs(120),
            |s| (s.synced && s.nodes.len() >= n).then_some(()),
        )
        .await?;
    gpunode_e2e::crds::install(&client).await?;

    // Real probes on the first nodes, the load generator on the others: every node's report
    // written once, then heartbeats.
    let k = args.real_probes.min(n);
    let mut real = if k > 0 {
        Some(RealProbes::start(&client, &names[..k], &args.out.join("real-probes")).await?)
    } else {
        None
    };
    info!(n, real = k, stagger = ?args.stagger, "starting the load generator");
    let load = LoadGen::start(&client, &names[k..], report_template()?, args.stagger);
    load.wait_all_published(args.stagger + Duration::from_secs(120) + Duration::from_millis(n as u64 * 100))
        .await?;
    info!(publishes = load.published(), "every report written");

    // gpunode-operator as a process, with the chart's ServiceAccount.
    let token = gpunode_e2e::accounts::token(&client, OPERATOR_NAMESPACE, OPERATOR_SA, None).await?;
    let op_kc = args.out.join(format!("operator-{n}.kubeconfig"));
    token_kubeconfig(&kc, &token, &op_kc)?;
    let spec = operator::Spec {
        bin: args.operator.clone(),
        instance: "bench".into(),
        kubeconfig: op_kc.clone(),
        lease_namespace: None,
        metrics_addr: http::free_addr()?,
        rust_log: None,
        prefix: Vec::new(),
        env: Vec::new(),
    };
    let t_start = Timestamp::now();
    result.load_avg.insert("before_gpunode".into(), procs::load_avg());
    let mut op = start_operator(&spec, &args.out.join(format!("operator-{n}.log"))).await?;
    let s_synced = op.now()?;
    result.gpunode.rss_synced_mib = s_synced.rss_mib;
    info!(rss_mib = s_synced.rss_mib, "operator caches synced");

    // Convergence: apply the policy, wait for every node's label and condition.
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<gpunode_crds::GpuNodePolicy>(&()),
    );
    let policy: DynamicObject = serde_json::from_value(policy()?)?;
    let t_conv = Timestamp::now();
    let t0 = Instant::now();
    policies.create(&PostParams::default(), &policy).await?;
    let conv_timeout = Duration::from_secs(600) + Duration::from_millis(n as u64 * 200);
    tracker
        .wait("every node converged", conv_timeout, |s| {
            (s.converged >= n).then_some(())
        })
        .await?;
    let times = convergence_times(&tracker, t0);
    let g = &mut result.gpunode;
    g.convergence_s = times.last().copied().unwrap_or(0.0);
    g.first_node_s = times.first().copied().unwrap_or(0.0);
    g.half_nodes_s = times.get(times.len() / 2).copied().unwrap_or(0.0);
    g.convergence_runs_p99_s = vec![percentile(&times, 0.99)];
    g.compliant = tracker.with(|s| {
        s.nodes
            .values()
            .filter(|e| e.state.as_deref() == Some("compliant"))
            .count()
    });
    let s_conv = op.now()?;
    let t_conv_end = Timestamp::now();
    info!(seconds = g.convergence_s, compliant = g.compliant, "converged");

    // What the operator's reflectors hold, as JSON.
    g.cached_nodes_mib = cached_mib(nodes.list(&ListParams::default()).await?.items);
    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    g.cached_reports_mib = cached_mib(reports.list(&ListParams::default()).await?.items);

    // Reaction while the other nodes heartbeat: gpunode's and the floor's in turn.
    let t_react = Timestamp::now();
    let (mut op, runs, spent) = reactions(args, (&load, &tracker), (&spec, &op_kc), op).await?;
    let g = &mut result.gpunode;
    let of = |f: fn(&reaction_results::Run) -> &Vec<f64>| -> Vec<f64> {
        runs.iter()
            .filter(|r| r.controller == Controller::Gpunode)
            .flat_map(|r| f(r).iter().copied())
            .collect()
    };
    g.reaction = Latency::of(&of(|r| &r.single.written_to_taint_ms));
    g.reaction_from_change = Latency::of(&of(|r| &r.single.change_to_taint_ms));
    g.recovery = Latency::of(&of(|r| &r.single.recovery_ms));
    g.reaction_failures = runs
        .iter()
        .filter(|r| r.controller == Controller::Gpunode)
        .map(|r| r.single.failures)
        .sum();
    g.reaction_rss_peak_mib = spent.hwm_mib;
    g.reaction_cpu_s = spent.reaction_cpu_s;
    result.reactions = runs;
    let s_react = op.now()?;
    let t_react_end = Timestamp::now();
    info!(
        p50 = g.reaction.p50_ms,
        p99 = g.reaction.p99_ms,
        failed = g.reaction_failures,
        "reaction measured"
    );

    // A profile of the operator that runs on after the reaction phases (the real probes and
    // the steady state).
    let perf = if args.perf {
        let path = args.out.join(format!("perf-{n}.data"));
        std::process::Command::new("perf")
            // The CPU clock, not the PMU's cycles (a VM may have none: perf then records next
            // to nothing); no call graphs (release builds have no frame pointers).
            .args(["record", "-e", "cpu-clock", "-F", "199", "-o"])
            .arg(&path)
            .args(["-p", &op.pid().to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()
            .map(|c| (c, path))
    } else {
        None
    };
    // End to end with the real probes.
    if let Some(real) = real.as_mut() {
        info!(
            probes = k,
            rounds = args.real_rounds,
            "measuring the real probes' reaction"
        );
        let m = real.reaction(&tracker, args.real_rounds).await;
        info!(
            p50 = m.observation_to_taint.p50_ms,
            p99 = m.observation_to_taint.p99_ms,
            samples = m.observation_to_taint.count,
            probe_share_p99 = m.observation_to_publish.p99_ms,
            operator_share_p99 = m.publish_to_taint.p99_ms,
            failures = m.failures,
            "real probes: observation to taint"
        );
        result.gpunode.real_probes = Some(m);
    }
    let probes_before = real.as_ref().map(RealProbes::sample);

    // Steady state: nothing changes but heartbeats (a measurement window, not a test). It
    // starts after the real probes' rounds, whose taints and Events are reaction, not steady
    // state (until dc5b1b8 the window began before them and counted their writes).
    let s_steady_start = op.now()?;
    let t_steady_start = Timestamp::now();
    let published_before = load.published();
    let beats_before = load.stats.beats.load(std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(args.steady).await;
    let s_steady = op.now()?;
    let t_steady_end = Timestamp::now();
    if let (Some(real), Some(before), Some(m)) = (&real, probes_before, result.gpunode.real_probes.as_mut()) {
        let secs = args.steady.as_secs_f64().max(1.0);
        for (b, a) in before.iter().zip(real.sample()) {
            m.cpu_percent.push((a.cpu_s - b.cpu_s) / secs * 100.0);
            m.rss_peak_mib.push(a.hwm_mib);
        }
    }
    result.loadgen.insert(
        "steady_publishes_per_s".into(),
        (load.published() - published_before) as f64 / args.steady.as_secs_f64(),
    );
    result.loadgen.insert(
        "steady_lease_renewals_per_s".into(),
        (load.stats.beats.load(std::sync::atomic::Ordering::Relaxed) - beats_before) as f64
            / args.steady.as_secs_f64(),
    );
    if let Some((mut child, path)) = perf {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let _ = child.wait();
        info!(path = %path.display(), "perf profile written");
    }

    if let Ok(http::Response { body: metrics, .. }) = http::get(spec.metrics_addr, "/metrics").await {
        let g = &mut result.gpunode;
        g.reconciles = http::series(&metrics, "gpunode_reconciles_total").unwrap_or(0.0);
        let sum = http::series(&metrics, "gpunode_reconcile_duration_seconds_sum").unwrap_or(0.0);
        let count = http::series(&metrics, "gpunode_reconcile_duration_seconds_count").unwrap_or(0.0);
        g.reconcile_mean_ms = if count > 0.0 { sum / count * 1000.0 } else { 0.0 };
        g.operator_reaction_count = http::series(&metrics, "gpunode_reaction_seconds_count").unwrap_or(0.0);
        std::fs::write(args.out.join(format!("operator-metrics-{n}.txt")), metrics)
            .map_err(Error::io("writing the operator's metrics"))?;
    }
    let timeline = op.timeline.lock().map(|t| t.clone()).unwrap_or_default();
    std::fs::write(
        args.out.join(format!("operator-samples-{n}.json")),
        serde_json::to_string(&timeline)?,
    )
    .map_err(Error::io("writing the operator's samples"))?;
    let last = op.stop().await;
    let g = &mut result.gpunode;
    // gpunode ran as several processes (stopped while the floor answered): the peak is the
    // largest of theirs, the CPU by phase that of the process running it.
    g.rss_peak_mib = last.hwm_mib.max(g.reaction_rss_peak_mib);
    g.rss_end_mib = s_steady.rss_mib;
    let mut cpu = BTreeMap::from([
        ("startup".to_string(), s_synced.cpu_s),
        ("convergence".to_string(), s_conv.cpu_s - s_synced.cpu_s),
        ("reaction".to_string(), g.reaction_cpu_s),
        ("real_probes".to_string(), s_steady_start.cpu_s - s_react.cpu_s),
        ("steady".to_string(), s_steady.cpu_s - s_steady_start.cpu_s),
    ]);
    cpu.insert("total".to_string(), cpu.values().sum());
    g.cpu_s = cpu;
    result.load_avg.insert("after_gpunode".into(), procs::load_avg());

    // The reference write rate for gpunode's own request, interleaved with more convergence runs.
    info!(
        reps = args.reps,
        "measuring the reference write rate, interleaved with convergence runs"
    );
    let t_reference = Timestamp::now();
    reference_and_convergence(args, &op_kc, &spec, &tracker, &policies, &policy, &mut result).await?;
    let t_peer = Timestamp::now();

    // The peer beside gpunode's convergence, repeated and alternated (peer.rs).
    let mut nfd_windows = Vec::new();
    if let Some((bin, crds)) = &args.nfd {
        let ctx = peer::PeerCtx {
            client: &client,
            kc: &kc,
            names: &names,
            nfd: (bin, crds),
            out: &args.out,
            deadline: args.nfd_deadline,
            parallelism: &args.nfd_parallelism,
        };
        let converge = async |rep: usize| {
            let label = format!("peer{rep}");
            converge_again(args, &spec, &tracker, &policies, &policy, &label)
                .await
                .map(|(last, _)| last)
        };
        nfd_windows = peer::compare(&ctx, args.peer_reps, &mut result, converge).await?;
    }
    let t_peer_end = Timestamp::now();

    result.loadgen.insert("publishes".into(), load.published() as f64);
    result.loadgen.insert(
        "lease_renewals".into(),
        load.stats.beats.load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    result.loadgen.insert(
        "failed".into(),
        load.stats.failed.load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    load.stop().await;
    if let Some(real) = real {
        real.stop(&client).await;
    }
    result.load_avg.insert("end".into(), procs::load_avg());

    // Requests, as the API server logged them.
    let all = audit::read(&args.audit_log)?;
    let user = format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}");
    let g = &mut result.gpunode;
    // Each phase's wall-clock window, to match a spike in any figure with what ran then.
    let windows = [
        ("startup", t_start, t_conv),
        ("convergence", t_conv, t_conv_end),
        ("reaction", t_react, t_react_end),
        ("real_probes", t_react_end, t_steady_start),
        ("steady", t_steady_start, t_steady_end),
    ];
    result.phases = windows
        .iter()
        .map(|(p, from, to)| (p.to_string(), from.to_string(), to.to_string()))
        .chain([
            (
                "reference".to_string(),
                t_reference.to_string(),
                t_peer.to_string(),
            ),
            ("peer".to_string(), t_peer.to_string(), t_peer_end.to_string()),
        ])
        .collect();
    for (phase, from, to) in windows {
        g.requests
            .insert(phase.to_string(), requests(&all, &user, from, to));
    }
    let steady = g.requests.get("steady").map_or(0, |r| r.total);
    g.steady_requests_per_node_min = steady as f64 / n as f64 / (args.steady.as_secs_f64() / 60.0);
    for (i, from, to) in nfd_windows {
        if let Some(peer) = result.nfd_runs.get_mut(i) {
            peer.requests = requests(&all, nfd::USER, from, to);
        }
    }
    peer::headline(&mut result, &args.nfd_parallelism);
    Ok(result)
}
