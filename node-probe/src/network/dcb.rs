//! DCB (IEEE 802.1Qaz/Qbb) settings of a network interface: PFC-enabled priorities, the APP
//! table (DSCP → priority entries decide the trust mode on inbox mlx5) and the DCBX mode.
//!
//! [`parse_ieee_reply`] is a pure parser of an `RTM_GETDCB` / `DCB_CMD_IEEE_GET` reply (layouts in
//! the kernel's `include/uapi/linux/dcbnl.h`); [`DcbSource`] hides where the reply comes from
//! (the kernel over netlink, or a fixture file).
//!
//! It only reads: the probe never sets a DCB setting (that is the NIC owner's job).

use std::path::PathBuf;

use gpunode_crds::ObservedTrust;
use serde::Deserialize;

/// `RTM_GETDCB`.
pub const RTM_GETDCB: u16 = 78;
/// `NLMSG_ERROR`.
pub const NLMSG_ERROR: u16 = 2;
/// `NLM_F_REQUEST`.
const NLM_F_REQUEST: u16 = 0x1;
/// `DCB_CMD_IEEE_GET`.
pub const DCB_CMD_IEEE_GET: u8 = 21;
/// Top-level attributes.
const DCB_ATTR_IFNAME: u16 = 1;
const DCB_ATTR_IEEE: u16 = 13;
const DCB_ATTR_DCBX: u16 = 14;
/// Attributes nested in `DCB_ATTR_IEEE`.
const DCB_ATTR_IEEE_PFC: u16 = 2;
const DCB_ATTR_IEEE_APP_TABLE: u16 = 3;
/// Attribute nested in `DCB_ATTR_IEEE_APP_TABLE`.
const DCB_ATTR_IEEE_APP: u16 = 1;
/// `struct ieee_pfc` size.
const IEEE_PFC_LEN: usize = 136;
/// `struct dcb_app` size.
const DCB_APP_LEN: usize = 4;
/// APP selector for DSCP entries (`IEEE_8021QAZ_APP_SEL_DSCP`).
pub const APP_SEL_DSCP: u8 = 5;
/// Netlink header and `struct dcbmsg` sizes.
const NLMSG_HDR_LEN: usize = 16;
const DCBMSG_LEN: usize = 4;

/// Why DCB settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DcbError {
    /// The netlink socket could not be used.
    #[error("netlink socket: {0}")]
    Socket(#[from] std::io::Error),
    /// The kernel answered with an error.
    #[error("netlink: {}", errno_text(*.errno))]
    Kernel {
        /// Positive errno.
        errno: i32,
    },
    /// The reply did not have the expected layout.
    #[error("malformed DCB reply: {0}")]
    Malformed(String),
    /// The interface name cannot be sent (too long or contains NUL).
    #[error("invalid interface name {0:?}")]
    InvalidName(String),
    /// No reply arrived in time.
    #[error("no DCB reply from the kernel")]
    NoReply,
    /// The fixture file is missing or invalid.
    #[error("DCB fixture {path}: {reason}")]
    Fixture {
        /// The fixture file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

fn errno_text(errno: i32) -> String {
    let what = match errno {
        95 => "interface has no DCB support (EOPNOTSUPP)".to_owned(),
        19 => "interface not in this network namespace (ENODEV); the probe needs hostNetwork".to_owned(),
        _ => std::io::Error::from_raw_os_error(errno).to_string(),
    };
    format!("{what} [errno {errno}]")
}

/// `struct ieee_pfc`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IeeePfc {
    /// Traffic classes that can have PFC.
    pub pfc_cap: u8,
    /// Bit p set = PFC on priority p.
    pub pfc_en: u8,
    /// MACsec bypass capability.
    pub mbc: u8,
    /// Allowance for cable delay (mlx5: cable length).
    pub delay: u16,
    /// Pause frames sent per priority (mlx5).
    pub requests: [u64; 8],
    /// Pause frames received per priority (mlx5).
    pub indications: [u64; 8],
}

/// `struct dcb_app`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DcbApp {
    /// 1 ethertype, 2 TCP port, 3 UDP port, 4 any, 5 DSCP.
    pub selector: u8,
    /// Priority the matching traffic gets.
    pub priority: u8,
    /// Ethertype, port or DSCP value, by selector.
    pub protocol: u16,
}

/// What `DCB_CMD_IEEE_GET` tells about an interface.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DcbConfig {
    /// DCBX mode flags (0x1 host/OS-controlled), when the driver reports them.
    pub dcbx: Option<u8>,
    /// PFC settings, when present.
    pub pfc: Option<IeeePfc>,
    /// The APP table.
    pub app: Vec<DcbApp>,
}

impl DcbConfig {
    /// Priorities with PFC enabled; None when the reply had no PFC attribute.
    pub fn pfc_priorities(&self) -> Option<Vec<u8>> {
        self.pfc
            .as_ref()
            .map(|pfc| (0..8u8).filter(|p| pfc.pfc_en & (1 << p) != 0).collect())
    }

    /// Trust mode as mlnx_qos derives it without the OFED sysfs file: DSCP when the APP table
    /// has a DSCP-selector entry, else PCP.
    pub fn trust_from_app_table(&self) -> ObservedTrust {
        if self.app.iter().any(|a| a.selector == APP_SEL_DSCP) {
            ObservedTrust::Dscp
        } else {
            ObservedTrust::Pcp
        }
    }
}

/// Where DCB settings come from.
pub trait DcbSource: Send + Sync {
    /// The IEEE DCB settings of `ifname`.
    fn ieee(&self, ifname: &str) -> Result<DcbConfig, DcbError>;
}

/// The `RTM_GETDCB` / `DCB_CMD_IEEE_GET` request for `ifname`.
pub fn ieee_request(ifname: &str, seq: u32) -> Result<Vec<u8>, DcbError> {
    if ifname.is_empty() || ifname.len() > 15 || ifname.contains('\0') {
        return Err(DcbError::InvalidName(ifname.to_owned()));
    }
    let nla_len = 4 + ifname.len() + 1;
    let total = NLMSG_HDR_LEN + DCBMSG_LEN + align4(nla_len);
    let mut buf = Vec::with_capacity(total);
    buf.extend_from_slice(&(total as u32).to_ne_bytes());
    buf.extend_from_slice(&RTM_GETDCB.to_ne_bytes());
    buf.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&[0, DCB_CMD_IEEE_GET, 0, 0]);
    buf.extend_from_slice(&(nla_len as u16).to_ne_bytes());
    buf.extend_from_slice(&DCB_ATTR_IFNAME.to_ne_bytes());
    buf.extend_from_slice(ifname.as_bytes());
    buf.resize(total, 0);
    Ok(buf)
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(buf: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(buf.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(buf.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

/// Splits a run of netlink attributes into (type without flag bits, payload). Rejects headers
/// shorter than 4 bytes and lengths past the end; trailing padding is ignored.
pub fn attributes(buf: &[u8]) -> Result<Vec<(u16, &[u8])>, DcbError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= buf.len() {
        let len = usize::from(u16_at(buf, at).unwrap_or(0));
        let kind = u16_at(buf, at + 2).unwrap_or(0) & 0x3FFF;
        if len < 4 {
            return Err(DcbError::Malformed(format!("attribute at {at} has length {len}")));
        }
        let payload = buf
            .get(at + 4..at + len)
            .ok_or_else(|| DcbError::Malformed(format!("attribute {kind} at {at} overruns the message")))?;
        out.push((kind, payload));
        at += align4(len);
    }
    Ok(out)
}

fn parse_pfc(payload: &[u8]) -> Result<IeeePfc, DcbError> {
    if payload.len() < IEEE_PFC_LEN {
        return Err(DcbError::Malformed(format!(
            "ieee_pfc is {} bytes, expected {IEEE_PFC_LEN}",
            payload.len()
        )));
    }
    let mut pfc = IeeePfc {
        pfc_cap: payload[0],
        pfc_en: payload[1],
        mbc: payload[2],
        delay: u16_at(payload, 4).unwrap_or(0),
        ..IeeePfc::default()
    };
    for p in 0..8 {
        pfc.requests[p] = u64_at(payload, 8 + 8 * p).unwrap_or(0);
        pfc.indications[p] = u64_at(payload, 72 + 8 * p).unwrap_or(0);
    }
    Ok(pfc)
}

fn parse_app_table(payload: &[u8]) -> Result<Vec<DcbApp>, DcbError> {
    let mut apps = Vec::new();
    for (kind, app) in attributes(payload)? {
        if kind != DCB_ATTR_IEEE_APP {
            continue;
        }
        if app.len() < DCB_APP_LEN {
            return Err(DcbError::Malformed(format!(
                "dcb_app is {} bytes, expected {DCB_APP_LEN}",
                app.len()
            )));
        }
        apps.push(DcbApp {
            selector: app[0],
            priority: app[1],
            protocol: u16_at(app, 2).unwrap_or(0),
        });
    }
    Ok(apps)
}

/// Parses the kernel's reply to [`ieee_request`]: the first netlink message of `buf`.
/// Attribute order is not assumed; unknown attributes are skipped.
pub fn parse_ieee_reply(buf: &[u8]) -> Result<DcbConfig, DcbError> {
    let len =
        u32_at(buf, 0).ok_or_else(|| DcbError::Malformed("shorter than a netlink header".into()))? as usize;
    if len < NLMSG_HDR_LEN || len > buf.len() {
        return Err(DcbError::Malformed(format!(
            "netlink length {len} for a {}-byte buffer",
            buf.len()
        )));
    }
    let msg = &buf[..len];
    match u16_at(msg, 4).unwrap_or(0) {
        NLMSG_ERROR => {
            let error = u32_at(msg, NLMSG_HDR_LEN)
                .map(|e| e as i32)
                .ok_or_else(|| DcbError::Malformed("truncated netlink error".into()))?;
            if error == 0 {
                return Err(DcbError::Malformed("acknowledgement without DCB data".into()));
            }
            Err(DcbError::Kernel {
                errno: error.saturating_neg(),
            })
        }
        RTM_GETDCB => {
            let body = msg
                .get(NLMSG_HDR_LEN + DCBMSG_LEN..)
                .ok_or_else(|| DcbError::Malformed("truncated dcbmsg".into()))?;
            let cmd = msg[NLMSG_HDR_LEN + 1];
            if cmd != DCB_CMD_IEEE_GET {
                return Err(DcbError::Malformed(format!("reply to DCB command {cmd}")));
            }
            let mut config = DcbConfig::default();
            for (kind, payload) in attributes(body)? {
                match kind {
                    DCB_ATTR_DCBX => config.dcbx = payload.first().copied(),
                    DCB_ATTR_IEEE => {
                        for (inner, payload) in attributes(payload)? {
                            match inner {
                                DCB_ATTR_IEEE_PFC => config.pfc = Some(parse_pfc(payload)?),
                                DCB_ATTR_IEEE_APP_TABLE => config.app = parse_app_table(payload)?,
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            Ok(config)
        }
        other => Err(DcbError::Malformed(format!(
            "unexpected netlink message type {other}"
        ))),
    }
}

/// Sequence number of a reply, to match it with its request.
pub fn reply_seq(buf: &[u8]) -> Option<u32> {
    u32_at(buf, 8)
}

/// The fixture form of a DCB reply (`dcb/<ifname>.json` in a fixture tree).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DcbFixture {
    #[serde(default)]
    dcbx: Option<u8>,
    #[serde(default)]
    pfc: Option<IeeePfc>,
    /// ETS settings are not reported; accepted so fixtures can document them.
    #[serde(default)]
    #[allow(dead_code)]
    ets: Option<serde_json::Value>,
    #[serde(default)]
    app: Vec<DcbApp>,
    /// A netlink error to simulate, as the kernel sends it (negative errno, e.g. -95).
    #[serde(default)]
    error: Option<i32>,
}

/// Reads DCB settings from `<dir>/dcb/<ifname>.json` instead of the kernel.
#[derive(Debug, Clone)]
pub struct FixtureDcb {
    dir: PathBuf,
}

impl FixtureDcb {
    /// A source reading `<dir>/dcb/`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FixtureDcb { dir: dir.into() }
    }
}

impl DcbSource for FixtureDcb {
    fn ieee(&self, ifname: &str) -> Result<DcbConfig, DcbError> {
        let path = self.dir.join("dcb").join(format!("{ifname}.json"));
        let fixture_error = |reason: String| DcbError::Fixture {
            path: path.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| fixture_error(e.to_string()))?;
        let fixture: DcbFixture = serde_json::from_str(&text).map_err(|e| fixture_error(e.to_string()))?;
        if let Some(error) = fixture.error {
            return Err(DcbError::Kernel {
                errno: error.saturating_neg(),
            });
        }
        Ok(DcbConfig {
            dcbx: fixture.dcbx,
            pfc: fixture.pfc,
            app: fixture.app,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Appends one attribute (header, payload, padding).
    pub fn attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
        buf.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(payload);
        buf.resize(align4(buf.len()), 0);
    }

    pub fn pfc_payload(pfc_en: u8, rx3: u64, tx3: u64) -> Vec<u8> {
        let mut p = vec![0u8; IEEE_PFC_LEN];
        p[0] = 8;
        p[1] = pfc_en;
        p[4..6].copy_from_slice(&7u16.to_ne_bytes());
        p[8 + 3 * 8..8 + 4 * 8].copy_from_slice(&tx3.to_ne_bytes());
        p[72 + 3 * 8..72 + 4 * 8].copy_from_slice(&rx3.to_ne_bytes());
        p
    }

    pub fn app_table(entries: &[(u8, u8, u16)]) -> Vec<u8> {
        let mut table = Vec::new();
        for (selector, priority, protocol) in entries {
            let mut app = vec![*selector, *priority];
            app.extend_from_slice(&protocol.to_ne_bytes());
            attr(&mut table, DCB_ATTR_IEEE_APP, &app);
        }
        table
    }

    /// A whole reply message: header, dcbmsg, then the given top-level attributes.
    pub fn message(kind: u16, cmd: u8, attrs: &[u8]) -> Vec<u8> {
        let total = NLMSG_HDR_LEN + DCBMSG_LEN + attrs.len();
        let mut buf = Vec::new();
        buf.extend_from_slice(&(total as u32).to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&0u16.to_ne_bytes());
        buf.extend_from_slice(&7u32.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&[0, cmd, 0, 0]);
        buf.extend_from_slice(attrs);
        buf
    }

    /// A reply like mlx5 sends: ifname, IEEE {ETS, MAXRATE, PFC, BUFFER, APP}, DCBX.
    pub fn mlx5_reply(pfc_en: u8, apps: &[(u8, u8, u16)], dcbx: u8) -> Vec<u8> {
        let mut ieee = Vec::new();
        attr(&mut ieee, 1, &[0u8; 59]); // ETS
        attr(&mut ieee, 7, &[0u8; 64]); // MAXRATE
        attr(&mut ieee, DCB_ATTR_IEEE_PFC, &pfc_payload(pfc_en, 120, 5));
        attr(&mut ieee, 10, &[0u8; 44]); // DCB_BUFFER
        attr(&mut ieee, DCB_ATTR_IEEE_APP_TABLE, &app_table(apps));
        let mut top = Vec::new();
        attr(&mut top, DCB_ATTR_IFNAME, b"ens1f0np0\0");
        attr(&mut top, DCB_ATTR_IEEE | 0x8000, &ieee);
        attr(&mut top, DCB_ATTR_DCBX, &[dcbx]);
        message(RTM_GETDCB, DCB_CMD_IEEE_GET, &top)
    }

    fn dscp_default_map() -> Vec<(u8, u8, u16)> {
        (0..64u16)
            .map(|dscp| (APP_SEL_DSCP, (dscp >> 3) as u8, dscp))
            .collect()
    }

    #[test]
    fn builds_the_request_like_the_kernel_expects() {
        let req = ieee_request("ens1f0np0", 9).unwrap();
        assert_eq!(req.len(), 16 + 4 + 16);
        assert_eq!(u32_at(&req, 0), Some(36));
        assert_eq!(u16_at(&req, 4), Some(RTM_GETDCB));
        assert_eq!(u16_at(&req, 6), Some(NLM_F_REQUEST));
        assert_eq!(u32_at(&req, 8), Some(9));
        assert_eq!(&req[16..20], &[0, DCB_CMD_IEEE_GET, 0, 0]);
        assert_eq!(u16_at(&req, 20), Some(4 + 10));
        assert_eq!(u16_at(&req, 22), Some(DCB_ATTR_IFNAME));
        assert_eq!(&req[24..34], b"ens1f0np0\0");
        assert!(ieee_request("a-name-longer-than-15", 1).is_err());
        assert!(ieee_request("", 1).is_err());
    }

    #[test]
    fn parses_pfc_on_priority_3_with_the_dscp_map() {
        let config = parse_ieee_reply(&mlx5_reply(0x08, &dscp_default_map(), 0x01)).unwrap();
        assert_eq!(config.pfc_priorities(), Some(vec![3]));
        assert_eq!(config.trust_from_app_table(), ObservedTrust::Dscp);
        assert_eq!(config.dcbx, Some(1));
        assert_eq!(config.app.len(), 64);
        assert!(config.app.contains(&DcbApp {
            selector: 5,
            priority: 3,
            protocol: 26
        }));
        let pfc = config.pfc.unwrap_or_default();
        assert_eq!((pfc.indications[3], pfc.requests[3], pfc.delay), (120, 5, 7));
    }

    #[test]
    fn no_dscp_entries_means_pcp_trust() {
        let config = parse_ieee_reply(&mlx5_reply(0x18, &[(3, 3, 4791)], 0x02)).unwrap();
        assert_eq!(config.pfc_priorities(), Some(vec![3, 4]));
        assert_eq!(config.trust_from_app_table(), ObservedTrust::Pcp);
    }

    #[test]
    fn a_reply_without_pfc_leaves_pfc_unknown() {
        let mut top = Vec::new();
        attr(&mut top, DCB_ATTR_IEEE, &[]);
        let config = parse_ieee_reply(&message(RTM_GETDCB, DCB_CMD_IEEE_GET, &top)).unwrap();
        assert_eq!(config.pfc_priorities(), None);
    }

    #[test]
    fn kernel_errors_become_errno() {
        let mut err = message(NLMSG_ERROR, 0, &[]);
        err.truncate(16);
        err.extend_from_slice(&(-95i32).to_ne_bytes());
        err.extend_from_slice(&[0u8; 16]);
        let len = err.len() as u32;
        err[0..4].copy_from_slice(&len.to_ne_bytes());
        let e = parse_ieee_reply(&err)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("no DCB support") && e.contains("95"), "{e}");
    }

    #[test]
    fn rejects_truncated_and_overrunning_input() {
        let good = mlx5_reply(0x08, &dscp_default_map(), 1);
        for cut in [0, 3, 15, 19, 40, good.len() - 1] {
            assert!(parse_ieee_reply(&good[..cut]).is_err(), "cut at {cut}");
        }
        // An attribute claiming more bytes than the message has.
        let mut top = Vec::new();
        attr(&mut top, DCB_ATTR_DCBX, &[1]);
        top[0..2].copy_from_slice(&200u16.to_ne_bytes());
        assert!(parse_ieee_reply(&message(RTM_GETDCB, DCB_CMD_IEEE_GET, &top)).is_err());
        // A zero-length attribute header would loop forever if accepted.
        let zero = message(RTM_GETDCB, DCB_CMD_IEEE_GET, &[0, 0, 1, 0]);
        assert!(parse_ieee_reply(&zero).is_err());
        // A short ieee_pfc.
        let mut ieee = Vec::new();
        attr(&mut ieee, DCB_ATTR_IEEE_PFC, &[0u8; 20]);
        let mut top = Vec::new();
        attr(&mut top, DCB_ATTR_IEEE, &ieee);
        assert!(parse_ieee_reply(&message(RTM_GETDCB, DCB_CMD_IEEE_GET, &top)).is_err());
    }

    #[test]
    fn skips_unknown_attributes_and_accepts_longer_structs() {
        let mut ieee = Vec::new();
        attr(&mut ieee, 99, &[1, 2, 3]);
        let mut longer_pfc = pfc_payload(0x08, 0, 0);
        longer_pfc.extend_from_slice(&[0xAA; 8]);
        attr(&mut ieee, DCB_ATTR_IEEE_PFC, &longer_pfc);
        let mut top = Vec::new();
        attr(&mut top, 42, b"future");
        attr(&mut top, DCB_ATTR_IEEE, &ieee);
        let config = parse_ieee_reply(&message(RTM_GETDCB, DCB_CMD_IEEE_GET, &top)).unwrap();
        assert_eq!(config.pfc_priorities(), Some(vec![3]));
    }

    #[test]
    fn rejects_other_message_types() {
        assert!(parse_ieee_reply(&message(16, 0, &[])).is_err());
        assert!(parse_ieee_reply(&message(RTM_GETDCB, 22, &[])).is_err());
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_ieee_reply(&bytes);
        }

        #[test]
        fn never_panics_on_corrupted_replies(flips in proptest::collection::vec((0usize..400, proptest::num::u8::ANY), 1..8)) {
            let mut reply = mlx5_reply(0x08, &[(5, 3, 26), (5, 6, 48)], 1);
            for (at, byte) in flips {
                let n = reply.len();
                reply[at % n] = byte;
            }
            let _ = parse_ieee_reply(&reply);
        }
    }
}
