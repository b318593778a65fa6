//! Who the benchmark's operator is: the chart's namespace and ServiceAccount, and a kubeconfig
//! that authenticates as it (or as any token), so that its requests are the operator's own.

use std::path::Path;

use kube::config::{Kubeconfig, NamedAuthInfo};
use serde_json::json;

use crate::error::Error;

/// The chart's namespace and the operator's ServiceAccount (its RBAC is applied by run.sh).
pub const OPERATOR_NAMESPACE: &str = "gpunode-system";
/// The operator's ServiceAccount.
pub const OPERATOR_SA: &str = "gpunode-operator";
/// Writes a copy of `kc` that authenticates with `token`.
pub fn token_kubeconfig(kc: &Kubeconfig, token: &str, path: &Path) -> Result<(), Error> {
    let mut kc = kc.clone();
    let user = "bench-token".to_string();
    let named: NamedAuthInfo = serde_json::from_value(json!({"name": user, "user": {"token": token}}))?;
    kc.auth_infos = vec![named];
    for ctx in &mut kc.contexts {
        if let Some(c) = ctx.context.as_mut() {
            c.user = Some(user.clone());
        }
    }
    std::fs::write(path, serde_yaml::to_string(&kc)?)
        .map_err(Error::io(format!("writing {}", path.display())))
}
