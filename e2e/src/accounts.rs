//! Clients that act as a ServiceAccount, with tokens from the TokenRequest API, so tests run
//! with exactly the permissions the chart grants.

use k8s_openapi::{
    api::{
        authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
        core::v1::{Pod, ServiceAccount},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, Client, api::PostParams, config::AuthInfo};

use crate::{Error, cluster::admin_config};

/// A token for `namespace/name`, valid for an hour; bound to `pod` when given, so it carries
/// the pod's node in the `authentication.kubernetes.io/node-name` claim.
pub async fn token(admin: &Client, namespace: &str, name: &str, pod: Option<&Pod>) -> Result<String, Error> {
    let bound_object_ref = pod.map(|p| BoundObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Pod".to_string()),
        name: p.metadata.name.clone(),
        uid: p.metadata.uid.clone(),
    });
    let request = TokenRequest {
        metadata: ObjectMeta::default(),
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            bound_object_ref,
        },
        status: None,
    };
    let api: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let response = api
        .create_token_request(name, &PostParams::default(), &request)
        .await?;
    response
        .status
        .map(|s| s.token)
        .ok_or_else(|| Error::Unexpected(format!("TokenRequest for {namespace}/{name} returned no token")))
}

/// A client authenticated as ServiceAccount `namespace/name` (bound to `pod` when given).
pub async fn client_for(
    admin: &Client,
    namespace: &str,
    name: &str,
    pod: Option<&Pod>,
) -> Result<Client, Error> {
    let token = token(admin, namespace, name, pod).await?;
    let mut config = admin_config().await?;
    config.auth_info = AuthInfo {
        token: Some(token.into()),
        ..AuthInfo::default()
    };
    Ok(Client::try_from(config)?)
}
