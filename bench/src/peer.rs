//! gpunode beside its peer, NFD's nfd-master, repetition by repetition: gpunode's convergence on
//! a fresh operator, then NFD at its defaults and at each parallelism swept (no client-side
//! limit), which of the two goes first alternating by repetition and the parallelisms' order
//! rotating. Neither start-up counts (`nfd::run` waits out nfd-master's; gpunode's operator is
//! synced before its policy exists). The table quotes each NFD setting's median over the
//! repetitions and the median of its per-repetition ratios to gpunode, not the best run.

use std::{path::Path, time::Duration};

use jiff::Timestamp;
use kube::{Client, config::Kubeconfig};
use tracing::info;

use crate::{
    error::Error,
    nfd,
    results::{Nfd, RunResult, Tuning},
    stats::Spread,
};

/// What the comparison needs of the run.
pub struct PeerCtx<'a> {
    /// Admin client.
    pub client: &'a Client,
    /// Admin kubeconfig.
    pub kc: &'a Kubeconfig,
    /// The benchmark's nodes.
    pub names: &'a [String],
    /// nfd-master and NFD's CRD file.
    pub nfd: (&'a Path, &'a Path),
    /// Where logs go.
    pub out: &'a Path,
    /// How long NFD may take before its time is projected.
    pub deadline: Duration,
    /// NFD's parallelisms swept, besides its defaults.
    pub parallelism: &'a [usize],
}

/// Each NFD setting run in one repetition: the defaults, then every parallelism swept,
/// rotated by `rep`.
pub fn settings(parallelism: &[usize], rep: usize) -> Vec<Tuning> {
    let mut tuned: Vec<Tuning> = parallelism.iter().map(|&p| Tuning::tuned(p)).collect();
    if !tuned.is_empty() {
        let k = rep % tuned.len();
        tuned.rotate_left(k);
    }
    std::iter::once(Tuning::DEFAULTS).chain(tuned).collect()
}

/// One setting over the repetitions: the run with the median convergence (its figures stand
/// for the setting) and the median of the per-repetition ratios NFD / gpunode.
pub fn summarize(runs: &[Nfd], gpunode_s: &[f64], setting: Tuning) -> Option<(Nfd, f64, Spread)> {
    let mut of: Vec<&Nfd> = runs.iter().filter(|r| r.setting == Some(setting)).collect();
    of.sort_by(|a, b| a.convergence_s.total_cmp(&b.convergence_s));
    let median = of.get(of.len().checked_sub(1)? / 2).copied()?.clone();
    let ratios: Vec<f64> = of
        .iter()
        .filter_map(|r| {
            let g = gpunode_s.get(r.rep).copied().filter(|g| *g > 0.0)?;
            Some(r.convergence_s / g)
        })
        .collect();
    let spread = Spread::of(&ratios);
    Some((median, spread.median, spread))
}

/// Fills the result's headline peer figures from its runs: at its defaults, and at the swept
/// parallelism with the lowest median convergence (its best).
pub fn headline(result: &mut RunResult, parallelism: &[usize]) {
    let (runs, g) = (&result.nfd_runs, &result.peer_gpunode_s);
    if let Some((r, ratio, _)) = summarize(runs, g, Tuning::DEFAULTS) {
        (result.nfd, result.nfd_vs_gpunode) = (Some(r), Some(ratio));
    }
    let best = parallelism
        .iter()
        .filter_map(|&p| summarize(runs, g, Tuning::tuned(p)))
        .min_by(|a, b| a.0.convergence_s.total_cmp(&b.0.convergence_s));
    if let Some((r, ratio, _)) = best {
        (result.nfd_best, result.nfd_best_vs_gpunode) = (Some(r), Some(ratio));
    }
}

/// One NFD run of the comparison; a failure becomes a note (gpunode's figures are kept).
pub async fn nfd_once(
    ctx: &PeerCtx<'_>,
    setting: Tuning,
    rep: usize,
    result: &mut RunResult,
) -> Option<(usize, Timestamp, Timestamp)> {
    let (bin, crds) = ctx.nfd;
    match nfd::run(
        ctx.client,
        ctx.kc,
        ctx.names,
        (bin, crds),
        ctx.out,
        ctx.deadline,
        (setting, rep),
    )
    .await
    {
        Ok((r, from, to)) => {
            if r.projected {
                result.notes.push(format!(
                    "NFD ({}, repetition {rep}) labelled {} of {} nodes within {:.0} s; its convergence time is projected from that rate",
                    r.tuning,
                    r.labelled,
                    ctx.names.len(),
                    r.waited_s
                ));
            }
            info!(rep, tuning = %r.tuning, seconds = r.convergence_s, "NFD converged");
            result.nfd_runs.push(r);
            Some((result.nfd_runs.len() - 1, from, to))
        }
        Err(e) => {
            tracing::error!(error = %e, ?setting, "the NFD measurement failed");
            result.notes.push(format!(
                "the NFD measurement ({}, repetition {rep}) failed: {e}",
                setting.describe()
            ));
            None
        }
    }
}

/// The comparison, `reps` repetitions, `converge` running gpunode's convergence once more
/// (`headline` summarizes it once the requests are counted); the audit windows of NFD's runs
/// (index into `result.nfd_runs`, from, to).
pub async fn compare(
    ctx: &PeerCtx<'_>,
    reps: usize,
    result: &mut RunResult,
    mut converge: impl AsyncFnMut(usize) -> Result<f64, Error>,
) -> Result<Vec<(usize, Timestamp, Timestamp)>, Error> {
    let mut windows = Vec::new();
    for rep in 0..reps {
        let gpunode_first = rep % 2 == 0;
        if gpunode_first {
            result.peer_gpunode_s.push(converge(rep).await?);
        }
        for setting in settings(ctx.parallelism, rep) {
            windows.extend(nfd_once(ctx, setting, rep, result).await);
        }
        if !gpunode_first {
            result.peer_gpunode_s.push(converge(rep).await?);
        }
    }
    Ok(windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nfd(setting: Tuning, rep: usize, s: f64) -> Nfd {
        Nfd {
            setting: Some(setting),
            rep,
            convergence_s: s,
            ..Nfd::default()
        }
    }

    #[test]
    fn the_defaults_come_first_and_the_sweep_rotates() {
        let p = |r| {
            settings(&[10, 32, 128], r)
                .iter()
                .map(|t| (t.parallelism, t.client_limited))
                .collect::<Vec<_>>()
        };
        assert_eq!(p(0), [(10, true), (10, false), (32, false), (128, false)]);
        assert_eq!(p(1), [(10, true), (32, false), (128, false), (10, false)]);
    }

    #[test]
    fn the_headline_is_the_median_ratio_not_the_best_run() {
        let t = Tuning::tuned(128);
        let mut r = RunResult {
            peer_gpunode_s: vec![10.0, 20.0, 10.0],
            nfd_runs: vec![
                nfd(t, 0, 40.0),
                nfd(t, 1, 20.0),
                nfd(t, 2, 15.0),
                nfd(Tuning::tuned(32), 0, 90.0),
            ],
            ..RunResult::default()
        };
        headline(&mut r, &[32, 128]);
        // Ratios 4.0, 1.0, 1.5: the median is 1.5, not the best run's 4.0.
        assert_eq!(r.nfd_best_vs_gpunode, Some(1.5));
        assert_eq!(r.nfd_best.map(|n| n.convergence_s), Some(20.0));
        assert_eq!(r.nfd_vs_gpunode, None);
    }
}
