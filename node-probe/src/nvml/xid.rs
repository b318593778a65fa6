//! XID errors: an NVML event set waited on by a dedicated thread (no polling), and the log of
//! recent XIDs per GPU that the collector copies into the report.
//!
//! NVML events carry no timestamp, so each XID is stamped when the thread receives it. Every
//! received XID bumps a `watch` channel so the publisher can publish at once.
//!
//! NVML delivers an XID only to event sets registered when it happened, so the log is the only
//! record of it: with an [`XidStore`] the log starts from the XIDs saved earlier in the same boot
//! and the thread saves it after each XID (at most once per [`MIN_SAVE_GAP`] during a storm, the
//! rest within a gap and a wait slice), so a restarted probe still reports them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gpunode_crds::report::{MAX_XIDS_PER_GPU, XidEvent};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use tokio::sync::watch;

use crate::xid_state::{Ignored, XidStore};

/// NVML's code for an XID it could not decode.
pub const XID_UNKNOWN: u32 = 999;
/// Distinct (GPU, XID) pairs counted for metrics; bounds the metric's cardinality.
const MAX_COUNTED_PAIRS: usize = 256;
/// Most queued events drained before the thread reports ready.
const MAX_DRAIN: usize = 1024;
/// Shortest time between two saves of the XID state while XIDs keep arriving.
pub const MIN_SAVE_GAP: Duration = Duration::from_secs(1);

/// Recent XIDs per GPU, shared between the event thread and the collector.
#[derive(Debug)]
pub struct XidLog {
    inner: Mutex<XidLogInner>,
    notify: watch::Sender<u64>,
    store: Option<XidStore>,
}

/// What became of the XID state: for logs and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Persistence {
    /// XIDs are saved (a state directory is set and the boot id is known).
    pub enabled: bool,
    /// XIDs restored at start.
    pub restored: usize,
    /// Why the state file was not restored at start, if it was not.
    pub ignored: Option<&'static str>,
    /// Saves that failed.
    pub save_failures: u64,
}

#[derive(Debug, Default)]
struct XidLogInner {
    per_gpu: BTreeMap<u32, VecDeque<XidEvent>>,
    counts: BTreeMap<(u32, u32), u64>,
    total: u64,
    watcher_error: Option<String>,
    persistence: Persistence,
    /// Changed since the last save.
    dirty: bool,
    last_save: Option<Instant>,
    /// The last save failed (its warning was logged; the retries are not).
    failing: bool,
}

impl Default for XidLog {
    fn default() -> Self {
        XidLog {
            inner: Mutex::default(),
            notify: watch::Sender::new(0),
            store: None,
        }
    }
}

impl XidLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, XidLogInner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A log kept in `store`: it starts from the XIDs saved there during this boot on this node;
    /// a state file that is missing, unreadable or of another boot or node is ignored with a
    /// warning. ([`XidLog::default`] keeps XIDs in memory only.)
    pub fn persistent(store: XidStore) -> XidLog {
        let mut inner = XidLogInner {
            persistence: Persistence {
                enabled: true,
                ..Persistence::default()
            },
            ..XidLogInner::default()
        };
        match store.load() {
            Ok(gpus) => {
                let restored: usize = gpus.values().map(Vec::len).sum();
                tracing::info!(
                    path = %store.path().display(),
                    boot_id = store.boot_id(),
                    restored,
                    "restored the XIDs of this boot"
                );
                inner.persistence.restored = restored;
                inner.per_gpu = gpus.into_iter().map(|(i, x)| (i, x.into())).collect();
            }
            Err((why, detail)) => {
                let what = match why {
                    Ignored::OtherBoot => "the node rebooted: forgetting the XIDs of the previous boot",
                    Ignored::Missing => "no XID state of this boot: starting with none",
                    _ => "ignoring the XID state file: starting with no XIDs",
                };
                tracing::warn!(reason = why.label(), detail, "{what}");
                inner.persistence.ignored = Some(why.label());
                // The next save replaces a file that does not belong to this boot.
                inner.dirty = why != Ignored::Missing;
            }
        }
        XidLog {
            inner: Mutex::new(inner),
            notify: watch::Sender::new(0),
            store: Some(store),
        }
    }

    /// Saves the log to its store if it changed, unless the last save (or failed attempt) is
    /// under [`MIN_SAVE_GAP`] old and `force` is false. Failures are counted (and logged once
    /// until a save succeeds again); the log stays dirty, so a later call retries.
    pub fn save(&self, force: bool) {
        let Some(store) = &self.store else { return };
        let snapshot = {
            let mut inner = self.lock();
            let due = force || inner.last_save.is_none_or(|at| at.elapsed() >= MIN_SAVE_GAP);
            if !inner.dirty || !due {
                return;
            }
            inner.dirty = false;
            inner.last_save = Some(Instant::now());
            inner.per_gpu.clone()
        };
        let result = store.save(&snapshot);
        let mut inner = self.lock();
        match result {
            Ok(()) if inner.failing => {
                inner.failing = false;
                tracing::info!("saved the XID state again");
            }
            Ok(()) => {}
            Err(e) => {
                // Retried on the next save, at most once per MIN_SAVE_GAP; warned once.
                if !inner.failing {
                    tracing::warn!(error = %e, "cannot save the XID state: a restarted probe would forget these XIDs");
                }
                inner.failing = true;
                inner.dirty = true;
                inner.persistence.save_failures += 1;
            }
        }
    }

    /// What became of the XID state.
    pub fn persistence(&self) -> Persistence {
        self.lock().persistence.clone()
    }

    /// Records an XID for GPU `index`, keeping the newest [`MAX_XIDS_PER_GPU`], and notifies.
    pub fn record(&self, index: u32, xid: u32, at: jiff::Timestamp) {
        let total = {
            let mut inner = self.lock();
            inner.dirty = true;
            let events = inner.per_gpu.entry(index).or_default();
            if events.len() == MAX_XIDS_PER_GPU {
                events.pop_front();
            }
            events.push_back(XidEvent { xid, at: Time(at) });
            let room = inner.counts.len() < MAX_COUNTED_PAIRS;
            match inner.counts.get_mut(&(index, xid)) {
                Some(count) => *count += 1,
                None if room => {
                    inner.counts.insert((index, xid), 1);
                }
                None => {}
            }
            inner.total += 1;
            inner.total
        };
        self.notify.send_replace(total);
    }

    /// The XIDs of GPU `index`, oldest first.
    pub fn for_gpu(&self, index: u32) -> Vec<XidEvent> {
        self.lock()
            .per_gpu
            .get(&index)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets the XIDs of GPU `index` (its metric counts stay): a GPU that was reset starts
    /// afresh, as it would after a reboot. Saved at once, so a restarted probe does not bring
    /// them back.
    pub fn forget_gpu(&self, index: u32) {
        {
            let mut inner = self.lock();
            if inner.per_gpu.remove(&index).is_none() {
                return;
            }
            inner.dirty = true;
        }
        self.save(true);
    }

    /// Wakes whoever waits on [`XidLog::subscribe`] without an XID: the publisher observes and
    /// publishes at once (after a GPU reset, whose outcome the operator judges by the next
    /// report).
    pub fn wake(&self) {
        self.notify.send_modify(|_| {});
    }

    /// How many XIDs were received in total.
    pub fn total(&self) -> u64 {
        self.lock().total
    }

    /// XIDs received per (GPU index, XID code), for metrics.
    pub fn counts(&self) -> BTreeMap<(u32, u32), u64> {
        self.lock().counts.clone()
    }

    /// Why the event thread is not (fully) listening, if it is not.
    pub fn watcher_error(&self) -> Option<String> {
        self.lock().watcher_error.clone()
    }

    fn set_watcher_error(&self, error: Option<String>) {
        self.lock().watcher_error = error;
    }

    /// A receiver that changes whenever an XID arrives.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }
}

/// The thread that waits on the NVML event set. Dropping it stops and joins the thread.
#[derive(Debug)]
pub struct XidWatcher {
    stop: Arc<AtomicBool>,
    ready: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl XidWatcher {
    /// Starts the thread: it registers for critical XID events on every GPU that supports
    /// them, drains what is already queued, reports ready, then waits for events in
    /// `wait` slices (the slice bounds how long a stop takes).
    pub fn start(nvml: Arc<Nvml>, log: Arc<XidLog>, wait: Duration) -> std::io::Result<XidWatcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let ready = Arc::new((Mutex::new(false), Condvar::new()));
        let thread = {
            let (stop, ready) = (stop.clone(), ready.clone());
            std::thread::Builder::new()
                .name("nvml-xid-events".to_owned())
                .spawn(move || watch_events(&nvml, &log, &stop, &ready, wait))?
        };
        Ok(XidWatcher {
            stop,
            ready,
            thread: Some(thread),
        })
    }

    /// Waits until the thread registered its event set and drained queued events, or the deadline.
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let (lock, cvar) = &*self.ready;
        let guard = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (guard, _) = cvar
            .wait_timeout_while(guard, timeout, |ready| !*ready)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *guard
    }

    /// Whether the thread has ended (it ends on stop, or when it cannot create an event set).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the XID event thread panicked");
        }
    }
}

fn mark_ready(ready: &(Mutex<bool>, Condvar)) {
    let (lock, cvar) = ready;
    *lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = true;
    cvar.notify_all();
}

/// XID code of an event; NVML's "unknown" becomes 999, oversized values saturate.
fn xid_code(data: Option<XidError>) -> u32 {
    match data {
        Some(XidError::Value(v)) => u32::try_from(v).unwrap_or(u32::MAX),
        Some(XidError::Unknown) | None => XID_UNKNOWN,
    }
}

fn watch_events(
    nvml: &Nvml,
    log: &XidLog,
    stop: &AtomicBool,
    ready: &(Mutex<bool>, Condvar),
    wait: Duration,
) {
    let _span = tracing::info_span!("xid_events").entered();
    let (set, registered, skipped) = match register(nvml) {
        Ok(registered) => registered,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for XID events");
            log.set_watcher_error(Some(format!("XID events: {}", super::reason::nvml_reason(&e))));
            mark_ready(ready);
            return;
        }
    };
    tracing::info!(gpus = ?registered, "listening for XID events");
    log.set_watcher_error(
        (!skipped.is_empty()).then(|| format!("XID events not registered on {}", skipped.join("; "))),
    );

    // Events already queued are delivered before the thread reports ready (bounded, so a
    // storm cannot hold readiness back).
    let full_slice = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
    let mut slice_ms = 0;
    let mut drained = 0usize;
    let mut failures: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(slice_ms) {
            Ok(event) => {
                failures = 0;
                if slice_ms == 0 {
                    drained += 1;
                    if drained >= MAX_DRAIN {
                        mark_ready(ready);
                        slice_ms = full_slice;
                    }
                }
                let index = match event.device.index() {
                    Ok(index) => index,
                    Err(e) => {
                        tracing::warn!(error = %e, "XID event from a device without an index");
                        continue;
                    }
                };
                let xid = xid_code(event.event_data);
                tracing::warn!(gpu = index, xid, "XID error");
                log.record(index, xid, jiff::Timestamp::now());
                log.save(false);
            }
            Err(NvmlError::Timeout) => {
                // A storm paused: what MIN_SAVE_GAP held back is saved now (a failing save is
                // retried no more often).
                log.save(false);
                if slice_ms == 0 {
                    mark_ready(ready);
                    slice_ms = full_slice;
                }
            }
            Err(e) => {
                // A failing wait (GPU lost, driver reloaded) must not spin: back off, capped.
                failures = failures.saturating_add(1);
                log.set_watcher_error(Some(format!(
                    "XID event wait: {}",
                    super::reason::nvml_reason(&e)
                )));
                mark_ready(ready);
                slice_ms = full_slice;
                let pause = Duration::from_millis(100u64 << failures.min(6));
                let until = Instant::now() + pause;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    std::thread::park_timeout(Duration::from_millis(50));
                }
            }
        }
    }
    log.save(true);
}

type Registered<'n> = (nvml_wrapper::EventSet<'n>, Vec<u32>, Vec<String>);

/// Creates an event set and registers critical XID events on every GPU that supports them.
/// nvml-wrapper frees the set when a registration fails, so the set is then rebuilt with the
/// GPUs registered so far.
fn register(nvml: &Nvml) -> Result<Registered<'_>, NvmlError> {
    let count = nvml.device_count()?;
    let mut set = nvml.create_event_set()?;
    let mut registered = Vec::new();
    let mut skipped = Vec::new();
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(device) => device,
            Err(e) => {
                skipped.push(format!("GPU {index}: {}", super::reason::nvml_reason(&e)));
                continue;
            }
        };
        match device.supported_event_types() {
            Ok(types) if types.contains(EventTypes::CRITICAL_XID_ERROR) => {}
            Ok(_) => {
                skipped.push(format!("GPU {index}: XID events not supported"));
                continue;
            }
            Err(e) => {
                skipped.push(format!("GPU {index}: {}", super::reason::nvml_reason(&e)));
                continue;
            }
        }
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(same) => {
                set = same;
                registered.push(index);
            }
            Err(e) => {
                skipped.push(format!("GPU {index}: {}", super::reason::nvml_reason(&e.error)));
                set = nvml.create_event_set()?;
                let mut kept = Vec::new();
                for &again in &registered {
                    let device = nvml.device_by_index(again)?;
                    set = device
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .map_err(|e| e.error)?;
                    kept.push(again);
                }
                registered = kept;
            }
        }
    }
    Ok((set, registered, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_xids_per_gpu_and_counts_all() {
        let log = XidLog::default();
        let rx = log.subscribe();
        for i in 0..40u32 {
            log.record(0, 100 + i, jiff::Timestamp::UNIX_EPOCH);
        }
        log.record(1, 79, jiff::Timestamp::UNIX_EPOCH);
        let gpu0 = log.for_gpu(0);
        assert_eq!(gpu0.len(), MAX_XIDS_PER_GPU);
        assert_eq!(gpu0.first().map(|e| e.xid), Some(108));
        assert_eq!(gpu0.last().map(|e| e.xid), Some(139));
        assert_eq!(log.for_gpu(1).len(), 1);
        assert!(log.for_gpu(2).is_empty());
        assert_eq!(log.total(), 41);
        assert_eq!(*rx.borrow(), 41);
    }

    #[test]
    fn bounds_the_counted_pairs() {
        let log = XidLog::default();
        for xid in 0..1000u32 {
            log.record(0, xid, jiff::Timestamp::UNIX_EPOCH);
        }
        assert_eq!(log.counts().len(), MAX_COUNTED_PAIRS);
        assert_eq!(log.total(), 1000);
    }

    /// A state directory and a proc root per boot id, in one temporary directory.
    struct Node {
        dir: tempfile::TempDir,
    }

    impl Node {
        fn new() -> Node {
            Node {
                dir: tempfile::tempdir().unwrap(),
            }
        }

        fn store(&self, boot: &str) -> XidStore {
            let proc_root = self.dir.path().join(format!("proc-{boot}"));
            let random = proc_root.join("sys/kernel/random");
            std::fs::create_dir_all(&random).unwrap();
            std::fs::write(random.join("boot_id"), boot).unwrap();
            XidStore::open(self.dir.path(), "n1", &proc_root).unwrap()
        }

        fn metrics(&self, log: XidLog) -> String {
            let state = crate::state::ProbeState::new("n1", Duration::from_secs(60), Some(Arc::new(log)));
            crate::metrics::render(&state).unwrap()
        }
    }

    fn codes(log: &XidLog, gpu: u32) -> Vec<u32> {
        log.for_gpu(gpu).iter().map(|x| x.xid).collect()
    }

    #[test]
    fn a_persistent_log_keeps_the_xids_of_this_boot_across_restarts() {
        let node = Node::new();
        let first = XidLog::persistent(node.store("boot-a"));
        assert_eq!(first.persistence().ignored, Some("missing"));
        first.record(5, 79, jiff::Timestamp::UNIX_EPOCH);
        first.save(false);
        let at = first.for_gpu(5);

        // A restart on the same boot: the XID is back, with the time it was received.
        let restarted = XidLog::persistent(node.store("boot-a"));
        assert_eq!(restarted.for_gpu(5), at);
        assert_eq!(restarted.total(), 0, "restored XIDs are not received ones");
        let p = restarted.persistence();
        assert_eq!((p.enabled, p.restored, p.ignored), (true, 1, None));
        restarted.record(5, 48, jiff::Timestamp::UNIX_EPOCH);
        restarted.save(false);
        assert_eq!(codes(&XidLog::persistent(node.store("boot-a")), 5), vec![79, 48]);
        let metrics = node.metrics(restarted);
        assert!(
            metrics.contains("gpunode_probe_xid_state_restored{Hostname=\"n1\"} 1"),
            "{metrics}"
        );
        assert!(metrics.contains("gpunode_probe_xid_state_enabled{Hostname=\"n1\"} 1"));

        // A reboot forgets them, counted, and the next save replaces the old boot's file.
        let rebooted = XidLog::persistent(node.store("boot-b"));
        assert!(rebooted.for_gpu(5).is_empty());
        assert_eq!(rebooted.persistence().ignored, Some("other_boot"));
        rebooted.save(false);
        assert_eq!(
            XidLog::persistent(node.store("boot-a")).persistence().ignored,
            Some("other_boot")
        );
        let metrics = node.metrics(rebooted);
        assert!(
            metrics
                .contains("gpunode_probe_xid_state_ignored_total{Hostname=\"n1\",reason=\"other_boot\"} 1"),
            "{metrics}"
        );
    }

    #[test]
    fn a_corrupt_state_file_is_ignored_and_counted() {
        let node = Node::new();
        let store = node.store("boot-a");
        std::fs::write(store.path(), "{\"version\": 1, \"gpus\": [").unwrap();
        let log = XidLog::persistent(store.clone());
        assert_eq!(log.persistence().ignored, Some("corrupt"));
        assert!(log.for_gpu(0).is_empty());
        log.record(0, 79, jiff::Timestamp::UNIX_EPOCH);
        log.save(false);
        assert_eq!(codes(&XidLog::persistent(store), 0), vec![79]);
        let metrics = node.metrics(log);
        assert!(
            metrics.contains("gpunode_probe_xid_state_ignored_total{Hostname=\"n1\",reason=\"corrupt\"} 1"),
            "{metrics}"
        );
        assert!(metrics.contains("gpunode_probe_xid_state_save_failures_total{Hostname=\"n1\"} 0"));
    }

    #[test]
    fn saves_are_spaced_during_a_storm_and_failures_counted() {
        let node = Node::new();
        let store = node.store("boot-a");
        let log = XidLog::persistent(store.clone());
        log.record(0, 13, jiff::Timestamp::UNIX_EPOCH);
        log.save(false);
        log.record(0, 14, jiff::Timestamp::UNIX_EPOCH);
        log.save(false);
        // The second XID came within MIN_SAVE_GAP: held back until the storm pauses.
        assert_eq!(codes(&XidLog::persistent(store.clone()), 0), vec![13]);
        log.save(true);
        assert_eq!(codes(&XidLog::persistent(store.clone()), 0), vec![13, 14]);

        // A directory where the file should be: the save fails, is counted, and is retried.
        std::fs::remove_file(store.path()).unwrap();
        std::fs::create_dir(store.path()).unwrap();
        log.record(0, 15, jiff::Timestamp::UNIX_EPOCH);
        log.save(true);
        assert_eq!(log.persistence().save_failures, 1);
        std::fs::remove_dir(store.path()).unwrap();
        log.save(true);
        assert_eq!(codes(&XidLog::persistent(store), 0), vec![13, 14, 15]);
        let memory_only = node.metrics(XidLog::default());
        assert!(memory_only.contains("gpunode_probe_xid_state_enabled{Hostname=\"n1\"} 0"));
        assert!(!memory_only.contains("gpunode_probe_xid_state_restored"));
    }

    #[test]
    fn decodes_xid_codes() {
        assert_eq!(xid_code(Some(XidError::Value(79))), 79);
        assert_eq!(xid_code(Some(XidError::Unknown)), XID_UNKNOWN);
        assert_eq!(xid_code(None), XID_UNKNOWN);
        assert_eq!(xid_code(Some(XidError::Value(u64::MAX))), u32::MAX);
    }
}
