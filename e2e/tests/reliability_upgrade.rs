//! A rolling upgrade and a rollback mid-drain, on the reliability cluster (never the shared
//! `test` cluster): the operator of an earlier commit (`e2e/upgrade-from`, built once into
//! `~/.cache/gpunode/upgrade/`, see `gpunode_e2e::upgrade`) leads a wave whose first drain a
//! PodDisruptionBudget holds; a replica of this build starts beside it and the old one is
//! terminated (SIGTERM, as a Deployment's rolling update does), so the new version takes over
//! the drain the old one started, from its bookkeeping. Then the same the other way round (a
//! rollback). Checks: the old replica exited on SIGTERM, the new one leads, the wave completes,
//! and the wave's invariants (budget at every instant, no pod evicted twice, none after its
//! eviction was committed, every pod evicted once, the end state). Recovery: SIGTERM → the new
//! version leads.
//!
//! It builds a whole operator the first time (minutes), so it runs only with
//! `GPUNODE_REL_UPGRADE=1`, which `make reliability-long` sets.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, time::Duration};

use gpunode_e2e::faults::{
    checks::Check,
    cluster::FaultCluster,
    record::{self, Recorder, Run, Until},
    replica::{self, Launch, Operator},
    wave::{Wave, WaveSpec},
};
use kube::Client;

const CLASS: &str = "operator";
const DEADLINE: Duration = Duration::from_secs(120);

#[tokio::test]
async fn a_rolling_upgrade_and_a_rollback_mid_drain_lose_and_repeat_nothing() {
    if std::env::var("GPUNODE_REL_UPGRADE").ok().as_deref() != Some("1") {
        eprintln!(
            "not run: the rolling upgrade builds an earlier commit's operator (minutes); \
             GPUNODE_REL_UPGRADE=1 runs it (make reliability-long does)"
        );
        return;
    }
    let (fc, client) = FaultCluster::up().await.unwrap();
    let (commit, old) = gpunode_e2e::upgrade::previous_operator().unwrap();
    let short = &commit[..7];
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "upgrade");
    let upgrade = format!(
        "rolling upgrade mid-drain: the operator of {short} SIGTERMed once this build's replica ran beside it"
    );
    roll(
        &fc,
        &client,
        &mut rec,
        "upgrade",
        (Some(old.clone()), None),
        upgrade,
    )
    .await;
    let rollback =
        format!("rollback mid-drain: this build's operator SIGTERMed once {short}'s replica ran beside it");
    roll(&fc, &client, &mut rec, "rollback", (None, Some(old)), rollback).await;
    rec.assert_clean();
}

/// One hand-over mid-drain from the binary `bins.0` to `bins.1` (`None`: this build's).
async fn roll(
    fc: &FaultCluster,
    client: &Client,
    rec: &mut Recorder,
    tag: &str,
    bins: (Option<PathBuf>, Option<PathBuf>),
    fault: String,
) {
    let ns = format!("rel-{tag}");
    let launch = |bin: Option<PathBuf>| Launch {
        bin,
        ..Launch::default()
    };
    let mut old = Operator::start_with(fc, client, &format!("rel-{tag}-a"), &ns, launch(bins.0))
        .await
        .unwrap();
    old.wait_leading(DEADLINE).await.unwrap();
    let mut spec = WaveSpec::drain(tag, 3, 2);
    spec.pdb = true;
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    let first = wave.drain_started(&[], DEADLINE).await.unwrap();
    // The new version's pod starts; then the old one is told to stop.
    let new = Operator::start_with(fc, client, &format!("rel-{tag}-b"), &ns, launch(bins.1))
        .await
        .unwrap();
    let stopped = std::time::Instant::now();
    old.terminate().unwrap();
    let exit = old.wait_exit(DEADLINE).await;
    new.wait_leading(DEADLINE).await.unwrap();
    let took_ms = record::elapsed_ms(stopped);
    wave.release_pdb().await.unwrap();
    wave.drive(DEADLINE * 2).await.unwrap();
    let holder = replica::lease(client, &ns).await.map(|(h, _)| h);
    let mut checks = vec![
        Check::new(
            "the old version exited on SIGTERM",
            exit.as_ref().is_ok_and(std::process::ExitStatus::success),
            format!("exit {exit:?}"),
        ),
        Check::new(
            "the new version took over the held drain and leads",
            holder.as_deref() == Some(new.identity.as_str()),
            format!("Lease holder {holder:?}; the drain held on {first} when the old one stopped"),
        ),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault,
        seed: None,
        checks,
        recovery: Some(Until::Leading.after(took_ms)),
    })
    .unwrap();
    wave.cleanup().await;
    drop(new);
}
