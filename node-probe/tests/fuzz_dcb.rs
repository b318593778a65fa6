//! Property tests (seeded, bounded) of the DCB netlink parser: arbitrary bytes, and well-framed
//! replies whose attributes have random types, lengths (short, long, lying) and nesting. The
//! parser never panics or reads out of bounds. And replies encoded here, from the kernel's struct
//! layouts, out of a generated configuration (attributes in any order, unknown attributes,
//! netlink flag bits, longer payloads) parse back to exactly that configuration.
//! `PROPTEST_CASES` raises the case count (`make reliability-long`).

use gpunode_probe::network::dcb::{
    DCB_CMD_IEEE_GET, DcbApp, DcbConfig, IeeePfc, RTM_GETDCB, parse_ieee_reply,
};
use gpunode_testkit::{Counter, record, runner};
use proptest::prelude::*;

const SEED: [u8; 32] = *b"gpunode-reliability-fuzz-dcb--01";

/// A netlink attribute; `lie` is added to the declared length (a hostile or truncated reply).
fn attr(out: &mut Vec<u8>, kind: u16, payload: &[u8], lie: i8) {
    let len = (4 + payload.len()) as i64 + i64::from(lie);
    out.extend_from_slice(&(len.clamp(0, 0xffff) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

fn message(kind: u16, attrs: &[u8], lie: i8) -> Vec<u8> {
    let total = (16 + 4 + attrs.len()) as i64 + i64::from(lie);
    let mut buf = Vec::new();
    buf.extend_from_slice(&(total.clamp(0, u32::MAX as i64) as u32).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&0u16.to_ne_bytes());
    buf.extend_from_slice(&7u32.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&[0, DCB_CMD_IEEE_GET, 0, 0]);
    buf.extend_from_slice(attrs);
    buf
}

#[derive(Debug, Clone)]
struct Attr {
    kind: u16,
    payload: Vec<u8>,
    lie: i8,
    nested: Vec<Attr>,
}

fn attr_strategy() -> impl Strategy<Value = Attr> {
    let leaf = (
        prop_oneof![0u16..16, Just(13 | 0x8000), any::<u16>()],
        prop::collection::vec(any::<u8>(), 0..160),
        prop_oneof![Just(0i8), -8i8..8, any::<i8>()],
    )
        .prop_map(|(kind, payload, lie)| Attr {
            kind,
            payload,
            lie,
            nested: vec![],
        });
    leaf.prop_recursive(3, 24, 6, |inner| {
        (
            prop_oneof![Just(13u16), Just(13 | 0x8000), Just(3u16), Just(2u16)],
            prop::collection::vec(inner, 0..6),
            prop_oneof![Just(0i8), -4i8..4],
        )
            .prop_map(|(kind, nested, lie)| Attr {
                kind,
                payload: vec![],
                lie,
                nested,
            })
    })
}

fn encode(a: &Attr, out: &mut Vec<u8>) {
    let mut payload = a.payload.clone();
    for n in &a.nested {
        encode(n, &mut payload);
    }
    attr(out, a.kind, &payload, a.lie);
}

#[test]
fn arbitrary_bytes_never_panic() {
    let ran = Counter::default();
    let outcome = runner(&SEED, 512).run(&prop::collection::vec(any::<u8>(), 0..600), |bytes| {
        ran.hit();
        let _ = parse_ieee_reply(&bytes);
        Ok(())
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "dcb-bytes",
        "proptest: DCB netlink parser on arbitrary bytes",
        ran.get(),
        &[("no panic on any input", "every case parsed or refused".into())],
        &outcome,
    );
    outcome.unwrap();
}

#[test]
fn framed_replies_with_hostile_attributes_never_panic() {
    let strategy = (
        prop::collection::vec(attr_strategy(), 0..6),
        prop_oneof![Just(RTM_GETDCB), Just(2u16), any::<u16>()],
        prop_oneof![Just(0i8), any::<i8>()],
    );
    let (ran, accepted) = (Counter::default(), Counter::default());
    let outcome = runner(&SEED, 512).run(&strategy, |(attrs, kind, lie)| {
        ran.hit();
        let mut body = Vec::new();
        for a in &attrs {
            encode(a, &mut body);
        }
        if let Ok(config) = parse_ieee_reply(&message(kind, &body, lie)) {
            accepted.hit();
            let _ = config.trust_from_app_table();
        }
        Ok(())
    });
    assert!(
        accepted.get() > 0,
        "the generator never produced a reply the parser accepts"
    );
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "dcb-framed",
        "proptest: DCB replies with hostile attributes",
        ran.get(),
        &[(
            "no panic on any input",
            format!("{} replies accepted", accepted.get()),
        )],
        &outcome,
    );
    outcome.unwrap();
}

/// `struct ieee_pfc` (linux/dcbnl.h) as the kernel lays it out: pfc_cap, pfc_en, mbc, a pad
/// byte, delay (u16) and two pad bytes, then requests[8] and indications[8] (u64 each), 136
/// bytes; `extra` trailing bytes stand for a newer kernel's longer struct.
fn ieee_pfc_bytes(p: &IeeePfc, extra: usize) -> Vec<u8> {
    let mut b = vec![p.pfc_cap, p.pfc_en, p.mbc, 0xAA];
    b.extend_from_slice(&p.delay.to_ne_bytes());
    b.extend_from_slice(&[0xAA, 0xAA]);
    for r in p.requests.iter().chain(&p.indications) {
        b.extend_from_slice(&r.to_ne_bytes());
    }
    b.extend(std::iter::repeat_n(0x55, extra));
    b
}

/// One top-level or nested attribute of a reply to build.
#[derive(Debug, Clone)]
enum Part {
    Dcbx(Vec<u8>),
    Ieee(Vec<(u32, Inner)>),
    Noise(u16, Vec<u8>),
}

#[derive(Debug, Clone)]
enum Inner {
    Pfc(Vec<u8>),
    Apps(Vec<(u32, Option<DcbApp>, u16, Vec<u8>)>),
    Noise(u16, Vec<u8>),
}

/// Netlink attribute flag bits (NLA_F_NESTED, NLA_F_NET_BYTEORDER) a sender may set.
fn flags() -> impl Strategy<Value = u16> {
    prop::sample::select(vec![0u16, 0x8000, 0x4000])
}

fn noise_kind(known: &'static [u16]) -> impl Strategy<Value = u16> {
    (0u16..0x3FFF, flags()).prop_filter_map("a known attribute", move |(k, f)| {
        (!known.contains(&k)).then_some(k | f)
    })
}

fn noise(known: &'static [u16]) -> impl Strategy<Value = (u16, Vec<u8>)> {
    (noise_kind(known), prop::collection::vec(any::<u8>(), 0..70))
}

fn pfc() -> impl Strategy<Value = IeeePfc> {
    (
        (any::<u8>(), any::<u8>(), any::<u8>(), any::<u16>()),
        prop::array::uniform8(any::<u64>()),
        prop::array::uniform8(any::<u64>()),
    )
        .prop_map(|((pfc_cap, pfc_en, mbc, delay), requests, indications)| IeeePfc {
            pfc_cap,
            pfc_en,
            mbc,
            delay,
            requests,
            indications,
        })
}

fn app() -> impl Strategy<Value = DcbApp> {
    (any::<u8>(), any::<u8>(), any::<u16>()).prop_map(|(selector, priority, protocol)| DcbApp {
        selector,
        priority,
        protocol,
    })
}

/// A configuration, and the attributes of a reply carrying it (order keys, noise, flags).
fn encoded_config() -> impl Strategy<Value = (DcbConfig, Vec<(u32, Part)>)> {
    (
        prop::option::of((
            any::<u8>(),
            prop::collection::vec(any::<u8>(), 0..3),
            any::<u32>(),
        )),
        prop::option::of((pfc(), 0usize..12, any::<u32>())),
        prop::option::of((
            prop::collection::vec((any::<u32>(), app(), flags()), 0..6),
            prop::collection::vec((any::<u32>(), noise(&[1])), 0..3),
            any::<u32>(),
        )),
        prop::collection::vec((any::<u32>(), noise(&[2, 3])), 0..3),
        prop::collection::vec((any::<u32>(), noise(&[13, 14])), 0..3),
        (any::<u32>(), prop::bool::ANY),
    )
        .prop_map(
            |(dcbx, pfc, apps, inner_noise, top_noise, (ieee_key, ieee_always))| {
                let mut config = DcbConfig::default();
                let mut top: Vec<(u32, Part)> = Vec::new();
                if let Some((v, extra, key)) = dcbx {
                    config.dcbx = Some(v);
                    let mut payload = vec![v];
                    payload.extend(extra);
                    top.push((key, Part::Dcbx(payload)));
                }
                let mut inner: Vec<(u32, Inner)> = Vec::new();
                if let Some((p, extra, key)) = &pfc {
                    inner.push((*key, Inner::Pfc(ieee_pfc_bytes(p, *extra))));
                    config.pfc = Some(p.clone());
                }
                if let Some((entries, noise, key)) = apps {
                    let mut table: Vec<(u32, Option<DcbApp>, u16, Vec<u8>)> = Vec::new();
                    for (k, a, f) in &entries {
                        table.push((*k, Some(*a), *f, vec![]));
                    }
                    for (k, (kind, payload)) in noise {
                        table.push((k, None, kind, payload));
                    }
                    // Entries keep their relative order (the table is a list); noise goes anywhere.
                    let mut apps_only = entries.iter().map(|e| e.1);
                    config.app = Vec::new();
                    table.sort_by_key(|t| t.0);
                    for t in &mut table {
                        if t.1.is_some() {
                            t.1 = apps_only.next();
                            if let Some(a) = t.1 {
                                config.app.push(a);
                            }
                        }
                    }
                    inner.push((key, Inner::Apps(table)));
                }
                for (k, (kind, payload)) in inner_noise {
                    inner.push((k, Inner::Noise(kind, payload)));
                }
                if !inner.is_empty() || ieee_always {
                    top.push((ieee_key, Part::Ieee(inner)));
                }
                for (k, (kind, payload)) in top_noise {
                    top.push((k, Part::Noise(kind, payload)));
                }
                (config, top)
            },
        )
}

/// Netlink attribute: u16 length (header included, padding not), u16 type, payload, padding
/// to 4 bytes.
fn nla(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    out.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

fn build(parts: &[(u32, Part)]) -> Vec<u8> {
    let mut parts = parts.to_vec();
    parts.sort_by_key(|p| p.0);
    let mut body = Vec::new();
    for (_, part) in &parts {
        match part {
            Part::Dcbx(payload) => nla(&mut body, 14, payload),
            Part::Noise(kind, payload) => nla(&mut body, *kind, payload),
            Part::Ieee(inner) => {
                let mut inner = inner.clone();
                inner.sort_by_key(|i| i.0);
                let mut nest = Vec::new();
                for (_, i) in &inner {
                    match i {
                        Inner::Pfc(bytes) => nla(&mut nest, 2, bytes),
                        Inner::Noise(kind, payload) => nla(&mut nest, *kind, payload),
                        Inner::Apps(table) => {
                            let mut t = Vec::new();
                            for (_, app, kind, payload) in table {
                                match app {
                                    Some(a) => {
                                        let mut b = vec![a.selector, a.priority];
                                        b.extend_from_slice(&a.protocol.to_ne_bytes());
                                        nla(&mut t, 1 | kind, &b);
                                    }
                                    None => nla(&mut t, *kind, payload),
                                }
                            }
                            nla(&mut nest, 3 | 0x8000, &t);
                        }
                    }
                }
                nla(&mut body, 13 | 0x8000, &nest);
            }
        }
    }
    message(RTM_GETDCB, &body, 0)
}

#[test]
fn replies_parse_to_exactly_the_config_they_encode() {
    let ran = Counter::default();
    let (with_pfc, with_apps) = (Counter::default(), Counter::default());
    let outcome = runner(&SEED, 512).run(&encoded_config(), |(expected, parts)| {
        ran.hit();
        if expected.pfc.is_some() {
            with_pfc.hit();
        }
        if !expected.app.is_empty() {
            with_apps.hit();
        }
        let bytes = build(&parts);
        match parse_ieee_reply(&bytes) {
            Ok(got) => prop_assert_eq!(got, expected),
            Err(e) => return Err(TestCaseError::fail(format!("well-formed reply refused: {e}"))),
        }
        Ok(())
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "dcb-exact",
        "proptest: DCB replies built from a generated config (any order, unknown attributes, flags)",
        ran.get(),
        &[(
            "the parser returns exactly the encoded config",
            format!(
                "{} with PFC, {} with APP entries",
                with_pfc.get(),
                with_apps.get()
            ),
        )],
        &outcome,
    );
    outcome.unwrap();
}
