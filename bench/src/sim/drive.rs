//! One simulation run: the real gpunode-operator binary against the synthetic API at N nodes.
//!
//! 1. **Start-up**: the fleet (N kubelet-sized Nodes, N healthy reports, N heartbeat Leases) and
//!    the benchmark policy exist before the operator starts; start-up is from its start to the
//!    first write of a node (its first plan applied), then to every node carrying gpunode's
//!    condition (convergence), then until its writes stop.
//! 2. **Memory**: its resident set once quiet, per node.
//! 3. **Reaction**: `changes` times, one node's report turns drifting (GPU 0 thermally
//!    throttled) and, once tainted, healthy again; the time from the report's write (the
//!    moment the synthetic API stores it and tells the watches) to the taint's write, and to its
//!    removal, per change; the operator's CPU over the phase per report change (idle included:
//!    its idle rate is measured before, over a quiet window, and given beside it).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use gpunode_operator::markers::{CONDITION_TYPE, TAINT_KEY};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;

use super::{
    api::{Api, Observer},
    objects::{self, NODES, POLICIES, REPORTS},
    store::{Store, Written},
};
use crate::{
    error::Error,
    procs::{self, Measured},
    results::Latency,
    run,
};

/// What to run.
#[derive(Debug, Clone)]
pub struct SimArgs {
    /// Nodes.
    pub n: usize,
    /// The gpunode-operator binary.
    pub operator: PathBuf,
    /// Report changes that turn a node drifting (each is followed by its recovery).
    pub changes: usize,
    /// `--planning` of the operator.
    pub planning: String,
    /// Where the log, kubeconfig and result go.
    pub out: PathBuf,
    /// Which repetition this is (in file names).
    pub rep: usize,
    /// Longest a phase may take.
    pub deadline: Duration,
    /// The quiet window the idle CPU is measured over (zero: not measured).
    pub idle: Duration,
}

/// What one run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SimResult {
    /// Nodes.
    pub n: usize,
    /// `--planning`.
    pub planning: String,
    /// Repetition.
    pub rep: usize,
    /// The commit of the code (and binaries) measured.
    pub commit: String,
    /// Bytes of one Node's JSON, of one report's.
    pub node_bytes: usize,
    /// Bytes of one report's JSON.
    pub report_bytes: usize,
    /// Operator start → its first node write (its first plan applied), seconds.
    pub startup_to_first_write_s: f64,
    /// Operator start → every node carries gpunode's condition, seconds.
    pub convergence_s: f64,
    /// Resident set once quiet after convergence, MiB.
    pub rss_mib: f64,
    /// Its peak so far, MiB.
    pub hwm_mib: f64,
    /// Resident set per node, KiB.
    pub rss_per_node_kib: f64,
    /// CPU while quiet, core-milliseconds per second.
    pub idle_cpu_ms_per_s: f64,
    /// Report turned drifting → taint written.
    pub taint: Latency,
    /// Report healthy again → taint removed.
    pub untaint: Latency,
    /// Operator CPU over the reaction phase per report change (two per drift), core-ms.
    pub cpu_per_change_ms: f64,
    /// Every drift → taint sample, ms, in order.
    pub taint_samples_ms: Vec<f64>,
    /// Every recovery → untaint sample, ms, in order.
    pub untaint_samples_ms: Vec<f64>,
    /// Requests the operator made, by kind.
    pub requests: HashMap<String, u64>,
}

/// What the observer saw of the nodes.
#[derive(Default)]
struct Seen {
    /// Nodes carrying gpunode's condition.
    conditioned: AtomicU64,
    /// Node writes.
    writes: AtomicU64,
    first_write: Mutex<Option<Instant>>,
    /// By node: carries the condition; tainted by gpunode, since when.
    nodes: Mutex<HashMap<String, (bool, bool, Instant)>>,
    changed: Notify,
}

impl Seen {
    fn saw(&self, name: &str, node: &Value) {
        let conditioned = node["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"].as_str() == Some(CONDITION_TYPE)));
        let tainted = node["spec"]["taints"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["key"].as_str() == Some(TAINT_KEY)));
        let now = Instant::now();
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.first_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(now);
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        let before = nodes.get(name).copied();
        if conditioned && !before.is_some_and(|b| b.0) {
            self.conditioned.fetch_add(1, Ordering::Relaxed);
        }
        let since = match before {
            Some((_, t, at)) if t == tainted => at,
            _ => now,
        };
        nodes.insert(name.to_string(), (conditioned, tainted, since));
        drop(nodes);
        self.changed.notify_waiters();
    }

    /// Since when node `name` is tainted (or not), if it is.
    fn tainted_since(&self, name: &str, tainted: bool) -> Option<Instant> {
        let nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        nodes.get(name).filter(|n| n.1 == tainted).map(|n| n.2)
    }

    /// Waits until `done` holds, or `deadline` passes.
    async fn until<T>(
        &self,
        what: &str,
        deadline: Duration,
        mut done: impl FnMut() -> Option<T>,
    ) -> Result<T, Error> {
        let end = tokio::time::Instant::now() + deadline;
        loop {
            let notified = self.changed.notified();
            if let Some(t) = done() {
                return Ok(t);
            }
            // A periodic look too: not every condition is a node write (the writes stopping).
            let wake = (tokio::time::Instant::now() + Duration::from_millis(250)).min(end);
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wake) => {}
            }
            if tokio::time::Instant::now() >= end {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    after: deadline,
                });
            }
        }
    }
}

/// The benchmark policy, with reports stale only after an hour: the simulation renews no
/// heartbeat, and a run at 100,000 nodes takes minutes.
fn policy() -> Result<Value, Error> {
    let mut p = run::policy()?;
    p["apiVersion"] = Value::from("gpunode.dev/v1alpha1");
    p["kind"] = Value::from("GpuNodePolicy");
    p["spec"]["staleAfter"] = Value::from("1h");
    Ok(p)
}

/// The fleet and the policy, in a new store.
fn seed(
    n: usize,
    template: &gpunode_crds::report::GpuNodeReportStatus,
) -> Result<(Arc<Store>, usize, usize), Error> {
    let store = Arc::new(Store::default());
    let now = Timestamp::now();
    let node_bytes = objects::node(0, now).to_string().len();
    let report_bytes = objects::report(template, 0, false, now)?.to_string().len();
    store.seed(NODES, (0..n).map(|i| objects::node(i, now)));
    let reports = (0..n)
        .map(|i| objects::report(template, i, false, now))
        .collect::<Result<Vec<_>, _>>()?;
    store.seed(REPORTS, reports);
    let leases = (0..n)
        .map(|i| objects::lease(i, now))
        .collect::<Result<Vec<_>, _>>()?;
    store.seed(&objects::leases(), leases);
    store.seed(POLICIES, [policy()?]);
    Ok((store, node_bytes, report_bytes))
}

fn kubeconfig(out: &Path, addr: std::net::SocketAddr) -> Result<PathBuf, Error> {
    let path = out.join("sim-kubeconfig.yaml");
    let kc: kube::config::Kubeconfig = serde_json::from_value(serde_json::json!({
        "clusters": [{"name": "sim", "cluster": {"server": format!("http://{addr}")}}],
        "users": [{"name": "sim", "user": {}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}],
        "current-context": "sim"
    }))?;
    std::fs::write(&path, serde_yaml::to_string(&kc)?)
        .map_err(Error::io(format!("writing {}", path.display())))?;
    Ok(path)
}

/// The operator, started against the synthetic API at `addr`.
fn start_operator(args: &SimArgs, kubeconfig: PathBuf) -> Result<Measured, Error> {
    let spec = gpunode_e2e::operator::Spec {
        bin: args.operator.clone(),
        instance: "sim".to_string(),
        kubeconfig,
        lease_namespace: None,
        metrics_addr: gpunode_e2e::http::free_addr()?,
        rust_log: Some(std::env::var("GPUNODE_SIM_RUST_LOG").unwrap_or_else(|_| "warn".to_string())),
        prefix: Vec::new(),
        env: vec![("GPUNODE_PLANNING".to_string(), args.planning.clone())],
    };
    let log = args.out.join(format!("sim-operator-{}-{}.log", args.n, args.rep));
    Measured::spawn_command("gpunode-operator", spec.command(), &log)
}

/// Writes node `i`'s report, drifting or not; returns when it was stored.
fn write_report(
    store: &Store,
    template: &gpunode_crds::report::GpuNodeReportStatus,
    i: usize,
    drifting: bool,
) -> Result<Instant, Error> {
    let new = objects::report(template, i, drifting, Timestamp::now())?;
    let at = Instant::now();
    match store.update(REPORTS, &objects::node_name(i), |obj, _| {
        *obj = new;
        true
    }) {
        Written::Ok(_) => Ok(at),
        _ => Err(Error::Other(format!("no report for node {i}"))),
    }
}

/// Runs the simulation once.
pub async fn run(args: &SimArgs) -> Result<SimResult, Error> {
    std::fs::create_dir_all(&args.out).map_err(Error::io(format!("creating {}", args.out.display())))?;
    let template = run::report_template()?;
    let (store, node_bytes, report_bytes) = seed(args.n, &template)?;
    let seen = Arc::new(Seen::default());
    let watcher = seen.clone();
    let observer: Observer = Arc::new(move |collection, name, obj| {
        if collection == NODES {
            watcher.saw(name, obj);
        }
    });
    let api = Api::new(store.clone(), observer);
    let counts = api.counts.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(Error::io("binding the synthetic API"))?;
    let addr = listener.local_addr().map_err(Error::io("reading its address"))?;
    let server = tokio::spawn(async move { axum::serve(listener, api.router()).await });
    let kubeconfig = kubeconfig(&args.out, addr)?;
    let started = Instant::now();
    let mut op = start_operator(args, kubeconfig)?;
    let result = measure(
        args,
        &store,
        &template,
        &seen,
        &mut op,
        started,
        (node_bytes, report_bytes),
    )
    .await;
    op.stop().await;
    server.abort();
    let mut result = result?;
    let c = &counts;
    for (k, v) in [
        ("list", &c.lists),
        ("watch", &c.watches),
        ("get", &c.gets),
        ("patch", &c.patches),
        ("create", &c.creates),
        ("replace or delete", &c.others),
        ("not served", &c.unknown),
    ] {
        result.requests.insert(k.to_string(), v.load(Ordering::Relaxed));
    }
    Ok(result)
}

async fn measure(
    args: &SimArgs,
    store: &Store,
    template: &gpunode_crds::report::GpuNodeReportStatus,
    seen: &Seen,
    op: &mut Measured,
    started: Instant,
    (node_bytes, report_bytes): (usize, usize),
) -> Result<SimResult, Error> {
    let n = args.n;
    let first = seen
        .until("the operator's first node write", args.deadline, || {
            *seen.first_write.lock().unwrap_or_else(PoisonError::into_inner)
        })
        .await?;
    seen.until("every node carrying gpunode's condition", args.deadline, || {
        (seen.conditioned.load(Ordering::Relaxed) >= n as u64).then_some(())
    })
    .await?;
    let convergence = started.elapsed();
    quiet(seen, op.pid(), args.deadline).await?;
    let ticks = procs::clock_ticks();
    let before_idle = procs::sample(op.pid(), ticks).unwrap_or_default();
    let idle_from = Instant::now();
    // The idle window: a measurement over a fixed time, not a wait for something to happen.
    tokio::time::sleep(args.idle).await;
    let after_idle = op.now()?;
    let idle_s = idle_from.elapsed().as_secs_f64();
    let (taints, untaints) = react(args, store, template, seen).await?;
    let after = op.now()?;
    let changes = (2 * args.changes).max(1) as f64;
    Ok(SimResult {
        n,
        planning: args.planning.clone(),
        rep: args.rep,
        commit: procs::commit(),
        node_bytes,
        report_bytes,
        startup_to_first_write_s: first.duration_since(started).as_secs_f64(),
        convergence_s: convergence.as_secs_f64(),
        rss_mib: after_idle.rss_mib,
        hwm_mib: after_idle.hwm_mib,
        rss_per_node_kib: after_idle.rss_mib * 1024.0 / n.max(1) as f64,
        idle_cpu_ms_per_s: if idle_s > 0.0 {
            (after_idle.cpu_s - before_idle.cpu_s) * 1000.0 / idle_s
        } else {
            0.0
        },
        taint: Latency::of(&taints),
        untaint: Latency::of(&untaints),
        cpu_per_change_ms: (after.cpu_s - after_idle.cpu_s) * 1000.0 / changes,
        taint_samples_ms: taints,
        untaint_samples_ms: untaints,
        requests: HashMap::new(),
    })
}

/// Most CPU a quiet operator uses, core-seconds per second: it has digested what it wrote.
const QUIET_CPU: f64 = 0.05;

/// Waits until the operator's node writes have stopped for two seconds and, over the last
/// second, it used at most [`QUIET_CPU`]: the watch events of its own writes are read back
/// seconds after the last write at 100,000 nodes.
async fn quiet(seen: &Seen, pid: u32, deadline: Duration) -> Result<(), Error> {
    let ticks = procs::clock_ticks();
    let cpu = || procs::sample(pid, ticks).map_or(0.0, |s| s.cpu_s);
    let mut last = (seen.writes.load(Ordering::Relaxed), Instant::now());
    let mut window = (cpu(), Instant::now(), f64::MAX);
    seen.until("the operator to be quiet", deadline, || {
        let now = seen.writes.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        }
        if window.1.elapsed() >= Duration::from_secs(1) {
            let used = cpu();
            window = (
                used,
                Instant::now(),
                (used - window.0) / window.1.elapsed().as_secs_f64(),
            );
        }
        (last.1.elapsed() >= Duration::from_secs(2) && window.2 <= QUIET_CPU).then_some(())
    })
    .await
}

/// The reaction phase: each change and its recovery, one at a time; the latencies in ms.
async fn react(
    args: &SimArgs,
    store: &Store,
    template: &gpunode_crds::report::GpuNodeReportStatus,
    seen: &Seen,
) -> Result<(Vec<f64>, Vec<f64>), Error> {
    let (mut taints, mut untaints) = (Vec::new(), Vec::new());
    let wait = Duration::from_secs(30);
    for k in 0..args.changes {
        // Nodes spread over the fleet, none twice in a row.
        let i = (k * 7919 + 13) % args.n;
        let name = objects::node_name(i);
        for drifting in [true, false] {
            let at = write_report(store, template, i, drifting)?;
            let done = seen
                .until(&format!("{name} tainted: {drifting}"), wait, || {
                    seen.tainted_since(&name, drifting).filter(|t| *t >= at)
                })
                .await?;
            let ms = done.duration_since(at).as_secs_f64() * 1000.0;
            if drifting { &mut taints } else { &mut untaints }.push(ms);
        }
    }
    Ok((taints, untaints))
}
