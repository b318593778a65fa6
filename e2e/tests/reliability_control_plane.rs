//! Control-plane faults on the reliability cluster (never the shared `test` cluster): the API
//! server stopped for 30 s during a drain held by a PodDisruptionBudget while a wave of drifts
//! waits for the budget; etcd paused (SIGSTOP) mid-wave; the API server restarted behind the
//! operator's watches, so their resourceVersions are too old (410 Gone) and the operator relists.
//! After each: the operator (one process, never restarted) carries on, no pod is evicted twice,
//! every node ends exactly as the policy implies, and the budget held at every observed instant.
//! `GPUNODE_REL_OUTAGE_SECS` changes the outage length (default 30, `make reliability-long` 60).

use std::time::{Duration, Instant};

use gpunode_e2e::faults::{
    checks::{self, Check},
    cluster::{self, FaultCluster, Restore},
    marks,
    record::{self, Recorder, Run},
    replica::Operator,
    wave::{self, Wave, WaveSpec},
};

const CLASS: &str = "control plane";
const DEADLINE: Duration = Duration::from_secs(120);

fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("GPUNODE_REL_OUTAGE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30),
    )
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
    let back = Instant::now();
    fc.ctl("start", "kube-apiserver").await.unwrap();
    guard.done();
    fc.wait_api(&client, DEADLINE).await.unwrap();
    // Recovery: the operator is back at work on the held drain (a new eviction attempt).
    let user = op.user();
    gpunode_e2e::wait::until("the operator to retry the held drain", DEADLINE, || async {
        let n = fc
            .audit()?
            .iter()
            .filter(|e| e.user == user && e.subresource == "eviction" && e.at > before)
            .count();
        Ok((n > 0).then_some(()))
    })
    .await
    .unwrap();
    let recovered_ms = record::elapsed_ms(back);
    let audit = fc.audit().unwrap();
    let mut checks = vec![Check::new(
        "operator process survived without restart",
        op.alive(),
        "same process",
    )];
    checks.extend(monitor.checks(1, &audit, &wave.namespace));
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
        recovery_ms: Some(recovered_ms),
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
    let relisted_ms = relist_ms(relisted.0).max(relist_ms(relisted.1));
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
        recovery_ms: Some(relisted_ms),
    })
    .unwrap();

    // Fault 3: etcd hangs (SIGSTOP) while the wave is in flight.
    let guard = Restore::new(&fc, "etcd", "resume");
    fc.ctl("pause", "etcd").await.unwrap();
    cluster::hold("etcd paused", outage() / 3).await.unwrap();
    fc.ctl("resume", "etcd").await.unwrap();
    guard.done();
    let resumed = Instant::now();
    wave.drive(DEADLINE * 2).await.unwrap();
    let wave_ms = record::elapsed_ms(resumed);
    let mut checks = vec![Check::new(
        "operator process survived without restart",
        op.alive(),
        "same process",
    )];
    checks.extend(wave.run_checks(&fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault: format!("etcd paused (SIGSTOP) {} s mid-wave", (outage() / 3).as_secs()),
        seed: None,
        checks,
        recovery_ms: Some(wave_ms),
    })
    .unwrap();

    wave.cleanup().await;
    drop(monitor);
    drop(op);
    rec.assert_clean();
}
