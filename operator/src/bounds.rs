//! The bounds the chart grants to what gpunode makes from a policy's template: the namespaces a
//! validation Job (`spec.validation`) may run in, the ServiceAccounts its pod may use there, and
//! whether it may be privileged, add capabilities, share the host's namespaces or mount host
//! paths (the chart's `operator.validation.namespaces`, handed to the operator as
//! `--validation-namespaces`). A template outside them is refused, naming the field and the chart
//! value that would allow it: no Job is made, and the policy is Degraded.
//!
//! The same for repair steps' remediation objects: the kinds the chart's `operator.remediators`
//! grants, and the namespaces an entry limits them to (`--remediators`).
//!
//! Pure: it parses the flags and checks a template or an object's place. It may not read or write the cluster, and it
//! imports nothing of the operator's.

use k8s_openapi::api::core::v1::{ContainerPort, PodSpec, PodTemplateSpec, SecurityContext};
use serde::Deserialize;

/// The chart value the bounds come from (named in every refusal).
pub const VALUE: &str = "operator.validation.namespaces";

/// One namespace the chart grants to validation Jobs, and what their pods may do there.
#[derive(Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceBounds {
    /// The namespace.
    pub name: String,
    /// The ServiceAccounts a validation pod may use; the first is set on a template that names
    /// none. Empty: no pod can run there.
    #[serde(default)]
    pub service_accounts: Vec<String>,
    /// Containers may be privileged (`securityContext.privileged`,
    /// `allowPrivilegeEscalation`) and add any capability.
    #[serde(default)]
    pub allow_privileged: bool,
    /// Capabilities a container may add (`securityContext.capabilities.add`) without
    /// `allowPrivileged`, for example `SYS_ADMIN` for DCGM's diagnostics.
    #[serde(default)]
    pub allowed_capabilities: Vec<String>,
    /// The pod may use the host's PID, IPC and network namespaces, and host ports.
    #[serde(default)]
    pub allow_host_namespaces: bool,
    /// The pod may mount `hostPath` volumes.
    #[serde(default)]
    pub allow_host_path: bool,
}

/// The namespaces granted to validation Jobs. None granted (the default): no validation Job is
/// ever made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValidationBounds {
    namespaces: Vec<NamespaceBounds>,
}

/// Why `--validation-namespaces` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BoundsError {
    /// Not a JSON list of namespace bounds.
    #[error("--validation-namespaces ({VALUE}): {0}")]
    Invalid(String),
    /// Not a JSON list of remediator grants.
    #[error("--remediators ({REMEDIATORS_VALUE}): {0}")]
    Remediators(String),
}

impl ValidationBounds {
    /// Bounds granting `namespaces`.
    pub fn new(namespaces: Vec<NamespaceBounds>) -> ValidationBounds {
        ValidationBounds { namespaces }
    }

    /// Parses the flag: a JSON list of [`NamespaceBounds`] (the chart renders it from its
    /// value). Empty text is no namespace.
    pub fn parse(text: &str) -> Result<ValidationBounds, BoundsError> {
        if text.trim().is_empty() {
            return Ok(ValidationBounds::default());
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let namespaces: Vec<NamespaceBounds> = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| BoundsError::Invalid(format!("{}: {}", e.path(), e.inner())))?;
        if let Some((i, _)) = namespaces.iter().enumerate().find(|(_, n)| n.name.is_empty()) {
            return Err(BoundsError::Invalid(format!("[{i}].name: must not be empty")));
        }
        Ok(ValidationBounds { namespaces })
    }

    /// The template of a validation Job in `namespace`, if the bounds allow it: with the
    /// namespace's first ServiceAccount set where it names none. Otherwise the field that
    /// oversteps them and why, naming the chart value that would allow it.
    pub fn admit(&self, namespace: &str, template: PodTemplateSpec) -> Result<PodTemplateSpec, String> {
        let Some(ns) = self.namespaces.iter().find(|n| n.name == namespace) else {
            return Err(format!(
                "spec.validation.namespace: namespace {namespace} is not granted to validation Jobs \
                 (chart value {VALUE})"
            ));
        };
        let mut template = template;
        let spec = template.spec.get_or_insert_with(PodSpec::default);
        check(ns, spec)?;
        if spec.service_account_name.is_none() && spec.service_account.is_none() {
            spec.service_account_name = ns.service_accounts.first().cloned();
        }
        Ok(template)
    }
}

/// The chart value the remediator bounds come from (named in every refusal).
pub const REMEDIATORS_VALUE: &str = "operator.remediators";

/// One remediation API group the chart grants repair steps (an entry of `operator.remediators`).
#[derive(Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemediatorGrant {
    /// The API group.
    pub api_group: String,
    /// The kinds gpunode makes (plural resource names).
    pub resources: Vec<String>,
    /// The template kinds it reads (plural resource names).
    #[serde(default)]
    pub templates: Vec<String>,
    /// The namespaces it may make them in; `None`: any (and cluster-scoped kinds).
    #[serde(default)]
    pub namespaces: Option<Vec<String>>,
}

/// The remediation kinds, and where, the chart grants repair steps (`--remediators`). None
/// granted (the default): no repair step makes a remediation object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemediatorBounds {
    grants: Vec<RemediatorGrant>,
}

impl RemediatorBounds {
    /// Bounds granting `grants`.
    pub fn new(grants: Vec<RemediatorGrant>) -> RemediatorBounds {
        RemediatorBounds { grants }
    }

    /// Parses the flag: a JSON list of [`RemediatorGrant`] (the chart's value as it is). Empty
    /// text is none.
    pub fn parse(text: &str) -> Result<RemediatorBounds, BoundsError> {
        if text.trim().is_empty() {
            return Ok(RemediatorBounds::default());
        }
        let mut de = serde_json::Deserializer::from_str(text);
        let grants = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| BoundsError::Remediators(format!("{}: {}", e.path(), e.inner())))?;
        Ok(RemediatorBounds { grants })
    }

    /// Whether a repair step may make an object of `resource` (plural) of `group` in
    /// `namespace` (`None`: cluster-scoped); otherwise why, naming the chart value.
    pub fn admit(&self, group: &str, resource: &str, namespace: Option<&str>) -> Result<(), String> {
        let granted: Vec<&RemediatorGrant> = self
            .grants
            .iter()
            .filter(|g| g.api_group == group && g.resources.iter().any(|r| r == resource))
            .collect();
        if granted.is_empty() {
            return Err(format!(
                "spec.repair.steps[].remediator: {resource}.{group} is not granted to repair steps \
                 (chart value {REMEDIATORS_VALUE})"
            ));
        }
        let anywhere = granted.iter().any(|g| g.namespaces.is_none());
        let here = namespace.is_some_and(|ns| {
            granted
                .iter()
                .filter_map(|g| g.namespaces.as_ref())
                .any(|n| n.iter().any(|g| g == ns))
        });
        if anywhere || here {
            return Ok(());
        }
        Err(format!(
            "spec.repair.steps[].remediator.namespace: {resource}.{group} may not be made in {} \
             (chart value {REMEDIATORS_VALUE}[].namespaces)",
            namespace.map_or_else(|| "the cluster scope".to_string(), |n| format!("namespace {n}"))
        ))
    }
}

const FIELD: &str = "spec.validation.template.spec";

/// Whether `spec` keeps within `ns`; the first field that does not, and why.
fn check(ns: &NamespaceBounds, spec: &PodSpec) -> Result<(), String> {
    let name = &ns.name;
    let refuse = |field: String, what: &str, value: &str| {
        Err(format!(
            "{FIELD}.{field}: {what} not allowed in namespace {name} (chart value {VALUE}[].{value})"
        ))
    };
    for (field, on) in [
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
        ("hostNetwork", spec.host_network),
    ] {
        if on == Some(true) && !ns.allow_host_namespaces {
            return refuse(field.to_string(), "host namespaces are", "allowHostNamespaces");
        }
    }
    let containers = every_container(spec);
    // A host port publishes the pod on the node's own address, as the host network would.
    for (at, ports, _) in &containers {
        for (j, p) in ports.iter().enumerate() {
            if p.host_port.is_some_and(|port| port != 0) && !ns.allow_host_namespaces {
                return refuse(
                    format!("{at}.ports[{j}].hostPort"),
                    "host ports are",
                    "allowHostNamespaces",
                );
            }
        }
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if v.host_path.is_some() && !ns.allow_host_path {
            return refuse(
                format!("volumes[{i}].hostPath"),
                "hostPath volumes are",
                "allowHostPath",
            );
        }
    }
    for (at, _, sc) in &containers {
        if let Some(sc) = sc {
            check_container(ns, at, sc)?;
        }
    }
    let account = spec
        .service_account_name
        .as_ref()
        .or(spec.service_account.as_ref());
    match account {
        Some(sa) if !ns.service_accounts.contains(sa) => refuse(
            "serviceAccountName".to_string(),
            &format!("ServiceAccount {sa} is"),
            "serviceAccounts",
        ),
        None if ns.service_accounts.is_empty() => refuse(
            "serviceAccountName".to_string(),
            "a pod without a granted ServiceAccount is",
            "serviceAccounts",
        ),
        _ => Ok(()),
    }
}

/// Every container of `spec` (init, regular, ephemeral) with its path in the pod spec, its
/// ports and its security context.
fn every_container(spec: &PodSpec) -> Vec<(String, &[ContainerPort], Option<&SecurityContext>)> {
    let init = spec.init_containers.iter().flatten().enumerate().map(|(i, c)| {
        let ports = c.ports.as_deref().unwrap_or_default();
        (format!("initContainers[{i}]"), ports, c.security_context.as_ref())
    });
    let regular = spec.containers.iter().enumerate().map(|(i, c)| {
        let ports = c.ports.as_deref().unwrap_or_default();
        (format!("containers[{i}]"), ports, c.security_context.as_ref())
    });
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let ports = c.ports.as_deref().unwrap_or_default();
            (
                format!("ephemeralContainers[{i}]"),
                ports,
                c.security_context.as_ref(),
            )
        });
    init.chain(regular).chain(ephemeral).collect()
}

/// Whether one container's security context keeps within `ns`.
fn check_container(ns: &NamespaceBounds, at: &str, sc: &SecurityContext) -> Result<(), String> {
    let name = &ns.name;
    let refuse = |field: &str, what: &str, value: &str| {
        Err(format!(
            "{FIELD}.{at}.securityContext.{field}: {what} not allowed in namespace {name} \
             (chart value {VALUE}[].{value})"
        ))
    };
    if ns.allow_privileged {
        return Ok(());
    }
    if sc.privileged == Some(true) {
        return refuse("privileged", "privileged containers are", "allowPrivileged");
    }
    if sc.allow_privilege_escalation == Some(true) {
        return refuse(
            "allowPrivilegeEscalation",
            "privilege escalation is",
            "allowPrivileged",
        );
    }
    let added = sc.capabilities.as_ref().and_then(|c| c.add.as_ref());
    for (i, cap) in added.into_iter().flatten().enumerate() {
        let bare = cap.strip_prefix("CAP_").unwrap_or(cap);
        if !ns
            .allowed_capabilities
            .iter()
            .any(|a| a.strip_prefix("CAP_").unwrap_or(a).eq_ignore_ascii_case(bare))
        {
            return refuse(
                &format!("capabilities.add[{i}]"),
                &format!("capability {cap} is"),
                "allowedCapabilities",
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(spec: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(serde_json::json!({"spec": spec})).unwrap_or_default()
    }

    fn bounds(extra: serde_json::Value) -> ValidationBounds {
        let mut ns = serde_json::json!({"name": "gpu-validation", "serviceAccounts": ["gpunode-validation"]});
        if let (Some(o), serde_json::Value::Object(e)) = (ns.as_object_mut(), extra) {
            o.extend(e);
        }
        ValidationBounds::parse(&serde_json::json!([ns]).to_string()).unwrap_or_default()
    }

    fn container(security: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"containers": [
            {"name": "a", "image": "a"},
            {"name": "dcgm", "image": "nvcr.io/nvidia/cloud-native/dcgm", "securityContext": security},
        ]})
    }

    fn refused(b: &ValidationBounds, ns: &str, spec: serde_json::Value) -> String {
        b.admit(ns, template(spec)).err().unwrap_or_default()
    }

    #[test]
    fn a_plain_template_in_a_granted_namespace_gets_its_service_account() {
        let b = bounds(serde_json::json!({}));
        let t = b
            .admit(
                "gpu-validation",
                template(serde_json::json!({"containers": [{"name": "a", "image": "a"}]})),
            )
            .ok()
            .and_then(|t| t.spec)
            .and_then(|s| s.service_account_name);
        assert_eq!(t.as_deref(), Some("gpunode-validation"));
        let named = serde_json::json!({"serviceAccountName": "gpunode-validation", "containers": [{"name": "a", "image": "a"}]});
        assert!(b.admit("gpu-validation", template(named)).is_ok());
    }

    #[test]
    fn each_field_beyond_the_bounds_is_refused_by_name() {
        let b = bounds(serde_json::json!({}));
        let c = serde_json::json!([{"name": "a", "image": "a"}]);
        for (spec, want) in [
            (
                serde_json::json!({"hostPID": true, "containers": c}),
                "spec.validation.template.spec.hostPID: host namespaces are not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowHostNamespaces)",
            ),
            (
                serde_json::json!({"hostNetwork": true, "containers": c}),
                "spec.validation.template.spec.hostNetwork: host namespaces are not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowHostNamespaces)",
            ),
            (
                serde_json::json!({"hostIPC": true, "containers": c}),
                "spec.validation.template.spec.hostIPC: host namespaces are not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowHostNamespaces)",
            ),
            (
                serde_json::json!({"containers": c, "volumes": [{"name": "e", "emptyDir": {}}, {"name": "h", "hostPath": {"path": "/"}}]}),
                "spec.validation.template.spec.volumes[1].hostPath: hostPath volumes are not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowHostPath)",
            ),
            (
                serde_json::json!({"containers": [{"name": "a", "image": "a", "ports": [{"containerPort": 80}, {"containerPort": 81, "hostPort": 81}]}]}),
                "spec.validation.template.spec.containers[0].ports[1].hostPort: host ports are not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowHostNamespaces)",
            ),
            (
                container(serde_json::json!({"privileged": true})),
                "spec.validation.template.spec.containers[1].securityContext.privileged: privileged containers are not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowPrivileged)",
            ),
            (
                container(serde_json::json!({"allowPrivilegeEscalation": true})),
                "spec.validation.template.spec.containers[1].securityContext.allowPrivilegeEscalation: privilege escalation is not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowPrivileged)",
            ),
            (
                container(serde_json::json!({"capabilities": {"add": ["SYS_ADMIN"]}})),
                "spec.validation.template.spec.containers[1].securityContext.capabilities.add[0]: capability SYS_ADMIN is not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowedCapabilities)",
            ),
            (
                serde_json::json!({"initContainers": [{"name": "i", "image": "i", "securityContext": {"privileged": true}}], "containers": c}),
                "spec.validation.template.spec.initContainers[0].securityContext.privileged: privileged containers are not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowPrivileged)",
            ),
            (
                serde_json::json!({"initContainers": [{"name": "i", "image": "i", "ports": [{"containerPort": 53, "hostPort": 53}]}], "containers": c}),
                "spec.validation.template.spec.initContainers[0].ports[0].hostPort: host ports are not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].allowHostNamespaces)",
            ),
            (
                serde_json::json!({"serviceAccountName": "cluster-admin-sa", "containers": c}),
                "spec.validation.template.spec.serviceAccountName: ServiceAccount cluster-admin-sa is not allowed in namespace gpu-validation (chart value operator.validation.namespaces[].serviceAccounts)",
            ),
        ] {
            assert_eq!(refused(&b, "gpu-validation", spec), want);
        }
        assert_eq!(
            refused(&b, "kube-system", serde_json::json!({"containers": c})),
            "spec.validation.namespace: namespace kube-system is not granted to validation Jobs (chart value operator.validation.namespaces)"
        );
        assert_eq!(
            refused(
                &ValidationBounds::default(),
                "gpu-validation",
                serde_json::json!({"containers": c})
            ),
            "spec.validation.namespace: namespace gpu-validation is not granted to validation Jobs (chart value operator.validation.namespaces)",
            "no flag: nothing granted"
        );
    }

    #[test]
    fn what_the_chart_allows_for_a_namespace_is_admitted() {
        let dcgm = bounds(serde_json::json!({"allowedCapabilities": ["SYS_ADMIN"]}));
        let diag = container(serde_json::json!({"capabilities": {"add": ["SYS_ADMIN"]}}));
        assert!(dcgm.admit("gpu-validation", template(diag.clone())).is_ok());
        let cap = container(serde_json::json!({"capabilities": {"add": ["CAP_SYS_ADMIN"]}}));
        assert!(
            dcgm.admit("gpu-validation", template(cap)).is_ok(),
            "CAP_ is the same capability"
        );
        let other = container(serde_json::json!({"capabilities": {"add": ["NET_ADMIN"]}}));
        assert!(dcgm.admit("gpu-validation", template(other)).is_err());
        let all = bounds(
            serde_json::json!({"allowPrivileged": true, "allowHostNamespaces": true, "allowHostPath": true}),
        );
        let everything = serde_json::json!({
            "hostPID": true, "hostNetwork": true, "hostIPC": true,
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
            "containers": [{"name": "a", "image": "a", "securityContext": {"privileged": true, "capabilities": {"add": ["ALL"]}}}],
        });
        assert!(all.admit("gpu-validation", template(everything)).is_ok());
    }

    #[test]
    fn the_flag_is_a_json_list_and_bad_input_names_the_field() {
        assert_eq!(
            ValidationBounds::parse("").ok(),
            Some(ValidationBounds::default())
        );
        let b = ValidationBounds::parse(r#"[{"name":"v","serviceAccounts":["s"],"allowHostPath":true}]"#);
        assert_eq!(
            b.ok(),
            Some(ValidationBounds::new(vec![NamespaceBounds {
                name: "v".to_string(),
                service_accounts: vec!["s".to_string()],
                allow_host_path: true,
                ..NamespaceBounds::default()
            }]))
        );
        let bad = |t: &str| {
            ValidationBounds::parse(t)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(
            bad(r#"[{"name":"v","allowPrivileged":"yes"}]"#).starts_with(
                "--validation-namespaces (operator.validation.namespaces): [0].allowPrivileged: invalid type"
            ),
            "{}",
            bad(r#"[{"name":"v","allowPrivileged":"yes"}]"#)
        );
        assert!(
            bad(r#"[{"name":"v","allowPriviledged":true}]"#).contains("unknown field `allowPriviledged`")
        );
        assert_eq!(
            bad(r#"[{"name":""}]"#),
            "--validation-namespaces (operator.validation.namespaces): [0].name: must not be empty"
        );
    }

    #[test]
    fn remediation_objects_only_of_granted_kinds_and_in_granted_namespaces() {
        let b = RemediatorBounds::parse(
            r#"[{"apiGroup":"a.example","resources":["reboots"],"templates":["reboottemplates"],"namespaces":["ops"]},
                {"apiGroup":"b.example","resources":["machines"],"templates":["machinetemplates"]}]"#,
        )
        .unwrap_or_default();
        assert_eq!(b.admit("a.example", "reboots", Some("ops")), Ok(()));
        assert_eq!(
            b.admit("a.example", "reboots", Some("kube-system")),
            Err("spec.repair.steps[].remediator.namespace: reboots.a.example may not be made in namespace kube-system (chart value operator.remediators[].namespaces)".to_string())
        );
        assert!(
            b.admit("a.example", "reboots", None).is_err(),
            "not cluster-scoped when limited"
        );
        assert_eq!(
            b.admit("b.example", "machines", Some("anywhere")),
            Ok(()),
            "no namespaces: any"
        );
        assert_eq!(b.admit("b.example", "machines", None), Ok(()));
        assert_eq!(
            b.admit("c.example", "reboots", Some("ops")),
            Err("spec.repair.steps[].remediator: reboots.c.example is not granted to repair steps (chart value operator.remediators)".to_string())
        );
        assert!(
            RemediatorBounds::default()
                .admit("a.example", "reboots", Some("ops"))
                .is_err()
        );
        let bad = RemediatorBounds::parse(r#"[{"apiGroup":"a","resources":["r"],"namespace":["x"]}]"#);
        assert!(
            bad.err()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("unknown field `namespace`")
        );
    }
}
