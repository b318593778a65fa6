//! Operator faults with the operator as real processes (`gpunode-operator run --leader-elect`):
//! - the leader SIGKILLed at seeded random points of a drain and restarted (a container restart:
//!   same pod name, so it takes its own Lease back at once), 20 seeds (`GPUNODE_REL_SEEDS`);
//! - both replicas SIGKILLed mid-drain and restarted;
//! - the leader cut off (SIGSTOP, its view of a partition) until its Lease expires: the follower
//!   takes over, and the old leader, continued, writes nothing after the new one acquired the
//!   Lease (audit log, per ServiceAccount).
//!
//! After each: no pod evicted twice, every node ends as the policy implies, budget held.
//! The steps share one binary and run in sequence: two operator deployments at once would both
//! act on every policy.

use std::time::{Duration, Instant};

use futures::future::join_all;
use gpunode_e2e::{
    faults::{self, Check, DisruptionMonitor, FaultCluster, Operator, Recorder, Run, Wave, WaveSpec},
    wait,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

const CLASS: &str = "operator";
const DEADLINE: Duration = Duration::from_secs(120);

fn fail(e: impl std::fmt::Display) -> ! {
    panic!("{e}")
}

/// splitmix64: a deterministic sequence per seed, no dependency.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn seeds() -> u64 {
    std::env::var("GPUNODE_REL_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

async fn lease(client: &Client, ns: &str) -> Option<(String, jiff::Timestamp)> {
    let l = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(gpunode_operator::leader::DEFAULT_LEASE_NAME)
        .await
        .ok()??;
    let spec = l.spec?;
    Some((spec.holder_identity?, spec.acquire_time?.0))
}

/// Checks common to every run of a wave.
async fn wave_checks(fc: &FaultCluster, wave: &Wave, monitor: &DisruptionMonitor) -> Vec<Check> {
    let audit = fc.audit().unwrap_or_else(|e| fail(e));
    let mut checks = vec![monitor.check(1)];
    checks.extend(faults::eviction_checks(&audit, &wave.namespace, &wave.all_pods()));
    checks.extend(wave.final_checks().await.unwrap_or_else(|e| fail(e)));
    checks
}

#[tokio::test]
async fn leader_kills_restarts_and_partitions_lose_and_repeat_nothing() {
    let (fc, client) = FaultCluster::up().await.unwrap_or_else(|e| fail(e));
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "operator");
    sigkill_at_random_points(&fc, &client, &mut rec).await;
    both_replicas_killed(&fc, &client, &mut rec).await;
    partitioned_leader(&fc, &client, &mut rec).await;
    rec.assert_clean();
}

async fn sigkill_at_random_points(fc: &FaultCluster, client: &Client, rec: &mut Recorder) {
    let n = seeds();
    let mut op = Operator::start(fc, client, "rel-kill", "rel-kill")
        .await
        .unwrap_or_else(|e| fail(e));
    op.wait_leading(DEADLINE).await.unwrap_or_else(|e| fail(e));
    // One single-node policy per seed, set up together so the runs only pay for the drain.
    let waves: Vec<Wave> = join_all((0..n).map(|s| {
        let client = client.clone();
        async move { Wave::setup(&client, &WaveSpec::drain(&format!("kill{s}"), 1, 3)).await }
    }))
    .await
    .into_iter()
    .map(|w| w.unwrap_or_else(|e| fail(e)))
    .collect();
    for (seed, wave) in (0..n).zip(&waves) {
        let monitor = DisruptionMonitor::start(client, &wave.selector());
        wave.wait_all("compliant", DEADLINE)
            .await
            .unwrap_or_else(|e| fail(e));
        // Kill point: 0–600 ms after the fatal XID is reported, which spans the operator's
        // reaction, the cordon, the evictions and what follows.
        let delay = Duration::from_millis(mix(seed) % 600);
        wave.drift_all().await.unwrap_or_else(|e| fail(e));
        faults::hold("kill point", delay)
            .await
            .unwrap_or_else(|e| fail(e));
        op.kill();
        let node = wave.nodes_now().await.unwrap_or_else(|e| fail(e));
        let left = wave
            .alive_pods()
            .await
            .unwrap_or_else(|e| fail(e))
            .values()
            .sum::<usize>();
        let at_kill = node.first().map_or("?".to_string(), |n| {
            format!(
                "cordoned={} drain-started={} pods left {left}/3",
                faults::disrupted(n),
                faults::annotation(n, faults::DRAIN_STARTED_ANNOTATION).is_some()
            )
        });
        op.spawn().unwrap_or_else(|e| fail(e));
        let restarted = Instant::now();
        op.wait_leading(DEADLINE).await.unwrap_or_else(|e| fail(e));
        let recovery = faults::elapsed_ms(restarted);
        wave.drive(DEADLINE).await.unwrap_or_else(|e| fail(e));
        let mut checks = wave_checks(fc, wave, &monitor).await;
        // A container restart keeps the pod name: the replica renews its own Lease at once
        // instead of waiting for it to expire.
        checks.push(Check::new(
            "restarted replica leads again without waiting for its Lease to expire",
            recovery < 10_000,
            format!(
                "killed {} ms after the XID ({at_kill}); leading {recovery} ms after the restart",
                delay.as_millis()
            ),
        ));
        rec.push(Run {
            class: CLASS.into(),
            fault: "leader SIGKILLed at a seeded random point of a drain, restarted".into(),
            seed: Some(seed),
            checks,
            recovery_ms: Some(recovery),
        })
        .unwrap_or_else(|e| fail(e));
    }
    for w in &waves {
        w.cleanup().await;
    }
}

async fn both_replicas_killed(fc: &FaultCluster, client: &Client, rec: &mut Recorder) {
    let ns = "rel-ha";
    let mut a = Operator::start(fc, client, "rel-ha-a", ns)
        .await
        .unwrap_or_else(|e| fail(e));
    a.wait_leading(DEADLINE).await.unwrap_or_else(|e| fail(e));
    let mut b = Operator::start(fc, client, "rel-ha-b", ns)
        .await
        .unwrap_or_else(|e| fail(e));
    let mut spec = WaveSpec::drain("both", 2, 2);
    spec.pdb = true;
    let wave = Wave::setup(client, &spec).await.unwrap_or_else(|e| fail(e));
    let monitor = DisruptionMonitor::start(client, &wave.selector());
    wave.wait_all("compliant", DEADLINE)
        .await
        .unwrap_or_else(|e| fail(e));
    wave.drift_all().await.unwrap_or_else(|e| fail(e));
    wait::until("a drain to start", DEADLINE, || async {
        let ns = wave.nodes_now().await?;
        Ok(ns
            .iter()
            .any(|n| faults::annotation(n, faults::DRAIN_STARTED_ANNOTATION).is_some())
            .then_some(()))
    })
    .await
    .unwrap_or_else(|e| fail(e));
    a.kill();
    b.kill();
    let killed = jiff::Timestamp::now();
    b.spawn().unwrap_or_else(|e| fail(e));
    a.spawn().unwrap_or_else(|e| fail(e));
    let restarted = Instant::now();
    wave.release_pdb().await.unwrap_or_else(|e| fail(e));
    wave.drive(DEADLINE).await.unwrap_or_else(|e| fail(e));
    let recovery = faults::elapsed_ms(restarted);
    let mut checks = wave_checks(fc, &wave, &monitor).await;
    let audit = fc.audit().unwrap_or_else(|e| fail(e));
    let writers: std::collections::BTreeSet<String> = audit
        .iter()
        .filter(|e| e.at > killed && e.is_write() && (e.user == a.user() || e.user == b.user()))
        .filter(|e| e.resource == "nodes" || e.subresource == "eviction")
        .map(|e| e.user.clone())
        .collect();
    checks.push(Check::new(
        "one writer after the restart",
        writers.len() == 1,
        format!("node and eviction writers: {writers:?}"),
    ));
    rec.push(Run {
        class: CLASS.into(),
        fault: "both replicas SIGKILLed mid-drain and restarted".into(),
        seed: None,
        checks,
        recovery_ms: Some(recovery),
    })
    .unwrap_or_else(|e| fail(e));
    wave.cleanup().await;
}

async fn partitioned_leader(fc: &FaultCluster, client: &Client, rec: &mut Recorder) {
    let ns = "rel-part";
    // The cluster outlives a test run: only this run's writes count.
    let started = jiff::Timestamp::now();
    let a = Operator::start(fc, client, "rel-part-a", ns)
        .await
        .unwrap_or_else(|e| fail(e));
    a.wait_leading(DEADLINE).await.unwrap_or_else(|e| fail(e));
    let b = Operator::start(fc, client, "rel-part-b", ns)
        .await
        .unwrap_or_else(|e| fail(e));
    let mut spec = WaveSpec::drain("part", 2, 2);
    spec.pdb = true;
    let wave = Wave::setup(client, &spec).await.unwrap_or_else(|e| fail(e));
    let monitor = DisruptionMonitor::start(client, &wave.selector());
    wave.wait_all("compliant", DEADLINE)
        .await
        .unwrap_or_else(|e| fail(e));
    wave.drift_all().await.unwrap_or_else(|e| fail(e));
    wait::until("a drain to start", DEADLINE, || async {
        let ns = wave.nodes_now().await?;
        Ok(ns
            .iter()
            .any(|n| faults::annotation(n, faults::DRAIN_STARTED_ANNOTATION).is_some())
            .then_some(()))
    })
    .await
    .unwrap_or_else(|e| fail(e));
    // The leader retries the held evictions every few seconds; stop it at a seeded point of
    // that cycle, possibly mid-apply.
    faults::hold("pause point", Duration::from_millis(mix(99) % 5000))
        .await
        .unwrap_or_else(|e| fail(e));
    a.pause().unwrap_or_else(|e| fail(e));
    let paused = Instant::now();
    let (holder, acquired) = wait::until("the follower to take the Lease over", DEADLINE, || async {
        Ok(lease(client, ns).await.filter(|(h, _)| *h == b.identity))
    })
    .await
    .unwrap_or_else(|e| fail(e));
    let failover = faults::elapsed_ms(paused);
    // The old leader runs again, its term long over by its own clock: it must write nothing.
    a.resume().unwrap_or_else(|e| fail(e));
    faults::hold("old leader running after the partition", Duration::from_secs(6))
        .await
        .unwrap_or_else(|e| fail(e));
    wave.release_pdb().await.unwrap_or_else(|e| fail(e));
    wave.drive(DEADLINE).await.unwrap_or_else(|e| fail(e));
    let mut checks = wave_checks(fc, &wave, &monitor).await;
    let audit = fc.audit().unwrap_or_else(|e| fail(e));
    let late: Vec<String> = audit
        .iter()
        .filter(|e| e.user == a.user() && e.is_write() && e.at >= acquired)
        .map(|e| format!("{} {}/{} {}", e.verb, e.resource, e.subresource, e.name))
        .collect();
    let last_a = audit
        .iter()
        .filter(|e| e.user == a.user() && e.is_write())
        .map(|e| e.at)
        .max();
    let early_b = audit
        .iter()
        .filter(|e| e.user == b.user() && e.is_write() && e.resource != "leases")
        .filter(|e| e.at > started && e.at < acquired)
        .count();
    let gap = last_a.map(|t| acquired.duration_since(t).as_secs_f64());
    checks.push(Check::new(
        "old leader wrote nothing after the new one acquired the Lease",
        late.is_empty(),
        format!("late writes: {late:?}; last write {gap:?} s before {holder} acquired"),
    ));
    checks.push(Check::new(
        "new leader wrote nothing before acquiring the Lease",
        early_b == 0,
        format!("{early_b} early writes"),
    ));
    rec.push(Run {
        class: CLASS.into(),
        fault: "leader partitioned (SIGSTOP) until its Lease expired, then continued".into(),
        seed: Some(99),
        checks,
        recovery_ms: Some(failover),
    })
    .unwrap_or_else(|e| fail(e));
    wave.cleanup().await;
}

/// The fence itself, deterministically: an applier whose replica is not (or no longer) the
/// leader makes no request at all, even with a plan that cordons and drains. (The partition run
/// above can only pause the leader at a seeded point; this covers a pause that lands mid-apply.)
#[tokio::test]
async fn a_replica_past_its_term_writes_nothing_even_mid_apply() {
    use gpunode_operator::{
        apply::{Applier, ApplyError},
        leader::Leadership,
        plan::{NodeView, plan},
        verdict::{Drift, Verdict},
    };
    let (fc, client) = FaultCluster::up().await.unwrap_or_else(|e| fail(e));
    let wave = Wave::setup(&client, &WaveSpec::drain("fence", 1, 1))
        .await
        .unwrap_or_else(|e| fail(e));
    // The node's report is healthy: an operator running in parallel only labels it. The plan
    // below is made as if it had a fatal XID.
    let spec: gpunode_crds::GpuNodePolicySpec =
        serde_json::from_value(WaveSpec::drain("x", 1, 0).policy_spec).unwrap_or_else(|e| fail(e));
    let node = wave.nodes_now().await.unwrap_or_else(|e| fail(e)).remove(0);
    let verdict = Verdict::new(
        vec![Drift {
            class: gpunode_crds::DriftClass::Xid,
            check: "gpu.fatalXids".into(),
            expected: "none".into(),
            actual: "79".into(),
            gpu: Some(0),
            device: None,
        }],
        vec![],
    );
    let (view, _) = NodeView::observe(&node, verdict, vec![]);
    let now = jiff::Timestamp::now();
    let p = plan(&spec, &[view], now);
    let np = &p.nodes[0];
    assert_eq!(np.cordon, Some(true), "the plan cordons and drains: {np:?}");
    let since = jiff::Timestamp::now();
    let applier = Applier::new(client.clone()).with_gate(Leadership::fixed(false));
    let r = applier
        .apply(&wave.policy, np, &node, &spec.disruption.drain, now)
        .await;
    let audit = fc.audit().unwrap_or_else(|e| fail(e));
    let writes = audit
        .iter()
        // The applier writes as the admin user; an operator elsewhere has its own account.
        .filter(|e| e.is_write() && e.at >= since && e.user == "gpunode-admin")
        .filter(|e| e.name == node.metadata.name.clone().unwrap_or_default() || e.namespace == wave.namespace)
        .count();
    wave.cleanup().await;
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "operator-fence");
    rec.push(Run {
        class: CLASS.into(),
        fault: "replica past its term applies a cordon-and-drain plan (the fence)".into(),
        seed: None,
        checks: vec![
            Check::new(
                "the apply refuses before any request",
                matches!(r, Err(ApplyError::NotLeader(_))),
                format!("{r:?}"),
            ),
            Check::new(
                "no write by the fenced replica (audit log)",
                writes == 0,
                format!("{writes} writes"),
            ),
        ],
        recovery_ms: None,
    })
    .unwrap_or_else(|e| fail(e));
    rec.assert_clean();
}
