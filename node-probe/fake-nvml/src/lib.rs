//! A fake `libnvidia-ml.so`: exports the NVML C symbols the node-probe calls (through
//! nvml-wrapper), answering from a JSON fixture instead of a driver.
//!
//! * **Fixture:** the file named by `FAKE_NVML_FIXTURE`, else `<path of this .so>.json` (lets a
//!   test load several copies of the library in one process, each with its own fixture). See
//!   [`fixture::Fixture`] for the format; every key has a healthy-H100 default.
//! * **Live changes:** the file is re-read whenever its modification time, size or inode changes (checked
//!   on every call), so a running probe sees a flipped fixture.
//! * **XID events, as the real library delivers them:** only to event sets registered before the
//!   event happened. Each device lists `events`, identified by `id` (default: 1-based position);
//!   an event *happens* when a re-read of the fixture first lists its id (absent from the version
//!   read before), and is then queued, once or `repeat` times, to every event set registered at
//!   that moment for its device and type. Events already in the fixture when the library is
//!   initialised happened before anyone could register: a new process (or a re-init after the
//!   last `nvmlShutdown`) never sees them, and an event set created later never sees earlier
//!   events. To inject an XID, wait until the probe has registered (its log line "listening for
//!   XID events"), then append `{"id": N, "xid": 79}` to a device's `events` or swap in a fixture
//!   that lists it. Rewriting the list with the same ids delivers nothing; dropping an id and
//!   listing it again later makes it happen again.
//! * **GPU reset, as NVML does it:** `nvmlDeviceModifyDrainState` (drain on; refused with InUse
//!   while persistence mode is on, which `nvmlDeviceSetPersistenceMode` turns off), then
//!   `nvmlDeviceRemoveGpu_v2` (refused with InUse unless drained and free of the device's
//!   `processes`, which the running-process queries list, and of persistence mode; afterwards
//!   every call on the device is GpuIsLost), then `nvmlDeviceDiscoverGpus` brings it back reset,
//!   persistence mode off: its volatile ECC counters and its pending row remap read as cleared
//!   until the fixture shows new values. Like hardware, this outlives the process: it is kept in
//!   `<fixture>.hardware`. Each call fails on demand through the device's `errors` (by symbol
//!   name).
//! * **Errors:** `init_error` makes `nvmlInit_v2` fail with that code; per-device `errors` maps a C
//!   symbol (or `"*"`) to the code it returns; top-level `errors` does the same for calls without
//!   a device.
//!
//! Build: `cargo build -p fake-nvml` → `target/<profile>/libfake_nvml.so`. Load it with
//! `Nvml::builder().lib_path(..)` or as `libnvidia-ml.so.1` on `LD_LIBRARY_PATH`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod fixture;
mod state;

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::time::{Duration, Instant};

use fixture::Device;
use state::{code, with_state};

type Return = c_uint;
/// `nvmlDevice_t`: the device index + 1, so null is never a valid handle.
type DeviceHandle = *mut c_void;
/// `nvmlEventSet_t`: the event set id.
type EventSetHandle = *mut c_void;

/// `nvmlPciInfo_t` (v3).
#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// The version word nvml-wrapper presets for `nvmlMemory_v2_t`: size | 2 << 24.
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

/// `nvmlProcessInfo_t` (v2 layout, what the `_v3` process queries fill).
#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    device: DeviceHandle,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlFieldValue_t`; the value union is kept as raw bytes.
#[repr(C)]
pub struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: c_uint,
    value: u64,
}

/// NVML_FI_DEV_MEMORY_TEMP.
const FIELD_MEMORY_TEMP: c_uint = 82;
/// NVML_FI_DEV_NVLINK_LINK_COUNT.
const FIELD_NVLINK_LINK_COUNT: c_uint = 91;
/// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h; not among the ids renumbered from driver 580.82).
const FIELD_RECOVERY_ACTION: c_uint = 230;
/// NVML_VALUE_TYPE_UNSIGNED_INT.
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

// ---------------------------------------------------------------------------------------------
// Helpers

/// Writes `value` through `ptr`, or returns InvalidArgument for a null pointer.
unsafe fn put<T>(ptr: *mut T, value: T) -> Return {
    if ptr.is_null() {
        return code::INVALID_ARGUMENT;
    }
    // SAFETY: the caller passes a pointer to a live, writable T (NVML's contract).
    unsafe { ptr.write(value) };
    code::SUCCESS
}

/// Copies `s` and a NUL into a caller buffer of `len` bytes; InsufficientSize when it does not fit.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Return {
    if buf.is_null() {
        return code::INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return code::INSUFFICIENT_SIZE;
    }
    // SAFETY: the buffer holds `len` bytes and we write bytes.len() + 1 <= len of them.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    code::SUCCESS
}

/// Fills a fixed C char array with `s`, truncated so a NUL always fits.
fn fill_chars(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    if let Some(last) = dst.get_mut(n) {
        *last = 0;
    }
}

/// Runs `f` on the device behind `handle` unless the fixture configures an error for `symbol`.
fn device_call(handle: DeviceHandle, symbol: &str, f: impl FnOnce(&Device) -> Return) -> Return {
    hang_while_listed(symbol);
    with_state(|s| match s.device(handle as usize, symbol) {
        Ok(device) => f(device),
        Err(code) => code,
    })
    .unwrap_or(code::UNINITIALIZED)
}

/// Blocks while the fixture lists `symbol` under `hang`, as a call into a hung driver would;
/// the state lock is not held meanwhile, so other threads' calls and re-reads go on.
fn hang_while_listed(symbol: &str) {
    while with_state(|s| s.fixture.hang.iter().any(|h| h == symbol)).unwrap_or(false) {
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Runs `f` unless the fixture configures an error for `symbol` (calls without a device).
fn global_call(symbol: &str, f: impl FnOnce(&mut state::State) -> Return) -> Return {
    with_state(|s| match s.global_error(symbol) {
        Some(code) => code,
        None => f(s),
    })
    .unwrap_or(code::UNINITIALIZED)
}

/// The bus id a caller's `nvmlPciInfo_t` names.
unsafe fn bus_id_of(pci: *const PciInfo) -> Option<String> {
    if pci.is_null() {
        return None;
    }
    // SAFETY: the caller passes a live nvmlPciInfo_t (NVML's contract); bus_id is a fixed array.
    let raw = unsafe { &(*pci).bus_id };
    let bytes: Vec<u8> = raw.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8(bytes).ok()
}

/// Runs `f` on the device at the bus id `pci` names (its index), unless the fixture configures
/// an error for `symbol` on it.
fn pci_call(
    pci: *const PciInfo,
    symbol: &str,
    f: impl FnOnce(&mut state::State, usize, String) -> Return,
) -> Return {
    // SAFETY: forwarded from the C caller.
    let Some(bus) = (unsafe { bus_id_of(pci) }) else {
        return code::INVALID_ARGUMENT;
    };
    with_state(|s| {
        let Some(index) = s.index_by_bus_id(&bus) else {
            return code::NOT_FOUND;
        };
        if let Some(code) = s.fixture.devices.get(index).and_then(|d| d.errors.get(symbol)) {
            return *code;
        }
        f(s, index, bus)
    })
    .unwrap_or(code::UNINITIALIZED)
}

// ---------------------------------------------------------------------------------------------
// Library and system

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> Return {
    state::init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Return {
    state::init()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> Return {
    state::shutdown()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: Return) -> *const c_char {
    let s: &'static [u8] = match result {
        0 => b"Success\0",
        1 => b"Uninitialized\0",
        2 => b"Invalid Argument\0",
        3 => b"Not Supported\0",
        7 => b"Insufficient Size\0",
        9 => b"Driver Not Loaded\0",
        10 => b"Timeout\0",
        15 => b"GPU is lost\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr().cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Return {
    global_call("nvmlSystemGetDriverVersion", |s| unsafe {
        put_str(version, length, &s.fixture.driver_version)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Return {
    global_call("nvmlSystemGetCudaDriverVersion_v2", |s| unsafe {
        put(version, s.fixture.cuda_driver_version as c_int)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Return {
    unsafe { nvmlSystemGetCudaDriverVersion_v2(version) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Return {
    global_call("nvmlDeviceGetCount_v2", |s| unsafe {
        put(count, s.fixture.devices.len() as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut DeviceHandle) -> Return {
    let handle = index as usize + 1;
    with_state(|s| match s.device(handle, "nvmlDeviceGetHandleByIndex_v2") {
        Ok(_) => unsafe { put(device, handle as DeviceHandle) },
        Err(code) => code,
    })
    .unwrap_or(code::UNINITIALIZED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut DeviceHandle) -> Return {
    if uuid.is_null() {
        return code::INVALID_ARGUMENT;
    }
    // SAFETY: NVML takes a NUL-terminated string.
    let wanted = unsafe { std::ffi::CStr::from_ptr(uuid) }
        .to_string_lossy()
        .into_owned();
    global_call("nvmlDeviceGetHandleByUUID", |s| {
        match s.fixture.devices.iter().position(|d| d.uuid == wanted) {
            Some(i) => unsafe { put(device, (i + 1) as DeviceHandle) },
            None => 6,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Identity

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: DeviceHandle, index: *mut c_uint) -> Return {
    device_call(device, "nvmlDeviceGetIndex", |_| unsafe {
        put(index, (device as usize - 1) as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: DeviceHandle,
    name: *mut c_char,
    length: c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetName", |d| unsafe {
        put_str(name, length, &d.name)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: DeviceHandle,
    uuid: *mut c_char,
    length: c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetUUID", |d| unsafe {
        put_str(uuid, length, &d.uuid)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: DeviceHandle,
    serial: *mut c_char,
    length: c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetSerial", |d| unsafe {
        put_str(serial, length, &d.serial)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(device: DeviceHandle, brand: *mut c_uint) -> Return {
    device_call(device, "nvmlDeviceGetBrand", |d| unsafe {
        put(brand, d.brand as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(device: DeviceHandle, arch: *mut c_uint) -> Return {
    device_call(device, "nvmlDeviceGetArchitecture", |d| unsafe {
        put(arch, d.arch as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: DeviceHandle, pci: *mut PciInfo) -> Return {
    device_call(device, "nvmlDeviceGetPciInfo_v3", |d| {
        let mut info = PciInfo {
            bus_id_legacy: [0; 16],
            domain: d.pci.domain as c_uint,
            bus: d.pci.bus as c_uint,
            device: d.pci.device as c_uint,
            pci_device_id: d.pci.pci_device_id as c_uint,
            pci_sub_system_id: d.pci.pci_subsystem_id as c_uint,
            bus_id: [0; 32],
        };
        // The legacy id has a 4-digit domain: "0000:18:00.0".
        let legacy = d.pci.bus_id.get(4..).unwrap_or(&d.pci.bus_id);
        fill_chars(&mut info.bus_id_legacy, legacy);
        fill_chars(&mut info.bus_id, &d.pci.bus_id);
        unsafe { put(pci, info) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: DeviceHandle, memory: *mut MemoryV2) -> Return {
    device_call(device, "nvmlDeviceGetMemoryInfo_v2", |d| {
        if memory.is_null() {
            return code::INVALID_ARGUMENT;
        }
        // SAFETY: non-null pointer to the caller's struct; the version word is preset by the caller.
        let version = unsafe { (*memory).version };
        if version != MEMORY_V2_VERSION {
            return code::ARGUMENT_VERSION_MISMATCH;
        }
        let m = &d.memory;
        let value = MemoryV2 {
            version,
            total: m.total as u64,
            reserved: m.reserved as u64,
            free: m.free as u64,
            used: m.used as u64,
        };
        unsafe { put(memory, value) }
    })
}

// ---------------------------------------------------------------------------------------------
// Memory health

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: DeviceHandle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetEccMode", |d| unsafe {
        match put(current, d.ecc.current as c_uint) {
            code::SUCCESS => put(pending, d.ecc.pending as c_uint),
            err => err,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: DeviceHandle,
    error_type: c_uint,
    counter_type: c_uint,
    count: *mut c_ulonglong,
) -> Return {
    device_call(device, "nvmlDeviceGetTotalEccErrors", |d| {
        let counts = match counter_type {
            0 => &d.ecc.vol,
            1 => &d.ecc.agg,
            _ => return code::INVALID_ARGUMENT,
        };
        let value = match error_type {
            0 => counts.corr,
            1 => counts.unc,
            _ => return code::INVALID_ARGUMENT,
        };
        unsafe { put(count, value as u64) }
    })
}

fn retired_list(d: &Device, cause: c_uint) -> Option<&[u64]> {
    match cause {
        0 => Some(&d.retired_pages.sbe),
        1 => Some(&d.retired_pages.dbe),
        _ => None,
    }
}

/// Shared body of both retired-pages calls: report the count when the caller's buffer is too
/// small, else fill addresses (and timestamps when asked).
unsafe fn retired_pages(
    d: &Device,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Return {
    let Some(pages) = retired_list(d, cause) else {
        return code::INVALID_ARGUMENT;
    };
    if count.is_null() {
        return code::INVALID_ARGUMENT;
    }
    // SAFETY: non-null pointer to the caller's capacity.
    let capacity = unsafe { *count } as usize;
    let n = pages.len();
    unsafe { count.write(n as c_uint) };
    if n == 0 {
        return code::SUCCESS;
    }
    if capacity < n {
        return code::INSUFFICIENT_SIZE;
    }
    if addresses.is_null() {
        return code::INVALID_ARGUMENT;
    }
    for (i, addr) in pages.iter().enumerate() {
        // SAFETY: the caller's arrays hold `capacity` >= n entries.
        unsafe {
            addresses.add(i).write(*addr);
            if !timestamps.is_null() {
                timestamps.add(i).write(1_700_000_000 + i as u64);
            }
        }
    }
    code::SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: DeviceHandle,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> Return {
    device_call(device, "nvmlDeviceGetRetiredPages", |d| unsafe {
        retired_pages(d, cause, count, addresses, std::ptr::null_mut())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: DeviceHandle,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Return {
    device_call(device, "nvmlDeviceGetRetiredPages_v2", |d| unsafe {
        retired_pages(d, cause, count, addresses, timestamps)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: DeviceHandle,
    pending: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetRetiredPagesPendingStatus", |d| unsafe {
        put(pending, d.retired_pages.pending as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: DeviceHandle,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failure: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetRemappedRows", |d| {
        if d.arch < 7 {
            return code::NOT_SUPPORTED;
        }
        let r = &d.remapped_rows;
        for (ptr, value) in [
            (corr, r.corr),
            (unc, r.unc),
            (pending, r.pending),
            (failure, r.failure),
        ] {
            let rc = unsafe { put(ptr, value as c_uint) };
            if rc != code::SUCCESS {
                return rc;
            }
        }
        code::SUCCESS
    })
}

// ---------------------------------------------------------------------------------------------
// Thermal, power, clocks

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: DeviceHandle,
    sensor: c_uint,
    temp: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetTemperature", |d| match sensor {
        0 => unsafe { put(temp, d.temperature as c_uint) },
        _ => code::INVALID_ARGUMENT,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: DeviceHandle,
    threshold: c_uint,
    temp: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetTemperatureThreshold", |d| {
        let t = &d.thresholds;
        let value = match threshold {
            0 => t.shutdown,
            1 => t.slowdown,
            2 => t.mem_max,
            3 => t.gpu_max,
            _ => return code::INVALID_ARGUMENT,
        };
        unsafe { put(temp, value as c_uint) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumFans(device: DeviceHandle, count: *mut c_uint) -> Return {
    device_call(device, "nvmlDeviceGetNumFans", |d| match &d.fans {
        Some(fans) => unsafe { put(count, fans.len() as c_uint) },
        None => code::NOT_SUPPORTED,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: DeviceHandle,
    fan: c_uint,
    speed: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetFanSpeed_v2", |d| match &d.fans {
        Some(fans) => match fans.get(fan as usize) {
            Some(v) => unsafe { put(speed, *v as c_uint) },
            None => code::INVALID_ARGUMENT,
        },
        None => code::NOT_SUPPORTED,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: DeviceHandle, power: *mut c_uint) -> Return {
    device_call(device, "nvmlDeviceGetPowerUsage", |d| unsafe {
        put(power, d.power_mw as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: DeviceHandle,
    limit: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetPowerManagementLimit", |d| unsafe {
        put(limit, d.power_limit_mw as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(device: DeviceHandle, limit: *mut c_uint) -> Return {
    device_call(device, "nvmlDeviceGetEnforcedPowerLimit", |d| unsafe {
        put(limit, d.enforced_limit_mw as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementDefaultLimit(
    device: DeviceHandle,
    limit: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetPowerManagementDefaultLimit", |d| unsafe {
        put(limit, d.default_limit_mw as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: DeviceHandle,
    min_limit: *mut c_uint,
    max_limit: *mut c_uint,
) -> Return {
    device_call(
        device,
        "nvmlDeviceGetPowerManagementLimitConstraints",
        |d| unsafe {
            match put(min_limit, d.min_limit_mw as c_uint) {
                code::SUCCESS => put(max_limit, d.max_limit_mw as c_uint),
                err => err,
            }
        },
    )
}

/// Sets the power management limit, as `nvidia-smi -pl` does: root only (NoPermission unless
/// the fixture says `privileged`), InvalidArgument outside the board's constraints. The limit
/// is kept like hardware ([`state::Hardware`]): across processes and GPU resets (a reset does
/// not restore the default), until set again or the machine reboots (the hardware file gone).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPowerManagementLimit(device: DeviceHandle, limit: c_uint) -> Return {
    with_state(|s| {
        let (min, max) = match s.device(device as usize, "nvmlDeviceSetPowerManagementLimit") {
            Ok(d) => (d.min_limit_mw, d.max_limit_mw),
            Err(code) => return code,
        };
        if !s.fixture.privileged {
            return code::NO_PERMISSION;
        }
        let limit = i64::from(limit);
        if limit < min || limit > max {
            return code::INVALID_ARGUMENT;
        }
        s.set_power_limit((device as usize).saturating_sub(1), limit);
        code::SUCCESS
    })
    .unwrap_or(code::UNINITIALIZED)
}

/// The deprecated name nvml-wrapper 0.13 resolves for `current_throttle_reasons()`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: DeviceHandle,
    reasons: *mut c_ulonglong,
) -> Return {
    device_call(device, "nvmlDeviceGetCurrentClocksThrottleReasons", |d| unsafe {
        put(reasons, d.throttle_reasons)
    })
}

/// The current name of the same call (drivers >= 535).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: DeviceHandle,
    reasons: *mut c_ulonglong,
) -> Return {
    device_call(device, "nvmlDeviceGetCurrentClocksEventReasons", |d| unsafe {
        put(reasons, d.throttle_reasons)
    })
}

// ---------------------------------------------------------------------------------------------
// Links and modes

macro_rules! pcie_getter {
    ($name:ident, $field:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: DeviceHandle, value: *mut c_uint) -> Return {
            device_call(device, stringify!($name), |d| unsafe {
                put(value, d.pcie.$field as c_uint)
            })
        }
    };
}

pcie_getter!(nvmlDeviceGetCurrPcieLinkGeneration, generation);
pcie_getter!(nvmlDeviceGetMaxPcieLinkGeneration, max_gen);
pcie_getter!(nvmlDeviceGetCurrPcieLinkWidth, width);
pcie_getter!(nvmlDeviceGetMaxPcieLinkWidth, max_width);
pcie_getter!(nvmlDeviceGetPcieReplayCounter, replay);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: DeviceHandle,
    link: c_uint,
    active: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetNvLinkState", |d| {
        match d.nvlink.get(link as usize) {
            Some(state) => unsafe { put(active, *state as c_uint) },
            None => code::INVALID_ARGUMENT,
        }
    })
}

/// `nvmlDeviceGetNvLinkErrorCounter`: the fixture's cumulative counter of an active link
/// (less what the last GPU reset cleared). A link that is down has none (NotSupported), a link
/// past the GPU's and a counter past `NVML_NVLINK_ERROR_DL_ECC_DATA` are InvalidArg.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: DeviceHandle,
    link: c_uint,
    counter: c_uint,
    value: *mut c_ulonglong,
) -> Return {
    device_call(device, "nvmlDeviceGetNvLinkErrorCounter", |d| {
        match d.nvlink.get(link as usize) {
            None => code::INVALID_ARGUMENT,
            Some(0) => code::NOT_SUPPORTED,
            Some(_) => {
                let counters = d.nvlink_errors.get(link as usize).copied().unwrap_or_default();
                match counters.get(counter) {
                    Some(v) => unsafe { put(value, v) },
                    None => code::INVALID_ARGUMENT,
                }
            }
        }
    })
}

/// `nvmlGpuFabricInfo_t`, the unversioned struct.
#[repr(C)]
pub struct GpuFabricInfo {
    cluster_uuid: [u8; 16],
    status: c_uint,
    clique_id: c_uint,
    state: u8,
}

/// `nvmlGpuFabricInfo_v3_t`; v2 is the same without `health_summary`.
#[repr(C)]
pub struct GpuFabricInfoV {
    version: c_uint,
    cluster_uuid: [u8; 16],
    status: c_uint,
    clique_id: c_uint,
    state: u8,
    health_mask: c_uint,
    health_summary: u8,
}

/// Size of `nvmlGpuFabricInfo_v2_t`: v3 without its trailing `healthSummary` and padding.
const FABRIC_INFO_V2_SIZE: u32 = 36;
/// `nvmlGpuFabricInfo_v2` and `_v3`: the struct size with the version in the top byte.
const FABRIC_INFO_V2: u32 = FABRIC_INFO_V2_SIZE | (2 << 24);
const FABRIC_INFO_V3: u32 = std::mem::size_of::<GpuFabricInfoV>() as u32 | (3 << 24);

/// `nvmlDeviceGetGpuFabricInfoV`: the fixture's `fabric` in the caller's v2 or v3 struct (any
/// other version: ArgumentVersionMismatch, as NVML answers); no `fabric`: NotSupported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfoV(
    device: DeviceHandle,
    info: *mut GpuFabricInfoV,
) -> Return {
    device_call(device, "nvmlDeviceGetGpuFabricInfoV", |d| {
        if info.is_null() {
            return code::INVALID_ARGUMENT;
        }
        // SAFETY: the caller passes a struct at least as large as the version it names; the
        // version word is first in every version.
        let version = unsafe { (*info).version };
        if version != FABRIC_INFO_V2 && version != FABRIC_INFO_V3 {
            return code::ARGUMENT_VERSION_MISMATCH;
        }
        let Some(f) = &d.fabric else {
            return code::NOT_SUPPORTED;
        };
        // SAFETY: as above; v2's fields are a prefix of v3's, and only v3 gets the summary.
        unsafe {
            (*info).cluster_uuid = f.uuid_bytes();
            (*info).status = f.status;
            (*info).clique_id = f.clique_id;
            (*info).state = f.state as u8;
            (*info).health_mask = f.health_mask;
            if version == FABRIC_INFO_V3 {
                (*info).health_summary = f.health_summary;
            }
        }
        code::SUCCESS
    })
}

/// `nvmlDeviceGetGpuFabricInfo`: the unversioned call of older drivers, without the health mask.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: DeviceHandle,
    info: *mut GpuFabricInfo,
) -> Return {
    device_call(device, "nvmlDeviceGetGpuFabricInfo", |d| {
        let Some(f) = &d.fabric else {
            return code::NOT_SUPPORTED;
        };
        unsafe {
            put(
                info,
                GpuFabricInfo {
                    cluster_uuid: f.uuid_bytes(),
                    status: f.status,
                    clique_id: f.clique_id,
                    state: f.state as u8,
                },
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(device: DeviceHandle, mode: *mut c_uint) -> Return {
    with_state(
        |s| match s.device(device as usize, "nvmlDeviceGetPersistenceMode") {
            // SAFETY: the caller passes a writable unsigned int.
            Ok(_) => unsafe { put(mode, c_uint::from(s.persistent(device as usize - 1))) },
            Err(code) => code,
        },
    )
    .unwrap_or(code::UNINITIALIZED)
}

/// Persistence mode on or off (root only on real NVML); kept like hardware, and off again on
/// a GPU discovered after its removal (nvidia-persistenced would turn it back on).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetPersistenceMode(device: DeviceHandle, mode: c_uint) -> Return {
    with_state(|s| {
        let bus = match s.device(device as usize, "nvmlDeviceSetPersistenceMode") {
            Ok(d) => d.pci.bus_id.clone(),
            Err(code) => return code,
        };
        s.hardware.persistence.insert(bus, mode != 0);
        s.save_hardware();
        code::SUCCESS
    })
    .unwrap_or(code::UNINITIALIZED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: DeviceHandle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Return {
    device_call(device, "nvmlDeviceGetMigMode", |d| unsafe {
        match put(current, d.mig.current as c_uint) {
            code::SUCCESS => put(pending, d.mig.pending as c_uint),
            err => err,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: DeviceHandle,
    count: c_int,
    values: *mut FieldValue,
) -> Return {
    let recovery_field = FIELD_RECOVERY_ACTION;
    device_call(device, "nvmlDeviceGetFieldValues", |d| {
        if values.is_null() || count <= 0 {
            return code::INVALID_ARGUMENT;
        }
        for i in 0..count as usize {
            // SAFETY: the caller's array holds `count` entries.
            let v = unsafe { &mut *values.add(i) };
            let (rc, value) = match d.errors.get(&format!("field:{}", v.field_id)) {
                Some(code) => (*code, 0),
                None => match v.field_id {
                    FIELD_MEMORY_TEMP => match d.memory_temperature {
                        Some(t) => (code::SUCCESS, u64::from(t as c_uint)),
                        None => (code::NOT_SUPPORTED, 0),
                    },
                    FIELD_NVLINK_LINK_COUNT => (code::SUCCESS, d.nvlink.len() as u64),
                    id if id == recovery_field => match d.recovery_action {
                        Some(a) => (code::SUCCESS, u64::from(a as c_uint)),
                        None => (code::NOT_SUPPORTED, 0),
                    },
                    _ => (code::NOT_SUPPORTED, 0),
                },
            };
            v.nvml_return = rc;
            v.value_type = VALUE_TYPE_UNSIGNED_INT;
            v.value = value;
            v.timestamp = 0;
            v.latency_usec = 0;
        }
        code::SUCCESS
    })
}

// ---------------------------------------------------------------------------------------------
// Events

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut EventSetHandle) -> Return {
    global_call("nvmlEventSetCreate", |s| {
        let id = s.next_event_set;
        s.next_event_set += 1;
        s.event_sets.insert(id, state::EventSet::default());
        unsafe { put(set, id as EventSetHandle) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: EventSetHandle) -> Return {
    with_state(|s| match s.event_sets.remove(&(set as usize)) {
        Some(_) => code::SUCCESS,
        None => code::INVALID_ARGUMENT,
    })
    .unwrap_or(code::UNINITIALIZED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: DeviceHandle,
    types: *mut c_ulonglong,
) -> Return {
    device_call(device, "nvmlDeviceGetSupportedEventTypes", |d| unsafe {
        put(types, d.supported_events)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: DeviceHandle,
    types: c_ulonglong,
    set: EventSetHandle,
) -> Return {
    with_state(|s| {
        let supported = match s.device(device as usize, "nvmlDeviceRegisterEvents") {
            Ok(d) => d.supported_events,
            Err(code) => return code,
        };
        if types & !supported != 0 {
            return code::NOT_SUPPORTED;
        }
        match s.event_sets.get_mut(&(set as usize)) {
            Some(set) => {
                set.registrations.push((device as usize - 1, types));
                code::SUCCESS
            }
            None => code::INVALID_ARGUMENT,
        }
    })
    .unwrap_or(code::UNINITIALIZED)
}

/// Takes the next event queued to the set, if any.
fn next_event(s: &mut state::State, set: usize) -> Result<Option<EventData>, Return> {
    let queue = &mut s.event_sets.get_mut(&set).ok_or(code::INVALID_ARGUMENT)?.queue;
    let Some(front) = queue.front_mut() else {
        return Ok(None);
    };
    let event = *front;
    // A flood (`repeat`) is one queue entry counted down, so a billion events take no memory.
    front.remaining -= 1;
    if front.remaining == 0 {
        queue.pop_front();
    }
    Ok(Some(EventData {
        device: (event.device + 1) as DeviceHandle,
        event_type: event.event_type,
        event_data: event.xid,
        gpu_instance_id: u32::MAX,
        compute_instance_id: u32::MAX,
    }))
}

/// How often a waiting `nvmlEventSetWait_v2` looks at the fixture again.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Waits up to `timeout_ms` for an event, polling the (possibly re-read) fixture.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: EventSetHandle,
    data: *mut EventData,
    timeout_ms: c_uint,
) -> Return {
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        let found = with_state(|s| match s.global_error("nvmlEventSetWait_v2") {
            Some(code) => Err(code),
            None => next_event(s, set as usize),
        });
        match found {
            None => return code::UNINITIALIZED,
            Some(Err(code)) => return code,
            Some(Ok(Some(event))) => return unsafe { put(data, event) },
            Some(Ok(None)) => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return code::TIMEOUT;
        }
        // The real library blocks in the driver; the fake has to poll its fixture. Each poll
        // takes a lock and stats the file, so polling every few ms would charge the probe CPU the
        // real NVML never costs; 100 ms keeps injected XIDs far inside the 2 s publish target.
        std::thread::sleep((deadline - now).min(POLL_INTERVAL));
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

/// The compute (or graphics) processes of a device, as NVML lists them: `*count` in is the room
/// in `infos`, out the number of processes; InsufficientSize when they do not fit (a null
/// `infos` with room 0 asks for the count).
unsafe fn processes(
    device: DeviceHandle,
    symbol: &str,
    graphics: bool,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Return {
    device_call(device, symbol, |d| {
        if count.is_null() {
            return code::INVALID_ARGUMENT;
        }
        let list: Vec<_> = d.processes.iter().filter(|p| p.graphics == graphics).collect();
        // SAFETY: checked non-null; the caller passes a readable, writable unsigned int.
        let room = unsafe { count.read() } as usize;
        // SAFETY: as above.
        unsafe { count.write(list.len() as c_uint) };
        if list.len() > room || (infos.is_null() && !list.is_empty()) {
            return code::INSUFFICIENT_SIZE;
        }
        for (i, p) in list.iter().enumerate() {
            // SAFETY: `infos` holds `room` >= list.len() entries (NVML's contract).
            unsafe {
                infos.add(i).write(ProcessInfo {
                    pid: p.pid,
                    used_gpu_memory: p.used_memory,
                    gpu_instance_id: c_uint::MAX,
                    compute_instance_id: c_uint::MAX,
                })
            };
        }
        code::SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: DeviceHandle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Return {
    // SAFETY: forwarded from the C caller.
    unsafe {
        processes(
            device,
            "nvmlDeviceGetComputeRunningProcesses_v3",
            false,
            count,
            infos,
        )
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: DeviceHandle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Return {
    // SAFETY: forwarded from the C caller.
    unsafe {
        processes(
            device,
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            true,
            count,
            infos,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// GPU reset: drain, remove, discover

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceModifyDrainState(pci: *mut PciInfo, new_state: c_uint) -> Return {
    pci_call(pci, "nvmlDeviceModifyDrainState", |s, index, bus| {
        if new_state == 0 {
            s.hardware.drained.remove(&bus);
        } else if s.persistent(index) {
            // NVML: persistence mode must be turned off before a GPU is drained; it counts as
            // an attachment to the GPU.
            return code::IN_USE;
        } else {
            s.hardware.drained.insert(bus);
        }
        s.save_hardware();
        code::SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceQueryDrainState(pci: *mut PciInfo, current: *mut c_uint) -> Return {
    pci_call(pci, "nvmlDeviceQueryDrainState", |s, _, bus| {
        // SAFETY: the caller passes a writable unsigned int.
        unsafe { put(current, c_uint::from(s.hardware.drained.contains(&bus))) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRemoveGpu_v2(
    pci: *mut PciInfo,
    _gpu_state: c_uint,
    _link_state: c_uint,
) -> Return {
    pci_call(pci, "nvmlDeviceRemoveGpu_v2", |s, index, bus| {
        // NVML removes only a drained GPU (new work could land on it otherwise) that no process
        // uses; persistence mode counts as one.
        let busy = s
            .fixture
            .devices
            .get(index)
            .is_some_and(|d| !d.processes.is_empty())
            || s.persistent(index);
        if !s.hardware.drained.contains(&bus) || busy {
            return code::IN_USE;
        }
        s.hardware.removed.insert(bus);
        s.save_hardware();
        code::SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceDiscoverGpus(pci: *mut PciInfo) -> Return {
    pci_call(pci, "nvmlDeviceDiscoverGpus", |s, index, bus| {
        if s.hardware.removed.remove(&bus) {
            s.hardware.drained.remove(&bus);
            s.hardware.persistence.insert(bus.clone(), false);
            s.reset(index);
            s.save_hardware();
        }
        code::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> Vec<std::path::PathBuf> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let mut out: Vec<_> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn every_committed_fixture_parses() {
        let all = fixtures();
        assert!(all.len() >= 9, "{all:?}");
        for path in all {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let parsed: Result<fixture::Fixture, _> = serde_json::from_str(&text);
            assert!(parsed.is_ok(), "{}: {:?}", path.display(), parsed.err());
        }
    }

    #[test]
    fn strings_that_do_not_fit_are_insufficient_size() {
        let mut buf = [0 as c_char; 4];
        assert_eq!(
            unsafe { put_str(buf.as_mut_ptr(), 4, "abcd") },
            code::INSUFFICIENT_SIZE
        );
        assert_eq!(unsafe { put_str(buf.as_mut_ptr(), 4, "abc") }, code::SUCCESS);
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
        let mut bus = [1 as c_char; 8];
        fill_chars(&mut bus, "00000000:18:00.0");
        assert_eq!(bus[7], 0);
    }

    /// The process-wide state is shared, so the whole call sequence is one test.
    #[test]
    fn call_sequence_against_a_live_fixture() {
        let dir = std::env::temp_dir().join(format!("fake-nvml-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fixture.json");
        let write = |json: &str| {
            let tmp = dir.join("fixture.tmp");
            std::fs::write(&tmp, json).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        };
        write(r#"{"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b", "errors": {"nvmlDeviceGetUUID": 15}}]}"#);
        // SAFETY: no other test of this crate reads the environment.
        unsafe { std::env::set_var(state::FIXTURE_ENV, &path) };

        let mut count = 0;
        assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut count) }, code::UNINITIALIZED);
        assert_eq!(nvmlInit_v2(), code::SUCCESS);
        assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut count) }, code::SUCCESS);
        assert_eq!(count, 2);

        let mut handle: DeviceHandle = std::ptr::null_mut();
        assert_eq!(
            unsafe { nvmlDeviceGetHandleByIndex_v2(2, &mut handle) },
            code::INVALID_ARGUMENT
        );
        assert_eq!(
            unsafe { nvmlDeviceGetHandleByIndex_v2(1, &mut handle) },
            code::SUCCESS
        );
        let mut buf = [0 as c_char; 96];
        assert_eq!(unsafe { nvmlDeviceGetUUID(handle, buf.as_mut_ptr(), 96) }, 15);

        // Events: delivered only to sets registered before they happened, registered type
        // only, once per id, not replayed after a re-read.
        let mut data = EventData {
            device: std::ptr::null_mut(),
            event_type: 0,
            event_data: 0,
            gpu_instance_id: 0,
            compute_instance_id: 0,
        };
        // An event appended before the set registered is never delivered to it.
        write(r#"{"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b", "events": [{"id": 7, "xid": 13}]}]}"#);
        assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut count) }, code::SUCCESS);
        let mut set: EventSetHandle = std::ptr::null_mut();
        assert_eq!(unsafe { nvmlEventSetCreate(&mut set) }, code::SUCCESS);
        assert_eq!(nvmlDeviceRegisterEvents(handle, 0x8, set), code::SUCCESS);
        assert_eq!(nvmlDeviceRegisterEvents(handle, 0x4, set), code::NOT_SUPPORTED);
        assert_eq!(unsafe { nvmlEventSetWait_v2(set, &mut data, 0) }, code::TIMEOUT);
        // One appended after registration is, once per `repeat`.
        let with_event = r#"{"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b", "events": [{"id": 7, "xid": 13}, {"id": 8, "xid": 79, "repeat": 2}, {"id": 9, "type": 1, "xid": 5}]}]}"#;
        write(with_event);
        for _ in 0..2 {
            assert_eq!(
                unsafe { nvmlEventSetWait_v2(set, &mut data, 1000) },
                code::SUCCESS
            );
            assert_eq!(
                (data.device as usize, data.event_type, data.event_data),
                (2, 8, 79)
            );
        }
        assert_eq!(unsafe { nvmlEventSetWait_v2(set, &mut data, 20) }, code::TIMEOUT);
        // A set created after the event never sees it; re-reads replay nothing.
        let mut later: EventSetHandle = std::ptr::null_mut();
        assert_eq!(unsafe { nvmlEventSetCreate(&mut later) }, code::SUCCESS);
        assert_eq!(nvmlDeviceRegisterEvents(handle, 0x8, later), code::SUCCESS);
        write(&with_event.replace("GPU-a", "GPU-c"));
        assert_eq!(unsafe { nvmlEventSetWait_v2(set, &mut data, 20) }, code::TIMEOUT);
        assert_eq!(
            unsafe { nvmlEventSetWait_v2(later, &mut data, 20) },
            code::TIMEOUT
        );
        // An id dropped from the list and listed again happens again, for both sets.
        write(r#"{"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}]}"#);
        assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut count) }, code::SUCCESS);
        write(r#"{"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b", "events": [{"id": 8, "xid": 48}]}]}"#);
        for s in [set, later] {
            assert_eq!(unsafe { nvmlEventSetWait_v2(s, &mut data, 1000) }, code::SUCCESS);
            assert_eq!(data.event_data, 48);
        }
        assert_eq!(nvmlEventSetFree(set), code::SUCCESS);
        assert_eq!(nvmlEventSetFree(later), code::SUCCESS);

        // Reference-counted init.
        assert_eq!(nvmlInit_v2(), code::SUCCESS);
        assert_eq!(nvmlShutdown(), code::SUCCESS);
        assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut count) }, code::SUCCESS);
        assert_eq!(nvmlShutdown(), code::SUCCESS);
        assert_eq!(unsafe { nvmlDeviceGetCount_v2(&mut count) }, code::UNINITIALIZED);

        // A new process (here: init after the last shutdown) never sees events that were
        // already in the fixture, even ones it had not been told of.
        write(
            r#"{"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b", "events": [{"id": 8, "xid": 48}, {"id": 10, "xid": 79}]}]}"#,
        );
        assert_eq!(nvmlInit_v2(), code::SUCCESS);
        let mut fresh: EventSetHandle = std::ptr::null_mut();
        assert_eq!(unsafe { nvmlEventSetCreate(&mut fresh) }, code::SUCCESS);
        assert_eq!(nvmlDeviceRegisterEvents(handle, 0x8, fresh), code::SUCCESS);
        write(
            r#"{"devices": [{"uuid": "GPU-c"}, {"uuid": "GPU-b", "events": [{"id": 8, "xid": 48}, {"id": 10, "xid": 79}]}]}"#,
        );
        assert_eq!(
            unsafe { nvmlEventSetWait_v2(fresh, &mut data, 20) },
            code::TIMEOUT
        );
        assert_eq!(nvmlEventSetFree(fresh), code::SUCCESS);
        assert_eq!(nvmlShutdown(), code::SUCCESS);

        // The power limit, as `nvidia-smi -pl` sets it: root only, within the constraints,
        // kept across a GPU reset and a new process; only a reboot restores the default.
        let one = |privileged: bool| {
            format!(r#"{{"privileged": {privileged}, "devices": [{{"uuid": "GPU-a", "persistence": 0}}]}}"#)
        };
        write(&one(false));
        assert_eq!(nvmlInit_v2(), code::SUCCESS);
        let mut gpu: DeviceHandle = std::ptr::null_mut();
        assert_eq!(
            unsafe { nvmlDeviceGetHandleByIndex_v2(0, &mut gpu) },
            code::SUCCESS
        );
        let limits = || {
            let (mut managed, mut enforced, mut default) = (0, 0, 0);
            assert_eq!(
                unsafe { nvmlDeviceGetPowerManagementLimit(gpu, &mut managed) },
                code::SUCCESS
            );
            assert_eq!(
                unsafe { nvmlDeviceGetEnforcedPowerLimit(gpu, &mut enforced) },
                code::SUCCESS
            );
            assert_eq!(
                unsafe { nvmlDeviceGetPowerManagementDefaultLimit(gpu, &mut default) },
                code::SUCCESS
            );
            (managed, enforced, default)
        };
        assert_eq!(
            unsafe { nvmlDeviceSetPowerManagementLimit(gpu, 400_000) },
            code::NO_PERMISSION
        );
        assert_eq!(limits(), (700_000, 700_000, 700_000));
        write(&one(true));
        let (mut min, mut max) = (0, 0);
        assert_eq!(
            unsafe { nvmlDeviceGetPowerManagementLimitConstraints(gpu, &mut min, &mut max) },
            code::SUCCESS
        );
        assert_eq!((min, max), (200_000, 700_000));
        for outside in [199_999, 700_001] {
            assert_eq!(
                unsafe { nvmlDeviceSetPowerManagementLimit(gpu, outside) },
                code::INVALID_ARGUMENT
            );
        }
        assert_eq!(
            unsafe { nvmlDeviceSetPowerManagementLimit(gpu, 400_000) },
            code::SUCCESS
        );
        assert_eq!(limits(), (400_000, 400_000, 700_000));
        // A GPU reset (drain, remove, discover) keeps it.
        let mut pci = PciInfo {
            bus_id_legacy: [0; 16],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: [0; 32],
        };
        fill_chars(&mut pci.bus_id, "00000000:18:00.0");
        assert_eq!(unsafe { nvmlDeviceModifyDrainState(&mut pci, 1) }, code::SUCCESS);
        assert_eq!(unsafe { nvmlDeviceRemoveGpu_v2(&mut pci, 0, 0) }, code::SUCCESS);
        assert_eq!(unsafe { nvmlDeviceDiscoverGpus(&mut pci) }, code::SUCCESS);
        assert_eq!(limits(), (400_000, 400_000, 700_000));
        // A fixture rewritten for other reasons still shows the set limit; so does a new process.
        write(&one(true).replace("GPU-a", "GPU-c"));
        assert_eq!(limits(), (400_000, 400_000, 700_000));
        assert_eq!(nvmlShutdown(), code::SUCCESS);
        assert_eq!(nvmlInit_v2(), code::SUCCESS);
        assert_eq!(limits(), (400_000, 400_000, 700_000));
        // A reboot (the hardware state gone) runs the board at its default again.
        let mut hardware = path.clone().into_os_string();
        hardware.push(".hardware");
        std::fs::remove_file(&hardware).unwrap();
        assert_eq!(limits(), (700_000, 700_000, 700_000));
        assert_eq!(nvmlShutdown(), code::SUCCESS);

        write(r#"{"init_error": 9}"#);
        assert_eq!(nvmlInit_v2(), 9);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
