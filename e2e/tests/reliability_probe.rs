//! Probe faults, with the operator as a process and the test playing the probes:
//! - a probe dies: its last report goes stale by the operator's own timer (no event arrives), the
//!   node turns Unknown and nothing disruptive happens under a policy that does not ask for it;
//!   under one that taints Stale nodes explicitly, the taint comes; both recover when the probe
//!   returns;
//! - a probe floods updates (hundreds of reports from 32 concurrent writers, as fast as the API
//!   server takes them): the operator's reconciles stay bounded by the updates and it writes
//!   nothing to the Node;
//! - a probe restarts with a different boot id: no action, no write to the Node;
//! - the real probe process (fake NVML, the chart's ServiceAccount) SIGKILLed mid-drain after a
//!   fatal XID and restarted on the same boot: the XID comes back from its state directory, the
//!   node stays out of service and its drain completes; restarted after a reboot, the node returns;
//! - the real probe with its wall clock 10 minutes ahead, then behind (libfaketime): the node is
//!   compliant while the probe runs and turns Unknown `staleAfter` (60 s) after it dies, by the
//!   operator's clock, not the probe's.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use gpunode_e2e::{
    faults::{
        checks::Check,
        cluster::FaultCluster,
        marks,
        record::{self, Recorder, Run, Until},
        replica::Operator,
        wave::{self, Wave, WaveSpec},
    },
    probe::Host,
    reports, wait,
};
use kube::Client;
use serde_json::json;

const CLASS: &str = "probe";
const DEADLINE: Duration = Duration::from_secs(120);
/// A probe's clock skew: ten minutes, ten times the skewed run's `staleAfter`.
const PROBE_SKEW_SECS: i64 = 600;
/// Reports in flight at once during the flood.
const FLOOD_WRITERS: usize = 32;

/// The reconcile counter once it has stopped moving for `QUIET` (debounced reconciles of
/// earlier events done).
async fn settled(op: &Operator) -> f64 {
    // Longer than the controller's debounce plus one reconcile on a loaded machine.
    const QUIET: Duration = Duration::from_millis(800);
    let last: std::sync::Mutex<Option<(f64, Instant)>> = std::sync::Mutex::new(None);
    wait::until("reconciles to settle", DEADLINE, || async {
        let now = op.metric("gpunode_reconciles_total").await?;
        let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
        match *last {
            Some((v, since)) if v == now => Ok((since.elapsed() >= QUIET).then_some(now)),
            _ => {
                *last = Some((now, Instant::now()));
                Ok(None)
            }
        }
    })
    .await
    .unwrap()
}

fn node_writes(fc: &FaultCluster, user: &str, nodes: &[String], since: jiff::Timestamp) -> usize {
    fc.audit()
        .unwrap_or_default()
        .iter()
        .filter(|e| e.user == user && e.is_write() && e.resource == "nodes" && e.at > since)
        .filter(|e| nodes.contains(&e.name))
        .count()
}

#[tokio::test]
async fn dead_flooding_and_restarted_probes_cause_no_harm() {
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "probe");
    let mut op = Operator::start(&fc, &client, "rel-probe", "rel-probe")
        .await
        .unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    // A subset while working on one (`GPUNODE_REL_PROBE_FAULTS_ONLY=skew`), all by default.
    let only = std::env::var("GPUNODE_REL_PROBE_FAULTS_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only.split(',').any(|o| o == name);
    if run("dead") {
        dead_probe(&fc, &client, &mut rec).await;
    }
    if run("flood") {
        flood(&fc, &client, &op, &mut rec).await;
    }
    if run("killed") {
        real_probe_killed(&fc, &client, &mut rec).await;
    }
    rec.push(Run {
        class: CLASS.into(),
        fault: "(all probe faults) operator process".into(),
        seed: None,
        checks: vec![Check::new(
            "operator survived every probe fault",
            op.alive(),
            "same process",
        )],
        recovery: None,
    })
    .unwrap();
    if run("skew") {
        // The skewed probes' heartbeats count: the operator reads the heartbeat Leases where
        // the probes write them, its own namespace (the release namespace, as the chart runs
        // both), so this replica takes over from the one above.
        op.kill();
        let mut op = Operator::start(&fc, &client, "rel-probe-skew", gpunode_e2e::chart::NAMESPACE)
            .await
            .unwrap();
        op.wait_leading(DEADLINE).await.unwrap();
        skewed_probe(&fc, &client, &mut rec, PROBE_SKEW_SECS).await;
        skewed_probe(&fc, &client, &mut rec, -PROBE_SKEW_SECS).await;
        op.kill();
    }
    rec.assert_clean();
}

/// Waits until `node`'s probe has renewed its heartbeat Lease `n` times from now.
async fn heartbeats_after(client: &Client, node: &str, n: usize) -> Result<(), gpunode_e2e::Error> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), gpunode_e2e::chart::NAMESPACE);
    let name = gpunode_crds::heartbeat::lease_name(node).unwrap_or_default();
    let renewed = || async {
        let lease = leases.get_opt(&name).await?;
        Ok::<_, gpunode_e2e::Error>(lease.and_then(|l| l.spec?.renew_time).map(|t| t.0))
    };
    let mut last = renewed().await?;
    for _ in 0..n {
        let before = last;
        last = wait::until("a heartbeat Lease renewal", DEADLINE, || async {
            let now = renewed().await?;
            Ok((now.is_some() && now != before).then_some(now))
        })
        .await?;
    }
    Ok(())
}

/// A report last observed `age` ago.
fn aged(age: Duration) -> serde_json::Value {
    let mut s = wave::report_status(false, "boot-1");
    let at = jiff::Timestamp::now() - jiff::SignedDuration::try_from(age).unwrap_or_default();
    s["observedAt"] = json!(at.to_string());
    s
}

async fn dead_probe(fc: &FaultCluster, client: &Client, rec: &mut Recorder) {
    // Policy A does not act on Stale; policy B taints Stale nodes explicitly.
    let mut spec = WaveSpec::drain("stale", 1, 2);
    spec.policy_spec["staleAfter"] = json!("60s");
    let quiet = Wave::setup(client, &spec).await.unwrap();
    let mut spec = WaveSpec::drain("stalet", 1, 0);
    spec.policy_spec["staleAfter"] = json!("60s");
    spec.policy_spec["remediation"] =
        json!([{"classes": ["Stale"], "action": "Taint", "effect": "NoSchedule"}]);
    let loud = Wave::setup(client, &spec).await.unwrap();
    let monitor = quiet.monitor();
    quiet.wait_all("compliant", DEADLINE).await.unwrap();
    loud.wait_all("compliant", DEADLINE).await.unwrap();
    // The probes' last words: observed 50 s ago, so with staleAfter 60 s the reports go stale
    // 10 s from now, by the operator's timer alone (nothing is published after this).
    for w in [&quiet, &loud] {
        reports::publish(client, &w.nodes[0], aged(Duration::from_secs(50)))
            .await
            .unwrap();
    }
    let died = Instant::now();
    let spec_stale = Duration::from_secs(10);
    quiet.wait_all("unknown", DEADLINE).await.unwrap();
    let detected = died.elapsed();
    let tainted = wait::until(
        "the Stale taint on the node of the explicit policy",
        DEADLINE,
        || async {
            let n = loud.nodes_now().await?;
            Ok(n.first()
                .filter(|n| marks::disrupted(n))
                .map(marks::gpunode_taints))
        },
    )
    .await
    .unwrap();
    let q = quiet.nodes_now().await.unwrap();
    let alive = quiet.alive_pods().await.unwrap();
    let untouched = q
        .iter()
        .all(|n| !marks::disrupted(n) && marks::gpunode_taints(n).is_empty())
        && alive.values().sum::<usize>() == 2;
    // The probe comes back.
    for w in [&quiet, &loud] {
        reports::publish(client, &w.nodes[0], wave::report_status(false, "boot-1"))
            .await
            .unwrap();
    }
    let back = Instant::now();
    quiet.wait_all("compliant", DEADLINE).await.unwrap();
    wait::until("the Stale taint removed once fresh again", DEADLINE, || async {
        let n = loud.nodes_now().await?;
        Ok(n.first()
            .is_some_and(|n| marks::gpunode_taints(n).is_empty() && !marks::disrupted(n))
            .then_some(()))
    })
    .await
    .unwrap();
    let recovery = record::elapsed_ms(back);
    let mut checks = vec![
        Check::new(
            "stale report makes the node Unknown by the timer",
            detected >= spec_stale - Duration::from_secs(1)
                && detected < spec_stale + Duration::from_secs(15),
            format!(
                "Unknown {:.1} s after the probe died (expected ~{} s)",
                detected.as_secs_f64(),
                spec_stale.as_secs()
            ),
        ),
        Check::new(
            "Unknown is not drifted: no taint, cordon or eviction",
            untouched,
            format!("pods alive {alive:?}"),
        ),
        Check::new(
            "explicit Stale rule acts",
            !tainted.is_empty(),
            format!("taints {tainted:?}"),
        ),
    ];
    checks.extend(quiet.run_checks(fc, &monitor, 0, &[]).await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault: "probe died (report went stale)".into(),
        seed: None,
        checks,
        recovery: Some(Until::Converged.after(recovery)),
    })
    .unwrap();
    quiet.cleanup().await;
    loud.cleanup().await;
}

async fn flood(fc: &FaultCluster, client: &Client, op: &Operator, rec: &mut Recorder) {
    let wave = Wave::setup(client, &WaveSpec::drain("flood", 2, 1))
        .await
        .unwrap();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    let r0 = settled(op).await;
    let since = jiff::Timestamp::now();
    let updates: u32 = std::env::var("GPUNODE_REL_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let start = Instant::now();
    // Concurrent writers at full speed: as many reports in flight as the API server takes.
    let results: Vec<Result<(), gpunode_e2e::Error>> = futures::stream::iter(0..updates)
        .map(|i| {
            let node = wave.nodes[(i % 2) as usize].clone();
            async move {
                let mut s = wave::report_status(false, "boot-1");
                // Noise a probe would not even publish: temperature and power jitter.
                s["gpus"][0]["temperatureCelsius"] = json!(40 + (i % 7));
                s["gpus"][0]["powerWatts"] = json!(100 + (i % 13));
                reports::publish_status(client, &node, s).await
            }
        })
        .buffer_unordered(FLOOD_WRITERS)
        .collect()
        .await;
    let refused = results.iter().filter(|r| r.is_err()).count();
    let flood_s = start.elapsed().as_secs_f64();
    let ended = Instant::now();
    let r1 = settled(op).await;
    let settle_ms = record::elapsed_ms(ended);
    let reconciles = r1 - r0;
    let writes = node_writes(fc, &op.user(), &wave.nodes, since);
    // A restarted probe: new boot id, same healthy node.
    let since_boot = jiff::Timestamp::now();
    for n in &wave.nodes {
        reports::publish(client, n, wave::report_status(false, "boot-2"))
            .await
            .unwrap();
    }
    settled(op).await;
    let boot_writes = node_writes(fc, &op.user(), &wave.nodes, since_boot);
    let mut checks = vec![
        Check::new(
            "operator work bounded by the updates",
            reconciles <= f64::from(updates) + 5.0,
            format!(
                "{updates} reports from {FLOOD_WRITERS} concurrent writers in {flood_s:.1} s \
                 ({:.0}/s, {refused} refused) → {reconciles} reconciles",
                f64::from(updates) / flood_s
            ),
        ),
        Check::new(
            "no write amplification on Nodes",
            writes == 0,
            format!("{writes} node writes during the flood"),
        ),
    ];
    checks.extend(wave.final_checks().await.unwrap());
    rec.push(Run {
        class: "load".into(),
        fault: format!("probe flooded {updates} updates from {FLOOD_WRITERS} concurrent writers"),
        seed: None,
        checks,
        recovery: Some(Until::Settled.after(settle_ms)),
    })
    .unwrap();
    let mut checks = vec![Check::new(
        "restart with a new boot id changes nothing",
        boot_writes == 0,
        format!("{boot_writes} node writes"),
    )];
    checks.extend(wave.final_checks().await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault: "probe restarted with a different boot id".into(),
        seed: None,
        checks,
        recovery: None,
    })
    .unwrap();
    wave.cleanup().await;
}

async fn real_probe_killed(fc: &FaultCluster, client: &Client, rec: &mut Recorder) {
    let wave = Wave::setup(client, &WaveSpec::drain("realprobe", 1, 2))
        .await
        .unwrap();
    let monitor = wave.monitor();
    let node = wave.nodes[0].clone();
    let host = Host::prepare(client, &node).await.unwrap();
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let first = host.start_probe("boot-a").unwrap();
    // NVML delivers an XID only to an event set registered before it happened.
    first.logged("listening for XID events", DEADLINE).await.unwrap();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    host.inject_xid(3, 79).unwrap();
    wait::until("the drain to start", DEADLINE, || async {
        let n = nodes.get(&node).await?;
        Ok(marks::annotation(&n, marks::DRAIN_STARTED_ANNOTATION).map(|_| ()))
    })
    .await
    .unwrap();
    let was_running = first.kill().unwrap();
    let second = host.start_probe("boot-a").unwrap();
    let restored = second
        .logged("restored the XIDs of this boot", DEADLINE)
        .await
        .is_ok();
    second.logged("first observation", DEADLINE).await.unwrap();
    // The drain completes with the restarted probe still reporting the XID.
    wait::until("the drain to complete", DEADLINE, || async {
        Ok((wave.alive_pods().await?.values().sum::<usize>() == 0).then_some(()))
    })
    .await
    .unwrap();
    let n = nodes.get(&node).await.unwrap();
    let held = gpunode_e2e::nodes::cordoned(&n)
        && marks::label(&n, marks::STATE_LABEL).as_deref() == Some("drifted");
    let _ = second.kill();
    // The repair: a reboot. The XIDs of boot A are forgotten; the node returns after healthyFor.
    let third = host.start_probe("boot-b").unwrap();
    third.logged("first observation", DEADLINE).await.unwrap();
    let rebooted = Instant::now();
    wait::until("the node back in service", DEADLINE, || async {
        let n = nodes.get(&node).await?;
        Ok((!gpunode_e2e::nodes::cordoned(&n)
            && marks::label(&n, marks::STATE_LABEL).as_deref() == Some("compliant"))
        .then_some(()))
    })
    .await
    .unwrap();
    let recovery = record::elapsed_ms(rebooted);
    let mut checks = vec![
        Check::new(
            "the probe was running when SIGKILLed mid-drain",
            was_running,
            "killed after the drain started",
        ),
        Check::new(
            "the restarted probe kept the XID of this boot",
            restored,
            "log: restored the XIDs of this boot",
        ),
        Check::new(
            "the node stayed cordoned and drifted across the probe's restart until drained",
            held,
            format!(
                "cordoned {}, state {:?}",
                gpunode_e2e::nodes::cordoned(&n),
                marks::label(&n, marks::STATE_LABEL)
            ),
        ),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault: "the real probe process SIGKILLed mid-drain and restarted on the same boot".into(),
        seed: None,
        checks,
        recovery: Some(Until::Converged.after(recovery)),
    })
    .unwrap();
    drop(third);
    host.cleanup(client).await;
    wave.cleanup().await;
}

/// The real probe with its wall clock `skew` seconds off the operator's (`staleAfter: 60s`, the
/// least allowed; a heartbeat every second): fresh while it runs, stale 60 s after it dies, and back when it
/// returns. Judged by the probe's own times, a probe behind would be stale from the start and
/// one ahead would stay fresh for its skew after it died.
async fn skewed_probe(fc: &FaultCluster, client: &Client, rec: &mut Recorder, skew: i64) {
    let short = if skew > 0 { "ahead" } else { "behind" };
    let mut spec = WaveSpec::drain(&format!("pskew{short}"), 1, 2);
    spec.policy_spec["staleAfter"] = json!("60s");
    // Every node of the policy has the real probe: a bystander's report, published once,
    // would go stale in its turn.
    spec.bystander = false;
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    let node = wave.nodes[0].clone();
    let host = Host::prepare(client, &node).await.unwrap();
    let env = gpunode_e2e::faults::clock::skewed(skew).unwrap();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    // From compliant (the wave's report), with the node's Events read: a probe behind whose
    // first report made the node Unknown for a moment (the operator took it for stale until its
    // first heartbeat) shows as an Unknown Event, or as a death seen at once.
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    let first = host.start_probe_env("boot-a", &[], &env).unwrap();
    first.logged("first observation", DEADLINE).await.unwrap();
    // The skew applied: the first report's observedAt, by the probe's clock, is off by about
    // `skew` (read at once: the probe rewrites its report only when it changes).
    let reports: kube::Api<gpunode_crds::GpuNodeReport> = kube::Api::all(client.clone());
    let observed = wait::until("the skewed probe's first report", DEADLINE, || async {
        Ok(reports.get_opt(&node).await?.and_then(|r| r.status?.observed_at))
    })
    .await
    .ok()
    .map(|t| t.0.duration_since(jiff::Timestamp::now()).as_secs());
    let applied = observed.is_some_and(|off| (off - skew).abs() <= 30);
    let fresh = wave.wait_all("compliant", DEADLINE).await.is_ok();
    // Two renewals of its Lease after the report: the operator has long seen both.
    let renewals = heartbeats_after(client, &node, 2).await.is_ok();
    let turns: Vec<String> = gpunode_e2e::nodes::events(client, &node)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    let flapped = turns.iter().any(|r| r == "Unknown");
    let _ = first.kill();
    let died = Instant::now();
    let stale = wave.wait_all("unknown", DEADLINE).await.is_ok();
    let detected = died.elapsed();
    let second = host.start_probe_env("boot-a", &[], &env).unwrap();
    let back = Instant::now();
    let returned = wave.wait_all("compliant", DEADLINE).await.is_ok();
    let recovery = record::elapsed_ms(back);
    let mut checks = vec![
        Check::new(
            "the probe's clock was skewed (its report's observedAt against the operator's clock)",
            applied,
            format!("observedAt {observed:?} s from now, skew {skew:+} s"),
        ),
        Check::new(
            "a running probe with a skewed clock keeps its node fresh (compliant, never Unknown)",
            fresh && renewals && !flapped,
            format!(
                "compliant {fresh}, 2 heartbeats after its report {renewals}, the node's Events {turns:?}"
            ),
        ),
        // The operator times staleness from the last renewal it received: that may precede the
        // kill by the 1-s interval and the reads above (58.9 s, twice, in a make
        // reliability-long; 59.9 s unloaded); a judgement by the skewed clock shows 0 s or 660 s.
        Check::new(
            "its death is seen staleAfter later by the operator's clock",
            stale && detected >= Duration::from_secs(50) && detected < Duration::from_secs(75),
            format!(
                "Unknown {:.1} s after the probe died (staleAfter 60 s)",
                detected.as_secs_f64()
            ),
        ),
        Check::new(
            "the node returns when the probe does",
            returned,
            format!("compliant again {recovery} ms after the restart"),
        ),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 0, &[]).await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault: format!(
            "the real probe with its wall clock {} s {short} the operator's (libfaketime), killed and restarted",
            skew.abs()
        ),
        seed: None,
        checks,
        recovery: Some(Until::Converged.after(recovery)),
    })
    .unwrap();
    drop(second);
    host.cleanup(client).await;
    wave.cleanup().await;
}
