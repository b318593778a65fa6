//! Process-wide state of the fake library: the fixture, re-read when its file changes, the
//! init reference count, and the event sets with the events queued to each.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::fixture::{Device, Fixture, NvlinkErrors};

/// NVML return codes used by the fake.
pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NO_PERMISSION: u32 = 4;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const TIMEOUT: u32 = 10;
    pub const GPU_IS_LOST: u32 = 15;
    pub const IN_USE: u32 = 19;
    pub const ARGUMENT_VERSION_MISMATCH: u32 = 25;
    pub const UNKNOWN: u32 = 999;
}

/// Environment variable naming the fixture file.
pub const FIXTURE_ENV: &str = "FAKE_NVML_FIXTURE";

/// Identity of a fixture file version (modification time, size, inode): re-read when any
/// changes. The inode catches a file replaced by rename within the timestamp granularity.
type Stamp = (SystemTime, u64, u64);

/// Everything the fake remembers between calls.
pub struct State {
    pub fixture: Fixture,
    path: PathBuf,
    stamp: Option<Stamp>,
    pub init_count: u32,
    /// Event set id → its registrations and queue.
    pub event_sets: HashMap<usize, EventSet>,
    pub next_event_set: usize,
    /// (device index, event id) of every event in the fixture as last read: an event "happens"
    /// when a re-read shows one that is not in here.
    seen: HashSet<(usize, u64)>,
    /// What the GPUs' own state holds (drain, removal, resets).
    pub hardware: Hardware,
    /// The version of the hardware file last read or written by this process: another process
    /// on the same "machine" (the chart's reset DaemonSet beside the probe) that writes it makes
    /// this one read it again, as both would see the same GPUs.
    hardware_stamp: Option<Stamp>,
}

/// The state of the GPUs themselves. Like hardware, it outlives the process and is shared by
/// every process of the machine: it is kept in a file next to the fixture
/// (`<fixture>.hardware`), written on every change and read at initialisation and whenever
/// another process changed it, so a restarted probe sees a GPU it reset still reset, and a probe
/// sees a GPU that another process (the reset DaemonSet) reset as reset.
#[derive(Default, serde::Serialize, serde::Deserialize)]
pub struct Hardware {
    /// Bus ids whose drain state is on (`nvmlDeviceModifyDrainState`).
    pub drained: HashSet<String>,
    /// Bus ids removed (`nvmlDeviceRemoveGpu_v2`) and not yet discovered again.
    pub removed: HashSet<String>,
    /// Persistence mode set by `nvmlDeviceSetPersistenceMode`, by bus id (over the fixture's).
    #[serde(default)]
    pub persistence: HashMap<String, bool>,
    /// Power management limits set by `nvmlDeviceSetPowerManagementLimit`, mW, by bus id (over
    /// the fixture's). Like the driver's, kept until set again or the machine reboots (this
    /// file gone): a GPU reset does not restore the default.
    #[serde(default)]
    pub power_limits: HashMap<String, i64>,
    /// Per device index: what its last reset cleared, as the fixture showed it then.
    resets: HashMap<usize, Cleared>,
}

impl Hardware {
    fn path(fixture: &Path) -> PathBuf {
        let mut p = fixture.as_os_str().to_owned();
        p.push(".hardware");
        PathBuf::from(p)
    }

    /// The hardware state last saved next to `fixture` (none saved: a fresh machine).
    fn load(fixture: &Path) -> Hardware {
        std::fs::read_to_string(Self::path(fixture))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default()
    }
}

/// What a GPU reset cleared: the volatile ECC counters, the pending row remap and a recovery
/// action asking for a reset, as the fixture
/// showed them. A re-read fixture that still shows those values shows them cleared (the reset
/// happened to that hardware state); one that shows other values describes new errors.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Cleared {
    vol: (i64, i64),
    remap_pending: i64,
    /// The recovery action the reset did (GPU reset, drain and reset), if it asked for one.
    #[serde(default)]
    recovery_action: Option<i64>,
    /// The NVLink error counters it cleared: afterwards a link counts what the fixture shows
    /// beyond them.
    #[serde(default)]
    nvlink_errors: Vec<NvlinkErrors>,
}

/// Recovery actions a GPU reset does: GPU reset (1) and drain and reset (4).
const RESET_ACTIONS: [i64; 2] = [1, 4];

/// One `nvmlEventSet_t`.
#[derive(Default)]
pub struct EventSet {
    /// (device index, event mask) registered on the set.
    pub registrations: Vec<(usize, u64)>,
    /// Events that happened since they were registered, oldest first.
    pub queue: VecDeque<Pending>,
}

/// An event queued to a set, delivered `remaining` more times.
#[derive(Clone, Copy)]
pub struct Pending {
    pub device: usize,
    pub event_type: u64,
    pub xid: u64,
    pub remaining: u64,
}

/// The (device index, event id) pairs of a fixture; an event's id defaults to its 1-based position.
fn event_ids(fixture: &Fixture) -> HashSet<(usize, u64)> {
    fixture
        .devices
        .iter()
        .enumerate()
        .flat_map(|(index, d)| {
            d.events
                .iter()
                .enumerate()
                .map(move |(pos, e)| (index, e.id.unwrap_or(pos as u64 + 1)))
        })
        .collect()
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// Runs `f` on the state, re-reading the fixture first if its file changed. `None` before init.
pub fn with_state<T>(f: impl FnOnce(&mut State) -> T) -> Option<T> {
    let mut guard = STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let state = guard.as_mut()?;
    state.refresh();
    Some(f(state))
}

/// `nvmlInit_v2`: loads the fixture on the first call, counts the others.
pub fn init() -> u32 {
    let mut guard = STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(state) = guard.as_mut() {
        state.refresh();
        if let Some(code) = state.fixture.init_error {
            return code;
        }
        state.init_count += 1;
        return code::SUCCESS;
    }
    let Some(path) = fixture_path() else {
        eprintln!("fake-nvml: set {FIXTURE_ENV} to a fixture file");
        return code::UNKNOWN;
    };
    let (fixture, stamp) = match load(&path) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("fake-nvml: {e}");
            return code::UNKNOWN;
        }
    };
    if let Some(code) = fixture.init_error {
        return code;
    }
    // Events already in the fixture happened before this process could register for them: like
    // the real library, they are never delivered.
    let seen = event_ids(&fixture);
    let hardware_stamp = stamp_of(&Hardware::path(&path)).ok();
    let hardware = Hardware::load(&path);
    *guard = Some(State {
        fixture,
        path,
        stamp: Some(stamp),
        init_count: 1,
        event_sets: HashMap::new(),
        next_event_set: 1,
        seen,
        hardware,
        hardware_stamp,
    });
    if let Some(state) = guard.as_mut() {
        state.apply_resets();
        state.apply_power_limits();
    }
    code::SUCCESS
}

/// `nvmlShutdown`: drops the state once every init is matched.
pub fn shutdown() -> u32 {
    let mut guard = STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(state) = guard.as_mut() else {
        return code::UNINITIALIZED;
    };
    state.init_count = state.init_count.saturating_sub(1);
    if state.init_count == 0 {
        *guard = None;
    }
    code::SUCCESS
}

impl State {
    /// Re-reads the fixture when its modification time, size or inode changed. A file that does
    /// not parse (a test halfway through rewriting it) keeps the previous fixture and is retried.
    /// Events the new version lists and the previous one did not happen now: each is queued to
    /// the event sets registered for its device and type at this moment, and only to those.
    fn refresh(&mut self) {
        let hardware_stamp = stamp_of(&Hardware::path(&self.path)).ok();
        if hardware_stamp != self.hardware_stamp {
            // Another process changed the GPUs (or a reboot removed their state): their state,
            // applied to the fixture as read.
            self.hardware = Hardware::load(&self.path);
            self.hardware_stamp = hardware_stamp;
            self.stamp = None;
        }
        let Ok(stamp) = stamp_of(&self.path) else { return };
        if self.stamp == Some(stamp) {
            return;
        }
        let Ok((fixture, stamp)) = load(&self.path) else {
            return;
        };
        let ids = event_ids(&fixture);
        for (index, device) in fixture.devices.iter().enumerate() {
            for (pos, event) in device.events.iter().enumerate() {
                let id = event.id.unwrap_or(pos as u64 + 1);
                if self.seen.contains(&(index, id)) || event.repeat == 0 {
                    continue;
                }
                for set in self.event_sets.values_mut() {
                    let registered = set
                        .registrations
                        .iter()
                        .any(|&(d, mask)| d == index && mask & event.event_type != 0);
                    if registered {
                        set.queue.push_back(Pending {
                            device: index,
                            event_type: event.event_type,
                            xid: event.xid,
                            remaining: event.repeat,
                        });
                    }
                }
            }
        }
        self.seen = ids;
        self.fixture = fixture;
        self.stamp = Some(stamp);
        self.apply_resets();
        self.apply_power_limits();
    }

    /// Puts the power limits set on the GPUs over a freshly read fixture.
    fn apply_power_limits(&mut self) {
        for d in &mut self.fixture.devices {
            if let Some(limit) = self.hardware.power_limits.get(&d.pci.bus_id) {
                set_limit(d, *limit);
            }
        }
    }

    /// `nvmlDeviceSetPowerManagementLimit` on device `index`: kept in the hardware state, and
    /// the fixture read again so that the limit applies to its own values.
    pub fn set_power_limit(&mut self, index: usize, limit_mw: i64) {
        let Some(d) = self.fixture.devices.get_mut(index) else {
            return;
        };
        set_limit(d, limit_mw);
        self.hardware.power_limits.insert(d.pci.bus_id.clone(), limit_mw);
        self.save_hardware();
        self.stamp = None;
    }

    /// Clears in a freshly read fixture what earlier resets cleared, where it still shows the
    /// values they cleared; forgets the resets it no longer shows.
    fn apply_resets(&mut self) {
        let devices = &mut self.fixture.devices;
        self.hardware
            .resets
            .retain(|&index, cleared| devices.get_mut(index).is_some_and(|d| clear(d, cleared)));
    }

    /// The index of the device at PCI bus id `bus_id`.
    pub fn index_by_bus_id(&self, bus_id: &str) -> Option<usize> {
        self.fixture
            .devices
            .iter()
            .position(|d| d.pci.bus_id.eq_ignore_ascii_case(bus_id))
    }

    /// A GPU reset of device `index`: its volatile ECC counters and pending row remap are
    /// cleared (a pending remap is applied by a reset), until the fixture shows new values.
    pub fn reset(&mut self, index: usize) {
        if let Some(d) = self.fixture.devices.get_mut(index) {
            let cleared = Cleared {
                vol: (d.ecc.vol.corr, d.ecc.vol.unc),
                remap_pending: d.remapped_rows.pending,
                recovery_action: d.recovery_action.filter(|a| RESET_ACTIONS.contains(a)),
                nvlink_errors: d.nvlink_errors.clone(),
            };
            clear(d, &cleared);
            self.hardware.resets.insert(index, cleared);
        }
    }

    /// Saves the hardware state next to the fixture (best effort: a fake that cannot write it
    /// forgets it at the next process, as a fixture-only fake would).
    pub fn save_hardware(&mut self) {
        if let Ok(json) = serde_json::to_string(&self.hardware) {
            let path = Hardware::path(&self.path);
            if std::fs::write(&path, json).is_ok() {
                self.hardware_stamp = stamp_of(&path).ok();
            }
        }
    }

    /// The device behind a handle, with the error code configured for `symbol` if any.
    pub fn device(&self, handle: usize, symbol: &str) -> Result<&Device, u32> {
        let device = handle
            .checked_sub(1)
            .and_then(|index| self.fixture.devices.get(index))
            .ok_or(code::INVALID_ARGUMENT)?;
        // "*" covers calls on the device; getting its handle is configured by its own key.
        let wildcard = if symbol == "nvmlDeviceGetHandleByIndex_v2" {
            None
        } else {
            device.errors.get("*")
        };
        if let Some(code) = device.errors.get(symbol).or(wildcard) {
            return Err(*code);
        }
        // Removed from the bus and not discovered again: gone, like a GPU that fell off it.
        if self.hardware.removed.contains(&device.pci.bus_id) && symbol != "nvmlDeviceGetHandleByIndex_v2" {
            return Err(code::GPU_IS_LOST);
        }
        Ok(device)
    }

    /// Whether persistence mode is on for device `index`: as last set, else as the fixture says.
    pub fn persistent(&self, index: usize) -> bool {
        self.fixture.devices.get(index).is_some_and(|d| {
            self.hardware
                .persistence
                .get(&d.pci.bus_id)
                .copied()
                .unwrap_or(d.persistence != 0)
        })
    }

    /// The error configured for a call that takes no device.
    pub fn global_error(&self, symbol: &str) -> Option<u32> {
        self.fixture.errors.get(symbol).copied()
    }
}

/// Sets `d`'s management limit to `limit_mw`; the enforced limit follows it unless the fixture
/// caps the board lower than its management limit (then the lower of the two).
fn set_limit(d: &mut Device, limit_mw: i64) {
    d.enforced_limit_mw = if d.enforced_limit_mw < d.power_limit_mw {
        d.enforced_limit_mw.min(limit_mw)
    } else {
        limit_mw
    };
    d.power_limit_mw = limit_mw;
}

/// Clears on `d` what a reset cleared, where it still shows the values it had then; whether any
/// did (the reset still applies to this fixture).
fn clear(d: &mut Device, cleared: &Cleared) -> bool {
    let mut applies = false;
    if (d.ecc.vol.corr, d.ecc.vol.unc) == cleared.vol {
        d.ecc.vol = Default::default();
        applies = true;
    }
    if d.remapped_rows.pending == cleared.remap_pending {
        d.remapped_rows.pending = 0;
        applies = true;
    }
    if cleared.recovery_action.is_some() && d.recovery_action == cleared.recovery_action {
        d.recovery_action = Some(0);
        applies = true;
    }
    // A reset zeroes the volatile NVLink counters: what the fixture shows beyond the values
    // then is what the links counted since. A fixture below them describes another history.
    let since: Option<Vec<NvlinkErrors>> = d
        .nvlink_errors
        .iter()
        .enumerate()
        .map(|(i, now)| now.since(cleared.nvlink_errors.get(i).unwrap_or(&NvlinkErrors::default())))
        .collect();
    if let Some(since) = since.filter(|_| {
        cleared
            .nvlink_errors
            .iter()
            .any(|e| *e != NvlinkErrors::default())
    }) {
        d.nvlink_errors = since;
        applies = true;
    }
    applies
}

/// The fixture path: `FAKE_NVML_FIXTURE`, else a sidecar `<this library's path>.json`. The
/// sidecar lets tests in one process load several copies of the library, each with its own
/// fixture, without racing on a process-wide environment variable.
fn fixture_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(FIXTURE_ENV) {
        return Some(PathBuf::from(path));
    }
    let mut sidecar = own_path()?.into_os_string();
    sidecar.push(".json");
    let sidecar = PathBuf::from(sidecar);
    sidecar.exists().then_some(sidecar)
}

/// Where this shared object was loaded from (dladdr on one of our own functions).
fn own_path() -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let addr = own_path as fn() -> Option<PathBuf> as *const libc::c_void;
    // SAFETY: dladdr only reads the address and fills `info`; dli_fname, when set, points to a
    // NUL-terminated string owned by the dynamic loader that outlives this call.
    let found = unsafe { libc::dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: checked non-null above; the loader keeps the string alive while we are loaded.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    use std::os::unix::ffi::OsStrExt;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
}

fn stamp_of(path: &Path) -> std::io::Result<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    Ok((meta.modified()?, meta.len(), meta.ino()))
}

fn load(path: &Path) -> Result<(Fixture, Stamp), String> {
    let stamp = stamp_of(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let fixture = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((fixture, stamp))
}
