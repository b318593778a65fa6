//! Disruption storms on the real API server, each over 24 nodes under two policies that do not
//! overlap, with a fleet-wide cap of 3 GPU nodes gpunode may take out of service (over what is
//! unavailable already: an earlier test's nodes, a node a person cordoned). An independent watch
//! of every node (each node's cordon, NoSchedule/NoExecute taints and Ready condition, not
//! gpunode's markers) counts the unavailable ones at every instant the API server shows; the
//! count never passes the cap.
//!
//! - **Every node at once**: the breaker off, so the cap alone holds them; recovering nodes let
//!   every drifted node through in turn.
//! - **A slow ramp**: one node at a time, slower than the breaker's trip rate and lasting longer
//!   than its window (`GPUNODE_STORM_WINDOW_S`, 60 s here, 600 s in `make reliability-long`), so
//!   a breaker that counts drifts within a window never opens: the cap is what holds it.
//! - **Absurd values fleet-wide**: every probe publishes nonsense the schema admits (a GPU at
//!   2,147,483,647 °C or at −2,147,483,648 °C, which no sensor reads and are judged unknown;
//!   4,096 GPUs of one, 32 fatal XIDs, a driver 0.0.1, every throttle reason), as a probe bug
//!   rolled out to the fleet would: every node is drifted or unknown, and the cap holds.
//!
//! The tests take turns: an in-process operator reconciles every policy in the cluster.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    cell::{Cell, RefCell},
    collections::BTreeSet,
    time::{Duration, Instant},
};

use futures::future::join_all;
use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    cluster::admin_client,
    nodes, reports,
    storm::{Setting, Stage, throttled},
    wait,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use serde_json::{Value, json};

/// One in-process operator at a time.
static ONE_OPERATOR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const PER_POLICY: usize = 12;
/// Nodes gpunode may take out of service over what is unavailable already.
const FREE: u32 = 3;
const DEADLINE: Duration = Duration::from_secs(60);
const WAITS_FOR_CAP: &str = "fleet-wide disruption cap reached";

/// The breaker's window in the ramp (`GPUNODE_STORM_WINDOW_S`, default 60 s).
fn window() -> Duration {
    let s = std::env::var("GPUNODE_STORM_WINDOW_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(s)
}

/// A policy cordoning its nodes that drift in `classes`, with no budget of its own and the
/// breaker `breaker`.
fn policy(classes: &[&str], breaker: Value) -> impl Fn(Value) -> Value {
    let classes = classes.to_vec();
    move |selector| {
        json!({
            "nodeSelector": selector,
            "gpu": {"count": 1, "driverVersion": ">=550"},
            "cooling": {"maxGpuCelsius": 90},
            "remediation": [{"classes": classes, "action": "Cordon"}],
            "disruption": {"maxUnavailable": "100%", "circuitBreaker": breaker},
            "recovery": {"healthyFor": "1s"},
            // Longer than the longest ramp (16 min with the 10-minute window): a stale report
            // would turn every quiet node Unknown at once.
            "staleAfter": "1h",
        })
    }
}

fn breaker_off() -> Value {
    json!({"maxDriftedPercent": 100})
}

/// What each node's condition says and whether it is cordoned now.
async fn decisions(client: &Client, names: &[String]) -> Vec<(String, bool, String)> {
    let api: Api<Node> = Api::all(client.clone());
    let got = join_all(names.iter().map(|n| api.get(n))).await;
    names
        .iter()
        .zip(got)
        .map(|(n, node)| {
            let node = node.unwrap();
            (n.clone(), nodes::cordoned(&node), nodes::compliance(&node).1)
        })
        .collect()
}

/// Waits until every node of `names` is cordoned or says it waits for the fleet cap, and
/// returns how many are cordoned.
async fn until_each_decided(client: &Client, names: &[String]) -> usize {
    let decided = wait::until(
        "every drifted node cordoned or waiting for the cap",
        DEADLINE,
        || async {
            let d = decisions(client, names).await;
            let decided = d.iter().all(|(_, c, m)| *c || m.contains(WAITS_FOR_CAP));
            Ok(decided.then(|| d.iter().filter(|(_, c, _)| *c).count()))
        },
    )
    .await;
    match decided {
        Ok(cordoned) => cordoned,
        Err(e) => {
            let undecided: Vec<String> = decisions(client, names)
                .await
                .into_iter()
                .filter(|(_, c, m)| !*c && !m.contains(WAITS_FOR_CAP))
                .map(|(n, _, m)| format!("{n}: {m}"))
                .collect();
            panic!("{e}; undecided: {undecided:#?}")
        }
    }
}

async fn publish_all(client: &Client, names: &[String], status: impl Fn(usize) -> Value) {
    join_all(
        names
            .iter()
            .enumerate()
            .map(|(i, n)| reports::publish_status(client, n, status(i))),
    )
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .unwrap();
}

#[tokio::test]
async fn every_node_at_once_never_passes_the_fleet_cap() {
    let _turn = ONE_OPERATOR.lock().await;
    let client = admin_client().await.unwrap();
    let spec = policy(&["Throttle"], breaker_off());
    let setting = Setting {
        per_policy: PER_POLICY,
        free: FREE,
        instance: "e2e-storm-all",
        policy: &spec,
    };
    let stage = Stage::set(&client, &setting).await.unwrap();
    let drifting = stage.drifting();
    publish_all(&client, &drifting, |_| throttled(&["HwSlowdown"])).await;

    // Each node gpunode cordoned recovers, freeing its slot for the next, until every drifted
    // node has had its turn. A node beyond the cap says why it waits.
    let node_api: Api<Node> = Api::all(client.clone());
    let recovered: RefCell<BTreeSet<String>> = RefCell::default();
    let waited_for_cap = Cell::new(false);
    wait::until(
        "every drifted node cordoned in turn",
        Duration::from_secs(240),
        || {
            let (node_api, client, drifting, stage) = (&node_api, &client, &drifting, &stage);
            let (recovered, waited_for_cap) = (&recovered, &waited_for_cap);
            async move {
                for n in drifting {
                    let node = node_api.get(n).await?;
                    if nodes::compliance(&node).1.contains(WAITS_FOR_CAP) {
                        waited_for_cap.set(true);
                    }
                    if nodes::cordoned(&node) && recovered.borrow_mut().insert(n.clone()) {
                        reports::publish_status(client, n, throttled(&[])).await?;
                    }
                }
                let seen = stage.watch.seen();
                Ok(drifting
                    .iter()
                    .all(|n| seen.ever_cordoned.contains(n))
                    .then_some(()))
            }
        },
    )
    .await
    .unwrap();
    let (cap, max) = (stage.cap, stage.watch.seen().max);
    println!(
        "every node at once: fleet cap {cap} ({FREE} free): at most {max} GPU nodes unavailable at once"
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
    stage.tear_down().await.unwrap();
}

/// A policy's breaker in the ramp: more than 3 of its 12 nodes (25 %) drifting within `window`
/// opens it.
fn ramp_breaker(window: Duration) -> Value {
    json!({"maxDriftedPercent": 25, "window": format!("{}s", window.as_secs())})
}

#[tokio::test]
async fn a_slow_ramp_past_the_breaker_window_never_passes_the_fleet_cap() {
    let _turn = ONE_OPERATOR.lock().await;
    let client = admin_client().await.unwrap();
    let window = window();
    let spec = policy(&["Throttle"], ramp_breaker(window));
    let setting = Setting {
        per_policy: PER_POLICY,
        free: FREE,
        instance: "e2e-storm-ramp",
        policy: &spec,
    };
    let stage = Stage::set(&client, &setting).await.unwrap();
    // One node every window/5, alternating policies: each policy sees a drift every 2/5 of the
    // window, 3 within any window (its breaker opens above 3), and nine drifts span 8/5 of it.
    let ramp: Vec<String> = stage.interleaved().into_iter().take(9).collect();
    let step = window / 5;
    let start = Instant::now();
    let mut ticks = tokio::time::interval(step);
    let mut drifted = Vec::new();
    for n in &ramp {
        ticks.tick().await;
        reports::publish_status(&client, n, throttled(&["HwSlowdown"]))
            .await
            .unwrap();
        drifted.push(n.clone());
        let max = stage.watch.seen().max;
        assert!(
            max <= stage.cap as usize,
            "{max} nodes unavailable at once, cap {}",
            stage.cap
        );
    }
    let span = start.elapsed();
    assert!(
        span > window,
        "the ramp ({span:?}) outlasted the breaker window ({window:?})"
    );
    let cordoned = until_each_decided(&client, &drifted).await;

    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    for p in &stage.policies {
        let b = policies
            .get(p)
            .await
            .unwrap()
            .status
            .and_then(|s| s.circuit_breaker);
        assert!(
            !b.is_some_and(|b| b.open),
            "{p}: the breaker opened, so the ramp did not test the cap alone"
        );
    }
    let (cap, max) = (stage.cap, stage.watch.seen().max);
    println!(
        "slow ramp: 9 nodes over {span:?} (breaker window {window:?}), fleet cap {cap} ({FREE} free): {cordoned} cordoned, at most {max} GPU nodes unavailable at once"
    );
    assert!(max <= cap as usize, "{max} nodes unavailable at once, cap {cap}");
    assert_eq!(cordoned, FREE as usize, "the cap held the rest of the ramp");
    assert_eq!(max, cap as usize, "the cap was reached");
    stage.tear_down().await.unwrap();
}

/// Nonsense a probe bug could publish that the schema admits, one kind per node in turn.
fn absurd(i: usize) -> Value {
    let mut s = throttled(&[]);
    let gpu = &mut s["gpus"][0];
    match i % 6 {
        0 => gpu["temperatureCelsius"] = json!(i32::MAX),
        1 => s["gpuCount"] = json!(4096),
        2 => {
            let xid = json!({"xid": 79, "at": jiff::Timestamp::now().to_string()});
            gpu["xids"] = Value::Array(vec![xid; 32]);
        }
        3 => s["driverVersion"] = json!("0.0.1"),
        4 => {
            gpu["throttleReasons"] = json!([
                "HwSlowdown",
                "HwThermalSlowdown",
                "HwPowerBrakeSlowdown",
                "SwThermalSlowdown"
            ]);
        }
        _ => {
            gpu["temperatureCelsius"] = json!(i32::MIN);
            gpu["slowdownCelsius"] = json!(i32::MIN);
        }
    }
    s
}

#[tokio::test]
async fn absurd_values_fleet_wide_never_pass_the_fleet_cap() {
    let _turn = ONE_OPERATOR.lock().await;
    let client = admin_client().await.unwrap();
    let classes = ["Inventory", "Driver", "Xid", "Thermal", "Throttle", "Stale"];
    let spec = policy(&classes, breaker_off());
    let setting = Setting {
        per_policy: PER_POLICY,
        free: FREE,
        instance: "e2e-storm-absurd",
        policy: &spec,
    };
    let stage = Stage::set(&client, &setting).await.unwrap();
    let drifting = stage.drifting();
    publish_all(&client, &drifting, absurd).await;
    let cordoned = until_each_decided(&client, &drifting).await;
    let d = decisions(&client, &drifting).await;
    let (cap, max) = (stage.cap, stage.watch.seen().max);
    println!(
        "absurd values on {} nodes, fleet cap {cap} ({FREE} free): {cordoned} cordoned, at most {max} GPU nodes unavailable at once",
        drifting.len()
    );
    for (n, c, m) in d.iter().filter(|(_, c, _)| *c).take(FREE as usize) {
        println!("  {n}: cordoned {c}: {m}");
    }
    assert!(max <= cap as usize, "{max} nodes unavailable at once, cap {cap}");
    assert_eq!(cordoned, FREE as usize, "the cap held the rest");
    assert_eq!(max, cap as usize, "the cap was reached");
    stage.tear_down().await.unwrap();
}
