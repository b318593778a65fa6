//! Control-plane faults on the reliability cluster (never the shared `test` cluster): the API
//! server stopped for 30 s during a drain held by a PodDisruptionBudget while a wave of drifts
//! waits for the budget; etcd paused (SIGSTOP) mid-wave; the API server restarted behind the
//! operator's watches, so their resourceVersions are too old (410 Gone) and the operator relists;
//! a 410 storm, the API server restarted `GPUNODE_REL_STORM_RESTARTS` times (default 3) in a row
//! mid-drain, each time once the last restart's expiry reached the operator.
//! After each: the operator (one process, never restarted) carries on, no pod is evicted twice,
//! every node ends exactly as the policy implies, and the budget held at every observed instant.
//! `GPUNODE_REL_API_OUTAGE_SECS` (else `GPUNODE_REL_OUTAGE_SECS`) changes the outage length
//! (default 30 s; `make reliability-long` 600 s, a 10-minute outage).

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_e2e::faults::{
    checks::{self, Check},
    cluster::{self, FaultCluster, Restore},
    marks,
    record::{self, Recorder, Run, Until},
    replica::Operator,
    wave::{self, Wave, WaveSpec},
};

const CLASS: &str = "control plane";
const DEADLINE: Duration = Duration::from_secs(120);

fn outage() -> Duration {
    let secs = |var: &str| std::env::var(var).ok().and_then(|v| v.parse().ok());
    Duration::from_secs(
        secs("GPUNODE_REL_API_OUTAGE_SECS")
            .or_else(|| secs("GPUNODE_REL_OUTAGE_SECS"))
            .unwrap_or(30),
    )
}

/// How long etcd is paused: a third of `GPUNODE_REL_OUTAGE_SECS` (default 30 s).
fn etcd_pause() -> Duration {
    let secs = std::env::var("GPUNODE_REL_OUTAGE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    Duration::from_secs(secs) / 3
}

/// How many times the API server restarts in the 410 storm: `GPUNODE_REL_STORM_RESTARTS`
/// (default 3, `make reliability-long` 10).
fn storm_restarts() -> usize {
    std::env::var("GPUNODE_REL_STORM_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// Relists of a resource by the operator's user after `since` (the watcher starts over with a
/// list after a 410, not after a plain reconnect).
fn relists(fc: &FaultCluster, user: &str, resource: &str, since: jiff::Timestamp) -> usize {
    fc.audit()
        .unwrap_or_default()
        .iter()
        .filter(|e| e.verb == "list" && e.user == user && e.resource == resource && e.at > since)
        .count()
}

/// When the operator's `source` watch (node, report) first finished listing after `since`: its
/// "watch listed" log line, whose text starts with the time it was written.
fn listed_after(log: &str, source: &str, since: jiff::Timestamp) -> Option<jiff::Timestamp> {
    let tag = format!("source=\"{source}\"");
    log.lines()
        .filter(|l| l.contains("watch listed") && l.contains(&tag))
        .filter_map(|l| l.split_whitespace().next()?.parse::<jiff::Timestamp>().ok())
        .find(|at| *at > since)
}

#[tokio::test]
async fn the_operator_rides_out_api_server_and_etcd_outages_and_expired_watches() {
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "control-plane");
    let mut op = Operator::start(&fc, &client, "rel-cp", "rel-cp").await.unwrap();
    op.wait_leading(DEADLINE).await.unwrap();

    let mut spec = WaveSpec::drain("cp", 3, 2);
    spec.pdb = true;
    // The test publishes the nodes' reports once: they must outlast the longest outage.
    spec.policy_spec["staleAfter"] = serde_json::json!("1h");
    let wave = Wave::setup(&client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();

    // A wave: every node drifts; the budget admits one, whose drain the PDB holds.
    wave.drift_all().await.unwrap();
    let first = wave.drain_started(&[], DEADLINE).await.unwrap();

    // Fault 1: the API server stops for the outage, mid-drain, with two nodes queued.
    let before = jiff::Timestamp::now();
    let guard = Restore::new(&fc, "kube-apiserver", "start");
    fc.ctl("stop", "kube-apiserver").await.unwrap();
    cluster::hold("API server outage", outage()).await.unwrap();
    // Recovery is timed from the start command on.
    let started = jiff::Timestamp::now();
    fc.ctl("start", "kube-apiserver").await.unwrap();
    guard.done();
    fc.wait_api(&client, DEADLINE).await.unwrap();
    // Recovery: the operator is back at work: its next write after the start command (the
    // held drain's eviction retry). Not one since the stop: the API server goes on serving for
    // a moment after its TERM, and an attempt then would count an outage not yet begun.
    let user = op.user();
    let recovered_ms =
        gpunode_e2e::wait::until("the operator's next write after the outage", DEADLINE, || async {
            Ok(record::first_write_ms(&fc.audit()?, &user, started))
        })
        .await
        .unwrap();
    let audit = fc.audit().unwrap();
    let mut checks = vec![Check::new(
        "operator process survived without restart",
        op.alive(),
        "same process",
    )];
    checks.extend(monitor.checks(1, &audit, &wave.namespace).await);
    checks.extend(checks::eviction_checks(&audit, &wave.namespace, &[]));
    let still = wave.alive_pods().await.unwrap();
    checks.push(Check::new(
        "PDB honoured through the outage",
        still.get(&first).copied() == Some(2),
        format!("pods alive on {first}: {:?}", still.get(&first)),
    ));
    rec.push(Run {
        class: CLASS.into(),
        fault: format!(
            "kube-apiserver stopped {} s during a held drain and a queued wave",
            outage().as_secs()
        ),
        seed: None,
        checks,
        recovery: Some(Until::Acting.after(recovered_ms)),
    })
    .unwrap();

    // Fault 2: the watches' resourceVersions predate the restarted API server's cache: a 410
    // Gone, seen in the operator's watcher log, and a relist in the audit log.
    let gone = gpunode_e2e::wait::until("the operator's watch to expire (410)", DEADLINE, || async {
        let log = op.log_text();
        let saw_410 =
            log.contains("code: 410") || log.contains("410 Gone") || log.contains("too old resource version");
        Ok(saw_410.then_some(()))
    })
    .await
    .is_ok();
    // How stale the operator's caches stayed: its node and report watches listed again.
    let relisted =
        gpunode_e2e::wait::until("the node and report watches to list again", DEADLINE, || async {
            let log = op.log_text();
            Ok(listed_after(&log, "node", started).zip(listed_after(&log, "report", started)))
        })
        .await
        .unwrap();
    let relist_ms = |at: jiff::Timestamp| u64::try_from(at.duration_since(started).as_millis()).unwrap_or(0);
    let expired = op.log_text().matches("code: 410").count();
    let node_relists = relists(&fc, &user, "nodes", before);
    let report_relists = relists(&fc, &user, "gpunodereports", before);

    // The drain goes through once the PDB is lifted; then the wave runs to its end.
    wave.release_pdb().await.unwrap();
    let second = gpunode_e2e::wait::until("a second node to drain", DEADLINE, || async {
        // Drive the wave by hand until a node other than the first drains.
        let alive = wave.alive_pods().await?;
        if alive.get(&first).copied() == Some(0) {
            gpunode_e2e::reports::publish(&client, &first, wave::report_status(false, "boot-1")).await?;
        }
        let ns = wave.nodes_now().await?;
        Ok(ns
            .iter()
            .filter(|n| n.metadata.name.as_deref() != Some(first.as_str()))
            .find(|n| marks::annotation(n, marks::DRAIN_STARTED_ANNOTATION).is_some())
            .and_then(|n| n.metadata.name.clone()))
    })
    .await
    .unwrap();
    rec.push(Run {
        class: CLASS.into(),
        fault: "watches expired (410 Gone) across the API server restart".into(),
        seed: None,
        checks: vec![
            // A list alone proves nothing (a reconnect may list too, and a streaming list is a
            // watch the audit log does not count as a list): the operator's watcher must have
            // been answered 410 Gone. That it listed again after is the wait above (its log).
            Check::new(
                "the expiry happened (410 Gone in the operator log), then both watches listed again",
                gone,
                format!(
                    "{expired} watches answered 410 Gone (operator log); list calls after the restart: \
                     nodes {node_relists}, reports {report_relists} (the watcher may relist by streaming)"
                ),
            ),
            Check::new(
                "operator carried on after relisting (next node drained)",
                !second.is_empty(),
                format!(
                    "{second} drained after {first}; the node and report watches listed again {} ms \
                     and {} ms after the API server's start command",
                    relist_ms(relisted.0),
                    relist_ms(relisted.1)
                ),
            ),
        ],
        // The outage's recovery is the row above's; this row's relist times are in its detail.
        recovery: None,
    })
    .unwrap();

    // Fault 3: etcd hangs (SIGSTOP) while the wave is in flight.
    let guard = Restore::new(&fc, "etcd", "resume");
    fc.ctl("pause", "etcd").await.unwrap();
    cluster::hold("etcd paused", etcd_pause()).await.unwrap();
    fc.ctl("resume", "etcd").await.unwrap();
    guard.done();
    let resumed = jiff::Timestamp::now();
    wave.drive(DEADLINE * 2).await.unwrap();
    let wave_ms = record::first_write_ms(&fc.audit().unwrap(), &user, resumed);
    let mut checks = vec![Check::new(
        "operator process survived without restart",
        op.alive(),
        "same process",
    )];
    checks.extend(wave.run_checks(&fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault: format!("etcd paused (SIGSTOP) {} s mid-wave", etcd_pause().as_secs()),
        seed: None,
        checks,
        recovery: wave_ms.map(|ms| Until::Acting.after(ms)),
    })
    .unwrap();

    wave.cleanup().await;
    drop(monitor);
    storm(&fc, &client, &mut op, &mut rec).await;
    drop(op);
    rec.assert_clean();
}

/// Fault 4, a 410 storm: the API server restarts again and again while a wave is in flight,
/// each time after the operator's watches answered the last one's 410 Gone, so every watch
/// expires over and over (what a flapping or rolling control plane does to a fleet's clients).
async fn storm(fc: &FaultCluster, client: &kube::Client, op: &mut Operator, rec: &mut Recorder) {
    let mut spec = WaveSpec::drain("storm", 3, 2);
    spec.pdb = true;
    spec.policy_spec["staleAfter"] = serde_json::json!("1h");
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    wave.drain_started(&[], DEADLINE).await.unwrap();
    let mut expired = Vec::new();
    let mut last = jiff::Timestamp::now();
    for _ in 0..storm_restarts() {
        let before = op.log_text().matches("code: 410").count();
        let guard = Restore::new(fc, "kube-apiserver", "start");
        fc.ctl("stop", "kube-apiserver").await.unwrap();
        fc.ctl("start", "kube-apiserver").await.unwrap();
        last = jiff::Timestamp::now();
        guard.done();
        fc.wait_api(client, DEADLINE).await.unwrap();
        // The next restart comes once this one's expiry reached the operator (or the wait
        // gave up: the check below counts the restarts that expired a watch).
        let seen = gpunode_e2e::wait::until("the operator's watches to expire (410)", DEADLINE, || async {
            let now = op.log_text().matches("code: 410").count();
            Ok((now > before).then_some(now - before))
        })
        .await
        .unwrap_or(0);
        expired.push(seen);
    }
    wave.release_pdb().await.unwrap();
    wave.drive(DEADLINE * 2).await.unwrap();
    let wave_ms = record::first_write_ms(&fc.audit().unwrap(), &op.user(), last);
    let mut checks = vec![
        Check::new(
            "every restart expired the operator's watches (410 Gone in its log)",
            expired.iter().all(|n| *n > 0),
            format!("410 Gone answers after each restart: {expired:?}"),
        ),
        Check::new(
            "operator process survived without restart",
            op.alive(),
            "same process",
        ),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault: format!(
            "410 storm: the API server restarted {} times mid-drain, each after the last expiry reached the operator",
            storm_restarts()
        ),
        seed: None,
        checks,
        recovery: wave_ms.map(|ms| Until::Acting.after(ms)),
    })
    .unwrap();
    wave.cleanup().await;
}
