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
    /// The pods holding it: from the kubelet's PodResources API in its report, or, on a DRA
    /// node, from the ResourceClaims its device is allocated to (absent: neither is known).
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
        let dra_pods = snapshot.dra.as_ref().and_then(|d| d.pods_of(&name));
        rows.extend(gpus.iter().map(|g| {
            let mut r = row(&name, g, view.as_ref(), &quarantine);
            // A DRA node's pods come from its ResourceClaims, not from its report.
            if r.pods.is_none() {
                let uuid = g.uuid.as_deref().unwrap_or_default();
                r.pods = dra_pods.as_ref().and_then(|p| p.get(uuid).cloned());
            }
            r
        }));
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

/// The distinct classes of a GPU's findings (`Memory,Xid`), for the table; JSON and YAML list
/// each check.
fn classes(findings: &[String]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for f in findings {
        let class = f.split_once(' ').map_or(f.as_str(), |(c, _)| c).to_string();
        if !seen.contains(&class) {
            seen.push(class);
        }
    }
    list(&seen, ",")
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
                classes(&g.drifts).into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(
        index: u32,
        state: GpuState,
        drifts: &[&str],
        quarantine: Option<Quarantine>,
        pods: Option<&[&str]>,
    ) -> GpuRow {
        GpuRow {
            node: "gpu-1".into(),
            index,
            uuid: Some(format!("GPU-{index}")),
            product: Some("NVIDIA H100 80GB HBM3".into()),
            state,
            drifts: drifts.iter().map(|s| s.to_string()).collect(),
            quarantine,
            pods: pods.map(|p| p.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn one_row_per_gpu_with_its_classes_quarantine_and_pods() {
        let gpus = Gpus {
            gpus: vec![
                row(0, GpuState::Ok, &[], None, Some(&[])),
                row(
                    5,
                    GpuState::Drifted,
                    &[
                        "Memory gpu.allowRowRemapFailure",
                        "Xid gpu.fatalXids",
                        "Memory gpu.maxVolatileUncorrectedEcc",
                    ],
                    Some(Quarantine {
                        by: "DeviceTaintRule".into(),
                        name: Some("gpunode-gpu-1-GPU-5".into()),
                        effect: Some("NoExecute".into()),
                    }),
                    Some(&["training/a", "training/b"]),
                ),
                row(6, GpuState::Unknown, &["Unknown gpu.eccMode"], None, None),
                row(
                    7,
                    GpuState::Ungoverned,
                    &[],
                    Some(Quarantine {
                        by: "annotation".into(),
                        name: None,
                        effect: None,
                    }),
                    None,
                ),
            ],
            notes: Vec::new(),
        };
        let want = "\
NODE    GPU   UUID    PRODUCT                 STATE     DRIFTS       QUARANTINE                  PODS
gpu-1   0     GPU-0   NVIDIA H100 80GB HBM3   ok        -            -                           none
gpu-1   5     GPU-5   NVIDIA H100 80GB HBM3   drifted   Memory,Xid   DeviceTaintRule NoExecute   training/a,training/b
gpu-1   6     GPU-6   NVIDIA H100 80GB HBM3   unknown   Unknown      -                           -
gpu-1   7     GPU-7   NVIDIA H100 80GB HBM3   -         -            annotation                  -
";
        assert_eq!(gpus.text(Style::plain()), want);
        assert!(!gpus.all_ok());
        let v = serde_json::to_value(&gpus).unwrap_or_default();
        assert_eq!(v["gpus"][1]["quarantine"]["by"], "DeviceTaintRule");
        assert_eq!(v["gpus"][1]["drifts"][1], "Xid gpu.fatalXids");
        assert_eq!(v["gpus"][3]["state"], "ungoverned");
        assert!(
            v["gpus"][2].get("pods").is_none(),
            "absent when the probe does not read pods"
        );
    }

    #[test]
    fn a_gpu_is_unknown_when_the_whole_report_is() {
        let verdict = Verdict::new(
            Vec::new(),
            vec![gpunode_operator::verdict::Unknown {
                check: "report".into(),
                reason: "report is 5m old (staleAfter 3m)".into(),
                gpu: None,
            }],
        );
        assert_eq!(
            gpu_verdict(&verdict, 3),
            (GpuState::Unknown, vec!["Unknown report".to_string()])
        );
    }
}
