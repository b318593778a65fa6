//! gpunode beside dcgm-exporter (README "With the GPU Operator and dcgm-exporter"): the chart as
//! the real helm renders it, with the probe on, next to a dcgm-exporter DaemonSet and Service laid
//! out as the GPU Operator runs them on the host network
//! (e2e/fixtures/dcgm-exporter/gpu-operator.yaml).
//!
//! - Ports: no port of the node is claimed by both (a host-network pod's container ports are
//!   ports of the node), and no Service port or target port is shared (a host-network backend's
//!   endpoint is the node's address, so a shared port would make one scrape target of two).
//! - Series: the names the probe really exports (`gpunode_probe::metrics::exported_series`,
//!   kept equal to a fully populated render by the probe's own tests) never enter dcgm-exporter's
//!   namespace and never equal one of its names, which come from README's mapping table; that
//!   table lists exactly the probe's GPU series; the chart's dashboard and alerts name only
//!   series the probe or the operator export.
//!
//! Needs only helm (`GPUNODE_HELM`, else `e2e/cluster/build.sh --print-env`), no control plane.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use gpunode_e2e::{chart, fixtures::repo_root};
use kube::api::DynamicObject;
use serde_json::Value;

/// The oldest Kubernetes the chart supports; nothing checked here depends on the version.
const KUBE_VERSION: &str = "1.33.0";

/// dcgm-exporter's port, as the GPU Operator deploys it.
const DCGM_EXPORTER_PORT: u16 = 9400;

/// Every series dcgm-exporter exports is a DCGM field's name or one of its own derived series,
/// all prefixed `DCGM_`: the namespace the probe must stay out of.
const DCGM_NAMESPACE: &str = "DCGM_";

/// Ports of other agents common on GPU nodes, on the host network or as host ports (README "With
/// the GPU Operator and dcgm-exporter"): node-exporter, the GPU Operator's node-status-exporter
/// and DCGM host engine, kubelet, kube-proxy, Cilium, Calico Felix, NFD.
const OTHER_NODE_AGENT_PORTS: &[(u16, &str)] = &[
    (9100, "node-exporter"),
    (8000, "GPU Operator node-status-exporter"),
    (5555, "DCGM host engine"),
    (10248, "kubelet healthz"),
    (10250, "kubelet"),
    (10255, "kubelet read-only"),
    (10249, "kube-proxy metrics"),
    (10256, "kube-proxy healthz"),
    (9962, "cilium-agent metrics"),
    (9963, "cilium-operator metrics"),
    (9964, "cilium envoy metrics"),
    (9965, "hubble metrics"),
    (9091, "calico-felix metrics"),
    (8080, "nfd metrics"),
    (8081, "nfd health"),
];

/// A port someone claims, and who.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Claim {
    port: u16,
    owner: String,
}

/// `helm template` of the chart with the probe on, plus `sets` (`key=value`).
fn render_chart(sets: &[&str]) -> Vec<DynamicObject> {
    let chart = chart::chart_dir().display().to_string();
    let mut args = vec![
        "template",
        "gpunode",
        chart.as_str(),
        "--namespace",
        "gpunode-system",
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "nodeProbe.enabled=true",
    ];
    for s in sets {
        args.extend(["--set", *s]);
    }
    chart::parse_manifests(&chart::run_helm(&args).unwrap()).unwrap()
}

fn dcgm_exporter() -> Vec<DynamicObject> {
    let path = repo_root().join("e2e/fixtures/dcgm-exporter/gpu-operator.yaml");
    chart::parse_manifests(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn kind_of(o: &DynamicObject) -> &str {
    o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or_default()
}

fn name_of(o: &DynamicObject) -> String {
    format!("{} {}", kind_of(o), o.metadata.name.as_deref().unwrap_or("?"))
}

fn port_of(v: &Value) -> Option<u16> {
    v.as_u64().and_then(|p| u16::try_from(p).ok())
}

/// The pod template of a workload.
fn pod_spec(o: &DynamicObject) -> Option<&Value> {
    match kind_of(o) {
        "DaemonSet" | "Deployment" | "StatefulSet" | "ReplicaSet" | "Job" => {
            Some(&o.data["spec"]["template"]["spec"])
        }
        "Pod" => Some(&o.data["spec"]),
        _ => None,
    }
}

fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers"]
        .into_iter()
        .filter_map(|k| spec[k].as_array())
        .flatten()
}

/// The ports of the node each workload's pods hold: every container port on the host network
/// (the host port is the container port there), else only explicit host ports.
fn node_ports(objects: &[DynamicObject]) -> Vec<Claim> {
    let mut out = Vec::new();
    for o in objects {
        let Some(spec) = pod_spec(o) else { continue };
        let host_network = spec["hostNetwork"].as_bool() == Some(true);
        for c in containers(spec) {
            for p in c["ports"].as_array().into_iter().flatten() {
                let port = if host_network {
                    port_of(&p["hostPort"]).or_else(|| port_of(&p["containerPort"]))
                } else {
                    port_of(&p["hostPort"])
                };
                if let Some(port) = port {
                    out.push(Claim {
                        port,
                        owner: format!("{} container {}", name_of(o), c["name"].as_str().unwrap_or("?")),
                    });
                }
            }
        }
    }
    out
}

/// Whether `labels` carry every `selector` pair.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
}

/// A Service's named target port, resolved on the workloads it selects.
fn named_target(selector: &Value, name: &str, objects: &[DynamicObject]) -> Vec<u16> {
    objects
        .iter()
        .filter(|o| selects(selector, &o.data["spec"]["template"]["metadata"]["labels"]))
        .filter_map(pod_spec)
        .flat_map(containers)
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .filter(|p| p["name"] == name)
        .filter_map(|p| port_of(&p["containerPort"]))
        .collect()
}

/// Each Service's ports and (resolved) target ports.
fn service_ports(objects: &[DynamicObject]) -> Vec<Claim> {
    let mut out = Vec::new();
    for s in objects.iter().filter(|o| kind_of(o) == "Service") {
        let selector = &s.data["spec"]["selector"];
        for p in s.data["spec"]["ports"].as_array().into_iter().flatten() {
            let owner = format!("{} port {}", name_of(s), p["name"].as_str().unwrap_or("?"));
            let port = port_of(&p["port"]);
            let targets = match &p["targetPort"] {
                Value::String(name) => named_target(selector, name, objects),
                Value::Null => port.into_iter().collect(),
                number => port_of(number).into_iter().collect(),
            };
            assert!(!targets.is_empty(), "{owner}: target port not found");
            for port in port.into_iter().chain(targets) {
                out.push(Claim {
                    port,
                    owner: owner.clone(),
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Every port claimed on both sides, with both claimants.
fn collisions(ours: &[Claim], theirs: &[Claim]) -> Vec<String> {
    let mut out = Vec::new();
    for a in ours {
        for b in theirs.iter().filter(|b| b.port == a.port) {
            out.push(format!("port {}: {} and {}", a.port, a.owner, b.owner));
        }
    }
    out
}

fn claims_on(claims: &[Claim], port: u16) -> bool {
    claims.iter().any(|c| c.port == port)
}

#[test]
fn probe_ports_do_not_collide_with_dcgm_exporter() {
    let ours = render_chart(&[]);
    let theirs = dcgm_exporter();
    let probe_port = gpunode_probe::config::DEFAULT_METRICS_PORT;

    // Not vacuous: the probe does hold a port of the node, the one the binary defaults to, and
    // dcgm-exporter holds 9400.
    let probe = ours
        .iter()
        .find(|o| kind_of(o) == "DaemonSet" && name_of(o).ends_with("-node-probe"))
        .expect("no probe DaemonSet rendered");
    let spec = pod_spec(probe).unwrap();
    assert_eq!(
        spec["hostNetwork"],
        Value::Bool(true),
        "the probe left the host network"
    );
    let args: Vec<&str> = spec["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        args.contains(&format!("--metrics-addr=0.0.0.0:{probe_port}").as_str()),
        "the chart's default metricsPort is not the probe's default {probe_port}: {args:?}"
    );
    let (our_node, their_node) = (node_ports(&ours), node_ports(&theirs));
    let (our_services, their_services) = (service_ports(&ours), service_ports(&theirs));
    assert!(claims_on(&our_node, probe_port), "{our_node:?}");
    assert!(claims_on(&our_services, probe_port), "{our_services:?}");
    assert!(claims_on(&their_node, DCGM_EXPORTER_PORT), "{their_node:?}");
    assert!(
        claims_on(&their_services, DCGM_EXPORTER_PORT),
        "{their_services:?}"
    );

    let clashes: Vec<String> = collisions(&our_node, &their_node)
        .into_iter()
        .chain(collisions(&our_services, &their_services))
        .collect();
    assert!(
        clashes.is_empty(),
        "gpunode and dcgm-exporter collide:\n{}",
        clashes.join("\n")
    );

    for c in &our_node {
        if let Some((_, agent)) = OTHER_NODE_AGENT_PORTS.iter().find(|(p, _)| *p == c.port) {
            panic!("{} takes port {} of the node, {agent}'s", c.owner, c.port);
        }
    }

    // The check does find a collision: the probe on dcgm-exporter's port is caught, on the node
    // and on the Service.
    let old = render_chart(&["nodeProbe.metricsPort=9400", "metrics.probeService.port=9400"]);
    let found = collisions(&node_ports(&old), &their_node);
    assert!(
        found
            .iter()
            .any(|c| c.contains("node-probe") && c.contains("nvidia-dcgm-exporter")),
        "{found:?}"
    );
    assert!(!collisions(&service_ports(&old), &their_services).is_empty());
}

/// README's mapping of the probe's GPU series to DCGM fields: (series, DCGM field or None), from
/// the table under "Metrics and alerts" whose header starts with `| probe series | type | DCGM field`.
fn readme_mapping() -> Vec<(String, Option<String>)> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let rows = readme
        .lines()
        .skip_while(|l| !l.starts_with("| probe series | type | DCGM field |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let mut out = Vec::new();
    for line in rows {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let series = cells[1].trim_matches('`');
        let series = series.split('{').next().unwrap_or(series).to_string();
        let dcgm = match cells[3] {
            "none" => None,
            field => Some(field.trim_matches('`').to_string()),
        };
        out.push((series, dcgm));
    }
    assert!(
        out.len() > 20,
        "README's mapping table not found or cut short: {out:?}"
    );
    out
}

/// Every identifier in `text` that starts with `prefix`.
fn identifiers<'a>(text: &'a str, prefix: &str) -> BTreeSet<&'a str> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(&tail[..end]);
        rest = &tail[end..];
    }
    out
}

#[test]
fn probe_series_share_no_name_with_dcgm_exporter() {
    let exported: BTreeSet<String> = gpunode_probe::metrics::exported_series().into_iter().collect();
    assert!(exported.len() > 30, "{exported:?}");
    let mapping = readme_mapping();
    let dcgm_names: BTreeSet<&str> = mapping.iter().filter_map(|(_, d)| d.as_deref()).collect();
    for d in &dcgm_names {
        assert!(
            d.starts_with(DCGM_NAMESPACE),
            "README maps to {d}, not a dcgm-exporter name"
        );
    }

    for s in &exported {
        assert!(
            !s.starts_with(DCGM_NAMESPACE),
            "the probe exports {s}, in dcgm-exporter's namespace"
        );
        assert!(
            !dcgm_names.contains(s.as_str()),
            "the probe exports {s}, a dcgm-exporter name"
        );
    }

    // The table is the documentation of the GPU series: exactly what the probe exports, once each.
    let documented: Vec<&str> = mapping.iter().map(|(s, _)| s.as_str()).collect();
    let documented_set: BTreeSet<&str> = documented.iter().copied().collect();
    assert_eq!(documented.len(), documented_set.len(), "a series mapped twice");
    let gpu_series: BTreeSet<&str> = exported
        .iter()
        .map(String::as_str)
        .filter(|s| s.starts_with("gpunode_probe_gpu_"))
        .collect();
    assert_eq!(
        documented_set, gpu_series,
        "README's mapping table and the probe differ"
    );

    // What the chart ships (dashboard, alerts, every comment) names only real probe series and
    // nothing of dcgm-exporter's.
    let chart = chart::chart_dir().display().to_string();
    let rendered = chart::run_helm(&[
        "template",
        "gpunode",
        chart.as_str(),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.grafanaDashboard.enabled=true",
    ])
    .unwrap();
    assert!(
        rendered.contains("gpunode_probe_gpu_temperature_celsius"),
        "the dashboard lost its GPU panel"
    );
    let unknown: Vec<&str> = identifiers(&rendered, "gpunode_probe_")
        .into_iter()
        .filter(|n| !exported.contains(*n))
        .collect();
    assert!(
        unknown.is_empty(),
        "the chart names series the probe does not export: {unknown:?}"
    );
    let theirs = identifiers(&rendered, DCGM_NAMESPACE);
    assert!(
        theirs.is_empty(),
        "the chart names dcgm-exporter series: {theirs:?}"
    );
}

#[test]
fn identifiers_finds_whole_names() {
    let found = identifiers(
        "max(gpunode_probe_gpu_x{a=\"b\"}) + gpunode_probe_y[5m]",
        "gpunode_probe_",
    );
    assert_eq!(found, BTreeSet::from(["gpunode_probe_gpu_x", "gpunode_probe_y"]));
}
