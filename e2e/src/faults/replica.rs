//! The operator as the reliability suite runs it: [`Operator`], one replica of
//! `gpunode-operator run --leader-elect` as a real process ([`crate::operator::Process`], so
//! SIGKILL and SIGSTOP are real), each replica with its own ServiceAccount, so the audit log says
//! who wrote what; [`Launch`] for a replica in a network namespace, with a skewed clock or through
//! a proxy; [`lease`], who holds the Lease.

use std::time::Duration;

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Namespace, Pod, ServiceAccount},
    rbac::v1::ClusterRoleBinding,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{cluster::FaultCluster, io};
use crate::{
    Error, accounts, chart,
    operator::{self, Process, Spec},
    wait,
};

/// Puts replica `identity` behind the chart's leader fence: a stand-in pod of its ServiceAccount
/// named after it (never scheduled: it selects no node, so no drain of a wave can evict it and
/// void the token bound to it), and the chart's fence policy rendered for that ServiceAccount,
/// with the namespace's Lease as its parameter, and with values that grant every kind the
/// replica writes (the fence matches exactly what the values grant). Returns the pod to bind the
/// token to.
async fn fence(admin: &Client, identity: &str, namespace: &str) -> Result<Pod, Error> {
    let pp = PatchParams::apply("gpunode-rel").force();
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": identity, "namespace": namespace},
        "spec": {"serviceAccountName": identity, "automountServiceAccountToken": false,
            "nodeSelector": {"gpunode.dev/never": "true"},
            "containers": [{"name": "operator", "image": "gpunode/operator"}]}});
    let pod = Api::<Pod>::namespaced(admin.clone(), namespace)
        .patch(identity, &pp, &Patch::Apply(&pod))
        .await?;
    let sa = format!("operator.serviceAccount.name={identity}");
    // The fence matches what the chart's values grant the operator; the replica (cluster-admin
    // here) writes the remediator's objects and validation Jobs too, so the values grant those.
    let remediators = format!(
        r#"operator.remediators=[{{"apiGroup":"{}","resources":["fakereboots"],"templates":["fakereboottemplates"]}}]"#,
        crate::remediator::GROUP
    );
    let validation = format!("operator.validation.namespaces={{{namespace}}}");
    let objects = chart::template(
        admin,
        identity,
        namespace,
        &[
            "--show-only",
            "templates/leader-fence.yaml",
            "--set",
            &sa,
            "--set-json",
            &remediators,
            "--set",
            &validation,
        ],
    )
    .await?;
    if objects.len() != 2 {
        return Err(Error::Unexpected(format!(
            "the chart rendered {} fence objects, not a policy and its binding",
            objects.len()
        )));
    }
    chart::apply(admin, &objects, namespace, false).await?;
    Ok(pod)
}

/// One replica of `gpunode-operator run --leader-elect`, as a process ([`Process`], which it
/// derefs to: kill, pause, resume, terminate, restart, /metrics) with its own ServiceAccount.
pub struct Operator {
    /// Holder identity and ServiceAccount name.
    pub identity: String,
    /// Namespace of the Lease and the ServiceAccount.
    pub namespace: String,
    /// Its ServiceAccount token (bound to its stand-in pod behind the fence).
    token: String,
    process: Process,
}

/// How a replica's process is started, beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Command the operator runs under, e.g. `ip netns exec NS` (a network namespace).
    pub prefix: Vec<String>,
    /// Extra environment, e.g. libfaketime's (a skewed clock).
    pub env: Vec<(String, String)>,
    /// The API server address the replica uses instead of the admin kubeconfig's, with the name
    /// its certificate is checked against (`tls-server-name`).
    pub server: Option<(String, String)>,
    /// Address /metrics listens on (default 127.0.0.1), e.g. the namespace's end of a veth link.
    pub metrics_ip: Option<String>,
    /// Run behind the chart's leader fence (templates/leader-fence.yaml): the replica's token is
    /// bound to a stand-in pod named after it, and the chart's fence policy, rendered for its
    /// ServiceAccount, refuses its writes whenever the namespace's Lease names another holder.
    pub fence: bool,
    /// The operator binary to run instead of this build's (an earlier commit's: a rolling
    /// upgrade).
    pub bin: Option<std::path::PathBuf>,
}

impl Operator {
    /// Creates ServiceAccount `identity` in `namespace` (cluster-admin: RBAC is tested elsewhere,
    /// here each replica only needs its own name in the audit log) and starts the replica.
    pub async fn start(
        fc: &FaultCluster,
        admin: &Client,
        identity: &str,
        namespace: &str,
    ) -> Result<Operator, Error> {
        Operator::start_with(fc, admin, identity, namespace, Launch::default()).await
    }

    /// [`Operator::start`], started as `launch` says.
    pub async fn start_with(
        fc: &FaultCluster,
        admin: &Client,
        identity: &str,
        namespace: &str,
        launch: Launch,
    ) -> Result<Operator, Error> {
        let pp = PatchParams::apply("gpunode-rel").force();
        Api::<Namespace>::all(admin.clone())
            .patch(
                namespace,
                &pp,
                &Patch::Apply(
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
                ),
            )
            .await?;
        Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
            .patch(
                identity,
                &pp,
                &Patch::Apply(
                    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": identity}}),
                ),
            )
            .await?;
        let binding = format!("rel-{namespace}-{identity}");
        Api::<ClusterRoleBinding>::all(admin.clone())
            .patch(
                &binding,
                &pp,
                &Patch::Apply(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": binding},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": identity, "namespace": namespace}],
                })),
            )
            .await?;
        let pod = if launch.fence {
            Some(fence(admin, identity, namespace).await?)
        } else {
            None
        };
        let token = accounts::token(admin, namespace, identity, pod.as_ref()).await?;
        let admin_yaml = std::fs::read_to_string(&fc.kubeconfig).map_err(io(fc.kubeconfig.display()))?;
        let admin_kc: serde_json::Value = serde_yaml::from_str(&admin_yaml)?;
        let mut cluster = admin_kc
            .pointer("/clusters/0/cluster")
            .cloned()
            .ok_or_else(|| Error::Kubeconfig("admin kubeconfig has no cluster".into()))?;
        if let Some((server, tls_name)) = &launch.server {
            cluster["server"] = json!(server);
            cluster["tls-server-name"] = json!(tls_name);
        }
        let kc = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "rel", "cluster": cluster}],
            "users": [{"name": identity, "user": {"token": &token}}],
            "contexts": [{"name": "rel", "context": {"cluster": "rel", "user": identity}}],
            "current-context": "rel",
        });
        let kubeconfig = fc.dir.join(format!("op-{namespace}-{identity}.kubeconfig"));
        std::fs::write(&kubeconfig, serde_yaml::to_string(&kc)?).map_err(io(kubeconfig.display()))?;
        let ip = launch.metrics_ip.as_deref().unwrap_or("127.0.0.1");
        let metrics_addr = format!("{ip}:{}", crate::http::free_addr()?.port())
            .parse()
            .map_err(|e| Error::Unexpected(format!("metrics address {ip}: {e}")))?;
        let bin = match launch.bin {
            Some(bin) => bin,
            None => operator::binary()?,
        };
        let spec = Spec {
            bin,
            instance: identity.to_string(),
            kubeconfig,
            lease_namespace: Some(namespace.to_string()),
            metrics_addr,
            // The watcher's debug lines name a 410 Gone when a resumed watch expired.
            // `GPUNODE_REL_OPERATOR_LOG` replaces the filter when a run is debugged.
            rust_log: Some(
                std::env::var("GPUNODE_REL_OPERATOR_LOG")
                    .unwrap_or_else(|_| "info,kube=warn,kube_runtime::watcher=debug".into()),
            ),
            prefix: launch.prefix,
            env: launch.env,
        };
        let log = fc.dir.join(format!("logs/op-{namespace}-{identity}.log"));
        Ok(Operator {
            identity: identity.to_string(),
            namespace: namespace.to_string(),
            token,
            process: Process::start(spec, log)?,
        })
    }

    /// A client with this replica's own token, reaching the API server the admin way (from this
    /// test process, whatever network the replica is in): the requests the replica could still
    /// send.
    pub async fn client_as(&self, fc: &FaultCluster) -> Result<Client, Error> {
        let mut config = fc.config().await?;
        config.auth_info = kube::config::AuthInfo {
            token: Some(self.token.clone().into()),
            ..kube::config::AuthInfo::default()
        };
        Ok(Client::try_from(config)?)
    }

    /// The audit log's name for this replica.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.identity)
    }

    /// Waits until the Lease of its namespace names this replica (needs no access to its /metrics).
    pub async fn wait_holding(&self, admin: &Client, timeout: Duration) -> Result<jiff::Timestamp, Error> {
        wait::until(
            &format!("{} to hold the Lease", self.identity),
            timeout,
            || async {
                Ok(lease(admin, &self.namespace)
                    .await
                    .filter(|(h, _)| *h == self.identity)
                    .map(|(_, at)| at))
            },
        )
        .await
    }
}

impl std::ops::Deref for Operator {
    type Target = Process;

    fn deref(&self) -> &Process {
        &self.process
    }
}

impl std::ops::DerefMut for Operator {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.process
    }
}

/// The holder of the operator's Lease in `namespace` and when it acquired it.
pub async fn lease(client: &Client, namespace: &str) -> Option<(String, jiff::Timestamp)> {
    let l = Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(gpunode_operator::leader::DEFAULT_LEASE_NAME)
        .await
        .ok()??;
    let spec = l.spec?;
    Some((spec.holder_identity?, spec.acquire_time?.0))
}
