//! Property tests (seeded, bounded) of the driver/CUDA version and range parsers: arbitrary
//! strings never panic and errors always explain themselves; every accepted range prints in a
//! form that parses back to the same range; comparisons agree with the numeric components; and
//! ranges written from generated clauses (every operator spelling, spacing) match exactly the
//! versions a brute-force reference written here accepts, over a small universe of versions.
//! `PROPTEST_CASES` raises the case count (`make reliability-long`).

use gpunode_crds::{Version, VersionRange};
use gpunode_testkit::{Counter, record, runner};
use proptest::prelude::*;

const SEED: [u8; 32] = *b"gpunode-reliability-fuzz-ver--01";

/// Range-like strings: operators, digits, dots, commas, spaces and junk.
fn rangeish() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,140}",
        "((>=|<=|==|~=|!=|>|<|=|=>|)[ ]?[0-9]{0,11}(\\.[0-9]{0,11}){0,5}[ ]?,?){0,6}",
        "[0-9., <>=~!x-]{0,40}",
    ]
}

#[test]
fn range_parsing_never_panics_and_round_trips() {
    let (ran, accepted) = (Counter::default(), Counter::default());
    let outcome = runner(&SEED, 1024).run(&rangeish(), |s| {
        ran.hit();
        match s.parse::<VersionRange>() {
            Ok(r) => {
                accepted.hit();
                let printed = r.to_string();
                let again: VersionRange = printed
                    .parse()
                    .map_err(|e| TestCaseError::fail(format!("{printed:?} (from {s:?}): {e}")))?;
                prop_assert_eq!(&again.to_string(), &printed);
                // Same meaning, not only the same text.
                for v in universe() {
                    prop_assert_eq!(again.matches(&v), r.matches(&v), "{} on {}", printed, v);
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
        let _ = "550.54.15".parse::<VersionRange>().map(|r| r.matches_str(&s));
        Ok(())
    });
    assert!(accepted.get() > 0, "no generated range parsed");
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "version-range",
        "proptest: version-range parser on arbitrary strings",
        ran.get(),
        &[
            (
                "no panic on any input",
                format!("{} ranges accepted", accepted.get()),
            ),
            (
                "accepted ranges round-trip",
                "print → parse → same text, same versions matched".into(),
            ),
        ],
        &outcome,
    );
    outcome.unwrap();
}

#[test]
fn versions_compare_like_their_components() {
    let strategy = (
        prop::collection::vec(0u32..1_000_000, 1..5),
        prop::collection::vec(0u32..1_000_000, 1..5),
    );
    let ran = Counter::default();
    let outcome = runner(&SEED, 1024).run(&strategy, |(a, b)| {
        ran.hit();
        let join = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(".");
        let (sa, sb) = (join(&a), join(&b));
        let va: Version = sa
            .parse()
            .map_err(|e| TestCaseError::fail(format!("{sa}: {e}")))?;
        let vb: Version = sb
            .parse()
            .map_err(|e| TestCaseError::fail(format!("{sb}: {e}")))?;
        // Trailing zeros do not count: compare padded component lists.
        let n = a.len().max(b.len());
        let pad = |v: &[u32]| {
            let mut v = v.to_vec();
            v.resize(n, 0);
            v
        };
        prop_assert_eq!(va.cmp(&vb), pad(&a).cmp(&pad(&b)));
        let ge: VersionRange = format!(">={sb}")
            .parse()
            .map_err(|e| TestCaseError::fail(format!(">={sb}: {e}")))?;
        prop_assert_eq!(ge.matches(&va), va >= vb);
        Ok(())
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "version-order",
        "proptest: version ordering and ranges",
        ran.get(),
        &[(
            "ordering agrees with the components",
            "padded numeric comparison".into(),
        )],
        &outcome,
    );
    outcome.unwrap();
}

/// Every version with 1-3 components in 0..3: the universe the reference is checked over.
fn universe() -> Vec<Version> {
    let mut out = Vec::new();
    for n in 1..=3u32 {
        for i in 0..3u32.pow(n) {
            let parts: Vec<String> = (0..n).map(|d| ((i / 3u32.pow(d)) % 3).to_string()).collect();
            if let Ok(v) = parts.join(".").parse() {
                out.push(v);
            }
        }
    }
    out
}

/// The reference: components padded with zeros to four and compared as numbers, per the
/// documented operators (`~=V`: V or later, starting with every component of V).
fn reference(op: &str, bound: &[u32], v: &[u32]) -> bool {
    let pad = |x: &[u32]| {
        let mut x = x.to_vec();
        x.resize(4, 0);
        x
    };
    let (a, b) = (pad(v), pad(bound));
    match op {
        ">=" => a >= b,
        "<=" => a <= b,
        ">" => a > b,
        "<" => a < b,
        "!=" => a != b,
        "~=" => a >= b && a[..bound.len()] == b[..bound.len()],
        _ => a == b, // "==", "=", bare
    }
}

#[test]
fn ranges_agree_with_a_brute_force_reference() {
    let clause = (
        prop::sample::select(vec![">=", "<=", ">", "<", "!=", "~=", "==", "=", ""]),
        prop::collection::vec(0u32..3, 1..4),
        prop::sample::select(vec!["", " "]),
        prop::sample::select(vec!["", " "]),
    );
    let universe = universe();
    let (ran, matched) = (Counter::default(), Counter::default());
    let outcome = runner(&SEED, 1024).run(&prop::collection::vec(clause, 1..4), |clauses| {
        ran.hit();
        let text = clauses
            .iter()
            .map(|(op, v, pre, mid)| {
                let v: Vec<String> = v.iter().map(u32::to_string).collect();
                format!("{pre}{op}{mid}{}", v.join("."))
            })
            .collect::<Vec<_>>()
            .join(",");
        // Spaces around an operator's version are allowed (`>= 550`).
        let range: VersionRange = match text.parse() {
            Ok(r) => r,
            Err(e) => return Err(TestCaseError::fail(format!("{text:?} refused: {e}"))),
        };
        for v in &universe {
            let want = clauses
                .iter()
                .all(|(op, bound, _, _)| reference(op, bound, v.parts()));
            if want {
                matched.hit();
            }
            prop_assert_eq!(range.matches(v), want, "{} on {}", text, v);
        }
        Ok(())
    });
    let outcome = outcome.map_err(|e| e.to_string()).and_then(|()| {
        if matched.get() == 0 {
            Err("no generated range matched any version".to_string())
        } else {
            Ok(())
        }
    });
    record(
        env!("CARGO_TARGET_TMPDIR"),
        "version-reference",
        "proptest: version ranges vs. a brute-force reference over 39 versions",
        ran.get(),
        &[(
            "matches exactly the versions the reference accepts",
            format!("{} (range, version) pairs matched", matched.get()),
        )],
        &outcome,
    );
    outcome.unwrap();
}
