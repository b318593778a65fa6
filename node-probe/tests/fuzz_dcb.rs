//! Property tests (seeded, bounded) of the DCB netlink parser: arbitrary bytes, and well-framed
//! replies whose attributes have random types, lengths (short, long, lying) and nesting. The
//! parser never panics or reads out of bounds; a reply it accepts reports PFC priorities in 0..8.
//! `PROPTEST_CASES` raises the case count (`make reliability-long`).

use gpunode_probe::network::dcb::{DCB_CMD_IEEE_GET, RTM_GETDCB, parse_ieee_reply};
use gpunode_testkit::{cases, record, runner};
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
    let outcome = runner(&SEED, 512).run(&prop::collection::vec(any::<u8>(), 0..600), |bytes| {
        let _ = parse_ieee_reply(&bytes);
        Ok(())
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "dcb-bytes",
        format!(
            "proptest: DCB netlink parser on arbitrary bytes ({} cases)",
            cases(512)
        ),
        &[("no panic on any input", "every case parsed or refused".into())],
        &outcome,
    );
    outcome.unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn framed_replies_with_hostile_attributes_never_panic() {
    let strategy = (
        prop::collection::vec(attr_strategy(), 0..6),
        prop_oneof![Just(RTM_GETDCB), Just(2u16), any::<u16>()],
        prop_oneof![Just(0i8), any::<i8>()],
    );
    let accepted = std::cell::Cell::new(0u32);
    let outcome = runner(&SEED, 512).run(&strategy, |(attrs, kind, lie)| {
        let mut body = Vec::new();
        for a in &attrs {
            encode(a, &mut body);
        }
        if let Ok(config) = parse_ieee_reply(&message(kind, &body, lie)) {
            accepted.set(accepted.get() + 1);
            if let Some(prios) = config.pfc_priorities() {
                prop_assert!(
                    prios.iter().all(|p| *p < 8),
                    "PFC priority out of range: {prios:?}"
                );
            }
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
        format!(
            "proptest: DCB replies with hostile attributes ({} cases)",
            cases(512)
        ),
        &[
            (
                "no panic on any input",
                format!("{} replies accepted", accepted.get()),
            ),
            ("PFC priorities in 0..8", "checked on every accepted reply".into()),
        ],
        &outcome,
    );
    outcome.unwrap_or_else(|e| panic!("{e}"));
}
