//! The `nvml` collector: GPUs through nvml-wrapper, with an overridable library path (the fake
//! library in tests and the demo), and XIDs from an event thread.
//!
//! The library is loaded on the first collection and, while loading or `nvmlInit` fails, retried
//! on every collection: a driver installed after the probe started is picked up.
//!
//! Its submodules never import this module: `reason` and `raw` are leaves the others use, and
//! the collector here sits on top of [`gpu`], [`reset`] and [`xid`].

pub mod gpu;
pub mod nvlink;
mod raw;
mod reason;
pub mod reset;
pub mod signals;
pub mod xid;

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};
use std::time::{Duration, Instant};

use gpunode_crds::report::{CollectorName, FieldError, GpuNodeReportStatus, MAX_GPUS};
use nvml_wrapper::Nvml;

use crate::collect::{CollectError, Collector, Outcome};
pub use reason::nvml_reason;
pub use xid::{Persistence, XidLog, XidWatcher};

use crate::boot_state::BootFile;
use crate::xid_state::XidStore;
use nvlink::NvlinkHistory;
use signals::ReplayHistory;

/// The time in unix seconds (a fixed clock in tests).
type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Default library name, resolved by the dynamic loader.
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";
/// Default deadline of one collection.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// XID codes above this (other than NVML's 999 "unknown") are not real XIDs.
const MAX_PLAUSIBLE_XID: u32 = 1023;

/// Why the NVML collector produced no GPUs.
#[derive(Debug, thiserror::Error)]
pub enum NvmlCollectError {
    /// The library could not be loaded or `nvmlInit` failed (no driver, wrong driver).
    #[error("NVML init ({lib}): {reason}")]
    Init {
        /// The library path tried.
        lib: String,
        /// Why it failed.
        reason: String,
    },
    /// The GPU count could not be read.
    #[error("NVML device count: {0}")]
    DeviceCount(String),
    /// An NVML call did not return within the collector's deadline (a hung driver).
    #[error("an NVML call has not returned for {:.1}s (deadline {:.1}s)", .waited.as_secs_f64(), .deadline.as_secs_f64())]
    Hung {
        /// How long the oldest unfinished collection has been waiting.
        waited: Duration,
        /// The deadline (`--nvml-timeout`).
        deadline: Duration,
    },
    /// The collection's thread ended without an answer (it panicked).
    #[error("NVML collection thread ended without an answer")]
    Lost,
}

impl From<NvmlCollectError> for CollectError {
    fn from(e: NvmlCollectError) -> Self {
        match e {
            NvmlCollectError::Hung { .. } => CollectError::hung(e),
            other => CollectError::new(other),
        }
    }
}

/// How the NVML collector is set up.
#[derive(Debug, Clone)]
pub struct NvmlConfig {
    /// Path or name of `libnvidia-ml.so.1`.
    pub lib_path: OsString,
    /// Listen for XID events on a thread.
    pub watch_xids: bool,
    /// How long one event wait blocks; bounds how long stopping the thread takes.
    pub event_wait: Duration,
    /// Where the XIDs of this boot are kept across probe restarts; `None`: in memory only.
    pub xid_store: Option<XidStore>,
    /// How long one collection may take before it is reported as hung.
    pub timeout: Duration,
    /// Where the NVLink error counter history of this boot is kept across probe restarts
    /// ([`nvlink::FILE_NAME`]); `None`: in memory only.
    pub nvlink_state: Option<BootFile>,
    /// Where the PCIe replay history of this boot is kept across probe restarts
    /// ([`signals::FILE_NAME`]); `None`: in memory only.
    pub pcie_state: Option<BootFile>,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        NvmlConfig {
            lib_path: DEFAULT_LIB.into(),
            watch_xids: true,
            event_wait: Duration::from_millis(500),
            xid_store: None,
            timeout: DEFAULT_TIMEOUT,
            nvlink_state: None,
            pcie_state: None,
        }
    }
}

#[derive(Default)]
struct Loaded {
    nvml: Option<Arc<Nvml>>,
    watcher: Option<XidWatcher>,
}

/// The NVML collector.
pub struct NvmlCollector {
    config: NvmlConfig,
    xids: Arc<XidLog>,
    /// The power brake's start of each GPU.
    signals: Arc<Mutex<signals::Signals>>,
    replays: Arc<ReplayHistory>,
    nvlink: Arc<NvlinkHistory>,
    clock: Clock,
    loaded: Mutex<Loaded>,
    /// Held for reading by each collection and for writing by a reset, so that no report shows
    /// a GPU in the middle of its reset (off the bus between remove and discover).
    resetting: RwLock<()>,
    /// A collection that missed its deadline and has not returned yet: while it hangs, no other
    /// starts (each would hang on the same driver and pile up threads).
    stuck: Mutex<Option<Stuck>>,
}

/// A collection still running past its deadline, on its own thread.
struct Stuck {
    since: Instant,
    done: Arc<AtomicBool>,
}

impl NvmlCollector {
    /// A collector that loads the library on first use.
    pub fn new(config: NvmlConfig) -> Self {
        let xids = match &config.xid_store {
            Some(store) => XidLog::persistent(store.clone()),
            None => XidLog::default(),
        };
        let nvlink = match &config.nvlink_state {
            Some(file) => NvlinkHistory::persistent_as(file.clone(), "NVLink counter"),
            None => NvlinkHistory::in_memory("NVLink counter"),
        };
        let replays = match &config.pcie_state {
            Some(file) => ReplayHistory::persistent_as(file.clone(), "PCIe replay"),
            None => ReplayHistory::in_memory("PCIe replay"),
        };
        NvmlCollector {
            config,
            xids: Arc::new(xids),
            signals: Arc::default(),
            replays: Arc::new(replays),
            nvlink: Arc::new(nvlink),
            clock: Arc::new(|| jiff::Timestamp::now().as_second()),
            loaded: Mutex::default(),
            resetting: RwLock::new(()),
            stuck: Mutex::default(),
        }
    }

    /// The same collector, reading the time (unix seconds) from `clock` (the NVLink and PCIe
    /// replay counts).
    pub fn with_clock(mut self, clock: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The XID log (for the publisher's notifications and metrics).
    pub fn xids(&self) -> Arc<XidLog> {
        self.xids.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Loaded> {
        self.loaded
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Loads and initializes the library if it is not yet, and (re)starts the XID thread.
    fn ensure_loaded(&self) -> Result<Arc<Nvml>, NvmlCollectError> {
        let mut loaded = self.lock();
        let nvml = match &loaded.nvml {
            Some(nvml) => nvml.clone(),
            None => {
                let nvml = Nvml::builder()
                    .lib_path(&self.config.lib_path)
                    .init()
                    .map_err(|e| NvmlCollectError::Init {
                        lib: self.config.lib_path.to_string_lossy().into_owned(),
                        reason: nvml_reason(&e),
                    })?;
                let nvml = Arc::new(nvml);
                loaded.nvml = Some(nvml.clone());
                nvml
            }
        };
        let stopped = loaded.watcher.as_ref().is_none_or(XidWatcher::is_finished);
        if self.config.watch_xids && stopped {
            match XidWatcher::start(nvml.clone(), self.xids.clone(), self.config.event_wait) {
                Ok(watcher) => loaded.watcher = Some(watcher),
                Err(e) => tracing::warn!(error = %e, "cannot start the XID event thread"),
            }
        }
        Ok(nvml)
    }

    /// Loads the library and waits until the XID thread drained already-queued events (for
    /// `--once`). Returns false when it did not get ready in time.
    pub fn prepare(&self, timeout: Duration) -> bool {
        if self.ensure_loaded().is_err() {
            return false;
        }
        self.lock()
            .watcher
            .as_ref()
            .is_some_and(|w| w.wait_ready(timeout))
    }

    /// Resets GPU `index` if it is the GPU `uuid` and no process uses it ([`reset::reset_gpu`]).
    /// After a reset its XIDs are forgotten, and the XID thread starts again at the next
    /// collection (NVML's device handles, the event set's included, are not valid after a
    /// discovery).
    pub fn reset(&self, index: u32, uuid: &str) -> Result<(), reset::ResetError> {
        let _exclusive = self
            .resetting
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let nvml = self.ensure_loaded().map_err(|e| reset::ResetError::Nvml {
            index,
            step: "load",
            reason: e.to_string(),
        })?;
        let result = reset::reset_gpu(&nvml, index, uuid);
        if result.is_ok() {
            self.xids.forget_gpu(index);
        }
        if !matches!(
            result,
            Err(reset::ResetError::OtherGpu { .. } | reset::ResetError::InUse { .. })
        ) {
            // Removed (and maybe discovered again): the event set's handles are stale.
            self.lock().watcher = None;
        }
        result
    }

    /// GPU `index` was reset by another process (the chart's reset DaemonSet, `--follow-resets`):
    /// its XIDs are forgotten as after [`NvmlCollector::reset`], and the XID thread starts again
    /// at the next collection (the event set's handles are stale after a discovery).
    pub fn reset_elsewhere(&self, index: u32) {
        let _exclusive = self
            .resetting
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.xids.forget_gpu(index);
        self.lock().watcher = None;
    }

    /// Stops the XID thread and unloads the library.
    pub fn shutdown(&self) {
        let mut loaded = self.lock();
        loaded.watcher = None;
        loaded.nvml = None;
    }

    /// The hung collection's error while it still has not returned.
    fn still_hung(&self) -> Option<NvmlCollectError> {
        let mut stuck = self.stuck.lock().unwrap_or_else(|p| p.into_inner());
        if stuck.as_ref().is_some_and(|s| s.done.load(Ordering::Acquire)) {
            *stuck = None;
        }
        stuck.as_ref().map(|s| NvmlCollectError::Hung {
            waited: s.since.elapsed(),
            deadline: self.config.timeout,
        })
    }

    /// Reads the GPUs on a thread of its own and waits for it up to the deadline: a call into a
    /// hung driver never returns, and only a report that says so tells it from a dead probe.
    fn collect_within_deadline(&self, report: &mut GpuNodeReportStatus) -> Result<Outcome, NvmlCollectError> {
        if let Some(hung) = self.still_hung() {
            return Err(hung);
        }
        let nvml = self.ensure_loaded()?;
        let sources = Sources {
            xids: self.xids.clone(),
            signals: self.signals.clone(),
            replays: self.replays.clone(),
            nvlink: self.nvlink.clone(),
            clock: self.clock.clone(),
        };
        let mut scratch = report.clone();
        let done = Arc::new(AtomicBool::new(false));
        let finished = done.clone();
        let (tx, rx) = mpsc::channel();
        let started = Instant::now();
        std::thread::Builder::new()
            .name("nvml-collect".to_owned())
            .spawn(move || {
                let result = collect_gpus(&nvml, &sources, &mut scratch).map(|o| (o, scratch));
                finished.store(true, Ordering::Release);
                // The receiver is gone when the deadline passed: nothing to tell.
                let _ = tx.send(result);
            })
            .map_err(|_| NvmlCollectError::Lost)?;
        match rx.recv_timeout(self.config.timeout) {
            Ok(Ok((outcome, filled))) => {
                *report = filled;
                Ok(outcome)
            }
            Ok(Err(e)) => Err(e),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                *self.stuck.lock().unwrap_or_else(|p| p.into_inner()) = Some(Stuck { since: started, done });
                Err(NvmlCollectError::Hung {
                    waited: started.elapsed(),
                    deadline: self.config.timeout,
                })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(NvmlCollectError::Lost),
        }
    }
}

/// What a collection reads beside NVML: the XIDs, the power brake and PCIe replay history, the
/// NVLink counter history and the time.
struct Sources {
    xids: Arc<XidLog>,
    signals: Arc<Mutex<signals::Signals>>,
    replays: Arc<ReplayHistory>,
    nvlink: Arc<NvlinkHistory>,
    clock: Clock,
}

/// One collection of every GPU through `nvml`, with the XIDs and NVLink history of `sources`.
fn collect_gpus(
    nvml: &Nvml,
    sources: &Sources,
    report: &mut GpuNodeReportStatus,
) -> Result<Outcome, NvmlCollectError> {
    let now = jiff::Timestamp::now();
    let xids = &sources.xids;
    let count = nvml
        .device_count()
        .map_err(|e| NvmlCollectError::DeviceCount(nvml_reason(&e)))?;
    let mut notes = Vec::new();
    match nvml.sys_driver_version() {
        Ok(version) => report.driver_version = Some(version),
        Err(e) => notes.push(format!("driverVersion: {}", nvml_reason(&e))),
    }
    match nvml.sys_cuda_driver_version() {
        Ok(version) => report.cuda_version = Some(cuda_version(version)),
        Err(e) => notes.push(format!("cudaVersion: {}", nvml_reason(&e))),
    }
    if count as usize > MAX_GPUS {
        notes.push(format!("{count} GPUs, only the first {MAX_GPUS} are reported"));
    }
    report.gpu_count = Some(count);
    let mut links = Vec::new();
    report.gpus = (0..count.min(MAX_GPUS as u32))
        .enumerate()
        .map(|(position, index)| {
            let (mut gpu, counters) = gpu::read_gpu(nvml, index);
            links.extend(counters.into_iter().map(|c| (position, c)));
            sources
                .signals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .apply(&mut gpu, now);
            gpu.xids = xids.for_gpu(index);
            for bad in gpu
                .xids
                .iter()
                .filter(|x| x.xid > MAX_PLAUSIBLE_XID && x.xid != xid::XID_UNKNOWN)
            {
                let reason = format!("implausible XID code {} (kept as received)", bad.xid);
                if !gpu.errors.iter().any(|e| e.reason == reason) {
                    gpu.errors.push(FieldError {
                        field: "xids".to_owned(),
                        reason,
                    });
                }
            }
            gpu
        })
        .collect();
    let secs = (sources.clock)();
    signals::add_replays(&sources.replays, &mut report.gpus, secs);
    nvlink::add_rates(&sources.nvlink, &mut report.gpus, links, secs);
    if let Some(error) = xids.watcher_error() {
        notes.push(error);
    }
    Ok(Outcome {
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

/// 12040 → "12.4" (NVML encodes major * 1000 + minor * 10).
pub fn cuda_version(encoded: i32) -> String {
    format!("{}.{}", encoded / 1000, (encoded % 1000) / 10)
}

impl Collector for NvmlCollector {
    fn name(&self) -> CollectorName {
        CollectorName::Nvml
    }

    fn collect(&self, report: &mut GpuNodeReportStatus) -> Result<Outcome, CollectError> {
        let _shared = self
            .resetting
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(self.collect_within_deadline(report)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_cuda_versions() {
        assert_eq!(cuda_version(12040), "12.4");
        assert_eq!(cuda_version(12000), "12.0");
        assert_eq!(cuda_version(13010), "13.1");
    }

    #[test]
    fn a_missing_library_is_an_init_error() {
        let collector = NvmlCollector::new(NvmlConfig {
            lib_path: "/nonexistent/libnvidia-ml.so.1".into(),
            ..NvmlConfig::default()
        });
        let mut report = GpuNodeReportStatus::default();
        let err = collector
            .collect(&mut report)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("NVML init (/nonexistent/libnvidia-ml.so.1)"),
            "{err}"
        );
        assert!(err.contains("cannot open shared object file"), "{err}");
        assert!(report.gpus.is_empty());
    }
}
