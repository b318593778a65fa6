//! A GPU's NVLink error counters and NVSwitch fabric registration.
//!
//! The error counters (`nvmlDeviceGetNvLinkErrorCounter`) are cumulative since the driver
//! loaded or the GPU was last reset; the collector turns them into counts over the last hour
//! with the same history as the fabric's port counters ([`crate::network::history`]), kept
//! across probe restarts on the same boot in `<state-dir>/nvlink-counters.json`. Only active
//! links are read: NVML has no counters for a link that is down (NotSupported), and a link that
//! does not exist is InvalidArg. A counter NVML does not support is absent (not judged); any
//! other failure is a field error naming the counter's report field.
//!
//! The fabric registration comes from `nvmlDeviceGetGpuFabricInfoV` ([`super::raw`]); a GPU
//! outside an NVSwitch fabric reports state NotSupported, whether NVML says so in the state or
//! answers the call with NotSupported (GPUs before Hopper).

use std::collections::BTreeMap;

use gpunode_crds::nvlink::{FABRIC_SUCCESS, FabricState, GpuFabricStatus, NvlinkCounter, NvlinkErrorRates};
use gpunode_crds::report::{FieldError, GpuStatus};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::{Device, Nvml};

use super::raw;
use super::reason::nvml_reason;
use crate::network::history::Counts;
use crate::network::history_store::HistoryStore;

/// The state file's name in the state directory.
pub const FILE_NAME: &str = "nvlink-counters.json";
/// Version of the file format.
pub const FORMAT: u32 = 1;
/// Largest file read: 64 GPUs × 18 links × 4 counters × 13 samples take about 1.5 MiB.
pub const MAX_FILE_BYTES: u64 = 4 << 20;
/// `NVML_GPU_FABRIC_HEALTH_MASK_*_DEGRADED_BW`: bits 0-1 of the health mask.
const DEGRADED_BW_MASK: u32 = 0x3;
/// The degraded-bandwidth field says degraded (1) or not (2); 0 is not supported.
const DEGRADED_BW_TRUE: u32 = 1;
const DEGRADED_BW_FALSE: u32 = 2;

/// The NVLink history of the probe.
pub type NvlinkHistory = HistoryStore<NvlinkCounter>;

/// The raw counters of one active link of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkCounters {
    /// The link's number.
    pub link: u32,
    /// Cumulative value of each counter NVML reported.
    pub raw: BTreeMap<NvlinkCounter, u64>,
}

fn wrapper_counter(counter: NvlinkCounter) -> ErrorCounter {
    match counter {
        NvlinkCounter::Replay => ErrorCounter::DlReplay,
        NvlinkCounter::Recovery => ErrorCounter::DlRecovery,
        NvlinkCounter::CrcFlit => ErrorCounter::DlCrcFlit,
        NvlinkCounter::CrcData => ErrorCounter::DlCrcData,
    }
}

/// The error counters of each of `active` links, with an error per counter that failed.
pub fn read_counters(device: &Device<'_>, active: &[u32]) -> (Vec<LinkCounters>, Vec<FieldError>) {
    let mut links = Vec::new();
    let mut errors: Vec<FieldError> = Vec::new();
    for &link in active {
        let wrapper = device.link_wrapper_for(link);
        let mut raw = BTreeMap::new();
        for counter in NvlinkCounter::ALL {
            match wrapper.error_counter(wrapper_counter(counter)) {
                Ok(value) => {
                    raw.insert(counter, value);
                }
                // The link went down since it was listed, or the driver lacks this counter.
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
                Err(e) => {
                    // One entry per counter: a driver failing on every link says it once.
                    if !errors.iter().any(|x| x.field == counter.field()) {
                        errors.push(FieldError {
                            field: counter.field().to_owned(),
                            reason: format!("link {link}: {}", nvml_reason(&e)),
                        });
                    }
                }
            }
        }
        if !raw.is_empty() {
            links.push(LinkCounters { link, raw });
        }
    }
    (links, errors)
}

/// The key of a GPU's link in the history: its UUID (stable across index changes), else its
/// index.
pub fn history_key(gpu: &GpuStatus, link: u32) -> String {
    match &gpu.uuid {
        Some(uuid) => format!("{uuid}/{link}"),
        None => format!("gpu{}/{link}", gpu.index),
    }
}

/// The report's counts of one link.
pub fn link_rates(link: u32, counts: &Counts<NvlinkCounter>) -> NvlinkErrorRates {
    let mut rates = NvlinkErrorRates {
        link,
        window_minutes: counts.window_minutes,
        ..NvlinkErrorRates::default()
    };
    for (counter, count) in &counts.counts {
        rates.set(*counter, Some(*count));
    }
    rates
}

/// Turns every GPU's raw link counters into counts over the last hour, in one history update
/// at `now` (unix seconds), and puts them in each GPU's `nvlink.errorRates`.
pub fn add_rates(history: &NvlinkHistory, gpus: &mut [GpuStatus], raw: Vec<(usize, LinkCounters)>, now: i64) {
    let keys: Vec<(String, BTreeMap<NvlinkCounter, u64>)> = raw
        .iter()
        .filter_map(|(i, l)| Some((history_key(gpus.get(*i)?, l.link), l.raw.clone())))
        .collect();
    let counts = history.observe_counts(&keys, now);
    for ((i, link), counts) in raw.iter().zip(counts) {
        let (Some(gpu), Some(counts)) = (gpus.get_mut(*i), counts) else {
            continue;
        };
        // A link that counted nothing is left out: a healthy GPU lists no link, which keeps the
        // report small (8 GPUs of 18 links would add some 16 KB of zeros).
        if let Some(nvlink) = gpu
            .nvlink
            .as_mut()
            .filter(|_| counts.counts.values().any(|c| *c > 0))
        {
            nvlink.error_rates.push(link_rates(link.link, &counts));
        }
    }
}

/// The GPU's fabric registration and health.
pub fn fabric(nvml: &Nvml, device: &Device<'_>) -> Result<GpuFabricStatus, NvmlError> {
    let info = match raw::gpu_fabric_info(nvml, device) {
        Err(NvmlError::NotSupported) => return Ok(not_supported()),
        other => other?,
    };
    decode_fabric(&info).ok_or(NvmlError::UnexpectedVariant(u32::from(info.state)))
}

fn not_supported() -> GpuFabricStatus {
    GpuFabricStatus {
        state: FabricState::NotSupported,
        status: None,
        clique_id: None,
        cluster_uuid: None,
        bandwidth_degraded: None,
        health_mask: None,
    }
}

/// The report's view of NVML's answer; None for a state this API does not know.
pub fn decode_fabric(info: &raw::FabricInfoRaw) -> Option<GpuFabricStatus> {
    let state = FabricState::from_nvml(info.state)?;
    if state == FabricState::NotSupported {
        return Some(not_supported());
    }
    // NVML: the status "must be checked only if state returns complete".
    let status = (state == FabricState::Completed).then(|| match nvml_try(info.status) {
        Ok(()) => FABRIC_SUCCESS.to_owned(),
        Err(NvmlError::UnexpectedVariant(code)) => format!("code {code}"),
        Err(e) => format!("{e:?}"),
    });
    let bandwidth_degraded = info.health_mask.and_then(|m| match m & DEGRADED_BW_MASK {
        DEGRADED_BW_TRUE => Some(true),
        DEGRADED_BW_FALSE => Some(false),
        _ => None,
    });
    Some(GpuFabricStatus {
        state,
        status,
        clique_id: Some(info.clique_id),
        cluster_uuid: uuid(&info.cluster_uuid),
        bandwidth_degraded,
        health_mask: info.health_mask,
    })
}

/// 16 bytes as a UUID string; None when all zeros (no cluster).
fn uuid(bytes: &[u8; 16]) -> Option<String> {
    if bytes.iter().all(|b| *b == 0) {
        return None;
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: u8, status: u32, health_mask: Option<u32>) -> raw::FabricInfoRaw {
        raw::FabricInfoRaw {
            state,
            status,
            clique_id: 7,
            cluster_uuid: [
                0x6f, 0x1d, 0x0e, 0x54, 0x9a, 0x1e, 0x4c, 0x37, 0x9b, 0x0e, 0x1f, 0x5e, 0x6a, 0x7b, 0x8c,
                0x9d,
            ],
            health_mask,
        }
    }

    #[test]
    fn decodes_a_completed_registration() {
        let f = decode_fabric(&info(3, 0, Some(0x2 | 0x8))).unwrap();
        assert!(f.registered());
        assert_eq!(
            f.cluster_uuid.as_deref(),
            Some("6f1d0e54-9a1e-4c37-9b0e-1f5e6a7b8c9d")
        );
        assert_eq!((f.clique_id, f.bandwidth_degraded), (Some(7), Some(false)));
    }

    #[test]
    fn the_status_counts_only_once_completed() {
        let f = decode_fabric(&info(1, 0, None)).unwrap();
        assert_eq!(
            (f.state, f.status, f.bandwidth_degraded),
            (FabricState::NotStarted, None, None)
        );
        let f = decode_fabric(&info(3, 999, Some(1))).unwrap();
        assert_eq!(f.status.as_deref(), Some("Unknown"));
        assert_eq!(f.bandwidth_degraded, Some(true));
        assert!(!f.registered());
        assert_eq!(
            decode_fabric(&info(3, 25, None)).unwrap().status.as_deref(),
            Some("code 25")
        );
    }

    #[test]
    fn unknown_states_are_refused_and_not_supported_carries_nothing() {
        assert_eq!(decode_fabric(&info(9, 0, None)), None);
        assert_eq!(decode_fabric(&info(0, 0, Some(2))), Some(not_supported()));
        assert_eq!(uuid(&[0; 16]), None);
    }
}
