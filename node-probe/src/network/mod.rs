//! The `network` collector: every RDMA port under `<sys_root>/class/infiniband`, with the
//! lossless-Ethernet settings of the interface behind it: MTU, PFC priorities and trust mode
//! (DCB netlink, or the OFED `qos/trust` file), ECN priorities (OFED files; unknown without
//! them), PFC pause counters (ethtool statistics, else the DCB PFC counters) and the port's
//! error counters as counts over the last hour ([`counters`], [`history`]; the history outlives
//! a probe restart on the same boot through [`history_store`]).
//!
//! A field that cannot be read is absent from its port with an entry in that port's `errors`;
//! only an unreadable `class/infiniband` directory fails the collector.
//!
//! It only reads (sysfs files, a DCB netlink query, ethtool statistics): it never changes a
//! setting of the node, and it does not decide what a value means for the node's health (the
//! operator's checks do).

pub mod counters;
pub mod dcb;
pub mod ethtool;
pub mod history;
pub mod history_store;
pub mod netlink;
pub mod ports;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpunode_crds::ObservedTrust;
use gpunode_crds::report::{
    CollectorName, FieldError, GpuNodeReportStatus, NetworkStatus, PauseCounters, RdmaDevice,
};

use crate::collect::{CollectError, Collector, Outcome};
use crate::sysfs::{self, SysfsError};
use counters::RawCounters;
use dcb::{DcbConfig, DcbSource};
use ethtool::EthtoolSource;
use history_store::HistoryStore;

/// Driver statistics of one interface, by name.
type Stats = BTreeMap<String, u64>;

/// The time in unix seconds (a fixed clock in tests).
type Clock = Box<dyn Fn() -> i64 + Send + Sync>;

/// Why the network collector failed.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// `class/infiniband` exists but cannot be listed.
    #[error("network: {0}")]
    Sysfs(#[from] SysfsError),
}

impl From<NetworkError> for CollectError {
    fn from(e: NetworkError) -> Self {
        CollectError::new(e)
    }
}

/// The network collector.
pub struct NetworkCollector {
    sys_root: PathBuf,
    dcb: Box<dyn DcbSource>,
    ethtool: Box<dyn EthtoolSource>,
    history: HistoryStore,
    clock: Clock,
}

impl NetworkCollector {
    /// A collector reading sysfs under `sys_root` and DCB/ethtool from the given sources.
    pub fn new(
        sys_root: impl Into<PathBuf>,
        dcb: Box<dyn DcbSource>,
        ethtool: Box<dyn EthtoolSource>,
    ) -> Self {
        NetworkCollector {
            sys_root: sys_root.into(),
            dcb,
            ethtool,
            history: HistoryStore::default(),
            clock: Box::new(|| jiff::Timestamp::now().as_second()),
        }
    }

    /// The same collector, keeping the counter history in `history` (in memory by default).
    pub fn with_history(mut self, history: HistoryStore) -> Self {
        self.history = history;
        self
    }

    /// The same collector, reading the time (unix seconds) from `clock`.
    pub fn with_clock(mut self, clock: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// The kernel sources: DCB over netlink, statistics over the ethtool ioctl.
    pub fn real(sys_root: impl Into<PathBuf>) -> Self {
        Self::new(
            sys_root,
            Box::new(netlink::NetlinkDcb::new()),
            Box::new(ethtool::IoctlEthtool),
        )
    }

    /// Fixture sources reading `<dir>/dcb/<if>.json` and `<dir>/ethtool/<if>.json`.
    pub fn with_fixtures(sys_root: impl Into<PathBuf>, dir: &Path) -> Self {
        Self::new(
            sys_root,
            Box::new(dcb::FixtureDcb::new(dir)),
            Box::new(ethtool::FixtureEthtool::new(dir)),
        )
    }

    /// Reads every RDMA port.
    pub fn read(&self) -> Result<NetworkStatus, NetworkError> {
        let class = self.sys_root.join("class/infiniband");
        let mut names = sysfs::dir_names(&class)?;
        names.sort_by_key(|n| natural_key(n));
        let mut status = NetworkStatus::default();
        let mut counters = Vec::new();
        for name in names {
            let device_dir = class.join(&name);
            let ports = match sysfs::numbered_entries(&device_dir.join("ports"), "") {
                Ok(ports) => ports,
                Err(e) => {
                    status.rdma_devices.push(RdmaDevice {
                        device: name.clone(),
                        errors: vec![FieldError {
                            field: "ports".into(),
                            reason: e.to_string(),
                        }],
                        ..RdmaDevice::default()
                    });
                    continue;
                }
            };
            for (port, port_dir) in ports {
                let (device, raw) = self.read_port(&name, &device_dir, port, &port_dir);
                counters.push((status.rdma_devices.len(), format!("{name}/{port}"), raw));
                status.rdma_devices.push(device);
            }
        }
        self.add_rates(&mut status, counters);
        Ok(status)
    }

    /// Turns each port's raw counters into counts over the last hour, in one history update.
    fn add_rates(&self, status: &mut NetworkStatus, counters: Vec<(usize, String, RawCounters)>) {
        let (indexes, ports): (Vec<usize>, Vec<(String, RawCounters)>) =
            counters.into_iter().map(|(i, key, raw)| (i, (key, raw))).unzip();
        let rates = self.history.observe(&ports, (self.clock)());
        for (index, rates) in indexes.into_iter().zip(rates) {
            if let Some(device) = status.rdma_devices.get_mut(index) {
                device.error_rates = rates;
            }
        }
    }

    /// One port: its link (state, rate, RoCE v2 GIDs) and, behind its interface, the lossless
    /// settings. Each field that cannot be read is absent with an entry in `errors`, in the order
    /// the fields are read. Also returns the port's raw error counters.
    fn read_port(
        &self,
        name: &str,
        device_dir: &Path,
        port: u32,
        port_dir: &Path,
    ) -> (RdmaDevice, RawCounters) {
        let _span = tracing::debug_span!("rdma_port", device = name, port).entered();
        let mut d = RdmaDevice {
            device: name.to_owned(),
            port,
            ..RdmaDevice::default()
        };
        let mut errors = Errors::default();
        let (infiniband, v2) = read_link(&mut d, port_dir, &mut errors);
        let mut stats = None;
        match ports::netdev(device_dir, port_dir, &v2) {
            Some(netdev) => {
                stats = self.read_lossless(&mut d, &netdev, device_dir, &mut errors);
                d.netdev = Some(netdev);
            }
            None if !infiniband => errors.fail("netdev", "no network interface found for this port".into()),
            None => {}
        }
        let (raw, counter_errors) = counters::read(port_dir, stats.as_ref());
        for (field, reason) in counter_errors {
            errors.fail(field, reason);
        }
        d.errors = errors.0;
        (d, raw)
    }

    /// The settings of interface `netdev`: MTU, then (on the physical function behind a bond)
    /// ECN, trust and PFC priorities, and PFC pause counters. Returns the driver statistics of
    /// the physical interface, when they could be read.
    fn read_lossless(
        &self,
        d: &mut RdmaDevice,
        netdev: &str,
        device_dir: &Path,
        errors: &mut Errors,
    ) -> Option<Stats> {
        let net = self.sys_root.join("class/net").join(netdev);
        match sysfs::read_num::<u32>(&net.join("mtu")) {
            Ok(mtu) => d.mtu = Some(mtu),
            Err(e) => errors.fail("mtu", e.to_string()),
        }
        // DCB, ECN and statistics live on the physical function, not on a bond over it.
        let physical = self.physical_netdev(netdev, device_dir);
        let phys_net = self.sys_root.join("class/net").join(&physical);

        match read_ecn(&phys_net.join("ecn/roce_np/enable")) {
            Ok(ecn) => d.ecn_priorities = ecn,
            Err(e) => errors.fail("ecnPriorities", e.to_string()),
        }

        let dcb = self.dcb.ieee(&physical);
        let trust_file = read_trust_file(&phys_net, errors);
        match &dcb {
            Ok(config) => {
                d.pfc_priorities = config.pfc_priorities();
                if d.pfc_priorities.is_none() {
                    errors.fail(
                        "pfcPriorities",
                        format!("{physical}: DCB reply has no PFC settings"),
                    );
                }
                d.trust = Some(trust_file.unwrap_or_else(|| config.trust_from_app_table()));
            }
            Err(e) => {
                errors.fail("pfcPriorities", format!("{physical}: {e}"));
                d.trust = Some(trust_file.unwrap_or(ObservedTrust::Unknown));
            }
        }

        match self.ethtool.stats(&physical) {
            Ok(stats) => {
                d.pfc_pause = ethtool::pause_counters(&stats);
                Some(stats)
            }
            Err(e) => {
                match dcb.as_ref().ok().and_then(dcb_pause_counters) {
                    Some(counters) => {
                        tracing::debug!(netdev = %physical, error = %e, "pause counters from DCB instead of ethtool");
                        d.pfc_pause = counters;
                    }
                    None => errors.fail("pfcPause", format!("{physical}: {e}")),
                }
                None
            }
        }
    }

    /// The interface whose DCB settings apply: for a bond, its slave on this RDMA device's PCI
    /// function (else its first slave); otherwise the interface itself.
    fn physical_netdev(&self, netdev: &str, device_dir: &Path) -> String {
        let slaves_file = self
            .sys_root
            .join("class/net")
            .join(netdev)
            .join("bonding/slaves");
        let Ok(Some(slaves)) = sysfs::read_optional(&slaves_file) else {
            return netdev.to_owned();
        };
        let slaves: Vec<&str> = slaves
            .split_whitespace()
            .filter(|s| ports::valid_ifname(s))
            .collect();
        let own = sysfs::dir_names(&device_dir.join("device/net")).unwrap_or_default();
        slaves
            .iter()
            .find(|s| own.iter().any(|o| o == *s))
            .or(slaves.first())
            .map_or_else(|| netdev.to_owned(), |s| (*s).to_owned())
    }
}

impl Collector for NetworkCollector {
    fn name(&self) -> CollectorName {
        CollectorName::Network
    }

    fn collect(&self, report: &mut GpuNodeReportStatus) -> Result<Outcome, CollectError> {
        report.network = Some(self.read()?);
        Ok(Outcome::default())
    }
}

/// The field errors of one port, in the order its fields are read.
#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn fail(&mut self, field: &str, reason: String) {
        self.0.push(FieldError {
            field: field.to_owned(),
            reason,
        });
    }
}

/// The port's link: state, physical state, rate and RoCE v2 GIDs. Returns whether the link
/// layer is InfiniBand (which has no interface and no RoCE GIDs to miss) and the indexes of
/// the RoCE v2 GIDs.
fn read_link(d: &mut RdmaDevice, port_dir: &Path, errors: &mut Errors) -> (bool, Vec<u32>) {
    let path = port_dir.join("state");
    match sysfs::read_text(&path).and_then(|t| ports::parse_state(&path, &t)) {
        Ok(state) => d.state = Some(state),
        Err(e) => errors.fail("state", e.to_string()),
    }
    let path = port_dir.join("phys_state");
    match sysfs::read_text(&path).and_then(|t| ports::parse_phys_state(&path, &t)) {
        Ok(state) => d.physical_state = Some(state),
        Err(e) => errors.fail("physicalState", e.to_string()),
    }
    let path = port_dir.join("rate");
    match sysfs::read_text(&path).and_then(|t| ports::parse_rate(&path, &t)) {
        Ok(rate) => d.rate_gbps = Some(rate),
        Err(e) => errors.fail("rateGbps", e.to_string()),
    }
    let infiniband = sysfs::read_text(&port_dir.join("link_layer")).is_ok_and(|l| l == "InfiniBand");
    let v2 = match ports::roce_v2_indexes(port_dir) {
        Ok(Some(v2)) => {
            d.roce_v2_gid = Some(!v2.is_empty());
            v2
        }
        Ok(None) if infiniband => Vec::new(),
        Ok(None) => {
            errors.fail("roceV2Gid", format!("{}: no gid_attrs/types", port_dir.display()));
            Vec::new()
        }
        Err(e) => {
            errors.fail("roceV2Gid", e.to_string());
            Vec::new()
        }
    };
    (infiniband, v2)
}

/// The trust mode from the OFED `qos/trust` file of interface directory `phys_net`; None
/// without the file (inbox driver) or when it cannot be read (with an error).
fn read_trust_file(phys_net: &Path, errors: &mut Errors) -> Option<ObservedTrust> {
    let path = phys_net.join("qos/trust");
    match sysfs::read_optional(&path) {
        Ok(Some(t)) if t == "dscp" => Some(ObservedTrust::Dscp),
        Ok(Some(t)) if t == "pcp" => Some(ObservedTrust::Pcp),
        Ok(Some(t)) => {
            errors.fail("trust", format!("{}: unknown trust mode {t:?}", path.display()));
            None
        }
        Ok(None) => None,
        Err(e) => {
            errors.fail("trust", e.to_string());
            None
        }
    }
}

/// ECN-enabled priorities from the OFED `ecn/roce_np/enable/<p>` files; None (unknown) when the
/// directory does not exist (inbox driver).
pub fn read_ecn(dir: &Path) -> Result<Option<Vec<u8>>, SysfsError> {
    if !dir.exists() {
        return Ok(None);
    }
    let mut enabled = Vec::new();
    for p in 0..8u8 {
        let path = dir.join(p.to_string());
        match sysfs::read_text(&path)?.as_str() {
            "1" => enabled.push(p),
            "0" => {}
            other => return Err(SysfsError::parse(&path, other, "expected 0 or 1")),
        }
    }
    Ok(Some(enabled))
}

/// Pause counters from `ieee_pfc` (mlx5 fills requests = sent, indications = received) for the
/// priorities with PFC on or with frames counted.
fn dcb_pause_counters(config: &DcbConfig) -> Option<Vec<PauseCounters>> {
    let pfc = config.pfc.as_ref()?;
    Some(
        (0..8u8)
            .filter(|&p| {
                let i = usize::from(p);
                pfc.pfc_en & (1 << p) != 0 || pfc.requests[i] != 0 || pfc.indications[i] != 0
            })
            .map(|p| PauseCounters {
                priority: p,
                rx: pfc.indications[usize::from(p)],
                tx: pfc.requests[usize::from(p)],
            })
            .collect(),
    )
}

/// Sorts "mlx5_2" before "mlx5_10".
fn natural_key(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (stem, number) = name.split_at(name.len() - digits);
    (stem.to_owned(), number.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_device_names_naturally() {
        let mut names = vec!["mlx5_10", "mlx5_2", "mlx5_bond_0", "mlx5_0"];
        names.sort_by_key(|n| natural_key(n));
        assert_eq!(names, vec!["mlx5_0", "mlx5_2", "mlx5_10", "mlx5_bond_0"]);
    }

    #[test]
    fn pause_counters_fall_back_to_dcb() {
        let config = DcbConfig {
            pfc: Some(dcb::IeeePfc {
                pfc_en: 0x08,
                requests: [0, 0, 0, 5, 0, 0, 0, 0],
                indications: [0, 0, 0, 120, 0, 0, 2, 0],
                ..dcb::IeeePfc::default()
            }),
            ..DcbConfig::default()
        };
        assert_eq!(
            dcb_pause_counters(&config),
            Some(vec![
                PauseCounters {
                    priority: 3,
                    rx: 120,
                    tx: 5
                },
                PauseCounters {
                    priority: 6,
                    rx: 2,
                    tx: 0
                }
            ])
        );
    }
}
