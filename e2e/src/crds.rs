//! Installing gpunode's CRDs into the test cluster.

use std::time::Duration;

use gpunode_crds::{GpuNodePolicy, generate};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::wait::{await_condition, conditions::is_crd_established},
};

use crate::Error;

/// Applies every generated CRD (server-side) and waits until each is Established.
pub async fn install(client: &Client) -> Result<(), Error> {
    for (_, crd) in generate::crds() {
        apply_established(client, &crd).await?;
    }
    Ok(())
}

/// Applies `crd` (server-side) and waits until it is Established.
pub async fn apply_established(client: &Client, crd: &CustomResourceDefinition) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply("gpunode-e2e").force();
    let name = crd.metadata.name.clone().unwrap_or_default();
    api.patch(&name, &pp, &Patch::Apply(crd)).await?;
    let established = await_condition(api.clone(), &name, is_crd_established());
    tokio::time::timeout(Duration::from_secs(30), established)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("CRD {name} to become Established"),
            after: Duration::from_secs(30),
            last: "not established".to_string(),
        })?
        .map_err(|e| Error::Unexpected(format!("watching CRD {name}: {e}")))?;
    Ok(())
}

/// Creates the GpuNodePolicy `name` with `spec`, typed first, so a mistake in a test's policy
/// fails here with the field that is wrong rather than as an API error; a field the type does
/// not know (the API server would drop it without a word) is refused with its path.
pub async fn create_policy(
    client: &Client,
    name: &str,
    spec: serde_json::Value,
) -> Result<GpuNodePolicy, Error> {
    let policy = typed_policy(name, spec)?;
    Ok(Api::<GpuNodePolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await?)
}

/// The policy `name` with `spec`, refused when a field of `spec` is not the policy's.
fn typed_policy(name: &str, spec: serde_json::Value) -> Result<GpuNodePolicy, Error> {
    let mut unknown = Vec::new();
    let typed: gpunode_crds::policy::GpuNodePolicySpec =
        serde_ignored::deserialize(spec, |path| unknown.push(format!("spec.{path}")))?;
    if !unknown.is_empty() {
        return Err(Error::Unexpected(format!(
            "GpuNodePolicy {name}: fields the policy does not have (the API server would drop them): {}",
            unknown.join(", ")
        )));
    }
    Ok(GpuNodePolicy::new(name, typed))
}

/// Deletes every generated CRD (and with them every policy and report, once the operator has
/// released what the policies did) and waits until each is gone.
pub async fn uninstall(client: &Client, timeout: Duration) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let names: Vec<String> = generate::crds()
        .into_iter()
        .filter_map(|(_, crd)| crd.metadata.name)
        .collect();
    for name in &names {
        match api.delete(name, &kube::api::DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    crate::wait::until("gpunode's CRDs to be deleted", timeout, || async {
        for name in &names {
            if let Some(crd) = api.get_opt(name).await? {
                let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
                let why: Vec<String> = conditions
                    .iter()
                    .filter(|c| c.type_ == "Terminating" || c.type_ == "InstanceDeletionInProgress")
                    .map(|c| format!("{}: {}", c.type_, c.message.clone().unwrap_or_default()))
                    .collect();
                return Err(Error::Unexpected(format!("{name} still there: {why:?}")));
            }
        }
        Ok(Some(()))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field in the wrong place (the drain's settings at the top of the spec, not under
    /// `disruption`) is refused with its path; in place, it is taken.
    #[test]
    fn a_policy_field_out_of_place_is_refused_with_its_path() {
        let misplaced = serde_json::json!({
            "nodeSelector": {"matchLabels": {"a": "b"}},
            "drain": {"protectedNamespaces": ["kube-system"]},
        });
        let e = typed_policy("p", misplaced)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(e.as_ref().is_err_and(|e| e.contains("spec.drain")), "{e:?}");
        let placed = serde_json::json!({
            "nodeSelector": {"matchLabels": {"a": "b"}},
            "disruption": {"drain": {"protectedNamespaces": ["kube-system"]}},
        });
        let ok = typed_policy("p", placed).map(|_| ()).map_err(|e| e.to_string());
        assert!(ok.is_ok(), "{ok:?}");
    }
}
