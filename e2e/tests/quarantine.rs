//! Per-GPU quarantine on the real API server, scheduler and controller-manager: a KWOK node
//! whose 8 GPUs a DRA driver publishes in a ResourceSlice, one pod per GPU allocated by the real
//! scheduler. A fatal XID on GPU 5 makes the operator create one DeviceTaintRule for exactly that
//! device; the controller-manager evicts exactly the pod using it; a new pod is scheduled onto
//! another GPU of the same node and never onto GPU 5; an operator killed meanwhile is replaced
//! without a duplicate rule; recovery removes the rule after `healthyFor` and GPU 5 is
//! allocatable again. A rule gpunode did not create is never touched. (A separate test binary:
//! one operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use gpunode_crds::GpuNodePolicy;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, reports, scratch::Scratch,
    scratch::rand_suffix, wait,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);
const DRIVER: &str = "gpu.nvidia.com";
const GPUS: u32 = 8;

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind), plural)
}

fn uuid(node: &str, i: u32) -> String {
    // Not the index, not the device name: the operator must match on this.
    format!("GPU-{:08x}-{i}", node.len() as u32 * 7919 + i * 104_729)
}

async fn publish_report(client: &Client, node: &str, xid_on: Option<u32>) {
    let gpus: Vec<serde_json::Value> = (0..GPUS)
        .map(|i| {
            let xids = if Some(i) == xid_on {
                json!([{"xid": 79, "at": jiff::Timestamp::now().to_string()}])
            } else {
                json!([])
            };
            json!({"index": i, "uuid": uuid(node, i),
                   "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": false, "failure": false},
                   "xids": xids})
        })
        .collect();
    let status = json!({
        "observedAt": jiff::Timestamp::now().to_string(),
        "collectors": [{"name": "nvml", "ok": true, "durationMs": 5}],
        "gpuCount": GPUS,
        "gpus": gpus,
    });
    reports::publish(client, node, status).await.unwrap();
}

async fn create(client: &Client, ar: &ApiResource, ns: Option<&str>, object: serde_json::Value) {
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// The DRA driver's objects for `node`: a DeviceClass, one ResourceSlice with a device per GPU
/// (named in the driver's own scheme, the UUID as an attribute), a one-GPU claim template.
async fn publish_devices(client: &Client, node: &str, class: &str, ns: &str) {
    create(
        client,
        &resource("DeviceClass", "deviceclasses"),
        None,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": class},
               "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}}),
    )
    .await;
    let devices: Vec<serde_json::Value> = (0..GPUS)
        .map(|i| {
            json!({"name": format!("gpu-{i}"),
                   "attributes": {"uuid": {"string": uuid(node, i)}, "index": {"int": i}}})
        })
        .collect();
    create(
        client,
        &resource("ResourceSlice", "resourceslices"),
        None,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": format!("{node}-{DRIVER}")},
               "spec": {"driver": DRIVER, "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": devices}}),
    )
    .await;
    create(
        client,
        &resource("ResourceClaimTemplate", "resourceclaimtemplates"),
        Some(ns),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
               "metadata": {"name": "one-gpu"},
               "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}}}),
    )
    .await;
}

/// A pod that asks the scheduler for one GPU of `node`.
fn gpu_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "train"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "main", "image": "registry.invalid/workload:1",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        }
    }))
    .unwrap()
}

/// The device the scheduler allocated to a pod's claim, once it has.
async fn device_of(client: &Client, ns: &str, pod: &str) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let p = pods.get(pod).await.ok()?;
    let claim = p
        .status?
        .resource_claim_statuses?
        .into_iter()
        .next()?
        .resource_claim_name?;
    let claims: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &resource("ResourceClaim", "resourceclaims"));
    let c = claims.get(&claim).await.ok()?;
    c.data["status"]["allocation"]["devices"]["results"][0]["device"]
        .as_str()
        .map(str::to_string)
}

/// Every pod of `ns` with its phase and device, and every claim with its allocation and users.
async fn placements(client: &Client, ns: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut out = Vec::new();
    for p in pods.list(&ListParams::default()).await.unwrap().items {
        let name = p.name_any();
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        let deleting = p.metadata.deletion_timestamp.is_some();
        let device = device_of(client, ns, &name).await;
        out.push(format!("pod {name} {phase:?} deleting={deleting} {device:?}"));
    }
    let claims: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &resource("ResourceClaim", "resourceclaims"));
    for c in claims.list(&ListParams::default()).await.unwrap().items {
        out.push(format!(
            "claim {} device={} reservedFor={} deleting={}",
            c.name_any(),
            c.data["status"]["allocation"]["devices"]["results"][0]["device"],
            c.data["status"]["reservedFor"],
            c.metadata.deletion_timestamp.is_some()
        ));
    }
    out.join("\n")
}

async fn running(client: &Client, ns: &str, pod: &str) -> bool {
    gpunode_e2e::pods::is_running(&Api::namespaced(client.clone(), ns), pod).await
}

/// gpunode's DeviceTaintRules for `node`.
async fn our_rules(client: &Client, node: &str) -> Vec<DynamicObject> {
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource("DeviceTaintRule", "devicetaintrules"));
    api.list(&ListParams::default().labels(&format!(
        "app.kubernetes.io/managed-by=gpunode,gpunode.dev/node={node}"
    )))
    .await
    .unwrap()
    .items
}

use gpunode_e2e::nodes::label;

#[tokio::test]
async fn an_xid_on_gpu_5_quarantines_that_gpu_alone_and_recovery_gives_it_back() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let id = format!("{:06x}", rand_suffix());
    let node = format!("quar-{id}");
    nodes::create_one(&client, &node).await.unwrap();
    let ns = Scratch::new(&client, "quarantine").await.unwrap();
    let class = format!("gpu-{id}");
    publish_devices(&client, &node, &class, &ns.name).await;
    // Someone else's rule on another device of the node: gpunode must leave it alone.
    let rules: Api<DynamicObject> =
        Api::all_with(client.clone(), &resource("DeviceTaintRule", "devicetaintrules"));
    let foreign = format!("foreign-{id}");
    create(
        &client,
        &resource("DeviceTaintRule", "devicetaintrules"),
        None,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": foreign},
               "spec": {"deviceSelector": {"driver": DRIVER, "pool": node, "device": "gpu-7"},
                        "taint": {"key": "example.com/maintenance", "value": "planned", "effect": "None"}}}),
    )
    .await;

    // One pod per GPU, placed by the scheduler.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let names: Vec<String> = (0..GPUS).map(|i| format!("job-{i}")).collect();
    for n in &names {
        pods.create(&PostParams::default(), &gpu_pod(n, &node))
            .await
            .unwrap();
    }
    let on_gpu_5 = wait::until("every pod Running with its GPU", DEADLINE, || async {
        let mut holder = None;
        for n in &names {
            let Some(device) = device_of(&client, &ns.name, n).await else {
                return Ok(None);
            };
            if !running(&client, &ns.name, n).await {
                return Ok(None);
            }
            if device == "gpu-5" {
                holder = Some(n.clone());
            }
        }
        Ok(holder)
    })
    .await
    .unwrap();

    publish_report(&client, &node, None).await;
    crds::create_policy(
        &client,
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {},
            "remediation": [
                {"classes": ["Xid"], "action": "TaintDevice", "effect": "NoExecute"},
                {"classes": ["Xid"], "action": "Drain"},
            ],
            "recovery": {"healthyFor": "5s"},
        }),
    )
    .await
    .unwrap();
    let node_api: Api<Node> = Api::all(client.clone());
    let first = InProcess::start(&operator_client, "e2e-quarantine");
    nodes::until_labelled(
        &client,
        &node,
        &[
            ("gpunode.dev/state", "compliant"),
            ("gpunode.dev/healthy-gpus", "8"),
        ],
        DEADLINE,
    )
    .await
    .unwrap();

    // GPU 5 falls off the bus.
    publish_report(&client, &node, Some(5)).await;
    let rule = wait::until("one DeviceTaintRule for gpu-5", DEADLINE, || async {
        let mut ours = our_rules(&client, &node).await;
        Ok((ours.len() == 1).then(|| ours.remove(0)))
    })
    .await
    .unwrap();
    assert_eq!(rule.data["spec"]["deviceSelector"]["device"], "gpu-5");
    assert_eq!(rule.data["spec"]["deviceSelector"]["pool"], node.as_str());
    assert_eq!(rule.data["spec"]["taint"]["effect"], "NoExecute");
    assert_eq!(
        rule.owner_references().first().map(|o| o.kind.as_str()),
        Some("GpuNodePolicy"),
        "owned by the policy"
    );
    // The controller-manager evicts exactly the pod on gpu-5; the other seven keep running.
    wait::until(&format!("{on_gpu_5} (on gpu-5) evicted"), DEADLINE, || async {
        Ok((!running(&client, &ns.name, &on_gpu_5).await).then_some(()))
    })
    .await
    .unwrap();
    for n in names.iter().filter(|n| **n != on_gpu_5) {
        assert!(running(&client, &ns.name, n).await, "{n} kept running");
    }
    let n = node_api.get(&node).await.unwrap();
    assert_ne!(
        n.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "the node stays schedulable: its Drain rule does not act on one GPU"
    );
    assert_eq!(label(&n, "gpunode.dev/healthy-gpus").as_deref(), Some("7"));
    let policies: Api<GpuNodePolicy> = Api::all(client.clone());
    wait::until("the policy counts one quarantined GPU", DEADLINE, || async {
        let p = policies.get(&node).await?;
        Ok((p.status.map(|s| s.quarantined_gpus) == Some(1)).then_some(()))
    })
    .await
    .unwrap();

    // A new pod can only get gpu-5, which is tainted: it stays unscheduled.
    pods.delete(&on_gpu_5, &DeleteParams::default().grace_period(0))
        .await
        .ok();
    pods.create(&PostParams::default(), &gpu_pod("late", &node))
        .await
        .unwrap();
    // The operator is killed and replaced while the quarantine holds.
    first.kill().await;
    let second = InProcess::start(&operator_client, "e2e-quarantine");
    // A healthy GPU frees up: the new pod takes it, never gpu-5.
    let freed = names.iter().find(|n| **n != on_gpu_5).cloned().unwrap();
    let freed_device = device_of(&client, &ns.name, &freed).await.unwrap();
    wait::until(
        "the new pod found no GPU it may use (only gpu-5 is free)",
        DEADLINE,
        || async {
            let p = pods.get("late").await?;
            let unschedulable = p
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "False");
            Ok(unschedulable.then_some(()))
        },
    )
    .await
    .unwrap();
    assert_eq!(device_of(&client, &ns.name, "late").await, None);
    pods.delete(&freed, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let late_device = wait::until("the new pod placed", DEADLINE, || async {
        Ok(device_of(&client, &ns.name, "late").await)
    })
    .await
    .unwrap();
    assert_eq!(
        late_device, freed_device,
        "the new pod got the freed GPU, not gpu-5"
    );
    let ours = our_rules(&client, &node).await;
    assert_eq!(ours.len(), 1, "no duplicate after the restart");
    assert_eq!(ours[0].uid(), rule.uid(), "the same rule, not a new one");

    // Recovery: the rule goes after healthyFor, and gpu-5 can be allocated again.
    let healed = std::time::Instant::now();
    publish_report(&client, &node, None).await;
    wait::until("the DeviceTaintRule removed", DEADLINE, || async {
        Ok(our_rules(&client, &node).await.is_empty().then_some(()))
    })
    .await
    .unwrap();
    assert!(
        healed.elapsed() >= Duration::from_secs(5),
        "removed {:?} after recovery, before healthyFor",
        healed.elapsed()
    );
    pods.create(&PostParams::default(), &gpu_pod("after", &node))
        .await
        .unwrap();
    let after = wait::until("a pod placed on gpu-5 again", DEADLINE, || async {
        Ok(device_of(&client, &ns.name, "after").await)
    })
    .await
    .unwrap();
    assert_eq!(
        after,
        "gpu-5",
        "placements: {}",
        placements(&client, &ns.name).await
    );
    wait::until("8 healthy GPUs again", DEADLINE, || async {
        let n = node_api.get(&node).await?;
        Ok((label(&n, "gpunode.dev/healthy-gpus").as_deref() == Some("8")).then_some(()))
    })
    .await
    .unwrap();
    let still = rules.get(&foreign).await.unwrap();
    assert_eq!(
        still.data["spec"]["taint"]["key"], "example.com/maintenance",
        "the foreign rule is untouched"
    );

    second.stop().await.unwrap();
    policies.delete(&node, &DeleteParams::default()).await.unwrap();
    rules.delete(&foreign, &DeleteParams::default()).await.unwrap();
    ns.delete().await.unwrap();
}
