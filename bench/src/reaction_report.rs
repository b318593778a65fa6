//! The reaction section of results.md: gpunode beside the floor (the minimal controller), for
//! single faults, bursts and the open loop, each figure a median [min–max] over the repetitions
//! of one `make bench`, and the reaction targets of issue 45 judged from the same run.

use std::fmt::Write as _;

use crate::{
    reaction_results::{Controller, Run},
    results::RunResult,
    stats::{Latency, Spread, figure as f},
};

fn spread(v: &[f64]) -> String {
    let s = Spread::of(v);
    format!("{} [{}–{}]", f(s.median), f(s.min), f(s.max))
}

fn of(runs: &[Run], c: Controller) -> Vec<&Run> {
    runs.iter().filter(|r| r.controller == c).collect()
}

/// Every N's result with each controller that ran there and its repetitions, in table order.
fn by_controller(runs: &[RunResult]) -> impl Iterator<Item = (&RunResult, Controller, Vec<&Run>)> {
    runs.iter().flat_map(|r| {
        [Controller::Gpunode, Controller::Floor]
            .into_iter()
            .map(move |c| (r, c, of(&r.reactions, c)))
            .filter(|(_, _, rs)| !rs.is_empty())
    })
}

fn p50(samples: &[f64]) -> f64 {
    Latency::of(samples).p50_ms
}

fn p99(samples: &[f64]) -> f64 {
    Latency::of(samples).p99_ms
}

/// Per repetition: gpunode's figure over the floor's in the same repetition.
fn ratios(runs: &[Run], figure: impl Fn(&Run) -> f64) -> Vec<f64> {
    of(runs, Controller::Gpunode)
        .iter()
        .filter_map(|g| {
            let fl = runs
                .iter()
                .find(|r| r.controller == Controller::Floor && r.rep == g.rep)?;
            let d = figure(fl);
            (d > 0.0).then(|| figure(g) / d)
        })
        .collect()
}

/// The medians over repetitions the targets read, for `c` at one N.
#[derive(Debug, Clone, Copy, Default)]
struct Medians {
    p99_ms: f64,
    cpu_ms_per_change: f64,
    burst_worst_ms: f64,
}

/// None when `c` has no run (an older result, or a run without reaction phases).
fn medians(runs: &[Run], c: Controller) -> Option<Medians> {
    let rs = of(runs, c);
    if rs.is_empty() {
        return None;
    }
    let med = |v: Vec<f64>| Spread::of(&v).median;
    Some(Medians {
        p99_ms: med(rs.iter().map(|r| p99(&r.single.written_to_taint_ms)).collect()),
        cpu_ms_per_change: med(rs.iter().map(|r| r.single.cpu_ms_per_change).collect()),
        burst_worst_ms: rs
            .iter()
            .flat_map(|r| r.bursts.iter().map(|b| b.last_written_to_all_ms))
            .fold(0.0, f64::max),
    })
}

fn single_table(s: &mut String, runs: &[RunResult]) {
    let _ = writeln!(
        s,
        "### Single faults, one at a time (report written → taint seen)\n\n\
         Per repetition, the percentile of its faults; the table gives their median [min–max] over \
         the repetitions. CPU: the controller's CPU time over the phase per report change (a fault \
         and its recovery are two).\n"
    );
    let _ = writeln!(
        s,
        "| N | controller | reps | faults | p50 ms | p99 ms | recovery p99 ms | CPU ms per report change | passes per change | CPU ms per pass | failures | gpunode / floor p99 |"
    );
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (r, c, rs) in by_controller(runs) {
        let col = |g: &dyn Fn(&Run) -> f64| spread(&rs.iter().map(|r| g(r)).collect::<Vec<_>>());
        let ratio = match c {
            Controller::Gpunode => spread(&ratios(&r.reactions, |x| p99(&x.single.written_to_taint_ms))),
            Controller::Floor => "–".into(),
        };
        // Per pass: the phase's CPU over its passes (gpunode counts them; the floor has none).
        let (passes, per_pass) = if rs.iter().all(|x| x.single.passes_per_change.is_some()) {
            let pp = |x: &Run| x.single.passes_per_change.unwrap_or(0.0);
            (
                col(&pp),
                col(&|x| x.single.cpu_ms_per_change / pp(x).max(f64::MIN_POSITIVE)),
            )
        } else {
            ("–".into(), "–".into())
        };
        let _ = writeln!(
            s,
            "| {} | {c:?} | {} | {} | {} | {} | {} | {} | {passes} | {per_pass} | {} | {ratio} |",
            r.n,
            rs.len(),
            rs.iter()
                .map(|x| x.single.written_to_taint_ms.len())
                .sum::<usize>(),
            col(&|x| p50(&x.single.written_to_taint_ms)),
            col(&|x| p99(&x.single.written_to_taint_ms)),
            col(&|x| p99(&x.single.recovery_ms)),
            col(&|x| x.single.cpu_ms_per_change),
            rs.iter().map(|x| x.single.failures).sum::<usize>(),
        );
    }
}

fn burst_table(s: &mut String, runs: &[RunResult]) {
    let _ = writeln!(
        s,
        "\n### Bursts (nodes faulted at once)\n\n\
         Median [min–max] over every burst of every repetition. *Last written → all tainted*: from \
         the last of the burst's reports stored to the last taint seen (the controller's share); \
         *injected → all tainted* adds the load generator's writes.\n"
    );
    let _ = writeln!(
        s,
        "| N | controller | size | bursts | last written → all tainted ms | injected → all tainted ms | per node p99 ms | failures |"
    );
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|");
    for (r, c, rs) in by_controller(runs) {
        let bs: Vec<_> = rs.into_iter().flat_map(|x| &x.bursts).collect();
        let Some(first) = bs.first() else { continue };
        let col = |g: &dyn Fn(&crate::reaction_results::Burst) -> f64| {
            spread(&bs.iter().map(|b| g(b)).collect::<Vec<_>>())
        };
        let _ = writeln!(
            s,
            "| {} | {c:?} | {} | {} | {} | {} | {} | {} |",
            r.n,
            first.size,
            bs.len(),
            col(&|b| b.last_written_to_all_ms),
            col(&|b| b.injected_to_all_ms),
            col(&|b| p99(&b.written_to_taint_ms)),
            bs.iter().map(|b| b.failures).sum::<usize>(),
        );
    }
}

fn open_loop_table(s: &mut String, runs: &[RunResult]) {
    let _ = writeln!(
        s,
        "\n### Open loop (faults injected at a fixed rate, whatever the answers)\n\n\
         Rate after rate until one is not sustained (a fault unanswered within 30 s, or the p99 \
         over {} ms). Saturation: the last rate sustained, median [min–max] over the repetitions; \
         then each rate's p99 in ms, median over the repetitions that ran it.\n",
        crate::reaction_results::SUSTAINED_P99_MS
    );
    let _ = writeln!(s, "| N | controller | saturation faults/s | p99 ms by rate |");
    let _ = writeln!(s, "|---:|---|---:|---|");
    for (r, c, rs) in by_controller(runs) {
        let mut rates: Vec<f64> = rs
            .iter()
            .flat_map(|x| x.open_loop.iter().map(|o| o.rate))
            .collect();
        rates.sort_by(f64::total_cmp);
        rates.dedup();
        let by_rate: Vec<String> = rates
            .iter()
            .map(|rate| {
                let p99s: Vec<f64> = rs
                    .iter()
                    .flat_map(|x| x.open_loop.iter().filter(|o| o.rate == *rate))
                    .map(|o| p99(&o.written_to_taint_ms))
                    .collect();
                format!("{rate}/s: {}", f(Spread::of(&p99s).median))
            })
            .collect();
        let sat: Vec<f64> = rs.iter().map(|x| x.saturation_rate).collect();
        let _ = writeln!(
            s,
            "| {} | {c:?} | {} | {} |",
            r.n,
            spread(&sat),
            by_rate.join(", ")
        );
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

fn targets(s: &mut String, runs: &[RunResult]) {
    let at = |n: usize, c: Controller| {
        runs.iter()
            .find(|r| r.n == n)
            .and_then(|r| medians(&r.reactions, c))
    };
    let (Some(small), Some(large)) = (at(100, Controller::Gpunode), at(5000, Controller::Gpunode)) else {
        let _ = writeln!(
            s,
            "\nThe reaction targets (issue 45) need gpunode's reaction phases at N = 100 and N = 5000: not measured in this run."
        );
        return;
    };
    let floor = at(5000, Controller::Floor);
    let cpu = large.cpu_ms_per_change / small.cpu_ms_per_change.max(f64::MIN_POSITIVE);
    let grow = large.p99_ms / small.p99_ms.max(f64::MIN_POSITIVE);
    let _ = writeln!(s, "\n### Reaction targets (issue 45), from this run\n");
    let _ = writeln!(
        s,
        "- CPU per report change at 5,000 ≤ 1.5x that at 100: {} / {} ms = {cpu:.2}x: {}",
        f(large.cpu_ms_per_change),
        f(small.cpu_ms_per_change),
        verdict(cpu <= 1.5)
    );
    let _ = writeln!(
        s,
        "- report written → taint p99 at 5,000 ≤ 1.2x that at 100: {} / {} ms = {grow:.2}x: {}",
        f(large.p99_ms),
        f(small.p99_ms),
        verdict(grow <= 1.2)
    );
    match floor {
        Some(floor) => {
            let to_floor = large.p99_ms / floor.p99_ms.max(f64::MIN_POSITIVE);
            let _ = writeln!(
                s,
                "- the same p99 ≤ 3x the floor's at 5,000: {} / {} ms = {to_floor:.2}x: {}",
                f(large.p99_ms),
                f(floor.p99_ms),
                verdict(floor.p99_ms > 0.0 && to_floor <= 3.0)
            );
        }
        None => {
            let _ = writeln!(
                s,
                "- the same p99 ≤ 3x the floor's at 5,000: not measured (no floor run)"
            );
        }
    }
    let _ = writeln!(
        s,
        "- a burst at 5,000 fully tainted within 1 s of its last report (the slowest burst): {} ms: {}",
        f(large.burst_worst_ms),
        verdict(large.burst_worst_ms > 0.0 && large.burst_worst_ms <= 1000.0)
    );
}

/// The section, from every N's runs.
pub fn markdown(runs: &[RunResult]) -> String {
    let mut s = String::from("\n## Reaction: gpunode beside the floor\n\n");
    let _ = writeln!(
        s,
        "The floor is a minimal controller (bench/src/floor.rs: it taints a node while its report \
         shows a throttled GPU, nothing else) with gpunode's client, ServiceAccount and write \
         concurrency, answering the same faults in the same run; gpunode is stopped while it \
         runs, and which of the two goes first alternates by repetition. Raw samples: \
         raw/n<N>.json, `reactions`.\n"
    );
    single_table(&mut s, runs);
    burst_table(&mut s, runs);
    open_loop_table(&mut s, runs);
    targets(&mut s, runs);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reaction_results::{Burst, Single};

    fn run(controller: Controller, rep: usize, ms: f64, cpu: f64) -> Run {
        Run {
            controller,
            rep,
            phases: Vec::new(),
            single: Single {
                written_to_taint_ms: vec![ms; 10],
                change_to_taint_ms: vec![ms; 10],
                recovery_ms: vec![ms; 10],
                failures: 0,
                cpu_ms_per_change: cpu,
                passes_per_change: (controller == Controller::Gpunode).then_some(1.25),
            },
            bursts: vec![Burst {
                size: 256,
                last_written_to_all_ms: ms * 5.0,
                ..Burst::default()
            }],
            open_loop: Vec::new(),
            saturation_rate: 50.0,
        }
    }

    fn at(n: usize, gpunode_ms: f64, cpu: f64) -> RunResult {
        RunResult {
            n,
            reactions: (0..3)
                .flat_map(|rep| {
                    [
                        run(Controller::Gpunode, rep, gpunode_ms, cpu),
                        run(Controller::Floor, rep, 20.0, 1.0),
                    ]
                })
                .collect(),
            ..RunResult::default()
        }
    }

    #[test]
    fn the_targets_are_judged_from_the_medians_of_the_same_run() {
        let md = markdown(&[at(100, 40.0, 2.0), at(5000, 44.0, 2.8)]);
        assert!(md.contains("= 1.40x: met"), "{md}");
        assert!(md.contains("44.0 / 40.0 ms = 1.10x: met"), "{md}");
        assert!(md.contains("44.0 / 20.0 ms = 2.20x: met"), "{md}");
        assert!(
            md.contains("| 5000 | Gpunode | 3 | 30 | 44.0 [44.0–44.0] |"),
            "{md}"
        );
        // 2.8 ms per change at 1.25 passes per change: 2.24 ms per pass.
        assert!(md.contains("| 1.25 [1.25–1.25] | 2.24 [2.24–2.24] |"), "{md}");
        assert!(
            md.contains("| 5000 | Floor | 3 | 30 | 20.0 [20.0–20.0] | 20.0 [20.0–20.0] | 20.0 [20.0–20.0] | 1.00 [1.00–1.00] | – | – |"),
            "{md}"
        );
        // A result without reaction phases (before issue 45) judges nothing.
        let md = markdown(&[
            RunResult {
                n: 100,
                ..RunResult::default()
            },
            RunResult {
                n: 5000,
                ..RunResult::default()
            },
        ]);
        assert!(md.contains("not measured in this run"), "{md}");
        assert!(!md.contains("met"), "{md}");
        let md = markdown(&[at(100, 40.0, 2.0), at(5000, 90.0, 4.0)]);
        assert!(md.contains("= 2.00x: **missed**"), "{md}");
        assert!(md.contains("90.0 / 40.0 ms = 2.25x: **missed**"), "{md}");
        assert!(
            md.contains("fully tainted within 1 s of its last report (the slowest burst): 450 ms: met"),
            "{md}"
        );
    }
}
