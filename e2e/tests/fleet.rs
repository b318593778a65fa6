//! The fleet-wide disruption cap on the real API server: two policies that do not overlap, 24
//! nodes drifting at once, a cap of 4 GPU nodes unavailable (over any an earlier test's policies
//! still hold). An independent watch of every node
//! (not gpunode's markers: each node's cordon, NoSchedule/NoExecute taints and Ready condition)
//! counts the unavailable nodes at every instant the API server shows; the count never passes
//! the cap, a node a person cordoned counting as one of them, while recovering nodes let every
//! drifted node through in turn. The operator runs in-process with the chart's ServiceAccount.
//!
//! And the circuit breaker's latch: it opens, stays open across an operator restart and past
//! its window while one more node drifts alone, and closes with `kubectl gpunode close-breaker`
//! (the built plugin, run with the admin kubeconfig), after which the held nodes are cordoned.
//!
//! The tests take turns: an in-process operator reconciles every policy in the cluster.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    cell::{Cell, RefCell},
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{StreamExt, future::join_all};
use gpunode_crds::{
    GpuNodePolicy, MaxUnavailable,
    policy::{BreakerClosedBy, CircuitBreakerStatus},
};
use gpunode_e2e::{
    chart,
    cluster::{self, admin_client},
    crds, nodes,
    operator::InProcess,
    probe, reports,
    scratch::rand_suffix,
    wait,
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    core::{Selector, SelectorExt},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

const CAP: u32 = 4;

/// One in-process operator at a time.
static ONE_OPERATOR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const PER_POLICY: usize = 12;
const DEADLINE: Duration = Duration::from_secs(60);

fn report_status(throttle: &[&str]) -> serde_json::Value {
    json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "driverVersion": "550.90.07",
        "gpuCount": 1,
        "gpus": [{"index": 0, "product": "NVIDIA H100 80GB HBM3", "temperatureCelsius": 70,
                  "slowdownCelsius": 87, "throttleReasons": throttle}],
    })
}

/// Unavailable as the cap counts it, read from the Node alone.
fn unavailable(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
        ts.iter()
            .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    });
    cordoned || tainted || !nodes::is_ready(node)
}

/// What the independent watch saw.
#[derive(Default)]
struct Seen {
    /// Each GPU node (one some policy selects): whether it is unavailable now.
    now: BTreeMap<String, bool>,
    max: usize,
    ever_cordoned: BTreeSet<String>,
}

impl Seen {
    fn unavailable(&self) -> usize {
        self.now.values().filter(|u| **u).count()
    }
}

/// Watches every node, counting at every event the unavailable ones that some policy selects
/// (`selectors`: every policy in the cluster, so that what earlier tests left counts too).
fn monitor(client: &Client, selectors: Vec<Selector>) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api: Api<Node> = Api::all(client.clone());
    let s = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(node)) = events.next().await {
            let mut seen = s.lock().unwrap();
            if !selectors.iter().any(|sel| sel.matches(node.labels())) {
                seen.now.remove(&node.name_any());
                continue;
            }
            if nodes::cordoned(&node) {
                seen.ever_cordoned.insert(node.name_any());
            }
            seen.now.insert(node.name_any(), unavailable(&node));
            seen.max = seen.max.max(seen.unavailable());
        }
    });
    (seen, task)
}

/// Every policy's node selector.
async fn selectors(client: &Client) -> Vec<Selector> {
    let api: Api<GpuNodePolicy> = Api::all(client.clone());
    api.list(&Default::default())
        .await
        .unwrap()
        .iter()
        .filter_map(|p| gpunode_operator::observe::selector_of(p).ok())
        .collect()
}

/// A policy cordoning its throttled nodes (`pool` label), with no budget or breaker of its own.
async fn pool_policy(client: &Client, name: &str, run: &str, pool: &str) {
    crds::create_policy(
        client,
        name,
        json!({
            "nodeSelector": {"matchLabels": {"fleet-e2e-run": run, "fleet-e2e-pool": pool}},
            "cooling": {},
            "remediation": [{"classes": ["Throttle"], "action": "Cordon"}],
            "disruption": {"maxUnavailable": "100%", "circuitBreaker": {"maxDriftedPercent": 100}},
            "recovery": {"healthyFor": "1s"},
            "staleAfter": "10m",
        }),
    )
    .await
    .unwrap();
}

/// Deletes the nodes an earlier run of these tests left (one that failed before its cleanup):
/// their policies would count them against the fleet cap.
async fn remove_leftovers(client: &Client) {
    let api: Api<Node> = Api::all(client.clone());
    let lp = kube::api::ListParams::default().labels("fleet-e2e-run");
    for n in api.list(&lp).await.unwrap() {
        let _ = api.delete(&n.name_any(), &DeleteParams::default()).await;
    }
    wait::until("leftover nodes gone", DEADLINE, || async {
        Ok(api.list(&lp).await?.items.is_empty().then_some(()))
    })
    .await
    .unwrap();
}

async fn make_nodes(client: &Client, run: &str, pool: &str, names: &[String]) {
    nodes::create(client, names, &nodes::GpuNodeShape::default())
        .await
        .unwrap();
    let api: Api<Node> = Api::all(client.clone());
    let labels = json!({"metadata": {"labels": {"fleet-e2e-run": run, "fleet-e2e-pool": pool}}});
    for n in names {
        api.patch(n, &PatchParams::default(), &Patch::Merge(&labels))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_fleet_cap_holds_at_every_instant_across_two_policies() {
    let _turn = ONE_OPERATOR.lock().await;
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    remove_leftovers(&client).await;
    let run = format!("{:06x}", rand_suffix());
    let name = |pool: &str, i: usize| format!("fleet-{run}-{pool}{i:02}");
    let a: Vec<String> = (0..PER_POLICY).map(|i| name("a", i)).collect();
    let b: Vec<String> = (0..PER_POLICY).map(|i| name("b", i)).collect();
    let person = format!("fleet-{run}-a-person");
    make_nodes(&client, &run, "a", &a).await;
    make_nodes(&client, &run, "b", &b).await;
    make_nodes(&client, &run, "a", std::slice::from_ref(&person)).await;
    let node_api: Api<Node> = Api::all(client.clone());
    let all: Vec<String> = a.iter().chain(&b).chain([&person]).cloned().collect();
    // Every node Ready and untainted (a new node is tainted not-ready until kwok says Ready).
    wait::until(
        "every node Ready and untainted",
        Duration::from_secs(60),
        || async {
            let nodes = join_all(all.iter().map(|n| node_api.get(n))).await;
            let nodes: Result<Vec<Node>, _> = nodes.into_iter().collect();
            Ok(nodes?.iter().all(|n| !unavailable(n)).then_some(()))
        },
    )
    .await
    .unwrap();
    // A person's cordon: it holds one of the cap's slots for the whole run.
    let cordon = json!({"spec": {"unschedulable": true}});
    node_api
        .patch(&person, &PatchParams::default(), &Patch::Merge(&cordon))
        .await
        .unwrap();
    join_all(
        all.iter()
            .map(|n| reports::publish(&client, n, report_status(&[]))),
    )
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .unwrap();
    let (pa, pb) = (format!("fleet-{run}-a"), format!("fleet-{run}-b"));
    pool_policy(&client, &pa, &run, "a").await;
    pool_policy(&client, &pb, &run, "b").await;
    // The cap: 4 GPU nodes unavailable, over what other policies (an earlier test's) hold now.
    let (seen, watch) = monitor(&client, selectors(&client).await);
    let held = wait::until("the watch synced", DEADLINE, || async {
        let seen = seen.lock().unwrap();
        let synced = all.iter().all(|n| seen.now.contains_key(n));
        Ok(synced.then(|| seen.unavailable()))
    })
    .await
    .unwrap();
    // The person's cordon is one of the 4.
    let cap = u32::try_from(held).unwrap() - 1 + CAP;
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start_capped(&operator_client, "e2e-fleet", MaxUnavailable::Count(cap));
    wait::until(
        "every node labelled compliant",
        Duration::from_secs(60),
        || async {
            let nodes = join_all(all.iter().map(|n| node_api.get(n))).await;
            let nodes: Result<Vec<Node>, _> = nodes.into_iter().collect();
            Ok(nodes?
                .iter()
                .all(|n| nodes::label(n, "gpunode.dev/state").as_deref() == Some("compliant"))
                .then_some(()))
        },
    )
    .await
    .unwrap();

    // Every node of both policies drifts at once.
    let drifting: Vec<String> = a.iter().chain(&b).cloned().collect();
    join_all(
        drifting
            .iter()
            .map(|n| reports::publish_status(&client, n, report_status(&["HwSlowdown"]))),
    )
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .unwrap();

    // Each node gpunode cordoned recovers, freeing its slot for the next, until every drifted
    // node has had its turn. A node beyond the cap says why it waits.
    let recovered: RefCell<BTreeSet<String>> = RefCell::default();
    let waited_for_cap = Cell::new(false);
    wait::until(
        "every drifted node cordoned in turn",
        Duration::from_secs(240),
        || {
            let (node_api, client, drifting, seen) = (&node_api, &client, &drifting, &seen);
            let (recovered, waited_for_cap) = (&recovered, &waited_for_cap);
            async move {
                for n in drifting {
                    let node = node_api.get(n).await?;
                    let message = node
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuPolicyCompliant"))
                        .and_then(|c| c.message.clone())
                        .unwrap_or_default();
                    if message.contains("fleet-wide disruption cap reached") {
                        waited_for_cap.set(true);
                    }
                    if nodes::cordoned(&node) && recovered.borrow_mut().insert(n.clone()) {
                        reports::publish_status(client, n, report_status(&[])).await?;
                    }
                }
                let done = {
                    let seen = seen.lock().unwrap();
                    drifting.iter().all(|n| seen.ever_cordoned.contains(n))
                };
                Ok(done.then_some(()))
            }
        },
    )
    .await
    .unwrap();
    let max = seen.lock().unwrap().max;
    println!(
        "fleet cap {cap} ({} of earlier tests' nodes held, a person's cordon, {} free): at most {max} GPU nodes unavailable at once",
        held - 1,
        CAP - 1
    );
    assert!(max <= cap as usize, "{max} nodes unavailable at once, cap {cap}");
    assert_eq!(
        max, cap as usize,
        "the cap was reached: it is what held the others"
    );
    assert!(
        waited_for_cap.get(),
        "no node's condition said it waited for the fleet cap"
    );

    watch.abort();
    // The policies go while the operator runs (it removes their finalizer), then the nodes.
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    for p in [&pa, &pb] {
        let _ = policies.delete(p, &DeleteParams::default()).await;
    }
    wait::until("both policies gone", Duration::from_secs(60), || async {
        let a = policies.get_opt(&pa).await?;
        let b = policies.get_opt(&pb).await?;
        Ok((a.is_none() && b.is_none()).then_some(()))
    })
    .await
    .unwrap();
    operator.stop().await.unwrap();
    for n in &all {
        let _ = node_api.delete(n, &DeleteParams::default()).await;
    }
}

/// What `kubectl-gpunode ARGS` printed and how it exited.
async fn plugin(args: &[&str]) -> (i32, String, String) {
    let bin = probe::built("kubectl-gpunode").unwrap();
    let kubeconfig = cluster::admin_kubeconfig().await.unwrap();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(bin)
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `node`'s probe now reports a driver older than the policy's.
async fn old_driver(client: &Client, node: &str) {
    reports::publish_status(client, node, reports::one_gpu("535.129.03", "boot-1", json!([])))
        .await
        .unwrap();
}

async fn breaker_status(api: &Api<GpuNodePolicy>, name: &str) -> Option<CircuitBreakerStatus> {
    api.get(name).await.ok()?.status?.circuit_breaker
}

#[tokio::test]
async fn the_breaker_stays_open_across_a_restart_and_its_window_until_close_breaker() {
    let _turn = ONE_OPERATOR.lock().await;
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    remove_leftovers(&client).await;
    let run = format!("{:06x}", rand_suffix());
    let names: Vec<String> = (0..4).map(|i| format!("brk-{run}-{i}")).collect();
    make_nodes(&client, &run, "brk", &names).await;
    for n in &names {
        reports::publish(&client, n, reports::one_gpu("550.54.15", "boot-1", json!([])))
            .await
            .unwrap();
    }
    let policy = format!("brk-{run}");
    crds::create_policy(
        &client,
        &policy,
        json!({
            "nodeSelector": {"matchLabels": {"fleet-e2e-run": run, "fleet-e2e-pool": "brk"}},
            "gpu": {"driverVersion": ">=550"},
            // `after`: the two drifts below are two report writes; without it the first could
            // be cordoned before the second is seen (one drifting node never opens the breaker).
            "remediation": [{"classes": ["Driver"], "action": "Cordon", "after": "20s"}],
            "disruption": {"maxUnavailable": "100%",
                           "circuitBreaker": {"maxDriftedPercent": 25, "window": "1m"}},
            "staleAfter": "10m",
        }),
    )
    .await
    .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e-breaker");
    for n in &names {
        nodes::until_labelled(&client, n, &[("gpunode.dev/state", "compliant")], DEADLINE)
            .await
            .unwrap();
    }
    let (code, _, stderr) = plugin(&["close-breaker", &policy]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is closed: nothing to close"), "{stderr}");

    // Two of four drift at once: above 25% (one node), the breaker opens.

    old_driver(&client, &names[0]).await;
    old_driver(&client, &names[1]).await;
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    let opened = wait::until("the breaker open", DEADLINE, || async {
        Ok(breaker_status(&policies, &policy)
            .await
            .filter(|b| b.open)
            .and_then(|b| b.opened_at))
    })
    .await
    .unwrap();
    let p = policies.get(&policy).await.unwrap();
    let c = p
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .find(|c| c.type_ == "CircuitOpen")
        .cloned()
        .unwrap();
    assert_eq!(c.status, "True");
    assert!(
        c.message
            .contains(&format!("kubectl gpunode close-breaker {policy}")),
        "{}",
        c.message
    );

    // A restart: the new operator reads the open breaker back from the status.
    operator.stop().await.unwrap();
    let operator = InProcess::start(&operator_client, "e2e-breaker-2");
    // Past the window a third node drifts, alone in it: held all the same.
    let node_api: Api<Node> = Api::all(client.clone());
    wait::until("the window passed", Duration::from_secs(90), || async {
        Ok((jiff::Timestamp::now() > opened.0 + jiff::SignedDuration::from_secs(65)).then_some(()))
    })
    .await
    .unwrap();
    old_driver(&client, &names[2]).await;
    let held = wait::until("the third node held by the breaker", DEADLINE, || async {
        let n = node_api.get(&names[2]).await?;
        let message = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "GpuPolicyCompliant"))
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        Ok(message.contains("circuit breaker open").then_some(n))
    })
    .await
    .unwrap();
    assert!(!nodes::cordoned(&held));
    for n in &names[..3] {
        assert!(!nodes::cordoned(&node_api.get(n).await.unwrap()), "{n} cordoned");
    }
    assert!(breaker_status(&policies, &policy).await.unwrap().open);

    let (code, stdout, stderr) = plugin(&["close-breaker", &policy]).await;
    assert_eq!(code, 0, "{stderr}");
    let at = opened.0.to_string();
    assert_eq!(
        stdout,
        format!(
            "gpunodepolicy/{policy}: closing the circuit breaker opened at {at} (gpunode.dev/close-breaker={at}); the operator resumes on its next pass\n"
        )
    );
    wait::until("the held nodes cordoned once closed", DEADLINE, || async {
        let mut all = true;
        for n in &names[..3] {
            all &= nodes::cordoned(&node_api.get(n).await?);
        }
        Ok(all.then_some(()))
    })
    .await
    .unwrap();
    // The status trails the nodes by at most its pacing interval.
    wait::until("the status says a person closed it", DEADLINE, || async {
        let b = breaker_status(&policies, &policy).await;
        Ok(b.filter(|b| !b.open && b.closed_by == Some(BreakerClosedBy::Person)))
    })
    .await
    .unwrap();
    let (code, _, _) = plugin(&["close-breaker", &policy]).await;
    assert_eq!(code, 2, "closed already");

    let _ = policies.delete(&policy, &DeleteParams::default()).await;
    wait::until("the policy gone", DEADLINE, || async {
        Ok(policies.get_opt(&policy).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    operator.stop().await.unwrap();
    for n in &names {
        let _ = node_api.delete(n, &DeleteParams::default()).await;
    }
}
