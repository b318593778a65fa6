//! `kubectl gpunode gpus [NODE | -l SELECTOR]`: one row per GPU of the nodes' reports.

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::report::GpuStatus;
use gpunode_operator::{markers::UNHEALTHY_GPUS_ANNOTATION, plan::NodeView, verdict::Verdict};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde::Serialize;

use crate::{
    error::Error,
    live::Snapshot,
    render::{
        list,
        style::{Style, Tone},
        table::{Cell, Table},
    },
};

/// Every GPU shown.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpus {
    /// One per GPU, by node then index.
    pub gpus: Vec<GpuRow>,
    /// What could not be read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One GPU.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuRow {
    /// Its node.
    pub node: String,
    /// Its NVML index.
    pub index: u32,
    /// Its UUID, if the probe read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Its product name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Its verdict under the node's policy.
    pub state: GpuState,
    /// Its failed checks (`Xid gpu.fatalXids`) and checks that could not be made.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drifts: Vec<String>,
    /// gpunode's quarantine of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<Quarantine>,
    /// The pods holding it (absent: the probe does not read the kubelet's PodResources API).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods: Option<Vec<String>>,
}

/// A GPU's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuState {
    /// Its checks pass.
    Ok,
    /// A check of it failed.
    Drifted,
    /// A check of it could not be made (or the node's report is stale).
    Unknown,
    /// No policy governs its node.
    Ungoverned,
}

/// How a GPU is quarantined.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Quarantine {
    /// `DeviceTaintRule` (a DRA device) or `annotation` (gpunode.dev/unhealthy-gpus).
    pub by: String,
    /// The DeviceTaintRule's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// None, NoSchedule or NoExecute, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
}

/// The GPUs of `nodes` (each must have a report when `strict`; otherwise those without one are
/// left out).
pub fn gpus(snapshot: &Snapshot, nodes: &[&Node], strict: bool) -> Result<Gpus, Error> {
    let mut governed = BTreeMap::new();
    let mut rows = Vec::new();
    for node in nodes {
        let name = node.name_any();
        let Some(report) = snapshot.report(&name) else {
            if strict {
                return Err(Error::NotFound(format!(
                    "node {name} has no readable GpuNodeReport: its probe has not published one"
                )));
            }
            continue;
        };
        let view = match snapshot.governing(node) {
            Ok(p) => governed
                .entry(p.name_any())
                .or_insert_with(|| snapshot.govern(p))
                .views
                .iter()
                .find(|v| v.name == name)
                .cloned(),
            Err(_) => None,
        };
        let gpus = report
            .status
            .as_ref()
            .map(|s| s.gpus.as_slice())
            .unwrap_or_default();
        let quarantine = quarantines(snapshot, node, view.as_ref());
        rows.extend(gpus.iter().map(|g| row(&name, g, view.as_ref(), &quarantine)));
    }
    Ok(Gpus {
        gpus: rows,
        notes: snapshot.notes.clone(),
    })
}

fn row(
    node: &str,
    g: &GpuStatus,
    view: Option<&NodeView>,
    quarantine: &BTreeMap<String, Quarantine>,
) -> GpuRow {
    let (state, drifts) = match view {
        Some(v) => gpu_verdict(&v.verdict, g.index),
        None => (GpuState::Ungoverned, Vec::new()),
    };
    let key = gpunode_operator::markers::gpu_key(g.index, g.uuid.as_deref());
    GpuRow {
        node: node.to_string(),
        index: g.index,
        uuid: g.uuid.clone(),
        product: g.product.clone(),
        state,
        drifts,
        quarantine: quarantine.get(&key).map(|q| Quarantine {
            by: q.by.clone(),
            name: q.name.clone(),
            effect: q.effect.clone(),
        }),
        pods: g.pods.as_ref().map(|pods| {
            pods.iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect()
        }),
    }
}

/// The GPU's own findings: drifted if a check of it failed, unknown if one could not be made
/// or the whole report is unknown.
fn gpu_verdict(verdict: &Verdict, index: u32) -> (GpuState, Vec<String>) {
    let drifts: Vec<String> = verdict
        .drifts
        .iter()
        .filter(|d| d.gpu == Some(index))
        .map(|d| format!("{} {}", d.class.as_str(), d.check))
        .collect();
    let unknowns: Vec<String> = verdict
        .unknowns
        .iter()
        .filter(|u| u.gpu == Some(index) || u.gpu.is_none())
        .map(|u| format!("Unknown {}", u.check))
        .collect();
    let state = if !drifts.is_empty() {
        GpuState::Drifted
    } else if !unknowns.is_empty() {
        GpuState::Unknown
    } else {
        GpuState::Ok
    };
    (state, drifts.into_iter().chain(unknowns).collect())
}

/// gpunode's quarantines on the node by GPU key: its DeviceTaintRules, and the GPUs its
/// `gpunode.dev/unhealthy-gpus` annotation names (effect from its bookkeeping).
fn quarantines(snapshot: &Snapshot, node: &Node, view: Option<&NodeView>) -> BTreeMap<String, Quarantine> {
    let effects: BTreeMap<String, String> = view
        .map(|v| {
            v.markers
                .quarantines()
                .map(|(gpu, _, effect)| (gpu.to_string(), effect.as_str().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let mut out: BTreeMap<String, Quarantine> = snapshot
        .rules_of(&node.name_any())
        .into_iter()
        .map(|(gpu, rule)| {
            let q = Quarantine {
                by: "DeviceTaintRule".to_string(),
                name: Some(rule.name_any()),
                effect: Some(rule.spec.taint.effect.clone()),
            };
            (gpu, q)
        })
        .collect();
    let annotated: BTreeSet<&str> = node
        .annotations()
        .get(UNHEALTHY_GPUS_ANNOTATION)
        .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    for uuid in annotated {
        out.entry(uuid.to_string()).or_insert_with(|| Quarantine {
            by: "annotation".to_string(),
            name: None,
            effect: effects.get(uuid).cloned(),
        });
    }
    out
}

impl Gpus {
    /// Whether no GPU drifts, is unknown or quarantined.
    pub fn all_ok(&self) -> bool {
        self.gpus
            .iter()
            .all(|g| matches!(g.state, GpuState::Ok | GpuState::Ungoverned) && g.quarantine.is_none())
    }

    /// The text table.
    pub fn text(&self, style: Style) -> String {
        let mut t = Table::new(&[
            "NODE",
            "GPU",
            "UUID",
            "PRODUCT",
            "STATE",
            "DRIFTS",
            "QUARANTINE",
            "PODS",
        ]);
        for g in &self.gpus {
            let (state, tone) = match g.state {
                GpuState::Ok => ("ok", Tone::Good),
                GpuState::Drifted => ("drifted", Tone::Bad),
                GpuState::Unknown => ("unknown", Tone::Warn),
                GpuState::Ungoverned => ("-", Tone::Warn),
            };
            let quarantine = match &g.quarantine {
                None => Cell::from("-"),
                Some(q) => Cell::toned(
                    format!("{} {}", q.by, q.effect.as_deref().unwrap_or(""))
                        .trim_end()
                        .to_string(),
                    Tone::Bad,
                ),
            };
            t.row(vec![
                g.node.as_str().into(),
                g.index.to_string().into(),
                g.uuid.as_deref().unwrap_or("-").into(),
                g.product.as_deref().unwrap_or("-").into(),
                Cell::toned(state, tone),
                list(&g.drifts, ", ").into(),
                quarantine,
                match &g.pods {
                    None => "-".to_string(),
                    Some(p) if p.is_empty() => "none".to_string(),
                    Some(p) => p.join(","),
                }
                .into(),
            ]);
        }
        let mut out = if self.gpus.is_empty() {
            "no GPUs: no node shown has a GpuNodeReport\n".to_string()
        } else {
            t.render(style)
        };
        for n in &self.notes {
            out.push_str(&format!("\nnote: {n}\n"));
        }
        out
    }
}
