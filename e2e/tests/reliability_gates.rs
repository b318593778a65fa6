//! The gates on disruption under leader failure, on the reliability cluster (never the shared
//! `test` cluster), with two operator replicas as processes:
//! - **approval given mid-wave**: three nodes drift under a Drain rule that requires approval;
//!   the leader is SIGKILLed while every node waits, the other replica takes over; a person
//!   approves one node, then a second while the first drains, and the new leader is SIGKILLed
//!   in turn (the first replica comes back), then the third node is approved;
//! - **a window opening mid-wave**: three nodes drift under a Drain rule that waits for a
//!   maintenance window opening at the next whole minute; the leader is SIGKILLed while they
//!   wait, and the replica that took over is SIGKILLed a second before the window opens, so the
//!   opening finds no leader until the first replica takes the Lease back;
//! - the same two gates under the other faults of a leader ([`Strike`]): a window opening while
//!   the leader is cut off (its network namespace's link down 8 s before the opening; a fenced
//!   follower takes over after the Lease expires) and while the API server is down (stopped 18 s
//!   before the opening, down 20 s once its process is gone); an approval given just before the
//!   leader is cut off, and just before the API server stops.
//!
//! Checks: nothing disruptive without its approval or outside the window, at any observed
//! instant (the monitor's node states: cordoned or tainted off) and in the audit log (no
//! eviction before the node's approval or the window's opening); each node drained once
//! approved or in the window; the wave's invariants (budget at every instant, no pod evicted
//! twice, every pod evicted once, the end state). Recovery: the last approval, or the window's
//! opening → the wave complete.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gpunode_e2e::{
    audit::AuditEvent,
    faults::{
        checks::Check,
        cluster::{self, FaultCluster},
        record::{self, Recorder, Run, Until},
        replica::Operator,
        strike::{Interrupted, Strike},
        wave::{Wave, WaveSpec},
    },
    monitor::WaveMonitor,
    wait,
};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

const CLASS: &str = "gates";
const DEADLINE: Duration = Duration::from_secs(120);
const NAMESPACE: &str = "rel-gates";

#[tokio::test]
async fn approvals_and_windows_hold_across_leader_kills() {
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "gates");
    let mut a = Operator::start(&fc, &client, "rel-gates-a", NAMESPACE)
        .await
        .unwrap();
    a.wait_leading(DEADLINE).await.unwrap();
    let mut b = Operator::start(&fc, &client, "rel-gates-b", NAMESPACE)
        .await
        .unwrap();
    approval_mid_wave(&fc, &client, &mut a, &mut b, &mut rec).await;
    b.spawn().unwrap();
    window_opening_mid_wave(&fc, &client, &mut a, &mut b, &mut rec).await;
    a.kill();
    b.kill();
    for strike in [Strike::Partition, Strike::ApiOutage] {
        approval_under(&fc, &client, &mut rec, strike).await;
        window_opening_under(&fc, &client, &mut rec, strike).await;
    }
    rec.assert_clean();
}

/// Waits until every node of the wave has a condition `test` accepts; whether they did.
async fn wait_all_conditions(wave: &Wave, what: &str, test: impl Fn(&str, &str) -> bool) -> bool {
    wait::until(what, DEADLINE, || async {
        let nodes = wave.nodes_now().await?;
        Ok((nodes.len() == wave.nodes.len()
            && nodes.iter().all(|n| {
                let (reason, message) = gpunode_e2e::nodes::compliance(n);
                test(&reason, &message)
            }))
        .then_some(()))
    })
    .await
    .is_ok()
}

/// A person approves the node's Drain (README, Manual approval); returns when.
async fn approve(client: &Client, node: &str) -> Timestamp {
    let at = Timestamp::now();
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"gpunode.dev/approve": "Drain"}}})),
        )
        .await
        .unwrap();
    at
}

/// Evictions of the wave's pods received before the moment `allowed` gives the pod's node.
fn early_evictions(
    audit: &[AuditEvent],
    wave: &Wave,
    allowed: impl Fn(&str) -> Option<Timestamp>,
) -> Vec<String> {
    let node_of: BTreeMap<&String, &String> = wave
        .pods
        .iter()
        .flat_map(|(node, pods)| pods.iter().map(move |p| (p, node)))
        .collect();
    audit
        .iter()
        .filter(|e| e.subresource == "eviction" && e.namespace == wave.namespace)
        .filter_map(|e| {
            let node = node_of.get(&e.name)?;
            let early = allowed(node).is_none_or(|from| e.at < from);
            early.then(|| format!("{} of {node} at {}", e.name, e.at))
        })
        .collect()
}

async fn approval_mid_wave(
    fc: &FaultCluster,
    client: &Client,
    a: &mut Operator,
    b: &mut Operator,
    rec: &mut Recorder,
) {
    let mut spec = WaveSpec::drain("approve", 3, 2);
    spec.policy_spec["remediation"] =
        json!([{"classes": ["Xid"], "action": "Drain", "requireApproval": true}]);
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    let waited = wait_all_conditions(&wave, "every node awaiting approval", |r, _| {
        r == "AwaitingApproval"
    })
    .await;
    // The leader dies while every node waits; the other takes over and must wait as well.
    a.kill();
    b.wait_leading(DEADLINE).await.unwrap();
    let mut approved = BTreeMap::new();
    approved.insert(wave.nodes[0].clone(), approve(client, &wave.nodes[0]).await);
    let first = wave.drain_started(&[], DEADLINE).await.unwrap();
    approved.insert(wave.nodes[1].clone(), approve(client, &wave.nodes[1]).await);
    // Mid-drain, the new leader dies too; the first replica comes back and takes over.
    b.kill();
    a.spawn().unwrap();
    a.wait_leading(DEADLINE).await.unwrap();
    let last = Instant::now();
    approved.insert(wave.nodes[2].clone(), approve(client, &wave.nodes[2]).await);
    wave.drive(DEADLINE * 2).await.unwrap();
    let wave_ms = record::elapsed_ms(last);

    let mut checks = vec![Check::new(
        "every node awaited its approval (condition AwaitingApproval)",
        waited,
        "before the first approval",
    )];
    checks.extend(approval_checks(fc, &wave, &monitor, &approved, &first).await);
    push(
        rec,
        "approval given mid-wave, node by node; the leader SIGKILLed while every node waited, the next one mid-drain",
        checks,
        wave_ms,
    );
    wave.cleanup().await;
}

async fn window_opening_mid_wave(
    fc: &FaultCluster,
    client: &Client,
    a: &mut Operator,
    b: &mut Operator,
    rec: &mut Recorder,
) {
    // At least 40 s away: time to set up, drift and fail over before it opens.
    let (window, opens) = gpunode_e2e::window::next_minute(Duration::from_secs(40)).unwrap();
    let mut spec = WaveSpec::drain("window", 3, 2);
    spec.policy_spec["maintenance"] = json!({"windows": [window]});
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    let waited = wait_all_conditions(&wave, "every node waiting for the window", |_, m| {
        m.contains("waiting for the maintenance window")
    })
    .await;
    // The leader dies while they wait; the other takes over, and dies a second before the
    // window opens: the opening finds no leader until the first takes its Lease back.
    a.kill();
    b.wait_leading(DEADLINE).await.unwrap();
    let before = opens
        .duration_since(Timestamp::now())
        .saturating_sub(jiff::SignedDuration::from_secs(1));
    let before = Duration::try_from(before).unwrap_or_default();
    cluster::hold("until a second before the window opens", before)
        .await
        .unwrap();
    b.kill();
    a.spawn().unwrap();
    let in_time = Timestamp::now() < opens;
    a.wait_leading(DEADLINE).await.unwrap();
    wave.drive(DEADLINE * 2).await.unwrap();
    let wave_ms = u64::try_from(Timestamp::now().duration_since(opens).as_millis()).unwrap_or(0);

    let mut checks = vec![
        Check::new(
            "every node waited for the window (its condition says until when)",
            waited,
            "before the first leader died",
        ),
        Check::new(
            "the second leader died before the window opened",
            in_time,
            format!("window opened at {opens}"),
        ),
    ];
    checks.extend(window_checks(fc, &wave, &monitor, opens).await);
    push(
        rec,
        "a maintenance window opening mid-wave; the leader SIGKILLed while the nodes waited, the next one a second before the opening",
        checks,
        wave_ms,
    );
    wave.cleanup().await;
}

/// Files a gate run: its fault, checks, and the time until the wave was complete.
fn push(rec: &mut Recorder, fault: &str, checks: Vec<Check>, wave_ms: u64) {
    rec.push(Run {
        class: CLASS.into(),
        fault: fault.into(),
        seed: None,
        checks,
        recovery: Some(Until::Converged.after(wave_ms)),
    })
    .unwrap();
}

/// Nothing out of service without its approval (the monitor's states), no eviction before the
/// node's approval (audit log), and the wave's invariants.
async fn approval_checks(
    fc: &FaultCluster,
    wave: &Wave,
    monitor: &WaveMonitor,
    approved: &BTreeMap<String, Timestamp>,
    first: &str,
) -> Vec<Check> {
    let disruptions = monitor.disruptions();
    let ungated: Vec<String> = disruptions
        .iter()
        .filter(|d| {
            !d.approved
                .as_deref()
                .is_some_and(|a| a.split(',').any(|r| r.trim() == "Drain"))
        })
        .map(|d| format!("{} at {}", d.node, d.at))
        .collect();
    let audit = fc.audit().unwrap();
    let early = early_evictions(&audit, wave, |n| approved.get(n).copied());
    let mut checks = vec![
        Check::new(
            "no node out of service without its approval (every observed state)",
            ungated.is_empty() && !disruptions.is_empty(),
            format!(
                "{} observed states out of service (first drained: {first}), without approval: {ungated:?}",
                disruptions.len()
            ),
        ),
        Check::new(
            "no eviction before the node's approval (audit log)",
            early.is_empty(),
            format!("early: {early:?}"),
        ),
    ];
    checks.extend(wave.run_checks(fc, monitor, 1, &wave.all_pods()).await.unwrap());
    checks
}

/// Nothing out of service before the window opened (the monitor's states), no eviction before
/// it (audit log), and the wave's invariants.
async fn window_checks(
    fc: &FaultCluster,
    wave: &Wave,
    monitor: &WaveMonitor,
    opens: Timestamp,
) -> Vec<Check> {
    let disruptions = monitor.disruptions();
    let outside: Vec<String> = disruptions
        .iter()
        .filter(|d| d.at < opens)
        .map(|d| format!("{} at {}", d.node, d.at))
        .collect();
    let audit = fc.audit().unwrap();
    let early = early_evictions(&audit, wave, |_| Some(opens));
    let mut checks = vec![
        Check::new(
            "no node out of service before the window opened (every observed state)",
            outside.is_empty() && !disruptions.is_empty(),
            format!(
                "{} observed states out of service, before {opens}: {outside:?}",
                disruptions.len()
            ),
        ),
        Check::new(
            "no eviction before the window opened (audit log)",
            early.is_empty(),
            format!("early: {early:?}"),
        ),
    ];
    checks.extend(wave.run_checks(fc, monitor, 1, &wave.all_pods()).await.unwrap());
    checks
}

/// The replicas of a gate scenario under `strike` (their own identities and Lease namespace).
async fn struck_leader(fc: &FaultCluster, client: &Client, strike: Strike) -> Interrupted {
    let mut leader = Interrupted::start(fc, client, strike, ("rel-gates-s", "rel-gates-s"), None, &[])
        .await
        .unwrap();
    leader.leader().wait_leading(DEADLINE).await.unwrap();
    leader
}

/// Three nodes wait for their approval; a person approves the first just before the leader is
/// struck (cut off, or the API server stopped), the second once the strike is over and the
/// first drains, then the third.
async fn approval_under(fc: &FaultCluster, client: &Client, rec: &mut Recorder, strike: Strike) {
    let mut spec = WaveSpec::drain(&format!("approve{}", strike.tag()), 3, 2);
    spec.policy_spec["remediation"] =
        json!([{"classes": ["Xid"], "action": "Drain", "requireApproval": true}]);
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    let mut leader = struck_leader(fc, client, strike).await;
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    let waited = wait_all_conditions(&wave, "every node awaiting approval", |r, _| {
        r == "AwaitingApproval"
    })
    .await;
    let mut approved = BTreeMap::new();
    approved.insert(wave.nodes[0].clone(), approve(client, &wave.nodes[0]).await);
    let (mut checks, _) = leader.strike(fc, client, DEADLINE).await;
    let first = wave.drain_started(&[], DEADLINE).await.unwrap();
    approved.insert(wave.nodes[1].clone(), approve(client, &wave.nodes[1]).await);
    let last = Instant::now();
    approved.insert(wave.nodes[2].clone(), approve(client, &wave.nodes[2]).await);
    wave.drive(DEADLINE * 2).await.unwrap();
    let wave_ms = record::elapsed_ms(last);
    checks.push(Check::new(
        "every node awaited its approval (condition AwaitingApproval)",
        waited,
        "before the first approval",
    ));
    checks.extend(approval_checks(fc, &wave, &monitor, &approved, &first).await);
    checks.extend(leader.afterwards(fc, client).await);
    let fault = match strike {
        Strike::Partition => {
            "an approval given just before the leader's network was cut (netns link down); a fenced follower took over"
        }
        _ => "an approval given just before kube-apiserver stopped 20 s",
    };
    push(rec, fault, checks, wave_ms);
    wave.cleanup().await;
    leader.end().await;
}

/// Three nodes wait for a maintenance window; before it opens the leader is struck (cut off
/// 8 s before: a fenced follower takes over once the Lease expires; or the API server stopped
/// 18 s before, for 20 s once its process is gone), so the opening finds no leader that can act.
async fn window_opening_under(fc: &FaultCluster, client: &Client, rec: &mut Recorder, strike: Strike) {
    // At least 70 s away: right after the last scenario's outage, setting up and drifting the
    // wave has taken 40 s, and the strike comes up to 18 s before the opening.
    let (window, opens) = gpunode_e2e::window::next_minute(Duration::from_secs(70)).unwrap();
    let mut spec = WaveSpec::drain(&format!("window{}", strike.tag()), 3, 2);
    spec.policy_spec["maintenance"] = json!({"windows": [window]});
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    let mut leader = struck_leader(fc, client, strike).await;
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    let waited = wait_all_conditions(&wave, "every node waiting for the window", |_, m| {
        m.contains("waiting for the maintenance window")
    })
    .await;
    // A partition is cut at once and its follower takes over once the Lease expires (13–15 s
    // later); the API server may take up to 15 s to exit on its TERM, and stays down 20 s.
    let lead = match strike {
        Strike::ApiOutage => 18,
        _ => 8,
    };
    let before = opens
        .duration_since(Timestamp::now())
        .saturating_sub(jiff::SignedDuration::from_secs(lead));
    let before = Duration::try_from(before).unwrap_or_default();
    cluster::hold("until the strike before the window opens", before)
        .await
        .unwrap();
    let (mut checks, _) = leader.strike(fc, client, DEADLINE).await;
    wave.drive(DEADLINE * 2).await.unwrap();
    let wave_ms = u64::try_from(Timestamp::now().duration_since(opens).as_millis()).unwrap_or(0);
    let span = leader.span();
    checks.extend([
        Check::new(
            "every node waited for the window (its condition says until when)",
            waited,
            "before the strike",
        ),
        Check::new(
            "the window opened with no leader able to act (cut off or without its API server from before the opening to after it)",
            span.is_some_and(|(down, back)| down < opens && back > opens),
            format!("cut off over {span:?}, window opened at {opens}"),
        ),
    ]);
    checks.extend(window_checks(fc, &wave, &monitor, opens).await);
    checks.extend(leader.afterwards(fc, client).await);
    let fault = match strike {
        Strike::Partition => {
            "a maintenance window opening while the leader's network was cut (netns link down); a fenced follower took over"
        }
        _ => "a maintenance window opening while kube-apiserver was stopped 20 s",
    };
    push(rec, fault, checks, wave_ms);
    wave.cleanup().await;
    leader.end().await;
}
