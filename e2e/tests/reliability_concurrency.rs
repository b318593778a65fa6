//! Concurrency with another actor: a second controller adds and removes its own taint and label
//! on the same nodes as fast as it can (read-modify-write with resourceVersion for the taint list,
//! as any well-behaved controller must; a merge patch of its own label key) while gpunode taints
//! and untaints those nodes as their reports flip. Afterwards the other actor's taint and label
//! are exactly what it last wrote, and gpunode's are exactly what its policy implies.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use gpunode_e2e::{
    faults::{
        checks::Check,
        cluster::{self, FaultCluster},
        marks,
        record::{self, Recorder, Run, Until},
        replica::Operator,
        wave::{self, Wave, WaveSpec},
    },
    reports, wait,
};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

const CLASS: &str = "concurrency";
const DEADLINE: Duration = Duration::from_secs(120);
const ACTOR_TAINT: &str = "actor.example.com/maintenance";
const ACTOR_LABEL: &str = "actor.example.com/slot";

fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What the other actor last wrote on a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Mine {
    taint: Option<String>,
    label: Option<String>,
}

#[derive(Debug, Default)]
struct ActorStats {
    writes: usize,
    conflicts: usize,
}

/// Sets (or removes) the actor's own taint, keeping every other taint: read, modify, write with
/// the resourceVersion, again on conflict.
async fn set_taint(
    api: &Api<Node>,
    node: &str,
    value: Option<&str>,
    stats: &mut ActorStats,
) -> Result<(), kube::Error> {
    loop {
        let n = api.get(node).await?;
        let mut taints: Vec<Taint> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != ACTOR_TAINT)
            .collect();
        if let Some(v) = value {
            taints.push(Taint {
                key: ACTOR_TAINT.into(),
                value: Some(v.into()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
        }
        let patch = json!({"metadata": {"resourceVersion": n.metadata.resource_version},
                           "spec": {"taints": taints}});
        match api
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                stats.writes += 1;
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => stats.conflicts += 1,
            Err(e) => return Err(e),
        }
    }
}

async fn actor(
    client: Client,
    nodes: Vec<String>,
    run_for: Duration,
) -> (BTreeMap<String, Mine>, ActorStats) {
    let api: Api<Node> = Api::all(client);
    let mut last: BTreeMap<String, Mine> = BTreeMap::new();
    let mut stats = ActorStats::default();
    let end = Instant::now() + run_for;
    let mut i = 0u64;
    while Instant::now() < end {
        let r = mix(i);
        let node = &nodes[(r % nodes.len() as u64) as usize];
        let mine = last.entry(node.clone()).or_default();
        let value = format!("v{i}");
        if r & 0x100 == 0 {
            let v = (r & 0x200 == 0).then_some(value.as_str());
            set_taint(&api, node, v, &mut stats).await.expect("actor taint");
            mine.taint = v.map(str::to_string);
        } else {
            let v = (r & 0x200 == 0).then_some(value.clone());
            let patch = json!({"metadata": {"labels": {ACTOR_LABEL: v}}});
            api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("actor label");
            stats.writes += 1;
            mine.label = v;
        }
        i += 1;
    }
    (last, stats)
}

fn observed_mine(n: &Node) -> Mine {
    Mine {
        taint: n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .and_then(|ts| ts.iter().find(|t| t.key == ACTOR_TAINT))
            .and_then(|t| t.value.clone()),
        label: marks::label(n, ACTOR_LABEL),
    }
}

/// The policy's `maxUnavailable`, of the wave's 4 nodes.
const BUDGET: usize = 2;

#[tokio::test]
async fn another_controllers_taints_and_labels_survive_and_gpunodes_match_the_policy() {
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "concurrency");
    let mut op = Operator::start(&fc, &client, "rel-conc", "rel-conc")
        .await
        .unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    let mut spec = WaveSpec::drain("conc", 4, 0);
    spec.policy_spec["remediation"] =
        json!([{"classes": ["Xid"], "action": "Taint", "effect": "NoSchedule"}]);
    // A budget of 2 of the 4 nodes: the flips drift more at once, so the budget check below
    // can fail (with 4 of 4 it could not); the final reports drift 2.
    spec.policy_spec["disruption"]["maxUnavailable"] = json!(BUDGET);
    let wave = Wave::setup(&client, &spec).await.unwrap();
    // Besides the actor's own markers, checked against its last write at the end: a third
    // controller's label and taint and a person's cordon, watched at every instant.
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();

    let run_for = Duration::from_secs(
        std::env::var("GPUNODE_REL_ACTOR_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(15),
    );
    let actor_task = tokio::spawn(actor(client.clone(), wave.nodes.clone(), run_for));
    // Meanwhile the nodes' reports flip between a fatal XID and healthy, so gpunode keeps
    // adding and removing its taint on the same nodes.
    let start = Instant::now();
    let mut flips = 0u64;
    while start.elapsed() < run_for {
        let r = mix(1000 + flips);
        let node = &wave.nodes[(r % wave.nodes.len() as u64) as usize];
        reports::publish(&client, node, wave::report_status(r & 0x10 == 0, "boot-1"))
            .await
            .unwrap();
        flips += 1;
        cluster::hold("flip rate", Duration::from_millis(150))
            .await
            .unwrap();
    }
    let (last, stats) = actor_task.await.unwrap();
    // Final reports: even nodes drifted, odd ones healthy.
    let expect_drift: BTreeMap<String, bool> = wave
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i % 2 == 0))
        .collect();
    for (n, d) in &expect_drift {
        reports::publish(&client, n, wave::report_status(*d, "boot-1"))
            .await
            .unwrap();
    }
    let settled_from = Instant::now();
    let converged = wait::until(
        "gpunode's markers to match the final reports",
        DEADLINE,
        || async {
            let nodes = wave.nodes_now().await?;
            let ok = nodes.iter().all(|n| {
                let name = n.metadata.name.clone().unwrap_or_default();
                let drift = expect_drift.get(&name).copied().unwrap_or(false);
                let state = marks::label(n, marks::STATE_LABEL);
                let taints = marks::gpunode_taints(n);
                let drift_labels = n.metadata.labels.as_ref().map_or(0, |l| {
                    l.keys().filter(|k| k.starts_with("gpunode.dev/drift.")).count()
                });
                if drift {
                    state.as_deref() == Some("drifted") && taints.len() == 1 && drift_labels == 1
                } else {
                    state.as_deref() == Some("compliant") && taints.is_empty() && drift_labels == 0
                }
            });
            Ok(ok.then_some(nodes))
        },
    )
    .await;
    let recovery = record::elapsed_ms(settled_from);
    let converged_ok = converged.is_ok();
    let nodes = match converged {
        Ok(n) => n,
        Err(e) => {
            eprintln!("not converged: {e}");
            wave.nodes_now().await.unwrap()
        }
    };
    let gpunode_ok = converged_ok && nodes.len() == wave.nodes.len();
    let mut lost = Vec::new();
    for n in &nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let want = last.get(&name).cloned().unwrap_or_default();
        let got = observed_mine(n);
        if want != got {
            lost.push(format!("{name}: wrote {want:?}, found {got:?}"));
        }
    }
    let summary: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                "{}: {:?}",
                n.metadata.name.clone().unwrap_or_default(),
                marks::gpunode_taints(n)
            )
        })
        .collect();
    let watched = monitor
        .checks(BUDGET, &fc.audit().unwrap(), &wave.namespace)
        .await;
    rec.push(Run {
        class: CLASS.into(),
        fault: "another controller rewriting its taints and labels on the same nodes".into(),
        seed: Some(0),
        checks: vec![
            Check::new(
                "other actor's taints and labels are what it last wrote",
                lost.is_empty(),
                format!(
                    "{} actor writes ({} conflicts retried), {flips} report flips; differences: {lost:?}",
                    stats.writes, stats.conflicts
                ),
            ),
            Check::new(
                "gpunode's taints and labels match the policy",
                gpunode_ok,
                format!("{summary:?}"),
            ),
            Check::new("operator survived", op.alive(), "same process"),
        ]
        .into_iter()
        .chain(watched)
        .collect(),
        recovery: Some(Until::Answered.after(recovery)),
    })
    .unwrap();
    wave.cleanup().await;
    rec.assert_clean();
}
