//! The chart's PrometheusRule alerts under `promtool test rules`: the rule group is rendered by
//! the real helm from charts/gpunode (`metrics.prometheusRule.enabled=true`), checked with
//! `promtool check rules`, and run against the committed cases in charts/gpunode/tests/alerts/,
//! whose input series are the ones the operator and the probe export.
//!
//! Every alert of the chart needs a case where it fires and one where it stays silent (a new alert
//! cannot ship untested, and a case naming an alert the chart lacks is an error, since promtool
//! would pass its silence trivially). Then the cases must kill mutants of each alert: an alert
//! that never fires, one that always fires, one without its `for`, and the mutants of `MUTANTS`
//! (a loosened threshold, a dropped leader join, a wider label matcher...), each of which one
//! near miss exists to catch. A mutant that passes the cases is a near miss nobody tests.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Read,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use gpunode_e2e::{chart, tools};
use serde_yaml::Value;

/// The rule file the cases name in `rule_files`.
const RULES_FILE: &str = "gpunode-alerts.rules.yaml";

/// A mutant of one alert's expression: (alert, what it breaks, text in the rendered expression,
/// its replacement). The text must occur in the expression, so the table follows the chart.
const MUTANTS: &[(&str, &str, &str, &str)] = &[
    ("GpuNodesDrifted", "leader join dropped", LEADER_JOIN, ""),
    (
        "GpuNodesDrifted",
        "threshold > 0 loosened to >= 0",
        ") > 0",
        ") >= 0",
    ),
    (
        "GpuNodesDrifted",
        "state matcher widened to unknown",
        r#"state="drifted""#,
        r#"state=~"drifted|unknown""#,
    ),
    ("GpuNodeCircuitOpen", "leader join dropped", LEADER_JOIN, ""),
    (
        "GpuNodeCircuitOpen",
        "threshold > 0 loosened to >= 0",
        ") > 0",
        ") >= 0",
    ),
    (
        "GpuNodeCircuitOpen",
        "condition matcher widened to BudgetExhausted",
        r#"condition="CircuitOpen""#,
        r#"condition=~"CircuitOpen|BudgetExhausted""#,
    ),
    (
        "GpuNodeDrainStuck",
        "threshold > 0 loosened to >= 0",
        ") > 0",
        ") >= 0",
    ),
    (
        "GpuNodeDrainStuck",
        "action matcher widened to drain_start",
        r#"action="drain_stuck""#,
        r#"action=~"drain_stuck|drain_start""#,
    ),
    (
        "GpuNodeDrainStuck",
        "the counter's value instead of its increase",
        r#"sum(increase(gpunode_actions_total{action="drain_stuck"}[30m]))"#,
        r#"sum(gpunode_actions_total{action="drain_stuck"})"#,
    ),
    ("GpuNodeReportsStale", "leader join dropped", LEADER_JOIN, ""),
    (
        "GpuNodeReportsStale",
        "threshold > 0 loosened to >= 0",
        ") > 0",
        ") >= 0",
    ),
    (
        "GpuNodeReportsStale",
        "state matcher widened to drifted",
        r#"state="unknown""#,
        r#"state=~"unknown|drifted""#,
    ),
    (
        "GpuNodeProbeCannotPublish",
        "successful writes ignored (unless dropped)",
        r#" unless sum by (instance, node) (increase(gpunode_publish_total{result="ok"}[10m])) > 0"#,
        "",
    ),
    (
        "GpuNodeProbeCannotPublish",
        "error threshold > 0 loosened to >= 0",
        r#"(increase(gpunode_publish_total{result="error"}[10m])) > 0"#,
        r#"(increase(gpunode_publish_total{result="error"}[10m])) >= 0"#,
    ),
    (
        "GpuNodeOperatorNoLeader",
        "threshold < 1 loosened to <= 1",
        " < 1",
        " <= 1",
    ),
    (
        "GpuNodeOperatorNoLeader",
        "absent() dropped",
        " or absent(gpunode_leader)",
        "",
    ),
    (
        "GpuNodeOperatorNoLeader",
        "max taken as min",
        "max(gpunode_leader)",
        "min(gpunode_leader)",
    ),
];

/// The chart's join on the leading replica (a follower's gauges are stale).
const LEADER_JOIN: &str = " * on (instance) group_left () (gpunode_leader == 1)";

/// One alerting rule of the rendered group.
struct Alert {
    expr: String,
    for_: Option<String>,
}

/// The rendered PrometheusRule's `spec.groups`.
fn render_groups() -> Value {
    let chart_dir = chart::chart_dir().display().to_string();
    let yaml = chart::run_helm(&[
        "template",
        "gpunode",
        &chart_dir,
        "--namespace",
        "gpunode-system",
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--show-only",
        "templates/prometheusrule.yaml",
    ])
    .unwrap();
    let rule: Value =
        serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("rendered PrometheusRule: {e}\n{yaml}"));
    if rule["kind"].as_str() != Some("PrometheusRule") {
        panic!("templates/prometheusrule.yaml rendered no PrometheusRule:\n{yaml}");
    }
    let groups = rule["spec"]["groups"].clone();
    if groups.as_sequence().is_none_or(|g| g.is_empty()) {
        panic!("the PrometheusRule has no spec.groups:\n{yaml}");
    }
    groups
}

/// The alerting rules of `groups`, by name.
fn alerts(groups: &Value) -> BTreeMap<String, Alert> {
    let mut out = BTreeMap::new();
    for group in groups.as_sequence().into_iter().flatten() {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            let Some(name) = rule["alert"].as_str() else {
                continue;
            };
            let expr = rule["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("alert {name} has no expr"))
                .to_string();
            let for_ = rule["for"].as_str().map(str::to_string);
            if out.insert(name.to_string(), Alert { expr, for_ }).is_some() {
                panic!("alert {name} is defined twice");
            }
        }
    }
    if out.is_empty() {
        panic!("the rendered rule groups hold no alert");
    }
    out
}

/// `groups` with alert `name`'s expression and `for` replaced.
fn mutate(groups: &Value, name: &str, expr: &str, for_: Option<&str>) -> Value {
    let mut groups = groups.clone();
    for group in groups.as_sequence_mut().into_iter().flatten() {
        for rule in group["rules"].as_sequence_mut().into_iter().flatten() {
            if rule["alert"].as_str() == Some(name)
                && let Some(map) = rule.as_mapping_mut()
            {
                map.insert("expr".into(), expr.into());
                match for_ {
                    Some(f) => map.insert("for".into(), f.into()),
                    None => map.remove("for"),
                };
            }
        }
    }
    groups
}

/// The committed case files.
fn case_files() -> Vec<PathBuf> {
    let dir = chart::chart_dir().join("tests/alerts");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        panic!("no *.yaml cases in {}", dir.display());
    }
    files
}

/// What the cases say about one alert.
#[derive(Default)]
struct Cases {
    /// Cases where it fires, as `file: test name @ t`.
    fires: Vec<String>,
    /// Cases where it stays silent.
    silent: Vec<String>,
    /// The files holding them.
    files: BTreeSet<String>,
}

/// The cases, by alert name.
type Coverage = BTreeMap<String, Cases>;

fn coverage(files: &[PathBuf]) -> Coverage {
    let mut cov = Coverage::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let doc: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let file = f
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let rule_files: Vec<&str> = doc["rule_files"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if rule_files != [RULES_FILE] {
            panic!("{file}: rule_files must be [{RULES_FILE}] (the rendered chart), not {rule_files:?}");
        }
        for test in doc["tests"].as_sequence().into_iter().flatten() {
            let name = test["name"].as_str().unwrap_or("(unnamed)");
            for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                let alert = case["alertname"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{file}: a case of '{name}' has no alertname"));
                let at = case["eval_time"].as_str().unwrap_or("?");
                let entry = cov.entry(alert.to_string()).or_default();
                let fires = case["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty());
                let what = format!("{file}: {name} @ {at}");
                if fires {
                    entry.fires.push(what);
                } else {
                    entry.silent.push(what);
                }
                entry.files.insert(file.clone());
            }
        }
    }
    cov
}

/// Writes `groups` as the rule file and copies of the cases into `dir`; returns the case files' names.
fn stage(dir: &Path, groups: &Value, files: &[PathBuf]) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut doc = serde_yaml::Mapping::new();
    doc.insert("groups".into(), groups.clone());
    let rules = serde_yaml::to_string(&doc).unwrap();
    std::fs::write(dir.join(RULES_FILE), rules).unwrap();
    files
        .iter()
        .map(|f| {
            let name = f
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            std::fs::copy(f, dir.join(&name)).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            name
        })
        .collect()
}

/// Runs promtool in `dir`; returns whether it succeeded and what it printed. stdout and stderr
/// share one pipe, so a test file's FAILED (stderr) stays under its name (stdout).
fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let bin = tools::promtool().unwrap();
    let run = || -> std::io::Result<(bool, String)> {
        let (mut reader, writer) = std::io::pipe()?;
        let mut cmd = Command::new(&bin);
        cmd.args(args)
            .current_dir(dir)
            .stdout(writer.try_clone()?)
            .stderr(writer);
        let mut child = cmd.spawn()?;
        // The Command holds the pipe's write ends; reading ends only once they are all closed.
        drop(cmd);
        let mut text = String::new();
        reader.read_to_string(&mut text)?;
        Ok((child.wait()?.success(), text))
    };
    run().unwrap_or_else(|e| panic!("running {} {}: {e}", bin.display(), args.join(" ")))
}

fn work_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("alerts-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn every_alert_fires_on_its_series_and_stays_silent_on_near_misses() {
    let t0 = Instant::now();
    let groups = render_groups();
    let alerts = alerts(&groups);
    let files = case_files();
    let work = work_dir();

    // The rendered rules are valid and lint-clean.
    let real = work.join("chart");
    let names = stage(&real, &groups, &files);
    let (ok, out) = promtool(&real, &["check", "rules", "--lint-fatal", RULES_FILE]);
    if !ok {
        panic!(
            "promtool check rules failed on the chart's alerts ({}):\n{out}",
            real.display()
        );
    }

    // Every alert has a firing and a silent case, and every case names an alert of the chart.
    let cov = coverage(&files);
    let mut problems = Vec::new();
    for name in cov.keys().filter(|n| !alerts.contains_key(*n)) {
        problems.push(format!(
            "cases name alert {name}, which the chart does not define"
        ));
    }
    for name in alerts.keys() {
        let (fires, silent) = cov.get(name).map_or((0, 0), |c| (c.fires.len(), c.silent.len()));
        if fires == 0 {
            problems.push(format!(
                "alert {name} has no case where it fires (exp_alerts non-empty)"
            ));
        }
        if silent == 0 {
            problems.push(format!(
                "alert {name} has no case where it stays silent (no exp_alerts)"
            ));
        }
    }
    if !problems.is_empty() {
        panic!("charts/gpunode/tests/alerts:\n  {}", problems.join("\n  "));
    }

    // The cases pass on the chart's alerts.
    let mut args = vec!["test", "rules"];
    args.extend(names.iter().map(String::as_str));
    let (ok, out) = promtool(&real, &args);
    if !ok {
        panic!("promtool test rules failed ({}):\n{out}", real.display());
    }

    // ... and fail on every mutant.
    let mut mutants: Vec<(String, String, Value)> = Vec::new();
    for (name, alert) in &alerts {
        mutants.push((
            name.clone(),
            "never fires".into(),
            mutate(&groups, name, "vector(1) < 0", alert.for_.as_deref()),
        ));
        mutants.push((
            name.clone(),
            "always fires".into(),
            mutate(&groups, name, "vector(1)", alert.for_.as_deref()),
        ));
        if alert.for_.is_some() {
            mutants.push((
                name.clone(),
                "no for".into(),
                mutate(&groups, name, &alert.expr, None),
            ));
        }
    }
    for (name, what, from, to) in MUTANTS {
        let alert = alerts
            .get(*name)
            .unwrap_or_else(|| panic!("MUTANTS names alert {name}, which the chart does not define"));
        if !alert.expr.contains(from) {
            panic!(
                "mutant '{what}' of {name}: '{from}' is not in its expression '{}'",
                alert.expr
            );
        }
        let expr = alert.expr.replacen(from, to, 1);
        mutants.push((
            name.to_string(),
            what.to_string(),
            mutate(&groups, name, &expr, alert.for_.as_deref()),
        ));
    }
    // A mutant changes one alert, so only the files with cases for it are run; the mutants are
    // spread over the CPUs (each promtool run is a process of its own, in a directory of its own).
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(mutants.len());
    let survivors: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (mutants, cov, work, files) = (&mutants, &cov, &work, &files);
                scope.spawn(move || {
                    let mut survivors = Vec::new();
                    for (i, (name, what, mutated)) in mutants.iter().enumerate().skip(t).step_by(threads) {
                        let dir = work.join(format!("mutant-{i}"));
                        let own: Vec<PathBuf> = files
                            .iter()
                            .filter(|f| {
                                f.file_name()
                                    .is_some_and(|n| cov[name].files.contains(n.to_string_lossy().as_ref()))
                            })
                            .cloned()
                            .collect();
                        let names = stage(&dir, mutated, &own);
                        let mut args = vec!["test", "rules"];
                        args.extend(names.iter().map(String::as_str));
                        let (ok, _) = promtool(&dir, &args);
                        if ok {
                            survivors.push(format!("{name}: {what} ({})", dir.display()));
                        } else {
                            let _ = std::fs::remove_dir_all(&dir);
                        }
                    }
                    survivors
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a mutant thread panicked"))
            .collect()
    });
    if !survivors.is_empty() {
        panic!(
            "the cases in charts/gpunode/tests/alerts pass on these broken alerts (a near miss is missing):\n  {}",
            survivors.join("\n  ")
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    let cases: usize = cov.values().map(|c| c.fires.len() + c.silent.len()).sum();
    eprintln!(
        "{} alerts, {cases} cases in {} files, {} mutants killed, in {:.1}s",
        alerts.len(),
        files.len(),
        mutants.len(),
        t0.elapsed().as_secs_f64()
    );
}
