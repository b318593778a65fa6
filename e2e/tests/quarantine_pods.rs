//! Per-GPU quarantine on a device-plugin node (no ResourceSlice names it), on the real API server:
//! a real probe process reads the fake NVML library and a fake kubelet's PodResources API on a
//! unix socket, and reports which pods hold which GPU. A fatal XID on GPU 5 makes the operator
//! evict exactly the pod holding GPU 5 through the Eviction API; the pod on GPU 0 and a pod
//! without a GPU keep running, the node stays schedulable, and its `gpunode.dev/unhealthy-gpus`
//! annotation names GPU 5's UUID. (A separate test binary: one operator per process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use gpunode_crds::GpuNodeReport;
use gpunode_e2e::nodes::label;
use gpunode_e2e::{
    chart, cluster::admin_client, crds, nodes, operator::InProcess, pods, probe::Host, scratch::Scratch,
    scratch::rand_suffix, wait,
};
use gpunode_podresources::{
    ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources, fake::spawn,
};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    events::v1::Event,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

/// What the kubelet says `pod` (in `ns`) holds: the GPUs with these device-plugin ids.
fn holding(ns: &str, pod: &str, ids: &[String]) -> PodResources {
    PodResources {
        name: pod.to_string(),
        namespace: ns.to_string(),
        containers: vec![ContainerResources {
            name: "main".into(),
            devices: vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: ids.to_vec(),
            }],
        }],
    }
}

fn annotation(n: &Node, key: &str) -> Option<String> {
    n.metadata.annotations.as_ref().and_then(|a| a.get(key).cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_on_gpu_5_evicts_only_the_pod_holding_gpu_5() {
    let client = admin_client().await.unwrap();
    crds::install(&client).await.unwrap();
    let operator_client = chart::operator_client(&client).await.unwrap();
    let id = format!("{:06x}", rand_suffix());
    let node = format!("qdp-{id}");
    nodes::create_one(&client, &node).await.unwrap();
    let ns = Scratch::new(&client, "quarantine-pods").await.unwrap();
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for (name, app) in [("job-5", "job-5"), ("job-0", "job-0"), ("no-gpu", "web")] {
        pod_api
            .create(
                &PostParams::default(),
                &pods::on_node(name, &node, json!({"app": app})).unwrap(),
            )
            .await
            .unwrap();
    }
    for name in ["job-5", "job-0", "no-gpu"] {
        pods::running(&pod_api, name, DEADLINE).await.unwrap();
    }

    // The node's files, and a fake kubelet whose answer is what the device plugin allocated: GPU
    // 5 to job-5 (by UUID, the plugin's default), GPU 0 to job-0.
    let host = Host::prepare(&client, &node).await.unwrap();
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(host.fixture()).unwrap()).unwrap();
    let uuid = |i: usize| fixture["devices"][i]["uuid"].as_str().unwrap().to_string();
    let answer = Arc::new(Mutex::new(ListPodResourcesResponse {
        pod_resources: vec![
            holding(&ns.name, "job-5", &[uuid(5)]),
            holding(&ns.name, "job-0", &[uuid(0)]),
        ],
    }));
    let socket = host.dir.join("kubelet.sock");
    let kubelet = {
        let answer = answer.clone();
        spawn(
            &socket,
            Arc::new(move || answer.lock().map(|a| a.clone()).map_err(|e| e.to_string())),
        )
        .unwrap()
    };
    let probe = host
        .start_probe_with(
            "boot-1",
            &[std::ffi::OsStr::new("--pod-resources-socket"), socket.as_os_str()],
        )
        .unwrap();
    let reports: Api<GpuNodeReport> = Api::all(client.clone());
    let pods_of = |r: &GpuNodeReport, i: u32| -> Option<Vec<String>> {
        let g = r.status.as_ref()?.gpus.iter().find(|g| g.index == i)?;
        g.pods
            .as_ref()
            .map(|p| p.iter().map(|p| p.name.clone()).collect())
    };
    wait::until("the report says which pod holds GPU 5", DEADLINE, || async {
        let Some(r) = reports.get_opt(&node).await? else {
            return Ok(None);
        };
        Ok((pods_of(&r, 5) == Some(vec!["job-5".to_string()])
            && pods_of(&r, 0) == Some(vec!["job-0".to_string()])
            && pods_of(&r, 3) == Some(vec![]))
        .then_some(()))
    })
    .await
    .unwrap();

    crds::create_policy(
        &client,
        &node,
        json!({
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
            "gpu": {"fatalXids": [79]},
            "remediation": [
                {"classes": ["Xid"], "action": "TaintDevice", "effect": "NoExecute"},
                {"classes": ["Xid"], "action": "Drain"},
            ],
        }),
    )
    .await
    .unwrap();
    let operator = InProcess::start(&operator_client, "e2e-quarantine-pods");
    let node_api: Api<Node> = Api::all(client.clone());
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

    // GPU 5 falls off the bus, under the running probe.
    host.inject_xid(5, 79).unwrap();
    wait::until("job-5 (holding GPU 5) evicted", DEADLINE, || async {
        Ok((!pods::is_running(&pod_api, "job-5").await).then_some(()))
    })
    .await
    .unwrap();
    let n = wait::until("GPU 5 quarantined on the node", DEADLINE, || async {
        let n = node_api.get(&node).await?;
        Ok(
            (annotation(&n, "gpunode.dev/unhealthy-gpus").as_deref() == Some(uuid(5).as_str())
                && label(&n, "gpunode.dev/healthy-gpus").as_deref() == Some("7"))
            .then_some(n),
        )
    })
    .await
    .unwrap();
    assert_ne!(
        n.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "the node stays schedulable: its Drain rule does not act on one GPU"
    );
    assert!(
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_none_or(|t| !t.iter().any(|t| t.key.starts_with("gpunode.dev/"))),
        "no node taint"
    );
    assert!(
        pods::is_running(&pod_api, "job-0").await,
        "the pod on GPU 0 keeps running"
    );
    assert!(
        pods::is_running(&pod_api, "no-gpu").await,
        "the pod without a GPU keeps running"
    );

    // The event names the GPU and the pod evicted for it.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let want = format!("; evicting the pods holding it: {}/job-5", ns.name);
    wait::until("the GpuQuarantined event naming the pod", DEADLINE, || async {
        let list = events.list(&ListParams::default()).await?;
        Ok(list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str()))
            .filter(|e| e.reason.as_deref() == Some("GpuQuarantined"))
            .find_map(|e| {
                e.note
                    .filter(|n| n.starts_with("quarantined gpu 5 (GPU-") && n.ends_with(&want))
            }))
    })
    .await
    .unwrap();

    // The kubelet forgets the evicted pod; a pod started meanwhile on GPU 3 is never touched.
    pod_api
        .create(
            &PostParams::default(),
            &pods::on_node("job-3", &node, json!({"app": "job-3"})).unwrap(),
        )
        .await
        .unwrap();
    pods::running(&pod_api, "job-3", DEADLINE).await.unwrap();
    {
        let mut a = answer.lock().unwrap();
        a.pod_resources.retain(|p| p.name != "job-5");
        a.pod_resources.push(holding(&ns.name, "job-3", &[uuid(3)]));
    }
    wait::until(
        "the report shows GPU 5 free and job-3 on GPU 3",
        DEADLINE,
        || async {
            let r = reports.get(&node).await?;
            Ok(
                (pods_of(&r, 5) == Some(vec![]) && pods_of(&r, 3) == Some(vec!["job-3".to_string()]))
                    .then_some(()),
            )
        },
    )
    .await
    .unwrap();
    // The quarantine holds (XID 79 stays for this boot) and evicts nothing more.
    let n = node_api.get(&node).await.unwrap();
    assert_eq!(
        annotation(&n, "gpunode.dev/unhealthy-gpus").as_deref(),
        Some(uuid(5).as_str())
    );
    for name in ["job-0", "job-3", "no-gpu"] {
        assert!(pods::is_running(&pod_api, name).await, "{name} keeps running");
    }

    operator.stop().await.unwrap();
    let _ = probe.kill();
    kubelet.stop().await.unwrap();
    let policies: Api<gpunode_crds::GpuNodePolicy> = Api::all(client.clone());
    policies.delete(&node, &DeleteParams::default()).await.unwrap();
    host.cleanup(&client).await;
    ns.delete().await.unwrap();
}
