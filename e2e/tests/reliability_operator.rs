//! Operator faults with the operator as real processes (`gpunode-operator run --leader-elect`):
//! - the leader SIGKILLed and restarted (a container restart: same pod name, so it takes its own
//!   Lease back at once) with four waves in flight, each aimed at a phase of its drain (before the
//!   cordon, after it, between evictions, after the drain); the phase each kill landed in is
//!   recorded and the four must be covered; `GPUNODE_REL_SEEDS` rounds (default 5, 20 runs);
//! - both replicas SIGKILLed mid-drain and restarted;
//! - the leader cut off (SIGSTOP, its view of a partition) at a seeded point until its Lease
//!   expires: the follower takes over, and the old leader, continued, writes nothing after the new
//!   one acquired the Lease (audit log, per ServiceAccount), and every kind of write sent late
//!   with its token is refused by the leader fence; `GPUNODE_REL_PARTITIONS` seeds.
//!
//! Every wave has three nodes under `maxUnavailable: 1`, so the budget binds. After each run: no
//! pod evicted twice, none after its eviction was committed, every node ends as the policy
//! implies, the budget, a person's cordon and other controllers' markers held at every instant.
//! The steps share one binary and run in sequence: two operator deployments at once would both
//! act on every policy.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::future::join_all;
use gpunode_e2e::{
    faults::{
        checks::Check,
        cluster::{self, FaultCluster},
        late, marks,
        record::{self, Recorder, Run, Until},
        replica::{self, Launch, Operator},
        wave::{self, Wave, WaveSpec},
    },
    monitor::WaveMonitor,
    remediator, wait,
};
use kube::Client;
use serde_json::json;

const CLASS: &str = "operator";
const DEADLINE: Duration = Duration::from_secs(120);
/// The early wave's drain rule waits this long: past the seeded kill point (at most 1 s after the
/// operator marks the wave drifted) with seconds to spare on a slow machine.
const BEFORE_CORDON_AFTER: &str = "4s";

fn seeds() -> u64 {
    std::env::var("GPUNODE_REL_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

/// Checks common to every run of a wave under `maxUnavailable: 1`.
async fn wave_checks(fc: &FaultCluster, wave: &Wave, monitor: &WaveMonitor) -> Vec<Check> {
    wave.run_checks(fc, monitor, 1, &wave.all_pods()).await.unwrap()
}

#[tokio::test]
async fn leader_kills_restarts_and_partitions_lose_and_repeat_nothing() {
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "operator");
    sigkill_in_every_phase(&fc, &client, &mut rec).await;
    both_replicas_killed(&fc, &client, &mut rec).await;
    for seed in 0..partitions() {
        partitioned_leader(&fc, &client, &mut rec, seed).await;
    }
    rec.assert_clean();
}

/// Waves aimed at each phase per kill (`GPUNODE_REL_WAVES_PER_PHASE`, default 1).
fn waves_per_phase() -> usize {
    std::env::var("GPUNODE_REL_WAVES_PER_PHASE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn partitions() -> u64 {
    std::env::var("GPUNODE_REL_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// Where a drain stood when the operator died, from what the API server shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    BeforeCordon,
    CordonedBeforeEvictions,
    BetweenEvictions,
    AfterDrain,
}

impl Phase {
    const ALL: [Phase; 4] = [
        Phase::BeforeCordon,
        Phase::CordonedBeforeEvictions,
        Phase::BetweenEvictions,
        Phase::AfterDrain,
    ];

    fn describe(self) -> &'static str {
        match self {
            Phase::BeforeCordon => "before the cordon",
            Phase::CordonedBeforeEvictions => "after the cordon, before any eviction",
            Phase::BetweenEvictions => "between evictions",
            Phase::AfterDrain => "after the drain, before the node healed",
        }
    }
}

/// The phase of the node furthest into its drain: cordoned by gpunode or with a drain started,
/// and how many of its pods are left.
async fn phase_of(wave: &Wave) -> Result<(Phase, String), gpunode_e2e::Error> {
    let nodes = wave.nodes_now().await?;
    let alive = wave.alive_pods().await?;
    let mut phase = Phase::BeforeCordon;
    let mut detail = Vec::new();
    for n in &nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let total = wave.pods.get(&name).map_or(0, Vec::len);
        let left = alive.get(&name).copied().unwrap_or(0);
        let started = marks::disrupted(n) || marks::annotation(n, marks::DRAIN_STARTED_ANNOTATION).is_some();
        detail.push(format!(
            "{left}/{total}{}",
            if started { " cordoned" } else { "" }
        ));
        if !started && left == total {
            continue;
        }
        let p = match left {
            0 => Phase::AfterDrain,
            l if l < total => Phase::BetweenEvictions,
            _ => Phase::CordonedBeforeEvictions,
        };
        phase = phase.max(p);
    }
    Ok((phase, format!("pods left per node: {}", detail.join(", "))))
}

/// Waits until `wave` has reached `phase`.
async fn reach(wave: &Wave, phase: Phase) {
    wait::until(
        &format!("{} to be {}", wave.id, phase.describe()),
        DEADLINE,
        || async { Ok((phase_of(wave).await?.0 == phase).then_some(())) },
    )
    .await
    .unwrap();
}

/// Each round runs four waves (times `GPUNODE_REL_WAVES_PER_PHASE`) of three nodes under
/// `maxUnavailable: 1` (so the budget binds),
/// each with three pods per node, and kills the leader once, with each wave's drain aimed at a
/// different phase: one whose drift the operator has marked while its rule's `after` holds the drain
/// (before the cordon), one whose
/// evictions a PDB holds (cordoned, before any eviction), one whose PDB spares each node's first
/// pod (between evictions), one whose first node has been drained but not yet healed (after the
/// drain). Each wave is a run, filed under the phase observed at the kill; the phases observed
/// over all rounds must cover the four.
async fn sigkill_in_every_phase(fc: &FaultCluster, client: &Client, rec: &mut Recorder) {
    let rounds = seeds();
    let mut op = Operator::start(fc, client, "rel-kill", "rel-kill").await.unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    let mut observed: std::collections::BTreeMap<Phase, usize> = Default::default();
    for round in 0..rounds {
        let per_phase = waves_per_phase();
        let aims: Vec<Phase> = Phase::ALL
            .iter()
            .flat_map(|p| std::iter::repeat_n(*p, per_phase))
            .collect();
        let specs: Vec<WaveSpec> = aims
            .iter()
            .enumerate()
            .map(|(i, aim)| {
                let mut spec = WaveSpec::drain(&format!("k{round}p{i}"), 3, 3);
                spec.pdb = matches!(aim, Phase::CordonedBeforeEvictions | Phase::BetweenEvictions);
                spec.pdb_spares_first = *aim == Phase::BetweenEvictions;
                if *aim == Phase::BeforeCordon {
                    // The drain waits for the drift to last: the kill lands while the operator has
                    // seen the drift and holds the action, whatever this machine's speed.
                    spec.policy_spec["remediation"][0]["after"] = json!(BEFORE_CORDON_AFTER);
                }
                spec
            })
            .collect();
        let waves: Vec<Wave> = join_all(specs.iter().map(|s| Wave::setup(client, s)))
            .await
            .into_iter()
            .map(|w| w.unwrap())
            .collect();
        let monitors: Vec<WaveMonitor> = waves.iter().map(Wave::monitor).collect();
        for w in &waves {
            w.wait_all("compliant", DEADLINE).await.unwrap();
        }
        let aimed = |phase: Phase| {
            waves
                .iter()
                .zip(&aims)
                .filter(move |(_, a)| **a == phase)
                .map(|(w, _)| w)
        };
        for (w, aim) in waves.iter().zip(&aims) {
            if *aim != Phase::BeforeCordon {
                w.drift_all().await.unwrap();
            }
        }
        for (w, aim) in waves.iter().zip(&aims) {
            if *aim != Phase::BeforeCordon {
                reach(w, *aim).await;
            }
        }
        // A seeded point in the held drains' retry cycle; then the early wave drifts, and the
        // kill comes a seeded 0–1000 ms after the operator marked it drifted, inside the rule's
        // `after` window.
        let r = wave::mix(round);
        cluster::hold("kill point in the held drains", Duration::from_millis(r % 1500))
            .await
            .unwrap();
        for w in aimed(Phase::BeforeCordon) {
            w.drift_all().await.unwrap();
        }
        for w in aimed(Phase::BeforeCordon) {
            w.wait_all("drifted", DEADLINE).await.unwrap();
        }
        cluster::hold(
            "kill point after the drift",
            Duration::from_millis((r >> 16) % 1000),
        )
        .await
        .unwrap();
        op.kill();
        let mut at_kill = Vec::new();
        for w in &waves {
            at_kill.push(phase_of(w).await.unwrap());
        }
        op.spawn().unwrap();
        let restarted = Instant::now();
        op.wait_leading(DEADLINE).await.unwrap();
        let recovery = record::elapsed_ms(restarted);
        for w in &waves {
            w.release_pdb().await.unwrap();
        }
        for r in join_all(waves.iter().map(|w| w.drive(DEADLINE * 2))).await {
            r.unwrap();
        }
        for ((w, m), (phase, detail)) in waves.iter().zip(&monitors).zip(at_kill) {
            *observed.entry(phase).or_default() += 1;
            let mut checks = wave_checks(fc, w, m).await;
            // A container restart keeps the pod name: the replica renews its own Lease at once
            // instead of waiting for it to expire.
            checks.push(Check::new(
                "restarted replica leads again without waiting for its Lease to expire",
                recovery < 10_000,
                format!(
                    "killed {}: {detail}; leading {recovery} ms after the restart",
                    phase.describe()
                ),
            ));
            rec.push(Run {
                class: CLASS.into(),
                fault: format!("leader SIGKILLed {}, restarted (3-node waves)", phase.describe()),
                seed: Some(round),
                checks,
                recovery: Some(Until::Leading.after(recovery)),
            })
            .unwrap();
        }
        for w in &waves {
            w.cleanup().await;
        }
    }
    let checks = Phase::ALL
        .iter()
        .map(|p| {
            let n = observed.get(p).copied().unwrap_or(0);
            Check::new(
                &format!("a SIGKILL landed {}", p.describe()),
                n > 0,
                format!("{n} of {} waves", rounds * 4 * waves_per_phase() as u64),
            )
        })
        .collect();
    rec.push(Run {
        class: CLASS.into(),
        fault: format!("where the SIGKILLs landed, over {rounds} rounds"),
        seed: None,
        checks,
        recovery: None,
    })
    .unwrap();
}

async fn both_replicas_killed(fc: &FaultCluster, client: &Client, rec: &mut Recorder) {
    let ns = "rel-ha";
    let mut a = Operator::start(fc, client, "rel-ha-a", ns).await.unwrap();
    a.wait_leading(DEADLINE).await.unwrap();
    let mut b = Operator::start(fc, client, "rel-ha-b", ns).await.unwrap();
    let mut spec = WaveSpec::drain("both", 3, 2);
    spec.pdb = true;
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    wave.drain_started(&[], DEADLINE).await.unwrap();
    a.kill();
    b.kill();
    let killed = jiff::Timestamp::now();
    b.spawn().unwrap();
    a.spawn().unwrap();
    let restarted = Instant::now();
    gpunode_e2e::wait::until("one of the restarted replicas to lead", DEADLINE, || async {
        let a_leads = a.metric("gpunode_leader").await.unwrap_or(0.0) >= 1.0;
        let b_leads = b.metric("gpunode_leader").await.unwrap_or(0.0) >= 1.0;
        Ok((a_leads || b_leads).then_some(()))
    })
    .await
    .unwrap();
    let recovery = record::elapsed_ms(restarted);
    wave.release_pdb().await.unwrap();
    wave.drive(DEADLINE).await.unwrap();
    let mut checks = wave_checks(fc, &wave, &monitor).await;
    let audit = fc.audit().unwrap();
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
        recovery: Some(Until::Leading.after(recovery)),
    })
    .unwrap();
    wave.cleanup().await;
}

async fn partitioned_leader(fc: &FaultCluster, client: &Client, rec: &mut Recorder, seed: u64) {
    let ns = &format!("rel-part{seed}");
    // The remediation object among the late writes is a FakeReboot.
    remediator::install(client).await.unwrap();
    // The cluster outlives a test run: only this run's writes count.
    let started = jiff::Timestamp::now();
    // Both behind the chart's leader fence: the old leader's clock decides what it attempts,
    // the API server what it commits.
    let fenced = || Launch {
        fence: true,
        ..Launch::default()
    };
    let a = Operator::start_with(fc, client, &format!("rel-part{seed}-a"), ns, fenced())
        .await
        .unwrap();
    a.wait_leading(DEADLINE).await.unwrap();
    let b = Operator::start_with(fc, client, &format!("rel-part{seed}-b"), ns, fenced())
        .await
        .unwrap();
    let mut spec = WaveSpec::drain(&format!("part{seed}"), 3, 2);
    spec.pdb = true;
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    wave.drain_started(&[], DEADLINE).await.unwrap();
    // The leader retries the held evictions every few seconds; stop it at a seeded point of
    // that cycle, possibly mid-apply.
    cluster::hold(
        "pause point",
        Duration::from_millis(wave::mix(1000 + seed) % 5000),
    )
    .await
    .unwrap();
    a.pause().unwrap();
    let paused = Instant::now();
    let (holder, acquired) = wait::until("the follower to take the Lease over", DEADLINE, || async {
        Ok(replica::lease(client, ns).await.filter(|(h, _)| *h == b.identity))
    })
    .await
    .unwrap();
    let failover = record::elapsed_ms(paused);
    // What the paused leader could still send: every kind of write, with its own token, after
    // the new leader acquired. The fence must refuse each (audit log).
    let targets = late::Targets::in_wave(&wave, &format!("rel-part{seed}-late"));
    let deposed = late::deposed_writes(fc, &a.client_as(fc).await.unwrap(), &a.user(), &targets, acquired)
        .await
        .unwrap();
    // The old leader runs again, its term long over by its own clock: it must write nothing.
    a.resume().unwrap();
    cluster::hold("old leader running after the partition", Duration::from_secs(6))
        .await
        .unwrap();
    wave.release_pdb().await.unwrap();
    wave.drive(DEADLINE).await.unwrap();
    let mut checks = wave_checks(fc, &wave, &monitor).await;
    checks.extend(deposed);
    let audit = fc.audit().unwrap();
    let late: Vec<String> = audit
        .iter()
        .filter(|e| e.user == a.user() && e.is_write() && e.at >= acquired)
        .map(|e| {
            format!(
                "{} {}/{} {} → {}",
                e.verb, e.resource, e.subresource, e.name, e.code
            )
        })
        .collect();
    let committed = audit
        .iter()
        .filter(|e| e.user == a.user() && e.is_write() && e.at >= acquired && e.succeeded())
        .count();
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
        "old leader committed nothing after the new one acquired the Lease",
        committed == 0,
        format!(
            "{committed} committed of its late requests {late:?}; last request {gap:?} s before {holder} acquired"
        ),
    ));
    checks.push(Check::new(
        "new leader wrote nothing before acquiring the Lease",
        early_b == 0,
        format!("{early_b} early writes"),
    ));
    rec.push(Run {
        class: CLASS.into(),
        fault: "leader partitioned (SIGSTOP) at a seeded point until its Lease expired, then continued"
            .into(),
        seed: Some(seed),
        checks,
        recovery: Some(Until::Leading.after(failover)),
    })
    .unwrap();
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
    let (fc, client) = FaultCluster::up().await.unwrap();
    let wave = Wave::setup(&client, &WaveSpec::drain("fence", 1, 1))
        .await
        .unwrap();
    // The node's report is healthy: an operator running in parallel only labels it. The plan
    // below is made as if it had a fatal XID.
    let spec: gpunode_crds::GpuNodePolicySpec =
        serde_json::from_value(WaveSpec::drain("x", 1, 0).policy_spec).unwrap();
    let node = wave.nodes_now().await.unwrap().remove(0);
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
    let p = plan("rel", &spec, &[view], now);
    let np = &p.nodes[0];
    assert_eq!(np.cordon, Some(true), "the plan cordons and drains: {np:?}");
    let since = jiff::Timestamp::now();
    let applier = Applier::new(client.clone()).with_gate(Leadership::fixed(false));
    let r = applier
        .apply(&wave.policy, np, &node, &spec.disruption.drain, now)
        .await;
    let audit = fc.audit().unwrap();
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
        recovery: None,
    })
    .unwrap();
    rec.assert_clean();
}
