//! `gpunode-bench sim` (`make bench-sim`): the real operator at 10,000 to 100,000 nodes, without
//! a cluster. A synthetic API server in this process ([`api`], [`store`]) speaks list and watch
//! for Nodes, reports, heartbeat Leases and policies and takes the operator's writes; the fleet
//! ([`objects`]) is kubelet-sized. Each N runs `reps` times ([`drive`]); the results, raw
//! samples included, go to `<out>/sim-results.json` and a table to `<out>/sim.md`, medians with
//! [min–max] over the runs.
//!
//! What it measures is the operator alone: the API server here costs next to nothing and
//! answers at once, so these are not figures of a real cluster (`make bench` measures those).

pub mod api;
pub mod drive;
pub mod objects;
pub mod store;

use std::{fmt::Write as _, path::Path};

use serde::{Deserialize, Serialize};

use crate::{error::Error, procs};

pub use drive::{SimArgs, SimResult};

/// Every run of one invocation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimResults {
    /// The machine and the commit.
    pub machine: procs::Machine,
    /// Every run, in the order they ran.
    pub runs: Vec<SimResult>,
}

/// Runs `reps` runs at each N of `ns`, N-major, writing the results after each run.
pub async fn run_all(base: &SimArgs, ns: &[usize], reps: usize) -> Result<SimResults, Error> {
    let mut all = SimResults {
        machine: procs::machine(&[(
            "gpunode-operator".to_string(),
            base.operator.clone(),
            vec!["--version".to_string()],
        )]),
        runs: Vec::new(),
    };
    for &n in ns {
        for rep in 0..reps.max(1) {
            let args = SimArgs {
                n,
                rep,
                ..base.clone()
            };
            tracing::info!(n, rep, "simulation run");
            let r = drive::run(&args).await?;
            tracing::info!(
                n,
                rep,
                startup_s = r.startup_to_first_write_s,
                taint_p99_ms = r.taint.p99_ms,
                rss_per_node_kib = r.rss_per_node_kib,
                "done"
            );
            all.runs.push(r);
            write(&base.out, &all)?;
        }
    }
    Ok(all)
}

fn write(out: &Path, all: &SimResults) -> Result<(), Error> {
    let json = out.join("sim-results.json");
    std::fs::write(&json, serde_json::to_string_pretty(all)?)
        .map_err(Error::io(format!("writing {}", json.display())))?;
    let md = out.join("sim.md");
    std::fs::write(&md, markdown(all)).map_err(Error::io(format!("writing {}", md.display())))
}

/// `median [min–max]` of `values`.
fn spread(values: &[f64], digits: usize) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => {
            let mid = v[(v.len() - 1) / 2];
            format!("{mid:.digits$} [{lo:.digits$}–{hi:.digits$}]")
        }
        _ => "–".to_string(),
    }
}

/// The table of the runs: one row per N, medians [min–max] over its runs.
pub fn markdown(all: &SimResults) -> String {
    let mut ns: Vec<usize> = all.runs.iter().map(|r| r.n).collect();
    ns.dedup();
    let m = &all.machine;
    let mut s = format!(
        "Binaries of commit `{}`, {} ({} cores, {:.0} GiB), started {}. Node objects {} bytes of JSON, reports {} bytes.\n\n",
        m.commit,
        m.cpu,
        m.cores,
        m.memory_gib,
        m.started,
        all.runs.first().map_or(0, |r| r.node_bytes),
        all.runs.first().map_or(0, |r| r.report_bytes),
    );
    s.push_str("| nodes | runs | start → first write, s | convergence, s | drift → taint p50, ms | p99, ms | recovery → untaint p99, ms | CPU per report change, core-ms | idle CPU, core-ms/s | RSS per node, KiB |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for n in ns {
        let runs: Vec<&SimResult> = all.runs.iter().filter(|r| r.n == n).collect();
        let col = |f: &dyn Fn(&SimResult) -> f64, d: usize| {
            spread(&runs.iter().map(|r| f(r)).collect::<Vec<_>>(), d)
        };
        let _ = writeln!(
            s,
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            runs.len(),
            col(&|r| r.startup_to_first_write_s, 1),
            col(&|r| r.convergence_s, 1),
            col(&|r| r.taint.p50_ms, 1),
            col(&|r| r.taint.p99_ms, 1),
            col(&|r| r.untaint.p99_ms, 1),
            col(&|r| r.cpu_per_change_ms, 2),
            col(&|r| r.idle_cpu_ms_per_s, 1),
            col(&|r| r.rss_per_node_kib, 2),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_spread_is_the_median_and_the_range() {
        assert_eq!(spread(&[3.0, 1.0, 2.0], 1), "2.0 [1.0–3.0]");
        assert_eq!(spread(&[], 1), "–");
    }

    /// The simulation at a small N, so it cannot rot: the operator binary `cargo build
    /// --workspace` made starts against the synthetic API, converges, and taints and untaints
    /// every changed node.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_operator_runs_against_the_synthetic_api() {
        let out = tempfile::tempdir().unwrap();
        let args = SimArgs {
            n: 200,
            operator: gpunode_e2e::operator::binary().unwrap(),
            changes: 5,
            planning: "incremental".to_string(),
            out: out.path().to_path_buf(),
            rep: 0,
            deadline: Duration::from_secs(120),
            idle: Duration::ZERO,
        };
        let r = drive::run(&args).await.unwrap();
        assert_eq!((r.taint.count, r.untaint.count), (5, 5));
        assert!(r.startup_to_first_write_s > 0.0 && r.convergence_s >= r.startup_to_first_write_s);
        assert!(r.rss_mib > 0.0);
        assert_eq!(r.requests.get("not served"), Some(&0), "{:?}", r.requests);
    }
}
