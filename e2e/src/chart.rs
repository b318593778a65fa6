//! The chart's ServiceAccounts, RBAC and admission policy in the test cluster, and clients that
//! act as those accounts, so every e2e test exercises exactly the permissions the chart grants.
//!
//! [`install_accounts`] renders `charts/gpunode` with the real helm binary (only the account,
//! RBAC and admission-policy templates) into `gpunode-system` and applies it server-side. It is
//! idempotent and safe to call from every test of every test binary at once, and returns only
//! once the API server enforces the admission policy.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use gpunode_crds::{GpuNodeReport, GpuResetRequest, heartbeat::LEASE_PREFIX};
use k8s_openapi::api::{
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    coordination::v1::Lease,
    core::v1::{Namespace, Pod},
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    config::{AuthInfo, Kubeconfig, NamedAuthInfo},
    discovery::{self, Scope},
};
use serde_json::json;

use crate::{Error, accounts, cluster, crds, fixtures::repo_root, tools, wait};

/// Namespace the chart is meant for, and where the test accounts live.
pub const NAMESPACE: &str = "gpunode-system";
/// Release name the accounts are rendered with (fixes the object names below).
pub const RELEASE: &str = "gpunode";
/// The operator's ServiceAccount.
pub const OPERATOR_SA: &str = "gpunode-operator";
/// The node-probe's ServiceAccount.
pub const PROBE_SA: &str = "gpunode-node-probe";
/// Field manager of everything the harness applies.
pub const FIELD_MANAGER: &str = "gpunode-e2e";
/// The chart's templates that make up the accounts: ServiceAccounts, RBAC, admission policy.
pub const ACCOUNT_TEMPLATES: [&str; 4] = [
    "templates/serviceaccounts.yaml",
    "templates/rbac-operator.yaml",
    "templates/rbac-node-probe.yaml",
    "templates/admission-policy.yaml",
];

/// Release the GPU-reset probe accounts are rendered with ([`install_reset_accounts`]): the
/// chart's probe pieces with `nodeProbe.gpuReset.enabled=true`, beside the default release, so
/// the default probe account keeps exactly the default permissions.
pub const RESET_RELEASE: &str = "gpunode-reset";
/// The probe's ServiceAccount in that release (it follows the resets, read-only).
pub const RESET_PROBE_SA: &str = "gpunode-reset-node-probe";
/// The reset DaemonSet's ServiceAccount in that release (it answers the resets).
pub const RESET_SA: &str = "gpunode-reset-gpu-reset";
/// Part of the reset admission policy's message for a write to another node's request.
pub const RESET_OTHER_NODE_MESSAGE: &str = "may write only its own node's GpuResetRequests";

/// Part of the admission policy's message for a write to another node's report.
pub const OTHER_NODE_MESSAGE: &str = "may write only its own node's GpuNodeReport, not the one of node";
/// Part of the admission policy's message for a token without a node-name claim.
pub const NO_NODE_MESSAGE: &str = "its token carries no node";
/// Part of the Lease admission policy's message for a token without a node-name claim.
pub const LEASE_NO_NODE_MESSAGE: &str = "heartbeat Lease, but its token carries no node";
/// Part of the Lease admission policy's message for a write to another Lease; followed by the
/// caller's node, `, not Lease ` and the Lease written.
pub const LEASE_OTHER_NODE_MESSAGE: &str = "may write only its own node's heartbeat Lease gpunode-probe-";
/// Part of the Lease admission policy's message for its own Lease held as another node;
/// followed by the holder in quotes.
pub const LEASE_HOLDER_MESSAGE: &str = "only as its own node, not with holderIdentity";

const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The chart's accounts as installed by [`install_accounts`].
#[derive(Debug, Clone)]
pub struct Accounts {
    /// Their namespace.
    pub namespace: String,
    /// The operator's ServiceAccount.
    pub operator: String,
    /// The probe's ServiceAccount.
    pub probe: String,
}

impl Accounts {
    /// `system:serviceaccount:<ns>:<operator>`.
    pub fn operator_user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.operator)
    }

    /// `system:serviceaccount:<ns>:<probe>`.
    pub fn probe_user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.probe)
    }
}

fn accounts() -> Accounts {
    Accounts {
        namespace: NAMESPACE.to_string(),
        operator: OPERATOR_SA.to_string(),
        probe: PROBE_SA.to_string(),
    }
}

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/gpunode")
}

/// The helm binary: `GPUNODE_HELM` if set, else the one `e2e/cluster/build.sh` built.
pub fn helm() -> Result<PathBuf, Error> {
    crate::tools::built("GPUNODE_HELM")
}

/// Runs helm with `args` (blocking) and returns its stdout; a failure carries helm's stderr.
pub fn run_helm(args: &[&str]) -> Result<String, Error> {
    run_helm_env(args, &[])
}

/// Like [`run_helm`], with extra environment variables (e.g. `KUBECONFIG`).
pub fn run_helm_env(args: &[&str], env: &[(&str, &Path)]) -> Result<String, Error> {
    let helm = helm()?;
    let mut cmd = Command::new(&helm);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        // Keep helm's cache and config out of the user's home and away from other runs.
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("gpunode-e2e-helm/cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("gpunode-e2e-helm/config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("gpunode-e2e-helm/data"),
        );
    tools::stdout_of(&mut cmd, &format!("helm {}", args.join(" ")))
}

/// The API server's version (`v1.37.2`), for `helm template --kube-version`.
pub async fn server_version(admin: &Client) -> Result<String, Error> {
    Ok(admin.apiserver_version().await?.git_version)
}

/// Renders the chart offline: `helm template <release> charts/gpunode --namespace <ns>
/// --kube-version <version> <extra...>`.
pub async fn template(
    admin: &Client,
    release: &str,
    namespace: &str,
    extra: &[&str],
) -> Result<Vec<DynamicObject>, Error> {
    let version = server_version(admin).await?;
    let chart = chart_dir().display().to_string();
    let mut args: Vec<String> = [
        "template",
        release,
        &chart,
        "--namespace",
        namespace,
        "--kube-version",
        &version,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let yaml = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run_helm(&refs)
    })
    .await
    .map_err(|e| Error::Unexpected(format!("helm template panicked: {e}")))??;
    parse_manifests(&yaml)
}

/// Every non-empty document of a multi-document YAML stream.
pub fn parse_manifests(yaml: &str) -> Result<Vec<DynamicObject>, Error> {
    use serde::Deserialize;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_json::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        out.push(serde_json::from_value(value)?);
    }
    Ok(out)
}

/// The group, version and kind of a manifest.
pub fn gvk_of(obj: &DynamicObject) -> Result<GroupVersionKind, Error> {
    let types = obj.types.as_ref().ok_or_else(|| {
        Error::Unexpected(format!("manifest {:?} has no apiVersion/kind", obj.metadata.name))
    })?;
    let (group, version) = match types.api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), types.api_version.clone()),
    };
    Ok(GroupVersionKind {
        group,
        version,
        kind: types.kind.clone(),
    })
}

/// An `Api` for `obj`'s kind, namespaced as the API server says the kind is (`default_ns` when
/// a namespaced object names none).
pub async fn api_for(
    client: &Client,
    obj: &DynamicObject,
    default_ns: &str,
) -> Result<Api<DynamicObject>, Error> {
    let gvk = gvk_of(obj)?;
    let (resource, caps) = discovery::pinned_kind(client, &gvk).await?;
    Ok(match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => {
            let ns = obj.metadata.namespace.as_deref().unwrap_or(default_ns);
            Api::namespaced_with(client.clone(), ns, &resource)
        }
    })
}

/// Server-side applies `objects` (forced, field manager [`FIELD_MANAGER`]); `dry_run` asks the
/// API server to validate and admit them without storing anything.
pub async fn apply(
    client: &Client,
    objects: &[DynamicObject],
    default_ns: &str,
    dry_run: bool,
) -> Result<(), Error> {
    let mut pp = PatchParams::apply(FIELD_MANAGER).force();
    pp.dry_run = dry_run;
    for obj in objects {
        let name = obj
            .metadata
            .name
            .clone()
            .ok_or_else(|| Error::Unexpected("a rendered manifest has no name".to_string()))?;
        let api = api_for(client, obj, default_ns).await?;
        api.patch(&name, &pp, &Patch::Apply(obj)).await.map_err(|e| {
            let kind = obj.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("?");
            Error::Unexpected(format!("applying {kind} {name}: {e}"))
        })?;
    }
    Ok(())
}

/// Creates `namespace` if it does not exist (server-side apply, so concurrent callers agree).
pub async fn ensure_namespace(admin: &Client, namespace: &str) -> Result<(), Error> {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace},
    }))?;
    Api::<Namespace>::all(admin.clone())
        .patch(namespace, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&ns))
        .await?;
    Ok(())
}

/// Installs the CRDs and the chart's ServiceAccounts, RBAC and admission policy into
/// `gpunode-system`, and waits until the API server enforces them: the operator's RBAC answers
/// yes, and a probe token without a node is refused by the admission policy. Idempotent; safe
/// to call concurrently from many tests and test binaries (server-side apply of identical
/// objects by one field manager).
pub async fn install_accounts(admin: &Client) -> Result<Accounts, Error> {
    // One installation per test process; later calls (from any test runtime) return at once.
    static DONE: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);
    let mut done = DONE.lock().await;
    if *done {
        return Ok(accounts());
    }
    crds::install(admin).await?;
    ensure_namespace(admin, NAMESPACE).await?;
    let mut extra = Vec::new();
    for t in ACCOUNT_TEMPLATES {
        extra.push("--show-only");
        extra.push(t);
    }
    let objects = template(admin, RELEASE, NAMESPACE, &extra).await?;
    apply(admin, &objects, NAMESPACE, false).await?;
    let acc = accounts();
    wait_rbac(admin, &acc).await?;
    wait_admission_policy(admin).await?;
    *done = true;
    Ok(acc)
}

/// The `operator.remediators` entries granted so far ([`grant_remediators`]): what an
/// in-process operator started after them gets ([`remediator_bounds`]).
static REMEDIATORS: std::sync::Mutex<Vec<serde_json::Value>> = std::sync::Mutex::new(Vec::new());

/// Grants the operator's ServiceAccount the remediation kinds `remediators` (the chart's
/// `operator.remediators` value, as JSON, entries without namespaces): renders the chart's
/// remediator ClusterRole and its binding with that value, applies them, waits until the
/// operator may create `resource` (`group/plural`) in `namespace`, and keeps the entries for
/// [`remediator_bounds`].
pub async fn grant_remediators(
    admin: &Client,
    remediators: &serde_json::Value,
    resource: &str,
    namespace: &str,
) -> Result<(), Error> {
    grant_operator(
        admin,
        &format!("operator.remediators={remediators}"),
        "-remediators",
        NAMESPACE,
        (resource, namespace),
    )
    .await?;
    let mut granted = REMEDIATORS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for r in remediators.as_array().into_iter().flatten() {
        if !granted.contains(r) {
            granted.push(r.clone());
        }
    }
    Ok(())
}

/// Grants the operator's ServiceAccount the remediation kinds of one `operator.remediators`
/// entry limited to one namespace (`entry` lists `namespaces: [namespace]`): renders the chart's
/// Role and RoleBinding for it there, applies them, waits until the operator may create
/// `resource` (`group/plural`) there, and keeps the entry for [`remediator_bounds`].
pub async fn grant_remediators_in(
    admin: &Client,
    entry: &serde_json::Value,
    resource: &str,
    namespace: &str,
) -> Result<(), Error> {
    grant_operator(
        admin,
        &format!("operator.remediators={}", json!([entry])),
        "-remediators-0",
        namespace,
        (resource, namespace),
    )
    .await?;
    let mut granted = REMEDIATORS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !granted.contains(entry) {
        granted.push(entry.clone());
    }
    Ok(())
}

/// What the remediation kinds granted so far ([`grant_remediators`]) allow, as the operator
/// reads the chart's `--remediators`.
pub fn remediator_bounds() -> Result<gpunode_operator::bounds::RemediatorBounds, Error> {
    let granted = REMEDIATORS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    gpunode_operator::bounds::RemediatorBounds::parse(&serde_json::Value::from(granted).to_string())
        .map_err(|e| Error::Unexpected(e.to_string()))
}

/// The entries of `operator.validation.namespaces` granted so far, as the chart renders them
/// for the operator's `--validation-namespaces`: what an in-process operator started after
/// them gets ([`validation_bounds`]).
static VALIDATION: std::sync::Mutex<Vec<serde_json::Value>> = std::sync::Mutex::new(Vec::new());

/// Grants the operator's ServiceAccount the Jobs of `namespace` (the chart's
/// `operator.validation.namespaces`, an entry with the namespace's name alone): see
/// [`grant_validation_with`].
pub async fn grant_validation(admin: &Client, namespace: &str) -> Result<(), Error> {
    grant_validation_with(admin, &json!(namespace)).await
}

/// Grants validation Jobs the namespace of `entry` (one entry of the chart's
/// `operator.validation.namespaces`): renders the chart with it, applies the validation Role
/// and RoleBinding and the chart's validation ServiceAccount there, waits until the operator
/// may create Jobs there, and keeps the operator's `--validation-namespaces` entry as the chart
/// rendered it for [`validation_bounds`].
pub async fn grant_validation_with(admin: &Client, entry: &serde_json::Value) -> Result<(), Error> {
    let namespace = entry
        .as_str()
        .or_else(|| entry["name"].as_str())
        .ok_or_else(|| Error::Unexpected(format!("a validation namespace entry without a name: {entry}")))?
        .to_string();
    let set = format!("operator.validation.namespaces={}", json!([entry]));
    grant_operator(admin, &set, "-validation", &namespace, ("batch/jobs", &namespace)).await?;
    let rendered = template(
        admin,
        RELEASE,
        NAMESPACE,
        &[
            "--show-only",
            "templates/serviceaccounts.yaml",
            "--show-only",
            "templates/operator-deployment.yaml",
            "--set-json",
            &set,
        ],
    )
    .await?;
    let accounts: Vec<DynamicObject> = rendered
        .iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "ServiceAccount"))
        .filter(|o| o.metadata.namespace.as_deref() == Some(namespace.as_str()))
        .cloned()
        .collect();
    apply(admin, &accounts, &namespace, false).await?;
    let flag = rendered
        .iter()
        .filter_map(|o| {
            o.data
                .pointer("/spec/template/spec/containers/0/args")?
                .as_array()
        })
        .flatten()
        .filter_map(serde_json::Value::as_str)
        .find_map(|a| a.strip_prefix("--validation-namespaces="))
        .ok_or_else(|| Error::Unexpected("the chart rendered no --validation-namespaces".to_string()))?;
    let entries: Vec<serde_json::Value> = serde_json::from_str(flag)?;
    let mut granted = VALIDATION
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    granted.retain(|g| g["name"].as_str() != Some(namespace.as_str()));
    granted.extend(entries);
    Ok(())
}

/// What the validation namespaces granted so far ([`grant_validation_with`]) allow, as the
/// operator reads the chart's `--validation-namespaces`.
pub fn validation_bounds() -> Result<gpunode_operator::bounds::ValidationBounds, Error> {
    let granted = VALIDATION
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    gpunode_operator::bounds::ValidationBounds::parse(&serde_json::Value::from(granted).to_string())
        .map_err(|e| Error::Unexpected(e.to_string()))
}

/// Renders the chart's operator RBAC with `set` (a `--set-json` value), applies the two objects
/// (a role and its binding) whose names end in `suffix` (namespaced ones into `namespace`), and
/// waits until the operator may create `can` (resource, namespace).
async fn grant_operator(
    admin: &Client,
    set: &str,
    suffix: &str,
    namespace: &str,
    can: (&str, &str),
) -> Result<(), Error> {
    let acc = install_accounts(admin).await?;
    let objects = template(
        admin,
        RELEASE,
        NAMESPACE,
        &["--show-only", "templates/rbac-operator.yaml", "--set-json", set],
    )
    .await?;
    let ours: Vec<DynamicObject> = objects
        .into_iter()
        .filter(|o| o.metadata.name.as_deref().is_some_and(|n| n.ends_with(suffix)))
        .collect();
    if ours.len() != 2 {
        return Err(Error::Unexpected(format!(
            "the chart rendered {} RBAC objects named *{suffix}, not a role and its binding",
            ours.len()
        )));
    }
    apply(admin, &ours, namespace, false).await?;
    let op = acc.operator_user();
    wait::until(
        &format!("the operator's *{suffix} RBAC to take effect"),
        SETUP_TIMEOUT,
        || async {
            Ok(can_i(admin, &op, "create", can.0, Some(can.1), None)
                .await?
                .then_some(()))
        },
    )
    .await
}

/// Installs the probe and reset accounts of the chart rendered with
/// `nodeProbe.gpuReset.enabled=true` as release [`RESET_RELEASE`] (ServiceAccounts, RBAC,
/// admission policies), and waits until their RBAC and the reset admission policy are enforced.
/// Returns the reset DaemonSet's user name.
pub async fn install_reset_accounts(admin: &Client) -> Result<String, Error> {
    static DONE: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);
    let user = format!("system:serviceaccount:{NAMESPACE}:{RESET_SA}");
    let probe_user = format!("system:serviceaccount:{NAMESPACE}:{RESET_PROBE_SA}");
    let mut done = DONE.lock().await;
    if *done {
        return Ok(user);
    }
    install_accounts(admin).await?;
    let mut extra = vec!["--set", "nodeProbe.gpuReset.enabled=true"];
    for t in [
        "templates/serviceaccounts.yaml",
        "templates/rbac-node-probe.yaml",
        "templates/rbac-gpu-reset.yaml",
        "templates/admission-policy.yaml",
    ] {
        extra.push("--show-only");
        extra.push(t);
    }
    let probe_objects: Vec<DynamicObject> = template(admin, RESET_RELEASE, NAMESPACE, &extra)
        .await?
        .into_iter()
        .filter(|o| {
            o.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(RESET_PROBE_SA) || n.starts_with(RESET_SA))
        })
        .collect();
    apply(admin, &probe_objects, NAMESPACE, false).await?;
    wait::until(
        "the GPU-reset accounts' RBAC to take effect",
        SETUP_TIMEOUT,
        || async {
            let ok = can_i(
                admin,
                &user,
                "patch",
                "gpunode.dev/gpuresetrequests/status",
                None,
                None,
            )
            .await?
                && can_i(admin, &user, "watch", "gpunode.dev/gpuresetrequests", None, None).await?
                && can_i(
                    admin,
                    &probe_user,
                    "watch",
                    "gpunode.dev/gpuresetrequests",
                    None,
                    None,
                )
                .await?
                && can_i(
                    admin,
                    &probe_user,
                    "patch",
                    "gpunode.dev/gpunodereports/status",
                    None,
                    None,
                )
                .await?;
            Ok(ok.then_some(()))
        },
    )
    .await?;
    // A request of a node no probe runs on; a status write to it by a token without a node
    // claim is refused once the policy is enforced (a dry run: nothing is stored).
    let requests: Api<DynamicObject> =
        Api::all_with(admin.clone(), &ApiResource::erase::<GpuResetRequest>(&()));
    let canary = "gpunode-e2e-reset-canary";
    let name = format!("{canary}-gpu-0");
    let request = json!({
        "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuResetRequest",
        "metadata": {"name": name},
        "spec": {"nodeName": canary, "index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000000"},
    });
    requests
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&request),
        )
        .await?;
    let token = accounts::client_for(admin, NAMESPACE, RESET_SA, None).await?;
    let as_probe: Api<DynamicObject> = Api::all_with(token, &ApiResource::erase::<GpuResetRequest>(&()));
    let pp = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let status = json!({"status": {"phase": "Succeeded"}});
    wait::until(
        "the GPU-reset admission policy to be enforced",
        SETUP_TIMEOUT,
        || async {
            match as_probe.patch_status(&name, &pp, &Patch::Merge(&status)).await {
                Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(RESET_OTHER_NODE_MESSAGE) => {
                    Ok(Some(()))
                }
                Ok(_) => Err(Error::Unexpected(format!(
                    "a reset status write to {name} without a node claim was admitted"
                ))),
                Err(kube::Error::Api(s)) if s.code == 403 => Ok(None),
                Err(e) => Err(e.into()),
            }
        },
    )
    .await?;
    *done = true;
    Ok(user)
}

/// Asks the API server whether `user` may `verb` `resource` (SubjectAccessReview, as `kubectl
/// auth can-i --as` does). `resource` is `[group/]resource[/subresource]`.
pub async fn can_i(
    admin: &Client,
    user: &str,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<bool, Error> {
    let (group, rest) = match resource.split_once('/') {
        // A group has a dot, except the built-in ones without (pods/eviction is a subresource).
        Some((g, r)) if g.contains('.') || matches!(g, "apps" | "batch" | "autoscaling" | "policy") => {
            (g.to_string(), r.to_string())
        }
        _ => (String::new(), resource.to_string()),
    };
    let (res, sub) = match rest.split_once('/') {
        Some((r, s)) => (r.to_string(), Some(s.to_string())),
        None => (rest, None),
    };
    let sa_groups = user.strip_prefix("system:serviceaccount:").and_then(|rest| {
        rest.split_once(':').map(|(ns, _)| {
            vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".to_string(),
            ]
        })
    });
    let review = SubjectAccessReview {
        metadata: Default::default(),
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            groups: sa_groups,
            resource_attributes: Some(ResourceAttributes {
                group: Some(group),
                resource: Some(res),
                subresource: sub,
                verb: Some(verb.to_string()),
                namespace: namespace.map(str::to_string),
                name: name.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        status: None,
    };
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Waits until both accounts' RBAC is in the authorizer's cache.
async fn wait_rbac(admin: &Client, acc: &Accounts) -> Result<(), Error> {
    let (op, probe) = (acc.operator_user(), acc.probe_user());
    wait::until("the chart's RBAC to take effect", SETUP_TIMEOUT, || async {
        let ok = can_i(admin, &op, "watch", "nodes", None, None).await?
            && can_i(
                admin,
                &op,
                "update",
                "coordination.k8s.io/leases",
                Some(NAMESPACE),
                Some("gpunode-operator"),
            )
            .await?
            && can_i(
                admin,
                &op,
                "create",
                "events.k8s.io/events",
                Some("default"),
                None,
            )
            .await?
            && can_i(
                admin,
                &op,
                "watch",
                "coordination.k8s.io/leases",
                Some(NAMESPACE),
                None,
            )
            .await?
            && can_i(
                admin,
                &probe,
                "patch",
                "gpunode.dev/gpunodereports/status",
                None,
                None,
            )
            .await?
            && can_i(
                admin,
                &probe,
                "create",
                "coordination.k8s.io/leases",
                Some(NAMESPACE),
                None,
            )
            .await?;
        Ok(ok.then_some(()))
    })
    .await
}

/// Dry-run writes of a report and of a heartbeat Lease by a probe token without a node claim:
/// refused by the admission policies once they are enforced (before that, RBAC alone would let
/// them through). Nothing is stored.
async fn wait_admission_policy(admin: &Client) -> Result<(), Error> {
    let token = accounts::client_for(admin, NAMESPACE, PROBE_SA, None).await?;
    let mut pp = PatchParams::apply(FIELD_MANAGER).force();
    pp.dry_run = true;
    let name = "gpunode-e2e-admission-canary";
    let report = json!({
        "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport",
        "metadata": {"name": name}, "spec": {"nodeName": name},
    });
    let lease_name = format!("{LEASE_PREFIX}{name}");
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": lease_name, "namespace": NAMESPACE}, "spec": {"holderIdentity": name},
    });
    for (api, name, object, message, what) in [
        (
            Api::<DynamicObject>::all_with(token.clone(), &ApiResource::erase::<GpuNodeReport>(&())),
            name,
            &report,
            NO_NODE_MESSAGE,
            "the probe report admission policy to be enforced",
        ),
        (
            Api::<DynamicObject>::namespaced_with(
                token.clone(),
                NAMESPACE,
                &ApiResource::erase::<Lease>(&()),
            ),
            lease_name.as_str(),
            &lease,
            LEASE_NO_NODE_MESSAGE,
            "the probe Lease admission policy to be enforced",
        ),
    ] {
        wait::until(what, SETUP_TIMEOUT, || async {
            match api.patch(name, &pp, &Patch::Apply(object)).await {
                Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(message) => Ok(Some(())),
                Ok(_) => Err(Error::Unexpected(format!(
                    "a probe write of {name} without a node claim was admitted"
                ))),
                Err(e) => Err(e.into()),
            }
        })
        .await?;
    }
    Ok(())
}

/// A client acting as the operator's ServiceAccount.
pub async fn operator_client(admin: &Client) -> Result<Client, Error> {
    install_accounts(admin).await?;
    accounts::client_for(admin, NAMESPACE, OPERATOR_SA, None).await
}

/// A client acting as the probe's ServiceAccount with a token bound to `pod` (a pod of that
/// ServiceAccount on the probe's node, see [`probe_pod`]): the token carries the pod's node in
/// its `authentication.kubernetes.io/node-name` claim, which the admission policy checks.
pub async fn probe_client(admin: &Client, pod: &Pod) -> Result<Client, Error> {
    accounts::client_for(admin, NAMESPACE, PROBE_SA, Some(pod)).await
}

/// The name of the stand-in probe pod of `node`.
pub fn probe_pod_name(node: &str) -> String {
    format!("node-probe-{node}")
}

/// A pod of the probe's ServiceAccount bound to `node` (as the DaemonSet would place one), so a
/// token bound to it carries the node's name. It never runs a container that matters: on KWOK
/// nodes kwok only marks it Running. Created if missing; returns the stored pod (with its uid).
pub async fn probe_pod(admin: &Client, node: &str) -> Result<Pod, Error> {
    install_accounts(admin).await?;
    probe_pod_as(admin, node, PROBE_SA, &probe_pod_name(node)).await
}

/// [`probe_pod`] of ServiceAccount `sa`, named `name`.
pub async fn probe_pod_as(admin: &Client, node: &str, sa: &str, name: &str) -> Result<Pod, Error> {
    let name = name.to_string();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/component": "node-probe", "gpunode.dev/e2e": "true"},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": sa,
            // The test process uses its own token; this pod only anchors it to the node.
            "automountServiceAccountToken": false,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "probe", "image": "registry.invalid/gpunode/node-probe:e2e"}],
        }
    }))?;
    let api: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    match api.create(&PostParams::default(), &pod).await {
        Ok(p) => Ok(p),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(api.get(&name).await?),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the stand-in probe pod of `node` (its tokens stop working).
pub async fn delete_probe_pod(admin: &Client, node: &str) -> Result<(), Error> {
    delete_pod(admin, &probe_pod_name(node)).await
}

/// Deletes the stand-in probe pod `name`.
pub async fn delete_pod(admin: &Client, name: &str) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    match api.delete(name, &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Writes a kubeconfig for the test cluster that authenticates with `token` (for binaries run
/// as processes, e.g. the probe with its pod-bound token).
pub async fn write_kubeconfig(token: &str, path: &Path) -> Result<(), Error> {
    let admin = cluster::admin_kubeconfig().await?;
    let mut kubeconfig = Kubeconfig::read_from(&admin).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let user = "gpunode-e2e-token".to_string();
    kubeconfig.auth_infos = vec![NamedAuthInfo {
        name: user.clone(),
        auth_info: Some(AuthInfo {
            token: Some(token.to_string().into()),
            ..AuthInfo::default()
        }),
        other: Default::default(),
    }];
    for ctx in &mut kubeconfig.contexts {
        if let Some(c) = ctx.context.as_mut() {
            c.user = Some(user.clone());
        }
    }
    let yaml = serde_yaml::to_string(&kubeconfig)?;
    std::fs::write(path, yaml).map_err(|e| Error::Unexpected(format!("writing {}: {e}", path.display())))
}

/// A kubeconfig at `path` for the probe's ServiceAccount with a token bound to `pod`.
pub async fn write_probe_kubeconfig(admin: &Client, pod: &Pod, path: &Path) -> Result<(), Error> {
    write_kubeconfig_as(admin, PROBE_SA, pod, path).await
}

/// A kubeconfig at `path` for ServiceAccount `sa` with a token bound to `pod`.
pub async fn write_kubeconfig_as(admin: &Client, sa: &str, pod: &Pod, path: &Path) -> Result<(), Error> {
    let token = accounts::token(admin, NAMESPACE, sa, Some(pod)).await?;
    write_kubeconfig(&token, path).await
}

/// Minimal stand-ins for the Prometheus Operator's ServiceMonitor and PrometheusRule CRDs
/// (`monitoring.coreos.com/v1`, spec unchecked), so the chart's optional monitoring objects can
/// be installed on a cluster without the Prometheus Operator. CRDs that already exist (a real
/// Prometheus Operator) are left alone. Returns once both are Established.
pub async fn install_monitoring_stand_ins(admin: &Client) -> Result<(), Error> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::runtime::wait::{await_condition, conditions::is_crd_established};

    let api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for (kind, plural) in [
        ("ServiceMonitor", "servicemonitors"),
        ("PrometheusRule", "prometheusrules"),
    ] {
        let name = format!("{plural}.monitoring.coreos.com");
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name, "labels": {"gpunode.dev/e2e": "stand-in"}},
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(),
                          "listKind": format!("{kind}List")},
                "versions": [{
                    "name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
                    }},
                }],
            }
        }))?;
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
        tokio::time::timeout(
            SETUP_TIMEOUT,
            await_condition(api.clone(), &name, is_crd_established()),
        )
        .await
        .map_err(|_| Error::Timeout {
            what: format!("CRD {name} to become Established"),
            after: SETUP_TIMEOUT,
            last: "not established".to_string(),
        })?
        .map_err(|e| Error::Unexpected(format!("watching CRD {name}: {e}")))?;
    }
    Ok(())
}
