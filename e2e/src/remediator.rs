//! A small fake remediator for the repair tests: the kinds `FakeReboot` and `FakeRebootTemplate`
//! (group [`GROUP`]), shaped like medik8s remediations (a template with `spec.template.spec`, an
//! object named after the node, a `Succeeded` condition), and a controller that acts on them the
//! way the object's `spec.behavior` says:
//! - `Succeed`: once the object is labelled [`GO_LABEL`]`=true` (so a test decides when), it
//!   sets `Succeeded=True` and "reboots" the node through the test's callback (which publishes
//!   the report a rebooted node's probe would);
//! - `Fail`: sets `Succeeded=False` (reason `BmcUnreachable`) at once;
//! - `Hang`: never does anything.

use std::{collections::BTreeSet, future::Future};

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

use crate::Error;

/// The fake remediation API group.
pub const GROUP: &str = "remediation.e2e.gpunode.dev";
/// Its version.
pub const VERSION: &str = "v1alpha1";
/// The label that lets a `Succeed` remediation proceed.
pub const GO_LABEL: &str = "remediation.e2e.gpunode.dev/go";

/// The `FakeReboot` kind.
pub fn reboot_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "FakeReboot"),
        "fakereboots",
    )
}

/// The `FakeRebootTemplate` kind.
pub fn template_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "FakeRebootTemplate"),
        "fakereboottemplates",
    )
}

fn crd(kind: &str, plural: &str, spec: serde_json::Value) -> Result<CustomResourceDefinition, Error> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{GROUP}")},
        "spec": {
            "group": GROUP,
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION, "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": spec,
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                }},
            }],
        },
    }))?)
}

/// Installs both kinds and waits until they are Established.
pub async fn install(admin: &Client) -> Result<(), Error> {
    let behavior = json!({
        "type": "object",
        "required": ["behavior"],
        "properties": {"behavior": {"type": "string", "enum": ["Succeed", "Fail", "Hang"]}},
    });
    let template = json!({
        "type": "object",
        "properties": {"template": {"type": "object", "properties": {"spec": behavior}}},
    });
    for c in [
        crd("FakeReboot", "fakereboots", behavior)?,
        crd("FakeRebootTemplate", "fakereboottemplates", template)?,
    ] {
        crate::crds::apply_established(admin, &c).await?;
    }
    Ok(())
}

/// Installs both kinds, and grants the operator's ServiceAccount the fake remediation kind in
/// `namespace` through the chart's `operator.remediators` value.
pub async fn install_and_grant(admin: &Client, namespace: &str) -> Result<(), Error> {
    install(admin).await?;
    crate::chart::grant_remediators(
        admin,
        &json!([{"apiGroup": GROUP, "resources": ["fakereboots"], "templates": ["fakereboottemplates"]}]),
        &format!("{GROUP}/fakereboots"),
        namespace,
    )
    .await
}

/// Creates the template `name` in `namespace` with `behavior`.
pub async fn create_template(
    admin: &Client,
    namespace: &str,
    name: &str,
    behavior: &str,
) -> Result<(), Error> {
    let ar = template_resource();
    let obj = DynamicObject::new(name, &ar)
        .within(namespace)
        .data(json!({"spec": {"template": {"spec": {"behavior": behavior}}}}));
    Api::<DynamicObject>::namespaced_with(admin.clone(), namespace, &ar)
        .create(&PostParams::default(), &obj)
        .await?;
    Ok(())
}

/// Lets the `Succeed` remediation of `node` in `namespace` proceed.
pub async fn go(admin: &Client, namespace: &str, node: &str) -> Result<(), Error> {
    let patch = json!({"metadata": {"labels": {GO_LABEL: "true"}}});
    Api::<DynamicObject>::namespaced_with(admin.clone(), namespace, &reboot_resource())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn set_condition(
    api: &Api<DynamicObject>,
    name: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let patch = json!({"status": {"conditions": [{
        "type": "Succeeded", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": jiff::Timestamp::now().to_string(),
    }]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Runs the fake remediator until the task is aborted. `reboot(node)` is what a reboot of
/// `node` does (publish its fresh report); each object is acted on once.
pub fn spawn<F, Fut>(admin: Client, reboot: F) -> tokio::task::JoinHandle<()>
where
    F: Fn(String) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let ar = reboot_resource();
        let all: Api<DynamicObject> = Api::all_with(admin.clone(), &ar);
        let mut done: BTreeSet<String> = BTreeSet::new();
        let mut events = watcher(all, crate::faults::cluster::watch_config())
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(obj) = event else { continue };
            let (ns, name, uid) = (
                obj.namespace().unwrap_or_default(),
                obj.name_any(),
                obj.uid().unwrap_or_default(),
            );
            if done.contains(&uid) || obj.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns, &ar);
            let behavior = obj
                .data
                .pointer("/spec/behavior")
                .and_then(|b| b.as_str())
                .unwrap_or_default();
            let result = match behavior {
                "Fail" => {
                    set_condition(&api, &name, "False", "BmcUnreachable", "the BMC did not answer").await
                }
                "Succeed" if obj.labels().get(GO_LABEL).is_some_and(|v| v == "true") => {
                    // As a real one: the node is back, and its probe reports after that.
                    let done =
                        set_condition(&api, &name, "True", "Rebooted", "the node was power-cycled").await;
                    if done.is_ok() {
                        reboot(name.clone()).await;
                    }
                    done
                }
                _ => continue,
            };
            if result.is_ok() {
                done.insert(uid);
            }
        }
    })
}
