//! The runs' record: [`Run`], one fault injected and what was checked after it; [`Recorder`]
//! writes a test binary's runs as JSON (invariants, seed, recovery time) with the commit of the
//! code that produced them; [`summary`] turns every results file into the table of
//! docs/reliability.md, refusing results of different commits.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use super::{checks::Check, io};
use crate::{Error, audit::AuditEvent};

/// One fault injected and what was checked after it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    /// Fault class (issue 7's list): control plane, operator, probe, bad input, concurrency.
    pub class: String,
    /// The fault.
    pub fault: String,
    /// Seed of a seeded run.
    pub seed: Option<u64>,
    /// Invariants checked.
    pub checks: Vec<Check>,
    /// From the end of the fault to the state the run waits for, when measured, and which
    /// state that is.
    #[serde(default)]
    pub recovery: Option<Recovery>,
}

/// A recovery time and what it was measured until.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovery {
    /// Milliseconds.
    pub ms: u64,
    /// The state it ends at.
    pub until: Until,
}

/// What a recovery time measures: from the end of the fault (the restart, the start or resume
/// command, the fault lifted or undone) until this state. A fault class measures one, named in
/// the table; the report refuses a class whose runs measured different ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Until {
    /// A replica holds the leader Lease and leads.
    Leading,
    /// The API server received the operator's next write after the fault ([`first_write_ms`]).
    Acting,
    /// The operator's answer to the change in effect: the next drain started, the edited
    /// policy applied, a deleted policy's nodes released, its markers matching the reports.
    Answered,
    /// Every node as the policy implies (the wave done, the node back in service).
    Converged,
    /// The restarted probe process back at work: its saved state restored, or answering
    /// reset requests.
    ProbeBack,
    /// The operator idle again after a flood (no write for a while).
    Settled,
    /// No end of the fault: the whole wave, from the drift to the last node done, with the
    /// fault in place throughout.
    WaveUnderFault,
}

impl Until {
    /// The recovery `ms` long until this state.
    pub fn after(self, ms: u64) -> Recovery {
        Recovery { ms, until: self }
    }

    /// The table's words for it.
    pub fn describe(self) -> &'static str {
        match self {
            Until::Leading => "fault's end → a replica leads",
            Until::Acting => "fault's end → the operator's next write received",
            Until::Answered => "change → the operator's answer in effect",
            Until::Converged => "fault's end → every node as the policy implies",
            Until::ProbeBack => "restart → the probe process back at work",
            Until::Settled => "flood's end → the operator idle",
            Until::WaveUnderFault => "drift → wave done, under the fault throughout",
        }
    }
}

/// Milliseconds from `since` until the API server received the first write by `user` after it,
/// whatever it answered (an eviction a PodDisruptionBudget still holds is the operator at work
/// too), its Lease and Events aside (they go on whatever the operator can do).
pub fn first_write_ms(audit: &[AuditEvent], user: &str, since: jiff::Timestamp) -> Option<u64> {
    let first = audit
        .iter()
        .filter(|e| e.user == user && e.at >= since && e.is_write())
        .filter(|e| e.resource != "leases" && e.resource != "events")
        .map(|e| e.at)
        .min()?;
    u64::try_from(first.duration_since(since).as_millis()).ok()
}

impl Run {
    /// Invariants that did not hold.
    pub fn violations(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }
}

/// A results file: the commit of the code that produced the runs
/// (`gpunode_testkit::source_commit`), and the runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    /// The commit, e.g. "a8ff14e" or "a8ff14e (with uncommitted changes)".
    pub commit: String,
    /// The runs.
    pub runs: Vec<Run>,
}

/// Collects a test binary's runs and writes them to `<dir>/<file>.json`.
pub struct Recorder {
    path: PathBuf,
    results: Results,
}

/// Where results go: `GPUNODE_RELIABILITY_DIR`, else `<target tmp>/reliability`.
pub fn results_dir(target_tmp: &str) -> PathBuf {
    std::env::var_os("GPUNODE_RELIABILITY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(target_tmp).join("reliability"))
}

impl Recorder {
    /// A recorder writing `<dir>/<file>.json` (pass `env!("CARGO_TARGET_TMPDIR")` as `target_tmp`).
    pub fn new(target_tmp: &str, file: &str) -> Recorder {
        Recorder {
            path: results_dir(target_tmp).join(format!("{file}.json")),
            results: Results {
                commit: gpunode_testkit::source_commit(),
                runs: Vec::new(),
            },
        }
    }

    /// Adds a run and rewrites the file (so a later failure keeps what was measured).
    pub fn push(&mut self, run: Run) -> Result<(), Error> {
        for c in run.violations() {
            eprintln!(
                "VIOLATION [{} / {}]: {}: {}",
                run.class, run.fault, c.invariant, c.detail
            );
        }
        self.results.runs.push(run);
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(io(dir.display()))?;
        }
        std::fs::write(&self.path, serde_json::to_string_pretty(&self.results)?)
            .map_err(io(self.path.display()))
    }

    /// Fails with every violation recorded so far.
    pub fn assert_clean(&self) {
        let bad: Vec<String> = self
            .results
            .runs
            .iter()
            .flat_map(|r| {
                r.violations()
                    .into_iter()
                    .map(move |c| format!("{} / {}: {}: {}", r.class, r.fault, c.invariant, c.detail))
            })
            .collect();
        assert!(bad.is_empty(), "invariants violated:\n{}", bad.join("\n"));
        assert!(!self.results.runs.is_empty(), "no run recorded");
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since `start`.
pub fn elapsed_ms(start: Instant) -> u64 {
    millis(start.elapsed())
}

/// The aggregated results.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Markdown: one row per fault class and fault, then one per invariant.
    pub table: String,
    /// Runs in all.
    pub runs: usize,
    /// Invariants that did not hold, in all.
    pub violations: usize,
    /// The commit every result names.
    pub commit: String,
}

/// The results files a `make test` run writes (each test binary of the reliability suite, each
/// `fuzz_*` property test): a file missing from the results, or holding no run, means a test ran
/// nothing, and the report fails naming it.
pub const EXPECTED: [&str; 20] = [
    "bad-input",
    "concurrency",
    "control-plane",
    "crash",
    "faults",
    "gates",
    "host",
    "latency",
    "operator",
    "operator-fence",
    "probe",
    "fuzz-evaluate-reports",
    "fuzz-evaluate-policies",
    "fuzz-plan",
    "fuzz-version-range",
    "fuzz-version-order",
    "fuzz-version-reference",
    "fuzz-dcb-bytes",
    "fuzz-dcb-framed",
    "fuzz-dcb-exact",
];

/// The files `make reliability-long` adds: the rolling upgrade's (it builds an earlier commit's
/// operator, so only there) and libFuzzer's runs (fuzz/run.sh), one per target.
pub const EXPECTED_LONG: [&str; 5] = [
    "upgrade",
    "cargofuzz-dcb",
    "cargofuzz-version_range",
    "cargofuzz-duration",
    "cargofuzz-report",
];

/// The expected results files (`long`: those of `make reliability-long` too) that `dir` lacks
/// or that hold no run.
pub fn missing(dir: &Path, long: bool) -> Vec<String> {
    let extra: &[&str] = if long { &EXPECTED_LONG } else { &[] };
    EXPECTED
        .iter()
        .chain(extra)
        .filter(|name| {
            let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap_or_default();
            serde_json::from_str::<Results>(&text).map_or(true, |r| r.runs.is_empty())
        })
        .map(|name| format!("{name}.json"))
        .collect()
}

/// The tables of every results file in `dir`.
pub fn summary(dir: &Path) -> Result<Summary, Error> {
    let mut runs: Vec<Run> = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut commits: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(io(f.display()))?;
        let mut some: Results = serde_json::from_str(&text).map_err(|e| {
            Error::Unexpected(format!(
                "{}: {e} (a results file names its commit and its runs; rerun the suite that wrote it)",
                f.display()
            ))
        })?;
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        commits.entry(some.commit).or_default().push(name);
        runs.append(&mut some.runs);
    }
    // One table describes one commit's code: results of several are refused, naming each.
    let commit = match commits.len() {
        0 => String::from("none"),
        1 => commits.keys().next().cloned().unwrap_or_default(),
        _ => {
            return Err(Error::Unexpected(format!(
                "the results were produced at different commits: {commits:?}; rerun them at one"
            )));
        }
    };
    let mut classes: BTreeMap<&str, std::collections::BTreeSet<Until>> = BTreeMap::new();
    for r in &runs {
        if let Some(rec) = r.recovery {
            classes.entry(r.class.as_str()).or_default().insert(rec.until);
        }
    }
    if let Some((class, untils)) = classes.iter().find(|(_, u)| u.len() > 1) {
        return Err(Error::Unexpected(format!(
            "the runs of class \"{class}\" measured recovery until different states: {untils:?}"
        )));
    }
    let mut rows: BTreeMap<(String, String), Vec<&Run>> = BTreeMap::new();
    for r in &runs {
        rows.entry((r.class.clone(), r.fault.clone()))
            .or_default()
            .push(r);
    }
    let mut out = String::from(
        "| Fault class | Fault injected | Runs | Invariants checked | Violations | Recovery measured | Recovery median | Recovery max |\n\
         |---|---|---:|---:|---:|---|---:|---:|\n",
    );
    let fmt = |ms: Option<u64>| ms.map_or("–".to_string(), |m| format!("{:.1} s", m as f64 / 1000.0));
    let (mut total_runs, mut total_checks, mut total_bad) = (0, 0, 0);
    for ((class, fault), rs) in &rows {
        let checks: usize = rs.iter().map(|r| r.checks.len()).sum();
        let bad: usize = rs.iter().map(|r| r.violations().len()).sum();
        let mut rec: Vec<u64> = rs.iter().filter_map(|r| r.recovery).map(|r| r.ms).collect();
        // The class's definition, on the rows that measured one.
        let measured = classes
            .get(class.as_str())
            .and_then(|u| u.first())
            .filter(|_| !rec.is_empty())
            .map_or("–", |u| u.describe());
        rec.sort_unstable();
        let median = (!rec.is_empty()).then(|| rec[rec.len() / 2]);
        out.push_str(&format!(
            "| {class} | {fault} | {} | {checks} | {bad} | {measured} | {} | {} |\n",
            rs.len(),
            fmt(median),
            fmt(rec.last().copied())
        ));
        total_runs += rs.len();
        total_checks += checks;
        total_bad += bad;
    }
    out.push_str(&format!(
        "| **all** | | **{total_runs}** | **{total_checks}** | **{total_bad}** | | | |\n"
    ));
    let mut invariants: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for c in runs.iter().flat_map(|r| &r.checks) {
        let e = invariants.entry(c.invariant.as_str()).or_default();
        e.0 += 1;
        e.1 += usize::from(!c.ok);
    }
    out.push_str("\n| Invariant | Times checked | Violations |\n|---|---:|---:|\n");
    for (inv, (n, bad)) in invariants {
        out.push_str(&format!("| {inv} | {n} | {bad} |\n"));
    }
    Ok(Summary {
        table: out,
        runs: total_runs,
        violations: total_bad,
        commit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, body: serde_json::Value) {
        std::fs::write(dir.join(file), body.to_string()).unwrap_or_default();
    }

    fn run(ok: bool) -> serde_json::Value {
        serde_json::json!([{"class": "c", "fault": "f", "seed": null, "recovery": {"ms": 5, "until": "leading"},
            "checks": [{"invariant": "i", "ok": ok, "detail": "d"}]}])
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gpunode-record-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_default();
        dir
    }

    /// A directory of results files, one per (commit, the run passed).
    fn results(name: &str, files: &[(&str, bool)]) -> PathBuf {
        let dir = scratch(name);
        for (i, (commit, ok)) in files.iter().enumerate() {
            let body = serde_json::json!({"commit": commit, "runs": run(*ok)});
            write(&dir, &format!("{i}.json"), body);
        }
        dir
    }

    #[test]
    fn an_expected_results_file_missing_or_empty_is_named() {
        let dir = scratch("manifest");
        for name in EXPECTED.iter().filter(|n| **n != "crash") {
            let body = serde_json::json!({"commit": "abc1234", "runs": run(true)});
            write(&dir, &format!("{name}.json"), body);
        }
        assert_eq!(missing(&dir, false), vec!["crash.json".to_string()]);
        write(
            &dir,
            "crash.json",
            serde_json::json!({"commit": "abc1234", "runs": []}),
        );
        assert_eq!(missing(&dir, false), vec!["crash.json".to_string()]);
        write(
            &dir,
            "crash.json",
            serde_json::json!({"commit": "abc1234", "runs": run(true)}),
        );
        assert!(missing(&dir, false).is_empty());
        assert_eq!(missing(&dir, true).len(), EXPECTED_LONG.len());
    }

    #[test]
    fn a_class_whose_runs_measured_recovery_until_different_states_is_refused() {
        let dir = scratch("until");
        let runs = serde_json::json!([
            {"class": "c", "fault": "f", "seed": null, "checks": [],
             "recovery": {"ms": 5, "until": "leading"}},
            {"class": "c", "fault": "g", "seed": null, "checks": [],
             "recovery": {"ms": 9, "until": "converged"}},
        ]);
        write(
            &dir,
            "a.json",
            serde_json::json!({"commit": "abc1234", "runs": runs}),
        );
        let e = summary(&dir).map(|s| s.table).map_err(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("Leading") && e.contains("Converged")),
            "{e:?}"
        );
        let dir = results("until-one", &[("abc1234", true)]);
        let table = summary(&dir).map(|s| s.table).unwrap_or_default();
        assert!(
            table.contains("| fault's end → a replica leads | 0.0 s |"),
            "{table}"
        );
        // A row of the class that measured nothing names no definition.
        let runs = serde_json::json!([
            {"class": "c", "fault": "f", "seed": null, "checks": [],
             "recovery": {"ms": 5, "until": "leading"}},
            {"class": "c", "fault": "g", "seed": null, "checks": []},
        ]);
        let dir = scratch("until-none");
        write(
            &dir,
            "a.json",
            serde_json::json!({"commit": "abc1234", "runs": runs}),
        );
        let table = summary(&dir).map(|s| s.table).unwrap_or_default();
        assert!(table.contains("| c | g | 1 | 0 | 0 | – | – | – |"), "{table}");
    }

    #[test]
    fn the_next_write_is_the_operators_first_after_the_fault_lease_and_events_aside() {
        let event = |user: &str, verb: &str, resource: &str, at: &str| AuditEvent {
            verb: verb.into(),
            user: user.into(),
            resource: resource.into(),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            pod: String::new(),
            dry_run: false,
            code: 429,
            at: at.parse().unwrap_or_default(),
        };
        let since: jiff::Timestamp = "2026-12-01T12:00:00Z".parse().unwrap_or_default();
        let audit = [
            event("op", "patch", "nodes", "2026-12-01T11:59:59Z"),
            event("op", "update", "leases", "2026-12-01T12:00:00.100Z"),
            event("op", "create", "events", "2026-12-01T12:00:00.200Z"),
            event("op", "get", "nodes", "2026-12-01T12:00:00.300Z"),
            event("someone", "patch", "nodes", "2026-12-01T12:00:00.400Z"),
            event("op", "create", "pods", "2026-12-01T12:00:01.500Z"),
        ];
        assert_eq!(first_write_ms(&audit, "op", since), Some(1500));
        assert_eq!(first_write_ms(&audit[..5], "op", since), None);
    }

    #[test]
    fn results_of_one_commit_make_one_table_naming_it() {
        let dir = results("one", &[("abc1234", true), ("abc1234", false)]);
        let s = summary(&dir).map_err(|e| e.to_string());
        assert_eq!(
            s.as_ref().map(|s| (s.commit.as_str(), s.runs, s.violations)),
            Ok(("abc1234", 2, 1))
        );
    }

    #[test]
    fn results_of_different_commits_or_none_are_refused() {
        let dir = results("mixed", &[("abc1234", true), ("def5678", true)]);
        let e = summary(&dir).map(|s| s.commit).map_err(|e| e.to_string());
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("abc1234") && e.contains("def5678")),
            "{e:?}"
        );
        let dir = scratch("old");
        write(&dir, "a.json", run(true));
        let e = summary(&dir).map(|s| s.commit).map_err(|e| e.to_string());
        assert!(e.as_ref().is_err_and(|e| e.contains("names its commit")), "{e:?}");
    }
}
