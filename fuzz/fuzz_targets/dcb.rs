//! The DCB netlink reply parser (node-probe) on arbitrary bytes. Beyond not panicking: a reply it
//! accepts, written back out from the kernel's struct layouts by this target's own encoder,
//! parses to the same configuration; and bytes after the first message change nothing.
#![no_main]

use gpunode_probe::network::dcb::{DCB_CMD_IEEE_GET, DcbConfig, RTM_GETDCB, parse_ieee_reply};
use libfuzzer_sys::fuzz_target;

/// Netlink attribute: u16 length (header included), u16 type, payload, padding to 4.
fn nla(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    out.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    while out.len() % 4 != 0 {
        out.push(0);
    }
}

/// The reply the kernel would send for `c`: nlmsghdr, dcbmsg, DCB_ATTR_DCBX (14) and
/// DCB_ATTR_IEEE (13, nested) holding DCB_ATTR_IEEE_PFC (2, struct ieee_pfc, 136 bytes) and
/// DCB_ATTR_IEEE_APP_TABLE (3) of DCB_ATTR_IEEE_APP (1, struct dcb_app, 4 bytes).
fn encode(c: &DcbConfig) -> Vec<u8> {
    let mut ieee = Vec::new();
    if let Some(p) = &c.pfc {
        let mut b = vec![p.pfc_cap, p.pfc_en, p.mbc, 0];
        b.extend_from_slice(&p.delay.to_ne_bytes());
        b.extend_from_slice(&[0, 0]);
        for r in p.requests.iter().chain(&p.indications) {
            b.extend_from_slice(&r.to_ne_bytes());
        }
        nla(&mut ieee, 2, &b);
    }
    if !c.app.is_empty() {
        let mut table = Vec::new();
        for a in &c.app {
            let mut b = vec![a.selector, a.priority];
            b.extend_from_slice(&a.protocol.to_ne_bytes());
            nla(&mut table, 1, &b);
        }
        nla(&mut ieee, 3 | 0x8000, &table);
    }
    let mut body = Vec::new();
    nla(&mut body, 13 | 0x8000, &ieee);
    if let Some(d) = c.dcbx {
        nla(&mut body, 14, &[d]);
    }
    let mut msg = Vec::new();
    msg.extend_from_slice(&((16 + 4 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&RTM_GETDCB.to_ne_bytes());
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&[0, DCB_CMD_IEEE_GET, 0, 0]);
    msg.extend_from_slice(&body);
    msg
}

fuzz_target!(|data: &[u8]| {
    let parsed = parse_ieee_reply(data);
    if let Ok(config) = &parsed {
        let again = parse_ieee_reply(&encode(config));
        assert_eq!(
            again.as_ref().ok(),
            Some(config),
            "re-encoded reply parsed differently: {again:?}"
        );
    }
    // Only the first message counts: what follows it (here, junk) cannot change the result.
    let declared = data
        .get(..4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize);
    if declared.is_some_and(|n| n <= data.len()) {
        let mut longer = data.to_vec();
        longer.extend_from_slice(&[0xff, 0xff, 0x00, 0x01, 0x13, 0x37, 0, 0]);
        let other = parse_ieee_reply(&longer);
        assert_eq!(
            parsed.as_ref().ok(),
            other.as_ref().ok(),
            "bytes after the message changed the result"
        );
        assert_eq!(parsed.is_err(), other.is_err());
    }
});
