//! Past this machine: a cost model fitted to the runs (each figure a straight line a + b·N by
//! least squares over the measured N) and the API server's cost per write
//! (bench/write-cost.sh), projected to fleets this machine cannot hold. A projection, not a
//! measurement: it assumes what grows per node keeps growing linearly, and it says nothing of
//! the API server's own memory, which the runs did not measure.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;

use crate::results::RunResult;

/// Fleet sizes the model projects to.
pub const PROJECT_TO: [usize; 3] = [10_000, 50_000, 100_000];

/// bench/write-cost.sh's figures (`WRITE_COST_JSON`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WriteCost {
    /// Requests timed per kind.
    pub requests_each: usize,
    /// kube-apiserver version.
    pub kube_apiserver: String,
    /// Commit measured.
    pub commit: String,
    /// Per kind of request.
    pub writes: BTreeMap<String, Cost>,
}

/// What one request costs.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Cost {
    /// kube-apiserver CPU, ms.
    pub apiserver_cpu_ms: f64,
    /// etcd CPU, ms.
    pub etcd_cpu_ms: f64,
}

/// y = a + b·N.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Line {
    /// At N = 0.
    pub a: f64,
    /// Per node.
    pub b: f64,
}

impl Line {
    /// Least squares over (N, y); a single point gives a line through the origin, and a figure
    /// that falls with N is flat at its largest value.
    pub fn fit(points: &[(f64, f64)]) -> Option<Line> {
        match points {
            [] => None,
            [(x, y)] => Some(Line {
                a: 0.0,
                b: if *x > 0.0 { y / x } else { 0.0 },
            }),
            _ => {
                let n = points.len() as f64;
                let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
                let my = points.iter().map(|p| p.1).sum::<f64>() / n;
                let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
                let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
                if sxx == 0.0 {
                    return None;
                }
                let b = sxy / sxx;
                if b < 0.0 {
                    // Falling with N is noise around a constant (at steady state, a handful of
                    // trailing writes at every N): projected flat at its largest measurement, never
                    // below what was measured and never negative.
                    let top = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
                    return Some(Line { a: top, b: 0.0 });
                }
                Some(Line { a: my - b * mx, b })
            }
        }
    }

    /// The value at `n`.
    pub fn at(&self, n: usize) -> f64 {
        self.a + self.b * n as f64
    }
}

/// The probe's writes per node and hour at its defaults (publish/config.rs
/// `PublishConfig::default`: a Lease renewal every 60 s, the whole report a jittered 300 to
/// 600 s after the last, 450 s on average: 8 an hour) — material changes come on top.
const LEASE_PER_HOUR: f64 = 60.0;
const REPORTS_PER_HOUR: f64 = 8.0;

/// One projected row.
struct Row {
    what: String,
    per: String,
    line: Line,
}

/// gpunode's CPU per report change: the median over its single-fault repetitions; for a result
/// from before they existed, its reaction phase's CPU over the changes and recoveries timed.
fn cpu_per_change(r: &RunResult) -> f64 {
    let single: Vec<f64> = r
        .reactions
        .iter()
        .filter(|x| x.controller == crate::reaction_results::Controller::Gpunode)
        .map(|x| x.single.cpu_ms_per_change)
        .collect();
    if !single.is_empty() {
        return crate::stats::Spread::of(&single).median;
    }
    let g = &r.gpunode;
    let changes = (g.reaction.count + g.recovery.count).max(1) as f64;
    g.cpu_s.get("reaction").copied().unwrap_or(0.0) * 1000.0 / changes
}

fn rows(runs: &[RunResult], cost: Option<&WriteCost>) -> Vec<Row> {
    let fit = |f: &dyn Fn(&RunResult) -> f64| {
        Line::fit(&runs.iter().map(|r| (r.n as f64, f(r))).collect::<Vec<_>>())
    };
    let mut out = Vec::new();
    let mut push = |what: &str, per: &str, line: Option<Line>| {
        if let Some(line) = line {
            out.push(Row {
                what: what.into(),
                per: per.into(),
                line,
            });
        }
    };
    push(
        "operator RSS, caches synced",
        "MiB",
        fit(&|r| r.gpunode.rss_synced_mib),
    );
    push("operator RSS, peak", "MiB", fit(&|r| r.gpunode.rss_peak_mib));
    push(
        "operator CPU while converging",
        "CPU s",
        fit(&|r| r.gpunode.cpu_s.get("convergence").copied().unwrap_or(0.0)),
    );
    push(
        "operator CPU at steady state",
        "cores",
        fit(&|r| {
            let secs = r.gpunode.requests.get("steady").map_or(0.0, |q| q.seconds);
            r.gpunode.cpu_s.get("steady").copied().unwrap_or(0.0) / secs.max(1.0)
        }),
    );
    // The per-change term: what each material report change costs, on top of the steady
    // state, whatever the change rate.
    push("operator CPU per report change", "CPU ms", fit(&cpu_per_change));
    push(
        "operator requests at steady state",
        "per minute",
        fit(&|r| r.gpunode.steady_requests_per_node_min * r.n as f64),
    );
    push(
        "objects the operator watches (nodes + reports, JSON)",
        "MiB",
        fit(&|r| r.gpunode.cached_nodes_mib + r.gpunode.cached_reports_mib),
    );
    if let Some(c) = cost {
        let lease = c.writes.get("lease_apply").copied().unwrap_or_default();
        let report = c.writes.get("report_apply").copied().unwrap_or_default();
        let record = c.writes.get("node_record_apply").copied().unwrap_or_default();
        let fleet = |f: fn(&Cost) -> f64| {
            (LEASE_PER_HOUR * f(&lease) + REPORTS_PER_HOUR * f(&report)) / 3600.0 / 1000.0
        };
        push(
            "kube-apiserver CPU for the probes' heartbeats and refreshes",
            "cores",
            Some(Line {
                a: 0.0,
                b: fleet(|c| c.apiserver_cpu_ms),
            }),
        );
        push(
            "etcd CPU for the same",
            "cores",
            Some(Line {
                a: 0.0,
                b: fleet(|c| c.etcd_cpu_ms),
            }),
        );
        push(
            "kube-apiserver CPU to converge every node once (one record each)",
            "CPU s",
            Some(Line {
                a: 0.0,
                b: record.apiserver_cpu_ms / 1000.0,
            }),
        );
    }
    out
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// The model's section of results.md.
pub fn markdown(runs: &[RunResult], cost: Option<&WriteCost>) -> String {
    let mut s = String::new();
    let measured: Vec<String> = runs.iter().map(|r| r.n.to_string()).collect();
    let _ = writeln!(s, "\n## Past this machine: a cost model\n");
    let _ = writeln!(
        s,
        "Each figure is a line a + b·N fitted (least squares) to the runs above (N = {}), \
         projected (a figure that falls with N is projected flat at its largest measurement); the API server's figures are bench/write-cost.sh's cost per request{} times \
         the probe's default writes (a Lease renewal a minute, the whole report every 10 \
         minutes; material changes come on top). A projection, not a measurement.\n",
        measured.join(", "),
        cost.map_or(
            String::from(" (not measured: raw/write-cost.json is missing)"),
            |c| format!(
                " (kube-apiserver {}, commit `{}`, {} requests each)",
                c.kube_apiserver, c.commit, c.requests_each
            )
        )
    );
    let heads: Vec<String> = PROJECT_TO.iter().map(|n| format!("{n} nodes")).collect();
    let _ = writeln!(s, "| figure | unit | per 1,000 nodes | {} |", heads.join(" | "));
    let _ = writeln!(s, "|---|---|---:|{}", "---:|".repeat(PROJECT_TO.len()));
    for row in rows(runs, cost) {
        let cells: Vec<String> = PROJECT_TO.iter().map(|&n| num(row.line.at(n))).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            row.what,
            row.per,
            num(row.line.b * 1000.0),
            cells.join(" | ")
        );
    }
    let _ = writeln!(
        s,
        "\nFor comparison, NVSentinel, the closest peer, publishes 32.6 KB of memory per node \
         measured at 100,010 nodes (an earlier figure of its, 221–235 GB for its control plane \
         at 100,000 nodes, is superseded), and time to cordon p50 26 ms / p99 165 ms on a \
         50,000-node fleet. gpunode adds no store: its state is the Nodes, GpuNodeReports and \
         Leases in the API server."
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_through_three_points_is_fitted_exactly() {
        let l = Line::fit(&[(100.0, 20.0), (1000.0, 38.0), (5000.0, 118.0)]).unwrap();
        assert!((l.b - 0.02).abs() < 1e-9 && (l.a - 18.0).abs() < 1e-9, "{l:?}");
        assert!((l.at(100_000) - 2018.0).abs() < 1e-6);
    }

    #[test]
    fn a_figure_that_falls_with_n_is_projected_flat_at_its_largest_measurement() {
        // The steady-state requests of the run at 43c43bc: 3, 9 and 3 in two minutes.
        let l = Line::fit(&[(100.0, 1.5), (1000.0, 4.5), (5000.0, 1.5)]).unwrap();
        assert_eq!(l, Line { a: 4.5, b: 0.0 });
        assert!((l.at(100_000) - 4.5).abs() < 1e-12);
    }

    #[test]
    fn one_point_is_a_line_through_the_origin_and_none_is_nothing() {
        assert_eq!(Line::fit(&[(10.0, 5.0)]), Some(Line { a: 0.0, b: 0.5 }));
        assert_eq!(Line::fit(&[]), None);
        assert_eq!(Line::fit(&[(10.0, 5.0), (10.0, 6.0)]), None);
    }

    #[test]
    fn the_fleet_cost_is_the_probe_writes_times_their_cost() {
        let cost = WriteCost {
            writes: BTreeMap::from([
                (
                    "lease_apply".into(),
                    Cost {
                        apiserver_cpu_ms: 3.6,
                        etcd_cpu_ms: 1.0,
                    },
                ),
                (
                    "report_apply".into(),
                    Cost {
                        apiserver_cpu_ms: 24.0,
                        etcd_cpu_ms: 2.0,
                    },
                ),
            ]),
            ..WriteCost::default()
        };
        let r = rows(&[], Some(&cost));
        let fleet = r
            .iter()
            .find(|r| r.what.starts_with("kube-apiserver CPU for the probes"))
            .unwrap();
        // (60 × 3.6 + 8 × 24) ms per node-hour = 408 ms / 3600 s = 0.1133 ms/s = 1.133e-4 cores
        // per node.
        let want = (60.0 * 3.6 + 8.0 * 24.0) / 3600.0 / 1000.0 * 100_000.0;
        assert!((fleet.line.at(100_000) - want).abs() < 1e-9, "{:?}", fleet.line);
    }
}
