//! Per-GPU quarantine, the part of the planner that acts on one GPU (`TaintDevice` rules), and
//! what it says: the quarantines, an escalation, their Events. Pure, like the rest of the
//! planner.
//!
//! - A class listed by a `TaintDevice` rule is *GPU-handled*: its drifts are tracked per GPU
//!   (keyed by UUID, with the same hysteresis as the node's classes), and a GPU whose class has
//!   lasted a rule's `after` is quarantined with the rule's effect (the strongest, when several
//!   fire).
//! - The node's other rules act on a GPU-handled class only once the node is *escalated*: more
//!   GPUs due for quarantine than `quarantine.maxGpusPerNode`, or a GPU due for it that cannot be
//!   quarantined on its own (no UUID, or not among the node's DRA devices). Such a GPU is named in
//!   the condition and an event, never guessed.
//! - A GPU's quarantine is undone once none of its classes has been active for `healthyFor`.
//!
//! A feature planner: it says what the `TaintDevice` rules want and where a quarantine goes;
//! whether one may start now is admission's answer, asked by the pass like for any action of
//! the ladder. It may import the layers below it (view, output, hysteresis), never admission (it
//! decides nothing), the node plan, the pass or another feature planner.

use std::collections::{BTreeMap, BTreeSet};

use gpunode_crds::{
    DriftClass, GpuNodePolicySpec,
    policy::{RemediationAction, TaintEffect},
};
use jiff::Timestamp;

use super::{
    hysteresis::{elapsed, signed, track_set},
    output::{Action, GpuTaint, NodeCondition, PlannedEvent},
    view::{DeviceRef, NodeDevices, NodeView, PodRef},
};
use crate::{
    markers::{GpuTrack, gpu_key},
    reasons::Reason,
};

/// Where a planned quarantine goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuarantineTarget {
    /// A DeviceTaintRule on this device.
    Dra(DeviceRef),
    /// The `gpunode.dev/unhealthy-gpus` annotation, and these pods evicted (NoExecute only).
    DevicePlugin {
        /// The pods holding the GPU, to evict (empty unless the effect is NoExecute).
        evict: Vec<PodRef>,
        /// When the probe saw them there (pods created later are never evicted for it).
        observed_at: Option<Timestamp>,
    },
}

/// One quarantine of the plan, with where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantine {
    /// The GPU and effect.
    pub taint: GpuTaint,
    /// Where.
    pub target: QuarantineTarget,
}

impl Quarantine {
    /// The GPU it quarantines, as a GPU reset names it, once it is idle: a NoExecute
    /// quarantine on a device-plugin node whose report lists no pod holding the GPU any more,
    /// of a GPU with a UUID. On a DRA node gpunode does not see which pods hold a device, so a
    /// quarantined GPU there is reset only after a drain.
    pub fn idle_gpu(&self) -> Option<crate::markers::ResetGpu> {
        let idle = self.taint.effect == TaintEffect::NoExecute
            && matches!(&self.target, QuarantineTarget::DevicePlugin { evict, .. } if evict.is_empty());
        (idle && !self.taint.gpu.starts_with("index-")).then(|| crate::markers::ResetGpu {
            index: self.taint.index,
            uuid: self.taint.gpu.clone(),
        })
    }

    /// The pods this quarantine evicts on its own (a NoExecute quarantine on a device-plugin
    /// node); empty otherwise.
    pub fn evicts(&self) -> &[PodRef] {
        match &self.target {
            QuarantineTarget::DevicePlugin { evict, .. } => evict,
            QuarantineTarget::Dra(_) => &[],
        }
    }

    /// `ns/a, ns/b`: the pods it evicts.
    pub fn evicted_names(&self) -> String {
        let names: Vec<String> = self.evicts().iter().map(PodRef::to_string).collect();
        names.join(", ")
    }
}

/// The quarantine of GPU `gpu` (its key) among `quarantines`.
pub fn quarantine_of<'a>(quarantines: &'a [Quarantine], gpu: &str) -> Option<&'a Quarantine> {
    quarantines.iter().find(|q| q.taint.gpu == gpu)
}

/// Why a node's GPU faults went to the node's own rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Escalation {
    /// More GPUs are due for quarantine than `quarantine.maxGpusPerNode`.
    TooMany {
        /// Their indexes.
        due: Vec<u32>,
        /// The limit.
        max: u32,
    },
    /// A GPU due for quarantine cannot be quarantined on its own.
    NotQuarantinable {
        /// Its index.
        index: u32,
        /// Why, for example `the probe reports no UUID for it`.
        why: String,
    },
}

impl Escalation {
    /// One line for the condition and the event.
    pub fn describe(&self) -> String {
        match self {
            Escalation::TooMany { due, max } => {
                let list: Vec<String> = due.iter().map(u32::to_string).collect();
                format!(
                    "{} GPUs are due for quarantine ({}), more than quarantine.maxGpusPerNode {max}: the node's rules act",
                    due.len(),
                    list.join(", ")
                )
            }
            Escalation::NotQuarantinable { index, why } => {
                format!("gpu {index} cannot be quarantined on its own ({why}): the node's rules act")
            }
        }
    }
}

/// The classes the policy's `TaintDevice` rules handle per GPU.
pub fn handled(policy: &GpuNodePolicySpec) -> BTreeSet<DriftClass> {
    policy
        .remediation
        .iter()
        .filter(|r| r.action == RemediationAction::TaintDevice)
        .flat_map(|r| r.classes.iter().copied())
        .filter(|c| c.is_gpu_scoped())
        .collect()
}

/// Updates the per-GPU tracks from the node's verdict: each GPU's GPU-handled drifts start,
/// resume or clear as the node's classes do. A GPU the report no longer lists is drifting in
/// nothing (the node's Inventory check sees it missing). While some check of the node is unknown
/// nothing new is considered cleared. Tracks with nothing active and no quarantine are dropped.
pub fn track(
    old: &BTreeMap<String, GpuTrack>,
    node: &NodeView,
    handled: &BTreeSet<DriftClass>,
    healthy_for: jiff::SignedDuration,
    now: Timestamp,
) -> BTreeMap<String, GpuTrack> {
    if handled.is_empty() && old.is_empty() {
        return BTreeMap::new();
    }
    let evidence_of_health = node.verdict.unknowns.is_empty();
    let mut drifting: BTreeMap<String, (u32, BTreeSet<DriftClass>)> = node
        .gpus
        .iter()
        .map(|g| (g.key(), (g.index, BTreeSet::new())))
        .collect();
    let keys: BTreeMap<u32, String> = node.gpus.iter().map(|g| (g.index, g.key())).collect();
    for d in &node.verdict.drifts {
        let (Some(index), true) = (d.gpu, handled.contains(&d.class)) else {
            continue;
        };
        let key = keys.get(&index).cloned().unwrap_or_else(|| gpu_key(index, None));
        drifting
            .entry(key)
            .or_insert_with(|| (index, BTreeSet::new()))
            .1
            .insert(d.class);
    }
    for (key, g) in old {
        drifting
            .entry(key.clone())
            .or_insert_with(|| (g.index, BTreeSet::new()));
    }
    let mut out = BTreeMap::new();
    for (key, (index, classes)) in drifting {
        let before = old.get(&key);
        let tracks = track_set(
            before.map(|g| &g.classes).unwrap_or(&BTreeMap::new()),
            &classes,
            evidence_of_health,
            healthy_for,
            now,
        );
        let quarantined = before.and_then(|g| g.quarantined);
        if tracks.is_empty() && quarantined.is_none() {
            continue;
        }
        out.insert(
            key,
            GpuTrack {
                index,
                classes: tracks,
                quarantined,
            },
        );
    }
    out
}

/// The quarantine the `TaintDevice` rules ask for, per GPU key: the strongest effect of the
/// rules with a class active on that GPU for the rule's `after`.
pub fn wanted(
    policy: &GpuNodePolicySpec,
    tracks: &BTreeMap<String, GpuTrack>,
    now: Timestamp,
) -> BTreeMap<String, TaintEffect> {
    let mut out: BTreeMap<String, TaintEffect> = BTreeMap::new();
    for rule in policy
        .remediation
        .iter()
        .filter(|r| r.action == RemediationAction::TaintDevice)
    {
        // Rejected by the API server; a rule that slipped through does nothing.
        let Some(effect) = rule.effect.filter(|e| *e != TaintEffect::PreferNoSchedule) else {
            continue;
        };
        let after = signed(rule.after);
        for (key, track) in tracks {
            let firing = rule.classes.iter().any(|c| {
                track
                    .classes
                    .get(c)
                    .is_some_and(|t| elapsed(now, t.since) >= after)
            });
            if firing {
                let e = out.entry(key.clone()).or_insert(effect);
                *e = (*e).max(effect);
            }
        }
    }
    out
}

/// Whether the GPU with this key can be quarantined on its own on this node, and where.
pub fn target(
    key: &str,
    effect: TaintEffect,
    devices: &NodeDevices,
    driver: &str,
) -> Result<QuarantineTarget, String> {
    if key.starts_with("index-") {
        return Err("the probe reports no UUID for it".to_string());
    }
    match devices {
        NodeDevices::Dra(by_uuid) => by_uuid
            .get(key)
            .cloned()
            .map(QuarantineTarget::Dra)
            .ok_or_else(|| format!("no device with UUID {key} in the node's ResourceSlices of {driver}")),
        NodeDevices::DevicePlugin(pods) => match (effect, pods.as_ref().map(|p| (p.by_gpu.get(key), p))) {
            (TaintEffect::NoExecute, None | Some((None, _))) => Err(
                "a device-plugin node whose report does not say which pods hold the GPU, so they cannot be evicted alone"
                    .to_string(),
            ),
            (TaintEffect::NoExecute, Some((Some(evict), pods))) => Ok(QuarantineTarget::DevicePlugin {
                evict: evict.clone(),
                observed_at: pods.observed_at,
            }),
            _ => Ok(QuarantineTarget::DevicePlugin {
                evict: Vec::new(),
                observed_at: None,
            }),
        },
        NodeDevices::Unknown => Ok(QuarantineTarget::DevicePlugin {
            evict: Vec::new(),
            observed_at: None,
        }),
    }
}

/// What the ladder wants for the node's GPUs: the quarantines it can take, and whether the node
/// is escalated (and why).
pub struct GpuWanted {
    /// The quarantines, by GPU key.
    pub taints: BTreeMap<String, GpuTaint>,
    /// Why the node's own rules act on the GPU-handled classes, if they do.
    pub escalation: Option<Escalation>,
}

/// The quarantines the rules want on a node with these tracks and devices, and its escalation.
pub fn decide(
    policy: &GpuNodePolicySpec,
    tracks: &BTreeMap<String, GpuTrack>,
    devices: &NodeDevices,
    now: Timestamp,
) -> GpuWanted {
    let due = wanted(policy, tracks, now);
    let driver = policy.quarantine.dra_driver.as_str();
    let mut taints = BTreeMap::new();
    let mut escalation = None;
    for (key, effect) in &due {
        let index = tracks.get(key).map_or(0, |t| t.index);
        match target(key, *effect, devices, driver) {
            Ok(_) => {
                taints.insert(
                    key.clone(),
                    GpuTaint {
                        gpu: key.clone(),
                        index,
                        effect: *effect,
                    },
                );
            }
            Err(why) => {
                escalation.get_or_insert(Escalation::NotQuarantinable { index, why });
            }
        }
    }
    let max = policy.quarantine.max_gpus_per_node;
    if u32::try_from(due.len()).unwrap_or(u32::MAX) > max {
        let mut indexes: Vec<u32> = due.keys().map(|k| tracks.get(k).map_or(0, |t| t.index)).collect();
        indexes.sort_unstable();
        escalation = Some(Escalation::TooMany { due: indexes, max });
    }
    GpuWanted { taints, escalation }
}

/// How many of the node's GPUs neither drift in a GPU-scoped class nor are quarantined; `None`
/// when the report lists no GPU.
pub fn healthy(node: &NodeView, quarantined: &BTreeSet<u32>) -> Option<u32> {
    if node.gpus.is_empty() {
        return None;
    }
    let sick: BTreeSet<u32> = node
        .verdict
        .drifts
        .iter()
        .filter(|d| d.class.is_gpu_scoped())
        .filter_map(|d| d.gpu)
        .chain(quarantined.iter().copied())
        .collect();
    let healthy = node.gpus.iter().filter(|g| !sick.contains(&g.index)).count();
    Some(u32::try_from(healthy).unwrap_or(u32::MAX))
}

/// The node's GPUs once a plan's actions are in effect.
pub struct GpusAfter<'e> {
    /// The quarantines in effect, by GPU key.
    pub taints: BTreeMap<&'e str, &'e GpuTaint>,
    /// Each GPU's track, recording its quarantine; those with nothing active and no quarantine
    /// are dropped.
    pub tracks: BTreeMap<String, GpuTrack>,
    /// The quarantines, each with where it goes.
    pub quarantines: Vec<Quarantine>,
    /// For the `gpunode.dev/healthy-gpus` label: GPUs neither drifting nor quarantined.
    pub healthy: Option<u32>,
}

/// The node's GPUs once `effective` (the actions in effect after the plan) is: each GPU's track
/// records the quarantine in effect, and each quarantine where it goes.
pub fn after<'e>(
    policy: &GpuNodePolicySpec,
    node: &NodeView,
    effective: &'e BTreeSet<Action>,
    mut tracks: BTreeMap<String, GpuTrack>,
) -> GpusAfter<'e> {
    let taints: BTreeMap<&str, &GpuTaint> = effective
        .iter()
        .filter_map(|a| match a {
            Action::TaintDevice(t) => Some((t.gpu.as_str(), t)),
            _ => None,
        })
        .collect();
    for (key, track) in &mut tracks {
        track.quarantined = taints.get(key.as_str()).map(|t| t.effect);
    }
    tracks.retain(|_, t| !t.classes.is_empty() || t.quarantined.is_some());
    let driver = policy.quarantine.dra_driver.as_str();
    let quarantines: Vec<Quarantine> = taints
        .values()
        .filter_map(|t| {
            target(&t.gpu, t.effect, &node.devices, driver)
                .ok()
                .map(|target| Quarantine {
                    taint: (*t).clone(),
                    target,
                })
        })
        .collect();
    let quarantined: BTreeSet<u32> = taints.values().map(|t| t.index).collect();
    let healthy = healthy(node, &quarantined);
    GpusAfter {
        taints,
        tracks,
        quarantines,
        healthy,
    }
}

/// ` on device <driver>/<pool>/<device>` when the GPU's quarantine is a DRA device taint.
pub fn on_device(quarantines: &[Quarantine], t: &GpuTaint) -> String {
    match quarantine_of(quarantines, &t.gpu).map(|q| &q.target) {
        Some(QuarantineTarget::Dra(device)) => format!(" on device {device}"),
        _ => String::new(),
    }
}

/// The node condition's words for its GPUs: the quarantines in effect and an escalation.
pub fn condition(
    condition: &mut NodeCondition,
    taints: &BTreeMap<&str, &GpuTaint>,
    quarantines: &[Quarantine],
    escalation: Option<&Escalation>,
) {
    if !taints.is_empty() {
        let list: Vec<String> = taints
            .values()
            .map(|t| {
                format!(
                    "{} {}{}",
                    t.subject(),
                    t.effect.as_str(),
                    on_device(quarantines, t)
                )
            })
            .collect();
        condition.message = format!("{}; quarantined: {}", condition.message, list.join(", "));
    }
    if let Some(e) = escalation {
        condition.message = format!("{}; escalated: {}", condition.message, e.describe());
    }
}

/// Events for the GPUs: quarantines added and lifted, and an escalation that begins.
pub fn events(
    node: &NodeView,
    taints: &BTreeMap<&str, &GpuTaint>,
    quarantines: &[Quarantine],
    escalation: Option<&Escalation>,
) -> Vec<PlannedEvent> {
    let mut out = Vec::new();
    let before: BTreeMap<&str, (u32, TaintEffect)> =
        node.markers.quarantines().map(|(k, i, e)| (k, (i, e))).collect();
    for (key, t) in taints {
        if before.get(key).map(|(_, e)| *e) != Some(t.effect) {
            let mut note = format!(
                "quarantined {}{} with effect {}",
                t.subject(),
                on_device(quarantines, t),
                t.effect.as_str()
            );
            if let Some(q) = quarantine_of(quarantines, &t.gpu).filter(|q| !q.evicts().is_empty()) {
                note.push_str(&format!("; evicting the pods holding it: {}", q.evicted_names()));
            }
            out.push(PlannedEvent {
                warning: true,
                reason: Reason::GpuQuarantined,
                note,
            });
        }
    }
    for (key, (index, _)) in &before {
        if !taints.contains_key(key) {
            let t = GpuTaint {
                gpu: (*key).to_string(),
                index: *index,
                effect: TaintEffect::None,
            };
            out.push(PlannedEvent {
                warning: false,
                reason: Reason::GpuReleased,
                note: format!("quarantine of {} lifted after recovery", t.subject()),
            });
        }
    }
    if let Some(e) = escalation
        && node.markers.escalated.is_none()
    {
        out.push(PlannedEvent {
            warning: true,
            reason: Reason::Escalated,
            note: e.describe(),
        });
    }
    out
}
