//! `--gpu-reset`: the probe answers its own node's GpuResetRequests, one at a time.
//!
//! The operator makes a request for each GPU a `GpuReset` repair step resets, once the node is
//! drained. The probe takes a request (status `Resetting`), resets the GPU through NVML only if
//! the GPU at that index still has the request's UUID and no process uses it, writes the
//! outcome (`Succeeded` or `Failed`, with the `Succeeded` condition the operator reads), and
//! then publishes a fresh report at once: the operator judges the reset by the first report
//! observed after the outcome was written.
//!
//! A request the probe finds `Resetting` that it did not take itself was taken by a probe that
//! stopped mid-reset: its outcome is unknown, so it is failed, never run twice (the repair
//! ladder moves on to its next step).
//!
//! The chart runs the resets apart from the observing probe (`--gpu-reset-only` in a privileged
//! DaemonSet of its own, on the nodes that opt in); the observing probe then follows its node's
//! requests read-only (`--follow-resets`): after a reset succeeded it forgets the GPU's XIDs,
//! restarts its XID thread and publishes a fresh report at once, as it does after its own reset.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gpunode_crds::GpuResetRequest;
use gpunode_crds::{
    names,
    reset::{GpuResetRequestStatus, NODE_LABEL, ResetPhase, SUCCEEDED},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tracing::Instrument;

use crate::nvml::NvmlCollector;
use crate::nvml::reset::ResetError;

/// Field manager of the probe's status writes.
const FIELD_MANAGER: &str = "gpunode-probe";
/// Attempts at writing one status before the request is left to the operator's timeout.
const STATUS_ATTEMPTS: u32 = 4;
/// The first pause between them (doubled each time).
const STATUS_BACKOFF: Duration = Duration::from_millis(500);

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Succeeded or Failed.
    pub phase: ResetPhase,
    /// The condition's reason (`Reset`, `InUse`, `OtherGpu`, `NvmlError`, `ProbeRestarted`,
    /// `OtherNode`).
    pub reason: &'static str,
    /// What happened.
    pub message: String,
}

impl Outcome {
    fn of(index: u32, uuid: &str, result: Result<(), ResetError>) -> Outcome {
        match result {
            Ok(()) => Outcome {
                phase: ResetPhase::Succeeded,
                reason: "Reset",
                message: format!("GPU {index} ({uuid}) was drained, removed and discovered again"),
            },
            Err(e) => Outcome {
                phase: ResetPhase::Failed,
                reason: e.reason(),
                message: e.to_string(),
            },
        }
    }
}

/// The status a finished request gets.
pub fn finished(outcome: &Outcome, started: Option<Time>, now: jiff::Timestamp) -> GpuResetRequestStatus {
    GpuResetRequestStatus {
        phase: Some(outcome.phase),
        message: Some(outcome.message.chars().take(1024).collect()),
        started_at: started,
        completed_at: Some(Time(now)),
        conditions: vec![Condition {
            type_: SUCCEEDED.to_string(),
            status: if outcome.phase == ResetPhase::Succeeded {
                "True"
            } else {
                "False"
            }
            .to_string(),
            reason: outcome.reason.to_string(),
            message: outcome.message.chars().take(1024).collect(),
            last_transition_time: Time(now),
            observed_generation: None,
        }],
    }
}

/// What to do with a request as it is seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Nothing: finished, or being reset by this probe.
    Skip,
    /// Reset the GPU.
    Reset,
    /// Fail it without touching any GPU.
    Fail(Outcome),
}

/// Decides what the probe of `node` does with `request`; `taken` are the requests (by uid) this
/// process took.
pub fn next(node: &str, request: &GpuResetRequest, taken: &BTreeSet<String>) -> Next {
    let status = request.status.clone().unwrap_or_default();
    if status.finished() {
        return Next::Skip;
    }
    if request.spec.node_name != node {
        // Labelled for this node, but for another: never reset on a label's word.
        return Next::Fail(Outcome {
            phase: ResetPhase::Failed,
            reason: "OtherNode",
            message: format!(
                "the request is labelled {NODE_LABEL}={node} but names node {}: nothing was reset",
                request.spec.node_name
            ),
        });
    }
    match status.phase {
        Some(ResetPhase::Resetting) if taken.contains(&request.uid().unwrap_or_default()) => Next::Skip,
        Some(ResetPhase::Resetting) => Next::Fail(Outcome {
            phase: ResetPhase::Failed,
            reason: "ProbeRestarted",
            message: format!(
                "the probe stopped while resetting GPU {}: the outcome is unknown, and the reset is not run twice",
                request.spec.index
            ),
        }),
        _ => Next::Reset,
    }
}

/// Answers `node`'s requests until `shutdown` completes, in a task of its own.
pub fn watch_resets(
    client: Client,
    node: String,
    nvml: Arc<NvmlCollector>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    tokio::spawn(answer_resets(client, node, nvml, shutdown));
}

/// Answers `node`'s requests until `shutdown` completes (`--gpu-reset-only` awaits it).
pub async fn answer_resets(
    client: Client,
    node: String,
    nvml: Arc<NvmlCollector>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let api: Api<GpuResetRequest> = Api::all(client);
    tokio::select! {
        () = shutdown => {}
        () = run(api, node, nvml) => {}
    }
}

/// `--follow-resets`: follows `node`'s requests, which another process answers, until
/// `shutdown` completes, in a task of its own. Read only: it never writes a request.
pub fn follow_resets(
    client: Client,
    node: String,
    nvml: Arc<NvmlCollector>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let api: Api<GpuResetRequest> = Api::all(client);
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown => {}
            () = follow(api, node, nvml) => {}
        }
    });
}

/// The GPU whose reset `request` reports done, when the follower of `node` (started at `since`)
/// has to act on it: a request of this node that succeeded after `since`. One that succeeded
/// before was followed by an earlier process, or by none (then its XIDs are kept: better a
/// drift reported once too often than an XID forgotten).
pub fn reset_done(node: &str, request: &GpuResetRequest, since: jiff::Timestamp) -> Option<u32> {
    let status = request.status.as_ref()?;
    let completed = status.completed_at.as_ref()?.0;
    (request.spec.node_name == node && status.phase == Some(ResetPhase::Succeeded) && completed >= since)
        .then_some(request.spec.index)
}

async fn follow(api: Api<GpuResetRequest>, node: String, nvml: Arc<NvmlCollector>) {
    // The API server keeps times to the second, cut off: a reset finished this second counts.
    let since = jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::from_secs(1))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    let config = watcher::Config::default().labels(&selector(&node));
    let mut requests = std::pin::pin!(watcher::watcher(api, config).default_backoff().applied_objects());
    let mut followed: BTreeSet<String> = BTreeSet::new();
    tracing::info!(node = %node, "following this node's GpuResetRequests (answered by the reset DaemonSet)");
    while let Some(event) = requests.next().await {
        let request = match event {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "watching GpuResetRequests");
                continue;
            }
        };
        let Some(index) = reset_done(&node, &request, since) else {
            continue;
        };
        if !followed.insert(request.uid().unwrap_or_default()) {
            continue;
        }
        tracing::info!(request = %request.name_any(), gpu = index, "GPU reset by the reset DaemonSet: publishing a fresh report");
        let reset_nvml = nvml.clone();
        let _ = tokio::task::spawn_blocking(move || reset_nvml.reset_elsewhere(index)).await;
        publish_after_outcome(&nvml).await;
    }
}

/// Publishes a fresh report once the outcome just written lies in the past: the operator counts
/// only a report observed after the outcome. The API server keeps the outcome's time to the
/// second, cut off, so the operator takes it as the end of that second: the fresh report is
/// observed from the next whole second on.
async fn publish_after_outcome(nvml: &NvmlCollector) {
    let into_second = u64::try_from(jiff::Timestamp::now().subsec_nanosecond()).unwrap_or(0);
    tokio::time::sleep(Duration::from_nanos(1_000_000_000u64.saturating_sub(into_second))).await;
    nvml.xids().wake();
}

/// The label selector of `node`'s requests: the node label as the operator writes it
/// (`names::label_value`, which hashes a name too long for a label).
pub fn selector(node: &str) -> String {
    format!("{NODE_LABEL}={}", names::label_value(node))
}

async fn run(api: Api<GpuResetRequest>, node: String, nvml: Arc<NvmlCollector>) {
    let config = watcher::Config::default().labels(&selector(&node));
    let mut requests = std::pin::pin!(
        watcher::watcher(api.clone(), config)
            .default_backoff()
            .applied_objects()
    );
    let mut taken: BTreeSet<String> = BTreeSet::new();
    tracing::info!(node = %node, "answering GpuResetRequests for this node");
    while let Some(event) = requests.next().await {
        let request = match event {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "watching GpuResetRequests");
                continue;
            }
        };
        let name = request.name_any();
        let span = tracing::info_span!("gpu_reset", request = %name, gpu = request.spec.index);
        async {
            match next(&node, &request, &taken) {
                Next::Skip => {}
                Next::Fail(outcome) => {
                    tracing::warn!(reason = outcome.reason, "{}", outcome.message);
                    let started = request.status.as_ref().and_then(|s| s.started_at.clone());
                    write(&api, &name, &finished(&outcome, started, jiff::Timestamp::now())).await;
                }
                Next::Reset => {
                    taken.insert(request.uid().unwrap_or_default());
                    reset(&api, &request, &nvml).await;
                }
            }
        }
        .instrument(span)
        .await;
    }
}

async fn reset(api: &Api<GpuResetRequest>, request: &GpuResetRequest, nvml: &Arc<NvmlCollector>) {
    let name = request.name_any();
    let (index, uuid) = (request.spec.index, request.spec.uuid.clone());
    let started = Time(jiff::Timestamp::now());
    let taking = GpuResetRequestStatus {
        phase: Some(ResetPhase::Resetting),
        message: Some(format!("resetting GPU {index} ({uuid})")),
        started_at: Some(started.clone()),
        ..GpuResetRequestStatus::default()
    };
    // Taken before anything is touched: a probe that stops mid-reset leaves it Resetting, and
    // the next one fails it instead of resetting again.
    if !write(api, &name, &taking).await {
        return;
    }
    tracing::info!(uuid = %uuid, "resetting GPU");
    let result = {
        let (nvml, uuid) = (nvml.clone(), uuid.clone());
        tokio::task::spawn_blocking(move || nvml.reset(index, &uuid))
            .await
            .unwrap_or_else(|e| {
                Err(ResetError::Nvml {
                    index,
                    step: "reset",
                    reason: format!("the reset panicked: {e}"),
                })
            })
    };
    gpunode_crashpoints::crash_point!("reset::after_reset");
    let outcome = Outcome::of(index, &uuid, result);
    match outcome.phase {
        ResetPhase::Succeeded => tracing::info!("{}", outcome.message),
        _ => tracing::warn!(reason = outcome.reason, "{}", outcome.message),
    }
    write(
        api,
        &name,
        &finished(&outcome, Some(started), jiff::Timestamp::now()),
    )
    .await;
    publish_after_outcome(nvml).await;
}

/// Merge-patches the request's status, retrying a few times; false when it could not.
async fn write(api: &Api<GpuResetRequest>, name: &str, status: &GpuResetRequestStatus) -> bool {
    let patch = serde_json::json!({ "status": status });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let mut pause = STATUS_BACKOFF;
    for attempt in 1..=STATUS_ATTEMPTS {
        match api.patch_status(name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => return true,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                tracing::info!("the request was deleted");
                return false;
            }
            Err(e) if attempt == STATUS_ATTEMPTS => {
                tracing::warn!(error = %e, "cannot write the request's status; the operator's step times out");
                return false;
            }
            Err(e) => {
                tracing::debug!(error = %e, attempt, "writing the request's status");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpunode_crds::GpuResetRequestSpec;

    /// The probe selects its requests by the node label the operator writes: the name itself,
    /// or for a name too long for a label its beginning and a digest (two nodes that share
    /// their first 63 characters select different requests).
    #[test]
    fn requests_are_selected_by_the_node_label_the_operator_writes() {
        assert_eq!(selector("gpu-1"), "gpunode.dev/node=gpu-1");
        let prefix = "a".repeat(63);
        let (a, b) = (selector(&format!("{prefix}-1")), selector(&format!("{prefix}-2")));
        assert_ne!(a, b);
        let value = a.trim_start_matches("gpunode.dev/node=");
        assert!(names::is_label_value(value), "{value}");
    }

    fn request(node: &str, phase: Option<ResetPhase>) -> GpuResetRequest {
        let mut r = GpuResetRequest::new(
            "gpu-1-gpu-2",
            GpuResetRequestSpec {
                node_name: node.to_string(),
                index: 2,
                uuid: "GPU-2".to_string(),
            },
        );
        r.metadata.uid = Some("u-1".to_string());
        r.status = phase.map(|p| GpuResetRequestStatus {
            phase: Some(p),
            ..GpuResetRequestStatus::default()
        });
        r
    }

    #[test]
    fn a_follower_acts_once_on_a_success_of_its_node_after_it_started() {
        let at = |t: &str| {
            t.parse::<jiff::Timestamp>()
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        };
        let since = at("2026-12-02T08:00:00Z");
        let done = |node: &str, phase: ResetPhase, completed: &str| {
            let mut r = request(node, Some(phase));
            if let Some(s) = r.status.as_mut() {
                s.completed_at = Some(Time(at(completed)));
            }
            r
        };
        let ok = done("gpu-1", ResetPhase::Succeeded, "2026-12-02T08:00:05Z");
        assert_eq!(reset_done("gpu-1", &ok, since), Some(2));
        assert_eq!(reset_done("gpu-2", &ok, since), None, "another node's request");
        let failed = done("gpu-1", ResetPhase::Failed, "2026-12-02T08:00:05Z");
        assert_eq!(
            reset_done("gpu-1", &failed, since),
            None,
            "a failed reset reset nothing"
        );
        let before = done("gpu-1", ResetPhase::Succeeded, "2026-12-02T07:59:59Z");
        assert_eq!(
            reset_done("gpu-1", &before, since),
            None,
            "finished before the follower started"
        );
        assert_eq!(
            reset_done("gpu-1", &request("gpu-1", Some(ResetPhase::Resetting)), since),
            None
        );
    }

    #[test]
    fn a_new_request_of_this_node_is_reset_once() {
        let none = BTreeSet::new();
        assert_eq!(next("gpu-1", &request("gpu-1", None), &none), Next::Reset);
        let mine = BTreeSet::from(["u-1".to_string()]);
        assert_eq!(
            next("gpu-1", &request("gpu-1", Some(ResetPhase::Resetting)), &mine),
            Next::Skip,
            "its own reset, seen again as it writes Resetting"
        );
        for done in [ResetPhase::Succeeded, ResetPhase::Failed] {
            assert_eq!(next("gpu-1", &request("gpu-1", Some(done)), &none), Next::Skip);
        }
    }

    #[test]
    fn a_reset_a_stopped_probe_left_is_failed_not_run_again() {
        let Next::Fail(o) = next(
            "gpu-1",
            &request("gpu-1", Some(ResetPhase::Resetting)),
            &BTreeSet::new(),
        ) else {
            panic!("not failed");
        };
        assert_eq!((o.phase, o.reason), (ResetPhase::Failed, "ProbeRestarted"));
    }

    #[test]
    fn a_request_naming_another_node_is_failed_whatever_its_label() {
        let Next::Fail(o) = next("gpu-1", &request("gpu-9", None), &BTreeSet::new()) else {
            panic!("not failed");
        };
        assert_eq!(o.reason, "OtherNode");
        assert!(o.message.contains("names node gpu-9"), "{}", o.message);
    }

    #[test]
    fn the_outcome_is_the_succeeded_condition_the_operator_reads() {
        let now: jiff::Timestamp = "2026-12-02T08:00:00.5Z"
            .parse()
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        let ok = finished(&Outcome::of(2, "GPU-2", Ok(())), None, now);
        assert_eq!(ok.phase, Some(ResetPhase::Succeeded));
        assert_eq!(
            (ok.conditions[0].type_.as_str(), ok.conditions[0].status.as_str()),
            ("Succeeded", "True")
        );
        assert_eq!(ok.conditions[0].last_transition_time, Time(now));
        let busy = finished(
            &Outcome::of(
                2,
                "GPU-2",
                Err(ResetError::InUse {
                    index: 2,
                    pids: vec![42],
                }),
            ),
            None,
            now,
        );
        assert_eq!(busy.phase, Some(ResetPhase::Failed));
        assert_eq!(
            (
                busy.conditions[0].status.as_str(),
                busy.conditions[0].reason.as_str()
            ),
            ("False", "InUse")
        );
        assert!(
            busy.message
                .unwrap_or_default()
                .contains("in use by processes [42]")
        );
    }
}
