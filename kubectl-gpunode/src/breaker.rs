//! `kubectl gpunode close-breaker POLICY`: closes a policy's open circuit breaker by setting the
//! policy annotation `gpunode.dev/close-breaker` to the trip's `status.circuitBreaker.openedAt`,
//! the one value that closes that trip and no later one. A breaker that is closed is refused
//! (nothing to close). The write is a merge patch carrying the policy's resourceVersion: a
//! policy changed meanwhile is read again. It writes nothing else.

use gpunode_crds::{
    GpuNodePolicy,
    policy::{CLOSE_BREAKER_ANNOTATION, CircuitBreakerStatus},
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::error::Error;

/// How often the write is made again after a 409 Conflict before giving up.
const ATTEMPTS: usize = 5;

/// The field manager of the plugin's writes.
const FIELD_MANAGER: &str = "kubectl-gpunode";

/// The annotation value that closes the breaker of `policy` as its status records it: the
/// trip's `openedAt`, or why there is nothing to close.
pub fn close_value(policy: &str, breaker: Option<&CircuitBreakerStatus>) -> Result<String, Error> {
    let open = breaker.filter(|b| b.open);
    let Some(b) = open else {
        return Err(Error::Usage(format!(
            "the circuit breaker of policy {policy} is closed: nothing to close"
        )));
    };
    let Some(at) = &b.opened_at else {
        return Err(Error::Usage(format!(
            "the circuit breaker of policy {policy} is open but its status names no openedAt"
        )));
    };
    Ok(at.0.to_string())
}

/// Closes the breaker of `policy`, reading it again and retrying when it changed meanwhile.
/// Returns one line for the person.
pub async fn close(client: &Client, policy: &str) -> Result<String, Error> {
    let api = Api::<GpuNodePolicy>::all(client.clone());
    let what = format!("gpunodepolicy {policy}");
    let missing = || format!("GpuNodePolicy {policy} not found");
    for _ in 0..ATTEMPTS {
        let current = api
            .get(policy)
            .await
            .map_err(|e| Error::from_kube(&format!("get {what}"), missing, e))?;
        let value = close_value(
            policy,
            current.status.as_ref().and_then(|s| s.circuit_breaker.as_ref()),
        )?;
        let patch = json!({
            "metadata": {
                "resourceVersion": current.resource_version(),
                "annotations": {CLOSE_BREAKER_ANNOTATION: value},
            }
        });
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        match api.patch(policy, &pp, &Patch::Merge(&patch)).await {
            Ok(_) => {
                return Ok(format!(
                    "gpunodepolicy/{policy}: closing the circuit breaker opened at {value} ({CLOSE_BREAKER_ANNOTATION}={value}); the operator resumes on its next pass\n"
                ));
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(Error::from_kube(&format!("patch {what}"), missing, e)),
        }
    }
    Err(Error::Api {
        what: format!("patch {what}"),
        message: format!("the policy kept changing: {ATTEMPTS} attempts met a newer resourceVersion"),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    #[test]
    fn only_an_open_breaker_is_closed_and_by_its_opened_at() {
        let open = CircuitBreakerStatus {
            open: true,
            opened_at: Some(Time("2026-12-06T01:00:00Z".parse().unwrap())),
            drifted: 4,
            of: 10,
            ..CircuitBreakerStatus::default()
        };
        assert_eq!(close_value("p", Some(&open)).unwrap(), "2026-12-06T01:00:00Z");
        let closed = CircuitBreakerStatus { open: false, ..open };
        let e = close_value("p", Some(&closed)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the circuit breaker of policy p is closed: nothing to close"
        );
        assert_eq!(e.exit_code(), crate::error::exit::USAGE);
        assert!(close_value("p", None).is_err());
    }
}
