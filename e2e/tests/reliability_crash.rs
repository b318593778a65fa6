//! Crash points (operator/src/crash.rs, node-probe/src/crash.rs): a process, at each point in
//! turn, aborts between two writes of one action and is started again without the point (a
//! container restart: the operator takes its Lease back at once, so the next leader is the
//! restarted process), which must finish the action:
//! - a drain: after the cordon, before its bookkeeping; after the first eviction; after the last
//!   one, before the drain is recorded done;
//! - a repair step: after its remediator's object is made, before its making is recorded;
//! - a validation: after its Job is made;
//! - a DRA quarantine: after a GPU's DeviceTaintRule is applied, before the quarantine is
//!   recorded;
//! - the release of a deleted policy's node: after its repair objects are deleted, and after its
//!   taints and cordon are removed, before its labels, annotations and condition are;
//! - the probe: the node's reset process after the GPU reset, before writing its outcome (the
//!   restarted one fails the request, never resets twice); a save of the XID state, between its
//!   temporary file and the rename (the state saved before is restored, the temporary file
//!   removed; the XID being saved is lost: NVML does not deliver it again).
//!
//! The leader's action points (a GPU reset step's request, a validation Job, a DRA quarantine's
//! rule) are also struck the two other ways a leader fails between two writes
//! ([`gpunode_e2e::faults::strike`]): the action held at the point while the leader's network is
//! cut (a fenced follower finishes it) or while the API server is stopped for 20 s (the same
//! process finishes it); those rows are the classes *operator host* and *control plane*.
//!
//! After each run: the process died at the point (its log names it and a signal ended it); no
//! object made twice (the audit log: one successful create per purpose); nothing left behind;
//! attempts recorded once (the node's bookkeeping); the budget held at every instant (the
//! wave's monitor); every node ends as the policy implies. `GPUNODE_REL_CRASH_RUNS` runs per
//! point (default 1; `make reliability-long` runs 20).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    faults::{
        checks::Check,
        cluster::FaultCluster,
        crash::probe_crashed_at,
        marks::{self, gpunode_taints},
        record::{Recorder, Recovery, Run, Until},
        replica::Operator,
        strike::{Interrupted, Strike},
        wave::{FOREIGN_LABEL, FOREIGN_TAINT, Wave, WaveSpec, report_status},
    },
    monitor::WaveMonitor,
    probe::Host,
    remediator, reports, wait,
};
use k8s_openapi::api::{
    batch::v1::Job,
    core::v1::{Namespace, Node},
};
use kube::{
    Api, Client, ResourceExt,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
        PostParams,
    },
};
use serde_json::json;

const CLASS: &str = "crash point";
/// The probe's crash points: their recovery is the probe process's, not a leader's.
const PROBE_CLASS: &str = "probe crash point";
const DEADLINE: Duration = Duration::from_secs(120);
/// The replica's identity and the namespace of its Lease, of the remediator's template and
/// objects.
const OPERATOR: &str = "rel-crash";
/// Where validation Jobs run.
const VALIDATION_NS: &str = "rel-crash-validation";

fn runs() -> u64 {
    std::env::var("GPUNODE_REL_CRASH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

#[tokio::test]
async fn a_leader_crashed_between_two_writes_leaves_no_duplicate_and_no_orphan() {
    binaries_have_crash_points();
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "crash");
    remediator::install(&client).await.unwrap();
    for ns in [OPERATOR, VALIDATION_NS] {
        namespace(&client, ns).await;
    }
    template(&client).await;
    let mut without = Vec::new();
    for run in 0..runs() {
        for point in points() {
            if !scenario(&fc, &client, &mut rec, point, run).await {
                without.push(point);
            }
        }
    }
    rec.push(Run {
        class: CLASS.into(),
        fault: "every crash point of the operator and the probe has a scenario".into(),
        seed: None,
        checks: vec![Check::new(
            "every point in the operator's and the probe's crash::POINTS ran",
            without.is_empty(),
            format!("without a scenario: {without:?}"),
        )],
        recovery: None,
    })
    .unwrap();
    rec.assert_clean();
}

/// Fails at once, saying why, when the built operator or probe cannot arm a crash point (a
/// binary built without the feature `failpoints`: by `cargo build -p` of the binaries alone,
/// where the workspace build turns it on through this crate). Each is started with a point armed
/// and stops right after arming it (the operator finds no cluster; the probe only prepares a
/// state directory).
fn binaries_have_crash_points() {
    let state = std::env::temp_dir().join(format!("gpunode-crash-preflight-{}", std::process::id()));
    let id = |flag: &str| {
        let out = std::process::Command::new("id").arg(flag).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let owner = format!("{}:{}", id("-u"), id("-g"));
    let runs = [
        (
            gpunode_e2e::operator::binary().unwrap(),
            vec![
                "run",
                "--instance",
                "preflight",
                "--leader-elect",
                "false",
                "--metrics-addr",
                "127.0.0.1:0",
            ],
            gpunode_operator::crash::POINTS[0],
        ),
        (
            gpunode_e2e::probe::built("gpunode-probe").unwrap(),
            vec![
                "--chown-state-dir",
                &owner,
                "--state-dir",
                state.to_str().unwrap_or_default(),
                "--node-name",
                "preflight",
            ],
            gpunode_probe::crash::POINTS[0],
        ),
    ];
    for (bin, args, point) in runs {
        let out = std::process::Command::new(&bin)
            .args(args)
            .env(gpunode_operator::crash::ENV, point)
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("POD_NAME")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("crash point armed"),
            "{} cannot arm a crash point: build the workspace (`cargo build --workspace`, as make test does), \
             which builds the binaries with the feature failpoints; it said: {text}",
            bin.display()
        );
    }
    let _ = std::fs::remove_dir_all(&state);
}

/// The operator's and the probe's crash points, or those `GPUNODE_REL_CRASH_POINTS` names
/// (comma-separated).
fn points() -> Vec<&'static str> {
    let only = std::env::var("GPUNODE_REL_CRASH_POINTS").unwrap_or_default();
    gpunode_operator::crash::POINTS
        .into_iter()
        .chain(gpunode_probe::crash::POINTS)
        .filter(|p| only.is_empty() || only.split(',').any(|o| o == *p))
        .collect()
}

/// Runs `point`'s scenario; false when it has none.
async fn scenario(fc: &FaultCluster, client: &Client, rec: &mut Recorder, point: &str, run: u64) -> bool {
    match point {
        "apply::after_spec" | "drain::after_first_eviction" | "drain::before_done_record" => {
            drain(fc, client, rec, point, run).await;
        }
        "repair::after_object" => {
            repair(fc, client, rec, point, run).await;
            // The GPU reset step's request as the object: a reset that succeeds and one refused
            // into the remediator hand-off, each under the run's strikes.
            for strike in strikes(run, false) {
                reset_by_new_leader(fc, client, rec, (point, strike), run, false).await;
                reset_by_new_leader(fc, client, rec, (point, strike), run, true).await;
            }
        }
        "validation::after_job" => {
            for strike in strikes(run, true) {
                validation(fc, client, rec, (point, strike), run).await;
            }
            // A failing and a hanging Job too (each takes a wave of its own).
            for strike in strikes(run, false) {
                validation_fails(fc, client, rec, (point, strike), run, Outcome::Fail).await;
                validation_fails(fc, client, rec, (point, strike), run, Outcome::Hang).await;
            }
        }
        "devices::after_rule" => {
            for strike in strikes(run, true) {
                devices(fc, client, rec, (point, strike), run).await;
            }
        }
        "release::after_repair_objects" | "release::after_spec" => {
            release(fc, client, rec, point, run).await;
        }
        "state::xids_before_rename" => xid_save(client, rec, point, run).await,
        "reset::after_reset" => gpu_reset(fc, client, rec, point, run).await,
        _ => return false,
    }
    true
}

/// The strikes run `run` of an action's point gets (each takes a wave of its own): the crash on
/// every fourth run, or on every run when `crash_always`; the partition and the API outage on
/// every tenth (each takes 20 s or more: 2 of the long campaign's 20 runs). `make test` runs
/// once, so all three. Only those `GPUNODE_REL_STRIKES` names, if set (comma-separated: crash,
/// partition, outage).
fn strikes(run: u64, crash_always: bool) -> Vec<Strike> {
    let all: Vec<Strike> = Strike::ALL
        .into_iter()
        .filter(|s| match s {
            Strike::Crash => crash_always || run.is_multiple_of(4),
            Strike::Partition | Strike::ApiOutage => run.is_multiple_of(10),
        })
        .collect();
    let only = std::env::var("GPUNODE_REL_STRIKES").unwrap_or_default();
    let named = |s: Strike| match s {
        Strike::Crash => "crash",
        Strike::Partition => "partition",
        Strike::ApiOutage => "outage",
    };
    all.into_iter()
        .filter(|s| only.is_empty() || only.split(',').any(|o| o == named(*s)))
        .collect()
}

async fn namespace(client: &Client, name: &str) {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("gpunode-rel").force(),
            &Patch::Apply(&ns),
        )
        .await
        .unwrap();
}

/// The remediator's template `reboot` (it succeeds once told to go), made once.
async fn template(client: &Client) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), OPERATOR, &remediator::template_resource());
    if api.get_opt("reboot").await.unwrap().is_none() {
        remediator::create_template(client, OPERATOR, "reboot", "Succeed")
            .await
            .unwrap();
    }
}

/// Files run `run` of `point` with its checks, the crash check first.
fn push(rec: &mut Recorder, point: &str, action: &str, run: u64, checks: Vec<Check>, recovery: Recovery) {
    push_struck(rec, (point, Strike::Crash), action, run, checks, recovery);
}

/// [`push`] for a leader struck at `point` as `strike` says: its class and fault are the
/// strike's.
fn push_struck(
    rec: &mut Recorder,
    (point, strike): (&str, Strike),
    action: &str,
    run: u64,
    checks: Vec<Check>,
    recovery: Recovery,
) {
    let (class, fault) = if gpunode_probe::crash::POINTS.contains(&point) {
        (
            PROBE_CLASS,
            format!("probe process crashed at {point} ({action}), restarted"),
        )
    } else {
        (strike.class(), strike.fault(point, action))
    };
    rec.push(Run {
        class: class.into(),
        fault,
        seed: Some(run),
        checks,
        recovery: Some(recovery),
    })
    .unwrap();
}

/// Deletes the wave and waits until its nodes are gone, so the next run's armed replica finds
/// nothing of this one to act on.
async fn finish(client: &Client, wave: &Wave) {
    wave.cleanup().await;
    let selector = wave.policy_selector();
    wait::until("the wave's nodes to be gone", DEADLINE, || async {
        let left = Api::<Node>::all(client.clone())
            .list(&ListParams::default().labels(&selector))
            .await?;
        Ok(left.items.is_empty().then_some(()))
    })
    .await
    .unwrap();
}

/// Successful creates of `resource` in `namespace` since `since` (the audit log).
fn creates(fc: &FaultCluster, resource: &str, namespace: &str, since: jiff::Timestamp) -> usize {
    fc.audit()
        .unwrap()
        .iter()
        .filter(|e| e.at >= since && e.verb == "create" && e.succeeded())
        .filter(|e| e.resource == resource && e.subresource.is_empty() && e.namespace == namespace)
        .count()
}

/// A 3-node drain wave (three pods per node, `maxUnavailable: 1`); the leader crashes at
/// `point` of the first node's drain.
async fn drain(fc: &FaultCluster, client: &Client, rec: &mut Recorder, point: &str, run: u64) {
    let wave = Wave::setup(client, &WaveSpec::drain(&format!("cr{run}d"), 3, 3))
        .await
        .unwrap();
    let monitor = wave.monitor();
    let mut leader = armed(fc, client, (point, Strike::Crash), &[]).await;
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    let (mut checks, recovery) = leader.strike(fc, client, DEADLINE).await;
    let driven = wave.drive(DEADLINE * 2).await;
    checks.push(completed(&driven));
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    push(
        rec,
        point,
        "a drain of 3 nodes, 3 pods each",
        run,
        checks,
        recovery,
    );
    leader.end().await;
    finish(client, &wave).await;
}

/// The wave went through: every node drained, healed and back, compliant and clean.
fn completed(driven: &Result<(), gpunode_e2e::Error>) -> Check {
    Check::new(
        "the action completed by the restarted leader (every node back, compliant and clean)",
        driven.is_ok(),
        format!("{driven:?}"),
    )
}

/// The leader (replica `OPERATOR`), armed at `point` for `strike`, with `env` added.
async fn armed(
    fc: &FaultCluster,
    client: &Client,
    (point, strike): (&str, Strike),
    env: &[(&str, String)],
) -> Interrupted {
    Interrupted::start(fc, client, strike, (OPERATOR, OPERATOR), Some(point), env)
        .await
        .unwrap()
}

/// Two nodes drained on a fatal XID and handed to the remediator (a `FakeReboot` each); the
/// leader crashes once the first object exists, before its making is recorded.
async fn repair(fc: &FaultCluster, client: &Client, rec: &mut Recorder, point: &str, run: u64) {
    let since = jiff::Timestamp::now();
    let mut spec = WaveSpec::drain(&format!("cr{run}r"), 2, 1);
    spec.policy_spec["repair"] = json!({"maxAttempts": 2, "window": "1h", "steps": [{
        "name": "reboot", "action": "Remediator", "classes": ["Xid"], "timeout": "5m",
        "remediator": {
            "apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
            "kind": "FakeRebootTemplate", "name": "reboot", "namespace": OPERATOR,
        },
    }]});
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    let env = [("GPUNODE_REMEDIATORS", remediator_grant())];
    let mut leader = armed(fc, client, (point, Strike::Crash), &env).await;
    let reboots = remediator::spawn(client.clone(), {
        let client = client.clone();
        move |node| {
            let client = client.clone();
            async move {
                let _ = reports::publish(&client, &node, report_status(false, "boot-2")).await;
            }
        }
    });
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    let (mut checks, recovery) = leader.strike(fc, client, DEADLINE).await;
    checks.extend(repaired(fc, client, &wave, &monitor, since).await);
    reboots.abort();
    push(
        rec,
        point,
        "a repair step of 2 drained nodes",
        run,
        checks,
        recovery,
    );
    leader.end().await;
    finish(client, &wave).await;
}

/// Lets each node's remediation go until every node is back, compliant and clean; then: one
/// object made per node, each node's repair attempted once, no object left, and the wave's checks.
async fn repaired(
    fc: &FaultCluster,
    client: &Client,
    wave: &Wave,
    monitor: &WaveMonitor,
    since: jiff::Timestamp,
) -> Vec<Check> {
    let reboots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), OPERATOR, &remediator::reboot_resource());
    // A remediation goes only once the node's bookkeeping records its object's making, with
    // this object's uid: the crashed leader never recorded it, so the restarted one has to (a
    // remediator quicker than that would end the repair before the resume is exercised).
    let back = wait::until("the repaired nodes to be back", DEADLINE * 2, || async {
        let nodes = wave.nodes_now().await?;
        for o in reboots.list(&ListParams::default()).await?.items {
            let node = nodes.iter().find(|n| n.name_any() == o.name_any());
            let recorded = node.is_some_and(|n| made_recorded(n, o.uid().as_deref()));
            if recorded && !o.labels().contains_key(remediator::GO_LABEL) {
                remediator::go(client, OPERATOR, &o.name_any()).await?;
            }
        }
        Ok(all_clean(&nodes).then_some(()))
    })
    .await;
    let left = wait::until("the repair objects to be deleted", DEADLINE, || async {
        let names: Vec<String> = reboots
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|o| o.name_any())
            .collect();
        let left: Vec<String> = names.into_iter().filter(|n| wave.nodes.contains(n)).collect();
        Ok(left.is_empty().then_some(left))
    })
    .await
    .unwrap_or_else(|e| vec![e.to_string()]);
    let made = creates(fc, "fakereboots", OPERATOR, since);
    // The attempts as the node's bookkeeping counts them (kept through the policy's window after
    // the repair). Not its Events: one queued when the leader crashed is lost with it.
    let attempts: Vec<Option<usize>> = wave
        .nodes_now()
        .await
        .unwrap()
        .iter()
        .map(|n| {
            let track = marks::annotation(n, gpunode_operator::markers::REPAIR_ANNOTATION)?;
            let track: serde_json::Value = serde_json::from_str(&track).ok()?;
            Some(track["attempts"].as_array()?.len())
        })
        .collect();
    let mut checks = vec![
        Check::new(
            "the repair resumed and finished: its object recorded with its uid, the node back",
            back.is_ok(),
            format!("{back:?}"),
        ),
        Check::new(
            "one remediation object made per node",
            made == wave.nodes.len(),
            format!("{made} created for {} nodes (audit log)", wave.nodes.len()),
        ),
        Check::new(
            "each node's repair attempted once",
            attempts.len() == wave.nodes.len() && attempts.iter().all(|a| *a == Some(1)),
            format!("attempts recorded per node: {attempts:?}"),
        ),
        Check::new(
            "no remediation object left after the repair",
            left.is_empty(),
            format!("left: {left:?}"),
        ),
    ];
    checks.extend(wave.run_checks(fc, monitor, 1, &wave.all_pods()).await.unwrap());
    checks
}

/// Whether `node`'s repair record says its step's object was made, naming `uid`.
fn made_recorded(node: &Node, uid: Option<&str>) -> bool {
    let Some(track) = marks::annotation(node, gpunode_operator::markers::REPAIR_ANNOTATION) else {
        return false;
    };
    let track: serde_json::Value = serde_json::from_str(&track).unwrap_or_default();
    let created = track["step"]["created"].as_bool() == Some(true);
    let objects = track["objects"].as_array().cloned().unwrap_or_default();
    created && uid.is_some_and(|u| objects.iter().any(|o| o["uid"].as_str() == Some(u)))
}

/// Every node compliant, uncordoned and without gpunode's taints.
fn all_clean(nodes: &[Node]) -> bool {
    nodes.iter().all(|n| {
        marks::label(n, marks::STATE_LABEL).as_deref() == Some("compliant")
            && !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
            && gpunode_taints(n).is_empty()
    })
}

/// A 2-node drain wave (one pod each) whose nodes are validated by a Job before they return:
/// its pod labelled `labels` (kwok's stages read `gpunode.test/outcome`), timed out after `timeout`.
fn validation_wave(id: &str, labels: serde_json::Value, timeout: &str) -> WaveSpec {
    let mut spec = WaveSpec::drain(id, 2, 1);
    spec.policy_spec["remediation"] = json!([{"classes": ["Xid", "Validation"], "action": "Drain"}]);
    spec.policy_spec["validation"] = json!({"namespace": VALIDATION_NS, "timeout": timeout, "template": {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "diag", "image": "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04",
            "command": ["dcgmi", "diag", "-r", "1"]}]},
    }});
    spec
}

/// The operator's grant to run validation Jobs in [`VALIDATION_NS`].
fn validation_env() -> [(&'static str, String); 1] {
    [(
        "GPUNODE_VALIDATION_NAMESPACES",
        json!([{"name": VALIDATION_NS, "serviceAccounts": ["default"]}]).to_string(),
    )]
}

/// Two nodes drained on a fatal XID; once healthy each is validated by a Job (kwok completes
/// its pod) before it returns. The leader is struck once the first Job exists.
async fn validation(
    fc: &FaultCluster,
    client: &Client,
    rec: &mut Recorder,
    (point, strike): (&str, Strike),
    run: u64,
) {
    let since = jiff::Timestamp::now();
    let id = format!("cr{run}v{}", strike.tag());
    let spec = validation_wave(&id, json!({"app": "gpu-diag"}), "90s");
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    let env = validation_env();
    let mut leader = armed(fc, client, (point, strike), &env).await;
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    // The wave is healed as it drains (its Jobs start once a node is healthy) while the leader
    // is struck.
    let (driven, (mut checks, recovery)) =
        tokio::join!(wave.drive(DEADLINE * 3), leader.strike(fc, client, DEADLINE));
    checks.push(completed(&driven));
    checks.extend(validated(fc, client, &wave, since).await);
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    checks.extend(leader.afterwards(fc, client).await);
    let action = "a validation Job for each of 2 nodes";
    push_struck(rec, (point, strike), action, run, checks, recovery);
    leader.end().await;
    finish(client, &wave).await;
}

/// What a validation Job's pod does (kwok's stages, e2e/cluster/kwok-stages-outcome.yaml).
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// Exits 1 once running.
    Fail,
    /// Runs on past the validation's timeout.
    Hang,
}

/// Two nodes drift, one at a time (`maxUnavailable: 1`); the first, healed once drained, is
/// validated by a Job that fails or hangs, and the leader is struck at `point` just after making
/// it. After recovery: the validation failed (the hanging Job timed out and was deleted), the
/// node stays out of service, its one Job was never made again, and it holds the budget: the
/// second node is never disrupted.
async fn validation_fails(
    fc: &FaultCluster,
    client: &Client,
    rec: &mut Recorder,
    (point, strike): (&str, Strike),
    run: u64,
    outcome: Outcome,
) {
    let since = jiff::Timestamp::now();
    let (tag, label, timeout) = match outcome {
        Outcome::Fail => ("f", "Fail", "90s"),
        Outcome::Hang => ("h", "Hang", "10s"),
    };
    let labels = json!({"app": "gpu-diag", "gpunode.test/outcome": label});
    let spec = validation_wave(&format!("cr{run}v{tag}{}", strike.tag()), labels, timeout);
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    let env = validation_env();
    let mut leader = armed(fc, client, (point, strike), &env).await;
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    let first = wave.drain_started(&[], DEADLINE).await.unwrap();
    // Healed once drained: its validation Job is made, and the leader is struck just after.
    let heal = async {
        wait::until(&format!("{first} drained"), DEADLINE, || async {
            Ok((wave.alive_pods().await?.get(&first).copied().unwrap_or(0) == 0).then_some(()))
        })
        .await?;
        reports::publish(client, &first, report_status(false, "boot-1")).await
    };
    let (healed, (struck, recovery)) = tokio::join!(heal, leader.strike(fc, client, DEADLINE));
    healed.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let failed = wait::until(&format!("{first}'s validation to fail"), DEADLINE, || async {
        let c = gpunode_e2e::nodes::compliance(&nodes.get(&first).await?);
        Ok((c.0 == "ValidationFailed").then_some(c.1))
    })
    .await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), VALIDATION_NS);
    let selector = format!("{}={first}", gpunode_operator::plan::validation::NODE_LABEL);
    // A hanging Job is deleted at its timeout; a failed one is kept for a person to read.
    let jobs_left = wait::until("the node's Jobs settled", DEADLINE, || async {
        let n = jobs
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .len();
        let settled = match outcome {
            Outcome::Fail => n == 1,
            Outcome::Hang => n == 0,
        };
        Ok(settled.then_some(n))
    })
    .await;
    let node = nodes.get(&first).await.unwrap();
    let made = creates(fc, "jobs", VALIDATION_NS, since);
    let others: Vec<String> = monitor
        .disruptions()
        .iter()
        .filter(|d| d.node != first)
        .map(|d| format!("{} at {}", d.node, d.at))
        .collect();
    let mut checks = struck;
    checks.extend([
        Check::new(
            "the validation failed (a hanging Job at its timeout)",
            failed.is_ok(),
            format!("{failed:?}"),
        ),
        Check::new(
            "the node stays out of service, its validation recorded failed",
            gpunode_e2e::nodes::cordoned(&node)
                && marks::label(&node, "gpunode.dev/validation").as_deref() == Some("failed"),
            format!(
                "cordoned {}, validation {:?}",
                gpunode_e2e::nodes::cordoned(&node),
                marks::label(&node, "gpunode.dev/validation")
            ),
        ),
        Check::new(
            "one validation Job made, never again after the leader was struck",
            made == 1,
            format!("{made} created (audit log)"),
        ),
        Check::new(
            "the node's Jobs settled (a failed one kept, a hung one deleted)",
            jobs_left.is_ok(),
            format!("{jobs_left:?}"),
        ),
        Check::new(
            "the failed node holds the budget: no other node out of service",
            others.is_empty(),
            format!("other nodes observed out of service: {others:?}"),
        ),
    ]);
    checks.extend(monitor.checks(1, &fc.audit().unwrap(), &wave.namespace).await);
    checks.extend(leader.afterwards(fc, client).await);
    let action = match outcome {
        Outcome::Fail => "a validation Job that fails",
        Outcome::Hang => "a validation Job that hangs past its timeout",
    };
    push_struck(rec, (point, strike), action, run, checks, recovery);
    leader.end().await;
    finish(client, &wave).await;
}

/// One Job made per node, each owned by its node (the garbage collector takes it with the node).
async fn validated(fc: &FaultCluster, client: &Client, wave: &Wave, since: jiff::Timestamp) -> Vec<Check> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), VALIDATION_NS);
    let made = creates(fc, "jobs", VALIDATION_NS, since);
    let mut per_node = Vec::new();
    for n in &wave.nodes {
        let label = format!("{}={n}", gpunode_operator::plan::validation::NODE_LABEL);
        let list = jobs
            .list(&ListParams::default().labels(&label))
            .await
            .unwrap()
            .items;
        let owned = list
            .iter()
            .filter(|j| {
                j.owner_references()
                    .iter()
                    .any(|o| o.kind == "Node" && &o.name == n)
            })
            .count();
        per_node.push((list.len(), owned));
    }
    vec![
        Check::new(
            "one validation Job made per node",
            made == wave.nodes.len(),
            format!("{made} created for {} nodes (audit log)", wave.nodes.len()),
        ),
        Check::new(
            "each node's Job is its only one and owned by the node",
            per_node.iter().all(|p| *p == (1, 1)),
            format!("(Jobs, owned by the node) per node: {per_node:?}"),
        ),
    ]
}

/// A 3-node drain wave held by a PodDisruptionBudget (one node cordoned, tainted, its drain
/// waiting); its policy is deleted and the leader crashes at `point` of the release.
async fn release(fc: &FaultCluster, client: &Client, rec: &mut Recorder, point: &str, run: u64) {
    let mut spec = WaveSpec::drain(&format!("cr{run}x"), 3, 1);
    spec.pdb = true;
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    let mut leader = armed(fc, client, (point, Strike::Crash), &[]).await;
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    wave.drain_started(&[], DEADLINE).await.unwrap();
    Api::<GpuNodePolicy>::all(client.clone())
        .delete(&wave.policy, &DeleteParams::default())
        .await
        .unwrap();
    let (mut checks, recovery) = leader.strike(fc, client, DEADLINE).await;
    let all = Api::<Node>::all(client.clone());
    let selector = ListParams::default().labels(&wave.policy_selector());
    let expected = wave.nodes.len() + usize::from(wave.bystander.is_some());
    let remaining = || async {
        let nodes = all.list(&selector).await?.items;
        let mut left: Vec<String> = nodes.iter().flat_map(|n| leftovers(n, &wave)).collect();
        if nodes.len() != expected {
            left.push(format!("{} of {expected} nodes listed", nodes.len()));
        }
        Ok::<_, gpunode_e2e::Error>(left)
    };
    let released = wait::until("the nodes to be released", DEADLINE, || async {
        Ok(remaining().await?.is_empty().then_some(()))
    })
    .await;
    // What is left, as of the end of the wait (the wait's error says only that it timed out).
    let left = match released {
        Ok(()) => Vec::new(),
        Err(e) => remaining().await.unwrap_or_else(|_| vec![e.to_string()]),
    };
    checks.push(Check::new(
        "nothing of gpunode's left on the released nodes, nothing else removed",
        left.is_empty(),
        format!("{left:?}"),
    ));
    checks.extend(monitor.checks(1, &fc.audit().unwrap(), &wave.namespace).await);
    push(
        rec,
        point,
        "the release of a deleted policy's 3 nodes, one mid-drain",
        run,
        checks,
        recovery,
    );
    leader.end().await;
    finish(client, &wave).await;
}

/// What is wrong with a released node: gpunode's labels, annotations, condition, taints or
/// cordon still on it, or another's label, taint or a person's cordon gone.
fn leftovers(n: &Node, wave: &Wave) -> Vec<String> {
    let name = n.name_any();
    let ours = |k: &String| k.starts_with("gpunode.dev/");
    let labels: Vec<&String> = n.labels().keys().filter(|k| ours(k)).collect();
    let annotations: Vec<&String> = n.annotations().keys().filter(|k| ours(k)).collect();
    let condition = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "GpuPolicyCompliant"));
    let unschedulable = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
    let foreign_taint = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == FOREIGN_TAINT.0));
    let foreign_label = n.labels().get(FOREIGN_LABEL.0).map(String::as_str) == Some(FOREIGN_LABEL.1);
    let person = wave.bystander.as_ref() == Some(&name);
    [
        (!labels.is_empty(), format!("labels {labels:?}")),
        (!annotations.is_empty(), format!("annotations {annotations:?}")),
        (condition, "condition GpuPolicyCompliant".to_string()),
        (
            !gpunode_taints(n).is_empty(),
            format!("taints {:?}", gpunode_taints(n)),
        ),
        (unschedulable != person, format!("unschedulable {unschedulable}")),
        (
            !foreign_taint || !foreign_label,
            "another controller's label or taint".to_string(),
        ),
    ]
    .into_iter()
    .filter_map(|(bad, what)| bad.then(|| format!("{name}: {what}")))
    .collect()
}

fn dra(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind), plural)
}

/// The report of a one-GPU node whose GPU has UUID `uuid`, with a fatal XID when `xid`.
fn one_gpu(uuid: &str, xid: bool) -> serde_json::Value {
    let mut status = report_status(xid, "boot-1");
    status["gpus"][0]["uuid"] = json!(uuid);
    status
}

/// One node whose GPU a DRA driver publishes; a fatal XID on it quarantines that GPU with a
/// DeviceTaintRule. The leader is struck once the rule exists, before the quarantine is
/// recorded. After a crash, the driver's slices are withdrawn and republished with the leader
/// SIGKILLed in the gap.
async fn devices(
    fc: &FaultCluster,
    client: &Client,
    rec: &mut Recorder,
    (point, strike): (&str, Strike),
    run: u64,
) {
    let since = jiff::Timestamp::now();
    let mut spec = WaveSpec::drain(&format!("cr{run}g{}", strike.tag()), 1, 0);
    spec.bystander = false;
    spec.policy_spec["remediation"] = json!([
        {"classes": ["Xid"], "action": "TaintDevice", "effect": "NoExecute"},
        {"classes": ["Xid"], "action": "Drain"},
    ]);
    let wave = Wave::setup(client, &spec).await.unwrap();
    let node = wave.nodes[0].clone();
    let uuid = format!("GPU-{node}-0");
    let slices: Api<DynamicObject> = Api::all_with(client.clone(), &dra("ResourceSlice", "resourceslices"));
    let slice: DynamicObject = serde_json::from_value(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpu")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": uuid}, "index": {"int": 0}}}]}})).unwrap();
    slices.create(&PostParams::default(), &slice).await.unwrap();
    reports::publish(client, &node, one_gpu(&uuid, false))
        .await
        .unwrap();
    let monitor = wave.monitor();
    let mut leader = armed(fc, client, (point, strike), &[]).await;
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    reports::publish(client, &node, one_gpu(&uuid, true))
        .await
        .unwrap();
    let (mut checks, recovery) = leader.strike(fc, client, DEADLINE).await;
    checks.extend(quarantined(fc, client, &node, &uuid, since).await);
    let gap = if strike == Strike::Crash {
        Some(slice_gap(fc, client, leader.leader(), &slices, &slice, &node).await)
    } else {
        None
    };
    reports::publish(client, &node, one_gpu(&uuid, false))
        .await
        .unwrap();
    checks.push(unquarantined(client, &wave).await);
    let disrupted = monitor.disruptions();
    let never_out = Check::new(
        if gap.is_some() {
            "the node never taken out of service, the slices' gap included (no escalation)"
        } else {
            "the node never taken out of service (no escalation)"
        },
        disrupted.is_empty(),
        format!(
            "observed out of service: {:?}",
            disrupted.iter().map(|d| d.at.to_string()).collect::<Vec<_>>()
        ),
    );
    checks.extend(monitor.checks(1, &fc.audit().unwrap(), &wave.namespace).await);
    checks.extend(leader.afterwards(fc, client).await);
    let action = "a DRA quarantine of one GPU";
    match gap {
        Some((mut gap, gap_recovery)) => {
            gap.push(never_out);
            push(rec, point, action, run, checks, recovery);
            rec.push(Run {
                class: CLASS.into(),
                fault: "leader SIGKILLed while the DRA driver's slices were withdrawn (a quarantined GPU's device unlisted), restarted; the slices republished".into(),
                seed: Some(run),
                checks: gap,
                recovery: Some(gap_recovery),
            })
            .unwrap();
        }
        None => {
            checks.push(never_out);
            push_struck(rec, (point, strike), action, run, checks, recovery);
        }
    }
    leader.end().await;
    let _ = slices
        .delete(&format!("{node}-gpu"), &DeleteParams::default())
        .await;
    finish(client, &wave).await;
}

/// The DRA driver restarts: its slice of the node, which lists the quarantined GPU, is withdrawn;
/// the leader is SIGKILLed and restarted in the gap and plans without it; the slice comes back
/// (a new pool generation). The quarantine holds throughout: the same rule, never deleted or
/// made again (the monitor's checks add that the node was never taken out instead).
async fn slice_gap(
    fc: &FaultCluster,
    client: &Client,
    op: &mut Operator,
    slices: &Api<DynamicObject>,
    slice: &DynamicObject,
    node: &str,
) -> (Vec<Check>, Recovery) {
    let uids = || async {
        rules_of(client, node)
            .await
            .map(|rs| rs.iter().filter_map(|r| r.uid()).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let before = uids().await;
    let since = jiff::Timestamp::now();
    let name = format!("{node}-gpu");
    slices.delete(&name, &DeleteParams::default()).await.unwrap();
    wait::until("the slice withdrawn", DEADLINE, || async {
        Ok(slices.get_opt(&name).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    op.kill();
    op.spawn().unwrap();
    let restarted = std::time::Instant::now();
    op.wait_leading(DEADLINE).await.unwrap();
    let recovery = Until::Leading.after(gpunode_e2e::faults::record::elapsed_ms(restarted));
    // The new leader's passes, the first with its caches listed and the slice missing.
    let op: &Operator = op;
    let passes = |at_least: f64| {
        wait::until(
            "the new leader's reconcile passes",
            DEADLINE,
            move || async move { Ok((op.metric("gpunode_reconciles_total").await? >= at_least).then_some(())) },
        )
    };
    let planned = passes(2.0).await.is_ok();
    let during = uids().await;
    let mut again = slice.clone();
    again.data["spec"]["pool"]["generation"] = json!(2);
    slices.create(&PostParams::default(), &again).await.unwrap();
    let done = op.metric("gpunode_reconciles_total").await.unwrap_or(0.0);
    let replanned = passes(done + 1.0).await.is_ok();
    let after = uids().await;
    let writes: Vec<String> = fc
        .audit()
        .unwrap()
        .iter()
        .filter(|e| e.at >= since && e.resource == "devicetaintrules" && e.succeeded())
        .filter(|e| e.verb == "delete" || e.verb == "create" || e.code == 201)
        .map(|e| format!("{} {} ({})", e.verb, e.name, e.code))
        .collect();
    let checks = vec![Check::new(
        "the quarantine held while the slice was missing: the same rule, never deleted or made again",
        planned && replanned && before.len() == 1 && during == before && after == before && writes.is_empty(),
        format!(
            "rule uids before {before:?}, in the gap {during:?}, after the republish {after:?}; rules deleted or \
             made since the withdrawal: {writes:?}; the new leader planned in the gap: {planned}, after: {replanned}"
        ),
    )];
    (checks, recovery)
}

/// gpunode's DeviceTaintRules of `node`.
async fn rules_of(client: &Client, node: &str) -> Result<Vec<DynamicObject>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &dra("DeviceTaintRule", "devicetaintrules"));
    let selector = format!("app.kubernetes.io/managed-by=gpunode,gpunode.dev/node={node}");
    Ok(api.list(&ListParams::default().labels(&selector)).await?.items)
}

/// After the restart: the quarantine is recorded on the node, with one rule, made once.
async fn quarantined(
    fc: &FaultCluster,
    client: &Client,
    node: &str,
    uuid: &str,
    since: jiff::Timestamp,
) -> Vec<Check> {
    let nodes: Api<Node> = Api::all(client.clone());
    let recorded = wait::until("the quarantine to be recorded", DEADLINE, || async {
        let n = nodes.get(node).await?;
        let unhealthy = marks::annotation(&n, gpunode_operator::markers::UNHEALTHY_GPUS_ANNOTATION);
        Ok(unhealthy.filter(|u| u.contains(uuid)))
    })
    .await;
    let rules = rules_of(client, node).await.unwrap();
    // A server-side apply that makes the rule is answered 201 Created.
    let made = fc
        .audit()
        .unwrap()
        .iter()
        .filter(|e| e.at >= since && e.resource == "devicetaintrules" && e.verb == "patch" && e.code == 201)
        .count();
    vec![
        Check::new(
            "the quarantine recorded by the next leader",
            recorded.is_ok(),
            format!("{recorded:?}"),
        ),
        Check::new(
            "one DeviceTaintRule, made once",
            rules.len() == 1 && made == 1,
            format!(
                "{} rules of the node; {made} made (audit log: apply answered 201)",
                rules.len()
            ),
        ),
    ]
}

/// After the GPU recovered: no rule of the node left, the node compliant and clean.
async fn unquarantined(client: &Client, wave: &Wave) -> Check {
    let node = &wave.nodes[0];
    let done = wait::until("the quarantine to be lifted", DEADLINE, || async {
        let rules = rules_of(client, node).await?;
        let n = Api::<Node>::all(client.clone()).get(node).await?;
        let unhealthy = marks::annotation(&n, gpunode_operator::markers::UNHEALTHY_GPUS_ANNOTATION);
        Ok((rules.is_empty() && unhealthy.is_none() && all_clean(std::slice::from_ref(&n))).then_some(()))
    })
    .await;
    Check::new(
        "no rule and no quarantine left after the GPU recovered",
        done.is_ok(),
        format!("{done:?}"),
    )
}

/// A probe with its XID state directory: a first XID is saved; the probe crashes while saving a
/// second (its new state written to a temporary file, not yet renamed over the state file) and
/// is started again.
async fn xid_save(client: &Client, rec: &mut Recorder, point: &str, run: u64) {
    let node = format!("cr{run}s-{:06x}", gpunode_e2e::scratch::rand_suffix());
    gpunode_e2e::nodes::create(client, std::slice::from_ref(&node), &Default::default())
        .await
        .unwrap();
    let host = Host::prepare(client, &node).await.unwrap();
    let env = [(gpunode_operator::crash::ENV, point), ("GPUNODE_CRASH_SKIP", "1")];
    let mut probe = host.start_probe_env("boot-1", &[], &env).unwrap();
    probe.logged("listening for XID events", DEADLINE).await.unwrap();
    host.inject_xid(2, 79).unwrap();
    let state = host.dir.join("state");
    let saved = wait::until("the first XID saved", DEADLINE, || async {
        let text = std::fs::read_to_string(state.join("xids.json")).unwrap_or_default();
        Ok(text.contains("79").then_some(()))
    })
    .await;
    host.inject_xid(4, 48).unwrap();
    let crashed = probe_crashed_at(&mut probe, point, DEADLINE).await;
    let restart = jiff::Timestamp::now();
    let started = std::time::Instant::now();
    let again = host.start_probe("boot-1").unwrap();
    let restored = again.logged("restored the XIDs of this boot", DEADLINE).await;
    let recovery = Until::ProbeBack.after(gpunode_e2e::faults::record::elapsed_ms(started));
    let leftovers: Vec<String> = std::fs::read_dir(&state)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let leftovers: Vec<String> = leftovers
        .into_iter()
        .filter(|n| n.starts_with(".xids.json-"))
        .collect();
    // A third XID after the restart makes the probe publish (an unchanged report is not
    // written again); the report then shows what it kept.
    again.logged("listening for XID events", DEADLINE).await.unwrap();
    host.inject_xid(6, 31).unwrap();
    let reported = reported_xids(client, &node, restart).await;
    let kept = reported.as_ref().is_ok_and(|x| x.contains(&(2, 79)));
    let checks = vec![
        crashed,
        Check::new(
            "the first XID's save completed before the crash",
            saved.is_ok(),
            format!("{saved:?}"),
        ),
        Check::new(
            "the state saved before the crash restored by the next probe, not taken for corrupt",
            restored.is_ok()
                && !again
                    .lines()
                    .iter()
                    .any(|l| l.contains("ignoring the XID state file")),
            format!("{restored:?}"),
        ),
        Check::new(
            "no temporary file of the interrupted save left",
            leftovers.is_empty(),
            format!("{leftovers:?}"),
        ),
        // The second XID was recorded in memory when the probe died; NVML does not deliver it
        // again, so whether it survived is reported, not required.
        Check::new(
            "the XID saved before the crash reported again after the restart",
            kept,
            format!("(gpu, xid) reported after the restart: {reported:?}"),
        ),
    ];
    push(rec, point, "a probe saving its second XID", run, checks, recovery);
    drop(again);
    host.cleanup(client).await;
    let _ = Api::<Node>::all(client.clone())
        .delete(&node, &DeleteParams::background())
        .await;
}

/// The (GPU, XID) pairs of `node`'s report once one observed after `since` has XID 31 on GPU 6.
async fn reported_xids(
    client: &Client,
    node: &str,
    since: jiff::Timestamp,
) -> Result<Vec<(u32, u32)>, gpunode_e2e::Error> {
    let reports: Api<gpunode_crds::GpuNodeReport> = Api::all(client.clone());
    wait::until("a report observed after the restart", DEADLINE, || async {
        let Some(status) = reports.get_opt(node).await?.and_then(|r| r.status) else {
            return Ok(None);
        };
        if status.observed_at.as_ref().is_none_or(|t| t.0 <= since) {
            return Ok(None);
        }
        let xids: Vec<(u32, u32)> = status
            .gpus
            .iter()
            .flat_map(|g| g.xids.iter().map(move |x| (g.index, x.xid)))
            .collect();
        Ok(xids.contains(&(6, 31)).then_some(xids))
    })
    .await
}

/// The GPU whose row remap turns pending in the reset scenario.
const RESET_GPU: usize = 3;

/// A policy for `node` whose repair resets the drifting GPU, then hands the node to the
/// remediator.
fn reset_policy(node: &str) -> serde_json::Value {
    json!({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "gpu": {},
        "remediation": [{"classes": ["Memory", "Xid"], "action": "Drain"}],
        "disruption": {"maxUnavailable": 1, "circuitBreaker": {"maxDriftedPercent": 100},
            // The probe's and the reset process's stand-in pods (the DaemonSet pods a drain
            // skips) live there; their tokens are bound to them, so evicting them would leave
            // both processes unable to authenticate.
            "drain": {"protectedNamespaces": ["kube-system", gpunode_e2e::chart::NAMESPACE]}},
        "recovery": {"healthyFor": "2s"},
        "staleAfter": "5m",
        // The reset step's timeout outlasts an API outage and the probe's backoff after it (up to
        // 60 s): a shorter one ended a successful reset whose fresh report came late, and handed
        // the node to the reboot.
        "repair": {"maxAttempts": 3, "window": "1h", "steps": [
            {"name": "gpu-reset", "action": "GpuReset", "classes": ["Memory", "Xid"], "timeout": "3m"},
            {"name": "reboot", "action": "Remediator", "classes": ["Memory", "Xid"], "timeout": "60s",
             "remediator": {
                 "apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
                 "kind": "FakeRebootTemplate", "name": "reboot", "namespace": OPERATOR,
             }},
        ]},
    })
}

/// A node whose GPU's row remap turns pending is drained and its GPU reset by the node's reset
/// process (`--gpu-reset-only`, as the chart's reset DaemonSet runs it), which crashes after the
/// reset, before writing its outcome, and is started again.
async fn gpu_reset(fc: &FaultCluster, client: &Client, rec: &mut Recorder, point: &str, run: u64) {
    let since = jiff::Timestamp::now();
    let rig = ResetRig::up(
        client,
        &format!("cr{run}t"),
        &[(gpunode_operator::crash::ENV, point)],
    )
    .await;
    let (node, host) = (rig.node.clone(), rig.host.clone());
    let launch = gpunode_e2e::faults::replica::Launch {
        env: vec![("GPUNODE_REMEDIATORS".into(), remediator_grant())],
        ..Default::default()
    };
    let op = Operator::start_with(fc, client, OPERATOR, OPERATOR, launch)
        .await
        .unwrap();
    rig.until_compliant(client).await;
    host.edit_fixture(|f| f["devices"][RESET_GPU]["remapped_rows"]["pending"] = 1.into())
        .unwrap();
    let mut reset = rig.reset;
    let crashed = probe_crashed_at(&mut reset, point, DEADLINE).await;
    let started = std::time::Instant::now();
    let again = host.start_reset_only().unwrap();
    let answering = again.logged("answering GpuResetRequests", DEADLINE).await;
    let recovery = Until::ProbeBack.after(gpunode_e2e::faults::record::elapsed_ms(started));
    let mut checks = vec![crashed];
    checks.push(Check::new(
        "the restarted reset process answers requests again",
        answering.is_ok(),
        format!("{answering:?}"),
    ));
    checks.extend(reset_outcome(client, &node).await);
    let back = until_back(client, &node).await;
    let resets = [&reset, &again]
        .iter()
        .flat_map(|p| p.lines())
        // Logged as the reset starts (its outcome is logged after the crash point).
        .filter(|l| l.contains("resetting GPU uuid="))
        .count();
    checks.push(Check::new(
        "the GPU reset once (the restarted process did not reset it again)",
        resets == 1,
        format!("{resets} resets started (the reset processes' logs)"),
    ));
    checks.push(Check::new(
        "the node returned, compliant and uncordoned",
        back.is_ok(),
        format!("{back:?}"),
    ));
    checks.extend(reset_leftovers(fc, client, &node, since).await);
    push(
        rec,
        point,
        "a GPU reset by the node's reset process",
        run,
        checks,
        recovery,
    );
    drop((op, reset, again));
    ResetRig::down(client, &node, host, rig.probe, rig.reboots).await;
}

/// A node whose GPU's row remap turns pending is drained and its GPU reset step begins; the
/// leader crashes just after making the GpuResetRequest, before recording it. The restarted
/// leader resumes the step: the reset succeeds, or (`in_use`: a process holds the GPU) the reset
/// process refuses it and the ladder hands the node to the remediator's reboot. Either way one
/// request, the remediator's object only after a refusal, each attempt counted once, nothing
/// left, the node back.
async fn reset_by_new_leader(
    fc: &FaultCluster,
    client: &Client,
    rec: &mut Recorder,
    (point, strike): (&str, Strike),
    run: u64,
    in_use: bool,
) {
    let since = jiff::Timestamp::now();
    let tag = format!("cr{run}{}{}", if in_use { "u" } else { "s" }, strike.tag());
    let rig = ResetRig::up(client, &tag, &[]).await;
    let (node, host) = (rig.node.clone(), rig.host.clone());
    let env = [("GPUNODE_REMEDIATORS", remediator_grant())];
    let mut leader = armed(fc, client, (point, strike), &env).await;
    rig.until_compliant(client).await;
    host.edit_fixture(|f| {
        f["devices"][RESET_GPU]["remapped_rows"]["pending"] = 1.into();
        if in_use {
            f["devices"][RESET_GPU]["processes"] =
                json!([{"pid": 4242, "used_memory": 1_073_741_824u64, "graphics": false}]);
        }
    })
    .unwrap();
    let requests: Api<gpunode_crds::GpuResetRequest> = Api::all(client.clone());
    let name = format!("{node}-gpu-{RESET_GPU}");
    // Read while the leader is struck: the reset process answers the request meanwhile, and the
    // next leader deletes it once it has read the outcome, possibly before the strike is over.
    // A request gone before a finished status was seen ends the wait with none.
    let existed = std::cell::Cell::new(false);
    let outcome = wait::until("the reset's outcome", DEADLINE * 2, || async {
        match requests.get_opt(&name).await? {
            Some(r) => {
                existed.set(true);
                Ok(r.status.filter(|s| s.finished()).map(Some))
            }
            None if existed.get() => Ok(Some(None)),
            None => Ok(None),
        }
    });
    let ((struck, recovery), status) = tokio::join!(leader.strike(fc, client, DEADLINE), outcome);
    let expected = if in_use {
        gpunode_crds::reset::ResetPhase::Failed
    } else {
        gpunode_crds::reset::ResetPhase::Succeeded
    };
    let seen = status.as_ref().is_ok_and(|s| {
        s.as_ref().is_some_and(|s| {
            s.phase == Some(expected)
                && (!in_use || s.message.as_deref().unwrap_or_default().contains("in use"))
        })
    });
    // The request may live only between two looks of the test's client (answered just before
    // the API server stopped, deleted by the leader just after it came back, while the client
    // still waited on a connection the stop left hanging): then the reset process's own log
    // line and its two status writes (taken, then finished) in the audit log say the same.
    let line = if in_use {
        "is in use by processes [4242]"
    } else {
        "was drained, removed and discovered again"
    };
    let logged = rig.reset.lines().iter().any(|l| l.contains(line));
    let written = fc
        .audit()
        .unwrap()
        .iter()
        .filter(|e| e.at >= since && e.resource == "gpuresetrequests" && e.subresource == "status")
        .filter(|e| e.name == name && e.verb == "patch" && e.succeeded())
        .count();
    let outcome = seen || (logged && written >= 2);
    let back = until_back(client, &node).await;
    let made_reboots = creates(fc, "fakereboots", OPERATOR, since);
    let mut checks = struck;
    checks.extend([
        Check::new(
            if in_use {
                "the reset refused: the GPU is in use"
            } else {
                "the reset succeeded"
            },
            outcome,
            format!(
                "status seen: {status:?}; the reset process logged \"{line}\": {logged}; its status writes: {written}"
            ),
        ),
        Check::new(
            "the remediator's reboot made only after a refused reset, once",
            made_reboots == usize::from(in_use),
            format!("{made_reboots} remediation objects created (audit log)"),
        ),
        Check::new(
            "the node returned, compliant and uncordoned",
            back.is_ok(),
            format!("{back:?}"),
        ),
    ]);
    checks.extend(reset_leftovers(fc, client, &node, since).await);
    checks.extend(leader.afterwards(fc, client).await);
    let action = if in_use {
        "a GPU reset refused (the GPU in use), handed to the remediator"
    } else {
        "a GPU reset that succeeds"
    };
    push_struck(rec, (point, strike), action, run, checks, recovery);
    leader.end().await;
    drop(rig.reset);
    ResetRig::down(client, &node, host, rig.probe, rig.reboots).await;
}

/// The GPU reset scenarios' node: its reset policy, the real probe following GpuResetRequests,
/// the node's reset process (`reset_env` added to its environment) and the fake remediator,
/// whose reboot gives the node a fresh boot and a healthy fixture.
struct ResetRig {
    node: String,
    host: std::sync::Arc<Host>,
    probe: gpunode_e2e::probe::Probe,
    reset: gpunode_e2e::probe::Probe,
    reboots: tokio::task::JoinHandle<()>,
}

impl ResetRig {
    /// A node named `<tag>-<random>` with both processes answering.
    async fn up(client: &Client, tag: &str, reset_env: &[(&str, &str)]) -> ResetRig {
        let node = format!("{tag}-{:06x}", gpunode_e2e::scratch::rand_suffix());
        gpunode_e2e::nodes::create(client, std::slice::from_ref(&node), &Default::default())
            .await
            .unwrap();
        let host = std::sync::Arc::new(Host::prepare_for_resets(client, &node).await.unwrap());
        gpunode_e2e::crds::create_policy(client, &node, reset_policy(&node))
            .await
            .unwrap();
        let probe = host
            .start_probe_with("boot-1", &[std::ffi::OsStr::new("--follow-resets")])
            .unwrap();
        let reset = host.start_reset_only_env(reset_env).unwrap();
        probe
            .logged("following this node's GpuResetRequests", DEADLINE)
            .await
            .unwrap();
        reset
            .logged("answering GpuResetRequests", DEADLINE)
            .await
            .unwrap();
        let rebooted = host.clone();
        let reboots = remediator::spawn(client.clone(), move |_| {
            let host = rebooted.clone();
            async move {
                let _ = host.reboot("boot-1", "boot-2");
            }
        });
        ResetRig {
            node,
            host,
            probe,
            reset,
            reboots,
        }
    }

    /// Waits until the operator has found the node compliant.
    async fn until_compliant(&self, client: &Client) {
        let compliant = [("gpunode.dev/state", "compliant")];
        gpunode_e2e::nodes::until_labelled(client, &self.node, &compliant, DEADLINE)
            .await
            .unwrap();
    }

    /// Stops the remediator and the probe, deletes the policy, the host's objects and the node
    /// (the operator and the reset processes are stopped by the caller first).
    async fn down(
        client: &Client,
        node: &str,
        host: std::sync::Arc<Host>,
        probe: gpunode_e2e::probe::Probe,
        reboots: tokio::task::JoinHandle<()>,
    ) {
        reboots.abort();
        drop(probe);
        let _ = Api::<GpuNodePolicy>::all(client.clone())
            .delete(node, &DeleteParams::default())
            .await;
        host.cleanup(client).await;
        let _ = Api::<Node>::all(client.clone())
            .delete(node, &DeleteParams::background())
            .await;
    }
}

/// What the operator's GPUNODE_REMEDIATORS grants for the fake reboot.
fn remediator_grant() -> String {
    json!([{"apiGroup": remediator::GROUP, "resources": ["fakereboots"],
        "templates": ["fakereboottemplates"]}])
    .to_string()
}

/// The request of the interrupted reset: failed by the restarted reset process, which does not
/// reset the GPU again.
async fn reset_outcome(client: &Client, node: &str) -> Vec<Check> {
    let requests: Api<gpunode_crds::GpuResetRequest> = Api::all(client.clone());
    let name = format!("{node}-gpu-{RESET_GPU}");
    let status = wait::until("the interrupted reset's outcome", DEADLINE, || async {
        let status = requests.get_opt(&name).await?.and_then(|r| r.status);
        Ok(status.filter(|s| s.finished()))
    })
    .await;
    let failed = status.as_ref().is_ok_and(|s| {
        s.phase == Some(gpunode_crds::reset::ResetPhase::Failed)
            && s.message.as_deref().unwrap_or_default().contains("not run twice")
    });
    vec![Check::new(
        "the interrupted reset failed by the restarted reset process, not run again",
        failed,
        format!("{status:?}"),
    )]
}

/// Waits until `node` is back: compliant, uncordoned, without gpunode's taints; lets the
/// remediation go if the ladder reached it.
async fn until_back(client: &Client, node: &str) -> Result<(), gpunode_e2e::Error> {
    let reboots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), OPERATOR, &remediator::reboot_resource());
    let nodes: Api<Node> = Api::all(client.clone());
    wait::until("the reset node to be back", DEADLINE * 2, || async {
        if let Some(o) = reboots.get_opt(node).await?
            && !o.labels().contains_key(remediator::GO_LABEL)
        {
            remediator::go(client, OPERATOR, node).await?;
        }
        Ok(all_clean(&[nodes.get(node).await?]).then_some(()))
    })
    .await
}

/// After the node returned: one reset request made, its steps' attempts recorded once each,
/// no request or remediation object left.
async fn reset_leftovers(
    fc: &FaultCluster,
    client: &Client,
    node: &str,
    since: jiff::Timestamp,
) -> Vec<Check> {
    let requests: Api<gpunode_crds::GpuResetRequest> = Api::all(client.clone());
    let reboots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), OPERATOR, &remediator::reboot_resource());
    let name = format!("{node}-gpu-{RESET_GPU}");
    let gone = wait::until("the repair objects deleted", DEADLINE, || async {
        let left = requests.get_opt(&name).await?.is_some() || reboots.get_opt(node).await?.is_some();
        Ok((!left).then_some(()))
    })
    .await;
    let made_resets = creates(fc, "gpuresetrequests", "", since);
    let made_reboots = creates(fc, "fakereboots", OPERATOR, since);
    let n = Api::<Node>::all(client.clone()).get(node).await.unwrap();
    let attempts = marks::annotation(&n, gpunode_operator::markers::REPAIR_ANNOTATION)
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|t| t["attempts"].as_array().map(Vec::len));
    vec![
        Check::new(
            "one GpuResetRequest made",
            made_resets == 1,
            format!("{made_resets} created (audit log)"),
        ),
        Check::new(
            "each step started counted once (attempts = objects made)",
            attempts == Some(made_resets + made_reboots),
            format!(
                "attempts {attempts:?}; made {made_resets} reset requests, {made_reboots} remediation objects"
            ),
        ),
        Check::new(
            "no reset request or remediation object left",
            gone.is_ok(),
            format!("{gone:?}"),
        ),
    ]
}
