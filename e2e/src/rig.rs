//! One fake GPU node under a policy of its own, its probe host (fake NVML, fixture sysfs, the
//! chart's ServiceAccount) and the in-process operator: the stage of the tests that follow a
//! finding of the real probe through the operator's reaction (a fatal XID or a flapping port
//! across probe restarts and reboots).

use std::time::{Duration, Instant};

use gpunode_crds::{GpuNodePolicy, GpuNodeReport};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client, api::DeleteParams};
use serde_json::Value;

use crate::{
    Error, chart, cluster, crds, nodes, operator::InProcess, probe::Host, scratch::rand_suffix, wait,
};

/// The stage; [`Rig::finish`] takes it down.
pub struct Rig {
    /// The admin client.
    pub client: Client,
    /// The node's name, also the policy's.
    pub node: String,
    /// The node's probe host.
    pub host: Host,
    /// Nodes, through the admin client.
    pub nodes: Api<Node>,
    /// Reports, through the admin client.
    pub reports: Api<GpuNodeReport>,
    operator: InProcess,
}

/// The node's `gpunode.dev/state` label.
pub fn state(n: &Node) -> Option<String> {
    nodes::label(n, "gpunode.dev/state")
}

impl Rig {
    /// Node `<prefix>-<random>` with a probe host (its sysfs a copy of fixture tree `tree`, when
    /// given, for a test that edits it), policy `spec(node)` and the operator (instance
    /// `e2e-<prefix>`). Logs go to the test's output (`RUST_LOG`).
    pub async fn start(
        prefix: &str,
        tree: Option<&str>,
        spec: impl FnOnce(&str) -> Value,
    ) -> Result<Rig, Error> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let client = cluster::admin_client().await?;
        crds::install(&client).await?;
        let node = format!("{prefix}-{:06x}", rand_suffix());
        nodes::create(
            &client,
            std::slice::from_ref(&node),
            &nodes::GpuNodeShape::default(),
        )
        .await?;
        let mut host = Host::prepare(&client, &node).await?;
        if let Some(tree) = tree {
            host = host.with_tree_copy(tree)?;
        }
        crds::create_policy(&client, &node, spec(&node)).await?;
        let operator = InProcess::start(&chart::operator_client(&client).await?, &format!("e2e-{prefix}"));
        Ok(Rig {
            nodes: Api::all(client.clone()),
            reports: Api::all(client.clone()),
            client,
            node,
            host,
            operator,
        })
    }

    /// The node, once its state is `state` and its cordon `cordoned`.
    pub async fn until(
        &self,
        what: &str,
        state_is: &str,
        cordoned: bool,
        timeout: Duration,
    ) -> Result<Node, Error> {
        wait::until(what, timeout, || async {
            let n = self.nodes.get(&self.node).await?;
            Ok((state(&n).as_deref() == Some(state_is) && nodes::cordoned(&n) == cordoned).then_some(n))
        })
        .await
    }

    /// Watches the node stay drifted and cordoned until `length` has passed since `since`; an
    /// error names when and how it left that state.
    pub async fn stays_cordoned(&self, since: Instant, length: Duration) -> Result<(), Error> {
        let held = wait::until(
            "the node drifted and cordoned throughout",
            length + Duration::from_secs(60),
            || async {
                let n = self.nodes.get(&self.node).await?;
                if !nodes::cordoned(&n) || state(&n).as_deref() != Some("drifted") {
                    return Ok(Some(Err(format!(
                        "{:?} after the start, the node is {:?}, cordoned: {}",
                        since.elapsed(),
                        state(&n),
                        nodes::cordoned(&n)
                    ))));
                }
                Ok((since.elapsed() >= length).then_some(Ok(())))
            },
        )
        .await?;
        held.map_err(Error::Unexpected)
    }

    /// Stops the operator, deletes the policy and the host's objects.
    pub async fn finish(self) -> Result<(), Error> {
        self.operator.stop().await?;
        let policies: Api<GpuNodePolicy> = Api::all(self.client.clone());
        let _ = policies.delete(&self.node, &DeleteParams::default()).await;
        self.host.cleanup(&self.client).await;
        Ok(())
    }
}
