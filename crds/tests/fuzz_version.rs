//! Property tests (seeded, bounded) of the driver/CUDA version and range parsers: arbitrary
//! strings never panic and errors always explain themselves; every accepted range prints in a
//! form that parses back to the same range; comparisons agree with the numeric components.
//! `PROPTEST_CASES` raises the case count (`make reliability-long`).

use gpunode_crds::{Version, VersionRange};
use gpunode_testkit::{cases, record, runner};
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
    let accepted = std::cell::Cell::new(0u32);
    let outcome = runner(&SEED, 1024).run(&rangeish(), |s| {
        match s.parse::<VersionRange>() {
            Ok(r) => {
                accepted.set(accepted.get() + 1);
                let printed = r.to_string();
                let again: VersionRange = printed
                    .parse()
                    .map_err(|e| TestCaseError::fail(format!("{printed:?} (from {s:?}): {e}")))?;
                prop_assert_eq!(again.to_string(), printed);
                prop_assert!(!r.clauses().is_empty());
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
        format!(
            "proptest: version-range parser on arbitrary strings ({} cases)",
            cases(1024)
        ),
        &[
            (
                "no panic on any input",
                format!("{} ranges accepted", accepted.get()),
            ),
            ("accepted ranges round-trip", "print → parse → same".into()),
        ],
        &outcome,
    );
    outcome.unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn versions_compare_like_their_components() {
    let strategy = (
        prop::collection::vec(0u32..1_000_000, 1..5),
        prop::collection::vec(0u32..1_000_000, 1..5),
    );
    let outcome = runner(&SEED, 1024).run(&strategy, |(a, b)| {
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
        format!("proptest: version ordering and ranges ({} cases)", cases(1024)),
        &[(
            "ordering agrees with the components",
            "padded numeric comparison".into(),
        )],
        &outcome,
    );
    outcome.unwrap_or_else(|e| panic!("{e}"));
}
