//! What gpunode leaves behind when things go wrong, on the reliability cluster (never the shared
//! `test` cluster), with operator replicas as real processes:
//!
//! - a policy governing many nodes, each cordoned and tainted by gpunode, is deleted; its leader
//!   loses its Lease part-way through the release (SIGSTOP past the renew deadline, as a long
//!   pause or a partition would) while the other replica is stopped too, then carries on and is
//!   killed; once the other replica leads, no node carries any `gpunode.dev/` taint, label or
//!   annotation, the GpuPolicyCompliant condition or a cordon gpunode made. (Before the fix the
//!   paused leader took its lost Lease as "done", removed the finalizer, and the rest of the
//!   nodes kept gpunode's cordon and taint with no policy left to undo them.)
//! - nodes left with gpunode's markers and no policy (a finalizer removed by hand) are released
//!   by the leader, with an Event and a metric, gpunode's keys another field manager holds too;
//! - SIGTERM with the API server not answering: the operator still exits within its shutdown
//!   limit (before, it waited for ever on the Lease release).
//!
//! The tests share one cluster and stop its API server, so they take turns.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    faults::{
        cluster::{FaultCluster, Restore},
        marks,
        replica::{Launch, Operator},
        wave::{Wave, WaveSpec},
    },
    wait,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Event, Node},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(120);
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Everything gpunode may have left on a node, as a list of what is there.
fn leftovers(node: &Node) -> Vec<String> {
    let mut out = Vec::new();
    let meta = &node.metadata;
    out.extend(
        meta.labels
            .iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("gpunode.dev/"))
            .map(|(k, _)| format!("label {k}")),
    );
    out.extend(
        meta.annotations
            .iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("gpunode.dev/"))
            .map(|(k, _)| format!("annotation {k}")),
    );
    out.extend(
        marks::gpunode_taints(node)
            .into_iter()
            .map(|t| format!("taint {t}")),
    );
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        out.push("cordon".into());
    }
    let condition = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "GpuPolicyCompliant"));
    if condition {
        out.push("condition GpuPolicyCompliant".into());
    }
    out
}

fn released(node: &Node) -> bool {
    !node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key("gpunode.dev/policy"))
}

/// Cordon and taint on a fatal XID, every node at once (budget 100%, breaker off).
fn cordon_and_taint(tag: &str, nodes: usize) -> WaveSpec {
    let mut spec = WaveSpec::drain(tag, nodes, 0);
    spec.policy_spec = json!({
        "gpu": {},
        "remediation": [
            {"classes": ["Xid"], "action": "Taint", "effect": "NoSchedule"},
            {"classes": ["Xid"], "action": "Cordon"},
        ],
        "disruption": {"maxUnavailable": "100%", "circuitBreaker": {"maxDriftedPercent": 100}},
        "recovery": {"healthyFor": "1s"},
    });
    spec
}

/// A policy's `nodes` fake nodes, each cordoned and tainted by gpunode for a fatal XID.
async fn disrupted_wave(client: &Client, tag: &str, nodes: usize) -> Wave {
    let wave = Wave::setup(client, &cordon_and_taint(tag, nodes)).await.unwrap();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    wait_all_disrupted(&wave).await;
    wave
}

async fn wait_all_disrupted(wave: &Wave) {
    wait::until("every node cordoned and tainted by gpunode", DEADLINE, || async {
        let nodes = wave.nodes_now().await?;
        Ok((nodes.len() == wave.nodes.len()
            && nodes.iter().all(|n| {
                n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
                    && !marks::gpunode_taints(n).is_empty()
            }))
        .then_some(()))
    })
    .await
    .unwrap();
}

async fn wait_all_clean(wave: &Wave, what: &str) {
    let result = wait::until(what, DEADLINE, || async {
        let nodes = wave.nodes_now().await?;
        Ok(nodes.iter().all(|n| leftovers(n).is_empty()).then_some(()))
    })
    .await;
    if let Err(e) = result {
        let nodes = wave.nodes_now().await.unwrap_or_default();
        let left: Vec<String> = nodes
            .iter()
            .filter(|n| !leftovers(n).is_empty())
            .map(|n| {
                format!(
                    "{}: {:?}",
                    n.metadata.name.clone().unwrap_or_default(),
                    leftovers(n)
                )
            })
            .collect();
        panic!("{e}\nstill marked:\n{}", left.join("\n"));
    }
}

/// Waits until the API server's copy of the leader Lease has expired (renewTime + duration).
async fn wait_lease_expired(client: &Client, namespace: &str) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    wait::until("the paused leader's Lease to expire", DEADLINE, || async {
        let l = leases.get(gpunode_operator::leader::DEFAULT_LEASE_NAME).await?;
        let spec = l.spec.unwrap_or_default();
        let renewed = spec.renew_time.map(|t| t.0);
        let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15)) + 1;
        let expired =
            renewed.is_some_and(|t| jiff::Timestamp::now() > t + jiff::SignedDuration::from_secs(secs));
        Ok(expired.then_some(()))
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_deleted_policy_is_released_completely_when_its_leader_loses_the_lease_mid_release() {
    let _turn = TURN.lock().await;
    let (fc, client) = FaultCluster::up().await.unwrap();
    let ns = "rel-release";
    // A releases two nodes at a time: with the default 32, most of the 40 releases are already
    // on the wire when the test sees the first one done, and SIGSTOP cannot stop requests the
    // API server has received, so nothing would be left to release after the pause. Two still
    // runs the concurrent path (several releases in flight when leadership is lost).
    let launch = Launch {
        env: vec![("GPUNODE_APPLY_CONCURRENCY".into(), "2".into())],
        ..Launch::default()
    };
    let mut a = Operator::start_with(&fc, &client, "rel-release-a", ns, launch)
        .await
        .unwrap();
    a.wait_leading(DEADLINE).await.unwrap();
    let b = Operator::start(&fc, &client, "rel-release-b", ns).await.unwrap();

    let wave = disrupted_wave(&client, "rls", 40).await;

    // B cannot take over while A is paused: what A does on resuming decides.
    b.pause().unwrap();
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    policies
        .delete(&wave.policy, &DeleteParams::default())
        .await
        .unwrap();
    // Pause A as soon as its release has begun but not ended (tight polling: a release of 40
    // nodes two at a time takes about half a second).
    let nodes_api: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default().labels(&wave.selector());
    let started = Instant::now();
    let (done, total) = loop {
        let nodes = nodes_api.list(&lp).await.unwrap().items;
        let done = nodes.iter().filter(|n| released(n)).count();
        if done > 0 {
            a.pause().unwrap();
            break (done, nodes.len());
        }
        assert!(started.elapsed() < DEADLINE, "the release never started");
        tokio::time::sleep(Duration::from_millis(5)).await; // poll interval of the tight wait
    };
    let after_pause = nodes_api.list(&lp).await.unwrap().items;
    let done_paused = after_pause.iter().filter(|n| released(n)).count();
    eprintln!("release paused after {done} (then {done_paused}) of {total} nodes");
    assert!(
        done_paused < total,
        "the release finished before the leader could be paused; nothing was tested"
    );

    // A's term passes while it is paused; it resumes as a replica that no longer leads.
    wait_lease_expired(&client, ns).await;
    a.resume().unwrap();
    // Whatever A does next, it does within a few seconds; then it dies.
    wait::until("the resumed replica to run again", DEADLINE, || async {
        Ok((a.metric("gpunode_reconciles_total").await.is_ok()).then_some(()))
    })
    .await
    .unwrap();
    let stranded = policies.get_opt(&wave.policy).await.unwrap().is_none()
        && nodes_api
            .list(&lp)
            .await
            .unwrap()
            .items
            .iter()
            .any(|n| !leftovers(n).is_empty());
    eprintln!("after the resumed replica: policy gone with nodes still marked = {stranded}");
    a.kill();

    b.resume().unwrap();
    b.wait_leading(DEADLINE).await.unwrap();
    wait_all_clean(&wave, "every node released by the new leader").await;
    wait::until("the policy to be gone", DEADLINE, || async {
        Ok(policies.get_opt(&wave.policy).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    let released_by_b = b
        .metric("gpunode_actions_total{action=\"release\",result=\"ok\"}")
        .await;
    eprintln!("released by the new leader: {released_by_b:?}");
}

#[tokio::test]
async fn markers_no_policy_governs_are_released_with_an_event() {
    let _turn = TURN.lock().await;
    let (fc, client) = FaultCluster::up().await.unwrap();
    let ns = "rel-unowned";
    let mut op = Operator::start(&fc, &client, "rel-unowned", ns).await.unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    let wave = disrupted_wave(&client, "unowned", 3).await;

    // Someone removes the finalizer by hand while the operator is down, then deletes the policy.
    op.kill();
    // Another writer holds one node's gpunode state label too and left an annotation under
    // gpunode's prefix: applying nothing under gpunode's field manager leaves both, so the
    // release must delete them by name (before, the sweep released that node again and again).
    let nodes: Api<Node> = Api::all(client.clone());
    let foreign = json!({"metadata": {
        "labels": {"gpunode.dev/state": "Drifted"},
        "annotations": {"gpunode.dev/left-by-hand": "yes"},
    }});
    nodes
        .patch(
            &wave.nodes[0],
            &PatchParams {
                field_manager: Some("someone-else".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(&foreign),
        )
        .await
        .unwrap();
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    policies
        .patch(
            &wave.policy,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    policies
        .delete(&wave.policy, &DeleteParams::default())
        .await
        .unwrap();
    wait::until("the policy to be gone", DEADLINE, || async {
        Ok(policies.get_opt(&wave.policy).await?.is_none().then_some(()))
    })
    .await
    .unwrap();

    // At start-up the operator finds what no policy governs and releases it.
    op.spawn().unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    wait_all_clean(&wave, "every unowned node released at start-up").await;
    // Counted once each release returns, just after its last write.
    wait::until("the release metric to count every node", DEADLINE, || async {
        let released = op
            .metric("gpunode_actions_total{action=\"release\",result=\"ok\"}")
            .await?;
        Ok((released >= 3.0).then_some(()))
    })
    .await
    .unwrap();
    let events: Api<Event> = Api::all(client.clone());
    wait::until("a Released event for each node", DEADLINE, || async {
        let list = events
            .list(&ListParams::default().fields("reason=Released"))
            .await?;
        let on: std::collections::BTreeSet<String> = list
            .items
            .iter()
            .filter_map(|e| e.involved_object.name.clone())
            .collect();
        Ok(wave.nodes.iter().all(|n| on.contains(n)).then_some(()))
    })
    .await
    .unwrap();
    op.kill();
}

#[tokio::test]
async fn sigterm_exits_within_the_limit_while_the_api_server_does_not_answer() {
    let _turn = TURN.lock().await;
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut op = Operator::start(&fc, &client, "rel-shutdown", "rel-shutdown")
        .await
        .unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    let guard = Restore::new(&fc, "kube-apiserver", "resume");
    fc.ctl("pause", "kube-apiserver").await.unwrap();
    let sent = Instant::now();
    op.terminate().unwrap();
    // The operator's limit is 20 s; a loaded machine gets 10 s more.
    let limit = Duration::from_secs(30);
    let status = loop {
        if let Some(status) = op.exited() {
            break status;
        }
        if sent.elapsed() > limit {
            fc.ctl("resume", "kube-apiserver").await.unwrap();
            guard.done();
            panic!("the operator was still running {limit:?} after SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // poll interval of the exit wait
    };
    eprintln!(
        "exited {status} after {:?} with the API server paused",
        sent.elapsed()
    );
    fc.ctl("resume", "kube-apiserver").await.unwrap();
    guard.done();
    fc.wait_api(&client, DEADLINE).await.unwrap();
}
