//! The built-in GPU reset (`spec.repair` step `action: GpuReset`) on the real API server, with
//! real processes under the accounts the chart renders with `nodeProbe.gpuReset.enabled=true`
//! (their RBAC and admission policies), run as the chart runs them: the unprivileged probe
//! (`--follow-resets`) and the reset DaemonSet's process (`--gpu-reset-only`), both on the fake
//! NVML library of their node:
//! - a row remap turns pending on GPU 3 of one node: the node drifts (Memory) and is drained,
//!   the operator asks for GPU 3's reset with a GpuResetRequest naming its index and UUID, the
//!   node's reset process resets it through NVML (drain, remove, discover: the remap is
//!   applied) and writes the outcome, and the probe publishes a clean report; the node is
//!   released after `healthyFor` and the request deleted;
//! - on another node the same reset fails (NVML's remove fails): the reset process fails the
//!   request, the ladder moves to its next step, a hand-off to the fake remediator, whose
//!   "reboot" brings the node back on a new boot without the pending remap, and the node is
//!   released;
//! - the reset DaemonSet's account may write the status of its own node's requests only.
//!
//! (A separate test binary: one operator per process.) Needs the binaries built (`make test`
//! builds them first): `gpunode-probe` and `libfake_nvml.so`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{ffi::OsStr, sync::Arc, time::Duration};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport, GpuResetRequest, reset::ResetPhase};
use gpunode_e2e::{
    accounts, chart, cluster::admin_client, crds, nodes, operator::InProcess, probe::Host, remediator,
    scratch::Scratch, scratch::rand_suffix, wait,
};
use k8s_openapi::api::{core::v1::Node, events::v1::Event};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(90);
/// The GPU whose row remap turns pending.
const GPU: usize = 3;

fn policy(node: &str, ns: &str) -> serde_json::Value {
    json!({
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "gpu": {},
        "remediation": [{"classes": ["Memory", "Xid"], "action": "Drain"}],
        "disruption": {"maxUnavailable": 2, "circuitBreaker": {"maxDriftedPercent": 100},
            // The probe's stand-in pod (the DaemonSet pod a drain skips) lives there: its token
            // is bound to it.
            "drain": {"protectedNamespaces": ["kube-system", chart::NAMESPACE]}},
        "recovery": {"healthyFor": "5s"},
        "staleAfter": "5m",
        "repair": {
            "steps": [
                {"name": "gpu-reset", "action": "GpuReset", "classes": ["Memory", "Xid"], "timeout": "60s"},
                {"name": "reboot", "action": "Remediator", "classes": ["Memory", "Xid"], "timeout": "60s",
                 "remediator": {
                     "apiVersion": format!("{}/{}", remediator::GROUP, remediator::VERSION),
                     "kind": "FakeRebootTemplate", "name": "reboot", "namespace": ns,
                 }},
            ],
            "maxAttempts": 3,
            "window": "1h",
        },
    })
}

/// How many times gpunode published `reason` about `node` (an event the recorder aggregated
/// into a series counts each repeat).
async fn count(client: &Client, node: &str, reason: &str) -> i32 {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let list = events.list(&ListParams::default()).await.unwrap();
    list.items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// Waits until gpunode's events about `node` count `want` of each reason (they are published in
/// the background), then checks they are exactly that.
async fn counted(client: &Client, node: &str, want: &[(&str, i32)]) {
    let what = format!("{node}'s events {want:?}");
    let seen = wait::until(&what, DEADLINE, || async {
        let mut seen = Vec::new();
        for (reason, _) in want {
            seen.push((*reason, count(client, node, reason).await));
        }
        Ok(want
            .iter()
            .zip(&seen)
            .all(|((_, w), (_, s))| s >= w)
            .then_some(seen))
    })
    .await
    .unwrap();
    assert_eq!(seen, want, "{node}");
}

async fn released(client: &Client, node: &str) {
    let api: Api<Node> = Api::all(client.clone());
    wait::until(&format!("{node} released"), DEADLINE, || async {
        let n = api.get(node).await?;
        let ok =
            !nodes::cordoned(&n) && nodes::label(&n, "gpunode.dev/state").as_deref() == Some("compliant");
        Ok(ok.then_some(()))
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_pending_row_remap_is_repaired_by_the_probes_gpu_reset_and_a_failed_reset_escalates() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let ns = Scratch::new(&client, "gpu-reset").await.unwrap();
    remediator::install_and_grant(&client, &ns.name).await.unwrap();
    remediator::create_template(&client, &ns.name, "reboot", "Succeed")
        .await
        .unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();

    let id = format!("{:06x}", rand_suffix());
    let (good, bad) = (format!("reset-ok-{id}"), format!("reset-fail-{id}"));
    nodes::create(
        &client,
        &[good.clone(), bad.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let good_host = Host::prepare_for_resets(&client, &good).await.unwrap();
    let bad_host = Arc::new(Host::prepare_for_resets(&client, &bad).await.unwrap());
    // NVML refuses to take the bad node's GPU off the bus.
    bad_host
        .edit_fixture(|f| f["devices"][GPU]["errors"]["nvmlDeviceRemoveGpu_v2"] = 999.into())
        .unwrap();
    for n in [&good, &bad] {
        crds::create_policy(&client, n, policy(n, &ns.name))
            .await
            .unwrap();
    }
    // As the chart runs them with nodeProbe.gpuReset.enabled: the unprivileged probe follows
    // its node's requests, the reset DaemonSet's process answers them.
    let follow = [OsStr::new("--follow-resets")];
    let good_probe = good_host.start_probe_with("boot-1", &follow).unwrap();
    let bad_probe = bad_host.start_probe_with("boot-1", &follow).unwrap();
    let good_reset = good_host.start_reset_only().unwrap();
    let bad_reset = bad_host.start_reset_only().unwrap();
    for p in [&good_probe, &bad_probe] {
        p.logged("following this node's GpuResetRequests", DEADLINE)
            .await
            .unwrap();
    }
    for p in [&good_reset, &bad_reset] {
        p.logged("answering GpuResetRequests", DEADLINE).await.unwrap();
    }
    // The remediator's "reboot" of the bad node: a new boot, its GPUs healthy again.
    let rebooted = bad_host.clone();
    let bad_name = bad.clone();
    let fake = remediator::spawn(client.clone(), move |node| {
        let host = rebooted.clone();
        let bad = bad_name.clone();
        async move {
            if node == bad {
                host.reboot("boot-1", "boot-2").unwrap();
            }
        }
    });
    let operator = InProcess::start(&operator_client, "e2e-gpu-reset");
    for n in [&good, &bad] {
        nodes::until_labelled(&client, n, &[("gpunode.dev/state", "compliant")], DEADLINE)
            .await
            .unwrap();
    }

    // A row remap turns pending on GPU 3 of both nodes.
    for h in [&good_host, &*bad_host] {
        h.edit_fixture(|f| f["devices"][GPU]["remapped_rows"]["pending"] = 1.into())
            .unwrap();
    }
    let requests: Api<GpuResetRequest> = Api::all(client.clone());
    let name = format!("{good}-gpu-{GPU}");
    let made = wait::until("the reset request of the good node", DEADLINE, || async {
        Ok(requests.get_opt(&name).await?)
    })
    .await
    .unwrap();
    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    let uuid = reports.get(&good).await.unwrap().status.unwrap_or_default().gpus[GPU]
        .uuid
        .clone();
    assert_eq!(made.spec.node_name, good);
    assert_eq!(made.spec.index, GPU as u32);
    assert_eq!(
        Some(made.spec.uuid.clone()),
        uuid,
        "the GPU is named by its UUID too"
    );
    assert_eq!(
        made.labels().get("gpunode.dev/node").map(String::as_str),
        Some(good.as_str())
    );

    // The reset process resets it; the remap is applied; the probe follows and publishes; the
    // node is released and the request deleted.
    good_reset
        .logged("was drained, removed and discovered again", DEADLINE)
        .await
        .unwrap();
    good_probe
        .logged(
            "GPU reset by the reset DaemonSet: publishing a fresh report",
            DEADLINE,
        )
        .await
        .unwrap();
    released(&client, &good).await;
    wait::until("the good node's request deleted", DEADLINE, || async {
        Ok(requests.get_opt(&name).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    let pending = reports.get(&good).await.unwrap().status.unwrap_or_default().gpus[GPU]
        .remapped_rows
        .as_ref()
        .map(|r| r.pending);
    assert_eq!(pending, Some(false), "the reset applied the pending remap");
    counted(
        &client,
        &good,
        &[("RepairStarted", 1), ("RepairSucceeded", 1), ("RepairFailed", 0)],
    )
    .await;

    // The bad node: the reset fails, and the ladder hands the node to the remediator.
    let reboots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &remediator::reboot_resource());
    wait::until("the bad node handed to the remediator", DEADLINE, || async {
        Ok(reboots.get_opt(&bad).await?)
    })
    .await
    .unwrap();
    let failed = requests
        .get(&format!("{bad}-gpu-{GPU}"))
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    assert_eq!(failed.phase, Some(ResetPhase::Failed), "{failed:?}");
    assert!(
        failed
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("remove failed"),
        "{failed:?}"
    );
    assert_eq!(
        failed
            .conditions
            .first()
            .map(|c| (c.status.as_str(), c.reason.as_str())),
        Some(("False", "NvmlError"))
    );
    remediator::go(&client, &ns.name, &bad).await.unwrap();
    released(&client, &bad).await;
    // The reset failed, then the reboot succeeded.
    counted(
        &client,
        &bad,
        &[("RepairStarted", 2), ("RepairFailed", 1), ("RepairSucceeded", 1)],
    )
    .await;
    assert!(
        requests
            .get_opt(&format!("{bad}-gpu-{GPU}"))
            .await
            .unwrap()
            .is_none(),
        "the failed request is deleted when the repair ends"
    );

    fake.abort();
    operator.stop().await.unwrap();
    for n in [&good, &bad] {
        let _ = Api::<GpuNodePolicy>::all(client.clone())
            .delete(n, &Default::default())
            .await;
    }
    drop((good_probe, bad_probe, good_reset, bad_reset));
    good_host.cleanup(&client).await;
    bad_host.cleanup(&client).await;
}

#[tokio::test]
async fn a_probe_writes_the_status_of_its_own_nodes_reset_requests_only() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    chart::install_reset_accounts(&client).await.unwrap();
    let id = format!("{:06x}", rand_suffix());
    let (mine, theirs) = (format!("reset-own-{id}"), format!("reset-other-{id}"));
    nodes::create(
        &client,
        &[mine.clone(), theirs.clone()],
        &nodes::GpuNodeShape::default(),
    )
    .await
    .unwrap();
    let pod_name = format!("gpu-reset-own-{mine}");
    let pod = chart::probe_pod_as(&client, &mine, chart::RESET_SA, &pod_name)
        .await
        .unwrap();
    let probe = accounts::client_for(&client, chart::NAMESPACE, chart::RESET_SA, Some(&pod))
        .await
        .unwrap();
    let admin_requests: Api<GpuResetRequest> = Api::all(client.clone());
    for n in [&mine, &theirs] {
        let r: GpuResetRequest = serde_json::from_value(json!({
            "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuResetRequest",
            "metadata": {"name": format!("{n}-gpu-0"), "labels": {"gpunode.dev/node": n}},
            "spec": {"nodeName": n, "index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000001"},
        }))
        .unwrap();
        admin_requests.create(&PostParams::default(), &r).await.unwrap();
    }
    let as_probe: Api<GpuResetRequest> = Api::all(probe);
    let status = json!({"status": {"phase": "Succeeded", "message": "done"}});
    as_probe
        .patch_status(
            &format!("{mine}-gpu-0"),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .expect("its own node's request");
    match as_probe
        .patch_status(
            &format!("{theirs}-gpu-0"),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "{s:?}");
            assert!(
                s.message.contains(chart::RESET_OTHER_NODE_MESSAGE),
                "{}",
                s.message
            );
        }
        other => panic!("another node's request: expected the admission policy's 403, got {other:?}"),
    }
    let forged: GpuResetRequest = serde_json::from_value(json!({
        "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuResetRequest",
        "metadata": {"name": format!("{mine}-gpu-1")},
        "spec": {"nodeName": mine, "index": 1, "uuid": "GPU-00000000-0000-0000-0000-000000000002"},
    }))
    .unwrap();
    match as_probe.create(&PostParams::default(), &forged).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "RBAC grants no create: {s:?}"),
        other => panic!("a probe created a request: {other:?}"),
    }
    for n in [&mine, &theirs] {
        let _ = admin_requests
            .delete(&format!("{n}-gpu-0"), &Default::default())
            .await;
    }
    let _ = chart::delete_pod(&client, &pod_name).await;
}
