//! The empirical floor (`gpunode-bench floor`): a minimal controller that taints a node while its
//! report shows a thermally throttled GPU and untaints it after, nothing else. It runs as its own
//! process with gpunode's client (`gpunode_operator::client::build`), ServiceAccount and write
//! concurrency, keeps two caches (Nodes, reports) and writes one merge patch per change: what any
//! controller must spend between a report and a taint on this API server. The benchmark measures
//! it in the same run as gpunode, with the same faults, and quotes gpunode as a ratio to it.

use std::{net::SocketAddr, path::Path};

use futures::StreamExt;
use gpunode_crds::GpuNodeReport;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{
    Api,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt, reflector, reflector::ObjectRef, watcher},
};
use serde_json::json;

use crate::{
    error::Error,
    loadgen::THROTTLE,
    tracker::{NODE_SELECTOR, TAINT_KEY},
};

/// Writes in flight at once: gpunode's default `--apply-concurrency`.
const CONCURRENCY: usize = 32;

/// Whether the floor wants `report`'s node tainted.
fn wants_taint(report: &GpuNodeReport) -> bool {
    report
        .status
        .as_ref()
        .is_some_and(|s| s.gpus.iter().any(|g| g.throttle_reasons.contains(&THROTTLE)))
}

/// `taints` with the floor's taint on (`on`) or off; None when that is what they are already.
fn retainted(taints: &[Taint], on: bool) -> Option<Vec<Taint>> {
    let has = taints.iter().any(|t| t.key == TAINT_KEY);
    if has == on {
        return None;
    }
    let mut out: Vec<Taint> = taints.iter().filter(|t| t.key != TAINT_KEY).cloned().collect();
    if on {
        out.push(Taint {
            key: TAINT_KEY.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        });
    }
    Some(out)
}

/// Runs until killed: answers `GET /readyz` on `ready` once both caches are listed.
pub async fn run(kubeconfig: &Path, ready: SocketAddr) -> Result<(), Error> {
    let (config, _) = crate::run::config(kubeconfig).await?;
    let client = gpunode_operator::client::build(config)?;
    let nodes: Api<Node> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let node_events = watcher(nodes.clone(), watcher::Config::default().labels(NODE_SELECTOR))
        .default_backoff()
        .reflect(writer)
        .for_each(|_| async {});
    tokio::spawn(node_events);
    store
        .wait_until_ready()
        .await
        .map_err(|e| Error::Other(format!("the node cache: {e}")))?;
    let listener = tokio::net::TcpListener::bind(ready)
        .await
        .map_err(Error::io(format!("binding {ready}")))?;
    let app = axum::Router::new().route("/readyz", axum::routing::get(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    let reports: Api<GpuNodeReport> = Api::all(client);
    watcher(reports, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .for_each_concurrent(CONCURRENCY, |event| {
            let (nodes, store) = (&nodes, &store);
            async move {
                let Ok(report) = event else { return };
                let name = report.spec.node_name.clone();
                let Some(node) = store.get(&ObjectRef::new(&name)) else {
                    return;
                };
                let taints = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default();
                let Some(taints) = retainted(&taints, wants_taint(&report)) else {
                    return;
                };
                let patch = json!({"spec": {"taints": taints}});
                if let Err(e) = nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!(node = %name, error = %e, "taint write failed");
                }
            }
        })
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }
    }

    #[test]
    fn the_floor_adds_and_removes_only_its_own_taint() {
        let other = taint("example.com/other");
        let on = retainted(std::slice::from_ref(&other), true).unwrap_or_default();
        assert_eq!(on, vec![other.clone(), taint(TAINT_KEY)]);
        assert_eq!(retainted(&on, true), None);
        assert_eq!(retainted(&on, false), Some(vec![other.clone()]));
        assert_eq!(retainted(&[other], false), None);
    }
}
