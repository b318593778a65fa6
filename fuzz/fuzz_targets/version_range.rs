//! Version and range parsing (crds) on arbitrary text: the first line is a range, the others
//! are versions. Beyond not panicking: an accepted range prints in a form that parses back to
//! the same text; a range matches a version exactly when a reference written here from the
//! documented rules says so (components compared as numbers, missing ones zero); versions
//! order like their padded component lists.
#![no_main]

use gpunode_crds::{Version, VersionRange, version::Op};
use libfuzzer_sys::fuzz_target;

fn padded(v: &[u32], n: usize) -> Vec<u32> {
    let mut v = v.to_vec();
    v.resize(n.max(v.len()), 0);
    v
}

/// The documented meaning of one clause.
fn reference(op: Op, bound: &[u32], v: &[u32]) -> bool {
    let n = bound.len().max(v.len());
    let (a, b) = (padded(v, n), padded(bound, n));
    match op {
        Op::Eq => a == b,
        Op::Ne => a != b,
        Op::Gt => a > b,
        Op::Ge => a >= b,
        Op::Lt => a < b,
        Op::Le => a <= b,
        // V or a later release of the same line: starts with every component of V.
        Op::Compatible => a >= b && a[..bound.len()] == b[..bound.len()],
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let first = lines.next().unwrap_or_default();
    let versions: Vec<Version> = lines.filter_map(|l| l.parse().ok()).collect();
    for v in &versions {
        let printed = v.to_string();
        let back: Version = printed
            .parse()
            .unwrap_or_else(|e| panic!("{printed:?} does not parse back: {e}"));
        assert_eq!(back.parts(), v.parts());
    }
    for w in versions.windows(2) {
        let n = w[0].parts().len().max(w[1].parts().len());
        assert_eq!(
            w[0].cmp(&w[1]),
            padded(w[0].parts(), n).cmp(&padded(w[1].parts(), n))
        );
    }
    match first.parse::<VersionRange>() {
        Ok(range) => {
            let printed = range.to_string();
            // What is stored (serde) must always read back; the display form, when it fits
            // the length limit, too.
            let stored = serde_json::to_string(&range).unwrap_or_else(|e| panic!("{e}"));
            let back: VersionRange = serde_json::from_str(&stored)
                .unwrap_or_else(|e| panic!("{stored} (from {first:?}) does not read back: {e}"));
            assert_eq!(back.to_string(), printed);
            if printed.len() <= gpunode_crds::version::MAX_RANGE_LEN {
                let shown: VersionRange = printed
                    .parse()
                    .unwrap_or_else(|e| panic!("{printed:?} (from {first:?}) does not parse back: {e}"));
                assert_eq!(shown.to_string(), printed);
            }
            for v in &versions {
                let want = range
                    .clauses()
                    .iter()
                    .all(|c| reference(c.op, c.version.parts(), v.parts()));
                assert_eq!(range.matches(v), want, "{printed} on {v}");
                assert_eq!(back.matches(v), want, "{printed} (reparsed) on {v}");
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    // A bare version is a one-clause range that matches exactly its equals.
    if let Ok(v) = first.trim_matches(' ').parse::<Version>()
        && let Ok(range) = v.to_string().parse::<VersionRange>()
    {
        assert!(range.matches(&v));
    }
});
